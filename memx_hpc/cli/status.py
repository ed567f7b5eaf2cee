"""``memx-hpc status``: what the tool sees — the site, Slurm, the store, the predictor, the cache."""

from __future__ import annotations

import argparse
import shutil

from .common import add_json, add_site, emit_json, table

HELP = "show what is in place: Slurm, the profile store, the fitted predictor, the cache"
DESCRIPTION = """\
Show the state a plan would start from: whether Slurm answers (and its partitions),
what the profile store holds per GPU type (measured, imported, augmented samples),
whether a fitted predictor is saved next to the store, and the prediction cache.

example:
  memx-hpc status --site site_configs/local.yaml
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("status", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_site(p)
    p.add_argument("--store", metavar="PATH", help="profile store (default: the site's, then $MEMX_STORE)")
    add_json(p)
    return p


def run(args: argparse.Namespace) -> int:
    from ..slurm.local_cluster import partitions, slurm_available
    from ..spec import load_site

    site = load_site(args.site)
    from ..planner import store_paths
    paths = store_paths(site, args.store)  # the same rule as plan/search
    store_path, cache_path = paths.store, paths.cache
    out: dict = {"site": site.name, "store": str(store_path), "cache": str(cache_path)}
    has_sbatch = shutil.which("sbatch") is not None
    up = slurm_available() if has_sbatch else False
    out["slurm"] = {"installed": has_sbatch, "answers": up}
    if up:
        found = partitions()
        out["slurm"]["partitions"] = {p.name: (p.name in found) for p in site.partitions}
    out["e2e_runs"] = 0
    records = []
    if store_path.exists():
        from ..profile.store import ProfileStore
        store = ProfileStore(store_path)
        out["store_summary"] = store.summary()
        records = store.e2e_records(site=site.name)
        out["e2e_runs"] = len(records)
    else:
        out["store_summary"] = []
    from ..search.report import coverage, coverage_table
    out["site_gpu_types"] = coverage(site, out["store_summary"], records)
    model_file = paths.predictor
    out["predictor"] = str(model_file) if model_file.exists() else None
    if args.json:
        emit_json(out)
        return 0
    print(f"site {site.name}")
    if not has_sbatch:
        print("slurm: not installed here (plans profile through local subprocesses)")
    elif not up:
        print("slurm: installed but not answering (scripts/slurm-local.sh start for the local cluster)")
    else:
        missing = [k for k, v in out["slurm"]["partitions"].items() if not v]
        print("slurm: answers" + (f"; partitions missing from sinfo: {', '.join(missing)}" if missing else
                                  "; every site partition is there"))
    print(f"store: {store_path}" + ("" if store_path.exists() else " (empty: nothing profiled or imported yet)"))
    print("the site's GPU types:")
    coverage_table(out["site_gpu_types"])
    if out["store_summary"]:
        print("the store (every GPU type it holds):")
        rows = []
        for r in out["store_summary"]:
            rows.append((r.get("gpu_type"), r.get("samples", r.get("total", "")),
                         ", ".join(f"{k} {v}" for k, v in sorted(r.get("by_origin", {}).items())),
                         ", ".join(f"{k} {v}" for k, v in sorted(r.get("by_kind", {}).items()))))
        table(rows, ["gpu type", "samples", "by origin", "by kind"])
    print(f"end-to-end runs measured on this site: {out['e2e_runs']}"
          + (" (plan, search and predict calibrate with them)" if out["e2e_runs"] else " (memx-hpc verify adds them)"))
    print(f"predictor: {out['predictor'] or 'not fitted yet (memx-hpc fit, or plan fits it)'}")
    print(f"cache: {cache_path}" + ("" if cache_path.exists() else " (none yet)"))
    return 0
