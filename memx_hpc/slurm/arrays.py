"""Job arrays through submitit: submit a function over many arguments as one array, tell
their states, read their results. Knows Slurm and submitit, nothing of what the tasks do.

* **Executor.** ``site.scheduler``: ``slurm`` -> submitit's ``SlurmExecutor``; ``local``
  -> ``LocalExecutor``; ``auto`` -> Slurm when ``sinfo`` answers within a few seconds,
  else local (:func:`choose_scheduler`). Never ``AutoExecutor`` (it picks Slurm wherever
  ``sbatch`` exists). Executors are built at the edge, one per submission, so that one
  partition's parameters never leak into another's (``update_parameters`` keeps earlier
  ones).
* **Request.** What an array asks of Slurm is a :class:`~memx_hpc.slurm.request.SlurmRequest`
  (its submitit parameters, or the local executor's), the same object a rendered script's
  ``#SBATCH`` lines come from.
* **After submission.** :func:`reattach` rebuilds a job handle from its id and folder (a
  later process watching what an earlier one submitted); :func:`finished`, :func:`state`,
  :func:`result` and :func:`failure_reason` say how it went, :func:`is_oom` whether Slurm
  killed it for memory.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import SystemFailure
from ..spec import Site
from .request import SlurmRequest

__all__ = ["SCHEDULERS", "choose_scheduler", "submit_array", "reattach", "finished", "alive_or_done", "state",
           "is_oom", "result", "failure_reason"]

#: Where arrays run: a Slurm cluster, or subprocesses of this machine (submitit's LocalExecutor).
SCHEDULERS = ("slurm", "local")


def choose_scheduler(site: Site, *, timeout_s: float = 5.0) -> str:
    """``slurm`` or ``local`` for this site (``auto``: Slurm when ``sinfo`` answers)."""
    if site.scheduler in SCHEDULERS:
        return site.scheduler
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return "local"
    try:
        r = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=timeout_s,
                           stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "local"
    return "slurm" if r.returncode == 0 and r.stdout.strip() else "local"


def _executor(kind: str, folder: Path, python: str) -> Any:
    import submitit

    if kind == "slurm":
        try:
            return submitit.SlurmExecutor(folder=folder, python=python, max_num_timeout=0)
        except RuntimeError as e:
            raise SystemFailure(f"cannot use Slurm: {e}") from None
    return submitit.LocalExecutor(folder=folder, python=python)


def submit_array(fn: Callable[[Any], Any], args: Sequence[Any], *, request: SlurmRequest, kind: str, folder: Path,
                 python: str) -> list[Any]:
    """Submit ``fn(a)`` for every ``a`` of ``args`` as one array on ``kind`` (``slurm`` |
    ``local``), each task asking for ``request``, started by ``python`` (the partition's, as its
    nodes see it). Returns submitit's job handles, in the order of ``args``. ``fn`` must be a
    module-level function: submitit pickles it by name."""
    ex = _executor(kind, folder, request.submitit_python(python))
    ex.update_parameters(**(request.submitit_parameters() if kind == "slurm" else request.local_parameters()))
    try:
        return list(ex.map_array(fn, list(args)))
    except Exception as e:  # noqa: BLE001 - sbatch refusal, missing partition, ...
        raise SystemFailure(f"submitting {len(args)} task(s) to partition {request.partition} failed: "
                            f"{str(e).strip()[:500]}") from None


def reattach(kind: str, folder: str, job_id: str, ntasks: int) -> Any:
    """A handle of a job submitted earlier (by this process or another), from its id and folder."""
    if kind == "slurm":
        from submitit.slurm.slurm import SlurmJob

        return SlurmJob(folder=folder, job_id=job_id, tasks=tuple(range(ntasks)))
    from submitit.local.local import LocalJob

    return LocalJob(folder=folder, job_id=job_id, tasks=tuple(range(ntasks)))


def finished(job: Any, kind: str) -> bool:
    """Whether the job has ended (with a result or without one)."""
    if kind == "local" and getattr(job, "_process", None) is None:
        # re-attached local job: its result file is the only sign
        return job.paths.result_pickle.exists() or not _pid_alive(job)
    try:
        return bool(job.done())
    except Exception:  # noqa: BLE001 - a watcher hiccup: look again next round
        return False


def alive_or_done(kind: str, folder: str, job_id: str, ntasks: int) -> bool:
    """Whether a job submitted earlier can still give a result: always on Slurm (it keeps the
    job's state); locally only while its process runs or once its result file exists."""
    if kind != "local":
        return True
    job = reattach("local", folder, job_id, ntasks)
    return job.paths.result_pickle.exists() or _pid_alive(job)


def _pid_alive(job: Any) -> bool:
    try:
        pid = int(str(job.job_id).split("_")[0])
        os.kill(pid, 0)
        return True
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True


def state(job: Any) -> str:
    """The job's state as Slurm (or the local executor) names it; ``UNKNOWN`` when it cannot say."""
    try:
        return str(job.state)
    except Exception:  # noqa: BLE001 - sacct missing or slow: the state is unknown, not an error
        return "UNKNOWN"


def is_oom(job_state: str) -> bool:
    """Whether Slurm ended the job for memory (``OUT_OF_MEMORY``, ``OOM...``)."""
    return "OUT_OF_MEMORY" in job_state.upper() or job_state.upper().startswith("OOM")


def result(job: Any, ntasks: int) -> Any:
    """What the task returned: rank 0's for a multi-task job (each rank returns one).
    Raises what submitit raises for a task that ended without a result."""
    return job.results()[0] if ntasks > 1 else job.result()


_EXC_LINE = re.compile(r"^([\w.]+(?:Error|Exception|Failure|Interrupt|Exit))\b(.*)$")
_STATE = re.compile(r"\(state: ([A-Z_]+)")


def failure_reason(e: BaseException, job_state: str) -> str:
    """One line: the Slurm state and the exception the task ended with.

    submitit's FailedJobError carries the remote traceback (its last exception line is
    the cause); UncompletedJobError names the state and the end of the error stream."""
    text = str(e)
    m = _STATE.search(text)
    if m:
        job_state = m.group(1)
    lines = [ln.rstrip() for ln in text.splitlines()]
    exc = [ln for ln in lines if _EXC_LINE.match(ln.strip())]
    if exc:
        cause = exc[-1].strip()
    else:
        body = [ln.strip() for ln in lines if ln.strip() and not set(ln.strip()) <= {"-"}]
        cause = next((ln for ln in body[1:] if "srun:" not in ln), body[0] if body else "")
    return f"{job_state}: {type(e).__name__}: {cause[:300]}"
