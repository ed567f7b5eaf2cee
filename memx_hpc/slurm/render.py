"""From a plan to a heterogeneous sbatch script that launches Megatron-LM, and what to do with it.

Describe, then act (torchx's Slurm scheduler builds a request and materialises it):

* :func:`describe` turns ``(Plan, Site, TrainJob)`` into a :class:`LaunchRequest`: one
  :class:`Component` (a ``#SBATCH hetjob`` component) per run of consecutive stages on one
  partition, with its Slurm request, environment and Megatron-LM command line. It refuses,
  with a :class:`~memx_hpc.errors.SpecError` that says why, every plan Megatron-LM cannot
  run and every value that cannot be put into a script safely.
* :func:`render` is ``describe`` + the Jinja template ``templates/megatron.sbatch.j2``
  (StrictUndefined, ``shell_quote`` on every value from a site or job file). Pure.
* :func:`check_syntax` (``bash -n``), :func:`test_only` (``sbatch --test-only``) and
  :func:`submit` (``sbatch``) act on a written script.

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
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import SpecError, SystemFailure
from ..placement import comm_vendor, place
from ..spec import Partition, Plan, Recompute, Site, Stage, TrainJob
from ..shellsafe import check_entry, check_partition, check_path, check_setup_line
from .cmdline import ComponentShape, command_line, pipeline_layout, project_entry_refusal, recompute_args
from .groups import GroupBackend, encode_rank_vendors, format_map, group_backends

__all__ = ["SUPPORTED_MEGATRON_VERSIONS", "SbatchOption", "EnvVar", "Component", "LaunchRequest",
           "VendorLaunch", "describe", "render", "render_request", "pipeline_layout", "recompute_args",
           "process_groups", "rank_vendors", "transformer_impl_of", "PROJECT_ENTRY",
           "check_syntax", "output_dirs", "TestOnly", "test_only", "submit", "JobOutcome", "job_states", "wait", "TEMPLATE"]

#: The Megatron-LM versions whose argument names this renderer emits.
SUPPORTED_MEGATRON_VERSIONS = ("core_r0.16.0",)
TEMPLATE = "megatron.sbatch.j2"

# Slurm option values: partition, GRES type, account, QoS and job names (Slurm's own
# names use these characters; anything else in an #SBATCH line is refused, since sbatch
# parses those lines itself and a newline would end the directive).
_SLURM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_UNSAFE_CHARS = ("\n", "\r", "\x00")


@dataclass(frozen=True, kw_only=True)
class VendorLaunch:
    """What differs per vendor when launching: the collective library's name (for messages),
    the container runtime's GPU flag, and variables every rank of that vendor needs."""

    comm_library: str
    apptainer_flags: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


# A small registry: a new vendor is an entry here, not a code change elsewhere.
# CUDA_DEVICE_MAX_CONNECTIONS=1: Megatron-LM's examples set it on NVIDIA GPUs so that
# communication kernels are scheduled in issue order (needed for TP/SP overlap). A UCC
# pipeline forbids it (megatron-core asserts "UCC-backend requires CUDA_DEVICE_MAX_CONNECTIONS
# > 1"), so cross-vendor plans leave it unset: the cost is tensor-parallel communication
# overlap, which Megatron-LM then does not get (TP/SP all-gathers and reduce-scatters run
# without a guaranteed order against the GEMMs they would overlap).
VENDORS: dict[str, VendorLaunch] = {
    "nvidia": VendorLaunch(comm_library="NCCL", apptainer_flags=("--nv",),
                           env=(("CUDA_DEVICE_MAX_CONNECTIONS", "1"),)),
    "amd": VendorLaunch(comm_library="RCCL", apptainer_flags=("--rocm",)),
    "intel": VendorLaunch(comm_library="oneCCL", apptainer_flags=()),
    "cpu": VendorLaunch(comm_library="gloo", apptainer_flags=()),
}
_SERIAL_CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"

#: The training entry of cross-vendor plans: megatron-core with every process group on the
#: backend the group rule gives it (:mod:`memx_hpc.slurm.groups`); stock Megatron-LM can only
#: switch the pipeline group.
PROJECT_ENTRY = ("-m", "memx_hpc.train.pretrain_gpt")


