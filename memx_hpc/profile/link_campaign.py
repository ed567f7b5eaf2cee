"""The link campaign: the communication-curve jobs of :mod:`memx_hpc.profile.comm`, run through Slurm.

Each job is an sbatch script (a hetjob with one component per partition for a pair of
partitions: ``srun A : B`` gives one step whose ranks are contiguous across the
components, each component with its own partition's setup, environment and Python).
The login node submits the jobs one at a time (a job waits for the previous one to end),
so no measurement shares its links with another, reads what rank 0 wrote, and stores
the curves in the profile store's ``/comm``
table (:func:`memx_hpc.profile.comm.write_comm_curves`). What each component asks of Slurm
is its :class:`~memx_hpc.slurm.request.SlurmRequest`; writing, checking, submitting and
waiting are :mod:`memx_hpc.slurm.submit`'s.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from ..errors import SpecError, SystemFailure
from ..slurm.request import SlurmRequest
from ..slurm.submit import cancel, launch, wait
from .campaign import resolve_python
from .comm import COMM_SIZES_BYTES, CommJob, comm_jobs, write_comm_curves

__all__ = ["CommReport", "render_comm_script", "profile_comm", "main"]


# --------------------------------------------------------------------------- the job script


def render_comm_script(job: CommJob, site: Any, *, task_file: Path, out_file: Path, log_dir: Path) -> str:
    """The sbatch script of ``job``: a hetjob for ``cross`` (one component per partition),
    a plain job otherwise. Every value that reaches the shell is quoted."""
    q = shlex.quote
    requests = [SlurmRequest.of(site, name, nodes=job.nodes[k], tasks_per_node=job.tasks_per_node[k], job_wide=k == 0,
                                **({"job_name": f"memx-comm-{job.name}",
                                    "output": str(log_dir / f"comm-{job.name}-%j.out")} if k == 0 else {}))
                for k, name in enumerate(job.partitions)]
    lines = ["#!/bin/bash"]
    for k, req in enumerate(requests):
        lines += (["#SBATCH hetjob"] if k else []) + req.sbatch_lines()
    # one step over all components (``srun A : B``: ranks contiguous across them), each
    # component with its own partition's setup lines, environment and Python
    root = Path(__file__).resolve().parents[2]
    cmds = []
    for name, req in zip(job.partitions, requests):
        # each setup line through ``eval`` and one command per line, so a setup line ending in a
        # comment (or any other checked line) cannot swallow the commands after it
        body = list(req.setup) + [f"export PYTHONPATH={q(str(root))}${{PYTHONPATH:+:$PYTHONPATH}}"]
        python = req.launcher(resolve_python(site, site.partition(name)))
        body.append(f"exec {' '.join(q(w) for w in python)} -m memx_hpc.profile.comm worker "
                    f"--task {q(str(task_file))} --out {q(str(out_file))}")
        opts = " ".join(o.word() for o in req.srun_options())
        cmds.append(f"{opts} bash -c {q(chr(10).join(body))}")
    lines.append("srun " + " : ".join(cmds))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- on the login node


@dataclass(frozen=True, kw_only=True)
class CommJobRun:
    """One comm job that ran to the end: its name, Slurm's id, its ranks and its wall time."""

    job: str
    slurm_job_id: str
    ranks: int
    wall_s: float


@dataclass(frozen=True, kw_only=True)
class CommReport:
    """What :func:`profile_comm` did: curves written, the jobs that ran, and those that failed (with why)."""

    written: int = 0
    jobs: tuple[CommJobRun, ...] = ()
    failures: tuple[str, ...] = ()
    task_seconds: float = 0.0  # measured: each job's rank-0 run time times its ranks


