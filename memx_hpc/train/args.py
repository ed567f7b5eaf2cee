"""The trainer's command line: Megatron-LM's own argument names (``megatron/training/arguments.py``
at core_r0.16.0), for every argument :mod:`memx_hpc.slurm.render` emits and the common ones
around them, so that one rendered script launches either Megatron-LM's ``pretrain_gpt.py``
(real sites) or ``python -m memx_hpc.train.pretrain_gpt`` (this machine).

Arguments that only make sense on a GPU are accepted and reported as ignored (one log
line each); an argument Megatron-LM does not have is an error, as in Megatron-LM.
No torch import here: ``--help`` is instant.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Sequence

from ..spec import MOE_FIELDS, PROJECT_ENTRY_EXPERT_BIAS_WHY

#: the model's MoE fields this entry builds (memx_hpc.spec.MOE_FIELDS: one table for the spec and here)
ENTRY_MOE_FIELDS = tuple(f for f in MOE_FIELDS if f.project_entry)

# Accepted because Megatron-LM accepts them and scripts pass them; they change nothing
# on a CPU (kernel fusions, GPU-only memory options). Flag -> why it is ignored here.
CPU_NO_OP_FLAGS = {
    "--no-gradient-accumulation-fusion": "gradient accumulation fusion is a CUDA kernel",
    "--no-persist-layer-norm": "the persistent layer norm is a CUDA kernel",
    "--no-masked-softmax-fusion": "the masked-softmax fusion is a CUDA kernel",
    "--no-bias-gelu-fusion": "the bias-GeLU fusion is a CUDA kernel",
    "--no-bias-swiglu-fusion": "the bias-SwiGLU fusion is a CUDA kernel",
    "--no-bias-dropout-fusion": "the bias-dropout fusion is a CUDA kernel",
    "--no-rope-fusion": "the RoPE fusion is a CUDA kernel",
    "--use-flash-attn": "flash attention is a CUDA kernel",
    "--use-cpu-initialization": "always on here",
    "--use-mcore-models": "always megatron-core models here",
    "--overlap-grad-reduce": "no CUDA streams to overlap on",
    "--overlap-param-gather": "no CUDA streams to overlap on",
}


@dataclass(frozen=True, kw_only=True)
class TrainArgs:
    """The parsed command line (Megatron-LM names, underscores for dashes)."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int | None
    num_attention_heads: int
    group_query_attention: bool
    num_query_groups: int | None
    seq_length: int
    max_position_embeddings: int | None
    vocab_size: int | None  # NullTokenizer's; other tokenizers bring their own
    rotary_base: int
    use_rope_scaling: bool
    rope_scaling_factor: float
    kv_channels: int | None
    add_qkv_bias: bool
    qk_layernorm: bool
    make_vocab_size_divisible_by: int
    swiglu: bool
    untie_embeddings_and_output_weights: bool
    position_embedding_type: str
    normalization: str
    add_bias_linear: bool
    attention_dropout: float
    hidden_dropout: float
    attention_backend: str
    transformer_impl: str
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    pipeline_model_parallel_layout: str | None
    decoder_first_pipeline_num_layers: int | None
    decoder_last_pipeline_num_layers: int | None
    pipeline_model_parallel_comm_backend: str | None
    sequence_parallel: bool
    distributed_backend: str
    distributed_timeout_minutes: int
    use_distributed_optimizer: bool
    micro_batch_size: int
    global_batch_size: int | None
    train_iters: int | None
    train_samples: int | None
    log_interval: int
    eval_iters: int
    eval_interval: int
    lr: float
    min_lr: float
    lr_decay_style: str
    lr_warmup_iters: int
    lr_decay_iters: int | None
    lr_warmup_samples: int
    lr_decay_samples: int | None
    weight_decay: float
    clip_grad: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    optimizer: str
    seed: int
    init_method_std: float
    recompute_granularity: str | None
    recompute_method: str | None
    recompute_num_layers: int | None
    recompute_modules: tuple[str, ...] | None
    mock_data: bool
    tokenizer_type: str | None
    tokenizer_model: str | None
    vocab_file: str | None
    merge_file: str | None
    data_path: tuple[str, ...] | None
    split: str
    save: str | None
    load: str | None
    save_interval: int | None
    ckpt_format: str
    exit_duration_in_mins: float | None
    exit_signal_handler: bool
    exit_interval: int | None
    bf16: bool
    fp16: bool
    ignored: tuple[tuple[str, str], ...]  # (flag, why) for the log
    #: logging (Megatron-LM's LoggerConfig names): TensorBoard event files, Weights & Biases
    tensorboard_dir: str | None = None
    tensorboard_log_interval: int = 1
    log_throughput: bool = False
    log_memory_to_tensorboard: bool = False
    log_timers_to_tensorboard: bool = False
    wandb_project: str | None = None
    wandb_exp_name: str | None = None
    wandb_save_dir: str | None = None
    #: mixture of experts (Megatron-LM's names): None = a dense model
    num_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    moe_layer_freq: int | tuple[int, ...] = 1
    moe_router_load_balancing_type: str = "aux_loss"
    moe_router_score_function: str = "softmax"
    moe_aux_loss_coeff: float = 0.0
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None
    #: context parallel (ring attention; Transformer Engine's attention only)
    context_parallel_size: int = 1
    #: multi-latent attention (Megatron-LM's "mla" group, its names and defaults; ``rope_type`` None:
    #: MLATransformerConfig's own, YaRN, which at ``rotary_scaling_factor`` 1 is plain RoPE)
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int = 32
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    rope_type: str | None = None
    rotary_scaling_factor: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0


