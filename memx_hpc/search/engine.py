"""The search: stream the space, compose, score, keep the top-K and the Pareto front.

Serial by default. Under ``mpiexec -n N`` or ``srun`` (mpi4py, imported only when the
process was started by an MPI launcher) the ranks split the plan indices into N
contiguous ranges without talking; the unique stage signatures of the whole space are
looked up in the cache by rank 0, the misses are split round-robin so each rank
predicts a disjoint share, and the answers are shared with ``allgather``. Each rank
keeps its own top-K (by score, then plan index), time-only top-K, Pareto front and
feasible-time array; rank 0 merges them. Ties are broken by plan index and every plan's
numbers are computed row by row, so 1 and N ranks give the same answer.

Memory stays bounded for any size of space: blocks of ``block_size`` plans are decoded,
composed and dropped; what is kept is K plans, the Pareto front, and 8 bytes per
feasible plan (its iteration time, to give each reported plan its time-only rank).
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import MemxError, SpecError, SystemFailure
from ..model.api import CostModel, LayerQuery
from ..model.comm_costs import link_model_for
from ..model.compose import Composer, CompositionInputs, CostOptions, Prediction, predict_plan, required_queries
from ..model.memory import memory_scale_of
from ..model.queries import MODE_NAMES, context_queries
from ..model.host import host_us_per_op
from ..spec import Plan
from .cache import CacheStats, PredictionCache, signature
from .mpi import MPI_ENV_VARS, launched_under_mpi, mpi_comm  # noqa: F401 - their home before search/mpi.py
from .objective import TIME_NOISE, Weights, band_order, in_time_band, log_score, risk_utilisation, tie_key
from .space import PlanSpace

@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """``use_cache`` False asks the cost model for every stage of every plan (no signature
    table): the baseline the hash-signature cache is measured against. ``memory_error``:
    per GPU type the expected relative error of the predicted peak (see
    :func:`~memx_hpc.search.objective.memory_error_bands`); the recommended ranking widens
    peaks by it. ``time_noise``: plans this close to the fastest risk-feasible one count as
    equally fast."""

    top_k: int = 10
    weights: Weights = field(default_factory=Weights)
    block_size: int = 65536
    use_cache: bool = True
    cost: CostOptions = field(default_factory=CostOptions)
    memory_error: Mapping[str, float] = field(default_factory=dict)
    time_noise: float = TIME_NOISE

    def __post_init__(self) -> None:
        if not isinstance(self.top_k, int) or self.top_k < 1:
            raise SpecError("must be a whole number >= 1", field="top", found=self.top_k)
        if self.block_size < 1:
            raise SpecError("must be >= 1", field="block_size", found=self.block_size)
        if not 0 <= self.time_noise < 1:
            raise SpecError("must be in [0, 1)", field="time_noise", found=self.time_noise)
        for g, v in self.memory_error.items():
            if not (isinstance(v, (int, float)) and 0 <= v < 10):
                raise SpecError("an expected memory error is a fraction >= 0", field=f"memory_error.{g}", found=v)


@dataclass(frozen=True, kw_only=True)
class ScoredPlan:
    """A plan with its prediction; ``rank`` in the list it is reported in, ``score`` its
    weighted product, ``time_rank`` its rank by iteration time alone (1 = fastest; plans
    with equal time share a rank) among feasible plans, ``risk_utilisation`` its worst
    GPU's peak widened by the expected memory error, over capacity (> 1: may not fit)."""

    index: int
    plan: Plan
    prediction: Prediction
    score: float
    rank: int
    time_rank: int
    risk_utilisation: float = float("nan")

    @property
    def risk_feasible(self) -> bool:
        return bool(self.prediction.feasible) and self.risk_utilisation <= 1.0


@dataclass(frozen=True, kw_only=True)
class ParetoPoint:
    """A plan no other feasible plan beats on both iteration time and peak memory utilisation."""

    index: int
    iteration_ms: float
    max_utilisation: float


