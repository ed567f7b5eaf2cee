"""A GPT trainer on megatron-core that takes Megatron-LM's ``pretrain_gpt.py`` command line.

Run as ``python -m memx_hpc.train.pretrain_gpt ARGS`` (one process per rank, as
``srun`` or ``torchrun`` start them). It builds megatron-core's ``GPTModel`` from the
local layer spec (standard or multi-latent attention, dense or MoE layers, as Megatron-LM's
gpt_builders picks the spec; checkpoint keys as Transformer Engine's layer names them), initialises real tensor and pipeline parallel groups, wraps the
model in megatron-core's ``DistributedDataParallel``, trains ``--train-iters`` (or
``--train-samples``) on Megatron's indexed data (``--data-path``, megatron-core's GPTDataset,
a tokenizer from local files: :mod:`memx_hpc.train.tokenizer`) or on synthetic data
(``--mock-data``) with megatron-core's 1F1B schedule (``get_forward_backward_func``; interleaved
over one model chunk per virtual stage when ``--pipeline-model-parallel-layout`` has ``pp x v``
chunks), context- and expert-parallel groups by the group rule, and its
optimizer, evaluates, saves and loads megatron-core distributed checkpoints
(:mod:`memx_hpc.train.checkpoint`), and logs iteration time and memory in Megatron-LM's
format (:mod:`memx_hpc.train.logs`), also as TensorBoard events (``--tensorboard-dir``).
With ``--exit-signal-handler``, SIGTERM saves after the current iteration and exits cleanly:
what the rendered script's time-limit warning sends every rank before it submits the run's
next segment (memx_hpc/slurm/render.py).

On a CPU-only PyTorch (this machine, the local Slurm cluster) it uses gloo and the
redirections of :mod:`memx_hpc.train.cpu`; a few arguments that need a GPU are
accepted and ignored with one log line each:

* ``--bf16`` / ``--fp16``: the CPU runs fp32 (bf16 matmuls on CPU are emulated and slow,
  and fp16 is not supported by every CPU kernel);
* ``--use-distributed-optimizer``: gloo has no reduce-scatter, which megatron-core's
  distributed optimizer needs; the plain megatron-core optimizer is used instead
  (identical when the data-parallel size is 1);
* ``--pipeline-model-parallel-comm-backend ucc``: UCC is for GPUs; gloo carries the
  pipeline sends too.

Heterogeneous recomputation needs nothing special: each hetjob component's command
line carries its own ``--recompute-*`` flags, so each rank applies its own.

Rank and world size come from ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (what the rendered
script exports, and what torchrun sets), else ``SLURM_PROCID``/``SLURM_NTASKS``/
``SLURM_LOCALID``, else a single process. ``MASTER_ADDR``/``MASTER_PORT`` give the
rendezvous (rank 0's host).
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterator, Sequence

from .args import TrainArgs, parse_args
from ..slurm.groups import GroupBackend, decode_rank_vendors, format_map, group_backends
from .logs import MetricsLog, iteration_line, layout_line, memory_line, training_flops


@dataclass(frozen=True, kw_only=True)
class DistEnv:
    """Where this process sits in the job (from torchrun's or Slurm's variables)."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str  # "torchrun" | "slurm" | "single"


def dist_env(environ: dict[str, str] | None = None) -> DistEnv:
    """Rank, world size and rendezvous from the environment."""
    env = os.environ if environ is None else environ
    addr = env.get("MASTER_ADDR", "127.0.0.1")
    port = int(env.get("MASTER_PORT", "29500"))
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistEnv(rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]),
                       local_rank=int(env.get("LOCAL_RANK", "0")), master_addr=addr, master_port=port,
                       source="torchrun")
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return DistEnv(rank=int(env["SLURM_PROCID"]), world_size=int(env["SLURM_NTASKS"]),
                       local_rank=int(env.get("SLURM_LOCALID", "0")), master_addr=addr, master_port=port,
                       source="slurm")
    return DistEnv(rank=0, world_size=1, local_rank=0, master_addr=addr,
                   master_port=port if "MASTER_PORT" in env else _free_port(), source="single")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _set_threads() -> None:
    # One rank per core: Slurm says how many CPUs a task has; without it torch would start
    # one thread per core on every rank and the ranks would compete for the same cores.
    if "OMP_NUM_THREADS" in os.environ or "SLURM_CPUS_PER_TASK" not in os.environ:
        return
    try:
        n = int(os.environ["SLURM_CPUS_PER_TASK"])
    except ValueError:
        return
    import torch

    torch.set_num_threads(max(n, 1))


def _log(rank: int, msg: str) -> None:
    print(f"[Rank {rank}] {msg}", flush=True)


def _now() -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")


def _synthetic_batches(*, seed: int, dp_rank: int, micro_batch_size: int, seq_length: int,
                       vocab_size: int, torch: Any, device: Any = "cpu") -> Iterator[dict[str, Any]]:
    """Mock data: random tokens, next-token labels, a full loss mask and an explicit causal
    mask (megatron-core's default mask is built on the GPU). Every rank of a data-parallel
    replica draws the same micro-batches (same seed), so no broadcast is needed."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + dp_rank)
    causal = torch.triu(torch.ones(seq_length, seq_length, dtype=torch.bool), diagonal=1)
    attention_mask = causal.view(1, 1, seq_length, seq_length)  # True = masked out (Megatron-LM)
    position_ids = torch.arange(seq_length, dtype=torch.long).unsqueeze(0).expand(micro_batch_size, -1)
    attention_mask, position_ids = attention_mask.to(device), position_ids.to(device)
    loss_mask = torch.ones(micro_batch_size, seq_length, dtype=torch.float, device=device)
    while True:
        text = torch.randint(0, vocab_size, (micro_batch_size, seq_length + 1), generator=gen).to(device)
        yield {"tokens": text[:, :-1].contiguous(), "labels": text[:, 1:].contiguous(),
               "loss_mask": loss_mask, "attention_mask": attention_mask, "position_ids": position_ids}


def _datasets(*, args: TrainArgs, tokenizer: Any, seed: int, train_samples: int, valid_samples: int) -> tuple[Any, Any]:
    """Megatron-LM's GPT train and validation datasets over ``--data-path`` (optionally
    ``weight prefix ...``) and ``--split``, built by megatron-core's BlendedMegatronDatasetBuilder
    as Megatron-LM's pretrain_gpt.py builds them (``core_gpt_dataset_config_from_args``)."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=args.seq_length, blend=get_blend_from_list(list(args.data_path or ())),
        split=args.split, tokenizer=tokenizer, reset_position_ids=False,
        reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=True)
    train, valid, _ = BlendedMegatronDatasetBuilder(GPTDataset, [train_samples, valid_samples, 0], lambda: True,
                                                    config).build()
    if train is None:
        raise ValueError(f"--split {args.split} leaves no training data")
    return train, valid


