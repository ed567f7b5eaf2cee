"""The job ledger of profiling runs: what was submitted for which points, and how it ended.

``<store>.jobs.json`` beside the profile store, replaced atomically on every change. Each
entry is a :class:`LedgerEntry` (frozen): the job, its partition and ranks, the points it
measures, its state (``submitted``, then ``collected``, ``failed`` or ``lost``) and what
was learnt on the way (attempt, reasons, the task's run time). A later run re-attaches to
entries still ``submitted`` (:mod:`memx_hpc.profile.campaign`).

The file format (version 1) is the one earlier versions wrote: a mapping ``{"version": 1,
"tasks": {job id: entry}}``, each entry with the keys of :meth:`LedgerEntry.to_json`
(``points`` the points' keys, ``point_data`` the points themselves). A file of the wrong
shape is a :class:`~memx_hpc.errors.SystemFailure` naming the file and the entry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import SpecError, SystemFailure
from ..spec import LayerShape, ProfilePoint, load_json

__all__ = ["LEDGER_VERSION", "STATES", "LedgerEntry", "Ledger", "point_key", "point_to_json", "point_from_json"]

LEDGER_VERSION = 1
#: ``submitted``: queued or running (re-attached by a later run); ``collected``: its samples are
#: in the store; ``failed``: it ended without a result (its points retried); ``lost``: a local
#: task whose process died without a result.
STATES = ("submitted", "collected", "failed", "lost")


def point_to_json(p: ProfilePoint) -> dict:
    d = asdict(p)
    d["shape"] = dict(d["shape"])
    return d


def point_from_json(d: dict) -> ProfilePoint:
    d = dict(d)
    d["shape"] = LayerShape(**d["shape"])
    return ProfilePoint(**d)


def point_key(p: ProfilePoint) -> str:
    """A stable identity of a point (not Python's hash(): stable across processes)."""
    return hashlib.sha256(json.dumps(point_to_json(p), sort_keys=True).encode()).hexdigest()[:24]


@dataclass(frozen=True, kw_only=True)
class LedgerEntry:
    """One submitted task (an array element): where it runs, what it measures, how it ended."""

    job_id: str
    executor: str  # slurm | local
    folder: str  # submitit's folder of the job
    partition: str
    gpu_type: str
    world_size: int
    nodes: int
    points: tuple[ProfilePoint, ...]
    state: str = "submitted"
    attempt: int = 1
    measure_device: bool = False
    submitted_at: float | None = None  # time.time()
    pid: int | None = None  # the process that submitted it
    reasons: tuple[str, ...] = ()  # why it failed, one per failed attempt of this job
    failures: tuple[str, ...] = ()  # points that failed inside a collected task
    wall_s: float | None = None  # the task's run time on its node (rank 0)
    collected_at: float | None = None

    @property
    def point_keys(self) -> frozenset[str]:
        return frozenset(point_key(p) for p in self.points)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "job_id": self.job_id, "executor": self.executor, "folder": self.folder, "partition": self.partition,
            "gpu_type": self.gpu_type, "world_size": self.world_size, "nodes": self.nodes,
            "measure_device": self.measure_device, "points": [point_key(p) for p in self.points],
            "point_data": [point_to_json(p) for p in self.points], "state": self.state, "attempt": self.attempt,
            "submitted_at": self.submitted_at, "pid": self.pid, "reasons": list(self.reasons)}
        if self.state == "collected":
            d.update(failures=list(self.failures), wall_s=self.wall_s, collected_at=self.collected_at)
        return d


#: What every entry holds, with the type each has (what an earlier version always wrote).
_REQUIRED = {"job_id": str, "executor": str, "folder": str, "partition": str, "gpu_type": str,
             "world_size": int, "nodes": int, "points": list, "point_data": list, "state": str}
#: What an entry may hold: (type(s), default).
_OPTIONAL: dict[str, tuple[tuple[type, ...], Any]] = {
    "attempt": ((int,), 1), "measure_device": ((bool,), False), "submitted_at": ((int, float), None),
    "pid": ((int,), None), "reasons": ((list,), ()), "failures": ((list,), ()), "wall_s": ((int, float), None),
    "collected_at": ((int, float), None)}


class _Bad(Exception):
    def __init__(self, field: str, what: str, found: Any = None) -> None:
        super().__init__(field)
        self.field, self.what, self.found = field, what, found


