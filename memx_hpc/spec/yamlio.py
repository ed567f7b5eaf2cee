"""Bounded reading of YAML and JSON documents, and of the regular files that hold them.

Site and job files are YAML read by a bounded safe loader: size, nesting depth and the
count of values (YAML nodes, aliases expanded: a "billion laughs" is refused) are limited,
and a key given twice is refused (PyYAML would keep the last one silently). JSON is read
with the same bounds. :class:`_Reader` maps one mapping of a document to Python values,
tracking the field path for errors; unknown keys are rejected with the nearest valid name
suggested.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import warnings
from typing import Any, Iterable, Mapping

import yaml

from ..errors import SpecError
from .checks import _ENV_NAME, MAX_GBPS, MIN_RATE, _choice, _real, _short, _suggest, _wrap_file

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
    """Refuse a node graph of more than MAX_EXPANDED_NODES values (aliases expanded) or
    deeper than MAX_DEPTH. The error names the field whose values pass the bound and says
    whether aliases made it so: a plain list of 10^5 partitions is too large by itself."""
    sizes: dict[int, tuple[int, int]] = {}
    active: set[int] = set()
    aliased = False

    def walk(node: Any, path: str) -> tuple[int, int]:
        nonlocal aliased
        key = id(node)
        if key in sizes:
            aliased = True  # a node met twice is an alias's target
            return sizes[key]
        if key in active:
            raise SpecError(f"a recursive alias at line {node.start_mark.line + 1}", field=path or None)
        active.add(key)
        if isinstance(node, yaml.SequenceNode):
            children = [(c, f"{path}[{i}]") for i, c in enumerate(node.value)]
        elif isinstance(node, yaml.MappingNode):
            children = []
            for k, v in node.value:
                name = str(k.value)[:80] if isinstance(k, yaml.ScalarNode) else "?"
                children += [(k, path), (v, f"{path}.{name}" if path else name)]
        else:
            children = []
        count, depth = 1, 1
        for child, where in children:
            c, d = walk(child, where)
            count += c
            depth = max(depth, d + 1)
            if count > MAX_EXPANDED_NODES or depth > MAX_DEPTH:
                raise _too_large(node, path, count > MAX_EXPANDED_NODES, aliased)
        active.discard(key)
        sizes[key] = (count, depth)
        return count, depth

    walk(root, "")


def _too_large(node: Any, path: str, too_many: bool, aliased: bool) -> SpecError:
    line = node.start_mark.line + 1
    if aliased:
        what = f"more than {MAX_EXPANDED_NODES:,} values or {MAX_DEPTH} levels"
        return SpecError(f"aliases expand to {what} (from line {line})", field=path or None)
    if too_many:
        entries = f" ({len(node.value):,} entries from line {line})" if isinstance(node, yaml.SequenceNode) else ""
        return SpecError(f"the document holds more than {MAX_EXPANDED_NODES:,} values (YAML nodes){entries}",
                         field=path or None, allowed=f"at most {MAX_EXPANDED_NODES:,} values in one file")
    return SpecError(f"nested deeper than {MAX_DEPTH} levels (from line {line})", field=path or None)


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


