"""The value checks every spec runs when it is built, the ranges they check against, and
``_build`` / ``_wrap_file``, which prefix an error with the field path and the file name.

Each check raises :class:`~memx_hpc.errors.SpecError` naming the field, what was found and
what is allowed.
"""

from __future__ import annotations

import difflib
import math
import numbers
import re
from typing import Any, Callable, Iterable

from ..errors import SpecError

# sbatch --signal=[{R|B}:]SIG[@seconds]: a signal number or name, Slurm's lead time <= 65535 s
_SLURM_SIGNAL = re.compile(r"(?:[RB]:)?(?:[0-9]{1,2}|(?:SIG)?[A-Z][A-Z0-9]{0,15})(?:@[0-9]{1,5})?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Names that become Slurm option values, folder or file names (job, partition, GRES,
# account, QoS, GPU type): Slurm's own character set. It has no '/', no NUL or
# newline, cannot start with '-' (an option) or '.' (so never '.' or '..').
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
SAFE_NAME_RULE = "letters, digits, '_', '.', '+' and '-', starting with a letter or digit"
MAX_NAME_CHARS = 128

# Physical ranges. Generous by orders of magnitude over any part sold or cluster built,
# tight enough that arithmetic on them stays finite and the work they imply is bounded.
MAX_DEVICE_MEMORY_GIB = 2.0**20       # 1 PiB per device
MIN_DEVICE_MEMORY_GIB = 2.0**-10      # 1 MiB per device
MAX_TFLOPS = 1e6
#: below this a "usable fraction" is a misread unit (a percentage, GB for GiB), not a driver reserve
MIN_USABLE_FRACTION = 0.5
MAX_GBPS = 1e6                        # GB/s per direction
MIN_RATE = 1e-6                       # TFLOP/s or GB/s: anything slower is a typo
MAX_NODES = 1_000_000
MAX_GPUS_PER_NODE = 1024
MAX_PARTITIONS = 64
MAX_TIME_LIMIT_MIN = 366 * 24 * 60
MAX_LAYERS = 4096
MAX_HIDDEN = 2**20
MAX_HEADS = 2**14
MAX_VOCAB = 2**24
MAX_SEQ_LENGTH = 2**24
MAX_GLOBAL_BATCH = 2**16              # sequences per iteration (30x the largest published runs)
MAX_MICRO_BATCH_CHOICES = 64
MAX_TRAIN_ITERS = 10**9
MAX_WEIGHT = 1e3


# --------------------------------------------------------------------------- value checks


# --------------------------------------------------------------------------- value checks


def _short(v: Any) -> Any:
    if isinstance(v, numbers.Integral) and not isinstance(v, bool) and abs(int(v)).bit_length() > 132:
        return f"an integer of about {int(abs(int(v)).bit_length() * 0.30103) + 1:,} digits"
    if isinstance(v, (dict, list, tuple)):
        try:
            text = repr(v)
        except ValueError:  # an integer too long to print
            text = f"<{type(v).__name__} of {len(v)}>"
        return text if len(text) < 60 else text[:57] + "..."
    if isinstance(v, str) and len(v) > 80:
        return v[:77] + "..."
    return v


def _suggest(word: str, options: Iterable[str]) -> str:
    near = difflib.get_close_matches(word, list(options), n=1, cutoff=0.5)
    return f"; did you mean {near[0]!r}?" if near else ""


def _whole(value: Any, name: str, lo: int, hi: int, *, optional: bool = False) -> None:
    """A whole number in ``[lo, hi]`` (numpy integers too; never bool)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SpecError("expected a whole number", field=name, found=_short(value), allowed=f"{lo:,} to {hi:,}")
    if not lo <= value <= hi:
        raise SpecError(f"must be between {lo:,} and {hi:,}", field=name, found=_short(value))


def _real(value: Any, name: str, lo: float, hi: float, *, lo_open: bool = False, optional: bool = False) -> None:
    """A finite number in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    if value is None and optional:
        return
    try:
        ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(float(value))
    except OverflowError:
        ok = False
    if not ok:
        raise SpecError("expected a finite number", field=name, found=_short(value),
                        allowed=f"{'more than' if lo_open else 'from'} {lo:g} to {hi:g}")
    v = float(value)
    if v < lo or (lo_open and v == lo) or v > hi:
        raise SpecError(f"must be {'more than' if lo_open else 'at least'} {lo:g} and at most {hi:g}",
                        field=name, found=value)


def _choice(value: Any, name: str, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise SpecError("not an allowed value" + (_suggest(value, choices) if isinstance(value, str) else ""),
                        field=name, found=_short(value), allowed=", ".join(choices))


def _text(value: Any, name: str, *, optional: bool = False) -> None:
    """A non-empty single line of printable text (labels, paths, free text)."""
    if value is None and optional:
        return
    if not isinstance(value, str) or not value.strip():
        raise SpecError("expected a non-empty string", field=name, found=_short(value))
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise SpecError("must be a single line of printable text (no newline, tab or NUL)", field=name,
                        found=_short(value))


def _safe_name(value: Any, name: str, *, optional: bool = False) -> None:
    """A name that ends up in a Slurm option, a folder or a file name."""
    if value is None and optional:
        return
    if not isinstance(value, str) or not _SAFE_NAME.fullmatch(value) or len(value) > MAX_NAME_CHARS:
        raise SpecError("not a safe name: it becomes a Slurm option, folder or file name", field=name,
                        found=_short(value), allowed=f"{SAFE_NAME_RULE}; at most {MAX_NAME_CHARS} characters")


def _str_pairs(value: Any, name: str) -> None:
    if not isinstance(value, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in value):
        raise SpecError("expected (NAME, value) pairs", field=name, found=_short(value))
    for k, v in value:
        if not isinstance(k, str) or not _ENV_NAME.fullmatch(k):
            raise SpecError("environment variable names are letters, digits and _", field=f"{name}.{k}", found=k)
        if not isinstance(v, str):
            raise SpecError("expected a string", field=f"{name}.{k}", found=_short(v))
        if any(ch in v for ch in ("\n", "\r", "\x00")):  # refused here, not first by render
            raise SpecError("must be a single line (no newline, carriage return or NUL): it goes into a "
                            "shell script", field=f"{name}.{k}", found=_short(v))


def _optional_bool(value: Any, name: str) -> None:
    if value is not None and not isinstance(value, bool):
        raise SpecError("expected true or false", field=name, found=_short(value))


def _slurm_signal(value: Any, name: str) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not _SLURM_SIGNAL.fullmatch(value) or \
            ("@" in value and int(value.rsplit("@", 1)[1]) > 65535):
        raise SpecError("not a Slurm signal", field=name, found=_short(value),
                        allowed="[R:|B:]SIGNAL[@seconds] as sbatch --signal takes it (USR1@120, B:TERM@60, 10), "
                                "at most 65535 s")


def _degrees(value: Any, name: str, hi: int) -> None:
    """A list of parallel degrees a search may choose among: whole numbers in ``[1, hi]``."""
    if not isinstance(value, tuple):
        raise SpecError("expected a list of whole numbers >= 1", field=name, found=_short(value))
    if len(value) > MAX_MICRO_BATCH_CHOICES:
        raise SpecError(f"{len(value)} sizes", field=name, allowed=f"at most {MAX_MICRO_BATCH_CHOICES}")
    for i, v in enumerate(value):
        _whole(v, f"{name}[{i}]", 1, hi)


def _str_tuple(value: Any, name: str) -> None:
    if not isinstance(value, tuple) or not all(isinstance(x, str) for x in value):
        raise SpecError("expected a list of strings", field=name, found=_short(value))


def _build(cls: Callable[..., Any], path: str, **kw: Any) -> Any:
    """``cls(**kw)`` with the field path of any SpecError prefixed by ``path``."""
    try:
        return cls(**kw)
    except SpecError as e:
        raise e.within(path) from None




def _wrap_file(fn: Callable[[], Any], file: str) -> Any:
    """``fn()`` with any SpecError naming ``file`` (unless it names a file already)."""
    try:
        return fn()
    except SpecError as e:
        raise e.with_file(file) from None
