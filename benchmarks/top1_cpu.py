"""Planner top-1 against measured top-1 on this machine, through the real local Slurm,
for the fitted predictor and the datasheet roofline side by side in one run.

1. **Profile.** The minimal set of layer points the store lacks for the GPU type(s) of
   the two partitions used is measured through the local Slurm
   (``memx_hpc.slurm.dispatch.profile``: submitit job arrays, the profiler on the node),
   into a store in a temporary folder (or ``--store``; what it already holds is reused).
2. **Fit.** The dual-output XGBoost predictor is fitted on those layer samples, as
   ``memx-hpc plan`` fits it (``memx_hpc.planner.load_cost_model``: the CPU's speed
   figures measured while profiling, ``fit_or_load``), without the calibration: it sees
   no end-to-end run.
3. **Predict and rank** a small space of plans that fit this 2-core machine (world size
   <= 2, so ranks never share a core; one core per rank): tensor, pipeline and data
   parallel degrees, micro-batch, layer split across two partitions, recompute per stage.
   Each plan is predicted with the planner's own composition
   (``memx_hpc.model.compose.predict_plan``) by the fitted predictor and by the datasheet
   roofline (``AnalyticCostModel``: what the planner falls back to without profiles).
4. **Run every plan for real**: rendered (``memx_hpc.slurm.render``), submitted as a
   (het)job running the local site's Megatron entry (megatron-core on the CPU), measured
   from its Megatron-LM style log (``memx_hpc.train.measure.measure_plan``): median
   iteration time after the first iteration, per rank the peak of live tensor bytes
   (``max allocated``) and the process footprint (``max reserved`` = peak RSS).
5. **Score**, per cost model: planner top-1 vs measured top-1 under the time-only ranking
   and under the weighted-product ranking (MemX's objective; the same weights on both
   sides), Spearman rank correlation of predicted and measured orders, MAPE of
   iteration time, of peak allocated bytes and of the device footprint.

A third column, "fitted + calibration (LOO)", is the fitted predictor calibrated by the
end-to-end runs (``memx_hpc.model.calibrate``) as ``memx-hpc verify`` does it, and it is
honest only because every plan is predicted by a calibration fitted on the OTHER plans'
runs (leave-one-out). The first two columns use nothing of the runs they are scored on.

Memory comparison: measured ``max allocated`` against the predicted peak without the
predicted runtime overhead (both are tensor bytes); measured peak RSS against the
predicted peak with it (what the device, here the process, holds). The measured
utilisation in the weighted ranking is peak RSS / the GPU type's capacity.

The MemX paper's claim to beat: it was the only method whose top-1 was the measured best
under both rankings.

Run from the repository root with the local cluster up (``scripts/slurm-local.sh start``):

    .venv/bin/python benchmarks/top1_cpu.py [--iters 4] [--store DIR/store.h5] [--json results.json]

About 1.5 min of profiling, then one Slurm job of ~10-30 s per plan (interpreter
start-up, then the iterations), one after another so that they do not compete for the
two cores: ~10 min for the default 24 plans.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from memx_hpc.errors import MemxError, SpecError  # noqa: E402
from memx_hpc.spec import Plan, Recompute, Site, Stage, TrainJob, load_job, load_site  # noqa: E402


# --------------------------------------------------------------------------- the space


def small_space(site: Site, job: TrainJob, *, first: str, second: str) -> list[Plan]:
    """Plans of world size <= 2 on ``first`` (and ``second`` for the second pipeline stage)."""
    L = job.model.num_layers
    gbs = job.global_batch_size
    mbs_choices = [m for m in (1, 4) if gbs % m == 0] or [1]
    plans: list[Plan] = []
    none, full = Recompute(), Recompute(mode="full")
    for tp, dp in ((1, 1), (2, 1), (1, 2)):
        for mbs in mbs_choices:
            if gbs % (mbs * dp):
                continue
            for rc in (none, full):
                plans.append(Plan(tp=tp, dp=dp, micro_batch_size=mbs, global_batch_size=gbs,
                                  stages=(Stage(partition=first, num_layers=L, recompute=rc),)))
    for k in sorted({1, L // 2, L - 1}):
        if not 0 < k < L:
            continue
        for mbs in mbs_choices:
            for rc0, rc1 in ((none, none), (none, full)):
                plans.append(Plan(tp=1, dp=1, micro_batch_size=mbs, global_batch_size=gbs,
                                  stages=(Stage(partition=first, num_layers=k, recompute=rc0),
                                          Stage(partition=second, num_layers=L - k, recompute=rc1))))
    return plans


def label(p: Plan) -> str:
    stages = "|".join(f"{s.partition.split('_')[-1]}:{s.num_layers}:{s.recompute.label()}" for s in p.stages)
    return f"tp{p.tp} pp{p.pp} dp{p.dp} mb{p.micro_batch_size} {stages}"


# --------------------------------------------------------------------------- statistics


def ranks_of(values: list[float]) -> list[int]:
    """1 = smallest; ties share the smallest rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0] * len(values)
    for pos, i in enumerate(order):
        out[i] = pos + 1 if pos == 0 or values[order[pos - 1]] != values[i] else out[order[pos - 1]]
    return out


