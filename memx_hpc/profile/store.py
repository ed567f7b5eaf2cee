"""The profile store: every measured, imported or augmented sample, in one HDF5 file.

Layout (schema version :data:`SCHEMA_VERSION`)::

    /                       attrs: schema_version, format = "memx-profile-store"
    /gpu/<GPU type>/        attrs: gpu_type, device_figures (JSON, "" when none)
        <column>            one 1-D dataset per number column of :data:`COLUMNS`; a text
                            column is <column>.utf8 (its rows' UTF-8 bytes, concatenated)
                            and <column>.end (where each row's bytes end), schema 4
    /e2e/                   end-to-end measurements of whole plans (schema 2 on)
        <column>            one 1-D dataset per column of :data:`E2E_COLUMNS`

Version 1 files (no ``/e2e`` group) are read as stores without end-to-end records; the
first write turns them into version 2.

End-to-end records (:class:`E2ERecord`) are short real training runs of a plan
(``memx-hpc verify``): iteration time and, per rank, peak allocated bytes and device
footprint, with the plan, the job's shape, the prediction made when the plan was chosen,
and provenance. They calibrate the predictor (:mod:`memx_hpc.model.calibrate`); they are
not training data of the predictor, so :meth:`ProfileStore.content_hash` covers layer
samples only and :meth:`ProfileStore.e2e_hash` covers the end-to-end records.

A columnar table per GPU type, units in the column names (``forward_ms``,
``activation_bytes``); text columns are UTF-8 variable-length strings.
Every row keeps its ``origin`` (measured | imported | augmented), ``source`` and
``provenance`` (:class:`~memx_hpc.spec.Provenance`, stored as its JSON text: host, device, driver,
versions, settings, time).

Writing. Only one process writes (the login-node process that gathers results):
a lock file ``<store>.lock`` holds ``PID@host`` of the writer. A second writer
gets :class:`StoreLocked` ("store locked by PID ..."); a lock left by a process
that no longer runs on this host is broken with a warning.

Appending (schema 3 and 4). Every table is a set of resizable, chunked 1-D datasets
(:data:`CHUNK_ROWS` rows a chunk) plus a ``committed_rows`` attribute on its group. An
append writes the new rows past the committed count, flushes, and only then raises
``committed_rows`` and flushes again; readers read the first ``committed_rows`` rows
and nothing else. So an append costs the same at the 10,000th sample as at the first
(``benchmarks/store_append.py``), and a writer killed at any moment loses at most the
rows it was appending: rows past the committed count are overwritten by the next
append. Each sample table also keeps ``row_sha256`` (the digest of each row, the one
:meth:`ProfileStore.content_hash` is built from), so duplicate checks need not decode rows.
Text columns are bytes plus end offsets (schema 4), not HDF5 variable-length strings,
whose heap blocks each in-place append would leave behind (4 KB a call).
Version 1 to 3 files (version 1 and 2: whole datasets, rewritten per append) are read as
they are and turned into the current version by their first write, which builds the new file next to the old
one and moves it over it with ``os.replace``.

Reading takes no lock: a reader sees the committed rows of the moment it opens the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import socket
import stat
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from ..errors import SpecError, SystemFailure
from ..records import E2ERecord, records_hash  # noqa: F401 (re-exported)
from ..spec import (SAMPLE_KINDS, SAMPLE_ORIGINS, LayerSample, LayerShape, NotARegularFile, ProfilePoint,
                    Provenance, read_regular_file)

__all__ = ["SCHEMA_VERSION", "READABLE_VERSIONS", "COLUMNS", "E2E_COLUMNS", "E2ERecord", "ProfileStore",
           "StoreDamaged", "StoreFull", "StoreLocked", "check_store_path", "sample_to_row", "row_to_sample", "record_to_row", "row_to_record", "records_hash"]

SCHEMA_VERSION = 5
#: Versions this code reads: 1 (layer samples only), 2 (adds ``/e2e``), 3 (appendable tables),
#: 4 (text as UTF-8 bytes and end offsets, so appends do not leave HDF5 heap blocks behind),
#: 5 (the columns of MoE and multi-latent-attention layers and of the EP degree; a file of an
#: older version reads their defaults, a dense layer with standard attention).
READABLE_VERSIONS = (1, 2, 3, 4, 5)
#: Bytes per HDF5 chunk of a text column's UTF-8 data (schema 4).
CHUNK_BYTES = 1 << 16
#: Rows per HDF5 chunk of an appendable table (schema 3).
CHUNK_ROWS = 1024
_COMMITTED = "committed_rows"
_DIGESTS = "row_sha256"
_WRITING = "append_in_progress"
FORMAT_NAME = "memx-profile-store"
#: Prefix of :meth:`ProfileStore.content_hash`. It names the sample table's layout, not the
#: file's schema version, so that adding the e2e table (version 2) left the hash of the
#: same samples unchanged.
_SAMPLES_HASH_TAG = f"{FORMAT_NAME}/1"
#: Origins of end-to-end records: run by ``memx-hpc verify`` here, or imported from elsewhere.
E2E_ORIGINS = ("measured", "imported")


@dataclass(frozen=True, kw_only=True)
class Column:
    """One column of the sample table: its name (with unit), type and default."""

    name: str
    kind: str  # "str" | "int" | "float" | "bool"
    default: Any = None  # None: required in CSV input
    since: int = 1  # the schema version that added it (older files read its default)


# The order here is the order of the CSV interchange format (see csvio.py).
COLUMNS: tuple[Column, ...] = (
    Column(name="gpu_type", kind="str"),
    Column(name="kind", kind="str"),
    Column(name="hidden_size", kind="int"),
    Column(name="num_attention_heads", kind="int"),
    Column(name="num_query_groups", kind="int"),
    Column(name="ffn_hidden_size", kind="int"),
    Column(name="seq_length", kind="int"),
    Column(name="vocab_size", kind="int"),
    Column(name="activation", kind="str", default="gelu"),
    Column(name="tp", kind="int", default=1),
    Column(name="micro_batch_size", kind="int", default=1),
    Column(name="recompute", kind="str", default="none"),
    Column(name="precision", kind="str", default="bf16"),
    Column(name="attention", kind="str", default="sdpa"),
    Column(name="group_size", kind="int", default=1),
    Column(name="message_bytes", kind="int", default=0),
    Column(name="inter_node", kind="bool", default=False),
    Column(name="forward_ms", kind="float", default=0.0),
    Column(name="backward_ms", kind="float", default=0.0),
    Column(name="update_ms", kind="float", default=0.0),
    Column(name="activation_bytes", kind="int", default=0),
    Column(name="peak_allocated_bytes", kind="int", default=0),
    Column(name="peak_reserved_bytes", kind="int", default=0),
    Column(name="device_footprint_bytes", kind="int", default=0),
    Column(name="infeasible", kind="bool", default=False),
    Column(name="origin", kind="str", default="measured"),
    Column(name="source", kind="str", default=""),
    Column(name="provenance", kind="str", default="{}"),
    Column(name="weight", kind="float", default=1.0),
    # schema 5: layers beyond dense ones with standard attention (LayerShape's extension; 0 and
    # false: not that kind of layer) and the expert-parallel degree an MoE layer ran at
    *(Column(name=n, kind="int", default=0, since=5) for n in (
        "head_dim", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
        "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size")),
    Column(name="multi_latent_attention", kind="bool", default=False, since=5),
    Column(name="moe_shared_expert_gate", kind="bool", default=False, since=5),
    Column(name="ep", kind="int", default=1, since=5),
)
COLUMN_NAMES = tuple(c.name for c in COLUMNS)
#: the columns of schema 4; a row's digest is over these, then the later columns whose value
#: is not their default (so a row of a dense layer keeps the digest it had)
_BASE_NAMES = tuple(c.name for c in COLUMNS if c.since < 5)
_LATER = tuple(c for c in COLUMNS if c.since >= 5)
_SHAPE_FIELDS = ("hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "seq_length",
                 "vocab_size", "activation", "head_dim", "multi_latent_attention", "q_lora_rank", "kv_lora_rank",
                 "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "num_experts", "moe_router_topk",
                 "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_shared_expert_gate")
#: shape fields whose None is stored as 0
_OPTIONAL_SHAPE = frozenset(("head_dim", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                             "v_head_dim", "num_experts", "moe_router_topk", "moe_ffn_hidden_size",
                             "moe_shared_expert_intermediate_size"))
_POINT_FIELDS = ("kind", "tp", "micro_batch_size", "recompute", "precision", "attention", "group_size",
                 "message_bytes", "inter_node", "ep")
_VALUE_FIELDS = ("forward_ms", "backward_ms", "update_ms", "activation_bytes", "peak_allocated_bytes",
                 "peak_reserved_bytes", "device_footprint_bytes", "infeasible", "origin", "source",
                 "provenance", "weight")
FIGURE_KEYS = ("peak_tflops_fp32", "peak_tflops_bf16", "hbm_gbps", "memory_gib")


class StoreLocked(SystemFailure):
    """Another process is writing the store (its PID is in the lock file)."""


class StoreDamaged(SystemFailure):
    """The file's groups, columns or counts are not the store's layout (the message names what)."""


class StoreFull(SystemFailure):
    """The file system (or the process's file size limit) has no room for a write; nothing was written."""


#: Bytes one table's datasets take for one more chunk each: a table that gets its first rows,
#: or whose row count crosses a chunk boundary, grows by this much at once.
_CHUNK_SET_BYTES = sum(CHUNK_ROWS * 8 if c.kind != "str" else CHUNK_BYTES + CHUNK_ROWS * 8 for c in COLUMNS[1:]) \
    + CHUNK_ROWS * 32
#: HDF5's own metadata (object headers, B-tree nodes, the free list) a write may add.
_METADATA_BYTES = 1 << 20


def _rows_bytes(rows: list[dict[str, Any]], columns: tuple[Column, ...]) -> int:
    """What ``rows`` take in their columns: 8 bytes a number, the UTF-8 text and its end offset, the digest."""
    total = 0
    for r in rows:
        for c in columns:
            v = r[c.name]
            total += len(v.encode("utf-8")) + 8 if c.kind == "str" else 8
        total += 32
    return total


# --------------------------------------------------------------------------- rows


def sample_to_row(s: LayerSample) -> dict[str, Any]:
    """A sample as a flat row keyed by :data:`COLUMN_NAMES` (plain Python values)."""
    p = s.point
    row: dict[str, Any] = {"gpu_type": p.gpu_type}
    for f in _SHAPE_FIELDS:
        v = getattr(p.shape, f)
        row[f] = 0 if v is None and f in _OPTIONAL_SHAPE else v
    for f in _POINT_FIELDS:
        row[f] = getattr(p, f)
    for f in _VALUE_FIELDS:
        row[f] = getattr(s, f)
    row["provenance"] = s.provenance.text
    for c in COLUMNS:
        row[c.name] = _coerce(c, row[c.name])
    return row


def row_to_sample(row: dict[str, Any]) -> LayerSample:
    """The inverse of :func:`sample_to_row`; checks kinds and origins."""
    return _sample_of({c.name: _coerce(c, row[c.name]) for c in COLUMNS})


def _sample_of(r: dict[str, Any], shapes: dict[tuple, LayerShape] | None = None) -> LayerSample:
    """:func:`row_to_sample` of a row whose values are coerced already (the store's snapshot);
    ``shapes``: the LayerShapes built so far, by their values (rows share a few shapes)."""
    if r["kind"] not in SAMPLE_KINDS:
        raise SpecError("unknown sample kind", field="kind", found=r["kind"], allowed=", ".join(SAMPLE_KINDS))
    if r["origin"] not in SAMPLE_ORIGINS:
        raise SpecError("unknown sample origin", field="origin", found=r["origin"],
                        allowed=", ".join(SAMPLE_ORIGINS))
    key = tuple(r[f] for f in _SHAPE_FIELDS)
    shape = shapes.get(key) if shapes is not None else None
    if shape is None:
        shape = LayerShape(**{f: (None if v == 0 and f in _OPTIONAL_SHAPE else v) for f, v in zip(_SHAPE_FIELDS, key)})
        if shapes is not None:
            shapes[key] = shape
    point = ProfilePoint(gpu_type=r["gpu_type"], shape=shape, **{f: r[f] for f in _POINT_FIELDS})
    values = {f: r[f] for f in _VALUE_FIELDS}
    values["provenance"] = Provenance(values["provenance"])
    return LayerSample(point=point, **values)


def _coerce(c: Column, v: Any) -> Any:
    if c.kind == "str":
        if isinstance(v, bytes):
            v = v.decode("utf-8")
        if not isinstance(v, str):
            raise SpecError("expected text", field=c.name, found=v)
        return v
    if c.kind == "bool":
        if hasattr(v, "item"):
            v = v.item()
        if not isinstance(v, (bool, int)) or v not in (0, 1):
            raise SpecError("expected true or false", field=c.name, found=v)
        return bool(v)
    if c.kind == "int":
        if hasattr(v, "item"):
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                return int(v)
            raise SpecError("expected a whole number", field=c.name, found=v)
        return int(v)
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(float(v)):
        raise SpecError("expected a number", field=c.name, found=v)
    return float(v)


def _coerce_column(c: Column, values: Any) -> list[Any]:
    """``[_coerce(c, v) for v in values]``, a whole column at a time where its array type
    already says each value is valid (numbers of the column's type, no NaN; text decoded):
    decoding a store of a few thousand rows value by value was most of a warm ``predict``."""
    import numpy as np

    dtype = getattr(values, "dtype", None)
    if c.kind == "str" and isinstance(values, list) and all(type(v) is str for v in values):
        return values
    if dtype is not None and values.ndim == 1:
        if c.kind == "int" and dtype.kind in "iu":
            return values.tolist()
        if c.kind == "bool" and dtype.kind == "b":
            return values.tolist()
        if c.kind == "float" and dtype.kind == "f" and not np.isnan(values).any():
            return [float(v) for v in values.tolist()]
    return [_coerce(c, v) for v in values]


def _row_key(row: dict[str, Any]) -> tuple:
    return tuple(row[n] for n in COLUMN_NAMES)


def _row_digest(row: dict[str, Any]) -> str:
    # repr() of a float is its shortest round-trip form: equal floats, equal text.
    values: list[Any] = [repr(row[n]) if isinstance(row[n], float) else row[n] for n in _BASE_NAMES]
    values += [[c.name, row[c.name]] for c in _LATER if row[c.name] != c.default]
    text = json.dumps(values, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------- end-to-end records


# Columns of the /e2e table. Per-rank maps, the plan, the prediction, the job and the
# provenance are canonical JSON text (sorted keys, no spaces): equal content, equal text.
E2E_COLUMNS: tuple[Column, ...] = (
    Column(name="key", kind="str"),
    Column(name="site", kind="str"),
    Column(name="job", kind="str"),
    Column(name="plan_json", kind="str"),
    Column(name="gpu_types_json", kind="str"),
    Column(name="gpu_type_by_rank_json", kind="str"),
    Column(name="stage_by_rank_json", kind="str"),
    Column(name="iters", kind="int"),
    Column(name="iteration_ms", kind="float"),
    Column(name="peak_allocated_bytes_by_rank_json", kind="str"),
    Column(name="peak_footprint_bytes_by_rank_json", kind="str"),
    Column(name="peak_footprint_bytes", kind="int"),
    Column(name="job_id", kind="str"),
    Column(name="log_file", kind="str"),
    Column(name="prediction_json", kind="str"),
    Column(name="job_spec_json", kind="str"),
    Column(name="provenance_json", kind="str"),
    Column(name="origin", kind="str"),
)
E2E_COLUMN_NAMES = tuple(c.name for c in E2E_COLUMNS)


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _int_map(d: Any, field_name: str) -> dict[str, int]:
    if not isinstance(d, dict):
        raise SpecError("expected a mapping of rank to bytes", field=field_name, found=d)
    out = {}
    for k, v in d.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or not math.isfinite(v):
            raise SpecError("expected bytes >= 0", field=f"{field_name}.{k}", found=v)
        out[str(k)] = int(v)
    return out


def record_to_row(rec: E2ERecord) -> dict[str, Any]:
    """A record as a flat row keyed by :data:`E2E_COLUMN_NAMES`; checks what it holds."""
    if not isinstance(rec, E2ERecord):
        raise TypeError(f"expected an E2ERecord, got {type(rec).__name__}")
    if rec.origin not in E2E_ORIGINS:
        raise SpecError("unknown end-to-end record origin", field="origin", found=rec.origin,
                        allowed=", ".join(E2E_ORIGINS))
    if not isinstance(rec.iteration_ms, (int, float)) or not math.isfinite(rec.iteration_ms) \
            or rec.iteration_ms <= 0:
        raise SpecError("a measured iteration time is a positive number of ms", field="iteration_ms",
                        found=rec.iteration_ms)
    if isinstance(rec.iters, bool) or not isinstance(rec.iters, int) or rec.iters < 1:
        raise SpecError("expected a whole number >= 1", field="iters", found=rec.iters)
    if not isinstance(rec.plan, dict):
        raise SpecError("expected the plan as a mapping", field="plan", found=rec.plan)
    foot = _int_map(rec.peak_footprint_bytes_by_rank, "peak_footprint_bytes_by_rank")
    alloc = _int_map(rec.peak_allocated_bytes, "peak_allocated_bytes")
    gpus = {str(k): str(v) for k, v in rec.gpu_type_by_rank.items()}
    stages = {str(k): int(v) for k, v in rec.stage_by_rank.items()}
    row = {
        "key": rec.key, "site": rec.site, "job": rec.job, "plan_json": _canonical(rec.plan),
        "gpu_types_json": _canonical(sorted(set(gpus.values()))), "gpu_type_by_rank_json": _canonical(gpus),
        "stage_by_rank_json": _canonical(stages), "iters": rec.iters, "iteration_ms": float(rec.iteration_ms),
        "peak_allocated_bytes_by_rank_json": _canonical(alloc),
        "peak_footprint_bytes_by_rank_json": _canonical(foot),
        "peak_footprint_bytes": max(foot.values(), default=0), "job_id": str(rec.job_id),
        "log_file": str(rec.log_file), "prediction_json": _canonical(rec.prediction),
        "job_spec_json": _canonical(rec.job_spec), "provenance_json": _canonical(rec.provenance),
        "origin": rec.origin,
    }
    return {c.name: _coerce(c, row[c.name]) for c in E2E_COLUMNS}


def row_to_record(row: dict[str, Any]) -> E2ERecord:
    """The inverse of :func:`record_to_row`."""
    r = {c.name: _coerce(c, row[c.name]) for c in E2E_COLUMNS}

    def load(name: str) -> Any:
        try:
            return json.loads(r[name])
        except ValueError:
            raise SpecError("not valid JSON", field=f"e2e.{name}", found=r[name][:80]) from None

    return E2ERecord(key=r["key"], plan=load("plan_json"), site=r["site"], job=r["job"], iters=r["iters"],
                     iteration_ms=r["iteration_ms"], peak_allocated_bytes=load("peak_allocated_bytes_by_rank_json"),
                     peak_footprint_bytes_by_rank=load("peak_footprint_bytes_by_rank_json"),
                     gpu_type_by_rank=load("gpu_type_by_rank_json"), job_id=r["job_id"], log_file=r["log_file"],
                     prediction=load("prediction_json"), provenance=load("provenance_json"),
                     job_spec=load("job_spec_json"),
                     stage_by_rank={k: int(v) for k, v in load("stage_by_rank_json").items()}, origin=r["origin"])


def _e2e_digest(row: dict[str, Any]) -> str:
    text = json.dumps([repr(row[n]) if isinstance(row[n], float) else row[n] for n in E2E_COLUMN_NAMES],
                      ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _check_gpu_name(name: str) -> None:
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        raise SpecError("a GPU type name must be non-empty and must not contain '/'", field="gpu_type",
                        found=name)


# --------------------------------------------------------------------------- appendable tables


def _show(v: Any) -> str:
    """What an attribute holds, for a message about a damaged store."""
    if hasattr(v, "shape") and getattr(v, "shape", ()) != ():
        return f"an array of shape {tuple(v.shape)}"
    if isinstance(v, (bytes, str)):
        return f"text {v[:40]!r}"
    return repr(v)[:40]


def _scalar(v: Any) -> Any:
    return v.item() if hasattr(v, "item") and getattr(v, "shape", None) == () else v


def _text_attr(g: Any, name: str, default: str, where: str) -> str:
    v = _scalar(g.attrs.get(name, default))
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            pass
    elif isinstance(v, str):
        return v
    raise StoreDamaged(f"{where}: the attribute {name!r} should be text; it holds {_show(v)}")


def _count_attr(g: Any, name: str, where: str, *, most: int | None = None) -> int:
    """A whole-number attribute (a row count, a flag) of a damaged store named as such."""
    v = _scalar(g.attrs.get(name))
    if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (most is not None and v > most):
        rule = f"0 to {most}" if most is not None else "a whole number >= 0"
        raise StoreDamaged(f"{where}: the attribute {name!r} should be {rule}; it holds {_show(v)}")
    return v


def _check_format(f: Any, path: Path) -> int:
    """The schema version of a store file, once its layout was checked (see :func:`_check_layout`)."""
    fmt = _scalar(f.attrs.get("format"))
    fmt = fmt.decode("utf-8", "replace") if isinstance(fmt, bytes) else fmt
    if not isinstance(fmt, str) or fmt != FORMAT_NAME:
        raise SpecError("not a memx profile store", file=str(path), field="format",
                        found=fmt if isinstance(fmt, str) or fmt is None else _show(fmt), allowed=FORMAT_NAME)
    if "schema_version" not in f.attrs:
        raise SpecError("unsupported store schema version", file=str(path), field="schema_version",
                        found=None, allowed=", ".join(map(str, READABLE_VERSIONS)))
    version = _count_attr(f, "schema_version", f"{path}: the profile store is damaged")
    if version not in READABLE_VERSIONS:
        raise SpecError("unsupported store schema version", file=str(path), field="schema_version",
                        found=version, allowed=", ".join(map(str, READABLE_VERSIONS)))
    _check_layout(f, path, version)
    return version


#: The dtype kinds a column may be stored as (ints in float columns: older writers).
_KINDS = {"int": "iu", "bool": "biu", "float": "fiu", "str": "OSU", "utf8": "u", "end": "i", "digest": "S"}


def _check_layout(f: Any, path: Path, version: int) -> None:
    """Refuse a file whose top-level layout is not the store's (``/gpu`` a dataset or missing,
    a table that is a dataset, a flag that is text or an array), naming the store and what is
    wrong, before a reader or writer relies on it. Each table's count and columns are checked
    where they are opened (:func:`_rows_of`, :func:`_column`): checking every column here
    opened each dataset twice, which on a store of 16 GPU types cost more than the read."""
    import h5py

    where = f"{path}: the profile store is damaged"
    if _WRITING in f.attrs:
        _count_attr(f, _WRITING, where, most=1)
    top = f.get("gpu")
    if not isinstance(top, h5py.Group):
        raise StoreDamaged(f"{where}: /gpu should be the group of sample tables; it is "
                            f"{'missing' if top is None else 'not a group'}")
    if version >= 2 and "e2e" in f and not isinstance(f["e2e"], h5py.Group):
        raise StoreDamaged(f"{where}: /e2e should be a table (a group); it is not")


def _table(top: Any, name: str, where: str) -> Any:
    """Member ``name`` of ``/gpu`` as a table (a group), or None when there is none."""
    import h5py

    g = top.get(name)
    if g is not None and not isinstance(g, h5py.Group):
        raise StoreDamaged(f"{where}: /gpu/{name} should be a table (a group); it is not")
    return g


def _rows_of(g: Any, where: str) -> int:
    """The committed row count of a table (schema 3 on)."""
    return _count_attr(g, _COMMITTED, where)


def _column(g: Any, name: str, kind: str, where: str, rows: int | None = None) -> Any:
    """The 1-D dataset ``name`` of table ``g`` of dtype kind ``kind`` (see :data:`_KINDS`) holding
    at least ``rows`` items; a damaged store otherwise."""
    import h5py

    ds = g.get(name)
    if ds is None:
        raise StoreDamaged(f"{where} lacks column {name!r}")
    if not isinstance(ds, h5py.Dataset) or len(ds.shape) != 1 or ds.dtype.kind not in _KINDS[kind] \
            or (kind == "digest" and ds.dtype.itemsize != 32):
        what = "a group" if not isinstance(ds, h5py.Dataset) else f"{ds.dtype} of shape {ds.shape}"
        raise StoreDamaged(f"{where}: column {name!r} should be a 1-D column of {kind} values; it is {what}")
    if rows is not None and ds.shape[0] < rows:
        raise StoreDamaged(f"{where}: column {name!r} holds {ds.shape[0]} rows, {rows} were committed")
    return ds


def _read_columns(g: Any, columns: tuple[Column, ...], version: int, where: str) -> dict[str, Any]:
    """The committed rows of a table, column by column (schema 3 on: ``committed_rows``; older: all)."""
    n = _rows_of(g, where) if version >= 3 else None
    cols = {}
    for c in columns:
        if c.since > version:  # a column the file's schema does not have: its default in every row
            rows = n if n is not None else len(cols[next(iter(cols))]) if cols else 0
            cols[c.name] = [c.default] * rows
            continue
        if c.kind == "str" and version >= 4:
            cols[c.name] = _read_text(g, c.name, n or 0, where)
            continue
        ds = _column(g, c.name, c.kind, where, n)
        sel = slice(0, n) if n is not None else slice(None)
        cols[c.name] = ds.asstr()[sel] if c.kind == "str" else ds[sel]
    return cols


def _read_text(g: Any, name: str, n: int, where: str) -> list[str]:
    import numpy as np

    ends_ds = _column(g, f"{name}.end", "end", where, n)
    data = _column(g, f"{name}.utf8", "utf8", where)
    ends = ends_ds[:n] if n else np.zeros(0, dtype=np.int64)
    if len(ends) and (ends[0] < 0 or np.any(np.diff(ends) < 0)):
        raise StoreDamaged(f"{where}: column {name!r} is damaged (its row ends go backwards)")
    raw = data[:int(ends[-1])].tobytes() if len(ends) else b""
    if len(raw) < (ends[-1] if len(ends) else 0):
        raise StoreDamaged(f"{where}: column {name!r} holds fewer bytes than its rows need")
    out, start = [], 0
    for end in ends.tolist():
        try:
            out.append(raw[start:end].decode("utf-8"))
        except UnicodeDecodeError:
            raise StoreDamaged(f"{where}: column {name!r} row {len(out)} is not UTF-8 text") from None
        start = end
    return out


def _h5_dtype(c: Column) -> Any:
    import h5py
    import numpy as np

    return {"str": h5py.string_dtype("utf-8"), "int": np.int64, "bool": np.bool_}.get(c.kind, np.float64)


def _new_table(g: Any, columns: tuple[Column, ...], *, digests: bool = False) -> Any:
    """Empty resizable chunked datasets for ``columns`` in group ``g`` (not yet committed)."""
    import numpy as np

    for c in columns:
        if c.kind == "str":
            g.create_dataset(f"{c.name}.utf8", shape=(0,), maxshape=(None,), chunks=(CHUNK_BYTES,), dtype=np.uint8)
            g.create_dataset(f"{c.name}.end", shape=(0,), maxshape=(None,), chunks=(CHUNK_ROWS,), dtype=np.int64)
        else:
            g.create_dataset(c.name, shape=(0,), maxshape=(None,), chunks=(CHUNK_ROWS,), dtype=_h5_dtype(c))
    if digests:
        g.create_dataset(_DIGESTS, shape=(0,), maxshape=(None,), chunks=(CHUNK_ROWS,), dtype="S32")
    return g


def _sample_group(top: Any, gpu: str) -> Any:
    """The committed (possibly empty) table of ``gpu``; a group whose creation was cut short is rebuilt."""
    g = _table(top, gpu, f"{top.file.filename}: the profile store is damaged")
    if g is not None and _COMMITTED in g.attrs:
        return g
    if g is not None:
        del top[gpu]
    g = _new_table(top.create_group(gpu), COLUMNS[1:], digests=True)
    g.attrs["gpu_type"] = gpu
    g.attrs["device_figures"] = ""
    g.attrs[_COMMITTED] = 0
    return g


def _append_rows(g: Any, columns: tuple[Column, ...], rows: list[dict[str, Any]],
                 digests: list[bytes] | None = None) -> int:
    """Write ``rows`` past the committed rows of table ``g`` (overwriting what a killed writer
    left there) and return the new row count; the caller commits it with :func:`_commit`."""
    import numpy as np

    where = f"{g.file.filename}: the profile store is damaged: table {g.name}"
    n = _rows_of(g, where) if _COMMITTED in g.attrs else 0
    k = len(rows)
    if not k:
        return n
    # every column is opened and checked before the first is written: a damaged table is
    # refused with nothing written, not half-way through
    cols = {c.name: (_column(g, f"{c.name}.end", "end", where, n), _column(g, f"{c.name}.utf8", "utf8", where))
            if c.kind == "str" else _column(g, c.name, c.kind, where, n) for c in columns}
    digest_ds = _column(g, _DIGESTS, "digest", where, n) if digests is not None else None
    for c in columns:
        vals = [r[c.name] for r in rows]
        if c.kind == "str":
            ends, data = cols[c.name]
            start = int(ends[n - 1]) if n else 0
            blobs = [v.encode("utf-8") for v in vals]
            blob = b"".join(blobs)
            data.resize((start + len(blob),))
            if blob:
                data[start:start + len(blob)] = np.frombuffer(blob, dtype=np.uint8)
            ends.resize((n + k,))
            ends[n:n + k] = start + np.cumsum([len(b) for b in blobs], dtype=np.int64)
            continue
        ds = cols[c.name]
        ds.resize((n + k,))
        ds[n:n + k] = np.array(vals, dtype=_h5_dtype(c))
    if digest_ds is not None:
        ds = digest_ds
        ds.resize((n + k,))
        ds[n:n + k] = np.array(digests, dtype="S32")
    return n + k


def _commit(f: Any, tables: list[tuple[Any, int]]) -> None:
    """Make appended rows visible: data first (flush), then the committed counts (flush)."""
    f.flush()
    for g, n in tables:
        g.attrs[_COMMITTED] = n
    f.flush()


# --------------------------------------------------------------------------- the store


@dataclass(frozen=True)
class _Snapshot:
    """Everything in the file, read at once (tables as rows, figures per type, e2e rows)."""

    rows: dict[str, list[dict[str, Any]]]
    figures: dict[str, dict]
    e2e: tuple[dict[str, Any], ...]


def check_store_path(path: str | os.PathLike) -> bool:
    """Whether a profile store is at ``path``: False when nothing is there (a store not made
    yet), True for a regular file; SystemFailure (exit 2, naming the path) for anything else
    there (a folder, ``/dev/null`` or another device, a FIFO, a link to one), which a caller
    asking ``is_file()`` would take for "no store" and plan from datasheet figures."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        if p.is_symlink():
            raise SystemFailure(f"{p}: the profile store path is a symbolic link to nothing "
                                f"({os.readlink(p)})") from None
        return False
    except OSError as e:
        raise SystemFailure(f"{p}: cannot read the profile store path: {e.strerror or e}") from None
    if stat.S_ISREG(st.st_mode):
        return True
    kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a character device" if stat.S_ISCHR(st.st_mode) else
            "a block device" if stat.S_ISBLK(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else
            "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
    via = f" (a link to {os.path.realpath(p)})" if p.is_symlink() else ""
    raise SystemFailure(f"{p}: the profile store path is {kind}{via}, not a file; name an HDF5 file")


class ProfileStore:
    """An HDF5 profile store at ``path`` (created on the first write).

    Construction does no I/O. Reads never lock; writes take the writer lock for
    the duration of one call, or for a whole ``with store.writer():`` block.
    """

    def __init__(self, path: str | os.PathLike, *, lock_timeout_s: float = 0.0) -> None:
        self.path = Path(path)
        self.lock_path = Path(str(self.path) + ".lock")
        self.lock_timeout_s = lock_timeout_s
        self._lock_depth = 0
        self._cache_key: tuple | None = None
        self._cache: _Snapshot | None = None
        self._digest_key: tuple | None = None
        self._digest_cache: dict[str, set[bytes]] = {}

    def __repr__(self) -> str:
        return f"ProfileStore({str(self.path)!r})"

    # ------------------------------------------------------------------ reading

    def exists(self) -> bool:
        return self.path.exists()

    def _read(self) -> _Snapshot:
        if not check_store_path(self.path):
            return _Snapshot(rows={}, figures={}, e2e=())
        st = self.path.stat()
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self._cache_key and self._cache is not None:
            return self._cache
        snap = self._read_file()
        self._cache_key, self._cache = key, snap
        return snap

    def _read_file(self) -> _Snapshot:
        import h5py

        try:
            f = h5py.File(self.path, "r", locking=False)
        except IsADirectoryError:
            raise SystemFailure(f"{self.path}: the profile store path is a folder, not a file") from None
        except OSError as e:
            raise SystemFailure(f"{self.path}: cannot open the profile store as HDF5: {e}") from None
        try:
            with f:
                version = _check_format(f, self.path)
                rows: dict[str, list[dict[str, Any]]] = {}
                figures: dict[str, dict] = {}
                for gname in f["gpu"]:
                    g = _table(f["gpu"], gname, f"{self.path}: the profile store is damaged")
                    if version >= 3 and _COMMITTED not in g.attrs:
                        continue  # a table whose creation was cut short: nothing in it was committed
                    where = f"{self.path}: the profile store is damaged: /gpu/{gname}"
                    gpu = _text_attr(g, "gpu_type", gname, where)
                    fig = _text_attr(g, "device_figures", "", where)
                    if fig:
                        try:
                            figures[gpu] = json.loads(fig)
                        except ValueError:
                            raise StoreDamaged(f"{where}: the attribute 'device_figures' is not valid JSON "
                                                f"({fig[:80]!r})") from None
                        if not isinstance(figures[gpu], dict):
                            raise StoreDamaged(f"{where}: the attribute 'device_figures' should be a JSON "
                                                f"mapping ({fig[:80]!r})")
                    cols = _read_columns(g, COLUMNS[1:], version, f"{self.path}: the profile store is damaged: table /gpu/{gname}")
                    n = len(cols["kind"])
                    try:
                        values = [_coerce_column(c, cols[c.name]) for c in COLUMNS[1:]]
                    except SpecError:
                        # name the first bad row, as reading row by row would have
                        for i in range(n):
                            try:
                                for c in COLUMNS[1:]:
                                    _coerce(c, cols[c.name][i])
                            except SpecError as e:
                                raise StoreDamaged(f"{where}: row {i}: {e}") from None
                        raise
                    names = [c.name for c in COLUMNS[1:]]
                    rows[gpu] = [{"gpu_type": gpu, **dict(zip(names, r))} for r in zip(*values)] if n else []
                e2e: tuple[dict[str, Any], ...] = ()
                if version >= 2 and "e2e" in f and (version < 3 or _COMMITTED in f["e2e"].attrs):
                    cols = _read_columns(f["e2e"], E2E_COLUMNS, version, f"{self.path}: the profile store is damaged: table /e2e")
                    n = len(cols["key"])
                    e2e = tuple({c.name: _coerce(c, cols[c.name][i]) for c in E2E_COLUMNS} for i in range(n))
        except SpecError as e:
            raise e.with_file(str(self.path)) from None
        except (OSError, KeyError, ValueError, TypeError) as e:  # a damaged file: h5py's own errors
            raise SystemFailure(f"{self.path}: the profile store cannot be read ({type(e).__name__}: {e})") from None
        return _Snapshot(rows=rows, figures=figures, e2e=e2e)

    def samples(self, *, gpu_type: str | None = None, kind: str | None = None,
                origins: Iterable[str] | None = None) -> list[LayerSample]:
        """Samples, optionally only of one GPU type, one kind, and some origins (stored order)."""
        snap = self._read()
        wanted = set(origins) if origins is not None else None
        out = []
        shapes: dict[tuple, LayerShape] = {}
        for gpu, table in snap.rows.items():
            if gpu_type is not None and gpu != gpu_type:
                continue
            for row in table:
                if kind is not None and row["kind"] != kind:
                    continue
                if wanted is not None and row["origin"] not in wanted:
                    continue
                try:
                    out.append(_sample_of(row, shapes))
                except SpecError as e:  # a row the file holds that no sample can be: a damaged store
                    raise StoreDamaged(f"{self.path}: the profile store is damaged: /gpu/{gpu} row "
                                        f"{table.index(row)}: {e}") from None
        return out

    def __len__(self) -> int:
        return sum(len(t) for t in self._read().rows.values())

    def gpu_types(self) -> list[str]:
        """GPU types that have samples or device figures, sorted."""
        snap = self._read()
        return sorted(set(snap.rows) | set(snap.figures))

    def content_hash(self) -> str:
        """sha256 over every layer sample, independent of the order they were added in.

        Device figures are not part of it: they describe the device, not the samples. Nor
        are end-to-end records (see :meth:`e2e_hash`): they calibrate the predictor, they do
        not train it, so a new run must not make the predictor look stale.
        """
        digests = sorted(_row_digest(r) for t in self._read().rows.values() for r in t)
        h = hashlib.sha256(f"{_SAMPLES_HASH_TAG}\n".encode())
        for d in digests:
            h.update(d.encode())
        return h.hexdigest()

    def stored_points(self, *, include_augmented: bool = False) -> set[ProfilePoint]:
        """Every point that has a sample (measured or imported; feasible or not)."""
        out = set()
        for s in self.samples():
            if s.origin == "augmented" and not include_augmented:
                continue
            out.add(s.point)
        return out

    def has_point(self, point: ProfilePoint) -> bool:
        """True when ``point`` was measured or imported (an infeasible result counts:
        it is known not to fit). Augmented samples are estimates and do not count."""
        return point in self.stored_points()

    def device_figures(self, gpu_type: str) -> dict | None:
        """Figures measured at profile time for ``gpu_type`` (see :data:`FIGURE_KEYS`), or None."""
        fig = self._read().figures.get(gpu_type)
        return dict(fig) if fig is not None else None

    def summary(self) -> list[dict]:
        """Per GPU type: sample counts in total, by kind and by origin; infeasible count; figures."""
        snap = self._read()
        out = []
        for gpu in self.gpu_types():
            table = snap.rows.get(gpu, [])
            by_kind: dict[str, int] = {}
            by_origin: dict[str, int] = {}
            for r in table:
                by_kind[r["kind"]] = by_kind.get(r["kind"], 0) + 1
                by_origin[r["origin"]] = by_origin.get(r["origin"], 0) + 1
            out.append({
                "gpu_type": gpu,
                "samples": len(table),
                "by_kind": dict(sorted(by_kind.items())),
                "by_origin": dict(sorted(by_origin.items())),
                "infeasible": sum(1 for r in table if r["infeasible"]),
                "device_figures": snap.figures.get(gpu),
            })
        return out

    def e2e_records(self, site: str | None = None, job: str | None = None) -> list[E2ERecord]:
        """End-to-end records in the order they were added, optionally of one site and one job (names)."""
        out = []
        for row in self._read().e2e:
            if site is not None and row["site"] != site:
                continue
            if job is not None and row["job"] != job:
                continue
            out.append(row_to_record(row))
        return out

    def e2e_hash(self) -> str:
        """sha256 over every end-to-end record, independent of order (see :func:`records_hash`)."""
        return records_hash(self.e2e_records())

    # ------------------------------------------------------------------ writing

    def append_e2e(self, records: Iterable[E2ERecord]) -> int:
        """Add end-to-end records atomically, under the writer lock, as :meth:`append` adds
        samples; exact duplicates (every column equal) are skipped. Returns the number added.
        A second run of the same plan (another job id) is a new record."""
        new_rows = []
        for rec in records:
            row = record_to_row(rec)
            row_to_record(row)  # the JSON columns read back
            new_rows.append(row)
        if not new_rows:
            return 0
        with self.writer():
            snap = self._read()
            seen = {_e2e_digest(r) for r in snap.e2e}
            rows = []
            for row in new_rows:
                d = _e2e_digest(row)
                if d not in seen:
                    seen.add(d)
                    rows.append(row)
            if rows:
                with self._open_for_append() as f:
                    self._check_room(2 * _rows_bytes(rows, E2E_COLUMNS) + _METADATA_BYTES + len(E2E_COLUMNS) * (
                        CHUNK_BYTES + CHUNK_ROWS * 8))
                    g = f["e2e"]
                    n = _append_rows(g, E2E_COLUMNS, rows)
                    _commit(f, [(g, n)])
                self._written()
            return len(rows)

    def append(self, samples: Iterable[LayerSample]) -> int:
        """Add samples atomically; exact duplicates (every column equal, of a stored
        sample or earlier in ``samples``) are skipped. Returns the number added.

        The cost does not grow with the store: new rows go past each table's committed
        rows, and duplicates are found by the stored row digests (kept in memory between
        appends of this object while no one else writes)."""
        new_rows = []
        for s in samples:
            if not isinstance(s, LayerSample):
                raise TypeError(f"append() takes LayerSample objects, got {type(s).__name__}")
            row = sample_to_row(s)
            _check_gpu_name(row["gpu_type"])
            row_to_sample(row)  # validates kind and origin
            new_rows.append(row)
        if not new_rows:
            return 0
        with self.writer():
            with self._open_for_append() as f:
                top = f["gpu"]
                by_gpu: dict[str, list[tuple[dict[str, Any], bytes]]] = {}
                for row in new_rows:
                    gpu = row["gpu_type"]
                    seen = self._digests_of(top, gpu)
                    d = bytes.fromhex(_row_digest(row))
                    if d in seen:
                        continue
                    seen.add(d)
                    by_gpu.setdefault(gpu, []).append((row, d))
                if not by_gpu:
                    return 0
                self._check_room(sum(_CHUNK_SET_BYTES + _rows_bytes([r for r, _ in v], COLUMNS)
                                     for v in by_gpu.values()) + _METADATA_BYTES)
                commits = []
                for gpu, items in by_gpu.items():
                    g = _sample_group(top, gpu)
                    n = _append_rows(g, COLUMNS[1:], [r for r, _ in items], digests=[d for _, d in items])
                    commits.append((g, n))
                _commit(f, commits)
            self._written()
            return sum(len(v) for v in by_gpu.values())

    def set_device_figures(self, gpu_type: str, figures: dict) -> None:
        """Record the figures measured for a ``measured_at_profile_time`` device type."""
        _check_gpu_name(gpu_type)
        clean = {}
        for k, v in figures.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise SpecError("device figures are positive finite numbers", field=f"device_figures.{k}", found=v)
            clean[str(k)] = float(v)
        missing = [k for k in FIGURE_KEYS if k not in clean]
        if missing:
            raise SpecError("device figures are incomplete", field="device_figures", found=sorted(clean),
                            allowed=", ".join(FIGURE_KEYS))
        with self.writer():
            with self._open_for_append() as f:
                g = _sample_group(f["gpu"], gpu_type)
                f.flush()
                g.attrs["device_figures"] = json.dumps(clean, sort_keys=True)  # one small in-place write
                f.flush()
            self._written()

    @contextlib.contextmanager
    def writer(self) -> Iterator["ProfileStore"]:
        """Hold the writer lock for a block of writes (re-entrant within this object)."""
        if self._lock_depth == 0:
            self._acquire()
        self._lock_depth += 1
        try:
            yield self
        finally:
            self._lock_depth -= 1
            if self._lock_depth == 0:
                self._release()

    # ------------------------------------------------------------------ writing: in place

    @contextlib.contextmanager
    def _open_for_append(self) -> Iterator[Any]:
        """The store opened for in-place appends (held under the writer lock): created, or
        turned into the current schema by one whole rewrite, first when needed."""
        import h5py

        version, dirty = None, False
        if self.path.exists():
            try:
                with h5py.File(self.path, "r", locking=False) as f:
                    version = _check_format(f, self.path)
                    dirty = bool(_scalar(f.attrs.get(_WRITING, 0)))  # a 0/1 count: _check_layout
            except IsADirectoryError:
                raise SystemFailure(f"{self.path}: the profile store path is a folder, not a file") from None
            except OSError as e:
                raise SystemFailure(f"{self.path}: cannot open the profile store as HDF5: {e}") from None
        if version is None:
            self._write(_Snapshot(rows={}, figures={}, e2e=()))
        elif version != SCHEMA_VERSION or dirty:
            if dirty:
                # The last writer died inside an append: HDF5's own metadata past the
                # committed rows may be half written. Rebuild the file from what was committed.
                warnings.warn(f"{self.path}: the last write was cut short; rebuilding the store from its "
                              "committed rows", stacklevel=4)
            self._write(self._read())
        try:
            f = h5py.File(self.path, "r+", locking=False)
        except OSError as e:
            raise SystemFailure(f"{self.path}: cannot open the profile store for writing: {e}") from None
        try:
            f.attrs[_WRITING] = 1  # cleared below; found set, the next writer rebuilds the file
            f.flush()
            try:
                yield f
            except (StoreDamaged, StoreFull):
                # Found before any count was raised: the committed rows are as they were and the
                # file closes cleanly, so it is not marked as cut short.
                f.attrs[_WRITING] = 0
                raise
            f.flush()
            f.attrs[_WRITING] = 0
        finally:
            f.close()
        with open(self.path, "rb") as fh:
            os.fsync(fh.fileno())

    def _digests_of(self, top: Any, gpu: str) -> set[bytes]:
        """The row digests of ``gpu``'s committed rows; from memory when this object wrote last."""
        key = self._stat_key()
        if self._digest_key != key:
            self._digest_cache, self._digest_key = {}, key
        seen = self._digest_cache.get(gpu)
        if seen is None:
            where = f"{self.path}: the profile store is damaged: table /gpu/{gpu}"
            g = _table(top, gpu, where)
            if g is None or _COMMITTED not in g.attrs:
                seen = set()
            else:
                n = _rows_of(g, where)
                # The raw 32 bytes of each digest: numpy's S32 items drop trailing NUL bytes
                # (about one digest in 256 ends in one), which then never matched a new row's.
                raw = _column(g, _DIGESTS, "digest", where, n)[:n].tobytes()
                seen = {raw[i:i + 32] for i in range(0, len(raw), 32)}
            self._digest_cache[gpu] = seen
        return seen

    def _stat_key(self) -> tuple | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _written(self) -> None:
        """After a write of ours: the snapshot is stale; the digest sets (updated in place) are current."""
        self._cache_key, self._cache = None, None
        self._digest_key = self._stat_key()

    # ------------------------------------------------------------------ writing: whole file

    def _write(self, snap: _Snapshot) -> None:
        """Write a whole new file in the current schema next to the store and move it over it."""
        import h5py

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SystemFailure(f"{self.path.parent}: cannot create the profile store's folder: "
                                f"{e.strerror or e}") from None
        self._clean_temps()
        self._check_room(sum(_CHUNK_SET_BYTES + _rows_bytes(t, COLUMNS) for t in snap.rows.values())
                         + 2 * _rows_bytes(list(snap.e2e), E2E_COLUMNS) + _METADATA_BYTES, whole_file=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        try:
            with h5py.File(tmp, "w", locking=False) as f:
                f.attrs["format"] = FORMAT_NAME
                f.attrs["schema_version"] = SCHEMA_VERSION
                top = f.create_group("gpu")
                for gpu in sorted(set(snap.rows) | set(snap.figures)):
                    g = _sample_group(top, gpu)
                    fig = snap.figures.get(gpu)
                    g.attrs["device_figures"] = json.dumps(fig, sort_keys=True) if fig else ""
                    table = snap.rows.get(gpu, [])
                    n = _append_rows(g, COLUMNS[1:], table,
                                     digests=[bytes.fromhex(_row_digest(r)) for r in table])
                    g.attrs[_COMMITTED] = n
                e2e = _new_table(f.create_group("e2e"), E2E_COLUMNS)
                e2e.attrs[_COMMITTED] = _append_rows(e2e, E2E_COLUMNS, list(snap.e2e))
                self._carry_other_groups(f)
                f.flush()
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
            _fsync_dir(self.path.parent)
        except OSError as e:
            raise SystemFailure(f"{self.path}: cannot write the profile store: {e.strerror or e}") from None
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
        self._cache_key, self._cache = None, None
        self._digest_key, self._digest_cache = None, {}

    def _check_room(self, need_bytes: int, *, whole_file: bool = False) -> None:
        """Refuse a write the file system or the file size limit (``RLIMIT_FSIZE``) has no room
        for, before HDF5 starts it: HDF5 meeting a full disk or the limit mid-write crashed the
        process (a segfault in its clean-up), where this names the store and writes nothing.
        ``whole_file``: a new file is written beside the store (which stays until the move)."""
        import resource

        try:
            size = self.path.stat().st_size
        except OSError:
            size = 0
        if whole_file:
            # the rewrite copies what other tables keep in the file (link curves) as they are
            need_bytes += size
        try:
            st = os.statvfs(self.path.parent)
        except OSError:
            return  # no folder yet: the write itself says why
        room, why = st.f_bavail * st.f_frsize, f"free on the file system of {self.path.parent}"
        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        if soft != resource.RLIM_INFINITY:
            grows_from = 0 if whole_file else size
            if soft - grows_from < room:
                room, why = max(0, soft - grows_from), f"left under this process's file size limit ({soft:,} bytes)"
        if need_bytes > room:
            raise StoreFull(f"{self.path}: no room to write the profile store: about {need_bytes / 2**20:.1f} MiB "
                            f"needed, {room / 2**20:.1f} MiB {why}; nothing was written")

    def _carry_other_groups(self, f: Any) -> None:
        """Groups other tables keep in the same file (``/comm``: the link curves of
        :mod:`memx_hpc.profile.comm`, with their own writer under this lock) move into a
        rewritten file as they are."""
        import h5py
        if not self.path.exists():
            return
        try:
            with h5py.File(self.path, "r", locking=False) as old:
                for name in old:
                    if name not in ("gpu", "e2e") and name not in f:
                        old.copy(name, f)
        except (OSError, KeyError, RuntimeError) as e:
            warnings.warn(f"{self.path}: could not carry other tables into the rewritten store: {e}", stacklevel=3)

    def _clean_temps(self) -> None:
        """Remove temporary files left by writers that were killed mid-write."""
        for t in self.path.parent.glob(f".{self.path.name}.tmp-*"):
            try:
                pid = int(t.name.rsplit("-", 1)[1])
            except ValueError:
                continue
            if pid != os.getpid() and not pid_alive(pid):
                with contextlib.suppress(OSError):
                    t.unlink()

    # ------------------------------------------------------------------ the lock

    def _acquire(self) -> None:
        try:
            self._try_acquire()
        except OSError as e:  # no folder, no permission, a read-only file system
            raise SystemFailure(f"{self.lock_path}: cannot take the profile store's writer lock: "
                                f"{e.strerror or e}") from None

    def _try_acquire(self) -> None:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        me = f"{os.getpid()}@{socket.gethostname()}"
        deadline = time.monotonic() + self.lock_timeout_s
        # The lock appears with its holder already written: the PID goes into a file of this
        # process's own, which is then hard-linked to the lock name (atomic, fails when the lock
        # exists; also on NFS). A writer killed at any moment leaves either no lock or one that
        # names its dead PID, never an empty lock that nobody can tell from one being created.
        mine = self.lock_path.with_name(f"{self.lock_path.name}.{os.getpid()}")
        while True:
            try:
                created = self._create_lock(mine, me)
            except FileExistsError:
                created = False
            if not created:
                holder = self._holder()
                if _is_dead(holder) and self._break_stale():
                    continue
                if time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                who = f"PID {holder[0]} on {holder[1]}" if holder else "a process starting to write"
                raise StoreLocked(f"store locked by {who}: {self.path} is being written; wait for it to finish, "
                                  f"or remove {self.lock_path} if that process is gone")
            return

    def _break_stale(self) -> bool:
        """Remove the lock if it still names a dead process; True when it was removed.

        Two writers that both saw the dead holder must not both break: the second would
        delete the lock the first had just taken, and both would write. So the holder is read
        again and the lock removed under an exclusive ``flock`` of a separate guard file;
        between that read and the removal nobody else can remove the lock, and nobody can
        create one while it exists, so what is removed is the dead holder's lock."""
        import fcntl

        guard = self.lock_path.with_name(f".{self.lock_path.name}.guard")
        try:
            fd = os.open(guard, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise SystemFailure(f"{guard}: cannot open the guard of the profile store's writer lock: "
                                f"{e.strerror or e}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SystemFailure(f"{guard}: the guard of the profile store's writer lock is not a regular "
                                    "file; remove it")
            fcntl.flock(fd, fcntl.LOCK_EX)
            holder = self._holder()
            if not _is_dead(holder):
                return False
            warnings.warn(f"breaking the stale lock {self.lock_path} of PID {holder[0]} "
                          "(that process no longer runs)", stacklevel=6)
            with contextlib.suppress(FileNotFoundError):
                self.lock_path.unlink()
            with contextlib.suppress(FileNotFoundError):  # its own file, if it died before removing it
                self.lock_path.with_name(f"{self.lock_path.name}.{holder[0]}").unlink()
            return True
        finally:
            os.close(fd)  # releases the flock

    def _create_lock(self, mine: Path, me: str) -> bool:
        """Create the lock holding ``me``; False when another holder has it (FileExistsError
        may also come through from the fallback)."""
        with open(mine, "w") as fh:
            fh.write(me + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(mine, self.lock_path)
            return True
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: create-exclusive, then write
            fd = os.open(self.lock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            with os.fdopen(fd, "w") as fh:
                fh.write(me + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                mine.unlink()

    def _holder(self) -> tuple[int, str] | None:
        """(PID, host) from the lock file; None while it is being created or is unreadable."""
        try:
            # Only a regular file is read, and only its first bytes: a FIFO there would block
            # every writer and a link to /dev/zero would fill its memory.
            text = read_regular_file(self.lock_path, 4096, follow_links=False).decode("utf-8", "replace").strip()
        except FileNotFoundError:
            return None
        except NotARegularFile as e:
            raise SystemFailure(f"{self.lock_path}: the profile store's writer lock {e.strerror}; "
                                "remove it (a lock is a file this tool creates)") from None
        try:
            pid_s, host = text.split("@", 1)
            return int(pid_s), host
        except ValueError:
            # Empty or garbled: a writer between O_EXCL and write(), or a kill right
            # there. Old enough means the latter; treat it as a lock of a dead PID.
            try:
                age = time.time() - self.lock_path.stat().st_mtime
            except FileNotFoundError:
                return None
            return (0, socket.gethostname()) if age > 5 else None

    def _release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.lock_path.unlink()


def _is_dead(holder: tuple[int, str] | None) -> bool:
    """True for a lock holder that is a process of this host that no longer runs."""
    return holder is not None and holder[1] == socket.gethostname() and not pid_alive(holder[0])


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` of this host runs (a zombie does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) holds nothing
        proc = Path(f"/proc/{pid}/stat").read_text()
        return proc.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
