"""What one job component asks of Slurm: the one place a partition becomes Slurm options.

A :class:`SlurmRequest` is built once per component (:meth:`SlurmRequest.of`: the site,
one of its partitions and the component's size) and yields everything Slurm is told
about that component, in each of the forms the project needs:

* :meth:`~SlurmRequest.sbatch_lines` / :meth:`~SlurmRequest.sbatch_options` -- the
  ``#SBATCH`` lines of a written script (``slurm/render.py``, the link campaign's jobs);
* :meth:`~SlurmRequest.submitit_parameters` -- the same request as parameters of
  submitit's ``SlurmExecutor`` (the layer campaign's job arrays; ``LocalExecutor`` gets
  :meth:`~SlurmRequest.local_parameters`);
* :meth:`~SlurmRequest.srun_options` and :meth:`~SlurmRequest.launcher` -- the step's own
  options and the command that starts the partition's Python (inside its container).

What goes in, and how:

* **GPUs**: ``--gres=gpu:TYPE:N`` with the partition's ``gres_type``, untyped
  ``--gres=gpu:N`` otherwise; CPU partitions without a GRES type ask for none. One rank per
  device, so N is the tasks per node.
* **Memory**: ``mem_per_node_gib`` as ``--mem`` in MiB, rounded up (0.5 GiB is
  ``--mem=512M``): a whole-GiB value truncated from 0.5 would be ``--mem=0``, which Slurm
  reads as all of the node's memory.
* **Account, QoS, time limit, exclusive**: the partition's value, else the site's
  ``slurm:`` value. **Signal** and **requeue** are job-wide (the site's, or what a run that
  continues itself asks for, on the first component of a hetjob, with the job name, output
  file, working directory and ``--open-mode``).
* **Container**: the site's ``slurm.container_runtime`` starts a partition's ``container``
  image: ``pyxis`` adds ``--container-image=IMAGE`` to the step (srun), ``apptainer`` runs
  ``apptainer exec [--nv|--rocm] IMAGE python``.
* **Environment**: the partition's ``module purge``, setup lines (each through a quoted
  ``eval``) and exported variables (:class:`PartitionEnvironment`, which the rendered
  training script reads too), as the lines a job runs before its tasks start.

Every value here was validated when the :class:`~memx_hpc.spec.Site` and its partitions were
built; what a caller adds (job name, output file, working directory, size) is checked here.
Pure: nothing is submitted, nothing is read from Slurm.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import SpecError
from ..shellsafe import setup_commands
from ..spec import Partition, Site

__all__ = ["SlurmOption", "Container", "PartitionEnvironment", "SlurmRequest", "APPTAINER_GPU_FLAGS"]

#: apptainer's flag that brings a vendor's GPUs and driver libraries into the container.
APPTAINER_GPU_FLAGS = {"nvidia": ("--nv",), "amd": ("--rocm",)}

# the job name is a Slurm name (sbatch parses #SBATCH lines itself: no spaces, no newline)
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
_CONTROL = ("\n", "\r", "\x00")


@dataclass(frozen=True, kw_only=True)
class SlurmOption:
    """One long option of sbatch or srun: ``--name=value``, or ``--name`` when value is None."""

    name: str
    value: str | None = None

    def word(self) -> str:
        """The option as one shell word (the value quoted)."""
        return f"--{self.name}" if self.value is None else f"--{self.name}={shlex.quote(self.value)}"


@dataclass(frozen=True, kw_only=True)
class Container:
    """The image a partition's tasks run in, and the runtime that starts it."""

    runtime: str  # pyxis | apptainer
    image: str
    gpu_flags: tuple[str, ...] = ()  # apptainer's --nv / --rocm


@dataclass(frozen=True, kw_only=True)
class PartitionEnvironment:
    """What prepares a partition's tasks, assembled once from its site entry for every script
    that runs there (the rendered training job, submitit's arrays, the link campaign's jobs):
    its shell lines (``module purge`` first where the partition asks for it, then its setup
    lines, shell code by contract) and its exported variables."""

    setup: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, p: Partition) -> "PartitionEnvironment":
        return cls(setup=(("module purge",) if p.module_purge else ()) + tuple(p.setup), env=tuple(p.env))

    def script_lines(self) -> tuple[str, ...]:
        """The lines a job runs before its tasks start: each setup line through a quoted
        ``eval`` (memx_hpc.shellsafe), each variable exported with its value quoted."""
        return tuple(setup_commands(self.setup) + [f"export {k}={shlex.quote(v)}" for k, v in self.env])


def _line(value: str | None, field: str) -> str | None:
    if value is not None and any(c in value for c in _CONTROL):
        raise SpecError("must be a single line (no newline, carriage return or NUL): it goes into an #SBATCH "
                        "line", field=field, found=value)
    return value


