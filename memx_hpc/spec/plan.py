"""Plans: :class:`Plan` (what Megatron-LM can run: uniform TP, CP, EP, DP and micro-batch
over ordered :class:`Stage` s, virtual stages included) and :class:`GeneralPlan` (per-stage
TP and mixed GPUs, as other planners produce: predicted, never rendered), with the checks a
plan needs of the model and the job."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ..errors import SpecError
from .checks import MAX_GLOBAL_BATCH, MAX_GPUS_PER_NODE, MAX_LAYERS, MAX_NODES, _choice, _optional_bool, _safe_name, _short, _whole
from .job import TrainJob
from .modes import FP8_FORMATS, FP8_RECIPES, Fp8Format, Fp8Recipe
from .model import ModelSpec
from .recompute import Recompute


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One pipeline stage: consecutive layers on GPUs of one partition. 0 layers: a first
    stage that holds only the embedding or a last one that holds only the output layer and
    loss (Megatron-LM's pipeline layout allows both; :class:`Plan` checks the position)."""

    partition: str
    num_layers: int
    recompute: Recompute = field(default_factory=Recompute)

    def __post_init__(self) -> None:
        _safe_name(self.partition, "partition")
        _whole(self.num_layers, "num_layers", 0, MAX_LAYERS)
        if not isinstance(self.recompute, Recompute):
            raise SpecError("expected a recompute setting", field="recompute", found=_short(self.recompute))


def _check_batches_and_stages(plan: Any) -> None:
    """What a Plan and a GeneralPlan share: the batch sizes and a bounded, non-empty pipeline."""
    _whole(plan.global_batch_size, "global_batch_size", 1, MAX_GLOBAL_BATCH)
    _whole(plan.micro_batch_size, "micro_batch_size", 1, plan.global_batch_size)
    if not plan.stages:
        raise SpecError("a plan needs at least one stage", field="stages", found=[])
    if len(plan.stages) > MAX_LAYERS:
        raise SpecError(f"{len(plan.stages)} stages", field="stages", allowed=f"at most {MAX_LAYERS}")


def chunk_split(num_layers: int, virtual_stages: int, *, last: bool = False) -> tuple[int, ...]:
    """Layers of each of a stage's ``virtual_stages`` model chunks: even, the remainder to the
    later chunks; the last stage with fewer layers than chunks leaves its last chunk empty (the
    loss alone, as Megatron's --account-for-loss-in-pipeline-split builds it)."""
    n, v = int(num_layers), int(virtual_stages)
    if last and n < v:
        return tuple(1 if k < n else 0 for k in range(v))
    base, rem = divmod(n, v)
    return tuple(base + (1 if k >= v - rem else 0) for k in range(v))


