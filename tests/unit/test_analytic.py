"""The closed forms in memx_hpc.model.analytic against megatron-core, the papers and Sailor's counts."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from memx_hpc.spec.catalog import catalog, preset
from memx_hpc.datapaths import shared_data
from memx_hpc.errors import SpecError
from memx_hpc.model import analytic as A
from memx_hpc.model.api import AnalyticCostModel, LayerQuery, forward_fraction
from memx_hpc.spec import LayerShape, site_from_mapping


def test_seven_billion_matches_megatron_core_exactly():
    m = preset("Llama-2-7B")
    closed = A.stage_params(m, m.num_layers, first=True, last=True, tp=1, pp=1)
    # ml-stack.md: GPTModel under torch.device("meta") with the tokenizer's 32,000 rows has
    # 6,738,415,616; launched with the NullTokenizer (32,000 + EOD, padded to 32,128) the
    # untied embedding and output layer each hold 128 rows more
    assert A.padded_vocab_size(m.vocab_size) == 32_128
    assert closed == 6_738_415_616 + 2 * 128 * m.hidden_size


@pytest.mark.slow
@pytest.mark.parametrize("name,overrides", [
    ("GPT-3-1.3B", {}),  # learned positions, LayerNorm, biases, tied
    ("Llama-3-8B", {}),  # GQA, SwiGLU, RMSNorm, no biases, untied, vocab 128256
    ("tiny-gpt", {"num_query_groups": 2, "activation": "swiglu", "ffn_hidden_size": 704}),  # GQA + SwiGLU + biases
    ("OPT-350M", {"tied_embeddings": False, "position_embedding": "rope", "normalization": "rmsnorm"}),
    # MoE layers (megatron-core's decoder block spec, local experts), cut to a few layers/experts
    ("Mixtral-8x7B", {"num_layers": 2}),
    ("Qwen3-30B-A3B", {"num_layers": 2, "num_experts": 8}),  # head_dim 128 at h/a 64, Q/K norms
    ("DeepSeek-V2-Lite", {"num_layers": 3, "moe_layer_freq": (0, 1, 1), "num_experts": 8}),  # MLA, shared experts
    ("tiny-gpt", {"num_experts": 4, "moe_router_topk": 2, "moe_layer_freq": (1, 0, 1, 1)}),  # router bias
    ("tiny-gpt", {"num_experts": 4, "moe_shared_expert_intermediate_size": 512, "moe_shared_expert_gate": True,
                  "add_bias_linear": False, "moe_layer_freq": 2}),
    ("tiny-gpt", {"add_bias_linear": False, "add_qkv_bias": True, "head_dim": 32, "qk_layernorm": True}),
])
def test_closed_form_equals_megatron_core(name, overrides):
    m = dataclasses.replace(preset(name), **overrides)
    closed = A.stage_params(m, m.num_layers, first=True, last=True, tp=1, pp=1)
    assert closed == A.exact_params_megatron(m)


def test_stages_sum_to_model_plus_tied_copy():
    m = preset("GPT-3-1.3B")
    whole = A.stage_params(m, 24, first=True, last=True, tp=2, pp=1)
    split = (A.stage_params(m, 10, first=True, last=False, tp=2, pp=3)
             + A.stage_params(m, 7, first=False, last=False, tp=2, pp=3)
             + A.stage_params(m, 7, first=False, last=True, tp=2, pp=3))
    # the last stage holds a copy of the tied word embedding when pp > 1
    assert split - whole == A.padded_vocab_size(m.vocab_size, 2) * m.hidden_size // 2
    assert A.head_params(m, 1, pp=1) == 0


def test_sailor_llm_info_parameter_counts():
    """Sailor counted OPT-350's parameters per TP rank on real Megatron-DeepSpeed runs."""
    info = json.loads((shared_data() / "sailor" / "llm_info.json").read_text())["OPT-350"]
    m = preset("OPT-350M")
    for tp in (1, 2, 4, 8):
        layers = info[str(tp)]
        assert layers["0"]["params_floats"] == A.embedding_params(m, tp)
        for i in range(1, 25):
            assert layers[str(i)]["params_floats"] == A.layer_params(m, tp)


