"""Typed, frozen specifications that cross the borders of the system.

Every spec checks itself when it is built (``__post_init__``): values outside their
physical range, path-like names and unknown choices raise
:class:`~memx_hpc.errors.SpecError` naming the field, what was found and what is
allowed. So a YAML or JSON file, ``dataclasses.replace()`` and a profile store all
get the same checks. The loaders below only map documents to keyword arguments;
they prefix the field path (``partitions[1].gpus_per_node``) and the file name.

Site and job files are YAML read by a bounded safe loader: size, nesting depth and
the expanded size of aliases are limited, and a key given twice is refused (PyYAML
would keep the last one silently). Unknown keys are rejected with the nearest valid
name suggested.
"""

from __future__ import annotations

import difflib
import errno
import json
import math
import numbers
import os
import warnings
import re
import stat
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import yaml

from .errors import SpecError
from .shellsafe import check_entry, check_path, check_setup_line

VENDORS = ("nvidia", "amd", "intel", "cpu")
PRECISIONS = ("bf16", "fp16", "fp32")
#: FP8 matmuls through Transformer Engine (Megatron-LM's ``--fp8-format``): ``hybrid`` (e4m3
#: forward, e5m2 gradients) or ``e4m3`` throughout; the job's ``precision`` stays the master
#: and parameter dtype. "" (``fp8: none`` in a job file): no FP8.
FP8_FORMATS = ("hybrid", "e4m3")
#: Megatron-LM's ``--fp8-recipe`` (core_v0.16): scaling of the FP8 tensors. ``mxfp8`` runs on
#: Blackwell only (Transformer Engine refuses it elsewhere at start-up).
FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise")
ACTIVATIONS = ("gelu", "swiglu")
RECOMPUTE_MODES = ("none", "selective", "full")
ATTENTIONS = ("sdpa", "core")
SCHEDULERS = ("auto", "slurm", "local")
COMM_BACKENDS = ("nccl", "ucc")
#: How a partition's ``container`` image is started: pyxis (``srun --container-image``) or
#: apptainer (``apptainer exec IMAGE python``); one per site (memx_hpc/slurm/request.py).
CONTAINER_RUNTIMES = ("pyxis", "apptainer")
# sbatch --signal=[{R|B}:]SIG[@seconds]: a signal number or name, Slurm's lead time <= 65535 s
_SLURM_SIGNAL = re.compile(r"(?:[RB]:)?(?:[0-9]{1,2}|(?:SIG)?[A-Z][A-Z0-9]{0,15})(?:@[0-9]{1,5})?")
TRANSFORMER_IMPLS = ("local", "transformer_engine")
STAND_IN_VENDORS = ("nvidia", "amd", "intel")
#: Clusters whose published network curves the package can import (:mod:`memx_hpc.profile.comm`):
#: a partition naming one in ``link_curves_from`` says its nodes are that cluster's, so the
#: curves measured there stand for its links. Another cluster's fabric is not this site's:
#: without the field imported curves are never used.
LINK_CURVE_CLUSTERS = ("sailor",)
#: Between nodes, the figure a partition gets when the site file states none (GB/s per
#: direction, labelled ``generic`` wherever it is used): one HDR InfiniBand adapter,
#: 200 Gb/s = 25 GB/s per port (NVIDIA ConnectX-6 VPI adapter product brief: "up to 200Gb/s
#: InfiniBand HDR"), the rate HPE Slingshot-11's Cassini NIC also states (200 Gb/s, HPE
#: Slingshot interconnect datasheet). Only a stand-in: a site states its own figure.
GENERIC_INTER_NODE_GBPS = 25.0
#: Fabrics a partition may name (``fabric:``) when the site file states no inter-node figure:
#: the adapter's line rate in Gb/s (gigabits) per direction and where it is stated. The
#: generic figure is that rate / 8 per adapter, shared by the GPUs of a node when it has
#: fewer adapters than GPUs (``nics_per_node``; default one per GPU, as DGX/HGX nodes are
#: built), labelled ``generic`` wherever it is used.
FABRICS = {
    "ib-edr": (100.0, "InfiniBand EDR, 100 Gb/s per port (NVIDIA ConnectX-5 adapter product brief)"),
    "ib-hdr": (200.0, "InfiniBand HDR, 200 Gb/s per port (NVIDIA ConnectX-6 VPI adapter product brief)"),
    "ib-ndr": (400.0, "InfiniBand NDR, 400 Gb/s per port (NVIDIA ConnectX-7 adapter product brief)"),
    "ib-xdr": (800.0, "InfiniBand XDR, 800 Gb/s per port (NVIDIA ConnectX-8 SuperNIC product brief)"),
    "slingshot-11": (200.0, "HPE Slingshot-11, 200 Gb/s per Cassini NIC (HPE Slingshot interconnect datasheet)"),
    "roce-100": (100.0, "RoCE over 100 Gb/s Ethernet (the port's line rate)"),
    "roce-200": (200.0, "RoCE over 200 Gb/s Ethernet (the port's line rate)"),
    "roce-400": (400.0, "RoCE over 400 Gb/s Ethernet (the port's line rate)"),
    "opa-100": (100.0, "Intel Omni-Path 100 Series, 100 Gb/s per port (Intel OPA host fabric adapter brief)"),
    "ethernet-25": (25.0, "TCP over 25 Gb/s Ethernet (the port's line rate; NCCL's socket transport)"),
}
BYTES_PER_ELEMENT = {"bf16": 2, "fp16": 2, "fp32": 4}
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

#: File names of the bandwidth fields (GB/s) -> the names they had before. ``*_gbps`` reads
#: as gigabits per second to anyone used to network figures ("200 Gb/s per node" is 25 GB/s),
#: so files say ``gbytes_per_s``; the old names are still read, with a DeprecatedField warning.
RENAMED_RATE_FIELDS = {
    "hbm_gbytes_per_s": "hbm_gbps",
    "link_gbytes_per_s": "link_gbps",
    "intra_node_gbytes_per_s": "intra_node_gbps",
    "inter_node_gbytes_per_s": "inter_node_gbps",
    "inter_partition_gbytes_per_s": "inter_partition_gbps",
    "gbytes_per_s": "gbps",
}


class DeprecatedField(UserWarning):
    """A spec file uses a field name that is still read but no longer written."""
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


# --------------------------------------------------------------------------- reading documents

MAX_DOCUMENT_BYTES = 8 * 2**20
MAX_DEPTH = 32
MAX_EXPANDED_NODES = 100_000   # YAML nodes after expanding aliases (a "billion laughs" is refused)
MAX_NUMBER_DIGITS = 400  # parsing is cheap below this; the specs' ranges refuse far less


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys, deep nesting and huge numbers."""

    _memx_depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._memx_depth += 1
        try:
            if self._memx_depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise SpecError(f"nested deeper than {MAX_DEPTH} levels at line {mark.line + 1}")
            return super().compose_node(parent, index)
        finally:
            self._memx_depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, value in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = key_node.value
                if isinstance(value, yaml.ScalarNode) and value.tag == "tag:yaml.org,2002:int":
                    digits = sum(c.isalnum() for c in str(value.value))
                    if digits > MAX_NUMBER_DIGITS:
                        raise SpecError(f"a number of {digits:,} digits at line {value.start_mark.line + 1}",
                                        field=str(key)[:80], allowed=f"at most {MAX_NUMBER_DIGITS} digits")
                if key in seen:
                    raise SpecError(f"key given twice (lines {seen[key]} and {key_node.start_mark.line + 1}); "
                                    "one would silently replace the other", field=str(key)[:80])
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> Any:
        digits = sum(c.isalnum() for c in str(node.value))
        if digits > MAX_NUMBER_DIGITS:
            raise SpecError(f"a number of {digits:,} digits at line {node.start_mark.line + 1}",
                            allowed=f"at most {MAX_NUMBER_DIGITS} digits")
        return super().construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def _check_expansion(root: Any) -> None:
    """Refuse a node graph whose aliases expand beyond MAX_EXPANDED_NODES or MAX_DEPTH."""
    sizes: dict[int, tuple[int, int]] = {}
    active: set[int] = set()

    def walk(node: Any) -> tuple[int, int]:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise SpecError(f"a recursive alias at line {node.start_mark.line + 1}")
        active.add(key)
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        count, depth = 1, 1
        for child in children:
            c, d = walk(child)
            count += c
            depth = max(depth, d + 1)
            if count > MAX_EXPANDED_NODES or depth > MAX_DEPTH:
                raise SpecError(f"aliases expand to more than {MAX_EXPANDED_NODES:,} values or "
                                f"{MAX_DEPTH} levels (from line {node.start_mark.line + 1})")
        active.discard(key)
        sizes[key] = (count, depth)
        return count, depth

    walk(root)


class NotARegularFile(OSError):
    """A path that names a FIFO, a device, a socket or a folder where a file was expected."""


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a link")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular_file(path: str | os.PathLike, *, follow_links: bool = True) -> int:
    """A descriptor open for reading on the regular file ``path``.

    The size a stat reports is 0 for FIFOs and character devices, so a bound on it lets
    ``/dev/zero`` grow a read without end, and a FIFO blocks the reader forever. The file is
    opened without blocking and checked to be a regular file on the open descriptor (no swap
    between check and read). Raises :class:`NotARegularFile` (an OSError) for anything else;
    ``follow_links=False`` refuses a symbolic link too.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if not follow_links and e.errno == errno.ELOOP:
            raise NotARegularFile(errno.ELOOP, "is a symbolic link, not a regular file", str(path)) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = _kind_of(mode)
        raise NotARegularFile(errno.EISDIR if kind == "a folder" else errno.EINVAL,
                              f"is {kind}, not a regular file", str(path))
    return fd


def read_regular_file(path: str | os.PathLike, limit_bytes: int, *, follow_links: bool = True) -> bytes:
    """At most ``limit_bytes + 1`` bytes of the regular file ``path`` (see
    :func:`open_regular_file`); more than ``limit_bytes`` means too large: the caller says so."""
    fd = open_regular_file(path, follow_links=follow_links)
    try:
        chunks, left = [], limit_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_text(path: str | os.PathLike) -> str:
    try:
        data = read_regular_file(path, MAX_DOCUMENT_BYTES)
        if len(data) > MAX_DOCUMENT_BYTES:
            raise SpecError("file is too large", file=str(path), allowed=f"at most {MAX_DOCUMENT_BYTES:,} bytes")
        return data.decode("utf-8")
    except FileNotFoundError:
        raise SpecError("file not found", file=str(path)) from None
    except IsADirectoryError:
        raise SpecError("is a folder, not a file", file=str(path)) from None
    except NotARegularFile as e:
        if e.errno == errno.EISDIR:
            raise SpecError("is a folder, not a file", file=str(path)) from None
        raise SpecError(f"{e.strerror}: this tool reads only regular files", file=str(path)) from None
    except UnicodeDecodeError as e:
        raise SpecError(f"not UTF-8 text ({e.reason} at byte {e.start})", file=str(path)) from None
    except OSError as e:
        raise SpecError(f"cannot read file: {e.strerror or e}", file=str(path)) from None


def _check_size(text: str) -> None:
    if len(text) > MAX_DOCUMENT_BYTES:
        raise SpecError("document too large", allowed=f"at most {MAX_DOCUMENT_BYTES:,} bytes")


def parse_yaml(text: str) -> Any:
    """Parse YAML text with the bounded safe loader (SpecError on anything refused)."""
    _check_size(text)
    loader = None
    try:
        loader = _BoundedLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
    except (RecursionError, ValueError, OverflowError) as e:
        raise SpecError(f"not a YAML document this tool reads: {type(e).__name__}") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml(path: str | os.PathLike) -> Any:
    """Read a YAML file with the bounded safe loader, turning every failure into a SpecError."""
    return _wrap_file(lambda: parse_yaml(_read_text(path)), str(path))


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise SpecError("key given twice; one would silently replace the other", field=k[:80])
        out[k] = v
    return out


def _json_int(text: str) -> int:
    if len(text) > MAX_NUMBER_DIGITS:
        raise SpecError(f"a number of {len(text):,} digits", allowed=f"at most {MAX_NUMBER_DIGITS} digits")
    return int(text)


def _json_constant(text: str) -> Any:
    raise SpecError(f"{text} is not a number this tool reads")


def _json_depth(data: Any) -> int:
    depth, stack = 0, [(data, 1)]
    while stack:
        v, d = stack.pop()
        depth = max(depth, d)
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return depth


def parse_json(text: str) -> Any:
    """Parse JSON text: duplicate keys, NaN/Infinity, huge integers and deep nesting are refused."""
    _check_size(text)
    try:
        data = json.loads(text, object_pairs_hook=_json_pairs, parse_int=_json_int, parse_constant=_json_constant)
    except json.JSONDecodeError as e:
        raise SpecError(f"not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise SpecError(f"nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, OverflowError) as e:
        raise SpecError(f"not a JSON document this tool reads: {e}") from None
    if _json_depth(data) > MAX_DEPTH:
        raise SpecError(f"nested deeper than {MAX_DEPTH} levels")
    return data


def load_json(path: str | os.PathLike) -> Any:
    """Read a JSON file (bounded as :func:`parse_json`), naming the file in every error."""
    return _wrap_file(lambda: parse_json(_read_text(path)), str(path))


