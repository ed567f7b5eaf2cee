"""A Hugging Face ``config.json`` read into :class:`~memx_hpc.spec.model.ModelSpec` keyword arguments.

``model: {hf_config: path/to/config.json, seq_length: 4096}`` in a job file plans the model
that config describes, with the same overrides a preset takes. The families read are the
ones Megatron-LM's own converters and recipes cover: Llama, Mistral, Mixtral, Qwen2,
Qwen3, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2 and DeepSeek-V3 (``model_type``).

Every key of the config is either mapped onto the spec, known to leave both the cost and
the layers Megatron builds unchanged (token ids, initialisation, norm epsilon, loss
coefficients, ...), or checked to hold a value the spec can represent. Anything else is
refused by name: a key this reader does not know might change what the model is, and a
plan for another model than the one asked for is worse than no plan.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..errors import SpecError
from .yamlio import load_json

FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3")

# Keys that change neither the shapes nor the cost of training: ids, numerics of norms and
# initialisation, inference-only settings, loss coefficients (the router's load-balancing
# *kind* is mapped; its coefficient is a training choice, Megatron's --moe-aux-loss-coeff).
_IGNORED = frozenset({
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "bos_token_id", "eos_token_id",
    "pad_token_id", "initializer_range", "rms_norm_eps", "layer_norm_eps", "use_cache", "attention_dropout",
    "pretraining_tp", "output_router_logits", "router_aux_loss_coef", "aux_loss_alpha", "routed_scaling_factor",
    "norm_topk_prob", "max_window_layers", "auto_map", "quantization_config", "_name_or_path", "name_or_path",
    "id2label", "label2id", "tokenizer_class", "return_dict", "output_hidden_states", "output_attentions",
    "is_encoder_decoder", "bad_words_ids", "chunk_size_feed_forward", "tie_encoder_decoder",
    # DeepSeek-V3's multi-token-prediction module: Hugging Face's DeepseekV3ForCausalLM builds
    # no MTP layer, so the model this config describes has none (Megatron's --mtp-num-layers
    # adds one when asked for).
    "num_nextn_predict_layers",
    # the pattern of routed layers is read from first_k_dense_replace and moe_layer_freq
    "ep_size",
})


def _int(cfg: Mapping[str, Any], key: str, file: str, default: Any = ...) -> Any:
    v = cfg.get(key, default)
    if v is ...:
        raise SpecError("required key is missing", file=file, field=key)
    if v is None and default is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise SpecError("expected a whole number", file=file, field=key, found=v)
    return v


def _must(cfg: Mapping[str, Any], key: str, file: str, allowed: tuple, why: str) -> None:
    """A key whose value the spec cannot represent unless it is one of ``allowed``."""
    if key in cfg and cfg[key] not in allowed:
        raise SpecError(f"cannot be honoured: {why}", file=file, field=key, found=cfg[key],
                        allowed=", ".join(repr(a) for a in allowed))


def _rope_scaling(cfg: Mapping[str, Any], file: str) -> dict[str, Any]:
    rs = cfg.get("rope_scaling")
    if rs is None:
        return {}
    if not isinstance(rs, Mapping):
        raise SpecError("expected a mapping or null", file=file, field="rope_scaling", found=rs)
    kind = rs.get("rope_type", rs.get("type"))
    if kind not in ("llama3", "yarn"):
        raise SpecError("cannot be honoured: Megatron-LM runs Llama 3.1's and YaRN's RoPE scaling only",
                        file=file, field="rope_scaling.rope_type", found=kind, allowed="'llama3', 'yarn'")
    factor = rs.get("factor", 1.0)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor < 1:
        raise SpecError("expected a number >= 1", file=file, field="rope_scaling.factor", found=factor)
    return {"rope_scaling": kind, "rope_scaling_factor": float(factor)}


def _pattern(num_layers: int, moe: list[bool]) -> int | tuple[int, ...]:
    """The spec's ``moe_layer_freq`` for a per-layer MoE pattern: 1 when every layer is MoE."""
    return 1 if all(moe) else tuple(int(x) for x in moe)


