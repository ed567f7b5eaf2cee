"""The planner's conductor: a typed :class:`PlanRequest` in, a :class:`PlanResult` out.

:func:`plan` does what ``memx-hpc plan`` and ``memx-hpc search`` do, without printing
to stdout (progress goes to stderr when ``request.progress``):

1. load the site and the job (when given as file paths);
2. with ``request.profile``: measure the points the store lacks (the profiler, through
   the site's scheduler). A failed profiling run or a locked store is a
   :class:`~memx_hpc.errors.SystemFailure` naming the store, unless
   ``request.allow_datasheet`` says planning from what the store holds (and datasheet
   figures for the rest) is wanted; then it is a note;
3. assemble the cost model (:func:`memx_hpc.model.assemble.load_cost_model`): the predictor
   fitted on the store for the GPU types it has samples of, the datasheet roofline for the
   rest, calibrated by the site's end-to-end runs, with the site's links;
4. search the plan space (serially, or split over the ranks of an MPI communicator);
5. on rank 0, write one plan JSON per reported plan, the three picks (``recommended.json``,
   ``fastest.json``, ``weighted.json``), ``pareto.png`` and ``summary.json`` into a folder of
   its own, ``request.out_dir/<run id>/``, with ``request.out_dir/latest`` pointing at it
   (when ``request.write``); with ``request.finish``, rank the best candidates by when they
   would finish (:mod:`memx_hpc.planner.finish`).

The ranking is ``request.objective``'s: ``recommended`` (the default: the fastest plan
whose peak, widened by the expected memory error of its GPU types, fits; see
:mod:`memx_hpc.search.objective`) or ``memx`` (the weighted product). The search always
keeps both, and the fastest plan that fits.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, TypeVar

from ..spec.catalog import precision_notes
from ..errors import MemxError, SpecError, SystemFailure
from ..model.api import Basis
from ..model.assemble import bases_of, load_cost_model, provenance_of, start_store, store_paths
from ..model.assembled import AssembledCostModel
from ..model.calibrate import CalibratedCostModel, leave_one_out
from ..profile.store import ProfileStore
from ..search.cache import PredictionCache
from ..search.engine import SearchOptions, SearchResult, search
from ..search.objective import (MIN_RUNS_FOR_OWN_BAND, MemoryErrorBand, Weights, memory_error_bands,
                                parse_weights)
from ..search.report import (MAX_PLAN_FILES, ProgressBar, link_rows, new_run_dir, new_run_id, pareto_png,
                             point_latest, result_to_json, write_plan_files)
from ..search.rule import rule_pick, rule_row
from ..placement import comm_vendor
from ..search.space import PlanSpace, SpaceOptions
from ..slurm.cmdline import TP_COMM_OVERLAP_OFF, overlap_refusal, performance_options, site_launches
from ..slurm.submit import launch
from ..spec import Site, TrainJob, load_job, load_site
from .finish import cluster_view, rank_by_finish, usable_site
from .ranks import (ALONE, MIN_PLANS_PER_RANK, TOGETHER, decides, failure_of, follow_rank0, tell_decision,
                    tell_outcome, world)
from .request import PlanRequest, PlanResult, Prepared
from .precision import search_precisions
from .space import launchable_space

if TYPE_CHECKING:
    from mpi4py.MPI import Comm

__all__ = ["MIN_PLANS_PER_RANK", "PlanRequest", "PlanResult", "search_options", "error_bands", "rule_fallback",
           "profile_missing", "load_specs", "prepare", "Prepared", "plan", "submit_best", "overlap_notes"]

T = TypeVar("T")


# --------------------------------------------------------------------------- request and result


# --------------------------------------------------------------------------- options


def search_options(request: PlanRequest, site: Site, bands: dict | None = None) -> "SearchOptions":
    """Search options; the site's ``objective:`` weights are the default that ``request.weights``
    overrides; ``bands``: per GPU type the expected memory error the recommended plan widens by."""

    default = (Weights(**dict(zip(("time", "memory", "balance"), site.objective_weights)))
               if site.objective_weights else None)
    weights = request.weights if isinstance(request.weights, Weights) else parse_weights(request.weights,
                                                                                        default=default)
    return SearchOptions(top_k=request.top_k, weights=weights, block_size=request.block_size,
                         use_cache=request.use_cache, cost=request.cost,
                         memory_error={g: b.fraction for g, b in (bands or {}).items()})


def error_bands(cost_model: AssembledCostModel, site: Site, job: TrainJob, store_path: Path,
                notes: list[str] | None = None) -> dict[str, MemoryErrorBand]:
    """Per GPU type of ``site``, the expected error of the predicted peak memory
    (:func:`memx_hpc.search.objective.memory_error_bands`): the shipped benchmark rows by
    provenance, or for GPU types the site's end-to-end runs calibrate, those runs'
    leave-one-out error (each run predicted by a calibration fitted on the others)."""
    bases = bases_of(cost_model, site)
    calibrated_types: list[str] = []
    held: list = []
    layers = cost_model.layers
    if isinstance(layers, CalibratedCostModel):
        cal = layers.calibration_
        calibrated_types = [g for g in bases if site.gpu(g).name in
                            {site.gpu(x).name for x in cal.overhead_bytes}]
        if any(n >= MIN_RUNS_FOR_OWN_BAND for n in cal.runs_by_gpu_type.values()):
            by_key = {r.key: r for r in layers.records}
            try:
                held = [(h, by_key[h.key]) for h in leave_one_out(layers.base, layers.records, site, job,
                                                                   links=cost_model.links)
                        if h.key in by_key]
            except SpecError as e:  # a run that no longer composes: the table's rows stand
                if notes is not None:
                    notes.append(f"memory error band: leave-one-out over the site's runs failed ({e}); "
                                 f"using the benchmark rows")
    return memory_error_bands(bases, calibrated=calibrated_types, held_out=held)


def _mpi(request: PlanRequest) -> "Comm | None":
    return request.comm if request.comm is not None else world(request.mpi)


# --------------------------------------------------------------------------- the rule of thumb


def rule_fallback(result: SearchResult, site: Site, bases: Mapping[str, Basis], notes: list[str]) -> SearchResult:
    """``result`` with the rule of thumb's plan (:mod:`memx_hpc.search.rule`: largest DP,
    then smallest TP, then largest micro-batch) first in its recommended ranking, on a kind
    of site where the predictor's held-out top-1 is below the rule's
    (``memx_hpc/data/ranking.yaml``, from benchmarks/ranking.py); ``result`` itself
    elsewhere. The rule picks among the plans the recommended ranking keeps (risk-feasible
    plans, the top-K), so its plan fits with the error band as every recommended plan does;
    the others keep their order. What was done goes into ``notes`` and the result's
    ``recommended_by`` line (printed with the three picks). ``bases``: per GPU type what
    the cost model's numbers rest on (the rule applies by the basis kind, datasheet-only
    or profiled)."""
    row = rule_row(site, bases)
    ranked = list(result.recommended_top)
    if row is None or len(ranked) < 2:
        return result
    i = rule_pick([s.plan for s in ranked])
    line = (f"the recommended plan is the rule of thumb's (largest DP, then smallest TP, then largest micro-batch) "
            f"among the {len(ranked)} plans the recommended ranking keeps: on {row['nodes']} NVIDIA sites with "
            f"{row['chip']} GPU types the predictor's held-out top-1 ({float(row['predictor_top1']):.0%} of "
            f"{row['groups']} groups) is below the rule's ({float(row['rule_top1']):.0%}; benchmarks/ranking.py, "
            f"memx_hpc/data/ranking.yaml)")
    notes.append(line)
    order = [ranked[i]] + ranked[:i] + ranked[i + 1:]
    order = [dataclasses.replace(s, rank=k + 1) for k, s in enumerate(order)]
    return dataclasses.replace(result, recommended_top=tuple(order), recommended_by=line)



# --------------------------------------------------------------------------- performance options


def overlap_notes(site: Site, job: TrainJob, options: SpaceOptions) -> list[str]:
    """Which plans of the search get Megatron-LM's ``--overlap-grad-reduce`` /
    ``--overlap-param-gather`` and why the others do not (the rule:
    :func:`memx_hpc.slurm.cmdline.performance_options`), in words for the plan report."""
    if not options.overlap:
        return ["--no-overlap: every plan runs without Megatron's --overlap-grad-reduce and --overlap-param-gather, "
                "and is priced with its gradient reduction and parameter gather exposed"]
    notes = []
    runs = []
    for p in site.partitions:
        why = overlap_refusal(site_launches(site, [p.name], cross_vendor=False), cross_vendor=False)
        if why is None:
            runs.append(p.name)
        else:
            notes.append(f"plans on partition {p.name} run without --overlap-grad-reduce and --overlap-param-gather "
                         f"(priced so): {why.reason}")
    if len({comm_vendor(site, p) for p in site.partitions}) > 1 and not options.single_vendor:
        why = overlap_refusal([], cross_vendor=True)
        notes.append(f"cross-vendor plans run without --overlap-grad-reduce and --overlap-param-gather (priced so): "
                     f"{why.reason if why else ''}")
    if not runs:
        return notes
    with_dist = performance_options(site, runs[:1], job, cross_vendor=False, distributed_optimizer=True)
    without = performance_options(site, runs[:1], job, cross_vendor=False)
    gather = ("and --overlap-param-gather (the distributed optimizer's parameter all-gather behind the next "
              "forward)" if without["overlap_param_gather"] else
              "and, on the plans with the distributed optimizer, --overlap-param-gather" if
              job.distributed_optimizer_searched and with_dist["overlap_param_gather"] else
              "but not --overlap-param-gather: the job runs without the distributed optimizer, which Megatron-LM "
              "needs for it")
    notes.append(f"plans on partition(s) {', '.join(runs)} run Megatron's --overlap-grad-reduce (gradient buckets "
                 f"reduced behind the last backward) {gather}, as production recipes do: priced and written into "
                 f"the script (--no-overlap turns them off)")
    notes.append(TP_COMM_OVERLAP_OFF)
    return notes


# --------------------------------------------------------------------------- profiling


_DATASHEET_HINT = ("pass --allow-datasheet to plan from what the store holds and datasheet figures for the rest, "
                   "or --no-profile to skip profiling")


def profile_missing(site: Site, job: TrainJob, store_path: Path, notes: list[str], *,
                    allow_datasheet: bool = False, scheduler: str | None = None, progress: bool = True) -> None:
    """Measure what the store lacks (the profiler). When profiling cannot run, fails, or
    finds the store locked: :class:`SystemFailure` naming the store, unless
    ``allow_datasheet`` (then a note, and planning goes on with what the store holds)."""
    def fault(msg: str) -> None:
        if allow_datasheet:
            notes.append(f"{msg}; --allow-datasheet: planned with what the store holds and datasheet figures")
            return
        raise SystemFailure(f"{msg}; {_DATASHEET_HINT}")

    try:
        from ..profile.campaign import profile
    except ImportError as e:  # an installation without the profiler
        return fault(f"profiling for {store_path} is not available in this installation ({e})")
    try:
        report = profile(site, job, ProfileStore(store_path), progress=progress, scheduler=scheduler)
    except SystemFailure as e:
        return fault(f"profiling into {store_path} did not run: {e}")
    if report.scheduled:
        notes.append(f"profiled {report.measured} point(s) ({report.infeasible} out of memory) via "
                     f"{report.scheduler} in {report.wall_s:.0f} s")
    if report.failed:
        fault(f"profiling via {report.scheduler}: {report.failed} point(s) failed after retries (see the job ledger "
              f"of {store_path}, 'memx-hpc profile ls --store {store_path}')")


# --------------------------------------------------------------------------- the planner


def load_specs(request: PlanRequest) -> tuple[Site, TrainJob]:
    """The request's site and job, read from their files where given as paths."""
    site = request.site if isinstance(request.site, Site) else load_site(request.site)
    job = request.job if isinstance(request.job, TrainJob) else load_job(request.job)
    return site, job


