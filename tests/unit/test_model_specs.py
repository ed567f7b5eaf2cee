"""Model presets against the configurations and parameter counts they name; Hugging Face
config.json reading; MoE and multi-latent attention in the spec and the analytic model.

The config files under tests/data/hf_configs are the published config.json files of the
models named (Hugging Face hub), transcribed; the reference counts are the totals those
checkpoints hold (model cards; exact where a card or the safetensors index gives them)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from memx_hpc.spec.catalog import model_presets, preset
from memx_hpc.cli.main import main
from memx_hpc.errors import SpecError
from memx_hpc.spec.hfconfig import read_hf_config
from memx_hpc.model import analytic as A
from memx_hpc.params import layer_params, model_params
from memx_hpc.search.space import recompute_levels
from memx_hpc.spec import LayerShape, ModelSpec, job_from_mapping, model_from_mapping

HF = Path(__file__).resolve().parents[1] / "data" / "hf_configs"

# (total, active) parameters with the config's own vocabulary, as the model cards count them.
REFERENCE_COUNTS = {
    "Llama-2-7B": (6_738_415_616, None),
    "Llama-2-13B": (13_015_864_320, None),
    "Llama-2-70B": (68_976_648_192, None),
    "Llama-3-8B": (8_030_261_248, None),
    "Llama-3-70B": (70_553_706_496, None),
    "Llama-3.1-8B": (8_030_261_248, None),
    "Llama-3.1-70B": (70_553_706_496, None),
    "Llama-3.1-405B": (405_853_388_800, None),
    "Llama-3.2-1B": (1_235_814_400, None),
    "Llama-3.2-3B": (3_212_749_824, None),
    "Mixtral-8x7B": (46_702_792_704, 12_879_925_248),  # "46.7B total, 12.9B active" (Mixtral paper)
    "DeepSeek-V2-Lite": (15_706_484_224, None),        # "15.7B" (DeepSeek-V2 paper, Appendix B)
    "Qwen3-30B-A3B": (30_532_122_624, 3_353_032_704),  # "30.5B, 3.3B activated" (model card)
}


@pytest.mark.parametrize("name", sorted(REFERENCE_COUNTS))
def test_preset_parameter_counts_match_reference(name):
    total, active = REFERENCE_COUNTS[name]
    m = preset(name)
    assert model_params(m, pad_vocab=False) == total
    if active is not None:
        assert model_params(m, pad_vocab=False, active=True) == active


def test_headline_figures_of_the_moe_presets():
    # the rounded figures the papers and cards print
    q = preset("Qwen3-30B-A3B")
    embeddings = 2 * q.vocab_size * q.hidden_size
    assert round((model_params(q, pad_vocab=False) - embeddings) / 1e9, 1) == 29.9  # "29.9B non-embedding"
    d = preset("DeepSeek-V2-Lite")
    # "2.4B activated": what a token runs beyond its embedding row (2.45 B, the paper truncates)
    active = model_params(d, pad_vocab=False, active=True) - d.vocab_size * d.hidden_size
    assert 2.4e9 <= active < 2.5e9
    assert sum(d.moe_layers) == 26 and not d.moe_layers[0]  # first_k_dense_replace: 1


def test_existing_presets_against_their_papers():
    """GPT-3's Table 2.1 gives rounded sizes; GPT-Neo-2.7B's checkpoint has no Q/K/V biases
    (2,651,307,520), which the preset's Megatron layer has; OPT-350M projects its 1024-wide
    layers to a 512-wide embedding (331,196,416), which the preset leaves out: the preset plans
    a Megatron GPT of OPT-350M's layer shape, as Sailor's measurements ran it."""
    for name, paper in (("GPT-3-1.3B", 1.3e9), ("GPT-3-2.7B", 2.7e9), ("GPT-3-6.7B", 6.7e9),
                        ("GPT-3-175B", 175e9)):
        assert abs(model_params(preset(name), pad_vocab=False) / paper - 1) < 0.02, name
    neo = preset("GPT-Neo-2.7B")
    assert model_params(neo, pad_vocab=False) - 2_651_307_520 == neo.num_layers * 3 * neo.hidden_size
    assert 0.07 < model_params(preset("OPT-350M"), pad_vocab=False) / 331_196_416 - 1 < 0.08


def test_llama3_family_rotary_base():
    llama3 = [n for n in model_presets() if n.startswith("Llama-3")]
    assert len(llama3) == 7
    assert {preset(n).rotary_base for n in llama3} == {500_000}
    assert preset("Llama-2-7B").rotary_base == 10_000


# config file -> the preset it must equal, and the fields where the preset deliberately differs
HF_PRESETS = {
    "Meta-Llama-3-8B.json": ("Llama-3-8B", {}),
    "Llama-3.1-405B.json": ("Llama-3.1-405B", {"seq_length": 8192}),
    "Llama-3.2-1B.json": ("Llama-3.2-1B", {"seq_length": 8192}),
    "Mixtral-8x7B-v0.1.json": ("Mixtral-8x7B", {}),
    "DeepSeek-V2-Lite.json": ("DeepSeek-V2-Lite", {"seq_length": 4096}),
    # the Qwen3 report trains with a global-batch balancing loss, which config.json does not record
    "Qwen3-30B-A3B.json": ("Qwen3-30B-A3B", {"seq_length": 4096, "moe_router_load_balancing_type": "global_aux_loss"}),
}


@pytest.mark.parametrize("file", sorted(HF_PRESETS))
def test_hf_config_reads_to_the_preset(file):
    name, differ = HF_PRESETS[file]
    read = ModelSpec(**{**read_hf_config(HF / file), **differ, "name": name})
    assert read == preset(name)


@pytest.mark.parametrize("file,total,active", [
    ("DeepSeek-V3.json", 671_026_404_352, 37_552_282_624),       # "671B total, 37B activated" (V3 report)
    ("Qwen2-7B.json", 7_615_616_512, None),                      # Q/K/V biases
    ("Qwen1.5-MoE-A2.7B.json", 14_315_784_192, 2_689_173_504),   # "14.3B, 2.7B activated"; gated shared expert
])
def test_hf_families_without_a_preset(file, total, active):
    m = ModelSpec(**read_hf_config(HF / file))
    assert model_params(m, pad_vocab=False) == total
    if active is not None:
        assert model_params(m, pad_vocab=False, active=True) == active


def test_deepseek_v3_router_and_attention():
    m = ModelSpec(**read_hf_config(HF / "DeepSeek-V3.json"))
    assert m.multi_latent_attention and m.q_lora_rank == 1536 and m.kv_lora_rank == 512
    assert (m.moe_router_score_function, m.moe_router_num_groups, m.moe_router_group_topk) == ("sigmoid", 8, 4)
    assert m.moe_router_enable_expert_bias and m.moe_shared_expert_intermediate_size == 2048
    assert m.moe_layers[:4] == (False, False, False, True)


def _write(tmp_path, name, cfg):
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return p


def test_job_with_hf_config_relative_to_the_job_file_and_overrides(tmp_path):
    cfg = json.loads((HF / "Mixtral-8x7B-v0.1.json").read_text())
    (tmp_path / "models").mkdir()
    _write(tmp_path / "models", "config.json", cfg)
    job = tmp_path / "job.yaml"
    job.write_text("model: {hf_config: models/config.json, seq_length: 4096, num_layers: 8}\n"
                   "global_batch_size: 64\n")
    from memx_hpc.spec import load_job
    j = load_job(job)
    assert (j.model.seq_length, j.model.num_layers, j.model.num_experts, j.model.moe_router_topk) == (4096, 8, 8, 2)
    assert j.model.rotary_base == 1_000_000


@pytest.mark.parametrize("key,value,needle", [
    ("sliding_window", 4096, "sliding_window"),
    ("attention_bias", True, "attention_bias"),
    ("rope_scaling", {"rope_type": "dynamic", "factor": 2.0}, "rope_scaling.rope_type"),
    ("hidden_act", "gelu", "hidden_act"),
    ("router_jitter_noise", 0.1, "router_jitter_noise"),
    ("some_new_knob", 3, "some_new_knob"),
    ("model_type", "gpt_oss", "model_type"),
])
def test_hf_config_fields_it_cannot_honour_exit_1_by_name(tmp_path, capsys, key, value, needle):
    cfg = json.loads((HF / "Mixtral-8x7B-v0.1.json").read_text())
    cfg[key] = value
    _write(tmp_path, "config.json", cfg)
    job = tmp_path / "job.yaml"
    job.write_text("model: {hf_config: config.json}\nglobal_batch_size: 8\n")
    assert main(["validate", "--job", str(job)]) == 1
    err = capsys.readouterr().err
    assert needle in err and "config.json" in err and "Traceback" not in err


def test_validate_prints_moe_model(capsys):
    doc = {"model": {"preset": "Mixtral-8x7B", "seq_length": 4096}, "global_batch_size": 64}
    job = job_from_mapping(doc)
    assert job.model.is_moe
    from memx_hpc.cli.validate import _job_dict
    d = _job_dict(job)
    assert d["num_experts"] == 8 and d["moe_layers"] == 32
    assert d["active_parameters"] < d["parameters"] / 3


def test_moe_fields_in_a_job_and_their_checks():
    m = model_from_mapping({"preset": "tiny-gpt", "num_experts": 4, "moe_router_topk": 2, "moe_layer_freq": 2})
    assert m.moe_layers == (True, False, True, False)
    m = model_from_mapping({"preset": "tiny-gpt", "num_experts": 4, "moe_layer_freq": [0, 1, 1, 0]})
    assert m.moe_layers == (False, True, True, False)
    for doc, field in (({"num_experts": 4, "moe_layer_freq": [1, 0]}, "model.moe_layer_freq"),
                       ({"num_experts": 4, "moe_router_topk": 5}, "model.moe_router_topk"),
                       ({"moe_ffn_hidden_size": 64}, "model.moe_ffn_hidden_size"),
                       ({"num_experts": 4, "moe_router_load_balancing_type": "aux"},
                        "model.moe_router_load_balancing_type"),
                       ({"num_experts": 4, "moe_shared_expert_intermediate_size": 256},
                        "model.add_bias_linear")):
        with pytest.raises(SpecError) as e:
            model_from_mapping({"preset": "tiny-gpt", **doc})
        assert e.value.field == field, doc


def test_layer_shapes_of_moe_and_mla_models():
    mix = preset("Mixtral-8x7B")
    s = LayerShape.of(mix)  # every layer MoE: one shape
    assert s.is_moe and (s.num_experts, s.moe_router_topk, s.moe_ffn_hidden_size) == (8, 2, mix.expert_ffn_hidden_size)
    lite = preset("DeepSeek-V2-Lite")
    assert len(set(lite.moe_layers)) == 2  # dense first layer(s), MoE after
    with pytest.raises(SpecError) as e:
        LayerShape.of(lite)  # two kinds of layer: which one must be asked
    assert e.value.field == "model.moe_layer_freq"
    dense, moe = LayerShape.of(lite, moe=False), LayerShape.of(lite, moe=True)
    assert not dense.is_moe and moe.is_moe and dense.multi_latent_attention and moe.multi_latent_attention
    assert moe.moe_shared_expert_intermediate_size == lite.moe_shared_expert_intermediate_size
    assert dense.kv_lora_rank == lite.kv_lora_rank and dense.extension != {}
    qwen = LayerShape.of(preset("Qwen3-30B-A3B"))
    assert qwen.head_dim == 128 and qwen.kv_channels == 128
    llama = LayerShape.of(preset("Llama-3.2-1B"))  # head_dim equal to h/a is a dense standard shape
    assert llama.extension == {} and llama.head_dim is None
    with pytest.raises(SpecError) as e:
        LayerShape.of(preset("Llama-3.2-1B"), moe=True)
    assert e.value.field == "model.num_experts"


def test_named_selective_recompute_is_kept_under_sdpa():
    base = {"model": "tiny-gpt", "global_batch_size": 8}
    by_default = job_from_mapping(base)
    named = job_from_mapping({**base, "recompute_modes": ["none", "selective", "full"]})
    assert "selective" not in [lv.base for lv in recompute_levels(by_default, 1)]
    assert "selective" in [lv.base for lv in recompute_levels(named, 1)]


def test_moe_layer_params_shard_over_expert_parallel():
    m = preset("Mixtral-8x7B")
    one = layer_params(m, 1)
    ep8 = layer_params(m, 1, ep=8)
    expert = 3 * m.hidden_size * m.expert_ffn_hidden_size
    assert one - ep8 == 7 * expert
    assert layer_params(m, 2, ep=8, etp=1) - layer_params(m, 2, ep=8, etp=2) == expert // 2
    with pytest.raises(SpecError):
        layer_params(m, 1, ep=3)
    d = preset("DeepSeek-V2-Lite")
    with pytest.raises(SpecError):
        layer_params(d, 1)  # dense first layer, MoE others: which one
    assert A.stage_params(d, 27, first=True, last=True, tp=1, pp=1) == model_params(d)
    # the first stage starts at the dense layer 0, the last ends at layer 26
    split = (A.stage_params(d, 14, first=True, last=False, tp=1, pp=2)
             + A.stage_params(d, 13, first=False, last=True, tp=1, pp=2))
    assert split == model_params(d)


def test_moe_flops_and_activations():
    m = preset("Mixtral-8x7B")
    s, h, b = m.seq_length, m.hidden_size, 1
    dense = A.layer_flops(m, micro_batch_size=b)
    moe = A.layer_flops(m, micro_batch_size=b, moe_layer=True)
    # top-2 of 8 experts of the dense width: one more MLP plus the router
    assert moe - dense == pytest.approx(2 * s * b * h * (m.num_experts + 3 * m.ffn_hidden_size))
    kw = dict(micro_batch_size=1, tp=2, recompute="none", precision="bf16", attention="sdpa")
    a1 = A.activation_bytes_per_layer(m, moe_layer=True, **kw)
    a2 = A.activation_bytes_per_layer(m, moe_layer=True, etp=1, **kw)
    routed = s * m.moe_router_topk * 2 * m.expert_ffn_hidden_size * 3
    assert a2 - a1 == pytest.approx(routed / 2, rel=1e-9)
    assert A.activation_bytes_per_layer(m, moe_layer=True, moe_imbalance=1.5, **kw) - a1 == pytest.approx(
        0.5 * routed / 2, rel=1e-6)
    assert A.moe_dispatch_bytes(m, micro_batch_size=2, precision="bf16") == 2 * s * 2 * h * 2


def test_mla_and_head_dim_flops():
    d = preset("DeepSeek-V2-Lite")
    a, s = d.num_attention_heads, d.seq_length
    assert A.attention_score_flops(d, micro_batch_size=1) == 2 * s * s * a * (128 + 64) + 2 * s * s * a * 128
    q = preset("Qwen3-30B-A3B")  # 32 heads of 128 at h = 2048: Q is twice h wide
    assert A.attention_score_flops(q, micro_batch_size=1) == 4 * q.seq_length ** 2 * 32 * 128
    # MLA keeps per-head K of 192 and V of 128 plus replicated latents
    full = A.activation_bytes_per_layer(d, micro_batch_size=1, tp=1, recompute="none", precision="bf16",
                                        attention="sdpa")
    assert full > A.activation_bytes_per_layer(dataclasses.replace(d, num_experts=None, moe_layer_freq=1,
                                                                   moe_ffn_hidden_size=None,
                                                                   moe_shared_expert_intermediate_size=None,
                                                                   multi_latent_attention=False, qk_layernorm=False),
                                               micro_batch_size=1, tp=1, recompute="none", precision="bf16",
                                               attention="sdpa")


def test_context_parallel_divides_activations_and_exchanges_kv():
    m = dataclasses.replace(preset("Llama-3-8B"), seq_length=32768)
    kw = dict(micro_batch_size=1, tp=2, recompute="none", precision="bf16", attention="sdpa",
              sequence_parallel=True)
    one = A.activation_bytes_per_layer(m, **kw)
    assert A.activation_bytes_per_layer(m, cp=4, **kw) == pytest.approx(one / 4, rel=1e-6)
    with pytest.raises(SpecError):
        A.activation_bytes_per_layer(m, cp=4, **{**kw, "attention": "core"})
    fwd, bwd = A.cp_kv_exchange_bytes(m, micro_batch_size=1, precision="bf16", cp=4)
    # 3 steps of an 8192-token block of K and V (8 groups of 128) in bf16
    assert fwd == 3 * 8192 * 2 * 1024 * 2 and bwd == 2 * fwd
    assert A.cp_kv_exchange_bytes(m, micro_batch_size=1, precision="bf16", cp=1) == (0.0, 0.0)


def test_the_config_reader_is_small_functions_and_errors_name_the_config_key(tmp_path, capsys):
    """read_hf_config is split per concern (no function over 60 lines); a value the config
    gives that the spec refuses names the config.json and its own key, not the job's field."""
    import ast
    import inspect

    from memx_hpc.spec import hfconfig
    tree = ast.parse(inspect.getsource(hfconfig))
    long = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.end_lineno - n.lineno >= 60]
    assert not long, long
    cfg = json.loads((HF / "Mixtral-8x7B-v0.1.json").read_text())
    _write(tmp_path, "config.json", {**cfg, "num_local_experts": 10**6})
    job = tmp_path / "job.yaml"
    job.write_text("model: {hf_config: config.json}\nglobal_batch_size: 8\n")
    assert main(["validate", "--job", str(job)]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path}/config.json: num_local_experts" in err and "job.yaml" not in err