#: The config key a ModelSpec field is read from, where the names differ (per family below).
_KEY_OF = {
    "name": "_name_or_path", "num_layers": "num_hidden_layers", "num_query_groups": "num_key_value_heads",
    "ffn_hidden_size": "intermediate_size", "seq_length": "max_position_embeddings", "rotary_base": "rope_theta",
    "tied_embeddings": "tie_word_embeddings", "rope_scaling": "rope_scaling.rope_type",
    "rope_scaling_factor": "rope_scaling.factor", "activation": "hidden_act", "moe_router_topk": "num_experts_per_tok",
    "moe_ffn_hidden_size": "moe_intermediate_size", "qk_head_dim": "qk_nope_head_dim",
    "qk_pos_emb_head_dim": "qk_rope_head_dim", "moe_router_num_groups": "n_group", "moe_router_group_topk": "topk_group",
    "moe_router_score_function": "scoring_func", "moe_router_load_balancing_type": "topk_method",
    "moe_router_enable_expert_bias": "topk_method",
}
_FAMILY_KEY_OF = {
    "mixtral": {"num_experts": "num_local_experts", "moe_ffn_hidden_size": "intermediate_size"},
    "qwen2_moe": {"moe_shared_expert_intermediate_size": "shared_expert_intermediate_size",
                  "moe_shared_expert_gate": "shared_expert_intermediate_size", "moe_layer_freq": "decoder_sparse_step"},
    "qwen3_moe": {"moe_layer_freq": "decoder_sparse_step"},
    "deepseek_v2": {"num_experts": "n_routed_experts", "moe_shared_expert_intermediate_size": "n_shared_experts",
                    "moe_layer_freq": "first_k_dense_replace"},
    "deepseek_v3": {"num_experts": "n_routed_experts", "moe_shared_expert_intermediate_size": "n_shared_experts",
                    "moe_layer_freq": "first_k_dense_replace"},
}


@dataclass(frozen=True)
class HfModel:
    """What :func:`read_hf` read: the ModelSpec keyword arguments of the config at ``file``."""

    file: str
    family: str
    kwargs: dict[str, Any]

    def key(self, spec_field: str) -> str:
        """The config's own key for the ModelSpec field ``spec_field`` (what an error names)."""
        return _FAMILY_KEY_OF.get(self.family, {}).get(spec_field) or _KEY_OF.get(spec_field, spec_field)


@dataclass
class _Config:
    """A config being read: its mapping, its file, and the keys read so far."""

    cfg: Mapping[str, Any]
    file: str
    family: str
    used: set[str] = field(default_factory=lambda: set(_IGNORED))

    def int(self, key: str, default: Any = ...) -> Any:
        self.used.add(key)
        return _int(self.cfg, key, self.file, default)

    def must(self, key: str, allowed: tuple, why: str) -> None:
        self.used.add(key)
        _must(self.cfg, key, self.file, allowed, why)

    def take(self, *keys: str) -> None:
        self.used.update(keys)


def read_hf_config(path: str | os.PathLike) -> dict[str, Any]:
    """ModelSpec keyword arguments for the Hugging Face ``config.json`` at ``path``.

    ``seq_length`` defaults to the config's ``max_position_embeddings`` (what the model was
    built for); a job usually overrides it. Exit-1 errors name the file and the key.
    """
    return read_hf(path).kwargs


def read_hf(path: str | os.PathLike) -> HfModel:
    """:func:`read_hf_config`, with the file and family (:meth:`HfModel.key` names a field's key)."""
    file = str(path)
    cfg = load_json(path)
    if not isinstance(cfg, Mapping):
        raise SpecError("expected a JSON object (a Hugging Face config.json)", file=file)
    family = cfg.get("model_type")
    if family not in FAMILIES:
        raise SpecError("not a model family this reader knows", file=file, field="model_type", found=family,
                        allowed=", ".join(FAMILIES))
    c = _Config(cfg, file, family)
    kw = _shape(c)
    _attention(c, kw)
    moe = _MLP[family](c, kw)
    if any(moe):
        kw["moe_layer_freq"] = _pattern(kw["num_layers"], moe)
    elif kw.get("num_experts"):
        raise SpecError("no layer of this config is a mixture of experts", file=file, field="mlp_only_layers")
    _refuse_unknown(c)
    return HfModel(file, family, kw)