def _rank0_first(comm: "Comm | None", work: Callable[[], T]) -> T:
    """``work()`` on rank 0 first, then on the other ranks (which reuse what rank 0 saved,
    e.g. the fitted predictor). When it fails on rank 0 with a user or system fault, every
    rank stops with that error instead of waiting for rank 0 forever."""

    if comm is None:
        return work()
    if comm.Get_rank() == 0:
        try:
            out = work()
        except MemxError as e:
            comm.bcast((type(e).__name__, str(e)), root=0)
            raise
        comm.bcast(None, root=0)
        return out
    failure = comm.bcast(None, root=0)
    if failure is not None:
        kind, message = failure
        raise (SpecError if kind == "SpecError" else SystemFailure)(message)
    return work()


def prepare(request: PlanRequest) -> Prepared:
    """Everything before a search: specs, options, MPI, profiling, the cost model, the cache."""

    site, job = load_specs(request)
    search_options(request, site)  # bad weights stop here, before any work
    comm = _mpi(request)
    rank0 = comm is None or comm.Get_rank() == 0
    notes: list[str] = list(request.notes)
    paths = store_paths(site, request.store)
    if not request.analytic:
        # before profiling adds the first measured points, so that the new store holds both
        _rank0_first(comm, lambda: start_store(site, paths.store, notes, reference=request.reference,
                                               progress=request.progress) if rank0 else None)
    if request.profile:
        failure = None
        if rank0:
            try:
                profile_missing(site, job, paths.store, notes, allow_datasheet=request.allow_datasheet,
                                scheduler=request.scheduler, progress=request.progress)
            except SystemFailure as e:
                failure = str(e)
        if comm is not None:
            notes, failure = comm.bcast((notes, failure), root=0)
        if failure is not None:  # every rank stops, not only rank 0
            raise SystemFailure(failure)
    # rank 0 fits (and saves) the predictor; the others then load what it saved
    cost_model = _rank0_first(comm, lambda: load_cost_model(site, job, paths.store, analytic=request.analytic,
                                                            notes=notes, progress=request.progress,
                                                            reference=request.reference))
    notes += precision_notes(site, job)
    bands = error_bands(cost_model, site, job, paths.store, notes)
    opts = search_options(request, site, bands)
    cache = PredictionCache(identity=cost_model.identity, path=paths.cache) if request.use_cache else None
    return Prepared(site=site, job=job, options=opts, comm=comm, rank0=rank0, notes=notes, cost_model=cost_model,
                     cache=cache, bands=bands)


