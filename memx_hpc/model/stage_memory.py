"""Memory of one stage of a plan: what one GPU of it holds at its peak.

Per stage ``i`` (``n_i`` layers, ``k_i`` of them under full recompute), from the cost model's
per-layer activation answers ``a`` (bytes kept per in-flight micro-batch):

* activations ``A_i = k_i a_full + (n_i - k_i) a_base`` (+ embedding / head), held for
  ``min(p - i, m)`` in-flight micro-batches under 1F1B (Narayanan et al. 2021, §2.2: stage i
  runs ``p - i - 1`` warm-up forwards before its first backward; interleaving holds more
  chunks, but the last stage's output layer and loss for one micro-batch only, since its last
  chunk's backward follows its forward), plus a transient: when a stage recomputes, one
  layer's full activations rebuilt during its backward, on the last stage the logits the loss
  holds;
* what the job does not keep taken out of the answers (hidden-dropout masks at dropout 0);
* weights, gradients and optimizer states from :mod:`memx_hpc.model.analytic`
  (``stage_params`` -> ``state_bytes``), the distributed optimizer sharding them over the
  ranks that reduce them, FP8 weights on top;
* the allocator peak ``A`` (state ``S`` + held activations) as the device reports it,
  ``S + a·(A - S) + b`` -- the allocator's slack on the activations, not on the state
  allocated once at start-up (:mod:`memx_hpc.model.memory`, the device-memory model fitted on end-to-end runs: kept
  apart from this module because it knows devices and runs, not Megatron's layout), and
  whether it fits under the capacity less the site's safety margin.

The formulas work on floats and numpy arrays alike: the vectorised
:class:`~memx_hpc.model.compose.Composer` and the one-plan path both call them.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..spec import BYTES_PER_ELEMENT, GpuType, Site, TrainJob, fp8_gemm_takes_non_tn_layouts
from . import analytic
from .api import LayerQuery
from .queries import shape_of
from .schedule import in_flight_chunks, in_flight_last_chunk

__all__ = ["dropout_mask_bytes", "activations_as_run", "stage_state", "dense_stage_state", "fp8_param_gather_active", "fp8_state_bytes",
           "in_flight", "in_flight_units", "in_flight_heads", "stage_activation_bytes", "logits_transient_bytes",
           "held_activation_bytes", "stage_peak_bytes", "memory_limit", "fits"]


def dropout_mask_bytes(job: TrainJob, q: LayerQuery) -> float:
    """The hidden-dropout masks (1 byte per element) the cost model's activation answer for
    ``q`` holds and ``job`` does not keep: ``2·s·b·h`` per layer (after attention and after the
    MLP; none under full recompute, whose layer keeps its input alone), ``s·b·h`` on the
    embedding (Korthikanti et al. 2022, §4.1 and 4.3; divided by TP under sequence
    parallelism), when the model's ``hidden_dropout`` is 0 -- torch's dropout keeps no mask at
    p = 0 (torch/_decomp/decompositions.py ``dropout``). Profiles and the analytic formula
    are taken at Megatron-LM's default dropout (0.1), which keeps them."""
    if job.model.hidden_dropout > 0 or q.kind == "head" or (q.kind == "layer" and q.recompute == "full"):
        return 0.0
    sbh = float(q.shape.seq_length * q.micro_batch_size * q.shape.hidden_size)
    masks = 2.0 if q.kind == "layer" else 1.0
    return masks * sbh / (q.tp if q.sequence_parallel else 1)


def activations_as_run(job: TrainJob, queries: Sequence[LayerQuery], values) -> np.ndarray:
    """``values`` (time, activation bytes per query) with what the job does not keep taken
    out of the activations (:func:`dropout_mask_bytes`), never below zero."""
    out = np.array(values, dtype=np.float64).reshape(len(queries), 2)
    if job.model.hidden_dropout > 0:
        return out
    masks = np.array([dropout_mask_bytes(job, q) for q in queries])
    out[:, 1] = np.maximum(out[:, 1] - masks, 0.0)
    return out


