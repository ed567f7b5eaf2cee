"""Communication costs of one stage of a plan, over the site's links.

Every link is a curve of message size -> time (:class:`memx_hpc.model.links.LinkModel`:
measured, else Sailor's imported curves, else the site's figure).

* point-to-point sends between stages: each TP rank sends the ``s·b·h`` activation
  (divided by TP under sequence parallelism; Megatron-core's ``p2p_communication`` has
  no scatter-gather), all TP ranks of a node at once, over the link between the two
  stages' GPUs: inside a node, between nodes of a partition, or between partitions;
* after its last backward each stage synchronises gradients over its data-parallel
  group -- a ring all-reduce (Patarasuk & Yuan 2009: ``2(d-1)`` steps of ``bytes/d`` on the
  group's slowest link curve, all the stage's TP ranks of a node running their rings at
  once), or with the distributed optimizer reduce-scatter of gradients then all-gather
  of parameters, half a ring each (Rajbhandari et al. 2020, ZeRO §5), in megatron-core's
  buckets, each call priced by NCCL's model of the group's shape (:func:`stage_sync_terms`,
  :mod:`memx_hpc.model.collectives`) where the link has no measured or imported curve; under
  the plan's ``--overlap-grad-reduce`` / ``--overlap-param-gather`` only what the last backward
  and the next forward do not hide shows (:func:`exposed_dp_sync_ms`). Tied
  embeddings add the first/last-stage embedding-gradient all-reduce (Megatron-LM
  ``_allreduce_word_embedding_grads``);
* a TP group of whole nodes adds the inter-node part of its collectives, and context and
  expert parallel their exposed K/V exchange and all-to-all (:func:`stage_extras`).

Gradients travel in fp32 under bf16 (Megatron-LM sets ``accumulate_allreduce_grads_in_fp32``
for bf16 in ``megatron/training/arguments.py``) unless the job reduces them in bf16
(``grad_reduce_in_fp32`` off: ``--grad-reduce-in-bf16``), in the parameter dtype otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..placement import Placement
from ..spec import BYTES_PER_ELEMENT, Site, TrainJob
from . import analytic
from .assembled import AssembledCostModel
from .host import HOST_US_PER_OP, layer_host_ms_parallel
from .queries import shape_of

if TYPE_CHECKING:
    from .api import CostModel
    from .links import LinkModel

__all__ = ["GRAD_BYTES_PER_PARAM", "grad_bytes_per_param", "StageExtras", "stage_extras", "p2p_bytes", "transfer_ms",
           "sync_ms_per_param", "tied_embedding_sync_ms", "stage_layout", "stage_links", "link_model_for", "send_ms",
           "dp_sync_ms", "stage_sync_ms", "tied_sync_ms", "tp_internode_ms", "TP_COLLECTIVE_UNITS",
           "SYNC_TERMS", "bucket_terms", "one_bucket_terms", "exposed_dp_sync_ms", "stage_sync_terms",
           "group_collective_ms", "group_shape_of", "domain_gpus", "intra_link_kind", "inter_link_kind"]

#: Bytes per parameter of the gradients that DP synchronises (see the module docstring).
GRAD_BYTES_PER_PARAM = {"bf16": 4, "fp16": 2, "fp32": 4}


def grad_bytes_per_param(job: TrainJob) -> int:
    """Bytes per parameter of the gradients DP synchronises: :data:`GRAD_BYTES_PER_PARAM`,
    bf16 gradients in bf16 where the job reduces them so (``grad_reduce_in_fp32`` off)."""
    if job.precision == "bf16" and not job.grad_reduce_in_fp32:
        return 2
    return GRAD_BYTES_PER_PARAM[job.precision]


def _expert_share(job: TrainJob) -> float:
    """The routed experts' part of an MoE layer's forward FLOPs on a rank
    (:func:`memx_hpc.model.analytic.moe_layer_flops` at EP 1): what the imbalance margin of
    expert parallel widens; 0 for a dense model."""
    if not job.model.is_moe:
        return 0.0
    parts = analytic.moe_layer_flops(shape_of(job), micro_batch_size=1, tp=1, ep=1)
    return parts["routed"] / sum(parts.values())


@dataclass(frozen=True, kw_only=True)
class StageExtras:
    """What context and expert parallel change of one stage's per-layer answers: time scales
    of the layers and of the embedding/head, the activation scale, and the exposed
    communication per layer (forward, backward ms per micro-batch): ring attention's K/V
    steps that attention does not hide, and the experts' all-to-all dispatch and combine."""

    layer_scale: float = 1.0
    ends_scale: float = 1.0
    act_scale: float = 1.0
    extra_fwd_ms: float = 0.0
    extra_bwd_ms: float = 0.0


