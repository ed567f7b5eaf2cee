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
   a partition, and between every pair of partitions; the link campaign,
   :mod:`memx_hpc.profile.link_campaign`), stored in the profile store;
2. ``imported``: another cluster's published curves (Sailor's, per GPU type, ``intra`` /
   ``inter`` node; :func:`import_sailor_network`) -- only for a partition whose site entry
   says its nodes are that cluster's (``link_curves_from: sailor``). Another cluster's
   fabric is not this site's: without that field they are never used, and the planner
   says so (:func:`link_notes`). Between partitions nothing was published: when both
   partitions say so, the slower of their two inter-node curves stands for the pair;
3. ``site-figure``: the bandwidth the site file states (``intra_node_gbytes_per_s``,
   ``inter_node_gbytes_per_s``, ``links``, ``inter_partition_gbytes_per_s``) as latency +
   bytes / bandwidth;
4. ``generic``: where the site file states none, a labelled figure for the fabric: inside
   a node the GPU type's datasheet link (NVLink / Infinity Fabric / PCIe, the catalog's
   ``link_gbytes_per_s``), between nodes one HDR InfiniBand adapter
   (:data:`memx_hpc.spec.GENERIC_INTER_NODE_GBPS`).

Every LinkCost and every :meth:`LinkModel.describe` row names the provenance and the
source of the figure it used.

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

from ..errors import SpecError
from ..profile.comm import import_sailor_network, read_comm_curves
from ..records import COMM_KINDS, COMM_SCOPES, CURVE_PROVENANCES, SITE_LATENCY_US, CommCurve

__all__ = ["COMM_KINDS", "COMM_SCOPES", "CURVE_PROVENANCES", "CommCurve", "LinkModel", "LinkCost",
           "curve_cluster", "import_sailor_network", "link_notes", "load_links", "ring_allreduce_ms",
           "SITE_LATENCY_US"]


def curve_cluster(c: CommCurve) -> str:
    """The cluster an imported curve was measured on, as a site's ``link_curves_from``
    names it: the first word of its source, lower case (``Sailor (ETH Zurich), ...`` ->
    ``sailor``); empty for a curve that is not imported."""
    if c.provenance != "imported" or not c.source.strip():
        return ""
    return c.source.split()[0].strip(",:;").lower()

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
    provenance: str  # measured | imported | site-figure | generic


