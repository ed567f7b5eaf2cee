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
#: Host cost of one eager operator (us): see the module docstring.
HOST_US_PER_OP = 20.0


def layer_ops(recompute: str, tp: int) -> int:
    """Operators the host dispatches for one layer's forward+backward of one micro-batch."""
    comm_f = TP_COLLECTIVES_FORWARD if tp > 1 else 0
    comm_b = TP_COLLECTIVES_BACKWARD if tp > 1 else 0
    ops = FORWARD_OPS + comm_f + BACKWARD_OPS + comm_b
    if recompute == "full":
        ops += FORWARD_OPS + comm_f
    elif recompute == "selective":
        ops += SELECTIVE_OPS
    return ops


def layer_host_ms(recompute: str, tp: int, us_per_op: float = HOST_US_PER_OP) -> float:
    """The host time of one layer's forward+backward of one micro-batch (ms)."""
    return layer_ops(recompute, tp) * us_per_op * 1e-3


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
            out[i, 0] = max(out[i, 0], layer_host_ms(q.recompute, q.tp, us_per_op))
    return out


__all__ = ["BACKWARD_OPS", "FORWARD_OPS", "HOST_US_PER_OP", "SELECTIVE_OPS", "host_bound", "host_us_per_op",
           "layer_host_ms", "layer_ops"]