def stage_extras(links, job: TrainJob, *, partition: str | None, tasks_per_node: int, tp: int, cp: int, ep: int,
                 etp: int | None, micro_batch_size: int, layer_fwd_ms: float,
                 host_us: float = HOST_US_PER_OP) -> StageExtras:
    """:class:`StageExtras` of a stage on ``partition`` whose component runs ``tasks_per_node``
    ranks a node; ``layer_fwd_ms``: one layer's forward at the whole sequence (the cost model's,
    before the CP split).

    * Context parallel ``c``: each rank computes ``1/c`` of a layer's work (Megatron splits the
      sequence into ``2c`` chunks, rank r taking r and ``2c-1-r``, so causal attention
      balances) and keeps ``1/c`` of its activations. Ring attention runs ``c - 1`` K/V steps
      per layer, each overlapping the attention on the block held: per step
      ``max(attention / c, send)`` (:func:`memx_hpc.model.analytic.cp_kv_exchange_bytes`, K and V
      split over TP), the send over the CP group's link (inside a node when the component's
      tasks per node are a multiple of ``tp x c``; Megatron's order puts the CP peers TP
      apart), all the node's ranks sending at once; backward moves twice the bytes.
    * Expert parallel ``ep``: the cost model prices the MoE layer at EP 1 (every expert on the
      rank: no imbalance, no all-to-all); with ``ep > 1`` the routed experts' compute is
      widened by :func:`memx_hpc.model.analytic.moe_imbalance` (the most loaded rank), and
      each MoE layer adds a dispatch and a combine all-to-all forward and again backward
      (:func:`memx_hpc.model.analytic.moe_alltoall_bytes` for the rank's ``1/(tp x c)`` of the
      tokens) over the EP group's link, not overlapped (Megatron's default), the most loaded
      rank's share set by the same margin.
    * The host floor (:func:`memx_hpc.model.host.layer_host_ms_parallel`): every rank of the
      group dispatches all of the layer's operators and those ring attention and the MoE
      layer add, so a layer whose device work the split makes small still takes its host
      time; the forward and backward are raised to it where the device part (layer time x
      scale + the exposed communication above) is shorter. Large layers are unchanged.
    """
    m = job.model
    imbalance = analytic.moe_imbalance(ep) if m.is_moe else 1.0
    layer_scale = (1.0 + (imbalance - 1.0) * _expert_share(job)) / cp
    xf = xb = 0.0
    if partition is not None and cp > 1:
        f_bytes, b_bytes = analytic.cp_kv_exchange_bytes(shape_of(job), micro_batch_size=micro_batch_size,
                                                          precision=job.precision, cp=cp)
        streams = max(1, min(tp * cp, tasks_per_node))
        same = tasks_per_node % (tp * cp) == 0 or _in_domain(links.site, partition, tasks_per_node, tp * cp)
        att = layer_fwd_ms / cp * (analytic.attention_score_flops(shape_of(job), micro_batch_size=micro_batch_size)
                                   / analytic.layer_flops(shape_of(job), micro_batch_size=micro_batch_size))
        for nbytes, work, is_f in ((f_bytes, att, True), (b_bytes, 2.0 * att, False)):
            step = links.p2p(nbytes / (cp - 1) / tp * streams, partition, partition, same_node=same,
                             streams=streams).ms
            exposed = (cp - 1) * max(0.0, step - work / cp)
            if is_f:
                xf += exposed
            else:
                xb += exposed
    if partition is not None and ep > 1 and m.is_moe:
        et = tp if etp is None else etp
        frac = sum(m.moe_layers) / m.num_layers
        out = analytic.moe_alltoall_bytes(m, micro_batch_size=micro_batch_size, precision=job.precision, ep=ep) \
            / (tp * cp)
        streams = max(1, min(et * ep, tasks_per_node))
        same = tasks_per_node % (et * ep) == 0 or _in_domain(links.site, partition, tasks_per_node, et * ep)
        a2a = links.p2p(out * streams, partition, partition, same_node=same, streams=streams).ms * imbalance
        xf += 2.0 * a2a * frac
        xb += 2.0 * a2a * frac
    xf, xb = _host_floor_extras(job, tp=tp, cp=cp, ep=ep, layer_scale=layer_scale, layer_fwd_ms=layer_fwd_ms,
                                xf=xf, xb=xb, host_us=host_us)
    return StageExtras(layer_scale=layer_scale, ends_scale=1.0 / cp, act_scale=1.0 / cp, extra_fwd_ms=xf,
                       extra_bwd_ms=xb)


