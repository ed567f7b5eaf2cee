"""The planner as a library: a typed :class:`PlanRequest` in, a :class:`PlanResult` out.

:func:`plan` does what ``memx-hpc plan`` and ``memx-hpc search`` do, without printing
to stdout (progress goes to stderr when ``request.progress``):

1. load the site and the job (when given as file paths);
2. with ``request.profile``: measure the points the store lacks (the profiler, through
   the site's scheduler). A failed profiling run or a locked store is a
   :class:`~memx_hpc.errors.SystemFailure` naming the store, unless
   ``request.allow_datasheet`` says planning from what the store holds (and datasheet
   figures for the rest) is wanted; then it is a note;
3. build the cost model (:func:`load_cost_model`): the predictor fitted on the store for
   the GPU types it has samples of, the datasheet roofline for the rest, calibrated by the
   site's end-to-end runs;
4. search the plan space (serially, or split over the ranks of an MPI communicator);
5. on rank 0, write one plan JSON per reported plan, the three picks (``recommended.json``,
   ``fastest.json``, ``weighted.json``), ``pareto.png`` and ``summary.json`` into a folder of
   its own, ``request.out_dir/<run id>/``, with ``request.out_dir/latest`` pointing at it
   (when ``request.write``).

The ranking is ``request.objective``'s: ``recommended`` (the default: the fastest plan
whose peak, widened by the expected memory error of its GPU types, fits; see
:mod:`memx_hpc.search.objective`) or ``memx`` (the weighted product). The search always
keeps both, and the fastest plan that fits.

Example::

    from memx_hpc.planner import PlanRequest, plan
    result = plan(PlanRequest(site="site_configs/local.yaml", job="jobs/tiny-gpt.yaml", top_k=5))
    best = result.ranked[0]              # ScoredPlan: .plan, .prediction, .score, .rank
    result.search.fastest, result.search.weighted_best, result.bands
    result.notes, result.files, result.summary

The CLI subcommands (``plan``, ``search``, ``simulate``, ``verify``, ``predict``) parse
their arguments into a request, call this module and print.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import SpecError, SystemFailure
from .model.compose import CostOptions
from .spec import Site, TrainJob

if TYPE_CHECKING:  # only for annotations: the search is imported where it is used
    from .search.engine import SearchOptions, SearchResult
    from .search.objective import Weights
    from .search.space import SpaceOptions

__all__ = ["MIN_TYPES_FOR_DATASHEET_TRANSFER", "PlanRequest", "PlanResult", "ScaleResult", "ScaledSearch", "StorePaths", "base_of",
           "calibrated", "load_cost_model", "plan", "profile_missing", "provenance_of", "scale_site",
           "search_options", "simulate_scales", "store_paths", "submit_best", "VerifyRequest", "VerifyResult",
           "best_plan_check", "plan_file_entries", "verify", "FinishGoal", "parse_finish", "FinishCandidate",
           "FinishRanking", "usable_site", "rank_by_finish", "finish_order", "submit_finish"]

#: profiled GPU types a store needs before the predictor estimates unprofiled types itself
MIN_TYPES_FOR_DATASHEET_TRANSFER = 3
#: Plans each MPI rank must get before starting it pays (``PlanRequest.min_plans_per_rank``).
#: A rank costs its own start (imports, MPI, the cost model loaded after rank 0's) and a share
#: of the predictions exchanged; on a 2-core machine (load ~8) 2 ranks searched the
#: cross-vendor llama2-7b space (243,153 plans) in 9.4-10.6 s against 6.3-6.6 s on one, and
#: local.yaml's tiny-gpt space (8,208 plans) in 1.5 s against 0.7 s (benchmarks/cli_speed.py
#: prints the current figures). Spaces of a million plans and more are where ranks pay.
MIN_PLANS_PER_RANK = 500_000
_OUTCOME_TAG = 7319  # the message rank 0 sends the ranks it left idle: None or (error type, text)


# --------------------------------------------------------------------------- request and result


def _space_options_default():
    from .search.space import SpaceOptions
    return SpaceOptions()


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """What to plan.

    ``site``/``job``: the specs, or paths of their YAML files. ``store``: the profile store
    (None: the site's). ``weights``: the objective's exponents as ``Weights`` or text
    (``"time=1,memory=0.5"``; None: the site's ``objective:``, else the default).
    ``space``/``cost``: the search-space and composition options. ``profile``: measure
    what the store lacks first; ``scheduler`` overrides the site's (``slurm`` | ``local``);
    ``allow_datasheet``: a failed or locked profiling run becomes a note instead of an
    error. ``out_dir``: where files go (None: the site's ``work_dir/plan-<job>``);
    ``write`` False writes nothing. ``mpi``: ``"auto"`` (use MPI when launched under
    it), ``"require"`` or ``"off"``; ``comm`` an explicit communicator (wins over
    ``mpi``). ``analytic``: datasheet roofline only; ``use_cache`` False: no signature
    cache. ``progress``: progress lines on stderr. ``notes``: notes the result starts with
    (what the caller chose, in words). ``objective``: ``recommended`` or ``memx`` (which
    ranking ``PlanResult.ranked`` and plan-NN.json follow). ``run_folder`` False writes
    into ``out_dir`` itself instead of a new run folder under it. ``finish``: rank the best
    candidates by when they would finish that much training on the cluster as it is now
    (:func:`rank_by_finish`: Slurm's ``--test-only`` start + the predicted run time); nodes a
    job cannot get now (down, drained, reserved) are not planned on. ``min_plans_per_rank``:
    under MPI, a space of fewer plans than this per rank is searched by rank 0 alone, the
    other ranks waiting for its outcome (:data:`MIN_PLANS_PER_RANK` is what the CLI passes;
    0: every rank searches, however small the space).
    """

    site: Site | str | Path
    job: TrainJob | str | Path
    store: str | Path | None = None
    weights: "Weights | str | None" = None
    space: "SpaceOptions" = field(default_factory=_space_options_default)
    cost: CostOptions = field(default_factory=CostOptions)
    top_k: int = 10
    block_size: int = 65536
    profile: bool = False
    scheduler: str | None = None
    allow_datasheet: bool = False
    out_dir: str | Path | None = None
    write: bool = True
    mpi: str = "auto"
    comm: Any = None
    analytic: bool = False
    use_cache: bool = True
    progress: bool = True
    notes: tuple[str, ...] = ()
    objective: str = "recommended"
    run_folder: bool = True
    finish: "FinishGoal | None" = None
    min_plans_per_rank: int = 0
    #: a store that does not exist yet starts from the shipped reference profiles: True/False
    #: (``--no-reference``), None: the site's ``reference_data`` (:func:`start_store`)
    reference: bool | None = None

    def __post_init__(self) -> None:
        from .search.objective import OBJECTIVES
        if self.objective not in OBJECTIVES:
            raise SpecError("unknown objective", field="objective", found=self.objective,
                            allowed=", ".join(OBJECTIVES))
        if self.mpi not in ("auto", "require", "off"):
            raise SpecError("unknown MPI mode", field="mpi", found=self.mpi, allowed="auto, require, off")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
            raise SpecError("must be a whole number >= 1", field="top", found=self.top_k)
        if self.finish is not None and not isinstance(self.finish, FinishGoal):
            raise SpecError("expected a FinishGoal (parse_finish)", field="finish", found=self.finish)
        if (isinstance(self.min_plans_per_rank, bool) or not isinstance(self.min_plans_per_rank, int)
                or self.min_plans_per_rank < 0):
            raise SpecError("must be a whole number >= 0", field="min_plans_per_rank", found=self.min_plans_per_rank)


@dataclass(kw_only=True)
class PlanResult:
    """A finished plan.

    ``search``: the :class:`~memx_hpc.search.engine.SearchResult` (``top``: ranked
    ``ScoredPlan``s, ``time_top``, ``pareto``, ``weights``, ``stats``). ``provenance``:
    per GPU type of the site where its numbers come from (measured | imported |
    augmented | datasheet-only). ``notes``: what the user should know, in words.
    ``cost_model``: the model the search used. ``files``: paths written (plan files,
    pareto.png, summary.json; an sbatch script after :func:`submit_best`). ``summary``:
    the JSON summary (what ``--json`` prints). ``rank0`` is False on the other ranks of
    an MPI run, which write and report nothing. ``finish``: with ``PlanRequest.finish``, the
    candidates ranked by when they would finish (``site`` is then the usable part of the
    cluster the search ran on).
    """

    site: Site
    job: TrainJob
    cost_model: Any
    search: "SearchResult"
    notes: list[str]
    provenance: dict[str, str]
    out_dir: Path
    files: list[str]
    summary: dict
    rank0: bool = True
    objective: str = "recommended"
    bands: dict = field(default_factory=dict)
    run_id: str | None = None
    finish: "FinishRanking | None" = None

    @property
    def ranked(self) -> tuple:
        """The plans as ``objective`` ranks them (recommended first by default)."""
        return self.search.ranking(self.objective)

    @property
    def result(self) -> "SearchResult":
        """The search result (the name earlier callers used)."""
        return self.search


# --------------------------------------------------------------------------- paths


@dataclass(frozen=True, kw_only=True)
class StorePaths:
    """The profile store and the files kept beside it: the signature cache and the saved predictor."""

    store: Path
    cache: Path
    predictor: Path


def store_paths(site: Site, store: str | Path | None = None) -> StorePaths:
    """Where a site's store, cache and predictor are. An explicit ``store`` keeps its cache
    beside it unless the site names a cache file; the predictor always sits beside the store."""
    path = Path(store) if store else site.store
    # an explicit store: the site's own rule (Site.cache) applied to it, i.e. the site's
    # cache_path when it names one, else the cache beside that store
    cache = dataclasses.replace(site, store_path=str(path.absolute())).cache if store else site.cache
    return StorePaths(store=path, cache=cache, predictor=path.with_suffix(".predictor.ubj"))


# --------------------------------------------------------------------------- options


def search_options(request: PlanRequest, site: Site, bands: dict | None = None) -> "SearchOptions":
    """Search options; the site's ``objective:`` weights are the default that ``request.weights``
    overrides; ``bands``: per GPU type the expected memory error the recommended plan widens by."""
    from .search.engine import SearchOptions
    from .search.objective import Weights, parse_weights

    default = (Weights(**dict(zip(("time", "memory", "balance"), site.objective_weights)))
               if site.objective_weights else None)
    weights = request.weights if isinstance(request.weights, Weights) else parse_weights(request.weights,
                                                                                        default=default)
    return SearchOptions(top_k=request.top_k, weights=weights, block_size=request.block_size,
                         use_cache=request.use_cache, cost=request.cost,
                         memory_error={g: b.fraction for g, b in (bands or {}).items()})


def error_bands(cost_model, site: Site, job: TrainJob, store_path: Path, notes: list[str] | None = None) -> dict:
    """Per GPU type of ``site``, the expected error of the predicted peak memory
    (:func:`memx_hpc.search.objective.memory_error_bands`): the shipped benchmark rows by
    provenance, or for GPU types the site's end-to-end runs calibrate, those runs'
    leave-one-out error (each run predicted by a calibration fitted on the others)."""
    from .model.calibrate import CalibratedCostModel, leave_one_out
    from .search.objective import MIN_RUNS_FOR_OWN_BAND, memory_error_bands

    bases = bases_of(cost_model, site)
    calibrated_types: list[str] = []
    held: list = []
    if isinstance(cost_model, CalibratedCostModel):
        cal = cost_model.calibration_
        calibrated_types = [g for g in bases if site.gpu(g).name in
                            {site.gpu(x).name for x in cal.overhead_bytes}]
        if any(n >= MIN_RUNS_FOR_OWN_BAND for n in cal.runs_by_gpu_type.values()):
            by_key = {r.key: r for r in cost_model.records}
            try:
                held = [(h, by_key[h.key]) for h in leave_one_out(cost_model.base, cost_model.records, site, job)
                        if h.key in by_key]
            except SpecError as e:  # a run that no longer composes: the table's rows stand
                if notes is not None:
                    notes.append(f"memory error band: leave-one-out over the site's runs failed ({e}); "
                                 f"using the benchmark rows")
    return memory_error_bands(bases, calibrated=calibrated_types, held_out=held)


def _mpi(request: PlanRequest):
    from .search.engine import launched_under_mpi, mpi_comm
    if request.comm is not None:
        return request.comm
    if request.mpi == "require":
        return mpi_comm(required=True)
    if request.mpi == "auto" and launched_under_mpi():
        return mpi_comm()
    return None


# --------------------------------------------------------------------------- cost model


def start_store(site, store_path: Path, notes: list[str], *, reference: bool | None = None,
                progress: bool = True) -> None:
    """A store that does not exist yet starts from the shipped reference profiles
    (Sailor's and Cephalo's published measurements, labelled ``imported``) when the site
    wants them (:func:`memx_hpc.profile.reference.wanted`; ``reference`` overrides the
    site's ``reference_data``). An existing store is left as it is. Says so in ``notes``."""
    if store_path.exists():
        return
    from .profile.reference import seed_store, wanted
    if not wanted(site, reference):
        return
    if progress:
        print(f"store: {store_path} does not exist; starting it from the shipped reference profiles ...",
              file=sys.stderr, flush=True)
    try:
        report = seed_store(store_path, gpus=site)
    except OSError as e:
        raise SystemFailure(f"cannot create the profile store {store_path}: {e}") from None
    if report is not None:
        notes.append(report.describe() + " (--no-reference or 'reference_data: false' in the site to start empty)")


def load_cost_model(site, job, store_path: Path, *, analytic: bool, notes: list[str], fit: bool = True,
                    calibrate: bool = True, progress: bool = True, reference: bool | None = None):
    """The cost model for ``site``: the predictor fitted on the store for GPU types it has
    samples of (fitted or reloaded: see fit_or_load), the datasheet roofline for the rest;
    calibrated by the end-to-end runs the store holds for the site (see
    :mod:`memx_hpc.model.calibrate`) unless ``calibrate`` is False or ``analytic`` is set.
    ``progress``: say on stderr when the predictor is fitted or reloaded, and how long it took.
    A store that does not exist yet is started from the reference profiles first
    (:func:`start_store`; ``reference`` as there) unless ``analytic``."""
    if not analytic:
        start_store(site, store_path, notes, reference=reference, progress=progress)
    from .profile.store import ProfileStore
    store = ProfileStore(store_path)  # one object: the file is read once, however many parts read it
    model = _uncalibrated_cost_model(site, job, store_path, analytic=analytic, notes=notes, fit=fit,
                                     progress=progress, store=store)
    # every p2p and collective of the composition reads the site's link curves: measured
    # and imported ones from the store, the site's figures (labelled so) for the rest
    from .model.links import link_notes, load_links
    model.links = load_links(site, store_path if store_path.is_file() else None)
    notes.extend(link_notes(model.links))
    if analytic or not calibrate or not store_path.is_file():
        return model
    return calibrated(model, site, job, store_path, notes, store=store)


def calibrated(model, site, job, store_path: Path, notes: list[str], *, store=None):
    """``model`` wrapped in the calibration from the store's end-to-end runs of ``site``
    (``model`` itself when there are none); what was used goes into ``notes``. ``store``:
    the ProfileStore of ``store_path`` when the caller has one (its snapshot is reused)."""
    from .profile.store import ProfileStore

    records = (store if store is not None else ProfileStore(store_path)).e2e_records(site=site.name)
    if not records:
        return model
    from .model.calibrate import CalibratedCostModel
    cm = CalibratedCostModel(model, records, site, job).fit()
    cal = cm.calibration_
    if not cal.runs:
        notes.append(f"end-to-end runs in {store_path} not used for calibration: " + "; ".join(cal.skipped[:3]))
        return model
    notes.append(f"calibrated by end-to-end runs (memx-hpc verify): {cal.describe()}"
                 + (f"; {len(cal.skipped)} run(s) left out" if cal.skipped else "")
                 + "; its held-out (leave-one-out) error: memx-hpc verify")
    return cm


def base_of(model):
    """The model under a calibration (the model itself when it is not calibrated)."""
    from .model.calibrate import CalibratedCostModel
    return model.base if isinstance(model, CalibratedCostModel) else model


def _uncalibrated_cost_model(site, job, store_path: Path, *, analytic: bool, notes: list[str], fit: bool = True,
                             progress: bool = True, store=None):
    from .model.api import AnalyticCostModel
    from .model.routed import RoutedCostModel
    fallback = AnalyticCostModel(site)
    site_gpus = sorted({p.gpu_type for p in site.partitions})
    if analytic:
        notes.append("--analytic: every number is a datasheet roofline estimate")
        return fallback
    if not store_path.is_file():
        notes.append(f"no profile store at {store_path}: every number is estimated from datasheet figures "
                     f"(run 'memx-hpc plan' or 'memx-hpc profile' to measure)")
        return fallback
    from .model.api import with_store_figures
    from .profile.store import ProfileStore
    store = store if store is not None else ProfileStore(store_path)
    samples = store.samples()
    # CPU "devices" (measured_at_profile_time): the speeds measured when profiling, as
    # memx-hpc fit uses them, so both fit the same model from the same figures
    gpus = with_store_figures(site, store)
    fallback = AnalyticCostModel(gpus)
    if not samples:
        notes.append(f"the profile store {store_path} is empty: estimates from datasheet figures only")
        return fallback
    have, have_chips = set(), {}
    for s in samples:
        try:
            g = site.gpu(s.point.gpu_type)
        except Exception:  # a GPU type this site does not know: still training data
            continue
        have.add(g.name)
        have_chips.setdefault(g.chip_id, g.name)
    # a type with samples of its own, or of another type of its chip (gpus.yaml chip:
    # V100-32 answers with V100-16's measured layer times, its own memory)
    covered = [g for g in site_gpus if site.gpu(g).name in have or site.gpu(g).chip_id in have_chips]
    missing = [g for g in site_gpus if g not in covered]
    for g in covered:
        if site.gpu(g).name not in have:
            notes.append(f"{g}: no samples of its own; layer times from {have_chips[site.gpu(g).chip_id]} "
                         f"(same chip), memory from its own size")
    # The predictor's datasheet part (model.anchors.Anchors.datasheet: the roofline's parts at
    # the costs every measured chip in the store shows) estimates a GPU type with no samples
    # from its figures -- about half the roofline's error on held-out types
    # (benchmarks/accuracy.py, new-gpu) -- when the store spans several GPU types to learn
    # that mapping from; with fewer, the plain roofline is safer. Whether it answers depends
    # on the store alone, never on what else the site holds: a site of only unprofiled
    # types gets the same numbers as that site plus a profiled partition it does not use.
    layer_types = {s.point.gpu_type for s in samples if s.point.kind == "layer"}
    transfer = bool(missing) and len(layer_types) >= MIN_TYPES_FOR_DATASHEET_TRANSFER
    if not covered and not transfer:
        notes.append(f"the profile store has no samples for {', '.join(site_gpus)}: estimates from datasheet "
                     f"figures only (the store spans {len(layer_types)} profiled GPU type(s); "
                     f"{MIN_TYPES_FOR_DATASHEET_TRANSFER} are needed to transfer their costs)")
        return fallback
    if not fit:
        return fallback
    try:
        from .model.predictor import fit_or_load
    except ImportError as e:  # xgboost missing from this installation
        notes.append(f"the predictor cannot be loaded ({e}): estimates from datasheet figures only")
        return fallback
    model_path = store_paths(site, store_path).predictor
    t0 = time.perf_counter()

    def say(line: str) -> None:
        if progress:
            print(line, file=sys.stderr, flush=True)

    samples, sources = consistent_sources(samples, gpus, site, store, notes)
    say(f"predictor: reusing {model_path} or fitting it on {len(samples):,} samples from {store_path} ...")
    predictor = fit_or_load(samples, model_path, gpus, progress=say)
    say(f"predictor: ready in {time.perf_counter() - t0:.1f} s (covers {', '.join(covered) or 'no site GPU type'})")
    from .model.compose import layer_query
    for g in covered:
        q = layer_query(job, g, kind="layer", tp=1, micro_batch_size=1, recompute="none", sequence_parallel=False)
        if not predictor.shape_profiled(q):
            notes.append(f"{g}: {job.name}'s layer shape ({job.precision}, {job.attention}) was never profiled on "
                         f"this chip: its layer times are the chip's measured efficiency scaled to the work "
                         f"(extrapolated; profile it for measured times)")
    notes.extend(eager_layer_notes(site, job, samples, covered))
    if transfer:
        notes.append(f"no samples for {', '.join(missing)} in {store_path}: the predictor estimates those "
                     f"GPU types from their datasheet figures and the {len(layer_types)} profiled types")
        routed = RoutedCostModel(_routes(site, site_gpus, predictor), fallback)
    else:
        if missing:
            notes.append(f"no samples for {', '.join(missing)} in {store_path}: those GPU types use the datasheet "
                         f"roofline (AnalyticCostModel)")
        routed = RoutedCostModel(_routes(site, covered, predictor), fallback)
    routed.sources = sources
    return routed


def eager_layer_notes(site: Site, job: TrainJob, samples, covered) -> list[str]:
    """A note per site GPU type whose layer samples of the job's attention kernel all come
    from plain-PyTorch layers (:data:`memx_hpc.model.api.EAGER_SOURCES`: Cephalo's Hugging Face
    layers): its layer times are those layers' as measured, while the plan runs Megatron's
    fused ones, and an unprofiled type beside it is priced as Megatron's."""
    from .model.api import kernels_of
    kinds: dict[str, set[str]] = {}
    for s in samples:
        if s.point.kind != "layer" or s.point.attention != job.attention or s.origin == "augmented":
            continue
        try:
            chip = site.gpu(s.point.gpu_type).chip_id
        except Exception:
            continue
        kinds.setdefault(chip, set()).add(kernels_of(s))
    return [f"{g}: its layer times are plain-PyTorch layers as measured (Cephalo's, unfused elementwise kernels), "
            f"not Megatron's fused ones, so they run high (about 1.3-1.5x at large work on vTrain's A100 runs, "
            f"benchmarks/end_to_end.py); profile this partition for Megatron's own times"
            for g in covered if kinds.get(site.gpu(g).chip_id) == {"eager"}]


def consistent_sources(samples, gpus, site, store, notes: list[str]):
    """The store's samples with disagreeing sources settled (:func:`memx_hpc.model.sources.resolve`:
    the site's ``prefer_source``, else the store's end-to-end runs of the site, else the shipped
    evidence), and the report; the site's GPU types' disagreements go into ``notes``."""
    from .model.predictor import Predictor
    from .model.sources import cases_from_records, resolve, shipped_preferences
    cases = cases_from_records(store.e2e_records(site=site.name), site) if store is not None else []
    out, report = resolve(samples, gpus, prefer=dict(site.prefer_source) or None, cases=cases,
                          fit=lambda ss: Predictor().fit(ss, gpus), evidence="end-to-end runs in the store",
                          prior=shipped_preferences())
    names = set()
    for p in site.partitions:
        g = site.gpu(p.gpu_type)
        names |= {g.name, p.gpu_type, *g.aliases}
    notes.extend(report.notes(sorted(names)))
    return out, report


def _routes(site, names, model) -> dict:
    """``model`` for each of ``names`` under every name it goes by (site name, catalog name,
    aliases: a query may carry any of them, e.g. Sailor's ``GH-96`` for ``GH200``)."""
    out = {}
    for g in names:
        t = site.gpu(g)
        for n in (g, t.name, *t.aliases):
            out[n] = model
    return out


def rule_fallback(result, site, provenance: dict[str, str], notes: list[str]):
    """``result`` with the rule of thumb's plan (:mod:`memx_hpc.search.rule`: largest DP,
    then smallest TP, then largest micro-batch) first in its recommended ranking, on a kind
    of site where the predictor's held-out top-1 is below the rule's
    (``memx_hpc/data/ranking.yaml``, from benchmarks/ranking.py); ``result`` itself
    elsewhere. The rule picks among the plans the recommended ranking keeps (risk-feasible
    plans, the top-K), so its plan fits with the error band as every recommended plan does;
    the others keep their order. What was done goes into ``notes`` and the result's
    ``recommended_by`` line (printed with the three picks)."""
    from .search.rule import rule_pick, rule_row

    row = rule_row(site, provenance)
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


def provenance_of(cost_model, site) -> dict[str, str]:
    """Per GPU type of ``site``: where the cost model's numbers for it come from, as reports write it."""
    return {g: cost_model.provenance(g) for g in sorted({p.gpu_type for p in site.partitions})}


def bases_of(cost_model, site) -> dict:
    """Per GPU type of ``site``: the cost model's :class:`~memx_hpc.model.api.Basis` for it."""
    return {g: cost_model.basis(g) for g in sorted({p.gpu_type for p in site.partitions})}


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
        from .profile.store import ProfileStore
        from .profile.campaign import profile
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


def _load(request: PlanRequest) -> tuple[Site, TrainJob]:
    from .spec import load_job, load_site
    site = request.site if isinstance(request.site, Site) else load_site(request.site)
    job = request.job if isinstance(request.job, TrainJob) else load_job(request.job)
    return site, job


@dataclass(kw_only=True)
class _Prepared:
    site: Site
    job: TrainJob
    options: Any
    comm: Any
    rank0: bool
    notes: list[str]
    cost_model: Any
    cache: Any
    bands: dict = field(default_factory=dict)


def _rank0_first(comm, work):
    """``work()`` on rank 0 first, then on the other ranks (which reuse what rank 0 saved,
    e.g. the fitted predictor). When it fails on rank 0 with a user or system fault, every
    rank stops with that error instead of waiting for rank 0 forever."""
    from .errors import MemxError

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


def _prepare(request: PlanRequest) -> _Prepared:
    """Everything before a search: specs, options, MPI, profiling, the cost model, the cache."""
    from .search.cache import PredictionCache

    site, job = _load(request)
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
    from .spec.catalog import precision_notes
    notes += precision_notes(site, job)
    bands = error_bands(cost_model, site, job, paths.store, notes)
    opts = search_options(request, site, bands)
    cache = PredictionCache(identity=cost_model.identity, path=paths.cache) if request.use_cache else None
    return _Prepared(site=site, job=job, options=opts, comm=comm, rank0=rank0, notes=notes, cost_model=cost_model,
                     cache=cache, bands=bands)


def resume_job(job: TrainJob, checkpoint: str) -> tuple[TrainJob, str]:
    """``job`` continued from the megatron-core distributed checkpoint folder ``checkpoint``
    (what a run's ``--save`` wrote): the checkpoint's model must be the job's (a resumed run
    keeps the model's shape; TP, PP, DP and partitions may change, the checkpoint reshards),
    the script loads it (``--load``) and keeps saving (the job's save folder, else the same
    one). Returns the job and a note: the iteration it resumes at and the plan that wrote it."""
    from .spec import Checkpointing

    try:
        from .train.checkpoint import read_info

        info = read_info(checkpoint)
    except ImportError as e:
        raise SystemFailure(f"reading the checkpoint {checkpoint} needs torch and megatron-core ({e}): "
                            f"pip install 'memx-hpc[profile]'") from None
    except FileNotFoundError:
        raise SpecError("not a checkpoint folder: it has no latest_checkpointed_iteration.txt", field="--resume",
                        found=checkpoint) from None
    except Exception as e:  # noqa: BLE001 - a damaged or foreign checkpoint: name it, exit 1
        raise SpecError(f"cannot read the checkpoint: {type(e).__name__}: {e}", field="--resume",
                        found=checkpoint) from None
    a, m = info.args, job.model
    pairs = [("num_layers", m.num_layers), ("hidden_size", m.hidden_size),
             ("num_attention_heads", m.num_attention_heads), ("ffn_hidden_size", m.ffn_hidden_size),
             ("seq_length", m.seq_length)]
    if getattr(a, "group_query_attention", False):
        pairs.append(("num_query_groups", m.num_query_groups))
    for name, ours in pairs:
        theirs = getattr(a, name, None)
        if theirs is not None and theirs != ours:
            raise SpecError(f"the checkpoint's model has {name} {theirs}: a resumed run keeps the model's shape",
                            field=f"model.{name}", file=job.source_file, found=ours, allowed=str(theirs))
    if job.train_iters is not None and job.train_iters <= info.iteration:
        raise SpecError(f"the checkpoint is at iteration {info.iteration} already: raise train_iters to go on",
                        field="train_iters", file=job.source_file, found=job.train_iters)
    ck = job.checkpoint
    job = dataclasses.replace(job, checkpoint=Checkpointing(
        save_dir=ck.save_dir if ck is not None and ck.save_dir else checkpoint, load_dir=checkpoint,
        save_interval=ck.save_interval if ck is not None else None))
    shape = "/".join(str(getattr(a, k, "?")) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                                        "data_parallel_size"))
    note = (f"resumes from {info.path}: iteration {info.iteration}, written with tp/pp/dp {shape} and global batch "
            f"{getattr(a, 'global_batch_size', '?')}; the plans keep the model's shape and may use other partitions "
            f"and TP/PP/DP (the checkpoint reshards); render with --resume {checkpoint} (or checkpoint.load in the "
            f"job file) to load it")
    if getattr(a, "global_batch_size", job.global_batch_size) != job.global_batch_size:
        note += (f"; the job's global batch {job.global_batch_size} differs, so iteration i no longer reads the "
                 f"samples it would have")
    return job, note


def launchable_space(site: Site, job: TrainJob, options: "SpaceOptions") -> tuple["SpaceOptions", list[str]]:
    """The search options with only plans ``render`` would launch for this job and site, and
    a note per exclusion saying what was left out and why. A plan whose stages speak more
    than one vendor's collectives runs the project's megatron-core entry over a cross-vendor
    backend: the space leaves such plans out when that entry cannot build the job's
    tokenizer or the site names no cross-vendor pipeline backend (render refuses both)."""
    from .placement import comm_vendor
    from .slurm.cmdline import project_entry_refusal

    options, notes = _launchable_sequence_parallel(site, options)
    vendors = sorted({comm_vendor(site, p) for p in site.partitions})
    if len(vendors) < 2 or options.single_vendor:
        return options, notes
    why = []
    refusal = project_entry_refusal(job)
    if refusal is not None:
        why.append(refusal.reason)
    if site.pipeline_comm_backend != "ucc":
        why.append(f"the site's pipeline_comm.backend is {site.pipeline_comm_backend}, and NCCL/RCCL do not talk "
                   f"to each other (set it to ucc)")
    if not why:
        return options, notes
    note = (f"cross-vendor plans left out of the search (partitions of {', '.join(vendors)} are not mixed in one "
            f"plan): render would refuse them: " + "; ".join(why))
    return dataclasses.replace(options, single_vendor=True), notes + [note]


def _launchable_sequence_parallel(site: Site, options: "SpaceOptions") -> tuple["SpaceOptions", list[str]]:
    """Sequence parallel left out of the search where render would refuse it (CPU devices);
    asked for explicitly there, it is a user error naming the option."""
    from .slurm.render import sequence_parallel_refusal

    if options.sequence_parallel is False:
        return options, []
    why = sequence_parallel_refusal(site, [p.name for p in site.partitions])
    if why is None:
        return options, []
    if options.sequence_parallel is True:
        raise SpecError(why, field="--sequence-parallel", found="on", allowed="off, search")
    return (dataclasses.replace(options, sequence_parallel=False),
            [f"sequence parallel left out of the search: {why}"])


def _one_rank_if_small(request: PlanRequest) -> tuple[PlanRequest | None, Any]:
    """Under MPI with a space of fewer than ``request.min_plans_per_rank`` plans per rank:
    on rank 0 ``(the request for rank 0 alone, with a note saying why, the world)``; on the
    other ranks it waits for rank 0's outcome (rank 0's error is raised here too, so every
    rank says why it stopped) and returns ``(None, world)``. Otherwise ``(request, None)``."""
    if request.min_plans_per_rank <= 0 or request.finish is not None:
        return request, None
    comm = _mpi(request)
    if comm is None:
        return request, None
    from .search.space import PlanSpace
    site, job = _load(request)
    plans, size = len(PlanSpace(site, job, launchable_space(site, job, request.space)[0])), comm.Get_size()
    if plans >= request.min_plans_per_rank * size:
        return dataclasses.replace(request, site=site, job=job, comm=comm), None
    if comm.Get_rank() != 0:
        # poll rather than block: MPICH's blocking receive spins on a core rank 0 needs
        while not comm.Iprobe(source=0, tag=_OUTCOME_TAG):
            time.sleep(0.05)
        failure = comm.recv(source=0, tag=_OUTCOME_TAG)
        if failure is not None:
            kind, message = failure
            raise (SpecError if kind == "SpecError" else SystemFailure)(message)
        return None, comm
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
    request, world = _one_rank_if_small(request)
    if request is None:
        return PlanResult(site=None, job=None, cost_model=None, search=None, notes=[], provenance={},
                          out_dir=Path("."), files=[], summary={}, rank0=False)
    if world is None:
        return _plan(request)
    outcome = ("SystemFailure", "rank 0 stopped before it finished the search")
    try:
        result = _plan(request)
        outcome = None
        return result
    except (SpecError, SystemFailure) as e:
        outcome = ("SpecError" if isinstance(e, SpecError) else "SystemFailure", str(e))
        raise
    finally:
        for r in range(1, world.Get_size()):
            world.send(outcome, dest=r, tag=_OUTCOME_TAG)


def _plan(request: PlanRequest) -> PlanResult:
    from .search.engine import search
    from .search.report import (MAX_PLAN_FILES, ProgressBar, link_rows, new_run_dir, new_run_id, pareto_png,
                                point_latest, result_to_json, write_plan_files)
    from .search.space import PlanSpace

    pr = _prepare(request)
    site, job, notes, cost_model, rank0 = pr.site, pr.job, pr.notes, pr.cost_model, pr.rank0
    view = None
    if request.finish is not None:
        view = _cluster_view(pr.comm, rank0)
        site, shrunk = usable_site(site, view)
        notes += shrunk
    space_options, excluded = launchable_space(site, job, request.space)
    notes += excluded
    space = PlanSpace(site, job, space_options)
    progress = ProgressBar("search", enabled=rank0 and request.progress)
    result = search(space, cost_model, options=pr.options, cache=pr.cache, comm=pr.comm, progress=progress)
    provenance = provenance_of(cost_model, site)
    if request.objective == "recommended":
        result = rule_fallback(result, site, provenance, notes)
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
                                        title=f"{job.name} on {site.name}: {result.stats.feasible:,} plans fit")))
        except OSError as e:
            raise SystemFailure(f"cannot write the plan files into {out_dir}: {e}") from None
    finish = None
    if request.finish is not None and view is not None:
        finish = rank_by_finish(request, pr, site, result, view,
                                out_dir if result.top and request.write else None, progress=request.progress)
        files += [str(c.script) for c in finish.candidates if c.script is not None]
    summary = result_to_json(result, site=site, job=job, provenance=provenance, notes=notes, files=files,
                             objective=request.objective, bands=pr.bands, run_id=run_id,
                             links=link_rows(cost_model))
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


@dataclass(kw_only=True)
class ScaleResult:
    """One scaled site's search: the site, the search result, its wall time, and for the
    best plan (the first of the request's objective ranking, as ``plan`` ranks) the pipeline
    time three ways (:func:`best_plan_check`; None when no plan fits)."""

    site: Site
    search: "SearchResult"
    wall_s: float
    best_check: dict | None


@dataclass(kw_only=True)
class ScaledSearch:
    """:func:`simulate_scales`' answer: per scaled site (the site itself first) a
    :class:`ScaleResult`; the options, notes and provenance shared by all."""

    site: Site
    job: TrainJob
    options: "SearchOptions"
    notes: list[str]
    provenance: dict[str, str]
    scales: list[ScaleResult]
    rank0: bool = True


def best_plan_check(prediction) -> dict:
    """A plan's pipeline time as the search evaluated it, by the event-driven 1F1B
    simulator, and by the textbook closed form ``sum(f+b) + (m-1) max(f+b)`` (to show how
    far off the closed form is), with the simulator's bubble fraction."""
    import numpy as np

    from .model.schedule import closed_form_ms, simulate_1f1b

    st = prediction.stages
    f = [x.forward_ms for x in st]
    b = [x.backward_ms for x in st]
    c = [x.send_ms for x in st[:-1]]
    m = prediction.num_microbatches
    v = prediction.virtual_stages
    # with v chunks the search prices 1F1B of m*v micro-batches of 1/v of each stage (the
    # event-driven simulator runs the same); the exact interleaved schedule is shown beside it
    sim = simulate_1f1b([x / v for x in f], [x / v for x in b], c, m * v)
    textbook = float(closed_form_ms(np.array(f), np.array(b), np.array(c), m))
    out = {"pipeline_ms_search": prediction.pipeline_ms, "pipeline_ms_event_driven": sim.total_ms,
           "pipeline_ms_textbook": textbook, "bubble_fraction": sim.bubble_fraction}
    if v > 1:
        from .model.schedule import simulate_interleaved
        chunks = [[x / v] * v for x in f], [[x / v] * v for x in b]
        out["pipeline_ms_interleaved_exact"] = simulate_interleaved(chunks[0], chunks[1], c + [c[-1] if c else 0.0],
                                                                    m).total_ms
    return out


def simulate_scales(request: PlanRequest, gpu_counts: tuple[int, ...] | None = None) -> ScaledSearch:
    """Search the request's site and larger copies of it (:func:`scale_site`; default 2x and
    3x its GPUs) with one cost model, as the MemX paper does for 40 and 60 GPUs. Writes nothing."""
    from .search.engine import search
    from .search.report import ProgressBar
    from .search.space import PlanSpace

    pr = _prepare(request)
    site = pr.site
    scales = gpu_counts or (site.total_gpus * 2, site.total_gpus * 3)
    out = []
    for gpus in (site.total_gpus,) + tuple(s for s in scales if s != site.total_gpus):
        s = site if gpus == site.total_gpus else scale_site(site, gpus)
        t0 = time.perf_counter()
        res = search(PlanSpace(s, pr.job, launchable_space(s, pr.job, request.space)[0]), pr.cost_model,
                     options=pr.options, cache=pr.cache,
                     comm=pr.comm,
                     progress=ProgressBar(f"search {s.total_gpus} GPUs", enabled=pr.rank0 and request.progress))
        wall = time.perf_counter() - t0
        # the best plan as 'plan' ranks it (request.objective: the recommended plan by default)
        ranked = res.ranking(request.objective)
        out.append(ScaleResult(site=s, search=res, wall_s=wall,
                               best_check=best_plan_check(ranked[0].prediction) if ranked else None))
    return ScaledSearch(site=site, job=pr.job, options=pr.options, notes=pr.notes,
                        provenance=provenance_of(pr.cost_model, site), scales=out, rank0=pr.rank0)


# --------------------------------------------------------------------------- verify


@dataclass(frozen=True, kw_only=True)
class VerifyRequest:
    """Measure plans for real (``memx-hpc verify``).

    ``search``: the site, job, store and search options; when ``plans`` is None its search
    runs first and its top ``search.top_k`` plans (in ``search.objective``'s order) are
    measured. ``plans``: (name, plan, prediction at planning time or None) to measure
    instead (:func:`plan_file_entries` reads them from plan files). ``iters`` per run (the
    first is warm-up), ``timeout_s`` per job, ``workdir`` of the jobs; ``rerun`` measures
    plans already measured with the same site, job, plan and iteration count again.
    """

    search: PlanRequest
    plans: tuple | list | None = None
    iters: int = 5
    timeout_s: float = 1800.0
    workdir: str | None = None
    rerun: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.iters, bool) or not isinstance(self.iters, int) or self.iters < 2:
            raise SpecError("at least 2 iterations (the first is warm-up)", field="--iters", found=self.iters)


