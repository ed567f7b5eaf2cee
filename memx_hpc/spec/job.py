"""What to train: :class:`TrainJob` (a model, the batch, precision, optimizer and the degrees
the search may choose among), with its data (:class:`TrainData`), learning-rate schedule
(:class:`LRSchedule`), checkpointing (:class:`Checkpointing`) and where its metrics go
(:class:`TrainLogging`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from ..errors import SpecError
from ..shellsafe import check_path
from .checks import (MAX_GLOBAL_BATCH, MAX_LAYERS, MAX_MICRO_BATCH_CHOICES, MAX_SEQ_LENGTH, MAX_TRAIN_ITERS,
                     _choice, _degrees, _real, _safe_name, _short, _text, _whole)
from .model import ModelSpec
from .modes import (ATTENTIONS, BYTES_PER_ELEMENT, FP8_FORMATS, FP8_RECIPES, LR_DECAY_STYLES, OPTIMIZERS, PRECISIONS,
                    RECOMPUTE_MODES, TOKENIZER_TYPES, Attention, Fp8Format, Fp8Recipe, LrDecayStyle, Optimizer,
                    Precision, RecomputeMode, TokenizerType)
from .recompute import Recompute


def max_virtual_stages(num_layers: int) -> int:
    """The most model chunks per pipeline rank any searched plan of a model of ``num_layers``
    can take: interleaving needs at least 2 pipeline stages and the search gives every stage
    at least one layer per chunk (memx_hpc/search/space.py), so ``2 * v <= num_layers``."""
    return max(1, num_layers // 2)



@dataclass(frozen=True, kw_only=True)
class TrainData:
    """Real training data (Megatron-LM's ``--data-path``, ``--split`` and tokenizer arguments).
    Paths are single words (memx_hpc.shellsafe), weights optional: ``[0.3, a, 0.7, b]``."""

    paths: tuple[str, ...]
    tokenizer_type: TokenizerType
    tokenizer_model: str | None = None
    vocab_file: str | None = None
    merge_file: str | None = None
    split: str = "969,30,1"

    def __post_init__(self) -> None:
        if not isinstance(self.paths, tuple) or not self.paths:
            raise SpecError("expected a non-empty list of dataset prefixes", field="paths", found=_short(self.paths))
        for i, p in enumerate(self.paths):
            check_path(str(p), f"paths[{i}]")
        _choice(self.tokenizer_type, "tokenizer.type", TOKENIZER_TYPES)
        for name in ("tokenizer_model", "vocab_file", "merge_file"):
            if getattr(self, name) is not None:
                check_path(getattr(self, name), name)
        if not re.fullmatch(r"\d+(,\d+){0,2}", self.split or ""):
            raise SpecError("expected train,valid,test weights such as 969,30,1", field="split", found=self.split)


@dataclass(frozen=True, kw_only=True)
class LRSchedule:
    """Megatron-LM's learning-rate schedule arguments."""

    lr: float = 1.0e-4
    min_lr: float = 0.0
    decay_style: LrDecayStyle = "linear"
    warmup_iters: int = 0
    decay_iters: int | None = None  # None: over train_iters

    def __post_init__(self) -> None:
        _real(self.lr, "lr", 0.0, 10.0, lo_open=True)
        _real(self.min_lr, "min_lr", 0.0, self.lr)
        _choice(self.decay_style, "decay_style", LR_DECAY_STYLES)
        _whole(self.warmup_iters, "warmup_iters", 0, MAX_TRAIN_ITERS)
        _whole(self.decay_iters, "decay_iters", 1, MAX_TRAIN_ITERS, optional=True)


#: The most Slurm jobs one run may continue through (a last guard against a chain that never
#: ends: each segment must also write a newer checkpoint than the one it started from).
DEFAULT_MAX_SEGMENTS = 1000
MAX_SEGMENTS = 100_000


@dataclass(frozen=True, kw_only=True)
class Checkpointing:
    """Where checkpoints go and come from (``--save``, ``--load``, ``--save-interval``), and how
    many Slurm jobs (segments) a run that saves may continue through (``max_segments``): the
    rendered script submits its own continuation at Slurm's time limit
    (memx_hpc/slurm/render.py)."""

    save_dir: str | None = None
    load_dir: str | None = None
    save_interval: int | None = None
    max_segments: int = DEFAULT_MAX_SEGMENTS

    def __post_init__(self) -> None:
        for name in ("save_dir", "load_dir"):
            if getattr(self, name) is not None:
                check_path(getattr(self, name), name)
        _whole(self.save_interval, "interval", 1, MAX_TRAIN_ITERS, optional=True)
        if self.save_interval is not None and self.save_dir is None:
            raise SpecError("a save interval needs a save directory", field="interval", found=self.save_interval)
        _whole(self.max_segments, "max_segments", 1, MAX_SEGMENTS)


#: Weights & Biases names: what its web interface shows; single words keep them out of trouble
#: in a shell line and a URL
_WANDB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
MAX_WANDB_NAME_CHARS = 128


@dataclass(frozen=True, kw_only=True)
class TrainLogging:
    """Where a training run's metrics go besides its text log: TensorBoard event files in the
    run's folder (``tensorboard``, on by default: Megatron-LM's ``--tensorboard-dir`` with its
    throughput, memory and timer scalars) and Weights & Biases when ``wandb_project`` is named
    (``--wandb-project``, ``--wandb-exp-name``: default the job's name)."""

    tensorboard: bool = True
    wandb_project: str | None = None
    wandb_exp_name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tensorboard, bool):
            raise SpecError("expected true or false", field="tensorboard", found=_short(self.tensorboard))
        for name in ("wandb_project", "wandb_exp_name"):
            v = getattr(self, name)
            _text(v, name, optional=True)
            if v is not None and (not _WANDB_NAME.fullmatch(v) or len(v) > MAX_WANDB_NAME_CHARS):
                raise SpecError("not a Weights & Biases name", field=name, found=_short(v),
                                allowed=f"letters, digits, '_', '.', '+', '-' (first a letter or digit); "
                                        f"at most {MAX_WANDB_NAME_CHARS} characters")
        if self.wandb_exp_name is not None and self.wandb_project is None:
            raise SpecError("an experiment name needs a project", field="wandb_exp_name", found=self.wandb_exp_name,
                            allowed="wandb_project: NAME beside it")