def stage_state(job: TrainJob, n: int, *, first: bool, last: bool, tp: int, pp: int, dp: int, cp: int = 1,
                ep: int = 1, etp: int | None = None, gpu: GpuType | None = None) -> tuple[int, int, int]:
    """``(parameters, routed-expert parameters, state bytes)`` of one rank of a stage of ``n``
    layers: weights, gradients and optimizer states with the distributed optimizer sharding
    the dense parameters over the ``dp x cp`` ranks that reduce their gradients and the
    routed experts over the expert data-parallel ``tp x cp x dp / (etp x ep)`` ranks
    (megatron-core's ``dp_cp`` and ``edp`` groups). ``gpu``: the stage's GPU type, whose
    compute capability decides whether FP8 weights keep a transpose (:func:`fp8_state_bytes`;
    None: they do)."""
    from ..params import expert_params

    params = analytic.stage_params(job.model, n, first=first, last=last, tp=tp, pp=pp, ep=ep, etp=etp)
    et = tp if etp is None else etp
    start = analytic.stage_first_layer(job.model, n, first=first, last=last)
    experts = expert_params(job.model, start, n, ep=ep, etp=et) if job.model.is_moe and n else 0
    kw = dict(precision=job.precision, optimizer=job.optimizer, distributed_optimizer=job.distributed_optimizer,
              grad_reduce_in_fp32=job.grad_reduce_in_fp32)
    state = analytic.state_bytes(params - experts, dp=dp * cp, **kw)
    if experts:
        state += analytic.state_bytes(experts, dp=max(1, tp * cp * dp // (et * ep)), **kw)
    if job.fp8:  # the FP8 weights of the stage's layers (not of its embedding / head)
        base = analytic.stage_params(job.model, 0, first=first, last=last, tp=tp, pp=pp, ep=ep, etp=etp)
        state += float(fp8_state_bytes(job, params - base, gpu=gpu))
    return params, experts, state


def dense_stage_state(job: TrainJob, n: int, *, first: bool, last: bool, tp: int, pp: int,
                      dp: int, gpu: GpuType | None = None) -> tuple[int, int, float]:
    """``(parameters, 0, state bytes)`` of one rank of a stage of ``n`` layers by the dense
    rule (every parameter sharded over the ``dp`` ranks that reduce it; no routed-expert
    groups): what a general plan's replica holds, whose stages have their own TP and DP.
    ``gpu`` as :func:`stage_state`."""
    params = analytic.stage_params(job.model, n, first=first, last=last, tp=tp, pp=pp)
    state = analytic.state_bytes(params, precision=job.precision, optimizer=job.optimizer,
                                 distributed_optimizer=job.distributed_optimizer, dp=dp,
                                 grad_reduce_in_fp32=job.grad_reduce_in_fp32)
    if job.fp8:
        state += float(fp8_state_bytes(job, params - analytic.stage_params(
            job.model, 0, first=first, last=last, tp=tp, pp=pp), gpu=gpu))
    return params, 0, state


def fp8_param_gather_active(job: TrainJob) -> bool:
    """Whether the layers' weights are FP8 tensors (``--fp8-param-gather``; Megatron-LM
    accepts it with the distributed optimizer only, megatron/training/arguments.py)."""
    return bool(job.fp8 and job.fp8_param_gather and job.distributed_optimizer)


def fp8_state_bytes(job: TrainJob, layer_params, *, gpu: GpuType | None = None):
    """What FP8 adds to :func:`memx_hpc.model.analytic.state_bytes` for ``layer_params``
    parameters of a stage's layers (array or float; 0 without FP8): Transformer Engine's FP8
    weight and, where the GPU's FP8 GEMMs need TN layouts, its transpose
    (:func:`memx_hpc.model.analytic.fp8_weight_bytes`; ``gpu`` None: the transpose is
    counted), less the 16-bit weight ``state_bytes`` counts when the FP8 tensor is the weight
    (``--fp8-param-gather``: megatron-core distributed_data_parallel.py gives a Float8Tensor a
    uint8 parameter buffer, and an MXFP8 one shares the gradient buffer for its all-gather,
    param_and_grad_buffer.py). On a GPU without the transpose an FP8 weight is then one byte
    below the 16-bit one, so the term is negative."""
    if not job.fp8:
        return 0.0 * layer_params
    per = analytic.fp8_weight_bytes(1.0, job.fp8_recipe,
                                    non_tn_gemm=gpu is not None and fp8_gemm_takes_non_tn_layouts(gpu))
    if fp8_param_gather_active(job):
        per -= BYTES_PER_ELEMENT[job.precision]
    return per * layer_params


def in_flight(pp, stage, num_microbatches):
    """Micro-batches whose activations a 1F1B stage holds at once (Narayanan et al. 2021, §2.2)."""
    return np.minimum(pp - stage, num_microbatches)


def in_flight_units(pp, stage, num_microbatches, virtual_stages=1, group=None):
    """A stage's in-flight activations in units of one micro-batch through all its layers:
    ``min(p - i, m)`` under 1F1B; with ``v`` chunks, :func:`memx_hpc.model.schedule.in_flight_chunks`
    chunks of ``1/v`` of the layers each (interleaving's warm-up holds more: ``2(p - i - 1) +
    (v - 1)·G + 1`` chunks, ``G`` the micro-batches each chunk runs in a row, ``group``:
    the plan's ``microbatch_group_size_per_vp_stage``, None for megatron-core's default ``p``)."""
    if virtual_stages == 1:
        return in_flight(pp, stage, num_microbatches)
    g = None if group is None else int(group)
    return in_flight_chunks(int(stage), int(pp), int(num_microbatches), int(virtual_stages), g) / virtual_stages


def in_flight_heads(pp, stage, num_microbatches, virtual_stages=1, group=None):
    """Micro-batches whose output-layer and loss activations the last stage holds at once:
    one under 1F1B, and under interleaving too (the last chunk's backward follows its
    forward; :func:`memx_hpc.model.schedule.in_flight_last_chunk`), not the in-flight
    units of its earlier chunks; ``m`` when every forward is in the warm-up. ``group`` as
    :func:`in_flight_units`."""
    if virtual_stages == 1:
        return in_flight(pp, stage, num_microbatches)
    g = None if group is None else int(group)
    return in_flight_last_chunk(int(stage), int(pp), int(num_microbatches), int(virtual_stages), g)


def stage_activation_bytes(k, nb, a_full, a_base, a_none, first, last, a_emb, a_head, logits=0.0):
    """(activation bytes kept per in-flight micro-batch, the transient on top of them: the
    larger of a recomputing stage's one layer of full activations rebuilt during its
    backward and, on the last stage, the logits the loss holds beside their fp32 copy
    (``logits``: :func:`~memx_hpc.model.analytic.head_logits_transient_bytes`); the two are
    never live at once -- the loss runs before the layers' backward)."""
    act = k * a_full + nb * a_base + first * a_emb + last * a_head
    transient = np.maximum(np.where(k > 0, a_none - a_full, 0.0), last * logits)
    return act, transient


def logits_transient_bytes(job: TrainJob, tp: int, micro_batch_size: int) -> float:
    """:func:`~memx_hpc.model.analytic.head_logits_transient_bytes` of ``job``'s model."""
    return float(analytic.head_logits_transient_bytes(shape_of(job), micro_batch_size=micro_batch_size, tp=tp,
                                                      precision=job.precision))


def held_activation_bytes(inflight, act, transient, head=0.0, heads=1.0):
    """Activation bytes a stage holds at its peak: ``inflight`` units of ``act`` plus the
    transient, where ``head`` (the part of ``act`` that is the last stage's output layer and
    loss) is held for ``heads`` micro-batches (:func:`in_flight_heads`) instead."""
    return inflight * (act - head) + heads * head + transient


def stage_peak_bytes(state, inflight, act, transient, scale, overhead, head=0.0, heads=1.0):
    """What the device reports: the state at its size, ``a`` times the activations
    :func:`held_activation_bytes` counts, and ``b`` (``S + a·(A - S) + b`` of the allocator
    peak ``A``: :func:`memx_hpc.model.memory.device_peak`). The state -- weights, the
    contiguous gradient buffer, the distributed optimizer's flat shards, FP8 weight copies --
    is allocated once in exact-size blocks; the caching allocator's slack ``a`` is that of
    the short-lived activation blocks."""
    return state + scale * held_activation_bytes(inflight, act, transient, head, heads) + overhead



def memory_limit(site: Site) -> float:
    """The fraction of a GPU's capacity a plan may use: 1 less the site's safety margin."""
    return 1.0 - site.memory_safety_margin


def fits(peak, capacity, site: Site):
    """Whether a peak stays under the capacity less the site's safety margin."""
    return peak <= capacity * memory_limit(site)
