"""A Hugging Face ``config.json`` read into :class:`~memx_hpc.spec.ModelSpec` keyword arguments.

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
from typing import Any, Mapping

from .errors import SpecError
from .spec import load_json

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


def read_hf_config(path: str | os.PathLike) -> dict[str, Any]:
    """ModelSpec keyword arguments for the Hugging Face ``config.json`` at ``path``.

    ``seq_length`` defaults to the config's ``max_position_embeddings`` (what the model was
    built for); a job usually overrides it. Exit-1 errors name the file and the key.
    """
    file = str(path)
    cfg = load_json(path)
    if not isinstance(cfg, Mapping):
        raise SpecError("expected a JSON object (a Hugging Face config.json)", file=file)
    family = cfg.get("model_type")
    if family not in FAMILIES:
        raise SpecError("not a model family this reader knows", file=file, field="model_type", found=family,
                        allowed=", ".join(FAMILIES))
    used: set[str] = set(_IGNORED)

    def take(*keys: str) -> None:
        used.update(keys)

    h = _int(cfg, "hidden_size", file)
    layers = _int(cfg, "num_hidden_layers", file)
    heads = _int(cfg, "num_attention_heads", file)
    take("hidden_size", "num_hidden_layers", "num_attention_heads")
    name = cfg.get("_name_or_path") or f"{family}-h{h}-l{layers}"
    if not isinstance(name, str):
        name = f"{family}-h{h}-l{layers}"
    kw: dict[str, Any] = {
        "name": os.path.basename(name.rstrip("/")) or name, "num_layers": layers, "hidden_size": h,
        "num_attention_heads": heads, "num_query_groups": _int(cfg, "num_key_value_heads", file, heads),
        "vocab_size": _int(cfg, "vocab_size", file), "seq_length": _int(cfg, "max_position_embeddings", file),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)), "position_embedding": "rope",
        "normalization": "rmsnorm", "add_bias_linear": False, "activation": "swiglu",
    }
    take("num_key_value_heads", "vocab_size", "max_position_embeddings", "tie_word_embeddings")
    if not isinstance(cfg.get("tie_word_embeddings", False), bool):
        raise SpecError("expected true or false", file=file, field="tie_word_embeddings",
                        found=cfg.get("tie_word_embeddings"))
    if kw["num_query_groups"] is None:
        kw["num_query_groups"] = heads
    theta = cfg.get("rope_theta", 10000)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) \
            or theta < 1 or theta != int(theta):
        raise SpecError("expected a whole number (Megatron-LM's --rotary-base is an integer)", file=file,
                        field="rope_theta", found=theta)
    kw["rotary_base"] = int(theta)
    take("rope_theta", "rope_scaling")
    kw.update(_rope_scaling(cfg, file))
    # every family here runs a gated SiLU MLP (SwiGLU)
    _must(cfg, "hidden_act", file, ("silu",), "the MLP of these families is SwiGLU (gated SiLU)")
    take("hidden_act")
    # what Megatron cannot express: biases on the attention output but not the MLP, MLP biases
    _must(cfg, "attention_bias", file, (False,), "Megatron-LM biases Q, K, V only (--add-qkv-bias) or every "
                                                 "linear layer (--add-bias-linear), never all attention layers alone")
    _must(cfg, "mlp_bias", file, (False,), "the MLP biases come only with every other linear bias in Megatron-LM")
    # Qwen2/3 configs carry a window size that is unused while use_sliding_window is false
    if cfg.get("use_sliding_window") is not False:
        _must(cfg, "sliding_window", file, (None,), "sliding-window attention is not modelled")
    _must(cfg, "use_sliding_window", file, (False,), "sliding-window attention is not modelled")
    _must(cfg, "layer_types", file, (["full_attention"] * layers,), "every layer runs full attention here")
    take("attention_bias", "mlp_bias", "sliding_window", "use_sliding_window", "layer_types")
    if family in ("qwen2", "qwen2_moe"):
        # Qwen2's attention has biases on Q, K and V (no config key: always on)
        kw["add_qkv_bias"] = True
    if family in ("qwen3", "qwen3_moe"):
        kw["qk_layernorm"] = True  # Qwen3 normalises each head of Q and K (no config key: always on)
    if "head_dim" in cfg and cfg["head_dim"] is not None:
        hd = _int(cfg, "head_dim", file)
        if family.startswith("deepseek"):
            raise SpecError("DeepSeek's head sizes are qk_nope_head_dim, qk_rope_head_dim and v_head_dim",
                            file=file, field="head_dim", found=hd)
        if hd * heads != h:
            kw["head_dim"] = hd
    take("head_dim")

    moe = [False] * layers
    if family == "mixtral":
        f = _int(cfg, "intermediate_size", file)
        kw.update(ffn_hidden_size=f, num_experts=_int(cfg, "num_local_experts", file),
                  moe_router_topk=_int(cfg, "num_experts_per_tok", file), moe_ffn_hidden_size=f)
        _must(cfg, "router_jitter_noise", file, (0, 0.0), "router input jitter is not modelled")
        take("intermediate_size", "num_local_experts", "num_experts_per_tok", "router_jitter_noise")
        moe = [True] * layers
    elif family in ("qwen2_moe", "qwen3_moe"):
        kw.update(ffn_hidden_size=_int(cfg, "intermediate_size", file), num_experts=_int(cfg, "num_experts", file),
                  moe_router_topk=_int(cfg, "num_experts_per_tok", file),
                  moe_ffn_hidden_size=_int(cfg, "moe_intermediate_size", file))
        step = _int(cfg, "decoder_sparse_step", file, 1)
        dense_only = cfg.get("mlp_only_layers", []) or []
        if not isinstance(dense_only, list) or not all(isinstance(i, int) and 0 <= i < layers for i in dense_only):
            raise SpecError("expected a list of layer indices", file=file, field="mlp_only_layers", found=dense_only)
        if not isinstance(step, int) or step < 1:
            raise SpecError("expected a whole number >= 1", file=file, field="decoder_sparse_step", found=step)
        # transformers' Qwen2MoeDecoderLayer: sparse when not in mlp_only_layers and (i + 1) % step == 0
        moe = [i not in dense_only and (i + 1) % step == 0 for i in range(layers)]
        shared = _int(cfg, "shared_expert_intermediate_size", file, None)
        if family == "qwen2_moe" and shared:
            # Qwen2-MoE gates its shared expert with a sigmoid of one linear unit per token
            kw.update(moe_shared_expert_intermediate_size=shared, moe_shared_expert_gate=True)
        take("intermediate_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
             "decoder_sparse_step", "mlp_only_layers", "shared_expert_intermediate_size")
    elif family in ("deepseek_v2", "deepseek_v3"):
        q_lora = _int(cfg, "q_lora_rank", file, None)
        kw.update(ffn_hidden_size=_int(cfg, "intermediate_size", file), multi_latent_attention=True,
                  q_lora_rank=q_lora, kv_lora_rank=_int(cfg, "kv_lora_rank", file),
                  qk_head_dim=_int(cfg, "qk_nope_head_dim", file),
                  qk_pos_emb_head_dim=_int(cfg, "qk_rope_head_dim", file), v_head_dim=_int(cfg, "v_head_dim", file))
        kw["num_query_groups"] = heads  # MLA: the config's KV-head count is the head count
        kw["qk_layernorm"] = True  # the latent norms (kv_a_layernorm, q_a_layernorm): Megatron's --qk-layernorm
        take("intermediate_size", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
             "v_head_dim")
        routed = _int(cfg, "n_routed_experts", file, None)
        take("n_routed_experts", "n_shared_experts", "moe_intermediate_size", "first_k_dense_replace",
             "moe_layer_freq", "num_experts_per_tok", "topk_method", "n_group", "topk_group", "scoring_func",
             "seq_aux")
        if routed:
            fe = _int(cfg, "moe_intermediate_size", file)
            first_dense = _int(cfg, "first_k_dense_replace", file, 0)
            freq = _int(cfg, "moe_layer_freq", file, 1)
            if freq < 1:
                raise SpecError("expected a whole number >= 1", file=file, field="moe_layer_freq", found=freq)
            # transformers' DeepseekV2DecoderLayer: MoE when i >= first_k_dense_replace and i % freq == 0
            moe = [i >= first_dense and i % freq == 0 for i in range(layers)]
            shared = _int(cfg, "n_shared_experts", file, None)
            kw.update(num_experts=routed, moe_router_topk=_int(cfg, "num_experts_per_tok", file),
                      moe_ffn_hidden_size=fe,
                      moe_shared_expert_intermediate_size=shared * fe if shared else None)
            method = cfg.get("topk_method", "greedy")
            _must(cfg, "topk_method", file, ("greedy", "group_limited_greedy", "noaux_tc"),
                  "Megatron-LM's router runs greedy, group-limited and bias-corrected top-k")
            groups, group_topk = _int(cfg, "n_group", file, 1), _int(cfg, "topk_group", file, 1)
            if method != "greedy" and groups and groups > 1:
                kw.update(moe_router_num_groups=groups, moe_router_group_topk=group_topk)
            if method == "noaux_tc":
                kw["moe_router_enable_expert_bias"] = True
            score = cfg.get("scoring_func", "softmax")
            _must(cfg, "scoring_func", file, ("softmax", "sigmoid"), "Megatron-LM scores experts by these two")
            kw["moe_router_score_function"] = score
            if method == "noaux_tc":
                kw["moe_router_load_balancing_type"] = "seq_aux_loss" if cfg.get("seq_aux") else "none"
            elif cfg.get("seq_aux"):
                kw["moe_router_load_balancing_type"] = "seq_aux_loss"
    else:
        kw["ffn_hidden_size"] = _int(cfg, "intermediate_size", file)
        take("intermediate_size")

    if any(moe):
        kw["moe_layer_freq"] = _pattern(layers, moe)
    elif kw.get("num_experts"):
        raise SpecError("no layer of this config is a mixture of experts", file=file, field="mlp_only_layers")
    unknown = sorted(k for k in cfg if k not in used)
    if unknown:
        raise SpecError("a key this reader cannot honour (it might change the model); remove it if it does "
                        "not, or describe the model by its fields", file=file, field=unknown[0],
                        found=cfg[unknown[0]],
                        allowed="the keys of the " + family + " family: " + ", ".join(sorted(used - _IGNORED)))
    return kw
