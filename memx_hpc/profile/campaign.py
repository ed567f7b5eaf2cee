"""The layer-profiling campaign: the minimal set the store lacks, measured as Slurm job arrays.

``profile(site, job, store)`` finds the minimal-set points the store lacks
(:mod:`memx_hpc.profile.points`), packs them into tasks (one GPU type, a few points, the
ranks they need), and runs them through :mod:`memx_hpc.slurm.arrays`:

* **Requests.** One array per (partition, ranks, nodes), asking Slurm for what
  :class:`~memx_hpc.slurm.request.SlurmRequest` makes of the site, the partition and the
  task's size (GPUs, memory, account, QoS, time, container, setup and environment), the
  same request a rendered script's ``#SBATCH`` lines come from. Multi-rank points (TP > 1,
  collectives) run as multi-task jobs; each task runs :func:`memx_hpc.profile.runner.run_task`.
* **Failures.** A task that raises, times out, is cancelled or preempted, or whose node
  fails is resubmitted up to ``max_retries`` times with each reason kept; a point that
  raises inside a task is retried alone. Out of memory is a result (the runner stores
  ``infeasible=True``); a single-point job that Slurm kills for memory is stored so too.
* **Ledger.** :mod:`memx_hpc.profile.ledger` (``<store>.jobs.json``, written atomically)
  records every submitted task. A rerun after Ctrl-C or a crash re-attaches to tasks that
  are still queued or running and collects those that finished, so nothing that finished
  or still runs is submitted again; the store drops exact duplicates.
* **CPU devices** of one host share its cores: one CPU task measures at a time (a host-wide
  lock), so tasks do not time each other's contention.
* **Progress** on stderr while jobs run.

Only this process writes the store (it holds the writer lock for the whole run); the
tasks return samples, they never open the store.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ..errors import SpecError
from ..slurm import arrays
from ..slurm.request import SlurmRequest
from ..spec import LayerSample, Partition, ProfilePoint, Provenance, Site, TrainJob, find_relative_to_site
from .ledger import Ledger, LedgerEntry, point_key, point_to_json
from .points import estimate_seconds, full_grid, grid_axes, layer_points, minimal_set, missing_points
from .runner import ProfileTask, RunSettings, TaskResult, world_size_of
from .store import ProfileStore

__all__ = ["ProfileReport", "Failure", "GpuTypePlan", "PlannedTask", "profile", "plan_tasks", "resolve_python",
           "point_key", "POINTS_PER_TASK", "CPU_LOCK"]

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
            return None if p is None else point_to_json(p)

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


# --------------------------------------------------------------------------- on the node


def _run_task_entry(task: ProfileTask) -> TaskResult:
    """What submitit pickles and runs on the node (a plain module-level function)."""
    from .runner import run_task

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
    from .runner import _rank_world

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


# --------------------------------------------------------------------------- progress


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


# --------------------------------------------------------------------------- the run


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
    only = {site.gpu(p.gpu_type).name for p in site.partitions if partitions is None or p.name in partitions}
    chosen = [p for p in minimal_set(site, job) if p.gpu_type in only]
    missing = [p for p in missing_points(site, job, store) if p.gpu_type in only]
    plans = tuple(_gpu_plans(site, job, missing, only))
    tasks, unplaceable = plan_tasks(site, missing, partitions=partitions, store=store,
                                    points_per_task=points_per_task)
    skipped = len(chosen) - len(missing)
    if dry_run:
        return ProfileReport(scheduled=0, measured=0, infeasible=0, failed=len(unplaceable), skipped=skipped,
                             failures=tuple(unplaceable), plans=plans, tasks=tuple(tasks), dry_run=True,
                             scheduler=scheduler or site.scheduler, wall_s=time.monotonic() - t0)
    kind = scheduler or arrays.choose_scheduler(site)
    if kind == "local":
        tasks, unplaceable = _one_node_only(tasks, unplaceable)
    run = _Campaign(site=site, store=store, ledger=Ledger.beside(store.path), kind=kind,
                    folder=site.resolve(site.work_dir) / "profile", settings=settings or RunSettings(),
                    max_retries=max_retries, partitions=partitions, points_per_task=points_per_task,
                    on_submit=on_submit, unplaceable=len(unplaceable))
    run.failures += unplaceable
    with store.writer():
        run.ledger.load()
        scheduled = run.start(tasks, missing)
        run.watch(_Progress(progress, scheduled), poll_s=poll_s)
    return ProfileReport(scheduled=scheduled, measured=run.measured, infeasible=run.infeasible,
                         failed=len(run.failures), skipped=skipped, failures=tuple(run.failures), plans=plans,
                         tasks=tuple(tasks), job_ids=tuple(dict.fromkeys(run.job_ids)), scheduler=kind,
                         wall_s=time.monotonic() - t0)


def _one_node_only(tasks: list[PlannedTask], unplaceable: list[Failure]) -> tuple[list[PlannedTask], list[Failure]]:
    """One machine (the local executor): no second node for inter-node points."""
    keep = [t for t in tasks if t.nodes == 1]
    lost = [Failure(point=p, partition=t.partition, attempts=0,
                    reason="inter-node point needs two nodes; the local executor has one")
            for t in tasks if t.nodes > 1 for p in t.points]
    return keep, unplaceable + lost


@dataclass(kw_only=True)
class _Active:
    """A submitted task being watched (mutable bookkeeping of this run only)."""

    key: str
    job: Any
    planned: PlannedTask
    attempt: int


@dataclass(kw_only=True)
class _Campaign:
    """One profiling run's bookkeeping (this process only): the tasks watched, each point's
    attempts and reasons, what was stored. The ledger keeps what must outlive the process."""

    site: Site
    store: ProfileStore
    ledger: Ledger
    kind: str  # slurm | local
    folder: Path
    settings: RunSettings
    max_retries: int
    partitions: Sequence[str] | None
    points_per_task: int
    on_submit: Callable[[list[str]], None] | None
    unplaceable: int  # failures known before anything ran (not counted as "failed" in progress)
    active: list[_Active] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, list[str]] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    job_ids: list[str] = field(default_factory=list)
    measured: int = 0
    infeasible: int = 0
    done: int = 0  # points with a sample or given up on

    def start(self, tasks: list[PlannedTask], missing: list[ProfilePoint]) -> int:
        """Re-attach to what an earlier run left, submit the rest; how many points are scheduled."""
        self.folder.mkdir(parents=True, exist_ok=True)
        missing_keys = {point_key(p) for p in missing}
        covered = self._reattach(missing_keys)
        to_submit = [replace(t, points=rest) for t in tasks
                     if (rest := tuple(p for p in t.points if point_key(p) not in covered))]
        self._submit(to_submit, lambda t: 1)
        return len(covered & missing_keys) + sum(len(t.points) for t in to_submit)

    def _reattach(self, missing_keys: set[str]) -> set[str]:
        """Watch again what an earlier run left queued, running or finished-but-uncollected;
        the keys of the points those tasks measure."""
        covered: set[str] = set()
        for e in self.ledger.submitted(self.kind):
            keys = e.point_keys
            if not keys & missing_keys:
                self.ledger.update(e.job_id, state="collected")
                continue
            if not arrays.alive_or_done(self.kind, e.folder, e.job_id, e.world_size):
                self.ledger.update(e.job_id, state="lost")
                continue
            planned = PlannedTask(partition=e.partition, gpu_type=e.gpu_type, world_size=e.world_size,
                                  nodes=e.nodes, points=e.points, measure_device=e.measure_device)
            self.active.append(_Active(key=e.job_id, job=arrays.reattach(self.kind, e.folder, e.job_id, e.world_size),
                                       planned=planned, attempt=e.attempt))
            covered |= keys
            self.job_ids.append(e.job_id)
        self.ledger.save()
        return covered

    def _submit(self, batch: list[PlannedTask], attempt_of: Callable[[PlannedTask], int]) -> None:
        """Submit ``batch`` as one array per (partition, ranks, nodes); each into the ledger at once."""
        shapes: dict[tuple[str, int, int], list[PlannedTask]] = {}
        for t in batch:
            shapes.setdefault((t.partition, t.world_size, t.nodes), []).append(t)
        for (pname, world, nodes), group in shapes.items():
            part = self.site.partition(pname)
            request = SlurmRequest.of(self.site, part, nodes=nodes, tasks_per_node=world // nodes,
                                      job_name=f"memx-profile-{group[0].gpu_type}")
            jobs = arrays.submit_array(_run_task_entry, [self._task(t) for t in group], request=request,
                                       kind=self.kind, folder=self.folder, python=resolve_python(self.site, part))
            ids = [str(j.job_id) for j in jobs]
            for t, j, job_id in zip(group, jobs, ids):
                a = attempt_of(t)
                self.ledger.put(LedgerEntry(
                    job_id=job_id, executor=self.kind, folder=str(self.folder), partition=t.partition,
                    gpu_type=t.gpu_type, world_size=t.world_size, nodes=t.nodes, points=t.points,
                    measure_device=t.measure_device, attempt=a, submitted_at=time.time(), pid=os.getpid()))
                self.active.append(_Active(key=job_id, job=j, planned=t, attempt=a))
            self.job_ids.extend(ids)
            self.ledger.save()
            if self.on_submit:
                self.on_submit(ids)

    def _task(self, t: PlannedTask) -> ProfileTask:
        gpu = self.site.gpu(t.gpu_type)
        return ProfileTask(gpu_type=t.gpu_type, vendor=gpu.vendor, memory_cap_bytes=gpu.memory_bytes,
                           points=t.points, world_size=t.world_size, nodes=t.nodes, settings=self.settings,
                           rendezvous_dir=str(self.folder), measure_device=t.measure_device, label=t.partition,
                           transformer_impl=self.site.partition(t.partition).transformer_impl_for(gpu.vendor))

    def watch(self, bar: _Progress, poll_s: float = 1.0) -> None:
        """Until every task has ended: collect what finished, resubmit what failed."""
        try:
            while self.active:
                bar.show(self.done, len(self.active), len(self.failures) - self.unplaceable,
                         sum(1 for a in self.active if a.attempt > 1))
                time.sleep(poll_s)
                retry: list[tuple[ProfilePoint, int, str]] = []
                still = []
                for a in self.active:
                    if arrays.finished(a.job, self.kind):
                        retry += self._collect(a)
                    else:
                        still.append(a)
                self.active = still
                self.ledger.save()
                self._retry(retry)
            bar.show(self.done, 0, len(self.failures) - self.unplaceable, 0)
        finally:
            bar.end()
            self.ledger.save()

    def _collect(self, a: _Active) -> list[tuple[ProfilePoint, int, str]]:
        """Store what a finished task measured; the points to retry, with why."""
        try:
            res: TaskResult = arrays.result(a.job, a.planned.world_size)
        except Exception as e:  # noqa: BLE001 - every way a task can end without a result
            state = arrays.state(a.job)
            reason = arrays.failure_reason(e, state)
            if a.key in self.ledger.entries:
                self.ledger.update(a.key, state="failed", reasons=self.ledger.entries[a.key].reasons + (reason,))
            if arrays.is_oom(state) and len(a.planned.points) == 1:
                self.store.append([_oom_sample(a.planned.points[0], state, a.job.job_id)])
                self.infeasible += 1
                self.done += 1
                return []
            return [(p, a.attempt, reason) for p in a.planned.points]
        self.store.append(res.samples)  # exact duplicates (a re-collected result) are dropped
        if res.device_figures:
            self.store.set_device_figures(a.planned.gpu_type, res.device_figures)
        for s in res.samples:
            if s.infeasible:
                self.infeasible += 1
            else:
                self.measured += 1
        self.done += len(res.samples)
        if a.key in self.ledger.entries:
            # what the task really cost: its run time on the node (rank 0), times its ranks
            self.ledger.update(a.key, state="collected", failures=tuple(f.reason for f in res.failures),
                               wall_s=round(res.wall_s, 3), collected_at=time.time())
        return [(f.point, a.attempt, f.reason) for f in res.failures]

    def _retry(self, retry: list[tuple[ProfilePoint, int, str]]) -> None:
        """Resubmit the points that failed and have attempts left; give up on the others."""
        again: list[ProfilePoint] = []
        for p, att, reason in retry:
            k = point_key(p)
            self.reasons.setdefault(k, []).append(reason)
            self.attempts[k] = att
            if att > self.max_retries:
                parts = _partitions_of(self.site, p.gpu_type, self.partitions)
                self.failures.append(Failure(point=p, partition=parts[0].name if parts else "",
                                             reason=" | ".join(self.reasons[k]), attempts=att))
                self.done += 1
            else:
                again.append(p)
        if again:
            planned, unplaced = plan_tasks(self.site, again, partitions=self.partitions, store=self.store,
                                           points_per_task=self.points_per_task)
            self.failures += unplaced
            self._submit(planned, lambda t: max(self.attempts[point_key(p)] for p in t.points) + 1)


def _oom_sample(p: ProfilePoint, state: str, job_id: str) -> LayerSample:
    prov = Provenance.of({"note": f"Slurm ended the job with {state}", "slurm_job_id": str(job_id)})
    return LayerSample(point=p, infeasible=True, origin="measured", source=f"slurm:{job_id}", provenance=prov)
