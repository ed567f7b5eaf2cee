"""FP8 in the MoE layer's saved activations: the experts' GEMM inputs are kept as FP8."""

import pytest

from memx_hpc.model import analytic as A
from memx_hpc.spec.catalog import preset


def test_fp8_keeps_each_routed_copy_of_the_expert_inputs_at_one_byte():
    """Under FP8, per token and routed copy, fc1's input (h) and fc2's input (f_e) drop from
    2 bytes to 1, as the dense MLP's GEMM inputs do; bf16 is unchanged."""
    m = preset("Mixtral-8x7B")
    kw = dict(micro_batch_size=1, tp=1, recompute="selective", precision="bf16", attention="sdpa",
              moe_layer=True)
    bf16 = A.activation_bytes_per_layer(m, **kw)
    fp8 = A.activation_bytes_per_layer(m, fp8="hybrid", **kw)
    s, k = m.seq_length, m.moe_router_topk
    dense_part = A.activation_bytes_per_layer(m, **{**kw, "moe_layer": False}) - \
        A.activation_bytes_per_layer(m, fp8="hybrid", **{**kw, "moe_layer": False})
    # the attention part's FP8 saving is the dense model's less its MLP terms
    attn_saving = dense_part - s * (m.ffn_hidden_size + m.hidden_size)
    assert bf16 - fp8 == pytest.approx(attn_saving + s * k * (m.hidden_size + m.expert_ffn_hidden_size), rel=1e-6)


def test_each_routed_copy_keeps_the_expert_input_interior_and_probability_not_the_output():
    """megatron-core 0.16 weights a copy by its routing probability inside the activation and
    unpermutes without probabilities: per extra routed copy a token keeps the experts' input
    (e·h), the SwiGLU input and fc2's input (3 e·f_e) and the fp32 probability (4 bytes)."""
    import dataclasses

    m = preset("Mixtral-8x7B")
    kw = dict(micro_batch_size=1, tp=1, recompute="selective", precision="bf16", attention="sdpa",
              moe_layer=True)
    k = m.moe_router_topk
    more = dataclasses.replace(m, moe_router_topk=k + 1)
    extra = A.activation_bytes_per_layer(more, **kw) - A.activation_bytes_per_layer(m, **kw)
    e, s = 2, m.seq_length
    assert extra == pytest.approx(s * (e * m.hidden_size + 4 + 3 * e * m.expert_ffn_hidden_size), rel=1e-6)