def spearman(a: list[float], b: list[float]) -> float:
    from scipy.stats import spearmanr

    if len(a) < 3:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def mape(pred: list[float], true: list[float]) -> float:
    """memx_hpc's MAPE (:func:`memx_hpc.model.metrics.mape`); NaN when nothing can be scored."""
    from memx_hpc.model.metrics import mape as project_mape

    m = project_mape(pred, true)
    return float("nan") if m is None else m




# --------------------------------------------------------------------------- profiling and fitting


def profile_and_fit(site: Site, job: TrainJob, store_path: Path, partitions: list[str]):
    """Measure what the store lacks on ``partitions``, then fit (or reuse) the predictor.
    Returns (predictor, description)."""
    from memx_hpc.planner import load_cost_model
    from memx_hpc.profile.store import ProfileStore
    from memx_hpc.slurm.dispatch import profile

    store = ProfileStore(store_path)
    t0 = time.monotonic()
    report = profile(site, job, store, partitions=partitions, progress=True)
    prof_s = time.monotonic() - t0
    if report.failed:
        raise SpecError(f"profiling left {report.failed} point(s) without a sample: "
                        + "; ".join(f.reason for f in report.failures[:3]))
    samples = store.samples()
    types = sorted({site.partition(p).gpu_type for p in partitions})
    lacking = [g for g in types if not any(s.point.gpu_type == g for s in samples)]
    if lacking:
        raise SpecError(f"the store has no samples of {lacking} after profiling")
    t1 = time.monotonic()
    # the planner's own loading (memx-hpc plan/search), without the calibration: no end-to-end run is used
    notes: list[str] = []
    model = load_cost_model(site, job, store_path, analytic=False, notes=notes, calibrate=False)
    fit_s = time.monotonic() - t1
    for n in notes:
        print(f"note: {n}")
    if any(model.provenance(g) == "datasheet-only" for g in types):
        raise SpecError(f"the planner's cost model still answers {types} from datasheet figures: " + "; ".join(notes))
    measured = sum(1 for s in samples if s.origin == "measured")
    desc = (f"XGBoost predictor fitted on {len(samples)} layer samples ({measured} measured by the profiler here; "
            f"{report.measured} new in {prof_s:.0f} s via {report.scheduler or 'nothing'}, {report.skipped} "
            f"already stored) in {fit_s:.1f} s; provenance "
            + ", ".join(f"{g}: {model.provenance(g)}" for g in types))
    return model, desc, {"profile_s": prof_s, "fit_s": fit_s, "samples": len(samples),
                         "new_points": report.measured, "skipped_points": report.skipped}


