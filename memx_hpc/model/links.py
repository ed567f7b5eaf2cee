"""Communication costs as curves: message size -> time, per link of a site.

A plan moves three kinds of messages: activations between pipeline stages (p2p), the
data-parallel gradient synchronisation (all-reduce, or reduce-scatter + all-gather),
and small collectives (tied embeddings). What one such message costs depends on its
size far from linearly: small messages pay latency, large ones a bandwidth that
saturates only at tens of MiB, and several GPUs of a node sending at once share (or
not) its network adapters. A single "GB/s" figure per link cannot say that, so each
link is a :class:`CommCurve`, chosen in this order (:class:`LinkModel`):

1. ``measured``: the curve the profiler measured on this site (:mod:`memx_hpc.profile.comm`:
   p2p and all-reduce over a sweep of message sizes inside a node, between two nodes of
   a partition, and between every pair of partitions), stored in the profile store;
2. ``imported``: Sailor's published curves for the GPU type (``intra`` / ``inter``
   node; :func:`import_sailor_network`);
   Between partitions nothing was published: when both partitions' GPU types have
   imported inter-node curves, the slower of the two stands for the pair;
3. ``site-figure``: the site file's bandwidth (``intra_node_gbps``, ``inter_node_gbps``,
   ``links``, ``inter_partition_gbps``) as latency + bytes / bandwidth. The fallback, and
   labelled so in every provenance.

Sailor's curves (Strati et al., "Sailor: Automating Distributed Training over Dynamic,
Heterogeneous, and Geo-distributed Clusters", SOSP 2025; code eth-easl/sailor,
MIT licence). Their profiler times NCCL send/recv between GPUs for a sweep of message
sizes and fits the achieved bandwidth in GB/s as a degree-2 polynomial of
``log2(bytes / 1e6)`` (``sailor/profiling/networking/fit_func.py``: ``np.polyfit(log2(MB),
GB/s, 2)``); the second number of each entry is the largest bandwidth measured, in
bytes/s. Their simulator evaluates a message of ``x`` bytes as
``time_s = (x / 1e9) / polyval(coeffs, log2(x / 1e6))``
(``sailor/providers/gcp/model_networking.py``, ``get_time_on_config``) and a ring
all-reduce over ``n`` workers as ``2 (n - 1) · time(x / n)``
(``sailor/profiling/profile_utils.py``, ``estimate_ar_time``). The key under each GPU
type is the number of GPUs of a node taking part at once: ``inter`` (between nodes) "k"
means k GPUs of each node send to k peers together (the simulator passes
``min(tp, gpus_per_node)`` for pipeline sends and 1 for the data-parallel
synchronisation), and the curve is of the whole message they share; ``intra`` "k" means
k GPUs of one node sending pairwise (k / 2 pairs at once). Outside the sizes a quadratic
was fitted on it bends down (or below zero); here it is held physical: at or above
1 MB the bandwidth is the polynomial's up to its vertex and never above the largest
measured bandwidth; below 1 MB the time is the latency + bandwidth line through the
curve's times at 1 and 2 MB.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..profile.comm import import_sailor_network, read_comm_curves
from ..records import COMM_KINDS, COMM_SCOPES, CURVE_PROVENANCES, SITE_LATENCY_US, CommCurve

__all__ = ["COMM_KINDS", "COMM_SCOPES", "CURVE_PROVENANCES", "CommCurve", "LinkModel", "LinkCost",
           "import_sailor_network", "load_links", "ring_allreduce_ms", "SITE_LATENCY_US"]

def ring_allreduce_ms(p2p_ms, nbytes: float, n: int) -> float:
    """Ring all-reduce of ``nbytes`` over ``n`` ranks from a p2p time function:
    ``2 (n - 1)`` steps, each moving ``nbytes / n`` (Patarasuk & Yuan 2009; Sailor's
    ``estimate_ar_time``)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (n - 1) * p2p_ms(nbytes / n)


# --------------------------------------------------------------------------- the site's links