@dataclass(frozen=True, kw_only=True)
class SearchStats:
    plans: int
    feasible: int
    seconds: float
    compose_seconds: float
    ranks: int
    peak_rss_bytes: int
    cache: dict
    space: dict

    @property
    def plans_per_s(self) -> float:
        return self.plans / self.seconds if self.seconds > 0 else float("inf")

    def to_dict(self) -> dict:
        return {"plans": self.plans, "feasible": self.feasible, "seconds": self.seconds,
                "compose_seconds": self.compose_seconds, "plans_per_s": self.plans_per_s, "ranks": self.ranks,
                "peak_rss_bytes": self.peak_rss_bytes, "cache": self.cache, "space": self.space}


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """``top``: by MemX's weighted product; ``time_top``: by iteration time alone (feasible
    plans); ``recommended_top``: the recommended ranking (risk-feasible plans: the plans
    within ``time_noise`` of the fastest one by widened memory x imbalance, then the others
    by time; see search/objective.py). ``recommended`` is its first plan (None when no plan
    is risk-feasible); ``risk_feasible``: how many plans are."""

    top: tuple[ScoredPlan, ...]
    time_top: tuple[ScoredPlan, ...]
    pareto: tuple[ParetoPoint, ...]
    weights: Weights
    stats: SearchStats
    recommended_top: tuple[ScoredPlan, ...] = ()
    fastest_safe: ScoredPlan | None = None
    risk_feasible: int = 0
    memory_error: Mapping[str, float] = field(default_factory=dict)
    time_noise: float = TIME_NOISE
    #: the fastest plan whose every peak fits its GPU's capacity but not under the site's
    #: safety margin (the margin alone sets it aside: never recommended, shown so the cost of
    #: the margin is seen), and how many plans the margin alone set aside
    margin_aside: ScoredPlan | None = None
    margin_aside_count: int = 0
    #: who put the first plan of ``recommended_top`` first: ``predictor`` (the ranking above),
    #: or the line saying why the rule of thumb did (:func:`memx_hpc.planner.rule_fallback`)
    recommended_by: str = "predictor"

    @property
    def recommended(self) -> ScoredPlan | None:
        return self.recommended_top[0] if self.recommended_top else None

    @property
    def fastest(self) -> ScoredPlan | None:
        return self.time_top[0] if self.time_top else None

    @property
    def weighted_best(self) -> ScoredPlan | None:
        return self.top[0] if self.top else None

    def ranking(self, objective: str) -> tuple[ScoredPlan, ...]:
        """The plans as ``objective`` (recommended | memx) ranks them."""
        return self.recommended_top if objective == "recommended" else self.top


# --------------------------------------------------------------------------- streaming keepers


def _take_best(keys: np.ndarray, idx: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k smallest (key, index) pairs, ordered; ties by index. Infinite keys are dropped."""
    fin = np.isfinite(keys)
    keys, idx = keys[fin], idx[fin]
    if len(keys) > k:
        kth = np.partition(keys, k - 1)[k - 1]
        sel = keys <= kth  # keeps every tie of the k-th key
        keys, idx = keys[sel], idx[sel]
    order = np.lexsort((idx, keys))[:k]
    return keys[order], idx[order]


def _front(t: np.ndarray, u: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Positions of the non-dominated points (minimise t and u; ties by index)."""
    if not len(t):
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((idx, u, t))
    us = u[order]
    prev_min = np.minimum.accumulate(np.r_[np.inf, us[:-1]])
    return order[us < prev_min]


def _band(t: np.ndarray, key: np.ndarray, idx: np.ndarray, noise: float):
    """The entries within ``noise`` of the fastest (all of them: the recommended plan is
    the best of these by ``key``, and a plan left out here could be it)."""
    keep = in_time_band(t, noise)
    return t[keep], key[keep], idx[keep]


_EMPTY3 = (np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64))
#: how many of the plans set aside by the safety margin alone each rank keeps (the report
#: names the fastest distinct one; a few spares cover indices that decode to one plan)
ASIDE_KEPT = 4