def _dataset_batches(dataset: Any, *, micro_batch_size: int, dp_rank: int, dp: int, start_microbatch: int,
                     torch: Any, device: Any = "cpu") -> Iterator[dict[str, Any]]:
    """Micro-batches of a GPTDataset: micro-batch k of data-parallel rank d holds samples
    ``k*mbs*dp + d*mbs ...`` (Megatron-LM's pretraining sampler order), so iteration i always
    trains on samples ``[i*gbs, (i+1)*gbs)`` whatever the plan's TP, PP, DP and micro-batch:
    a run resumed under another plan sees the same data."""
    mbs = micro_batch_size
    k = start_microbatch
    while True:
        first = (k * mbs * dp + dp_rank * mbs) % len(dataset)
        items = [dataset[(first + j) % len(dataset)] for j in range(mbs)]
        batch = {key: torch.stack([torch.as_tensor(it[key]) for it in items]) for key in
                 ("tokens", "labels", "loss_mask", "position_ids")}
        batch["attention_mask"] = torch.as_tensor(items[0]["attention_mask"]).unsqueeze(0)
        yield {key: v.to(device) for key, v in batch.items()}
        k += 1


def _loss_func(loss_mask: Any, output_tensor: Any) -> tuple[Any, Any, dict[str, Any]]:
    # As Megatron-LM's pretrain_gpt.loss_func (core_r0.16.0): sum of masked token losses,
    # the token count, and [loss, tokens] for reporting.
    import torch
    losses = output_tensor.view(-1).float()
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().clone().detach().to(torch.int)
    report = torch.cat([loss.clone().detach().view(1), num_tokens.view(1).float()])
    return loss, num_tokens, {"lm loss": report}


def cp_slices(data: Iterator[dict[str, Any]], cp: int) -> Iterator[dict[str, Any]]:
    """This rank's part of each micro-batch under context parallel (megatron-core's
    get_batch_on_this_cp_rank, as Megatron-LM's get_batch: 2 x CP sequence chunks, rank r
    taking chunks r and 2CP-1-r so that causal attention work is balanced); as is at CP 1."""
    if cp == 1:
        return data
    from megatron.core.utils import get_batch_on_this_cp_rank

    return (get_batch_on_this_cp_rank(batch) for batch in data)


def per_chunk(data: Iterator[dict[str, Any]], chunks: int) -> Any:
    """The data iterator(s) the schedule takes: with ``chunks`` > 1 (interleaved), one per model
    chunk, each the same micro-batch sequence (every chunk's forward step reads micro-batch j as
    its j-th; the interleaved schedule runs each chunk's micro-batches in order)."""
    if chunks == 1:
        return data
    import itertools

    return list(itertools.tee(data, chunks))


def _forward_step(data_iterator: Iterator[dict[str, Any]], model: Any) -> tuple[Any, Any]:
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])
    return output, partial(_loss_func, batch["loss_mask"])


def planned_groups(*, world: int, tp: int, pp: int, on_cpu: bool, torch: Any, cp: int = 1, ep: int = 1,
                   etp: int | None = None, environ: dict[str, str] | None = None) -> tuple[GroupBackend, ...]:
    """The job's process groups and backends (memx_hpc.slurm.groups), from the per-rank vendors
    the rendered script exports (``MEMX_RANK_VENDORS``); without them, every rank is on this
    process's kind of device."""
    env = os.environ if environ is None else environ
    if env.get("MEMX_RANK_VENDORS"):
        vendors = decode_rank_vendors(env["MEMX_RANK_VENDORS"])
        if len(vendors) != world:
            raise ValueError(f"MEMX_RANK_VENDORS names {len(vendors)} ranks, the world has {world}")
    else:
        here = "cpu" if on_cpu else ("amd" if getattr(torch.version, "hip", None) else "nvidia")
        vendors = (here,) * world
    return group_backends(vendors, tp=tp, dp=world // (tp * cp * pp), pp=pp, cp=cp, ep=ep, etp=etp,
                          cross_vendor_backend=env.get("MEMX_CROSS_VENDOR_BACKEND", "ucc"))


