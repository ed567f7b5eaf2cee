"""Profiling cost: what the profiler's tasks really took, beside the full grid and trial runs.

Measured, not estimated. Every profiling task records how long it ran on its node
(``TaskResult.wall_s``, rank 0, kept in the job ledger ``<store>.jobs.json`` when the
login node collects it), and every link-curve job records its ranks' seconds in the
store's ``/comm`` provenance (``task_seconds``). This script sums those per GPU type:
device-seconds = task seconds x ranks. The store is the one given with ``--store``, or,
by default, a fresh one filled by profiling the local site for real (through its Slurm
when ``sinfo`` answers, else submitit's local executor) with its link curves.

Beside it, for the local site and the 20-GPU cross-vendor example (GPT-3 2.7B and
Llama-2 7B) as dry runs: the number of points of the minimal set and of the full grid
per GPU type, and the cost of the full grid at the measured seconds per point (a
scaling of a measurement, labelled so), and what profiling every configuration end to
end would cost at the MemX paper's rate (about 17 days for 31,240 configurations, i.e.
~47 s of the whole cluster per configuration).

Goal: the minimal set at most 10 % of the full layer grid.

The machine this runs on may be shared: measured seconds include contention; say so.

Run from the repository root:  .venv/bin/python benchmarks/profiling_cost.py [--store S.h5] [--no-links]
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

from memx_hpc.profile.points import full_grid, grid_axes, layer_points, minimal_set  # noqa: E402
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


def measured_cost(store_path: Path) -> dict:
    """Per GPU type: tasks, points, task-seconds x ranks (from the job ledger); and the link
    curves' jobs and seconds (from the store's /comm provenance)."""
    from memx_hpc.profile.comm import read_comm_rows
    from memx_hpc.profile.ledger import Ledger

    per: dict[str, dict] = {}
    for e in Ledger.beside(store_path).load().entries.values():
        d = per.setdefault(e.gpu_type, {"tasks": 0, "points": 0, "device_s": 0.0, "failed": 0, "untimed": 0})
        if e.state != "collected":
            d["failed"] += 1
            continue
        d["tasks"] += 1
        d["points"] += len(e.points)
        if e.wall_s is not None:
            d["device_s"] += e.wall_s * e.world_size
        else:
            d["untimed"] += 1
    links = {"jobs": set(), "curves": 0, "device_s": 0.0}
    for row in read_comm_rows(store_path):
        prov = row.get("provenance", {})
        if row["curve"]["provenance"] != "measured":
            continue
        links["curves"] += 1
        job = prov.get("slurm_job_id")
        if job not in links["jobs"]:
            links["jobs"].add(job)
            links["device_s"] += float(prov.get("task_seconds", 0.0))
    return {"per_type": per, "links": links}


def profile_local(with_links: bool) -> tuple[Path, float, object]:
    """Profile the local site's minimal set (and its links) into a fresh store; returns it."""
    from memx_hpc.profile.runner import RunSettings
    from memx_hpc.profile.store import ProfileStore
    from memx_hpc.profile.campaign import profile

    site, job = load_site(REPO / CASES[0][0]), load_job(REPO / CASES[0][1])
    d = Path(tempfile.mkdtemp(prefix="memx-profiling-cost-"))
    site = dataclasses.replace(site, work_dir=str(d / "runs"))
    store = ProfileStore(d / "store.h5")
    t0 = time.monotonic()
    rep = profile(site, job, store, progress=False, settings=RunSettings())
    if with_links and rep.scheduler == "slurm":
        from memx_hpc.profile.link_campaign import profile_comm
        lrep = profile_comm(site, store.path, d / "runs" / "comm")
        for f in lrep.failures:
            print(f"links failed: {f}")
    return store.path, time.monotonic() - t0, rep


