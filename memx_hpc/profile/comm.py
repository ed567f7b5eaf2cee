"""Communication curves measured on the site, and where they live in the profile store.

What is measured (:func:`comm_jobs`), each as one small Slurm job (submitted by
:mod:`memx_hpc.profile.link_campaign`; :func:`run_comm_job` runs on the nodes):

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
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..errors import SpecError, SystemFailure
from ..records import CommCurve

__all__ = ["COMM_SIZES_BYTES", "CommJob", "comm_jobs", "run_comm_job", "read_comm_rows", "read_comm_curves",
           "write_comm_curves", "import_sailor_comm", "import_sailor_network", "curve_key"]

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
    store's writer lock. The store file must exist (any profile or import creates it). A write
    the disk (or the file size limit) has no room for is refused before HDF5 starts it, as
    the store's own writers refuse theirs (StoreFull, exit 2 naming the store)."""
    import h5py
    import numpy as np

    from .store import _METADATA_BYTES, ProfileStore
    path = Path(store_path)
    store = ProfileStore(path, lock_timeout_s=30.0)
    with store.writer():
        if not path.is_file():  # a store with no samples yet, made by the store itself
            with store._open_for_append():
                pass
        merged = {curve_key(r["curve"]): r for r in read_comm_rows(path)}
        for r in rows:
            CommCurve(**{k: tuple(v) if isinstance(v, list) else v for k, v in r["curve"].items()})  # validates
            merged[curve_key(r["curve"])] = r
        keys = sorted(merged)
        texts = [json.dumps(merged[k], sort_keys=True) for k in keys]
        # the new table is written beside the old one before the move: room for both
        store._check_room(2 * sum(len(k.encode()) + len(t.encode()) + 16 for k, t in zip(keys, texts))
                          + _METADATA_BYTES)
        try:
            with h5py.File(path, "a", locking=False) as f:
                new = f"{GROUP}.new"
                if new in f:
                    del f[new]
                g = f.create_group(new)
                g.attrs["format"] = "memx-comm-curves/1"
                str_t = h5py.string_dtype("utf-8")
                g.create_dataset("key", data=np.array(keys, dtype=object), dtype=str_t)
                g.create_dataset("curve", data=np.array(texts, dtype=object), dtype=str_t)
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
    return [{"curve": c.to_dict(), "provenance": {"source": c.source, "origin": "imported"}}
            for c in import_sailor_network(Path(folder))]


# --------------------------------------------------------------------------- Sailor's curves


def import_sailor_network(folder: str | Path, *, catalog: Any = None) -> list[CommCurve]:
    """Sailor's published network curves (``network_coeffs_all_homo.json``, whose
    ``intra`` part ``intra_node_bandwidths.json`` repeats) as :class:`CommCurve` objects.

    GPU names resolve through the catalog (``GH-96`` -> ``GH200``); a name the catalog
    does not know is kept as written. Raises SpecError naming the file when it is
    missing or malformed.
    """
    from ..spec.catalog import catalog as default_catalog
    cat = catalog or default_catalog()
    folder = Path(folder)
    path = folder / "network_coeffs_all_homo.json"
    if not path.is_file():
        raise SpecError("Sailor's network coefficients are missing", field=str(path), found="no such file")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SpecError(f"cannot read Sailor's network coefficients: {e}", field=str(path)) from None
    src = "Sailor (ETH Zurich), MIT licence: " + path.name
    out: list[CommCurve] = []
    for scope in ("intra", "inter"):
        for gpu, per_count in sorted((data.get(scope) or {}).items()):
            try:
                name = cat.get(gpu).name
            except SpecError:
                name = gpu
            for count, entry in sorted(per_count.items(), key=lambda kv: int(kv[0])):
                try:
                    coeffs, max_bps = entry
                    k = int(count)
                    curve = CommCurve(kind="p2p", scope=scope, gpu_types=(name,), provenance="imported",
                                      source=f"{src} [{scope}][{gpu}][{count}]", form="sailor",
                                      streams=max(1, k // 2) if scope == "intra" else k,
                                      coeffs=tuple(float(c) for c in coeffs), max_bytes_per_s=float(max_bps))
                except (TypeError, ValueError) as e:
                    raise SpecError(f"malformed entry: {e}", field=f"{path}: {scope}.{gpu}.{count}") from None
                out.append(curve)
    return out


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m memx_hpc.profile.comm worker --task T --out O``: one rank of a comm job
    (the job scripts of :mod:`memx_hpc.profile.link_campaign` run it)."""
    ap = argparse.ArgumentParser(prog="python -m memx_hpc.profile.comm",
                                 description="Run one rank of a communication-curve job.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="run on the nodes by the job script")
    w.add_argument("--task", required=True)
    w.add_argument("--out", required=True)
    return _worker(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
