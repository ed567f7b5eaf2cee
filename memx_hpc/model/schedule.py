"""An event-driven simulator of Megatron-LM's 1F1B pipeline schedule.

Each stage runs its operations in the order Megatron's
``forward_backward_pipelining_without_interleaving`` issues them
(``megatron/core/pipeline_parallel/schedules.py``): ``min(p - i - 1, m)`` warm-up
forwards, then ``m - warmup`` steady (forward, backward) pairs, then the remaining
backwards. A forward of micro-batch j on stage i starts when the stage is free and
the activation of j has arrived from stage i-1 (its forward end plus the link time);
a backward starts when the gradient of j has arrived from stage i+1 (the last stage:
after its own forward of j). Links are modelled as delays (a send does not occupy
the sending stage), as with asynchronous p2p.

The search evaluates the same schedule for many plans at once with
:func:`pipeline_finish_batch` (vectorised over plans, exact against the event-driven
:func:`simulate_1f1b` up to :data:`MAX_SIMULATED_MICROBATCHES` micro-batches, its steady
state extended linearly beyond). :func:`uniform_closed_form_ms` is the closed form for uniform
stages, derived from and checked against the simulator; :func:`closed_form_ms`, the
textbook heterogeneous estimate, is kept to show how far off it is.
"""

from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import SpecError

__all__ = ["Op", "Simulation", "closed_form_ms", "in_flight_chunks", "in_flight_last_chunk", "interleaved_finish", "interleaved_warmup", "pipeline_finish_batch",
           "schedule_1f1b", "schedule_interleaved", "simulate_1f1b", "simulate_interleaved", "uniform_closed_form_ms"]


@dataclass(frozen=True, kw_only=True)
class Op:
    """One scheduled operation: stage, micro-batch, ``F`` or ``B``, start and end (ms)."""

    stage: int
    microbatch: int
    kind: str
    start_ms: float
    end_ms: float