def process_group_collection(groups: Sequence[GroupBackend], *, rank: int, on_cpu: bool, torch: Any,
                             ps: Any) -> Any:
    """megatron-core's ProcessGroupCollection with this rank's groups, each created on its
    planned backend (gloo for all of them on the CPU). Every rank creates every group, in
    the map's order, as torch.distributed.new_group requires."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    mine: dict[str, Any] = {}
    for g in groups:
        if g.kind == "default":
            continue
        backend = "gloo" if on_cpu else g.backend
        pg = torch.distributed.new_group(ranks=list(g.ranks), backend=backend)
        if rank in g.ranks:
            mine[g.kind] = pg
    pgc = ProcessGroupCollection()
    pgc.tp, pgc.pp, pgc.mp, pgc.dp = mine["tp"], mine["pp"], mine["mp"], mine["dp"]
    pgc.embd = mine.get("embd")
    pgc.pos_embd = mine.get("pos_embd")
    # Context and expert groups never leave a stage (so never a partition nor a vendor): the
    # rule's own where it lists them (cp, dp_cp, ep, etp, edp), else megatron-core's, which are
    # single ranks or equal to a group above (CP 1: dp_cp is dp; EP 1 with expert TP = TP:
    # the experts' groups are TP's and DP x CP's). The compound groups megatron-core also asks
    # for (tp x cp, expert tp x ep, and with the pipeline) come from parallel_state.
    cp = mine.get("cp")
    pgc.cp = cp if cp is not None else ps.get_context_parallel_group()
    pgc.dp_cp = pgc.intra_dp_cp = pgc.intra_dist_opt = mine.get("dp_cp", pgc.dp)
    pgc.tp_cp = ps.get_tensor_and_context_parallel_group() if cp is not None else pgc.tp
    experts = "ep" in mine or "etp" in mine or "edp" in mine
    pgc.ep = mine["ep"] if "ep" in mine else ps.get_expert_model_parallel_group()
    pgc.expt_tp = mine["etp"] if "etp" in mine else (ps.get_expert_tensor_parallel_group() if experts else pgc.tp)
    pgc.expt_dp = pgc.intra_expt_dp = mine["edp"] if "edp" in mine else pgc.dp_cp
    pgc.tp_ep = ps.get_expert_tensor_and_model_parallel_group() if experts else pgc.tp
    pgc.tp_ep_pp = ps.get_expert_tensor_model_pipeline_parallel_group() if experts else pgc.mp
    # the router's token counts (MoE): every rank of the stage
    pgc.tp_dp_cp = ps.get_tensor_and_data_parallel_group(with_context_parallel=True)
    pgc.inter_dist_opt = None
    return pgc


def _moe_config(args: TrainArgs) -> dict[str, Any]:
    """TransformerConfig's mixture-of-experts options: megatron-core's MoE layer with the
    all-to-all token dispatcher (Megatron-LM's choice for expert parallel) and its experts as a
    list of MLPs (the local spec's SequentialMLP); nothing for a dense model."""
    if args.num_experts is None:
        return {}
    return dict(num_moe_experts=args.num_experts, moe_router_topk=args.moe_router_topk,
                moe_ffn_hidden_size=args.moe_ffn_hidden_size or args.ffn_hidden_size,
                moe_shared_expert_intermediate_size=args.moe_shared_expert_intermediate_size,
                moe_layer_freq=args.moe_layer_freq, moe_router_load_balancing_type=args.moe_router_load_balancing_type,
                moe_router_score_function=args.moe_router_score_function, moe_aux_loss_coeff=args.moe_aux_loss_coeff,
                moe_token_dispatcher_type="alltoall", moe_grouped_gemm=False,
                expert_model_parallel_size=args.expert_model_parallel_size,
                expert_tensor_parallel_size=args.expert_tensor_parallel_size)


def train(args: TrainArgs, env: DistEnv) -> int:
    """Build, train and log. Returns the process exit code."""
    import contextlib

    import torch

    on_cpu = not torch.cuda.is_available()
    with contextlib.ExitStack() as stack:
        tracker = None
        if on_cpu:
            from ..megatron_cpu import cpu_workarounds
            from .cpu import TensorMemoryTracker, use_cpu

            # The profiler's workarounds (dropout keeps a 1-byte mask as on CUDA, CPU RNG for
            # recompute), so measured memory means what the profiled layers' memory means;
            # then the rest of the training path (schedules, DDP, optimizer).
            stack.enter_context(cpu_workarounds())
            stack.callback(use_cpu().undo)
            tracker = stack.enter_context(TensorMemoryTracker())  # before the model: params count
        stack.callback(_destroy, torch)
        return _train(args, env, torch, on_cpu, tracker)


def _destroy(torch: Any) -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class _Refused(Exception):
    """A setup step refuses the run: its message is logged as ``error: ...`` and the run exits 1."""


@dataclass(frozen=True, kw_only=True)
class _Batches:
    """The run's batch arithmetic, as Megatron-LM derives it from the command line."""

    dp: int
    global_batch_size: int
    num_microbatches: int
    train_iters: int


def _batches(args: TrainArgs, world: int) -> _Batches:
    """Data-parallel size, global batch, micro-batches per iteration and iterations to run."""
    tp, pp, cp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size
    if world % (tp * cp * pp):
        raise _Refused(f"world size {world} is not divisible by tp*cp*pp = {tp * cp * pp}")
    dp = world // (tp * cp * pp)
    gbs = args.global_batch_size or args.micro_batch_size * dp
    if gbs % (args.micro_batch_size * dp):
        raise _Refused(f"global batch size {gbs} is not a multiple of micro batch size "
                       f"{args.micro_batch_size} times data-parallel size {dp}")
    # Megatron-LM: sample-based training runs train_samples // global batch iterations
    train_iters = args.train_iters if args.train_iters is not None else args.train_samples // gbs
    if train_iters < 1:
        raise _Refused(f"--train-samples {args.train_samples} is less than one global batch ({gbs})")
    return _Batches(dp=dp, global_batch_size=gbs, num_microbatches=gbs // (args.micro_batch_size * dp),
                    train_iters=train_iters)


def _tokenizer(args: TrainArgs) -> Any:
    from .tokenizer import load_tokenizer

    try:
        return load_tokenizer(args.tokenizer_type or "NullTokenizer", model=args.tokenizer_model,
                              vocab_file=args.vocab_file, merge_file=args.merge_file, vocab_size=args.vocab_size)
    except Exception as e:  # noqa: BLE001 - SpecError: a file the job names is missing or wrong
        raise _Refused(str(e)) from None


def _dtype(args: TrainArgs, rank: int, torch: Any, on_cpu: bool) -> Any:
    """The training dtype; on the CPU, fp32, with one line for each GPU-only argument set aside."""
    if on_cpu:
        for flag, why in args.ignored:
            _log(rank, f"ignoring {flag} on the CPU: {why}")
        if args.bf16 or args.fp16:
            _log(rank, f"{'--bf16' if args.bf16 else '--fp16'} requested: training in fp32 on the CPU "
                       f"(no native half-precision matmul here)")
        if args.use_distributed_optimizer:
            _log(rank, "--use-distributed-optimizer requested: using the plain megatron-core optimizer "
                       "(gloo has no reduce-scatter); identical when data-parallel size is 1")
        if args.pipeline_model_parallel_comm_backend == "ucc":
            _log(rank, "--pipeline-model-parallel-comm-backend ucc requested: gloo carries pipeline "
                       "sends on the CPU")
        if args.transformer_impl == "transformer_engine":
            _log(rank, "--transformer-impl transformer_engine requested: using the local spec on the CPU")
        return torch.float32
    return torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else torch.float32


def virtual_stages(args: TrainArgs) -> int:
    """Model chunks per pipeline rank: the layout's (Megatron-LM derives
    ``--virtual-pipeline-model-parallel-size`` from ``--pipeline-model-parallel-layout``: its
    ``|``-separated parts are ``pp x v`` chunks), else 1."""
    layout, pp = args.pipeline_model_parallel_layout, args.pipeline_model_parallel_size
    if not layout or pp < 2:
        return 1
    parts = layout.count("|") + 1
    if parts % pp:
        raise _Refused(f"--pipeline-model-parallel-layout has {parts} chunks, not a multiple of "
                       f"--pipeline-model-parallel-size {pp}")
    return parts // pp


def _init_groups(args: TrainArgs, env: DistEnv, torch: Any, on_cpu: bool) -> tuple[Any, str]:
    """Start torch.distributed and megatron-core's groups by the group rule, seed the RNGs as
    Megatron-LM does; ``(the cross-vendor group collection or None, the default backend)``."""
    import random

    import numpy as np
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    rank, world = env.rank, env.world_size
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    if not on_cpu:
        torch.cuda.set_device(env.local_rank)
    cp, ep, etp = args.context_parallel_size, args.expert_model_parallel_size, args.expert_tensor_parallel_size
    groups = planned_groups(world=world, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, on_cpu=on_cpu, torch=torch)
    if rank == 0:
        for line in format_map(groups):
            _log(rank, "process group " + line + (" [gloo on the CPU]" if on_cpu else ""))
    default_backend = "gloo" if on_cpu else next(g.backend for g in groups if g.kind == "default")
    torch.distributed.init_process_group(
        backend=default_backend, init_method=f"tcp://{env.master_addr}:{env.master_port}", rank=rank,
        world_size=world, timeout=datetime.timedelta(minutes=args.distributed_timeout_minutes))
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, context_parallel_size=cp,
        virtual_pipeline_model_parallel_size=virtual_stages(args) if virtual_stages(args) > 1 else None,
        expert_model_parallel_size=args.expert_model_parallel_size,
        expert_tensor_parallel_size=args.expert_tensor_parallel_size,
        pipeline_model_parallel_comm_backend=None if on_cpu else args.pipeline_model_parallel_comm_backend)
    # Cross-vendor: every group megatron-core communicates over, built on the backend the
    # group rule gives it and handed to the model, DDP, optimizer and schedule; parallel_state
    # keeps its own groups (on the world group's backend) only for rank bookkeeping.
    pgc = process_group_collection(groups, rank=rank, on_cpu=on_cpu, torch=torch, ps=ps) \
        if any(g.cross_vendor for g in groups) else None

    # Megatron-LM's _set_random_seed: a different seed per pipeline stage.
    seed = args.seed + 100 * ps.get_pipeline_model_parallel_rank()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    # On the CPU the training RNG tracker would save CUDA generator states; the inference
    # tracker (no forks) is the documented workaround (ml-stack notes).
    model_parallel_cuda_manual_seed(seed, inference_rng_tracker=on_cpu)
    return pgc, default_backend


@dataclass(frozen=True, kw_only=True)
class _Attention:
    """Which attention the model trains with: Transformer Engine's layer, or the local one
    with torch SDPA (``flash_like``) or megatron-core's unfused DotProductAttention."""

    use_te: bool
    flash_like: bool
    dropout: float


def _attention(args: TrainArgs, rank: int, on_cpu: bool) -> _Attention:
    # Flash/fused attention (Megatron-LM's default "auto" on GPUs) keeps no s x s matrices.
    # Transformer Engine's layer brings its own; megatron-core's local layer gets torch SDPA,
    # as the profiler measures it (without attention dropout: with it, CPU SDPA falls back to
    # a path that stores the matrices). "unfused"/"local" keep megatron-core's
    # DotProductAttention, which stores them, with dropout.
    use_te = not on_cpu and args.transformer_impl == "transformer_engine"
    if args.context_parallel_size > 1 and not use_te:
        raise _Refused(f"--context-parallel-size {args.context_parallel_size} needs Transformer Engine's attention "
                       f"(--transformer-impl transformer_engine on a GPU): megatron-core's local attention has no "
                       f"context parallel")
    flash_like = not use_te and args.attention_backend in ("auto", "flash", "fused")
    attention_dropout = args.attention_dropout
    if flash_like and attention_dropout > 0:
        _log(rank, f"--attention-backend {args.attention_backend}: torch SDPA in the local layer, without "
                   f"attention dropout ({attention_dropout} requested), as profiled")
        attention_dropout = 0.0
    return _Attention(use_te=use_te, flash_like=flash_like, dropout=attention_dropout)


def _transformer_config(args: TrainArgs, attention: _Attention, dtype: Any, torch: Any) -> Any:
    """megatron-core's TransformerConfig of the command line (MLATransformerConfig for
    multi-latent attention, as Megatron-LM's core_transformer_config_from_args chooses)."""
    import torch.nn.functional as F
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    ffn = args.ffn_hidden_size
    if ffn is None:  # Megatron-LM's defaults (validate_args)
        ffn = int((4 * args.hidden_size * 2 / 3) / 64) * 64 if args.swiglu else 4 * args.hidden_size
    config_class = MLATransformerConfig if args.multi_latent_attention else TransformerConfig
    return config_class(
        num_layers=args.num_layers, hidden_size=args.hidden_size, ffn_hidden_size=ffn,
        num_attention_heads=args.num_attention_heads, num_query_groups=args.num_query_groups,
        normalization=args.normalization, add_bias_linear=args.add_bias_linear, add_qkv_bias=args.add_qkv_bias,
        qk_layernorm=args.qk_layernorm, **({"kv_channels": args.kv_channels} if args.kv_channels else {}),
        gated_linear_unit=args.swiglu, activation_func=F.silu if args.swiglu else F.gelu,
        attention_dropout=attention.dropout, hidden_dropout=args.hidden_dropout,
        init_method_std=args.init_method_std,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        context_parallel_size=args.context_parallel_size,
        sequence_parallel=args.sequence_parallel,
        pipeline_model_parallel_layout=args.pipeline_model_parallel_layout,
        num_layers_in_first_pipeline_stage=args.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=args.decoder_last_pipeline_num_layers,
        pipeline_dtype=dtype, params_dtype=dtype, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
        use_cpu_initialization=True,
        recompute_granularity=args.recompute_granularity, recompute_method=args.recompute_method,
        recompute_num_layers=args.recompute_num_layers,
        **({"recompute_modules": list(args.recompute_modules)} if args.recompute_modules else {}),
        # Megatron-LM's default fusions of bias+activation (GeLU with biases, SwiGLU) and
        # bias+dropout+add keep less for backward than the unfused ops; the profiler runs
        # them too (eagerly under cpu_workarounds), so the memory measured in training
        # means what the profiled layer's memory means. The rest are CUDA kernels.
        bias_activation_fusion=args.swiglu or args.add_bias_linear, bias_dropout_fusion=True,
        masked_softmax_fusion=False, persist_layer_norm=False, apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        deallocate_pipeline_outputs=True,
        **_moe_config(args), **_mla_config(args),
    )


def _mla_config(args: TrainArgs) -> dict[str, Any]:
    """MLATransformerConfig's fields from Megatron-LM's MLA arguments (each config field of the
    same name, as core_transformer_config_from_args copies them); ``--rope-type`` left out keeps
    the config's default (YaRN). Nothing for standard attention."""
    if not args.multi_latent_attention:
        return {}
    return dict(q_lora_rank=args.q_lora_rank, kv_lora_rank=args.kv_lora_rank, qk_head_dim=args.qk_head_dim,
                qk_pos_emb_head_dim=args.qk_pos_emb_head_dim, v_head_dim=args.v_head_dim,
                rotary_base=args.rotary_base, rotary_scaling_factor=args.rotary_scaling_factor,
                mscale=args.mscale, mscale_all_dim=args.mscale_all_dim,
                **({"rope_type": args.rope_type} if args.rope_type is not None else {}))


def _layer_spec(args: TrainArgs, attention: _Attention) -> Any:
    """The transformer layer spec as Megatron-LM's gpt_builders picks it (experts, Q/K norms,
    multi-latent attention where the command line asks): Transformer Engine's, or the local
    one (with SDPA attention where ``flash_like``, MLA's head sizes through
    :func:`~memx_hpc.megatron_cpu.mla_core_attention_class`) whose checkpoint keys are
    Transformer Engine's (:func:`te_checkpoint_keys`)."""
    import copy

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    kinds = dict(num_experts=args.num_experts, moe_grouped_gemm=False, qk_layernorm=args.qk_layernorm,
                 multi_latent_attention=args.multi_latent_attention)
    if attention.use_te:
        try:
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
            return get_gpt_layer_with_transformer_engine_spec(**kinds)
        except Exception as e:  # noqa: BLE001 - TE missing or broken: say so, do not train another layer
            raise _Refused(f"--transformer-impl transformer_engine, but Transformer Engine is not usable here "
                           f"({type(e).__name__}: {e})") from None
    from ..megatron_cpu import mla_core_attention_class, sdpa_core_attention_class

    spec = copy.deepcopy(get_gpt_layer_local_spec(normalization=args.normalization, **kinds))
    core = sdpa_core_attention_class() if attention.flash_like else None
    if args.multi_latent_attention:
        core = mla_core_attention_class(core)
    if core is not None:
        spec.submodules.self_attention.submodules.core_attention = core
    spec.submodules.sharded_state_dict_keys_map = te_checkpoint_keys(args)
    return spec


def te_checkpoint_keys(args: TrainArgs) -> dict[str, str]:
    """The local layer's checkpoint key prefixes renamed to the Transformer Engine layer's, so
    that Megatron-LM's default (``--transformer-impl transformer_engine``) loads what this entry
    saves: Transformer Engine fuses a norm into the linear layer after it, and its checkpoint
    calls the norm's weight ``<linear>.layer_norm_weight`` (get_gpt_layer_with_transformer_engine_spec):
    the input norm into ``linear_qkv`` (standard attention; MLA keeps ``input_layernorm``), MLA's
    latent norms into ``linear_q_up_proj`` / ``linear_kv_up_proj``, the MLP's norm into
    ``linear_fc1`` (a dense MLP; an MoE layer keeps ``pre_mlp_layernorm``)."""
    keys: dict[str, str] = {}
    if args.multi_latent_attention:
        if args.qk_layernorm:
            keys["self_attention.q_layernorm."] = "self_attention.linear_q_up_proj.layer_norm_"
            keys["self_attention.kv_layernorm."] = "self_attention.linear_kv_up_proj.layer_norm_"
    else:
        keys["input_layernorm."] = "self_attention.linear_qkv.layer_norm_"
    if args.num_experts is None:
        keys["pre_mlp_layernorm."] = "mlp.linear_fc1.layer_norm_"
    return keys


@dataclass(frozen=True, kw_only=True)
class _Built:
    """The model as megatron-core trains it: the GPT module of each model chunk of this rank
    (one, or one per virtual stage under the interleaved schedule), their DDP wrappers, the
    optimizer and learning-rate schedule, with the padded vocabulary the checkpoint records."""

    model: tuple[Any, ...]
    ddp: tuple[Any, ...]
    optimizer: Any
    scheduler: Any
    vocab: int


def _build(args: TrainArgs, config: Any, attention: _Attention, tokenizer: Any, b: _Batches, pgc: Any,
           dtype: Any, torch: Any, on_cpu: bool) -> _Built:
    """GPTModel, DistributedDataParallel, optimizer and scheduler, as Megatron-LM's setup builds them."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, \
        finalize_model_grads
    from megatron.core.models.gpt import GPTModel

    # Megatron-LM's _vocab_size_with_padding of the tokenizer's vocabulary (NullTokenizer: V + 1)
    multiple = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
    vocab = -(-tokenizer.vocab_size // multiple) * multiple
    spec = _layer_spec(args, attention)
    v = virtual_stages(args)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=dtype != torch.float32, overlap_grad_reduce=False,
        use_distributed_optimizer=args.use_distributed_optimizer and not on_cpu)
    models, ddps = [], []
    # Megatron-LM's get_model: one GPTModel per model chunk (vp_stage), the embedding on the
    # first chunk of the first stage, the output layer on the last chunk of the last stage,
    # each in its own DDP wrapper (gradient buckets of the chunks after the first disabled)
    for i in range(v):
        vp = i if v > 1 else None
        model = GPTModel(
            config=config, transformer_layer_spec=spec,
            vocab_size=vocab, max_sequence_length=args.max_position_embeddings or args.seq_length,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=v == 1, vp_stage=vp),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=v == 1, vp_stage=vp), parallel_output=True,
            share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
            position_embedding_type=args.position_embedding_type, rotary_base=args.rotary_base,
            rope_scaling=args.use_rope_scaling, rope_scaling_factor=args.rope_scaling_factor,
            **({"vp_stage": vp} if vp is not None else {}), **({"pg_collection": pgc} if pgc else {}))
        if not on_cpu:
            model.cuda(torch.cuda.current_device())
        models.append(model)
        ddps.append(DistributedDataParallel(config=config, ddp_config=ddp_config, module=model,
                                            disable_bucketing=i > 0, **({"pg_collection": pgc} if pgc else {})))
    config.no_sync_func = [d.no_sync for d in ddps] if v > 1 else ddps[0].no_sync
    config.finalize_model_grads_func = partial(finalize_model_grads, pg_collection=pgc) if pgc \
        else finalize_model_grads
    optimizer, scheduler = _optimizer(args, config, ddps, b, pgc, dtype, torch, on_cpu)
    return _Built(model=tuple(models), ddp=tuple(ddps), optimizer=optimizer, scheduler=scheduler, vocab=vocab)


def _optimizer(args: TrainArgs, config: Any, ddps: Sequence[Any], b: _Batches, pgc: Any, dtype: Any, torch: Any,
               on_cpu: bool) -> tuple[Any, Any]:
    """megatron-core's optimizer over the model chunks ``ddps`` and Megatron-LM's learning-rate
    schedule."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    gbs, train_iters = b.global_batch_size, b.train_iters
    opt_config = OptimizerConfig(
        optimizer=args.optimizer, lr=args.lr, min_lr=args.min_lr, weight_decay=args.weight_decay,
        adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
        clip_grad=args.clip_grad, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
        params_dtype=dtype, use_distributed_optimizer=args.use_distributed_optimizer and not on_cpu)
    optimizer = get_megatron_optimizer(opt_config, list(ddps), **({"pg_collection": pgc, "use_gloo_process_groups": False}
                                                             if pgc else {}))
    config.grad_scale_func = optimizer.scale_loss  # as Megatron-LM's setup: fp16 loss scaling
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=0.0 if (args.lr_warmup_iters or args.lr_warmup_samples) else args.lr, max_lr=args.lr, min_lr=args.min_lr,
        # Megatron-LM's get_optimizer_param_scheduler: steps are samples
        lr_warmup_steps=args.lr_warmup_iters * gbs if args.train_iters is not None else args.lr_warmup_samples,
        lr_decay_steps=(args.lr_decay_iters or train_iters) * gbs if args.train_iters is not None
        else (args.lr_decay_samples or args.train_samples),
        lr_decay_style=args.lr_decay_style, start_wd=args.weight_decay, end_wd=args.weight_decay,
        wd_incr_steps=train_iters * gbs, wd_incr_style="constant")
    return optimizer, scheduler