def profile_comm(site: Any, store_path: Path, work_dir: Path, *, sizes_bytes: Sequence[int] = COMM_SIZES_BYTES,
                 timeout_s: float = 600.0, jobs: Sequence[CommJob] | None = None) -> CommReport:
    """Submit every comm job of ``site`` through ``sbatch``, wait for them, store the curves."""
    work_dir.mkdir(parents=True, exist_ok=True)
    jobs = list(jobs) if jobs is not None else comm_jobs(site, sizes_bytes=sizes_bytes)
    deadline = time.monotonic() + timeout_s
    curves: list[dict] = []
    runs: list[CommJobRun] = []
    failures: list[str] = []
    task_seconds = 0.0
    for job in jobs:  # one at a time: no measurement shares its links (or its cores) with another
        try:
            run, rows = _run_one(job, site, work_dir, timeout_s=max(deadline - time.monotonic(), 1.0))
        except _JobFailed as e:
            failures.append(f"{job.name}: {e}")
            continue
        task_seconds += float(rows[0]["provenance"].get("task_seconds", 0.0)) if rows else 0.0
        runs.append(run)
        curves += rows
    written = write_comm_curves(store_path, curves) if curves else 0
    return CommReport(written=written, jobs=tuple(runs), failures=tuple(failures), task_seconds=task_seconds)


class _JobFailed(Exception):
    """A comm job that gave no curves (the message says why); the campaign goes on."""


def _run_one(job: CommJob, site: Any, work_dir: Path, *, timeout_s: float) -> tuple[CommJobRun, list[dict]]:
    """Write, submit and wait for one comm job; what it measured (rank 0's rows)."""
    task = work_dir / f"comm-{job.name}.task.json"
    out = work_dir / f"comm-{job.name}.out.json"
    for stale in (out, out.with_suffix(".rdzv")):
        if stale.exists():
            stale.unlink()
    task.write_text(json.dumps(asdict(job)))
    text = render_comm_script(job, site, task_file=task, out_file=out, log_dir=work_dir)
    t0 = time.monotonic()
    try:
        job_id = str(launch(text, work_dir / f"comm-{job.name}.sbatch", submit_job=True).job_id)
    except SystemFailure as e:
        raise _JobFailed(str(e)) from None
    try:
        outcome = wait(job_id, timeout_s=timeout_s, poll_s=0.5)
    except SystemFailure:
        cancel(job_id)
        raise _JobFailed(f"job {job_id} did not finish within {timeout_s:.0f} s (cancelled)") from None
    if outcome.state not in ("COMPLETED", "UNKNOWN"):
        raise _JobFailed(f"job {job_id} ended {outcome.state} (log in {out.parent})")
    wall = time.monotonic() - t0
    if not out.is_file():
        raise _JobFailed(f"job {job_id} ended without results (log in {out.parent})")
    rows = json.loads(out.read_text())
    return CommJobRun(job=job.name, slurm_job_id=job_id, ranks=job.world_size, wall_s=round(wall, 2)), rows


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m memx_hpc.profile.link_campaign --site S [--store P]``: measure and store the site's links."""
    ap = argparse.ArgumentParser(prog="python -m memx_hpc.profile.link_campaign",
                                 description="Measure the site's communication curves (p2p, all-reduce) as Slurm "
                                             "jobs and store them in the profile store.")
    ap.add_argument("--site", required=True)
    ap.add_argument("--store", default=None)
    ap.add_argument("--timeout-s", type=float, default=600.0)
    args = ap.parse_args(argv)
    from ..spec import load_site
    try:
        site = load_site(args.site)
        store = Path(args.store) if args.store else site.resolve(site.store_path)
        rep = profile_comm(site, store, site.resolve(site.work_dir) / "comm", timeout_s=args.timeout_s)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except SystemFailure as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for j in rep.jobs:
        print(f"{j.job}: job {j.slurm_job_id}, {j.ranks} ranks, {j.wall_s} s")
    for f in rep.failures:
        print(f"failed: {f}", file=sys.stderr)
    print(f"{rep.written} curve(s) written to {store}")
    return 0 if not rep.failures else 2


if __name__ == "__main__":
    sys.exit(main())