@dataclass(kw_only=True)
class VerifyResult:
    """What ``verify`` measured and learned. ``rows``: per plan measured (or kept), the
    measurement against the prediction before calibration and after it (leave-one-out).
    ``calibration``: the :class:`~memx_hpc.model.calibrate.Calibration` fitted on every run of
    the site now (what plan, search and predict use from now on). ``summary``: all of it as
    JSON (what ``--json`` prints)."""

    site: Site
    job: TrainJob
    store: Path
    rows: list[VerifyRow]
    calibration: Any
    notes: list[str]
    summary: dict


def plan_file_entries(files: list[str], top: int) -> list[tuple[str, Any, dict | None]]:
    """(file, plan, prediction) of the first ``top`` plan files by their 'rank' field
    (files without one keep their order, after those with one)."""
    from .planfile import load_plan
    from .spec import GeneralPlan

    entries = []
    for i, f in enumerate(files):
        plan_ = load_plan(f)
        if isinstance(plan_, GeneralPlan):
            raise SpecError("a general plan cannot be run by Megatron-LM", file=f)
        try:
            raw = json.loads(Path(f).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raw = {}
        rank = raw.get("rank") if isinstance(raw.get("rank"), int) else None
        pred = raw.get("prediction") if isinstance(raw.get("prediction"), dict) else None
        entries.append((rank if rank is not None else 10**9, i, f, plan_, pred))
    entries.sort(key=lambda e: (e[0], e[1]))
    return [(f, plan_, pred) for _, _, f, plan_, pred in entries[:top]]


def _prediction_dict(scored) -> dict:
    d = scored.prediction.to_dict()
    d["rank"], d["time_only_rank"], d["score"] = scored.rank, scored.time_rank, scored.score
    return d


@dataclass(frozen=True, kw_only=True)
class VerifyRow:
    """One plan ``verify`` measured (or kept from an earlier run): the measurement, what was
    predicted when it was planned, and the prediction before calibration and after it
    (leave-one-out: calibrated on the site's other runs; None when there are none)."""

    plan: str
    key: str
    job_id: str
    new: bool
    measured_ms: float
    measured_peak_mib: float
    measured_allocated_mib: float
    predicted_at_the_time_ms: float | None
    before_ms: float | None
    after_ms: float | None
    before_peak_mib: float | None
    after_peak_mib: float | None
    calibrated_on_runs: int | None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _verify_row(name, rec, fresh: bool, held) -> VerifyRow:
    MiB = 2**20
    pred = rec.prediction or {}
    at_time = pred.get("iteration_ms")
    return VerifyRow(plan=str(name), key=rec.key, job_id=rec.job_id, new=fresh,
                     measured_ms=rec.iteration_ms, measured_peak_mib=rec.peak_footprint_bytes / MiB,
                     measured_allocated_mib=rec.peak_allocated_max_bytes / MiB,
                     predicted_at_the_time_ms=float(at_time) if isinstance(at_time, (int, float)) else None,
                     before_ms=held.before_ms if held else None,
                     after_ms=held.after_ms if held else None,
                     before_peak_mib=held.before_footprint_bytes / MiB if held else None,
                     after_peak_mib=held.after_footprint_bytes / MiB if held else None,
                     calibrated_on_runs=held.fitted_on if held else None)


def _rows_mape(rows: list[VerifyRow]) -> dict:
    from .model.metrics import mape

    def of(p: str, m: str) -> float | None:
        return mape([getattr(r, p) for r in rows], [getattr(r, m) for r in rows])

    return {"mape_time_before_pct": of("before_ms", "measured_ms"),
            "mape_time_after_pct": of("after_ms", "measured_ms"),
            "mape_memory_before_pct": of("before_peak_mib", "measured_peak_mib"),
            "mape_memory_after_pct": of("after_peak_mib", "measured_peak_mib")}


def verify(request: VerifyRequest) -> VerifyResult:
    """Search (or take ``request.plans``), run each plan as a short real job one after
    another, store every run in the store's end-to-end table as soon as it ends, and report
    measured against predicted before calibration and after it (leave-one-out: a run is
    never used to predict itself). SystemFailure when Slurm does not answer or a job fails."""
    import os

    from .model.calibrate import CalibratedCostModel, error_summary, leave_one_out
    from .profile.store import ProfileStore
    from .slurm.local_cluster import START_HINT, slurm_available
    from .train.measure import measure_plan, move_legacy_records, plan_key

    site, job = _load(request.search)
    if not slurm_available(timeout=5.0):
        raise SystemFailure(f"Slurm does not answer (sinfo); verify runs real jobs. {START_HINT}")
    store_path = store_paths(site, request.search.store).store
    store = ProfileStore(store_path)
    notes: list[str] = []
    moved = move_legacy_records(store, notes)

    entries = request.plans
    if entries is None:
        searched = plan(dataclasses.replace(request.search, site=site, job=job))
        notes += searched.notes
        if not searched.ranked:
            raise SpecError(f"none of the {searched.result.stats.plans:,} plans fits in memory on {site.name}"
                            + (" with the expected memory error (--objective memx ranks without it)"
                               if searched.result.top else "") + "; nothing to verify", file=job.source_file)
        entries = [(str(searched.out_dir / f"plan-{s.rank:02d}.json"), s.plan, _prediction_dict(s))
                   for s in searched.ranked[:request.search.top_k]]
        base = base_of(searched.cost_model)
    else:
        base = base_of(load_cost_model(site, job, store_path, analytic=request.search.analytic, notes=notes,
                                       progress=request.search.progress))

    done = {r.key: r for r in store.e2e_records(site=site.name)}  # the latest run of each key wins
    log_dir = Path(os.path.normpath(site.resolve(site.work_dir))) / "verify"
    measured = []
    for name, plan_, prediction in entries:
        key = plan_key(plan_, site, job, request.iters)
        if key in done and not request.rerun:
            measured.append((name, done[key], False))
            continue
        print(f"verify: running {Path(str(name)).name} ({request.iters} iterations) ...", file=sys.stderr,
              flush=True)
        rec = measure_plan(plan_, site, job, iters=request.iters, log_dir=log_dir, workdir=request.workdir,
                           timeout_s=request.timeout_s, plan_file=str(name), prediction=prediction)
        store.append_e2e([rec])  # at once: a later failure must not lose this run
        done[key] = rec
        measured.append((name, rec, True))

    records = store.e2e_records(site=site.name)
    held = {(h.key, h.job_id): h for h in leave_one_out(base, records, site, job)}
    rows = [_verify_row(name, rec, fresh, held.get((rec.key, rec.job_id))) for name, rec, fresh in measured]
    now = CalibratedCostModel(base, records, site, job).fit().calibration_
    summary = {"store": str(store_path), "plans": [r.to_dict() for r in rows], "notes": notes,
               "moved_from_jsonl": moved,
               "these_plans": _rows_mape(rows),
               "all_runs_leave_one_out": error_summary(list(held.values())),
               "calibration": {"runs": now.runs, "selection": now.selection, "time_factor": dict(now.time_factor),
                               "overhead_bytes": dict(now.overhead_bytes), "memory_scale": dict(now.memory_scale),
                               "skipped": list(now.skipped),
                               "describe": now.describe()}}
    return VerifyResult(site=site, job=job, store=store_path, rows=rows, calibration=now, notes=notes,
                        summary=summary)


# --------------------------------------------------------------------------- after the search


def submit_best(outcome: PlanResult, *, iters: int | None, workdir: str | None) -> dict:
    """Render the best plan of a search, check it with ``bash -n``, submit it; the job id
    and where things are. SystemFailure when Slurm refuses or does not answer."""
    from .slurm.render import render
    from .slurm.submit import launch

    best = outcome.ranked[0]
    out_dir = outcome.out_dir
    text = render(best.plan, outcome.site, outcome.job, iters=iters, log_dir=str(out_dir), workdir=workdir,
                  job_name=f"memx-{outcome.job.name}")
    done = launch(text, out_dir / "plan-01.sbatch", submit_job=True)
    outcome.files.append(str(done.script))
    return {"job_id": done.job_id, "script": str(done.script), "log_dir": str(out_dir), "plan_rank": best.rank}


def scale_site(site: Site, gpus: int) -> Site:
    """``site`` with every partition's node count multiplied by ``gpus / site.total_gpus``
    (rounded, at least one node)."""
    factor = gpus / site.total_gpus
    parts = tuple(dataclasses.replace(p, nodes=max(1, round(p.nodes * factor))) for p in site.partitions)
    scaled = dataclasses.replace(site, partitions=parts, name=f"{site.name}-x{factor:g}")
    if scaled.total_gpus < 1:  # pragma: no cover - nodes >= 1
        raise SpecError("scaled site has no GPUs", field="--scale", found=gpus)
    return scaled


# --------------------------------------------------------------------------- ranked by when they finish

#: The time limit a finish candidate's script asks for: its predicted run time with this
#: slack, plus a start-up allowance (imports, dataset index building and checkpoint loading
#: take minutes on a cold node), so that a run predicted a little too fast is not killed.
#: A longer limit only delays a start under backfill; the finish time does not include either.
FINISH_TIME_SLACK = 1.10
FINISH_STARTUP_MIN = 10
#: scripts asked about (one sbatch --test-only each), fastest first
MAX_FINISH_CANDIDATES = 12
#: partitions up to which every subset of them is searched for its own best plan
MAX_SUBSET_PARTITIONS = 4
FINISH_UNITS = ("iterations", "samples", "tokens")
_UNIT_WORDS = {"": "iterations", "it": "iterations", "its": "iterations", "iter": "iterations",
               "iters": "iterations", "iteration": "iterations", "iterations": "iterations",
               "sample": "samples", "samples": "samples", "seq": "samples", "seqs": "samples",
               "sequences": "samples", "tok": "tokens", "token": "tokens", "tokens": "tokens"}
_MULTIPLIERS = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12}


