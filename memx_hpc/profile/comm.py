"""Communication curves measured on the site, and where they live in the profile store.

What is measured (:func:`comm_jobs`), each as one small Slurm job:

* ``intra``: inside one node of every partition with two or more devices per node --
  p2p between two ranks and all-reduce over all the node's ranks;
* ``inter``: between two nodes of every partition with two or more nodes -- p2p and
  all-reduce, one rank per node;
* ``cross``: between every pair of partitions -- p2p and all-reduce, one rank on each,
  as a heterogeneous job (``#SBATCH hetjob``, one component per partition, one
  ``srun --het-group=0,1`` step whose ranks are contiguous across the components).

Each job sweeps the message sizes :data:`COMM_SIZES_BYTES` (64 KiB .. 256 MiB: from
latency- to bandwidth-bound), a few warm-up and timed repetitions each, the median kept:
one-way p2p time is half a ping-pong's round trip; all-reduce time is the slowest rank's.
Backends: NCCL/RCCL when every rank has a GPU of one vendor, else UCC when torch has it,
else gloo (host memory; the provenance says so). The curves
(:class:`memx_hpc.model.links.CommCurve`, form ``points``) are the measured links of
:class:`memx_hpc.model.links.LinkModel`.

Storage: group ``/comm`` of the profile store (beside ``/gpu`` and ``/e2e``), one row per
curve: ``key`` (what it is a curve of) and ``curve`` (the curve as JSON, with its
provenance: host names, backend, job id, time). A newer curve for the same key replaces
the older. The table is written under the store's writer lock; a write builds the new
table beside the old one (``/comm.new``), flushes, and only then swaps the links.
Sailor's published curves can be kept there too (:func:`import_sailor_comm`, origin
``imported``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..errors import SpecError, SystemFailure
from ..model.links import CommCurve, LinkModel

__all__ = ["COMM_SIZES_BYTES", "CommJob", "comm_jobs", "render_comm_script", "run_comm_job", "profile_comm",
           "read_comm_curves", "write_comm_curves", "import_sailor_comm", "load_links", "curve_key"]

COMM_SIZES_BYTES = (2**16, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28)
GROUP = "comm"


@dataclass(frozen=True, kw_only=True)
class CommJob:
    """One measurement job: ``ranks`` on ``partitions`` (one for intra/inter, two for cross)."""

    scope: str
    partitions: tuple[str, ...]
    gpu_types: tuple[str, ...]
    vendors: tuple[str, ...]
    nodes: tuple[int, ...]  # nodes per component
    tasks_per_node: tuple[int, ...]
    sizes_bytes: tuple[int, ...] = COMM_SIZES_BYTES
    warmup: int = 2
    iters: int = 5

    @property
    def world_size(self) -> int:
        return sum(n * t for n, t in zip(self.nodes, self.tasks_per_node))

    @property
    def name(self) -> str:
        return f"{self.scope}-{'-'.join(self.partitions)}"


def comm_jobs(site: Any, *, sizes_bytes: Sequence[int] = COMM_SIZES_BYTES, max_ranks: int = 8) -> list[CommJob]:
    """The jobs that measure every link of ``site`` (see the module docstring)."""
    jobs = []
    sizes = tuple(int(s) for s in sizes_bytes)
    for p in site.partitions:
        g = site.gpu(p.gpu_type)
        if p.gpus_per_node >= 2:
            jobs.append(CommJob(scope="intra", partitions=(p.name,), gpu_types=(g.name,), vendors=(g.vendor,),
                                nodes=(1,), tasks_per_node=(min(p.gpus_per_node, max_ranks),), sizes_bytes=sizes))
        if p.nodes >= 2:
            jobs.append(CommJob(scope="inter", partitions=(p.name,), gpu_types=(g.name,), vendors=(g.vendor,),
                                nodes=(2,), tasks_per_node=(1,), sizes_bytes=sizes))
    parts = list(site.partitions)
    for i, a in enumerate(parts):
        for b in parts[i + 1:]:
            ga, gb = site.gpu(a.gpu_type), site.gpu(b.gpu_type)
            jobs.append(CommJob(scope="cross", partitions=(a.name, b.name), gpu_types=(ga.name, gb.name),
                                vendors=(ga.vendor, gb.vendor), nodes=(1, 1), tasks_per_node=(1, 1),
                                sizes_bytes=sizes))
    return jobs


# --------------------------------------------------------------------------- the job script


def render_comm_script(job: CommJob, site: Any, *, task_file: Path, out_file: Path, log_dir: Path) -> str:
    """The sbatch script of ``job``: a hetjob for ``cross`` (one component per partition),
    a plain job otherwise. Every value that reaches the shell is quoted."""
    from ..slurm.dispatch import resolve_python
    q = shlex.quote
    lines = ["#!/bin/bash"]
    for k, part_name in enumerate(job.partitions):
        part = site.partition(part_name)
        if k:
            lines.append("#SBATCH hetjob")
        opts = [f"--partition={part.name}", f"--nodes={job.nodes[k]}", f"--ntasks-per-node={job.tasks_per_node[k]}",
                f"--time={part.time_limit_min or site.time_limit_min}"]
        if k == 0:
            # one name for every comm job and --dependency=singleton: they run one at a time,
            # so no measurement shares its links (or, here, its cores) with another
            opts += ["--job-name=memx-comm", "--dependency=singleton",
                     f"--output={log_dir / ('comm-' + job.name + '-%j.out')}"]
        gpu = site.gpu(part.gpu_type)
        if part.gres_type:
            opts.append(f"--gres=gpu:{part.gres_type}:{job.tasks_per_node[k]}")
        elif gpu.vendor != "cpu":
            opts.append(f"--gpus-per-node={job.tasks_per_node[k]}")
        if part.cpus_per_task:
            opts.append(f"--cpus-per-task={part.cpus_per_task}")
        for key, val in (("account", part.account or site.account), ("qos", part.qos or site.qos)):
            if val:
                opts.append(f"--{key}={val}")
        lines += [f"#SBATCH {q(o)}" for o in opts]
    # one step over all components (``srun A : B``: ranks contiguous across them), each
    # component with its own partition's setup lines, environment and Python
    root = Path(__file__).resolve().parents[2]
    cmds = []
    for part_name in job.partitions:
        part = site.partition(part_name)
        body = list(part.setup) + [f"export {k}={q(v)}" for k, v in part.env]
        body.append(f"export PYTHONPATH={q(str(root))}${{PYTHONPATH:+:$PYTHONPATH}}")
        body.append(f"exec {q(resolve_python(site, part))} -m memx_hpc.profile.comm worker --task {q(str(task_file))} "
                    f"--out {q(str(out_file))}")
        cmds.append(f"bash -c {q('; '.join(body))}")
    lines.append("srun " + " : ".join(cmds))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- on the nodes


def _median_ms(fn, warmup: int, iters: int, sync) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run_comm_job(job: CommJob, *, rank: int, world: int, rendezvous: Path) -> list[dict] | None:
    """Measure ``job`` as rank ``rank`` of ``world``; rank 0 returns the curves (as dicts)."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    same_vendor = len(set(job.vendors)) == 1 and job.vendors[0] != "cpu"
    if cuda and same_vendor:
        backend = "nccl"
    elif cuda and getattr(dist, "is_ucc_available", lambda: False)():
        backend = "ucc"
    else:
        backend = "gloo"
    device = "cpu"
    if cuda and backend != "gloo":
        local = int(os.environ.get("SLURM_LOCALID", 0))
        torch.cuda.set_device(local % max(torch.cuda.device_count(), 1))
        device = f"cuda:{torch.cuda.current_device()}"
    dist.init_process_group(backend=backend, init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    try:
        sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
        hosts: list[Any] = [None] * world
        dist.all_gather_object(hosts, socket.gethostname())
        p2p_ms, ar_ms = [], []
        for size in job.sizes_bytes:
            t = torch.ones(max(1, size // 2), dtype=torch.float16, device=device)

            def ping_pong() -> None:
                if rank == 0:
                    dist.send(t, 1)
                    dist.recv(t, 1)
                elif rank == 1:
                    dist.recv(t, 0)
                    dist.send(t, 0)

            dist.barrier()
            one_way = _median_ms(ping_pong, job.warmup, job.iters, sync) / 2 if rank < 2 else 0.0
            dist.barrier()
            ms = _median_ms(lambda: dist.all_reduce(t), job.warmup, job.iters, sync)
            slowest = torch.tensor([one_way, ms], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            p2p_ms.append(float(slowest[0]))
            ar_ms.append(float(slowest[1]))
            del t
        if rank != 0:
            return None
        prov = {"hosts": hosts, "backend": backend, "device": device, "world_size": world,
                "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "torch": torch.__version__,
                "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "warmup": job.warmup, "iters": job.iters}
        src = f"measured by memx-hpc ({backend}, job {prov['slurm_job_id']})"
        streams = 1
        out = []
        for kind, times, group in (("p2p", p2p_ms, 2), ("allreduce", ar_ms, world)):
            c = CommCurve(kind=kind, scope=job.scope, gpu_types=job.gpu_types, partitions=job.partitions,
                          provenance="measured", source=src, form="points", streams=streams, group_size=group,
                          sizes_bytes=tuple(float(s) for s in job.sizes_bytes), times_ms=tuple(times))
            out.append({"curve": c.to_dict(), "provenance": prov})
        return out
    finally:
        dist.destroy_process_group()


def _worker(args: argparse.Namespace) -> int:
    job = CommJob(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(Path(args.task).read_text()).items()})
    rank = int(os.environ.get("SLURM_PROCID", 0))
    world = job.world_size
    rdzv = Path(args.out).with_suffix(".rdzv")
    t0 = time.perf_counter()
    rows = run_comm_job(job, rank=rank, world=world, rendezvous=rdzv)
    if rows is not None:
        for row in rows:  # what the measurement cost: this task's seconds times the ranks
            row["provenance"]["task_seconds"] = round((time.perf_counter() - t0) * world, 3)
        tmp = Path(args.out).with_suffix(".tmp")
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, args.out)
    return 0


# --------------------------------------------------------------------------- on the login node


@dataclass
class CommReport:
    """What :func:`profile_comm` did: curves written, and the jobs that failed (with why)."""

    written: int = 0
    jobs: list[dict] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    task_seconds: float = 0.0  # measured: each job's rank-0 run time times its ranks


def profile_comm(site: Any, store_path: Path, work_dir: Path, *, sizes_bytes: Sequence[int] = COMM_SIZES_BYTES,
                 timeout_s: float = 600.0, jobs: Sequence[CommJob] | None = None) -> CommReport:
    """Submit every comm job of ``site`` through ``sbatch``, wait for them, store the curves."""
    work_dir.mkdir(parents=True, exist_ok=True)
    jobs = list(jobs) if jobs is not None else comm_jobs(site, sizes_bytes=sizes_bytes)
    report = CommReport()
    submitted = []
    for job in jobs:
        task = work_dir / f"comm-{job.name}.task.json"
        out = work_dir / f"comm-{job.name}.out.json"
        for stale in (out, out.with_suffix(".rdzv")):
            if stale.exists():
                stale.unlink()
        task.write_text(json.dumps(asdict(job)))
        script = work_dir / f"comm-{job.name}.sbatch"
        script.write_text(render_comm_script(job, site, task_file=task, out_file=out, log_dir=work_dir))
        try:
            r = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60,
                               stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SystemFailure(f"sbatch could not be run for {script}: {e}") from None
        if r.returncode != 0:
            report.failures.append(f"{job.name}: sbatch refused {script}: {r.stderr.strip()[:300]}")
            continue
        submitted.append((job, r.stdout.strip().split(";")[0], out, time.monotonic()))
    deadline = time.monotonic() + timeout_s
    curves: list[dict] = []
    for job, job_id, out, t0 in submitted:
        while time.monotonic() < deadline and _queued(job_id):
            time.sleep(0.5)
        if _queued(job_id):
            subprocess.run(["scancel", job_id], capture_output=True, check=False, stdin=subprocess.DEVNULL)
            report.failures.append(f"{job.name}: job {job_id} did not finish within {timeout_s:.0f} s (cancelled)")
            continue
        wall = time.monotonic() - t0
        if not out.is_file():
            report.failures.append(f"{job.name}: job {job_id} ended without results (log in {out.parent})")
            continue
        rows = json.loads(out.read_text())
        report.task_seconds += float(rows[0]["provenance"].get("task_seconds", 0.0)) if rows else 0.0
        report.jobs.append({"job": job.name, "slurm_job_id": job_id, "ranks": job.world_size,
                            "wall_s": round(wall, 2)})
        curves += rows
    if curves:
        report.written = write_comm_curves(store_path, curves)
    return report


def _queued(job_id: str) -> bool:
    try:
        r = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i"], capture_output=True, text=True, timeout=30,
                           stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return True
    return r.returncode == 0 and bool(r.stdout.strip())


# --------------------------------------------------------------------------- the store table


def curve_key(curve: dict) -> str:
    """What a curve is a curve of: a newer curve with the same key replaces the older."""
    return json.dumps([curve["kind"], curve["scope"], list(curve.get("partitions") or ()),
                       list(curve.get("gpu_types") or ()), curve.get("streams", 1), curve.get("group_size", 2),
                       curve["provenance"]], sort_keys=True)


def read_comm_rows(store_path: str | os.PathLike) -> list[dict]:
    """The ``/comm`` rows of the store (``{"curve": ..., "provenance": ...}``); none when absent."""
    import h5py
    path = Path(store_path)
    if not path.is_file():
        return []
    try:
        with h5py.File(path, "r", locking=False) as f:
            if GROUP not in f or "curve" not in f[GROUP]:
                return []
            return [json.loads(x) for x in f[GROUP]["curve"].asstr()[()]]
    except OSError as e:
        raise SystemFailure(f"{path}: cannot read the communication curves: {e}") from None


def read_comm_curves(store_path: str | os.PathLike) -> list[CommCurve]:
    out = []
    for row in read_comm_rows(store_path):
        c = dict(row["curve"])
        for k in ("gpu_types", "partitions", "sizes_bytes", "times_ms", "coeffs"):
            c[k] = tuple(c.get(k) or ())
        out.append(CommCurve(**c))
    return out


def write_comm_curves(store_path: str | os.PathLike, rows: Sequence[dict]) -> int:
    """Add (or replace, by :func:`curve_key`) curves in the store's ``/comm`` table under the
    store's writer lock. The store file must exist (any profile or import creates it)."""
    import h5py
    import numpy as np

    from . import store as store_mod
    path = Path(store_path)
    store = store_mod.ProfileStore(path, lock_timeout_s=30.0)
    with store.writer():
        if not path.is_file():  # a store with no samples yet: its format attributes and an empty /gpu
            path.parent.mkdir(parents=True, exist_ok=True)
            with h5py.File(path, "w", locking=False) as f:
                f.attrs["format"] = store_mod.FORMAT_NAME
                f.attrs["schema_version"] = store_mod.SCHEMA_VERSION
                f.create_group("gpu")
        merged = {curve_key(r["curve"]): r for r in read_comm_rows(path)}
        for r in rows:
            CommCurve(**{k: tuple(v) if isinstance(v, list) else v for k, v in r["curve"].items()})  # validates
            merged[curve_key(r["curve"])] = r
        keys = sorted(merged)
        try:
            with h5py.File(path, "a", locking=False) as f:
                new = f"{GROUP}.new"
                if new in f:
                    del f[new]
                g = f.create_group(new)
                g.attrs["format"] = "memx-comm-curves/1"
                str_t = h5py.string_dtype("utf-8")
                g.create_dataset("key", data=np.array(keys, dtype=object), dtype=str_t)
                g.create_dataset("curve", data=np.array([json.dumps(merged[k], sort_keys=True) for k in keys],
                                                        dtype=object), dtype=str_t)
                f.flush()
                if GROUP in f:
                    del f[GROUP]
                f.move(new, GROUP)
                f.flush()
        except OSError as e:
            raise SystemFailure(f"{path}: cannot write the communication curves: {e}") from None
    return len(rows)


def import_sailor_comm(folder: str | os.PathLike) -> list[dict]:
    """Sailor's published network curves as ``/comm`` rows (origin ``imported``)."""
    from ..model.links import import_sailor_network
    return [{"curve": c.to_dict(), "provenance": {"source": c.source, "origin": "imported"}}
            for c in import_sailor_network(Path(folder))]


def load_links(site: Any, store_path: str | os.PathLike | None) -> LinkModel:
    """The site's links: the store's curves (measured and imported), the site's figures for the rest."""
    curves = read_comm_curves(store_path) if store_path else []
    return LinkModel(site, curves)


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m memx_hpc.profile.comm",
                                 description="Measure the site's communication curves (p2p, all-reduce) as Slurm "
                                             "jobs and store them; or run one job's ranks (worker).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="run on the nodes by the job script")
    w.add_argument("--task", required=True)
    w.add_argument("--out", required=True)
    p = sub.add_parser("profile", help="submit the comm jobs of a site and store the curves")
    p.add_argument("--site", required=True)
    p.add_argument("--store", default=None)
    p.add_argument("--timeout-s", type=float, default=600.0)
    args = ap.parse_args(argv)
    if args.cmd == "worker":
        return _worker(args)
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
        print(f"{j['job']}: job {j['slurm_job_id']}, {j['ranks']} ranks, {j['wall_s']} s")
    for f in rep.failures:
        print(f"failed: {f}", file=sys.stderr)
    print(f"{rep.written} curve(s) written to {store}")
    return 0 if not rep.failures else 2


if __name__ == "__main__":
    sys.exit(main())