@dataclass
class _Keeper:
    k: int
    noise: float = TIME_NOISE
    score: tuple[np.ndarray, np.ndarray] = (np.zeros(0), np.zeros(0, dtype=np.int64))
    time: tuple[np.ndarray, np.ndarray] = (np.zeros(0), np.zeros(0, dtype=np.int64))
    safe: tuple[np.ndarray, np.ndarray] = (np.zeros(0), np.zeros(0, dtype=np.int64))
    band: tuple[np.ndarray, np.ndarray, np.ndarray] = _EMPTY3
    front: tuple[np.ndarray, np.ndarray, np.ndarray] = _EMPTY3
    #: the fastest plans within capacity that only the site's safety margin refuses, and their count
    aside: tuple[np.ndarray, np.ndarray] = (np.zeros(0), np.zeros(0, dtype=np.int64))
    aside_count: int = 0
    times: list = field(default_factory=list)
    plans: int = 0
    feasible: int = 0
    risk_feasible: int = 0
    lookups: int = 0
    recommended: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def add(self, idx: np.ndarray, ls: np.ndarray, it: np.ndarray, util: np.ndarray, feasible: np.ndarray,
            risk: np.ndarray | None = None, balance: np.ndarray | None = None,
            aside: np.ndarray | None = None) -> None:
        self.plans += len(idx)
        self.feasible += int(feasible.sum())
        if aside is not None:
            self.aside_count += int(np.isfinite(aside).sum())
            a0, ai = self.aside
            self.aside = _take_best(np.r_[a0, aside], np.r_[ai, idx], ASIDE_KEPT)
        s0, i0 = self.score
        self.score = _take_best(np.r_[s0, ls], np.r_[i0, idx], self.k)
        t0, j0 = self.time
        self.time = _take_best(np.r_[t0, it], np.r_[j0, idx], self.k)
        if risk is not None:
            rf = feasible & (risk <= 1.0)
            self.risk_feasible += int(rf.sum())
            r0, k0 = self.safe
            self.safe = _take_best(np.r_[r0, np.where(rf, it, np.inf)], np.r_[k0, idx], self.k)
            g = np.flatnonzero(rf)
            bt, bk, bi = self.band
            self.band = _band(np.r_[bt, it[g]], np.r_[bk, tie_key(risk[g], balance[g])], np.r_[bi, idx[g]],
                              self.noise)
        f = np.flatnonzero(feasible)
        ft, fu, fi = self.front
        t = np.r_[ft, it[f]]
        u = np.r_[fu, util[f]]
        ii = np.r_[fi, idx[f]]
        keep = _front(t, u, ii)
        self.front = (t[keep], u[keep], ii[keep])
        self.times.append(it[f].astype(np.float64))

    def sorted_times(self) -> np.ndarray:
        return np.sort(np.concatenate(self.times)) if self.times else np.zeros(0)


# --------------------------------------------------------------------------- predictions


def cache_on_root(comm, fn: Callable[[], Any]) -> Any:
    """``fn()`` (a use of the prediction cache file, which only rank 0 opens) on rank 0, its
    result on every rank. A damaged or locked cache fails on rank 0 alone; the other ranks
    would wait for it in the next collective forever, so the failure is sent to them too and
    every rank raises it: all exit with the message."""
    if comm is None:
        return fn()
    outcome: tuple[Any, tuple[int, str] | None] = (None, None)
    if comm.Get_rank() == 0:
        try:
            outcome = (fn(), None)
        except MemxError as e:
            outcome = (None, (e.exit_code, str(e)))
    value, failure = comm.bcast(outcome, root=0)
    if failure is not None:
        code, message = failure
        raise SpecError(message) if code == SpecError.exit_code else SystemFailure(message)
    return value



