"""Megatron-LM's command-line arguments for what a model spec adds to the dense GPT shape
(mixture of experts, multi-latent attention, head sizes, Q/K norms, RoPE base and scaling)
and for the parallel degrees beyond TP/PP/DP (sequence, virtual pipeline, context, expert
and expert-tensor parallel). Pure functions of typed values; the names are those of
``megatron/training/arguments.py`` at core_r0.16, and tests/unit/test_megatron_args.py runs
Megatron-LM's own ``parse_args`` + ``validate_args`` on them.
"""

from __future__ import annotations

from .errors import SpecError
from .spec import ModelSpec

Args = list[tuple[str, ...]]


def moe_layer_freq_arg(model: ModelSpec) -> str:
    """``--moe-layer-freq``: the integer, or the pattern as the Python list expression Megatron
    evaluates (``([0]*1+[1]*26)``), runs of equal entries joined."""
    freq = model.moe_layer_freq
    if isinstance(freq, int):
        return str(freq)
    runs: list[list[int]] = []
    for x in freq:
        if runs and runs[-1][0] == x:
            runs[-1][1] += 1
        else:
            runs.append([x, 1])
    return "(" + "+".join(f"[{x}]*{n}" for x, n in runs) + ")"


def model_extension_args(model: ModelSpec) -> Args:
    """The arguments for the fields beyond the dense shape (none for a plain GPT/Llama-2)."""
    a: Args = []
    if model.head_dim is not None and model.head_dim * model.num_attention_heads != model.hidden_size:
        a.append(("--kv-channels", str(model.head_dim)))
    if model.add_qkv_bias and not model.add_bias_linear:
        a.append(("--add-qkv-bias",))
    if model.qk_layernorm:
        a.append(("--qk-layernorm",))
    if model.position_embedding == "rope" and model.rotary_base != 10000:
        a.append(("--rotary-base", str(model.rotary_base)))
    if model.rope_scaling == "llama3":
        a += [("--use-rope-scaling",), ("--rope-scaling-factor", f"{model.rope_scaling_factor:g}")]
    if model.multi_latent_attention:
        a += [("--multi-latent-attention",), ("--kv-lora-rank", str(model.kv_lora_rank)),
              ("--qk-head-dim", str(model.qk_head_dim)), ("--qk-pos-emb-head-dim", str(model.qk_pos_emb_head_dim)),
              ("--v-head-dim", str(model.v_head_dim))]
        if model.q_lora_rank is not None:
            a.append(("--q-lora-rank", str(model.q_lora_rank)))
        if model.rope_scaling == "yarn":
            a += [("--rope-type", "yarn"), ("--rotary-scaling-factor", f"{model.rope_scaling_factor:g}")]
    if model.is_moe:
        a += [("--num-experts", str(model.num_experts)), ("--moe-router-topk", str(model.moe_router_topk)),
              ("--moe-ffn-hidden-size", str(model.expert_ffn_hidden_size)),
              ("--moe-layer-freq", moe_layer_freq_arg(model)),
              ("--moe-router-load-balancing-type", model.moe_router_load_balancing_type),
              ("--moe-router-score-function", model.moe_router_score_function),
              ("--moe-token-dispatcher-type", "alltoall")]
        if model.moe_shared_expert_intermediate_size is not None:
            a.append(("--moe-shared-expert-intermediate-size", str(model.moe_shared_expert_intermediate_size)))
        if model.moe_shared_expert_gate:
            a.append(("--moe-shared-expert-gate",))
        if model.moe_router_num_groups is not None:
            a += [("--moe-router-num-groups", str(model.moe_router_num_groups)),
                  ("--moe-router-group-topk", str(model.moe_router_group_topk))]
        if model.moe_router_enable_expert_bias:
            a.append(("--moe-router-enable-expert-bias",))
    return a


def parallel_args(model: ModelSpec, *, tp: int, sequence_parallel: bool = False, virtual_stages: int = 1,
                  cp: int = 1, ep: int = 1, etp: int | None = None) -> Args:
    """The arguments for the parallel degrees beyond TP/PP/DP. ``virtual_stages``: model
    chunks per pipeline rank (``--num-virtual-stages-per-pipeline-rank``; a rendered pipeline
    layout carries them itself, see Megatron's ``--pipeline-model-parallel-layout``)."""
    a: Args = []
    if sequence_parallel:
        if tp < 2:
            raise SpecError("sequence parallel splits along the tensor-parallel group", field="sequence_parallel",
                            found=tp, allowed="tp >= 2")
        a.append(("--sequence-parallel",))
    if virtual_stages > 1:
        a.append(("--num-virtual-stages-per-pipeline-rank", str(virtual_stages)))
    if cp > 1:
        a.append(("--context-parallel-size", str(cp)))
    if ep > 1 or etp is not None:
        if not model.is_moe:
            raise SpecError("expert parallel needs a mixture of experts", field="ep", found=ep)
        a.append(("--expert-model-parallel-size", str(ep)))
        if etp is not None:
            a.append(("--expert-tensor-parallel-size", str(etp)))
    return a


def flat(args: Args) -> list[str]:
    return [w for pair in args for w in pair]
