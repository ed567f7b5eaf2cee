"""The one rule for a component's Megatron-LM command line, for every plan.

:func:`command_line` turns ``(Plan, TrainJob, what kind of run)`` into the arguments every
rank shares and each hetjob component's own, in Megatron-LM core_r0.16.0's names
(``megatron/training/arguments.py``). Single-vendor plans hand them to Megatron-LM's
``pretrain_gpt.py``, cross-vendor plans to the project's entry
(``python -m memx_hpc.train.pretrain_gpt``), which takes the same command line: the rule
does not depend on the entry.

Three kinds of run, and the script says which on its first lines:

* ``train``: the job's ``data:`` section, its training length (``train_iters``,
  ``train_samples`` or ``train_tokens``), learning-rate schedule, evaluation and logging
  intervals, and checkpoints in megatron-core's distributed format (``torch_dist``);
* ``synthetic``: the job names no data; Megatron-LM's mock data with the NullTokenizer,
  otherwise the same schedule (what a user gets who has not prepared data yet);
* ``measure``: the short runs ``memx-hpc verify`` times (mock data, a few iterations,
  logged every iteration, no warm-up, no evaluation, no checkpoints).

Megatron-LM's performance options are the plan's (:data:`~memx_hpc.spec.PERFORMANCE_OPTIONS`):
``--overlap-grad-reduce`` and ``--overlap-param-gather`` are written where the plan has them,
and refused where the launched entry would not run them (:func:`overlap_refusal`), so that
what the composition priced is what runs. :func:`performance_options` is the choice the
search makes for each plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..errors import SpecError
from ..megatron_args import parallel_args
from ..shellsafe import check_entry
from ..spec import (PROJECT_ENTRY_EXPERT_BIAS_WHY, PROJECT_ENTRY_TOKENIZERS, ModelSpec, Plan, Recompute, Site,
                    Stage, TrainJob, check_plan_for_job, chunk_split)

__all__ = ["SYNTHETIC_TRAIN_ITERS", "RUN_KINDS", "TrainingLength", "ComponentShape", "CommandLine",
           "training_length", "command_line", "pipeline_layout", "recompute_args", "virtual_recompute_refusal",
           "project_entry_plan_refusal", "project_entry_refusal", "PROJECT_ENTRY_UNBUILT", "Refusal",
           "cross_vendor_refusal",
           "PROJECT_ENTRY_DEGREES",
           "CHECKPOINT_FORMAT", "exit_duration_min", "PROJECT_ENTRY_MODULE", "TP_COMM_OVERLAP_OFF", "overlap_refusal",
           "performance_options", "performance_args"]

#: The length of a synthetic-data run whose job names none (what the job file used to default to).
SYNTHETIC_TRAIN_ITERS = 20
RUN_KINDS = ("train", "synthetic", "measure")
#: megatron-core's distributed checkpoint format: any TP/PP/DP loads it (Megatron-LM's default).
CHECKPOINT_FORMAT = "torch_dist"
#: The project's megatron-core entry (``python -m``): cross-vendor plans launch it, and a
#: partition may name it as its ``megatron_entry`` (this machine's CPU partitions do).
PROJECT_ENTRY_MODULE = "memx_hpc.train.pretrain_gpt"
#: Why Megatron-LM's ``--tp-comm-overlap`` is never part of a plan (a note where plans overlap).
TP_COMM_OVERLAP_OFF = (
    "TP communication overlap (--tp-comm-overlap) stays off: Megatron-LM's validate_args asks only for sequence "
    "parallel, but the run then needs Transformer Engine's userbuffers (initialize_ub with an MPI or NCCL "
    "bootstrap, a build with userbuffers support, TP inside one NVLink domain), which a site file cannot attest, and "
    "the composition prices TP collectives as not hidden behind their GEMMs: a plan with it would not be the plan "
    "priced")


@dataclass(frozen=True, kw_only=True)
class TrainingLength:
    """How long a run trains: iterations or samples (Megatron-LM takes one of the two), and
    where the number comes from (for the script's banner)."""

    iters: int | None
    samples: int | None
    source: str

    def __post_init__(self) -> None:
        if (self.iters is None) == (self.samples is None):
            raise SpecError("a training length is iterations or samples, not both or neither (internal error)")

    def label(self) -> str:
        return f"{self.iters} iterations" if self.iters is not None else f"{self.samples} samples"


@dataclass(frozen=True, kw_only=True)
class ComponentShape:
    """What differs between hetjob components: the transformer layer implementation and the
    recompute setting of its stages (the most layers one of its stages holds)."""

    transformer_impl: str
    recompute: Recompute
    max_stage_layers: int
    #: the component's devices' vendor and its training entry's argv words (empty: not known;
    #: what decides whether the performance options can run, :func:`overlap_refusal`)
    vendor: str = ""
    entry: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class CommandLine:
    """Every rank's arguments (``common``), each component's own (``per_component``) and what
    kind of run they make (``kind``, ``banner``: one line for the script's head and log)."""

    kind: str
    banner: str
    length: TrainingLength
    common: tuple[tuple[str, ...], ...]
    per_component: tuple[tuple[tuple[str, ...], ...], ...]


def pipeline_layout(stages: Sequence[Stage], virtual_stages: int = 1) -> str:
    """Megatron's ``--pipeline-model-parallel-layout`` for these stages: ``E`` before the first
    stage's layers, ``L`` after the last stage's, ``|`` between stages (core_r0.16.0,
    megatron/core/transformer/pipeline_parallel_layer_layout.py).

    With ``virtual_stages = v > 1`` the layout lists ``pp * v`` model chunks in layer order,
    chunk ``k`` of pipeline rank ``i`` at position ``k * pp + i`` (what Megatron reads back
    as v virtual stages per rank; it takes no ``--num-virtual-stages-per-pipeline-rank``
    beside a layout). Each stage's layers are split as :meth:`~memx_hpc.spec.Plan.chunk_layers`
    splits them, so uneven stages interleave too."""
    pp, v = len(stages), virtual_stages
    chunks = []
    split = [chunk_split(s.num_layers, v, last=i == pp - 1) for i, s in enumerate(stages)]
    for k in range(v):
        for i in range(pp):
            chunks.append(split[i][k])
    parts = []
    for j, n in enumerate(chunks):
        body = "" if n == 0 else ("t" if n == 1 else f"t*{n}")
        if j == 0:
            body = "E" + body
        if j == len(chunks) - 1:
            body = body + "L"
        parts.append(body)
    assert len(parts) == pp * v
    return "|".join(parts)


def recompute_args(recompute: Recompute, num_layers: int, virtual_stages: int = 1) -> tuple[tuple[str, ...], ...]:
    """Megatron-LM's recompute flags for one stage of ``num_layers`` layers.

    ``selective`` recomputes core attention (Megatron-LM's default module); ``full`` every
    layer (``uniform`` method, one layer per checkpointed chunk); ``full:K`` the first K
    layers of the stage (``block`` method: "the number of individual Transformer layers to
    recompute within each pipeline stage"). With ``virtual_stages = v`` each model chunk is
    its own transformer block and the block method recomputes the first ``K / v`` layers of
    every chunk (K a multiple of v, see :func:`virtual_recompute_refusal`).
    """
    if recompute.mode == "none":
        return ()
    if recompute.mode == "selective":
        return (("--recompute-granularity", "selective"),)
    k = recompute.num_layers
    if k is not None and k == 0:
        return ()
    if k is None:
        return (("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                ("--recompute-num-layers", "1"))
    return (("--recompute-granularity", "full"), ("--recompute-method", "block"),
            ("--recompute-num-layers", str(min(k, num_layers) // virtual_stages)))


def virtual_recompute_refusal(plan: Plan) -> tuple[int, str] | None:
    """``(stage, reason)`` when a stage's ``full:K`` recompute cannot run with the plan's virtual
    stages: Megatron recomputes the first k layers of each of a rank's v chunks, so the K layers
    must be ``v * k`` with k no more than the smallest chunk's layers."""
    v = plan.virtual_stages
    if v == 1:
        return None
    for i, s in enumerate(plan.stages):
        k = s.recompute.num_layers
        if s.recompute.mode != "full" or k is None or k == 0 or k >= s.num_layers:
            continue
        if k % v or k // v > min(plan.chunk_layers(i)):
            return i, (f"stage {i} recomputes {k} of its {s.num_layers} layers, which its {v} model chunks "
                       f"cannot share evenly (Megatron recomputes the first k layers of every chunk)")
    return None


@dataclass(frozen=True, kw_only=True)
class Refusal:
    """Why a plan cannot launch: the job file's field and the reason."""

    field: str
    reason: str


#: The model fields the project's entry does not build (router options it does not pass to
#: megatron-core): field -> what it asks for. Each refuses a cross-vendor plan by its name.
PROJECT_ENTRY_UNBUILT = {
    "moe_router_num_groups": "group-limited routing",
    "moe_router_group_topk": "group-limited routing",
    "moe_router_enable_expert_bias": "the router's expert bias (aux-loss-free balancing)",
    "moe_shared_expert_gate": "a gate on the shared experts",
}


def project_entry_refusal(job: TrainJob) -> Refusal | None:
    """Why the project's entry (cross-vendor plans) cannot train ``job``, or None. The search
    space and render ask the same question (:mod:`memx_hpc.planner` excludes such plans).
    It builds standard and multi-latent attention (YaRN RoPE with MLA, as Megatron-LM), all
    dense or all MoE layers; a router option it does not build is refused by its field."""
    m = job.model
    entry = "the project's megatron-core entry, which cross-vendor plans run,"
    if m.is_moe and len(set(m.moe_layers)) > 1:
        return Refusal(field="model.moe_layer_freq",
                       reason=f"the model has dense and MoE layers (moe_layer_freq): {entry} builds GPT layers "
                              f"all dense or all MoE")
    if m.rope_scaling == "yarn" and not m.multi_latent_attention:
        return Refusal(field="model.rope_scaling",
                       reason=f"YaRN RoPE scaling without multi-latent attention: {entry} builds YaRN in MLA's "
                              f"rotary embedding only (as Megatron-LM: other attention takes --rope-type rope)")
    if m.is_moe and m.add_bias_linear:
        return Refusal(field="model.add_bias_linear",
                       reason=f"experts with linear biases: {PROJECT_ENTRY_EXPERT_BIAS_WHY}")
    for name, what in PROJECT_ENTRY_UNBUILT.items():
        if getattr(m, name) not in (None, False):
            return Refusal(field=f"model.{name}",
                           reason=f"{what} ({name}: {getattr(m, name)}): {entry} does not build it")
    d = job.data
    if d is not None and d.tokenizer_type not in PROJECT_ENTRY_TOKENIZERS:
        return Refusal(field="data.tokenizer.type",
                       reason=f"tokenizer {d.tokenizer_type}: {entry} builds {', '.join(PROJECT_ENTRY_TOKENIZERS)} "
                              f"from local files")
    return None


#: The parallel degrees above 1 the project's entry (cross-vendor plans) builds: Plan field ->
#: whether it does. Virtual stages: one GPTModel per model chunk and megatron-core's interleaved
#: schedule over the cross-vendor pipeline group (memx_hpc/train/pretrain_gpt.py). Context
#: parallel: its groups (cp, dp_cp) stay inside each stage's partition, built by the group rule,
#: with Transformer Engine's attention (the space already asks for it on every CP partition).
#: Expert parallel it runs (megatron-core's MoE layer, all-to-all dispatcher, its expert groups
#: built by the group rule).
PROJECT_ENTRY_DEGREES = {"virtual_stages": True, "cp": True}
_DEGREE_WHY = {"virtual_stages": ("virtual pipeline stages", "builds one model chunk per rank"),
               "cp": ("context parallel", "builds no context-parallel groups")}


def cross_vendor_refusal(name: str, value: int) -> Refusal | None:
    """Why a cross-vendor plan (the project's entry) cannot take ``value`` of the parallel degree
    ``name`` (a :data:`PROJECT_ENTRY_DEGREES` key), or None. The search and render ask this."""
    if value <= 1 or PROJECT_ENTRY_DEGREES.get(name, True):
        return None
    label, why = _DEGREE_WHY[name]
    return Refusal(field=name, reason=f"{label} ({name} {value}): the project's megatron-core entry, which "
                                      f"cross-vendor plans run, {why}")


def project_entry_plan_refusal(plan: Plan) -> Refusal | None:
    """Why the project's entry (cross-vendor plans) cannot run ``plan``'s parallel degrees, or
    None (:func:`cross_vendor_refusal` of each degree; the search asks the same)."""
    for name in PROJECT_ENTRY_DEGREES:
        refusal = cross_vendor_refusal(name, getattr(plan, name))
        if refusal is not None:
            return refusal
    return None


def _is_project_entry(entry: Sequence[str]) -> bool:
    words = tuple(entry)
    if len(words) == 2 and words[0] == "-m":
        return words[1] == PROJECT_ENTRY_MODULE
    return bool(words) and words[0].replace("\\", "/").endswith("/".join(PROJECT_ENTRY_MODULE.split(".")) + ".py")


def overlap_refusal(launches: Sequence[tuple[str, str, Sequence[str]]], *, cross_vendor: bool) -> Refusal | None:
    """Why ``--overlap-grad-reduce`` (and with it ``--overlap-param-gather``) would not run, or
    None. ``launches``: per component (or partition) ``(name, vendor, entry argv words)``.

    Megatron-LM's ``pretrain_gpt.py`` on GPUs runs them (megatron-core's DDP and distributed
    optimizer on CUDA/HIP streams). The project's megatron-core entry builds its DDP with
    ``overlap_grad_reduce=False`` and takes both flags only to ignore them
    (:mod:`memx_hpc.train.args`: "no CUDA streams to overlap on"): cross-vendor plans launch it,
    and so does a partition that names it as its ``megatron_entry``. CPU devices have no
    streams to overlap on."""
    if cross_vendor:
        return Refusal(field="overlap_grad_reduce",
                       reason="cross-vendor plans launch the project's megatron-core entry, which builds its data-"
                              "parallel wrapper without gradient-reduce overlap")
    cpu = sorted({name for name, vendor, _ in launches if vendor == "cpu"})
    if cpu:
        return Refusal(field="overlap_grad_reduce",
                       reason=f"partition(s) {', '.join(cpu)} train on CPU devices: no CUDA streams to overlap on "
                              f"(the project's entry ignores --overlap-grad-reduce and --overlap-param-gather)")
    own = sorted({name for name, _, entry in launches if entry and _is_project_entry(entry)})
    if own:
        return Refusal(field="overlap_grad_reduce",
                       reason=f"partition(s) {', '.join(own)} launch the project's megatron-core entry "
                              f"(megatron_entry: -m {PROJECT_ENTRY_MODULE}), which builds its data-parallel wrapper "
                              f"without gradient-reduce overlap")
    return None


def site_launches(site: Site, partitions: Sequence[str], *, cross_vendor: bool
                  ) -> list[tuple[str, str, tuple[str, ...]]]:
    """:func:`overlap_refusal`'s ``launches`` for a plan on ``partitions`` of ``site`` (before
    it is rendered): each partition's device vendor and the entry its ranks would launch."""
    out = []
    for name in dict.fromkeys(partitions):
        p = site.partition(name)
        entry = ("-m", PROJECT_ENTRY_MODULE) if cross_vendor else check_entry(p.megatron_entry, "megatron_entry")
        out.append((name, site.gpu(p.gpu_type).vendor, entry))
    return out


def performance_options(site: Site, partitions: Sequence[str], job: TrainJob, *, cross_vendor: bool,
                        distributed_optimizer: bool | None = None, wanted: bool = True) -> dict[str, bool]:
    """The performance options a plan on ``partitions`` gets (``Plan`` fields): on wherever the
    launched entry runs them (:func:`overlap_refusal`) and ``wanted`` (``--no-overlap`` turns
    them off), as every NeMo / Megatron-Bridge recipe turns them on with the distributed
    optimizer; the parameter gather only with the distributed optimizer (the plan's choice
    where it makes one, else the job's). Megatron-LM's own rules: validate_args asserts
    ``--overlap-param-gather`` only with ``--overlap-grad-reduce`` and the distributed optimizer;
    ``--align-param-gather`` is its default and forced off without virtual stages (nothing to
    set); the options that would refuse them (Muon, Torch FSDP2, delayed wgrad) are never
    rendered."""
    grad = wanted and overlap_refusal(site_launches(site, partitions, cross_vendor=cross_vendor),
                                      cross_vendor=cross_vendor) is None
    dist = job.distributed_optimizer if distributed_optimizer is None else distributed_optimizer
    return {"overlap_grad_reduce": grad, "overlap_param_gather": grad and bool(dist)}


def performance_args(plan: Plan, job: TrainJob, components: Sequence[ComponentShape], *,
                     cross_vendor: bool) -> list[tuple[str, ...]]:
    """The plan's performance options as Megatron-LM flags; SpecError naming the plan's field
    where the launched entry would not run them (a plan file edited by hand) or Megatron-LM
    would refuse them (``job``: the job as the plan runs it, its distributed optimizer)."""
    if not plan.overlap_grad_reduce and not plan.overlap_param_gather:
        return []
    why = overlap_refusal([(f"component {k}" if not c.vendor else f"component {k} ({c.vendor})", c.vendor, c.entry)
                           for k, c in enumerate(components)], cross_vendor=cross_vendor)
    if why is not None:
        raise SpecError(f"the plan overlaps what this launch would not: {why.reason}; the plan would be priced "
                        f"for a run that does not happen", field=why.field, found=True,
                        allowed="false for this plan (plan again, or set it false in the plan file)")
    check_plan_for_job(plan, job)
    a: list[tuple[str, ...]] = []
    if plan.overlap_grad_reduce:
        a.append(("--overlap-grad-reduce",))
        if plan.ddp_bucket_size is not None:
            a.append(("--ddp-bucket-size", str(plan.ddp_bucket_size)))
    if plan.overlap_param_gather:
        a.append(("--overlap-param-gather",))
    return a


def training_length(job: TrainJob, *, iters: int | None = None, kind: str = "train") -> TrainingLength:
    """The run's length: ``iters`` when given (``--iters``, verify), else the job's
    ``train_iters`` / ``train_samples`` / ``train_tokens`` (tokens: whole samples of the
    model's sequence length, rounded up). A training run on data must name one; a synthetic
    run that names none trains SYNTHETIC_TRAIN_ITERS iterations and says so."""
    if iters is not None:
        if iters < 1:
            raise SpecError("must be >= 1", field="iters", found=iters)
        return TrainingLength(iters=iters, samples=None, source="--iters")
    if job.train_iters is not None:
        return TrainingLength(iters=job.train_iters, samples=None, source="train_iters")
    if job.train_samples is not None:
        return TrainingLength(iters=None, samples=job.train_samples, source="train_samples")
    if job.train_tokens is not None:
        return TrainingLength(iters=None, samples=math.ceil(job.train_tokens / job.model.seq_length),
                              source=f"train_tokens {job.train_tokens} / seq_length {job.model.seq_length}")
    if kind == "train":
        raise SpecError("a training run on the job's data needs its length", field="train_iters",
                        file=job.source_file, allowed="train_iters, train_samples or train_tokens in the job file "
                                                      "(or render --iters N)")
    return TrainingLength(iters=SYNTHETIC_TRAIN_ITERS, samples=None,
                          source="the job names no length")


def _model_args(job: TrainJob) -> list[tuple[str, ...]]:
    m = job.model
    a: list[tuple[str, ...]] = [
        ("--num-layers", str(m.num_layers)), ("--hidden-size", str(m.hidden_size)),
        ("--ffn-hidden-size", str(m.ffn_hidden_size)), ("--num-attention-heads", str(m.num_attention_heads)),
    ]
    if m.num_query_groups != m.num_attention_heads:
        a += [("--group-query-attention",), ("--num-query-groups", str(m.num_query_groups))]
    a += [("--seq-length", str(m.seq_length)), ("--max-position-embeddings", str(m.seq_length))]
    if m.activation == "swiglu":
        a.append(("--swiglu",))
    if not m.tied_embeddings:
        a.append(("--untie-embeddings-and-output-weights",))
    if m.position_embedding == "rope":
        a += [("--position-embedding-type", "rope"), ("--rotary-base", str(m.rotary_base))]
    if m.normalization == "rmsnorm":
        a.append(("--normalization", "RMSNorm"))
    if not m.add_bias_linear:
        a.append(("--disable-bias-linear",))
    if job.attention == "core":
        # the unfused kernel that keeps the s x s attention matrices ("sdpa" = Megatron's default)
        a.append(("--attention-backend", "unfused"))
    return a + _extension_args(m)


def _extension_args(m) -> list[tuple[str, ...]]:  # noqa: ANN001 - ModelSpec
    """Every further ModelSpec field Megatron-LM needs to build the model named (its names,
    core_r0.16.0): head width, QKV bias, QK layer norm, RoPE scaling, multi-latent attention
    and mixture-of-experts settings. Defaults are left out (Megatron-LM's own)."""
    a: list[tuple[str, ...]] = []
    if m.head_dim is not None and m.head_dim != m.hidden_size // m.num_attention_heads:
        a.append(("--kv-channels", str(m.head_dim)))
    if m.add_qkv_bias:
        a.append(("--add-qkv-bias",))
    if m.qk_layernorm:
        a.append(("--qk-layernorm",))
    if m.hidden_dropout != 0.1:  # Megatron-LM's default
        a.append(("--hidden-dropout", repr(float(m.hidden_dropout))))
    if m.rope_scaling == "llama3":
        a += [("--use-rope-scaling",), ("--rope-scaling-factor", repr(float(m.rope_scaling_factor)))]
    elif m.rope_scaling == "yarn":
        a += [("--rope-type", "yarn"), ("--rotary-scaling-factor", repr(float(m.rope_scaling_factor)))]
    if m.multi_latent_attention:
        a.append(("--multi-latent-attention",))
        if m.q_lora_rank is not None:
            a.append(("--q-lora-rank", str(m.q_lora_rank)))
        a += [("--kv-lora-rank", str(m.kv_lora_rank)), ("--qk-head-dim", str(m.qk_head_dim)),
              ("--qk-pos-emb-head-dim", str(m.qk_pos_emb_head_dim)), ("--v-head-dim", str(m.v_head_dim))]
    if m.num_experts is not None:
        a += [("--num-experts", str(m.num_experts)), ("--moe-router-topk", str(m.moe_router_topk)),
              ("--moe-router-load-balancing-type", m.moe_router_load_balancing_type),
              ("--moe-router-score-function", m.moe_router_score_function)]
        if m.moe_ffn_hidden_size is not None:
            a.append(("--moe-ffn-hidden-size", str(m.moe_ffn_hidden_size)))
        if m.moe_shared_expert_intermediate_size is not None:
            a.append(("--moe-shared-expert-intermediate-size", str(m.moe_shared_expert_intermediate_size)))
        freq = m.moe_layer_freq
        a.append(("--moe-layer-freq", str(freq) if isinstance(freq, int) else "[" + ",".join(map(str, freq)) + "]"))
        if m.moe_router_num_groups is not None:
            a.append(("--moe-router-num-groups", str(m.moe_router_num_groups)))
        if m.moe_router_group_topk is not None:
            a.append(("--moe-router-group-topk", str(m.moe_router_group_topk)))
        if m.moe_router_enable_expert_bias:
            a.append(("--moe-router-enable-expert-bias",))
        if m.moe_shared_expert_gate:
            a.append(("--moe-shared-expert-gate",))
    return a


def _parallel_args(plan: Plan, model: ModelSpec, *, cross_vendor: bool,
                   pipeline_backend: str) -> list[tuple[str, ...]]:
    a: list[tuple[str, ...]] = [("--tensor-model-parallel-size", str(plan.tp)),
                                ("--pipeline-model-parallel-size", str(plan.pp))]
    if plan.pp > 1:
        # the layout carries the virtual stages (Megatron refuses both flags together)
        a.append(("--pipeline-model-parallel-layout", pipeline_layout(plan.stages, plan.virtual_stages)))
    if plan.microbatch_group_size_per_vp_stage is not None:
        # megatron-core's ModelParallelConfig field (default pp), which its interleaved schedule reads
        a.append(("--microbatch-group-size-per-virtual-pipeline-stage", str(plan.microbatch_group_size_per_vp_stage)))
    a += parallel_args(model, tp=plan.tp, sequence_parallel=plan.sequence_parallel, cp=plan.cp, ep=plan.ep,
                       etp=plan.etp)
    if cross_vendor and plan.pp > 1:
        a.append(("--pipeline-model-parallel-comm-backend", pipeline_backend))
    a += [("--micro-batch-size", str(plan.micro_batch_size)), ("--global-batch-size", str(plan.global_batch_size))]
    return a


def _precision_args(job: TrainJob) -> list[tuple[str, ...]]:
    a: list[tuple[str, ...]] = []
    if job.precision == "bf16":
        a.append(("--bf16",))
    elif job.precision == "fp16":
        a.append(("--fp16",))
    if job.fp8:
        # FP8 GEMMs through Transformer Engine (the renderer refuses FP8 where the layer is not
        # Transformer Engine's); the 16-bit flag above stays the weights' dtype
        a += [("--fp8-format", job.fp8), ("--fp8-recipe", job.fp8_recipe)]
        if job.fp8_param_gather and job.distributed_optimizer:
            # Megatron-LM refuses --fp8-param-gather without the distributed optimizer
            a.append(("--fp8-param-gather",))
    if job.precision == "bf16" and not job.grad_reduce_in_fp32:
        a.append(("--grad-reduce-in-bf16",))
    if job.distributed_optimizer:
        a.append(("--use-distributed-optimizer",))
    if job.optimizer != "adam":
        a.append(("--optimizer", job.optimizer))
    return a


def _schedule_args(job: TrainJob, length: TrainingLength, *, global_batch_size: int,
                   kind: str) -> list[tuple[str, ...]]:
    """Length and learning-rate schedule. Megatron-LM takes iteration- or sample-based
    options, never both (validate_args asserts it): a sample-based run gets its warm-up and
    decay in samples, the job's iterations times the global batch."""
    lr = job.lr_schedule
    a: list[tuple[str, ...]] = [("--lr", repr(lr.lr)), ("--min-lr", repr(lr.min_lr)),
                                ("--lr-decay-style", lr.decay_style)]
    if kind == "measure":
        # a timed run of a few iterations: the schedule's shape is not what is measured, and a
        # warm-up longer than the run would be refused by megatron-core's scheduler
        return [("--train-iters", str(length.iters))] + a
    if length.iters is not None:
        total = length.iters
        a = [("--train-iters", str(total))] + a + [("--lr-warmup-iters", str(lr.warmup_iters))]
        if lr.decay_iters is not None:
            a.append(("--lr-decay-iters", str(lr.decay_iters)))
        decay = lr.decay_iters or total
        unit = "iterations"
    else:
        assert length.samples is not None
        total = length.samples
        a = [("--train-samples", str(total))] + a + [("--lr-warmup-samples", str(lr.warmup_iters * global_batch_size))]
        if lr.decay_iters is not None:
            a.append(("--lr-decay-samples", str(lr.decay_iters * global_batch_size)))
        decay = (lr.decay_iters or math.ceil(total / global_batch_size)) * global_batch_size
        total_w = lr.warmup_iters * global_batch_size
        if total_w and total_w >= decay:
            raise SpecError(f"the warm-up ({total_w} samples) must end before the decay does ({decay} samples): "
                            "megatron-core's scheduler refuses it", field="lr_schedule.warmup_iters",
                            file=job.source_file, found=lr.warmup_iters)
        return a
    if lr.warmup_iters and lr.warmup_iters >= decay:
        raise SpecError(f"the warm-up must end before the decay does ({decay} {unit}, from "
                        f"{'lr_schedule.decay_iters' if lr.decay_iters else length.source}): megatron-core's "
                        f"scheduler refuses it", field="lr_schedule.warmup_iters", file=job.source_file,
                        found=lr.warmup_iters)
    return a


def _data_args(job: TrainJob) -> list[tuple[str, ...]]:
    d = job.data
    assert d is not None
    a: list[tuple[str, ...]] = [("--data-path", *d.paths), ("--split", d.split), ("--tokenizer-type", d.tokenizer_type)]
    for flag, value in (("--tokenizer-model", d.tokenizer_model), ("--vocab-file", d.vocab_file),
                        ("--merge-file", d.merge_file)):
        if value is not None:
            a.append((flag, value))
    if d.tokenizer_type == "NullTokenizer":
        a.append(("--vocab-size", str(job.model.vocab_size)))
    return a


def _eval_args(job: TrainJob, kind: str) -> list[tuple[str, ...]]:
    has_valid = kind == "train" and job.data is not None and len(job.data.split.split(",")) > 1 \
        and int(job.data.split.split(",")[1]) > 0
    iters = job.eval_iters if has_valid else 0
    a: list[tuple[str, ...]] = [("--log-interval", "1" if kind == "measure" else str(job.log_interval)),
                                ("--eval-iters", str(iters))]
    if iters:
        a.append(("--eval-interval", str(job.eval_interval)))
    return a


def _checkpoint_args(job: TrainJob, kind: str, *, exit_duration_min: int | None) -> list[tuple[str, ...]]:
    ck = job.checkpoint
    if kind == "measure" or ck is None:
        return []
    a: list[tuple[str, ...]] = []
    if ck.save_dir is not None:
        a.append(("--save", ck.save_dir))
    if ck.load_dir is not None:
        a.append(("--load", ck.load_dir))
    if ck.save_interval is not None:
        a.append(("--save-interval", str(ck.save_interval)))
    if ck.save_dir is not None or ck.load_dir is not None:
        a.append(("--ckpt-format", CHECKPOINT_FORMAT))
    if ck.save_dir is not None:
        # SIGTERM saves after the current iteration and exits cleanly: what the rendered script's
        # warning trap sends every rank before Slurm's time limit (the script then submits its
        # continuation, which loads the checkpoint), and what scancel and preemption send
        a.append(("--exit-signal-handler",))
    if ck.save_dir is not None and exit_duration_min is not None:
        # save and stop cleanly before Slurm's time limit kills the job; the same script,
        # submitted again, loads the checkpoint and goes on (--load names the save folder)
        a.append(("--exit-duration-in-mins", str(exit_duration_min)))
    return a


def _logging_args(job: TrainJob, kind: str, *, run_dir: str | None) -> list[tuple[str, ...]]:
    """Where the run's metrics go besides its text log (Megatron-LM core_r0.16.0's
    LoggerConfig names): TensorBoard events in ``run_dir/tensorboard`` every log interval, with
    throughput (TFLOP/s per GPU: written to TensorBoard only beside ``--log-timers-to-tensorboard``,
    training.py's training_log), memory and the iteration time; Weights & Biases when the job
    names a project, its local files in ``run_dir/wandb``. A measurement run logs nothing more."""
    lg = job.logging
    if kind == "measure" or run_dir is None:
        return []
    a: list[tuple[str, ...]] = []
    if lg.tensorboard:
        a += [("--tensorboard-dir", f"{run_dir}/tensorboard"), ("--tensorboard-log-interval", str(job.log_interval)),
              ("--log-throughput",), ("--log-memory-to-tensorboard",), ("--log-timers-to-tensorboard",)]
    if lg.wandb_project is not None:
        a += [("--wandb-project", lg.wandb_project), ("--wandb-exp-name", lg.wandb_exp_name or job.name),
              ("--wandb-save-dir", f"{run_dir}/wandb")]
    return a


def exit_duration_min(time_limit_min: int | None) -> int | None:
    """When a run that saves stops by itself (``--exit-duration-in-mins``): 10 % of the Slurm
    time limit, at least 2 and at most 30 minutes, before it (None: a limit of 4 minutes or less)."""
    if time_limit_min is None or time_limit_min <= 4:
        return None
    return time_limit_min - min(30, max(2, time_limit_min // 10))


def command_line(plan: Plan, job: TrainJob, *, components: Sequence[ComponentShape], cross_vendor: bool,
                 pipeline_backend: str, kind: str, iters: int | None = None,
                 time_limit_min: int | None = None, run_dir: str | None = None) -> CommandLine:
    """The Megatron-LM command line of every component of ``plan`` for a run of ``kind``.

    ``time_limit_min`` is the job's Slurm time limit: a training run that saves checkpoints
    stops (and saves) 10 % of it, at least 2 and at most 30 minutes, before the limit
    (:func:`exit_duration_min`). ``run_dir`` is the run's folder, where its TensorBoard and
    Weights & Biases files go (:func:`_logging_args`).
    """
    if kind not in RUN_KINDS:
        raise SpecError("unknown kind of run (internal error)", found=kind, allowed=", ".join(RUN_KINDS))
    if kind == "train" and job.data is None:
        raise SpecError("a training run needs the job's data: section", field="data", file=job.source_file)
    length = training_length(job, iters=iters, kind=kind)
    common = _model_args(job) + _parallel_args(plan, job.model, cross_vendor=cross_vendor,
                                               pipeline_backend=pipeline_backend)
    common += _precision_args(job)
    common += performance_args(plan, job, components, cross_vendor=cross_vendor)
    common += _schedule_args(job, length, global_batch_size=plan.global_batch_size, kind=kind)
    common += _eval_args(job, kind)
    common += _checkpoint_args(job, kind, exit_duration_min=exit_duration_min(time_limit_min))
    common += _logging_args(job, kind, run_dir=run_dir)
    if kind == "train":
        common += _data_args(job)
    else:
        common += [("--mock-data",), ("--tokenizer-type", "NullTokenizer"), ("--vocab-size", str(job.model.vocab_size))]
    per = tuple((("--transformer-impl", c.transformer_impl),)
                + recompute_args(c.recompute, c.max_stage_layers, plan.virtual_stages) for c in components)
    if kind == "train":
        banner = (f"TRAINING RUN: {length.label()} ({length.source}) on {' '.join(job.data.paths)} "
                  f"with {job.data.tokenizer_type}")
    elif kind == "synthetic":
        banner = (f"SYNTHETIC-DATA RUN: the job has no data: section, so this trains on Megatron-LM's mock data "
                  f"(random tokens, NullTokenizer) for {length.label()} ({length.source}); prepare data with "
                  f"'memx-hpc data prepare' and name it in the job file to train for real")
    else:
        banner = (f"MEASUREMENT RUN (memx-hpc verify): {length.label()} of mock data, timed; not a training run")
    return CommandLine(kind=kind, banner=banner, length=length, common=tuple(common), per_component=per)