def _predict_all(queries: list[LayerQuery], cost_model: "CostModel", cache: PredictionCache | None, comm,
                 stats: CacheStats) -> dict[LayerQuery, tuple[float, float]]:
    """Answers for every unique query: cache hits, then the misses predicted (split over ranks)."""
    rank, size = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)
    identity = cost_model.identity
    sigs = [signature(identity, q) for q in queries]
    known: dict[str, tuple[float, float]] = cache_on_root(comm, lambda: cache.get_many(sigs)) \
        if cache is not None else {}
    missing = [i for i, s in enumerate(sigs) if s not in known]
    mine = missing[rank::size]
    vals = cost_model.predict([queries[i] for i in mine]) if mine else np.zeros((0, 2))
    part = {sigs[i]: (float(v[0]), float(v[1])) for i, v in zip(mine, vals)}
    if comm is not None:
        for other in comm.allgather(part):
            known.update(other)
    else:
        known.update(part)
    new = {sigs[i]: known[sigs[i]] for i in missing}
    if cache is not None and new:
        cache_on_root(comm, lambda: cache.put_many(new))
    stats.unique = len(queries)
    stats.hits = len(queries) - len(missing)
    stats.predicted = len(missing)
    if cache is not None:
        stats.file_hits = cache.stats.file_hits
        stats.invalidated = cache.stats.invalidated
        stats.path = cache.stats.path
    return {q: known[s] for q, s in zip(queries, sigs)}


def _block_queries(space: PlanSpace, block) -> list[LayerQuery]:
    """Every query of every stage of every plan in ``block``, not deduplicated (no cache)."""
    out: list[LayerQuery] = []
    job = space.job
    levels = space.levels
    for j in range(len(block)):
        sk = space.skeletons[int(block.skeleton[j])]
        parts = sk.stage_partitions()
        for i in range(sk.pp):
            gpu = space.partitions[parts[i]].gpu_type
            lv = levels[int(block.levels[j, i])]
            qs = context_queries(job, gpu, sk.tp, sk.micro_batch_size, sk.sequence_parallel)
            n = int(block.layers[j, i])
            k = lv.for_stage(n, int(block.group_max[j, i]))
            # full recompute also needs the plain layer: its activations are rebuilt in backward
            modes = ["full", "none"] if k.mode == "full" else [lv.base]
            out += [qs[MODE_NAMES.index(m)] for m in modes]
            if i == 0:
                out.append(qs[3])
            if i == sk.pp - 1:
                out.append(qs[4])
    return out


# --------------------------------------------------------------------------- the search


@dataclass(frozen=True, kw_only=True)
class RankShare:
    """What one rank sends rank 0 after composing its range of the space: its keepers' bests
    (``(keys, indices)`` pairs, the band and the front as ``(time, key or utilisation,
    index)`` triples) and its counts. The feasible times stay on the rank (they are large;
    each reported plan's time rank is counted where they are)."""

    score: tuple[np.ndarray, np.ndarray]
    time: tuple[np.ndarray, np.ndarray]
    safe: tuple[np.ndarray, np.ndarray]
    band: tuple[np.ndarray, np.ndarray, np.ndarray]
    front: tuple[np.ndarray, np.ndarray, np.ndarray]
    plans: int
    feasible: int
    risk_feasible: int
    lookups: int
    peak_rss_bytes: int
    compose_seconds: float
    aside: tuple[np.ndarray, np.ndarray] = (np.zeros(0), np.zeros(0, dtype=np.int64))
    aside_count: int = 0

    @staticmethod
    def of(keeper: "_Keeper", *, peak_rss_bytes: int, compose_seconds: float) -> "RankShare":
        return RankShare(score=keeper.score, time=keeper.time, safe=keeper.safe, band=keeper.band,
                         front=keeper.front, plans=keeper.plans, feasible=keeper.feasible,
                         risk_feasible=keeper.risk_feasible, lookups=keeper.lookups,
                         peak_rss_bytes=peak_rss_bytes, compose_seconds=compose_seconds, aside=keeper.aside,
                         aside_count=keeper.aside_count)


