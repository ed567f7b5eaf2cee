"""Collectives as they run: time per collective from the group's shape, the links and the message size.

Pure functions (numpy arrays accepted for message sizes), no state. Times are returned in
milliseconds, latency constants are in microseconds, bandwidths in GB/s (10^9 bytes/s) per GPU
and per direction unless a name says otherwise.

What is modelled
================

**Bus bandwidth.** nccl-tests defines, for a collective moving ``S`` bytes over ``n`` ranks
(NVIDIA/nccl-tests ``doc/PERFORMANCE.md``, "Performance reported by NCCL tests"):
``algbw = S / t`` and ``busbw = algbw · 2(n-1)/n`` for all-reduce, ``algbw · (n-1)/n`` for
reduce-scatter and all-gather (``S`` the whole buffer, ``count · n`` elements) and all-to-all.
``busbw`` is the bandwidth each rank would need on a flat fabric, so it compares with a link's line
rate whatever ``n`` is. The bandwidth term of a ring is therefore ``2(n-1)/n · S / busbw``
(all-reduce) and ``(n-1)/n · S / busbw`` (RS/AG); for large ``n`` the all-reduce term tends to
``2 S / busbw``.

**Peak bus bandwidth of a group** (:func:`peak_busbw_gbytes_per_s`). A group of ``n`` ranks with
``k`` of them in each NVLink/xGMI domain (``m = n / k`` domains; a domain is a node, or a rack
for NVL72 systems whose NVLink spans 18 nodes) runs NCCL's ring through the domains: inside a
domain the ring hops over NVLink, between domains over the fabric. Every edge of a ring carries
the same bytes, and NCCL runs one ring (channel) per adapter, so the bytes leaving a domain per
GPU of the group are ``2(n-1)/n · S / k`` over the GPU's share of the fabric. The bus bandwidth is
bounded by the slower hop: ``min(intra · f_intra, k · inter · f_inter)`` with ``inter`` the fabric
bandwidth one GPU gets while the node's other GPUs communicate too (:func:`fabric_share_gbytes_per_s`)
and ``f`` the fraction of the line rate NCCL reaches (:data:`LINK_KINDS`). A group inside one
domain (``m = 1``) never touches the fabric.

**Latency** (:func:`ring_latency_us`, :func:`tree_latency_us`). NCCL's own cost model,
``src/graph/tuning.cc`` of NVIDIA/nccl (commit 5067397c, ``ncclTopoTuneModel`` and
``ncclTopoGetAlgoTime``), Simple protocol (the one large messages such as gradient buckets use):
a base latency per call (8.4 us) plus a per-step hardware latency: ring ``2(n-1)`` steps for
all-reduce (``n-1`` for RS/AG), of which ``2(m-1)`` (``m-1``) cross the network at 14 us and the
others cost the intra-domain hop (NVLink 3.4 us, PCIe 5.7 us; at least 3x the 1 us network
overhead when the ring spans domains); a multi-node Simple ring is multiplied by 1.4 (NCCL's
"plateau effect of ring", Hopper and later). The tree (all-reduce only): ``2((k-1) · intra +
log2(m) · inter)`` steps, so its latency grows with ``log2`` of the node count instead of the
rank count; its bandwidth is ``0.92`` of the ring's (NCCL's model refinement) and halved to an
algorithm bandwidth (``algbw = 0.5 · busbw``), further scaled by NCCL's static correction for
medium sizes (``treeCorrectionFactor``, Simple row). ``algorithm="auto"`` takes the faster of the
two, as NCCL's tuner does, where the fabric runs both: over AWS EFA the all-reduce runs as a ring
(AWS recommends ``NCCL_ALGO=ring`` for large all-reduces there, and aws-ofi-nccl's tuner picks it),
so a tree's ``log2`` latency is not available to it (:attr:`LinkKind.allreduce_algorithms`).
Not modelled: the LL/LL128 protocols (lower latency for messages below
~1 MB, so small collectives are priced somewhat high), NVLink SHARP / NVLS and IB SHARP (which
reach a bus bandwidth above the line rate: ~480 GB/s on 8 H100s), and the 2-node tree's lower
network volume.

**Message-size efficiency.** ``t = latency + busbytes / busbw_peak`` gives an achieved bus
bandwidth ``busbytes / t = peak · line · S / (S + S_half)``: the S-curve nccl-tests publishes,
latency-bound for small messages and saturating at ``peak`` of the line rate.
:func:`bus_efficiency` is that curve with its two parameters (half-saturation size, peak fraction);
:func:`half_saturation_bytes` gives ``S_half`` of a group (it grows with the latency, hence with
``n`` and the number of domains). The peak fractions per link kind are cited in :data:`LINK_KINDS`.
``benchmarks/collectives_table.py`` prints the curve beside published nccl-tests results.

**Megatron's gradient buckets** (megatron-core, NVIDIA/Megatron-LM commit d98e8a64, files under
``megatron/core/distributed/``; ``megatron/training/`` from the local copy in
``shared/data/megatron-lm``):

- bucket size: ``DistributedDataParallel.__init__`` (``distributed_data_parallel.py``) sets
  ``bucket_size = max(40000000, 1000000 * dp_group.size())`` parameters when ``--ddp-bucket-size``
  is not given, ``None`` (one bucket) when ``overlap_grad_reduce`` is off, and ``None`` as well on
  every pipeline rank but the first (``if disable_bucketing or pp_rank > 0``) and for every model
  chunk but the first (``megatron/training/training.py``, ``get_model``:
  ``disable_bucketing=(model_chunk_idx > 0)``);
- buckets are filled in backward order (``param_and_grad_buffer.py``,
  ``_compute_default_per_buffer_param_layout``: ``for param in params[::-1]``, a bucket closes as
  soon as it holds ``>= bucket_size`` elements), so the first bucket holds the last layers and the
  last one, often smaller, the first layers;
- reduction: ``_ParamAndGradBucketGroup.start_grad_sync`` issues a reduce-scatter per bucket under
  the distributed optimizer, an all-reduce otherwise, one bucket group at a time on one stream;
- overlap: the backward post-hook (``_make_backward_post_hook`` -> ``register_grad_ready``) starts
  a bucket's reduction once all its gradients are ready, only in the last micro-batch
  (``is_last_microbatch``; the schedules run the others under ``no_sync``); in
  ``forward_backward_pipelining_without_interleaving`` (``megatron/core/pipeline_parallel/schedules.py``)
  only the first pipeline stage enables it in its last backward (``grad_sync_first_stage``), the
  other stages launch their reduction after their cool-down (``config.grad_sync_func``), where it
  hides in the time their pipeline predecessors still compute; the interleaved schedule launches a
  chunk's reduction at that chunk's last micro-batch backward;
- without overlap, ``finish_grad_sync`` runs the whole reduction synchronously after the backward;
- ``--overlap-param-gather`` (distributed optimizer only): the first bucket's all-gather starts in
  the forward pre-hook of the next iteration's first module and each wait dispatches the next
  bucket's (``finish_param_sync``; ``--align-param-gather`` is forced off without virtual stages,
  ``megatron/training/arguments.py``); with virtual stages all of a chunk's gathers are dispatched
  at once (``param_sync_func``). Without it the distributed optimizer all-gathers synchronously in
  ``step_with_ready_grads`` (``distrib_optimizer.py``).

:func:`exposed_grad_sync_ms` and :func:`exposed_param_gather_ms` turn per-bucket communication
times and the compute they can hide behind into the time the iteration waits for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import SpecError

__all__ = [
    "BASE_LATENCY_US", "COLLECTIVES", "DEFAULT_BUCKET_MIN_PARAMS", "DEFAULT_BUCKET_PARAMS_PER_DP_RANK",
    "GroupShape", "LINK_KINDS", "LinkKind", "RING_PLATEAU", "TREE_BANDWIDTH_FACTOR", "all_gather_ms",
    "all_to_all_ms", "allreduce_algorithms", "allreduce_ms", "bus_bytes", "bus_efficiency", "busbw_gbytes_per_s",
    "collective_ms",
    "default_bucket_size_params", "exposed_grad_sync_ms", "exposed_param_gather_ms", "fabric_share_gbytes_per_s",
    "group_shape", "half_saturation_bytes", "megatron_buckets", "peak_busbw_gbytes_per_s",
    "pipeline_idle_after_last_backward_ms", "reduce_scatter_ms", "ring_latency_us", "send_ms", "tree_latency_us",
    "uniform_buckets",
]

COLLECTIVES = ("allreduce", "reduce_scatter", "all_gather", "all_to_all")


# --------------------------------------------------------------------------- link kinds


@dataclass(frozen=True, kw_only=True)
class LinkKind:
    """What NCCL reaches on one kind of link: the fraction of the line rate at large messages
    (``peak_fraction``) and the per-step latencies of its cost model (Simple protocol)."""

    name: str
    #: achieved bus bandwidth / line rate for large messages
    peak_fraction: float
    #: one ring step over this link (us)
    ring_hop_latency_us: float
    #: one tree step over this link (us)
    tree_hop_latency_us: float
    #: whether the link is a network between domains (its steps count as inter-domain steps)
    network: bool
    source: str
    #: the all-reduce algorithms NCCL runs over this link between domains (``auto`` picks the
    #: fastest of them); a fabric whose transport lacks one is held to the others
    allreduce_algorithms: tuple[str, ...] = ("ring", "tree")


#: NCCL's base latency of a collective call, Simple protocol, ring and tree alike (us):
#: ``baseLatencies`` in NVIDIA/nccl src/graph/tuning.cc.
BASE_LATENCY_US = 8.4
#: NCCL's per-step network overhead on x86 (``getNetOverhead``: 1 us Intel, 2 us AMD), tripled for the
#: Simple protocol; a ring that spans nodes pays at least this on every step.
NET_OVERHEAD_SIMPLE_US = 3.0
#: ``lat *= 1.4``: "Plateau effect of ring" for a multi-node Simple all-reduce (compute capability >= 8.0).
RING_PLATEAU = 1.4
#: ``busBw * .92`` for the tree all-reduce (NCCL ``ncclTopoTuneModel``)
TREE_BANDWIDTH_FACTOR = 0.92
#: NCCL's ``treeCorrectionFactor`` for the Simple protocol, indexed by ``log2(bytes / 64)``
#: (sizes 64 B .. 256 MiB; 1.0 beyond): "Trees are not perfectly sticking to the model for medium sizes".
TREE_CORRECTION_SIMPLE = (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9,
                          .9)

_TUNING = "NVIDIA/nccl src/graph/tuning.cc (commit 5067397c), hwLatencies, Simple protocol"

#: Link kinds and what NCCL reaches on them. Latencies: NCCL's tuner table; peak fractions: the
#: nccl-tests bus bandwidth NVIDIA engineers quote, or public nccl-tests runs, as each source says.
LINK_KINDS: dict[str, LinkKind] = {
    "nvlink": LinkKind(
        name="nvlink", peak_fraction=370.0 / 450.0, ring_hop_latency_us=3.4, tree_hop_latency_us=4.0, network=False,
        source="peak: '450GB/s is the line rate. With the protocol overhead (~20%) NCCL can get an effective NVLink "
               "bandwidth of 370GB/s ... when running with NCCL_ALGO=RING' (S. Jeaugey, NVIDIA/nccl-tests issue 212, "
               "2024); ring busbw 365-370 GB/s on 2-8 H100 (NVIDIA/nccl issue 1455); latency: " + _TUNING + " NVLINK"),
    "xgmi": LinkKind(
        name="xgmi", peak_fraction=370.0 / 450.0, ring_hop_latency_us=3.4, tree_hop_latency_us=4.0, network=False,
        source="assumed equal to NVLink's (RCCL keeps NCCL's tuner model); no published RCCL efficiency used"),
    "pcie": LinkKind(
        name="pcie", peak_fraction=370.0 / 450.0, ring_hop_latency_us=5.7, tree_hop_latency_us=4.0, network=False,
        source="latency: " + _TUNING + " PCI; peak: NVLink's ~20% protocol overhead assumed"),
    "ib": LinkKind(
        name="ib", peak_fraction=0.94, ring_hop_latency_us=14.0, tree_hop_latency_us=14.0, network=True,
        source="peak: 'For NDR @ 400Gbps you should see 46-48GB/s per NIC' (NVIDIA/nccl-tests issue 290, 2025) and "
               "'24GB/s is the peak performance per 200G NIC' (S. Jeaugey, NVIDIA/nccl-tests issue 119, 2022): "
               "0.92-0.96 of the line rate; latency: " + _TUNING + " NET"),
    "roce": LinkKind(
        name="roce", peak_fraction=0.94, ring_hop_latency_us=14.0, tree_hop_latency_us=14.0, network=True,
        source="assumed equal to InfiniBand's (same NCCL IB transport over RoCE v2); latency: " + _TUNING + " NET"),
    "efa": LinkKind(
        name="efa", peak_fraction=0.89, ring_hop_latency_us=14.0, tree_hop_latency_us=14.0, network=True,
        source="peak: all_reduce_perf busbw 354-357 GB/s on 4-16 p5.48xlarge (3,200 Gb/s = 400 GB/s a node), "
               "crazyguitar/aws-gpu-communication-benchmark data/nccl_all_reduce.csv; latency: " + _TUNING
               + " NET (NCCL has one network row; aws-ofi-nccl adds its own); all-reduce as a ring: 'we recommend "
               "using NCCL_ALGO=ring for large message all reduce as it yields better performance ... EFA doesn't "
               "support LL and LL128' (AWS, aws/aws-ofi-nccl issue 76), and aws-ofi-nccl's tuner picks the ring for "
               "large all-reduces on P5/P6",
        allreduce_algorithms=("ring",)),
    "slingshot": LinkKind(
        name="slingshot", peak_fraction=0.94, ring_hop_latency_us=14.0, tree_hop_latency_us=14.0, network=True,
        source="assumed equal to InfiniBand's (aws-ofi-nccl over libfabric cxi); no published nccl-tests figure used"),
    "tcp": LinkKind(
        name="tcp", peak_fraction=0.94, ring_hop_latency_us=14.0, tree_hop_latency_us=14.0, network=True,
        source="assumed equal to InfiniBand's; NCCL's socket transport is usually slower: measure it"),
}


def _kind(name: str, field: str) -> LinkKind:
    try:
        return LINK_KINDS[name]
    except KeyError:
        raise SpecError("unknown link kind", field=field, found=name, allowed=", ".join(LINK_KINDS)) from None


# --------------------------------------------------------------------------- group shape


def fabric_share_gbytes_per_s(adapter_gbits_per_s: float, *, gpus_per_node: int, adapters_per_node: int | None = None,
                              gpus_sending: int | None = None) -> float:
    """GB/s per direction the fabric gives one GPU while ``gpus_sending`` GPUs of its node
    (default: all of them, as when every TP rank's data-parallel group reduces at once) use the
    node's ``adapters_per_node`` adapters (None: one per GPU) of ``adapter_gbits_per_s`` each.
    A GPU is held to its own adapters (``adapters / gpus_per_node``, at least one: NCCL maps a
    GPU's channels to the NICs nearest it), so p5's 32 adapters give each of 8 GPUs four."""
    if not adapter_gbits_per_s > 0 or not math.isfinite(adapter_gbits_per_s):
        raise SpecError("must be a positive number", field="adapter_gbits_per_s", found=adapter_gbits_per_s)
    _positive_int(gpus_per_node, "gpus_per_node")
    adapters = gpus_per_node if adapters_per_node is None else _positive_int(adapters_per_node, "adapters_per_node")
    sending = gpus_per_node if gpus_sending is None else _positive_int(gpus_sending, "gpus_sending")
    own = max(1.0, adapters / gpus_per_node)
    return adapter_gbits_per_s / 8.0 * min(own, adapters / sending)


@dataclass(frozen=True, kw_only=True)
class GroupShape:
    """A communicator as NCCL sees it: ``ranks`` GPUs, ``ranks_per_domain`` of them in each
    NVLink/xGMI domain (a node, or an NVL72 rack), ``domains`` = ranks / ranks_per_domain.

    ``intra_gbytes_per_s``: a GPU's link into its domain per direction (H100 NVLink: 450);
    ``inter_gbytes_per_s``: the fabric bandwidth one GPU gets per direction while its node's
    other GPUs communicate too (:func:`fabric_share_gbytes_per_s`; 400 Gb/s per GPU: 50).
    ``intra_link`` / ``inter_link``: keys of :data:`LINK_KINDS`."""

    ranks: int
    ranks_per_domain: int
    intra_gbytes_per_s: float
    inter_gbytes_per_s: float | None = None
    intra_link: str = "nvlink"
    inter_link: str = "ib"

    def __post_init__(self) -> None:
        _positive_int(self.ranks, "ranks")
        _positive_int(self.ranks_per_domain, "ranks_per_domain")
        if self.ranks_per_domain > self.ranks:
            raise SpecError("more ranks in a domain than in the group", field="ranks_per_domain",
                            found=self.ranks_per_domain, allowed=f"1 .. ranks ({self.ranks})")
        if self.ranks % self.ranks_per_domain:
            raise SpecError("the group's ranks must fill its domains evenly", field="ranks_per_domain",
                            found=self.ranks_per_domain, allowed=f"a divisor of ranks ({self.ranks})")
        _positive_rate(self.intra_gbytes_per_s, "intra_gbytes_per_s")
        if self.domains > 1:
            if self.inter_gbytes_per_s is None:
                raise SpecError("a group spanning domains needs the fabric's bandwidth", field="inter_gbytes_per_s",
                                allowed="GB/s per GPU per direction")
            _positive_rate(self.inter_gbytes_per_s, "inter_gbytes_per_s")
        intra = _kind(self.intra_link, "intra_link")
        if intra.network:
            raise SpecError("not a link inside a domain", field="intra_link", found=self.intra_link,
                            allowed=", ".join(k for k, v in LINK_KINDS.items() if not v.network))
        inter = _kind(self.inter_link, "inter_link")
        if not inter.network:
            raise SpecError("not a network link", field="inter_link", found=self.inter_link,
                            allowed=", ".join(k for k, v in LINK_KINDS.items() if v.network))

    @property
    def domains(self) -> int:
        """NVLink/xGMI domains the group spans (nodes, or racks for NVL72)."""
        return self.ranks // self.ranks_per_domain


def group_shape(*, ranks: int, gpus_per_node: int, intra_gbytes_per_s: float, inter_gbytes_per_s: float | None = None,
                stride: int = 1, domain_size: int | None = None, intra_link: str = "nvlink",
                inter_link: str = "ib") -> GroupShape:
    """The shape of a group of ``ranks`` GPUs whose global ranks are ``stride`` apart (a DP group
    of a TP x CP layout: stride TP·CP) on nodes of ``gpus_per_node`` GPUs, ranks filling nodes in
    order. ``domain_size``: GPUs sharing one NVLink/xGMI domain (default: a node; 72 for GB200
    NVL72, whose domain spans 18 nodes of 4). A group that fits a domain keeps its traffic on
    NVLink; otherwise ``domain_size // stride`` of its ranks share each domain."""
    _positive_int(ranks, "ranks")
    _positive_int(gpus_per_node, "gpus_per_node")
    _positive_int(stride, "stride")
    domain = gpus_per_node if domain_size is None else _positive_int(domain_size, "domain_size")
    per_domain = max(1, min(ranks, domain // stride))
    while ranks % per_domain:  # a domain the group does not fill evenly: NCCL's slowest domain sets the pace
        per_domain -= 1
    return GroupShape(ranks=ranks, ranks_per_domain=per_domain, intra_gbytes_per_s=intra_gbytes_per_s,
                      inter_gbytes_per_s=inter_gbytes_per_s, intra_link=intra_link, inter_link=inter_link)


# --------------------------------------------------------------------------- bandwidth and latency


def peak_busbw_gbytes_per_s(shape: GroupShape) -> float:
    """The bus bandwidth a ring reaches for large messages: inside one domain the intra link at
    its peak fraction; across domains the slower of that and ``k`` GPUs' fabric shares (the bytes
    leaving a domain are shared by the group's ``k`` GPUs there)."""
    intra = shape.intra_gbytes_per_s * LINK_KINDS[shape.intra_link].peak_fraction
    if shape.domains == 1:
        return intra
    inter = shape.ranks_per_domain * shape.inter_gbytes_per_s * LINK_KINDS[shape.inter_link].peak_fraction
    return min(intra, inter)


def bus_bytes(nbytes, n: int, collective: str):
    """The bytes a collective of ``nbytes`` (the whole buffer, nccl-tests' ``S``) puts on each
    rank's link: ``2(n-1)/n · S`` for all-reduce, ``(n-1)/n · S`` for the others
    (nccl-tests doc/PERFORMANCE.md)."""
    factor = {"allreduce": 2.0 * (n - 1) / n}.get(_collective(collective), (n - 1) / n)
    return np.asarray(nbytes, dtype=float) * factor


def ring_latency_us(shape: GroupShape, collective: str = "allreduce") -> float:
    """NCCL's latency of a ring (Simple protocol): base + intra steps x intra hop + inter steps x
    network hop; 2(n-1) steps for all-reduce (2(m-1) of them between domains), n-1 otherwise."""
    n, m = shape.ranks, shape.domains
    if n == 1:
        return 0.0
    ar = _collective(collective) == "allreduce"
    steps = 2 * (n - 1) if ar else n - 1
    inter_steps = 0 if m == 1 else (2 * (m - 1) if ar else m - 1)
    intra = LINK_KINDS[shape.intra_link].ring_hop_latency_us
    if m > 1:
        intra = max(intra, NET_OVERHEAD_SIMPLE_US)
    inter = LINK_KINDS[shape.inter_link].ring_hop_latency_us
    lat = BASE_LATENCY_US + (steps - inter_steps) * intra + inter_steps * inter
    return lat * RING_PLATEAU if ar and m > 1 else lat


def tree_latency_us(shape: GroupShape) -> float:
    """NCCL's latency of a tree all-reduce (Simple): base + 2((k-1) intra + log2(m) network) steps:
    a chain inside each domain, a double binary tree across domains."""
    if shape.ranks == 1:
        return 0.0
    k, m = shape.ranks_per_domain, shape.domains
    intra = LINK_KINDS[shape.intra_link].tree_hop_latency_us
    inter = LINK_KINDS[shape.inter_link].tree_hop_latency_us
    return BASE_LATENCY_US + 2.0 * ((k - 1) * intra + math.floor(math.log2(m)) * inter)


def _tree_correction(nbytes: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        idx = np.floor(np.log2(np.maximum(nbytes, 1.0) / 64.0))
    table = np.asarray(TREE_CORRECTION_SIMPLE + (1.0,))
    i = np.clip(idx, 0, len(table) - 1).astype(int)
    return np.where(idx < 0, 1.0, table[i])


def _ring_ms(nbytes: np.ndarray, shape: GroupShape, collective: str) -> np.ndarray:
    bw = peak_busbw_gbytes_per_s(shape)
    return ring_latency_us(shape, collective) * 1e-3 + bus_bytes(nbytes, shape.ranks, collective) / (bw * 1e6)


def _tree_ms(nbytes: np.ndarray, shape: GroupShape) -> np.ndarray:
    algbw = 0.5 * TREE_BANDWIDTH_FACTOR * peak_busbw_gbytes_per_s(shape) * _tree_correction(nbytes)
    return tree_latency_us(shape) * 1e-3 + nbytes / (algbw * 1e6)


def allreduce_algorithms(shape: GroupShape) -> tuple[str, ...]:
    """The all-reduce algorithms NCCL runs on ``shape``: inside one domain ring and tree; across
    domains those the fabric's transport runs (:attr:`LinkKind.allreduce_algorithms`: EFA, ring)."""
    if shape.domains == 1:
        return ("ring", "tree")
    return LINK_KINDS[shape.inter_link].allreduce_algorithms


def allreduce_ms(nbytes, shape: GroupShape, *, algorithm: str = "auto"):
    """All-reduce of ``nbytes`` per rank over ``shape``: ``ring``, ``tree`` or ``auto`` (the faster
    of the algorithms the group's links run, as NCCL's tuner picks: :func:`allreduce_algorithms`).
    0 for one rank or no bytes."""
    if algorithm not in ("auto", "ring", "tree"):
        raise SpecError("unknown all-reduce algorithm", field="algorithm", found=algorithm, allowed="auto, ring, tree")
    x = _bytes(nbytes)
    if shape.ranks == 1:
        return _out(np.zeros_like(x), nbytes)
    ring = _ring_ms(x, shape, "allreduce")
    if algorithm == "ring":
        t = ring
    elif algorithm == "tree":
        t = _tree_ms(x, shape)
    elif "tree" in allreduce_algorithms(shape):
        t = np.minimum(ring, _tree_ms(x, shape))
    else:
        t = ring
    return _out(np.where(x > 0, t, 0.0), nbytes)


def reduce_scatter_ms(nbytes, shape: GroupShape):
    """Ring reduce-scatter of a ``nbytes`` buffer (each rank keeps ``nbytes / n``): ``(n-1)/n`` of
    the buffer over the bus, ``n-1`` steps (NCCL runs RS/AG as rings, no tree)."""
    return _simple(nbytes, shape, "reduce_scatter")


def all_gather_ms(nbytes, shape: GroupShape):
    """Ring all-gather into a ``nbytes`` buffer (each rank contributes ``nbytes / n``)."""
    return _simple(nbytes, shape, "all_gather")


def all_to_all_ms(nbytes, shape: GroupShape):
    """All-to-all of a ``nbytes`` send buffer per rank (``nbytes / n`` to each peer; MoE token
    dispatch). Each GPU sends ``(k-1)/n`` of it inside its domain and ``(n-k)/n`` over its own
    fabric share (nothing is aggregated, unlike a ring), at once; one network hop of latency."""
    x = _bytes(nbytes)
    n, k = shape.ranks, shape.ranks_per_domain
    if n == 1:
        return _out(np.zeros_like(x), nbytes)
    intra_kind = LINK_KINDS[shape.intra_link]
    intra = x * (k - 1) / n / (shape.intra_gbytes_per_s * intra_kind.peak_fraction * 1e6)
    if shape.domains > 1:
        inter_kind = LINK_KINDS[shape.inter_link]
        inter = x * (n - k) / n / (shape.inter_gbytes_per_s * inter_kind.peak_fraction * 1e6)
        hop = inter_kind.ring_hop_latency_us
    else:
        inter, hop = 0.0, intra_kind.ring_hop_latency_us
    t = (BASE_LATENCY_US + hop) * 1e-3 + np.maximum(intra, inter)
    return _out(np.where(x > 0, t, 0.0), nbytes)


def send_ms(nbytes, *, gbytes_per_s: float, link: str = "nvlink"):
    """One point-to-point message (a pipeline stage's activation) over a link of ``gbytes_per_s``
    per direction (the intra-domain link, or the sending GPU's fabric share between domains):
    base + one hop of latency, the bytes at the link's peak fraction."""
    _positive_rate(gbytes_per_s, "gbytes_per_s")
    kind = _kind(link, "link")
    x = _bytes(nbytes)
    t = (BASE_LATENCY_US + kind.ring_hop_latency_us) * 1e-3 + x / (gbytes_per_s * kind.peak_fraction * 1e6)
    return _out(np.where(x > 0, t, 0.0), nbytes)


def collective_ms(collective: str, nbytes, shape: GroupShape):
    """Dispatch by name (one of :data:`COLLECTIVES`)."""
    c = _collective(collective)
    return {"allreduce": allreduce_ms, "reduce_scatter": reduce_scatter_ms, "all_gather": all_gather_ms,
            "all_to_all": all_to_all_ms}[c](nbytes, shape)


def busbw_gbytes_per_s(nbytes, shape: GroupShape, collective: str = "allreduce"):
    """The bus bandwidth nccl-tests would report for this collective: ``bus bytes / time``."""
    x = _bytes(nbytes)
    t = _bytes(collective_ms(collective, x, shape))
    with np.errstate(divide="ignore", invalid="ignore"):
        bw = np.where(t > 0, bus_bytes(x, shape.ranks, collective) / (t * 1e6), 0.0)
    return _out(bw, nbytes)


def bus_efficiency(message_bytes, *, half_saturation_bytes: float, peak_fraction: float):
    """The S-curve of achieved bus bandwidth / line rate against message size:
    ``peak · S / (S + S_half)`` -- ``peak / 2`` at ``S_half``, ``peak`` for large messages, ~0 for
    small ones. It is exactly what ``latency + bytes / (peak · line)`` gives (see the module notes)."""
    if not 0 < peak_fraction <= 1:
        raise SpecError("must be in (0, 1]", field="peak_fraction", found=peak_fraction)
    if not half_saturation_bytes >= 0:
        raise SpecError("must be >= 0", field="half_saturation_bytes", found=half_saturation_bytes)
    x = _bytes(message_bytes)
    with np.errstate(invalid="ignore"):
        eff = np.where(x > 0, peak_fraction * x / (x + half_saturation_bytes), 0.0)
    return _out(eff, message_bytes)


def half_saturation_bytes(shape: GroupShape, collective: str = "allreduce", *, algorithm: str = "ring") -> float:
    """``S_half`` of the ring model: the message size at which the bus bandwidth is half its peak,
    ``latency · peak busbw · S / busbytes``. Only for the ring (the tree's correction table is not
    of this form)."""
    if algorithm != "ring":
        raise SpecError("the half-saturation size is defined for the ring model", field="algorithm",
                        found=algorithm, allowed="ring")
    n = shape.ranks
    if n == 1:
        return 0.0
    per_byte = float(bus_bytes(1.0, n, collective))
    return ring_latency_us(shape, collective) * 1e-6 * peak_busbw_gbytes_per_s(shape) * 1e9 / per_byte


# --------------------------------------------------------------------------- Megatron's buckets

#: ``max(40000000, 1000000 * dp_size)``: megatron-core DistributedDataParallel.__init__
DEFAULT_BUCKET_MIN_PARAMS = 40_000_000
DEFAULT_BUCKET_PARAMS_PER_DP_RANK = 1_000_000


def default_bucket_size_params(dp: int, *, overlap_grad_reduce: bool, first_pp_stage: bool = True,
                               first_model_chunk: bool = True, ddp_bucket_size: int | None = None) -> int | None:
    """Megatron's bucket size in parameters, or None for one bucket holding everything: no
    overlap, a pipeline rank other than the first, or a model chunk other than the first."""
    _positive_int(dp, "dp")
    if not overlap_grad_reduce or not first_pp_stage or not first_model_chunk:
        return None
    if ddp_bucket_size is not None:
        return _positive_int(ddp_bucket_size, "ddp_bucket_size")
    return max(DEFAULT_BUCKET_MIN_PARAMS, DEFAULT_BUCKET_PARAMS_PER_DP_RANK * dp)


def megatron_buckets(param_numels: Sequence[int], bucket_size: int | None) -> list[int]:
    """Bucket sizes (parameters) in launch order, as ``_compute_default_per_buffer_param_layout``
    builds them: ``param_numels`` in model order, walked backwards, a bucket closing once it holds
    ``>= bucket_size``; the remainder is the last bucket. Padding for the distributed optimizer is
    ignored (a few hundred elements per bucket)."""
    out: list[int] = []
    cur = 0
    for numel in reversed(list(param_numels)):
        if numel < 0:
            raise SpecError("a parameter count is negative", field="param_numels", found=numel)
        cur += int(numel)
        if bucket_size is not None and cur >= bucket_size:
            out.append(cur)
            cur = 0
    if cur or not out:
        out.append(cur)
    return out


def uniform_buckets(params: float, bucket_size: int | None) -> list[float]:
    """Buckets of ``params`` parameters spread evenly over layers too fine to matter: full buckets
    of ``bucket_size`` and the remainder last (one bucket when ``bucket_size`` is None)."""
    if not params >= 0:
        raise SpecError("must be >= 0", field="params", found=params)
    if bucket_size is None or params <= bucket_size:
        return [float(params)]
    full = int(params // bucket_size)
    rest = params - full * bucket_size
    return [float(bucket_size)] * full + ([float(rest)] if rest > 0 else [])


def exposed_grad_sync_ms(bucket_comm_ms: Sequence[float], backward_ms: float, *, overlap: bool,
                         bucket_params: Sequence[float] | None = None, idle_after_ms: float = 0.0) -> float:
    """The gradient synchronisation the iteration waits for.

    ``bucket_comm_ms``: each bucket's reduce-scatter / all-reduce, in launch order (the model's
    end first); ``backward_ms``: the backward of the last micro-batch, which produces the buckets'
    gradients in that order (at a uniform rate per parameter, ``bucket_params`` giving the split;
    equal split when None); ``idle_after_ms``: time this rank would wait anyway after its last
    backward (a later pipeline stage waits for its predecessors' cool-down:
    :func:`pipeline_idle_after_last_backward_ms`).

    Overlap on: buckets reduce one at a time on one stream as they become ready, so with ``t_j``
    the compute that fills bucket ``j`` the reduction ends ``max_i [c_i + sum_{j>i} (c_j - t_j)]``
    after the backward: the last bucket always, plus whatever communication outruns the compute
    behind it. Overlap off: all of it, after the backward."""
    c = np.asarray(bucket_comm_ms, dtype=float)
    if c.ndim != 1 or np.any(c < 0) or not np.all(np.isfinite(c)):
        raise SpecError("must be finite non-negative times", field="bucket_comm_ms")
    if not backward_ms >= 0 or not idle_after_ms >= 0:
        raise SpecError("must be >= 0", field="backward_ms" if not backward_ms >= 0 else "idle_after_ms",
                        found=backward_ms if not backward_ms >= 0 else idle_after_ms)
    if c.size == 0:
        return 0.0
    if not overlap:
        return float(max(0.0, c.sum() - idle_after_ms))
    t = _split(backward_ms, bucket_params, c.size, "bucket_params")
    slack = c - t
    # suffix sums of (c_j - t_j) for j > i
    after = np.concatenate([np.cumsum(slack[::-1])[::-1][1:], [0.0]])
    tail = float(np.max(c + after))
    return max(0.0, tail - idle_after_ms)


def exposed_param_gather_ms(bucket_gather_ms: Sequence[float], forward_ms: float, *, overlap: bool,
                            bucket_params: Sequence[float] | None = None, aligned: bool = False) -> float:
    """The parameter all-gather (distributed optimizer) the iteration waits for.

    ``bucket_gather_ms`` and ``bucket_params`` in the forward's order (the model's start first,
    i.e. the reverse of the gradient buckets); ``forward_ms``: the first micro-batch's forward that
    uses them. Overlap off: all of it (synchronous after the optimizer step). Overlap on, not
    aligned (no virtual stages): the first bucket's gather is exposed and each wait dispatches the
    next, so bucket ``j+1`` is hidden by bucket ``j``'s forward: ``g_1 + sum_j max(0, g_{j+1} - f_j)``.
    Aligned (virtual stages): all gathers are queued at once; bucket ``i`` is ready after the
    first ``i`` gathers, so the wait is ``max_i (G_i - F_{<i})``."""
    g = np.asarray(bucket_gather_ms, dtype=float)
    if g.ndim != 1 or np.any(g < 0) or not np.all(np.isfinite(g)):
        raise SpecError("must be finite non-negative times", field="bucket_gather_ms")
    if not forward_ms >= 0:
        raise SpecError("must be >= 0", field="forward_ms", found=forward_ms)
    if g.size == 0:
        return 0.0
    if not overlap:
        return float(g.sum())
    f = _split(forward_ms, bucket_params, g.size, "bucket_params")
    if aligned:
        before = np.concatenate([[0.0], np.cumsum(f)[:-1]])
        return float(max(0.0, np.max(np.cumsum(g) - before)))
    return float(g[0] + np.maximum(0.0, g[1:] - f[:-1]).sum())


def pipeline_idle_after_last_backward_ms(stage: int, last_backward_ms: Sequence[float], send_ms_between: float = 0.0
                                         ) -> float:
    """How long pipeline stage ``stage`` (0 = first) waits, after its last backward, for the first
    stage to finish (1F1B: the last micro-batch's gradient still runs back through stages
    ``stage-1 .. 0``): the sum of their last backward times plus one send per boundary. Its
    gradient reduction (one bucket, launched after the cool-down) hides in this time."""
    b = list(last_backward_ms)
    if not 0 <= stage < len(b):
        raise SpecError("no such pipeline stage", field="stage", found=stage, allowed=f"0 .. {len(b) - 1}")
    if not send_ms_between >= 0:
        raise SpecError("must be >= 0", field="send_ms_between", found=send_ms_between)
    return float(sum(b[:stage]) + stage * send_ms_between)


# --------------------------------------------------------------------------- helpers


def _split(total_ms: float, params: Sequence[float] | None, n: int, field: str) -> np.ndarray:
    if params is None:
        return np.full(n, total_ms / n)
    p = np.asarray(params, dtype=float)
    if p.shape != (n,) or np.any(p < 0) or not np.all(np.isfinite(p)):
        raise SpecError("one finite non-negative count per bucket", field=field, found=list(np.atleast_1d(p)))
    s = p.sum()
    return np.full(n, total_ms / n) if s == 0 else total_ms * p / s


def _collective(name: str) -> str:
    if name not in COLLECTIVES:
        raise SpecError("unknown collective", field="collective", found=name, allowed=", ".join(COLLECTIVES))
    return name


def _simple(nbytes, shape: GroupShape, collective: str):
    x = _bytes(nbytes)
    if shape.ranks == 1:
        return _out(np.zeros_like(x), nbytes)
    return _out(np.where(x > 0, _ring_ms(x, shape, collective), 0.0), nbytes)


def _bytes(nbytes) -> np.ndarray:
    x = np.asarray(nbytes, dtype=float)
    if np.any(~np.isfinite(x)) or np.any(x < 0):
        raise SpecError("message sizes must be finite and >= 0", field="nbytes")
    return x


def _out(arr: np.ndarray, like):
    """A float for a scalar input, the array otherwise."""
    return float(arr) if np.ndim(like) == 0 else arr


def _positive_int(v, field: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise SpecError("must be a whole number >= 1", field=field, found=v)
    return int(v)


def _positive_rate(v, field: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or not math.isfinite(v) \
            or v <= 0:
        raise SpecError("must be a positive number of GB/s", field=field, found=v)
    return float(v)
