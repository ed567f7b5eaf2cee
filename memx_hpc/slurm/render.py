"""From a plan to the heterogeneous sbatch script that launches Megatron-LM: describing only.

Describe, then act (torchx's Slurm scheduler builds a request and materialises it):

* :func:`describe` turns ``(Plan, Site, TrainJob)`` into a :class:`LaunchRequest`: one
  :class:`Component` (a ``#SBATCH hetjob`` component) per run of consecutive stages on one
  partition, with its Slurm request (:class:`~memx_hpc.slurm.request.SlurmRequest`, the one
  place a partition becomes Slurm options), environment and Megatron-LM command line
  (:mod:`memx_hpc.slurm.cmdline`). It refuses, with a :class:`~memx_hpc.errors.SpecError`
  that says why, every plan Megatron-LM cannot run.
* :func:`render` is ``describe`` + the Jinja template ``templates/megatron.sbatch.j2``
  (StrictUndefined, ``shell_quote`` on every value from a site or job file).

Both are pure: no files, no Slurm. Writing, ``bash -n``, ``sbatch --test-only``, submitting
and waiting are :mod:`memx_hpc.slurm.submit`. The site's values were validated when the
:class:`~memx_hpc.spec.Site` was built and are not checked again here.

Megatron-LM argument names are those of Megatron-LM core_r0.16.0
(``megatron/training/arguments.py``); the site's ``megatron_version`` must name it.
The per-stage layer split is ``--pipeline-model-parallel-layout`` (``E`` embedding, ``t``
a transformer layer, ``L`` the loss, ``|`` between stages: ``Et*14|t*10L``), which, unlike
``--decoder-first/last-pipeline-num-layers``, allows any number of layers on every stage.

Which ranks run where -- the hetjob components, their nodes and tasks per node, the vendor
of every rank -- is the plan's :class:`~memx_hpc.placement.Placement` (the one fit rule,
shared with the search and the composition). Ranks are numbered component by component in
Megatron's order, so one ``srun ... : ...`` across the components gives every rank the
stage the plan put it on.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal as _signal
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import SpecError, SystemFailure
from ..placement import ComponentPlacement, Placement, comm_vendor, place
from ..shellsafe import check_entry
from ..spec import Partition, Plan, Recompute, Site, TrainJob, job_for_plan
from .cmdline import (CommandLine, ComponentShape, command_line, pipeline_layout, project_entry_plan_refusal,
                      project_entry_refusal, recompute_args, virtual_recompute_refusal)
from .groups import GroupBackend, cross_vendor_unsupported, encode_rank_vendors, format_map, group_backends
from .request import PartitionEnvironment, SlurmOption, SlurmRequest

__all__ = ["SUPPORTED_MEGATRON_VERSIONS", "EnvVar", "Component", "LaunchRequest", "Continuation", "STATE_FILE",
           "TRACKER_FILE", "CHECKPOINT_POINTER", "run_folder", "warning_signal",
           "VendorLaunch", "describe", "render", "render_request", "pipeline_layout", "recompute_args",
           "process_groups", "rank_vendors", "sequence_parallel_refusal", "fp8_refusal", "PROJECT_ENTRY", "TEMPLATE"]

#: The Megatron-LM versions whose argument names this renderer emits.
SUPPORTED_MEGATRON_VERSIONS = ("core_r0.16.0",)
TEMPLATE = "megatron.sbatch.j2"

_UNSAFE_CHARS = ("\n", "\r", "\x00")


@dataclass(frozen=True, kw_only=True)
class VendorLaunch:
    """What differs per vendor when launching: the collective library's name (for messages)
    and variables every rank of that vendor needs (the container's GPU flags:
    memx_hpc/slurm/request.py)."""

    comm_library: str
    env: tuple[tuple[str, str], ...] = ()


# A small registry: a new vendor is an entry here, not a code change elsewhere.
# CUDA_DEVICE_MAX_CONNECTIONS=1: Megatron-LM's examples set it on NVIDIA GPUs so that
# communication kernels are scheduled in issue order (needed for TP/SP overlap). A UCC
# pipeline forbids it (megatron-core asserts "UCC-backend requires CUDA_DEVICE_MAX_CONNECTIONS
# > 1"), so cross-vendor plans leave it unset: the cost is tensor-parallel communication
# overlap, which Megatron-LM then does not get (TP/SP all-gathers and reduce-scatters run
# without a guaranteed order against the GEMMs they would overlap).
VENDORS: dict[str, VendorLaunch] = {
    "nvidia": VendorLaunch(comm_library="NCCL", env=(("CUDA_DEVICE_MAX_CONNECTIONS", "1"),)),
    "amd": VendorLaunch(comm_library="RCCL"),
    "intel": VendorLaunch(comm_library="oneCCL"),
    "cpu": VendorLaunch(comm_library="gloo"),
}
_SERIAL_CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"

#: The training entry of cross-vendor plans: megatron-core with every process group on the
#: backend the group rule gives it (:mod:`memx_hpc.slurm.groups`); stock Megatron-LM can only
#: switch the pipeline group.
PROJECT_ENTRY = ("-m", "memx_hpc.train.pretrain_gpt")


@dataclass(frozen=True, kw_only=True)
class EnvVar:
    name: str
    value: str


@dataclass(frozen=True, kw_only=True)
class Component:
    """One ``#SBATCH hetjob`` component: consecutive stages on one partition."""

    index: int
    partition: str
    vendor: str
    stages: tuple[int, ...]
    first_rank: int
    num_ranks: int
    nodes: int
    tasks_per_node: int
    first_layer: int
    num_layers: int
    recompute: Recompute
    slurm: SlurmRequest  # what the component asks of Slurm: its #SBATCH lines and step options
    setup: tuple[str, ...]  # site shell lines (shell code by contract), each run by a quoted eval
    env: tuple[EnvVar, ...]
    python: tuple[str, ...]  # [container runtime ...] python
    entry: tuple[str, ...]  # the training entry: a script path, or -m module
    entry_path: str | None  # the entry's file, which the preflight checks; None for -m module
    backends: tuple[str, ...]  # torch.distributed backends this component's ranks will use
    args: tuple[tuple[str, ...], ...]  # this component's own Megatron-LM arguments (recompute)

    @property
    def launcher(self) -> tuple[str, ...]:
        return self.python + self.entry

    @property
    def sbatch(self) -> tuple[SlurmOption, ...]:
        """The component's ``#SBATCH`` options."""
        return self.slurm.sbatch_options()

    @property
    def srun(self) -> tuple[SlurmOption, ...]:
        """The component's options in the step: a failing rank ends the whole step."""
        return self.slurm.srun_options() + (SlurmOption(name="kill-on-bad-exit", value="1"),)

    @property
    def stages_label(self) -> str:
        return _range_label(self.stages[0], self.stages[-1])

    @property
    def ranks_label(self) -> str:
        return _range_label(self.first_rank, self.first_rank + self.num_ranks - 1)

    @property
    def layers_label(self) -> str:
        return f"{_range_label(self.first_layer, self.first_layer + self.num_layers - 1)} ({self.num_layers})"

    @property
    def recompute_label(self) -> str:
        return self.recompute.label()


