"""Closed-form costs of a Megatron-LM GPT model: parameters, state and activation memory, FLOPs.

These are the priors and features of the predictor, not its answer: measured
samples correct them. Every formula names its source. Conventions:

* counts are *per tensor-parallel rank* (what one GPU holds) unless said otherwise;
* ``e`` is bytes per activation element of ``precision`` (bf16/fp16: 2, fp32: 4),
  ``m`` bytes per dropout-mask element (1 on CUDA/ROCm; 0 when dropout is off);
* ``s`` sequence length, ``b`` micro-batch size, ``h`` hidden size, ``a`` attention
  heads, ``g`` query groups (GQA), ``d = h / a`` head size, ``f`` FFN width per branch,
  ``t`` tensor-parallel degree, ``V`` padded vocabulary.

Only :func:`exact_params_megatron` imports torch/megatron-core, and it does so in a
child process so that no process group or model-parallel state leaks into the caller.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Union

from ..errors import SpecError, SystemFailure
from ..params import check_tp as _check_tp, kv_hidden as _kv_hidden, norm_params as _norm_params
from ..params import is_mla as _is_mla, q_hidden as _q_hidden
from ..params import expert_params, layer_params, layers_params, model_params, padded_vocab_size  # noqa: F401 (API)
from ..spec import BYTES_PER_ELEMENT, GpuType, LayerShape, ModelSpec, Recompute

ShapeLike = Union[ModelSpec, LayerShape]

#: Bytes per parameter of the optimizer states: Adam keeps fp32 first and second moments,
#: Megatron's SGD keeps one fp32 momentum buffer.
_OPTIMIZER_STATE_BYTES = {"adam": 8, "sgd": 4}

ATTENTION_KINDS = ("sdpa", "core")


# --------------------------------------------------------------------------- helpers


def _bytes_per_element(precision: str) -> int:
    try:
        return BYTES_PER_ELEMENT[precision]
    except KeyError:
        raise SpecError("unknown precision", field="precision", found=precision,
                        allowed=", ".join(BYTES_PER_ELEMENT)) from None


# --------------------------------------------------------------------------- parameters


def embedding_params(model: ModelSpec, tp: int = 1) -> int:
    """Input embedding on the first stage: word embeddings sharded over TP (padded vocabulary,
    ``VocabParallelEmbedding``) plus learned position embeddings (replicated) when
    ``position_embedding == 'learned'``; RoPE has no parameters.
    """
    _check_tp(tp)
    words = padded_vocab_size(model.vocab_size, tp) * model.hidden_size // tp
    pos = model.seq_length * model.hidden_size if model.position_embedding == "learned" else 0
    return words + pos


def head_params(model: ModelSpec, tp: int = 1, *, pp: int = 1) -> int:
    """Output layer on the last stage (column-parallel ``V x h``, no bias).

    With tied embeddings and one pipeline stage the output layer *is* the word
    embedding: 0 extra parameters. With ``pp > 1`` Megatron keeps a copy of the word
    embedding on the last stage and all-reduces its gradient with the first stage
    (``LanguageModule.setup_embeddings_and_output_layer``), so the copy counts there.
    """
    _check_tp(tp)
    if model.tied_embeddings and pp == 1:
        return 0
    return padded_vocab_size(model.vocab_size, tp) * model.hidden_size // tp


def stage_first_layer(model: ModelSpec, num_layers: int, *, first: bool, last: bool) -> int:
    """The first layer (0-based) of a stage of ``num_layers`` layers where only its place is
    known: 0 on the first stage, ``num_layers - n`` on the last; a middle stage of a model
    whose layers differ (dense and MoE, ``moe_layer_freq``) holds the ``n`` consecutive layers
    with the most MoE layers (the latest such run): for a model whose first layers are dense
    (DeepSeek's ``first_k_dense_replace``) the MoE layers after them, which is where a middle
    stage sits once the first stage holds the dense layers; otherwise the heaviest stage."""
    if first or (not last and len(set(model.moe_layers)) == 1):
        return 0
    n, total = int(num_layers), model.num_layers
    if last or n >= total:
        return max(0, total - n)
    moe = model.moe_layers
    best, start = -1, 0
    run = sum(moe[:n])
    for s in range(total - n + 1):
        if s:
            run += moe[s + n - 1] - moe[s - 1]
        if run >= best:
            best, start = run, s
    return start


def stage_params(model: ModelSpec, num_layers: int, *, first: bool, last: bool, tp: int, pp: int,
                 first_layer: int | None = None, ep: int = 1, etp: int | None = None) -> int:
    """Parameters one rank of a pipeline stage holds: its layers, the embedding on the first
    stage, the output layer (see :func:`head_params`) and the final norm on the last.

    ``first_layer``: the stage's first layer (0-based); None: :func:`stage_first_layer`.
    ``ep`` / ``etp``: the routed experts' expert-parallel and expert-tensor-parallel degrees
    (:func:`memx_hpc.params.mlp_params`).
    """
    if num_layers < 0:
        raise SpecError("a stage cannot have a negative number of layers", field="num_layers", found=num_layers)
    if first_layer is None:
        first_layer = stage_first_layer(model, num_layers, first=first, last=last)
    n = layers_params(model, first_layer, num_layers, tp, ep=ep, etp=etp) if num_layers else 0
    if first:
        n += embedding_params(model, tp)
    if last:
        n += head_params(model, tp, pp=pp) + _norm_params(model)
    return n


#: FP8 recipes whose tensors share one scale (per tensor: delayed and current/tensorwise
#: scaling): their column-wise copy is the row-wise data transposed, which FP8 GEMMs in non-TN
#: layouts read in place. ``mxfp8`` and ``blockwise`` scale blocks along one axis, so the
#: column-wise copy is a second quantization that every GPU keeps.
PER_TENSOR_FP8_RECIPES = ("delayed", "tensorwise")


def fp8_weight_bytes(layer_params: float, recipe: str, *, non_tn_gemm: bool = False) -> float:
    """Transformer Engine's FP8 copies of the layers' GEMM weights, 1 byte each per parameter:
    the FP8 weight and its transpose (the backward GEMMs read the transpose); ``mxfp8`` keeps
    row- and column-wise copies with one E8M0 scale byte per 32 elements each. The amax
    history (default length 1) is a few scalars per tensor. Without ``--fp8-param-gather``
    these sit beside the 16-bit weights Megatron keeps; with it they are the weights
    (:func:`memx_hpc.model.compose.fp8_state_bytes`).

    ``non_tn_gemm``: the GPU's FP8 GEMMs take non-TN layouts
    (:func:`memx_hpc.spec.fp8_gemm_takes_non_tn_layouts`: compute capability 10.x and 13+).
    Transformer Engine then makes no transpose of a per-tensor-scaled FP8 tensor
    (``Float8Quantizer`` / ``Float8CurrentScalingQuantizer`` create ``_transpose`` only when
    ``is_non_tn_fp8_gemm_supported()`` is false: transformer_engine/pytorch/tensor/
    float8_tensor.py): the weight is one byte per parameter. Block-scaled recipes
    (:data:`PER_TENSOR_FP8_RECIPES` names the others) keep both copies everywhere."""
    if recipe == "mxfp8":
        per = 2.0 + 2.0 / 32.0
    elif non_tn_gemm and recipe in PER_TENSOR_FP8_RECIPES:
        per = 1.0
    else:
        per = 2.0
    return per * float(layer_params)


def state_parts(params: int, *, precision: str, optimizer: str, distributed_optimizer: bool, dp: int,
                grad_reduce_in_fp32: bool = True) -> dict[str, int]:
    """:func:`state_bytes` by part: ``weights`` (the model's ``e``-byte parameters), ``grads``
    (the gradient buffer) and ``optimizer`` (fp32 main parameters and gradients where the
    precision has them, and the optimizer's moments: what the distributed optimizer shards)."""
    if params < 0:
        raise SpecError("parameter count must be >= 0", field="params", found=params)
    if optimizer not in _OPTIMIZER_STATE_BYTES:
        raise SpecError("unknown optimizer", field="optimizer", found=optimizer,
                        allowed=", ".join(_OPTIMIZER_STATE_BYTES))
    if dp < 1:
        raise SpecError("data-parallel degree must be >= 1", field="dp", found=dp)
    e = _bytes_per_element(precision)
    opt = _OPTIMIZER_STATE_BYTES[optimizer]
    if precision == "bf16":
        # megatron-core distributed_data_parallel.py: grad_dtype = float32 if
        # ddp_config.grad_reduce_in_fp32 else param.dtype
        weights, grads, shardable = 2, 4 if grad_reduce_in_fp32 else 2, 4 + opt
    elif precision == "fp16":
        weights, grads, shardable = 2, 2, 4 + 4 + opt
    else:
        weights, grads, shardable = e, e, opt
    sharded = math.ceil(shardable * params / dp) if distributed_optimizer else shardable * params
    return {"weights": weights * params, "grads": grads * params, "optimizer": sharded}


def state_bytes(params: int, *, precision: str, optimizer: str, distributed_optimizer: bool, dp: int,
                grad_reduce_in_fp32: bool = True) -> int:
    """Weights + gradients + optimizer states per GPU for ``params`` parameters, as Megatron holds them.

    Source: Megatron-LM ``docs/source/api-guide/dist_optimizer.md`` (bytes per parameter,
    non-distributed / distributed over ``d`` data-parallel ranks):
    fp16 params & grads: 20 / 4 + 16/d; bf16 params, fp32 grads: 18 / 6 + 12/d;
    fp32: 16 / 8 + 8/d — the ZeRO-1 partitioning of Rajbhandari et al. 2020 (§5.1).
    Decomposition (:func:`state_parts`): the model weights (e bytes) and the gradient buffer
    (fp32 for bf16, because Megatron accumulates bf16 gradients in fp32 -- unless
    ``grad_reduce_in_fp32`` is off (``--grad-reduce-in-bf16``): then bf16, 16 / 4 + 12/d;
    e bytes otherwise) are never sharded; the fp32 main parameters (mixed precision only),
    the fp32 main gradients (fp16 only) and the optimizer states (Adam 8, SGD 4 bytes) are
    sharded by the distributed optimizer.
    """
    return sum(state_parts(params, precision=precision, optimizer=optimizer,
                           distributed_optimizer=distributed_optimizer, dp=dp,
                           grad_reduce_in_fp32=grad_reduce_in_fp32).values())


# --------------------------------------------------------------------------- activations


def _attention_widths(shape: ShapeLike, attention: str) -> tuple[int, int, int, int]:
    """Per-token widths of Q, K and V as the attention kernel keeps them, and of the output
    projection's input. megatron-core's unfused DotProductAttention expands GQA's K and V to
    all heads (repeat_interleave) before the batched matmuls, so they are saved at full width;
    SDPA / flash attention keep the g-head tensors. Multi-latent attention expands its latent
    to per-head K (``d_qk + d_rope``) and V (``d_v``) before the kernel."""
    if _is_mla(shape):
        a = shape.num_attention_heads
        qk = shape.qk_head_dim + shape.qk_pos_emb_head_dim
        return a * qk, a * qk, a * shape.v_head_dim, a * shape.v_head_dim
    q = _q_hidden(shape)
    kv = q if attention == "core" else _kv_hidden(shape)
    return q, kv, kv, q


def _terms(shape: ShapeLike, *, micro_batch_size: int, precision: str, attention: str,
           dropout_mask_bytes: int, moe: bool = False, fp8: bool = False) -> dict[str, float]:
    """Per-layer saved-activation bytes, split into what TP replicates (without sequence
    parallelism), what it divides, what expert TP divides (routed experts) and the attention
    scores, before any division (t = 1)."""
    if attention not in ATTENTION_KINDS:
        raise SpecError("unknown attention kind", field="attention", found=attention,
                        allowed=", ".join(ATTENTION_KINDS))
    if micro_batch_size < 1:
        raise SpecError("micro-batch size must be >= 1", field="micro_batch_size", found=micro_batch_size)
    e = _bytes_per_element(precision)
    m = dropout_mask_bytes
    s, b, h = shape.seq_length, micro_batch_size, shape.hidden_size
    a, f = shape.num_attention_heads, shape.ffn_hidden_size
    sb = s * b
    q, k, v, proj = _attention_widths(shape, attention)
    act = 3 if shape.activation == "swiglu" else 2  # GeLU: its input + fc2 input; SwiGLU: fc1 out (2f) + fc2 in
    # Korthikanti et al. 2022, §4.1 (attention 11sbh + 5as²b, MLP 19sbh, norms 4sbh at e=2, m=1),
    # generalised to e, m, GQA, head sizes other than h/a and SwiGLU:
    replicated = sb * (
        2 * e * h  # inputs of the two norms
        + e * h  # QKV matmul input (first norm's output)
        + e * h  # MLP fc1 input (second norm's output; the router's and experts' input under MoE)
        + 2 * m * h  # dropout masks after attention and after the MLP
    )
    if _is_mla(shape):
        # the down-projections are replicated over TP: the normed K/V latent is kept as the
        # norm's input and the up-projection's input, the RoPE key part once; the same for Q's
        # latent when Q is compressed
        replicated += sb * e * (2 * shape.kv_lora_rank + shape.qk_pos_emb_head_dim
                                + (2 * shape.q_lora_rank if shape.q_lora_rank else 0))
    divided = sb * e * (q + k + v + proj)  # Q, K (for QK^T), V (attention over values), linear_proj input
    # FP8 (Transformer Engine): a GEMM saves its input for the weight gradient as the FP8 tensor
    # it multiplied, 1 byte per element -- the QKV and fc1 inputs (TE's LayerNormLinear keeps
    # only the quantised norm output) and fc2's input; linear_proj's FP8 input is a copy beside
    # the 16-bit attention output the fused attention kernel keeps for its own backward.
    g8 = e - 1 if fp8 and e > 1 else 0
    if g8:
        divided += sb * proj
        if not _is_mla(shape):
            replicated -= sb * g8 * h  # QKV input
    expert = 0.0
    if moe:
        model: ModelSpec = shape  # type: ignore[assignment]
        n_exp, topk, fe = model.num_experts, model.moe_router_topk, model.expert_ffn_hidden_size
        # the router keeps its fp32 logits and scores (E each per token); every token is permuted to
        # its k experts, whose fc1 input is kept per routed copy (replicated over expert TP: the
        # dispatcher gathers the tokens) and whose interior expert TP divides; shared experts as
        # a dense MLP of their width. megatron-core (0.16: transformer/moe/experts.py) weights
        # each copy by its routing probability inside the activation (weighted_bias_swiglu_impl
        # keeps its input and the fp32 probability, fusions/fused_bias_swiglu.py) and unpermutes
        # without probabilities (token_dispatcher.py: unpermute(..., probs=None) keeps only the
        # index map), so the experts' output is not kept.
        # Under FP8 the experts' GEMMs (Transformer Engine's GroupedLinear) save their inputs as
        # the FP8 tensors they multiplied, as the dense MLP's do: each routed copy's fc1 input
        # and fc2 input at 1 byte per element
        replicated += sb * (2 * 4 * n_exp + topk * ((e - g8) * h + 4))
        expert = sb * topk * (e * fe * act - g8 * fe)
        if model.moe_shared_expert_intermediate_size is not None:
            divided += sb * e * model.moe_shared_expert_intermediate_size * act
    else:
        divided += sb * (e * f * act - g8 * f)  # fc2's input in FP8
        replicated -= sb * g8 * h  # fc1's input (the MoE router reads the 16-bit norm output)
    if attention == "core":
        # softmax output (e), its dropout mask (m) and the dropout output (e) per score;
        # without attention dropout the softmax output is the only copy.
        per_score = (2 * e + m) if m > 0 else e
        scores = a * s * s * b * per_score
    else:
        # fused attention keeps only the log-sum-exp, fp32, one per head and token.
        scores = 4 * a * s * b
    return {"replicated": replicated, "divided": divided, "expert": expert, "scores": scores, "input": e * sb * h}


def activation_bytes_per_layer(model: ShapeLike, *, micro_batch_size: int, tp: int, recompute: str,
                               precision: str, attention: str, sequence_parallel: bool = False,
                               dropout_mask_bytes: int = 1, moe_layer: bool = False, etp: int | None = None,
                               moe_imbalance: float = 1.0, cp: int = 1, fp8: str = "") -> int:
    """Bytes one transformer layer keeps for backward, per in-flight micro-batch, on one TP rank.

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models", Eq. 1-2 and Table 2, generalised (``e`` bytes per element, ``m`` per mask
    element; the paper has e=2, m=1):

    * no recompute, unfused ("core") attention: ``sbh(16e + 2m) + a·s²·b·(2e + m)``;
      with fused SDPA/flash attention the s² matrices are not kept, only the fp32
      log-sum-exp: ``sbh(16e + 2m) + 4·a·s·b``;
    * selective recompute (core attention recomputed): ``sbh(16e + 2m)``;
    * full recompute: only the layer input, ``e·sbh``.

    GQA shrinks K and V to ``g·d`` wide for SDPA (the unfused kernel expands them); SwiGLU
    keeps fc1's two-branch output (2f) and fc2's input (f) instead of GeLU's 2 × f.
    Tensor parallelism divides Q/K/V, the projection input, the MLP interior and the
    scores by ``t``; the norm inputs, the two matmul inputs and the dropout masks are
    replicated unless sequence parallelism also divides them (the paper's
    ``sbh(10 + 24/t + 5as/(ht))``). The full-recompute checkpoint is replicated without
    sequence parallelism (Megatron's ``distribute_saved_activations`` is off by default).
    Small per-token statistics of the norms (mean/rstd) are left out (< 0.1 %).

    ``moe_layer`` (a ModelSpec with experts): the MLP terms are the router's fp32 logits and
    scores (``8·E`` bytes per token), per routed token copy (``k`` per token) the experts'
    input (``e·h``; not their output: megatron-core applies the routing probability inside the
    activation, whose fp32 weight it keeps, 4 bytes) and their interior (``e·f_e·3`` SwiGLU) divided by expert TP
    ``etp`` (None: ``tp``), and the shared experts as a dense MLP of their width. Expert
    parallelism moves tokens but leaves each rank ``k`` copies of its own tokens on average;
    ``moe_imbalance`` (>= 1) scales the routed terms for the most loaded rank. Multi-latent
    attention keeps its per-head K (``d_qk + d_rope``) and V (``d_v``) and, replicated, its
    normed latents.

    ``cp`` (context parallel): each rank holds ``s / cp`` of the sequence, so every term is
    divided by ``cp`` (Megatron splits the sequence into ``2·cp`` chunks, rank r taking
    chunks r and ``2cp - 1 - r``, so causal work and memory balance). Context parallel runs
    fused attention only (Transformer Engine's); the unfused kernel's s² scores are refused.

    ``fp8`` (a Transformer Engine FP8 format; "" none): a GEMM's input is saved as the FP8
    tensor it multiplied (TE ``Linear``/``LayerNormLinear`` keep the quantised input for the
    weight-gradient GEMM), 1 byte per element instead of ``e``: the QKV and fc1 inputs and
    fc2's input; linear_proj's FP8 input is an extra byte per element beside the 16-bit
    attention output the fused kernel keeps. Per-tensor scales are negligible; MXFP8's one
    byte per 32 elements is left out (3 %).
    """
    if not isinstance(cp, int) or cp < 1:
        raise SpecError("context-parallel degree must be a whole number >= 1", field="cp", found=cp)
    if cp > 1 and attention == "core":
        raise SpecError("context parallel runs fused attention only", field="attention", found=attention,
                        allowed="sdpa")
    if model.seq_length % (2 * cp) and cp > 1:
        raise SpecError(f"seq_length {model.seq_length} is not divisible by 2 x the context-parallel degree",
                        field="cp", found=cp)
    Recompute.check_mode(recompute)
    _check_tp(tp, heads=model.num_attention_heads, groups=model.num_query_groups)
    if dropout_mask_bytes < 0:
        raise SpecError("dropout mask bytes must be >= 0", field="dropout_mask_bytes", found=dropout_mask_bytes)
    if moe_layer and not model.is_moe:
        raise SpecError("an MoE layer needs a model with experts", field="num_experts", found=None)
    if not moe_imbalance >= 1.0:
        raise SpecError("the most loaded expert rank holds at least the mean", field="moe_imbalance",
                        found=moe_imbalance, allowed="numbers >= 1")
    if isinstance(model, LayerShape):
        moe_layer = model.is_moe
    t = _terms(model, micro_batch_size=micro_batch_size, precision=precision, attention=attention,
               dropout_mask_bytes=dropout_mask_bytes, moe=moe_layer, fp8=bool(fp8))
    if recompute == "full":
        return int(t["input"] // (tp * cp) if sequence_parallel else t["input"] // cp)
    rep = t["replicated"] / tp if sequence_parallel else t["replicated"]
    total = rep + t["divided"] / tp + moe_imbalance * t["expert"] / (tp if etp is None else etp)
    if recompute == "none":
        total += t["scores"] / tp
    return int(round(total / cp))


def cp_kv_exchange_bytes(model: ModelSpec | LayerShape, *, micro_batch_size: int, precision: str,
                         cp: int) -> tuple[float, float]:
    """Bytes one rank sends per layer for ring attention over ``cp`` ranks: (forward, backward).

    Forward: ``cp - 1`` steps, each passing the rank's K and V block (``s/cp`` tokens of
    ``2·g·d`` elements; MLA: the per-head K and V) to the next rank while attention runs on
    the block it holds (Liu et al. 2023, Ring Attention; Megatron's p2p context parallel in
    Transformer Engine). Backward passes K, V and their gradients around the ring again:
    twice the forward's bytes. The steps overlap the attention kernel; what does not overlap
    is the composition's to judge.
    """
    if cp <= 1:
        return 0.0, 0.0
    e = _bytes_per_element(precision)
    _, k, v, _ = _attention_widths(model, "sdpa")
    block = model.seq_length // cp * micro_batch_size * (k + v) * e
    return float((cp - 1) * block), float(2 * (cp - 1) * block)


def embedding_activation_bytes(shape: ShapeLike, *, micro_batch_size: int, tp: int, precision: str,
                               sequence_parallel: bool = False, dropout_mask_bytes: int = 1) -> int:
    """Saved activations of the input embedding: only its output dropout mask (``m·sbh``);
    the lookup keeps the token ids, which are negligible (Korthikanti et al. 2022, §4.3)."""
    s, b, h = shape.seq_length, micro_batch_size, shape.hidden_size
    total = dropout_mask_bytes * s * b * h
    return int(total // tp if sequence_parallel else total)


def head_activation_bytes(shape: ShapeLike, *, micro_batch_size: int, tp: int, precision: str,
                          sequence_parallel: bool = False) -> int:
    """Saved activations of the final norm, output layer and loss: the norm input and the
    output layer's input (``e·sbh`` each; replicated without sequence parallelism) and the
    fp32 logits the cross entropy keeps (``4·s·b·V/t``, Korthikanti et al. 2022, §4.3)."""
    e = _bytes_per_element(precision)
    s, b, h = shape.seq_length, micro_batch_size, shape.hidden_size
    v = padded_vocab_size(shape.vocab_size, tp)
    rep = 2 * e * s * b * h
    if sequence_parallel:
        rep //= tp
    return int(rep + 4 * s * b * v // tp)


def head_logits_transient_bytes(shape: ShapeLike, *, micro_batch_size: int, tp: int, precision: str) -> int:
    """What the loss allocates on the last stage beyond the activations it keeps
    (:func:`head_activation_bytes` counts the fp32 logits the cross entropy saves): the output
    layer's logits in the training precision (``e·s·b·V/t``) while their fp32 copy is made --
    Megatron computes the loss on ``output.float()`` (megatron/legacy/model/gpt_model.py,
    ``post_language_model_processing``; megatron-core's ``compute_language_model_loss`` the
    same unless ``--cross-entropy-loss-fusion``), so both are live at once -- and again in
    the backward pass, where the gradient of the fp32 copy is cast back to the logits'
    precision. Zero in fp32, whose ``float()`` is the tensor itself."""
    e = _bytes_per_element(precision)
    if e >= 4:
        return 0
    v = padded_vocab_size(shape.vocab_size, tp)
    return int(e * shape.seq_length * micro_batch_size * v // tp)


# --------------------------------------------------------------------------- FLOPs and bytes moved


def _attention_flops(shape: ShapeLike, *, micro_batch_size: int) -> tuple[float, float]:
    """Forward FLOPs of one layer's attention: (projections, scores and attention over values)."""
    s, b, h = shape.seq_length, micro_batch_size, shape.hidden_size
    sb = s * b
    if _is_mla(shape):
        a = shape.num_attention_heads
        qk, rope, v = shape.qk_head_dim, shape.qk_pos_emb_head_dim, shape.v_head_dim
        rq, rkv = shape.q_lora_rank, shape.kv_lora_rank
        q_proj = 2 * sb * h * a * (qk + rope) if rq is None else 2 * sb * (h * rq + rq * a * (qk + rope))
        proj = q_proj + 2 * sb * h * (rkv + rope) + 2 * sb * rkv * a * (qk + v) + 2 * sb * a * v * h
        return float(proj), float(2 * b * s * s * a * (qk + rope) + 2 * b * s * s * a * v)
    q, kv = _q_hidden(shape), _kv_hidden(shape)
    return float(2 * sb * h * (q + 2 * kv) + 2 * sb * q * h), float(4 * b * s * s * q)


def layer_flops(model_or_shape: ShapeLike, *, micro_batch_size: int, moe_layer: bool = False) -> float:
    """Forward FLOPs of one transformer layer (whole layer, all TP ranks together).

    Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
    Clusters", §5.1: ``24·b·s·h² + 4·b·s²·h`` per layer forward (multiply-add = 2 FLOPs),
    generalised: QKV ``2sbh(a·d + 2gd)``, projection ``2sb·a·d·h``, MLP ``2sbhf`` per matrix
    (GeLU 2 matrices, SwiGLU 3), scores and attention over values ``4bs²·a·d`` (the paper
    counts the full s² product, causal masking or not). Backward is 2x forward.
    Multi-latent attention: its down/up projections and per-head sizes (DeepSeek-V2 §2.1).
    ``moe_layer``: the router ``2sbh·E``, the ``k`` experts each token runs and the shared
    experts in place of the dense MLP (Megatron-LM's ``num_floating_point_operations``).
    """
    s, b, h = model_or_shape.seq_length, micro_batch_size, model_or_shape.hidden_size
    mats = 3 if model_or_shape.activation == "swiglu" else 2
    proj, scores = _attention_flops(model_or_shape, micro_batch_size=b)
    if isinstance(model_or_shape, LayerShape):
        moe_layer = model_or_shape.is_moe  # a layer shape says which kind of layer it is
    if moe_layer:
        m: ModelSpec = model_or_shape  # type: ignore[assignment]
        if not m.is_moe:
            raise SpecError("an MoE layer needs a model with experts", field="num_experts", found=None)
        mlp = 2 * s * b * h * (m.num_experts + m.moe_router_topk * m.expert_ffn_hidden_size * mats)
        if m.moe_shared_expert_intermediate_size is not None:
            mlp += 2 * s * b * h * m.moe_shared_expert_intermediate_size * mats
            if m.moe_shared_expert_gate:
                mlp += 2 * s * b * h
    else:
        mlp = 2 * s * b * h * model_or_shape.ffn_hidden_size * mats
    return float(proj + scores + mlp)


def attention_score_flops(model_or_shape: ShapeLike, *, micro_batch_size: int) -> float:
    """The ``4·b·s²·a·d`` part of :func:`layer_flops` (what selective recompute repeats)."""
    return _attention_flops(model_or_shape, micro_batch_size=micro_batch_size)[1]


def moe_dispatch_bytes(model: ShapeLike, *, micro_batch_size: int, precision: str) -> float:
    """Bytes one rank sends in the token dispatch of one MoE layer's forward, and again in the
    combine: each of its ``s·b`` tokens goes to ``k`` experts (``k·s·b·h·e``; the fraction
    ``(ep - 1) / ep`` of it leaves the rank under balanced routing). Megatron's all-to-all
    token dispatcher (``MoEAlltoAllTokenDispatcher``); backward moves the same again."""
    if not model.is_moe:
        raise SpecError("not a mixture of experts", field="num_experts", found=None)
    return float(model.moe_router_topk * model.seq_length * micro_batch_size * model.hidden_size
                 * _bytes_per_element(precision))


#: The expert-parallel rank that receives the most routed tokens, over the mean (tokens x
#: top-k / EP per rank), until measured: the expert capacity factor 1.25 that Switch
#: Transformers provision above an even share (Fedus, Zoph & Shazeer 2022, JMLR 23(120),
#: arXiv:2101.03961, §2.1-2.2 and Table 1: capacity factors 1.0 and 1.25 compared under
#: the auxiliary load-balancing loss). Megatron's dropless default drops nothing, so the most
#: loaded rank runs (and keeps the activations of) that much more than the mean, and the
#: others wait for it at the combine. With EP 1 every token's experts are on its rank: 1.
MOE_IMBALANCE = 1.25


def moe_imbalance(ep: int) -> float:
    """:data:`MOE_IMBALANCE` where the experts are spread over ``ep > 1`` ranks, else 1."""
    return MOE_IMBALANCE if ep > 1 else 1.0


def moe_layer_flops(shape: ShapeLike, *, micro_batch_size: int, tp: int, ep: int = 1, etp: int | None = None,
                    imbalance: float | None = None) -> dict[str, float]:
    """Forward FLOPs one rank runs in an MoE layer, by part (the whole-layer counts of
    :func:`layer_flops`, placed on ranks as megatron-core does):

    * ``attention``: projections, scores and attention over values, split by TP;
    * ``router``: the ``h x E`` gate GEMM on every token (``2sbh·E``), replicated over TP
      (``TopKRouter``'s weight is not split);
    * ``routed``: the grouped GEMM of the experts this rank holds (``E / ep``) over the
      tokens routed to them: ``s·b·k / E`` tokens per expert from each of the ``ep`` ranks of
      the group, so ``s·b·k`` token-expert pairs per rank on average (Megatron's
      ``MoEAlltoAllTokenDispatcher``), each ``2h·f_e`` per matrix (SwiGLU 3, GeLU 2), split
      by expert TP, times ``imbalance`` for the most loaded rank (None: :func:`moe_imbalance`);
    * ``shared``: the shared experts (every token, width ``f_s``; and their gate), split by TP.
    """
    if not shape.is_moe:
        raise SpecError("not a mixture-of-experts layer", field="num_experts", found=None)
    etp = tp if etp is None else etp
    imb = moe_imbalance(ep) if imbalance is None else imbalance
    s, b, h = shape.seq_length, micro_batch_size, shape.hidden_size
    mats = 3 if shape.activation == "swiglu" else 2
    proj, scores = _attention_flops(shape, micro_batch_size=b)
    tokens = s * b
    shared = 0.0
    if shape.moe_shared_expert_intermediate_size is not None:
        shared = 2.0 * tokens * h * shape.moe_shared_expert_intermediate_size * mats
        if shape.moe_shared_expert_gate:
            shared += 2.0 * tokens * h
    return {"attention": (proj + scores) / tp, "router": 2.0 * tokens * h * shape.num_experts,
            "routed": imb * 2.0 * tokens * shape.moe_router_topk * h * shape.expert_ffn_hidden_size * mats / etp,
            "shared": shared / tp}


def moe_alltoall_bytes(shape: ShapeLike, *, micro_batch_size: int, precision: str, ep: int) -> float:
    """Bytes one rank sends to the other ranks of its EP group in ONE all-to-all of an MoE
    layer (the dispatch, or the combine, which moves the same back): its ``s·b`` tokens' ``k``
    copies of ``h`` elements, the share ``(ep - 1) / ep`` of them routed off the rank under
    balanced routing (:func:`moe_dispatch_bytes` x that share). A forward runs two (dispatch,
    combine), the backward two more."""
    if ep <= 1:
        return 0.0
    return moe_dispatch_bytes(shape, micro_batch_size=micro_batch_size, precision=precision) * (ep - 1) / ep


def alltoall_ms(sent_bytes: float, group_size: int, link_gbps: float) -> float:
    """An all-to-all in which each rank sends ``sent_bytes`` in all (and receives as much) over a
    link of ``link_gbps`` GB/s each way: ``bytes / bandwidth`` (pairwise exchange; every rank's
    link busy the whole time)."""
    if group_size <= 1 or sent_bytes <= 0:
        return 0.0
    return sent_bytes / (link_gbps * 1e9) * 1e3


def head_flops(shape: ShapeLike, *, micro_batch_size: int) -> float:
    """Forward FLOPs of the output layer: ``2·s·b·h·V`` (Narayanan et al. 2021, §5.1)."""
    return float(2 * shape.seq_length * micro_batch_size * shape.hidden_size * padded_vocab_size(shape.vocab_size))


def layer_traffic_bytes(shape: ShapeLike, *, micro_batch_size: int, tp: int, precision: str,
                        attention: str, sequence_parallel: bool = False) -> float:
    """Device-memory bytes the memory-bound (non-matmul) kernels of one layer's forward move
    on one TP rank: the per-kernel roofline's second term (Williams et al. 2009).

    Counted: two norms (read + write ``sbh``), two bias-dropout-adds (read x and residual,
    write out and the mask), the activation function (GeLU: read f, write f; SwiGLU: read
    2f, write f), RoPE-free Q/K/V reads and output write of fused attention, or for the
    unfused kernel the s² score matrix written by QK^T, read/written by softmax and dropout.
    Matmul operand traffic is left out (compute-bound at these sizes).
    """
    e = _bytes_per_element(precision)
    m = 1
    s, b, h = shape.seq_length, micro_batch_size, shape.hidden_size
    a, f = shape.num_attention_heads, shape.ffn_hidden_size
    sb = s * b
    rep = sb * (2 * 2 * e * h + 2 * (4 * e + m) * h)
    if sequence_parallel:
        rep /= tp
    act = (3 if shape.activation == "swiglu" else 2) * e * f
    if isinstance(shape, LayerShape) and shape.is_moe:
        # the routed tokens' activation function (k per token, width f_e; expert TP is taken as
        # TP here), the permutation and unpermutation of their k copies (read + write each),
        # the router's fp32 softmax/top-k over E (read + write), the shared experts' activation
        k, fe = shape.moe_router_topk, shape.expert_ffn_hidden_size
        act = (3 if shape.activation == "swiglu" else 2) * e * (k * fe + (shape.moe_shared_expert_intermediate_size or 0))
        rep += sb * (4 * k * e * h + 2 * 4 * shape.num_experts)
    if attention == "core":
        att = a * s * s * b * (e + 2 * e + 2 * e + m)
    elif _is_mla(shape):  # fused attention over the expanded per-head Q, K, V and its output
        att = e * sb * sum(_attention_widths(shape, attention))
    else:
        att = e * sb * (2 * h + 2 * _kv_hidden(shape))
    return float(rep + (sb * act + att) / tp)


def fp8_cast_bytes(shape: ShapeLike, *, micro_batch_size: int, tp: int, precision: str) -> float:
    """Forward bytes Transformer Engine's FP8 casts move in one layer on one TP rank: each
    linear GEMM's 16-bit input read and its FP8 copy written (``e + 1`` bytes an element: the
    QKV and FC1 inputs ``s·b·h``, the projection's and FC2's ``s·b·h_in/tp`` with ``h_in`` the
    attention width and the FFN width), and the weights those GEMMs use, cast likewise once
    per micro-batch (``2·s·b`` FLOPs per weight element: their count is the GEMM FLOPs over
    ``2·s·b``). Amax reductions are a few scalars per tensor. The roofline adds these bytes to
    the layer's memory-bound traffic (backward twice over, for the gradients' casts)."""
    e = _bytes_per_element(precision)
    s, b, h = shape.seq_length, micro_batch_size, shape.hidden_size
    proj, scores = _attention_flops(shape, micro_batch_size=b)
    gemm = layer_flops(shape, micro_batch_size=b) - scores
    width = shape.num_attention_heads * shape.v_head_dim if _is_mla(shape) else _q_hidden(shape)
    acts = s * b * (2 * h + (width + shape.ffn_hidden_size) / tp)
    weights = gemm / (2 * s * b)
    return float((e + 1) * (acts + weights / tp))


def tp_allreduce_bytes(shape: ShapeLike, *, micro_batch_size: int, precision: str) -> float:
    """Bytes of the tensor-parallel collectives of one layer's forward: two all-reduces
    (or, with sequence parallelism, all-gather + reduce-scatter of the same volume) of
    the ``s·b·h`` activation (Shoeybi et al. 2019, Megatron-LM, §3, Fig. 4)."""
    return float(2 * _bytes_per_element(precision) * shape.seq_length * micro_batch_size * shape.hidden_size)


def ring_allreduce_ms(message_bytes: float, group_size: int, link_gbps: float) -> float:
    """Ring all-reduce time: ``2(n-1)/n · bytes / bandwidth`` (Patarasuk & Yuan 2009)."""
    if group_size <= 1:
        return 0.0
    return 2.0 * (group_size - 1) / group_size * message_bytes / (link_gbps * 1e9) * 1e3


def optimizer_step_ms(params: int, gpu: GpuType, *, precision: str, optimizer: str,
                      distributed_optimizer: bool, dp: int) -> float:
    """Memory-bandwidth-bound optimizer step for ``params`` parameters on one GPU (ms).

    An element-wise Adam step over the fp32 main copy reads the main parameter, the
    gradient and both moments and writes parameter and moments back (7 × 4 bytes), then
    writes the half-precision model weight (2 bytes): 30 bytes per parameter at peak
    device bandwidth (SGD: 5 × 4 + 2). With the distributed optimizer each rank steps
    only its 1/dp shard. A lower bound: real steps run at 60-90 % of peak bandwidth.
    """
    if dp < 1:
        raise SpecError("data-parallel degree must be >= 1", field="dp", found=dp)
    if optimizer not in _OPTIMIZER_STATE_BYTES:
        raise SpecError("unknown optimizer", field="optimizer", found=optimizer,
                        allowed=", ".join(_OPTIMIZER_STATE_BYTES))
    per_param = (7 if optimizer == "adam" else 5) * 4
    if precision != "fp32":
        per_param += _bytes_per_element(precision)
    n = params / dp if distributed_optimizer else params
    return n * per_param / (gpu.hbm_gbps * 1e9) * 1e3


# --------------------------------------------------------------------------- exact count (megatron-core)


_EXACT_SCRIPT = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch, torch.nn.functional as F
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec
spec = json.loads(sys.argv[1])
# MLA builds its rotary embedding on the current CUDA device whatever use_cpu_initialization
# says; it holds no parameters, so building it on the CPU leaves the count unchanged
torch.cuda.current_device = lambda: "cpu"
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
ps.initialize_model_parallel(1, 1)
norm = "RMSNorm" if spec["normalization"] == "rmsnorm" else "LayerNorm"
swiglu = spec["activation"] == "swiglu"
kw = dict(
    num_layers=spec["num_layers"], hidden_size=spec["hidden_size"],
    num_attention_heads=spec["num_attention_heads"], num_query_groups=spec["num_query_groups"],
    ffn_hidden_size=spec["ffn_hidden_size"], gated_linear_unit=swiglu,
    activation_func=F.silu if swiglu else F.gelu, bias_activation_fusion=False,
    normalization=norm, add_bias_linear=spec["add_bias_linear"], add_qkv_bias=spec["add_qkv_bias"],
    qk_layernorm=spec["qk_layernorm"], use_cpu_initialization=True)
if spec["head_dim"] is not None:
    kw["kv_channels"] = spec["head_dim"]
if spec["num_experts"] is not None:
    freq = spec["moe_layer_freq"]
    kw.update(num_moe_experts=spec["num_experts"], moe_router_topk=spec["moe_router_topk"],
              moe_ffn_hidden_size=spec["moe_ffn_hidden_size"] or spec["ffn_hidden_size"],
              moe_shared_expert_intermediate_size=spec["moe_shared_expert_intermediate_size"],
              moe_shared_expert_gate=spec["moe_shared_expert_gate"],
              moe_layer_freq=list(freq) if isinstance(freq, list) else freq,
              moe_router_load_balancing_type="none", moe_token_dispatcher_type="allgather")
if spec["multi_latent_attention"]:
    kw.update(multi_latent_attention=True, q_lora_rank=spec["q_lora_rank"], kv_lora_rank=spec["kv_lora_rank"],
              qk_head_dim=spec["qk_head_dim"], qk_pos_emb_head_dim=spec["qk_pos_emb_head_dim"],
              v_head_dim=spec["v_head_dim"])
    cfg = MLATransformerConfig(**kw)
else:
    cfg = TransformerConfig(**kw)
if spec["num_experts"] is not None:
    layer_spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization=norm)
else:
    layer_spec = get_gpt_layer_local_spec(normalization=norm, qk_layernorm=spec["qk_layernorm"],
                                          multi_latent_attention=spec["multi_latent_attention"])
if spec["multi_latent_attention"]:
    # megatron-core's local DotProductAttention takes no separate K/V head sizes (MLA runs on
    # Transformer Engine's); the attention kernel holds no parameters, so a stand-in counts the same
    class CoreAttention(torch.nn.Module):
        def __init__(self, *args, **kwargs):
            super().__init__()
    import megatron.core.transformer.multi_latent_attention as mla
    if not isinstance(mla.TELinear, type):  # without Transformer Engine it is None or a placeholder
        mla.TELinear = type("TELinearAbsent", (), {})
    layers = layer_spec.layer_specs if hasattr(layer_spec, "layer_specs") else [layer_spec]
    for ls in layers:
        ls.submodules.self_attention.submodules.core_attention = CoreAttention
with torch.device("meta"):
    model = GPTModel(config=cfg, transformer_layer_spec=layer_spec,
                     vocab_size=spec["vocab_size"], max_sequence_length=spec["seq_length"],
                     position_embedding_type="learned_absolute" if spec["position_embedding"] == "learned" else "rope",
                     share_embeddings_and_output_weights=spec["tied_embeddings"])
print(json.dumps(sum(p.numel() for p in model.parameters())))
ps.destroy_model_parallel()
dist.destroy_process_group()
"""


def exact_params_megatron(model: ModelSpec, *, pad_vocab: bool = True, timeout_s: float = 120.0) -> int:
    """Total parameters of ``model`` as megatron-core's ``GPTModel`` builds it (TP = PP = 1).

    The model is built under ``torch.device("meta")`` (no memory) in a child Python so
    that the process group and megatron's model-parallel globals stay out of the caller.
    ``pad_vocab`` pads the vocabulary as Megatron-LM's training script does. Used to
    check the closed forms above exactly (Llama-2-7B: 6,738,415,616), MoE (megatron-core's
    decoder block spec with its local experts) and multi-latent attention included.
    """
    spec = {k: getattr(model, k) for k in ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
                                            "ffn_hidden_size", "seq_length", "activation", "normalization",
                                            "add_bias_linear", "position_embedding", "tied_embeddings",
                                            "add_qkv_bias", "qk_layernorm", "head_dim", "multi_latent_attention",
                                            "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                                            "v_head_dim", "num_experts", "moe_router_topk", "moe_ffn_hidden_size",
                                            "moe_shared_expert_intermediate_size", "moe_shared_expert_gate",
                                            "moe_layer_freq")}
    spec["vocab_size"] = padded_vocab_size(model.vocab_size) if pad_vocab else model.vocab_size
    try:
        proc = subprocess.run([sys.executable, "-c", _EXACT_SCRIPT, json.dumps(spec)], capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SystemFailure(f"building {model.name} on the meta device took longer than {timeout_s:g} s") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise SystemFailure(f"megatron-core could not build {model.name}: {' / '.join(tail)}")
    return int(json.loads(proc.stdout.strip().splitlines()[-1]))
