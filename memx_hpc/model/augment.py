"""Interpolation augmentation: fill unprofiled grid points from their profiled neighbours.

Along the axes where the physics is near-linear (MemX §4; Korthikanti et al. 2022 for
memory), between two profiled neighbours ``x_lo < x < x_hi`` of one series (same GPU
type, kind, shape, precision, recompute, attention, and the other axis fixed):

* micro-batch axis: forward, backward and optimizer time and activation bytes are
  interpolated linearly in the micro-batch (time is near-linear in tokens per GPU once
  the GPU is busy; activation memory is exactly linear in the micro-batch);
* TP axis: linearly in ``1/tp`` — a layer's work per GPU is ``tokens/tp`` and its
  activation memory is ``R + D/tp`` (replicated plus divided parts).

New samples are ``origin="augmented"``, carry a lower ``weight`` (the neighbours' weight
times ``weight``; the fit treats them as weaker evidence), and say in ``provenance``
which samples they came from. Nothing is extrapolated past the profiled range unless
``extrapolate=True``, and then the provenance says ``"extrapolated": true`` and the
weight is lower still. Memory is interpolated only when both neighbours know it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Iterable, Sequence

from ..spec import LayerSample, Provenance

#: Default grids: the micro-batch sizes and TP degrees a search typically asks for
#: (powers of two and three times powers of two; powers of two for TP).
DEFAULT_MBS_GRID = tuple(sorted({2**k for k in range(0, 11)} | {3 * 2**k for k in range(0, 10)}))
DEFAULT_TP_GRID = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_WEIGHT = 0.3
EXTRAPOLATION_WEIGHT = 0.1
_KINDS = ("layer", "embedding", "head")


def _usable(s: LayerSample) -> bool:
    return s.point.kind in _KINDS and not s.infeasible and s.forward_ms + s.backward_ms > 0


def _series_key(s: LayerSample, axis: str) -> tuple:
    p = s.point
    other = p.tp if axis == "mbs" else p.micro_batch_size
    return (p.gpu_type, p.kind, p.shape, p.precision, p.recompute, p.attention, other)


def _coord(s: LayerSample, axis: str) -> int:
    return s.point.micro_batch_size if axis == "mbs" else s.point.tp


def _lin(axis: str, x: int) -> float:
    """The coordinate in which the quantities are linear: mbs itself, or 1/tp."""
    return float(x) if axis == "mbs" else 1.0 / x


def _make(axis: str, x: int, lo: LayerSample, hi: LayerSample, *, weight: float, extrapolated: bool) -> LayerSample:
    xl, xh, xq = _lin(axis, _coord(lo, axis)), _lin(axis, _coord(hi, axis)), _lin(axis, x)
    u = (xq - xl) / (xh - xl)

    def mix(a: float, b: float) -> float:
        return a + u * (b - a)

    act = 0
    if lo.activation_bytes > 0 and hi.activation_bytes > 0:
        act = max(int(round(mix(lo.activation_bytes, hi.activation_bytes))), 0)
    point = replace(lo.point, micro_batch_size=x) if axis == "mbs" else replace(lo.point, tp=x)
    prov = {"axis": "micro_batch_size" if axis == "mbs" else "tp", "from": [_coord(lo, axis), _coord(hi, axis)],
            "sources": sorted({lo.source, hi.source}), "extrapolated": extrapolated,
            "rule": "linear in micro-batch" if axis == "mbs" else "linear in 1/tp"}
    return LayerSample(
        point=point, forward_ms=max(mix(lo.forward_ms, hi.forward_ms), 0.0),
        backward_ms=max(mix(lo.backward_ms, hi.backward_ms), 0.0), update_ms=max(mix(lo.update_ms, hi.update_ms), 0.0),
        activation_bytes=act, origin="augmented", source=f"augmented:{prov['axis']}",
        provenance=Provenance.of(prov),
        weight=weight * min(lo.weight, hi.weight) * (EXTRAPOLATION_WEIGHT / DEFAULT_WEIGHT if extrapolated else 1.0))


def _along(samples: Sequence[LayerSample], axis: str, grid: Iterable[int], *, weight: float,
           extrapolate: bool) -> list[LayerSample]:
    series: dict[tuple, dict[int, LayerSample]] = defaultdict(dict)
    for s in samples:
        if _usable(s):
            # the first sample at a coordinate wins; measured ones are passed first
            series[_series_key(s, axis)].setdefault(_coord(s, axis), s)
    grid = sorted(set(grid))
    out: list[LayerSample] = []
    for pts in series.values():
        xs = sorted(pts)
        if len(xs) < 2:
            continue
        for x in grid:
            if x in pts:
                continue
            if xs[0] < x < xs[-1]:
                hi_i = next(i for i, v in enumerate(xs) if v > x)
                out.append(_make(axis, x, pts[xs[hi_i - 1]], pts[xs[hi_i]], weight=weight, extrapolated=False))
            elif extrapolate:
                lo, hi = (xs[0], xs[1]) if x < xs[0] else (xs[-2], xs[-1])
                if axis == "tp" and x > xs[-1]:
                    continue  # beyond the largest profiled TP the collectives dominate: never guess
                out.append(_make(axis, x, pts[lo], pts[hi], weight=weight, extrapolated=True))
    return out


def augment(samples: Sequence[LayerSample], *, mbs_grid: Iterable[int] = DEFAULT_MBS_GRID,
            tp_grid: Iterable[int] = DEFAULT_TP_GRID, weight: float = DEFAULT_WEIGHT,
            extrapolate: bool = False) -> list[LayerSample]:
    """The augmented samples for ``samples`` (new ones only; the inputs are not repeated).

    TP gaps are filled first from profiled points; then micro-batch gaps from the
    profiled and TP-filled points (a point filled along both axes gets ``weight²``).
    Points already present (any origin) are never overwritten.
    """
    if not 0 < weight <= 1:
        raise ValueError("augmentation weight must be in (0, 1]")
    ordered = sorted((s for s in samples if _usable(s)), key=lambda s: s.origin != "measured")
    by_tp = _along(ordered, "tp", tp_grid, weight=weight, extrapolate=extrapolate)
    by_mbs = _along(ordered + by_tp, "mbs", mbs_grid, weight=weight, extrapolate=extrapolate)
    return by_tp + by_mbs
