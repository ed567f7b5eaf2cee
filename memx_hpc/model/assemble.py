"""Assembling the cost model from the profile store and the site (:func:`load_cost_model`).

One :class:`~memx_hpc.model.assembled.AssembledCostModel` comes out: the predictor fitted on
the store for the GPU types it has samples of (fitted or reloaded), the datasheet roofline
for the rest, calibrated by the site's end-to-end runs; the site's links with their
provenance; how the store's disagreeing sources were settled; per GPU type what its
numbers rest on; and the notes, in words. The planner, ``predict`` and the benchmarks all
build it here.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..spec import LayerSample, Site, TrainJob
from .api import AnalyticCostModel, Basis, kernels_of, with_store_figures
from .assembled import AssembledCostModel
from .calibrate import CalibratedCostModel
from .compose import predict_plan
from .memory import memory_scale_of
from .queries import layer_query
from .links import LinkModel, link_notes, load_links
from .routed import RoutedCostModel
from .sources import SourceReport, cases_from_records, resolve, shipped_preferences

if TYPE_CHECKING:
    from ..profile.store import ProfileStore
    from .api import CostModel

__all__ = ["MIN_TYPES_FOR_DATASHEET_TRANSFER", "StorePaths", "store_paths", "start_store", "load_cost_model",
           "calibrated", "base_of", "eager_layer_notes", "consistent_sources", "provenance_of", "bases_of"]

#: profiled GPU types a store needs before the predictor estimates unprofiled types itself
MIN_TYPES_FOR_DATASHEET_TRANSFER = 3


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


def _open_store(store_path: Path) -> "ProfileStore":
    # h5py is imported with the store, which light commands (--help, status) do without
    from ..profile.store import ProfileStore
    return ProfileStore(store_path)


# --------------------------------------------------------------------------- the store


def start_store(site: Site, store_path: Path, notes: list[str], *, reference: bool | None = None,
                progress: bool = True) -> None:
    """A store that does not exist yet starts from the shipped reference profiles
    (Sailor's and Cephalo's published measurements, labelled ``imported``) when the site
    wants them (:func:`memx_hpc.profile.reference.wanted`; ``reference`` overrides the
    site's ``reference_data``). An existing store is left as it is. Says so in ``notes``."""
    from ..errors import SystemFailure
    if store_path.exists():
        return
    # the reference importers read the shipped tables: only when a store is started
    from ..profile.reference import seed_store, wanted
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


# --------------------------------------------------------------------------- the cost model


def load_cost_model(site: Site, job: TrainJob, store_path: Path, *, analytic: bool, notes: list[str],
                    fit: bool = True, calibrate: bool = True, progress: bool = True,
                    reference: bool | None = None) -> AssembledCostModel:
    """The cost model for ``site``: the predictor fitted on the store for GPU types it has
    samples of (fitted or reloaded: see fit_or_load), the datasheet roofline for the rest;
    calibrated by the end-to-end runs the store holds for the site (see
    :mod:`memx_hpc.model.calibrate`) unless ``calibrate`` is False or ``analytic`` is set.
    ``progress``: say on stderr when the predictor is fitted or reloaded, and how long it took.
    A store that does not exist yet is started from the reference profiles first
    (:func:`start_store`; ``reference`` as there) unless ``analytic``. What it found is
    appended to ``notes`` and kept in the result's ``notes``."""
    found: list[str] = []
    if not analytic:
        # a folder, /dev/null or a dangling link there is no "missing store": is_file() below
        # would read it so and plan from datasheet figures without a word (exit 2 instead)
        from ..profile.store import check_store_path  # with h5py, as _open_store
        check_store_path(store_path)
        start_store(site, store_path, found, reference=reference, progress=progress)
    store = _open_store(store_path)  # one object: the file is read once, however many parts read it
    layers, sources = _uncalibrated_cost_model(site, job, store_path, analytic=analytic, notes=found, fit=fit,
                                               progress=progress, store=store)
    # every p2p and collective of the composition reads the site's link curves: measured
    # and imported ones from the store, the site's figures (labelled so) for the rest
    links = load_links(site, store_path if store_path.is_file() else None)
    found.extend(link_notes(links))
    base = layers
    if not (analytic or not calibrate or not store_path.is_file()):
        layers = calibrated(layers, site, job, store_path, found, links=links, store=store)
    notes.extend(found)
    return AssembledCostModel(layers=layers, base=base, links=links, sources=sources,
                              bases=bases_of(layers, site), memory_scale=memory_scale_of(layers, site),
                              notes=tuple(found))


def calibrated(model: "CostModel", site: Site, job: TrainJob, store_path: Path, notes: list[str], *,
               links: LinkModel | None = None, store: "ProfileStore | None" = None) -> "CostModel":
    """``model`` wrapped in the calibration from the store's end-to-end runs of ``site``
    (``model`` itself when there are none), composing the runs over ``links``; what was
    used goes into ``notes``. ``store``: the ProfileStore of ``store_path`` when the caller
    has one (its snapshot is reused)."""
    records = (store if store is not None else _open_store(store_path)).e2e_records(site=site.name)
    if not records:
        return model
    cm = CalibratedCostModel(model, records, site, job, links=links).fit()
    cal = cm.calibration_
    if not cal.runs:
        notes.append(f"end-to-end runs in {store_path} not used for calibration: " + "; ".join(cal.skipped[:3]))
        return model
    notes.append(f"calibrated by end-to-end runs (memx-hpc verify): {cal.describe()}"
                 + (f"; {len(cal.skipped)} run(s) left out" if cal.skipped else "")
                 + "; its held-out (leave-one-out) error: memx-hpc verify")
    return cm


def base_of(model: "AssembledCostModel | CostModel") -> "CostModel":
    """The layer model under a calibration (the model itself when it is not calibrated)."""
    if isinstance(model, AssembledCostModel):
        return model.base
    return model.base if isinstance(model, CalibratedCostModel) else model


def _covered_types(site: Site, samples: Sequence[LayerSample], site_gpus: list[str],
                   notes: list[str]) -> tuple[list[str], list[str]]:
    """The site's GPU types the store covers (samples of their own, or of another type of
    their chip: gpus.yaml chip: V100-32 answers with V100-16's measured layer times, its own
    memory) and those it does not."""
    have, have_chips = set(), {}
    for s in samples:
        try:
            g = site.gpu(s.point.gpu_type)
        except Exception:  # a GPU type this site does not know: still training data
            continue
        have.add(g.name)
        have_chips.setdefault(g.chip_id, g.name)
    covered = [g for g in site_gpus if site.gpu(g).name in have or site.gpu(g).chip_id in have_chips]
    for g in covered:
        if site.gpu(g).name not in have:
            notes.append(f"{g}: no samples of its own; layer times from {have_chips[site.gpu(g).chip_id]} "
                         f"(same chip), memory from its own size")
    return covered, [g for g in site_gpus if g not in covered]


def _uncalibrated_cost_model(site: Site, job: TrainJob, store_path: Path, *, analytic: bool, notes: list[str],
                             fit: bool = True, progress: bool = True, store: "ProfileStore | None" = None
                             ) -> tuple["CostModel", SourceReport | None]:
    """The layer model before calibration, and the report of the store's disagreeing sources
    (None where no predictor answers)."""
    fallback = AnalyticCostModel(site)
    site_gpus = sorted({p.gpu_type for p in site.partitions})
    if analytic:
        notes.append("--analytic: every number is a datasheet roofline estimate")
        return fallback, None
    if not store_path.is_file():
        notes.append(f"no profile store at {store_path}: every number is estimated from datasheet figures "
                     f"(run 'memx-hpc plan' or 'memx-hpc profile' to measure)")
        return fallback, None
    store = store if store is not None else _open_store(store_path)
    samples = store.samples()
    # CPU "devices" (measured_at_profile_time): the speeds measured when profiling, as
    # memx-hpc fit uses them, so both fit the same model from the same figures
    gpus = with_store_figures(site, store)
    fallback = AnalyticCostModel(gpus)
    if not samples:
        notes.append(f"the profile store {store_path} is empty: estimates from datasheet figures only")
        return fallback, None
    covered, missing = _covered_types(site, samples, site_gpus, notes)
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
        return fallback, None
    if not fit:
        return fallback, None
    try:
        # XGBoost is imported here, only when a predictor is fitted or reloaded
        from .predictor import fit_or_load  # noqa: F401 - the check that XGBoost imports
    except ImportError as e:  # xgboost missing from this installation
        notes.append(f"the predictor cannot be loaded ({e}): estimates from datasheet figures only")
        return fallback, None
    samples, sources = consistent_sources(samples, gpus, site, store, notes)
    predictor = _fitted(samples, gpus, site, store_path, covered, progress=progress)
    notes.extend(_unprofiled_shape_notes(predictor, job, covered))
    notes.extend(eager_layer_notes(site, job, samples, covered))
    if transfer:
        notes.append(f"no samples for {', '.join(missing)} in {store_path}: the predictor estimates those "
                     f"GPU types from their datasheet figures and the {len(layer_types)} profiled types")
        return RoutedCostModel(_routes(site, site_gpus, predictor), fallback), sources
    if missing:
        notes.append(f"no samples for {', '.join(missing)} in {store_path}: those GPU types use the datasheet "
                     f"roofline (AnalyticCostModel)")
    return RoutedCostModel(_routes(site, covered, predictor), fallback), sources


def _fitted(samples: Sequence[LayerSample], gpus, site: Site, store_path: Path, covered: list[str], *,
            progress: bool):
    """The predictor fitted on ``samples`` (or reloaded from beside the store), saying so on stderr."""
    from .predictor import fit_or_load
    model_path = store_paths(site, store_path).predictor
    t0 = time.perf_counter()

    def say(line: str) -> None:
        if progress:
            print(line, file=sys.stderr, flush=True)

    say(f"predictor: reusing {model_path} or fitting it on {len(samples):,} samples from {store_path} ...")
    predictor = fit_or_load(samples, model_path, gpus, progress=say)
    say(f"predictor: ready in {time.perf_counter() - t0:.1f} s (covers {', '.join(covered) or 'no site GPU type'})")
    return predictor


def _unprofiled_shape_notes(predictor, job: TrainJob, covered: list[str]) -> list[str]:
    """A note per covered GPU type on which the job's layer shape was never profiled."""
    out = []
    for g in covered:
        q = layer_query(job, g, kind="layer", tp=1, micro_batch_size=1, recompute="none", sequence_parallel=False)
        if not predictor.shape_profiled(q):
            out.append(f"{g}: {job.name}'s layer shape ({job.precision}, {job.attention}) was never profiled on "
                       f"this chip: its layer times are the chip's measured efficiency scaled to the work "
                       f"(extrapolated; profile it for measured times)")
    return out


def eager_layer_notes(site: Site, job: TrainJob, samples: Sequence[LayerSample], covered: Sequence[str]) -> list[str]:
    """A note per site GPU type whose layer samples of the job's attention kernel all come
    from plain-PyTorch layers (:data:`memx_hpc.model.api.EAGER_SOURCES`: Cephalo's Hugging Face
    layers): its layer times are those layers' as measured, while the plan runs Megatron's
    fused ones, and an unprofiled type beside it is priced as Megatron's."""
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


def consistent_sources(samples: Sequence[LayerSample], gpus, site: Site, store: "ProfileStore | None",
                       notes: list[str]) -> tuple[list[LayerSample], SourceReport]:
    """The store's samples with disagreeing sources settled (:func:`memx_hpc.model.sources.resolve`:
    the site's ``prefer_source``, else the store's end-to-end runs of the site, else the shipped
    evidence), and the report; the site's GPU types' disagreements go into ``notes``."""
    # XGBoost: imported with the predictor, only when one is fitted
    from .predictor import Predictor
    cases = cases_from_records(store.e2e_records(site=site.name), site) if store is not None else []
    out, report = resolve(samples, gpus, prefer=dict(site.prefer_source) or None, cases=cases,
                          fit=lambda ss: Predictor().fit(ss, gpus),
                          predict_ms=lambda m, c: predict_plan(c.plan, c.site, c.job, m).iteration_ms,
                          evidence="end-to-end runs in the store",
                          prior=shipped_preferences())
    names = set()
    for p in site.partitions:
        g = site.gpu(p.gpu_type)
        names |= {g.name, p.gpu_type, *g.aliases}
    notes.extend(report.notes(sorted(names)))
    return out, report


def _routes(site: Site, names: Sequence[str], model) -> dict:
    """``model`` for each of ``names`` under every name it goes by (site name, catalog name,
    aliases: a query may carry any of them, e.g. Sailor's ``GH-96`` for ``GH200``)."""
    out = {}
    for g in names:
        t = site.gpu(g)
        for n in (g, t.name, *t.aliases):
            out[n] = model
    return out


def provenance_of(cost_model: "AssembledCostModel | CostModel", site: Site) -> dict[str, str]:
    """Per GPU type of ``site``: where the cost model's numbers for it come from, as reports write it."""
    return {g: cost_model.provenance(g) for g in sorted({p.gpu_type for p in site.partitions})}


def bases_of(cost_model: "AssembledCostModel | CostModel", site: Site) -> dict[str, Basis]:
    """Per GPU type of ``site``: the cost model's :class:`~memx_hpc.model.api.Basis` for it."""
    return {g: cost_model.basis(g) for g in sorted({p.gpu_type for p in site.partitions})}
