"""Measured end-to-end runs of plans: render, submit, wait, read the log, keep the record.

Used by ``memx-hpc verify`` (the re-profiling path) and the benchmarks. A record holds
what was run (the plan, site, job and iteration count, hashed into ``key``), what was
measured (median iteration time after the first iteration; per rank the peak of
allocated bytes and the peak footprint: ``max allocated`` and ``max reserved`` of
Megatron-LM's memory line, on the CPU live tensor bytes and peak RSS), and where it
came from (Slurm job id, log file, host, time, versions). Records live in the profile
store's end-to-end table (:meth:`memx_hpc.profile.store.ProfileStore.append_e2e`), each
appended as soon as its run ends, so a crash loses nothing already measured. JSON Lines
(one record per line: :meth:`E2ERecord.append_to`, :func:`read_records`) remain the
interchange format, and the format of ``<store>.e2e.jsonl`` files that earlier versions
wrote; ``memx-hpc verify`` moves those into the store.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
from dataclasses import asdict
from pathlib import Path

from ..errors import SpecError, SystemFailure
from ..planfile import plan_to_dict
from ..records import RECORD_FORMAT, E2ERecord, job_from_spec, job_to_spec
from ..spec import Plan, Site, TrainJob

__all__ = ["E2ERecord", "RECORD_FORMAT", "job_from_spec", "job_to_spec", "measure_plan", "move_legacy_records",
           "plan_key", "read_records"]


def plan_key(plan: Plan, site: Site, job: TrainJob, iters: int) -> str:
    """Stable identity of a measured run: the plan, the site's name and partitions' GPU types,
    the model and batch, precision and the iteration count (sha256, not Python's hash)."""
    ident = {
        "plan": plan_to_dict(plan),
        "site": site.name,
        "gpus": {p.name: p.gpu_type for p in site.partitions},
        "model": asdict(job.model),
        "global_batch_size": job.global_batch_size, "precision": job.precision,
        "optimizer": job.optimizer, "distributed_optimizer": job.distributed_optimizer, "attention": job.attention,
        "iters": iters,
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:20]


def read_records(path: str | os.PathLike) -> list[E2ERecord]:
    """Every record in the file (a missing file is an empty record). A torn last line (a
    crash while appending) is skipped; any other bad line is a user error naming it."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    lines = p.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            if d.get("format") != RECORD_FORMAT:
                raise ValueError(f"format {d.get('format')!r}")
            d["stage_by_rank"] = {str(k): int(v) for k, v in (d.get("stage_by_rank") or {}).items()}
            out.append(E2ERecord(**d))
        except (ValueError, TypeError) as e:
            if n == len(lines):
                continue
            raise SpecError(f"not a measurement record ({e})", file=str(p), field=f"line {n}") from None
    return out


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for dist in ("memx-hpc", "torch", "megatron-core"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def measure_plan(plan: Plan, site: Site, job: TrainJob, *, iters: int, log_dir: str | os.PathLike,
                 workdir: str | None = None, timeout_s: float = 1800.0, plan_file: str | None = None,
                 prediction: dict | None = None, job_name: str | None = None) -> E2ERecord:
    """Render, submit and wait for one short run of ``plan``; parse its log into a record.
    Raises SystemFailure when the job fails or logs fewer iterations than asked."""
    from ..slurm.render import render
    from ..slurm.submit import launch, wait
    from .logs import MB, parse_log

    key = plan_key(plan, site, job, iters)
    name = job_name or f"memx-verify-{key[:8]}"
    log_dir = Path(log_dir)
    # short measured runs train on mock data even when the job names real data
    text = render(plan, site, job, iters=iters, log_dir=str(log_dir), workdir=workdir, job_name=name, mock_data=True)
    job_id = str(launch(text, log_dir / f"{name}.sbatch", submit_job=True).job_id)
    outcome = wait(job_id, timeout_s=timeout_s)
    log_file = log_dir / f"{name}-{job_id}.out"
    text = log_file.read_text(encoding="utf-8", errors="replace") if log_file.exists() else ""
    if not outcome.ok and outcome.state != "UNKNOWN":
        raise SystemFailure(f"job {job_id} ended {outcome.state} ({dict(outcome.components)}); log {log_file}:\n"
                            f"{text[-2000:]}")
    log = parse_log(text)
    if log.iterations_done < iters or log.iteration_ms() is None:
        raise SystemFailure(f"job {job_id} logged {log.iterations_done} of {iters} iterations; log {log_file}:\n"
                            f"{text[-2000:]}")
    gpus = {str(d["rank"]): site.partition(d["partition"]).gpu_type
            for d in log.layouts if d.get("partition") not in (None, "-")}
    stages = {}
    for d in log.layouts:
        stage = d.get("pp stage", "").split("/")[0]
        if stage.isdigit():
            stages[str(d["rank"])] = int(stage)
    return E2ERecord(
        key=key, plan=plan_to_dict(plan), site=site.name, job=job.name, iters=iters,
        iteration_ms=float(log.iteration_ms(skip_first=1)),
        peak_allocated_bytes={str(r): int(v * MB) for r, v in log.peak_memory_mb().items()},
        peak_footprint_bytes_by_rank={str(r): int(v * MB) for r, v in log.peak_reserved_mb().items()},
        gpu_type_by_rank=gpus, stage_by_rank=stages, job_spec=job_to_spec(job), job_id=str(job_id),
        log_file=str(log_file), prediction=prediction,
        provenance={"host": socket.gethostname(), "time": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                    "slurm_state": outcome.state, "plan_file": plan_file, "versions": _versions(),
                    "megatron_version": site.megatron_version, "source": "memx-hpc verify"},
    )



def move_legacy_records(store, notes: list[str]) -> int:
    """Runs an earlier version kept in ``<store>.e2e.jsonl`` go into ``store`` (a
    :class:`~memx_hpc.profile.store.ProfileStore`; the file stays). Returns how many were added."""
    legacy = store.path.with_suffix(".e2e.jsonl")
    records = read_records(legacy)
    if not records:
        return 0
    added = store.append_e2e(records)
    if added:
        notes.append(f"moved {added} run(s) from {legacy} into the store's end-to-end table (the file can go)")
    return added