@dataclass(frozen=True, kw_only=True)
class SlurmRequest:
    """One job component's request to Slurm (see the module docstring for each field's source)."""

    partition: str
    nodes: int
    tasks_per_node: int
    time_limit_min: int
    gres: str | None = None  # gpu:TYPE:N, gpu:N, or None (no devices asked for)
    cpus_per_task: int | None = None
    mem_mib: int | None = None
    account: str | None = None
    qos: str | None = None
    exclusive: bool = False
    # job-wide: set on a plain job and on the first component of a hetjob only
    job_name: str | None = None
    output: str | None = None
    chdir: str | None = None
    signal: str | None = None
    requeue: bool | None = None
    open_mode: str | None = None  # append | truncate (Slurm's default: truncate)
    container: Container | None = None
    environment: PartitionEnvironment = PartitionEnvironment()

    @property
    def setup(self) -> tuple[str, ...]:
        """The shell lines that prepare the partition's environment (:class:`PartitionEnvironment`)."""
        return self.environment.script_lines()

    def __post_init__(self) -> None:
        for name in ("nodes", "tasks_per_node"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SpecError("must be a whole number >= 1", field=name, found=v)
        if self.job_name is not None and not _JOB_NAME.fullmatch(self.job_name):
            raise SpecError("not a Slurm name: it goes into an #SBATCH line, which sbatch parses itself",
                            field="job name", found=self.job_name, allowed="letters, digits, '_', '.', '+', '-'")
        _line(self.output, "output")
        _line(self.chdir, "workdir")

    @classmethod
    def of(cls, site: Site, partition: Partition | str, *, nodes: int, tasks_per_node: int,
           job_name: str | None = None, output: str | None = None, chdir: str | None = None,
           job_wide: bool = True, signal: Any = ..., requeue: Any = ...,
           open_mode: str | None = None) -> "SlurmRequest":
        """The request of ``nodes`` x ``tasks_per_node`` ranks on ``partition`` of ``site``.
        ``job_wide`` False: a later hetjob component (no signal/requeue of its own).
        ``signal`` / ``requeue`` given: what the job asks instead of the site's values (a run
        that continues itself: memx_hpc/slurm/render.py)."""
        p = site.partition(partition) if isinstance(partition, str) else partition
        vendor = site.gpu(p.gpu_type).vendor
        if p.gres_type is not None:
            gres: str | None = f"gpu:{p.gres_type}:{tasks_per_node}"
        else:
            gres = None if vendor == "cpu" else f"gpu:{tasks_per_node}"
        container = None
        if p.container is not None:
            runtime = str(site.container_runtime)  # the Site refuses a container without a runtime
            container = Container(runtime=runtime, image=p.container,
                                  gpu_flags=APPTAINER_GPU_FLAGS.get(vendor, ()) if runtime == "apptainer" else ())
        return cls(
            partition=p.name, nodes=nodes, tasks_per_node=tasks_per_node,
            time_limit_min=p.time_limit_min or site.time_limit_min, gres=gres, cpus_per_task=p.cpus_per_task,
            mem_mib=None if p.mem_per_node_gib is None else _mib(p.mem_per_node_gib),
            account=p.account or site.account, qos=p.qos or site.qos,
            exclusive=site.exclusive if p.exclusive is None else p.exclusive,
            job_name=job_name, output=output, chdir=chdir,
            signal=(site.signal if signal is ... else signal) if job_wide else None,
            requeue=(site.requeue if requeue is ... else requeue) if job_wide else None,
            open_mode=open_mode if job_wide else None,
            container=container, environment=PartitionEnvironment.of(p))

    # ------------------------------------------------------------------ sbatch

    def _slurm_options(self) -> list[tuple[_SlurmName, str, Any]]:
        """``(table row, Slurm's option name, value)`` of every option this request sets, in
        the order scripts show them (:data:`_SLURM_NAMES`; value True: a bare flag)."""
        out = []
        for row in _SLURM_NAMES:
            v = getattr(self, row.field)
            if v is None:
                continue
            name, value = row.slurm(v)
            if value is not None:
                out.append((row, name, value))
        return out

    def sbatch_options(self) -> tuple[SlurmOption, ...]:
        """The ``#SBATCH`` options, in the order scripts show them."""
        return tuple(SlurmOption(name=name, value=None if value is True else str(value))
                     for _, name, value in self._slurm_options())

    def sbatch_lines(self) -> list[str]:
        return [f"#SBATCH {opt.word()}" for opt in self.sbatch_options()]

    # ------------------------------------------------------------------ the step

    def srun_options(self) -> tuple[SlurmOption, ...]:
        """This component's options of the step that starts its ranks (srun does not inherit
        ``--cpus-per-task`` from the allocation since Slurm 22.05)."""
        o = [SlurmOption(name="nodes", value=str(self.nodes)),
             SlurmOption(name="ntasks-per-node", value=str(self.tasks_per_node))]
        if self.cpus_per_task is not None:
            o.append(SlurmOption(name="cpus-per-task", value=str(self.cpus_per_task)))
        if self.container is not None and self.container.runtime == "pyxis":
            o.append(SlurmOption(name="container-image", value=self.container.image))
        return tuple(o)

    def launcher(self, python: str) -> tuple[str, ...]:
        """The words that start ``python`` on this component's nodes (inside an apptainer
        image; pyxis puts the whole step into the image through :meth:`srun_options`)."""
        c = self.container
        if c is not None and c.runtime == "apptainer":
            return ("apptainer", "exec", *c.gpu_flags, c.image, python)
        return (python,)

    # ------------------------------------------------------------------ submitit

    def submitit_parameters(self) -> dict[str, Any]:
        """``SlurmExecutor.update_parameters`` keywords for this request, from the same name
        table as the ``#SBATCH`` lines: submitit's keyword is Slurm's option name with ``_`` for
        ``-`` (its ``_as_sbatch_flag`` turns it back). submitit writes its own output file,
        working directory and ``--signal=USR2@S`` (its handler listens on USR2): the site's
        signal gives S."""
        params: dict[str, Any] = {}
        for row, name, value in self._slurm_options():
            if row.submitit == "keyword":
                params[name.replace("-", "_")] = value
            elif row.submitit == "additional":
                params.setdefault("additional_parameters", {})[name.replace("-", "_")] = value
            elif row.submitit == "signal" and "@" in value:
                params["signal_delay_s"] = int(value.rsplit("@", 1)[1])
        if self.setup:
            params["setup"] = list(self.setup)
        srun = [opt.word() for opt in self.srun_options() if opt.name == "container-image"]
        if srun:
            params["srun_args"] = srun
        return params

    def local_parameters(self) -> dict[str, Any]:
        """``LocalExecutor.update_parameters`` keywords: one machine, the time limit, the ranks."""
        params: dict[str, Any] = {"timeout_min": self.time_limit_min, "tasks_per_node": self.tasks_per_node}
        if self.setup:
            params["setup"] = list(self.setup)
        return params

    def submitit_python(self, python: str) -> str:
        """submitit's ``python`` argument: written verbatim into a command line, so quoted here."""
        return " ".join(shlex.quote(w) for w in self.launcher(python))


@dataclass(frozen=True, kw_only=True)
class _SlurmName:
    """One row of the name table: a :class:`SlurmRequest` field, the Slurm option it becomes
    (``slurm``: the field's value -> ``(option name, value)``; value True: a bare flag, None:
    not asked) and how submitit takes it: ``keyword`` (its parameter of the same name),
    ``additional`` (through ``additional_parameters``), ``signal`` (its ``signal_delay_s``) or
    None (submitit sets it itself)."""

    field: str
    slurm: Callable[[Any], tuple[str, Any]]
    submitit: str | None = "keyword"


def _as(name: str) -> Callable[[Any], tuple[str, Any]]:
    return lambda v: (name, v)


#: The one table of what a request tells Slurm, in the order scripts show it: both the
#: ``#SBATCH`` lines and submitit's parameters are read from it.
_SLURM_NAMES = (
    _SlurmName(field="job_name", slurm=_as("job-name")),
    _SlurmName(field="output", slurm=_as("output"), submitit=None),
    _SlurmName(field="chdir", slurm=_as("chdir"), submitit=None),
    _SlurmName(field="partition", slurm=_as("partition")),
    _SlurmName(field="nodes", slurm=_as("nodes")),
    _SlurmName(field="tasks_per_node", slurm=_as("ntasks-per-node")),
    _SlurmName(field="gres", slurm=_as("gres")),
    _SlurmName(field="cpus_per_task", slurm=_as("cpus-per-task")),
    _SlurmName(field="mem_mib", slurm=lambda v: ("mem", f"{v}M")),
    _SlurmName(field="account", slurm=_as("account")),
    _SlurmName(field="qos", slurm=_as("qos")),
    _SlurmName(field="time_limit_min", slurm=_as("time")),
    _SlurmName(field="exclusive", slurm=lambda v: ("exclusive", True if v else None)),
    _SlurmName(field="signal", slurm=_as("signal"), submitit="signal"),
    _SlurmName(field="requeue", slurm=lambda v: ("requeue" if v else "no-requeue", True), submitit="additional"),
    _SlurmName(field="open_mode", slurm=_as("open-mode"), submitit="additional"),
)


def _mib(gib: float) -> int:
    """GiB -> whole MiB, rounded up (never less than asked; 0.5 -> 512, never 0). The rounding
    to 6 places first keeps 2.2 GiB (2252.8000000000002 MiB) from gaining a MiB."""
    return max(1, math.ceil(round(gib * 1024, 6)))