def _merge_shares(shares: list[RankShare], k: int, noise: float) -> _Keeper:
    """Rank 0's keeper from every rank's share: the same candidates a serial run keeps."""
    def cat(pairs, j: int) -> np.ndarray:
        return np.concatenate([p[j] for p in pairs])

    merged = _Keeper(k=k, noise=noise)
    for name in ("score", "time", "safe"):
        pairs = [getattr(s, name) for s in shares]
        setattr(merged, name, _take_best(cat(pairs, 0), cat(pairs, 1), k))
    merged.band = _band(*(cat([s.band for s in shares], j) for j in range(3)), noise)
    fronts = [s.front for s in shares]
    ft, fu, fi = (cat(fronts, j) for j in range(3))
    keep = _front(ft, fu, fi)
    merged.front = (ft[keep], fu[keep], fi[keep])
    merged.plans = sum(s.plans for s in shares)
    merged.feasible = sum(s.feasible for s in shares)
    merged.risk_feasible = sum(s.risk_feasible for s in shares)
    merged.lookups = sum(s.lookups for s in shares)
    pairs = [s.aside for s in shares]
    merged.aside = _take_best(cat(pairs, 0), cat(pairs, 1), ASIDE_KEPT)
    merged.aside_count = sum(s.aside_count for s in shares)
    return merged


def _known_predictions(space: PlanSpace, queries: list[LayerQuery], cost_model: "CostModel",
                       cache: PredictionCache | None, comm, options: "SearchOptions",
                       stats: CacheStats) -> dict[LayerQuery, tuple[float, float]]:
    """Every query's answer (cache, then the model, split over ranks); without the cache a
    placeholder the blocks overwrite with their own plans' answers."""
    if options.use_cache:
        return _predict_all(queries, cost_model, cache, comm, stats)
    # every block asks the model for its own plans' stages; until then nothing is known
    # (a value no plan of a block uses is multiplied by zero layers)
    stats.unique = len(queries)
    return {q: (0.0, 0.0) for q in queries}


def _composer(space: PlanSpace, inputs: CompositionInputs, predictions, cost_model: "CostModel",
              options: SearchOptions) -> Composer:
    gpus = sorted({p.gpu_type for p in space.partitions})
    scale_of = memory_scale_of(cost_model, space.site)
    return Composer(inputs, predictions, overhead_bytes={g: int(cost_model.overhead_bytes(g)) for g in gpus},
                    options=options.cost, memory_error=options.memory_error,
                    links=link_model_for(space.site, cost_model), memory_scale={g: float(scale_of(g)) for g in gpus},
                    host_us_per_op=host_us_per_op(cost_model))


def _compose_range(space: PlanSpace, composer: Composer, cost_model: "CostModel", options: SearchOptions,
                   stats: CacheStats, start: int, stop: int, *, on_block: Callable[[int], None]) -> _Keeper:
    """Decode, compose and score plans ``start..stop-1`` block by block into a keeper."""
    keeper = _Keeper(k=options.top_k * _SPARE, noise=options.time_noise)
    for block in space.iter_blocks(start, stop, block_size=options.block_size):
        if not options.use_cache:
            qs = _block_queries(space, block)
            vals = np.asarray(cost_model.predict(qs), dtype=np.float64)
            stats.predicted += len(qs)
            stats.lookups += len(qs)
            composer.set_predictions({q: (float(v[0]), float(v[1])) for q, v in zip(qs, vals)})
        cost = composer.compose(block)
        ls = log_score(cost.iteration_ms, cost.max_utilisation, cost.balance, options.weights)
        keeper.add(block.indices, ls, cost.iteration_ms, cost.max_utilisation, cost.feasible, cost.risk_utilisation,
                   cost.balance, cost.aside_ms)
        if options.use_cache:
            keeper.lookups += int((block.levels >= 0).sum())
        on_block(len(block))
    if not options.use_cache:
        keeper.lookups = stats.lookups
    return keeper


