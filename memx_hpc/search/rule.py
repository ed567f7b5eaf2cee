"""The rule of thumb the recommendation is scored against (and falls back to).

"Largest data-parallel width that fits, then the smallest tensor-parallel degree, then the
largest micro-batch": what practitioners pick without a cost model (TP and pipeline stages
only as far as memory needs them; a larger micro-batch runs the GPU more efficiently).
``benchmarks/ranking.py`` scores it beside the predictor on public multi-plan sets, and
:mod:`memx_hpc.planner` recommends its plan on a kind of site where the predictor's dev
top-1 there was below the rule's (``memx_hpc/data/ranking.yaml``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Mapping, Sequence

from ..model.api import Basis

if TYPE_CHECKING:
    from ..spec import Site

__all__ = ["rule_key", "rule_pick", "rule_row", "ranking_table", "site_kind"]

_DATASHEET = Basis(kind="datasheet-only")


def rule_key(dp: int, tp: int, micro_batch_size: int) -> tuple[int, int, int]:
    """The rule's preference as a key to maximise: larger DP, then smaller TP, then larger micro-batch."""
    return (int(dp), -int(tp), int(micro_batch_size))


def rule_pick(plans: Sequence) -> int | None:
    """Position of the rule's plan among ``plans`` (objects with ``dp``, ``tp`` and
    ``micro_batch_size``: Plans); ties go to the earlier plan. None for no plans."""
    if not len(plans):
        return None
    return max(range(len(plans)), key=lambda i: (rule_key(plans[i].dp, plans[i].tp, plans[i].micro_batch_size), -i))


def site_kind(site: Site, bases: Mapping[str, Basis]) -> tuple[str, str] | None:
    """``(nodes, chip in store)`` of ``site`` as ``memx_hpc/data/ranking.yaml`` names its
    rows: ``single-node`` or ``multi-node``; ``profiled`` when a GPU type of the site has
    samples (of its own or of its chip), ``datasheet-only`` when none has. ``bases``: per GPU
    type what the cost model's numbers rest on (an assembled cost model's ``bases``; a type
    missing from it has datasheet figures only). None for a site with a GPU type of another
    vendor than NVIDIA (no public multi-plan set covers it)."""
    if not site.partitions or any(site.gpu(p.gpu_type).vendor != "nvidia" for p in site.partitions):
        return None
    nodes = "multi-node" if sum(p.nodes for p in site.partitions) > 1 else "single-node"
    only_datasheet = all(bases.get(p.gpu_type, _DATASHEET).kind == "datasheet-only" for p in site.partitions)
    return nodes, "datasheet-only" if only_datasheet else "profiled"


@functools.lru_cache(maxsize=1)
def ranking_table() -> dict:
    """``memx_hpc/data/ranking.yaml``: per site kind, the predictor's and the rule's dev top-1."""
    from importlib import resources

    import yaml
    return yaml.safe_load(resources.files("memx_hpc.data").joinpath("ranking.yaml").read_text()) or {}


def rule_row(site: Site, bases: Mapping[str, Basis]) -> dict | None:
    """The row of :func:`ranking_table` for ``site``'s kind (``bases`` as :func:`site_kind`
    takes them) where the rule picked the measured fastest plan more often than the
    predictor; None where it did not (or no row covers the site)."""
    kind = site_kind(site, bases)
    if kind is None:
        return None
    row = (ranking_table().get(kind[0]) or {}).get(kind[1])
    if not row or float(row["predictor_top1"]) >= float(row["rule_top1"]):
        return None
    return {**row, "nodes": kind[0], "chip": kind[1]}