@dataclass(frozen=True, kw_only=True)
class SbatchOption:
    name: str
    value: str


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
    sbatch: tuple[SbatchOption, ...]  # "#SBATCH --name=value" lines
    srun: tuple[SbatchOption, ...]  # this component's options in the srun line
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


def _slurm_name(value: str, field: str) -> str:
    _no_control(value, field)
    if not _SLURM_NAME.match(value):
        raise SpecError("not a Slurm name: it goes into an #SBATCH line, which sbatch parses itself",
                        field=field, found=value, allowed="letters, digits, '_', '.', '+', '-'")
    return value


def _env(name: str, value: str, field: str) -> EnvVar:
    if not _ENV_NAME.match(name):
        raise SpecError("environment variable names are letters, digits and _", field=field, found=name)
    return EnvVar(name=name, value=_no_control(value, f"{field}"))


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

    if site.megatron_version not in SUPPORTED_MEGATRON_VERSIONS:
        raise SpecError("this renderer emits Megatron-LM argument names of another version",
                        field="megatron_version", found=site.megatron_version,
                        allowed=", ".join(SUPPORTED_MEGATRON_VERSIONS))
    model = job.model
    name = _slurm_name(job_name or job.name, "job name" if job_name else "name")
    _no_control(site.name, "site name")
    tp, dp, pp = plan.tp, plan.dp, plan.pp
    for what, n in (("num_attention_heads", model.num_attention_heads), ("num_query_groups", model.num_query_groups),
                    ("ffn_hidden_size", model.ffn_hidden_size), ("hidden_size", model.hidden_size)):
        if n % tp:
            raise SpecError(f"model {what} {n} is not divisible by the tensor-parallel size (Megatron-LM "
                            f"splits it across TP ranks)", field="tp", found=tp)
    if plan.sequence_parallel and tp == 1:
        raise SpecError("sequence parallelism needs tensor-parallel size > 1 (Megatron-LM refuses it)",
                        field="sequence_parallel", found=True)

    placement = place(plan, site, job)  # the one fit rule: SpecError naming the field when it does not fit
    partitions = {}
    for i, s in enumerate(plan.stages):
        partitions[s.partition] = site.partition(s.partition)
        _slurm_name(s.partition, f"stages[{i}].partition")

    vendors = {pname: site.gpu(p.gpu_type).vendor for pname, p in partitions.items()}
    stage_vendors = [placement.component_of_stage(i).comm_vendor for i in range(pp)]
    cross_vendor = placement.cross_vendor
    if cross_vendor and site.pipeline_comm_backend != "ucc":
        pairs = sorted({f"{plan.stages[i].partition} ({stage_vendors[i]}) -> {plan.stages[i + 1].partition} "
                        f"({stage_vendors[i + 1]})" for i in range(pp - 1) if stage_vendors[i] != stage_vendors[i + 1]})
        raise SpecError("this pipeline crosses vendors (" + "; ".join(pairs) + "), and NCCL/RCCL do not talk "
                        "to each other: set pipeline_comm.backend: ucc in the site file (groups that span "
                        "vendors then use UCC or gloo)", field="pipeline_comm.backend",
                        found=site.pipeline_comm_backend, allowed="ucc")
    groups = group_backends(placement.rank_vendors(), tp=tp, dp=dp, pp=pp,
                            cross_vendor_backend=site.pipeline_comm_backend)

    first_layer_of = [sum(s.num_layers for s in plan.stages[:i]) for i in range(pp)]
    comps: list[Component] = []
    shapes: list[ComponentShape] = []
    time_limits: list[int] = []
    comm_env = [_env(k, v, f"pipeline_comm.env.{k}") for k, v in site.pipeline_comm_env] \
        if cross_vendor else []
    for pc in placement.components:
        ci, pname, idx = pc.index, pc.partition, list(pc.stages)
        p = partitions[pname]
        pfield = f"partitions[{[q.name for q in site.partitions].index(pname)}]"
        vendor = vendors[pname]
        vl = VENDORS.get(vendor, VendorLaunch(comm_library="?", apptainer_flags=()))
        ranks, nodes, per_node = pc.num_ranks, pc.nodes, pc.tasks_per_node
        first_rank = pc.first_rank
        n_layers = sum(plan.stages[i].num_layers for i in idx)
        recompute = pc.recompute

        sb = [SbatchOption(name="partition", value=pname), SbatchOption(name="nodes", value=str(nodes)),
              SbatchOption(name="ntasks-per-node", value=str(per_node))]
        if ci == 0:
            sb.insert(0, SbatchOption(name="job-name", value=name))
            out_dir = log_dir if log_dir is not None else os.path.normpath(site.resolve(site.work_dir))
            _no_control(out_dir, "work_dir")
            sb.insert(1, SbatchOption(name="output", value=f"{out_dir.rstrip('/')}/{name}-%j.out"))
            if workdir is not None:
                sb.insert(2, SbatchOption(name="chdir", value=_no_control(workdir, "workdir")))
        if p.gres_type is not None:
            sb.append(SbatchOption(name="gres", value=f"gpu:{_slurm_name(p.gres_type, pfield + '.gres_type')}:{per_node}"))
        elif vendor != "cpu":
            sb.append(SbatchOption(name="gres", value=f"gpu:{per_node}"))
        if p.cpus_per_task is not None:
            sb.append(SbatchOption(name="cpus-per-task", value=str(p.cpus_per_task)))
        if p.mem_per_node_gib is not None:
            sb.append(SbatchOption(name="mem", value=f"{int(p.mem_per_node_gib * 1024)}M"))
        account = p.account or site.account
        if account is not None:
            sb.append(SbatchOption(name="account", value=_slurm_name(
                account, f"{pfield}.account" if p.account else "slurm.account")))
        qos = p.qos or site.qos
        if qos is not None:
            sb.append(SbatchOption(name="qos", value=_slurm_name(qos, f"{pfield}.qos" if p.qos else "slurm.qos")))
        sb.append(SbatchOption(name="time", value=str(p.time_limit_min or site.time_limit_min)))

        ucc_pipeline = cross_vendor and pp > 1
        env = [EnvVar(name=k, value=v) for k, v in vl.env if not (ucc_pipeline and k == _SERIAL_CONNECTIONS)]
        env += [_env(k, v, f"{pfield}.env.{k}") for k, v in p.env]
        env += comm_env
        if cross_vendor:
            _check_cross_vendor_env(p, site, vendor, pfield, pp)
            env += [EnvVar(name="MEMX_RANK_VENDORS", value=encode_rank_vendors(placement.rank_vendors())),
                    EnvVar(name="MEMX_CROSS_VENDOR_BACKEND", value=site.pipeline_comm_backend)]
        if p.cpus_per_task is not None:
            env.append(EnvVar(name="OMP_NUM_THREADS", value=str(p.cpus_per_task)))
        env += [EnvVar(name="MEMX_COMPONENT", value=str(ci)), EnvVar(name="MEMX_PARTITION", value=pname)]
        check_partition(p, pfield)  # every shell-bound field, as the site loader and the profiler
        python: tuple[str, ...] = ()
        if p.container is not None:
            python = ("apptainer", "exec", *vl.apptainer_flags, check_path(p.container, f"{pfield}.container"))
        python += (check_path(p.python, f"{pfield}.python"),)
        entry = PROJECT_ENTRY if cross_vendor else check_entry(p.megatron_entry, f"{pfield}.megatron_entry")
        my_ranks = set(range(first_rank, first_rank + ranks))
        backends = sorted({b for g in groups if my_ranks & set(g.ranks) for b in _effective(g.backend, vendor)})
        setup = (("module purge",) if p.module_purge else ()) + tuple(
            check_setup_line(line, f"{pfield}.setup[{k}]") for k, line in enumerate(p.setup))
        srun = [SbatchOption(name="nodes", value=str(nodes)), SbatchOption(name="ntasks-per-node", value=str(per_node))]
        if p.cpus_per_task is not None:  # srun does not inherit it from the allocation (Slurm >= 22.05)
            srun.append(SbatchOption(name="cpus-per-task", value=str(p.cpus_per_task)))
        srun.append(SbatchOption(name="kill-on-bad-exit", value="1"))
        impl = transformer_impl_of(p, vendor)
        shapes.append(ComponentShape(transformer_impl=impl, recompute=recompute,
                                     max_stage_layers=max(plan.stages[i].num_layers for i in idx)))
        time_limits.append(p.time_limit_min or site.time_limit_min)
        comps.append(Component(
            index=ci, partition=pname, vendor=vendor, stages=tuple(idx), first_rank=first_rank, num_ranks=ranks,
            nodes=nodes, tasks_per_node=per_node, first_layer=first_layer_of[idx[0]], num_layers=n_layers,
            recompute=recompute, sbatch=tuple(sb), srun=tuple(srun), setup=setup, env=tuple(env),
            python=python, entry=entry, entry_path=entry[0] if entry[0] != "-m" else None,
            backends=tuple(backends), args=()))

    layout = pipeline_layout(plan.stages) if pp > 1 else None
    if mock_data:
        kind = "measure"
    else:
        kind = "train" if job.data is not None else "synthetic"
    if cross_vendor:
        why = project_entry_refusal(job)
        if why is not None:
            raise SpecError(why.reason, field=why.field, file=job.source_file,
                            found=job.data.tokenizer_type if why.field.startswith("data") and job.data else None)
    cmd = command_line(plan, job, components=shapes, cross_vendor=cross_vendor,
                       pipeline_backend=site.pipeline_comm_backend, kind=kind, iters=iters,
                       time_limit_min=min(time_limits))
    _no_control(cmd.banner, "data.paths")  # it goes into comment lines
    comps = [dataclasses.replace(c, args=a) for c, a in zip(comps, cmd.per_component)]
    for k, e in enumerate(extra):
        _no_control(e, f"extra[{k}]")

    summary = (f"tp={tp} pp={pp} dp={dp} micro-batch={plan.micro_batch_size} global-batch={plan.global_batch_size} "
               f"world={plan.world_size}; stages: " +
               ", ".join(f"{s.partition}:{s.num_layers}:{s.recompute.label()}" for s in plan.stages))
    return LaunchRequest(
        tool_version=__version__, site_name=site.name, job_name=name, megatron_version=site.megatron_version,
        summary=summary, tp=tp, pp=pp, dp=dp, world_size=plan.world_size, layout=layout,
        components=tuple(comps), common_args=cmd.common, groups=groups, cross_vendor=cross_vendor,
        preflight_code=_preflight_source(), extra_args=tuple(extra), run_kind=cmd.kind, banner=cmd.banner)


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
                 for _ in range(plan.tp * plan.dp))


