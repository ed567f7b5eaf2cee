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
  ``slurm:`` value. **Signal** and **requeue** are job-wide (site only, on the first
  component of a hetjob, with the job name, output file and working directory).
* **Container**: the site's ``slurm.container_runtime`` starts a partition's ``container``
  image: ``pyxis`` adds ``--container-image=IMAGE`` to the step (srun), ``apptainer`` runs
  ``apptainer exec [--nv|--rocm] IMAGE python``.
* **Environment**: the partition's ``module purge``, setup lines (each through a quoted
  ``eval``) and exported variables, as the lines a job runs before its tasks start.

Every value here was validated when the :class:`~memx_hpc.spec.Site` and its partitions were
built; what a caller adds (job name, output file, working directory, size) is checked here.
Pure: nothing is submitted, nothing is read from Slurm.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from ..shellsafe import setup_commands
from ..spec import Partition, Site

__all__ = ["SlurmOption", "Container", "SlurmRequest", "APPTAINER_GPU_FLAGS"]

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
    container: Container | None = None
    setup: tuple[str, ...] = ()  # shell lines that prepare the partition's environment

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
           job_wide: bool = True) -> "SlurmRequest":
        """The request of ``nodes`` x ``tasks_per_node`` ranks on ``partition`` of ``site``.
        ``job_wide`` False: a later hetjob component (no signal/requeue of its own)."""
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
            signal=site.signal if job_wide else None, requeue=site.requeue if job_wide else None,
            container=container, setup=_environment(p))

    # ------------------------------------------------------------------ sbatch

    def sbatch_options(self) -> tuple[SlurmOption, ...]:
        """The ``#SBATCH`` options, in the order scripts show them."""
        o = [SlurmOption(name=n, value=v) for n, v in (("job-name", self.job_name), ("output", self.output),
                                                        ("chdir", self.chdir)) if v is not None]
        o += [SlurmOption(name="partition", value=self.partition), SlurmOption(name="nodes", value=str(self.nodes)),
              SlurmOption(name="ntasks-per-node", value=str(self.tasks_per_node))]
        if self.gres is not None:
            o.append(SlurmOption(name="gres", value=self.gres))
        if self.cpus_per_task is not None:
            o.append(SlurmOption(name="cpus-per-task", value=str(self.cpus_per_task)))
        if self.mem_mib is not None:
            o.append(SlurmOption(name="mem", value=f"{self.mem_mib}M"))
        for name in ("account", "qos"):
            if getattr(self, name) is not None:
                o.append(SlurmOption(name=name, value=getattr(self, name)))
        o.append(SlurmOption(name="time", value=str(self.time_limit_min)))
        if self.exclusive:
            o.append(SlurmOption(name="exclusive"))
        if self.signal is not None:
            o.append(SlurmOption(name="signal", value=self.signal))
        if self.requeue is not None:
            o.append(SlurmOption(name="requeue" if self.requeue else "no-requeue"))
        return tuple(o)

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
        """``SlurmExecutor.update_parameters`` keywords for this request. submitit writes its
        own ``--signal=USR2@S`` (its handler listens on USR2): the site's signal gives S."""
        params: dict[str, Any] = {"partition": self.partition, "time": self.time_limit_min, "nodes": self.nodes,
                                  "ntasks_per_node": self.tasks_per_node}
        optional = {"job_name": self.job_name, "gres": self.gres, "cpus_per_task": self.cpus_per_task,
                    "mem": None if self.mem_mib is None else f"{self.mem_mib}M", "account": self.account,
                    "qos": self.qos}
        params.update({k: v for k, v in optional.items() if v is not None})
        if self.exclusive:
            params["exclusive"] = True
        if self.signal is not None and "@" in self.signal:
            params["signal_delay_s"] = int(self.signal.rsplit("@", 1)[1])
        if self.requeue is not None:
            params["additional_parameters"] = {"requeue" if self.requeue else "no_requeue": True}
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


def _mib(gib: float) -> int:
    """GiB -> whole MiB, rounded up (never less than asked; 0.5 -> 512, never 0). The rounding
    to 6 places first keeps 2.2 GiB (2252.8000000000002 MiB) from gaining a MiB."""
    return max(1, math.ceil(round(gib * 1024, 6)))


def _environment(p: Partition) -> tuple[str, ...]:
    """The lines that prepare ``p``'s environment: module purge, each setup line through a quoted
    ``eval`` (memx_hpc.shellsafe), each variable exported with its value quoted."""
    lines = (["module purge"] if p.module_purge else []) + list(p.setup)
    return tuple(setup_commands(lines) + [f"export {k}={shlex.quote(v)}" for k, v in p.env])
