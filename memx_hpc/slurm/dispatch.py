"""Profiling jobs through submitit: one job array per partition and task shape, retried, resumable.

``profile(site, job, store)`` finds the minimal-set points the store lacks, packs them
into tasks (one GPU type, a few points, the ranks they need), and submits them:

* **Executor.** ``site.scheduler``: ``slurm`` -> submitit's ``SlurmExecutor``; ``local``
  -> ``LocalExecutor``; ``auto`` -> Slurm when ``sinfo`` answers within a few seconds,
  else local. Never ``AutoExecutor`` (it picks Slurm wherever ``sbatch`` exists).
  Executors are built at the edge, one per submission, so that one partition's
  parameters never leak into another's (``update_parameters`` keeps earlier ones).
* **Requests.** One ``map_array`` per (partition, ranks, nodes), asking Slurm for what
  :class:`~memx_hpc.slurm.request.SlurmRequest` makes of the site, the partition and the
  task's size (GPUs, memory, account, QoS, time, container, setup and environment), the
  same request a rendered script's ``#SBATCH`` lines come from. Multi-rank points (TP > 1,
  collectives) run as multi-task jobs.
* **Failures.** A task that raises, times out, is cancelled or preempted, or whose node
  fails is resubmitted up to ``max_retries`` times with each reason kept; a point that
  raises inside a task is retried alone. Out of memory is a result (the runner stores
  ``infeasible=True``); a single-point job that Slurm kills for memory is stored so too.
* **Ledger.** ``<store>.jobs.json`` (written atomically) records every submitted task:
  job id, folder, points, state. A rerun after Ctrl-C or a crash re-attaches to tasks
  that are still queued or running and collects those that finished, so nothing that
  finished or still runs is submitted again; the store drops exact duplicates.
* **Progress** on stderr while jobs run.

Only this process writes the store (it holds the writer lock for the whole run); the
tasks return samples, they never open the store.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ..errors import SpecError, SystemFailure
from ..profile.points import estimate_seconds, full_grid, grid_axes, layer_points, minimal_set, missing_points
from ..profile.runner import ProfileTask, RunSettings, TaskResult, world_size_of
from ..profile.store import ProfileStore
from ..spec import LayerSample, Partition, ProfilePoint, Site, TrainJob, find_relative_to_site, load_json
from .render import transformer_impl_of
from .request import SlurmRequest

__all__ = ["ProfileReport", "Failure", "GpuTypePlan", "PlannedTask", "profile", "plan_tasks", "choose_scheduler",
           "resolve_python", "LEDGER_VERSION"]

LEDGER_VERSION = 1
#: Points per task: each task pays a Python start and torch/megatron import (seconds),
#: so small points are packed; a task should still finish well inside its time limit.
POINTS_PER_TASK = 6


# --------------------------------------------------------------------------- report types


@dataclass(frozen=True, kw_only=True)
class Failure:
    """A point (or a whole task when ``point`` is None) that did not produce a sample."""

    point: ProfilePoint | None
    partition: str
    reason: str
    attempts: int


@dataclass(frozen=True, kw_only=True)
class GpuTypePlan:
    """Per GPU type: the minimal set against the full grid, and what this run schedules."""

    gpu_type: str
    full_grid_points: int
    full_grid_layer_points: int
    minimal_points: int
    minimal_layer_points: int
    missing_points: int
    est_full_grid_gpu_s: float
    est_minimal_gpu_s: float
    est_missing_gpu_s: float


@dataclass(frozen=True, kw_only=True)
class PlannedTask:
    """One array task: a partition, its ranks, and the points it measures."""

    partition: str
    gpu_type: str
    world_size: int
    nodes: int
    points: tuple[ProfilePoint, ...]
    measure_device: bool = False


@dataclass(frozen=True, kw_only=True)
class ProfileReport:
    """What a profiling run did (or, dry run, would do)."""

    scheduled: int  # points submitted or re-attached in this run
    measured: int  # feasible samples stored
    infeasible: int  # samples stored as out of memory
    failed: int  # points without a sample after all retries
    skipped: int  # minimal-set points the store already had
    failures: tuple[Failure, ...] = ()
    plans: tuple[GpuTypePlan, ...] = ()
    tasks: tuple[PlannedTask, ...] = ()
    job_ids: tuple[str, ...] = ()
    scheduler: str = ""
    dry_run: bool = False
    wall_s: float = 0.0

    def to_json(self) -> dict:
        def pt(p: ProfilePoint | None) -> dict | None:
            return None if p is None else _point_dict(p)

        return {
            "scheduled": self.scheduled, "measured": self.measured, "infeasible": self.infeasible,
            "failed": self.failed, "skipped": self.skipped, "scheduler": self.scheduler, "dry_run": self.dry_run,
            "wall_s": round(self.wall_s, 3), "job_ids": list(self.job_ids),
            "failures": [{"point": pt(f.point), "partition": f.partition, "reason": f.reason, "attempts": f.attempts}
                         for f in self.failures],
            "gpu_types": [asdict(p) for p in self.plans],
            "tasks": [{"partition": t.partition, "gpu_type": t.gpu_type, "world_size": t.world_size, "nodes": t.nodes,
                       "points": len(t.points), "measure_device": t.measure_device} for t in self.tasks],
        }


def _point_dict(p: ProfilePoint) -> dict:
    d = asdict(p)
    d["shape"] = dict(d["shape"])
    return d


def point_key(p: ProfilePoint) -> str:
    """A stable identity of a point (not Python's hash(): stable across processes)."""
    return hashlib.sha256(json.dumps(_point_dict(p), sort_keys=True).encode()).hexdigest()[:24]


def _point_from_dict(d: dict) -> ProfilePoint:
    from ..spec import LayerShape

    d = dict(d)
    d["shape"] = LayerShape(**d["shape"])
    return ProfilePoint(**d)


# --------------------------------------------------------------------------- planning


def _partitions_of(site: Site, gpu_type: str, allowed: Sequence[str] | None) -> list[Partition]:
    return [p for p in site.partitions if site.gpu(p.gpu_type).name == gpu_type
            and (allowed is None or p.name in allowed)]


def _nodes_for(point: ProfilePoint) -> int:
    return 2 if point.kind == "p2p" and point.inter_node else 1


def plan_tasks(site: Site, points: Iterable[ProfilePoint], *, partitions: Sequence[str] | None = None,
               store: ProfileStore | None = None, points_per_task: int = POINTS_PER_TASK
               ) -> tuple[list[PlannedTask], list[Failure]]:
    """Pack points into tasks: by GPU type and rank shape, spread over the partitions that
    carry the type (round robin, so same-type partitions profile in parallel)."""
    groups: dict[tuple[str, int, int], list[ProfilePoint]] = {}
    for p in points:
        groups.setdefault((p.gpu_type, world_size_of(p), _nodes_for(p)), []).append(p)
    tasks: list[PlannedTask] = []
    unplaceable: list[Failure] = []
    figures_planned: set[str] = set()
    for (gpu, world, nodes), pts in groups.items():
        cands = [q for q in _partitions_of(site, gpu, partitions)
                 if q.nodes >= nodes and q.gpus_per_node * nodes >= world and (world // nodes) <= q.gpus_per_node]
        if not cands:
            for p in pts:
                unplaceable.append(Failure(point=p, partition="", attempts=0,
                                           reason=f"no partition of {gpu} offers {world} devices on {nodes} node(s)"))
            continue
        # as many tasks as the size limit needs, at least one per candidate partition (when
        # there are points enough), points dealt out evenly so the tasks end together
        n = max(min(len(cands), len(pts)), -(-len(pts) // points_per_task))
        chunks = [pts[i::n] for i in range(n)]
        for i, chunk in enumerate(chunks):
            q = cands[i % len(cands)]
            g = site.gpu(gpu)
            measure = (g.measured_at_profile_time and g.vendor == "cpu" and gpu not in figures_planned
                       and world == 1 and (store is None or store.device_figures(gpu) is None))
            if measure:
                figures_planned.add(gpu)
            tasks.append(PlannedTask(partition=q.name, gpu_type=gpu, world_size=world, nodes=nodes,
                                     points=tuple(chunk), measure_device=measure))
    return tasks, unplaceable


def _gpu_plans(site: Site, job: TrainJob, missing: list[ProfilePoint], only: set[str]) -> list[GpuTypePlan]:
    full, mini = full_grid(site, job), minimal_set(site, job)
    out = []
    for ax in grid_axes(site, job):
        g = ax.gpu_type
        if g not in only:
            continue
        f = [p for p in full if p.gpu_type == g]
        m = [p for p in mini if p.gpu_type == g]
        x = [p for p in missing if p.gpu_type == g]
        out.append(GpuTypePlan(
            gpu_type=g, full_grid_points=len(f), full_grid_layer_points=len(layer_points(f)),
            minimal_points=len(m), minimal_layer_points=len(layer_points(m)), missing_points=len(x),
            est_full_grid_gpu_s=sum(estimate_seconds(site, p) for p in f),
            est_minimal_gpu_s=sum(estimate_seconds(site, p) for p in m),
            est_missing_gpu_s=sum(estimate_seconds(site, p) for p in x)))
    return out


# --------------------------------------------------------------------------- executors


def choose_scheduler(site: Site, *, timeout_s: float = 5.0) -> str:
    """``slurm`` or ``local`` for this site (``auto``: Slurm when ``sinfo`` answers)."""
    if site.scheduler in ("slurm", "local"):
        return site.scheduler
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return "local"
    try:
        r = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=timeout_s,
                           stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "local"
    return "slurm" if r.returncode == 0 and r.stdout.strip() else "local"


def resolve_python(site: Site, partition: Partition) -> str:
    """The partition's Python: absolute as given; a bare name from PATH on the node; a
    relative path from the site file's folder or the folders above it (a repository's
    ``.venv/bin/python`` named in ``site_configs/local.yaml``), else as given. The partition
    checked it is a path (memx_hpc.shellsafe): no shell words, no variables."""
    py = partition.python
    if os.path.isabs(py) or "/" not in py:
        return py
    found = find_relative_to_site(py, site.source_file)  # the rule the site loader checks
    return str(found) if found is not None else py


def _make_executor(kind: str, folder: Path, python: str) -> Any:
    import submitit

    if kind == "slurm":
        try:
            return submitit.SlurmExecutor(folder=folder, python=python, max_num_timeout=0)
        except RuntimeError as e:
            raise SystemFailure(f"cannot use Slurm: {e}") from None
    return submitit.LocalExecutor(folder=folder, python=python)


def _submit(kind: str, site: Site, folder: Path, tasks: list[PlannedTask], run_tasks: list[ProfileTask]) -> list[Any]:
    """Submit tasks of one (partition, ranks, nodes) shape as one job array."""
    t = tasks[0]
    part = site.partition(t.partition)
    request = SlurmRequest.of(site, part, nodes=t.nodes, tasks_per_node=t.world_size // t.nodes,
                              job_name=f"memx-profile-{t.gpu_type}")
    ex = _make_executor(kind, folder, request.submitit_python(resolve_python(site, part)))
    ex.update_parameters(**(request.submitit_parameters() if kind == "slurm" else request.local_parameters()))
    try:
        return list(ex.map_array(_run_task_entry, run_tasks))
    except Exception as e:  # noqa: BLE001 - sbatch refusal, missing partition, ...
        raise SystemFailure(f"submitting {len(tasks)} profiling task(s) to partition {part.name} failed: "
                            f"{str(e).strip()[:500]}") from None


def _run_task_entry(task: ProfileTask) -> TaskResult:
    """What submitit pickles and runs on the node (a plain module-level function)."""
    from ..profile.runner import run_task

    with _one_cpu_measurement_at_a_time(task):
        return run_task(task)


#: Host-wide lock file of CPU "device" measurements (see _one_cpu_measurement_at_a_time).
CPU_LOCK = Path(tempfile.gettempdir()) / "memx-hpc-cpu-profile.lock"


@contextlib.contextmanager
def _one_cpu_measurement_at_a_time(task: ProfileTask):
    """CPU devices of one host share its cores: tasks profiling them concurrently (the
    local executor starts every task at once; the local cluster's fake nodes all live on
    one host) would time each other's contention. Rank 0 of each CPU task holds a host-wide
    lock while the task runs, so one task measures at a time; the other ranks of a
    multi-rank task follow their rank 0 through the rendezvous. GPU tasks do not lock:
    each owns its devices."""
    if task.vendor != "cpu":
        yield
        return
    from ..profile.runner import _rank_world

    if _rank_world()[0] != 0:
        yield
        return
    import fcntl

    with open(CPU_LOCK, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _job_object(kind: str, folder: str, job_id: str, ntasks: int) -> Any:
    if kind == "slurm":
        from submitit.slurm.slurm import SlurmJob

        return SlurmJob(folder=folder, job_id=job_id, tasks=tuple(range(ntasks)))
    from submitit.local.local import LocalJob

    return LocalJob(folder=folder, job_id=job_id, tasks=tuple(range(ntasks)))


# --------------------------------------------------------------------------- the ledger


class _Ledger:
    """The job ledger next to the store: JSON, replaced atomically on every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"version": LEDGER_VERSION, "tasks": {}}

    def load(self) -> "_Ledger":
        """Read the ledger; one of the wrong shape (damaged, hand-edited) is a fault naming the
        file and the entry, never a KeyError half way through a run."""
        if not self.path.exists():
            return self
        try:
            data = load_json(self.path)
        except SpecError as e:
            raise SystemFailure(f"job ledger {self.path} is unreadable ({e.detail}); remove it to start "
                                "afresh (running jobs are then not re-attached)") from None
        self.data = _check_ledger(data, self.path)
        return self

    def save(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise SystemFailure(f"job ledger {self.path}: cannot write it: {e.strerror or e}") from None

    @property
    def tasks(self) -> dict[str, dict]:
        return self.data["tasks"]


#: What a ledger entry must hold to re-attach to its job, with the type each has.
_LEDGER_ENTRY = {"job_id": str, "executor": str, "folder": str, "partition": str, "gpu_type": str,
                 "world_size": int, "nodes": int, "points": list, "point_data": list, "state": str}


def _check_ledger(data: Any, path: Path) -> dict:
    def bad(field: str, what: str, found: Any = None) -> SystemFailure:
        shown = "" if found is None else f" (found {str(found)[:60]!r})"
        return SystemFailure(f"job ledger {path}: {field}: {what}{shown}; remove the file to start afresh "
                             "(running jobs are then not re-attached)")

    if not isinstance(data, dict):
        raise bad("(top level)", "expected a mapping", type(data).__name__)
    if data.get("version") != LEDGER_VERSION:
        raise bad("version", f"unsupported job ledger version (this code writes {LEDGER_VERSION})", data.get("version"))
    tasks = data.get("tasks")
    if not isinstance(tasks, dict):
        raise bad("tasks", "expected a mapping of job id to entry", type(tasks).__name__)
    for key, rec in tasks.items():
        if not isinstance(rec, dict):
            raise bad(f"tasks.{key}", "expected a mapping", type(rec).__name__)
        if rec.get("state") != "submitted":
            continue  # finished entries are history: only submitted ones are read back
        for name, kind in _LEDGER_ENTRY.items():
            v = rec.get(name)
            if not isinstance(v, kind) or isinstance(v, bool):
                raise bad(f"tasks.{key}.{name}", f"expected {kind.__name__}", v)
        if not all(isinstance(k, str) for k in rec["points"]):
            raise bad(f"tasks.{key}.points", "expected point keys (strings)")
        for i, d in enumerate(rec["point_data"]):
            try:
                _point_from_dict(d)
            except (SpecError, TypeError, ValueError, KeyError) as e:
                raise bad(f"tasks.{key}.point_data[{i}]", f"not a profile point ({e})") from None
    return data


# --------------------------------------------------------------------------- running


@dataclass(kw_only=True)
class _Active:
    """A submitted task being watched (mutable bookkeeping of this run only)."""

    key: str
    job: Any
    planned: PlannedTask
    attempt: int


class _Progress:
    """A progress bar on stderr (one redrawn line on a terminal, a line per change elsewhere)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total = enabled, total
        self.tty = sys.stderr.isatty()
        self.last: tuple = ()
        self.t0 = time.monotonic()

    def show(self, done: int, running: int, failed: int, retrying: int) -> None:
        if not self.enabled:
            return
        state = (done, running, failed, retrying)
        if not self.tty and state == self.last:
            return
        self.last = state
        width = 24
        filled = int(width * done / self.total) if self.total else width
        line = (f"profile [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} points, "
                f"{running} task(s) running, {retrying} retrying, {failed} failed, "
                f"{time.monotonic() - self.t0:.0f}s")
        sys.stderr.write(("\r" + line) if self.tty else (line + "\n"))
        sys.stderr.flush()

    def end(self) -> None:
        if self.enabled and self.tty and self.last:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _job_state(job: Any) -> str:
    with contextlib.suppress(Exception):
        return str(job.state)
    return "UNKNOWN"


def _oom_state(state: str) -> bool:
    return "OUT_OF_MEMORY" in state.upper() or state.upper().startswith("OOM")


def profile(site: Site, job: TrainJob, store: ProfileStore, *, partitions: Sequence[str] | None = None,
            dry_run: bool = False, progress: bool = True, max_retries: int = 2,
            settings: RunSettings | None = None, scheduler: str | None = None, poll_s: float = 1.0,
            points_per_task: int = POINTS_PER_TASK,
            on_submit: Callable[[list[str]], None] | None = None) -> ProfileReport:
    """Measure the minimal-set points the store lacks on the site's partitions.

    ``partitions`` limits the run to some partitions (and their GPU types); ``dry_run``
    plans and estimates without submitting; ``scheduler`` overrides the site's choice
    (``slurm`` | ``local``); ``on_submit`` is told the job ids of each submission.
    """
    t0 = time.monotonic()
    if max_retries < 0:
        raise SpecError("max_retries must be >= 0", field="max_retries", found=max_retries)
    if partitions is not None:
        partitions = list(partitions)
        for name in partitions:
            site.partition(name)  # unknown names: SpecError listing the valid ones
    settings = settings or RunSettings()
    only = {site.gpu(p.gpu_type).name for p in site.partitions if partitions is None or p.name in partitions}
    chosen = [p for p in minimal_set(site, job) if p.gpu_type in only]
    missing = [p for p in missing_points(site, job, store) if p.gpu_type in only]
    skipped = len(chosen) - len(missing)
    plans = _gpu_plans(site, job, missing, only)
    tasks, unplaceable = plan_tasks(site, missing, partitions=partitions, store=store,
                                    points_per_task=points_per_task)
    if dry_run:
        return ProfileReport(scheduled=0, measured=0, infeasible=0, failed=len(unplaceable), skipped=skipped,
                             failures=tuple(unplaceable), plans=tuple(plans), tasks=tuple(tasks), dry_run=True,
                             scheduler=scheduler or site.scheduler, wall_s=time.monotonic() - t0)
    kind = scheduler or choose_scheduler(site)
    if kind == "local":
        # one machine: no second node for inter-node points
        keep = []
        for t in tasks:
            if t.nodes > 1:
                unplaceable += [Failure(point=p, partition=t.partition, attempts=0,
                                        reason="inter-node point needs two nodes; the local executor has one")
                                for p in t.points]
            else:
                keep.append(t)
        tasks = keep
    folder = site.resolve(site.work_dir) / "profile"
    ledger = _Ledger(Path(str(store.path) + ".jobs.json"))
    with store.writer():
        ledger.load()
        return _run(site, store, ledger, kind, folder, tasks, missing, unplaceable, skipped, plans, settings,
                    max_retries=max_retries, progress=progress, poll_s=poll_s, t0=t0, on_submit=on_submit,
                    partitions=partitions, points_per_task=points_per_task)


def _run(site: Site, store: ProfileStore, ledger: _Ledger, kind: str, folder: Path, tasks: list[PlannedTask],
         missing: list[ProfilePoint], unplaceable: list[Failure], skipped: int, plans: list[GpuTypePlan],
         settings: RunSettings, *, max_retries: int, progress: bool, poll_s: float, t0: float,
         on_submit: Callable[[list[str]], None] | None, partitions: Sequence[str] | None,
         points_per_task: int) -> ProfileReport:
    folder.mkdir(parents=True, exist_ok=True)
    missing_keys = {point_key(p) for p in missing}
    active: list[_Active] = []
    attempts: dict[str, int] = {}
    reasons: dict[str, list[str]] = {}
    job_ids: list[str] = []
    counts = {"measured": 0, "infeasible": 0}
    final_failures: list[Failure] = list(unplaceable)

    # Re-attach to what an earlier run left queued, running or finished-but-uncollected.
    covered: set[str] = set()
    for key, rec in ledger.tasks.items():
        if rec.get("state") != "submitted" or rec.get("executor") != kind:
            continue
        pkeys = set(rec["points"])
        if not pkeys & missing_keys:
            rec["state"] = "collected"
            continue
        if kind == "local" and not _local_alive_or_done(rec):
            rec["state"] = "lost"
            continue
        planned = PlannedTask(partition=rec["partition"], gpu_type=rec["gpu_type"], world_size=rec["world_size"],
                              nodes=rec["nodes"], points=tuple(_point_from_dict(d) for d in rec["point_data"]),
                              measure_device=rec.get("measure_device", False))
        active.append(_Active(key=key, job=_job_object(kind, rec["folder"], rec["job_id"], rec["world_size"]),
                              planned=planned, attempt=rec.get("attempt", 1)))
        covered |= pkeys
        job_ids.append(rec["job_id"])
    ledger.save()
    to_submit: list[PlannedTask] = []
    for t in tasks:
        rest = tuple(p for p in t.points if point_key(p) not in covered)
        if rest:
            to_submit.append(replace(t, points=rest))
    scheduled = len(covered & missing_keys) + sum(len(t.points) for t in to_submit)
    total = scheduled
    done_points = 0
    bar = _Progress(progress, total)

    def submit(batch: list[PlannedTask], attempt_of: Callable[[PlannedTask], int]) -> None:
        shapes: dict[tuple[str, int, int], list[PlannedTask]] = {}
        for t in batch:
            shapes.setdefault((t.partition, t.world_size, t.nodes), []).append(t)
        for (pname, _w, _n), group in shapes.items():
            run_tasks = [ProfileTask(gpu_type=t.gpu_type, vendor=site.gpu(t.gpu_type).vendor,
                                     memory_cap_bytes=site.gpu(t.gpu_type).memory_bytes, points=t.points,
                                     world_size=t.world_size, nodes=t.nodes, settings=settings,
                                     rendezvous_dir=str(folder), measure_device=t.measure_device, label=pname,
                                     transformer_impl=transformer_impl_of(site.partition(pname),
                                                                          site.gpu(t.gpu_type).vendor))
                         for t in group]
            jobs = _submit(kind, site, folder, group, run_tasks)
            ids = [str(j.job_id) for j in jobs]
            for t, j in zip(group, jobs):
                key = f"{j.job_id}"
                a = attempt_of(t)
                ledger.tasks[key] = {
                    "job_id": str(j.job_id), "executor": kind, "folder": str(folder), "partition": t.partition,
                    "gpu_type": t.gpu_type, "world_size": t.world_size, "nodes": t.nodes,
                    "measure_device": t.measure_device, "points": [point_key(p) for p in t.points],
                    "point_data": [_point_dict(p) for p in t.points], "state": "submitted", "attempt": a,
                    "submitted_at": time.time(), "pid": os.getpid(), "reasons": []}
                active.append(_Active(key=key, job=j, planned=t, attempt=a))
            job_ids.extend(ids)
            ledger.save()
            if on_submit:
                on_submit(ids)

    submit(to_submit, lambda t: 1)
    try:
        while active:
            bar.show(done_points, len(active), len(final_failures) - len(unplaceable),
                     sum(1 for a in active if a.attempt > 1))
            time.sleep(poll_s)
            retry: list[tuple[ProfilePoint, int, str]] = []
            still: list[_Active] = []
            for a in active:
                if not _finished(a.job, kind):
                    still.append(a)
                    continue
                rec = ledger.tasks.get(a.key, {})
                try:
                    # a multi-task job returns one result per rank; rank 0 holds the samples
                    res: TaskResult = a.job.results()[0] if a.planned.world_size > 1 else a.job.result()
                except Exception as e:  # noqa: BLE001 - every way a task can end without a result
                    state = _job_state(a.job)
                    reason = _reason(e, state)
                    rec.update(state="failed", reasons=rec.get("reasons", []) + [reason])
                    if _oom_state(state) and len(a.planned.points) == 1:
                        p = a.planned.points[0]
                        store.append([_oom_sample(p, state, a.job.job_id)])
                        counts["infeasible"] += 1
                        done_points += 1
                    else:
                        retry += [(p, a.attempt, reason) for p in a.planned.points]
                    continue
                store.append(res.samples)  # exact duplicates (a re-collected result) are dropped
                if res.device_figures:
                    store.set_device_figures(a.planned.gpu_type, res.device_figures)
                for s in res.samples:
                    counts["infeasible" if s.infeasible else "measured"] += 1
                done_points += len(res.samples)
                retry += [(f.point, a.attempt, f.reason) for f in res.failures]
                # what the task really cost: its run time on the node (rank 0), times its ranks
                rec.update(state="collected", failures=[f.reason for f in res.failures], wall_s=round(res.wall_s, 3),
                           collected_at=time.time())
            active = still
            ledger.save()
            if retry:
                again: list[PlannedTask] = []
                for p, att, reason in retry:
                    k = point_key(p)
                    reasons.setdefault(k, []).append(reason)
                    attempts[k] = att
                    if att > max_retries:
                        final_failures.append(Failure(point=p, partition=_partition_hint(site, p, partitions),
                                                      reason=" | ".join(reasons[k]), attempts=att))
                        done_points += 1
                    else:
                        again.append(p)
                if again:
                    planned, unpl = plan_tasks(site, again, partitions=partitions, store=store,
                                               points_per_task=points_per_task)
                    final_failures += unpl
                    submit(planned, lambda t: max(attempts[point_key(p)] for p in t.points) + 1)
        bar.show(done_points, 0, len(final_failures) - len(unplaceable), 0)
    finally:
        bar.end()
        ledger.save()
    return ProfileReport(scheduled=scheduled, measured=counts["measured"], infeasible=counts["infeasible"],
                         failed=len(final_failures), skipped=skipped, failures=tuple(final_failures),
                         plans=tuple(plans), tasks=tuple(tasks), job_ids=tuple(dict.fromkeys(job_ids)),
                         scheduler=kind, wall_s=time.monotonic() - t0)


def _partition_hint(site: Site, p: ProfilePoint, partitions: Sequence[str] | None) -> str:
    parts = _partitions_of(site, p.gpu_type, partitions)
    return parts[0].name if parts else ""


def _finished(job: Any, kind: str) -> bool:
    if kind == "local" and getattr(job, "_process", None) is None:
        # re-attached local job: its result file is the only sign
        return job.paths.result_pickle.exists() or not _pid_alive_from_job(job)
    try:
        return bool(job.done())
    except Exception:  # noqa: BLE001 - a watcher hiccup: look again next round
        return False


def _pid_alive_from_job(job: Any) -> bool:
    try:
        pid = int(str(job.job_id).split("_")[0])
        os.kill(pid, 0)
        return True
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True


def _local_alive_or_done(rec: dict) -> bool:
    job = _job_object("local", rec["folder"], rec["job_id"], rec["world_size"])
    return job.paths.result_pickle.exists() or _pid_alive_from_job(job)


_EXC_LINE = re.compile(r"^([\w.]+(?:Error|Exception|Failure|Interrupt|Exit))\b(.*)$")
_STATE = re.compile(r"\(state: ([A-Z_]+)")


def _reason(e: BaseException, state: str) -> str:
    """One line: the Slurm state and the exception the task ended with.

    submitit's FailedJobError carries the remote traceback (its last exception line is
    the cause); UncompletedJobError names the state and the end of the error stream."""
    text = str(e)
    m = _STATE.search(text)
    if m:
        state = m.group(1)
    lines = [ln.rstrip() for ln in text.splitlines()]
    exc = [ln for ln in lines if _EXC_LINE.match(ln.strip())]
    if exc:
        cause = exc[-1].strip()
    else:
        body = [ln.strip() for ln in lines if ln.strip() and not set(ln.strip()) <= {"-"}]
        cause = next((ln for ln in body[1:] if "srun:" not in ln), body[0] if body else "")
    return f"{state}: {type(e).__name__}: {cause[:300]}"


def _oom_sample(p: ProfilePoint, state: str, job_id: str) -> LayerSample:
    prov = json.dumps({"note": f"Slurm ended the job with {state}", "slurm_job_id": str(job_id)}, sort_keys=True)
    return LayerSample(point=p, infeasible=True, origin="measured", source=f"slurm:{job_id}", provenance=prov)
