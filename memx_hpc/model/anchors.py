"""Measured anchors: exact where a point was measured, physical interpolation between and beyond.

The predictor's time answer for a GPU chip that has measurements is built here, not by
trees. Every measured point ``p`` is kept as its *log ratio to the roofline* of its own
GPU type, ``r_p = log(t_p / roofline(p))`` (the inverse of the achieved efficiency), and a
query ``q`` gets ``t_q = exp(r(q)) * roofline(q)`` with ``r(q)``:

* **exact** — ``q`` is a measured point (same GPU type, kind, shape, precision, attention,
  recompute, TP and micro-batch): ``r_p`` itself, so the answer is the measurement (the
  median of repeats);
* **series** — the shape was measured on this GPU at other (TP, micro-batch), or in the
  other 16-bit precision (fp16 for bf16: one set of units, the roofline of each): ``r``
  interpolated linearly in log micro-batch at each measured TP, then linearly in log TP
  (log-log interpolation of time: the roofline is linear in the micro-batch); beyond the
  measured micro-batches the nearest measured ratio is held, i.e. the nearest point scaled
  by the roofline ratio of the work (FLOPs, bytes and TP collectives); beyond the measured
  TPs a layer is 1/TP of the work at the efficiency the series reaches for work of that
  size, plus the TP collectives (:meth:`Anchors._tp_physical`; on Sailor's data-centre
  GPUs, the largest TP of each series held out: 8.6 % against 13.8 % for the held ratio,
  ``tests/accuracy/test_accuracy.py``);
* **work** — the shape was never measured on this chip (in this precision class): with
  the chip's own points of the query's attention kernel at the nearest measured TP, their
  efficiency curve over ``x``, the log roofline of the work (the time it takes at the
  GPU's datasheet peaks: the size of the work relative to the GPU) -- non-increasing
  (larger work runs at least as efficiently; pool-adjacent-violators) with a slope guard
  so that more work never takes less time -- ``interpolated`` inside the measured range;
  beyond it the curve's end follows the trend of a curve pooled over every measured chip
  (never a tree's flat edge; ``extrapolated``). At a TP that kernel never ran on the chip,
  one rank does 1/TP of the work (compute and memory-bound parts) at the efficiency the
  chip's curve gives for work of that smaller size, plus the TP collectives
  (:meth:`Anchors._tp_physical`): small shares run less efficiently. A chip that never
  ran the kernel gets the pooled curve plus its offset from it (``r = f(x) + offset[chip]``, fitted by backfitting).

An efficiency is the device's: a layer measured within :data:`HOST_BOUND_MARGIN` of its
host-dispatch floor (:mod:`memx_hpc.model.host`; the composition takes ``max(device, host)``)
says only that the device took no longer, so the curves over work (``work``, the TP scaling,
the pooled curve) are learned from the device-bound points, and each point at its floor caps
them from above: its time for less work (time is monotone in the work), its ratio to the
roofline for more (the curves never fall with the work). A chip measured only at its floor
keeps those points.

A chip never measured gets the roofline's own parts with costs learned on every measured
chip (:meth:`Anchors.datasheet`): ``(a0 + a1 F) * compute + b * memory-bound kernels + c *
TP collectives + d``, each part at least its roofline time, ``F`` the rated peak per W of
board power (:func:`_flops_per_watt`) -- a part with little bandwidth per FLOP, or a card
rated far beyond what its power cap sustains, runs at a lower fraction of its peak; a newer
generation is not assumed to reach peak. A module (SXM, OAM, superchip) has a power budget
sized for sustained matrix load: its ``F`` counts at most as the least-bound measured module's
(the smallest ``F`` of a measured module behind the fit), so a newer process's FLOP/s per W
is not read as a power cap. ``b`` is learned apart for the two kinds of layer code the
measured points come from (:data:`memx_hpc.model.api.KERNELS`): Megatron's, which fuses its
memory-bound steps, and plain PyTorch (Cephalo's Hugging Face layers), whose unfused
elementwise kernels move several times the bytes the formula counts; a query is priced by
its own kind (a plan's layers are Megatron's), at the roofline where no point of that kind
was measured.

Types of one chip (``chip:`` in the GPU catalog: V100-16 and V100-32) share each other's
points when a type has none of its own; the ratio to each type's own roofline carries the
difference in memory bandwidth where there is one. Times at one (series, TP) are made
non-decreasing in the micro-batch (a running maximum: measurement noise never makes more
tokens faster). An answer for a shape never measured never drops below the roofline
(``r >= 0``); along a measured series the measured ratio stands even where it is below 1
(Sailor's embedding and head timings are, where the roofline counts work they skip).

Memory (activation bytes) is anchored the same way on the analytic formula where a series
of the same shape and configuration measured it, on any GPU (exact, or interpolated along
the series); elsewhere the caller keeps the analytic prior with a bounded learned residual.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..spec import DENSE_SHAPE_FIELDS, LayerShape, LayerSample
from .analytic import ATTENTION_KINDS
from .api import LayerQuery, analytic_activation_bytes, kernels_of, resolve_gpu, roofline_components
from .host import query_host_ms

#: How an answer was obtained, from most to least direct.
HOW = ("measured", "interpolated", "extrapolated")

_PRECISION_CLASS = {"fp16": "half", "bf16": "half", "fp32": "fp32"}


@functools.lru_cache(maxsize=None)
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


#: Types whose values :func:`plain_dict` and :func:`named_values` keep as they are, checked
#: first: most fields are one of these, and two ``hasattr`` per field were most of the cost
#: of hashing a store's samples (a warm plan recognising its saved predictor).
_PLAIN_TYPES = frozenset({bool, int, float, str, type(None)})


def plain_dict(obj: Any) -> dict[str, Any]:
    """``dataclasses.asdict`` of a spec of plain values (nested specs become dicts, in field
    order), without the deep copy of every value that makes ``asdict`` the largest cost of a
    fit (hashing, anchoring and binding thousands of samples)."""
    out = {}
    for name in _field_names(type(obj)):
        v = getattr(obj, name)
        out[name] = v if type(v) in _PLAIN_TYPES else plain_dict(v) if hasattr(type(v), "__dataclass_fields__") else v
    return out


def named_values(obj: Any) -> tuple:
    """A spec of plain values as ``((field, value), ...)`` in field order, nested specs the
    same way: :func:`plain_dict` as a tuple, for hashing."""
    out = []
    for name in _field_names(type(obj)):
        v = getattr(obj, name)
        if type(v) in _PLAIN_TYPES:
            pass
        elif hasattr(type(v), "__dataclass_fields__"):
            v = named_values(v)
        elif hasattr(v, "item") and not isinstance(v, (bool, int, float, str)):
            v = v.item()  # a NumPy scalar: the Python value, whose repr does not name its type
        out.append((name, v))
    return tuple(out)


def _shape_key(s: LayerShape | dict[str, Any], kind: str) -> tuple:
    """What identifies a shape (or a shape's :func:`plain_dict`) for ``kind``: a transformer
    layer never touches the vocabulary, the embedding and head do."""
    # a stored shape from before LayerShape described MoE / MLA layers lacks those fields: their defaults
    d = {**_SHAPE_DEFAULTS, **s} if isinstance(s, dict) else plain_dict(s)
    if kind == "layer":
        d.pop("vocab_size")
    return tuple(sorted(d.items()))


_SHAPE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(LayerShape) if f.name not in DENSE_SHAPE_FIELDS}


def _median(xs: list[float]) -> float:
    # one value (most anchored points have no repeats) is its own median; np.median agrees
    return float(xs[0]) if len(xs) == 1 else float(np.median(xs))


def _cfg(q: LayerQuery) -> tuple:
    return (q.precision, q.attention, q.recompute, bool(q.sequence_parallel))


@dataclass
class _Series:
    gpu: str
    kind: str
    cfg: tuple
    shape: LayerShape
    # tp -> rows [mbs, r_time, r_mem, log_flops, log_roofline_ms]
    by_tp: dict[int, list[list[float]]] = field(default_factory=dict)
    skey: tuple = ()

    def finish(self) -> None:
        for tp, rows in self.by_tp.items():
            rows.sort(key=lambda r: r[0])

    def points(self) -> list[tuple[int, list[float]]]:
        return [(tp, r) for tp, rows in self.by_tp.items() for r in rows]


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> tuple[float, bool]:
    """Linear interpolation of the finite ``ys`` over sorted ``xs``; flat beyond the ends.
    Returns ``(y, inside)``; ``(nan, False)`` when no ``y`` is finite."""
    pts = [(a, b) for a, b in zip(xs, ys) if not math.isnan(b)]
    if not pts:
        return math.nan, False
    if x <= pts[0][0]:
        return pts[0][1], x == pts[0][0]
    if x >= pts[-1][0]:
        return pts[-1][1], x == pts[-1][0]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            if x1 == x0:
                return y0, True
            u = (x - x0) / (x1 - x0)
            return y0 + u * (y1 - y0), True
    return pts[-1][1], False  # unreachable


def efficiency_curve(w: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ratio-to-roofline curve over log work ``w``: non-increasing in ``w`` (larger work
    runs at least as efficiently; pool-adjacent-violators on the points sorted by ``w``),
    then each step limited to ``r[i] >= r[i-1] - (w[i] - w[i-1])`` so that the time
    ``exp(r) * roofline`` (roofline ~ exp(w)) never falls as the work grows."""
    order = np.argsort(w, kind="stable")
    w, r = np.asarray(w, float)[order], np.asarray(r, float)[order]
    # pool adjacent violators for a non-increasing fit
    blocks: list[list[float]] = []  # [sum, count, w_first, w_last]
    for wi, ri in zip(w, r):
        blocks.append([ri, 1.0, wi, wi])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            s, c, _, wl = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
            blocks[-1][3] = wl
    xs, ys = [], []
    for s, c, wf, wl in blocks:
        xs.append(0.5 * (wf + wl))
        ys.append(s / c)
    xs_a, ys_a = np.array(xs), np.array(ys)
    for i in range(1, len(xs_a)):
        ys_a[i] = max(ys_a[i], ys_a[i - 1] - (xs_a[i] - xs_a[i - 1]))
    return xs_a, ys_a


class Anchors:
    """The measured points a fitted predictor keeps, answering queries from them.

    Built from samples (medians of repeats per exact point); serialised as plain rows
    (:meth:`to_json`) and bound to a Site/Catalog (:meth:`bind`) to compute rooflines.
    """

    def __init__(self, rows: list[dict[str, Any]], parts: dict[str, Any] | None = None) -> None:
        self.rows = rows
        self._bound: Any = None
        #: parts fits saved with a predictor (:meth:`parts_json`), used when a binding
        #: resolves every GPU name to the same figures as the one they were fitted on
        self._saved_parts = parts
        #: per binding target (held, so its id is not reused), each row's query, GPU type and
        #: roofline figures: shared by the anchors :meth:`without` makes, which bind the same
        #: rows again (a cross-validation fold each)
        self._row_values: dict[int, tuple[Any, dict[int, Any]]] = {}

    # -------------------------------------------------------------- building

    @classmethod
    def from_samples(cls, samples: Sequence[LayerSample]) -> "Anchors":
        groups: dict[str, list[LayerSample]] = defaultdict(list)
        qs: dict[str, dict[str, Any]] = {}
        for s in samples:
            p = s.point
            if p.kind not in ("layer", "embedding", "head") or s.infeasible or s.origin == "augmented":
                continue
            if s.forward_ms + s.backward_ms <= 0 and s.activation_bytes <= 0:
                continue
            q = {"gpu_type": p.gpu_type, "kind": p.kind, "shape": plain_dict(p.shape), "tp": p.tp,
                 "micro_batch_size": p.micro_batch_size, "recompute": p.recompute, "precision": p.precision,
                 "attention": p.attention, "kernels": kernels_of(s)}
            k = repr(sorted((k, repr(v)) for k, v in q.items()))
            groups[k].append(s)
            qs[k] = q
        rows = []
        for k, ss in groups.items():
            t = [s.forward_ms + s.backward_ms for s in ss if s.forward_ms + s.backward_ms > 0]
            m = [s.activation_bytes for s in ss if s.activation_bytes > 0]
            rows.append({"q": qs[k], "t": _median(t) if t else None, "m": _median(m) if m else None})
        rows.sort(key=lambda r: repr(sorted(r["q"].items())))
        return cls(rows)

    def without(self, *, micro_batch_size: int) -> "Anchors":
        """The anchors of the same samples less those at ``micro_batch_size``: equal to
        :meth:`from_samples` of those samples (a row is one exact point, and the rows stay
        in their order), without regrouping them."""
        out = Anchors([r for r in self.rows if r["q"]["micro_batch_size"] != micro_batch_size])
        out._row_values = self._row_values
        return out

    def to_json(self) -> list[dict[str, Any]]:
        return self.rows

    @classmethod
    def from_json(cls, rows: list[dict[str, Any]], parts: dict[str, Any] | None = None) -> "Anchors":
        return cls(list(rows), parts)

    def parts_json(self) -> dict[str, Any]:
        """Every parts fit (:meth:`_parts_fit`) a query can ask of this binding, with the
        binding's fingerprint: saved with a predictor, they spare a reload the fits (and
        SciPy's import, a quarter of a warm ``predict`` that estimates a GPU never profiled)."""
        fits = []
        kinds = sorted({k for _, k in self.by_chip})
        for kind in kinds:
            for pc in sorted(set(_PRECISION_CLASS.values())):
                for attention in ATTENTION_KINDS:
                    fit = self._parts_fit(kind, pc, attention)
                    fits.append([kind, pc, attention, None if fit is None else [fit[0].tolist(), fit[1], fit[2]]])
        return {"binding": self._binding, "fits": fits}

    @staticmethod
    def _query(d: dict[str, Any], shapes: dict[tuple, LayerShape] | None = None) -> LayerQuery:
        """The query of a stored row; ``shapes``: LayerShapes already built, by their items
        (thousands of rows share a few dozen shapes, each checked once)."""
        items = tuple(d["shape"].items())
        shape = shapes.get(items) if shapes is not None else None
        if shape is None:
            shape = LayerShape(**d["shape"])
            if shapes is not None:
                shapes[items] = shape
        return LayerQuery(gpu_type=d["gpu_type"], kind=d["kind"], shape=shape, tp=int(d["tp"]),
                          micro_batch_size=int(d["micro_batch_size"]), recompute=d["recompute"],
                          precision=d["precision"], attention=d["attention"],
                          kernels=d.get("kernels", "megatron"))

    def bind(self, gpus: Any) -> "Anchors":
        """Resolve GPU names and compute each point's log ratios through ``gpus``."""
        if self._bound is gpus:
            return self
        self.gpus = gpus
        series: dict[tuple, _Series] = {}
        self.by_chip: dict[tuple[str, str], list[_Series]] = defaultdict(list)
        self.by_shape: dict[tuple, list[_Series]] = defaultdict(list)
        self.gpu_names: set[str] = set()
        self.chip_of: dict[str, str] = {}
        #: the measured GPU types that are modules (SXM / OAM): :meth:`datasheet`'s power term
        self.module_names: set[str] = set()
        shapes: dict[tuple, LayerShape] = {}
        gpu_of: dict[str, Any] = {}
        done = self._row_values.setdefault(id(gpus), (gpus, {}))[1]
        for row in self.rows:
            entry = done.get(id(row))
            if entry is None:
                entry = done[id(row)] = self._row_entry(row, gpus, shapes, gpu_of)
            if entry is False:
                continue
            q, g, key, values = entry
            gpu_of.setdefault(q.gpu_type, g)
            ser = series.get(key)
            if ser is None:
                ser = series[key] = _Series(gpu=g.name, kind=q.kind, cfg=_cfg(q), shape=q.shape, skey=key[3])
                self.by_chip[(g.chip_id, q.kind)].append(ser)
                self.by_shape[(q.kind, key[3], _cfg(q))].append(ser)
            ser.by_tp.setdefault(q.tp, []).append(list(values))  # a copy: the running maximum below edits it
            self.gpu_names.add(g.name)
            self.chip_of[g.name] = g.chip_id
            if getattr(g, "form_factor", "") == "module":
                self.module_names.add(g.name)
        for ser in series.values():
            ser.finish()
            if ser.kind != "layer":
                continue  # embedding/head timings are small and noisy: kept as measured
            for rows in ser.by_tp.values():
                # more tokens never faster: a running maximum of the measured time over the micro-batch
                best = -math.inf
                for r in rows:
                    if math.isnan(r[1]):
                        continue
                    lt = r[1] + r[4]
                    if lt < best:
                        r[1] = best - r[4]
                    best = max(best, r[1] + r[4])
        self._bound = gpus
        self._curves = {}
        # what the binding depends on besides the rows: the figures each GPU name resolves to
        self._binding = hashlib.sha256(repr(sorted(
            (n, repr(g)) for n, g in gpu_of.items())).encode()).hexdigest()
        saved = self._saved_parts
        if saved and saved.get("binding") == self._binding and all(
                fit is None or (len(fit) == 3 and len(fit[0]) == len(self.PARTS_FLOOR)) for *_, fit in saved["fits"]):
            for kind, pc, attention, fit in saved["fits"]:
                self._curves[("parts", kind, pc, attention)] = (
                    None if fit is None else (np.asarray(fit[0], dtype=np.float64), float(fit[1]), float(fit[2])))
        return self

    def _row_entry(self, row: dict[str, Any], gpus: Any, shapes: dict, gpu_of: dict) -> Any:
        """``(query, GPU type, series key, [mbs, r_time, r_mem, log flops, log roofline ms,
        compute ms, memory ms, comm ms, flops per W, host floor ms, eager])`` of a stored row through
        ``gpus`` (the host floor: :func:`memx_hpc.model.host.query_host_ms` of a layer, 0 for
        the embedding and head); False for a row this binding cannot use."""
        try:
            q = self._query(row["q"], shapes)
            g = gpu_of.get(q.gpu_type)
            if g is None:
                g = gpu_of[q.gpu_type] = resolve_gpu(gpus, q.gpu_type)
        except Exception:  # a GPU name this site/catalog does not know: unusable here
            return False
        c = roofline_components(q, g)
        roof = c["compute_ms"] + c["memory_ms"] + c["comm_ms"]
        rt = math.log(row["t"] / roof) if row["t"] else math.nan
        rm = math.log(row["m"] / max(analytic_activation_bytes(q), 1)) if row["m"] else math.nan
        key = (g.name, q.kind, _cfg(q), _shape_key(row["q"]["shape"], q.kind))
        host = query_host_ms(q)
        return q, g, key, (float(q.micro_batch_size), rt, rm, math.log(max(c["flops"], 1.0)), math.log(roof),
                           c["compute_ms"], c["memory_ms"], c["comm_ms"], _flops_per_watt(q, g), host,
                           float(q.kernels == "eager"))

    def datasheet(self, q: LayerQuery, g: Any) -> float:
        """Log ratio to the roofline for a chip with no measurement, from the roofline's own
        parts with costs learned on every measured chip (:meth:`_parts_fit`): ``t = (a0 + a1
        * F) * compute_ms + b[kernels] * memory_ms + c * comm_ms + d``. ``a0 + a1 * F`` is the inverse
        achieved fraction of the datasheet matrix rate, larger on a part whose rated peak
        per W of board power (``F``) lies far beyond what its power cap sustains; ``b`` the
        cost of the memory-bound kernels per analytic byte-time, of the query's kind of
        layer code (``q.kernels``: Cephalo's unfused PyTorch layers move several times the
        bytes the formula counts, at below-peak bandwidth; Megatron fuses those steps);
        ``d`` the fixed per-layer cost (kernel launches). A module's ``F`` is at most the
        smallest of the measured modules behind the fit, the module least bound by its power
        (an H100-SXM, B200 or GB200 is not a power-capped card because its newer process does
        more FLOP/s per W: Megatron-Bridge's published runs on them, benchmarks/public_runs.py
        dev rows, reach about twice the fraction of peak the unbounded term gave them), so
        the power term is never extrapolated for a module. A part with little bandwidth per FLOP (L4, T4) so runs a layer at a
        lower fraction of its matrix peak than one with much (V100, A100) -- the pooled
        ratio-to-roofline curve it replaces could not tell them apart. Falls back to that
        curve where too few points were measured. Never below the roofline (``r >= 0``);
        NaN when nothing of this kind was measured."""
        fit = self._parts_fit(q.kind, _PRECISION_CLASS[q.precision], q.attention)
        if fit is not None:
            coef, fpw_median, fpw_module = fit
            c = roofline_components(q, g)
            roof = c["compute_ms"] + c["memory_ms"] + c["comm_ms"]
            fpw = _flops_per_watt(q, g)
            if getattr(g, "form_factor", "") == "module":
                # a module's power budget is sized for sustained matrix load: its peak per W
                # beyond the measured modules' is a newer process, not a power cap
                fpw = fpw_module if math.isnan(fpw) else min(fpw, fpw_module)
            t = float(coef @ _parts_row(c["compute_ms"], c["memory_ms"], c["comm_ms"],
                                        fpw_median if math.isnan(fpw) else fpw, q.kernels == "eager"))
            y = math.log(t / roof) if t > 0 and roof > 0 else 0.0
        else:
            y = self._pool(q.kind, _PRECISION_CLASS[q.precision], q.attention, self._peak_time(q, g))
            if math.isnan(y):
                return math.nan
        if q.kind == "layer":
            # bounded by what the measured chips saturated at, however large the work
            y = self._saturate(y, q, g, None)
        return max(y, 0.0)

    #: Fewest measured chips and points behind a parts fit (else the pooled curve answers).
    MIN_PARTS_CHIPS, MIN_PARTS_POINTS = 2, 8
    #: The least cost of each part of :func:`_parts_row` (compute, compute x F, Megatron's
    #: memory-bound kernels, eager ones, TP collectives, fixed): its roofline time, once.
    PARTS_FLOOR = np.array([1.0, 0.0, 1.0, 1.0, 1.0, 0.0])

    def _parts_fit(self, kind: str, pc: str, attention: str) -> tuple[np.ndarray, float, float] | None:
        """Non-negative ``(a0, a1, b_megatron, b_eager, c, d)`` with ``t ~ (a0 + a1*F)*compute_ms + b*memory_ms +
        c*comm_ms + d`` (``b`` of the point's kind of layer code), ``F`` a part's peak TFLOP/s per W of board power (a card rated far
        beyond what its power cap sustains -- T4, L4, H100-NVL -- runs its matrix units at a
        lower clock; a part whose power is not known gets the measured parts' median ``F``:
        :func:`_flops_per_watt`), each cost at least 1 for the roofline parts
        (:attr:`PARTS_FLOOR`),
        over every measured chip's points of this kind and precision class (the query's
        attention kernel where any chip ran it), least squares in relative error with each
        chip weighted equally in total (a chip with many points does not decide for the
        others; reweighted to least absolute relative error). Non-negative costs keep the time
        monotone in every part of the work. Returned with the median ``F`` and the smallest
        ``F`` of a measured module (of any measured part where no module was measured): the
        most a module's ``F`` counts in :meth:`datasheet`. None
        when fewer than :attr:`MIN_PARTS_CHIPS` chips / :attr:`MIN_PARTS_POINTS` points."""
        key = ("parts", kind, pc, attention)
        cache = self.__dict__.setdefault("_curves", {})
        if key in cache:
            return cache[key]
        pts = [(chip, s.cfg[1], r, s.gpu) for (chip, k), sers in self.by_chip.items() if k == kind
               for s in sers if _PRECISION_CLASS[s.cfg[0]] == pc for _, r in s.points() if not math.isnan(r[1])]
        same = [p for p in pts if p[1] == attention] or pts
        module_pts = [(p[3], p[2]) for p in same if p[3] in self.module_names]
        same = [p[:3] for p in same]
        chips = [p[0] for p in same]
        if len(set(chips)) < self.MIN_PARTS_CHIPS or len(same) < self.MIN_PARTS_POINTS:
            cache[key] = None
            return None
        from scipy.optimize import nnls
        fpws = [r[8] for _, _, r in same if not math.isnan(r[8]) and r[8] > 0]
        fpw_median = float(np.median(fpws)) if fpws else 0.0
        modules = [r[8] for s, r in module_pts if not math.isnan(r[8]) and r[8] > 0]
        fpw_module = min(modules or fpws) if fpws else 0.0
        X = np.array([_parts_row(r[5], r[6], r[7], fpw_median if math.isnan(r[8]) else r[8], r[10] > 0)
                      for _, _, r in same])
        t = np.exp(np.array([r[1] + r[4] for _, _, r in same]))
        n = defaultdict(int)
        for c in chips:
            n[c] += 1
        w = 1.0 / (t * np.sqrt(np.array([n[c] for c in chips], float)))
        # every part costs at least its roofline time (no kernel beats the datasheet peak, no
        # collective the link): the fit is of the costs above those floors, non-negative. A
        # part the points cannot identify (TP collectives where the chips of this attention
        # kernel only ran TP 1) then stays at its roofline instead of costing nothing.
        floor = self.PARTS_FLOOR
        rest = t - X @ floor
        coef, _ = nnls(X * w[:, None], rest * w)
        for _ in range(5):
            # iteratively reweighted toward least *absolute* relative error (the APE that is
            # scored), so a cluster whose times do not follow its chip's datasheet (Sailor's
            # RTX-2080 and Titan-RTX run OPT-350 in the same time) does not drag the costs
            rel = np.abs(X @ (coef + floor) - t) / t
            v = w / np.sqrt(np.maximum(rel, 0.02))
            coef, _ = nnls(X * v[:, None], rest * v)
        coef = coef + floor
        cache[key] = (coef, fpw_median, fpw_module) if np.any(coef[:5] > 0) else None
        return cache[key]

    @staticmethod
    def _peak_time(q: LayerQuery, g: Any) -> float:
        """Log roofline ms: the work's time at datasheet peaks, TP collectives included --
        the curve's slope guard then makes the time rise wherever the roofline does."""
        c = roofline_components(q, g)
        return math.log(c["compute_ms"] + c["memory_ms"] + c["comm_ms"])

    def _pool_fit(self, kind: str, pc: str, attention: str) -> Any:
        """The pooled model ``r = f(x) + offset[chip]`` over every measured chip's points of
        this kind and precision class (the query's attention kernel where any chip ran it):
        ``x`` the log time of the work at the GPU's datasheet peaks, ``f`` non-increasing
        and slope-guarded (:func:`efficiency_curve`), one offset per chip (its median
        residual, centred so that the median chip has 0). Fitted by backfitting, three
        rounds. None when nothing was measured."""
        key = (kind, pc, attention)
        cache = self.__dict__.setdefault("_curves", {})
        if key in cache:
            return cache[key]
        pts = [(r[4], r[1], s.cfg[1], chip) for (chip, k), sers in self.by_chip.items() if k == kind
               for s in sers if _PRECISION_CLASS[s.cfg[0]] == pc
               for r in device_bound([r for _, r in s.points() if not math.isnan(r[1])])]
        same = [p for p in pts if p[2] == attention] or pts
        if not same:
            cache[key] = None
            return None
        x = np.array([p[0] for p in same])
        r = np.array([p[1] for p in same])
        chips = np.array([p[3] for p in same])
        names = sorted(set(chips))
        off = {c: 0.0 for c in names}
        for _ in range(3):
            xs, ys = efficiency_curve(x, r - np.array([off[c] for c in chips]))
            f = np.interp(x, xs, ys)
            off = {c: float(np.median((r - f)[chips == c])) for c in names}
            mid = float(np.median(list(off.values())))
            off = {c: v - mid for c, v in off.items()}
        xs, ys = efficiency_curve(x, r - np.array([off[c] for c in chips]))
        cache[key] = (xs, ys, off)
        return cache[key]

    def _pool(self, kind: str, pc: str, attention: str, x: float, chip: str | None = None) -> float:
        """The pooled curve at log peak time ``x``, plus ``chip``'s offset when given and known."""
        fit = self._pool_fit(kind, pc, attention)
        if fit is None:
            return math.nan
        xs, ys, off = fit
        return _interp(list(xs), list(ys), x)[0] + (off.get(chip, 0.0) if chip else 0.0)

    def chips(self) -> set[str]:
        return {c for c, _ in self.by_chip}

    def donor(self, gpu_name: str, chip: str) -> str | None:
        """The GPU type whose measurements answer for ``gpu_name``: itself when it has any,
        else a type of the same chip that has (alphabetically first), else None."""
        if gpu_name in self.gpu_names:
            return gpu_name
        same = sorted(n for n in self.gpu_names if self.chip_of.get(n) == chip)
        return same[0] if same else None

    # -------------------------------------------------------------- answering

    def answer(self, q: LayerQuery, g: Any) -> tuple[float, float, str | None]:
        """``(r_time, r_mem, how)`` for ``q`` on GPU type ``g`` (resolved): log ratios to the
        roofline and to the analytic bytes (NaN: no anchor), and ``how`` (one of
        :data:`HOW`, or None when the chip has no measurement of this kind). A layer
        shape the chip ran, asked beyond its measured micro-batches or TPs (``extrapolated``),
        is never more efficient than the chip's measured saturation (:meth:`saturation`): the
        efficiency stops rising where the chip's did. A shape the chip never ran is not
        bounded so: larger layers than a chip ran do run more efficiently (on Cephalo's
        layers, hidden 5120-10240 predicted from <= 2560, benchmarks/accuracy.py dev, the
        bound took the error from 13.6 to 17.2 %, its largest from 62 to 240 %)."""
        rt, rm, how = self._answer(q, g)
        if how == "extrapolated" and q.kind == "layer" and not math.isnan(rt) and self.has_series(q, g):
            rt = self._saturate(rt, q, g, g.chip_id)
        return rt, rm, how

    def _saturate(self, rt: float, q: LayerQuery, g: Any, chip: str | None) -> float:
        """``rt`` (log ratio to the roofline) with the device work -- the time less the TP
        collectives, over the roofline of the compute and memory-bound parts -- no more
        efficient than ``chip``'s saturation (:meth:`saturation`); the collectives stay as
        they are (a link's efficiency is not a kernel's)."""
        sat = self.saturation(chip, q.kind, _PRECISION_CLASS[q.precision], q.attention)
        if not math.isfinite(sat):
            return rt
        c = roofline_components(q, g)
        w = c["compute_ms"] + c["memory_ms"]
        roof = w + c["comm_ms"]
        if w <= 0 or roof <= 0:
            return rt
        t = math.exp(rt) * roof
        if t - c["comm_ms"] >= math.exp(sat) * w:
            return rt
        return math.log((math.exp(sat) * w + c["comm_ms"]) / roof)

    #: The measured chip whose saturation bounds a chip never measured (:meth:`saturation`
    #: with ``chip`` None), as a quantile of the measured chips' best log ratios: 0, the most
    #: efficient measured chip's -- a bound on what no measured GPU reached, not an estimate.
    #: The median chip's (0.5) was measured on the dev splits and left out: ultrascale's H100
    #: top-1 2/8 against 1/8, but Megatron-Bridge's published H100/B200 runs 7.4 -> 12.7 %
    #: (benchmarks/public_runs.py), the leave-one-type-out mean 21.3 -> 23.8 % (P40 14.5 ->
    #: 27.8 %; benchmarks/accuracy.py) and vTrain's datasheet-only time 8.6 -> 9.0 %: chips
    #: saturate at different fractions of their datasheet, and the parts fit already carries
    #: each one's (its compute, memory-bound and fixed costs saturate by construction).
    PRIOR_SATURATION_QUANTILE = 0.0

    def saturation(self, chip: str | None, kind: str, pc: str, attention: str) -> float:
        """The smallest log ratio of the device work to its roofline (the highest achieved
        efficiency of the kernels, the TP collectives taken out: :func:`_work_ratio`) a layer
        reaches on ``chip``: the lowest of its device-bound measured points of this kind
        and precision class (of the query's attention kernel where the chip ran it) -- the
        measured saturation of the chip's GEMM and attention kernels, a bound an
        extrapolation never passes (GEMM throughput flattens once the tiles fill the SMs:
        NVIDIA's "Matrix Multiplication Background" guide, 2023, Fig. 2-4; Megatron-LM on
        A100 reaches 0.44-0.52 of peak at the largest sizes, Narayanan et al., SC'21, Table 1).
        ``chip`` None: the most efficient measured chip's (:attr:`PRIOR_SATURATION_QUANTILE`;
        a bound for a chip never measured: no GPU runs its kernels closer to its datasheet
        roofline than any measured one did).
        -inf (no bound) when nothing was measured."""
        key = ("saturation", chip, kind, pc, attention)
        cache = self.__dict__.setdefault("_curves", {})
        if key in cache:
            return cache[key]
        if chip is None:
            sats = [self.saturation(c, kind, pc, attention) for c in sorted({c for c, k in self.by_chip if k == kind})]
            sats = [x for x in sats if math.isfinite(x)]
            cache[key] = float(np.quantile(sats, self.PRIOR_SATURATION_QUANTILE)) if sats else -math.inf
            return cache[key]
        sers = [s for s in self.by_chip.get((chip, kind), ()) if _PRECISION_CLASS[s.cfg[0]] == pc]
        sers = [s for s in sers if s.cfg[1] == attention] or sers
        rs = [_work_ratio(r) for s in sers for r in device_bound([r for _, r in s.points() if not math.isnan(r[1])])]
        cache[key] = min(rs) if rs else -math.inf
        return cache[key]

    def _answer(self, q: LayerQuery, g: Any) -> tuple[float, float, str | None]:
        pool = self.by_chip.get((g.chip_id, q.kind))
        if not pool:
            return math.nan, math.nan, None
        pc = _PRECISION_CLASS[q.precision]
        cfg = _cfg(q)
        shape = _shape_key(q.shape, q.kind)
        # the same shape and attention kernel in the same precision class (fp16 and bf16 run
        # on the same units; the roofline of each carries any difference): this GPU type's
        # own series first, then another type of its chip; exact precision first
        same_shape = sorted((s for s in pool if s.skey == shape and _PRECISION_CLASS[s.cfg[0]] == pc
                             and s.cfg[1] == q.attention),
                            key=lambda s: (s.gpu != g.name, s.cfg[0] != q.precision))
        pool = [s for s in pool if s.gpu == g.name] or pool
        exact_cfg = [s for s in same_shape if s.cfg[2:] == cfg[2:] and s.gpu == same_shape[0].gpu]
        if exact_cfg or same_shape:
            ser = (exact_cfg or same_shape)[0]
            rt, rm, inside, exact = self._series(ser, q)
            if q.kind == "layer" and not (min(ser.by_tp) <= q.tp <= max(ser.by_tp)):
                # beyond the TPs this shape ran: 1/TP of the work at the efficiency this
                # series reaches for work of that size, plus the collectives
                lt = math.log(q.tp)
                near = min(ser.by_tp, key=lambda t: (abs(math.log(t) - lt), t))
                pts = [r for r in ser.by_tp[near] if not math.isnan(r[1])]
                if pts:
                    rt = self._tp_physical(pts, q, g, pc)[0]
                return rt, rm if exact_cfg else math.nan, "extrapolated"
            if not exact_cfg:
                # another recompute mode / sequence parallelism of the same shape: its
                # efficiency, the roofline carries the extra work; the memory is another
                # formula's, not this series'
                return rt, math.nan, "extrapolated"
            exact = exact and ser.cfg[0] == q.precision and ser.gpu == g.name
            return rt, rm, "measured" if exact else ("interpolated" if inside else "extrapolated")
        return self._work(pool, q, g, pc)

    def has_series(self, q: LayerQuery, g: Any) -> bool:
        """Whether ``q``'s shape (precision class, attention kernel) was measured on ``g``'s chip."""
        shape = _shape_key(q.shape, q.kind)
        pc = _PRECISION_CLASS[q.precision]
        return any(s.skey == shape and _PRECISION_CLASS[s.cfg[0]] == pc and s.cfg[1] == q.attention
                   for s in self.by_chip.get((g.chip_id, q.kind), ()))

    def memory(self, q: LayerQuery) -> float:
        """Log ratio of the activation bytes to the analytic formula from a series of the same
        kind, shape and configuration measured on *any* GPU (activation bytes are the
        model's, not the chip's: Sailor's llm_info.json bytes answer a GPU never profiled),
        interpolated along it; NaN when no such series measured memory."""
        for ser in self.by_shape.get((q.kind, _shape_key(q.shape, q.kind), _cfg(q)), ()):
            rm = self._series(ser, q)[1]
            if not math.isnan(rm):
                return rm
        return math.nan

    @staticmethod
    def _series(ser: _Series, q: LayerQuery) -> tuple[float, float, bool, bool]:
        b, t = float(q.micro_batch_size), q.tp
        tps = sorted(ser.by_tp)
        lb = math.log(b)

        def at(tp: int) -> tuple[float, float, bool, bool]:
            rows = ser.by_tp[tp]
            xs = [math.log(r[0]) for r in rows]
            yt, it = _interp(xs, [r[1] for r in rows], lb)
            ym, _ = _interp(xs, [r[2] for r in rows], lb)
            exact = any(r[0] == b for r in rows)
            return yt, ym, it, exact

        if t in ser.by_tp:
            yt, ym, inside, exact = at(t)
            return yt, ym, inside, exact
        below = [x for x in tps if x < t]
        above = [x for x in tps if x > t]
        if below and above:
            lo, hi = max(below), min(above)
            a, c = at(lo), at(hi)
            u = (math.log(t) - math.log(lo)) / (math.log(hi) - math.log(lo))

            def mix(x: float, y: float) -> float:
                if math.isnan(x):
                    return y
                if math.isnan(y):
                    return x
                return x + u * (y - x)

            return mix(a[0], c[0]), mix(a[1], c[1]), a[2] and c[2], False
        near = max(below) if below else min(above)
        yt, ym, _, _ = at(near)
        return yt, ym, False, False

    def _work(self, pool: list[_Series], q: LayerQuery, g: Any, pc: str) -> tuple[float, float, str | None]:
        """A shape this chip never ran (in this precision class). With the chip's own points
        of the query's attention kernel (the nearest measured TP): their efficiency curve
        over the log roofline (non-increasing, slope-guarded) inside their range --
        ``interpolated`` -- and beyond it the curve's end moved along the pooled curve of all
        chips (its trend with the size of the work; ``extrapolated``). Without them: the
        pooled curve plus the chip's offset (``extrapolated``)."""
        cand = [s for s in pool if _PRECISION_CLASS[s.cfg[0]] == pc]
        if not cand:
            return math.nan, math.nan, None
        chip = g.chip_id
        x = self._peak_time(q, g)
        own = [(tp, r) for s in cand if s.cfg[1] == q.attention for tp, r in s.points() if not math.isnan(r[1])]
        if own:
            lt = math.log(q.tp)
            near = min({tp for tp, _ in own}, key=lambda t: (abs(math.log(t) - lt), t))
            pts = [r for tp, r in own if tp == near]
            if near != q.tp:
                return self._tp_physical(pts, q, g, pc)
            # the efficiency is the device's: a point at its host floor only bounds it from above
            dev = device_bound(pts)
            bounds = [(r[4], r[1]) for r in pts if near_host_floor(r)] if len(dev) < len(pts) else []
            xs, ys = efficiency_curve(np.array([r[4] for r in dev]), np.array([r[1] for r in dev]))
            if xs[0] <= x <= xs[-1]:
                y = _below_bounds(_interp(list(xs), list(ys), x)[0], x, bounds)
                return max(y, 0.0), math.nan, "interpolated"
            edge, yedge = (xs[0], ys[0]) if x < xs[0] else (xs[-1], ys[-1])
            trend = self._pool(q.kind, pc, q.attention, x) - self._pool(q.kind, pc, q.attention, edge)
            y = _below_bounds(yedge + (0.0 if math.isnan(trend) else trend), x, bounds)
            return max(y, 0.0), math.nan, "extrapolated"
        fit = self._pool_fit(q.kind, pc, q.attention)
        if fit is not None and chip in fit[2]:
            y = self._pool(q.kind, pc, q.attention, x, chip)
        else:
            # the chip ran only another attention kernel: its offset there, on this kernel's curve
            other = self._pool_fit(q.kind, pc, cand[0].cfg[1])
            shift = other[2].get(chip, 0.0) if other is not None else 0.0
            y = self._pool(q.kind, pc, q.attention, x) + shift
        if math.isnan(y):
            return math.nan, math.nan, None
        return max(y, 0.0), math.nan, "extrapolated"


    def _tp_physical(self, pts: list[list[float]], q: LayerQuery, g: Any, pc: str) -> tuple[float, float, str]:
        """A TP this chip never ran the query's kernel at: one rank does ``1/tp`` of the
        layer's work (the roofline's compute and memory-bound parts per rank) at the
        efficiency the chip reaches for work of *that* size, plus the layer's TP
        collectives (two all-reduces of ``s*b*h`` forward, two backward, ring over the
        GPU's link figure: the roofline's ``comm_ms``). The efficiency is the chip's own
        curve over the log per-rank work time (non-increasing, slope-guarded) from its
        points at the nearest measured TP, each with its own collectives taken out first;
        below or above their range the curve's end follows the pooled curve's trend. So a
        smaller per-rank share runs less efficiently, the time is monotone in the work,
        never below the roofline, and more TP is slower only where the collectives outweigh
        the work they split."""
        def own(rows: list) -> tuple[np.ndarray, np.ndarray]:
            # log per-rank work and log ratio of the measured time less its collectives to it
            work = np.array([r[5] + r[6] for r in rows])
            meas = np.exp(np.array([r[1] + r[4] for r in rows]))
            return np.log(work), np.log(np.maximum(meas - np.array([r[7] for r in rows]), work) / work)

        # the device's efficiency from the device-bound points; those at their host floor
        # only bound it from above (_below_bounds)
        dev = device_bound(pts)
        bounds = list(zip(*own([r for r in pts if near_host_floor(r)]))) if len(dev) < len(pts) else []
        xs, ys = efficiency_curve(*own(dev))
        c = roofline_components(q, g)
        w = c["compute_ms"] + c["memory_ms"]
        roof = w + c["comm_ms"]
        xw = math.log(max(w, 1e-12))
        if xs[0] <= xw <= xs[-1]:
            y = _interp(list(xs), list(ys), xw)[0]
        else:
            edge, yedge = (xs[0], ys[0]) if xw < xs[0] else (xs[-1], ys[-1])
            trend = self._pool(q.kind, pc, q.attention, xw) - self._pool(q.kind, pc, q.attention, edge)
            y = yedge + (0.0 if math.isnan(trend) else trend)
        y = _below_bounds(y, xw, bounds)
        t = math.exp(max(y, 0.0)) * w + c["comm_ms"]
        return max(math.log(t / roof), 0.0), math.nan, "extrapolated"


#: A layer measured within this factor of its host-dispatch floor may be host-bound (its
#: time then says only that the device took no longer): Megatron's eager layers on A100
#: run at 3.3-3.6 ms per micro-batch against the 3.2-3.3 ms the prior cost per operator
#: gives (memx_hpc.model.host), and the host's launch queue hides the device only where
#: the device work clearly exceeds the dispatch.
HOST_BOUND_MARGIN = 1.5


def near_host_floor(r: Sequence[float]) -> bool:
    """Whether a bound point (a row of :meth:`Anchors._row_entry`) took less than
    :data:`HOST_BOUND_MARGIN` times its host floor: its device time is then known only to be
    at most the measurement."""
    return len(r) > 9 and r[9] > 0 and not math.isnan(r[1]) and math.exp(r[1] + r[4]) < HOST_BOUND_MARGIN * r[9]


def device_bound(rows: list) -> list:
    """The rows of ``rows`` whose measured time is the device's (:func:`near_host_floor` is
    false): what a device efficiency is learned from. All of them when none is (a chip
    measured only at its floor keeps what it has: an upper bound of its device times)."""
    keep = [r for r in rows if not near_host_floor(r)]
    return keep or list(rows)


def _work_ratio(r: Sequence[float]) -> float:
    """A bound point's (a row of :meth:`Anchors._row_entry`) log ratio of its measured time
    less its TP collectives to the roofline of its compute and memory-bound parts: the
    efficiency of its kernels, the links' taken out (at least the roofline: 0)."""
    work = r[5] + r[6]
    if work <= 0:
        return r[1]
    return math.log(max(math.exp(r[1] + r[4]) - r[7], work) / work)


def _below_bounds(y: float, x: float, bounds: Sequence[tuple[float, float]]) -> float:
    """``y`` (log ratio at log work ``x``) no higher than the upper bounds ``(x_p, r_p)``
    allow: a point at its host floor says the device took at most its time, so at most that
    time for any smaller work (time is monotone in the work) and at most its ratio for any
    larger work (the efficiency curves never fall with the work):
    ``y <= r_p + max(0, x_p - x)``."""
    for xp, rp in bounds:
        y = min(y, rp + max(0.0, xp - x))
    return y


def _flops_per_watt(q: LayerQuery, g: Any) -> float:
    """Peak TFLOP/s (in ``q``'s precision) per W of board (or module) power; NaN when the
    power is not known. :meth:`Anchors.datasheet` bounds a module's."""
    tdp = float(getattr(g, "tdp_w", 0.0) or 0.0)
    return g.peak_tflops(q.precision) / tdp if tdp > 0 else math.nan


def _parts_row(compute_ms: float, memory_ms: float, comm_ms: float, fpw: float, eager: bool) -> np.ndarray:
    """The regressors of :meth:`Anchors._parts_fit` for one point: the memory-bound kernels'
    time in the column of whose kernels ran them (:data:`memx_hpc.model.api.KERNELS`)."""
    return np.array([compute_ms, compute_ms * fpw, 0.0 if eager else memory_ms, memory_ms if eager else 0.0,
                     comm_ms, 1.0])


class _FlopsOnlyGpu:
    """Stand-in GPU for counting FLOPs (roofline_components needs figures; FLOPs do not)."""
    name = "flops"
    vendor = "nvidia"
    link_gbps = 1.0
    hbm_gbps = 1.0

    @staticmethod
    def peak_tflops(precision: str) -> float:
        return 1.0


_GPU_FOR_FLOPS: Any = _FlopsOnlyGpu()