def report(store_path: Path, wall: float | None = None, scheduler: str = "") -> dict:
    cost = measured_cost(store_path)
    rows = []
    for g, d in sorted(cost["per_type"].items()):
        per_pt = d["device_s"] / d["points"] if d["points"] else float("nan")
        rows.append([g, d["tasks"], d["points"], f"{d['device_s']:.1f}", f"{per_pt:.2f}", d["failed"], d["untimed"]])
    lk = cost["links"]
    if lk["curves"]:
        rows.append(["links (p2p, all-reduce)", len(lk["jobs"]), lk["curves"], f"{lk['device_s']:.1f}",
                     f"{lk['device_s'] / lk['curves']:.2f}", 0, 0])
    print(f"Measured cost of the profiling recorded with {store_path}"
          + (f" ({scheduler}, wall {wall:.0f} s from submission to the last result)" if wall else "") + ":")
    _table(rows, ["gpu type", "tasks", "points", "device-s", "device-s / point", "failed tasks", "untimed tasks"])
    print("device-s: each task's run time on its node (rank 0) x its ranks, from the job ledger; links from the "
          "store's /comm provenance. Shared machine: the seconds include contention.")
    return cost


def dry_rows(cost: dict | None) -> None:
    per_type: list[list[str]] = []
    totals: list[list[str]] = []
    s_per_point = None
    if cost:
        pts = sum(d["points"] for d in cost["per_type"].values())
        secs = sum(d["device_s"] for d in cost["per_type"].values())
        s_per_point = secs / pts if pts else None
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
                             f"{len(m)}/{len(f)}", f"{100 * len(m) / len(f):.1f}%"])
        n_cfg = _space_size(site, job)
        e2e = n_cfg * E2E_S_PER_CONFIG * site.total_gpus if n_cfg is not None else None
        local = site_file == CASES[0][0]
        scaled_min = len(mini) * s_per_point if s_per_point and local else None
        scaled_full = len(full) * s_per_point if s_per_point and local else None
        totals.append([f"{site.name}/{job.name}", str(site.total_gpus),
                       f"{len(layer_points(mini))}/{len(layer_points(full))}",
                       f"{100 * len(layer_points(mini)) / len(layer_points(full)):.1f}%",
                       f"{len(mini)}/{len(full)}", f"{100 * len(mini) / len(full):.1f}%",
                       _fmt_s(scaled_min) if scaled_min else "-", _fmt_s(scaled_full) if scaled_full else "-",
                       f"{n_cfg:,}" if n_cfg is not None else "n/a",
                       _fmt_s(e2e) if e2e else "n/a"])
    print("\nPer GPU type (dry run): minimal set / full grid")
    _table(per_type, ["site/job", "gpu type", "TPxMBSxRC", "layer pts", "share", "all pts", "share"])
    print()
    print(f"Per site: minimal set against the full grid and against end-to-end trial runs "
          f"(MemX: {MEMX_E2E_CONFIGS:,} configurations in 17 days = {E2E_S_PER_CONFIG:.0f} s each)")
    _table(totals, ["site/job", "GPUs", "layer pts", "share", "all pts", "share", "min dev-s (measured/pt)",
                    "grid dev-s (measured/pt)", "e2e configs", "e2e dev-s (MemX rate)"])
    print("min/grid dev-s: the points times the measured device-seconds per point above (local site only: the GPU "
          "sites were not profiled here); e2e: the MemX paper's rate times the site's GPUs.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, default=None,
                    help="report the profiling recorded with this store (its job ledger and /comm table) instead of "
                         "profiling the local site now")
    ap.add_argument("--no-links", action="store_true", help="do not measure the local site's link curves")
    args = ap.parse_args(argv)
    if args.store is not None:
        cost = report(args.store)
    else:
        path, wall, rep = profile_local(not args.no_links)
        print(f"profiled the local site: {rep.measured} measured, {rep.infeasible} infeasible, {rep.failed} failed "
              f"in {len(rep.job_ids)} job(s)")
        cost = report(path, wall, rep.scheduler)
    dry_rows(cost)
    return 0


if __name__ == "__main__":
    sys.exit(main())
