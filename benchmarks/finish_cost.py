"""What ``plan --finish`` costs over ``plan``: wall and CPU time side by side, on the local
Slurm (``scripts/slurm-local.sh start``) with a site from ``memx-hpc site discover``.

Both commands plan the same job on the same site from datasheet figures (no store);
``--finish`` also reads the cluster (scontrol), searches each set of partitions for its own
best plan, renders the candidates and asks ``sbatch --test-only`` about each. Every run is
its own process; CPU time is the process's (user + system), wall time includes the Slurm
clients' answers and whatever else the machine runs.

Run from the repository root:  .venv/bin/python benchmarks/finish_cost.py [--repeat N] [--job J]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "memx_hpc"]


def run(args: list[str]) -> tuple[float, float, dict]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(CLI + args, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each command (default 3)")
    ap.add_argument("--job", default="jobs/tiny-gpt.yaml", help="job file (default jobs/tiny-gpt.yaml)")
    ap.add_argument("--finish", default="1000", help="the --finish goal (default 1000 iterations)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="memx-finish-bench-") as tmp:
        site = Path(tmp) / "site.yaml"
        r = subprocess.run(CLI + ["site", "discover", "--out", str(site)], capture_output=True, text=True, cwd=ROOT)
        if r.returncode != 0:
            sys.exit(f"site discover failed: {r.stderr.strip()} (is the local Slurm running?)")
        common = ["plan", "--site", str(site), "--job", a.job, "--no-profile", "--store", os.path.join(tmp, "none.h5"),
                  "--json"]
        rows = []
        for i in range(a.repeat):
            w0, c0, _ = run(common + ["--out", os.path.join(tmp, f"p{i}")])
            w1, c1, s1 = run(common + ["--out", os.path.join(tmp, f"f{i}"), "--finish", a.finish])
            rows.append((w0, c0, w1, c1, len(s1["finish"]["candidates"])))
    print(f"job {a.job}, site from 'memx-hpc site discover' on this cluster, --finish {a.finish}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'run':>3}  {'plan wall s':>11}  {'cpu s':>6}  {'--finish wall s':>15}  {'cpu s':>6}  "
          f"{'wall ratio':>10}  {'test-only asks':>14}")
    for i, (w0, c0, w1, c1, n) in enumerate(rows, 1):
        print(f"{i:>3}  {w0:>11.2f}  {c0:>6.2f}  {w1:>15.2f}  {c1:>6.2f}  {w1 / w0:>10.2f}  {n:>14}")
    mw0 = sorted(r[0] for r in rows)[len(rows) // 2]
    mw1 = sorted(r[2] for r in rows)[len(rows) // 2]
    print(f"median wall: plan {mw0:.2f} s, plan --finish {mw1:.2f} s ({mw1 / mw0:.2f}x)")


if __name__ == "__main__":
    main()
