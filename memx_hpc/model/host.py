"""The host-dispatch floor of a transformer layer.

Megatron-LM runs eagerly: every operator of a layer is dispatched by the host (Python
module code, the PyTorch dispatcher, autograd bookkeeping, then the CUDA/HIP launch)
before the device can run it. When the device work of a layer is small, the device
waits for the host and the layer takes the host's time, whatever its shape: tensor
parallelism and smaller micro-batches then stop paying off, while pipeline stages (one
process each) split the host work and data parallelism cuts the micro-batches per rank.

A layer's time is therefore ``max(device time, host time)`` with ``host time = operators
dispatched x host cost per operator``. The counts are those of Megatron's GPT layer
(``ParallelTransformerLayer`` / the local ``TransformerLayer`` spec, unfused core
attention):

* forward: two layer norms, the QKV, projection, FC1 and FC2 GEMMs, the attention core
  (``baddbmm``, masked softmax, dropout under the RNG tracker, ``bmm``) with the views,
  transposes and copies around it, bias-GeLU and two bias-dropout-adds -- about 40
  operators (:data:`FORWARD_OPS`), plus two tensor-parallel all-reduces when ``tp > 1``;
* backward: autograd runs about two operators per forward one (each GEMM has two
  gradient GEMMs, each element-wise op its own backward kernel and gradient
  accumulation) -- :data:`BACKWARD_OPS`, and the two all-reduces of the input gradients;
* full recompute (activation checkpointing) runs the forward a second time inside the
  backward; selective recompute repeats only the attention core, a few operators.

The cost per operator is a prior: a bare CUDA kernel launch costs the host a few
microseconds, and PyTorch's eager dispatcher, autograd bookkeeping and the Python module
code around each operator add more (He, "Making Deep Learning Go Brrrr From First
Principles", 2022, on overhead-bound execution: with small operators the time goes to
Python and the framework, not to the GPU) -- :data:`HOST_US_PER_OP`, 20 us, i.e. 3.2 ms for a
fully recomputed layer. Megatron-DeepSpeed layers on A100 (vTrain's published runs, the
development split of benchmarks/end_to_end.py) never take less than 3.3-3.6 ms per
micro-batch whatever their shape. A cost model that carries ``host_us_per_op`` (a value
measured on the site: a tiny layer's time is pure host) overrides the prior.
"""

from __future__ import annotations

import numpy as np

#: Operators one GPT layer's forward dispatches (Megatron, unfused core attention).
FORWARD_OPS = 40
#: Operators its backward dispatches (autograd: about two per forward operator).
BACKWARD_OPS = 80
#: Extra operators of selective recompute (the attention core again).
SELECTIVE_OPS = 8
#: Tensor-parallel all-reduces per layer: forward (attention output, MLP output), and the
#: two of the input gradients in the backward.
TP_COLLECTIVES_FORWARD = 2
TP_COLLECTIVES_BACKWARD = 2
#: Sequence parallelism (Megatron's ``--sequence-parallel``) replaces each all-reduce by an
#: all-gather before the block and a reduce-scatter after it: four collectives forward; the
#: backward mirrors them and all-gathers each block's input again for its weight gradient.
SP_COLLECTIVES_FORWARD = 4
SP_COLLECTIVES_BACKWARD = 6
#: A gated MLP (SwiGLU: Megatron's ``--swiglu``) splits FC1's output, applies the activation
#: to one half and multiplies by the other: two operators beyond GeLU's one forward, and
#: autograd's two per forward one backward.
GATED_EXTRA_FORWARD = 2
GATED_EXTRA_BACKWARD = 4
#: Host cost of one eager operator (us): see the module docstring.
HOST_US_PER_OP = 20.0


def layer_ops(recompute: str, tp: int, *, sequence_parallel: bool = False, gated: bool = False) -> int:
    """Operators the host dispatches for one layer's forward+backward of one micro-batch:
    :data:`FORWARD_OPS` and :data:`BACKWARD_OPS`, the TP collectives (all-reduces, or the
    all-gathers and reduce-scatters of sequence parallelism), a gated MLP's extra operators,
    and the forward again under full recompute (a few under selective)."""
    sp = sequence_parallel and tp > 1
    comm_f = (SP_COLLECTIVES_FORWARD if sp else TP_COLLECTIVES_FORWARD) if tp > 1 else 0
    comm_b = (SP_COLLECTIVES_BACKWARD if sp else TP_COLLECTIVES_BACKWARD) if tp > 1 else 0
    fwd = FORWARD_OPS + (GATED_EXTRA_FORWARD if gated else 0)
    ops = fwd + comm_f + BACKWARD_OPS + (GATED_EXTRA_BACKWARD if gated else 0) + comm_b
    if recompute == "full":
        ops += fwd + comm_f
    elif recompute == "selective":
        ops += SELECTIVE_OPS
    return ops


def layer_host_ms(recompute: str, tp: int, us_per_op: float = HOST_US_PER_OP, *, sequence_parallel: bool = False,
                  gated: bool = False) -> float:
    """The host time of one layer's forward+backward of one micro-batch (ms)."""
    return layer_ops(recompute, tp, sequence_parallel=sequence_parallel, gated=gated) * us_per_op * 1e-3


def query_host_ms(q, us_per_op: float = HOST_US_PER_OP) -> float:
    """:func:`layer_host_ms` of a layer query (its recompute, TP, sequence parallelism and
    activation: a gated one dispatches more); 0 for the embedding and head."""
    if q.kind != "layer":
        return 0.0
    gated = getattr(getattr(q, "shape", None), "activation", "gelu") in GATED_ACTIVATIONS
    return layer_host_ms(q.recompute, q.tp, us_per_op, sequence_parallel=bool(getattr(q, "sequence_parallel", False)),
                         gated=gated)