@dataclass(frozen=True, kw_only=True)
class FinishGoal:
    """How much training to finish: ``amount`` of ``unit`` (iterations, samples or tokens)."""

    amount: float
    unit: str = "iterations"
    text: str = ""

    def __post_init__(self) -> None:
        import math
        if self.unit not in FINISH_UNITS:
            raise SpecError("unknown unit", field="--finish", found=self.unit, allowed=", ".join(FINISH_UNITS))
        if isinstance(self.amount, bool) or not isinstance(self.amount, (int, float)) \
                or not math.isfinite(self.amount) or self.amount <= 0:
            raise SpecError("expected an amount > 0", field="--finish", found=self.amount)

    def iterations(self, job: TrainJob) -> int:
        """Iterations of ``job`` that train that much (a partial iteration counts whole)."""
        import math
        from .spec import MAX_TRAIN_ITERS
        per = {"iterations": 1, "samples": job.global_batch_size,
               "tokens": job.global_batch_size * job.model.seq_length}[self.unit]
        n = max(1, math.ceil(self.amount / per - 1e-9))
        if n > MAX_TRAIN_ITERS:
            raise SpecError(f"{self.label(job)} is {n:,} iterations", field="--finish", found=self.text or self.amount,
                            allowed=f"at most {MAX_TRAIN_ITERS:,} iterations")
        return n

    def label(self, job: TrainJob) -> str:
        if self.unit == "iterations":
            return f"{self.amount:,.0f} iterations"
        per = job.global_batch_size * (job.model.seq_length if self.unit == "tokens" else 1)
        return f"{self.amount:,.0f} {self.unit} ({per:,} per iteration)"


