"""What a site may put into a shell, checked in one place for loading, rendering and profiling.

Three kinds of site values reach a shell on the cluster:

* **paths** -- a partition's ``python`` and ``container``: one word each, from a small
  alphabet (letters, digits, ``_ . / + @ : % = , -``), never starting with ``-``. They are
  also quoted wherever they are written (the rendered script, submitit's sbatch file).
* **the entry** -- ``megatron_entry``: a path as above, or ``-m dotted.module``.
* **setup lines** -- shell code by contract (``module load rocm/6.1``). Each must be one
  complete line that ``bash -n`` accepts on its own; it is written into scripts as the
  quoted argument of ``eval``, so no value can change the structure of the script around
  it (close a function, open a here-document, end a component).

:func:`check_partition` applies all three to a partition; the site loader, ``render`` and
the profiler call it, so ``validate`` accepts exactly what they accept.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from typing import Iterable, Sequence

from .errors import SpecError

__all__ = ["check_path", "check_entry", "check_setup_line", "check_partition", "setup_commands",
           "PATH_CHARS"]

#: The characters a path field may hold (a readable statement for error messages).
PATH_CHARS = "letters, digits and _ . / + @ : % = , - (one word, not starting with '-')"
# \Z, not $: '$' also matches before a final newline, so "a\n" passed as a path
_PATH = re.compile(r"^[A-Za-z0-9_./+@:%=,][A-Za-z0-9_./+@:%=,-]*\Z")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_CONTROL = ("\n", "\r", "\x00")


def check_path(value: str, field: str) -> str:
    """A path that goes into a shell command: one word from :data:`PATH_CHARS`."""
    if not isinstance(value, str) or not value:
        raise SpecError("must be a non-empty path", field=field, found=value)
    if not _PATH.match(value):
        raise SpecError("not a plain path: it is run on the cluster's nodes, so shell characters, spaces "
                        "and leading '-' are refused", field=field, found=value, allowed=PATH_CHARS)
    return value


def check_entry(value: str, field: str) -> tuple[str, ...]:
    """The training entry as argv words: ``path/pretrain_gpt.py`` or ``-m dotted.module``."""
    if isinstance(value, str) and value.startswith("-m"):
        words = value.split()
        if len(words) == 2 and words[0] == "-m" and _MODULE.match(words[1]):
            return ("-m", words[1])
        raise SpecError("an entry module is '-m dotted.module.name'", field=field, found=value,
                        allowed="a path (" + PATH_CHARS + ") or -m dotted.module")
    return (check_path(value, field),)


def _bash_n(text: str) -> str | None:
    """bash's complaint about ``text`` as a script, or None when it parses."""
    try:
        r = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:  # no bash: the quoted eval still keeps it contained
        return None if isinstance(e, OSError) else "bash -n did not answer"
    lines = [ln.split(": ", 2)[-1] for ln in r.stderr.strip().splitlines()] or ["syntax error"]
    return None if r.returncode == 0 else lines[0]


def check_setup_line(line: str, field: str) -> str:
    """A setup line: one complete shell line (bash -n accepts it alone), no here-document."""
    if not isinstance(line, str):
        raise SpecError("setup lines are strings", field=field, found=line)
    for ch in _CONTROL:
        if ch in line:
            raise SpecError("must be a single line (no newline, carriage return or NUL)", field=field, found=line)
    if re.search(r"<<(?!<)", line):
        raise SpecError("here-documents are not allowed in setup lines", field=field, found=line)
    try:
        shlex.split(line, comments=True)
    except ValueError as e:
        raise SpecError(f"not a complete shell line ({e})", field=field, found=line) from None
    complaint = _bash_n(line + "\n")
    if complaint is not None:
        raise SpecError(f"not a complete shell command on its own (bash -n: {complaint})", field=field,
                        found=line)
    return line


def setup_commands(lines: Iterable[str]) -> list[str]:
    """The script lines that run checked setup lines: ``eval`` of each, quoted, so that a line
    runs where it is placed and cannot alter the script's structure."""
    return [f"eval {shlex.quote(line)}" for line in lines]


def check_partition(p: object, field: str) -> None:
    """Every shell-bound field of a :class:`~memx_hpc.spec.Partition` (``field`` is its
    place in the site file, e.g. ``partitions[1]``)."""
    check_path(p.python, f"{field}.python")  # type: ignore[attr-defined]
    if p.container is not None:  # type: ignore[attr-defined]
        check_path(p.container, f"{field}.container")  # type: ignore[attr-defined]
    check_entry(p.megatron_entry, f"{field}.megatron_entry")  # type: ignore[attr-defined]
    setup: Sequence[str] = p.setup  # type: ignore[attr-defined]
    for k, line in enumerate(setup):
        check_setup_line(line, f"{field}.setup[{k}]")