#: The plan's Megatron-LM performance options (fields of :class:`Plan`, flags of the same names
#: with dashes), in the order the command line writes them.
PERFORMANCE_OPTIONS = ("overlap_grad_reduce", "overlap_param_gather")


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A configuration Megatron-LM can run: uniform TP, DP and micro-batch; ordered stages.

    Derived quantities are properties, not stored (one product check, as torchtitan's
    ParallelDims).
    """

    tp: int
    dp: int
    micro_batch_size: int
    global_batch_size: int
    stages: tuple[Stage, ...]
    sequence_parallel: bool = False
    #: model chunks per pipeline rank (interleaved 1F1B; Megatron's virtual pipeline stages):
    #: stage ``i``'s layers are split into ``virtual_stages`` chunks as evenly as possible,
    #: chunk ``k`` of stage ``i`` being virtual stage ``k * pp + i`` (the pipeline layout's order)
    virtual_stages: int = 1
    #: context-parallel size: each sequence split over ``cp`` ranks (ring attention)
    cp: int = 1
    #: expert-parallel size and expert tensor-parallel size (None: TP's) of an MoE model's
    #: expert layers; ``etp * ep`` ranks of a stage's ``tp * cp * dp`` hold one copy of the experts
    ep: int = 1
    etp: int | None = None
    #: micro-batches each model chunk runs in a row under interleaving (Megatron-LM's
    #: ``--microbatch-group-size-per-virtual-pipeline-stage``; None: megatron-core's default,
    #: ``pp``): a larger group lengthens each stage's warm-up by ``(v - 1)`` micro-batches per
    #: extra micro-batch of the group, so the stage holds more chunks' activations at once
    microbatch_group_size_per_vp_stage: int | None = None
    #: Megatron-LM's ``--use-distributed-optimizer`` for this plan (None: the job's setting)
    distributed_optimizer: bool | None = None
    #: Megatron-LM's performance options, priced by the composition and written into the script:
    #: ``--overlap-grad-reduce`` (each gradient bucket's reduction starts in the last backward,
    #: behind the rest of it) and ``--overlap-param-gather`` (the distributed optimizer's parameter
    #: all-gather hides behind the next forward; Megatron-LM asserts it only with the distributed
    #: optimizer and --overlap-grad-reduce: :func:`check_plan_for_job`). Off: not run, not priced.
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    #: Megatron-LM's ``--ddp-bucket-size``: parameters per gradient bucket under
    #: --overlap-grad-reduce (megatron-core's first pipeline rank; each bucket one collective, so
    #: smaller buckets start reducing sooner and pay more calls' latency). None: megatron-core's
    #: default, ``max(40M, 1M x dp)`` (``megatron/training/training.py``, ``get_model``)
    ddp_bucket_size: int | None = None
    #: the FP8 format this plan's GEMMs run in (Megatron-LM's ``--fp8-format``; "" 16-bit) and
    #: Transformer Engine's recipe (``--fp8-recipe``); None: the job's (:func:`job_for_plan`)
    fp8: Fp8Format | Literal[""] | None = None
    fp8_recipe: Fp8Recipe | None = None

    def __post_init__(self) -> None:
        _whole(self.tp, "tp", 1, 1 << 16)
        if self.fp8 not in (None, ""):
            _choice(self.fp8, "fp8", FP8_FORMATS)
        if self.fp8_recipe is not None:
            _choice(self.fp8_recipe, "fp8_recipe", FP8_RECIPES)
        _optional_bool(self.distributed_optimizer, "distributed_optimizer")
        for name in PERFORMANCE_OPTIONS:
            if not isinstance(getattr(self, name), bool):
                raise SpecError("expected true or false", field=name, found=_short(getattr(self, name)))
        _whole(self.ddp_bucket_size, "ddp_bucket_size", 1, 1 << 40, optional=True)
        if self.ddp_bucket_size is not None and not self.overlap_grad_reduce:
            raise SpecError("Megatron-LM uses --ddp-bucket-size only with --overlap-grad-reduce (without it every "
                            "stage reduces its gradients in one bucket)", field="ddp_bucket_size",
                            found=self.ddp_bucket_size, allowed="absent, or overlap_grad_reduce true")
        if self.overlap_param_gather and not self.overlap_grad_reduce:
            raise SpecError("Megatron-LM runs --overlap-param-gather only with --overlap-grad-reduce ('Must use "
                            "--overlap-param-gather with --overlap-grad-reduce')", field="overlap_param_gather",
                            found=True, allowed="false, or overlap_grad_reduce true")
        _whole(self.dp, "dp", 1, MAX_NODES * MAX_GPUS_PER_NODE)
        _whole(self.cp, "cp", 1, 1 << 16)
        _whole(self.ep, "ep", 1, 1 << 16)
        _whole(self.etp, "etp", 1, 1 << 16, optional=True)
        _whole(self.virtual_stages, "virtual_stages", 1, MAX_LAYERS)
        _whole(self.microbatch_group_size_per_vp_stage, "microbatch_group_size_per_vp_stage", 1, 1 << 20,
               optional=True)
        if not isinstance(self.sequence_parallel, bool):
            raise SpecError("expected true or false", field="sequence_parallel", found=_short(self.sequence_parallel))
        _check_batches_and_stages(self)
        empty = [i for i, s in enumerate(self.stages) if s.num_layers == 0]
        if empty:
            inner = [i for i in empty if 0 < i < self.pp - 1]
            if inner or self.pp < 2 or len(empty) == self.pp:
                i = inner[0] if inner else empty[0]
                raise SpecError("a stage without layers is the first (the embedding alone) or the last (the output "
                                "layer and loss alone) of a pipeline with layers elsewhere",
                                field=f"stages[{i}].num_layers", found=0, allowed="at least 1 for this stage")
            for i in empty:
                if self.stages[i].recompute.mode != "none":
                    raise SpecError("a stage without layers has nothing to recompute", field=f"stages[{i}].recompute",
                                    found=self.stages[i].recompute.label(), allowed="none")
        if self.global_batch_size % (self.micro_batch_size * self.dp):
            raise SpecError("global_batch_size must be a multiple of micro_batch_size * dp", field="global_batch_size",
                            found=(self.global_batch_size, self.micro_batch_size, self.dp))
        width = self.tp * self.cp * self.dp
        if width % (self.expert_tp * self.ep):
            raise SpecError(f"expert TP x EP = {self.expert_tp} x {self.ep} must divide the {width} ranks of a stage "
                            f"(tp x cp x dp = {self.tp} x {self.cp} x {self.dp}): megatron-core lays the experts "
                            f"over the same ranks", field="ep", found=self.ep)
        v = self.virtual_stages
        if v > 1:
            if self.pp < 2:
                raise SpecError("virtual pipeline stages interleave a pipeline of at least 2 stages",
                                field="virtual_stages", found=v, allowed="1 with one stage")
            # the first stage's first chunk may hold only the embedding and the last stage's last
            # chunk only the loss (Megatron's --account-for-embedding/loss-in-pipeline-split)
            short = [i for i, s in enumerate(self.stages)
                     if s.num_layers < v - (1 if i in (0, self.pp - 1) else 0)]
            if short:
                raise SpecError(f"stage {short[0]} has {self.stages[short[0]].num_layers} layers, fewer than its "
                                f"{v} model chunks", field="virtual_stages", found=v,
                                allowed=f"at most {min(s.num_layers for s in self.stages)}")
            m, g = self.num_microbatches, self.vp_group
            if not self.pp <= g <= m:
                # megatron-core schedules.py (forward_backward_pipelining_with_interleaving):
                # "The number of contiguous micro-batches in a virtual pipeline stage should range in [PP, M]"
                field = "microbatch_group_size_per_vp_stage" if self.microbatch_group_size_per_vp_stage else \
                    "virtual_stages"
                raise SpecError(f"interleaved 1F1B runs micro-batches in groups of {g} per model chunk, which must "
                                f"lie between pp = {self.pp} and the {m} micro-batches per iteration", field=field,
                                found=self.microbatch_group_size_per_vp_stage or v,
                                allowed=f"a group size in [{self.pp}, {m}]" if m >= self.pp else
                                f"1, or at least {self.pp} micro-batches per iteration")
            if 0 < m % g < self.pp:
                # the last group shorter than pp leaves dependency bubbles: megatron-core refuses it
                field = "microbatch_group_size_per_vp_stage" if self.microbatch_group_size_per_vp_stage else \
                    "virtual_stages"
                ok = [x for x in range(self.pp, m + 1) if m % x == 0 or m % x >= self.pp]
                raise SpecError(f"interleaved 1F1B runs micro-batches in groups of {g} per model chunk: the "
                                f"{m} micro-batches per iteration leave a last group of {m % g}, fewer than "
                                f"pp = {self.pp}", field=field, found=self.microbatch_group_size_per_vp_stage or v,
                                allowed="microbatch_group_size_per_vp_stage in " + ", ".join(map(str, ok[:8]))
                                + (", ..." if len(ok) > 8 else "") if ok else "1")
        elif self.microbatch_group_size_per_vp_stage is not None:
            raise SpecError("a micro-batch group size per virtual stage needs interleaving (virtual_stages > 1)",
                            field="microbatch_group_size_per_vp_stage", found=self.microbatch_group_size_per_vp_stage,
                            allowed="none with virtual_stages 1")

    @property
    def vp_group(self) -> int:
        """Micro-batches each model chunk runs in a row under interleaving
        (``microbatch_group_size_per_vp_stage``, else megatron-core's default ``pp``)."""
        g = self.microbatch_group_size_per_vp_stage
        return self.pp if g is None else g

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def expert_tp(self) -> int:
        """The expert layers' tensor-parallel size (``etp``, else TP's, as megatron-core)."""
        return self.tp if self.etp is None else self.etp

    @property
    def gpus_per_stage(self) -> int:
        return self.tp * self.cp * self.dp

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def chunk_layers(self, stage: int) -> tuple[int, ...]:
        """Layers of each of stage ``stage``'s ``virtual_stages`` chunks (:func:`chunk_split`)."""
        return chunk_split(self.stages[stage].num_layers, self.virtual_stages, last=stage == self.pp - 1)

    @property
    def num_microbatches(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def num_layers(self) -> int:
        return sum(s.num_layers for s in self.stages)

    def component_groups(self) -> list[tuple[str, list[int]]]:
        """Runs of consecutive stages on one partition: ``[(partition, [stage indices])]``."""
        groups: list[tuple[str, list[int]]] = []
        for i, s in enumerate(self.stages):
            if groups and groups[-1][0] == s.partition:
                groups[-1][1].append(i)
            else:
                groups.append((s.partition, [i]))
        return groups


def job_for_plan(job: "TrainJob", plan: Plan) -> "TrainJob":
    """``job`` as ``plan`` runs it (what the composition prices and the renderer launches):
    the plan's own distributed-optimizer choice and FP8 format and recipe, where it states
    them. A plan in 16 bits drops the job's FP8 settings (``--fp8-param-gather`` included); the
    job returned never searches FP8 (``fp8_search`` ""): it is one plan's."""
    change: dict[str, Any] = {}
    if plan.distributed_optimizer is not None and plan.distributed_optimizer != job.distributed_optimizer:
        change["distributed_optimizer"] = plan.distributed_optimizer
    fp8 = job.fp8 if plan.fp8 is None else plan.fp8
    if fp8 != job.fp8 or job.fp8_search:
        change.update(fp8=fp8, fp8_search="")
        if not fp8:
            change["fp8_param_gather"] = False
    if plan.fp8_recipe is not None and plan.fp8_recipe != job.fp8_recipe:
        change["fp8_recipe"] = plan.fp8_recipe
    return replace(job, **change) if change else job


def check_plan_for_job(plan: Plan, job: "TrainJob") -> None:
    """What a plan's performance options need of the job: SpecError naming the field.
    Megatron-LM's validate_args asserts "--overlap-param-gather only supported with
    distributed optimizer" (the plan's own choice where it makes one, else the job's)."""
    if plan.overlap_param_gather and not job_for_plan(job, plan).distributed_optimizer:
        raise SpecError("--overlap-param-gather gathers the distributed optimizer's parameter shards; this plan runs "
                        "without the distributed optimizer (Megatron-LM refuses it)", field="overlap_param_gather",
                        found=True, allowed="false, or distributed_optimizer true")


def check_plan_for_model(plan: Plan, model: ModelSpec) -> None:
    """What a plan's context- and expert-parallel degrees need of the model (the Plan checks
    what needs no model): SpecError naming the field. Megatron-LM asserts a sequence of a
    multiple of ``2 * cp`` (ring attention's load-balanced halves), experts only in an MoE
    model, and ``num_experts`` a multiple of EP; each expert's FFN is split by expert TP."""
    if plan.cp > 1 and model.seq_length % (2 * plan.cp):
        raise SpecError(f"context parallel splits each sequence into 2 x cp = {2 * plan.cp} chunks: seq_length "
                        f"{model.seq_length} is not a multiple of it", field="cp", found=plan.cp)
    if plan.ep > 1 or plan.etp is not None:
        if not model.is_moe:
            raise SpecError(f"expert parallel needs a mixture of experts; model {model.name} is dense",
                            field="ep" if plan.ep > 1 else "etp", found=plan.ep if plan.ep > 1 else plan.etp,
                            allowed="ep 1 and no etp")
        if model.num_experts % plan.ep:
            raise SpecError(f"EP must divide the model's {model.num_experts} experts", field="ep", found=plan.ep)
        if model.expert_ffn_hidden_size % plan.expert_tp:
            raise SpecError(f"expert TP must divide the experts' FFN width {model.expert_ffn_hidden_size}",
                            field="etp", found=plan.expert_tp)


@dataclass(frozen=True, kw_only=True)
class Replica:
    """One data-parallel replica of a stage in a general plan: its GPU type and TP degree."""

    gpu_type: str
    tp: int
    partition: str | None = None

    def __post_init__(self) -> None:
        _safe_name(self.gpu_type, "gpu_type")
        _whole(self.tp, "tp", 1, 1 << 16)
        _safe_name(self.partition, "partition", optional=True)


@dataclass(frozen=True, kw_only=True)
class GeneralStage:
    """A stage of a general plan: replicas may differ in GPU type and TP (predict only)."""

    num_layers: int
    replicas: tuple[Replica, ...]
    recompute: Recompute = field(default_factory=Recompute)

    def __post_init__(self) -> None:
        _whole(self.num_layers, "num_layers", 1, MAX_LAYERS)
        if not self.replicas:
            raise SpecError("a stage needs at least one replica", field="replicas", found=[])


@dataclass(frozen=True, kw_only=True)
class GeneralPlan:
    """Plans other planners produce (Sailor, Metis): predicted and compared, never rendered."""

    micro_batch_size: int
    global_batch_size: int
    stages: tuple[GeneralStage, ...]

    def __post_init__(self) -> None:
        _check_batches_and_stages(self)