def _log_layout(args: TrainArgs, env: DistEnv, config: Any, built: _Built, attention: _Attention, b: _Batches,
                backend: str, torch: Any, on_cpu: bool) -> None:
    """The rank's one layout line: where it sits, what it holds, where it runs."""
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    rank, tp, pp = env.rank, args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    stage = ps.get_pipeline_model_parallel_rank()
    v = len(built.model)
    chunks = [(get_transformer_layer_offset(config, vp_stage=i if v > 1 else None, pp_rank=stage),
               get_num_layers_to_build(config, vp_stage=i if v > 1 else None, pp_rank=stage)) for i in range(v)]
    n_layers = sum(n for _, n in chunks)
    recompute = args.recompute_granularity or "none"
    if args.recompute_granularity == "full":
        recompute += f"/{args.recompute_method}/{args.recompute_num_layers}"
    n_params = sum(p.numel() for m in built.model for p in m.parameters())
    _log(rank, layout_line(rank=rank, fields={
        "world": env.world_size, "tp rank": f"{ps.get_tensor_model_parallel_rank()}/{tp}",
        "pp stage": f"{stage}/{pp}", "dp rank": f"{ps.get_data_parallel_rank()}/{b.dp}",
        **({"cp rank": f"{ps.get_context_parallel_rank()}/{args.context_parallel_size}"}
           if args.context_parallel_size > 1 else {}),
        "layers": ",".join(f"{a}-{a + n - 1}" for a, n in chunks if n) or "none", "num layers": n_layers,
        **({"virtual stages": v} if v > 1 else {}),
        "embedding": ps.is_pipeline_first_stage(), "loss": ps.is_pipeline_last_stage(), "recompute": recompute,
        "parameters": n_params, "micro batches": b.num_microbatches,
        "component": os.environ.get("MEMX_COMPONENT", "-"), "partition": os.environ.get("MEMX_PARTITION", "-"),
        "node": os.environ.get("SLURMD_NODENAME", "-"), "host": socket.gethostname(),
        "attention": "sdpa" if attention.flash_like else "core",
        **({"multi-latent attention": True} if args.multi_latent_attention else {}),
        "transformer impl": "transformer_engine" if attention.use_te else "local",
        "device": "cpu" if on_cpu else f"cuda:{torch.cuda.current_device()}", "backend": backend,
        **({"experts": f"{args.num_experts // ps.get_expert_model_parallel_world_size()}/{args.num_experts}",
            "ep rank": f"{ps.get_expert_model_parallel_rank()}/{ps.get_expert_model_parallel_world_size()}"}
           if args.num_experts is not None else {}),
    })[len(f"[Rank {rank}] "):])


