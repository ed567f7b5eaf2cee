"""Does the dual-output XGBoost earn its place? Ablation on GPU types and models held out.

The predictor answers a GPU type with no samples from the datasheet transfer model
(memx_hpc.model.anchors.Anchors.datasheet: the roofline's parts -- compute by the part's
rated peak per W, memory-bound kernels, TP collectives, a fixed per-layer cost -- at costs
fitted on every measured chip), and activation memory from a measured series of the same
shape on any GPU, else the analytic formula (memx_hpc.model.predictor). The booster could
add, on top of those physics models:

* time: a residual ``log(t / transfer model)`` learned across chips from the datasheet and
  physics features (memx_hpc.model.features: rates, bandwidths, link, ridge point, memory
  size, FLOPs, bytes, roofline shares) plus the part's power, trained on residuals
  *cross-fitted* (each training chip's residual against a transfer model fitted without that
  chip, as a new chip will see it), clipped so that the time never drops below the roofline;
* time, instead of the transfer model: the booster alone on those features (the design
  before the transfer model);
* memory: the residual to the analytic bytes for a layer shape no series measured, bounded to
  ``exp(+-bound)`` (memx_hpc.model.predictor.MEMORY_RESIDUAL_BOUND; 0 today).

Rows: leave one GPU type out (time, per-type MAPE averaged over types), and leave one model
out of Sailor's llm_info.json layer memory. Locked split of benchmarks/accuracy.py
(TEST_GPU_TYPES, TEST_MODELS): dev rows fit and score dev samples only and are the only rows
a choice looks at; test rows (test GPU types, fitted on every other chip) are reported.

Run from the repository root:  .venv/bin/python benchmarks/xgboost_ablation.py [--quick]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from accuracy import TEST_GPU_TYPES, is_test  # noqa: E402

from memx_hpc.spec.catalog import catalog  # noqa: E402
from memx_hpc.datapaths import SOURCES, shared_data  # noqa: E402
from memx_hpc.model import anchors as anchors_mod  # noqa: E402
from memx_hpc.model import features  # noqa: E402
from memx_hpc.model import predictor as predictor_mod  # noqa: E402
from memx_hpc.model.api import analytic_activation_bytes, resolve_gpu  # noqa: E402
from memx_hpc.model.predictor import MAX_LOG_RATIO, usable  # noqa: E402
from memx_hpc.tables import table  # noqa: E402

CAT = catalog()
#: Fixed a priori (shallow trees, strong child weight: a dozen chips to learn from).
PARAMS = {"objective": "reg:squarederror", "tree_method": "hist", "max_depth": 3, "eta": 0.05, "subsample": 0.8,
          "colsample_bytree": 0.8, "min_child_weight": 5.0, "lambda": 1.0, "seed": 0, "nthread": 1, "verbosity": 0}
ROUNDS = 150


def _chip(s) -> str:
    return CAT.get(s.point.gpu_type).chip_id


def _transfer(train, test) -> np.ndarray:
    """Log ratio to the roofline the datasheet transfer model gives ``test``'s layers, fitted on ``train``."""
    a = anchors_mod.Anchors.from_samples(train).bind(CAT)
    return np.array([a.datasheet(features.query_of(s), resolve_gpu(CAT, s.point.gpu_type)) for s in test])


def _rows(ss):
    X, base = features.build([features.query_of(s) for s in ss], CAT)
    power = []
    for s in ss:
        g = CAT.get(s.point.gpu_type)
        power.append([g.peak_tflops(s.point.precision) / g.tdp_w if g.tdp_w else math.nan, g.tdp_w or math.nan])
    t = np.array([s.forward_ms + s.backward_ms for s in ss])
    return np.c_[X, np.array(power)], t, base[:, 0]


def time_ablation(train_all, test, xgb) -> dict[str, float]:
    """MAPE on ``test`` (one GPU chip) of the roofline, the transfer model, transfer + booster
    residual, and the booster alone, each fitted on ``train_all``."""
    chips = sorted({_chip(s) for s in train_all})
    train = train_all
    r_cross = np.full(len(train), np.nan)
    for c in chips:
        idx = [i for i, s in enumerate(train) if _chip(s) == c]
        r_cross[idx] = _transfer([s for s in train if _chip(s) != c], [train[i] for i in idx])
    Xtr, ttr, rooftr = _rows(train)
    Xte, tte, roof = _rows(test)
    ytr = np.log(ttr / rooftr)
    count = {c: sum(1 for s in train if _chip(s) == c) for c in chips}
    w = np.array([1.0 / count[_chip(s)] for s in train])  # every chip the same weight in total
    r_ds = _transfer(train, test)
    ok = ~np.isnan(r_cross)
    resid = xgb.train(PARAMS, xgb.DMatrix(Xtr[ok], label=(ytr - r_cross)[ok], weight=w[ok]), ROUNDS)
    alone = xgb.train(PARAMS, xgb.DMatrix(Xtr, label=ytr, weight=w), ROUNDS)
    d = xgb.DMatrix(Xte)
    preds = {"roofline": roof, "transfer model": np.exp(r_ds) * roof,
             "transfer + XGBoost residual": np.exp(np.clip(r_ds + resid.predict(d), 0.0, MAX_LOG_RATIO)) * roof,
             "XGBoost alone": np.exp(np.clip(alone.predict(d), 0.0, MAX_LOG_RATIO)) * roof}
    return {k: float(np.mean(np.abs(p - tte) / tte) * 100) for k, p in preds.items()}


