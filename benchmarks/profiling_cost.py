"""Profiling cost: the minimal set against the full grid and against end-to-end trial runs.

For the local site (tiny GPT) and the 20-GPU cross-vendor example (GPT-3 2.7B and
Llama-2 7B), as dry runs: per GPU type, the number of points of the minimal set and of
the full grid (layer points alone, and all kinds), and their estimated device-seconds
(``memx_hpc.profile.points.estimate_seconds``: a start-up per point plus warm-up and
timed passes at 35 % of the datasheet peak - a planning figure, not a measurement).

The third column is what profiling every configuration end to end would cost: the
number of plans in the search space (``memx_hpc.search.space.PlanSpace``) times the
MemX paper's own rate, about 17 days for 31,240 configurations, i.e. ~47 s of wall
time per configuration on the whole cluster; device-seconds multiply that by the
site's GPU count (a trial run holds the test cluster).

``--run`` also profiles the local site for real (through Slurm when it answers, else
submitit's local executor) into a temporary store and prints the measured wall time
and task-seconds next to the estimate.

Goal: the minimal set at most 10 % of the full layer grid. The minimal set has a fixed
size per GPU type (6 layer points with three recompute modes), so the share depends on
the grid: see the printed rows.

Run from the repository root:  .venv/bin/python benchmarks/profiling_cost.py [--run]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memx_hpc.profile.points import estimate_seconds, full_grid, grid_axes, layer_points, minimal_set  # noqa: E402
from memx_hpc.spec import load_job, load_site  # noqa: E402

#: MemX paper: profiling every configuration end to end "about 17 days for 31,240 configurations".
MEMX_E2E_SECONDS = 17 * 86400
MEMX_E2E_CONFIGS = 31_240
E2E_S_PER_CONFIG = MEMX_E2E_SECONDS / MEMX_E2E_CONFIGS

CASES = [
    ("site_configs/local.yaml", "jobs/tiny-gpt.yaml"),
    ("site_configs/example-cross-vendor.yaml", "jobs/gpt3-2.7b.yaml"),
    ("site_configs/example-cross-vendor.yaml", "jobs/llama2-7b.yaml"),
]


def _fmt_s(s: float) -> str:
    if s >= 86400:
        return f"{s / 86400:.1f} d"
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    return f"{s:.0f} s"


def _table(rows: list[list[str]], header: list[str]) -> None:
    w = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print("  ".join(h.ljust(w[i]) for i, h in enumerate(header)))
    print("  ".join("-" * x for x in w))
    for r in rows:
        print("  ".join(str(c).rjust(w[i]) if i else str(c).ljust(w[i]) for i, c in enumerate(r)))


def _space_size(site, job) -> int | None:
    try:
        from memx_hpc.search.space import PlanSpace
    except ImportError:
        return None
    return len(PlanSpace(site, job))


def dry_rows() -> None:
    per_type: list[list[str]] = []
    totals: list[list[str]] = []
    for site_file, job_file in CASES:
        site, job = load_site(REPO / site_file), load_job(REPO / job_file)
        full, mini = full_grid(site, job), minimal_set(site, job)
        for ax in grid_axes(site, job):
            f = [p for p in full if p.gpu_type == ax.gpu_type]
            m = [p for p in mini if p.gpu_type == ax.gpu_type]
            fl, ml = layer_points(f), layer_points(m)
            per_type.append([f"{site.name}/{job.name}", ax.gpu_type,
                             f"{len(ax.tps)}x{len(ax.micro_batch_sizes)}x{len(ax.recompute_modes)}",
                             f"{len(ml)}/{len(fl)}", f"{100 * len(ml) / len(fl):.1f}%",
                             f"{len(m)}/{len(f)}", f"{100 * len(m) / len(f):.1f}%",
                             _fmt_s(sum(estimate_seconds(site, p) for p in m)),
                             _fmt_s(sum(estimate_seconds(site, p) for p in f))])
        est_min = sum(estimate_seconds(site, p) for p in mini)
        est_full = sum(estimate_seconds(site, p) for p in full)
        n_cfg = _space_size(site, job)
        e2e = n_cfg * E2E_S_PER_CONFIG * site.total_gpus if n_cfg is not None else None
        totals.append([f"{site.name}/{job.name}", str(site.total_gpus),
                       f"{len(layer_points(mini))}/{len(layer_points(full))}",
                       f"{100 * len(layer_points(mini)) / len(layer_points(full)):.1f}%",
                       f"{len(mini)}/{len(full)}", f"{100 * len(mini) / len(full):.1f}%",
                       _fmt_s(est_min), _fmt_s(est_full),
                       f"{n_cfg:,}" if n_cfg is not None else "n/a",
                       _fmt_s(e2e) if e2e else "n/a",
                       f"{e2e / est_min:,.0f}x" if e2e else "n/a"])
    print("Per GPU type (dry run): minimal set / full grid")
    _table(per_type, ["site/job", "gpu type", "TPxMBSxRC", "layer pts", "share", "all pts", "share",
                      "est dev-s min", "est dev-s grid"])
    print()
    print(f"Per site: minimal set against the full grid and against end-to-end trial runs "
          f"(MemX: {MEMX_E2E_CONFIGS:,} configurations in 17 days = {E2E_S_PER_CONFIG:.0f} s each)")
    _table(totals, ["site/job", "GPUs", "layer pts", "share", "all pts", "share", "est dev-s min",
                    "est dev-s grid", "e2e configs", "e2e dev-s", "e2e / min"])


def run_local(partitions: list[str] | None) -> None:
    from memx_hpc.profile.runner import RunSettings
    from memx_hpc.profile.store import ProfileStore
    from memx_hpc.slurm.dispatch import profile

    site, job = load_site(REPO / CASES[0][0]), load_job(REPO / CASES[0][1])
    with tempfile.TemporaryDirectory() as d:
        site = dataclasses.replace(site, work_dir=str(Path(d) / "runs"))
        store = ProfileStore(Path(d) / "store.h5")
        t0 = time.monotonic()
        rep = profile(site, job, store, partitions=partitions, progress=True, settings=RunSettings())
        wall = time.monotonic() - t0
        types = {site.gpu(q.gpu_type).name for q in site.partitions if partitions is None or q.name in partitions}
        est = sum(estimate_seconds(site, p) for p in minimal_set(site, job) if p.gpu_type in types)
        print()
        print(f"Real run of the minimal set on the local site ({rep.scheduler}): {rep.measured} measured, "
              f"{rep.infeasible} infeasible, {rep.failed} failed in {len(rep.job_ids)} job(s); "
              f"wall {wall:.0f} s (estimated {est:.0f} device-s)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="store_true", help="also profile the local site for real")
    ap.add_argument("--partition", action="append", help="with --run: only these partitions")
    args = ap.parse_args(argv)
    dry_rows()
    if args.run:
        run_local(args.partition)
    return 0


if __name__ == "__main__":
    sys.exit(main())
