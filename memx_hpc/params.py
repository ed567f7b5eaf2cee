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


def kv_hidden(shape: ShapeLike) -> int:
    """Width of K (or V): query groups times head size (GQA; equal to h without GQA)."""
    return shape.num_query_groups * (shape.hidden_size // shape.num_attention_heads)


def mlp_branches(shape: ShapeLike) -> int:
    """SwiGLU's first linear layer has two branches (gate and up); GeLU's one."""
    return 2 if shape.activation == "swiglu" else 1


def norm_params(model: ModelSpec) -> int:
    """LayerNorm has weight and bias; RMSNorm only a weight."""
    return 2 * model.hidden_size if model.normalization == "layernorm" else model.hidden_size


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


def layer_params(model: ModelSpec, tp: int = 1) -> int:
    """Parameters of one transformer layer held by one TP rank.

    Megatron-core's GPT layer (local or Transformer Engine spec, same counts):
    ``linear_qkv`` is column-parallel, ``h x (h + 2·g·d)`` (GQA: K and V have ``g``
    heads); ``linear_proj`` row-parallel ``h x h``; ``linear_fc1`` column-parallel
    ``h x f`` per branch (SwiGLU: 2 branches); ``linear_fc2`` row-parallel ``f x h``.
    Column-parallel biases are split over TP, row-parallel biases are replicated
    (``RowParallelLinear`` adds its bias after the all-reduce). The two norms are
    replicated. Biases exist when ``add_bias_linear`` (megatron-core also has
    ``add_qkv_bias``, which the model spec does not use).
    """
    check_tp(tp, heads=model.num_attention_heads, groups=model.num_query_groups)
    h, f = model.hidden_size, model.ffn_hidden_size
    qkv_out = h + 2 * kv_hidden(model)
    fc1_out = mlp_branches(model) * f
    weights = (h * qkv_out + h * h + h * fc1_out + f * h) // tp
    biases = 0
    if model.add_bias_linear:
        biases = (qkv_out + fc1_out) // tp + 2 * h  # column-parallel split; proj and fc2 replicated
    return weights + biases + 2 * norm_params(model)