@dataclass(frozen=True, kw_only=True)
class TrainJob:
    """What to train: a model, the batch, precision and optimizer."""

    name: str
    model: ModelSpec
    global_batch_size: int
    precision: Precision = "bf16"
    optimizer: Optimizer = "adam"
    distributed_optimizer: bool = True
    #: ``distributed_optimizer: both`` in the job file: the search tries each plan with and
    #: without it (where its data-parallel ranks make it matter); ``distributed_optimizer``
    #: is then what plans without a choice of their own use
    distributed_optimizer_searched: bool = False
    attention: Attention = "sdpa"
    micro_batch_sizes: tuple[int, ...] = ()  # candidates; () = every divisor up to 16
    recompute_modes: tuple[RecomputeMode, ...] = RECOMPUTE_MODES
    #: whether the job named its recompute modes: the search then keeps every one of them
    #: (by default it leaves out selective recompute where fused attention makes it dominated)
    recompute_modes_given: bool = False
    # The training length: at most one of these (Megatron-LM's --train-iters / --train-samples;
    # tokens become samples of seq_length). None of them: a job with data cannot be launched,
    # one without is a synthetic-data run of SYNTHETIC_TRAIN_ITERS iterations.
    train_iters: int | None = None
    train_samples: int | None = None
    train_tokens: int | None = None
    log_interval: int = 10
    eval_interval: int = 1000
    eval_iters: int = 10  # only where the data's split has a validation part
    max_pipeline_stages: int | None = None
    #: the degrees the search may choose among (empty: its own candidates, see
    #: memx_hpc/search/space.py): virtual pipeline stages per pipeline rank, context-parallel
    #: sizes, and, for an MoE model, expert-parallel and expert tensor-parallel sizes
    virtual_stages: tuple[int, ...] = ()
    context_parallel_sizes: tuple[int, ...] = ()
    expert_parallel_sizes: tuple[int, ...] = ()
    expert_tensor_parallel_sizes: tuple[int, ...] = ()
    #: FP8 matmuls (FP8_FORMATS; "" none) with Transformer Engine's ``fp8_recipe``: on GPU types
    #: whose catalog entry has an fp8 rate only; ``precision`` stays the weights' dtype
    fp8: Fp8Format | Literal[""] = ""
    fp8_recipe: Fp8Recipe = "delayed"
    #: the FP8 format the search tries beside 16-bit matmuls ("" none; ``fp8: [none, FORMAT]``
    #: in a job file): each plan then states which it runs (``Plan.fp8``), and ``fp8`` stays ""
    #: for what prices or launches the job without a plan (:func:`memx_hpc.spec.job_for_plan`)
    fp8_search: Fp8Format | Literal[""] = ""
    #: Megatron-LM accumulates and reduces bf16 gradients in an fp32 buffer unless told
    #: ``--grad-reduce-in-bf16`` (megatron/training/arguments.py; megatron-core
    #: distributed_data_parallel.py: the grad buffer is fp32 when ``grad_reduce_in_fp32``,
    #: else the parameters' dtype). False: a bf16 gradient buffer, 2 bytes per parameter.
    grad_reduce_in_fp32: bool = True
    #: ``--fp8-param-gather``: the layers' GEMM weights live as FP8 tensors (megatron-core
    #: gives them a uint8 parameter buffer) and are all-gathered in FP8, instead of 16-bit
    #: weights beside Transformer Engine's FP8 copies. Needs ``fp8`` and the distributed optimizer.
    fp8_param_gather: bool = False
    # what a training launch (render, plan --submit) uses; verify's short runs keep mock data
    data: TrainData | None = None
    lr_schedule: LRSchedule = field(default_factory=LRSchedule)
    checkpoint: Checkpointing | None = None
    logging: TrainLogging = field(default_factory=TrainLogging)
    source_file: str | None = None

    def __post_init__(self) -> None:
        _safe_name(self.name, "name")
        for name, cls in (("data", TrainData), ("lr_schedule", LRSchedule), ("checkpoint", Checkpointing),
                          ("logging", TrainLogging)):
            v = getattr(self, name)
            if not isinstance(v, cls) and not (v is None and name not in ("lr_schedule", "logging")):
                raise SpecError(f"expected a {name} section", field=name, found=_short(v))
        if not isinstance(self.model, ModelSpec):
            raise SpecError("expected a model", field="model", found=_short(self.model))
        _whole(self.global_batch_size, "global_batch_size", 1, MAX_GLOBAL_BATCH)
        _choice(self.precision, "precision", PRECISIONS)
        _choice(self.optimizer, "optimizer", OPTIMIZERS)
        for name in ("distributed_optimizer", "distributed_optimizer_searched"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError("expected true or false" + (", or both" if name == "distributed_optimizer" else ""),
                                field=name, found=_short(getattr(self, name)))
        _choice(self.attention, "attention", ATTENTIONS)
        if not isinstance(self.micro_batch_sizes, tuple):
            raise SpecError("expected a list of whole numbers", field="micro_batch_sizes",
                            found=_short(self.micro_batch_sizes))
        if len(self.micro_batch_sizes) > MAX_MICRO_BATCH_CHOICES:
            raise SpecError(f"{len(self.micro_batch_sizes)} micro-batch sizes", field="micro_batch_sizes",
                            allowed=f"at most {MAX_MICRO_BATCH_CHOICES}")
        for i, b in enumerate(self.micro_batch_sizes):
            _whole(b, f"micro_batch_sizes[{i}]", 1, self.global_batch_size)
            if self.global_batch_size % b:
                raise SpecError(f"does not divide global_batch_size {self.global_batch_size}",
                                field=f"micro_batch_sizes[{i}]", found=b)
        if not isinstance(self.recompute_modes, tuple) or not self.recompute_modes:
            raise SpecError("expected a non-empty list of recompute modes", field="recompute_modes",
                            found=_short(self.recompute_modes), allowed=", ".join(RECOMPUTE_MODES))
        for i, mo in enumerate(self.recompute_modes):
            Recompute.check_mode(mo, f"recompute_modes[{i}]")
        if not isinstance(self.recompute_modes_given, bool):
            raise SpecError("expected true or false", field="recompute_modes_given",
                            found=_short(self.recompute_modes_given))
        for name, hi in (("train_iters", MAX_TRAIN_ITERS), ("train_samples", MAX_TRAIN_ITERS * MAX_GLOBAL_BATCH),
                         ("train_tokens", MAX_TRAIN_ITERS * MAX_GLOBAL_BATCH * MAX_SEQ_LENGTH)):
            _whole(getattr(self, name), name, 1, hi, optional=True)
        given = [n for n in ("train_iters", "train_samples", "train_tokens") if getattr(self, n) is not None]
        if len(given) > 1:
            raise SpecError("give the training length one way only", field=given[1], found=getattr(self, given[1]),
                            allowed="one of train_iters, train_samples, train_tokens")
        _whole(self.log_interval, "log_interval", 1, MAX_TRAIN_ITERS)
        _whole(self.eval_interval, "eval_interval", 1, MAX_TRAIN_ITERS)
        _whole(self.eval_iters, "eval_iters", 0, MAX_TRAIN_ITERS)
        _whole(self.max_pipeline_stages, "max_pipeline_stages", 1, MAX_LAYERS, optional=True)
        if self.fp8 != "":
            _choice(self.fp8, "fp8", FP8_FORMATS)
        _choice(self.fp8_recipe, "fp8_recipe", FP8_RECIPES)
        if self.fp8_search != "":
            _choice(self.fp8_search, "fp8", FP8_FORMATS)
            if self.fp8:
                raise SpecError("give FP8 one way: a format every plan runs, or a list the search chooses from",
                                field="fp8", found=[self.fp8, self.fp8_search],
                                allowed=f"{self.fp8}, or [none, {self.fp8_search}]")
        for name in ("grad_reduce_in_fp32", "fp8_param_gather"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError("expected true or false", field=name, found=_short(getattr(self, name)))
        if self.fp8_param_gather and not (self.fp8 or self.fp8_search):
            raise SpecError("FP8 parameters need FP8 matmuls", field="fp8_param_gather", found=True,
                            allowed="fp8_param_gather: false, or an fp8 format")
        if self.fp8_param_gather and not (self.distributed_optimizer or self.distributed_optimizer_searched):
            # megatron/training/arguments.py: --fp8-param-gather only with the distributed optimizer
            raise SpecError("FP8 parameter all-gather needs the distributed optimizer", field="fp8_param_gather",
                            found=True, allowed="distributed_optimizer: true")
        if (self.fp8 or self.fp8_search) and self.precision == "fp32":
            raise SpecError("FP8 runs beside bf16 (or fp16) weights: Transformer Engine casts the GEMM inputs of a "
                            "16-bit model", field="fp8", found=self.fp8 or ["none", self.fp8_search],
                            allowed="precision: bf16 or fp16")
        _degrees(self.virtual_stages, "virtual_stages", MAX_LAYERS)
        for name in ("context_parallel_sizes", "expert_parallel_sizes", "expert_tensor_parallel_sizes"):
            _degrees(getattr(self, name), name, 1 << 16)
        m = self.model
        most = max_virtual_stages(m.num_layers)
        for i, v in enumerate(self.virtual_stages):
            if v > most:
                raise SpecError(f"no plan of model {m.name} can take {v} virtual stages: interleaving needs at least "
                                f"2 pipeline stages of at least one layer per model chunk, and the model has "
                                f"{m.num_layers} layers", field=f"virtual_stages[{i}]", found=v,
                                allowed=f"1 to {most} (the largest value this model allows is {most})")
        for i, cp in enumerate(self.context_parallel_sizes):
            if cp > 1 and m.seq_length % (2 * cp):
                raise SpecError(f"context parallel splits each sequence into 2 x cp = {2 * cp} chunks (Megatron-LM "
                                f"asserts it): seq_length {m.seq_length} is not a multiple of it",
                                field=f"context_parallel_sizes[{i}]", found=cp)
        for name in ("expert_parallel_sizes", "expert_tensor_parallel_sizes"):
            sizes = getattr(self, name)
            if not m.is_moe and any(x > 1 for x in sizes):
                raise SpecError(f"expert parallel needs a mixture of experts; model {m.name} is dense (give "
                                f"num_experts, or leave {name} out)", field=name, found=list(sizes))
        for i, ep in enumerate(self.expert_parallel_sizes):
            if m.is_moe and m.num_experts % ep:
                raise SpecError(f"does not divide the model's {m.num_experts} experts (Megatron-LM asserts it)",
                                field=f"expert_parallel_sizes[{i}]", found=ep)

    @property
    def bytes_per_element(self) -> int:
        return BYTES_PER_ELEMENT[self.precision]
