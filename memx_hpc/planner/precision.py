"""FP8 searched beside 16-bit matmuls (a job's ``fp8: [none, FORMAT]``): the plan space is
searched once per precision and the two rankings merged into one (:func:`search_precisions`).

The FP8 pass is the same search as a job with ``fp8: FORMAT`` runs: its space keeps the
partitions whose GPUs have an fp8 rate in the catalog and leaves cross-vendor plans out (the
project's cross-vendor entry has no FP8 path: :func:`memx_hpc.slurm.render.fp8_refusal`), and
the cost model prices its layers at each GPU's fp8 rate with Transformer Engine's casts. Each
plan of the merged ranking states the precision it runs (``Plan.fp8``), so predict, render and
verify price and launch it as searched (:func:`memx_hpc.spec.job_for_plan`)."""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from ..search.engine import ParetoPoint, ScoredPlan, SearchResult, SearchStats
from ..search.objective import band_order, in_time_band, tie_key
from ..search.space import PlanSpace, SpaceOptions
from ..spec import Plan, Site, TrainJob
from .space import launchable_space

__all__ = ["fp8_pass_job", "search_precisions", "merge_results"]

#: one search: a space in, its ranked result out (the conductor's call of the engine)
SearchFn = Callable[[PlanSpace, Callable[[int, int], None] | None], SearchResult]


def fp8_pass_job(job: TrainJob) -> TrainJob:
    """The job as its FP8 pass searches it: every plan in ``job.fp8_search``."""
    return dataclasses.replace(job, fp8=job.fp8_search, fp8_search="")