@dataclass(frozen=True, kw_only=True)
class Simulation:
    """The result of one simulated iteration's pipeline part."""

    total_ms: float
    stage_finish_ms: tuple[float, ...]  # when each stage's last backward ends
    stage_busy_ms: tuple[float, ...]
    ops: tuple[Op, ...]

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the stages over the iteration (0: no bubble)."""
        p = len(self.stage_busy_ms)
        return 1.0 - sum(self.stage_busy_ms) / (p * self.total_ms) if self.total_ms > 0 else 0.0


def schedule_1f1b(stage: int, num_stages: int, num_microbatches: int) -> list[tuple[str, int]]:
    """The op order of one stage under non-interleaved 1F1B (Megatron-LM's schedule)."""
    m = num_microbatches
    warmup = min(num_stages - stage - 1, m)
    ops = [("F", j) for j in range(warmup)]
    f, b = warmup, 0
    for _ in range(m - warmup):
        ops.append(("F", f))
        f += 1
        ops.append(("B", b))
        b += 1
    ops += [("B", j) for j in range(b, m)]
    return ops


def simulate_1f1b(forward_ms: Sequence[float], backward_ms: Sequence[float], link_ms: Sequence[float],
                  num_microbatches: int) -> Simulation:
    """Simulate one iteration; ``link_ms[i]`` is the one-way time from stage i to i+1."""
    p = len(forward_ms)
    m = num_microbatches
    if p < 1 or len(backward_ms) != p:
        raise SpecError("forward and backward times need one entry per stage",
                        found=(len(forward_ms), len(backward_ms)))
    if len(link_ms) < p - 1:
        raise SpecError("link times need one entry per stage boundary", found=len(link_ms), allowed=f">= {p - 1}")
    if m < 1:
        raise SpecError("the number of micro-batches must be >= 1", found=m)
    if any(x < 0 for x in list(forward_ms) + list(backward_ms) + list(link_ms)):
        raise SpecError("times must be >= 0")
    orders = [schedule_1f1b(i, p, m) for i in range(p)]
    pos = [0] * p
    free = [0.0] * p
    busy = [0.0] * p
    f_end: dict[tuple[int, int], float] = {}
    b_end: dict[tuple[int, int], float] = {}
    ops: list[Op] = []
    # Event queue of stages whose next op may have become ready; an op is issued when its
    # input's arrival time is known. Ordered by time so that ops are recorded in time order.
    queue: list[tuple[float, int]] = [(0.0, i) for i in range(p)]
    heapq.heapify(queue)
    waiting: dict[tuple[str, int, int], list[int]] = {}

    def ready_time(i: int, kind: str, j: int) -> float | None:
        if kind == "F":
            if i == 0:
                return 0.0
            t = f_end.get((i - 1, j))
            return None if t is None else t + link_ms[i - 1]
        if i == p - 1:
            return f_end.get((i, j))
        t = b_end.get((i + 1, j))
        return None if t is None else t + link_ms[i]

    while queue:
        _, i = heapq.heappop(queue)
        if pos[i] >= len(orders[i]):
            continue
        kind, j = orders[i][pos[i]]
        r = ready_time(i, kind, j)
        if r is None:
            dep = ("F", i - 1, j) if kind == "F" else (("F", i, j) if i == p - 1 else ("B", i + 1, j))
            waiting.setdefault(dep, []).append(i)
            continue
        start = max(free[i], r)
        dur = forward_ms[i] if kind == "F" else backward_ms[i]
        end = start + dur
        free[i] = end
        busy[i] += dur
        (f_end if kind == "F" else b_end)[(i, j)] = end
        ops.append(Op(stage=i, microbatch=j, kind=kind, start_ms=start, end_ms=end))
        pos[i] += 1
        for w in waiting.pop((kind, i, j), []):
            heapq.heappush(queue, (end, w))
        heapq.heappush(queue, (end, i))
    if any(pos[i] < len(orders[i]) for i in range(p)):  # pragma: no cover - the schedule is deadlock-free
        raise RuntimeError("1F1B simulation deadlocked")
    finish = tuple(b_end[(i, m - 1)] for i in range(p))
    return Simulation(total_ms=max(finish), stage_finish_ms=finish, stage_busy_ms=tuple(busy),
                      ops=tuple(sorted(ops, key=lambda o: (o.start_ms, o.stage))))


def uniform_closed_form_ms(forward_ms: float, backward_ms: float, link_ms: float, num_stages: int,
                           num_microbatches: int) -> float:
    """1F1B time for ``p`` identical stages joined by identical links, in closed form.

    Without link costs this is the textbook ``(m + p - 1)(f + b)`` (Narayanan et al. 2021,
    §2.2). With a link time ``c``, micro-batch 0 needs ``R = p(f + b) + 2(p - 1)c`` to go
    down the pipeline and back, and stage 0 holds only ``p`` micro-batches, so the link
    round trip cannot be hidden: each later micro-batch adds ``f + b + 2c``, except one in
    every ``p`` (the first of each in-flight window), which adds ``f + b``. Derived from and
    checked against :func:`simulate_1f1b`.
    """
    p, m = num_stages, num_microbatches
    t, c = forward_ms + backward_ms, link_ms if num_stages > 1 else 0.0
    first = p * t + 2 * (p - 1) * c
    if m == 1:
        return first
    window_starts = (m - 2) // p + 1  # j in 1..m-1 with j % p == 1
    return first + (m - 1) * (t + 2 * c) - 2 * c * window_starts


# --------------------------------------------------------------------------- interleaved 1F1B


def interleaved_warmup(stage: int, num_stages: int, num_microbatches: int, num_chunks: int,
                       group: int | None = None) -> int:
    """Warm-up forwards of ``stage`` under interleaved 1F1B (Megatron-LM's
    ``get_pp_rank_microbatches``): ``2(p - i - 1) + (v - 1)·G`` chunk forwards (G: micro-batches
    per virtual-stage group, ``--microbatch-group-size-per-virtual-pipeline-stage``, default
    p), at most all ``m·v`` of them. With ``v = 1`` the non-interleaved ``p - i - 1``."""
    p, m, v = num_stages, num_microbatches, num_chunks
    if v == 1:
        return min(p - stage - 1, m)
    g = p if group is None else group
    return min(2 * (p - stage - 1) + (v - 1) * g, m * v)


def in_flight_chunks(stage: int, num_stages: int, num_microbatches: int, num_chunks: int,
                     group: int | None = None) -> int:
    """Most (micro-batch, chunk) activations ``stage`` holds at once: its warm-up forwards
    plus the first steady forward (1F1B runs a forward before each backward), at most all
    ``m·v``. Each holds one chunk's layers, ``L_stage / v``: the first stage of ``p = 4``,
    ``v = 2`` holds 11 chunks = 1.375x the activations of non-interleaved 1F1B (Narayanan et
    al. 2021, §2.2.2: ``1 + (p - 1)/(p·v)``). ``v = 1``: ``min(p - i, m)``."""
    return min(interleaved_warmup(stage, num_stages, num_microbatches, num_chunks, group) + 1,
               num_microbatches * num_chunks)


@functools.lru_cache(maxsize=1024)
def in_flight_last_chunk(stage: int, num_stages: int, num_microbatches: int, num_chunks: int,
                         group: int | None = None) -> int:
    """Micro-batches of ``stage``'s last model chunk held at once when it holds the most
    chunks (:func:`in_flight_chunks`), from the op order of :func:`schedule_interleaved`.
    On the last stage that chunk ends in the output layer and the loss, whose fp32 logits
    are the largest activation of a micro-batch: in 1F1B the backward of a last-chunk
    forward follows it at once, so one is held however many earlier chunks wait (``1``),
    unless every forward is in the warm-up (``m``). ``v = 1``: ``min(p - i, m)``."""
    p, m, v = num_stages, num_microbatches, num_chunks
    if v == 1:
        return min(p - stage, m)
    live = last = 0
    best = (0, 0)
    for kind, _, c in schedule_interleaved(stage, p, m, v, group):
        step = 1 if kind == "F" else -1
        live += step
        last += step * (c == v - 1)
        if kind == "F":
            best = max(best, (live, last))
    return best[1]


def _schedule_table(m: int, v: int, g: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of each virtual micro-batch in forward order (Megatron-LM's
    ``get_schedule_table``): groups of ``g`` micro-batches run chunk 0, then chunk 1, ..."""
    table: list[tuple[int, int]] = []
    for lo in range(0, m, g):
        hi = m if lo + g >= m else lo + g
        table += [(j, c) for c in range(v) for j in range(lo, hi)]
    return table


def schedule_interleaved(stage: int, num_stages: int, num_microbatches: int, num_chunks: int,
                         group: int | None = None) -> list[tuple[str, int, int]]:
    """The op order ``(F|B, micro-batch, chunk)`` of one stage under interleaved 1F1B
    (``forward_backward_pipelining_with_interleaving``): the warm-up forwards, then one
    forward and one backward at a time, then the remaining backwards. Backwards take the
    chunks in reverse order. Megatron requires ``p <= G <= m`` and the last group of
    micro-batches to be empty or at least ``p`` (checked here too)."""
    p, m, v = num_stages, num_microbatches, num_chunks
    g = p if group is None else group
    if v > 1 and not p <= g <= m:
        raise SpecError(f"interleaving needs between p = {p} and m = {m} micro-batches per virtual-stage group",
                        field="num_microbatches", found=m, allowed=f">= {p}")
    if v > 1 and 0 < m % g < p:
        raise SpecError(f"the last group of {m % g} micro-batches is smaller than the {p} pipeline stages",
                        field="num_microbatches", found=m, allowed=f"multiples of {g}, or a remainder >= {p}")
    table = _schedule_table(m, v, g)
    fwd = [("F", j, c) for j, c in table]
    bwd = [("B", j, v - 1 - c) for j, c in table]
    warmup = interleaved_warmup(stage, p, m, v, g)
    ops = fwd[:warmup]
    for k in range(m * v - warmup):
        ops += [fwd[warmup + k], bwd[k]]
    return ops + bwd[m * v - warmup:]


def simulate_interleaved(forward_ms: np.ndarray | Sequence[Sequence[float]],
                         backward_ms: np.ndarray | Sequence[Sequence[float]], link_ms: Sequence[float],
                         num_microbatches: int, *, group: int | None = None) -> Simulation:
    """Simulate one iteration of interleaved 1F1B with ``v`` model chunks per stage.

    ``forward_ms[i][c]`` / ``backward_ms[i][c]``: one micro-batch through chunk ``c`` of
    stage ``i`` (chunk c of stage i holds virtual stage ``c·p + i``). ``link_ms[i]``: stage i
    to i+1, and ``link_ms[p - 1]`` the wrap from the last stage to the first, which every
    chunk boundary crosses: interleaving sends ``v`` times the p2p messages of 1F1B. A
    forward of (j, c) on stage i waits for (j, c) on stage i-1, on stage 0 for (j, c-1) on
    the last stage; backwards the other way round. ``Op.microbatch`` is ``j·v + c``.
    """
    f = np.asarray(forward_ms, dtype=float)
    b = np.asarray(backward_ms, dtype=float)
    if f.ndim != 2 or f.shape != b.shape:
        raise SpecError("forward and backward times need one row per stage and one column per chunk",
                        found=(f.shape, b.shape))
    p, v = f.shape
    m = num_microbatches
    if m < 1:
        raise SpecError("the number of micro-batches must be >= 1", found=m)
    if len(link_ms) < (p if v > 1 else p - 1):
        raise SpecError("link times need one entry per stage boundary and the wrap from the last stage",
                        found=len(link_ms), allowed=f">= {p}")
    if (f < 0).any() or (b < 0).any() or any(x < 0 for x in link_ms):
        raise SpecError("times must be >= 0")
    orders = [schedule_interleaved(i, p, m, v, group) for i in range(p)]
    pos = [0] * p
    free = [0.0] * p
    busy = [0.0] * p
    done: dict[tuple[str, int, int, int], float] = {}
    ops: list[Op] = []

    def ready(i: int, kind: str, j: int, c: int) -> float | None:
        if kind == "F":
            if i > 0:
                t = done.get(("F", i - 1, j, c))
                return None if t is None else t + link_ms[i - 1]
            if c == 0:
                return 0.0
            t = done.get(("F", p - 1, j, c - 1))
            return None if t is None else t + link_ms[p - 1]
        if i < p - 1:
            t = done.get(("B", i + 1, j, c))
            return None if t is None else t + link_ms[i]
        if c == v - 1:
            return done.get(("F", i, j, c))
        t = done.get(("B", 0, j, c + 1))
        return None if t is None else t + link_ms[p - 1]

    progress = True
    while progress:
        progress = False
        for i in range(p):
            while pos[i] < len(orders[i]):
                kind, j, c = orders[i][pos[i]]
                r = ready(i, kind, j, c)
                if r is None:
                    break
                dur = float(f[i, c] if kind == "F" else b[i, c])
                start = max(free[i], r)
                free[i] = start + dur
                busy[i] += dur
                done[(kind, i, j, c)] = start + dur
                ops.append(Op(stage=i, microbatch=j * v + c, kind=kind, start_ms=start, end_ms=start + dur))
                pos[i] += 1
                progress = True
    if any(pos[i] < len(orders[i]) for i in range(p)):  # pragma: no cover - Megatron's order is deadlock-free
        raise RuntimeError("interleaved 1F1B simulation deadlocked")
    finish = tuple(free)
    return Simulation(total_ms=max(finish), stage_finish_ms=finish, stage_busy_ms=tuple(busy),
                      ops=tuple(sorted(ops, key=lambda o: (o.start_ms, o.stage))))


@functools.lru_cache(maxsize=512)
def _op_dag(p: int, m: int) -> tuple[tuple[np.ndarray, ...], ...]:
    """The 1F1B op graph of (p stages, m micro-batches), grouped into dependency levels.

    Returns per level ``(op ids, previous op on the stage, input op, link index, duration
    index)``; index ``n_ops`` / link ``p - 1`` / are sentinels for "none" (time 0).
    """
    # plain lists while building (numpy's per-element indexing was most of the cost), arrays at the end
    orders = [schedule_1f1b(i, p, m) for i in range(p)]
    ids: dict[tuple[str, int, int], int] = {}
    for i in range(p):
        for kind, j in orders[i]:
            ids[(kind, i, j)] = len(ids)
    n = len(ids)
    prev = [n] * n
    dep = [n] * n
    link = [p - 1] * n
    dur = [0] * n
    for i in range(p):
        last = n
        for kind, j in orders[i]:
            k = ids[(kind, i, j)]
            prev[k] = last
            last = k
            dur[k] = i if kind == "F" else p + i
            if kind == "F" and i > 0:
                dep[k], link[k] = ids[("F", i - 1, j)], i - 1
            elif kind == "B" and i < p - 1:
                dep[k], link[k] = ids[("B", i + 1, j)], i
    # Kahn's topological order; an op's level is one more than its inputs' levels.
    level = [0] * (n + 1)
    users: list[list[int]] = [[] for _ in range(n + 1)]
    indeg = [0] * n
    for k in range(n):
        for d in {prev[k], dep[k]} - {n}:
            users[d].append(k)
            indeg[k] += 1
    ready = [k for k in range(n) if indeg[k] == 0]
    while ready:
        k = ready.pop()
        level[k] = 1 + max(level[prev[k]] if prev[k] < n else 0, level[dep[k]] if dep[k] < n else 0)
        for u in users[k]:
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    lv = np.array(level[:n], dtype=np.int64)
    prev_a, dep_a = np.array(prev, dtype=np.int64), np.array(dep, dtype=np.int64)
    link_a, dur_a = np.array(link, dtype=np.int64), np.array(dur, dtype=np.int64)
    order = np.argsort(lv, kind="stable")  # by level, ascending op ids within one
    cuts = np.searchsorted(lv[order], np.arange(1, int(lv.max()) + 2))
    out = []
    for x, y in zip(cuts[:-1], cuts[1:]):
        sel = order[x:y]
        out.append((sel, prev_a[sel], dep_a[sel], link_a[sel], dur_a[sel]))
    finals = np.array([ids[("B", i, m - 1)] for i in range(p)], dtype=np.int64)
    return tuple(out) + ((finals,),)


def _run(index: np.ndarray) -> np.ndarray | slice:
    """``index`` as a slice where it is a run of consecutive rows (most levels' previous ops
    are the level before, in order): a view to read, not a copy to gather."""
    if len(index) and int(index[-1]) - int(index[0]) == len(index) - 1 and bool(np.all(np.diff(index) == 1)):
        return slice(int(index[0]), int(index[-1]) + 1)
    return index


@functools.lru_cache(maxsize=512)
def _ring_steps(p: int, m: int) -> tuple[tuple, int]:
    """:func:`_op_dag`'s levels as steps over a ring of rows: ``(steps, rows)``.

    An op reads ops at most ``d`` levels back (``d`` is ``p`` or so; warm-up can reach
    further), so the ``d + 1`` most recent levels of ``w`` ops each are all the evaluation
    keeps: level ``k`` writes rows ``(k mod (d + 1)) w ...``, the last row stays 0 (the
    "none" input). Each step is ``(input rows, link index, previous-op rows, duration index,
    first row, end row, finals)`` (the link, previous-op and duration indices a slice where
    they are consecutive); ``finals``: ``(stages, rows)`` whose last backward this
    level computes, else None. The rows a plan needs are ``(d + 1) w + 1`` instead of
    ``2 p m + 1``, so a chunk holds that many times more plans and the Python steps per
    call shrink by as much (the arithmetic per op is unchanged, so are the results, bit
    for bit)."""
    levels = _op_dag(p, m)
    finals, levels = levels[-1][0], levels[:-1]
    n = 2 * p * m
    sizes = np.array([len(lv[0]) for lv in levels], dtype=np.int64)
    ops = np.concatenate([lv[0] for lv in levels])
    level_of = np.zeros(n, dtype=np.int64)
    level_of[ops] = np.repeat(np.arange(len(levels)), sizes)
    pos_of = np.zeros(n, dtype=np.int64)
    pos_of[ops] = np.arange(len(ops)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    width = int(sizes.max())
    reach = 0
    for col in (1, 2):  # the previous op on the stage, the input from the next or last stage
        inputs = np.concatenate([lv[col] for lv in levels])
        real = inputs < n
        if real.any():
            reach = max(reach, int((level_of[ops[real]] - level_of[inputs[real]]).max()))
    slots = reach + 1
    zero = slots * width
    row_of = np.append((level_of % slots) * width + pos_of, zero)  # op id -> ring row; "none" -> the 0 row
    final_at: dict[int, list[tuple[int, int]]] = {}
    for i, op in enumerate(finals.tolist()):
        final_at.setdefault(int(level_of[op]), []).append((i, int(row_of[op])))
    steps = []
    for k, (sel, prv, dep, lk, du) in enumerate(levels):
        a = (k % slots) * width
        fin = final_at.get(k)
        steps.append((row_of[dep], _run(lk), _run(row_of[prv]), _run(du), a, a + len(sel),
                      None if fin is None else (np.array([i for i, _ in fin]), np.array([r for _, r in fin]))))
    return tuple(steps), zero + 1


#: Micro-batches simulated at most. Beyond, the schedule runs in its steady state, so the finish
#: times grow linearly: they are simulated for this many and half as many micro-batches and
#: extended along that slope. Simulating every micro-batch cost O(p * m) Python steps to build
#: the op graph and O(m) vectorised steps per chunk of plans, without bound in m (a search of
#: tiny-gpt at global batch 65,536 with micro-batch 1 did not finish in 25 minutes). Against
#: the full simulation at m = 5,000 and 6,000 on random heterogeneous stages (p = 3 to 8) the
#: extension is within 1e-4 (tests/unit/test_simulate.py checks 1e-3).
MAX_SIMULATED_MICROBATCHES = 2048


def pipeline_finish_batch(forward_ms: np.ndarray, backward_ms: np.ndarray, link_ms: np.ndarray,
                          num_microbatches: int, *, max_elements: int = 1 << 17) -> np.ndarray:
    """:func:`simulate_1f1b` for many plans at once: ``(N, p)`` times -> ``(N, p)`` finish times.

    All plans share ``p`` (columns) and ``m``. The op graph is evaluated level by level
    (ops whose inputs are ready together), each level one vectorised max-plus step over
    the plans of a chunk, so the cost is ``O(N * p * m)`` with ``O(p + m)`` Python steps per
    chunk. A chunk keeps only the recent levels (:func:`_ring_steps`), at most
    ``max_elements`` op times; 2^17 (1 MiB) was the fastest of 2^14 to 2^19 on the
    cross-vendor example's searches (they stay in the CPU's cache). Past
    :data:`MAX_SIMULATED_MICROBATCHES` the steady state is extended linearly (bounded time).
    """
    cap = MAX_SIMULATED_MICROBATCHES
    if num_microbatches > cap:
        hi = pipeline_finish_batch(forward_ms, backward_ms, link_ms, cap, max_elements=max_elements)
        lo = pipeline_finish_batch(forward_ms, backward_ms, link_ms, cap // 2, max_elements=max_elements)
        return hi + (num_microbatches - cap) * (hi - lo) / (cap - cap // 2)
    f = np.asarray(forward_ms, dtype=np.float64)
    b = np.asarray(backward_ms, dtype=np.float64)
    N, p = f.shape
    c = np.zeros((N, p), dtype=np.float64)
    if p > 1:
        c[:, :p - 1] = link_ms
    steps, rows = _ring_steps(p, num_microbatches)
    out = np.empty((N, p), dtype=np.float64)
    step = max(1, max_elements // rows)
    # Op-major layout: each level gathers whole rows (contiguous copies), not scattered columns.
    for a0 in range(0, N, step):
        z = min(N, a0 + step)
        dur = np.concatenate([f[a0:z].T, b[a0:z].T], axis=0)
        cc = np.ascontiguousarray(c[a0:z].T)
        E = np.zeros((rows, z - a0), dtype=np.float64)
        o = out[a0:z].T
        for dep, lk, prv, du, a, e, fin in steps:
            x = E[dep]
            x += cc[lk]
            np.maximum(x, E[prv], out=x)
            x += dur[du]
            E[a:e] = x
            if fin is not None:
                o[fin[0]] = E[fin[1]]
    return out


def closed_form_ms(forward_ms, backward_ms, link_ms, num_microbatches):
    """The textbook heterogeneous 1F1B estimate (arrays: stages on the last axis).

    ``sum_i (f_i + b_i) + 2 sum_i c_i + (m - 1) max_i (f_i + b_i)``: one micro-batch's trip
    through every stage and link and back, plus ``m - 1`` periods of the bottleneck stage.
    Exact for uniform stages without link costs; otherwise it is off, both ways: it
    assumes the bottleneck stage also waits for the last micro-batch's downstream round
    trip (in 1F1B it runs its cooldown backwards meanwhile: overestimate), and it ignores
    the link round trips stage 0 cannot hide with only ``p`` micro-batches in flight
    (underestimate). Against :func:`simulate_1f1b` on random heterogeneous stages it is
    up to ~20 % high, so the search composes with :func:`pipeline_finish_batch` instead;
    this is kept for comparison (``benchmarks/search_speed.py`` prints the gap).
    """
    f = np.asarray(forward_ms, dtype=np.float64)
    b = np.asarray(backward_ms, dtype=np.float64)
    c = np.asarray(link_ms, dtype=np.float64)
    t = f + b
    return np.sum(t, axis=-1) + 2.0 * np.sum(c, axis=-1) + (np.asarray(num_microbatches) - 1) * np.max(t, axis=-1)


def interleaved_finish(forward_ms, backward_ms, link_ms, num_microbatches: int, virtual_stages: int = 1,
                       group: int | None = None):
    """Each stage's finish time under 1F1B, or with ``v`` model chunks per stage under interleaved
    1F1B, priced as 1F1B of ``m·v`` micro-batches of ``1/v`` of each stage's time: the
    warm-up/cool-down bubble shrinks to ``(p-1)/(v·m)`` of the steady state (Narayanan et al.
    2021, §2.2.2) and every stage boundary carries ``v`` times the messages, as interleaving
    sends them. The embedding and the head sit in the first / last chunk in Megatron; here
    they are spread over the stage's chunks (:func:`simulate_interleaved` is the exact
    schedule; tests/unit/test_schedule_interleaved.py compares the two).

    ``group``: micro-batches per virtual-stage group (``--microbatch-group-size-per-virtual-
    pipeline-stage``); None or ``p`` is megatron-core's default and priced as above. Another
    group changes the op order the 1F1B of ``m·v`` does not follow (and lets ``m`` be no
    multiple of ``p``), so each plan is priced by :func:`simulate_interleaved` itself, in
    Megatron's order for that group, with the same ``1/v`` chunks and links (the wrap link
    from the last stage to the first left out, as above). One Python simulation per plan:
    the search prices the default group only."""
    v = int(virtual_stages)
    if v == 1:
        return pipeline_finish_batch(forward_ms, backward_ms, link_ms, num_microbatches)
    f, b = np.asarray(forward_ms, dtype=np.float64), np.asarray(backward_ms, dtype=np.float64)
    p = f.shape[1]
    if group is None or int(group) == p:
        return pipeline_finish_batch(f / v, b / v, link_ms, num_microbatches * v)
    c = np.broadcast_to(np.asarray(link_ms, dtype=np.float64), (f.shape[0], max(p - 1, 0)))
    out = np.empty_like(f)
    for r in range(f.shape[0]):
        sim = simulate_interleaved(np.repeat(f[r, :, None] / v, v, axis=1), np.repeat(b[r, :, None] / v, v, axis=1),
                                   list(c[r]) + [0.0], num_microbatches, group=int(group))
        out[r] = sim.stage_finish_ms
    return out