def _resume(args: TrainArgs, rank: int, built: _Built, ckpt_args: Any, dp_group: Any, ranks: dict[str, int],
            torch: Any) -> int:
    """The iteration the run starts after: the loaded checkpoint's, else 0."""
    from . import checkpoint as ckpt

    if not args.load:
        return 0
    try:
        got = ckpt.load(args.load, model=built.model, optimizer=built.optimizer, scheduler=built.scheduler,
                        args=ckpt_args, dp_group=dp_group, ranks=ranks, torch=torch)
    except Exception as e:  # noqa: BLE001 - a checkpoint of another model: say what, stop
        raise _Refused(f"cannot load the checkpoint in {args.load}: {type(e).__name__}: {e}") from None
    if got is None:
        return 0
    start, note = got
    _log(rank, f"resumed from {args.load} at iteration {start} ({note})")
    return start


def _data(args: TrainArgs, tokenizer: Any, b: _Batches, start: int, device: Any, torch: Any,
          ) -> tuple[Iterator[dict[str, Any]], Any]:
    """The training batches from iteration ``start + 1`` on, and the validation set (None: no
    evaluation): the job's indexed data, else synthetic batches."""
    from megatron.core import parallel_state as ps

    eval_on = bool(args.data_path) and args.eval_iters > 0
    if args.data_path:
        n_evals = b.train_iters // args.eval_interval + 1 if eval_on else 0
        gbs = b.global_batch_size
        train_set, valid_set = _datasets(args=args, tokenizer=tokenizer, seed=args.seed,
                                         train_samples=b.train_iters * gbs,
                                         valid_samples=n_evals * args.eval_iters * gbs)
        data = _dataset_batches(train_set, micro_batch_size=args.micro_batch_size, dp_rank=ps.get_data_parallel_rank(),
                                dp=b.dp, start_microbatch=start * b.num_microbatches, torch=torch, device=device)
        return data, valid_set if eval_on else None
    data = _synthetic_batches(seed=args.seed, dp_rank=ps.get_data_parallel_rank(),
                              micro_batch_size=args.micro_batch_size, seq_length=args.seq_length,
                              vocab_size=args.vocab_size, torch=torch, device=device)
    for _ in range(start * b.num_microbatches):  # the data position of the resumed iteration
        next(data)
    return data, None