@dataclass(frozen=True, kw_only=True)
class LinkCost:
    """A communication's time and the curve it was read from."""

    ms: float
    source: str  # CommCurve.label() of the curve used
    provenance: str  # measured | imported | site-figure


@dataclass
class LinkModel:
    """Every link of a site as a curve; the composition asks it for each p2p and collective.

    ``curves``: measured curves (from the store) and imported ones (Sailor's), in any
    order; the lookup prefers measured over imported over the site's figures.
    """

    site: Any
    curves: Sequence[CommCurve] = ()
    _index: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.curves = tuple(self.curves)
        for c in self.curves:
            key = (c.kind, c.scope, tuple(sorted(c.partitions)) if c.partitions else None,
                   None if c.partitions else c.gpu_types, c.provenance)
            self._index.setdefault(key, []).append(c)
        self.identity = hashlib.sha256(json.dumps(
            {"curves": [c.to_dict() for c in self.curves], "site": _site_links(self.site)},
            sort_keys=True, default=str).encode()).hexdigest()

    # ------------------------------------------------------------------ look-up

    def _gpu(self, partition: str) -> str:
        return self.site.gpu(self.site.partition(partition).gpu_type).name

    def _find(self, kind: str, scope: str, parts: tuple[str, ...]) -> list[CommCurve]:
        """Curves for this link: measured on these partitions, else imported for their GPU type."""
        key_parts = tuple(sorted(parts))
        found = self._index.get((kind, scope, key_parts, None, "measured"))
        if found:
            return found
        if scope != "cross":
            gpus = (self._gpu(parts[0]),)
            found = self._index.get((kind, scope, None, gpus, "imported"))
            if found:
                return found
            return []
        # between partitions nothing was published; when both GPU types have imported
        # inter-node curves, the pair's network is taken to be the slower of the two (a
        # message crosses both nodes' adapters)
        both = [self._index.get((kind, "inter", None, (self._gpu(p),), "imported")) for p in parts]
        if all(both):
            return min(both, key=lambda cs: min(c.bandwidth_gbps(64 * 2**20) for c in cs))
        return []

    def _site_curve(self, scope: str, parts: tuple[str, ...]) -> CommCurve:
        if scope == "intra":
            gbps, what = self.site.intra_gbps(parts[0]), f"partition {parts[0]} intra_node_gbps"
        elif scope == "inter":
            gbps, what = self.site.link_gbps(parts[0], parts[0]), f"partition {parts[0]} inter_node_gbps"
        else:
            gbps, what = self.site.link_gbps(parts[0], parts[1]), f"link {parts[0]}-{parts[1]}"
        return CommCurve(kind="p2p", scope=scope, gpu_types=(), partitions=tuple(parts), provenance="site-figure",
                         source=f"site {what} {gbps:g} GB/s", form="alpha-beta", latency_us=SITE_LATENCY_US[scope],
                         gbps=gbps)

    @staticmethod
    def _scope(a: str, b: str, same_node: bool) -> tuple[str, tuple[str, ...]]:
        if a != b:
            return "cross", (a, b)
        return ("intra" if same_node else "inter"), (a,)

    @staticmethod
    def _with_streams(curves: list[CommCurve], nbytes: float, streams: int) -> tuple[float, CommCurve]:
        """``streams`` GPUs of a node each moving ``nbytes / streams`` at once: the curve
        measured with that many streams (it is of the whole message), else the one-stream
        curve at the per-GPU share (each GPU its own path), else the nearest below."""
        by = {c.streams: c for c in curves}
        if streams in by:
            c = by[streams]
            return c.time_ms(nbytes), c
        below = [k for k in by if k <= streams]
        k = max(below) if below else min(by)
        c = by[k]
        return c.time_ms(nbytes * k / streams), c

    def p2p(self, nbytes: float, a: str, b: str, *, same_node: bool = False, streams: int = 1) -> LinkCost:
        """One message of ``nbytes`` (split over ``streams`` GPUs of the node) from a GPU of
        partition ``a`` to one of ``b``."""
        if nbytes <= 0:
            return LinkCost(ms=0.0, source="", provenance="measured")
        scope, parts = self._scope(a, b, same_node)
        curves = self._find("p2p", scope, parts)
        if not curves:
            curves = [self._site_curve(scope, parts)]
        ms, c = self._with_streams(curves, nbytes, max(1, streams))
        return LinkCost(ms=ms, source=c.label(), provenance=c.provenance)

    def allreduce(self, nbytes: float, n: int, partitions: Sequence[str], *, one_node: bool = False,
                  streams: int = 1) -> LinkCost:
        """A ring all-reduce of ``nbytes`` per rank over ``n`` ranks on ``partitions`` (the
        slowest link among them carries the ring). A measured all-reduce curve of that
        group is used as is (converted by bus bandwidth when its group size differs: NCCL
        tests' ``busbw = 2 (n-1)/n · bytes / time``); otherwise the ring is built from the
        link's p2p curve. ``streams`` rings run at once per node (the TP ranks of a stage
        each synchronise their own shard)."""
        if n <= 1 or nbytes <= 0:
            return LinkCost(ms=0.0, source="", provenance="measured")
        parts = sorted(set(partitions))
        worst: LinkCost | None = None
        pairs = [(x, y) for i, x in enumerate(parts) for y in parts[i:]]
        for a, b in pairs:
            same = one_node and a == b
            scope, key = self._scope(a, b, same)
            ar = [c for c in self._index.get(("allreduce", scope, tuple(sorted(key)), None, "measured"), [])]
            if ar:
                c = min(ar, key=lambda c: abs(c.group_size - n))
                n0 = c.group_size
                t0 = c.time_ms(nbytes)
                ms = t0 * (2 * (n - 1) / n) / (2 * (n0 - 1) / n0)
                cost = LinkCost(ms=ms, source=c.label() + f" (bus bandwidth, group {n0} -> {n})",
                                provenance="measured")
            else:
                curves = self._find("p2p", scope, key) or [self._site_curve(scope, key)]
                chosen: list[CommCurve] = []

                def one(x: float) -> float:
                    t, c = self._with_streams(curves, x * max(1, streams), max(1, streams))
                    chosen.append(c)
                    return t

                ms = ring_allreduce_ms(one, nbytes, n)
                c = chosen[0] if chosen else curves[0]
                cost = LinkCost(ms=ms, source=c.label() + f" (ring of {n})", provenance=c.provenance)
            if worst is None or cost.ms > worst.ms:
                worst = cost
        assert worst is not None
        return worst

    def describe(self) -> list[dict[str, str]]:
        """Which curve every link of the site uses (for reports and ``status``)."""
        rows = []
        names = [p.name for p in self.site.partitions]
        for i, a in enumerate(names):
            for b in names[i:]:
                for scope in (("intra", "inter") if a == b else ("cross",)):
                    key = (a,) if a == b else (a, b)
                    curves = self._find("p2p", scope, key)
                    c = curves[0] if curves else self._site_curve(scope, key)
                    rows.append({"link": f"{a}" if a == b else f"{a} <-> {b}", "scope": scope,
                                 "provenance": c.provenance, "source": c.source,
                                 "gbps_at_64MiB": f"{c.bandwidth_gbps(64 * 2**20):.2f}"})
        return rows


def _site_links(site: Any) -> Any:
    try:
        return {"parts": [(p.name, p.gpu_type, p.intra_node_gbps, p.inter_node_gbps) for p in site.partitions],
                "links": [(lk.a, lk.b, lk.gbps) for lk in getattr(site, "links", ())],
                "inter": getattr(site, "inter_partition_gbps", None)}
    except AttributeError:
        return None


def load_links(site: Any, store_path: str | Path | None) -> LinkModel:
    """The site's links: the store's curves (measured and imported), the site's figures for the rest."""
    curves = read_comm_curves(store_path) if store_path else []
    return LinkModel(site, curves)
