"""The CSV interchange format of profile samples (``memx-hpc profile export --csv`` / ``import``).

Format (version 1):

* UTF-8, comma-separated, RFC 4180 quoting (Python's ``csv`` module, ``QUOTE_MINIMAL``),
  CRLF line ends (RFC 4180); the first row is the header.
* One row per sample. The columns, in this order, are the store's
  (:data:`memx_hpc.profile.store.COLUMNS`): ``gpu_type, kind, hidden_size,
  num_attention_heads, num_query_groups, ffn_hidden_size, seq_length, vocab_size,
  activation, tp, micro_batch_size, recompute, precision, attention, group_size,
  message_bytes, inter_node, forward_ms, backward_ms, update_ms, activation_bytes,
  peak_allocated_bytes, peak_reserved_bytes, device_footprint_bytes, infeasible, origin,
  source, provenance, weight``. Units are in the names (ms, bytes).
* Whole numbers are written as integers; booleans as ``true`` / ``false`` (``1`` / ``0``
  also read); floats in their shortest round-trip form (``repr``), so export then import
  gives bit-identical values; ``provenance`` is a JSON object as text.
* On import the columns may come in any order and the optional ones (those with a
  default in ``COLUMNS``: everything after ``vocab_size``) may be left out. Unknown
  columns, a missing required column, or a bad value is an error naming the file, the
  line and the column.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Iterable

from ..errors import SpecError
from ..spec import LayerSample, Provenance, open_regular_file
from .store_format import COLUMN_NAMES, COLUMNS, Column, row_to_sample, sample_to_row

__all__ = ["write_csv", "read_csv", "CSV_COLUMNS"]

CSV_COLUMNS = COLUMN_NAMES


def _fmt(c: Column, v: object) -> str:
    if c.kind == "bool":
        return "true" if v else "false"
    if c.kind == "float":
        return repr(float(v))  # shortest round-trip text
    return str(v)


def write_csv(samples: Iterable[LayerSample], path: str | os.PathLike) -> int:
    """Write samples to ``path`` (atomically: a temporary file, then a rename). Returns the row count."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    n = 0
    try:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            w = csv.writer(fh, lineterminator="\r\n")  # RFC 4180; also makes a bare CR get quoted
            w.writerow(CSV_COLUMNS)
            for s in samples:
                row = sample_to_row(s)
                w.writerow([_fmt(c, row[c.name]) for c in COLUMNS])
                n += 1
        os.replace(tmp, p)
    finally:
        if tmp.exists():
            tmp.unlink()
    return n


def _parse(c: Column, text: str, where: dict) -> object:
    t = text.strip()
    if c.kind == "str":
        return c.default if text == "" and c.default else text
    if t == "" and c.default is not None:
        return c.default
    if c.kind == "bool":
        low = t.lower()
        if low in ("true", "1"):
            return True
        if low in ("false", "0"):
            return False
        raise SpecError("expected true or false", found=text, **where)
    if c.kind == "int":
        try:
            return int(t)
        except ValueError:
            try:
                f = float(t)
            except ValueError:
                f = math.nan
            if math.isfinite(f) and f.is_integer():
                return int(f)
            raise SpecError("expected a whole number", found=text, **where) from None
    try:
        f = float(t)
    except ValueError:
        raise SpecError("expected a number", found=text, **where) from None
    if not math.isfinite(f):
        raise SpecError("expected a finite number", found=text, **where)
    return f


def read_csv(path: str | os.PathLike) -> list[LayerSample]:
    """Samples from a CSV file in the interchange format (see the module docstring)."""
    p = Path(path)
    try:
        fh = os.fdopen(open_regular_file(p), encoding="utf-8", newline="")  # a FIFO would block the read
    except FileNotFoundError:
        raise SpecError("file not found", file=str(p)) from None
    except OSError as e:
        raise SpecError(f"cannot read file: {e.strerror or e}", file=str(p)) from None
    by_name = {c.name: c for c in COLUMNS}
    out: list[LayerSample] = []
    with fh:
        r = csv.reader(fh)
        try:
            header = next(r)
        except StopIteration:
            raise SpecError("empty file: expected a header row", file=str(p)) from None
        except (csv.Error, UnicodeDecodeError) as e:
            raise SpecError(f"not a CSV file: {e}", file=str(p)) from None
        header = [h.strip() for h in header]
        for h in header:
            if h not in by_name:
                raise SpecError("unknown column", file=str(p), field=h, allowed=", ".join(CSV_COLUMNS))
        if len(set(header)) != len(header):
            raise SpecError("a column appears twice", file=str(p), found=header)
        missing = [c.name for c in COLUMNS if c.default is None and c.name not in header]
        if missing:
            raise SpecError("required column(s) missing", file=str(p), field=", ".join(missing),
                            allowed=", ".join(CSV_COLUMNS))
        try:
            for line_no, cells in enumerate(r, start=2):
                if not cells or all(not x.strip() for x in cells):
                    continue
                if len(cells) != len(header):
                    raise SpecError(f"line {line_no}: {len(cells)} cells for {len(header)} columns", file=str(p))
                row = {}
                for name, text in zip(header, cells):
                    row[name] = _parse(by_name[name], text, {"file": str(p), "field": f"line {line_no}: {name}"})
                for c in COLUMNS:
                    row.setdefault(c.name, c.default)
                try:
                    Provenance.parse(row["provenance"])
                except SpecError as e:
                    raise SpecError(e.detail, file=str(p), field=f"line {line_no}: provenance", found=e.found) from None
                try:
                    out.append(row_to_sample(row))
                except SpecError as e:
                    raise SpecError(e.detail, file=str(p), field=f"line {line_no}: {e.field}", found=e.found,
                                    allowed=e.allowed) from None
        except (csv.Error, UnicodeDecodeError) as e:
            raise SpecError(f"not a valid CSV file: {e}", file=str(p)) from None
    return out
