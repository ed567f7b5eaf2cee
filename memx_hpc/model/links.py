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
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import SpecError

__all__ = ["COMM_KINDS", "COMM_SCOPES", "CURVE_PROVENANCES", "CommCurve", "LinkModel", "LinkCost",
           "import_sailor_network", "ring_allreduce_ms", "SITE_LATENCY_US"]

COMM_KINDS = ("p2p", "allreduce")
COMM_SCOPES = ("intra", "inter", "cross")  # inside a node; between nodes of a partition; between partitions
CURVE_PROVENANCES = ("measured", "imported", "site-figure")
#: Start-up latency of one message when only a bandwidth figure is known (microseconds):
#: NCCL's own latency model uses a few us per hop inside a node and ~5-20 us over the
#: network (NCCL ``src/graph/tuning.cc``, base latencies of the Simple protocol); the
#: larger value per scope keeps an unmeasured link from looking too fast.
SITE_LATENCY_US = {"intra": 10.0, "inter": 25.0, "cross": 50.0}
_MB = 1e6


@dataclass(frozen=True, kw_only=True)
class CommCurve:
    """Time of one p2p message or collective as a function of its size.

    ``form``: ``points`` (measured sizes and times, interpolated linearly; latency +
    bandwidth line below the smallest size; the last segment's slope above the largest),
    ``sailor`` (Sailor's bandwidth polynomial, see the module docstring) or ``alpha-beta``
    (``latency_us`` + bytes / ``gbps``). ``streams``: how many GPUs of a node send at once
    in the measurement (the curve is of the whole message they share). ``group_size``:
    ranks of a measured all-reduce. ``partitions``: the partitions it was measured on
    (one for intra / inter, two for cross); empty for a GPU type's imported curve.
    """

    kind: str
    scope: str
    gpu_types: tuple[str, ...]
    provenance: str
    source: str
    form: str
    partitions: tuple[str, ...] = ()
    streams: int = 1
    group_size: int = 2
    sizes_bytes: tuple[float, ...] = ()
    times_ms: tuple[float, ...] = ()
    coeffs: tuple[float, ...] = ()
    max_bytes_per_s: float = 0.0
    latency_us: float = 0.0
    gbps: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in COMM_KINDS:
            raise SpecError("unknown communication kind", field="kind", found=self.kind, allowed=", ".join(COMM_KINDS))
        if self.scope not in COMM_SCOPES:
            raise SpecError("unknown link scope", field="scope", found=self.scope, allowed=", ".join(COMM_SCOPES))
        if self.provenance not in CURVE_PROVENANCES:
            raise SpecError("unknown curve provenance", field="provenance", found=self.provenance,
                            allowed=", ".join(CURVE_PROVENANCES))
        if self.form == "points":
            if len(self.sizes_bytes) < 2 or len(self.sizes_bytes) != len(self.times_ms):
                raise SpecError("a measured curve needs at least two (size, time) points", field="sizes_bytes",
                                found=len(self.sizes_bytes))
            if any(t <= 0 or not math.isfinite(t) for t in self.times_ms):
                raise SpecError("measured times must be positive", field="times_ms", found=self.times_ms)
        elif self.form == "sailor":
            if len(self.coeffs) < 1 or self.max_bytes_per_s <= 0:
                raise SpecError("Sailor curve needs coefficients and a positive maximum bandwidth", field="coeffs",
                                found=(self.coeffs, self.max_bytes_per_s))
        elif self.form == "alpha-beta":
            if self.gbps <= 0:
                raise SpecError("bandwidth must be positive", field="gbps", found=self.gbps)
        else:
            raise SpecError("unknown curve form", field="form", found=self.form,
                            allowed="points, sailor, alpha-beta")
        if self.streams < 1:
            raise SpecError("streams must be >= 1", field="streams", found=self.streams)

    # ------------------------------------------------------------------ evaluation

    def time_ms(self, nbytes: float) -> float:
        """Milliseconds for a message (or collective buffer) of ``nbytes``."""
        x = float(nbytes)
        if x <= 0:
            return 0.0
        if self.form == "alpha-beta":
            return self.latency_us * 1e-3 + x / (self.gbps * 1e6)
        if self.form == "sailor":
            if x < _MB:
                t1, t2 = self._sailor_ms(_MB), self._sailor_ms(2 * _MB)
                beta = max(t2 - t1, 1e-12) / _MB  # ms per byte
                alpha = max(t1 - beta * _MB, 0.0)
                return alpha + beta * x
            return self._sailor_ms(x)
        return self._points_ms(x)

    def _sailor_bw_gbs(self, x: float) -> float:
        c = np.asarray(self.coeffs, dtype=np.float64)
        lx = math.log2(x / _MB)
        if len(c) == 3 and c[0] < 0:  # concave: the fit bends down past its vertex, bandwidth does not
            lx = min(lx, -c[1] / (2 * c[0]))
        bw = float(np.polyval(c, max(lx, 0.0)))
        cap = self.max_bytes_per_s / 1e9
        return min(max(bw, cap * 1e-3), cap)

    def _sailor_ms(self, x: float) -> float:
        return (x / 1e9) / self._sailor_bw_gbs(x) * 1e3

    def _points_ms(self, x: float) -> float:
        s = np.asarray(self.sizes_bytes, dtype=np.float64)
        t = np.maximum.accumulate(np.asarray(self.times_ms, dtype=np.float64)[np.argsort(s)])  # never faster when larger
        s = np.sort(s)
        if x <= s[0]:
            # the latency + bandwidth line through the two smallest points, never below
            # the smallest point's own bandwidth
            beta = max((t[1] - t[0]) / max(s[1] - s[0], 1.0), 0.0)
            return float(max(t[0] - beta * (s[0] - x), t[0] * x / s[0]))
        if x >= s[-1]:
            slope = (t[-1] - t[-2]) / max(s[-1] - s[-2], 1.0)
            slope = max(slope, t[-1] / s[-1] * 0.5)  # the achieved bandwidth at most doubles beyond
            return float(t[-1] + slope * (x - s[-1]))
        return float(np.interp(x, s, t))

    def bandwidth_gbps(self, nbytes: float) -> float:
        """Achieved GB/s at ``nbytes`` (algorithm bandwidth: bytes / time)."""
        t = self.time_ms(nbytes)
        return nbytes / (t * 1e6) if t > 0 else math.inf

    def label(self) -> str:
        where = "/".join(self.partitions) if self.partitions else "/".join(self.gpu_types)
        return f"{self.provenance} {self.kind} {self.scope} {where} x{self.streams} ({self.source})"

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict
        return asdict(self)


