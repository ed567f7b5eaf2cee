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
  of parameters, half a ring each (Rajbhandari et al. 2020, ZeRO §5); under
  ``--overlap-grad-reduce`` only what the last backward does not hide shows. Tied
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
           "exposed_sync_ms"]

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
        same = tasks_per_node % (tp * cp) == 0
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
        same = tasks_per_node % (et * ep) == 0
        a2a = links.p2p(out * streams, partition, partition, same_node=same, streams=streams).ms * imbalance
        xf += 2.0 * a2a * frac
        xb += 2.0 * a2a * frac
    xf, xb = _host_floor_extras(job, tp=tp, cp=cp, ep=ep, layer_scale=layer_scale, layer_fwd_ms=layer_fwd_ms,
                                xf=xf, xb=xb, host_us=host_us)
    return StageExtras(layer_scale=layer_scale, ends_scale=1.0 / cp, act_scale=1.0 / cp, extra_fwd_ms=xf,
                       extra_bwd_ms=xb)


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
    bounds, one_node = stage_links(placement)
    links = [site.intra_gbps(a) if same else site.link_gbps(a, b) for a, b, same in bounds]
    dps = [site.intra_gbps(name) if one else site.link_gbps(name, name)
           for name, one in zip(placement.stage_partitions, one_node)]
    return links, dps


def stage_links(placement: Placement) -> tuple[list[tuple[str, str, bool]], list[bool]]:
    """Where each stage boundary and each DP group runs: ``(sender partition, receiver
    partition, same node)`` per boundary and ``one node`` per stage's DP group."""
    names = placement.stage_partitions
    bounds = [(names[i], names[i + 1], placement.boundary_same_node(i)) for i in range(len(names) - 1)]
    return bounds, [placement.stage_on_one_node(i) for i in range(len(names))]


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
    context parallel), those of a node at once."""
    msg = p2p_bytes(job, micro_batch_size=micro_batch_size, tp=tp, sequence_parallel=sequence_parallel) / cp
    if a is None or b is None:
        return transfer_ms(msg, links.site.inter_partition_gbps)
    streams = min(tp * cp, links.site.partition(a).gpus_per_node)
    return links.p2p(msg * streams, a, b, same_node=same_node, streams=streams).ms


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
    """Extra ms of ONE layer's forward TP collectives when its TP group spans nodes.

    A TP group of whole nodes (:func:`memx_hpc.placement.tp_spans_nodes`) runs its two
    all-reduces of the ``s·b·h`` activation per layer forward (or, under sequence
    parallelism, all-gather + reduce-scatter of the same volume) as a ring whose slowest hop
    is the inter-node link: priced on the partition's inter-node curve
    (:meth:`memx_hpc.model.links.LinkModel.allreduce`). The layer's cost model priced them
    over the GPU's intra-node link (its roofline's ``comm_ms``, what measured TP groups inside
    a node ran), so only the difference is added. A layer's forward + backward holds two such
    forwards' worth (three under full recompute), the embedding and the head half of one
    (one all-reduce each). 0 where the group stays inside a node."""
    if partition is None or tp <= links.site.partition(partition).gpus_per_node:
        return 0.0
    nbytes = analytic.tp_allreduce_bytes(shape_of(job), micro_batch_size=micro_batch_size, precision=job.precision)
    inter = links.allreduce(nbytes, tp, [partition], one_node=False).ms
    intra = analytic.ring_allreduce_ms(nbytes, tp, links.site.gpu(gpu_type).link_gbps)
    return max(0.0, inter - intra)


#: TP-collective forwards per (layer under none/selective, layer under full, embedding, head)
TP_COLLECTIVE_UNITS = (2.0, 3.0, 0.5, 0.5)


def exposed_sync_ms(sync, backward, *, overlap_grad_reduce: bool):
    """The gradient synchronisation the iteration waits for: all of it, or under
    ``--overlap-grad-reduce`` (:class:`~memx_hpc.model.compose.CostOptions`) what the stage's
    last backward does not hide."""
    return np.maximum(0.0, sync - backward) if overlap_grad_reduce else sync