def _train(args: TrainArgs, env: DistEnv, torch: Any, on_cpu: bool, tracker: Any) -> int:
    """Set up (batches, tokenizer, groups, model, optimizer, resume, data), then run the loop."""
    from megatron.core import parallel_state as ps

    rank = env.rank
    try:
        b = _batches(args, env.world_size)
        tokenizer = _tokenizer(args)
        dtype = _dtype(args, rank, torch, on_cpu)
        pgc, backend = _init_groups(args, env, torch, on_cpu)
        attention = _attention(args, rank, on_cpu)
        config = _transformer_config(args, attention, dtype, torch)
        built = _build(args, config, attention, tokenizer, b, pgc, dtype, torch, on_cpu)
        _log_layout(args, env, config, built, attention, b, backend, torch, on_cpu)
        device = "cpu" if on_cpu else torch.device("cuda", torch.cuda.current_device())
        # losses and the checkpoint's replicas: DP and CP together (Megatron-LM's
        # get_data_parallel_group(with_context_parallel=True); DP itself at CP 1)
        dp_group = pgc.dp_cp if pgc is not None else ps.get_data_parallel_group(with_context_parallel=True)
        ranks = {"pp_rank": ps.get_pipeline_model_parallel_rank(), "pp": args.pipeline_model_parallel_size,
                 "tp_rank": ps.get_tensor_model_parallel_rank(), "tp": args.tensor_model_parallel_size,
                 "dp_rank": ps.get_data_parallel_rank()}
        ckpt_args = checkpoint_args(args, world=env.world_size, dp=b.dp, padded_vocab_size=built.vocab,
                                    tokenizer=tokenizer)
        start = _resume(args, rank, built, ckpt_args, dp_group, ranks, torch)
        data, valid_data = _data(args, tokenizer, b, start, device, torch)
        data = per_chunk(cp_slices(data, args.context_parallel_size), len(built.model))
    except _Refused as e:
        _log(rank, f"error: {e}")
        return 1
    metrics = MetricsLog.open(args, rank=rank, world=env.world_size, start_iteration=start,
                              say=partial(_log, rank))
    loop = _Loop(args=args, rank=rank, world=env.world_size, torch=torch, on_cpu=on_cpu, tracker=tracker,
                 batches=b, built=built, schedule_groups=_schedule_groups(pgc, config, args), dp_group=dp_group,
                 ranks=ranks, ckpt_args=ckpt_args, device=device, valid_data=valid_data, metrics=metrics,
                 flops_per_iteration=training_flops(args, batch_size=b.global_batch_size, padded_vocab_size=built.vocab))
    try:
        return loop.run(start, data)
    finally:
        if metrics is not None:
            metrics.close()