def parse_finish(text: str) -> FinishGoal:
    """``1000`` or ``1000it`` (iterations), ``2M samples``, ``1.5B tokens``; multipliers k, M,
    G or B, T. SpecError naming ``--finish`` for anything else."""
    import re
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][0-9]+)?)\s*([kKMGBT]?)\s*([A-Za-z]*)\s*", text or "")
    if m is None or m.group(3).lower() not in _UNIT_WORDS:
        raise SpecError("expected an amount with an optional multiplier and unit", field="--finish", found=text,
                        allowed="e.g. 1000 (iterations), 5000it, 2M samples, 1.5Btokens; multipliers k, M, G/B, T")
    return FinishGoal(amount=float(m.group(1)) * _MULTIPLIERS[m.group(2)], unit=_UNIT_WORDS[m.group(3).lower()],
                      text=text.strip())


@dataclass(frozen=True, kw_only=True)
class FinishCandidate:
    """One candidate plan with Slurm's answer. ``components``: (partition, nodes) per hetjob
    component; ``wait_s``: from asking to the expected start; ``finish_at``: the expected
    start + ``iterations`` x the predicted iteration time (start-up not included); None
    where Slurm gave no start. ``script``: the sbatch script Slurm was asked about."""

    scored: Any
    sources: tuple[str, ...]
    iterations: int
    run_s: float
    time_limit_min: int
    components: tuple[tuple[str, int], ...]
    estimate: Any
    asked_at: Any
    script: Path | None = None
    rank: int = 0
    notes: tuple[str, ...] = ()

    @property
    def _now(self):
        # Slurm answers in whole seconds: a job that starts at once reads as this second
        return self.asked_at.replace(microsecond=0)

    @property
    def wait_s(self) -> float | None:
        return self.estimate.wait_s(self._now) if self.estimate.accepted else None

    @property
    def start_at(self):
        if not self.estimate.accepted or self.estimate.start is None:
            return None
        return max(self.estimate.start, self._now)

    @property
    def finish_at(self):
        from datetime import timedelta
        start = self.start_at
        return None if start is None else start + timedelta(seconds=self.run_s)

    def to_json(self) -> dict:
        from .search.report import scored_to_dict
        e = self.estimate
        fin = self.finish_at
        return {"rank": self.rank, "sources": list(self.sources), "iterations": self.iterations,
                "iteration_s": self.scored.prediction.iteration_ms / 1e3, "run_s": self.run_s,
                "time_limit_min": self.time_limit_min, "components": [list(c) for c in self.components],
                "asked_at": self.asked_at.isoformat(timespec="seconds"),
                "slurm": {"accepted": e.accepted, "message": e.message,
                          "start": e.start.isoformat(timespec="seconds") if e.start else None,
                          "nodes": list(e.nodes), "processors": e.processors},
                "wait_s": self.wait_s,
                "start": self.start_at.isoformat(timespec="seconds") if self.start_at else None,
                "finish": fin.isoformat(timespec="seconds") if fin else None,
                "script": str(self.script) if self.script else None, "notes": list(self.notes),
                "plan": scored_to_dict(self.scored)}