def process_groups(plan: Plan, site: Site) -> tuple[GroupBackend, ...]:
    """Every process group of ``plan`` on ``site`` with the backend the group rule gives it
    (:func:`memx_hpc.slurm.groups.group_backends`); what the rendered job's ranks build."""
    return group_backends(rank_vendors(plan, site), tp=plan.tp, dp=plan.dp, pp=plan.pp,
                          cross_vendor_backend=site.pipeline_comm_backend)


def _effective(backend: str, vendor: str) -> tuple[str, ...]:
    """The backends a rank of ``vendor`` actually needs for a group planned on ``backend``
    (CPU partitions run every group on gloo)."""
    if vendor == "cpu":
        return ("gloo",)
    return tuple(b.split(":")[-1] for b in backend.split(","))


def transformer_impl_of(p: Partition, vendor: str) -> str:
    """The transformer layer a partition trains with (``--transformer-impl``): its own setting,
    else Transformer Engine on NVIDIA (Megatron-LM's default there) and the local spec elsewhere."""
    if p.transformer_impl is not None:
        return p.transformer_impl
    return "transformer_engine" if vendor == "nvidia" else "local"




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


# --------------------------------------------------------------------------- act


def check_syntax(script_path: str | Path) -> None:
    """``bash -n`` on the script; SystemFailure with bash's message when it does not parse."""
    try:
        r = subprocess.run(["bash", "-n", str(script_path)], capture_output=True, text=True, timeout=30,
                           stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SystemFailure(f"could not run bash -n: {e}") from None
    if r.returncode != 0:
        raise SystemFailure(f"bash -n rejects {script_path}: {r.stderr.strip()}")


@dataclass(frozen=True, kw_only=True)
class TestOnly:
    """The verdict of ``sbatch --test-only``: Slurm prints it on stderr."""

    __test__ = False  # not a pytest class

    accepted: bool
    message: str


def _sbatch() -> str:
    exe = shutil.which("sbatch")
    if exe is None:
        raise SystemFailure("sbatch is not on PATH: Slurm's client commands are needed to submit")
    return exe


def output_dirs(script_path: str | Path) -> list[Path]:
    """The folders the script's ``#SBATCH --output``/``--error`` files go into: Slurm does not
    create them, and a job whose log folder is missing dies without a log."""
    dirs = []
    for line in Path(script_path).read_text(encoding="utf-8").splitlines():
        m = re.match(r"#SBATCH --(?:output|error)=(.*)$", line)
        if m:
            words = shlex.split(m.group(1))
            if words and "/" in words[0]:
                dirs.append(Path(words[0]).parent)
    return dirs


def _sbatch_run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    """``sbatch ARGS``; no answer in time or no sbatch at all is a system error (exit 2)."""
    try:
        return subprocess.run([_sbatch(), *args], capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise SystemFailure(f"sbatch {args[0]} did not answer within {timeout_s:g} s") from None
    except OSError as e:
        raise SystemFailure(f"could not run sbatch: {e}") from None


def test_only(script_path: str | Path, *, timeout_s: float = 30.0) -> TestOnly:
    """Ask Slurm whether it would accept and schedule the script (nothing is submitted)."""
    r = _sbatch_run(["--test-only", str(script_path)], timeout_s)
    message = (r.stderr.strip() or r.stdout.strip())
    return TestOnly(accepted=r.returncode == 0, message=message)


def submit(script_path: str | Path, *, timeout_s: float = 60.0) -> str:
    """Submit the script with ``sbatch``; returns the job id (a hetjob's leader id).
    Creates the folder of the script's ``--output`` first (Slurm does not)."""
    for d in output_dirs(script_path):
        d.mkdir(parents=True, exist_ok=True)
    r = _sbatch_run(["--parsable", str(script_path)], timeout_s)
    if r.returncode != 0:
        raise SystemFailure(f"sbatch refused {script_path}: {r.stderr.strip() or r.stdout.strip()}")
    job_id = r.stdout.strip().split(";")[0]
    if not job_id.split("+")[0].isdigit():
        raise SystemFailure(f"sbatch printed no job id: {r.stdout.strip()!r}")
    return job_id


@dataclass(frozen=True, kw_only=True)
class JobOutcome:
    """How a submitted job ended: its state (the worst over hetjob components) and each component's."""

    job_id: str
    state: str
    components: tuple[tuple[str, str], ...]  # (Slurm id such as "17+1", state)

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED"


_FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL",
          "DEADLINE", "PREEMPTED")


def _client(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def job_states(job_id: str, *, timeout_s: float = 10.0) -> tuple[tuple[str, str], ...]:
    """``(id, state)`` of a job's allocations from ``sacct`` (``17`` or ``17+0``, ``17+1``, ...)."""
    r = _client(["sacct", "-n", "-P", "-X", "-j", str(job_id), "-o", "JobID,State"], timeout_s)
    if r is None or r.returncode != 0:
        return ()
    out = []
    for line in r.stdout.splitlines():
        jid, _, state = line.partition("|")
        jid = jid.strip()
        if jid == str(job_id) or jid.startswith(f"{job_id}+"):
            out.append((jid, (state.split() or ["UNKNOWN"])[0]))
    return tuple(out)


def wait(job_id: str, *, timeout_s: float = 600.0, poll_s: float = 1.0) -> JobOutcome:
    """Wait until the job has left the queue and accounting has a final state for every component.
    Raises SystemFailure when it is still running after ``timeout_s`` (it is not cancelled)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        states = job_states(job_id)
        if states and all(s in _FINAL for _, s in states):
            worst = next((s for _, s in states if s != "COMPLETED"), "COMPLETED")
            return JobOutcome(job_id=str(job_id), state=worst, components=states)
        if not states:
            q = _client(["squeue", "-h", "-j", str(job_id), "-o", "%i"], 10.0)
            gone = q is not None and q.returncode in (0, 1) and not q.stdout.strip()
            if gone and time.monotonic() > deadline - timeout_s + 5.0:
                # no accounting on this cluster: the job left the queue, its state is unknown
                return JobOutcome(job_id=str(job_id), state="UNKNOWN", components=())
        if time.monotonic() >= deadline:
            raise SystemFailure(f"job {job_id} did not finish within {timeout_s:g} s "
                                f"(last states: {dict(states) or 'unknown'}); it is still queued or running")
        time.sleep(poll_s)