class _Reader:
    """Reads one mapping of a document into Python values, tracking the field path for errors.

    It converts types only (a whole number, a string, a list of strings); ranges and
    choices are the specs' own checks.
    """

    def __init__(self, data: Any, path: str, *, kind: str = "a mapping") -> None:
        if not isinstance(data, Mapping):
            raise SpecError(f"expected {kind}", field=path or None, found=_short(data))
        self.data = data
        self.path = path
        self.used: set[str] = set()

    def _p(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def has(self, name: str) -> bool:
        return name in self.data and self.data[name] is not None

    def raw(self, name: str, default: Any = ...) -> Any:
        self.used.add(name)
        if name not in self.data or self.data[name] is None:
            if default is ...:
                raise SpecError("required field is missing", field=self._p(name))
            return default
        return self.data[name]

    def int(self, name: str, default: Any = ..., *, min: int | None = None) -> int:
        v = self.raw(name, default)
        if v is default and default is not ...:
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and math.isfinite(v) and v.is_integer():
                v = int(v)
            else:
                raise SpecError("expected a whole number", field=self._p(name), found=_short(v),
                                allowed=f"integers >= {min}" if min is not None else "integers")
        if min is not None and v < min:
            raise SpecError(f"must be >= {min}", field=self._p(name), found=_short(v))
        return v

    def float(self, name: str, default: Any = ..., *, min: float | None = None,
              max: float | None = None, strict_min: bool = False) -> float:
        v = self.raw(name, default)
        if v is default and default is not ...:
            return v
        try:
            ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(float(v))
        except OverflowError:
            ok = False
        if not ok:
            raise SpecError("expected a finite number", field=self._p(name), found=_short(v))
        v = float(v)
        if min is not None and (v <= min if strict_min else v < min):
            raise SpecError(f"must be {'>' if strict_min else '>='} {min:g}", field=self._p(name), found=v)
        if max is not None and v > max:
            raise SpecError(f"must be <= {max:g}", field=self._p(name), found=v)
        return v

    def str(self, name: str, default: Any = ..., *, choices: Iterable[str] | None = None) -> str:
        v = self.raw(name, default)
        if v is default and default is not ...:
            return v
        if not isinstance(v, str) or not v.strip():
            raise SpecError("expected a non-empty string", field=self._p(name), found=_short(v))
        if choices is not None:
            _choice(v, self._p(name), choices)
        return v

    def bool(self, name: str, default: Any = ...) -> bool:
        v = self.raw(name, default)
        if v is None and default is None:  # optional: absent means "not said"
            return v
        if not isinstance(v, bool):
            raise SpecError("expected true or false", field=self._p(name), found=_short(v))
        return v

    def str_list(self, name: str, default: Any = ()) -> tuple[str, ...]:
        v = self.raw(name, default)
        if isinstance(v, tuple):
            return v
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise SpecError("expected a list of strings", field=self._p(name), found=_short(v))
        return tuple(v)

    def str_map(self, name: str) -> tuple[tuple[str, str], ...]:
        v = self.raw(name, {})
        if not isinstance(v, Mapping):
            raise SpecError("expected a mapping of NAME: value", field=self._p(name), found=_short(v))
        out = []
        for k, val in v.items():
            if not isinstance(k, str) or not _ENV_NAME.fullmatch(k):
                raise SpecError("environment variable names are letters, digits and _",
                                field=f"{self._p(name)}.{k}", found=_short(k))
            if isinstance(val, bool) or not isinstance(val, (str, int, float)):
                raise SpecError("expected a string or number", field=f"{self._p(name)}.{k}", found=_short(val))
            if isinstance(val, int) and abs(val).bit_length() > 128:
                raise SpecError("number too long", field=f"{self._p(name)}.{k}", found=_short(val))
            out.append((k, str(val)))
        return tuple(out)

    def sub(self, name: str, *, required: bool = False) -> "_Reader | None":
        if not self.has(name):
            if required:
                self.raw(name)
            self.used.add(name)
            return None
        return _Reader(self.raw(name), self._p(name))

    def items(self, name: str, *, required: bool = False) -> list["_Reader"]:
        v = self.raw(name, ... if required else [])
        if not isinstance(v, list):
            raise SpecError("expected a list", field=self._p(name), found=_short(v))
        return [_Reader(x, f"{self._p(name)}[{i}]") for i, x in enumerate(v)]

    def rate(self, name: str, default: Any = ...) -> Any:
        """A bandwidth in GB/s under its file name ``name`` (``*_gbytes_per_s``), or under the
        name it had before (:data:`RENAMED_RATE_FIELDS`, ``*_gbps``, which reads as gigabits
        to many): the old name is still read, with a :class:`DeprecatedField` warning."""
        old = RENAMED_RATE_FIELDS[name]
        if old in self.data and name in self.data:
            raise SpecError(f"given twice, as {name!r} and under its old name {old!r}", field=self._p(name),
                            allowed=f"{name} only")
        key = old if (old in self.data and name not in self.data) else name
        if key == old:
            warnings.warn(f"{self._p(old)}: read as {name} (GB/s, gigabytes per second); the name {old!r} is "
                          f"deprecated, write {name!r}", DeprecatedField, stacklevel=3)
        v = self.float(key, default)
        if v is not None:  # checked here, so that an error names the field as the file spells it
            try:
                _real(v, key, MIN_RATE, MAX_GBPS)
            except SpecError as e:
                raise e.within(self.path) from None
        return v

    def finish(self, allowed: Iterable[str] | None = None) -> None:
        allowed = set(allowed) if allowed is not None else self.used
        for key in self.data:
            if key not in allowed:
                raise SpecError("unknown field" + _suggest(str(key), sorted(allowed)),
                                field=self._p(str(key)[:80]), allowed=", ".join(sorted(allowed)))


# --------------------------------------------------------------------------- hardware


#: How a part is built into a node (:attr:`GpuType.form_factor`).
FORM_FACTORS = ("module", "card")


@dataclass(frozen=True, kw_only=True)
class GpuType:
    """One accelerator model. Rates are vendor datasheet numbers (``source`` says which).

    ``memory_gib`` is the device memory as the device reports it (``nvidia-smi``
    memory.total, ``amd-smi``/``rocm-smi`` VRAM total), not the datasheet's decimal GB:
    HBM and GDDR come in binary sizes (an A100-80GB reports 81,920 MiB). ``usable_fraction``
    is the share of it one process can allocate at all (``torch.cuda.mem_get_info``'s total
    over memory.total: the driver keeps the rest); the runtime's own context and
    communicator buffers are not in it but in the footprint model's fixed term
    (:mod:`memx_hpc.model.memory`). ``capacity_bytes`` is their product, what plans are
    checked against. ``peak_tflops_fp8``: dense fp8 matrix rate, 0 where the part has none.

    ``link_gbps`` is the typical per-direction intra-node bandwidth of one device
    (NVLink / Infinity Fabric / PCIe) in GB/s; partitions may override it.
    ``precisions``: the precisions its matrix units run natively (Volta and Turing have
    fp16 tensor cores but no bf16; ``peak_tflops_bf16`` is then the fp16 figure).
    """

    name: str
    vendor: str
    memory_gib: float
    peak_tflops_bf16: float
    peak_tflops_fp32: float
    hbm_gbps: float
    link_gbps: float
    source: str = ""
    aliases: tuple[str, ...] = ()
    measured_at_profile_time: bool = False
    precisions: tuple[str, ...] = PRECISIONS
    #: the silicon this type is a board/memory variant of (V100-16 and V100-32 are one
    #: chip): variants share layer times and differ only in memory. Empty: its own chip.
    chip: str = ""
    #: board (module) power limit in W as the datasheet states it; 0: not known. Peak
    #: FLOP/s per W says how far the datasheet peak is beyond what the power cap sustains.
    tdp_w: float = 0.0
    #: share of ``memory_gib`` a process can allocate (what the driver does not keep back)
    usable_fraction: float = 1.0
    #: dense fp8 matrix throughput in TFLOP/s; 0: no fp8 units (or not rated)
    peak_tflops_fp8: float = 0.0
    #: ``module`` (SXM / OAM mezzanine or superchip: a power and cooling budget sized for
    #: sustained matrix load) or ``card`` (PCIe add-in board, its power set by the slot and
    #: the card's cooler: the rated peak assumes boost clocks the cap does not sustain);
    #: "" not stated (read as a card). A module's peak per W counts at most as the smallest
    #: of a measured module's (:meth:`memx_hpc.model.anchors.Anchors.datasheet`).
    form_factor: str = ""

    def __post_init__(self) -> None:
        _safe_name(self.name, "name")
        _choice(self.vendor, "vendor", VENDORS)
        _real(self.memory_gib, "memory_gib", MIN_DEVICE_MEMORY_GIB, MAX_DEVICE_MEMORY_GIB)
        for name in ("peak_tflops_bf16", "peak_tflops_fp32"):
            _real(getattr(self, name), name, MIN_RATE, MAX_TFLOPS)
        for name in ("hbm_gbps", "link_gbps"):
            _real(getattr(self, name), name, MIN_RATE, MAX_GBPS)
        if not isinstance(self.source, str):
            raise SpecError("expected a string", field="source", found=_short(self.source))
        _str_tuple(self.aliases, "aliases")
        for i, a in enumerate(self.aliases):
            _safe_name(a, f"aliases[{i}]")
        if not isinstance(self.measured_at_profile_time, bool):
            raise SpecError("expected true or false", field="measured_at_profile_time",
                            found=_short(self.measured_at_profile_time))
        _str_tuple(self.precisions, "precisions")
        if not self.precisions:
            raise SpecError("expected at least one precision", field="precisions", allowed=", ".join(PRECISIONS))
        for i, v in enumerate(self.precisions):
            _choice(v, f"precisions[{i}]", PRECISIONS)
        if self.chip != "":
            _safe_name(self.chip, "chip")
        if self.tdp_w != 0.0:
            _real(self.tdp_w, "tdp_w", 1.0, 100_000.0)
        _real(self.usable_fraction, "usable_fraction", MIN_USABLE_FRACTION, 1.0)
        if self.peak_tflops_fp8 != 0.0:
            _real(self.peak_tflops_fp8, "peak_tflops_fp8", MIN_RATE, MAX_TFLOPS)
        if self.form_factor != "":
            _choice(self.form_factor, "form_factor", FORM_FACTORS)

    def native(self, precision: str) -> bool:
        """Whether the part's matrix units run ``precision`` (bf16 on a V100 does not)."""
        return precision in self.precisions

    @property
    def chip_id(self) -> str:
        """The chip identity: ``chip`` when given, else the type's own name."""
        return self.chip or self.name

    def peak_tflops(self, precision: str) -> float:
        """Dense matrix throughput for ``precision`` (fp16 and bf16 share a figure). A 16-bit
        precision the part has no units for runs at best at its fp32 rate."""
        if precision == "fp32" or not self.native(precision):
            return self.peak_tflops_fp32
        return self.peak_tflops_bf16

    @property
    def memory_bytes(self) -> int:
        """The device memory as the device reports it, in bytes."""
        return int(self.memory_gib * 2**30)

    @property
    def capacity_bytes(self) -> int:
        """What one process can allocate: the reported memory times ``usable_fraction``."""
        return int(self.memory_gib * self.usable_fraction * 2**30)

    @staticmethod
    def from_mapping(data: Any, path: str, *, name: str | None = None) -> "GpuType":
        r = _Reader(data, path)
        g = _build(
            GpuType, path,
            name=name if name is not None else r.str("name"),
            vendor=r.str("vendor"),
            memory_gib=r.float("memory_gib"),
            peak_tflops_bf16=r.float("peak_tflops_bf16"),
            peak_tflops_fp32=r.float("peak_tflops_fp32"),
            hbm_gbps=r.rate("hbm_gbytes_per_s"),
            link_gbps=r.rate("link_gbytes_per_s"),
            source=r.str("source", ""),
            aliases=r.str_list("aliases"),
            measured_at_profile_time=r.bool("measured_at_profile_time", False),
            precisions=r.str_list("precisions") or PRECISIONS,
            chip=r.str("chip", ""),
            tdp_w=r.float("tdp_w", 0.0, min=0.0),
            usable_fraction=r.float("usable_fraction", 1.0),
            peak_tflops_fp8=r.float("peak_tflops_fp8", 0.0, min=0.0),
            form_factor=r.str("form_factor", ""),
        )
        r.finish()
        return g


def check_gpu_names(types: Iterable[GpuType], path: str = "gpu_types",
                    outer: Callable[[str], str | None] | None = None) -> None:
    """Refuse a GPU name or alias that also names another type (case-insensitively).

    An alias that names another type would silently swap figures (memory sizes) for
    every partition and sample that uses that name. ``outer(name)`` is the type a name
    resolves to outside ``types`` (the catalog, for site-defined types); a site type may
    reuse its own catalog namesake's aliases, since it replaces that entry.
    """
    owner: dict[str, str] = {}
    for g in types:
        for i, n in enumerate((g.name,) + tuple(g.aliases)):
            where = f"{path}.{g.name}" + (f".aliases[{i - 1}]" if i else "")
            prev = owner.get(n.lower())
            if prev is not None and prev != g.name:
                raise SpecError(f"names GPU type {prev!r} too; one would silently replace the other's figures",
                                field=where, found=n)
            owner[n.lower()] = g.name
            if i and outer is not None:
                other = outer(n)
                if other is not None and other.lower() != g.name.lower():
                    raise SpecError(f"names the built-in GPU type {other!r}; it would silently replace its "
                                    "figures (memory, throughput) wherever that name is used", field=where, found=n)


@dataclass(frozen=True, kw_only=True)
class Partition:
    """A Slurm partition whose nodes all carry one GPU type."""

    name: str
    gpu_type: str
    nodes: int
    gpus_per_node: int
    intra_node_gbps: float | None = None  # None: the GPU type's link_gbps (catalog, labelled generic)
    inter_node_gbps: float | None = None  # None: the fabric's figure, else GENERIC_INTER_NODE_GBPS (generic)
    #: the cluster (one of LINK_CURVE_CLUSTERS) whose imported network curves are this
    #: partition's own: its nodes are that cluster's. None: imported curves are not used.
    link_curves_from: str | None = None
    #: the fabric between its nodes (one of FABRICS; "" not stated) and the adapters a node has
    #: for it (None: one per GPU): the generic inter-node figure where the site file states none
    fabric: str = ""
    nics_per_node: int | None = None
    gres_type: str | None = None  # Slurm GRES type name (gpu:<type>:N); None: untyped
    account: str | None = None
    qos: str | None = None
    time_limit_min: int | None = None
    exclusive: bool | None = None  # None: the site's slurm.exclusive
    cpus_per_task: int | None = None
    mem_per_node_gib: float | None = None  # --mem in MiB, rounded up (memx_hpc/slurm/request.py)
    setup: tuple[str, ...] = ()  # shell lines run before launching (module load ...)
    env: tuple[tuple[str, str], ...] = ()
    python: str = "python3"
    container: str | None = None
    megatron_entry: str = "pretrain_gpt.py"
    # launch details (memx_hpc.slurm.render): start each component from a clean module
    # environment; the Transformer Engine layer or megatron-core's local one (None: TE on
    # NVIDIA, local elsewhere); on CPU partitions, the vendor whose place they take in
    # a cross-vendor rehearsal (process groups are planned as for that vendor, run on gloo)
    module_purge: bool = False
    transformer_impl: str | None = None
    stand_in_for: str | None = None

    def __post_init__(self) -> None:
        _safe_name(self.name, "name")
        _safe_name(self.gpu_type, "gpu_type")
        _whole(self.nodes, "nodes", 1, MAX_NODES)
        _whole(self.gpus_per_node, "gpus_per_node", 1, MAX_GPUS_PER_NODE)
        _real(self.intra_node_gbps, "intra_node_gbps", MIN_RATE, MAX_GBPS, optional=True)
        _real(self.inter_node_gbps, "inter_node_gbps", MIN_RATE, MAX_GBPS, optional=True)
        if self.fabric != "":
            _choice(self.fabric, "fabric", tuple(FABRICS))
        if self.nics_per_node is not None:
            _whole(self.nics_per_node, "nics_per_node", 1, 64)
            if not self.fabric:
                raise SpecError("nics_per_node says how a fabric's adapters are shared: name the fabric too",
                                field="nics_per_node", found=self.nics_per_node, allowed=", ".join(FABRICS))
        if self.link_curves_from is not None and self.link_curves_from not in LINK_CURVE_CLUSTERS:
            raise SpecError("names no cluster whose network curves can be imported", field="link_curves_from",
                            found=_short(self.link_curves_from), allowed=", ".join(LINK_CURVE_CLUSTERS))
        for name in ("gres_type", "account", "qos"):
            _safe_name(getattr(self, name), name, optional=True)
        _whole(self.time_limit_min, "time_limit_min", 1, MAX_TIME_LIMIT_MIN, optional=True)
        _optional_bool(self.exclusive, "exclusive")
        _whole(self.cpus_per_task, "cpus_per_task", 1, 1 << 16, optional=True)
        _real(self.mem_per_node_gib, "mem_per_node_gib", MIN_DEVICE_MEMORY_GIB, MAX_DEVICE_MEMORY_GIB,
              lo_open=True, optional=True)
        _str_tuple(self.setup, "setup")
        _str_pairs(self.env, "env")
        _text(self.python, "python")
        _text(self.container, "container", optional=True)
        _text(self.megatron_entry, "megatron_entry")
        # what reaches a shell on the nodes: the rules render and profiling apply
        check_path(self.python, "python")
        if self.container is not None:
            check_path(self.container, "container")
        check_entry(self.megatron_entry, "megatron_entry")
        for k, line in enumerate(self.setup):
            check_setup_line(line, f"setup[{k}]")
        if not isinstance(self.module_purge, bool):
            raise SpecError("expected true or false", field="module_purge", found=_short(self.module_purge))
        for name, allowed in (("transformer_impl", TRANSFORMER_IMPLS), ("stand_in_for", STAND_IN_VENDORS)):
            if getattr(self, name) is not None and getattr(self, name) not in allowed:
                raise SpecError("not an allowed value", field=name, found=_short(getattr(self, name)),
                                allowed=", ".join(allowed))

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def transformer_impl_for(self, vendor: str) -> str:
        """The transformer layer this partition trains with (``--transformer-impl``) when its
        ranks are ``vendor``'s: its own setting, else Transformer Engine on NVIDIA (Megatron-LM's
        default there) and the local spec elsewhere."""
        if self.transformer_impl is not None:
            return self.transformer_impl
        return "transformer_engine" if vendor == "nvidia" else "local"


@dataclass(frozen=True, kw_only=True)
class Link:
    """Bandwidth between two partitions (per direction, GB/s)."""

    a: str
    b: str
    gbps: float

    def __post_init__(self) -> None:
        _safe_name(self.a, "between[0]")
        _safe_name(self.b, "between[1]")
        _real(self.gbps, "gbps", MIN_RATE, MAX_GBPS)


@dataclass(frozen=True, kw_only=True)
class Site:
    """A cluster: its partitions, GPU types, links, and where state lives."""

    name: str
    partitions: tuple[Partition, ...]
    gpu_types: tuple[GpuType, ...] = ()  # site-defined types; the catalog supplies the rest
    links: tuple[Link, ...] = ()
    inter_partition_gbps: float = 12.5
    scheduler: str = "auto"
    account: str | None = None
    qos: str | None = None
    time_limit_min: int = 60
    # what every job asks of Slurm (memx_hpc/slurm/request.py): whole nodes, a signal before
    # the time limit, requeue after preemption or node failure (None: Slurm's default)
    exclusive: bool = False
    signal: str | None = None
    requeue: bool | None = None
    container_runtime: str | None = None  # pyxis | apptainer; needed once a partition names a container
    store_path: str = "memx-store.h5"
    cache_path: str | None = None
    work_dir: str = "memx-runs"
    pipeline_comm_backend: str = "nccl"
    pipeline_comm_env: tuple[tuple[str, str], ...] = ()
    memory_safety_margin: float = 0.05
    megatron_version: str = "core_r0.16.0"
    # (time, memory, balance) exponents of the weighted-product objective; None: the
    # planner's default. ``--weights`` on the command line overrides them.
    objective_weights: tuple[float, float, float] | None = None
    #: whether a new profile store starts from the shipped reference profiles (Sailor,
    #: Cephalo); None: yes unless every partition is a CPU (memx_hpc.profile.reference)
    reference_data: bool | None = None
    #: which source of layer times to follow where two disagree for a GPU type
    #: (memx_hpc.model.sources): (GPU type or "*", source) pairs; () decides by end-to-end runs
    prefer_source: tuple[tuple[str, str], ...] = ()
    #: the parallel degrees the search may choose among on this site (empty: any; a job's own
    #: lists narrow them further): see :class:`TrainJob`
    virtual_stages: tuple[int, ...] = ()
    context_parallel_sizes: tuple[int, ...] = ()
    expert_parallel_sizes: tuple[int, ...] = ()
    expert_tensor_parallel_sizes: tuple[int, ...] = ()
    source_file: str | None = None

    def __post_init__(self) -> None:
        _text(self.name, "name")
        _degrees(self.virtual_stages, "virtual_stages", MAX_LAYERS)
        for name in ("context_parallel_sizes", "expert_parallel_sizes", "expert_tensor_parallel_sizes"):
            _degrees(getattr(self, name), name, 1 << 16)
        if not isinstance(self.gpu_types, tuple) or not all(isinstance(g, GpuType) for g in self.gpu_types):
            raise SpecError("expected GPU types", field="gpu_types", found=_short(self.gpu_types))
        from .catalog import catalog
        cat = catalog()

        def builtin(n: str) -> str | None:
            g = cat.find(n)
            return g.name if g is not None else None
        check_gpu_names(self.gpu_types, "gpu_types", builtin)

        if not isinstance(self.partitions, tuple) or not all(isinstance(p, Partition) for p in self.partitions):
            raise SpecError("expected a list of partitions", field="partitions", found=_short(self.partitions))
        if not self.partitions:
            raise SpecError("a site needs at least one partition", field="partitions", found=[])
        if len(self.partitions) > MAX_PARTITIONS:
            raise SpecError(f"{len(self.partitions)} partitions", field="partitions",
                            allowed=f"at most {MAX_PARTITIONS}")
        names: set[str] = set()
        for i, p in enumerate(self.partitions):
            if p.name in names:
                raise SpecError("duplicate partition name", field=f"partitions[{i}].name", found=p.name)
            names.add(p.name)
            try:
                vendor = self.gpu(p.gpu_type).vendor
            except SpecError as e:
                raise SpecError(e.detail, field=f"partitions[{i}].gpu_type", found=e.found,
                                allowed="a catalog name (memx-hpc validate --list-gpus) or one defined "
                                        "under gpu_types") from None
            if p.stand_in_for is not None and vendor != "cpu":
                raise SpecError("only CPU partitions stand in for another vendor", field=f"partitions[{i}].stand_in_for",
                                found=p.stand_in_for)
            if p.transformer_impl == "transformer_engine" and vendor == "cpu":
                raise SpecError("Transformer Engine needs a GPU; CPU partitions train megatron-core's local layer",
                                field=f"partitions[{i}].transformer_impl", found=p.transformer_impl, allowed="local")
        for i, link in enumerate(self.links):
            if not isinstance(link, Link):
                raise SpecError("expected a link", field=f"links[{i}]", found=_short(link))
            for j, pn in enumerate((link.a, link.b)):
                if pn not in names:
                    raise SpecError("unknown partition" + _suggest(pn, sorted(names)),
                                    field=f"links[{i}].between[{j}]", found=pn, allowed=", ".join(sorted(names)))
        _real(self.inter_partition_gbps, "inter_partition_gbps", MIN_RATE, MAX_GBPS)
        if not isinstance(self.prefer_source, tuple):
            raise SpecError("expected (GPU type, source) pairs", field="prefer_source", found=_short(self.prefer_source))
        for pair in self.prefer_source:
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise SpecError("expected (GPU type, source) pairs", field="prefer_source", found=_short(pair))
            where = "prefer_source" if pair[0] == "*" else f"prefer_source.{pair[0]}"
            if pair[0] != "*":
                _safe_name(pair[0], "prefer_source")
            _safe_name(pair[1], where)
        _choice(self.scheduler, "slurm.scheduler", SCHEDULERS)
        _safe_name(self.account, "slurm.account", optional=True)
        _safe_name(self.qos, "slurm.qos", optional=True)
        _whole(self.time_limit_min, "slurm.time_limit_min", 1, MAX_TIME_LIMIT_MIN)
        if not isinstance(self.exclusive, bool):
            raise SpecError("expected true or false", field="slurm.exclusive", found=_short(self.exclusive))
        _slurm_signal(self.signal, "slurm.signal")
        _optional_bool(self.requeue, "slurm.requeue")
        if self.container_runtime is not None:
            _choice(self.container_runtime, "slurm.container_runtime", CONTAINER_RUNTIMES)
        with_image = [i for i, p in enumerate(self.partitions) if p.container is not None]
        if with_image and self.container_runtime is None:
            raise SpecError(f"partitions[{with_image[0]}].container names an image: say which runtime starts it",
                            field="slurm.container_runtime", found=None, allowed=", ".join(CONTAINER_RUNTIMES))
        _text(self.store_path, "store")
        _text(self.cache_path, "cache", optional=True)
        _text(self.work_dir, "work_dir")
        _choice(self.pipeline_comm_backend, "pipeline_comm.backend", COMM_BACKENDS)
        _str_pairs(self.pipeline_comm_env, "pipeline_comm.env")
        _real(self.memory_safety_margin, "memory_safety_margin", 0.0, 0.9)
        _text(self.megatron_version, "megatron_version")
        if self.objective_weights is not None:
            w = self.objective_weights
            if not isinstance(w, tuple) or len(w) != 3:
                raise SpecError("expected (time, memory, balance)", field="objective", found=_short(w))
            for name, v in zip(("time", "memory", "balance"), w):
                _real(v, f"objective.{name}", 0.0, MAX_WEIGHT)
            if not any(w):
                raise SpecError("at least one weight must be > 0", field="objective", found=w)

    def partition(self, name: str) -> Partition:
        for p in self.partitions:
            if p.name == name:
                return p
        raise SpecError(f"unknown partition{_suggest(name, [p.name for p in self.partitions])}",
                        found=name, allowed=", ".join(p.name for p in self.partitions))
    def gpu(self, name: str) -> GpuType:
        """The GPU type called ``name``: site-defined first, then the built-in catalog."""
        for g in self.gpu_types:
            if g.name == name or name in g.aliases:
                return g
        from .catalog import catalog
        return catalog().get(name)

    def gpu_of(self, partition: str) -> GpuType:
        return self.gpu(self.partition(partition).gpu_type)

    @property
    def total_gpus(self) -> int:
        return sum(p.total_gpus for p in self.partitions)

    def intra_gbps(self, partition: str) -> float:
        return self.intra_figure(partition)[0]

    def link_gbps(self, a: str, b: str) -> float:
        """Per-direction bandwidth between a GPU in partition ``a`` and one in ``b``."""
        return self.link_figure(a, b)[0]

    def intra_figure(self, partition: str) -> tuple[float, str, str]:
        """Inside a node of ``partition``: ``(GB/s, provenance, what)``; provenance
        ``site-figure`` when the site file states ``intra_node_gbytes_per_s``, else
        ``generic``: the GPU type's catalog link figure (NVLink / Infinity Fabric / PCIe
        from its datasheet, memx_hpc/data/gpus.yaml)."""
        p = self.partition(partition)
        if p.intra_node_gbps is not None:
            return p.intra_node_gbps, "site-figure", f"site partition {p.name} intra_node_gbytes_per_s"
        g = self.gpu(p.gpu_type)
        return g.link_gbps, "generic", f"generic: {g.name} datasheet link (gpu type link_gbytes_per_s)"

    def inter_figure(self, partition: str) -> tuple[float, str, str]:
        """Between nodes of ``partition``: ``(GB/s, provenance, what)`` as :meth:`intra_figure`;
        the generic figure is :data:`GENERIC_INTER_NODE_GBPS`."""
        p = self.partition(partition)
        if p.inter_node_gbps is not None:
            return p.inter_node_gbps, "site-figure", f"site partition {p.name} inter_node_gbytes_per_s"
        if p.fabric:
            gbit, what = FABRICS[p.fabric]
            nics = p.gpus_per_node if p.nics_per_node is None else min(p.nics_per_node, p.gpus_per_node)
            share = nics / p.gpus_per_node
            shared = "" if share == 1 else f", {nics} adapter(s) shared by {p.gpus_per_node} GPUs"
            return (gbit / 8.0 * share, "generic",
                    f"generic: partition {p.name} fabric {p.fabric}, {what}{shared}; no inter_node_gbytes_per_s "
                    f"in the site file")
        return (GENERIC_INTER_NODE_GBPS, "generic",
                "generic: no inter_node_gbytes_per_s in the site file, one HDR InfiniBand adapter (200 Gb/s)")

    def link_figure(self, a: str, b: str) -> tuple[float, str, str]:
        """Between a GPU of ``a`` and one of ``b`` (other nodes): ``(GB/s, provenance, what)``.
        Between partitions: the site's ``links`` entry for the pair, else the slowest of
        ``inter_partition_gbytes_per_s`` and both partitions' inter-node figures (generic
        when the slowest is a figure the site file does not state)."""
        if a == b:
            return self.inter_figure(a)
        for link in self.links:
            if {link.a, link.b} == {a, b}:
                return link.gbps, "site-figure", f"site link {a}-{b}"
        cands = [(self.inter_partition_gbps, "site-figure", "site inter_partition_gbytes_per_s"),
                 self.inter_figure(a), self.inter_figure(b)]
        gbps = min(c[0] for c in cands)
        for c in cands:  # the site's own figure when it ties with a generic one
            if c[0] == gbps and c[1] == "site-figure":
                return gbps, "site-figure", f"link {a}-{b}: {c[2]}"
        return next((gbps, c[1], f"link {a}-{b}: {c[2]}") for c in cands if c[0] == gbps)

    def resolve(self, path: str) -> Path:
        """Resolve a path from the site file relative to the site file's folder."""
        p = Path(os.path.expandvars(os.path.expanduser(path)))
        if p.is_absolute() or not self.source_file:
            return p
        return Path(self.source_file).resolve().parent / p

    @property
    def store(self) -> Path:
        env = os.environ.get("MEMX_STORE")
        if env and self.store_path == "memx-store.h5":
            return Path(env)
        return self.resolve(self.store_path)

    @property
    def cache(self) -> Path:
        if self.cache_path:
            return self.resolve(self.cache_path)
        return self.store.with_suffix(".cache.sqlite")




# --------------------------------------------------------------------------- model and job


def _check_shape(obj: Any) -> None:
    """The ranges of the shape fields a ModelSpec and a LayerShape share."""
    _whole(obj.hidden_size, "hidden_size", 1, MAX_HIDDEN)
    _whole(obj.num_attention_heads, "num_attention_heads", 1, MAX_HEADS)
    _whole(obj.num_query_groups, "num_query_groups", 1, MAX_HEADS)
    _whole(obj.ffn_hidden_size, "ffn_hidden_size", 1, 4 * MAX_HIDDEN)
    _whole(obj.vocab_size, "vocab_size", 1, MAX_VOCAB)
    _whole(obj.seq_length, "seq_length", 1, MAX_SEQ_LENGTH)
    _choice(obj.activation, "activation", ACTIVATIONS)


#: Megatron-LM's ``--moe-router-load-balancing-type`` choices (megatron/training/arguments.py).
MOE_LOAD_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")
#: Megatron-LM's ``--moe-router-score-function`` choices.
MOE_SCORE_FUNCTIONS = ("softmax", "sigmoid")
#: RoPE frequency scalings a Hugging Face config may name and Megatron-LM runs
#: (``--use-rope-scaling`` for Llama 3.1's, YaRN under multi-latent attention).
ROPE_SCALINGS = ("none", "llama3", "yarn")
MAX_EXPERTS = 4096

#: ModelSpec fields beyond the dense GPT shape: a plan's job fingerprint leaves them out
#: while they hold their defaults, so a dense model's fingerprint is what it was before
#: they existed (memx_hpc.planfile.job_fingerprint).
MODEL_EXTENSION_FIELDS = (
    "head_dim", "add_qkv_bias", "qk_layernorm", "rotary_base", "rope_scaling", "rope_scaling_factor",
    "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
    "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
    "moe_layer_freq", "moe_router_load_balancing_type", "moe_router_score_function", "moe_router_num_groups",
    "moe_router_group_topk", "moe_router_enable_expert_bias", "moe_shared_expert_gate", "hidden_dropout")


def moe_pattern(freq: "int | tuple[int, ...]", num_layers: int) -> tuple[bool, ...]:
    """Which layers are MoE, as Megatron-LM reads ``--moe-layer-freq``: an integer N makes
    layer i an expert layer when ``i % N == 0``; a list of 0/1 names every layer
    (megatron/training/arguments.py ``moe_freq_type``; training.py ``num_floating_point_operations``)."""
    if isinstance(freq, tuple):
        return tuple(bool(x) for x in freq)
    return tuple(i % freq == 0 for i in range(num_layers))


def _check_freq(freq: Any, num_layers: Any) -> None:
    if isinstance(freq, tuple):
        if not all(x in (0, 1) and not isinstance(x, bool) for x in freq):
            raise SpecError("a layer pattern holds 1 (MoE layer) and 0 (dense layer)", field="moe_layer_freq",
                            found=_short(freq), allowed="an integer N >= 1 or a list of 0/1, one per layer")
        if len(freq) != num_layers:
            raise SpecError(f"a pattern of {len(freq)} layers for a model of {num_layers}", field="moe_layer_freq",
                            found=_short(freq), allowed=f"{num_layers} entries")
        if not any(freq):
            raise SpecError("no MoE layer in the pattern", field="moe_layer_freq", found=_short(freq))
        return
    _whole(freq, "moe_layer_freq", 1, MAX_LAYERS)


class _HeadsAndExperts:
    """What a model and a layer shape derive alike from their head and expert fields."""

    @property
    def kv_channels(self) -> int:
        """Head size of standard attention (Megatron's ``--kv-channels``: ``head_dim``, else
        ``hidden_size / heads``)."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        """Whether the MLP (of a layer; of some layers of a model) is the mixture of experts."""
        return self.num_experts is not None

    @property
    def expert_ffn_hidden_size(self) -> int:
        """Per-branch width of one routed expert (``ffn_hidden_size`` when not given)."""
        return self.moe_ffn_hidden_size if self.moe_ffn_hidden_size is not None else self.ffn_hidden_size


@dataclass(frozen=True, kw_only=True)
class ModelSpec(_HeadsAndExperts):
    """A GPT-style decoder as megatron-core builds it. ``ffn_hidden_size`` is the per-branch
    width (SwiGLU has two) of the dense MLP.

    Attention: grouped-query (``num_query_groups`` < heads), a head size that is not
    ``hidden_size / heads`` (``head_dim``, Megatron's ``--kv-channels``: Qwen3), biases on
    Q, K and V only (``add_qkv_bias``: Qwen2), per-head Q/K norms (``qk_layernorm``: Qwen3),
    or DeepSeek's multi-latent attention (``multi_latent_attention`` with its ranks and head
    sizes, Megatron's MLA arguments; ``q_lora_rank`` None: Q projected directly).

    Mixture of experts (``num_experts`` set): the MLP of the layers ``moe_layer_freq`` marks
    (Megatron's ``--moe-layer-freq``: every N-th layer from layer 0, or a 0/1 per layer) is
    ``num_experts`` experts of width ``moe_ffn_hidden_size`` (None: ``ffn_hidden_size``)
    of which each token takes ``moe_router_topk``, plus shared experts of total width
    ``moe_shared_expert_intermediate_size`` every token runs; the other layers keep the
    dense MLP of width ``ffn_hidden_size``.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    vocab_size: int
    seq_length: int
    activation: str = "gelu"
    tied_embeddings: bool = True
    position_embedding: str = "learned"  # learned | rope
    normalization: str = "layernorm"  # layernorm | rmsnorm
    add_bias_linear: bool = True
    head_dim: int | None = None
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    rotary_base: int = 10000
    rope_scaling: str = "none"
    rope_scaling_factor: float = 1.0
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int = 512
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    num_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    moe_layer_freq: int | tuple[int, ...] = 1
    moe_router_load_balancing_type: str = "aux_loss"
    moe_router_score_function: str = "softmax"
    moe_router_num_groups: int | None = None
    moe_router_group_topk: int | None = None
    moe_router_enable_expert_bias: bool = False
    moe_shared_expert_gate: bool = False
    #: Megatron-LM's ``--hidden-dropout`` (default 0.1): the dropout after attention, after the
    #: MLP and on the embedding output. At 0 no mask is kept (torch's dropout returns its input
    #: at p = 0: torch/_decomp/decompositions.py ``dropout``; megatron-core's bias-dropout-add
    #: calls it), so a layer saves ``2·s·b·h`` mask bytes fewer (Llama-family recipes run 0)
    hidden_dropout: float = 0.1

    def __post_init__(self) -> None:
        _text(self.name, "name")
        _whole(self.num_layers, "num_layers", 1, MAX_LAYERS)
        _check_shape(self)
        _choice(self.position_embedding, "position_embedding", ("learned", "rope"))
        _choice(self.normalization, "normalization", ("layernorm", "rmsnorm"))
        for name in ("tied_embeddings", "add_bias_linear", "add_qkv_bias", "qk_layernorm", "multi_latent_attention",
                     "moe_router_enable_expert_bias", "moe_shared_expert_gate"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError("expected true or false", field=name, found=_short(getattr(self, name)))
        if self.num_attention_heads % self.num_query_groups:
            raise SpecError(f"num_attention_heads {self.num_attention_heads} is not divisible by it",
                            field="num_query_groups", found=self.num_query_groups,
                            allowed="divisors of num_attention_heads")
        _whole(self.head_dim, "head_dim", 1, MAX_HIDDEN, optional=True)
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise SpecError(f"hidden_size {self.hidden_size} is not divisible by it (give head_dim for a head "
                            "size other than hidden_size / heads)", field="num_attention_heads",
                            found=self.num_attention_heads)
        _whole(self.rotary_base, "rotary_base", 1, 10**12)
        _choice(self.rope_scaling, "rope_scaling", ROPE_SCALINGS)
        _real(self.rope_scaling_factor, "rope_scaling_factor", 1.0, 1e6)
        _real(self.hidden_dropout, "hidden_dropout", 0.0, 0.99)
        if self.rope_scaling != "none" and self.position_embedding != "rope":
            raise SpecError("RoPE scaling needs position_embedding: rope", field="rope_scaling",
                            found=self.rope_scaling)
        self._check_mla()
        self._check_moe()

    def _check_mla(self) -> None:
        _whole(self.q_lora_rank, "q_lora_rank", 1, MAX_HIDDEN, optional=True)
        for name in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
            _whole(getattr(self, name), name, 1, MAX_HIDDEN)
        if not self.multi_latent_attention:
            if self.q_lora_rank is not None:
                raise SpecError("q_lora_rank applies to multi-latent attention only", field="q_lora_rank",
                                found=self.q_lora_rank, allowed="multi_latent_attention: true, or leave it out")
            return
        if self.num_query_groups != self.num_attention_heads:
            raise SpecError("multi-latent attention has one latent K/V for all heads, no query groups",
                            field="num_query_groups", found=self.num_query_groups,
                            allowed=f"num_attention_heads ({self.num_attention_heads})")
        if self.position_embedding != "rope":
            raise SpecError("multi-latent attention carries its position in a RoPE part of each head",
                            field="position_embedding", found=self.position_embedding, allowed="rope")
        if self.head_dim is not None:
            raise SpecError("multi-latent attention takes qk_head_dim, qk_pos_emb_head_dim and v_head_dim",
                            field="head_dim", found=self.head_dim)

    def _check_moe(self) -> None:
        _whole(self.num_experts, "num_experts", 1, MAX_EXPERTS, optional=True)
        _choice(self.moe_router_load_balancing_type, "moe_router_load_balancing_type", MOE_LOAD_BALANCING)
        _choice(self.moe_router_score_function, "moe_router_score_function", MOE_SCORE_FUNCTIONS)
        if self.num_experts is None:
            for name in ("moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_router_num_groups",
                         "moe_router_group_topk"):
                if getattr(self, name) is not None:
                    raise SpecError("applies to a mixture of experts only", field=name, found=getattr(self, name),
                                    allowed="num_experts set, or leave it out")
            if self.moe_shared_expert_gate:
                raise SpecError("applies to a mixture of experts only", field="moe_shared_expert_gate", found=True)
            if self.moe_layer_freq != 1:
                raise SpecError("applies to a mixture of experts only", field="moe_layer_freq",
                                found=_short(self.moe_layer_freq), allowed="num_experts set, or leave it out")
            return
        _whole(self.moe_router_topk, "moe_router_topk", 1, self.num_experts)
        _whole(self.moe_ffn_hidden_size, "moe_ffn_hidden_size", 1, 4 * MAX_HIDDEN, optional=True)
        _whole(self.moe_shared_expert_intermediate_size, "moe_shared_expert_intermediate_size", 1,
               64 * MAX_HIDDEN, optional=True)
        _check_freq(self.moe_layer_freq, self.num_layers)
        if (self.moe_router_num_groups is None) != (self.moe_router_group_topk is None):
            raise SpecError("group-limited routing takes both moe_router_num_groups and moe_router_group_topk",
                            field="moe_router_group_topk" if self.moe_router_group_topk is None
                            else "moe_router_num_groups", found=None)
        if self.moe_router_num_groups is not None:
            _whole(self.moe_router_num_groups, "moe_router_num_groups", 1, self.num_experts)
            if self.num_experts % self.moe_router_num_groups:
                raise SpecError(f"num_experts {self.num_experts} is not divisible by it",
                                field="moe_router_num_groups", found=self.moe_router_num_groups)
            _whole(self.moe_router_group_topk, "moe_router_group_topk", 1, self.moe_router_num_groups)
        if self.moe_shared_expert_intermediate_size is not None and self.add_bias_linear:
            raise SpecError("megatron-core's shared experts have no biases (SharedExpertMLP)", field="add_bias_linear",
                            found=True, allowed="false with moe_shared_expert_intermediate_size")
        if self.moe_shared_expert_gate and self.moe_shared_expert_intermediate_size is None:
            raise SpecError("a shared-expert gate needs shared experts", field="moe_shared_expert_gate", found=True,
                            allowed="moe_shared_expert_intermediate_size set, or leave it out")

    @property
    def moe_layers(self) -> tuple[bool, ...]:
        """Per layer, whether its MLP is the mixture of experts (all False for a dense model)."""
        if self.num_experts is None:
            return (False,) * self.num_layers
        return moe_pattern(self.moe_layer_freq, self.num_layers)

    def check(self, path: str = "model") -> None:
        """Checks run when the spec is built; kept so callers that re-check still can."""
        try:
            ModelSpec(**{f.name: getattr(self, f.name) for f in fields(self)})
        except SpecError as e:
            raise e.within(path) from None


TOKENIZER_TYPES = ("NullTokenizer", "GPT2BPETokenizer", "HuggingFaceTokenizer", "SentencePieceTokenizer",
                   "GPTSentencePieceTokenizer", "Llama2Tokenizer", "TikTokenizer")
#: what the project's megatron-core entry (cross-vendor plans) builds from local files
#: (memx_hpc/train/tokenizer.py); Megatron-LM's pretrain_gpt.py builds every TOKENIZER_TYPES entry
PROJECT_ENTRY_TOKENIZERS = ("NullTokenizer", "GPT2BPETokenizer", "HuggingFaceTokenizer", "GPTSentencePieceTokenizer",
                            "Llama2Tokenizer")
LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")


@dataclass(frozen=True, kw_only=True)
class TrainData:
    """Real training data (Megatron-LM's ``--data-path``, ``--split`` and tokenizer arguments).
    Paths are single words (memx_hpc.shellsafe), weights optional: ``[0.3, a, 0.7, b]``."""

    paths: tuple[str, ...]
    tokenizer_type: str
    tokenizer_model: str | None = None
    vocab_file: str | None = None
    merge_file: str | None = None
    split: str = "969,30,1"

    def __post_init__(self) -> None:
        if not isinstance(self.paths, tuple) or not self.paths:
            raise SpecError("expected a non-empty list of dataset prefixes", field="paths", found=_short(self.paths))
        for i, p in enumerate(self.paths):
            check_path(str(p), f"paths[{i}]")
        _choice(self.tokenizer_type, "tokenizer.type", TOKENIZER_TYPES)
        for name in ("tokenizer_model", "vocab_file", "merge_file"):
            if getattr(self, name) is not None:
                check_path(getattr(self, name), name)
        if not re.fullmatch(r"\d+(,\d+){0,2}", self.split or ""):
            raise SpecError("expected train,valid,test weights such as 969,30,1", field="split", found=self.split)


@dataclass(frozen=True, kw_only=True)
class LRSchedule:
    """Megatron-LM's learning-rate schedule arguments."""

    lr: float = 1.0e-4
    min_lr: float = 0.0
    decay_style: str = "linear"
    warmup_iters: int = 0
    decay_iters: int | None = None  # None: over train_iters

    def __post_init__(self) -> None:
        _real(self.lr, "lr", 0.0, 10.0, lo_open=True)
        _real(self.min_lr, "min_lr", 0.0, self.lr)
        _choice(self.decay_style, "decay_style", LR_DECAY_STYLES)
        _whole(self.warmup_iters, "warmup_iters", 0, MAX_TRAIN_ITERS)
        _whole(self.decay_iters, "decay_iters", 1, MAX_TRAIN_ITERS, optional=True)


@dataclass(frozen=True, kw_only=True)
class Checkpointing:
    """Where checkpoints go and come from (``--save``, ``--load``, ``--save-interval``)."""

    save_dir: str | None = None
    load_dir: str | None = None
    save_interval: int | None = None

    def __post_init__(self) -> None:
        for name in ("save_dir", "load_dir"):
            if getattr(self, name) is not None:
                check_path(getattr(self, name), name)
        _whole(self.save_interval, "interval", 1, MAX_TRAIN_ITERS, optional=True)
        if self.save_interval is not None and self.save_dir is None:
            raise SpecError("a save interval needs a save directory", field="interval", found=self.save_interval)


@dataclass(frozen=True, kw_only=True)
class TrainJob:
    """What to train: a model, the batch, precision and optimizer."""

    name: str
    model: ModelSpec
    global_batch_size: int
    precision: str = "bf16"
    optimizer: str = "adam"
    distributed_optimizer: bool = True
    #: ``distributed_optimizer: both`` in the job file: the search tries each plan with and
    #: without it (where its data-parallel ranks make it matter); ``distributed_optimizer``
    #: is then what plans without a choice of their own use
    distributed_optimizer_searched: bool = False
    attention: str = "sdpa"  # sdpa (flash/fused: no s^2 matrix kept) | core (unfused)
    micro_batch_sizes: tuple[int, ...] = ()  # candidates; () = every divisor up to 16
    recompute_modes: tuple[str, ...] = RECOMPUTE_MODES
    #: whether the job named its recompute modes: the search then keeps every one of them
    #: (by default it leaves out selective recompute where fused attention makes it dominated)
    recompute_modes_given: bool = False
    # The training length: at most one of these (Megatron-LM's --train-iters / --train-samples;
    # tokens become samples of seq_length). None of them: a job with data cannot be launched,
    # one without is a synthetic-data run of SYNTHETIC_TRAIN_ITERS iterations.
    train_iters: int | None = None
    train_samples: int | None = None
    train_tokens: int | None = None
    log_interval: int = 10
    eval_interval: int = 1000
    eval_iters: int = 10  # only where the data's split has a validation part
    max_pipeline_stages: int | None = None
    #: the degrees the search may choose among (empty: its own candidates, see
    #: memx_hpc/search/space.py): virtual pipeline stages per pipeline rank, context-parallel
    #: sizes, and, for an MoE model, expert-parallel and expert tensor-parallel sizes
    virtual_stages: tuple[int, ...] = ()
    context_parallel_sizes: tuple[int, ...] = ()
    expert_parallel_sizes: tuple[int, ...] = ()
    expert_tensor_parallel_sizes: tuple[int, ...] = ()
    #: FP8 matmuls (FP8_FORMATS; "" none) with Transformer Engine's ``fp8_recipe``: on GPU types
    #: whose catalog entry has an fp8 rate only; ``precision`` stays the weights' dtype
    fp8: str = ""
    fp8_recipe: str = "delayed"
    #: Megatron-LM accumulates and reduces bf16 gradients in an fp32 buffer unless told
    #: ``--grad-reduce-in-bf16`` (megatron/training/arguments.py; megatron-core
    #: distributed_data_parallel.py: the grad buffer is fp32 when ``grad_reduce_in_fp32``,
    #: else the parameters' dtype). False: a bf16 gradient buffer, 2 bytes per parameter.
    grad_reduce_in_fp32: bool = True
    #: ``--fp8-param-gather``: the layers' GEMM weights live as FP8 tensors (megatron-core
    #: gives them a uint8 parameter buffer) and are all-gathered in FP8, instead of 16-bit
    #: weights beside Transformer Engine's FP8 copies. Needs ``fp8`` and the distributed optimizer.
    fp8_param_gather: bool = False
    # what a training launch (render, plan --submit) uses; verify's short runs keep mock data
    data: TrainData | None = None
    lr_schedule: LRSchedule = field(default_factory=LRSchedule)
    checkpoint: Checkpointing | None = None
    source_file: str | None = None

    def __post_init__(self) -> None:
        _safe_name(self.name, "name")
        for name, cls in (("data", TrainData), ("lr_schedule", LRSchedule), ("checkpoint", Checkpointing)):
            v = getattr(self, name)
            if not isinstance(v, cls) and not (v is None and name != "lr_schedule"):
                raise SpecError(f"expected a {name} section", field=name, found=_short(v))
        if not isinstance(self.model, ModelSpec):
            raise SpecError("expected a model", field="model", found=_short(self.model))
        _whole(self.global_batch_size, "global_batch_size", 1, MAX_GLOBAL_BATCH)
        _choice(self.precision, "precision", PRECISIONS)
        _choice(self.optimizer, "optimizer", ("adam", "sgd"))
        for name in ("distributed_optimizer", "distributed_optimizer_searched"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError("expected true or false" + (", or both" if name == "distributed_optimizer" else ""),
                                field=name, found=_short(getattr(self, name)))
        _choice(self.attention, "attention", ATTENTIONS)
        if not isinstance(self.micro_batch_sizes, tuple):
            raise SpecError("expected a list of whole numbers", field="micro_batch_sizes",
                            found=_short(self.micro_batch_sizes))
        if len(self.micro_batch_sizes) > MAX_MICRO_BATCH_CHOICES:
            raise SpecError(f"{len(self.micro_batch_sizes)} micro-batch sizes", field="micro_batch_sizes",
                            allowed=f"at most {MAX_MICRO_BATCH_CHOICES}")
        for i, b in enumerate(self.micro_batch_sizes):
            _whole(b, f"micro_batch_sizes[{i}]", 1, self.global_batch_size)
            if self.global_batch_size % b:
                raise SpecError(f"does not divide global_batch_size {self.global_batch_size}",
                                field=f"micro_batch_sizes[{i}]", found=b)
        if not isinstance(self.recompute_modes, tuple) or not self.recompute_modes:
            raise SpecError("expected a non-empty list of recompute modes", field="recompute_modes",
                            found=_short(self.recompute_modes), allowed=", ".join(RECOMPUTE_MODES))
        for i, mo in enumerate(self.recompute_modes):
            Recompute.check_mode(mo, f"recompute_modes[{i}]")
        if not isinstance(self.recompute_modes_given, bool):
            raise SpecError("expected true or false", field="recompute_modes_given",
                            found=_short(self.recompute_modes_given))
        for name, hi in (("train_iters", MAX_TRAIN_ITERS), ("train_samples", MAX_TRAIN_ITERS * MAX_GLOBAL_BATCH),
                         ("train_tokens", MAX_TRAIN_ITERS * MAX_GLOBAL_BATCH * MAX_SEQ_LENGTH)):
            _whole(getattr(self, name), name, 1, hi, optional=True)
        given = [n for n in ("train_iters", "train_samples", "train_tokens") if getattr(self, n) is not None]
        if len(given) > 1:
            raise SpecError("give the training length one way only", field=given[1], found=getattr(self, given[1]),
                            allowed="one of train_iters, train_samples, train_tokens")
        _whole(self.log_interval, "log_interval", 1, MAX_TRAIN_ITERS)
        _whole(self.eval_interval, "eval_interval", 1, MAX_TRAIN_ITERS)
        _whole(self.eval_iters, "eval_iters", 0, MAX_TRAIN_ITERS)
        _whole(self.max_pipeline_stages, "max_pipeline_stages", 1, MAX_LAYERS, optional=True)
        if self.fp8 != "":
            _choice(self.fp8, "fp8", FP8_FORMATS)
        _choice(self.fp8_recipe, "fp8_recipe", FP8_RECIPES)
        for name in ("grad_reduce_in_fp32", "fp8_param_gather"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError("expected true or false", field=name, found=_short(getattr(self, name)))
        if self.fp8_param_gather and not self.fp8:
            raise SpecError("FP8 parameters need FP8 matmuls", field="fp8_param_gather", found=True,
                            allowed="fp8_param_gather: false, or an fp8 format")
        if self.fp8_param_gather and not (self.distributed_optimizer or self.distributed_optimizer_searched):
            # megatron/training/arguments.py: --fp8-param-gather only with the distributed optimizer
            raise SpecError("FP8 parameter all-gather needs the distributed optimizer", field="fp8_param_gather",
                            found=True, allowed="distributed_optimizer: true")
        if self.fp8 and self.precision == "fp32":
            raise SpecError("FP8 runs beside bf16 (or fp16) weights: Transformer Engine casts the GEMM inputs of a "
                            "16-bit model", field="fp8", found=self.fp8, allowed="precision: bf16 or fp16")
        _degrees(self.virtual_stages, "virtual_stages", MAX_LAYERS)
        for name in ("context_parallel_sizes", "expert_parallel_sizes", "expert_tensor_parallel_sizes"):
            _degrees(getattr(self, name), name, 1 << 16)
        m = self.model
        for i, cp in enumerate(self.context_parallel_sizes):
            if cp > 1 and m.seq_length % (2 * cp):
                raise SpecError(f"context parallel splits each sequence into 2 x cp = {2 * cp} chunks (Megatron-LM "
                                f"asserts it): seq_length {m.seq_length} is not a multiple of it",
                                field=f"context_parallel_sizes[{i}]", found=cp)
        for name in ("expert_parallel_sizes", "expert_tensor_parallel_sizes"):
            sizes = getattr(self, name)
            if not m.is_moe and any(x > 1 for x in sizes):
                raise SpecError(f"expert parallel needs a mixture of experts; model {m.name} is dense (give "
                                f"num_experts, or leave {name} out)", field=name, found=list(sizes))
        for i, ep in enumerate(self.expert_parallel_sizes):
            if m.is_moe and m.num_experts % ep:
                raise SpecError(f"does not divide the model's {m.num_experts} experts (Megatron-LM asserts it)",
                                field=f"expert_parallel_sizes[{i}]", found=ep)

    @property
    def bytes_per_element(self) -> int:
        return BYTES_PER_ELEMENT[self.precision]


# --------------------------------------------------------------------------- plans


@dataclass(frozen=True, kw_only=True)
class Recompute:
    """Activation recomputation, the one type from profile point to rendered flags.

    ``mode`` is one of :data:`RECOMPUTE_MODES`; it is what a layer's profile point, sample and
    cost-model query key on (a single layer is recomputed wholly, selectively or not at all).
    A stage's setting adds ``num_layers``: ``full`` on that many of its layers (None: all),
    written ``full:K`` (:meth:`label`). The search assigns one :class:`Recompute.Level` per
    partition group, which gives each of the group's stages its ``Recompute``.
    :meth:`check_mode` is the one check of a mode string."""

    mode: str = "none"
    num_layers: int | None = None

    def __post_init__(self) -> None:
        Recompute.check_mode(self.mode)
        if self.mode != "full" and self.num_layers is not None:
            raise SpecError("num_layers applies to full recompute only", field="recompute", found=self.num_layers)
        _whole(self.num_layers, "recompute.num_layers", 0, MAX_LAYERS, optional=True)

    @staticmethod
    def check_mode(mode: Any, field: str = "recompute", allowed: tuple[str, ...] = RECOMPUTE_MODES) -> str:
        """``mode`` when it is one of ``allowed`` (a subset of :data:`RECOMPUTE_MODES`), else
        SpecError naming ``field``."""
        if mode not in allowed:
            raise SpecError("unknown recompute mode" + (_suggest(mode, allowed) if isinstance(mode, str) else ""),
                            field=field, found=_short(mode), allowed=", ".join(allowed))
        return mode

    @classmethod
    def of_layers(cls, base: str, full: int, num_layers: int) -> "Recompute":
        """A stage of ``num_layers`` that recomputes ``full`` of them fully and runs the others
        under ``base`` (Megatron-LM takes one mode per stage: ``base`` applies only when
        ``full`` is 0)."""
        if full == 0:
            return cls(mode=base)
        return cls(mode="full", num_layers=None if full == num_layers else full)

    def split(self, num_layers: int, field: str = "recompute") -> tuple[str, int]:
        """(mode of the layers not fully recomputed, number fully recomputed) in a stage of
        ``num_layers``; SpecError naming ``field`` when more are asked than the stage has."""
        if self.mode != "full":
            return self.mode, 0
        k = num_layers if self.num_layers is None else self.num_layers
        if k > num_layers:
            raise SpecError(f"full recompute of {k} layers in a stage of {num_layers}", field=field,
                            found=self.label())
        return "none", k

    def label(self) -> str:
        if self.mode == "full" and self.num_layers is not None:
            return f"full:{self.num_layers}"
        return self.mode

    @classmethod
    def parse(cls, text: Any, field: str = "recompute") -> "Recompute":
        """The setting a :meth:`label` wrote (None: no recompute); SpecError naming ``field``."""
        if text is None:
            return cls()
        if not isinstance(text, str):
            raise SpecError("expected none, selective, full or full:K", field=field, found=_short(text))
        mode, _, k = text.partition(":")
        try:
            return cls(mode=mode, num_layers=int(k) if k else None)
        except (SpecError, ValueError):
            raise SpecError("expected none, selective, full or full:K", field=field, found=_short(text)) from None

    @dataclass(frozen=True, kw_only=True)
    class Level:
        """A partition group's recompute setting as the search assigns it: ``base`` mode for the
        layers not fully recomputed, and the fraction of the group's largest stage under full
        recompute. :meth:`for_stage` gives the :class:`Recompute` of each of its stages.

        Megatron takes one ``--recompute-num-layers k`` per hetjob component (a partition
        group's stages share a command line), and a stage with ``n < k`` layers recomputes all
        n (the block method checkpoints layers ``0..k-1`` of each stage). So k is set per
        group, ``k = ceil(n_max * full_fraction)`` with ``n_max`` the group's largest stage,
        and a stage recomputes ``min(k, n)`` layers: what the rendered job runs.
        """

        base: str = "none"
        full_fraction: float = 0.0

        def __post_init__(self) -> None:
            Recompute.check_mode(self.base, "recompute level base", ("none", "selective"))
            _real(self.full_fraction, "full_fraction", 0.0, 1.0)

        def for_stage(self, num_layers: int, group_max_layers: int | None = None) -> "Recompute":
            k = min(num_layers, full_layers(group_max_layers or num_layers, self.full_fraction))
            return Recompute.of_layers(self.base, k, num_layers)

        def label(self) -> str:
            if self.full_fraction == 0:
                return self.base
            return "full" if self.full_fraction == 1 else f"full:{self.full_fraction:g}"


def full_layers(num_layers: int, fraction: float) -> int:
    """k = ceil(n * fraction). The small epsilon keeps exact products (4 x 0.5) from rounding
    up through binary fractions (1/3 x 3 = 1.0000000000000002)."""
    return int(math.ceil(num_layers * fraction - 1e-9))


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One pipeline stage: consecutive layers on GPUs of one partition. 0 layers: a first
    stage that holds only the embedding or a last one that holds only the output layer and
    loss (Megatron-LM's pipeline layout allows both; :class:`Plan` checks the position)."""

    partition: str
    num_layers: int
    recompute: Recompute = field(default_factory=Recompute)

    def __post_init__(self) -> None:
        _safe_name(self.partition, "partition")
        _whole(self.num_layers, "num_layers", 0, MAX_LAYERS)
        if not isinstance(self.recompute, Recompute):
            raise SpecError("expected a recompute setting", field="recompute", found=_short(self.recompute))


def _check_batches_and_stages(plan: Any) -> None:
    """What a Plan and a GeneralPlan share: the batch sizes and a bounded, non-empty pipeline."""
    _whole(plan.global_batch_size, "global_batch_size", 1, MAX_GLOBAL_BATCH)
    _whole(plan.micro_batch_size, "micro_batch_size", 1, plan.global_batch_size)
    if not plan.stages:
        raise SpecError("a plan needs at least one stage", field="stages", found=[])
    if len(plan.stages) > MAX_LAYERS:
        raise SpecError(f"{len(plan.stages)} stages", field="stages", allowed=f"at most {MAX_LAYERS}")


def chunk_split(num_layers: int, virtual_stages: int, *, last: bool = False) -> tuple[int, ...]:
    """Layers of each of a stage's ``virtual_stages`` model chunks: even, the remainder to the
    later chunks; the last stage with fewer layers than chunks leaves its last chunk empty (the
    loss alone, as Megatron's --account-for-loss-in-pipeline-split builds it)."""
    n, v = int(num_layers), int(virtual_stages)
    if last and n < v:
        return tuple(1 if k < n else 0 for k in range(v))
    base, rem = divmod(n, v)
    return tuple(base + (1 if k >= v - rem else 0) for k in range(v))


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A configuration Megatron-LM can run: uniform TP, DP and micro-batch; ordered stages.

    Derived quantities are properties, not stored (one product check, as torchtitan's
    ParallelDims).
    """

    tp: int
    dp: int
    micro_batch_size: int
    global_batch_size: int
    stages: tuple[Stage, ...]
    sequence_parallel: bool = False
    #: model chunks per pipeline rank (interleaved 1F1B; Megatron's virtual pipeline stages):
    #: stage ``i``'s layers are split into ``virtual_stages`` chunks as evenly as possible,
    #: chunk ``k`` of stage ``i`` being virtual stage ``k * pp + i`` (the pipeline layout's order)
    virtual_stages: int = 1
    #: context-parallel size: each sequence split over ``cp`` ranks (ring attention)
    cp: int = 1
    #: expert-parallel size and expert tensor-parallel size (None: TP's) of an MoE model's
    #: expert layers; ``etp * ep`` ranks of a stage's ``tp * cp * dp`` hold one copy of the experts
    ep: int = 1
    etp: int | None = None
    #: Megatron-LM's ``--use-distributed-optimizer`` for this plan (None: the job's setting)
    distributed_optimizer: bool | None = None

    def __post_init__(self) -> None:
        _whole(self.tp, "tp", 1, 1 << 16)
        _optional_bool(self.distributed_optimizer, "distributed_optimizer")
        _whole(self.dp, "dp", 1, MAX_NODES * MAX_GPUS_PER_NODE)
        _whole(self.cp, "cp", 1, 1 << 16)
        _whole(self.ep, "ep", 1, 1 << 16)
        _whole(self.etp, "etp", 1, 1 << 16, optional=True)
        _whole(self.virtual_stages, "virtual_stages", 1, MAX_LAYERS)
        if not isinstance(self.sequence_parallel, bool):
            raise SpecError("expected true or false", field="sequence_parallel", found=_short(self.sequence_parallel))
        _check_batches_and_stages(self)
        empty = [i for i, s in enumerate(self.stages) if s.num_layers == 0]
        if empty:
            inner = [i for i in empty if 0 < i < self.pp - 1]
            if inner or self.pp < 2 or len(empty) == self.pp:
                i = inner[0] if inner else empty[0]
                raise SpecError("a stage without layers is the first (the embedding alone) or the last (the output "
                                "layer and loss alone) of a pipeline with layers elsewhere",
                                field=f"stages[{i}].num_layers", found=0, allowed="at least 1 for this stage")
            for i in empty:
                if self.stages[i].recompute.mode != "none":
                    raise SpecError("a stage without layers has nothing to recompute", field=f"stages[{i}].recompute",
                                    found=self.stages[i].recompute.label(), allowed="none")
        if self.global_batch_size % (self.micro_batch_size * self.dp):
            raise SpecError("global_batch_size must be a multiple of micro_batch_size * dp", field="global_batch_size",
                            found=(self.global_batch_size, self.micro_batch_size, self.dp))
        width = self.tp * self.cp * self.dp
        if width % (self.expert_tp * self.ep):
            raise SpecError(f"expert TP x EP = {self.expert_tp} x {self.ep} must divide the {width} ranks of a stage "
                            f"(tp x cp x dp = {self.tp} x {self.cp} x {self.dp}): megatron-core lays the experts "
                            f"over the same ranks", field="ep", found=self.ep)
        v = self.virtual_stages
        if v > 1:
            if self.pp < 2:
                raise SpecError("virtual pipeline stages interleave a pipeline of at least 2 stages",
                                field="virtual_stages", found=v, allowed="1 with one stage")
            # the first stage's first chunk may hold only the embedding and the last stage's last
            # chunk only the loss (Megatron's --account-for-embedding/loss-in-pipeline-split)
            short = [i for i, s in enumerate(self.stages)
                     if s.num_layers < v - (1 if i in (0, self.pp - 1) else 0)]
            if short:
                raise SpecError(f"stage {short[0]} has {self.stages[short[0]].num_layers} layers, fewer than its "
                                f"{v} model chunks", field="virtual_stages", found=v,
                                allowed=f"at most {min(s.num_layers for s in self.stages)}")
            m = self.num_microbatches
            if m < self.pp or m % self.pp:
                # megatron-core's interleaved schedule: groups of pp micro-batches per chunk
                # (--microbatch-group-size-per-virtual-pipeline-stage, default pp), the last one full
                raise SpecError(f"interleaved 1F1B runs micro-batches in groups of pp = {self.pp}: the "
                                f"{m} micro-batches per iteration must be a multiple of it", field="virtual_stages",
                                found=v, allowed=f"1, or micro-batches per iteration a multiple of {self.pp}")

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def expert_tp(self) -> int:
        """The expert layers' tensor-parallel size (``etp``, else TP's, as megatron-core)."""
        return self.tp if self.etp is None else self.etp

    @property
    def gpus_per_stage(self) -> int:
        return self.tp * self.cp * self.dp

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def chunk_layers(self, stage: int) -> tuple[int, ...]:
        """Layers of each of stage ``stage``'s ``virtual_stages`` chunks (:func:`chunk_split`)."""
        return chunk_split(self.stages[stage].num_layers, self.virtual_stages, last=stage == self.pp - 1)

    @property
    def num_microbatches(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def num_layers(self) -> int:
        return sum(s.num_layers for s in self.stages)

    def component_groups(self) -> list[tuple[str, list[int]]]:
        """Runs of consecutive stages on one partition: ``[(partition, [stage indices])]``."""
        groups: list[tuple[str, list[int]]] = []
        for i, s in enumerate(self.stages):
            if groups and groups[-1][0] == s.partition:
                groups[-1][1].append(i)
            else:
                groups.append((s.partition, [i]))
        return groups


def job_for_plan(job: "TrainJob", plan: Plan) -> "TrainJob":
    """``job`` with the plan's own distributed-optimizer choice, where it makes one (what
    the composition prices and the renderer launches)."""
    if plan.distributed_optimizer is None or plan.distributed_optimizer == job.distributed_optimizer:
        return job
    return replace(job, distributed_optimizer=plan.distributed_optimizer)


def check_plan_for_model(plan: Plan, model: ModelSpec) -> None:
    """What a plan's context- and expert-parallel degrees need of the model (the Plan checks
    what needs no model): SpecError naming the field. Megatron-LM asserts a sequence of a
    multiple of ``2 * cp`` (ring attention's load-balanced halves), experts only in an MoE
    model, and ``num_experts`` a multiple of EP; each expert's FFN is split by expert TP."""
    if plan.cp > 1 and model.seq_length % (2 * plan.cp):
        raise SpecError(f"context parallel splits each sequence into 2 x cp = {2 * plan.cp} chunks: seq_length "
                        f"{model.seq_length} is not a multiple of it", field="cp", found=plan.cp)
    if plan.ep > 1 or plan.etp is not None:
        if not model.is_moe:
            raise SpecError(f"expert parallel needs a mixture of experts; model {model.name} is dense",
                            field="ep" if plan.ep > 1 else "etp", found=plan.ep if plan.ep > 1 else plan.etp,
                            allowed="ep 1 and no etp")
        if model.num_experts % plan.ep:
            raise SpecError(f"EP must divide the model's {model.num_experts} experts", field="ep", found=plan.ep)
        if model.expert_ffn_hidden_size % plan.expert_tp:
            raise SpecError(f"expert TP must divide the experts' FFN width {model.expert_ffn_hidden_size}",
                            field="etp", found=plan.expert_tp)


@dataclass(frozen=True, kw_only=True)
class Replica:
    """One data-parallel replica of a stage in a general plan: its GPU type and TP degree."""

    gpu_type: str
    tp: int
    partition: str | None = None

    def __post_init__(self) -> None:
        _safe_name(self.gpu_type, "gpu_type")
        _whole(self.tp, "tp", 1, 1 << 16)
        _safe_name(self.partition, "partition", optional=True)


@dataclass(frozen=True, kw_only=True)
class GeneralStage:
    """A stage of a general plan: replicas may differ in GPU type and TP (predict only)."""

    num_layers: int
    replicas: tuple[Replica, ...]
    recompute: Recompute = field(default_factory=Recompute)

    def __post_init__(self) -> None:
        _whole(self.num_layers, "num_layers", 1, MAX_LAYERS)
        if not self.replicas:
            raise SpecError("a stage needs at least one replica", field="replicas", found=[])


@dataclass(frozen=True, kw_only=True)
class GeneralPlan:
    """Plans other planners produce (Sailor, Metis): predicted and compared, never rendered."""

    micro_batch_size: int
    global_batch_size: int
    stages: tuple[GeneralStage, ...]

    def __post_init__(self) -> None:
        _check_batches_and_stages(self)


# --------------------------------------------------------------------------- profiling


@dataclass(frozen=True, kw_only=True)
class LayerShape(_HeadsAndExperts):
    """The shape numbers one transformer layer's cost depends on.

    A dense layer with standard attention of ``hidden_size / heads`` wide heads needs only the
    first seven fields (what every stored sample before the others existed describes). The
    others, each at a value meaning "not this kind of layer" by default:

    * ``head_dim``: a head size other than ``hidden_size / heads`` (Megatron's ``--kv-channels``);
    * ``multi_latent_attention`` with ``q_lora_rank`` (None: Q projected directly),
      ``kv_lora_rank``, ``qk_head_dim``, ``qk_pos_emb_head_dim`` and ``v_head_dim``
      (DeepSeek's MLA, Megatron's MLA arguments);
    * ``num_experts`` set: the layer's MLP is the mixture of experts (``moe_router_topk``
      experts per token of per-branch width ``moe_ffn_hidden_size``, shared experts of
      total width ``moe_shared_expert_intermediate_size`` with an optional gate); a dense
      layer of an MoE model (``moe_layer_freq``) has ``num_experts`` None.
    """

    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    seq_length: int
    vocab_size: int
    activation: str = "gelu"
    head_dim: int | None = None
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_head_dim: int | None = None
    qk_pos_emb_head_dim: int | None = None
    v_head_dim: int | None = None
    num_experts: int | None = None
    moe_router_topk: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    moe_shared_expert_gate: bool = False

    def __post_init__(self) -> None:
        _check_shape(self)
        _whole(self.head_dim, "head_dim", 1, MAX_HIDDEN, optional=True)
        for name in ("multi_latent_attention", "moe_shared_expert_gate"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError("expected true or false", field=name, found=_short(getattr(self, name)))
        mla = ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
        _whole(self.q_lora_rank, "q_lora_rank", 1, MAX_HIDDEN, optional=True)
        for name in mla:
            _whole(getattr(self, name), name, 1, MAX_HIDDEN, optional=True)
        if self.multi_latent_attention:
            missing = [n for n in mla if getattr(self, n) is None]
            if missing:
                raise SpecError("multi-latent attention needs its ranks and head sizes", field=missing[0], found=None)
            if self.head_dim is not None:
                raise SpecError("multi-latent attention takes qk_head_dim, qk_pos_emb_head_dim and v_head_dim",
                                field="head_dim", found=self.head_dim)
        else:
            given = [n for n in ("q_lora_rank",) + mla if getattr(self, n) is not None]
            if given:
                raise SpecError("applies to multi-latent attention only", field=given[0],
                                found=getattr(self, given[0]), allowed="multi_latent_attention: true, or leave it out")
        moe = ("moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size")
        _whole(self.num_experts, "num_experts", 1, MAX_EXPERTS, optional=True)
        if self.num_experts is None:
            given = [n for n in moe if getattr(self, n) is not None] + (
                ["moe_shared_expert_gate"] if self.moe_shared_expert_gate else [])
            if given:
                raise SpecError("applies to a mixture-of-experts layer only", field=given[0],
                                found=getattr(self, given[0]), allowed="num_experts set, or leave it out")
            return
        if self.moe_router_topk is None or self.moe_ffn_hidden_size is None:
            raise SpecError("an MoE layer needs moe_router_topk and moe_ffn_hidden_size",
                            field="moe_router_topk" if self.moe_router_topk is None else "moe_ffn_hidden_size",
                            found=None)
        _whole(self.moe_router_topk, "moe_router_topk", 1, self.num_experts)
        _whole(self.moe_ffn_hidden_size, "moe_ffn_hidden_size", 1, 4 * MAX_HIDDEN)
        _whole(self.moe_shared_expert_intermediate_size, "moe_shared_expert_intermediate_size", 1,
               64 * MAX_HIDDEN, optional=True)
        if self.moe_shared_expert_gate and self.moe_shared_expert_intermediate_size is None:
            raise SpecError("a shared-expert gate needs shared experts", field="moe_shared_expert_gate", found=True)

    @property
    def extension(self) -> dict[str, Any]:
        """The fields beyond the dense shape that differ from their defaults (a dense layer
        with standard attention: empty)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in DENSE_SHAPE_FIELDS and getattr(self, f.name) != f.default}

    @staticmethod
    def of(model: ModelSpec, *, moe: bool | None = None) -> "LayerShape":
        """The layer shape of ``model``'s layers: ``moe`` True the mixture-of-experts layer,
        False the dense one, None the one kind all its layers are (a model whose layers are
        dense and MoE, ``moe_layer_freq``, has two shapes: :meth:`kinds_of` says which each
        layer is). A head size equal to ``hidden_size / heads`` is the default one."""
        kinds = set(model.moe_layers)
        if moe is None:
            if len(kinds) > 1:
                raise SpecError("the layers of this model differ (dense and MoE): ask for one kind",
                                field="model.moe_layer_freq", found=_short(model.moe_layer_freq))
            moe = kinds == {True}
        if moe and not model.is_moe:
            raise SpecError("a dense model has no MoE layer", field="model.num_experts", found=None)
        ext: dict[str, Any] = {}
        if model.head_dim is not None and model.head_dim * model.num_attention_heads != model.hidden_size:
            ext["head_dim"] = model.head_dim
        if model.multi_latent_attention:
            ext.update(multi_latent_attention=True, q_lora_rank=model.q_lora_rank, kv_lora_rank=model.kv_lora_rank,
                       qk_head_dim=model.qk_head_dim, qk_pos_emb_head_dim=model.qk_pos_emb_head_dim,
                       v_head_dim=model.v_head_dim)
        if moe:
            ext.update(num_experts=model.num_experts, moe_router_topk=model.moe_router_topk,
                       moe_ffn_hidden_size=model.expert_ffn_hidden_size,
                       moe_shared_expert_intermediate_size=model.moe_shared_expert_intermediate_size,
                       moe_shared_expert_gate=model.moe_shared_expert_gate)
        return LayerShape(hidden_size=model.hidden_size, num_attention_heads=model.num_attention_heads,
                          num_query_groups=model.num_query_groups, ffn_hidden_size=model.ffn_hidden_size,
                          seq_length=model.seq_length, vocab_size=model.vocab_size,
                          activation=model.activation, **ext)

    @staticmethod
    def kinds_of(model: ModelSpec) -> tuple[bool, ...]:
        """Per layer, whether :meth:`of` ``(model, moe=True)`` is its shape (the model's
        ``moe_layers``: all False for a dense model)."""
        return model.moe_layers


#: The fields of a LayerShape every stored sample has (the rest are :attr:`LayerShape.extension`).
DENSE_SHAPE_FIELDS = ("hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "seq_length",
                      "vocab_size", "activation")


SAMPLE_KINDS = ("layer", "embedding", "head", "optimizer", "allreduce", "p2p", "alltoall")
SAMPLE_ORIGINS = ("measured", "imported", "augmented")
MAX_SAMPLE_MS = 1e9          # 11.6 days for one call: beyond that a unit is wrong
MAX_SAMPLE_BYTES = 2**62     # 4 EiB per device (fits int64)


@dataclass(frozen=True, kw_only=True)
class ProfilePoint:
    """What to measure: one kind of operation on one GPU type at one setting."""

    gpu_type: str
    kind: str  # one of SAMPLE_KINDS
    shape: LayerShape
    tp: int = 1
    micro_batch_size: int = 1
    recompute: str = "none"  # a Recompute.mode (a layer is recomputed wholly or not)
    precision: str = "bf16"
    attention: str = "sdpa"
    # collectives: group size and message size; p2p: 2 ranks, inter_node says where;
    # alltoall: an MoE layer's token dispatch (and combine) over an expert-parallel group
    # of group_size ranks, message_bytes what each rank sends
    group_size: int = 1
    message_bytes: int = 0
    inter_node: bool = False
    #: an MoE layer measured with its experts spread over ``ep`` ranks (1: all on one)
    ep: int = 1

    def __post_init__(self) -> None:
        _safe_name(self.gpu_type, "gpu_type")
        _choice(self.kind, "kind", SAMPLE_KINDS)
        if not isinstance(self.shape, LayerShape):
            raise SpecError("expected a layer shape", field="shape", found=_short(self.shape))
        _whole(self.tp, "tp", 1, 1 << 16)
        _whole(self.micro_batch_size, "micro_batch_size", 1, MAX_GLOBAL_BATCH)
        Recompute.check_mode(self.recompute)
        _choice(self.precision, "precision", PRECISIONS)
        _choice(self.attention, "attention", ATTENTIONS)
        _whole(self.group_size, "group_size", 1, MAX_NODES * MAX_GPUS_PER_NODE)
        _whole(self.message_bytes, "message_bytes", 0, MAX_SAMPLE_BYTES)
        if not isinstance(self.inter_node, (bool, numbers.Integral)):
            raise SpecError("expected true or false", field="inter_node", found=_short(self.inter_node))
        _whole(self.ep, "ep", 1, MAX_EXPERTS)
        if self.ep > 1 and not (self.kind == "layer" and self.shape.is_moe):
            raise SpecError("expert parallelism applies to an MoE layer", field="ep", found=self.ep, allowed="1")
        if self.ep > 1 and self.shape.num_experts % self.ep:
            raise SpecError(f"EP must divide the layer's {self.shape.num_experts} experts", field="ep", found=self.ep)


@dataclass(frozen=True)
class Provenance:
    """Where a sample was made, beyond its ``source`` and ``origin``: host, device, driver,
    versions, settings and time of a measurement; dataset, file and mapping of an import;
    the neighbours of an augmented point. One JSON object; ``text`` is its serialised form,
    kept as written (the store's and the CSV's ``provenance`` column hold it and a row's
    digest covers it). The fields the planner reads are typed properties; the object is
    read from ``text`` once, when one is first asked for."""

    text: str = "{}"

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise SpecError("expected JSON text", field="provenance", found=_short(self.text))

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> "Provenance":
        """The provenance of ``values`` (sorted keys; values JSON cannot hold are written as text)."""
        return cls(json.dumps(dict(values), sort_keys=True, default=str))

    @classmethod
    def parse(cls, text: Any, field: str = "provenance") -> "Provenance":
        """``text`` when it is a JSON object, else SpecError naming ``field``."""
        if not isinstance(text, str):
            raise SpecError("provenance must be JSON text", field=field, found=_short(text))
        try:
            ok = isinstance(json.loads(text), dict)
        except (ValueError, RecursionError):
            ok = False
        if not ok:
            raise SpecError("provenance must be JSON text", field=field, found=text[:60])
        return cls(text)

    def as_dict(self) -> dict[str, Any]:
        """The object (an empty one where ``text`` is not a JSON object: rows from before the check)."""
        got = self.__dict__.get("_fields")
        if got is None:
            try:
                got = json.loads(self.text or "{}")
            except (ValueError, RecursionError):
                got = {}
            if not isinstance(got, dict):
                got = {}
            object.__setattr__(self, "_fields", got)
        return dict(got)

    def _get(self, key: str) -> Any:
        self.as_dict()
        return self.__dict__["_fields"].get(key)

    @property
    def transformer_impl(self) -> str | None:
        """The transformer layer a measurement ran (``local`` | ``transformer_engine``), if recorded."""
        v = self._get("transformer_impl")
        return v if isinstance(v, str) else None

    @property
    def extrapolated(self) -> bool:
        """Whether an augmented point lies outside the measured ones."""
        return self._get("extrapolated") is True

    @property
    def model(self) -> str:
        """The model an imported sample was measured in ("" when not recorded)."""
        v = self._get("model")
        return v if isinstance(v, str) else ""

    @property
    def note(self) -> str | None:
        v = self._get("note")
        return v if isinstance(v, str) else None


@dataclass(frozen=True, kw_only=True)
class LayerSample:
    """What was measured (or imported, or augmented) at one ProfilePoint.

    Times are per call in milliseconds; bytes are per device. ``device_footprint_bytes``
    is what the driver reports for the process (allocator reserved peak plus runtime
    context and communication buffers); 0 when unknown. ``update_ms`` is the optimizer
    step for this layer's parameter shard. Times and bytes are never negative.
    """

    point: ProfilePoint
    forward_ms: float = 0.0
    backward_ms: float = 0.0
    update_ms: float = 0.0
    activation_bytes: int = 0
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    device_footprint_bytes: int = 0
    infeasible: bool = False
    origin: str = "measured"  # measured | imported | augmented
    source: str = ""  # where it came from: host/job id, or the imported file
    provenance: Provenance = field(default_factory=Provenance)
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.point, ProfilePoint):
            raise SpecError("expected a profile point", field="point", found=_short(self.point))
        for name in ("forward_ms", "backward_ms", "update_ms"):
            _real(getattr(self, name), name, 0.0, MAX_SAMPLE_MS)
        for name in ("activation_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "device_footprint_bytes"):
            _whole(getattr(self, name), name, 0, MAX_SAMPLE_BYTES)
        _choice(self.origin, "origin", SAMPLE_ORIGINS)
        if not isinstance(self.provenance, Provenance):
            raise SpecError("expected a provenance", field="provenance", found=_short(self.provenance))
        _real(self.weight, "weight", 0.0, 1e6)

    @property
    def transformer_impl(self) -> str:
        """The transformer layer that was measured (``local`` | ``transformer_engine``), from the
        provenance; measured samples from before the field was recorded are megatron-core's
        local spec (the only one profiled then); other samples that do not say: ``unknown``."""
        impl = self.provenance.transformer_impl
        if impl in TRANSFORMER_IMPLS:
            return impl
        return "local" if self.origin == "measured" else "unknown"


def transformer_impls(samples: Iterable[LayerSample]) -> dict[str, str]:
    """The one transformer implementation measured per GPU type (layer samples; ``unknown``
    ones do not count). A GPU type measured with two is refused: predicting from both would
    mix what runs with what does not."""
    seen: dict[str, set[str]] = {}
    for s in samples:
        if s.point.kind == "layer":
            seen.setdefault(s.point.gpu_type, set()).add(s.transformer_impl)
    out = {}
    for gpu, impls in sorted(seen.items()):
        known = sorted(impls - {"unknown"})
        if len(known) > 1:
            raise SpecError(f"layer samples of {gpu} were measured with {' and '.join(known)} layers; a predictor "
                            f"fitted on both would mix them: keep the samples of the implementation the "
                            f"partition trains with (its transformer_impl)", field="transformer_impl",
                            found=known, allowed="one implementation per GPU type")
        out[gpu] = known[0] if known else "unknown"
    return out


# --------------------------------------------------------------------------- loading files


#: the parallel degrees a site (what its Megatron-LM builds and networks are meant for) or a job
#: lets the search choose among
DEGREE_KEYS = ("virtual_stages", "context_parallel_sizes", "expert_parallel_sizes", "expert_tensor_parallel_sizes")
SITE_KEYS = ("name", "partitions", "gpu_types", "links", "inter_partition_gbytes_per_s", "inter_partition_gbps",
             "scheduler", "slurm",
             "store", "cache", "work_dir", "pipeline_comm", "memory_safety_margin", "megatron_version",
             "objective", "reference_data", "prefer_source") + DEGREE_KEYS
PARTITION_KEYS = ("name", "gpu_type", "nodes", "gpus_per_node", "intra_node_gbytes_per_s", "inter_node_gbytes_per_s",
                  "intra_node_gbps", "inter_node_gbps",
                  "gres_type", "account", "qos", "time_limit_min", "exclusive", "cpus_per_task", "mem_per_node_gib",
                  "setup", "env", "python", "container", "megatron_entry", "module_purge", "transformer_impl",
                  "stand_in_for", "link_curves_from", "fabric", "nics_per_node")


def _wrap_file(fn: Callable[[], Any], file: str) -> Any:
    try:
        return fn()
    except SpecError as e:
        raise e.with_file(file) from None


def load_site(path: str | os.PathLike) -> Site:
    """Load and validate a site file."""
    file = str(path)
    data = load_yaml(path)
    return _wrap_file(lambda: site_from_mapping(data, source_file=file), file)


def _partition_from(pr: _Reader) -> Partition:
    p = _build(
        Partition, pr.path,
        name=pr.str("name"),
        gpu_type=pr.str("gpu_type"),
        nodes=pr.int("nodes"),
        gpus_per_node=pr.int("gpus_per_node"),
        intra_node_gbps=pr.rate("intra_node_gbytes_per_s", None),
        inter_node_gbps=pr.rate("inter_node_gbytes_per_s", None),
        link_curves_from=pr.str("link_curves_from", None),
        fabric=pr.str("fabric", ""),
        nics_per_node=pr.int("nics_per_node", None),
        gres_type=pr.str("gres_type", None),
        account=pr.str("account", None),
        qos=pr.str("qos", None),
        time_limit_min=pr.int("time_limit_min", None),
        exclusive=pr.bool("exclusive", None),
        cpus_per_task=pr.int("cpus_per_task", None),
        mem_per_node_gib=pr.float("mem_per_node_gib", None),
        setup=pr.str_list("setup"),
        env=pr.str_map("env"),
        python=pr.str("python", "python3"),
        container=pr.str("container", None),
        megatron_entry=pr.str("megatron_entry", "pretrain_gpt.py"),
        module_purge=pr.bool("module_purge", False),
        transformer_impl=pr.str("transformer_impl", None),
        stand_in_for=pr.str("stand_in_for", None),
    )
    pr.finish(PARTITION_KEYS)
    return p


def site_from_mapping(data: Any, *, source_file: str | None = None) -> Site:
    """Map a site document to :class:`Site` keyword arguments (the Site checks them)."""
    r = _Reader(data, "", kind="a site mapping with 'name' and 'partitions'")
    g = r.raw("gpu_types", {})
    if not isinstance(g, Mapping):
        raise SpecError("expected a mapping of GPU type name to its figures", field="gpu_types", found=_short(g))
    gpu_types = []
    for gname, gdata in g.items():
        if not isinstance(gname, str):
            raise SpecError("GPU type names are strings", field="gpu_types", found=_short(gname))
        gpu_types.append(GpuType.from_mapping(gdata, f"gpu_types.{gname[:80]}", name=gname))

    slurm = r.sub("slurm")
    kw: dict[str, Any] = {}
    if slurm is not None:
        kw.update(scheduler=slurm.str("scheduler", "auto"), account=slurm.str("account", None),
                  qos=slurm.str("qos", None), time_limit_min=slurm.int("time_limit_min", 60),
                  exclusive=slurm.bool("exclusive", False), signal=slurm.str("signal", None),
                  requeue=slurm.bool("requeue", None),
                  container_runtime=slurm.str("container_runtime", None, choices=CONTAINER_RUNTIMES))
        slurm.finish(("scheduler", "account", "qos", "time_limit_min", "exclusive", "signal", "requeue",
                      "container_runtime"))

    items = r.items("partitions", required=True)
    if len(items) > MAX_PARTITIONS:
        raise SpecError(f"{len(items)} partitions", field="partitions", allowed=f"at most {MAX_PARTITIONS}")
    parts = [_partition_from(pr) for pr in items]

    links = []
    for lr in r.items("links"):
        pair = lr.str_list("between")
        if len(pair) != 2:
            raise SpecError("'between' names exactly two partitions", field=lr._p("between"), found=list(pair))
        links.append(_build(Link, lr.path, a=pair[0], b=pair[1], gbps=lr.rate("gbytes_per_s")))
        lr.finish(("between", "gbytes_per_s", "gbps"))

    pc = r.sub("pipeline_comm")
    if pc is not None:
        kw.update(pipeline_comm_backend=pc.str("backend", "nccl"), pipeline_comm_env=pc.str_map("env"))
        pc.finish(("backend", "env"))

    if r.raw("reference_data", None) is not None:
        kw["reference_data"] = r.bool("reference_data")
    pref = r.raw("prefer_source", None)
    if pref is not None:
        if isinstance(pref, str):
            kw["prefer_source"] = (("*", pref.lower()),)
        elif isinstance(pref, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in pref.items()):
            kw["prefer_source"] = tuple((k, v.lower()) for k, v in pref.items())
        else:
            raise SpecError("a source name (sailor, cephalo, measured), or a mapping of GPU type to one",
                            field="prefer_source", found=_short(pref))
    obj = r.sub("objective")
    if obj is not None:
        kw["objective_weights"] = (obj.float("time", 1.0), obj.float("memory", 0.5), obj.float("balance", 0.5))
        obj.finish(("time", "memory", "balance"))

    site = _build(
        Site, "",
        name=r.str("name"), partitions=tuple(parts), gpu_types=tuple(gpu_types), links=tuple(links),
        inter_partition_gbps=r.rate("inter_partition_gbytes_per_s", 12.5),
        store_path=r.str("store", "memx-store.h5"),
        cache_path=r.str("cache", None),
        work_dir=r.str("work_dir", "memx-runs"),
        memory_safety_margin=r.float("memory_safety_margin", 0.05),
        megatron_version=r.str("megatron_version", "core_r0.16.0"),
        **_degrees_from(r),
        source_file=source_file,
        **kw,
    )
    r.finish(SITE_KEYS)
    if source_file is not None:
        for i, part in enumerate(site.partitions):
            if "/" in part.python and not os.path.isabs(part.python) \
                    and find_relative_to_site(part.python, source_file) is None:
                # found nowhere, it is run as given from the job's folder on the node, where it is
                # not either: every task would die before writing a line
                raise SpecError("a relative Python path names no file from the site file's folder, the folders "
                                "above it or the current folder; give the absolute path of the nodes' Python",
                                field=f"partitions[{i}].python", found=part.python)
    return site


def find_relative_to_site(path: str, source_file: str | None) -> Path | None:
    """A relative path (a partition's ``python``) found from the site file's folder or a folder
    above it (a repository's ``.venv/bin/python`` named in ``site_configs/local.yaml``), else
    from the current folder; None when it names no file there."""
    if source_file:
        base = Path(source_file).resolve().parent
        for d in (base, *base.parents):
            if (d / path).exists():
                return d / path
    cand = Path.cwd() / path
    return cand.resolve() if cand.exists() else None


JOB_KEYS = ("name", "model", "global_batch_size", "precision", "optimizer", "distributed_optimizer",
            "attention", "micro_batch_sizes", "recompute_modes", "train_iters", "train_samples", "train_tokens",
            "log_interval", "eval_interval", "eval_iters", "max_pipeline_stages", "data", "lr_schedule", "checkpoint",
            "virtual_stages", "context_parallel_sizes", "expert_parallel_sizes", "expert_tensor_parallel_sizes",
            "fp8", "fp8_recipe", "grad_reduce_in_fp32", "fp8_param_gather")
MODEL_KEYS = ("preset", "hf_config", "name", "num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
              "ffn_hidden_size", "vocab_size", "seq_length", "activation", "tied_embeddings",
              "position_embedding", "normalization", "add_bias_linear") + MODEL_EXTENSION_FIELDS

# How a model mapping's extension fields are read (the _Reader method; moe_layer_freq is its own).
_EXTENSION_KINDS = {
    "head_dim": "int", "add_qkv_bias": "bool", "qk_layernorm": "bool", "rotary_base": "int", "rope_scaling": "str",
    "rope_scaling_factor": "float", "multi_latent_attention": "bool", "q_lora_rank": "int", "kv_lora_rank": "int",
    "qk_head_dim": "int", "qk_pos_emb_head_dim": "int", "v_head_dim": "int", "num_experts": "int",
    "moe_router_topk": "int", "moe_ffn_hidden_size": "int", "moe_shared_expert_intermediate_size": "int",
    "moe_router_load_balancing_type": "str", "moe_router_score_function": "str", "moe_router_num_groups": "int",
    "moe_router_group_topk": "int", "moe_router_enable_expert_bias": "bool", "moe_shared_expert_gate": "bool",
    "hidden_dropout": "float",
}


def load_job(path: str | os.PathLike) -> TrainJob:
    """Load and validate a job file."""
    file = str(path)
    data = load_yaml(path)
    return _wrap_file(lambda: job_from_mapping(data, source_file=file), file)


def _layer_freq(r: "_Reader", base: Mapping[str, Any]) -> int | tuple[int, ...]:
    """``moe_layer_freq``: an integer N or a list of 0/1 (a tuple in the spec)."""
    if not r.has("moe_layer_freq"):
        r.used.add("moe_layer_freq")
        return base.get("moe_layer_freq", 1)
    v = r.raw("moe_layer_freq")
    if isinstance(v, list):
        return tuple(v)
    return r.int("moe_layer_freq")


def model_from_mapping(data: Any, path: str = "model", *, base_dir: str | os.PathLike | None = None) -> ModelSpec:
    """A model from a preset name, a preset with overrides, a Hugging Face ``config.json``
    (``hf_config``, relative to ``base_dir``) with overrides, or an explicit shape."""
    from .catalog import model_presets
    if isinstance(data, str):
        data = {"preset": data}
    r = _Reader(data, path)
    base: dict[str, Any] = {}
    if r.has("preset") and r.has("hf_config"):
        raise SpecError("give a preset or a Hugging Face config, not both", field=f"{path}.hf_config",
                        found=r.raw("hf_config"))
    if r.has("preset"):
        presets = model_presets()
        pname = r.str("preset")
        if pname not in presets:
            raise SpecError("unknown model preset" + _suggest(pname, sorted(presets)), field=f"{path}.preset",
                            found=pname, allowed=", ".join(sorted(presets)) + "; or hf_config: path/to/config.json")
        base = {f.name: getattr(presets[pname], f.name) for f in fields(ModelSpec)}
    else:
        r.used.add("preset")
    if r.has("hf_config"):
        from .hfconfig import read_hf_config
        where = Path(os.path.expanduser(r.str("hf_config")))
        if not where.is_absolute() and base_dir is not None:
            where = Path(base_dir) / where
        base = read_hf_config(where)
    else:
        r.used.add("hf_config")

    def get(kind: str, name: str, **kw: Any) -> Any:
        default = base.get(name, kw.pop("default", ...))
        return getattr(r, kind)(name, default, **kw)

    hidden = get("int", "hidden_size")
    heads = get("int", "num_attention_heads")
    activation = get("str", "activation", default="gelu")
    # the default FFN width: 4h for GELU, Llama's 8h/3 rounded up to 256 for SwiGLU
    if isinstance(hidden, int) and 0 < hidden <= MAX_HIDDEN:
        default_ffn = 4 * hidden if activation != "swiglu" else int(256 * math.ceil((8 * hidden / 3) / 256))
    else:
        default_ffn = 1
    defaults = {f.name: f.default for f in fields(ModelSpec)}
    extension = {name: get(kind, name, default=defaults[name]) for name, kind in _EXTENSION_KINDS.items()}
    m = _build(
        ModelSpec, path,
        name=get("str", "name", default=base.get("name", "custom")),
        num_layers=get("int", "num_layers"),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=get("int", "num_query_groups", default=heads),
        ffn_hidden_size=get("int", "ffn_hidden_size", default=default_ffn),
        vocab_size=get("int", "vocab_size"),
        seq_length=get("int", "seq_length"),
        activation=activation,
        tied_embeddings=get("bool", "tied_embeddings", default=True),
        position_embedding=get("str", "position_embedding", default="learned"),
        normalization=get("str", "normalization", default="layernorm"),
        add_bias_linear=get("bool", "add_bias_linear", default=True),
        moe_layer_freq=_layer_freq(r, base),
        **extension,
    )
    r.finish(MODEL_KEYS)
    return m


def _data_from(d: "_Reader | None") -> TrainData | None:
    if d is None:
        return None
    paths = d.raw("paths")
    if not isinstance(paths, list):
        raise SpecError("expected a list of dataset prefixes (optionally weight, prefix, ...)", field=d._p("paths"),
                        found=_short(paths))
    tok = d.sub("tokenizer", required=True)
    out = _build(TrainData, d.path, paths=tuple(str(p) for p in paths), tokenizer_type=tok.str("type"),
                 tokenizer_model=tok.str("model", None), vocab_file=tok.str("vocab_file", None),
                 merge_file=tok.str("merge_file", None), split=d.str("split", "969,30,1"))
    tok.finish(("type", "model", "vocab_file", "merge_file"))
    d.finish(("paths", "tokenizer", "split"))
    return out


def _lr_from(d: "_Reader | None") -> LRSchedule:
    if d is None:
        return LRSchedule()
    out = _build(LRSchedule, d.path, lr=d.float("lr", 1.0e-4), min_lr=d.float("min_lr", 0.0),
                 decay_style=d.str("decay_style", "linear"), warmup_iters=d.int("warmup_iters", 0),
                 decay_iters=d.int("decay_iters", None))
    d.finish(("lr", "min_lr", "decay_style", "warmup_iters", "decay_iters"))
    return out


def _checkpoint_from(d: "_Reader | None") -> Checkpointing | None:
    if d is None:
        return None
    out = _build(Checkpointing, d.path, save_dir=d.str("save", None), load_dir=d.str("load", None),
                 save_interval=d.int("interval", None))
    d.finish(("save", "load", "interval"))
    return out


def _dist_opt(r: "_Reader") -> "bool | str":
    """A job's ``distributed_optimizer``: true, false or ``both`` (searched)."""
    v = r.raw("distributed_optimizer", True)
    if not isinstance(v, bool) and v != "both":
        raise SpecError("expected true, false or both (the search tries each plan with and without it)",
                        field="distributed_optimizer", found=_short(v), allowed="true, false, both")
    return v


def _degrees_from(r: "_Reader") -> dict[str, tuple]:
    """The degree lists of a site or job mapping (:data:`DEGREE_KEYS`), as given (checked by the spec)."""
    out = {}
    for name in DEGREE_KEYS:
        v = r.raw(name, [])
        if isinstance(v, bool) or not isinstance(v, (list, int)):
            raise SpecError("expected a list of whole numbers >= 1", field=name, found=_short(v))
        out[name] = tuple(v) if isinstance(v, list) else (v,)
    return out


def _fp8_of(r: "_Reader") -> str:
    """``fp8``: a format (FP8_FORMATS), or none / false / absent for no FP8."""
    v = r.raw("fp8", None)
    if v is None or v is False or v == "none":
        return ""
    if not isinstance(v, str) or v not in FP8_FORMATS:
        raise SpecError("unknown FP8 format", field="fp8", found=_short(v), allowed=", ".join(("none",) + FP8_FORMATS))
    return v


def job_from_mapping(data: Any, *, source_file: str | None = None) -> TrainJob:
    """Map a job document to :class:`TrainJob` keyword arguments (the TrainJob checks them)."""
    r = _Reader(data, "", kind="a job mapping with 'model' and 'global_batch_size'")
    model = model_from_mapping(r.raw("model"), "model",
                               base_dir=Path(source_file).parent if source_file else None)
    mbs = r.raw("micro_batch_sizes", [])
    if not isinstance(mbs, list):
        raise SpecError("expected a list of whole numbers >= 1", field="micro_batch_sizes", found=_short(mbs))
    job = _build(
        TrainJob, "",
        name=r.str("name", model.name),
        model=model,
        global_batch_size=r.int("global_batch_size"),
        precision=r.str("precision", "bf16"),
        optimizer=r.str("optimizer", "adam"),
        distributed_optimizer=_dist_opt(r) is not False,
        distributed_optimizer_searched=_dist_opt(r) == "both",
        attention=r.str("attention", "sdpa"),
        # kept in file order here, so an error names the entry as written
        micro_batch_sizes=tuple(mbs),
        recompute_modes=r.str_list("recompute_modes", RECOMPUTE_MODES),
        recompute_modes_given=r.has("recompute_modes"),
        train_iters=r.int("train_iters", None),
        train_samples=r.int("train_samples", None),
        train_tokens=r.int("train_tokens", None),
        log_interval=r.int("log_interval", 10),
        eval_interval=r.int("eval_interval", 1000),
        eval_iters=r.int("eval_iters", 10),
        max_pipeline_stages=r.int("max_pipeline_stages", None),
        **_degrees_from(r),
        fp8=_fp8_of(r),
        fp8_recipe=r.str("fp8_recipe", "delayed"),
        grad_reduce_in_fp32=r.bool("grad_reduce_in_fp32", True),
        fp8_param_gather=r.bool("fp8_param_gather", False),
        data=_data_from(r.sub("data")),
        lr_schedule=_lr_from(r.sub("lr_schedule")),
        checkpoint=_checkpoint_from(r.sub("checkpoint")),
        source_file=source_file,
    )
    r.finish(JOB_KEYS)
    return replace(job, micro_batch_sizes=tuple(sorted(set(job.micro_batch_sizes))),
                   **{n: tuple(sorted(set(getattr(job, n)))) for n in DEGREE_KEYS})


def job_for_model(model: ModelSpec, global_batch_size: int, **kw: Any) -> TrainJob:
    """A job for a model built in code (tests, benchmarks)."""
    return TrainJob(name=kw.pop("name", model.name), model=model, global_batch_size=global_batch_size, **kw)
