"""Searching a site and larger copies of it with one cost model (``memx-hpc simulate``)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from ..errors import SpecError
from ..model.assemble import provenance_of
from ..model.compose import Prediction
from ..model.schedule import closed_form_ms, simulate_1f1b, simulate_interleaved
from ..search.engine import SearchOptions, SearchResult, search
from ..search.report import ProgressBar
from ..spec import MAX_NODES, Site, TrainJob
from .conductor import load_specs, prepare
from .request import PlanRequest
from .precision import search_precisions
from .space import launchable_space

__all__ = ["ScaleResult", "ScaledSearch", "best_plan_check", "simulate_scales", "scale_site", "max_scale_gpus"]


@dataclass(kw_only=True)
class ScaleResult:
    """One scaled site's search: the site, the search result, its wall time, and for the
    best plan (the first of the request's objective ranking, as ``plan`` ranks) the pipeline
    time three ways (:func:`best_plan_check`; None when no plan fits)."""

    site: Site
    search: SearchResult
    wall_s: float
    best_check: dict | None


@dataclass(kw_only=True)
class ScaledSearch:
    """:func:`simulate_scales`' answer: per scaled site (the site itself first) a
    :class:`ScaleResult`; the options, notes and provenance shared by all."""

    site: Site
    job: TrainJob
    options: SearchOptions
    notes: list[str]
    provenance: dict[str, str]
    scales: list[ScaleResult]
    rank0: bool = True


def best_plan_check(prediction: Prediction) -> dict:
    """A plan's pipeline time as the search evaluated it, by the event-driven 1F1B
    simulator, and by the textbook closed form ``sum(f+b) + (m-1) max(f+b)`` (to show how
    far off the closed form is), with the simulator's bubble fraction."""
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
        chunks = [[x / v] * v for x in f], [[x / v] * v for x in b]
        out["pipeline_ms_interleaved_exact"] = simulate_interleaved(chunks[0], chunks[1], c + [c[-1] if c else 0.0],
                                                                    m).total_ms
    return out


def simulate_scales(request: PlanRequest, gpu_counts: tuple[int, ...] | None = None) -> ScaledSearch:
    """Search the request's site and larger copies of it (:func:`scale_site`; default 2x and
    3x its GPUs) with one cost model, as the MemX paper does for 40 and 60 GPUs. Writes nothing."""
    site, _ = load_specs(request)
    for gpus in gpu_counts or ():
        scale_site(site, gpus)  # an out-of-range count stops here, before the cost model is built
    pr = prepare(dataclasses.replace(request, site=site))
    site = pr.site
    scales = gpu_counts or (site.total_gpus * 2, site.total_gpus * 3)
    out = []
    for gpus in (site.total_gpus,) + tuple(s for s in scales if s != site.total_gpus):
        s = site if gpus == site.total_gpus else scale_site(site, gpus)
        t0 = time.perf_counter()
        # a job that lets the search choose FP8 is searched in both precisions at every scale;
        # the notes say so once
        res = search_precisions(s, pr.job, request.space, launchable_space(s, pr.job, request.space)[0],
                                lambda space, step: search(space, pr.cost_model, options=pr.options, cache=pr.cache,
                                                           comm=pr.comm, progress=step),
                                pr.notes if not out else [], top_k=pr.options.top_k,
                                progress=ProgressBar(f"search {s.total_gpus} GPUs",
                                                     enabled=pr.rank0 and request.progress))
        wall = time.perf_counter() - t0
        # the best plan as 'plan' ranks it (request.objective: the recommended plan by default)
        ranked = res.ranking(request.objective)
        out.append(ScaleResult(site=s, search=res, wall_s=wall,
                               best_check=best_plan_check(ranked[0].prediction) if ranked else None))
    return ScaledSearch(site=site, job=pr.job, options=pr.options, notes=pr.notes,
                        provenance=provenance_of(pr.cost_model, site), scales=out, rank0=pr.rank0)


def max_scale_gpus(site: Site) -> int:
    """The most GPUs :func:`scale_site` can scale ``site`` to: its largest partition then
    holds :data:`memx_hpc.spec.MAX_NODES` nodes."""
    return max(1, MAX_NODES * site.total_gpus // max(p.nodes for p in site.partitions))


def scale_site(site: Site, gpus: int) -> Site:
    """``site`` with every partition's node count multiplied by ``gpus / site.total_gpus``
    (rounded, at least one node). SpecError naming ``--scale`` and its range for a GPU count
    outside 1 .. :func:`max_scale_gpus`."""
    most = max_scale_gpus(site)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= most:
        raise SpecError(f"GPU counts to scale site {site.name} to ({site.total_gpus} GPUs now) run from 1 to "
                        f"{most:,}: its largest partition then has {MAX_NODES:,} nodes", field="--scale",
                        found=gpus, allowed=f"1 to {most:,}")
    factor = gpus / site.total_gpus
    parts = tuple(dataclasses.replace(p, nodes=max(1, round(p.nodes * factor))) for p in site.partitions)
    scaled = dataclasses.replace(site, partitions=parts, name=f"{site.name}-x{factor:g}")
    if scaled.total_gpus < 1:  # pragma: no cover - nodes >= 1
        raise SpecError("scaled site has no GPUs", field="--scale", found=gpus)
    return scaled