def build_parser() -> argparse.ArgumentParser:
    """The trainer's parser: Megatron-LM's names and defaults, one argument group per topic."""
    p = argparse.ArgumentParser(
        prog="python -m memx_hpc.train.pretrain_gpt",
        description="Train a GPT with megatron-core (real tensor and pipeline parallel, 1F1B) on "
                    "this machine's CPUs, from Megatron-LM's own command line.",
        allow_abbrev=False)
    for add in (_network_size_args, _distributed_args, _moe_args, _mla_args, _training_args, _data_args, _checkpoint_args,
                _logging_args, _precision_args, _ignored_args):
        add(p)
    return p


def _network_size_args(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("network size")
    m.add_argument("--num-layers", type=int, required=True)
    m.add_argument("--hidden-size", type=int, required=True)
    m.add_argument("--ffn-hidden-size", type=int, default=None)
    m.add_argument("--num-attention-heads", type=int, required=True)
    m.add_argument("--group-query-attention", action="store_true")
    m.add_argument("--num-query-groups", type=int, default=None)
    m.add_argument("--max-position-embeddings", type=int, default=None)
    m.add_argument("--position-embedding-type", default="learned_absolute",
                   choices=["learned_absolute", "rope", "none"])
    m.add_argument("--rotary-base", type=int, default=10000)
    m.add_argument("--use-rope-scaling", action="store_true")
    m.add_argument("--rope-scaling-factor", type=float, default=8.0)
    m.add_argument("--kv-channels", type=int, default=None)
    m.add_argument("--add-qkv-bias", action="store_true")
    m.add_argument("--qk-layernorm", action="store_true")
    m.add_argument("--normalization", default="LayerNorm", choices=["LayerNorm", "RMSNorm"])
    m.add_argument("--swiglu", action="store_true")
    m.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    m.add_argument("--disable-bias-linear", action="store_false", dest="add_bias_linear")
    m.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    m.add_argument("--attention-dropout", type=float, default=0.1)
    m.add_argument("--hidden-dropout", type=float, default=0.1)
    m.add_argument("--attention-backend", default="auto",
                   choices=["flash", "fused", "unfused", "local", "auto"])
    m.add_argument("--transformer-impl", default="local", choices=["local", "transformer_engine"])


def _distributed_args(p: argparse.ArgumentParser) -> None:
    d = p.add_argument_group("distributed")
    d.add_argument("--tensor-model-parallel-size", type=int, default=1)
    d.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    d.add_argument("--pipeline-model-parallel-layout", default=None)
    d.add_argument("--decoder-first-pipeline-num-layers", type=int, default=None)
    d.add_argument("--decoder-last-pipeline-num-layers", type=int, default=None)
    d.add_argument("--pipeline-model-parallel-comm-backend", default=None, choices=["nccl", "ucc"])
    d.add_argument("--sequence-parallel", action="store_true")
    d.add_argument("--distributed-backend", default="nccl", choices=["nccl", "gloo"])
    d.add_argument("--distributed-timeout-minutes", type=int, default=10)
    d.add_argument("--use-distributed-optimizer", action="store_true")
    d.add_argument("--expert-model-parallel-size", type=int, default=1)
    d.add_argument("--expert-tensor-parallel-size", type=int, default=None)
    d.add_argument("--context-parallel-size", type=int, default=1)


def _moe_args(p: argparse.ArgumentParser) -> None:
    moe = p.add_argument_group("mixture of experts (megatron-core's MoE layer, local spec)")
    # the flags, defaults and choices of the model's MoE fields come from their one table
    for f in ENTRY_MOE_FIELDS:
        if f.kind == "freq":
            moe.add_argument(f.flag, default=str(f.default),
                             help="every N-th layer is MoE (N), or a list of 0/1 per layer ('[0,1,1]')")
        else:
            moe.add_argument(f.flag, type=int if f.kind == "int" else str, default=f.default,
                             choices=list(f.choices) or None)
    moe.add_argument("--moe-aux-loss-coeff", type=float, default=0.0)


def _mla_args(p: argparse.ArgumentParser) -> None:
    # Megatron-LM's _add_mla_args (and --multi-latent-attention, --rope-type): the same defaults
    mla = p.add_argument_group("multi-latent attention (megatron-core's MLASelfAttention)")
    mla.add_argument("--multi-latent-attention", action="store_true")
    mla.add_argument("--q-lora-rank", type=int, default=None,
                     help="rank of the query's low-rank projection (none: the query is projected directly)")
    mla.add_argument("--kv-lora-rank", type=int, default=32)
    mla.add_argument("--qk-head-dim", type=int, default=128)
    mla.add_argument("--qk-pos-emb-head-dim", type=int, default=64)
    mla.add_argument("--v-head-dim", type=int, default=128)
    mla.add_argument("--rope-type", default=None, choices=["rope", "yarn"],
                     help="multi-latent attention takes YaRN when not given, other attention RoPE")
    mla.add_argument("--rotary-scaling-factor", type=float, default=1.0)
    mla.add_argument("--mscale", type=float, default=1.0)
    mla.add_argument("--mscale-all-dim", type=float, default=0.0)


def _training_args(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("training")
    t.add_argument("--micro-batch-size", type=int, required=True)
    t.add_argument("--global-batch-size", type=int, default=None)
    t.add_argument("--train-iters", type=int, default=None)
    t.add_argument("--train-samples", type=int, default=None)
    t.add_argument("--log-interval", type=int, default=100)
    t.add_argument("--eval-iters", type=int, default=100)
    t.add_argument("--eval-interval", type=int, default=1000)
    t.add_argument("--lr", type=float, default=None)
    t.add_argument("--min-lr", type=float, default=0.0)
    t.add_argument("--lr-decay-style", default="linear",
                   choices=["constant", "linear", "cosine", "inverse-square-root", "WSD"])
    t.add_argument("--lr-warmup-iters", type=int, default=0)
    t.add_argument("--lr-decay-iters", type=int, default=None)
    t.add_argument("--lr-warmup-samples", type=int, default=0)
    t.add_argument("--lr-decay-samples", type=int, default=None)
    t.add_argument("--weight-decay", type=float, default=0.01)
    t.add_argument("--clip-grad", type=float, default=1.0)
    t.add_argument("--adam-beta1", type=float, default=0.9)
    t.add_argument("--adam-beta2", type=float, default=0.999)
    t.add_argument("--adam-eps", type=float, default=1e-8)
    t.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    t.add_argument("--seed", type=int, default=1234)
    t.add_argument("--init-method-std", type=float, default=0.02)
    t.add_argument("--recompute-activations", action="store_true")
    t.add_argument("--recompute-granularity", default=None, choices=["full", "selective"])
    t.add_argument("--recompute-method", default=None, choices=["uniform", "block"])
    t.add_argument("--recompute-num-layers", type=int, default=None)
    t.add_argument("--recompute-modules", nargs="*", default=None)


def _data_args(p: argparse.ArgumentParser) -> None:
    data = p.add_argument_group("data and tokenizer")
    data.add_argument("--mock-data", action="store_true")
    data.add_argument("--seq-length", type=int, required=True)
    data.add_argument("--vocab-size", type=int, default=None)
    data.add_argument("--tokenizer-type", default=None)
    data.add_argument("--tokenizer-model", default=None)
    data.add_argument("--vocab-file", default=None)
    data.add_argument("--merge-file", default=None)
    data.add_argument("--data-path", nargs="*", default=None)
    data.add_argument("--split", default="969,30,1")


def _checkpoint_args(p: argparse.ArgumentParser) -> None:
    ck = p.add_argument_group("checkpointing")
    ck.add_argument("--save", default=None)
    ck.add_argument("--load", default=None)
    ck.add_argument("--save-interval", type=int, default=None)
    ck.add_argument("--ckpt-format", default="torch_dist", choices=["torch_dist"],
                    help="megatron-core's distributed checkpoint (any TP/PP/DP loads it)")
    ck.add_argument("--exit-duration-in-mins", type=float, default=None,
                    help="save and stop after this many minutes (before a Slurm time limit)")
    ck.add_argument("--exit-signal-handler", action="store_true",
                    help="on SIGTERM (Slurm's time limit, scancel, preemption) save and stop after the iteration")
    ck.add_argument("--exit-interval", type=int, default=None, help="save and stop at an iteration divisible by it")


def _logging_args(p: argparse.ArgumentParser) -> None:
    lg = p.add_argument_group("logging (TensorBoard events on the last rank, as Megatron-LM writes them)")
    lg.add_argument("--tensorboard-dir", default=None, help="write TensorBoard event files here")
    lg.add_argument("--tensorboard-log-interval", type=int, default=1)
    lg.add_argument("--log-throughput", action="store_true",
                    help="TFLOP/s per device in the log line (and TensorBoard with --log-timers-to-tensorboard)")
    lg.add_argument("--log-memory-to-tensorboard", action="store_true")
    lg.add_argument("--log-timers-to-tensorboard", action="store_true")
    lg.add_argument("--wandb-project", default=None,
                    help="Weights & Biases project (needs the wandb package; said once in the log when missing)")
    lg.add_argument("--wandb-exp-name", default=None)
    lg.add_argument("--wandb-save-dir", default=None)


def _precision_args(p: argparse.ArgumentParser) -> None:
    mp = p.add_argument_group("mixed precision")
    mp.add_argument("--bf16", action="store_true")
    mp.add_argument("--fp16", action="store_true")


def _ignored_args(p: argparse.ArgumentParser) -> None:
    ig = p.add_argument_group("accepted and ignored on the CPU")
    for flag in CPU_NO_OP_FLAGS:
        ig.add_argument(flag, action="store_true", dest=_ignored_dest(flag))


def _ignored_dest(flag: str) -> str:
    return "ignored_" + flag.strip("-").replace("-", "_")


def parse_args(argv: Sequence[str] | None = None) -> TrainArgs:
    """Parse and check the command line the way Megatron-LM's ``validate_args`` does for these names."""
    p = build_parser()
    ns = p.parse_args(argv)
    if ns.recompute_activations:  # Megatron-LM: --recompute-activations means selective
        ns.recompute_granularity = "selective"
    if ns.num_query_groups is not None and not ns.group_query_attention:
        ns.num_query_groups = None  # Megatron-LM ignores it without --group-query-attention
    for check in (_check_model_and_parallel, _check_data_and_length, _check_moe, _check_mla):
        check(p, ns)
    values = {f.name: getattr(ns, f.name) for f in fields(TrainArgs) if hasattr(ns, f.name)}
    values.update(
        ignored=tuple((flag, why) for flag, why in CPU_NO_OP_FLAGS.items() if getattr(ns, _ignored_dest(flag))),
        lr=ns.lr if ns.lr is not None else 1.0e-4, moe_layer_freq=_layer_freq(p, ns.moe_layer_freq),
        recompute_modules=tuple(ns.recompute_modules) if ns.recompute_modules is not None else None,
        data_path=tuple(ns.data_path) if ns.data_path else None)
    return TrainArgs(**values)


def _check_model_and_parallel(p: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    if ns.fp16 and ns.bf16:
        p.error("--fp16 and --bf16 are mutually exclusive")
    if ns.pipeline_model_parallel_layout and (ns.decoder_first_pipeline_num_layers is not None
                                              or ns.decoder_last_pipeline_num_layers is not None):
        p.error("--pipeline-model-parallel-layout cannot be combined with "
                "--decoder-first/last-pipeline-num-layers")
    if ns.recompute_granularity == "full" and ns.recompute_method is None:
        p.error("--recompute-granularity full needs --recompute-method (uniform or block)")
    if ns.recompute_method is not None and ns.recompute_num_layers is None:
        p.error("--recompute-method needs --recompute-num-layers")
    for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size",
                 "train_iters", "train_samples", "log_interval", "expert_model_parallel_size", "num_experts",
                 "expert_tensor_parallel_size", "moe_router_topk", "tensorboard_log_interval",
                 "context_parallel_size"):
        if getattr(ns, name) is not None and getattr(ns, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if ns.context_parallel_size > 1 and ns.seq_length % (2 * ns.context_parallel_size):
        p.error(f"--seq-length {ns.seq_length} is not a multiple of 2 x --context-parallel-size "
                f"{ns.context_parallel_size} (ring attention splits each sequence into 2 x CP chunks)")


def _check_data_and_length(p: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    if ns.mock_data and ns.data_path:
        p.error("--mock-data and --data-path are mutually exclusive")
    if not ns.mock_data and not ns.data_path:
        p.error("give --data-path (pre-tokenized Megatron-LM .bin/.idx prefixes) or --mock-data")
    from .tokenizer import BUILT_HERE

    if ns.tokenizer_type is not None and ns.tokenizer_type not in BUILT_HERE:
        p.error(f"--tokenizer-type {ns.tokenizer_type}: this entry builds {', '.join(BUILT_HERE)} from local files")
    if ns.tokenizer_type in (None, "NullTokenizer") and ns.vocab_size is None:
        p.error("--vocab-size is needed with the NullTokenizer (mock or pre-tokenized data)")
    if (ns.train_iters is None) == (ns.train_samples is None):
        p.error("give one of --train-iters and --train-samples")
    if ns.train_samples is not None and (ns.lr_warmup_iters or ns.lr_decay_iters is not None):
        p.error("sample-based training takes --lr-warmup-samples / --lr-decay-samples (as Megatron-LM)")
    if ns.train_iters is not None and (ns.lr_warmup_samples or ns.lr_decay_samples is not None):
        p.error("iteration-based training takes --lr-warmup-iters / --lr-decay-iters (as Megatron-LM)")
    if ns.lr_decay_style == "WSD":
        p.error("--lr-decay-style WSD is not supported by this entry (constant, linear, cosine, inverse-square-root)")
    if ns.save_interval is not None and ns.save is None:
        p.error("--save-interval needs --save")


def _check_moe(p: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    if ns.num_experts is None and (ns.expert_model_parallel_size > 1 or ns.expert_tensor_parallel_size is not None):
        p.error("--expert-model-parallel-size / --expert-tensor-parallel-size need --num-experts")
    if ns.num_experts is not None and ns.add_bias_linear:
        p.error(f"--num-experts with linear biases (add --disable-bias-linear): {PROJECT_ENTRY_EXPERT_BIAS_WHY}")
    if ns.num_experts is not None and ns.num_experts % ns.expert_model_parallel_size:
        p.error(f"--num-experts {ns.num_experts} is not a multiple of --expert-model-parallel-size "
                f"{ns.expert_model_parallel_size}")


def _check_mla(p: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    # Megatron-LM's validate_args and core_transformer_config_from_args
    if ns.multi_latent_attention and ns.group_query_attention:
        p.error("--group-query-attention and --multi-latent-attention are mutually exclusive")
    if not ns.multi_latent_attention and ns.rope_type not in (None, "rope"):
        p.error(f"--rope-type {ns.rope_type} needs --multi-latent-attention (other attention takes rope only)")
    for name in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
        if getattr(ns, name) is not None and getattr(ns, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")


def _layer_freq(p: argparse.ArgumentParser, text: str) -> int:
    """``--moe-layer-freq`` as Megatron-LM reads it; this entry builds every layer as MoE (1)."""
    freq = text.strip()
    try:
        layer_freq: int | tuple[int, ...] = (tuple(int(x) for x in freq.strip("[]").split(",")) if freq.startswith("[")
                                            else int(freq))
    except ValueError:
        p.error(f"--moe-layer-freq {freq!r}: an integer or a list of 0/1 such as [0,1,1]")
    if layer_freq != 1:
        p.error(f"--moe-layer-freq {freq}: this entry builds every layer as MoE (1); a mix of dense and MoE "
                "layers runs through Megatron-LM's pretrain_gpt.py")
    return 1