def _time_ranks(space: PlanSpace, composer: Composer, keeper: _Keeper, times: np.ndarray, comm) -> dict[int, int]:
    """Time-only rank of every reported plan: 1 + the feasible plans faster than it, counted
    on every rank (each holds its own range's times)."""
    targets = _report_indices(keeper)
    target_times = _times_of(space, composer, targets)
    faster = np.searchsorted(times, target_times, side="left") if len(targets) else np.zeros(0, dtype=np.int64)
    if comm is not None:
        faster = comm.allreduce(np.asarray(faster, dtype=np.int64))
    return {int(i): int(f) + 1 for i, f in zip(targets, faster)}


def search(space: PlanSpace, cost_model: "CostModel", *, options: SearchOptions | None = None,
           cache: PredictionCache | None = None, comm=None,
           progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Search ``space`` with ``cost_model``; see the module docstring. Every rank returns the result."""
    options = options or SearchOptions()
    t0 = time.perf_counter()
    rank, size = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)
    stats = CacheStats()
    inputs = space.composition_inputs()
    predictions = _known_predictions(space, required_queries(inputs), cost_model, cache, comm, options, stats)
    composer = _composer(space, inputs, predictions, cost_model, options)
    done = [0]

    def on_block(n: int) -> None:
        done[0] += n
        if progress is not None and rank == 0:
            progress(min(done[0] * size, len(space)), len(space))

    t_compose = time.perf_counter()
    keeper = _compose_range(space, composer, cost_model, options, stats, *space.rank_range(rank, size),
                            on_block=on_block)
    share = RankShare.of(keeper, peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                         compose_seconds=time.perf_counter() - t_compose)
    times = keeper.sorted_times()
    if comm is not None:
        shares = comm.gather(share, root=0)
        merged = _merge_shares(shares, options.top_k * _SPARE, options.time_noise) if rank == 0 else None
        keeper = comm.bcast(merged, root=0)
        share = comm.bcast(RankShare.of(keeper, peak_rss_bytes=max(s.peak_rss_bytes for s in shares),
                                        compose_seconds=max(s.compose_seconds for s in shares))
                           if rank == 0 else None, root=0)
    _keep_distinct(space, keeper, options.top_k)
    _recommended_order(space, keeper, options.top_k)
    time_rank = _time_ranks(space, composer, keeper, times, comm)
    stats.lookups = keeper.lookups
    return _result(space, cost_model, options, keeper, time_rank, stats, share, t0, comm, size)


def _result(space: PlanSpace, cost_model: "CostModel", options: SearchOptions, keeper: _Keeper,
            time_rank: dict[int, int], stats: CacheStats, share: RankShare, t0: float, comm, size: int) -> SearchResult:
    """The reported plans, each predicted on its own (the one-plan path), and the stats."""
    # the rankings share most of their plans: each is predicted once
    memo: dict[int, tuple[Plan, Prediction]] = {}
    top = _scored(space, cost_model, options, keeper.score[1], keeper.score[0], time_rank, memo)
    time_top = _scored(space, cost_model, options, keeper.time[1], None, time_rank, memo)
    recommended_top = _scored(space, cost_model, options, keeper.recommended, None, time_rank, memo)
    safe = _scored(space, cost_model, options, keeper.safe[1][:1], None, time_rank, memo)
    aside = _scored(space, cost_model, options, keeper.aside[1][_distinct(space, keeper.aside[1], 1)], None,
                    time_rank, memo)
    ft, fu, fi = keeper.front
    pareto = tuple(ParetoPoint(index=int(i), iteration_ms=float(t), max_utilisation=float(u))
                   for t, u, i in zip(ft, fu, fi))
    seconds = time.perf_counter() - t0
    if comm is not None:
        seconds = comm.bcast(seconds, root=0)
    st = SearchStats(plans=keeper.plans, feasible=keeper.feasible, seconds=seconds,
                     compose_seconds=share.compose_seconds, ranks=size, peak_rss_bytes=int(share.peak_rss_bytes),
                     cache=stats.to_dict(), space=space.describe())
    return SearchResult(top=top, time_top=time_top, pareto=pareto, weights=options.weights, stats=st,
                        recommended_top=recommended_top, risk_feasible=keeper.risk_feasible,
                        fastest_safe=safe[0] if safe else None,
                        margin_aside=aside[0] if aside else None, margin_aside_count=keeper.aside_count,
                        memory_error=dict(options.memory_error), time_noise=options.time_noise)


# Different indices can decode to the same runnable plan (a fractional full-recompute
# level on a one-layer stage is plain full recompute). They score the same, so the
# keepers hold _SPARE x top-K candidates and the report keeps the first index of each
# distinct plan; every rank count gives the same answer because the merge keeps the
# same candidates as the serial run.
_SPARE = 4


def _distinct(space: PlanSpace, indices, top_k: int) -> list[int]:
    """Positions in ``indices`` of the first index of each distinct runnable plan, at most ``top_k``."""
    seen: set = set()
    keep = []
    for j, i in enumerate(indices):
        plan = space.plan_at(int(i))
        if plan in seen:
            continue
        seen.add(plan)
        keep.append(j)
        if len(keep) == top_k:
            break
    return keep


def _keep_distinct(space: PlanSpace, k: _Keeper, top_k: int) -> None:
    for name in ("score", "time"):
        keys, idx = getattr(k, name)
        keep_a = np.asarray(_distinct(space, idx, top_k), dtype=np.int64)
        setattr(k, name, (keys[keep_a], idx[keep_a]))


def _recommended_order(space: PlanSpace, k: _Keeper, top_k: int) -> None:
    """``k.recommended``: the recommended ranking's plan indices (distinct plans, at most
    ``top_k``): the plans within the time noise of the fastest risk-feasible plan by
    widened worst-GPU utilisation and balance (then time, then index), followed by the
    other risk-feasible plans by time."""
    bt, bk, bi = k.band
    order = band_order(bt, bk, bi)
    in_band = set(int(i) for i in bi)
    cands = [int(i) for i in bi[order]] + [int(i) for i in k.safe[1] if int(i) not in in_band]
    k.recommended = np.asarray([cands[j] for j in _distinct(space, cands, top_k)], dtype=np.int64)


def _report_indices(k: _Keeper) -> np.ndarray:
    return np.unique(np.r_[k.score[1], k.time[1], k.recommended, k.safe[1][:1]]
                     ).astype(np.int64)


def _times_of(space: PlanSpace, composer: Composer, indices: np.ndarray) -> np.ndarray:
    """Iteration times of given plans, from the same vectorised composition as the search."""
    out = np.empty(len(indices))
    for j, i in enumerate(indices):
        out[j] = composer.compose(space.decode(int(i), int(i) + 1)).iteration_ms[0]
    return out


def _scored(space: PlanSpace, cost_model: "CostModel", options: SearchOptions, indices, log_scores,
            time_rank: dict[int, int], memo: dict[int, tuple[Plan, Prediction]] | None = None
            ) -> tuple[ScoredPlan, ...]:
    """The plans at ``indices``, each predicted on its own; ``memo`` (index -> plan and
    prediction) keeps what an earlier list of the same search predicted."""
    memo = {} if memo is None else memo
    out = []
    for r, i in enumerate(indices):
        if int(i) not in memo:
            plan = space.plan_at(int(i))
            memo[int(i)] = (plan, predict_plan(plan, space.site, space.job, cost_model, options=options.cost))
        plan, pred = memo[int(i)]
        ls = float(log_scores[r]) if log_scores is not None else float(
            log_score(pred.iteration_ms, pred.max_utilisation, pred.balance, options.weights))
        out.append(ScoredPlan(index=int(i), plan=plan, prediction=pred, score=float(np.exp(ls)), rank=r + 1,
                              time_rank=time_rank.get(int(i), 0),
                              risk_utilisation=risk_utilisation(pred, options.memory_error)))
    return tuple(out)