def _entry_from_json(key: str, rec: Any) -> LedgerEntry:
    """The entry ``tasks.<key>`` of a ledger file; _Bad naming the field when it is not one."""
    here = f"tasks.{key}"
    if not isinstance(rec, dict):
        raise _Bad(here, "expected a mapping", type(rec).__name__)
    for name, kind in _REQUIRED.items():
        v = rec.get(name)
        if not isinstance(v, kind) or isinstance(v, bool):
            raise _Bad(f"{here}.{name}", f"expected {kind.__name__}", v)
    if rec["state"] not in STATES:
        raise _Bad(f"{here}.state", f"expected one of {', '.join(STATES)}", rec["state"])
    kw: dict[str, Any] = {}
    for name, (kinds, default) in _OPTIONAL.items():
        v = rec.get(name, default)
        if v is not None and v is not default and \
                (not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds)):
            raise _Bad(f"{here}.{name}", f"expected {' or '.join(k.__name__ for k in kinds)}", v)
        kw[name] = tuple(str(x) for x in v) if isinstance(v, (list, tuple)) else v
    points = []
    for i, d in enumerate(rec["point_data"]):
        try:
            points.append(point_from_json(d))
        except (SpecError, TypeError, ValueError, KeyError) as e:
            raise _Bad(f"{here}.point_data[{i}]", f"not a profile point ({e})") from None
    if not all(isinstance(k, str) for k in rec["points"]):
        raise _Bad(f"{here}.points", "expected point keys (strings)")
    return LedgerEntry(job_id=rec["job_id"], executor=rec["executor"], folder=rec["folder"],
                       partition=rec["partition"], gpu_type=rec["gpu_type"], world_size=rec["world_size"],
                       nodes=rec["nodes"], points=tuple(points), state=rec["state"], **kw)


class Ledger:
    """The job ledger next to the store: entries by job id, the file replaced atomically on
    every :meth:`save`. Only the process that holds the store's writer lock writes it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.entries: dict[str, LedgerEntry] = {}

    @classmethod
    def beside(cls, store_path: str | os.PathLike) -> "Ledger":
        """The ledger of the store at ``store_path`` (``<store>.jobs.json``)."""
        return cls(Path(str(store_path) + ".jobs.json"))

    def load(self) -> "Ledger":
        """Read the ledger; one of the wrong shape (damaged, hand-edited) is a fault naming the
        file and the entry, never a KeyError half way through a run."""
        if not self.path.exists():
            return self
        try:
            data = load_json(self.path)
        except SpecError as e:
            raise SystemFailure(f"job ledger {self.path} is unreadable ({e.detail}); remove it to start "
                                "afresh (running jobs are then not re-attached)") from None
        try:
            self.entries = self._entries_of(data)
        except _Bad as b:
            shown = "" if b.found is None else f" (found {str(b.found)[:60]!r})"
            raise SystemFailure(f"job ledger {self.path}: {b.field}: {b.what}{shown}; remove the file to start "
                                "afresh (running jobs are then not re-attached)") from None
        return self

    @staticmethod
    def _entries_of(data: Any) -> dict[str, LedgerEntry]:
        if not isinstance(data, dict):
            raise _Bad("(top level)", "expected a mapping", type(data).__name__)
        if data.get("version") != LEDGER_VERSION:
            raise _Bad("version", f"unsupported job ledger version (this code writes {LEDGER_VERSION})",
                       data.get("version"))
        tasks = data.get("tasks")
        if not isinstance(tasks, dict):
            raise _Bad("tasks", "expected a mapping of job id to entry", type(tasks).__name__)
        return {str(key): _entry_from_json(str(key), rec) for key, rec in tasks.items()}

    def put(self, entry: LedgerEntry) -> None:
        self.entries[entry.job_id] = entry

    def update(self, job_id: str, **changes: Any) -> LedgerEntry:
        """Replace entry ``job_id`` by a copy with ``changes``; returns the new entry."""
        entry = dataclasses.replace(self.entries[job_id], **changes)
        self.entries[job_id] = entry
        return entry

    def submitted(self, executor: str) -> list[LedgerEntry]:
        """The entries still queued or running on ``executor``, as an earlier run left them."""
        return [e for e in self.entries.values() if e.state == "submitted" and e.executor == executor]

    def save(self) -> None:
        data = {"version": LEDGER_VERSION, "tasks": {k: e.to_json() for k, e in self.entries.items()}}
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise SystemFailure(f"job ledger {self.path}: cannot write it: {e.strerror or e}") from None