def ring_allreduce_ms(p2p_ms, nbytes: float, n: int) -> float:
    """Ring all-reduce of ``nbytes`` over ``n`` ranks from a p2p time function:
    ``2 (n - 1)`` steps, each moving ``nbytes / n`` (Patarasuk & Yuan 2009; Sailor's
    ``estimate_ar_time``)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (n - 1) * p2p_ms(nbytes / n)


# --------------------------------------------------------------------------- Sailor's curves


def import_sailor_network(folder: str | Path, *, catalog: Any = None) -> list[CommCurve]:
    """Sailor's published network curves (``network_coeffs_all_homo.json``, whose
    ``intra`` part ``intra_node_bandwidths.json`` repeats) as :class:`CommCurve` objects.

    GPU names resolve through the catalog (``GH-96`` -> ``GH200``); a name the catalog
    does not know is kept as written. Raises SpecError naming the file when it is
    missing or malformed.
    """
    from ..catalog import catalog as default_catalog
    cat = catalog or default_catalog()
    folder = Path(folder)
    path = folder / "network_coeffs_all_homo.json"
    if not path.is_file():
        raise SpecError("Sailor's network coefficients are missing", field=str(path), found="no such file")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SpecError(f"cannot read Sailor's network coefficients: {e}", field=str(path)) from None
    src = "Sailor (ETH Zurich), MIT licence: " + path.name
    out: list[CommCurve] = []
    for scope in ("intra", "inter"):
        for gpu, per_count in sorted((data.get(scope) or {}).items()):
            try:
                name = cat.get(gpu).name
            except SpecError:
                name = gpu
            for count, entry in sorted(per_count.items(), key=lambda kv: int(kv[0])):
                try:
                    coeffs, max_bps = entry
                    k = int(count)
                    curve = CommCurve(kind="p2p", scope=scope, gpu_types=(name,), provenance="imported",
                                      source=f"{src} [{scope}][{gpu}][{count}]", form="sailor",
                                      streams=max(1, k // 2) if scope == "intra" else k,
                                      coeffs=tuple(float(c) for c in coeffs), max_bytes_per_s=float(max_bps))
                except (TypeError, ValueError) as e:
                    raise SpecError(f"malformed entry: {e}", field=f"{path}: {scope}.{gpu}.{count}") from None
                out.append(curve)
    return out


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

