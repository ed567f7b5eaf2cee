"""Small helpers shared by the subcommands: output as JSON or tables, common options."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_site(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--site", required=required, metavar="SITE.yaml",
                   help="site file: partitions, GPU types, links, Slurm options (see site_configs/)")


def add_job(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--job", required=required, metavar="JOB.yaml",
                   help="job file: model (preset or shape), global batch, precision (see jobs/)")


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")


def emit_json(obj: Any) -> None:
    """``obj`` as JSON on stdout. A closed stdout (the caller's pipe, or no stdout at all) is
    a SystemFailure (exit 2, one line on stderr): the report the caller asked for is lost."""
    from ..errors import SystemFailure

    out = sys.stdout
    if out is None:
        raise SystemFailure("standard output is closed: nowhere to print the --json report")
    try:
        json.dump(obj, out, indent=2, default=str)
        out.write("\n")
        out.flush()
    except (BrokenPipeError, ValueError) as e:  # ValueError: a closed file object
        _quiet_stdout()
        raise SystemFailure(f"standard output is closed: the --json report could not be written ({e})") from None


def _quiet_stdout() -> None:
    """Point fd 1 at /dev/null, so that Python's flush at exit does not fail on the closed
    pipe a second time ("Exception ignored ... BrokenPipeError")."""
    import os

    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):
        pass


def shown(path: object) -> str:
    """A path as text that any terminal or log can take: bytes of a file name that are not
    UTF-8 (held by Python as surrogates) are shown as U+FFFD, never a UnicodeEncodeError."""
    return str(path).encode("utf-8", "surrogateescape").decode("utf-8", "replace")


from ..tables import TABLE_WIDTH, table  # noqa: E402,F401 (the subcommands print with these)


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
