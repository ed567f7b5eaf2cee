"""``memx-hpc fit``: fit the dual-output predictor on the profile store and report its error."""

from __future__ import annotations

import argparse
import sys

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
    from ..planner import FitRequest, fit

    res = fit(FitRequest(site=args.site, store=args.store, out=args.out, cross_validate=not args.no_cv,
                         augment=not args.no_augment, reference=False if args.no_reference else None),
              step=step, note=lambda n: print(n, file=sys.stderr))
    predictor, cv, store_path, out = res.predictor, res.cross_validation, res.store, res.path
    if args.json:
        emit_json(res.to_json())
        return 0
    print(f"fitted on {res.samples} samples ({predictor.n_samples_} rows with augmentation) from {store_path}")
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
