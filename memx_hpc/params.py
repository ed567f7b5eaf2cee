"""Megatron's counts for a model shape that launching, profiling and the cost model share:
the padded vocabulary and the parameters of one transformer layer (:mod:`memx_hpc.model.analytic`
builds memory and FLOPs on them)."""

from __future__ import annotations

import math
from typing import Union

from .errors import SpecError
from .spec import LayerShape, ModelSpec

ShapeLike = Union[ModelSpec, LayerShape]

#: Megatron-LM's ``--make-vocab-size-divisible-by`` default (megatron/training/arguments.py);
#: the vocabulary is padded to a multiple of this times TP (``_vocab_size_with_padding``).
VOCAB_DIVISIBLE_BY = 128



def check_tp(tp: int, *, heads: int | None = None, groups: int | None = None) -> None:
    """A tensor-parallel degree Megatron can split these heads and query groups by."""
    if not isinstance(tp, int) or tp < 1:
        raise SpecError("tensor-parallel degree must be a whole number >= 1", field="tp", found=tp)
    if heads is not None and heads % tp:
        raise SpecError(f"num_attention_heads {heads} is not divisible by the tensor-parallel degree",
                        field="tp", found=tp, allowed="divisors of num_attention_heads")
    if groups is not None and groups % tp and tp % groups:
        raise SpecError(f"num_query_groups {groups} and the tensor-parallel degree do not divide",
                        field="tp", found=tp)


def head_size(shape: ShapeLike) -> int:
    """Head size of standard attention: ``kv_channels`` (Qwen3: 128 at h/a = 64; ``h / a``
    unless a head size is given)."""
    return shape.kv_channels


def kv_hidden(shape: ShapeLike) -> int:
    """Width of K (or V): query groups times head size (GQA; equal to h without GQA)."""
    return shape.num_query_groups * head_size(shape)


def q_hidden(shape: ShapeLike) -> int:
    """Width of Q and of the attention output: heads times head size (h unless ``head_dim`` says
    otherwise)."""
    return shape.num_attention_heads * head_size(shape)


def is_mla(shape: ShapeLike) -> bool:
    return bool(shape.multi_latent_attention)


def mlp_branches(shape: ShapeLike) -> int:
    """SwiGLU's first linear layer has two branches (gate and up); GeLU's one."""
    return 2 if shape.activation == "swiglu" else 1


def norm_params(model: ModelSpec) -> int:
    """LayerNorm has weight and bias; RMSNorm only a weight."""
    return 2 * model.hidden_size if model.normalization == "layernorm" else model.hidden_size


def _norm(model: ModelSpec, width: int) -> int:
    return 2 * width if model.normalization == "layernorm" else width


def padded_vocab_size(vocab_size: int, tp: int = 1, divisible_by: int = VOCAB_DIVISIBLE_BY) -> int:
    """The embedding rows Megatron-LM allocates for a job of vocabulary ``vocab_size`` as
    memx-hpc launches it: the scripts pass ``--tokenizer-type NullTokenizer --vocab-size V``,
    whose tokenizer adds one end-of-document token (``_NullTokenizer.vocab_size`` is V + 1),
    and ``_vocab_size_with_padding`` rounds that up to a multiple of
    ``make_vocab_size_divisible_by * tp`` (megatron/training/tokenizer/tokenizer.py). For
    tiny-gpt (V = 1,024) that is 1,152 rows, not 1,024; for GPT-2's 50,257 it is 50,304 as
    with the real tokenizer. The one rule for the cost model, the profiler and the trainer.
    """
    multiple = divisible_by * tp
    return int(math.ceil((vocab_size + 1) / multiple) * multiple)