# --------------------------------------------------------------------------- scoring


def predicted_row(pred) -> dict:
    return {"ms": pred.iteration_ms, "alloc": max(s.peak_bytes - s.overhead_bytes for s in pred.stages),
            "footprint": max(s.peak_bytes for s in pred.stages), "util": pred.max_utilisation,
            "balance": pred.balance, "feasible": pred.feasible}


def score_model(rows: list[dict], name: str, weights) -> dict:
    """Top-1 under both rankings, Spearman and MAPE of one cost model's predictions."""
    from memx_hpc.search.objective import log_score

    preds = [r["pred"][name] for r in rows]
    pscore = [float(log_score(p["ms"], p["util"], p["balance"], weights)) if p["feasible"] else math.inf
              for p in preds]
    mscore = [r["meas_score"] for r in rows]
    meas_ms = [r["meas_ms"] for r in rows]
    feasible = [i for i, p in enumerate(preds) if p["feasible"]] or list(range(len(rows)))

    def top1(pred_vals: list[float], meas_vals: list[float]) -> dict:
        pick = min(feasible, key=lambda i: (pred_vals[i], i))
        best = min(range(len(rows)), key=lambda i: (meas_vals[i], i))
        order = sorted(range(len(rows)), key=lambda i: (meas_vals[i], i))
        return {"planner_top1": rows[pick]["plan"], "measured_top1": rows[best]["plan"], "hit": pick == best,
                "planner_top1_measured_rank": order.index(pick) + 1,
                "regret_pct": 100.0 * (meas_vals[pick] - meas_vals[best]) / abs(meas_vals[best])
                if meas_vals is meas_ms else None}

    return {
        "time_only": top1([p["ms"] for p in preds], meas_ms),
        "weighted_product": top1(pscore, mscore),
        "spearman_time": spearman([p["ms"] for p in preds], meas_ms),
        "spearman_score": spearman([pscore[i] for i in feasible], [mscore[i] for i in feasible]),
        "mape_time_pct": mape([p["ms"] for p in preds], meas_ms),
        "mape_alloc_pct": mape([p["alloc"] for p in preds], [r["meas_alloc"] for r in rows]),
        "mape_footprint_pct": mape([p["footprint"] for p in preds], [r["meas_footprint"] for r in rows]),
    }


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--site", default=str(ROOT / "site_configs" / "local.yaml"))
    ap.add_argument("--job", default=str(ROOT / "jobs" / "tiny-gpt.yaml"))
    ap.add_argument("--first", default="nvidia_a100", help="partition of the first (or only) stage")
    ap.add_argument("--second", default="amd_mi250", help="partition of the second pipeline stage")
    ap.add_argument("--iters", type=int, default=4, help="training iterations per plan (the first is warm-up)")
    ap.add_argument("--max-plans", type=int, default=0, help="run only the first N plans of the space (0: all)")
    ap.add_argument("--store", metavar="PATH", help="profile store to fill and fit on (default: a new one in a "
                                                    "temporary folder)")
    ap.add_argument("--weights", default=None, help="objective weights, e.g. time=1,memory=0.5,balance=0.5 "
                                                    "(default: the site's, else the objective's defaults)")
    ap.add_argument("--threads-per-rank", type=int, default=1,
                    help="CPUs per rank (--cpus-per-task) when the site does not set it")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each plan this many times and keep its fastest run (other load on the machine "
                         "only ever slows a run down, so the minimum is the least disturbed measurement)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each job")
    ap.add_argument("--json", metavar="FILE", help="also write every number to FILE")
    args = ap.parse_args(argv)

    from memx_hpc.model.api import AnalyticCostModel
    from memx_hpc.model.calibrate import leave_one_out
    from memx_hpc.model.compose import predict_plan
    from memx_hpc.search.objective import Weights, log_score, parse_weights
    from memx_hpc.slurm.local_cluster import START_HINT, slurm_available
    from memx_hpc.train.measure import measure_plan

    t_start = time.monotonic()
    if not slurm_available(timeout=5.0):
        print(f"Slurm does not answer; {START_HINT}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="memx-top1-") as tmp:
        try:
            site = load_site(args.site)
            job = load_job(args.job)
            default = (Weights(**dict(zip(("time", "memory", "balance"), site.objective_weights)))
                       if site.objective_weights else None)
            weights = parse_weights(args.weights, default=default)
            if job.distributed_optimizer and all(site.gpu(p.gpu_type).vendor == "cpu" for p in site.partitions):
                # The CPU trainer cannot shard optimizer state (gloo has no reduce-scatter): predict
                # what actually runs, not the sharded variant.
                job = dataclasses.replace(job, distributed_optimizer=False)
                print("note: CPU-only site: the distributed optimizer is off in runs and predictions alike")
            store_path = Path(args.store).resolve() if args.store else Path(tmp) / "store.h5"
            # one core per rank: the two ranks of a plan must not compete for the same core
            site = dataclasses.replace(
                site, store_path=str(store_path), work_dir=str(Path(tmp) / "runs"),
                partitions=tuple(p if p.cpus_per_task is not None
                                 else dataclasses.replace(p, cpus_per_task=args.threads_per_rank)
                                 for p in site.partitions))
            plans = small_space(site, job, first=args.first, second=args.second)
            if args.max_plans:
                plans = plans[:args.max_plans]
            print(f"site {site.name}, job {job.name}: {len(plans)} plans, {args.iters} iterations x {args.repeat} "
                  f"run(s) each; weights {weights.label()}", flush=True)
            print(f"profiling what {store_path} lacks on {args.first}, {args.second} ...", flush=True)
            fitted, fitted_desc, fit_info = profile_and_fit(site, job, store_path, [args.first, args.second])
            models = {"fitted": fitted, "roofline": AnalyticCostModel(site)}
            descs = {"fitted": fitted_desc,
                     "roofline": "datasheet roofline (AnalyticCostModel) with the site file's figures: what the "
                                 "planner uses before anything is profiled"}
            preds = {name: [predict_plan(p, site, job, m) for p in plans] for name, m in models.items()}
        except MemxError as e:
            print(f"top1_cpu: {e}", file=sys.stderr)
            return e.exit_code
        for name, d in descs.items():
            print(f"{name}: {d}")

        rows, records = [], []
        log_dir = Path(tmp) / "runs" / "verify"
        for i, plan in enumerate(plans):
            runs = []
            for k in range(max(args.repeat, 1)):
                t0, load0 = time.monotonic(), os.getloadavg()[0]
                rec = measure_plan(plan, site, job, iters=args.iters, log_dir=log_dir, workdir=str(ROOT),
                                   timeout_s=args.timeout, job_name=f"memx-top1-{i:02d}-{k}")
                runs.append((rec, time.monotonic() - t0, max(load0, os.getloadavg()[0])))
            rec, wall, load = min(runs, key=lambda x: x[0].iteration_ms)
            records.append(rec)
            cap = {g: site.gpu(g).memory_bytes for g in set(rec.gpu_type_by_rank.values())}
            util = [v / cap[rec.gpu_type_by_rank[r]] for r, v in rec.peak_footprint_bytes_by_rank.items()]
            row = {"plan": label(plan), "job_id": rec.job_id, "wall_s": wall, "load": load,
                   "meas_ms_runs": [x[0].iteration_ms for x in runs], "meas_ms": rec.iteration_ms,
                   "meas_alloc": rec.peak_allocated_max_bytes, "meas_footprint": rec.peak_footprint_bytes,
                   "meas_util": max(util), "meas_balance": max(util) / (sum(util) / len(util)),
                   "pred": {name: predicted_row(preds[name][i]) for name in models}}
            row["meas_score"] = float(log_score(row["meas_ms"], row["meas_util"], row["meas_balance"], weights))
            rows.append(row)
            print(f"  [{i + 1:2d}/{len(plans)}] {row['plan']:<40} measured {row['meas_ms']:8.1f} ms  fitted "
                  f"{row['pred']['fitted']['ms']:8.1f}  roofline {row['pred']['roofline']['ms']:8.1f}  "
                  f"(job {rec.job_id}, {wall:.0f} s, load {load:.1f})", flush=True)

        # the calibrated column: each plan predicted by a calibration fitted on the other plans' runs
        held = {h.key: h for h in leave_one_out(fitted, records, site, job)}
        for row, rec in zip(rows, records):
            h = held.get(rec.key)
            row["pred"]["fitted+calibration (LOO)"] = predicted_row(h.after) if h is not None else \
                dict(row["pred"]["fitted"])
        names = list(models) + ["fitted+calibration (LOO)"]

    from memx_hpc.tables import table

    MiB = 2**20
    print()
    table([[r["plan"], r["meas_ms"], r["pred"]["fitted"]["ms"], r["pred"]["fitted+calibration (LOO)"]["ms"],
            r["pred"]["roofline"]["ms"], r["meas_alloc"] / MiB, r["pred"]["fitted"]["alloc"] / MiB,
            r["pred"]["roofline"]["alloc"] / MiB, r["meas_footprint"] / MiB, r["pred"]["fitted"]["footprint"] / MiB,
            r["pred"]["fitted+calibration (LOO)"]["footprint"] / MiB, r["pred"]["roofline"]["footprint"] / MiB]
           for r in rows],
          ["plan", "meas ms", "fitted ms", "fit+cal ms", "roofline ms", "meas alloc MiB", "fitted", "roofline",
           "meas RSS MiB", "fitted", "fit+cal", "roofline"])

    scores = {name: score_model(rows, name, weights) for name in names}

    def hit(s: dict) -> str:
        return ("HIT" if s["hit"] else "miss") + f" (#{s['planner_top1_measured_rank']}" + \
            (f", +{s['regret_pct']:.1f}%" if s.get("regret_pct") else "") + ")"

    print()
    table([["time-only top-1"] + [hit(scores[n]["time_only"]) for n in names],
           [f"weighted top-1 ({weights.label()})"] + [hit(scores[n]["weighted_product"]) for n in names],
           ["Spearman, time"] + [f"{scores[n]['spearman_time']:.3f}" for n in names],
           ["Spearman, weighted score"] + [f"{scores[n]['spearman_score']:.3f}" for n in names],
           ["MAPE iteration time"] + [f"{scores[n]['mape_time_pct']:.1f}%" for n in names],
           ["MAPE peak allocated"] + [f"{scores[n]['mape_alloc_pct']:.1f}%" for n in names],
           ["MAPE footprint (RSS)"] + [f"{scores[n]['mape_footprint_pct']:.1f}%" for n in names]],
          ["", *names])
    best_t = min(rows, key=lambda r: r["meas_ms"])["plan"]
    best_w = min(rows, key=lambda r: r["meas_score"])["plan"]
    print(f"measured top-1: time-only {best_t}; weighted {best_w}")
    print("(#k: the planner's pick is the k-th best measured plan; +x%: how much slower it ran than the best)")
    print("fitted: layer samples only; fitted+calibration: each plan predicted from the OTHER plans' runs; "
          "roofline: datasheet figures only")
    print(f"total {time.monotonic() - t_start:.0f} s (profiling {fit_info['profile_s']:.0f} s, fit "
          f"{fit_info['fit_s']:.1f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps({"cost_models": {**descs, "fitted+calibration (LOO)":
                                                               "fitted, calibrated leave-one-out"},
                                               "fit": fit_info, "weights": weights.label(), "iters": args.iters,
                                               "scores": scores, "rows": rows}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
