"""Small helpers shared by the subcommands: output as JSON or tables, common options."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Iterable, Sequence


def add_site(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--site", required=required, metavar="SITE.yaml",
                   help="site file: partitions, GPU types, links, Slurm options (see site_configs/)")


def add_job(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--job", required=required, metavar="JOB.yaml",
                   help="job file: model (preset or shape), global batch, precision (see jobs/)")


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")


def emit_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


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
    text_cols = [i for i in range(len(header)) if not all(_isnum(r[i]) for r in rows)]
    if not text_cols:
        return
    i = max(text_cols, key=lambda j: widths[j])
    room = max(len(header[i]), widths[i] - (total - max_width), 8)
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


class step:
    """Progress of one step that has no count to show: ``with step("fit: cross-validation"):``
    prints the label on stderr, then the elapsed time while it runs (every second on a
    terminal, every 10 s into a log) and how long it took. Steps under 2 s print one line."""

    def __init__(self, label: str, *, stream=None, enabled: bool = True) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def __enter__(self) -> "step":
        import threading
        import time
        self._t0 = time.perf_counter()
        self._stop = threading.Event()
        if self.enabled:
            self._write(f"{self.label} ...", end="" if self.tty else "\n")
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        return self

    def _write(self, text: str, *, end: str = "\n") -> None:
        try:
            self.stream.write(text + end)
            self.stream.flush()
        except (OSError, ValueError):  # a closed stream must not fail the work
            pass

    def _tick(self) -> None:
        import time
        every = 1.0 if self.tty else 10.0
        while not self._stop.wait(every):
            el = time.perf_counter() - self._t0
            if self.tty:
                self._write(f"\r{self.label} ... {el:.0f} s", end="")
            else:
                self._write(f"{self.label}: still running ({el:.0f} s)")

    def __exit__(self, exc_type, exc, tb) -> None:
        import time
        self._stop.set()
        if not self.enabled:
            return
        self._thread.join()
        el = time.perf_counter() - self._t0
        word = "failed" if exc_type is not None else "done"
        self._write(f"\r{self.label} ... {word} in {el:.1f} s" if self.tty else f"{self.label}: {word} in {el:.1f} s")
