"""Plain aligned text tables, for the commands, the reports and the benchmarks alike."""

from __future__ import annotations

import sys
from typing import Any, Iterable, Sequence

__all__ = ["TABLE_WIDTH", "table"]

#: Tables are cut to this many columns when they would be wider (a terminal of 120).
TABLE_WIDTH = 120


def table(rows: Iterable[Sequence[Any]], header: Sequence[str], *, file=None, drop_empty: bool = False,
          max_width: int | None = None) -> str:
    """A plain aligned text table (right-aligned numbers).

    ``drop_empty``: leave out columns whose every cell is empty or "-". ``max_width``: when
    the table is wider, the widest text column is shortened (cells end in "~")."""
    rows = [[_fmt(c) for c in r] for r in rows]
    header = list(header)
    if drop_empty and rows:
        keep = [i for i in range(len(header)) if any(r[i] not in ("", "-") for r in rows)]
        header = [header[i] for i in keep]
        rows = [[r[i] for i in keep] for r in rows]
    if max_width is not None and rows:
        _fit(rows, header, max_width)
    widths = [len(h) for h in header]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    def line(cells: Sequence[str], numeric: Sequence[bool]) -> str:
        return "  ".join(c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cells, widths, numeric)).rstrip()
    numeric = [all(_isnum(r[i]) for r in rows) and bool(rows) for i in range(len(header))]
    out = [line(list(header), numeric), line(["-" * w for w in widths], numeric)]
    out += [line(r, numeric) for r in rows]
    text = "\n".join(out)
    print(text, file=file or sys.stdout)
    return text


def _fit(rows: list[list[str]], header: list[str], max_width: int) -> None:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    total = sum(widths) + 2 * (len(widths) - 1)
    if total <= max_width:
        return
    # only a long free-text column (stages, reasons) is shortened; names stay whole
    text_cols = [i for i in range(len(header)) if widths[i] > 20 and not all(_isnum(r[i]) for r in rows)]
    if not text_cols:
        return
    i = max(text_cols, key=lambda j: widths[j])
    room = max(len(header[i]), widths[i] - (total - max_width), 20)
    for r in rows:
        if len(r[i]) > room:
            r[i] = r[i][:room - 1] + "~"


def _fmt(c: Any) -> str:
    if isinstance(c, float):
        if c == 0:
            return "0"
        if abs(c) >= 1000:
            return f"{c:,.0f}"
        if abs(c) >= 10:
            return f"{c:.1f}"
        return f"{c:.3g}"
    return str(c)


def _isnum(s: str) -> bool:
    try:
        float(s.replace(",", "").rstrip("%x"))
        return True
    except ValueError:
        return False
