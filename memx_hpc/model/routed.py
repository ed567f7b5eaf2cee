"""A cost model that answers each GPU type from its own model (the planner's routing)."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from .api import LayerQuery

__all__ = ["RoutedCostModel"]


class RoutedCostModel:
    """Each GPU type answered by its own cost model; the others by ``default``.

    The planner fits its predictor on the GPU types the store has data for and answers
    the rest from datasheet figures (:class:`~memx_hpc.model.api.AnalyticCostModel`).
    The identity covers every route, so a change to any of them invalidates the cache.
    """

    def __init__(self, routes: Mapping[str, object], default) -> None:
        self.routes = dict(routes)
        self.default = default
        import hashlib
        import json
        self.identity = hashlib.sha256(json.dumps(
            {"routes": {g: m.identity for g, m in sorted(self.routes.items())}, "default": default.identity},
            sort_keys=True).encode()).hexdigest()

    def model_for(self, gpu_type: str):
        return self.routes.get(gpu_type, self.default)

    def predict(self, queries: Sequence[LayerQuery]) -> np.ndarray:
        out = np.zeros((len(queries), 2), dtype=np.float64)
        groups: dict[int, list[int]] = {}
        models: dict[int, object] = {}
        for i, q in enumerate(queries):
            m = self.model_for(q.gpu_type)
            groups.setdefault(id(m), []).append(i)
            models[id(m)] = m
        for key, rows in groups.items():
            out[rows] = np.asarray(models[key].predict([queries[i] for i in rows]), dtype=np.float64)
        return out

    def overhead_bytes(self, gpu_type: str) -> int:
        return int(self.model_for(gpu_type).overhead_bytes(gpu_type))

    def basis(self, gpu_type: str):
        return self.model_for(gpu_type).basis(gpu_type)

    def provenance(self, gpu_type: str) -> str:
        return self.model_for(gpu_type).provenance(gpu_type)
