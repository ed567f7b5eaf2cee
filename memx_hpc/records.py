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
import math
import os
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable

import numpy as np

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


# --------------------------------------------------------------------------- link curves


COMM_KINDS = ("p2p", "allreduce")
COMM_SCOPES = ("intra", "inter", "cross")  # inside a node; between nodes of a partition; between partitions
CURVE_PROVENANCES = ("measured", "imported", "site-figure", "generic")
#: Start-up latency of one message when only a bandwidth figure is known (microseconds):
#: NCCL's own latency model uses a few us per hop inside a node and ~5-20 us over the
#: network (NCCL ``src/graph/tuning.cc``, base latencies of the Simple protocol); the
#: larger value per scope keeps an unmeasured link from looking too fast.
SITE_LATENCY_US = {"intra": 10.0, "inter": 25.0, "cross": 50.0}
_MB = 1e6


@dataclass(frozen=True, kw_only=True)
class CommCurve:
    """Time of one p2p message or collective as a function of its size.

    ``form``: ``points`` (measured sizes and times, interpolated linearly; latency +
    bandwidth line below the smallest size; the last segment's slope above the largest),
    ``sailor`` (Sailor's bandwidth polynomial, see the module docstring) or ``alpha-beta``
    (``latency_us`` + bytes / ``gbps``). ``streams``: how many GPUs of a node send at once
    in the measurement (the curve is of the whole message they share). ``group_size``:
    ranks of a measured all-reduce. ``partitions``: the partitions it was measured on
    (one for intra / inter, two for cross); empty for a GPU type's imported curve.
    """

    kind: str
    scope: str
    gpu_types: tuple[str, ...]
    provenance: str
    source: str
    form: str
    partitions: tuple[str, ...] = ()
    streams: int = 1
    group_size: int = 2
    sizes_bytes: tuple[float, ...] = ()
    times_ms: tuple[float, ...] = ()
    coeffs: tuple[float, ...] = ()
    max_bytes_per_s: float = 0.0
    latency_us: float = 0.0
    gbps: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in COMM_KINDS:
            raise SpecError("unknown communication kind", field="kind", found=self.kind, allowed=", ".join(COMM_KINDS))
        if self.scope not in COMM_SCOPES:
            raise SpecError("unknown link scope", field="scope", found=self.scope, allowed=", ".join(COMM_SCOPES))
        if self.provenance not in CURVE_PROVENANCES:
            raise SpecError("unknown curve provenance", field="provenance", found=self.provenance,
                            allowed=", ".join(CURVE_PROVENANCES))
        if self.form == "points":
            if len(self.sizes_bytes) < 2 or len(self.sizes_bytes) != len(self.times_ms):
                raise SpecError("a measured curve needs at least two (size, time) points", field="sizes_bytes",
                                found=len(self.sizes_bytes))
            if any(t <= 0 or not math.isfinite(t) for t in self.times_ms):
                raise SpecError("measured times must be positive", field="times_ms", found=self.times_ms)
        elif self.form == "sailor":
            if len(self.coeffs) < 1 or self.max_bytes_per_s <= 0:
                raise SpecError("Sailor curve needs coefficients and a positive maximum bandwidth", field="coeffs",
                                found=(self.coeffs, self.max_bytes_per_s))
        elif self.form == "alpha-beta":
            if self.gbps <= 0:
                raise SpecError("bandwidth must be positive", field="gbps", found=self.gbps)
        else:
            raise SpecError("unknown curve form", field="form", found=self.form,
                            allowed="points, sailor, alpha-beta")
        if self.streams < 1:
            raise SpecError("streams must be >= 1", field="streams", found=self.streams)

    # ------------------------------------------------------------------ evaluation

    def time_ms(self, nbytes: float) -> float:
        """Milliseconds for a message (or collective buffer) of ``nbytes``."""
        x = float(nbytes)
        if x <= 0:
            return 0.0
        if self.form == "alpha-beta":
            return self.latency_us * 1e-3 + x / (self.gbps * 1e6)
        if self.form == "sailor":
            if x < _MB:
                t1, t2 = self._sailor_ms(_MB), self._sailor_ms(2 * _MB)
                beta = max(t2 - t1, 1e-12) / _MB  # ms per byte
                alpha = max(t1 - beta * _MB, 0.0)
                return alpha + beta * x
            return self._sailor_ms(x)
        return self._points_ms(x)

    def _sailor_bw_gbs(self, x: float) -> float:
        c = np.asarray(self.coeffs, dtype=np.float64)
        lx = math.log2(x / _MB)
        if len(c) == 3 and c[0] < 0:  # concave: the fit bends down past its vertex, bandwidth does not
            lx = min(lx, -c[1] / (2 * c[0]))
        bw = float(np.polyval(c, max(lx, 0.0)))
        cap = self.max_bytes_per_s / 1e9
        return min(max(bw, cap * 1e-3), cap)

    def _sailor_ms(self, x: float) -> float:
        return (x / 1e9) / self._sailor_bw_gbs(x) * 1e3

    def _points_ms(self, x: float) -> float:
        s = np.asarray(self.sizes_bytes, dtype=np.float64)
        t = np.maximum.accumulate(np.asarray(self.times_ms, dtype=np.float64)[np.argsort(s)])  # never faster when larger
        s = np.sort(s)
        if x <= s[0]:
            # the latency + bandwidth line through the two smallest points, never below
            # the smallest point's own bandwidth
            beta = max((t[1] - t[0]) / max(s[1] - s[0], 1.0), 0.0)
            return float(max(t[0] - beta * (s[0] - x), t[0] * x / s[0]))
        if x >= s[-1]:
            slope = (t[-1] - t[-2]) / max(s[-1] - s[-2], 1.0)
            slope = max(slope, t[-1] / s[-1] * 0.5)  # the achieved bandwidth at most doubles beyond
            return float(t[-1] + slope * (x - s[-1]))
        return float(np.interp(x, s, t))

    def bandwidth_gbps(self, nbytes: float) -> float:
        """Achieved GB/s at ``nbytes`` (algorithm bandwidth: bytes / time)."""
        t = self.time_ms(nbytes)
        return nbytes / (t * 1e6) if t > 0 else math.inf

    def label(self) -> str:
        where = "/".join(self.partitions) if self.partitions else "/".join(self.gpu_types)
        return f"{self.provenance} {self.kind} {self.scope} {where} x{self.streams} ({self.source})"

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict
        return asdict(self)
