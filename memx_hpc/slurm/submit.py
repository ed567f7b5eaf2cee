"""Acting on a written sbatch script: check it, ask Slurm about it, submit it, wait for it.

What describes a job (``slurm/render.py``, ``slurm/request.py``) is pure; this module is
where scripts meet the file system and Slurm's client commands. The path every caller
takes, once: :func:`launch` writes the script, checks it with ``bash -n``, creates its log
folder, asks ``sbatch --test-only`` where wanted (and Slurm answers), and submits it unless
Slurm said it would not run it. The steps are also here on their own: :func:`write_script`,
:func:`check_syntax`, :func:`test_only`, :func:`submit`, :func:`wait` (until accounting
has a final state for every component), :func:`job_states`, :func:`cancel`.

Every client command runs with a timeout; no answer, no client on PATH, or a refusal is a
:class:`~memx_hpc.errors.SystemFailure` (exit 2) that names the script or the job.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecError, SystemFailure

__all__ = ["TEST_ONLY_MODES", "TestOnly", "Launch", "JobOutcome", "launch", "write_script", "check_syntax",
           "test_only", "submit", "output_dirs", "make_output_dirs", "job_states", "wait", "cancel", "FINAL_STATES"]

#: ``launch(test_only=...)``: always ask Slurm, ask when it answers (``sinfo``), or never.
TEST_ONLY_MODES = ("always", "auto", "never")
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL",
                "DEADLINE", "PREEMPTED")


@dataclass(frozen=True, kw_only=True)
class TestOnly:
    """The verdict of ``sbatch --test-only``: Slurm prints it on stderr."""

    __test__ = False  # not a pytest class

    accepted: bool
    message: str


@dataclass(frozen=True, kw_only=True)
class Launch:
    """What :func:`launch` did: the checked script, Slurm's verdict (None: not asked, or Slurm
    did not answer) and the job id (None: not submitted)."""

    script: Path
    test_only: TestOnly | None
    job_id: str | None


@dataclass(frozen=True, kw_only=True)
class JobOutcome:
    """How a submitted job ended: its state (the worst over hetjob components) and each component's."""

    job_id: str
    state: str
    components: tuple[tuple[str, str], ...]  # (Slurm id such as "17+1", state)

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED"


# --------------------------------------------------------------------------- render -> check -> submit


def launch(text: str, path: str | Path, *, test_only_when: str = "never", submit_job: bool = False,
           timeout_s: float = 60.0) -> Launch:
    """Write ``text`` to ``path``, check it with ``bash -n``, ask ``sbatch --test-only`` as
    ``test_only_when`` says (:data:`TEST_ONLY_MODES`), and, with ``submit_job``, submit it --
    unless Slurm said it would not accept it (the verdict then says why; nothing is submitted)."""
    if test_only_when not in TEST_ONLY_MODES:
        raise SpecError("not an allowed value", field="test_only_when", found=test_only_when,
                        allowed=", ".join(TEST_ONLY_MODES))
    script = write_script(path, text)
    make_output_dirs(script)
    verdict = None
    if test_only_when == "always" or (test_only_when == "auto" and _slurm_answers()):
        verdict = test_only(script)
    job_id = None
    if submit_job and (verdict is None or verdict.accepted):
        job_id = submit(script, timeout_s=timeout_s)
    return Launch(script=script, test_only=verdict, job_id=job_id)


def _slurm_answers() -> bool:
    from .local_cluster import slurm_available

    return slurm_available(timeout=5.0)


def write_script(path: str | Path, text: str) -> Path:
    """Write a script (its folder made first) and check it with ``bash -n``."""
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    except OSError as e:
        raise SystemFailure(f"{out}: cannot write the script: {e.strerror or e}") from None
    check_syntax(out)
    return out


def check_syntax(script_path: str | Path) -> None:
    """``bash -n`` on the script; SystemFailure with bash's message when it does not parse."""
    try:
        r = subprocess.run(["bash", "-n", str(script_path)], capture_output=True, text=True, timeout=30,
                           stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SystemFailure(f"could not run bash -n: {e}") from None
    if r.returncode != 0:
        raise SystemFailure(f"bash -n rejects {script_path}: {r.stderr.strip()}")


# --------------------------------------------------------------------------- sbatch


def _sbatch() -> str:
    exe = shutil.which("sbatch")
    if exe is None:
        raise SystemFailure("sbatch is not on PATH: Slurm's client commands are needed to submit")
    return exe


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


test_only.__test__ = False  # type: ignore[attr-defined]  # not a pytest test when imported by name


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


def submit(script_path: str | Path, *, timeout_s: float = 60.0) -> str:
    """Submit the script with ``sbatch``; returns the job id (a hetjob's leader id).
    Creates the folder of the script's ``--output`` first (Slurm does not)."""
    make_output_dirs(script_path)
    r = _sbatch_run(["--parsable", str(script_path)], timeout_s)
    if r.returncode != 0:
        raise SystemFailure(f"sbatch refused {script_path}: {r.stderr.strip() or r.stdout.strip()}")
    job_id = r.stdout.strip().split(";")[0]
    if not job_id.split("+")[0].isdigit():
        raise SystemFailure(f"sbatch printed no job id: {r.stdout.strip()!r}")
    return job_id


def make_output_dirs(script_path: str | Path) -> None:
    """Create the script's log folders (:func:`output_dirs`); SystemFailure naming one that cannot be."""
    for d in output_dirs(script_path):
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SystemFailure(f"{d}: cannot create the job's log folder: {e.strerror or e}") from None


# --------------------------------------------------------------------------- after submission


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
    start = time.monotonic()
    deadline = start + timeout_s
    while True:
        states = job_states(job_id)
        if states and all(s in FINAL_STATES for _, s in states):
            worst = next((s for _, s in states if s != "COMPLETED"), "COMPLETED")
            return JobOutcome(job_id=str(job_id), state=worst, components=states)
        if not states:
            q = _client(["squeue", "-h", "-j", str(job_id), "-o", "%i"], 10.0)
            gone = q is not None and q.returncode in (0, 1) and not q.stdout.strip()
            if gone and time.monotonic() > start + 5.0:
                # no accounting on this cluster: the job left the queue, its state is unknown
                return JobOutcome(job_id=str(job_id), state="UNKNOWN", components=())
        if time.monotonic() >= deadline:
            raise SystemFailure(f"job {job_id} did not finish within {timeout_s:g} s "
                                f"(last states: {dict(states) or 'unknown'}); it is still queued or running")
        time.sleep(poll_s)


def cancel(job_id: str) -> None:
    """``scancel`` the job (best effort: a job that already ended is no error)."""
    _client(["scancel", str(job_id)], 10.0)