def _shape(c: _Config) -> dict[str, Any]:
    """The dense shape, embeddings and RoPE every family has."""
    h, layers, heads = c.int("hidden_size"), c.int("num_hidden_layers"), c.int("num_attention_heads")
    name = c.cfg.get("_name_or_path") or f"{c.family}-h{h}-l{layers}"
    if not isinstance(name, str):
        name = f"{c.family}-h{h}-l{layers}"
    kw: dict[str, Any] = {
        "name": os.path.basename(name.rstrip("/")) or name, "num_layers": layers, "hidden_size": h,
        "num_attention_heads": heads, "num_query_groups": c.int("num_key_value_heads", heads),
        "vocab_size": c.int("vocab_size"), "seq_length": c.int("max_position_embeddings"),
        "tied_embeddings": bool(c.cfg.get("tie_word_embeddings", False)), "position_embedding": "rope",
        "normalization": "rmsnorm", "add_bias_linear": False, "activation": "swiglu",
    }
    c.take("tie_word_embeddings")
    if not isinstance(c.cfg.get("tie_word_embeddings", False), bool):
        raise SpecError("expected true or false", file=c.file, field="tie_word_embeddings",
                        found=c.cfg.get("tie_word_embeddings"))
    if kw["num_query_groups"] is None:
        kw["num_query_groups"] = heads
    theta = c.cfg.get("rope_theta", 10000)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) \
            or theta < 1 or theta != int(theta):
        raise SpecError("expected a whole number (Megatron-LM's --rotary-base is an integer)", file=c.file,
                        field="rope_theta", found=theta)
    kw["rotary_base"] = int(theta)
    c.take("rope_theta", "rope_scaling")
    kw.update(_rope_scaling(c.cfg, c.file))
    return kw


def _attention(c: _Config, kw: dict[str, Any]) -> None:
    """The MLP activation, biases, attention window and head size: what Megatron can express."""
    layers, heads = kw["num_layers"], kw["num_attention_heads"]
    # every family here runs a gated SiLU MLP (SwiGLU)
    c.must("hidden_act", ("silu",), "the MLP of these families is SwiGLU (gated SiLU)")
    # what Megatron cannot express: biases on the attention output but not the MLP, MLP biases
    c.must("attention_bias", (False,), "Megatron-LM biases Q, K, V only (--add-qkv-bias) or every "
                                       "linear layer (--add-bias-linear), never all attention layers alone")
    c.must("mlp_bias", (False,), "the MLP biases come only with every other linear bias in Megatron-LM")
    # Qwen2/3 configs carry a window size that is unused while use_sliding_window is false
    if c.cfg.get("use_sliding_window") is not False:
        c.must("sliding_window", (None,), "sliding-window attention is not modelled")
    c.must("use_sliding_window", (False,), "sliding-window attention is not modelled")
    c.must("layer_types", (["full_attention"] * layers,), "every layer runs full attention here")
    c.take("sliding_window")
    if c.family in ("qwen2", "qwen2_moe"):
        # Qwen2's attention has biases on Q, K and V (no config key: always on)
        kw["add_qkv_bias"] = True
    if c.family in ("qwen3", "qwen3_moe"):
        kw["qk_layernorm"] = True  # Qwen3 normalises each head of Q and K (no config key: always on)
    c.take("head_dim")
    if "head_dim" in c.cfg and c.cfg["head_dim"] is not None:
        hd = c.int("head_dim")
        if c.family.startswith("deepseek"):
            raise SpecError("DeepSeek's head sizes are qk_nope_head_dim, qk_rope_head_dim and v_head_dim",
                            file=c.file, field="head_dim", found=hd)
        if hd * heads != kw["hidden_size"]:
            kw["head_dim"] = hd


def _dense_mlp(c: _Config, kw: dict[str, Any]) -> list[bool]:
    kw["ffn_hidden_size"] = c.int("intermediate_size")
    return [False] * kw["num_layers"]


def _mixtral(c: _Config, kw: dict[str, Any]) -> list[bool]:
    f = c.int("intermediate_size")
    kw.update(ffn_hidden_size=f, num_experts=c.int("num_local_experts"), moe_router_topk=c.int("num_experts_per_tok"),
              moe_ffn_hidden_size=f)
    c.must("router_jitter_noise", (0, 0.0), "router input jitter is not modelled")
    return [True] * kw["num_layers"]


def _qwen_moe(c: _Config, kw: dict[str, Any]) -> list[bool]:
    layers = kw["num_layers"]
    kw.update(ffn_hidden_size=c.int("intermediate_size"), num_experts=c.int("num_experts"),
              moe_router_topk=c.int("num_experts_per_tok"), moe_ffn_hidden_size=c.int("moe_intermediate_size"))
    step = c.int("decoder_sparse_step", 1)
    dense_only = c.cfg.get("mlp_only_layers", []) or []
    c.take("mlp_only_layers")
    if not isinstance(dense_only, list) or not all(isinstance(i, int) and 0 <= i < layers for i in dense_only):
        raise SpecError("expected a list of layer indices", file=c.file, field="mlp_only_layers", found=dense_only)
    if not isinstance(step, int) or step < 1:
        raise SpecError("expected a whole number >= 1", file=c.file, field="decoder_sparse_step", found=step)
    shared = c.int("shared_expert_intermediate_size", None)
    if c.family == "qwen2_moe" and shared:
        # Qwen2-MoE gates its shared expert with a sigmoid of one linear unit per token
        kw.update(moe_shared_expert_intermediate_size=shared, moe_shared_expert_gate=True)
    # transformers' Qwen2MoeDecoderLayer: sparse when not in mlp_only_layers and (i + 1) % step == 0
    return [i not in dense_only and (i + 1) % step == 0 for i in range(layers)]