#: the run folder's state file: one JSON line per segment event (memx_hpc/planner/runs.py reads it)
STATE_FILE = "segments.jsonl"
#: Megatron-LM's checkpoint tracker: the latest saved iteration (megatron/training/checkpointing.py)
TRACKER_FILE = "latest_checkpointed_iteration.txt"
#: the run folder's note of its checkpoint folder (one line)
CHECKPOINT_POINTER = "checkpoint_dir.txt"
#: signals the warning cannot be: TERM is what Slurm sends to cancel, preempt or end a job (the
#: script must tell the warning from those), the others cannot be trapped or stop the shell
_NOT_A_WARNING = ("TERM", "KILL", "STOP", "CONT", "INT", "HUP", "QUIT", "PIPE", "CHLD", "TSTP")


@dataclass(frozen=True, kw_only=True)
class Continuation:
    """How a run that saves checkpoints goes on past Slurm's time limit, one Slurm job (a
    *segment*) after another (the template's continuation block does it):

    * Slurm sends ``signal`` to the batch shell ``warning_s`` seconds before the time limit
      (``#SBATCH --signal=B:SIG@S``: the shell only, so that it stays in charge); its trap
      sends SIGTERM to every rank (``scancel --signal=TERM``: all steps of all hetjob
      components), which Megatron-LM's ``--exit-signal-handler`` turns into a save after the
      current iteration and a clean exit;
    * when the step has ended, the shell reads the checkpoint tracker: a newer iteration than
      the segment started from is progress, and the same script is submitted again with
      ``--dependency=afterany:<this job>`` (it starts when this job ends, from the latest
      checkpoint: ``--load`` is the save folder from the second segment on);
    * the chain stops, saying why in the log and the state file, when the tracker reaches
      ``target_iters``, when a segment wrote no newer checkpoint, after ``max_segments``
      segments, or when Slurm ends the job itself (scancel, preemption, node failure: with
      ``--requeue`` Slurm starts a preempted job again, which resumes the same way).

    A dependent job rather than ``scontrol requeue``: Slurm 22.05 requeues a heterogeneous job
    too, but holds a requeued job for about two minutes (its BeginTime), kills its batch shell at
    once (no bookkeeping after the requeue) and keeps one job id and one log for every segment;
    a dependent job starts when this one ends, with its own id, log and accounting record.
    """

    run_dir: str  # the run's folder: the state file, tensorboard/, wandb/
    checkpoint_dir: str  # Megatron-LM's --save folder, whose tracker measures progress
    target_iters: int  # the training length in iterations (samples: whole global batches)
    max_segments: int
    signal: str  # the warning's name, without SIG (USR1)
    warning_s: int

    @property
    def state_file(self) -> str:
        return f"{self.run_dir}/{STATE_FILE}"

    @property
    def slurm_signal(self) -> str:
        return f"B:{self.signal}@{self.warning_s}"


