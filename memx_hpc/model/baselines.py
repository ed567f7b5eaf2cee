"""Baselines the predictor is measured against (``benchmarks/accuracy.py``).

* :class:`NearestPointScaling` — what Metis-style planners do: take the nearest profiled
  point and scale it to the query by the ratio of an analytic cost (per-layer time scaled
  with the micro-batch / FLOPs; a GPU type without profiles scaled by datasheet peaks).
* Pure roofline time and the analytic memory formula — both are
  :class:`memx_hpc.model.api.AnalyticCostModel` (efficiency 1, Korthikanti et al. bytes).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Sequence

import numpy as np

from ..errors import SpecError
from ..spec import LayerSample
from .api import AnalyticCostModel, LayerQuery, analytic_activation_bytes, resolve_gpu, roofline_ms
from .features import query_of

__all__ = ["NearestPointScaling", "AnalyticCostModel"]


class NearestPointScaling:
    """Scale the nearest profiled sample to the query by the analytic ratio.

    Nearest, in this order of preference: same GPU type and configuration (kind, shape,
    precision, attention, recompute, TP) at another micro-batch; same GPU type and kind,
    any configuration; the same configuration on another GPU type; anything of the same
    kind. Among candidates, the one closest in log FLOPs-per-GPU wins. Time scales by
    ``roofline(query) / roofline(sample)`` (micro-batch, shape and GPU all enter through
    the roofline); memory by the analytic activation bytes. Not fitted: it memorises.
    """

    def fit(self, samples: Sequence[LayerSample], site_or_catalog: Any) -> "NearestPointScaling":
        self.gpus = site_or_catalog
        self.samples_ = [s for s in samples if s.point.kind in ("layer", "embedding", "head") and not s.infeasible
                         and s.forward_ms + s.backward_ms > 0]
        if not self.samples_:
            raise SpecError("no usable samples for the nearest-point baseline")
        self.index_: dict[tuple, list[int]] = defaultdict(list)
        self.roof_ = np.empty(len(self.samples_))
        for i, s in enumerate(self.samples_):
            q = query_of(s)
            self.roof_[i] = roofline_ms(q, resolve_gpu(site_or_catalog, q.gpu_type))
            for key in self._keys(q, resolve_gpu(site_or_catalog, q.gpu_type).name):
                self.index_[key].append(i)
        self.identity = "nearest-point-scaling"
        return self

    @staticmethod
    def _keys(q: LayerQuery, gpu: str) -> list[tuple]:
        cfg = (q.kind, q.shape, q.precision, q.attention, q.recompute, q.tp)
        return [("gpu+cfg", gpu) + cfg, ("gpu+kind", gpu, q.kind), ("cfg",) + cfg, ("kind", q.kind)]

    def predict(self, queries: Sequence[LayerQuery]) -> np.ndarray:
        out = np.empty((len(queries), 2), dtype=np.float64)
        for r, q in enumerate(queries):
            g = resolve_gpu(self.gpus, q.gpu_type)
            roof_q = roofline_ms(q, g)
            cand: list[int] = []
            for key in self._keys(q, g.name):
                cand = self.index_.get(key, [])
                if cand:
                    break
            i = min(cand, key=lambda j: abs(math.log(self.roof_[j] / roof_q)))
            s = self.samples_[i]
            out[r, 0] = (s.forward_ms + s.backward_ms) * roof_q / self.roof_[i]
            a_q = analytic_activation_bytes(q)
            if s.activation_bytes > 0:
                out[r, 1] = s.activation_bytes * a_q / max(analytic_activation_bytes(query_of(s)), 1)
            else:
                out[r, 1] = a_q
        return out