@dataclass
class LinkModel:
    """Every link of a site as a curve; the composition asks it for each p2p and collective.

    ``curves``: measured curves (from the store) and imported ones (Sailor's), in any
    order; the lookup prefers measured, then imported ones of the cluster a partition says
    it is (``link_curves_from``), then the site file's figures, then the generic ones.
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

    def _claimed(self, partition: str) -> str | None:
        return self.site.partition(partition).link_curves_from

    def _imported(self, kind: str, scope: str, partition: str) -> list[CommCurve]:
        """Imported curves for ``partition``'s GPU type from the cluster it says it is; none
        when it says none."""
        cluster = self._claimed(partition)
        if not cluster:
            return []
        return [c for c in self._index.get((kind, scope, None, (self._gpu(partition),), "imported"), ())
                if curve_cluster(c) == cluster]

    def _find(self, kind: str, scope: str, parts: tuple[str, ...]) -> list[CommCurve]:
        """Curves for this link: measured on these partitions, else imported ones of the
        cluster the partitions say they are; empty: the site's (or generic) figure."""
        key_parts = tuple(sorted(parts))
        found = self._index.get((kind, scope, key_parts, None, "measured"))
        if found:
            return found
        if scope != "cross":
            return self._imported(kind, scope, parts[0])
        # between partitions nothing was published; when both partitions are the cluster
        # whose inter-node curves were imported, the pair's network is taken to be the slower
        # of the two (a message crosses both nodes' adapters)
        both = [self._imported(kind, "inter", p) for p in parts]
        if all(both) and len({self._claimed(p) for p in parts}) == 1:
            return min(both, key=lambda cs: min(c.bandwidth_gbps(64 * 2**20) for c in cs))
        return []

    def _site_curve(self, scope: str, parts: tuple[str, ...]) -> CommCurve:
        if scope == "intra":
            gbps, prov, what = self.site.intra_figure(parts[0])
        else:
            gbps, prov, what = self.site.link_figure(parts[0], parts[-1])
        return CommCurve(kind="p2p", scope=scope, gpu_types=(), partitions=tuple(parts), provenance=prov,
                         source=f"{what} {gbps:g} GB/s", form="alpha-beta", latency_us=SITE_LATENCY_US[scope],
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

    def curve_backed(self, scope: str, parts: tuple[str, ...]) -> bool:
        """Whether a link (``intra`` / ``inter`` of one partition, ``cross`` of two) has a measured
        or imported curve (p2p, or a measured all-reduce), not only the site's figure."""
        if self._find("p2p", scope, parts):
            return True
        return bool(self._index.get(("allreduce", scope, tuple(sorted(parts)), None, "measured")))

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
        return {"parts": [(p.name, p.gpu_type, p.intra_node_gbps, p.inter_node_gbps,
                           getattr(p, "link_curves_from", None), getattr(p, "fabric", ""),
                           getattr(p, "nics_per_node", None), getattr(p, "nvlink_domain_gpus", None))
                          for p in site.partitions],
                "links": [(lk.a, lk.b, lk.gbps) for lk in getattr(site, "links", ())],
                "inter": getattr(site, "inter_partition_gbps", None)}
    except AttributeError:
        return None


def load_links(site: Any, store_path: str | Path | None) -> LinkModel:
    """The site's links: the store's curves (measured and imported), the site's figures
    (then generic ones) for the rest. A partition that names a cluster in
    ``link_curves_from`` whose curves the store does not hold for its GPU type is refused
    (SpecError naming the field) when there is a store to hold them."""
    curves = read_comm_curves(store_path) if store_path else []
    model = LinkModel(site, curves)
    if store_path:
        for i, p in enumerate(site.partitions):
            cluster = getattr(p, "link_curves_from", None)
            if not cluster:
                continue
            gpu = model._gpu(p.name)
            have = {g for c in curves if curve_cluster(c) == cluster for g in c.gpu_types}
            if gpu not in have:
                raise SpecError(f"the profile store {store_path} holds no network curves of cluster {cluster!r} "
                                f"for {gpu}", field=f"partitions[{i}].link_curves_from", found=cluster,
                                allowed=("GPU types " + ", ".join(sorted(have))) if have else
                                "nothing (memx-hpc profile import --format sailor adds Sailor's curves)")
    return model


def link_notes(model: LinkModel, partitions: Sequence[str] | None = None) -> list[str]:
    """What the links of ``partitions`` (default: all the site's) rest on, for ``plan`` and
    ``predict`` notes: one line per provenance other than measured, naming the links and
    figures; and a line for each GPU type whose imported curves are in the store but not
    used because no partition says it is that cluster."""
    keep = set(partitions) if partitions is not None else {p.name for p in model.site.partitions}
    by: dict[str, list[str]] = {}
    for r in model.describe():
        names = {x.strip() for x in r["link"].split("<->")}
        if names <= keep:
            by.setdefault(r["provenance"], []).append(f"{r['link']} {r['scope']} ({r['source']})")
    words = {"measured": "links measured on this site", "imported": "links from another cluster's curves, "
             "where the site says the partition is that cluster (link_curves_from)",
             "site-figure": "links from the site file's figures", "generic": "links from a generic figure "
             "(the site file states none; give intra_node_gbytes_per_s / inter_node_gbytes_per_s or profile "
             "the links)"}
    out = [f"{words[k]}: " + "; ".join(v) for k, v in by.items() if k != "measured"]
    unused: dict[str, set[str]] = {}
    for p in model.site.partitions:
        if p.name not in keep or p.link_curves_from:
            continue
        gpu = model._gpu(p.name)
        for c in model.curves:
            if c.provenance == "imported" and gpu in c.gpu_types:
                unused.setdefault(curve_cluster(c), set()).add(f"{p.name} ({gpu})")
    for cluster, ps in sorted(unused.items()):
        out.append(f"{cluster}'s imported network curves for {', '.join(sorted(ps))} not used: another cluster's "
                   f"fabric is not this site's ('link_curves_from: {cluster}' on a partition whose nodes are "
                   f"that cluster's)")
    return out