def run_folder(out_dir: str, job_name: str) -> str:
    """The run's folder: ``<log dir>/<job name>`` (its state file and TensorBoard events)."""
    return f"{out_dir.rstrip('/') or '/'}/{job_name}".replace("//", "/")


def warning_signal(site: Site, time_limit_min: int) -> tuple[str, int]:
    """The warning a continuing run asks of Slurm: ``(name, seconds before the limit)``. The
    site's ``slurm.signal`` when it names one (its ``B:``/no prefix alike: the batch shell gets
    it; no ``@``: Slurm's 60 s), else USR1 at 10 % of the limit, 2 to 30 minutes, and at most
    half of a limit shorter than that. Slurm may send it up to a minute early (sbatch(1))."""
    default_s = min(60 * min(30, max(2, time_limit_min // 10)), max(30, time_limit_min * 30))
    if site.signal is None:
        return "USR1", default_s
    spec = site.signal
    if spec.startswith("R:"):
        raise SpecError("a run that continues itself needs Slurm's warning in its batch shell (B:); R: asks for it "
                        "only when a reservation ends", field="slurm.signal", found=spec, allowed="USR1@300, B:USR2@600")
    spec = spec.removeprefix("B:")
    name, _, secs = spec.partition("@")
    if name.isdigit():
        try:
            name = _signal.Signals(int(name)).name
        except ValueError:
            raise SpecError("not a signal number of this system", field="slurm.signal", found=site.signal) from None
    name = name.removeprefix("SIG")
    if name in _NOT_A_WARNING:
        raise SpecError(f"SIG{name} cannot be the time-limit warning of a run that continues itself: Slurm sends "
                        f"SIGTERM to cancel or preempt a job, and the script must tell the two apart",
                        field="slurm.signal", found=site.signal, allowed="USR1@300, USR2@600 (B: optional)")
    return name, int(secs) if secs else 60


@dataclass(frozen=True, kw_only=True)
class LaunchRequest:
    """Everything the template needs, checked: the one object it is rendered from."""

    tool_version: str
    site_name: str
    job_name: str
    megatron_version: str
    summary: str
    tp: int
    pp: int
    dp: int
    world_size: int
    layout: str | None
    components: tuple[Component, ...]
    common_args: tuple[tuple[str, ...], ...]  # every rank's Megatron-LM arguments, one flag per tuple
    groups: tuple[GroupBackend, ...]  # every process group and its backend (memx_hpc.slurm.groups)
    cross_vendor: bool  # ranks on more than one vendor: the project's megatron-core entry runs
    preflight_code: str  # memx_hpc/slurm/preflight.py, run with python -c by every rank first
    extra_args: tuple[str, ...] = ()  # the caller's further arguments, last (argparse: later flags win)
    run_kind: str = "train"  # train | synthetic | measure (memx_hpc.slurm.cmdline)
    banner: str = ""  # one line: what kind of run this is, first in the script and in its log
    master_port_base: int = 20000
    master_port_span: int = 20000
    run_dir: str | None = None  # the run's folder (TensorBoard events, the state file of a continuing run)
    continuation: Continuation | None = None  # None: one Slurm job (no checkpoints to continue from)

    state_file_name: str = STATE_FILE
    tracker_file_name: str = TRACKER_FILE
    checkpoint_pointer_name: str = CHECKPOINT_POINTER

    @property
    def group_lines(self) -> list[str]:
        return format_map(self.groups)

    @property
    def megatron_argv(self) -> list[list[str]]:
        """Each component's full Megatron-LM argument list (for people and tests)."""
        common = [w for a in self.common_args for w in a]
        return [common + [w for a in c.args for w in a] + list(self.extra_args) for c in self.components]


def _range_label(a: int, b: int) -> str:
    return str(a) if a == b else f"{a}-{b}"


# --------------------------------------------------------------------------- checks


def _no_control(value: str, field: str) -> str:
    for ch in _UNSAFE_CHARS:
        if ch in value:
            raise SpecError("must be a single line (no newline, carriage return or NUL): it goes into a "
                            "shell script", field=field, found=value)
    return value


# --------------------------------------------------------------------------- Megatron arguments
# One rule for every plan's command line: memx_hpc/slurm/cmdline.py (pipeline_layout and
# recompute_args are re-exported here for callers of this module).


# --------------------------------------------------------------------------- describe


def describe(plan: Plan, site: Site, job: TrainJob, *, iters: int | None = None,
             extra: Sequence[str] = (), job_name: str | None = None, log_dir: str | None = None,
             workdir: str | None = None, mock_data: bool | None = None) -> LaunchRequest:
    """The checked launch request for ``plan`` on ``site``; raises SpecError for anything
    Megatron-LM cannot run or that cannot be written into a script safely.

    The Megatron-LM command line is :func:`memx_hpc.slurm.cmdline.command_line`'s: a training
    run on the job's ``data:`` section, or, when the job has none, a synthetic-data run that
    says so on the script's first lines. ``mock_data=True`` makes it a measurement run
    (what ``verify`` times: mock data, no warm-up, evaluation or checkpoints). ``iters``
    overrides the job's training length; ``extra`` are further Megatron-LM arguments for
    every rank (later flags override earlier ones in Megatron-LM's argparse). ``log_dir`` is where the
    job's output goes (default: the site's ``work_dir``); ``workdir`` the job's working
    directory (default: where it is submitted from).
    """
    from .. import __version__

    job = job_for_plan(job, plan)  # the plan's own --use-distributed-optimizer, where it has one
    _check_plan(plan, site, job)
    placement = place(plan, site, job)  # the one fit rule: SpecError naming the field when it does not fit
    cross_vendor = _check_vendors(plan, site, placement)
    name = job_name or job.name
    out_dir = log_dir if log_dir is not None else os.path.normpath(site.resolve(site.work_dir))
    run_dir = _no_control(run_folder(out_dir, name), "log_dir")
    ck = job.checkpoint
    continuation = None
    if not mock_data and ck is not None and ck.save_dir is not None:
        limit = min(site.partition(pc.partition).time_limit_min or site.time_limit_min for pc in placement.components)
        sig, warn_s = warning_signal(site, limit)
        continuation = Continuation(run_dir=run_dir, checkpoint_dir=ck.save_dir, target_iters=0,
                                    max_segments=ck.max_segments, signal=sig, warning_s=warn_s)
    leader = _JobWide(name=name, output=f"{out_dir.rstrip('/')}/{name}-%j.out", chdir=workdir,
                      signal=continuation.slurm_signal if continuation else None,
                      requeue=(True if site.requeue is None else site.requeue) if continuation else None,
                      open_mode="append" if continuation else None)
    groups = group_backends(placement.rank_vendors(), tp=plan.tp, dp=plan.dp, pp=plan.pp, cp=plan.cp, ep=plan.ep,
                            etp=plan.etp, cross_vendor_backend=site.pipeline_comm_backend)
    unsupported = cross_vendor_unsupported(groups)
    if unsupported:  # the cross-vendor group rule: every hot group that spans vendors has what it carries
        raise SpecError("; ".join(unsupported), field="pipeline_comm.backend", found=site.pipeline_comm_backend)
    comps = [_component(plan, site, placement, pc, groups=groups, cross_vendor=cross_vendor,
                        leader=leader if pc.index == 0 else None) for pc in placement.components]
    cmd = _command_line(plan, site, job, comps, cross_vendor=cross_vendor, iters=iters, measure=bool(mock_data),
                        run_dir=run_dir)
    if continuation is not None:
        n = cmd.length
        continuation = dataclasses.replace(continuation, target_iters=n.iters if n.iters is not None
                                           else max(1, n.samples // plan.global_batch_size))
    comps = [dataclasses.replace(c, args=a) for c, a in zip(comps, cmd.per_component)]
    for k, e in enumerate(extra):
        _no_control(e, f"extra[{k}]")
    more = "".join(f" {k}={getattr(plan, attr)}" for k, attr in (("vp", "virtual_stages"), ("cp", "cp"), ("ep", "ep"),
                                                                 ("etp", "etp")) if getattr(plan, attr) not in (1, None))
    summary = (f"tp={plan.tp} pp={plan.pp} dp={plan.dp}{more} micro-batch={plan.micro_batch_size} "
               f"global-batch={plan.global_batch_size} world={plan.world_size}; stages: " +
               ", ".join(f"{s.partition}:{s.num_layers}:{s.recompute.label()}" for s in plan.stages))
    return LaunchRequest(
        tool_version=__version__, site_name=site.name, job_name=name, megatron_version=site.megatron_version,
        summary=summary, tp=plan.tp, pp=plan.pp, dp=plan.dp, world_size=plan.world_size,
        layout=pipeline_layout(plan.stages, plan.virtual_stages) if plan.pp > 1 else None, components=tuple(comps),
        common_args=cmd.common, groups=groups, cross_vendor=cross_vendor, preflight_code=_preflight_source(),
        extra_args=tuple(extra), run_kind=cmd.kind, banner=cmd.banner, run_dir=run_dir, continuation=continuation)


def _check_plan(plan: Plan, site: Site, job: TrainJob) -> None:
    """What Megatron-LM refuses of a plan wherever it runs: the argument names' version, TP that
    does not divide the model, SP without TP (the layer count and the fit: the placement)."""
    if site.megatron_version not in SUPPORTED_MEGATRON_VERSIONS:
        raise SpecError("this renderer emits Megatron-LM argument names of another version",
                        field="megatron_version", found=site.megatron_version,
                        allowed=", ".join(SUPPORTED_MEGATRON_VERSIONS))
    model = job.model
    for what, n in (("num_attention_heads", model.num_attention_heads), ("num_query_groups", model.num_query_groups),
                    ("ffn_hidden_size", model.ffn_hidden_size), ("hidden_size", model.hidden_size)):
        if n % plan.tp:
            raise SpecError(f"model {what} {n} is not divisible by the tensor-parallel size (Megatron-LM "
                            f"splits it across TP ranks)", field="tp", found=plan.tp)
    if plan.sequence_parallel and plan.tp == 1:
        raise SpecError("sequence parallelism needs tensor-parallel size > 1 (Megatron-LM refuses it)",
                        field="sequence_parallel", found=True)
    if plan.sequence_parallel:
        cpu = sequence_parallel_refusal(site, [s.partition for s in plan.stages])
        if cpu is not None:
            raise SpecError(cpu, field="sequence_parallel", found=True)
    if plan.cp > 1:
        local = sorted({s.partition for s in plan.stages
                        if site.partition(s.partition).transformer_impl_for(site.gpu_of(s.partition).vendor)
                        != "transformer_engine"})
        if local:
            raise SpecError(f"context parallel runs Transformer Engine's attention; partition(s) {', '.join(local)} "
                            f"train megatron-core's local layer, whose attention has no context parallel",
                            field="cp", found=plan.cp, allowed="1 there, or transformer_impl: transformer_engine")
    vr = virtual_recompute_refusal(plan)
    if vr is not None:
        raise SpecError(vr[1], field=f"stages[{vr[0]}].recompute", found=plan.stages[vr[0]].recompute.label(),
                        allowed=f"none, selective, full, or full:K with K a multiple of {plan.virtual_stages}")


def sequence_parallel_refusal(site: Site, partitions: Sequence[str]) -> str | None:
    """Why sequence parallel cannot run on these partitions, or None. CPU devices train with
    megatron-core's local layer spec, whose norm without Apex is torch's LayerNorm
    (``WrappedTorchNorm``), and that asserts ``not config.sequence_parallel``."""
    cpu = sorted({p for p in partitions if site.gpu_of(p).vendor == "cpu"})
    if not cpu:
        return None
    return (f"sequence parallel cannot run on the CPU devices of {', '.join(cpu)}: megatron-core's local layer "
            f"spec normalises with torch's LayerNorm there (no Apex), which refuses sequence parallel")


def fp8_refusal(site: Site, partitions: Sequence[str], *, cross_vendor: bool) -> str | None:
    """Why FP8 cannot run on these partitions, or None. Megatron-LM runs FP8 GEMMs through
    Transformer Engine only (``--transformer-impl transformer_engine``; megatron-core's local
    spec accepts ``--fp8-format`` and trains in 16 bits): CPU devices have no Transformer
    Engine build, the project's entry (cross-vendor plans) builds the local spec, and a
    partition that trains with the local spec (AMD by default) would not run FP8."""
    cpu = sorted({p for p in partitions if site.gpu_of(p).vendor == "cpu"})
    if cpu:
        return (f"FP8 cannot run on the CPU devices of {', '.join(cpu)}: Megatron-LM needs Transformer Engine for "
                f"FP8 (--transformer-impl transformer_engine), which has no CPU build")
    if cross_vendor:
        return ("FP8 cannot run in a cross-vendor plan: its ranks run the project's megatron-core entry with the "
                "local layer spec, and Megatron-LM runs FP8 only through Transformer Engine")
    local = sorted({p for p in partitions
                    if site.partition(p).transformer_impl_for(site.gpu_of(p).vendor) != "transformer_engine"})
    if local:
        return (f"FP8 needs Transformer Engine, and partition {', '.join(local)} trains with megatron-core's local "
                f"spec (set its transformer_impl: transformer_engine where Transformer Engine is installed, e.g. "
                f"ROCm's build on MI300)")
    return None


def _check_vendors(plan: Plan, site: Site, placement: Placement) -> bool:
    """Whether the pipeline crosses vendors; refused when it does without UCC."""
    stage_vendors = [placement.component_of_stage(i).comm_vendor for i in range(plan.pp)]
    if placement.cross_vendor and site.pipeline_comm_backend != "ucc":
        pairs = sorted({f"{plan.stages[i].partition} ({stage_vendors[i]}) -> {plan.stages[i + 1].partition} "
                        f"({stage_vendors[i + 1]})" for i in range(plan.pp - 1)
                        if stage_vendors[i] != stage_vendors[i + 1]})
        raise SpecError("this pipeline crosses vendors (" + "; ".join(pairs) + "), and NCCL/RCCL do not talk "
                        "to each other: set pipeline_comm.backend: ucc in the site file (groups that span "
                        "vendors then use UCC or gloo)", field="pipeline_comm.backend",
                        found=site.pipeline_comm_backend, allowed="ucc")
    return placement.cross_vendor


@dataclass(frozen=True, kw_only=True)
class _JobWide:
    """What the first component carries for the whole job: its name, output file, working folder."""

    name: str
    output: str
    chdir: str | None
    signal: str | None = None  # None: the site's (a continuing run asks for its warning: Continuation)
    requeue: bool | None = None  # None: the site's
    open_mode: str | None = None  # append: a requeued (preempted) segment keeps its earlier output


def _field_of(site: Site, partition: str) -> str:
    """The partition's place in the site file, for messages (``partitions[1]``)."""
    return f"partitions[{[q.name for q in site.partitions].index(partition)}]"


def _component(plan: Plan, site: Site, placement: Placement, pc: ComponentPlacement, *,
               groups: Sequence[GroupBackend], cross_vendor: bool, leader: _JobWide | None) -> Component:
    """The placed component ``pc``: what it asks of Slurm (the job-wide options when it is the
    ``leader``), its environment and its ranks' launcher (its arguments: :func:`_command_line`)."""
    p = site.partition(pc.partition)
    job_wide: dict = {} if leader is None else {"job_name": leader.name, "output": leader.output,
                                                "chdir": leader.chdir}
    if leader is not None and leader.signal is not None:
        job_wide.update(signal=leader.signal, requeue=leader.requeue, open_mode=leader.open_mode)
    request = SlurmRequest.of(site, p, nodes=pc.nodes, tasks_per_node=pc.tasks_per_node, job_wide=leader is not None,
                              **job_wide)
    my_ranks = set(range(pc.first_rank, pc.first_rank + pc.num_ranks))
    backends = sorted({b for g in groups if my_ranks & set(g.ranks) for b in _effective(g.backend, pc.vendor)})
    # the entry as argv words (the partition checked it when it was built)
    entry = PROJECT_ENTRY if cross_vendor else check_entry(p.megatron_entry, "megatron_entry")
    return Component(
        index=pc.index, partition=p.name, vendor=pc.vendor, stages=pc.stages, first_rank=pc.first_rank,
        num_ranks=pc.num_ranks, nodes=pc.nodes, tasks_per_node=pc.tasks_per_node,
        first_layer=sum(s.num_layers for s in plan.stages[:pc.stages[0]]),
        num_layers=sum(plan.stages[i].num_layers for i in pc.stages),
        recompute=pc.recompute if pc.recompute is not None else plan.stages[pc.stages[0]].recompute,
        slurm=request, setup=request.environment.setup,
        env=_component_env(plan, site, placement, p, request.environment, pc.index, pc.vendor,
                           cross_vendor=cross_vendor),
        python=request.launcher(p.python), entry=entry, entry_path=entry[0] if entry[0] != "-m" else None,
        backends=tuple(backends), args=())


def _component_env(plan: Plan, site: Site, placement: Placement, p: Partition, penv: PartitionEnvironment,
                   ci: int, vendor: str, *, cross_vendor: bool) -> tuple[EnvVar, ...]:
    """A component's variables, in the order they are exported (later ones win): the vendor's,
    the partition's (``penv``), the cross-vendor backend's, then the project's own."""
    ucc_pipeline = cross_vendor and plan.pp > 1
    vl = VENDORS.get(vendor, VendorLaunch(comm_library="?"))
    env = [EnvVar(name=k, value=v) for k, v in vl.env if not (ucc_pipeline and k == _SERIAL_CONNECTIONS)]
    env += [EnvVar(name=k, value=v) for k, v in penv.env]
    if cross_vendor:
        env += [EnvVar(name=k, value=v) for k, v in site.pipeline_comm_env]
        _check_cross_vendor_env(p, site, vendor, _field_of(site, p.name), plan.pp)
        env += [EnvVar(name="MEMX_RANK_VENDORS", value=encode_rank_vendors(placement.rank_vendors())),
                EnvVar(name="MEMX_CROSS_VENDOR_BACKEND", value=site.pipeline_comm_backend)]
    if p.cpus_per_task is not None:
        env.append(EnvVar(name="OMP_NUM_THREADS", value=str(p.cpus_per_task)))
    env += [EnvVar(name="MEMX_COMPONENT", value=str(ci)), EnvVar(name="MEMX_PARTITION", value=p.name)]
    return tuple(env)


def _command_line(plan: Plan, site: Site, job: TrainJob, comps: Sequence[Component], *, cross_vendor: bool,
                  iters: int | None, measure: bool, run_dir: str | None = None) -> CommandLine:
    """The run's Megatron-LM arguments (memx_hpc.slurm.cmdline): a measurement run, a training
    run on the job's data, or a synthetic-data run when it has none."""
    kind = "measure" if measure else ("train" if job.data is not None else "synthetic")
    if job.fp8:
        why = fp8_refusal(site, [c.partition for c in comps], cross_vendor=cross_vendor)
        if why is not None:
            raise SpecError(why, field="fp8", found=job.fp8, file=job.source_file, allowed="none")
    if cross_vendor:
        why = project_entry_plan_refusal(plan)
        if why is not None:
            raise SpecError(why.reason, field=why.field, found=getattr(plan, why.field))
        why = project_entry_refusal(job)
        if why is not None:
            found = (job.data.tokenizer_type if why.field.startswith("data") and job.data else
                     getattr(job.model, why.field.removeprefix("model."), None))
            raise SpecError(why.reason, field=why.field, file=job.source_file, found=found)
    shapes = [ComponentShape(transformer_impl=site.partition(c.partition).transformer_impl_for(c.vendor),
                             recompute=c.recompute, max_stage_layers=max(plan.stages[i].num_layers for i in c.stages),
                             vendor=site.gpu_of(c.partition).vendor, entry=c.entry)
              for c in comps]
    cmd = command_line(plan, job, components=shapes, cross_vendor=cross_vendor,
                       pipeline_backend=site.pipeline_comm_backend, kind=kind, iters=iters,
                       time_limit_min=min(c.slurm.time_limit_min for c in comps), run_dir=run_dir)
    _no_control(cmd.banner, "data.paths")  # it goes into comment lines
    return cmd


#: the UCX transport that moves GPU memory, per vendor
_UCX_GPU_TRANSPORT = {"nvidia": "cuda_copy", "amd": "rocm_copy"}


def _check_cross_vendor_env(p: Partition, site: Site, vendor: str, pfield: str, pp: int) -> None:
    """What megatron-core and UCX need on a component of a cross-vendor plan: UCX_TLS (when
    given) names the transport that moves this vendor's GPU memory; no
    CUDA_DEVICE_MAX_CONNECTIONS=1 beside a UCC pipeline (megatron-core asserts it)."""
    exported = [(k, v, f"{pfield}.env.{k}") for k, v in p.env]
    exported += [(k, v, f"pipeline_comm.env.{k}") for k, v in site.pipeline_comm_env]  # exported after
    last = {k: (v, field) for k, v, field in exported}
    if "UCX_TLS" in last and vendor in _UCX_GPU_TRANSPORT:
        value, field = last["UCX_TLS"]
        tls = [t.strip() for t in value.split(",")]
        need = _UCX_GPU_TRANSPORT[vendor]
        if need not in tls and "all" not in tls and "^" not in value:
            raise SpecError(f"UCX cannot move {vendor.upper()} GPU memory without {need}: add it (groups that span "
                            f"vendors run on UCC over UCX)", field=field, found=value, allowed=f"a list with {need}")
    if pp > 1 and last.get(_SERIAL_CONNECTIONS, ("",))[0] == "1":
        raise SpecError("a UCC pipeline needs CUDA_DEVICE_MAX_CONNECTIONS > 1 (megatron-core asserts it); leave it "
                        "unset for cross-vendor plans", field=last[_SERIAL_CONNECTIONS][1], found="1")


def _preflight_source() -> str:
    from importlib import resources

    try:
        code = resources.files("memx_hpc.slurm").joinpath("preflight.py").read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SystemFailure("memx_hpc/slurm/preflight.py is missing from the installation") from None
    if "MEMX_PREFLIGHT_PY" in code or not code.endswith("\n"):  # the here-document's end marker
        raise SystemFailure("memx_hpc/slurm/preflight.py cannot be embedded as a here-document")
    return code


def rank_vendors(plan: Plan, site: Site) -> tuple[str, ...]:
    """The (communication) vendor of every global rank, in Megatron's rank order."""
    return tuple(comm_vendor(site, site.partition(s.partition)) for s in plan.stages
                 for _ in range(plan.gpus_per_stage))


def process_groups(plan: Plan, site: Site) -> tuple[GroupBackend, ...]:
    """Every process group of ``plan`` on ``site`` with the backend the group rule gives it
    (:func:`memx_hpc.slurm.groups.group_backends`); what the rendered job's ranks build."""
    return group_backends(rank_vendors(plan, site), tp=plan.tp, dp=plan.dp, pp=plan.pp, cp=plan.cp, ep=plan.ep,
                          etp=plan.etp, cross_vendor_backend=site.pipeline_comm_backend)


def _effective(backend: str, vendor: str) -> tuple[str, ...]:
    """The backends a rank of ``vendor`` actually needs for a group planned on ``backend``
    (CPU partitions run every group on gloo)."""
    if vendor == "cpu":
        return ("gloo",)
    return tuple(b.split(":")[-1] for b in backend.split(","))


# --------------------------------------------------------------------------- render


def _environment():  # noqa: ANN202 - jinja2 type, imported lazily
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_load_template), undefined=jinja2.StrictUndefined, autoescape=False,
        keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["shell_quote"] = _shell_quote
    return env


def _load_template(name: str) -> str:
    # The template beside this code: memx_hpc/templates/ in a wheel, templates/ at the top of a
    # source checkout (an editable install's package map may point at another checkout).
    here = Path(__file__).resolve().parents[1]
    for cand in (here / "templates" / name, here.parent / "templates" / name):
        if cand.is_file():
            return cand.read_text(encoding="utf-8")
    from importlib import resources

    try:
        return resources.files("memx_hpc.templates").joinpath(name).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SystemFailure(f"template {name} is missing from the installation (memx_hpc.templates)") from None


def _shell_quote(value: object) -> str:
    text = str(value)
    for ch in _UNSAFE_CHARS:
        if ch in text:  # describe() refuses these first; this keeps the template safe on its own
            raise SpecError("cannot be quoted into one shell line", found=text)
    return shlex.quote(text)


def render_request(request: LaunchRequest) -> str:
    """The sbatch script for a described request (the template does no checking of its own)."""
    return _environment().get_template(TEMPLATE).render(r=request)


def render(plan: Plan, site: Site, job: TrainJob, *, iters: int | None = None, extra: Sequence[str] = (),
           job_name: str | None = None, log_dir: str | None = None, workdir: str | None = None,
           mock_data: bool | None = None) -> str:
    """The heterogeneous sbatch script that runs ``plan`` with Megatron-LM on ``site``. Pure:
    no files, no Slurm. See :func:`describe` for the arguments and the refusals."""
    return render_request(describe(plan, site, job, iters=iters, extra=extra, job_name=job_name,
                                   log_dir=log_dir, workdir=workdir, mock_data=mock_data))