#: Activations of a gated MLP (:class:`memx_hpc.spec.LayerShape`'s ``activation``).
GATED_ACTIVATIONS = ("swiglu",)


def host_us_per_op(cost_model) -> float:
    """The cost model's measured host cost per operator, else the prior."""
    v = getattr(cost_model, "host_us_per_op", None)
    return float(v) if isinstance(v, (int, float)) and v > 0 else HOST_US_PER_OP


def host_bound(queries, values, us_per_op: float = HOST_US_PER_OP) -> np.ndarray:
    """``values`` (rows of (ms, bytes) per query) with each layer's time raised to its host
    floor: ``max(device, host)``. Embedding and head rows are left as they are."""
    out = np.array(values, dtype=np.float64, copy=True).reshape(len(queries), 2)
    for i, q in enumerate(queries):
        if q.kind == "layer":
            out[i, 0] = max(out[i, 0], query_host_ms(q, us_per_op))
    return out


# --------------------------------------------------------------------------- context and expert parallel
#
# What context and expert parallel add to a layer's host work. The cost model prices a layer
# at CP 1 and EP 1 (one sample per shape), and the composition divides that time by ``cp``;
# the ranks of a CP or EP group each still dispatch every operator of the layer, and more:
#
# * ring attention (Transformer Engine's ``AttnFuncWithCPAndKVP2P``, Megatron's
#   ``--context-parallel-size``): the forward runs ``cp`` steps, each posting the K/V send and
#   receive to the ring neighbours and waiting for them, selecting the step's Q/K/V chunks,
#   one attention kernel and the running correction of the output and its log-sum-exp;
#   around the loop the split into ``2 cp`` chunks and the final correction. The backward
#   repeats the loop with the gradients of K/V travelling too.
# * an MoE layer (Megatron's ``MoELayer``, the all-to-all token dispatcher): the router (gate
#   GEMM, score function, top-k, auxiliary/z losses), the permutation of the tokens by expert
#   and its inverse (counts, sort, gather, scatter-add with the probabilities), under EP the
#   token all-to-alls (dispatch, combine), the exchange of the per-expert counts (a device to
#   host copy) and the sort of the received chunks by local expert; then each local expert's
#   FC1, activation and FC2 in place of the dense MLP's three.
#
# Backward: autograd dispatches about two operators per forward one (as BACKWARD_OPS).

#: Ring attention, forward: operators per ring step and around the loop.
CP_OPS_PER_STEP_FORWARD = 11
CP_OPS_SETUP_FORWARD = 8
#: Ring attention, backward: per step (the K/V and their gradients travel) and around the loop.
CP_OPS_PER_STEP_BACKWARD = 13
CP_OPS_SETUP_BACKWARD = 8
#: An MoE layer's forward: router, permutation and its inverse, the EP exchange.
MOE_ROUTER_OPS = 10
MOE_PERMUTE_OPS = 12
MOE_EP_EXCHANGE_OPS = 6
#: Operators of one expert's MLP (FC1, activation, FC2), as many as the dense MLP it replaces.
MLP_OPS = 3


def parallel_host_ops(*, cp: int, moe: bool, local_experts: int, ep: int) -> tuple[int, int]:
    """Operators (forward, backward) one rank dispatches per layer and micro-batch beyond a
    dense layer's (:data:`FORWARD_OPS`, :data:`BACKWARD_OPS`): ring attention over ``cp``
    ranks, an MoE layer with ``local_experts`` experts on the rank (EP ``ep``)."""
    fwd = bwd = 0
    if cp > 1:
        fwd += CP_OPS_SETUP_FORWARD + cp * CP_OPS_PER_STEP_FORWARD
        bwd += CP_OPS_SETUP_BACKWARD + cp * CP_OPS_PER_STEP_BACKWARD
    if moe:
        f = MOE_ROUTER_OPS + MOE_PERMUTE_OPS + (MOE_EP_EXCHANGE_OPS if ep > 1 else 0) \
            + MLP_OPS * (max(1, local_experts) - 1)
        fwd += f
        bwd += 2 * f
    return fwd, bwd


def layer_host_ms_parallel(recompute: str, tp: int, *, cp: int, moe_share: float, local_experts: int, ep: int,
                           us_per_op: float = HOST_US_PER_OP) -> tuple[float, float]:
    """The host time (forward, backward ms) of one layer and micro-batch on a rank of a CP/EP
    group: the dense layer's operators (:func:`layer_ops`, forward share as FORWARD_OPS) plus
    :func:`parallel_host_ops`, the MoE part weighted by ``moe_share`` (the model's share of MoE
    layers)."""
    total = layer_ops(recompute, tp)
    comm_f = TP_COLLECTIVES_FORWARD if tp > 1 else 0
    dense_f = FORWARD_OPS + comm_f
    cf, cb = parallel_host_ops(cp=cp, moe=False, local_experts=1, ep=ep)
    mf, mb = parallel_host_ops(cp=1, moe=moe_share > 0, local_experts=local_experts, ep=ep)
    f = dense_f + cf + moe_share * mf
    b = total - dense_f + cb + moe_share * mb
    return f * us_per_op * 1e-3, b * us_per_op * 1e-3


__all__ = ["BACKWARD_OPS", "FORWARD_OPS", "GATED_ACTIVATIONS", "HOST_US_PER_OP", "SELECTIVE_OPS", "host_bound",
           "host_us_per_op", "layer_host_ms", "layer_host_ms_parallel", "layer_ops", "parallel_host_ops",
           "query_host_ms"]
