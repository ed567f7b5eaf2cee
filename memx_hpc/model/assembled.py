"""What the cost model answers, as one typed object (:class:`AssembledCostModel`).

:func:`memx_hpc.model.assemble.assemble_cost_model` builds it from the store and the site:
the layer model (each GPU type routed to the predictor or to the datasheet roofline,
calibrated by the site's end-to-end runs), the site's links with their provenance, the
report of the store's disagreeing sources, and per GPU type where its numbers come from.
Every part is set when it is built; nothing is attached afterwards. The object answers
layer queries itself (it is a :class:`~memx_hpc.model.api.CostModel`), so the search and
the composition take it where they take any cost model; the composition reads its
``links`` (:func:`memx_hpc.model.compose.link_model_for`).

This module is kept light (no NumPy-heavy imports of its own) because the composition
imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

if TYPE_CHECKING:
    import numpy as np

    from .api import Basis, CostModel, LayerQuery
    from .links import LinkModel
    from .sources import SourceReport

__all__ = ["AssembledCostModel"]


@dataclass(frozen=True, kw_only=True)
class AssembledCostModel:
    """The cost model the planner searches with, and everything reports say about it.

    ``layers``: what answers layer queries (a
    :class:`~memx_hpc.model.routed.RoutedCostModel`, an
    :class:`~memx_hpc.model.api.AnalyticCostModel`, or a
    :class:`~memx_hpc.model.calibrate.CalibratedCostModel` around one of them). ``base``:
    ``layers`` without its calibration (``layers`` itself when it is not calibrated).
    ``links``: the site's links (measured and imported curves from the store, the site's
    figures for the rest). ``sources``: how the store's disagreeing sources were settled
    (None when no predictor was fitted). ``bases``: per GPU type of the site, what its
    numbers are built from (:class:`~memx_hpc.model.api.Basis`; ``kind`` ``datasheet-only``
    where nothing was measured). ``memory_scale``: ``gpu_type -> a`` of the device-memory
    model (the calibration's, else the vendor's prior). ``notes``: what assembling it found,
    in words.
    """

    layers: "CostModel"
    base: "CostModel"
    links: "LinkModel"
    sources: "SourceReport | None"
    bases: Mapping[str, "Basis"]
    memory_scale: Callable[[str], float]
    notes: tuple[str, ...] = ()

    # ------------------------------------------------------------------ the CostModel protocol

    @property
    def identity(self) -> str:
        """The layer model's identity (what the signature cache is keyed by)."""
        return self.layers.identity

    def predict(self, queries: Sequence["LayerQuery"]) -> "np.ndarray":
        return self.layers.predict(queries)

    def overhead_bytes(self, gpu_type: str) -> int:
        return int(self.layers.overhead_bytes(gpu_type))

    def basis(self, gpu_type: str) -> "Basis":
        return self.layers.basis(gpu_type)

    def provenance(self, gpu_type: str) -> str:
        return self.layers.provenance(gpu_type)

    # ------------------------------------------------------------------ what reports read

    @property
    def provenance_by_type(self) -> dict[str, str]:
        """Per GPU type of the site: where its numbers come from, as reports write it."""
        return {g: b.label() for g, b in self.bases.items()}

    @property
    def calibrated(self) -> bool:
        return self.layers is not self.base