def test_state_bytes_megatron_table():
    # Megatron-LM distributed optimizer docs: bf16 18 / 6 + 12/d; fp16 20 / 4 + 16/d; fp32 16 / 8 + 8/d
    p = 1_000_000
    for prec, full, fixed, shard in (("bf16", 18, 6, 12), ("fp16", 20, 4, 16), ("fp32", 16, 8, 8)):
        assert A.state_bytes(p, precision=prec, optimizer="adam", distributed_optimizer=False, dp=8) == full * p
        assert A.state_bytes(p, precision=prec, optimizer="adam", distributed_optimizer=True, dp=1) == full * p
        assert A.state_bytes(p, precision=prec, optimizer="adam", distributed_optimizer=True, dp=4) == (fixed + shard // 4) * p
    assert A.state_bytes(p, precision="bf16", optimizer="sgd", distributed_optimizer=False, dp=1) == 14 * p
    with pytest.raises(SpecError, match="optimizer"):
        A.state_bytes(p, precision="bf16", optimizer="lamb", distributed_optimizer=False, dp=1)


def test_korthikanti_closed_forms():
    m = preset("GPT-3-175B")
    s, h, a, b = m.seq_length, m.hidden_size, m.num_attention_heads, 1
    kw = dict(micro_batch_size=b, precision="bf16", attention="core")
    for t in (1, 2, 8):
        # Eq. 2: no SP: sbh(10 + 24/t + 5as/(ht)); Eq. 4 with SP: sbh/t (34 + 5as/h)
        assert A.activation_bytes_per_layer(m, tp=t, recompute="none", **kw) == pytest.approx(
            s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-9)
        if t > 1:
            assert A.activation_bytes_per_layer(m, tp=t, recompute="none", sequence_parallel=True, **kw) == \
                pytest.approx(s * b * h / t * (34 + 5 * a * s / h), rel=1e-9)
            # selective + SP: 34 sbh / t (Table 2)
            assert A.activation_bytes_per_layer(m, tp=t, recompute="selective", sequence_parallel=True, **kw) == \
                pytest.approx(34 * s * b * h / t, rel=1e-9)
    assert A.activation_bytes_per_layer(m, tp=8, recompute="full", **kw) == 2 * s * b * h
    # SDPA: no s^2 term; fp32 log-sum-exp only
    sd = A.activation_bytes_per_layer(m, tp=1, recompute="none", micro_batch_size=1, precision="bf16", attention="sdpa")
    assert sd == 34 * s * h + 4 * a * s


def test_gqa_and_swiglu_adjustments():
    m = preset("Llama-3-8B")  # 32 heads, 8 groups, f = 3.5 h
    s, h, f = m.seq_length, m.hidden_size, m.ffn_hidden_size
    kv = 8 * (h // 32)
    got = A.activation_bytes_per_layer(m, micro_batch_size=1, tp=1, recompute="selective", precision="bf16",
                                       attention="sdpa")
    # norms 2e h, two matmul inputs 2e h, masks 2m h, Q e h, K V 2e kv, proj e h, SwiGLU 3e f
    assert got == s * (4 * h + 4 * h + 2 * h + 2 * h + 4 * kv + 2 * h + 6 * f)
    mha = dataclasses.replace(m, num_query_groups=32)
    assert A.activation_bytes_per_layer(mha, micro_batch_size=1, tp=1, recompute="selective", precision="bf16",
                                        attention="sdpa") - got == 4 * s * (h - kv)
    # unfused attention expands K, V to all heads: GQA saves nothing there
    core = dict(micro_batch_size=1, tp=1, recompute="selective", precision="bf16", attention="core")
    assert A.activation_bytes_per_layer(m, **core) == A.activation_bytes_per_layer(mha, **core)


def test_activation_scales_linearly_in_micro_batch_and_drops_with_recompute():
    sh = LayerShape.of(preset("GPT-3-6.7B"))
    for att in ("core", "sdpa"):
        v = [A.activation_bytes_per_layer(sh, micro_batch_size=b, tp=2, recompute="none", precision="fp16",
                                          attention=att) for b in (1, 2, 4)]
        assert v[1] == 2 * v[0] and v[2] == 4 * v[0]
        modes = [A.activation_bytes_per_layer(sh, micro_batch_size=2, tp=2, recompute=r, precision="fp16",
                                              attention=att) for r in ("none", "selective", "full")]
        assert modes[0] >= modes[1] > modes[2]


def test_flops_narayanan():
    m = preset("GPT-3-175B")
    s, h = m.seq_length, m.hidden_size
    assert A.layer_flops(m, micro_batch_size=3) == 3 * (24 * s * h * h + 4 * s * s * h)


def test_optimizer_step_is_bandwidth_bound():
    g = catalog().get("A100-80")
    ms = A.optimizer_step_ms(10**9, g, precision="bf16", optimizer="adam", distributed_optimizer=False, dp=4)
    assert ms == pytest.approx(30e9 / 2039e9 * 1e3)  # 7 fp32 reads/writes + the bf16 copy
    assert A.optimizer_step_ms(10**9, g, precision="bf16", optimizer="adam", distributed_optimizer=True,
                               dp=4) == pytest.approx(ms / 4)


def test_bad_tp_is_a_user_error():
    with pytest.raises(SpecError, match="not divisible"):
        A.layer_params(preset("GPT-3-1.3B"), tp=3)
    with pytest.raises(SpecError, match="recompute"):
        A.activation_bytes_per_layer(preset("tiny-gpt"), micro_batch_size=1, tp=1, recompute="some",
                                     precision="bf16", attention="sdpa")


def test_analytic_cost_model_resolves_site_types_and_aliases():
    site = site_from_mapping({"name": "s", "partitions": [{"name": "p", "gpu_type": "myacc", "nodes": 1,
                                                          "gpus_per_node": 4}],
                              "gpu_types": {"myacc": {"vendor": "amd", "memory_gib": 64, "peak_tflops_bf16": 100,
                                                      "peak_tflops_fp32": 20, "hbm_gbps": 1000, "link_gbps": 50}}})
    cm = AnalyticCostModel(site)
    sh = LayerShape.of(preset("GPT-3-1.3B"))
    qs = [LayerQuery(gpu_type=g, shape=sh, tp=1, micro_batch_size=2, recompute=r, precision="bf16")
          for g in ("myacc", "a100x80", "A100-80") for r in ("none", "full")]
    out = cm.predict(qs)
    assert out.shape == (6, 2) and out.dtype == np.float64
    assert out[2, 0] == out[4, 0]  # alias and name are the same GPU
    assert out[0, 0] > out[2, 0]  # 100 TFLOPS is slower than 312
    assert out[1, 0] / out[0, 0] == pytest.approx(4 / 3, rel=0.05)  # full recompute adds a forward
    assert out[1, 1] < out[0, 1]
    assert cm.provenance("myacc") == "datasheet-only"
    # each GPU's overhead is its vendor's memory prior (the uncalibrated footprint's fixed term)
    from memx_hpc.model.memory import prior_for
    assert cm.overhead_bytes("myacc") == pytest.approx(prior_for("amd").b_bytes, rel=1e-6)
    assert cm.overhead_bytes("a100x80") == pytest.approx(prior_for("nvidia").b_bytes, rel=1e-6)
    assert cm.overhead_bytes("myacc") != cm.overhead_bytes("a100x80")
    with pytest.raises(SpecError, match="unknown GPU type"):
        cm.predict([LayerQuery(gpu_type="Z9000", shape=sh, tp=1, micro_batch_size=1, recompute="none",
                               precision="bf16")])
    assert forward_fraction("none") == pytest.approx(1 / 3) and forward_fraction("full") == 0.25


def test_layer_query_validation():
    sh = LayerShape.of(preset("tiny-gpt"))
    with pytest.raises(SpecError, match="kind"):
        LayerQuery(gpu_type="A100-80", kind="mlp", shape=sh, tp=1, micro_batch_size=1, recompute="none",
                   precision="bf16")
    with pytest.raises(SpecError, match="micro_batch_size"):
        LayerQuery(gpu_type="A100-80", shape=sh, tp=1, micro_batch_size=0, recompute="none", precision="bf16")


def test_moe_layer_roofline_parts_all_to_all_and_imbalance():
    """An MoE layer's query: the routed experts' FLOPs per rank are the tokens' k expert
    passes whatever the EP (balanced routing), times the imbalance margin once EP > 1; the
    all-to-all is (ep - 1)/ep of the k token copies, twice a forward, and part of comm_ms;
    the whole-layer FLOPs at TP 1 / EP 1 are layer_flops' of the model's MoE layer."""
    from memx_hpc.model.api import roofline_components

    m = preset("Mixtral-8x7B")
    shape = LayerShape.of(m)
    g = catalog().get("H100-SXM")
    q1 = LayerQuery(gpu_type="H100-SXM", kind="layer", shape=shape, tp=1, micro_batch_size=1, recompute="none",
                    precision="bf16")
    c1 = roofline_components(q1, g)
    assert c1["flops"] == pytest.approx(3 * A.layer_flops(m, micro_batch_size=1, moe_layer=True))
    assert c1["alltoall_ms"] == 0.0 and c1["moe_imbalance"] == 1.0
    q4 = dataclasses.replace(q1, ep=4)
    c4 = roofline_components(q4, g)
    assert c4["moe_routed_flops"] == pytest.approx(A.MOE_IMBALANCE * c1["moe_routed_flops"])
    assert c4["moe_router_flops"] == c1["moe_router_flops"]
    sent = m.moe_router_topk * m.seq_length * m.hidden_size * 2 * 3 / 4  # bf16, 3/4 leave the rank
    assert A.moe_alltoall_bytes(shape, micro_batch_size=1, precision="bf16", ep=4) == pytest.approx(sent)
    assert c4["fwd_alltoall_ms"] == pytest.approx(2 * sent / (g.link_gbps * 1e9) * 1e3)
    assert c4["comm_ms"] - c1["comm_ms"] == pytest.approx(c4["alltoall_ms"]) and c4["alltoall_ms"] > 0
    # expert TP splits only the routed experts; TP splits attention and shared experts
    q_tp2 = dataclasses.replace(q1, tp=2, etp=1)
    c = roofline_components(q_tp2, g)
    assert c["moe_routed_flops"] == pytest.approx(c1["moe_routed_flops"])
    assert c["moe_attention_flops"] == pytest.approx(c1["moe_attention_flops"] / 2)
    # the most loaded rank keeps more routed activations
    from memx_hpc.model.api import analytic_activation_bytes
    assert analytic_activation_bytes(q4) > analytic_activation_bytes(q1)


def test_mla_layer_shape_costs_as_the_model():
    m = preset("DeepSeek-V2-Lite")
    for moe in (False, True):
        s = LayerShape.of(m, moe=moe)
        assert A.layer_flops(s, micro_batch_size=2) == A.layer_flops(m, micro_batch_size=2,
                                                                                   moe_layer=moe)
        kw = dict(micro_batch_size=2, tp=1, recompute="none", precision="bf16", attention="sdpa")
        assert A.activation_bytes_per_layer(s, **kw) == A.activation_bytes_per_layer(m, moe_layer=moe,
                                                                                                   **kw)