def _deepseek(c: _Config, kw: dict[str, Any]) -> list[bool]:
    q_lora = c.int("q_lora_rank", None)
    kw.update(ffn_hidden_size=c.int("intermediate_size"), multi_latent_attention=True,
              q_lora_rank=q_lora, kv_lora_rank=c.int("kv_lora_rank"),
              qk_head_dim=c.int("qk_nope_head_dim"), qk_pos_emb_head_dim=c.int("qk_rope_head_dim"),
              v_head_dim=c.int("v_head_dim"))
    kw["num_query_groups"] = kw["num_attention_heads"]  # MLA: the config's KV-head count is the head count
    kw["qk_layernorm"] = True  # the latent norms (kv_a_layernorm, q_a_layernorm): Megatron's --qk-layernorm
    routed = c.int("n_routed_experts", None)
    c.take("n_shared_experts", "moe_intermediate_size", "first_k_dense_replace", "moe_layer_freq",
           "num_experts_per_tok", "topk_method", "n_group", "topk_group", "scoring_func", "seq_aux")
    if not routed:
        return [False] * kw["num_layers"]
    fe = c.int("moe_intermediate_size")
    first_dense = c.int("first_k_dense_replace", 0)
    freq = c.int("moe_layer_freq", 1)
    if freq < 1:
        raise SpecError("expected a whole number >= 1", file=c.file, field="moe_layer_freq", found=freq)
    shared = c.int("n_shared_experts", None)
    kw.update(num_experts=routed, moe_router_topk=c.int("num_experts_per_tok"), moe_ffn_hidden_size=fe,
              moe_shared_expert_intermediate_size=shared * fe if shared else None)
    _deepseek_router(c, kw)
    # transformers' DeepseekV2DecoderLayer: MoE when i >= first_k_dense_replace and i % freq == 0
    return [i >= first_dense and i % freq == 0 for i in range(kw["num_layers"])]


def _deepseek_router(c: _Config, kw: dict[str, Any]) -> None:
    """DeepSeek's top-k method, expert groups and scoring as Megatron-LM's router arguments."""
    method = c.cfg.get("topk_method", "greedy")
    c.must("topk_method", ("greedy", "group_limited_greedy", "noaux_tc"),
           "Megatron-LM's router runs greedy, group-limited and bias-corrected top-k")
    groups, group_topk = c.int("n_group", 1), c.int("topk_group", 1)
    if method != "greedy" and groups and groups > 1:
        kw.update(moe_router_num_groups=groups, moe_router_group_topk=group_topk)
    if method == "noaux_tc":
        kw["moe_router_enable_expert_bias"] = True
    score = c.cfg.get("scoring_func", "softmax")
    c.must("scoring_func", ("softmax", "sigmoid"), "Megatron-LM scores experts by these two")
    kw["moe_router_score_function"] = score
    if method == "noaux_tc":
        kw["moe_router_load_balancing_type"] = "seq_aux_loss" if c.cfg.get("seq_aux") else "none"
    elif c.cfg.get("seq_aux"):
        kw["moe_router_load_balancing_type"] = "seq_aux_loss"


#: The MLP of each family: the keyword arguments it sets, and per layer whether it is MoE.
_MLP: dict[str, Callable[[_Config, dict[str, Any]], list[bool]]] = {
    "llama": _dense_mlp, "mistral": _dense_mlp, "qwen2": _dense_mlp, "qwen3": _dense_mlp, "mixtral": _mixtral,
    "qwen2_moe": _qwen_moe, "qwen3_moe": _qwen_moe, "deepseek_v2": _deepseek, "deepseek_v3": _deepseek,
}


def _refuse_unknown(c: _Config) -> None:
    unknown = sorted(k for k in c.cfg if k not in c.used)
    if unknown:
        raise SpecError("a key this reader cannot honour (it might change the model); remove it if it does "
                        "not, or describe the model by its fields", file=c.file, field=unknown[0],
                        found=c.cfg[unknown[0]],
                        allowed="the keys of the " + c.family + " family: " + ", ".join(sorted(c.used - _IGNORED)))