@dataclass(frozen=True, kw_only=True)
class FinishRanking:
    """The candidates by expected finish (those Slurm gave no start, then those it refused,
    last), the goal, and what the user should know."""

    goal: FinishGoal
    iterations: int
    candidates: tuple[FinishCandidate, ...]
    notes: tuple[str, ...] = ()

    @property
    def best(self) -> FinishCandidate | None:
        c = self.candidates[0] if self.candidates else None
        return c if c is not None and c.finish_at is not None else None

    def to_json(self) -> dict:
        return {"goal": {"amount": self.goal.amount, "unit": self.goal.unit, "text": self.goal.text},
                "iterations": self.iterations, "candidates": [c.to_json() for c in self.candidates],
                "notes": list(self.notes)}


def _node_fits(node, p, vendor: str) -> bool:
    """Whether a Slurm node carries what the site partition asks of each node."""
    if p.gres_type is not None:
        return any(g.type == p.gres_type and g.count >= p.gpus_per_node for g in node.gpus)
    if vendor != "cpu":
        return sum(g.count for g in node.gpus) >= p.gpus_per_node
    return True


def usable_site(site: Site, view) -> tuple[Site, list[str]]:
    """``site`` with each partition's nodes cut to those Slurm can give a job now (down,
    drained, draining, failing, reserved nodes and nodes without the partition's GPUs left
    out), partitions without any dropped; the notes say what was left out. SpecError for a
    site partition Slurm does not have; SystemFailure when no partition keeps a node."""
    from .spec import _suggest
    notes: list[str] = []
    parts = []
    names = [p.name for p in view.partitions]
    for i, p in enumerate(site.partitions):
        if view.partition(p.name) is None:
            raise SpecError("not a partition of this Slurm cluster" + _suggest(p.name, names),
                            file=site.source_file, field=f"partitions[{i}].name", found=p.name,
                            allowed=", ".join(names))
        vendor = site.gpu(p.gpu_type).vendor
        fits, held, misfit = [], [], 0
        for node, verdict in view.verdicts(p.name):
            if not _node_fits(node, p, vendor):
                misfit += 1
            elif verdict.usable:
                fits.append(node)
            else:
                held.append(f"{node.name} {verdict.why}")
        n = min(p.nodes, len(fits))
        ask = f"gpu:{p.gres_type}:{p.gpus_per_node}" if p.gres_type else f"{p.gpus_per_node} GPUs"
        if held:
            more = f"; and {len(held) - 4} more" if len(held) > 4 else ""
            notes.append(f"{p.name}: {len(held)} node{'s' if len(held) != 1 else ''} a job cannot get now, not "
                         f"planned on: " + "; ".join(held[:4]) + more)
        if n == 0:
            why = (f"no node of Slurm partition {p.name} carries {ask}" if not held and misfit else
                   "no node a job can get now")
            notes.append(f"{p.name}: {why}; left out of the plans")
            continue
        if n < p.nodes:
            notes.append(f"{p.name}: planned on {n} of the site's {p.nodes} nodes (Slurm can give {len(fits)} "
                         f"with {ask} now)")
        parts.append(dataclasses.replace(p, nodes=n) if n != p.nodes else p)
    if not parts:
        raise SystemFailure(f"no partition of site {site.name} has a node a job can get now: " + "; ".join(notes))
    kept = {p.name for p in parts}
    return dataclasses.replace(site, partitions=tuple(parts),
                               links=tuple(lk for lk in site.links if lk.a in kept and lk.b in kept)), notes