def memory_ablation(sailor, cephalo, bounds) -> list[list]:
    """Leave one Sailor model out: per-layer activation bytes (micro-batch 1, each TP) by the
    predictor with the memory residual bounded to each of ``bounds``, against llm_info.json."""
    from memx_hpc.model.predictor import Predictor
    pts = {}
    for s in sailor:
        if s.point.kind == "layer" and s.point.micro_batch_size == 1 and s.activation_bytes > 0:
            pts.setdefault((s.point.shape, s.point.tp), s)
    pts = list(pts.values())
    true = np.array([s.activation_bytes for s in pts], dtype=np.float64)
    test = np.array([is_test(s) for s in pts])
    pred = {b: np.full(len(pts), np.nan) for b in bounds}
    saved = predictor_mod.MEMORY_RESIDUAL_BOUND
    try:
        for shape in sorted({s.point.shape for s in pts}, key=str):
            idx = [i for i, s in enumerate(pts) if s.point.shape == shape]
            train = [s for s in sailor if s.point.kind != "layer" or s.point.shape != shape] + cephalo
            model = Predictor().fit(train, CAT)
            for b in bounds:
                predictor_mod.MEMORY_RESIDUAL_BOUND = b
                pred[b][idx] = model.predict([features.query_of(pts[i]) for i in idx])[:, 1]
    finally:
        predictor_mod.MEMORY_RESIDUAL_BOUND = saved
    analytic = np.array([analytic_activation_bytes(features.query_of(s)) for s in pts], dtype=np.float64)
    rows = []
    for split, mask in (("dev", ~test), ("test", test)):
        if not mask.any():
            continue
        rows.append([split, "analytic formula", int(mask.sum()), f"{np.mean(np.abs(analytic - true)[mask] / true[mask]) * 100:.1f}"])
        for b in bounds:
            e = np.abs(pred[b] - true)[mask] / true[mask] * 100
            rows.append([split, f"formula x XGBoost residual, bound {b:g}" + (" (shipped)" if b == saved else ""),
                         int(mask.sum()), f"{np.mean(e):.1f}"])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="time rows only (skip the memory fits)")
    args = ap.parse_args(argv)
    import xgboost as xgb

    from memx_hpc.profile.importers import import_cephalo, import_sailor
    data = shared_data()
    print(f"data: {data} ({SOURCES['sailor']}; {SOURCES['cephalo']})")
    skipped: list[str] = []
    sailor = import_sailor(data / "sailor", skipped=skipped)
    cephalo = import_cephalo(data / "cephalo" / "model_latencies.json", skipped=skipped)
    layers = [s for s in sailor + cephalo if usable(s) and s.point.kind == "layer" and s.forward_ms + s.backward_ms > 0]
    dev = [s for s in layers if not is_test(s)]
    t0 = time.perf_counter()
    per: dict[str, dict[str, list[float]]] = {"dev": {}, "test": {}}
    rows = []
    for split, pool, types in (("dev", dev, sorted({s.point.gpu_type for s in dev})),
                               ("test", layers, sorted(TEST_GPU_TYPES & {s.point.gpu_type for s in layers}))):
        for g in types:
            test = [s for s in pool if s.point.gpu_type == g]
            train = [s for s in pool if _chip(s) != _chip(test[0])]
            res = time_ablation(train, test, xgb)
            for k, v in res.items():
                per[split].setdefault(k, []).append(v)
            rows.append([split, g, len(test), *(f"{v:.1f}" for v in res.values())])
    names = list(per["dev"])
    print(f"\nTime of a GPU type never profiled (leave one type out; per-type MAPE %; {time.perf_counter() - t0:.0f} s):")
    table(rows, ["split", "type left out", "layers", *names])
    summary = [[split, len(per[split][names[0]]), *(f"{np.mean(per[split][k]):.1f}" for k in names)]
               for split in ("dev", "test") if per[split]]
    print("\nMean over the types left out:")
    table(summary, ["split", "types", *names])
    dev_mean = {k: float(np.mean(v)) for k, v in per["dev"].items()}
    keep = dev_mean["transfer + XGBoost residual"] < dev_mean["transfer model"]
    print(f"dev: the XGBoost residual {'helps' if keep else 'does not help'} the transfer model "
          f"({dev_mean['transfer + XGBoost residual']:.1f} % against {dev_mean['transfer model']:.1f} %); "
          f"the booster alone: {dev_mean['XGBoost alone']:.1f} %")
    if not args.quick:
        print("\nPer-layer activation memory of a model left out (Sailor llm_info.json, micro-batch 1, every TP):")
        table(memory_ablation(sailor, cephalo, (0.0, 0.1, 0.3)), ["split", "cost model", "points", "MAPE %"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