def attention_params(model: ModelSpec, tp: int = 1) -> int:
    """Parameters of one layer's attention (with its input norm) held by one TP rank.

    Standard attention, megatron-core's ``SelfAttention``: ``linear_qkv`` column-parallel
    ``h x (a·d + 2·g·d)`` (GQA: K and V have ``g`` heads of size ``d``), ``linear_proj``
    row-parallel ``a·d x h``; column-parallel biases are split over TP, the row-parallel
    bias is replicated (``RowParallelLinear`` adds it after the all-reduce); ``add_qkv_bias``
    biases ``linear_qkv`` alone. ``qk_layernorm`` adds a norm of width ``d`` for Q and for K
    (replicated).

    Multi-latent attention, megatron-core's ``MLASelfAttention`` (DeepSeek-V2 §2.1): Q is
    projected directly (``h x a·(d_qk + d_rope)``, column-parallel) or, with ``q_lora_rank``
    r_q, down to r_q, normed and up (``r_q x a·(d_qk + d_rope)``, column-parallel); K/V are
    projected down to the latent plus the shared RoPE key (``h x (r_kv + d_rope)``), normed
    (``r_kv``) and up (``r_kv x a·(d_qk + d_v)``, column-parallel); the output projection is
    ``a·d_v x h``, row-parallel. The latent norms exist with ``qk_layernorm`` (megatron-core
    builds them from that flag; DeepSeek's models have them). The down-projections are
    counted replicated over TP, as the Transformer Engine spec builds them (``duplicated``);
    megatron-core's local spec splits them.
    """
    check_tp(tp, heads=model.num_attention_heads, groups=model.num_query_groups)
    h, a = model.hidden_size, model.num_attention_heads
    norm = norm_params(model)
    if model.multi_latent_attention:
        qk, rope, v = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
        n = norm
        if model.q_lora_rank is None:
            n += h * a * (qk + rope) // tp
        else:
            n += h * model.q_lora_rank + model.q_lora_rank * a * (qk + rope) // tp
            if model.qk_layernorm:
                n += _norm(model, model.q_lora_rank)
        n += h * (model.kv_lora_rank + rope) + (_norm(model, model.kv_lora_rank) if model.qk_layernorm else 0)
        n += model.kv_lora_rank * a * (qk + v) // tp + a * v * h // tp
        if model.add_bias_linear:
            n += h
        return n
    qkv_out = q_hidden(model) + 2 * kv_hidden(model)
    n = norm + (h * qkv_out + q_hidden(model) * h) // tp
    if model.add_bias_linear:
        n += qkv_out // tp + h
    elif model.add_qkv_bias:
        n += qkv_out // tp
    if model.qk_layernorm:
        n += 2 * _norm(model, head_size(model))
    return n


def _mlp_params(model: ModelSpec, width: int, split: int) -> int:
    """One MLP of per-branch width ``width`` split ``split`` ways (fc1 column-, fc2 row-parallel)."""
    h, br = model.hidden_size, mlp_branches(model)
    n = (h * br * width + width * h) // split
    if model.add_bias_linear:
        n += br * width // split + h
    return n


def is_moe_layer(model: ModelSpec, layer: int) -> bool:
    """Whether layer ``layer`` (0-based) of ``model`` has the mixture of experts as its MLP."""
    return model.moe_layers[layer]


def mlp_params(model: ModelSpec, tp: int = 1, *, moe: bool = False, ep: int = 1, etp: int | None = None,
               active: bool = False) -> int:
    """Parameters of one layer's MLP block (with its pre-MLP norm) held by one rank.

    Dense: ``linear_fc1`` column-parallel ``h x f`` per branch, ``linear_fc2`` row-parallel
    ``f x h`` (biases as in :func:`attention_params`). MoE (megatron-core's ``MoELayer``):
    the router's ``E x h`` weight (and ``E`` bias with ``add_bias_linear``; replicated), the ``E / ep`` routed experts this rank
    holds, each ``h x f_e`` per branch and ``f_e x h`` split over expert TP ``etp``
    (Megatron's default: the TP degree), the shared experts of total width ``f_s`` split
    over TP, and the shared expert's ``h``-wide sigmoid gate when it has one.
    ``active``: what one token runs (top-k experts, the whole model on one rank).
    """
    n = norm_params(model)
    if not moe:
        return n + _mlp_params(model, model.ffn_hidden_size, tp)
    if model.num_experts is None:
        raise SpecError("not a mixture of experts", field="num_experts", found=None)
    etp = tp if etp is None else etp
    if model.num_experts % ep:
        raise SpecError(f"num_experts {model.num_experts} is not divisible by the expert-parallel degree",
                        field="ep", found=ep, allowed="divisors of num_experts")
    experts = model.moe_router_topk if active else model.num_experts // ep
    router = model.num_experts * (model.hidden_size + (1 if model.add_bias_linear else 0))  # TopKRouter's bias
    n += router + experts * _mlp_params(model, model.expert_ffn_hidden_size, etp)
    if model.moe_shared_expert_intermediate_size is not None:
        n += _mlp_params(model, model.moe_shared_expert_intermediate_size, tp)
        if model.moe_shared_expert_gate:
            n += model.hidden_size
    return n