def _in_domain(site: Site, partition: str, tasks_per_node: int, group: int) -> bool:
    """Whether a group of ``group`` consecutive ranks stays inside one NVLink domain of several
    whole nodes (an NVL72 rack) when a node runs ``tasks_per_node`` ranks."""
    p = site.partition(partition)
    dom = p.domain_gpus
    return dom > p.gpus_per_node and tasks_per_node == p.gpus_per_node and dom % group == 0


def _host_floor_extras(job: TrainJob, *, tp: int, cp: int, ep: int, layer_scale: float, layer_fwd_ms: float,
                       xf: float, xb: float, host_us: float) -> tuple[float, float]:
    """The exposed per-layer forward/backward extras ``xf, xb`` raised so that the layer's
    forward (``layer_fwd_ms x layer_scale + xf``) and backward (twice the forward's layer part
    + ``xb``: :func:`memx_hpc.model.api.forward_fraction`) take at least the host time of a rank
    of its CP/EP group (:func:`memx_hpc.model.host.layer_host_ms_parallel`)."""
    m = job.model
    frac = sum(m.moe_layers) / m.num_layers if m.is_moe else 0.0
    local = m.num_experts // max(1, ep) if m.is_moe else 1
    hf, hb = layer_host_ms_parallel("none", tp, cp=cp, moe_share=frac, local_experts=local, ep=ep, us_per_op=host_us)
    dev_f = layer_fwd_ms * layer_scale
    dev_b = 2.0 * layer_fwd_ms * layer_scale
    return xf + max(0.0, hf - dev_f - xf), xb + max(0.0, hb - dev_b - xb)


def p2p_bytes(job: TrainJob, *, micro_batch_size: int, tp: int, sequence_parallel: bool) -> float:
    """One activation (or its gradient) sent between stages: ``s·b·h`` elements."""
    m = job.model
    n = m.seq_length * micro_batch_size * m.hidden_size * BYTES_PER_ELEMENT[job.precision]
    return n / tp if sequence_parallel and tp > 1 else float(n)


def transfer_ms(nbytes: float, gbps: float) -> float:
    """``nbytes`` at a flat ``gbps`` (GB/s): the site's figure where no link curve applies."""
    return nbytes / (gbps * 1e6)


def sync_ms_per_param(job: TrainJob, dp: int, gbps: float) -> float:
    """Milliseconds per parameter (per GPU) of the data-parallel gradient synchronisation."""
    if dp <= 1:
        return 0.0
    g = grad_bytes_per_param(job)
    if job.distributed_optimizer:
        per_param = (dp - 1) / dp * (g + BYTES_PER_ELEMENT[job.precision])  # reduce-scatter + all-gather
    else:
        per_param = 2.0 * (dp - 1) / dp * g  # ring all-reduce
    return per_param / (gbps * 1e6)


def tied_embedding_sync_ms(site: Site, job: TrainJob, tp: int, pp: int, first_partition: str | None,
                           last_partition: str | None) -> float:
    """The first/last-stage all-reduce of the shared word-embedding gradients (two ranks)."""
    if pp <= 1 or not job.model.tied_embeddings:
        return 0.0
    nbytes = analytic.embedding_params(job.model, tp) * grad_bytes_per_param(job)
    if first_partition and last_partition:
        gbps = site.link_gbps(first_partition, last_partition)
    else:
        gbps = site.inter_partition_gbps
    return transfer_ms(nbytes, gbps)  # 2 (n-1)/n with n = 2


def stage_layout(site: Site, placement: Placement) -> tuple[list[float], list[float]]:
    """Link bandwidths (GB/s) between consecutive stages and of each stage's DP group.

    A stage boundary inside a partition uses the intra-node link when every sending GPU's
    peer is on its node (the nodes of :class:`~memx_hpc.placement.Placement`, as the
    rendered job's components take them), the partition's network otherwise; across
    partitions the site's link. A DP group inside one node uses the intra-node link.
    """
    bounds, one_node = stage_links(placement, site)
    links = [site.intra_gbps(a) if same else site.link_gbps(a, b) for a, b, same in bounds]
    dps = [site.intra_gbps(name) if one else site.link_gbps(name, name)
           for name, one in zip(placement.stage_partitions, one_node)]
    return links, dps


