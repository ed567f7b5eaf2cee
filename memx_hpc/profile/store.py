"""The profile store: every measured, imported or augmented sample, in one HDF5 file.

End-to-end records (:class:`E2ERecord`) are short real training runs of a plan
(``memx-hpc verify``): iteration time and, per rank, peak allocated bytes and device
footprint, with the plan, the job's shape, the prediction made when the plan was chosen,
and provenance. They calibrate the predictor (:mod:`memx_hpc.model.calibrate`); they are
not training data of the predictor, so :meth:`ProfileStore.content_hash` covers layer
samples only and :meth:`ProfileStore.e2e_hash` covers the end-to-end records.

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

The file's columns, row codecs and table helpers are in :mod:`memx_hpc.profile.store_format`;
the writer lock in :mod:`memx_hpc.profile.store_lock`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from ..errors import SpecError, SystemFailure
from ..records import E2ERecord, records_hash  # noqa: F401 (re-exported)
from ..spec import LayerSample, LayerShape, ProfilePoint
# COLUMN_NAMES, Column and the codecs are re-exported: callers import them from here
from .store_format import (  # noqa: F401
    _CHUNK_SET_BYTES, _COMMITTED, _DIGESTS, _METADATA_BYTES, _SAMPLES_HASH_TAG, _WRITING, CHUNK_BYTES, CHUNK_ROWS,
    COLUMN_NAMES, COLUMNS, E2E_COLUMNS, FIGURE_KEYS, FORMAT_NAME, READABLE_VERSIONS, SCHEMA_VERSION, Column,
    StoreDamaged, StoreFull, _append_rows, _check_format, _check_gpu_name, _coerce, _coerce_column, _column,
    _commit, _e2e_digest, _new_table, _read_columns, _row_digest, _rows_bytes, _rows_of, _sample_group,
    _sample_of, _scalar, _table, _text_attr, record_to_row, row_to_record, row_to_sample, sample_to_row)
from . import snapshot
from .store_lock import StoreLocked, WriterLock, _fsync_dir, pid_alive  # noqa: F401 (pid_alive re-exported)

__all__ = ["SCHEMA_VERSION", "READABLE_VERSIONS", "COLUMNS", "E2E_COLUMNS", "E2ERecord", "ProfileStore",
           "StoreDamaged", "StoreFull", "StoreLocked", "check_store_path", "sample_to_row", "row_to_sample", "record_to_row", "row_to_record", "records_hash"]



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
        self._samples: tuple[LayerSample, ...] | None = None  # every sample of _cache, in stored order
        self._digest_key: tuple | None = None
        self._digest_cache: dict[str, set[bytes]] = {}

    def __repr__(self) -> str:
        return f"ProfileStore({str(self.path)!r})"

    # ------------------------------------------------------------------ reading

    def exists(self) -> bool:
        return self.path.exists()

    def _read(self) -> _Snapshot:
        if not check_store_path(self.path):
            self._samples = ()
            return _Snapshot(rows={}, figures={}, e2e=())
        key = self._stat_key()
        if key == self._cache_key and self._cache is not None:
            return self._cache
        # the parsed file as the last reader left it (<store>.snapshot), when it was built from
        # these very bytes by this very code; else read the HDF5 file and leave a new one
        digest = snapshot.store_digest(self.path)
        payload = snapshot.load(self.path, digest)
        if payload is not None:
            snap, self._samples = payload
        else:
            snap = self._read_file()
            self._samples = self._all_samples(snap)
            if self._stat_key() != key:  # written meanwhile: these rows may not be the hashed bytes
                self._cache_key, self._cache = None, None
                return snap
            snapshot.save(self.path, digest, (snap, self._samples))
        self._cache_key, self._cache = key, snap
        return snap

    def _all_samples(self, snap: _Snapshot) -> tuple[LayerSample, ...] | None:
        """Every sample of ``snap`` in stored order, or None where a row is no sample (a
        damaged store: :meth:`samples` then names the row when it is asked for)."""
        shapes: dict[tuple, LayerShape] = {}
        try:
            return tuple(_sample_of(row, shapes) for table in snap.rows.values() for row in table)
        except SpecError:
            return None

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
        if self._samples is not None:  # built once per store content (and kept in the snapshot)
            return [s for s in self._samples if (gpu_type is None or s.point.gpu_type == gpu_type)
                    and (kind is None or s.point.kind == kind) and (wanted is None or s.origin in wanted)]
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

    # ------------------------------------------------------------------ the lock (store_lock.py)

    def _lock(self) -> WriterLock:
        return WriterLock(store_path=self.path, lock_path=self.lock_path, timeout_s=self.lock_timeout_s)

    def _acquire(self) -> None:
        self._lock().acquire()

    def _release(self) -> None:
        self._lock().release()