def layer_params(model: ModelSpec, tp: int = 1, *, layer: int | None = None, ep: int = 1,
                 etp: int | None = None) -> int:
    """Parameters of one transformer layer held by one TP rank (:func:`attention_params` +
    :func:`mlp_params`; megatron-core's GPT layer, local or Transformer Engine spec, same counts).

    ``layer``: which layer (0-based), for a mixture of experts whose layers differ (dense
    first layers, ``moe_layer_freq``); None for a model whose layers are all alike (a
    dense model, or one whose every layer is MoE). ``ep`` / ``etp``: expert-parallel and
    expert-tensor-parallel degrees of the routed experts.
    """
    if layer is None:
        kinds = set(model.moe_layers)
        if len(kinds) > 1:
            raise SpecError("the layers of this model differ (dense and MoE): say which", field="layer",
                            allowed=f"0 to {model.num_layers - 1}")
        moe = kinds == {True}
    else:
        moe = is_moe_layer(model, layer)
    return attention_params(model, tp) + mlp_params(model, tp, moe=moe, ep=ep, etp=etp)


def layers_params(model: ModelSpec, first_layer: int, num_layers: int, tp: int = 1, *, ep: int = 1,
                  etp: int | None = None) -> int:
    """Parameters of layers ``first_layer .. first_layer + num_layers - 1`` on one rank."""
    if len(set(model.moe_layers)) == 1 and first_layer >= 0 and num_layers >= 0:
        return num_layers * layer_params(model, tp, ep=ep, etp=etp)  # all layers alike
    if first_layer < 0 or num_layers < 0 or first_layer + num_layers > model.num_layers:
        raise SpecError(f"layers {first_layer}..{first_layer + num_layers - 1} of a {model.num_layers}-layer model",
                        field="num_layers", found=num_layers)
    moe = model.moe_layers[first_layer:first_layer + num_layers]
    n_moe = sum(moe)
    attn = attention_params(model, tp)
    out = num_layers * attn + (num_layers - n_moe) * mlp_params(model, tp)
    if n_moe:
        out += n_moe * mlp_params(model, tp, moe=True, ep=ep, etp=etp)
    return out


def expert_params(model: ModelSpec, first_layer: int, num_layers: int, *, ep: int = 1, etp: int = 1) -> int:
    """The routed experts among :func:`layers_params`: Megatron reduces their gradients and
    shards their optimizer states over the *expert* data-parallel group
    (``world / (pp · ep · etp)`` ranks, megatron-core ``parallel_state``), not over the
    data-parallel group of the other parameters."""
    if not model.is_moe:
        return 0
    n_moe = sum(model.moe_layers[first_layer:first_layer + num_layers])
    return n_moe * (model.num_experts // ep) * _mlp_params(model, model.expert_ffn_hidden_size, etp)


def model_params(model: ModelSpec, *, pad_vocab: bool = True, active: bool = False) -> int:
    """Parameters of the whole model on one device (TP = PP = EP = 1): layers, word embedding,
    learned positions, final norm and an untied output layer. ``pad_vocab``: the rows
    Megatron-LM allocates (:func:`padded_vocab_size`); False: the config's vocabulary, as
    model cards count. ``active``: what one token runs (top-k routed experts)."""
    v = padded_vocab_size(model.vocab_size) if pad_vocab else model.vocab_size
    h = model.hidden_size
    n = v * h * (1 if model.tied_embeddings else 2) + norm_params(model)
    if model.position_embedding == "learned":
        n += model.seq_length * h
    attn = attention_params(model)
    for moe in model.moe_layers:
        n += attn + mlp_params(model, moe=moe, active=active)
    return n