def _one_rank_if_small(request: PlanRequest) -> tuple[PlanRequest | None, "Comm | None"]:
    """Under MPI with a space of fewer than ``request.min_plans_per_rank`` plans per rank:
    on rank 0 ``(the request for rank 0 alone, with a note saying why, the world)``; on the
    other ranks it waits for rank 0's outcome (rank 0's error is raised here too, so every
    rank says why it stopped) and returns ``(None, world)``. Otherwise ``(request, None)``.
    Only rank 0 counts the space; it tells the others (:mod:`memx_hpc.planner.ranks`)."""
    if not decides(request.min_plans_per_rank, request.finish):
        return request, None
    comm = _mpi(request)
    if comm is None:
        return request, None
    if comm.Get_rank() != 0:
        if follow_rank0(comm):
            return None, comm
        return dataclasses.replace(request, comm=comm), None
    try:
        site, job = load_specs(request)
        plans = len(PlanSpace(site, job, launchable_space(site, job, request.space)[0]))
    except MemxError as e:  # a bad site or job: every rank stops with it, none waits
        tell_decision(comm, failure_of(e))
        raise
    size = comm.Get_size()
    if plans >= request.min_plans_per_rank * size:
        tell_decision(comm, TOGETHER)
        return dataclasses.replace(request, site=site, job=job, comm=comm), None
    tell_decision(comm, ALONE)
    note = (f"MPI: {size} ranks were started, but the space has {plans:,} plans, fewer than "
            f"{request.min_plans_per_rank:,} per rank (below that a rank's start costs more than its share "
            f"of the search): searched on rank 0 alone")
    return dataclasses.replace(request, site=site, job=job, mpi="off", comm=None,
                               notes=tuple(request.notes) + (note,)), comm


