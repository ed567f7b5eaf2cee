"""Search speed: configurations per second with and without the signature cache, with 1 and
2 MPI ranks, on the 20-GPU example site and on 40/60-GPU versions of it; peak RSS per row.

MemX (the paper) reports 31,240 configurations in 26.5 s (1,179 configurations/s). The
goals here: a space of that size in <= 1 s on one core, cost growing linearly with the
number of plans, and bounded memory (the space is streamed; only the top-K, the Pareto
front and 8 bytes per feasible plan are kept): <= 1 GiB RSS for millions of plans.

Rows:
  paper-scale  the example site (8x A100-80, 8x MI250X GCD, 4x V100-32), GPT-3 2.7B,
               layers on an 8-layer grid: a MemX-sized space (tens of thousands)
  default      the same with the default 4-layer grid (the plans 'memx-hpc plan' searches)
  40 / 60 GPUs the site with every partition's nodes doubled / tripled
  60 GPUs, 8 stages  up to 8 pipeline stages: millions of plans

Modes: ``cache`` composes from the table of unique stage signatures (each predicted
once); ``no cache`` asks the cost model for every stage of every plan (what the
signature cache saves). Every row runs in its own process (peak RSS is the process's
high-water mark; for 2 ranks the larger of the two), pinned with ``taskset`` to one
core for 1 rank and two cores for 2 ranks, with one BLAS/OpenMP thread per process.
Wall time is printed beside CPU time: other work on the machine inflates wall time.

The cost model is the XGBoost predictor fitted on Sailor's published profiles
(../shared/data/sailor/profiles; Sailor, ETH Zurich, MIT licence) — used here for its
prediction cost only (accuracy: benchmarks/end_to_end.py). ``--model analytic`` uses the
datasheet roofline instead (no data needed).

Run from the repository root:  .venv/bin/python benchmarks/search_speed.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MEMX_PAPER = {"plans": 31_240, "seconds": 26.5}


def _site_and_job(gpus: int):
    from memx_hpc.planner import scale_site
    from memx_hpc.spec import load_job, load_site
    site = load_site(ROOT / "site_configs" / "example-cross-vendor.yaml")
    if gpus != site.total_gpus:
        site = scale_site(site, gpus)
    return site, load_job(ROOT / "jobs" / "gpt3-2.7b.yaml")


def _cost_model(kind: str, model_path: str | None, site):
    from memx_hpc.model.api import AnalyticCostModel
    if kind == "analytic":
        return AnalyticCostModel(site)
    from memx_hpc.model.predictor import Predictor
    return Predictor.load(model_path, site=site)


def worker(spec: dict) -> None:
    """One row: build the space, search it, print the stats as one JSON line (rank 0)."""
    from memx_hpc.search.cache import PredictionCache
    from memx_hpc.search.engine import SearchOptions, launched_under_mpi, mpi_comm, search
    from memx_hpc.search.space import PlanSpace, SpaceOptions
    site, job = _site_and_job(spec["gpus"])
    model = _cost_model(spec["model"], spec.get("model_path"), site)
    comm = mpi_comm() if launched_under_mpi() else None
    t0, c0 = time.perf_counter(), time.process_time()  # the space's construction counts too
    space = PlanSpace(site, job, SpaceOptions(layer_granularity=spec["granularity"],
                                              max_pipeline_stages=spec["max_stages"]))
    cache = PredictionCache(identity=model.identity) if spec["cache"] else None  # in memory: a cold cache
    r = search(space, model, options=SearchOptions(top_k=10, use_cache=spec["cache"]), cache=cache, comm=comm)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if comm is not None:
        cpu = comm.allreduce(cpu)
    if comm is None or comm.Get_rank() == 0:
        best = r.top[0].prediction.iteration_ms if r.top else None
        print(json.dumps({"plans": r.stats.plans, "feasible": r.stats.feasible, "wall_s": wall, "cpu_s": cpu,
                          "search_s": wall, "ranks": r.stats.ranks, "rss": r.stats.peak_rss_bytes,
                          "predicted": r.stats.cache["predicted"], "lookups": r.stats.cache["lookups"],
                          "best_ms": best, "top": [s.index for s in r.top]}), flush=True)


def run_row(spec: dict, ranks: int, root: Path = ROOT) -> dict:
    """One row in its own process, with the code of the checkout at ``root`` (``--compare-with``:
    another checkout's package and its own worker)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=str(root))
    for v in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"):
        env.pop(v, None)
    cmd = [sys.executable, str(root / "benchmarks" / "search_speed.py"), "--worker", json.dumps(spec)]
    if ranks > 1:
        mpiexec = Path(sys.executable).parent / "mpiexec"
        cmd = [str(mpiexec if mpiexec.exists() else shutil.which("mpiexec") or "mpiexec"), "-n", str(ranks)] + cmd
    ncpu = os.cpu_count() or 1
    if shutil.which("taskset") and ncpu >= ranks:
        cmd = ["taskset", "-c", ",".join(str(i) for i in range(ranks))] + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"row failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="skip the 60-GPU 8-stage space (millions of plans)")
    ap.add_argument("--model", choices=("predictor", "analytic"), default="predictor")
    ap.add_argument("--compare-with", metavar="CHECKOUT", type=Path,
                    help="time only the paper-scale and default rows (1 rank, cache), each with this checkout's "
                         "code and with another checkout's (e.g. a worktree of an earlier commit), side by side, "
                         "and print the ratio of microseconds per plan")
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return

    from memx_hpc.tables import table
    from memx_hpc.datapaths import SOURCES, sailor_dir

    tmp = Path(tempfile.mkdtemp(prefix="memx-speed-"))
    model_path = None
    if args.model == "predictor" and args.compare_with is None:
        from memx_hpc.model.predictor import fit_or_load
        from memx_hpc.profile.importers import import_sailor
        site, _ = _site_and_job(20)
        skipped: list[str] = []
        samples = import_sailor(sailor_dir(), skipped=skipped)
        t = time.perf_counter()
        model_path = str(tmp / "predictor.ubj")
        fit_or_load(samples, model_path, site)
        gpus = sorted({s.point.gpu_type for s in samples})
        print(f"cost model: XGBoost predictor fitted in {time.perf_counter() - t:.1f} s on {len(samples)} samples "
              f"imported from {sailor_dir() / 'profiles'} ({SOURCES['sailor']}); GPU types {', '.join(gpus)}. "
              f"Used for its prediction cost only; the site's MI250X-GCD and V100-32 are extrapolated.")
        for s in skipped:
            print(f"  skipped: {s}")
    else:
        print("cost model: datasheet roofline (AnalyticCostModel)")

    if args.compare_with is not None:
        # a predictor file names the version of the prediction code that fitted it: the other
        # checkout may refuse this one's, so both sides compare with the datasheet roofline
        _compare(args.compare_with.resolve(), "analytic", None)
        shutil.rmtree(tmp, ignore_errors=True)
        return
    rows_spec = [
        ("paper-scale (8-layer grid)", 20, 8, None),
        ("default (4-layer grid)", 20, None, None),
        ("40 GPUs", 40, None, None),
        ("60 GPUs", 60, None, None),
    ]
    if not args.quick:
        rows_spec.append(("60 GPUs, up to 8 stages", 60, None, 8))
    rows = []
    results = []
    for name, gpus, g, stages in rows_spec:
        modes = [("cache", True, 1), ("cache", True, 2)]
        if name.startswith("paper"):
            modes.insert(1, ("no cache", False, 1))
        for mode, use_cache, ranks in modes:
            spec = {"gpus": gpus, "granularity": g, "max_stages": stages, "cache": use_cache, "model": args.model,
                    "model_path": model_path}
            r = run_row(spec, ranks)
            results.append((name, mode, ranks, r))
            rows.append([name, gpus, f"{r['plans']:,}", mode, ranks, f"{r['predicted']:,}", f"{r['search_s']:.2f}",
                         f"{r['cpu_s']:.2f}", f"{r['plans'] / r['search_s']:,.0f}",
                         f"{r['search_s'] / r['plans'] * 1e6:.2f}", f"{r['rss'] / 2**20:.0f}"])
            print(f"  {name:<28} {mode:<8} {ranks} rank(s): {r['plans']:,} plans in {r['search_s']:.2f} s",
                  file=sys.stderr, flush=True)
    print()
    table(rows, ["space", "GPUs", "plans", "mode", "ranks", "predicted", "wall s", "cpu s (all ranks)", "plans/s",
                 "us/plan", "peak RSS MiB"])
    print("wall s: enumeration + prediction + composition + top-K/Pareto, from building the space to the "
          "result; plans/s and us/plan from wall time")
    print()
    print(f"MemX paper: {MEMX_PAPER['plans']:,} configurations in {MEMX_PAPER['seconds']} s "
          f"({MEMX_PAPER['plans'] / MEMX_PAPER['seconds']:,.0f}/s).")
    by = {(n, m, k): r for n, m, k, r in results}
    paper = by[("paper-scale (8-layer grid)", "cache", 1)]
    nocache = by[("paper-scale (8-layer grid)", "no cache", 1)]
    per_31k = paper["search_s"] / paper["plans"] * MEMX_PAPER["plans"]
    print(f"paper-scale, 1 rank, cache: {paper['plans']:,} plans in {paper['search_s']:.2f} s -> "
          f"{MEMX_PAPER['plans']:,} plans in {per_31k:.2f} s at this rate (goal <= 1 s: "
          f"{'met' if per_31k <= 1 else 'NOT met'}); without the cache {nocache['search_s']:.1f} s "
          f"({nocache['search_s'] / paper['search_s']:.0f}x slower, {nocache['predicted']:,} predictions "
          f"instead of {paper['predicted']:,}).")
    same = all(by[(n, "cache", 1)]["top"] == by[(n, "cache", 2)]["top"] for n, *_ in rows_spec)
    print(f"1 and 2 ranks return the same top-10 in every space: {same}")
    ones = [(r["plans"], r["search_s"]) for n, m, k, r in results if m == "cache" and k == 1]
    import numpy as np
    x = np.array([p for p, _ in ones], dtype=float)
    y = np.array([s for _, s in ones])
    slope, icpt = np.polyfit(x, y, 1)
    pred = slope * x + icpt
    r2 = 1 - ((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    print(f"linear fit of search time on plans (1 rank, cache): {slope * 1e6:.2f} us/plan + {icpt:.2f} s, "
          f"R^2 = {r2:.3f}")
    big = max(results, key=lambda t: t[3]["plans"])
    print(f"largest space: {big[3]['plans']:,} plans, peak RSS {big[3]['rss'] / 2**20:.0f} MiB "
          f"(goal <= 1024 MiB: {'met' if big[3]['rss'] <= 2**30 else 'NOT met'})")
    shutil.rmtree(tmp, ignore_errors=True)


def _compare(other: Path, model: str, model_path: str | None) -> None:
    """Microseconds per plan of this checkout against ``other`` on the same rows, alternating
    (other, this, other, this) so that load on the machine falls on both; the best of two each."""
    from memx_hpc.tables import table
    if not (other / "benchmarks" / "search_speed.py").is_file():
        raise SystemExit(f"--compare-with {other}: no benchmarks/search_speed.py there (a checkout of this project?)")
    rows = []
    for name, g in (("paper-scale (8-layer grid)", 8), ("default (4-layer grid)", None)):
        spec = {"gpus": 20, "granularity": g, "max_stages": None, "cache": True, "model": model,
                "model_path": model_path}
        runs: dict[str, list[dict]] = {"before": [], "after": []}
        for _ in range(2):
            runs["before"].append(run_row(spec, 1, other))
            runs["after"].append(run_row(spec, 1, ROOT))
        best = {k: min(v, key=lambda r: r["search_s"] / r["plans"]) for k, v in runs.items()}
        us = {k: r["search_s"] / r["plans"] * 1e6 for k, r in best.items()}
        rows.append([name, f"{best['before']['plans']:,}", f"{us['before']:.2f}", f"{best['after']['plans']:,}",
                     f"{us['after']:.2f}", f"{us['after'] / us['before']:.2f}"])
    table(rows, ["space", f"plans ({other.name})", "us/plan", f"plans ({ROOT.name})", "us/plan", "ratio"])
    print(f"ratio: microseconds per plan of {ROOT} over {other} (1 rank, cache, best of 2 alternating runs)")


if __name__ == "__main__":
    main()