def stage_links(placement: Placement, site: Site | None = None) -> tuple[list[tuple[str, str, bool]], list[bool]]:
    """Where each stage boundary and each DP group runs: ``(sender partition, receiver
    partition, same node)`` per boundary and ``one node`` per stage's DP group. With ``site``,
    a boundary whose ranks all send inside one NVLink domain of several nodes
    (``nvlink_domain_gpus``: an NVL72 rack) counts as inside a node: its sends run over NVLink."""
    names = placement.stage_partitions
    bounds = [(names[i], names[i + 1], placement.boundary_same_node(i)
               or (site is not None and _boundary_same_domain(placement, site, i))) for i in range(len(names) - 1)]
    return bounds, [placement.stage_on_one_node(i) for i in range(len(names))]


def _boundary_same_domain(placement: Placement, site: Site, stage: int) -> bool:
    a, b = placement.component_of_stage(stage), placement.component_of_stage(stage + 1)
    if a.partition != b.partition:
        return False
    p = site.partition(a.partition)
    per = p.domain_gpus // p.gpus_per_node  # nodes a domain holds
    if per <= 1:
        return False
    w = placement.ranks_per_stage
    first = stage * w
    return all(a.node_of(r) // per == b.node_of(r + w) // per for r in range(first, first + w))


def link_model_for(site: Site, cost_model: "CostModel | AssembledCostModel | None" = None,
                   links: "LinkModel | None" = None) -> "LinkModel":
    """The links to compose with: ``links`` if given, else an assembled cost model's
    (:class:`~memx_hpc.model.assembled.AssembledCostModel`: the store's measured and imported
    curves, the site's figures for the rest), for ``site`` (a part or a scaled copy of the
    site it was assembled for keeps its curves), else the site's figures alone."""
    from .links import LinkModel
    if links is not None:
        return links
    if not isinstance(cost_model, AssembledCostModel):
        return LinkModel(site)
    lm = cost_model.links
    return lm if lm.site is site else LinkModel(site, lm.curves)


def send_ms(links, job: TrainJob, *, micro_batch_size: int, tp: int, sequence_parallel: bool, a: str | None,
            b: str | None, same_node: bool, cp: int = 1) -> float:
    """One activation (or gradient) between two stages: every TP rank sends its copy
    (``s·b·h``, or its ``1/tp`` under sequence parallelism; ``1/cp`` of the sequence under
    context parallel), those of a node at once: on a measured or imported curve of the link
    where there is one, else NCCL's send (:func:`memx_hpc.model.collectives.send_ms`: per-message
    latency of the link kind, bytes at its peak fraction of the site's figure)."""
    msg = p2p_bytes(job, micro_batch_size=micro_batch_size, tp=tp, sequence_parallel=sequence_parallel) / cp
    if a is None or b is None:
        return transfer_ms(msg, links.site.inter_partition_gbps)
    scope = "cross" if a != b else ("intra" if same_node else "inter")
    if links.curve_backed(scope, (a, b) if a != b else (a,)):
        streams = min(tp * cp, links.site.partition(a).gpus_per_node)
        return links.p2p(msg * streams, a, b, same_node=same_node, streams=streams).ms
    # NCCL's send: base + one hop of latency of the link between the two stages' GPUs, the bytes
    # at its peak fraction; each GPU over its own NVLink or its share of the fabric
    from . import collectives as coll
    site = links.site
    if scope == "intra":
        return float(coll.send_ms(msg, gbytes_per_s=site.intra_gbps(a), link=intra_link_kind(site, a)))
    kinds = {inter_link_kind(site, a), inter_link_kind(site, b)}
    kind = max(kinds, key=lambda k: coll.LINK_KINDS[k].ring_hop_latency_us / coll.LINK_KINDS[k].peak_fraction)
    return float(coll.send_ms(msg, gbytes_per_s=site.link_gbps(a, b), link=kind))


def dp_sync_ms(links, job: TrainJob, *, dp: int, params: float, partitions: Sequence[str | None], one_node: bool,
               streams: int = 1) -> float:
    """The data-parallel gradient synchronisation of ``params`` parameters per GPU."""
    if dp <= 1 or params <= 0:
        return 0.0
    g = grad_bytes_per_param(job)
    parts = [p for p in partitions if p is not None]
    if len(parts) < len(partitions) or not parts:
        per_param = sync_ms_per_param(job, dp, links.site.inter_partition_gbps)
        return params * per_param
    streams = 1 if one_node else streams

    def ar(nbytes: float) -> float:
        return links.allreduce(nbytes, dp, parts, one_node=one_node, streams=streams).ms

    if job.distributed_optimizer:  # reduce-scatter of gradients + all-gather of parameters: half a ring each
        return 0.5 * ar(params * g) + 0.5 * ar(params * BYTES_PER_ELEMENT[job.precision])
    return ar(params * g)


def stage_sync_ms(links, job: TrainJob, *, dp: int, cp: int, tp: int, ep: int, etp: int | None, params: float,
                  expert_params: float, partition: str | None, one_node: bool, streams: int) -> float:
    """A stage's gradient synchronisation: the dense parameters over its ``dp x cp`` ranks
    (megatron-core's ``dp_cp`` group: CP ranks hold the same weights), the routed experts over
    the expert data-parallel ranks ``tp x cp x dp / (etp x ep)``."""
    et = tp if etp is None else etp
    out = dp_sync_ms(links, job, dp=dp * cp, params=params - expert_params, partitions=[partition],
                     one_node=one_node, streams=streams)
    if expert_params:
        out += dp_sync_ms(links, job, dp=max(1, tp * cp * dp // (et * ep)), params=expert_params,
                          partitions=[partition], one_node=one_node, streams=streams)
    return out


def tied_sync_ms(links, job: TrainJob, tp: int, pp: int, first: str | None, last: str | None) -> float:
    """The first/last-stage all-reduce of the shared word-embedding gradients (two ranks)."""
    if pp <= 1 or not job.model.tied_embeddings:
        return 0.0
    nbytes = analytic.embedding_params(job.model, tp) * grad_bytes_per_param(job)
    if first is None or last is None:
        return transfer_ms(nbytes, links.site.inter_partition_gbps)
    return links.allreduce(nbytes, 2, [first, last]).ms


def tp_internode_ms(links, job: TrainJob, *, partition: str | None, gpu_type: str, tp: int,
                    micro_batch_size: int) -> float:
    """Extra ms of ONE layer's forward TP collectives when its TP group spans NVLink domains.

    A TP group inside one domain (a node, or a GB200/GB300 NVL72 rack's 72 GPUs:
    ``nvlink_domain_gpus``) stays on NVLink: 0. A TP group over several domains runs its two
    all-reduces of the ``s·b·h`` activation per layer forward (or, under sequence parallelism,
    all-gather + reduce-scatter of the same volume) as NCCL does over the group's shape
    (:func:`group_collective_ms`: ring or tree, the domain's GPUs sharing the fabric, per-call
    latency), or on the partition's measured inter-node curve where there is one. The layer's
    cost model priced them over the GPU's intra-node link (its roofline's ``comm_ms``), so only
    the difference is added. A layer's forward + backward holds two such forwards' worth (three
    under full recompute), the embedding and the head half of one (one all-reduce each)."""
    if partition is None or tp <= links.site.partition(partition).domain_gpus:
        return 0.0
    nbytes = analytic.tp_allreduce_bytes(shape_of(job), micro_batch_size=micro_batch_size, precision=job.precision)
    inter = float(group_collective_ms(links, "allreduce", np.array([nbytes]), ranks=tp, partition=partition,
                                      one_node=False, stride=1)[0])
    intra = analytic.ring_allreduce_ms(nbytes, tp, links.site.gpu(gpu_type).link_gbps)
    return max(0.0, inter - intra)


#: TP-collective forwards per (layer under none/selective, layer under full, embedding, head)
TP_COLLECTIVE_UNITS = (2.0, 3.0, 0.5, 0.5)


# --------------------------------------------------------------------------- DP synchronisation by buckets
#
# A stage's gradient synchronisation as megatron-core's DDP runs it (:mod:`memx_hpc.model.collectives`,
# module notes "Megatron's gradient buckets"): the gradients in buckets (``max(40M, 1M x dp)``
# parameters on the first pipeline rank under ``--overlap-grad-reduce``; one bucket per model
# chunk elsewhere, one bucket in all without it), each reduced by its own collective (per-call
# latency included), then under the distributed optimizer the parameters all-gathered in the same
# buckets. The terms below describe the buckets of every layer count at once; the iteration's
# wait is :func:`exposed_dp_sync_ms` of them and the stage's forward/backward, one formula for the
# vectorised composition and for one plan.

#: the columns of a synchronisation's terms (the last axis of :func:`sync_terms`' rows)
SYNC_TERMS = ("grad_total", "grad_first", "grad_first_frac", "grad_last", "grad_prev", "grad_last_frac",
              "grad_hide", "gather_first", "gather_full", "gather_after", "gather_first_frac", "gather_full_frac",
              "gather_hide")
_T = {name: i for i, name in enumerate(SYNC_TERMS)}


def intra_link_kind(site: Site, partition: str) -> str:
    """The :data:`~memx_hpc.model.collectives.LINK_KINDS` key of a partition's link inside its
    NVLink/xGMI domain: xGMI on AMD GPUs, NVLink otherwise."""
    return "xgmi" if site.gpu_of(partition).vendor == "amd" else "nvlink"


def inter_link_kind(site: Site, partition: str) -> str:
    """The :data:`~memx_hpc.model.collectives.LINK_KINDS` key of the fabric between a partition's
    nodes: its ``fabric``'s, InfiniBand's where the site names none."""
    from ..spec.site import FABRICS
    fab = site.partition(partition).fabric
    return FABRICS[fab].link if fab else "ib"


def domain_gpus(site: Site, partition: str) -> int:
    """GPUs of one NVLink/xGMI domain of ``partition``: its ``nvlink_domain_gpus`` (72 on a
    GB200/GB300 NVL72 rack), else a node."""
    return int(site.partition(partition).domain_gpus)


def group_shape_of(site: Site, partition: str, *, ranks: int, stride: int, one_node: bool = False):
    """The :class:`~memx_hpc.model.collectives.GroupShape` of ``ranks`` GPUs of ``partition``
    whose global ranks are ``stride`` apart (ranks fill nodes, and nodes their NVLink domains, in
    order); ``one_node``: the placement keeps the whole group on one node."""
    from . import collectives as coll
    p = site.partition(partition)
    intra, inter = site.intra_gbps(partition), site.link_gbps(partition, partition)
    ik, nk = intra_link_kind(site, partition), inter_link_kind(site, partition)
    if one_node:
        return coll.GroupShape(ranks=ranks, ranks_per_domain=ranks, intra_gbytes_per_s=intra,
                               inter_gbytes_per_s=inter, intra_link=ik, inter_link=nk)
    return coll.group_shape(ranks=ranks, gpus_per_node=p.gpus_per_node, intra_gbytes_per_s=intra,
                            inter_gbytes_per_s=inter, stride=max(1, stride), domain_size=domain_gpus(site, partition),
                            intra_link=ik, inter_link=nk)


def group_collective_ms(links, collective: str, nbytes, *, ranks: int, partition: str, one_node: bool, stride: int,
                        streams: int = 1) -> np.ndarray:
    """One collective (``allreduce``, ``reduce_scatter``, ``all_gather``) of ``nbytes`` (an
    array) over ``ranks`` GPUs of ``partition``: on a link the site measured (or whose curves it
    imported) the link model's ring from that curve (reduce-scatter and all-gather half an
    all-reduce each); otherwise NCCL's cost model of the group's shape
    (:mod:`memx_hpc.model.collectives`: per-call and per-step latency, ring or tree, the
    hierarchical bus bandwidth of NVLink domains over the fabric)."""
    from . import collectives as coll
    x = np.asarray(nbytes, dtype=np.float64)
    if ranks <= 1:
        return np.zeros_like(x)
    scope = "intra" if one_node else "inter"
    if links.curve_backed(scope, (partition,)):
        flat = [links.allreduce(float(v), ranks, [partition], one_node=one_node, streams=streams).ms
                for v in x.ravel()]
        ar = np.asarray(flat, dtype=np.float64).reshape(x.shape)
        return ar if collective == "allreduce" else 0.5 * ar
    shape = group_shape_of(links.site, partition, ranks=ranks, stride=stride, one_node=one_node)
    return np.asarray(coll.collective_ms(collective, x, shape), dtype=np.float64).reshape(x.shape)


def bucket_terms(params, bucket_size, grad_ms, gather_ms, *, hide_grad: bool, hide_gather: bool) -> np.ndarray:
    """The :data:`SYNC_TERMS` of ``params`` (an array of parameter counts) cut into buckets of
    ``bucket_size`` parameters (None: one bucket; an array: per entry), the full buckets reduced
    first (the model's end) and the remainder last, as ``_compute_default_per_buffer_param_layout``
    fills them; ``grad_ms(params)`` / ``gather_ms(params)``: one bucket's reduction / parameter
    all-gather (0: none). ``hide_*``: the overlap option that lets the compute hide them."""
    P = np.asarray(params, dtype=np.float64)
    if bucket_size is None:
        size = np.maximum(P, 1.0)
    else:
        size = np.maximum(np.broadcast_to(np.asarray(bucket_size, dtype=np.float64), P.shape), 1.0)
    nfull = np.where(P > size * (1 + 1e-9), np.floor(P / size + 1e-9), 0.0)
    rest = np.maximum(0.0, P - nfull * size)
    has_rest = rest > 1e-6 * np.maximum(P, 1.0)
    full_p = np.where(nfull > 0, size, 0.0)
    g_full, g_rest = grad_ms(full_p), np.where(has_rest, grad_ms(np.where(has_rest, rest, 0.0)), 0.0)
    a_full, a_rest = gather_ms(full_p), np.where(has_rest, gather_ms(np.where(has_rest, rest, 0.0)), 0.0)
    nb = nfull + has_rest
    safe = np.maximum(P, 1.0)
    out = np.zeros(P.shape + (len(SYNC_TERMS),), dtype=np.float64)
    out[..., _T["grad_total"]] = nfull * g_full + g_rest
    out[..., _T["grad_first"]] = np.where(nfull > 0, g_full, g_rest)
    out[..., _T["grad_first_frac"]] = np.where(nfull > 0, full_p / safe, 1.0)
    out[..., _T["grad_last"]] = np.where(has_rest, g_rest, g_full)
    out[..., _T["grad_prev"]] = np.where(nb >= 2, g_full, 0.0)
    out[..., _T["grad_last_frac"]] = np.where(nb >= 2, np.where(has_rest, rest, full_p) / safe, 1.0)
    out[..., _T["grad_hide"]] = float(hide_grad)
    # the all-gather runs in forward order: the remainder (the model's start) first
    out[..., _T["gather_first"]] = np.where(has_rest, a_rest, a_full)
    out[..., _T["gather_full"]] = a_full
    out[..., _T["gather_after"]] = np.maximum(nb - 1, 0)
    out[..., _T["gather_first_frac"]] = np.where(has_rest, rest, full_p) / safe
    out[..., _T["gather_full_frac"]] = full_p / safe
    out[..., _T["gather_hide"]] = float(hide_gather)
    out[P <= 0] = 0.0
    return out


def one_bucket_terms(total_ms) -> np.ndarray:
    """:data:`SYNC_TERMS` of a synchronisation of ``total_ms`` run as one call, not hidden."""
    t = np.asarray(total_ms, dtype=np.float64)
    out = np.zeros(t.shape + (len(SYNC_TERMS),), dtype=np.float64)
    out[..., _T["grad_total"]] = out[..., _T["grad_first"]] = out[..., _T["grad_last"]] = t
    out[..., _T["grad_first_frac"]] = out[..., _T["grad_last_frac"]] = 1.0
    return out


def exposed_dp_sync_ms(terms, forward, backward):
    """The synchronisation the iteration waits for, from :data:`SYNC_TERMS` (last axis; any
    axes before it summed over where ``terms`` has one more than ``forward``) and the stage's
    forward / backward ms per micro-batch (floats or arrays).

    Gradients (:func:`memx_hpc.model.collectives.exposed_grad_sync_ms` for full buckets and a
    remainder): buckets reduce one at a time as the last backward fills them, so the wait after it
    is ``max(last, total - backward x (1 - first's share), previous + last - backward x last's
    share)``; without ``--overlap-grad-reduce`` (or with one bucket) the whole reduction. Parameters
    (:func:`memx_hpc.model.collectives.exposed_param_gather_ms`, not aligned): the first bucket's
    gather, then each next one less the forward of the bucket before it; without
    ``--overlap-param-gather`` all of them."""
    t = np.asarray(terms, dtype=np.float64)
    f = np.asarray(forward, dtype=np.float64)
    b = np.asarray(backward, dtype=np.float64)
    extra = t.ndim - 1 - f.ndim
    for _ in range(extra):
        f, b = f[..., None], b[..., None]

    def c(name):
        return t[..., _T[name]]

    hb = c("grad_hide") * b
    grad = np.maximum(c("grad_last"), np.maximum(c("grad_total") - hb * (1.0 - c("grad_first_frac")),
                                                 c("grad_prev") + c("grad_last") - hb * c("grad_last_frac")))
    hf = c("gather_hide") * f
    after = c("gather_after")
    gather = (c("gather_first") + np.minimum(after, 1.0) * np.maximum(0.0, c("gather_full") - hf * c("gather_first_frac"))
              + np.maximum(after - 1.0, 0.0) * np.maximum(0.0, c("gather_full") - hf * c("gather_full_frac")))
    out = np.maximum(0.0, grad) + gather
    for _ in range(extra):
        out = out.sum(axis=-1)
    return out


def stage_sync_terms(links, job: TrainJob, *, params, expert_params, dp: int, cp: int, tp: int, ep: int,
                     etp: int | None, partition: str | None, one_node: bool, streams: int, first_stage: bool,
                     virtual_stages: int, overlap_grad_reduce: bool, overlap_param_gather: bool,
                     ddp_bucket_size: int | None = None, bucketing: str = "megatron") -> np.ndarray:
    """A stage's synchronisation terms for every entry of ``params`` / ``expert_params`` (arrays
    of its dense and routed-expert parameter counts per GPU): shape ``params.shape + (2,
    len(SYNC_TERMS))``, the dense parameters over the ``dp x cp`` ranks (stride TP) and the
    experts over the expert data-parallel ranks ``tp x cp x dp / (etp x ep)`` (stride ``etp x
    ep``). Gradients in the reduce dtype (:func:`grad_bytes_per_param`); under the distributed
    optimizer reduce-scatter then parameter all-gather, else all-reduce. Bucketing as
    megatron-core's DDP under ``--overlap-grad-reduce``: ``ddp_bucket_size`` parameters (the
    plan's ``--ddp-bucket-size``; None: ``max(40M, 1M x dp)``) on the first pipeline rank, one
    bucket per model chunk on the others, one bucket without it. ``bucketing="every_stage"``:
    PyTorch DDP's rule instead (every rank cuts its gradients into ``ddp_bucket_size`` buckets)."""
    from . import collectives as coll
    dense = np.asarray(params, dtype=np.float64) - np.asarray(expert_params, dtype=np.float64)
    experts = np.broadcast_to(np.asarray(expert_params, dtype=np.float64), dense.shape)
    g = grad_bytes_per_param(job)
    pb = BYTES_PER_ELEMENT[job.precision]
    et = tp if etp is None else etp
    groups = ((dense, dp * cp, tp), (experts, max(1, tp * cp * dp // (et * ep)), et * ep))
    out = np.zeros(dense.shape + (2, len(SYNC_TERMS)), dtype=np.float64)
    for j, (P, ranks, stride) in enumerate(groups):
        if ranks <= 1 or not np.any(P > 0):
            continue
        if partition is None:
            total = P * sync_ms_per_param(job, ranks, links.site.inter_partition_gbps)
            out[..., j, :] = one_bucket_terms(total)
            continue
        dist = job.distributed_optimizer

        def grad_ms(x, ranks=ranks, stride=stride):
            return group_collective_ms(links, "reduce_scatter" if dist else "allreduce", x * g, ranks=ranks,
                                       partition=partition, one_node=one_node, stride=stride, streams=streams)

        def gather_ms(x, ranks=ranks, stride=stride):
            if not dist:
                return np.zeros_like(np.asarray(x, dtype=np.float64))
            return group_collective_ms(links, "all_gather", x * pb, ranks=ranks, partition=partition,
                                       one_node=one_node, stride=stride, streams=streams)

        if not overlap_grad_reduce:
            size = None
        elif first_stage or bucketing == "every_stage":
            size = coll.default_bucket_size_params(ranks, overlap_grad_reduce=True, ddp_bucket_size=ddp_bucket_size)
        elif virtual_stages > 1:
            size = P / virtual_stages  # one bucket per model chunk
        else:
            size = None
        out[..., j, :] = bucket_terms(P, size, grad_ms, gather_ms, hide_grad=overlap_grad_reduce,
                                      hide_gather=overlap_param_gather and dist)
    return out
