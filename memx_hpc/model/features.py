"""Feature vectors for the predictor: one row per (layer shape, TP, micro-batch, sequence,
recompute, precision, GPU type, kind).

The features are chosen to be scale-free and physically meaningful, so that the model
transfers to GPU types, models and sizes it has not seen:

* the layer's shape as logs and ratios (``log h``, ``f/h``, ``g/a``, ``s/h`` ...);
* what the layer asks of one GPU: FLOPs, bytes moved by memory-bound kernels, bytes of
  TP collectives, the analytic activation bytes, arithmetic intensity;
* the per-kernel roofline on the GPU's datasheet numbers (compute, memory and link
  milliseconds and the share of each);
* the GPU's datasheet figures (peak throughput for the precision, bandwidth, link,
  ridge point, whether it has matrix units for the precision).

A GPU type with no samples still gets a complete feature vector from its datasheet,
which is how an unseen type is estimated (its provenance is then ``datasheet-only``).

The predictor's base estimates are ``base[:, 0]`` the roofline ms and ``base[:, 1]``
the analytic activation bytes; it learns log ratios to them.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..spec import BYTES_PER_ELEMENT, GpuType, LayerSample
from . import analytic
from .api import LayerQuery, analytic_activation_bytes, kernels_of, resolve_gpu, roofline_components

FEATURE_SCHEMA_VERSION = 2

#: Features that describe the layer and the device without any model of their interplay.
SHAPE_FEATURES = (
    "kind_layer", "kind_embedding", "kind_head",
    "log_hidden", "ffn_ratio", "kv_ratio", "log_head_dim", "log_seq", "seq_over_hidden", "log_vocab_over_hidden",
    "swiglu", "attention_core", "log_mbs", "log_tp", "sequence_parallel",
    "recompute_selective", "recompute_full", "bytes_per_element",
    "gpu_log_peak_tflops", "gpu_log_hbm_gbps", "gpu_log_link_gbps", "gpu_log_ridge", "gpu_matrix_units",
    "gpu_log_memory_gib",
    # an MoE layer (0 for a dense one): the experts this rank holds, the share of them a
    # token runs, the routed width a token runs over h; multi-latent attention
    "moe_layer", "log_experts_per_rank", "moe_topk_share", "moe_active_ffn_ratio", "log_ep", "mla",
)
#: Features derived from the analytic model and the roofline.
PHYSICS_FEATURES = (
    "log_flops_per_gpu", "log_traffic_per_gpu", "log_intensity", "log_tokens_per_gpu",
    "log_roofline_ms", "roofline_compute_share", "roofline_memory_share", "roofline_comm_share",
    "attention_flop_share", "log_analytic_bytes", "score_bytes_share", "roofline_alltoall_share",
)


def feature_names(*, physics: bool = True) -> tuple[str, ...]:
    """The feature schema, in column order."""
    return SHAPE_FEATURES + (PHYSICS_FEATURES if physics else ())


def query_of(sample: LayerSample) -> LayerQuery:
    """The cost question a sample answers."""
    p = sample.point
    return LayerQuery(gpu_type=p.gpu_type, kind=p.kind, shape=p.shape, tp=p.tp, micro_batch_size=p.micro_batch_size,
                      recompute=p.recompute, precision=p.precision, attention=p.attention,
                      ep=p.ep if p.kind == "layer" and p.shape.is_moe else 1, kernels=kernels_of(sample))


def _gpu_row(gpu: GpuType, precision: str) -> list[float]:
    peak = gpu.peak_tflops(precision)
    # Matrix units: a part whose half-precision peak is well above its fp32 peak has tensor
    # cores / matrix cores for it (P40 / P100 do not, V100 onwards do; GeForce Ampere's
    # fp32-accumulate tensor rate is only 2x its doubled fp32 rate)
    # (and only for a precision they run natively: bf16 on a V100 has no units).
    matrix = 1.0 if precision != "fp32" and gpu.peak_tflops(precision) > 1.5 * gpu.peak_tflops_fp32 else 0.0
    return [math.log(peak), math.log(gpu.hbm_gbps), math.log(gpu.link_gbps),
            math.log(peak * 1e3 / gpu.hbm_gbps), matrix, math.log(gpu.memory_gib)]


def build(queries: Sequence[LayerQuery], gpus: Any, *, physics: bool = True,
          dropout_mask_bytes: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``(X, base)``: the feature matrix (float64, columns :func:`feature_names`) and the
    base estimates ``[roofline ms, analytic activation bytes]`` for each query.

    ``gpus`` is a Site or Catalog; every GPU name resolves through it (aliases too).
    """
    n = len(queries)
    names = feature_names(physics=physics)
    X = np.empty((n, len(names)), dtype=np.float64)
    base = np.empty((n, 2), dtype=np.float64)
    cache: dict[str, GpuType] = {}
    for i, q in enumerate(queries):
        g = cache.get(q.gpu_type)
        if g is None:
            g = cache[q.gpu_type] = resolve_gpu(gpus, q.gpu_type)
        s = q.shape
        h, a = s.hidden_size, s.num_attention_heads
        row = [
            float(q.kind == "layer"), float(q.kind == "embedding"), float(q.kind == "head"),
            math.log(h), s.ffn_hidden_size / h, s.num_query_groups / a, math.log(s.kv_channels), math.log(s.seq_length),
            s.seq_length / h, math.log(s.vocab_size / h),
            float(s.activation == "swiglu"), float(q.attention == "core"), math.log(q.micro_batch_size),
            math.log(q.tp), float(q.sequence_parallel),
            float(q.recompute == "selective"), float(q.recompute == "full"), float(BYTES_PER_ELEMENT[q.precision]),
        ] + _gpu_row(g, q.precision)
        moe = q.kind == "layer" and s.is_moe
        row += [float(moe), math.log(s.num_experts / q.ep) if moe else 0.0,
                s.moe_router_topk / s.num_experts if moe else 0.0,
                s.moe_router_topk * s.expert_ffn_hidden_size / h if moe else 0.0,
                math.log(q.ep), float(s.multi_latent_attention)]
        c = roofline_components(q, g)
        roof = c["compute_ms"] + c["memory_ms"] + c["comm_ms"]
        act = float(analytic_activation_bytes(q, dropout_mask_bytes=dropout_mask_bytes))
        if physics:
            flops = max(c["flops"], 1.0)
            traffic = max(c["traffic_bytes"], 1.0)
            att = analytic.attention_score_flops(s, micro_batch_size=q.micro_batch_size) / q.tp
            fwd = max(c["flops"] / (4.0 if q.recompute == "full" else 3.0), 1.0)
            e = BYTES_PER_ELEMENT[q.precision]
            score_bytes = (a * s.seq_length ** 2 * q.micro_batch_size * e / q.tp
                           if (q.kind == "layer" and q.attention == "core" and q.recompute == "none") else 0.0)
            row += [
                math.log(flops), math.log(traffic), math.log(flops / traffic),
                math.log(s.seq_length * q.micro_batch_size / q.tp),
                math.log(roof), c["compute_ms"] / roof, c["memory_ms"] / roof, c["comm_ms"] / roof,
                (att / fwd) if q.kind == "layer" else 0.0,
                math.log(max(act, 1.0)), score_bytes / max(act, 1.0), c.get("alltoall_ms", 0.0) / roof,
            ]
        X[i] = row
        base[i, 0] = roof
        base[i, 1] = max(act, 1.0)
    return X, base