def plan(request: PlanRequest) -> PlanResult:
    """Profile what is missing (``request.profile``), load the cost model, search, and on
    rank 0 write the plan files, pareto.png and summary.json. Prints nothing on stdout.
    Under MPI, a space too small for its ranks is searched on rank 0 alone
    (``request.min_plans_per_rank``); the other ranks return ``rank0=False`` and no search."""
    request, idle = _one_rank_if_small(request)
    if request is None:
        return PlanResult(site=None, job=None, cost_model=None, search=None, notes=[], provenance={},
                          out_dir=Path("."), files=[], summary={}, rank0=False)
    if idle is None:
        return _plan(request)
    outcome: tuple[str, str] | None = ("SystemFailure", "rank 0 stopped before it finished the search")
    try:
        result = _plan(request)
        outcome = None
        return result
    except MemxError as e:
        outcome = failure_of(e)
        raise
    finally:
        tell_outcome(idle, outcome)


def _plan(request: PlanRequest) -> PlanResult:

    pr = prepare(request)
    site, job, notes, cost_model, rank0 = pr.site, pr.job, pr.notes, pr.cost_model, pr.rank0
    view = None
    if request.finish is not None:
        view = cluster_view(pr.comm, rank0)
        site, shrunk = usable_site(site, view)
        notes += shrunk
    space_options, excluded = launchable_space(site, job, request.space)
    notes += excluded + overlap_notes(site, job, space_options)
    progress = ProgressBar("search", enabled=rank0 and request.progress)
    result = search_precisions(site, job, request.space, space_options,
                               lambda space, step: search(space, cost_model, options=pr.options, cache=pr.cache,
                                                          comm=pr.comm, progress=step),
                               notes, top_k=pr.options.top_k, progress=progress)
    provenance = provenance_of(cost_model, site)  # the site searched: with --finish, the usable part
    if request.objective == "recommended":
        result = rule_fallback(result, site, bases_of(cost_model, site), notes)
    base = Path(os.path.normpath(Path(request.out_dir) if request.out_dir
                                 else site.resolve(site.work_dir) / f"plan-{job.name}"))
    kw = dict(objective=request.objective, bands=pr.bands)
    if not rank0:
        return PlanResult(site=site, job=job, cost_model=cost_model, search=result, notes=notes,
                          provenance=provenance, out_dir=base, files=[], summary={}, rank0=False, **kw)
    files: list[str] = []
    run_id = new_run_id() if request.run_folder else None
    out_dir = base
    if result.top and request.write:
        try:
            # latest moves to this run only once its summary is written (below): a run that
            # fails half-way leaves latest on the last complete one
            out_dir = new_run_dir(base, run_id, latest=False) if request.run_folder else base
            files += [str(p) for p in write_plan_files(result, out_dir, site=site, job=job, provenance=provenance,
                                                       objective=request.objective, bands=pr.bands, run_id=run_id)]
            ranked = len(result.ranking(request.objective))
            if ranked > MAX_PLAN_FILES:
                notes.append(f"--top {request.top_k:,}: {ranked:,} plans ranked, plan files written for the first "
                             f"{MAX_PLAN_FILES} (plan-01.json ... plan-{MAX_PLAN_FILES}.json); summary.json "
                             "lists them all")
            files.append(str(pareto_png(result, out_dir / "pareto.png", site=site, bands=pr.bands,
                                        title=f"{job.name} on {site.name}: {result.stats.feasible:,} plans fit",
                                        reuse=base / "latest" / "pareto.png" if request.run_folder else None)))
        except OSError as e:
            raise SystemFailure(f"cannot write the plan files into {out_dir}: {e}") from None
    finish = None
    if request.finish is not None and view is not None:
        finish = rank_by_finish(request, pr, site, result, view,
                                out_dir if result.top and request.write else None, progress=request.progress)
        files += [str(c.script) for c in finish.candidates if c.script is not None]
    summary = result_to_json(result, site=site, job=job, provenance=provenance, notes=notes, files=files,
                             objective=request.objective, bands=pr.bands, run_id=run_id,
                             links=link_rows(cost_model.links))
    if finish is not None:
        summary["finish"] = finish.to_json()
    if result.top and request.write:
        try:
            (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        except OSError as e:
            raise SystemFailure(f"cannot write {out_dir / 'summary.json'}: {e}") from None
        files.append(str(out_dir / "summary.json"))
        summary["files"] = files
        if request.run_folder:
            try:
                point_latest(base, run_id)
            except OSError as e:
                raise SystemFailure(f"cannot point {base / 'latest'} at {out_dir}: {e.strerror or e}") from None
    return PlanResult(site=site, job=job, cost_model=cost_model, search=result, notes=notes, provenance=provenance,
                      out_dir=out_dir, files=files, summary=summary, rank0=True, run_id=run_id, finish=finish, **kw)


# --------------------------------------------------------------------------- after the search


def submit_best(outcome: PlanResult, *, iters: int | None, workdir: str | None) -> dict:
    """Render the best plan of a search, check it with ``bash -n``, submit it; the job id
    and where things are. SystemFailure when Slurm refuses or does not answer."""
    # jinja2 is imported with the renderer, only when a plan is rendered
    from ..slurm.render import render

    best = outcome.ranked[0]
    out_dir = outcome.out_dir
    text = render(best.plan, outcome.site, outcome.job, iters=iters, log_dir=str(out_dir), workdir=workdir,
                  job_name=f"memx-{outcome.job.name}")
    done = launch(text, out_dir / "plan-01.sbatch", submit_job=True)
    outcome.files.append(str(done.script))
    return {"job_id": done.job_id, "script": str(done.script), "log_dir": str(out_dir), "plan_rank": best.rank}