def _schedule_groups(pgc: Any, config: Any, args: TrainArgs) -> dict[str, Any]:
    """The cross-vendor groups the pipeline schedule communicates over (none: parallel_state's)."""
    out: dict[str, Any] = {}
    if pgc is not None:
        from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

        out["pg_collection"] = pgc
        if args.pipeline_model_parallel_size > 1:
            out["p2p_communicator"] = P2PCommunicator(pp_group=pgc.pp, config=config)
    return out


@dataclass(frozen=True, kw_only=True)
class _Loop:
    """Megatron-LM's training loop over a built model: iterations, logging, evaluation,
    checkpoints and the exit conditions."""

    args: TrainArgs
    rank: int
    world: int
    torch: Any
    on_cpu: bool
    tracker: Any
    batches: _Batches
    built: _Built
    schedule_groups: dict[str, Any]
    dp_group: Any
    ranks: dict[str, int]
    ckpt_args: Any
    device: Any
    valid_data: Any  # the validation set; None: no evaluation
    metrics: MetricsLog | None = None  # TensorBoard / Weights & Biases (the last rank only)
    flops_per_iteration: float = 0.0  # for the throughput (TFLOP/s per device), as Megatron-LM counts them

    def _fwd_bwd(self, data: Iterator[dict[str, Any]] | list[Iterator[dict[str, Any]]], *,
                 forward_only: bool) -> list[Any]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        a = self.args
        return get_forward_backward_func()(
            forward_step_func=_forward_step, data_iterator=data, model=list(self.built.ddp),
            num_microbatches=self.batches.num_microbatches, seq_length=a.seq_length,
            micro_batch_size=a.micro_batch_size, decoder_seq_length=a.seq_length, forward_only=forward_only,
            **self.schedule_groups)

    def step(self, data: Iterator[dict[str, Any]]) -> tuple[list[Any], Any, float]:
        """One iteration: ``(losses, gradient norm, ms)``, timed between barriers (the iteration
        ends when the slowest stage is done)."""
        torch, built = self.torch, self.built
        torch.distributed.barrier()
        t0 = time.perf_counter()
        for ddp in built.ddp:
            ddp.zero_grad_buffer()
        built.optimizer.zero_grad()
        losses = self._fwd_bwd(data, forward_only=False)
        _, grad_norm, _ = built.optimizer.step()
        built.scheduler.step(increment=self.batches.global_batch_size)
        torch.distributed.barrier()
        return losses, grad_norm, (time.perf_counter() - t0) * 1000.0

    def lm_loss_of(self, losses: Any) -> float | None:
        from megatron.core import parallel_state as ps

        if not (ps.is_pipeline_last_stage() and losses):
            return None
        tot = self.torch.stack([x["lm loss"] for x in losses]).sum(dim=0)
        self.torch.distributed.all_reduce(tot, group=self.dp_group)
        return float(tot[0] / max(tot[1].item(), 1.0))

    def log_iteration(self, iteration: int, losses: Any, grad_norm: Any, interval_ms: list[float]) -> None:
        b = self.batches
        lm_loss = self.lm_loss_of(losses)
        if self.rank == self.world - 1:
            ms = sum(interval_ms) / len(interval_ms)
            # Megatron-LM's throughput: FLOPs of the iteration / (seconds * 1e12 * world size)
            tflops = self.flops_per_iteration / (ms / 1000.0 * 1e12 * self.world) if ms > 0 else None
            lr = self.built.optimizer.param_groups[0]["lr"]
            norm = float(grad_norm) if grad_norm is not None else None
            print(iteration_line(
                iteration=iteration, train_iters=b.train_iters, consumed_samples=iteration * b.global_batch_size,
                elapsed_ms=ms, learning_rate=lr, global_batch_size=b.global_batch_size, lm_loss=lm_loss,
                grad_norm=norm, timestamp=_now(), throughput_tflops=tflops if self.args.log_throughput else None),
                flush=True)
            if self.metrics is not None:
                self.metrics.iteration(iteration, consumed_samples=iteration * b.global_batch_size, lm_loss=lm_loss,
                                       learning_rate=lr, grad_norm=norm, batch_size=b.global_batch_size,
                                       iteration_s=ms / 1000.0, throughput_tflops=tflops,
                                       memory_bytes=self.memory_bytes())

    def memory_bytes(self) -> dict[str, int]:
        """This rank's memory now, as Megatron-LM logs it to TensorBoard (CPU: live tensor storages
        and the process's resident set, :mod:`memx_hpc.train.cpu`)."""
        if self.on_cpu:
            from .cpu import rss_bytes

            return {"reserved": rss_bytes()[0], "allocated": self.tracker.allocated_bytes,
                    "max-allocated": self.tracker.max_allocated_bytes}
        torch = self.torch
        return {"reserved": torch.cuda.memory_reserved(), "allocated": torch.cuda.memory_allocated(),
                "max-allocated": torch.cuda.max_memory_allocated()}

    def report_memory(self, iteration: int) -> None:
        from megatron.core import parallel_state as ps

        from .cpu import rss_bytes

        if ps.get_data_parallel_rank() != 0:
            return  # as Megatron-LM: one report per model-parallel rank
        torch, rank = self.torch, self.rank
        if self.on_cpu:
            cur, peak = rss_bytes()
            line = memory_line(rank=rank, iteration=iteration, allocated_bytes=self.tracker.allocated_bytes,
                               max_allocated_bytes=self.tracker.max_allocated_bytes, reserved_bytes=cur,
                               max_reserved_bytes=peak)
        else:
            line = memory_line(rank=rank, iteration=iteration, allocated_bytes=torch.cuda.memory_allocated(),
                               max_allocated_bytes=torch.cuda.max_memory_allocated(),
                               reserved_bytes=torch.cuda.memory_reserved(),
                               max_reserved_bytes=torch.cuda.max_memory_reserved())
            free, total = torch.cuda.mem_get_info()
            # what the driver counts on this device (CUDA context, NCCL buffers, allocator cache)
            _log(rank, f"device memory used (driver) after iteration {iteration}: {(total - free) / 2**20:.1f} MB "
                       f"of {total / 2**20:.1f} MB")
        print(line, flush=True)

    def evaluate(self, iteration: int) -> None:
        # Megatron-LM's evaluate(): eval_iters global batches of the validation set, forward only;
        # evaluation k reads the k-th block of eval_iters batches (the validation sampler's order)
        import math

        from megatron.core import parallel_state as ps

        a, b = self.args, self.batches
        k = iteration // a.eval_interval if iteration % a.eval_interval == 0 else b.train_iters // a.eval_interval
        vdata = _dataset_batches(self.valid_data, micro_batch_size=a.micro_batch_size,
                                 dp_rank=ps.get_data_parallel_rank(), dp=b.dp,
                                 start_microbatch=k * a.eval_iters * b.num_microbatches, torch=self.torch,
                                 device=self.device)
        vdata = per_chunk(cp_slices(vdata, self.args.context_parallel_size), len(self.built.ddp))
        out = []
        with self.torch.no_grad():
            for _ in range(a.eval_iters):
                out += self._fwd_bwd(vdata, forward_only=True)
        loss = self.lm_loss_of(out)
        if self.rank == self.world - 1 and loss is not None:
            print(f" validation loss at iteration {iteration} | lm loss value: {loss:.6E} | "
                  f"lm loss PPL: {math.exp(min(loss, 20.0)):.6E} |", flush=True)
            if self.metrics is not None:
                self.metrics.validation(iteration, lm_loss=loss, consumed_samples=iteration * b.global_batch_size)

    def save(self, iteration: int) -> None:
        from . import checkpoint as ckpt

        built = self.built
        ckpt.save(self.args.save, iteration=iteration, model=built.model, optimizer=built.optimizer,
                  scheduler=built.scheduler, args=self.ckpt_args, dp_group=self.dp_group, ranks=self.ranks,
                  torch=self.torch)
        if self.rank == 0:
            _log(self.rank, f"saved checkpoint at iteration {iteration} to {self.args.save}")

    def exit_requested(self, stop: _StopRequest, iteration: int, t_start: float) -> bool:
        """Megatron-LM's exit conditions, decided together (any rank's request stops all)."""
        a, torch = self.args, self.torch
        want = stop.requested() or (a.exit_interval is not None and iteration % a.exit_interval == 0) or \
            (a.exit_duration_in_mins is not None and (time.monotonic() - t_start) / 60.0 > a.exit_duration_in_mins)
        flag = torch.tensor([1 if want else 0], dtype=torch.int)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def run(self, start: int, data: Iterator[dict[str, Any]]) -> int:
        """Iterations ``start + 1 .. train_iters``, or until an exit condition saves and stops."""
        a, train_iters, eval_on = self.args, self.batches.train_iters, self.valid_data is not None
        interval_ms: list[float] = []
        reported_memory = False
        stop = _StopRequest(a.exit_signal_handler)
        t_start = time.monotonic()
        iteration = start
        saved_at = start if a.load and a.save == a.load else None
        for iteration in range(start + 1, train_iters + 1):
            losses, grad_norm, ms = self.step(data)
            interval_ms.append(ms)
            if iteration % a.log_interval == 0 or iteration == train_iters:
                self.log_iteration(iteration, losses, grad_norm, interval_ms)
                interval_ms.clear()
                if not reported_memory:
                    self.report_memory(iteration)
                    reported_memory = True
            if eval_on and iteration % a.eval_interval == 0:
                self.evaluate(iteration)
            if a.save and a.save_interval and iteration % a.save_interval == 0:
                self.save(iteration)
                saved_at = iteration
            if self.exit_requested(stop, iteration, t_start) and iteration < train_iters:
                if a.save and saved_at != iteration:
                    self.save(iteration)
                if self.rank == 0:
                    _log(self.rank, f"exiting at iteration {iteration} of {train_iters} (signal, --exit-interval or "
                                    f"--exit-duration-in-mins); the same command with --load {a.save or a.load} goes on")
                return 0
        if eval_on and train_iters % a.eval_interval:
            self.evaluate(train_iters)
        if a.save and saved_at != train_iters and iteration == train_iters:
            self.save(train_iters)
        self.report_memory(train_iters)
        self.torch.distributed.barrier()
        if self.rank == 0:
            print(f"[after training is done] datetime: {_now()}", flush=True)
        return 0


