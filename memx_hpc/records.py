"""Measured end-to-end runs as data: :class:`E2ERecord`, its JSON Lines form, the job
codec a record keeps its job's shape in, and the order-free hash of a set of records.

They sit beside the specs (below the store, the models and the launcher) because every
floor uses them: :mod:`memx_hpc.train.measure` makes records, the profile store keeps
them, :mod:`memx_hpc.model.calibrate` learns from them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable

from .errors import SpecError
from .spec import TrainJob

__all__ = ["E2ERecord", "RECORD_FORMAT", "job_from_spec", "job_to_spec", "records_hash"]

#: Format tag of an end-to-end record in JSON Lines (``<store>.e2e.jsonl`` of earlier versions).
RECORD_FORMAT = "memx-e2e/1"


@dataclass(frozen=True, kw_only=True)
class E2ERecord:
    """One measured run of one plan (``memx-hpc verify``, the benchmarks).

    ``key`` identifies what was run (:func:`memx_hpc.train.measure.plan_key`: plan, site,
    GPU types, job, iterations). Per-rank values are keyed by the global rank as text (JSON
    keys): ``peak_allocated_bytes`` is the peak of allocated tensor bytes (Megatron-LM's
    ``max allocated``), ``peak_footprint_bytes_by_rank`` what the device reports for the
    process (``max reserved``; on the CPU the peak RSS). Only data-parallel rank 0 of each
    model-parallel rank reports memory, as Megatron-LM does. ``prediction`` is what the
    planner predicted when the plan was chosen; ``job_spec`` the job's shape and batch (see
    :func:`memx_hpc.train.measure.job_to_spec`), so that a record can be predicted again
    with another cost model; ``stage_by_rank`` the pipeline stage each rank ran.
    """

    key: str
    plan: dict
    site: str
    job: str
    iters: int
    iteration_ms: float
    peak_allocated_bytes: dict[str, int]  # by global rank (str keys: JSON)
    peak_footprint_bytes_by_rank: dict[str, int]
    gpu_type_by_rank: dict[str, str]
    job_id: str
    log_file: str
    prediction: dict | None = None
    provenance: dict = field(default_factory=dict)
    format: str = RECORD_FORMAT
    job_spec: dict | None = None
    stage_by_rank: dict[str, int] = field(default_factory=dict)
    origin: str = "measured"

    @property
    def peak_footprint_bytes(self) -> int:
        """The largest footprint over the ranks that reported one."""
        return max(self.peak_footprint_bytes_by_rank.values(), default=0)

    @property
    def peak_allocated_max_bytes(self) -> int:
        return max(self.peak_allocated_bytes.values(), default=0)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.gpu_type_by_rank.values())))

    def by_gpu_type(self, values: dict[str, int]) -> dict[str, int]:
        """Per GPU type, the largest of per-rank ``values`` (ranks of unknown type are left out)."""
        out: dict[str, int] = {}
        for r, v in values.items():
            g = self.gpu_type_by_rank.get(r)
            if g is not None:
                out[g] = max(out.get(g, 0), int(v))
        return out

    def append_to(self, path: str | os.PathLike) -> None:
        """Append the record as one JSON line (the interchange format; the store is the home)."""
        from dataclasses import asdict

        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "a", encoding="utf-8") as f:
            f.write(json.dumps(asdict(self), sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())



def job_to_spec(job: TrainJob) -> dict[str, Any]:
    """The job as plain data (what a cost model needs to predict its plans again, and the
    launcher to run it again); the file it came from is left out, it does not change a
    prediction. Nested sections (model, data, LR schedule, checkpointing) are mappings,
    tuples are lists: JSON as it will be read back."""
    d = json.loads(json.dumps(asdict(job)))
    d.pop("source_file", None)
    return d


def job_from_spec(d: Any) -> TrainJob:
    """The inverse of :func:`job_to_spec`; a SpecError names what does not fit."""
    if not isinstance(d, dict) or not isinstance(d.get("model"), dict):
        raise SpecError("expected a job mapping with a model", field="job_spec", found=type(d).__name__)
    try:
        return _decode(TrainJob, d, "job_spec")
    except TypeError as e:
        raise SpecError(f"incomplete job ({e})", field="job_spec") from None


def _decode(tp: Any, value: Any, where: str) -> Any:
    """``value`` (plain JSON data) as type ``tp``: mappings into dataclasses (unknown keys
    refused, naming them), lists into tuples, ``X | None`` as X or None."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _decode(args[0], value, where) if len(args) == 1 else value
    if dataclasses.is_dataclass(tp) and isinstance(value, dict):
        hints = typing.get_type_hints(tp)
        unknown = sorted(set(value) - {f.name for f in fields(tp)})
        if unknown:
            raise SpecError(f"unknown fields of {tp.__name__}", field=where, found=unknown)
        return tp(**{k: _decode(hints[k], v, f"{where}.{k}") for k, v in value.items()})
    if origin is tuple and isinstance(value, list):
        return tuple(value)
    return value


def records_hash(records: Iterable[E2ERecord]) -> str:
    """sha256 over end-to-end records, independent of their order: each record's canonical
    JSON (sorted keys; a float as its shortest round-trip text) hashed, the sorted digests
    hashed again. The identity of a calibration and of a store's end-to-end table."""
    digests = sorted(hashlib.sha256(json.dumps(asdict(r), sort_keys=True, separators=(",", ":"),
                                               ensure_ascii=False).encode("utf-8")).hexdigest() for r in records)
    h = hashlib.sha256(f"{RECORD_FORMAT}/set\n".encode())
    for d in digests:
        h.update(d.encode())
    return h.hexdigest()