def _cluster_view(comm, rank0: bool):
    """Slurm's view, read once (rank 0) and shared, so that every rank searches the same site."""
    from .slurm.discover import read_cluster
    if comm is None:
        return read_cluster()
    view, failure = None, None
    if rank0:
        try:
            view = read_cluster()
        except SystemFailure as e:
            failure = str(e)
    view, failure = comm.bcast((view, failure), root=0)
    if failure is not None:
        raise SystemFailure(failure)
    return view


def _subsets(names: list[str]) -> list[tuple[str, ...]]:
    """Partition sets whose own best plan is a candidate: every proper subset for a few
    partitions, else each one alone and each one left out."""
    import itertools
    if len(names) <= 1:
        return []
    if len(names) <= MAX_SUBSET_PARTITIONS:
        return [c for k in range(1, len(names)) for c in itertools.combinations(names, k)]
    return [(n,) for n in names] + [tuple(x for x in names if x != n) for n in names]


def rank_by_finish(request: PlanRequest, pr: "_Prepared", site: Site, result, view, out_dir: Path | None, *,
                   progress: bool = True) -> FinishRanking:
    """The candidates ranked by when they would finish ``request.finish`` of training.

    Candidates: the ranking's plans and, for each set of partitions (:func:`_subsets`), the
    best plan on those partitions alone (on a busy cluster the plan that can start is often
    not among the fastest); of the plans that ask Slurm for the same nodes, the fastest.
    Each is rendered (``--train-iters`` N, a time limit of its predicted run: see
    FINISH_TIME_SLACK) and Slurm is asked when it would start it (``sbatch --test-only``);
    the ranking is by that start + N x the predicted iteration time. Scripts are written as
    ``finish-NN.sbatch`` into ``out_dir`` in that order (nowhere when it is None)."""
    import math
    import tempfile
    from datetime import datetime

    from .search.engine import search
    from .search.space import PlanSpace
    from .slurm import render as rs
    from .slurm.estimate import estimate_start
    from .slurm.submit import launch
    from .spec import MAX_TIME_LIMIT_MIN

    goal, job = request.finish, pr.job
    iters = goal.iterations(job)
    notes: list[str] = []
    pool: list[tuple[Any, str]] = [(s, f"#{s.rank} of the ranking") for s in result.ranking(request.objective)]
    for names in _subsets([p.name for p in site.partitions]):
        sub = dataclasses.replace(site, partitions=tuple(p for p in site.partitions if p.name in names),
                                  links=tuple(lk for lk in site.links if lk.a in names and lk.b in names))
        try:
            r = search(PlanSpace(sub, job, launchable_space(sub, job, request.space)[0]), pr.cost_model,
                       options=pr.options, cache=pr.cache,
                       comm=None, progress=None)
        except SpecError as e:  # a subset on which no plan can be built (too few GPUs for the model)
            notes.append(f"no plan searched on {'+'.join(names)} alone: {e}")
            continue
        best = r.ranking(request.objective)
        if best:
            pool.append((best[0], f"best on {'+'.join(names)}"))
    # one candidate per Slurm request (the same nodes per component): the fastest plan of it
    by_request: dict[tuple, list] = {}
    for s, source in pool:
        try:
            req = rs.describe(s.plan, site, job, iters=iters)
        except SpecError as e:
            notes.append(f"{source} cannot be rendered: {e}")
            continue
        # the same nodes in another component order is the same request to Slurm
        key = tuple(sorted((c.partition, c.nodes, c.tasks_per_node) for c in req.components))
        have = by_request.get(key)
        if have is None or s.prediction.iteration_ms < have[0].prediction.iteration_ms:
            by_request[key] = [s, (have[1] if have else ()) + (source,)]
        else:
            have[1] = have[1] + (source,)
    chosen = sorted(by_request.items(), key=lambda kv: kv[1][0].prediction.iteration_ms)
    if len(chosen) > MAX_FINISH_CANDIDATES:
        notes.append(f"{len(chosen)} distinct Slurm requests among the candidates; asked about the "
                     f"{MAX_FINISH_CANDIDATES} fastest")
        chosen = chosen[:MAX_FINISH_CANDIDATES]
    if progress:
        print(f"finish: asking Slurm when each of {len(chosen)} candidate plans would start (sbatch --test-only)",
              file=sys.stderr, flush=True)
    shared = _shared_nodes(view, site)
    tmp = tempfile.TemporaryDirectory(prefix="memx-finish-") if out_dir is None else None
    where = Path(tmp.name) if tmp is not None else out_dir
    cands: list[FinishCandidate] = []
    try:
        for k, (key, (s, sources)) in enumerate(chosen):
            run_s = iters * s.prediction.iteration_ms / 1e3
            need_min = math.ceil(run_s * FINISH_TIME_SLACK / 60) + FINISH_STARTUP_MIN
            limits = [view.partition(part).max_time_min for part, _, _ in key]
            cap = min([m for m in limits if m is not None], default=None)
            limit = min(need_min, cap if cap is not None else MAX_TIME_LIMIT_MIN, MAX_TIME_LIMIT_MIN)
            cnotes = []
            if limit < need_min:
                cnotes.append(f"needs {need_min:,} min, the partitions allow {limit:,}: the run takes "
                              f"{math.ceil(need_min / limit)} jobs (checkpoint, resubmit); later waits not counted")
            parts_used = {part for part, _, _ in key}
            if any(a in parts_used and b in parts_used for a, b in shared):
                cnotes.append("its partitions share nodes: Slurm's --test-only answer for a hetjob whose "
                              "components may share a node is not reliable")
            timed = dataclasses.replace(site, time_limit_min=limit, partitions=tuple(
                dataclasses.replace(p, time_limit_min=None) for p in site.partitions))
            script = where / f".finish-{k:02d}.sbatch"
            # written as every script is (bash -n, its log folder); Slurm is asked below
            launch(rs.render(s.plan, timed, job, iters=iters, job_name=f"memx-{job.name}", log_dir=str(where)),
                   script)
            asked = datetime.now().astimezone()
            est = estimate_start(script)
            cands.append(FinishCandidate(scored=s, sources=tuple(sources), iterations=iters, run_s=run_s,
                                         time_limit_min=limit, components=tuple((p, n) for p, n, _ in key),
                                         estimate=est, asked_at=asked, script=script, notes=tuple(cnotes)))
        ranked = []
        for r, c in enumerate(finish_order(cands), start=1):
            final = None
            if tmp is None:
                final = where / f"finish-{r:02d}.sbatch"
                c.script.replace(final)
            ranked.append(dataclasses.replace(c, rank=r, script=final))
    except OSError as e:
        raise SystemFailure(f"cannot write the finish scripts into {where}: {e}") from None
    finally:
        if tmp is not None:
            tmp.cleanup()
    refused = [c for c in ranked if not c.estimate.accepted]
    if refused:
        notes.append(f"Slurm would not place {len(refused)} candidate{'s' if len(refused) != 1 else ''}: "
                     + "; ".join(f"#{c.rank}: {c.estimate.message}" for c in refused[:3]))
    notes.append("finish = Slurm's expected start (sbatch --test-only, the backfill scheduler's estimate from the "
                 "running jobs' time limits, the queue and reservations) + iterations x predicted iteration time; "
                 "start-up and checkpoint time are not included")
    return FinishRanking(goal=goal, iterations=iters, candidates=tuple(ranked), notes=tuple(notes))


