"""The profile store's file format: its columns, the codecs between samples (and end-to-end
records) and table rows, row digests, and the HDF5 table helpers that read, check and append
them. :class:`memx_hpc.profile.store.ProfileStore` reads and writes the file through these.

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

A columnar table per GPU type, units in the column names (``forward_ms``,
``activation_bytes``); text columns are UTF-8 variable-length strings.
Every row keeps its ``origin`` (measured | imported | augmented), ``source`` and
``provenance`` (:class:`~memx_hpc.spec.Provenance`, stored as its JSON text: host, device, driver,
versions, settings, time).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SpecError, SystemFailure
from ..records import E2ERecord
from ..spec import SAMPLE_KINDS, SAMPLE_ORIGINS, LayerSample, LayerShape, ProfilePoint, Provenance

__all__ = ["SCHEMA_VERSION", "READABLE_VERSIONS", "COLUMNS", "COLUMN_NAMES", "Column", "E2E_COLUMNS", "FIGURE_KEYS",
           "StoreDamaged", "StoreFull", "sample_to_row", "row_to_sample", "record_to_row", "row_to_record"]

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