def _writer_ignores_sigterm() -> None:
    """Start megatron-core's checkpoint-writer results queue (a ``spawn`` Manager process,
    filesystem_async._get_write_results_queue) with SIGTERM ignored, which the new interpreter
    keeps (an ignored signal survives exec; a Python handler does not). Slurm's SIGTERM reaches
    every process of a step (scancel --signal, the time limit, preemption): a Manager with the
    default action would die, and the save that the signal asks for would fail (BrokenPipeError)."""
    import signal

    try:
        from megatron.core.dist_checkpointing.strategies import filesystem_async as fa
    except ImportError:
        return
    getter = getattr(fa, "_get_write_results_queue", None)
    if getter is None:
        return
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        getter()
    finally:
        signal.signal(signal.SIGTERM, before)


class _StopRequest:
    """Megatron-LM's --exit-signal-handler: SIGTERM (Slurm's time limit, scancel, preemption)
    asks the run to save and stop after the current iteration instead of dying mid-step."""

    def __init__(self, enabled: bool) -> None:
        self._hit = False
        if enabled:
            import signal

            _writer_ignores_sigterm()
            signal.signal(signal.SIGTERM, self._handler)

    def _handler(self, signum: int, frame: Any) -> None:  # noqa: ARG002 - signal's signature
        self._hit = True

    def requested(self) -> bool:
        return self._hit


def checkpoint_args(args: TrainArgs, *, world: int, dp: int, padded_vocab_size: int, tokenizer: Any) -> Any:
    """The ``args`` a checkpoint keeps, under Megatron-LM's names: what its loader compares
    (check_checkpoint_args) and what ``--use-checkpoint-args`` and ``plan --resume`` read."""
    from argparse import Namespace
    from dataclasses import asdict

    d = {k: v for k, v in asdict(args).items() if k != "ignored"}
    d.update(world_size=world, data_parallel_size=dp, padded_vocab_size=padded_vocab_size,
             add_position_embedding=args.position_embedding_type == "learned_absolute",
             tokenizer_type=args.tokenizer_type or "NullTokenizer", use_dist_ckpt=True,
             orig_vocab_size=tokenizer.vocab_size, data_path=list(args.data_path) if args.data_path else None,
             max_position_embeddings=args.max_position_embeddings or args.seq_length,
             num_query_groups=args.num_query_groups or args.num_attention_heads)
    return Namespace(**d)


def main(argv: Sequence[str] | None = None) -> int:
    import warnings

    args = parse_args(argv)
    # Known, harmless notices that would otherwise repeat on every rank of every run.
    warnings.filterwarnings("ignore", message=".*Apex .*not installed.*")
    warnings.filterwarnings("ignore", message=".*full scope is deprecated.*")
    _set_threads()
    env = dist_env()
    return train(args, env)


if __name__ == "__main__":
    sys.exit(main())
