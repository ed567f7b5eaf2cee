"""``memx-hpc fit``: fit the dual-output predictor on the profile store and report its error."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import add_json, add_site, emit_json, step, table

HELP = "fit the predictor on the profile store, print its cross-validated error, save it"
DESCRIPTION = """\
Fit the dual-output XGBoost predictor (per-layer time and activation memory) on
every sample in the profile store (measured, imported; augmented points are
re-derived from them), print its cross-validated error, and save it as .ubj next
to the store (or to --out). The error is leave-one-micro-batch-size-out: each
micro-batch size is held out in turn and predicted from the others, scoring only
points between profiled neighbours (interpolation).

examples:
  memx-hpc fit --site site_configs/local.yaml
  memx-hpc fit --site mysite.yaml --store /scratch/memx-store.h5 --json
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("fit", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_site(p)
    p.add_argument("--store", metavar="PATH", help="profile store (default: the site's store, then $MEMX_STORE)")
    p.add_argument("--out", metavar="PATH.ubj", help="where to save the predictor (default: <store>.predictor.ubj)")
    p.add_argument("--no-cv", action="store_true", help="skip the cross-validation (fit and save only)")
    p.add_argument("--no-augment", action="store_true", help="fit without interpolation augmentation")
    from .search import add_reference
    add_reference(p)
    add_json(p)
    return p


def run(args: argparse.Namespace) -> int:
    from ..errors import SpecError
    from ..model.api import with_store_figures
    from ..model.predictor import Predictor, cross_validate
    from ..planner import store_paths
    from ..profile.store import ProfileStore
    from ..spec import load_site

    site = load_site(args.site)
    store_path = store_paths(site, args.store).store
    from ..planner import start_store
    start_notes: list[str] = []
    start_store(site, store_path, start_notes, reference=False if args.no_reference else None)
    for n in start_notes:
        print(n, file=sys.stderr)
    if not store_path.is_file():
        raise SpecError("profile store not found; run 'memx-hpc profile' or 'memx-hpc profile import' first",
                        file=str(store_path))
    with step(f"fit: reading {store_path}"):
        store = ProfileStore(store_path)
        samples = store.samples()
        gpus = with_store_figures(site, store)  # CPU "devices": the speeds measured when profiling
    if not samples:
        raise SpecError("the profile store holds no samples", file=str(store_path))
    kw = {"augment": not args.no_augment}
    cv = None
    if not args.no_cv:
        from ..search.report import ProgressBar
        with step(f"fit: cross-validation on {len(samples):,} samples (one fit per held-out micro-batch size)"):
            cv = cross_validate(samples, gpus, progress=ProgressBar("fit: cross-validation folds"), **kw)
    with step(f"fit: fitting the predictor on {len(samples):,} samples"):
        predictor = Predictor(**kw)
        predictor.progress = lambda line: print(line, file=sys.stderr, flush=True)  # every 2 s of boosting
        predictor.fit(samples, gpus)
        predictor.progress = None
    out = Path(args.out) if args.out else store_paths(site, store_path).predictor
    predictor.save(out)
    gpu_types = sorted({s.point.gpu_type for s in samples})
    result = {"store": str(store_path), "predictor": str(out), "identity": predictor.identity,
              "data_hash": predictor.data_hash_, "samples": len(samples), "rows_fitted": predictor.n_samples_,
              "provenance": {g: predictor.provenance(g) for g in gpu_types}, "cross_validation": cv}
    if args.json:
        emit_json(result)
        return 0
    print(f"fitted on {len(samples)} samples ({predictor.n_samples_} rows with augmentation) from {store_path}")
    print(f"saved {out}  (identity {predictor.identity[:12]})")
    if cv is None:
        return 0
    if not cv["folds"]:
        print("cross-validation: no micro-batch size lies between two profiled ones; nothing to score")
        return 0
    print(f"\nleave-one-micro-batch-size-out error ({cv['folds']} folds, {cv['scored']} points scored):")
    rows = []
    for g, r in [("all", cv)] + sorted(cv["per_gpu_type"].items()):
        t, m = r["time"], r["memory"]
        rows.append([g, predictor.provenance(g) if g != "all" else "", t["n"], _pct(t["mape"]),
                     _pct(t["median_ape"]), _pct(t["max_ape"]), m["n"], _pct(m["mape"])])
    table(rows, ["gpu type", "data", "time n", "MAPE", "median", "max", "memory n", "memory MAPE"])
    return 0


def _pct(x: float) -> str:
    return "-" if x != x else f"{x:.1f}%"