def finish_order(cands: list[FinishCandidate]) -> list[FinishCandidate]:
    """By expected finish, then run time, then the order given; those Slurm accepted without
    a start time next, those it refused last."""
    def key_of(ic: tuple[int, FinishCandidate]):
        i, c = ic
        fin = c.finish_at
        group = 0 if fin is not None else (1 if c.estimate.accepted else 2)
        return (group, fin.timestamp() if fin is not None else 0.0, c.run_s, i)
    return [c for _, c in sorted(enumerate(cands), key=key_of)]


def _shared_nodes(view, site: Site) -> list[tuple[str, str]]:
    sets = {p.name: {n.name for n in view.nodes_of(p.name)} for p in site.partitions}
    names = list(sets)
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if sets[a] & sets[b]]


def submit_finish(outcome: PlanResult) -> dict:
    """Submit the script of the plan that finishes first (``finish-01.sbatch``); the job id."""
    from .slurm.submit import check_syntax, submit

    best = outcome.finish.best if outcome.finish is not None else None
    if best is None or best.script is None:
        raise SystemFailure("--submit: no candidate plan has a start time from Slurm; nothing was submitted")
    check_syntax(best.script)
    job_id = submit(best.script)
    return {"job_id": job_id, "script": str(best.script), "log_dir": str(best.script.parent),
            "plan_rank": best.scored.rank, "finish_rank": best.rank}