def search_precisions(site: Site, job: TrainJob, requested: SpaceOptions, space_options: SpaceOptions,
                      run: SearchFn, notes: list[str], *, top_k: int,
                      progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Search ``job`` on ``site``: one pass (``space_options``, the 16-bit or fixed-FP8 space,
    as before) when the job does not search FP8; else a 16-bit pass and an FP8 pass of the
    same space options (``requested``, made launchable for the FP8 job), merged into one
    ranking whose plans state their FP8. ``notes`` gains what was searched and why a
    partition was left out of the FP8 pass."""
    if not job.fp8_search:
        return run(PlanSpace(site, job, space_options), progress)
    plain = dataclasses.replace(job, fp8_search="", fp8_param_gather=False)
    fp8_job = fp8_pass_job(job)
    fp8_options, fp8_notes = launchable_space(site, fp8_job, requested)
    spaces = [PlanSpace(site, plain, space_options), PlanSpace(site, fp8_job, fp8_options)]
    without = sorted({p.name for p in site.partitions if site.gpu(p.gpu_type).peak_tflops_fp8 <= 0})
    said = (f"fp8: [none, {job.fp8_search}] (recipe {job.fp8_recipe}): each plan searched in 16 bits "
            f"({len(spaces[0]):,} plans) and in FP8 ({len(spaces[1]):,} plans), one ranking")
    if without:
        said += (f"; left out of the FP8 pass: partition{'s' if len(without) > 1 else ''} {', '.join(without)} "
                 f"(no fp8 rate in the catalog for {'their' if len(without) > 1 else 'its'} GPU)")
    notes.append(said)
    notes += [f"FP8 pass: {n}" for n in fp8_notes if "cross-vendor" in n]
    total = sum(len(s) for s in spaces)
    results = []
    offset = 0
    for space in spaces:
        if not len(space) and (results or len(spaces[-1])):
            continue  # an empty pass adds nothing (the first one is searched when both are empty)
        step = None if progress is None else (lambda d, t, o=offset: progress(o + d, total))
        results.append((space, offset, run(space, step)))
        offset += len(space)
    return merge_results([(r, off, space.job) for space, off, r in results], top_k=top_k)


def _stated(plan: Plan, job: TrainJob) -> Plan:
    """``plan`` stating the precision its pass priced it in."""
    return dataclasses.replace(plan, fp8=job.fp8, fp8_recipe=job.fp8_recipe if job.fp8 else None)


def merge_results(parts: list[tuple[SearchResult, int, TrainJob]], *, top_k: int) -> SearchResult:
    """One ranking of the results of several passes (``(result, index offset, the pass's
    job)``): plan indices shifted by their pass's offset (distinct across passes), plans
    stating their FP8, each list re-ranked by the engine's own keys (score; time; the
    recommended rule's time band, tie key and time), the Pareto front recomputed. A plan's
    ``time_rank`` counts the faster plans of its own pass and the faster reported plans of
    the others."""
    def tagged(r: SearchResult, off: int, job: TrainJob, name: str) -> list[ScoredPlan]:
        return [dataclasses.replace(s, index=s.index + off, plan=_stated(s.plan, job)) for s in getattr(r, name)]

    def rows(name: str) -> list[ScoredPlan]:
        return [s for r, off, job in parts for s in tagged(r, off, job, name)]

    fastest = sorted(rows("time_top"), key=lambda s: (s.prediction.iteration_ms, s.index))
    owner = {}
    for k, (r, off, _) in enumerate(parts):
        for s in r.time_top + r.top + r.recommended_top:
            owner[s.index + off] = k

    def time_rank(s: ScoredPlan) -> int:
        if not s.time_rank:
            return 0
        return s.time_rank + sum(1 for f in fastest
                                 if owner.get(f.index) != owner.get(s.index) and
                                 f.prediction.iteration_ms < s.prediction.iteration_ms)

    def ranked(items: list[ScoredPlan]) -> tuple[ScoredPlan, ...]:
        return tuple(dataclasses.replace(s, rank=r + 1, time_rank=time_rank(s)) for r, s in enumerate(items[:top_k]))

    top = sorted(rows("top"), key=lambda s: (-s.score, s.index))
    rec = rows("recommended_top")
    if rec:
        t = np.array([s.prediction.iteration_ms for s in rec])
        band = np.flatnonzero(in_time_band(t, parts[0][0].time_noise))
        key = tie_key([rec[i].risk_utilisation for i in band], [rec[i].prediction.balance for i in band])
        first = [rec[band[j]] for j in band_order(t[band], key, [rec[i].index for i in band])]
        inside = {s.index for s in first}
        rec = first + sorted((s for s in rec if s.index not in inside), key=lambda s: (s.prediction.iteration_ms,
                                                                                       s.index))
    safe = [dataclasses.replace(r.fastest_safe, index=r.fastest_safe.index + off, plan=_stated(r.fastest_safe.plan, job))
            for r, off, job in parts if r.fastest_safe is not None]
    aside = [dataclasses.replace(r.margin_aside, index=r.margin_aside.index + off,
                                 plan=_stated(r.margin_aside.plan, job))
             for r, off, job in parts if r.margin_aside is not None]
    points = sorted((ParetoPoint(index=p.index + off, iteration_ms=p.iteration_ms, max_utilisation=p.max_utilisation)
                     for r, off, _ in parts for p in r.pareto), key=lambda p: (p.iteration_ms, p.max_utilisation))
    front, best = [], float("inf")
    for p in points:
        if p.max_utilisation < best:
            front.append(p)
            best = p.max_utilisation
    stats = [r.stats for r, _, _ in parts]
    first_r = parts[0][0]
    st = SearchStats(plans=sum(s.plans for s in stats), feasible=sum(s.feasible for s in stats),
                     seconds=sum(s.seconds for s in stats), compose_seconds=sum(s.compose_seconds for s in stats),
                     ranks=stats[0].ranks, peak_rss_bytes=max(s.peak_rss_bytes for s in stats),
                     cache=_summed(s.cache for s in stats),
                     space={**stats[0].space, "precisions": [job.fp8 or "bf16" for _, _, job in parts]})
    return SearchResult(top=ranked(top), time_top=ranked(fastest), pareto=tuple(front), weights=first_r.weights,
                        stats=st, recommended_top=ranked(rec),
                        fastest_safe=min(safe, key=lambda s: (s.prediction.iteration_ms, s.index)) if safe else None,
                        margin_aside=min(aside, key=lambda s: (s.prediction.iteration_ms, s.index)) if aside else None,
                        margin_aside_count=sum(r.margin_aside_count for r, _, _ in parts),
                        risk_feasible=sum(r.risk_feasible for r, _, _ in parts), memory_error=first_r.memory_error,
                        time_noise=first_r.time_noise, recommended_by=first_r.recommended_by)


def _summed(dicts) -> dict:
    """The passes' cache counters added up (numbers), the first pass's other entries."""
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(out.get(k, 0), (int, float)):
                out[k] = out.get(k, 0) + v
            else:
                out.setdefault(k, v)
    asked = max(out.get("lookups", 0), out.get("unique", 0))
    if "hit_rate" in out:
        out["hit_rate"] = 1.0 - out.get("predicted", 0) / asked if asked else 0.0
    return out
