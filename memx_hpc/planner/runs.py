"""Where a training run stands: its segments, its checkpoint, and why it stopped.

A rendered run that saves checkpoints continues itself from one Slurm job (a *segment*) to the
next (memx_hpc/slurm/render.py, :class:`~memx_hpc.slurm.render.Continuation`). Its run folder
holds what the script wrote:

* ``segments.jsonl``: one JSON line per event, ``start`` when a segment begins and ``end`` when
  it ends, with the segment number, Slurm job id, restart count (a requeued job), checkpoint
  iteration, training length in iterations, the step's exit code, the outcome (``running``,
  ``continued``, ``complete``, ``no-progress``, ``max-segments``, ``terminated``,
  ``submit-failed``) and the next segment's job id. No user text is in it;
* ``checkpoint_dir.txt``: the checkpoint folder, whose tracker
  (``latest_checkpointed_iteration.txt``) is read live.

:func:`run_status` reads them -- bounded: the last :data:`MAX_STATE_BYTES` of the state file,
malformed lines skipped and counted -- and asks ``sacct`` for each segment's state where Slurm
answers. It takes the run folder, the checkpoint folder, or the rendered script.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import SpecError
from ..slurm.render import CHECKPOINT_POINTER, STATE_FILE, TRACKER_FILE

__all__ = ["Segment", "RunStatus", "run_status", "read_segments", "MAX_STATE_BYTES", "OUTCOMES", "SiteStatus",
           "site_status"]

#: the most of a state file that is read (its end): a run of 1000 segments writes about 500 kB
MAX_STATE_BYTES = 1 << 20
#: what the end of a segment can say, and what it means for the run
OUTCOMES = {
    "running": "running",
    "continued": "continued: the next segment was submitted",
    "complete": "training is complete",
    "no-progress": "stopped: the segment wrote no newer checkpoint",
    "max-segments": "stopped: checkpoint.max_segments reached",
    "terminated": "ended by Slurm (scancel, preemption, the time limit or a node failure)",
    "submit-failed": "stopped: sbatch did not take the next segment",
}


@dataclass(frozen=True, kw_only=True)
class Segment:
    """One Slurm job of a run (a requeued job starts a new segment record with ``restart`` + 1)."""

    segment: int
    job_id: str
    restart: int
    start_iteration: int | None
    end_iteration: int | None
    outcome: str  # OUTCOMES
    exit_code: int | None
    next_job_id: str | None
    started: str | None
    ended: str | None
    slurm_state: str | None = None  # sacct's, where it answers


@dataclass(frozen=True, kw_only=True)
class RunStatus:
    """What ``memx-hpc status RUN`` shows."""

    run_dir: str | None
    checkpoint_dir: str | None
    checkpoint_iteration: int | None  # the tracker's, None: no checkpoint yet (or no folder known)
    target_iters: int | None
    segments: tuple[Segment, ...]
    state: str  # running | waiting | complete | stopped | unknown
    why: str  # one line for people
    skipped_lines: int = 0  # malformed state lines left out


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def read_segments(state_file: Path) -> tuple[list[dict], int]:
    """The state file's events, oldest first (its last MAX_STATE_BYTES), and how many lines were
    left out as malformed."""
    with open(state_file, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - MAX_STATE_BYTES))
        data = f.read(MAX_STATE_BYTES)
    lines = data.decode("utf-8", "replace").splitlines()
    if size > MAX_STATE_BYTES and lines:
        lines = lines[1:]  # the first line read may be cut
    events, bad = [], 0
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if not isinstance(e, dict) or e.get("event") not in ("start", "end") or e.get("outcome") not in OUTCOMES:
            bad += 1
            continue
        events.append(e)
    return events, bad


def _segments(events: list[dict]) -> list[Segment]:
    """Start and end events paired by (job id, restart)."""
    out: list[Segment] = []
    open_at: dict[tuple[str, int], int] = {}
    for e in events:
        key = (str(e.get("job_id", "")), _int(e.get("restart")) or 0)
        it = _int(e.get("iteration"))
        if e["event"] == "start":
            open_at[key] = len(out)
            out.append(Segment(segment=_int(e.get("segment")) or 0, job_id=key[0], restart=key[1],
                               start_iteration=it, end_iteration=None, outcome="running", exit_code=None,
                               next_job_id=None, started=str(e.get("time", "")) or None, ended=None))
            continue
        done = dict(end_iteration=it, outcome=e["outcome"], exit_code=_int(e.get("exit_code")),
                    next_job_id=str(e.get("next_job_id") or "") or None, ended=str(e.get("time", "")) or None)
        if key in open_at:
            k = open_at.pop(key)
            out[k] = replace(out[k], **done)
        else:  # ended at its first check (training was complete already)
            out.append(Segment(segment=_int(e.get("segment")) or 0, job_id=key[0], restart=key[1],
                               start_iteration=it, started=None, **done))
    return out


def _tracker(ckpt: Path) -> int | None:
    try:
        text = (ckpt / TRACKER_FILE).read_text(encoding="utf-8", errors="replace")[:64].strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _from_script(path: Path) -> tuple[Path | None, Path | None]:
    """The run and checkpoint folders a rendered script names (its MEMX_RUN_DIR / MEMX_CKPT_DIR)."""
    run = ckpt = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for _, line in zip(range(20000), f):
            for name in ("MEMX_RUN_DIR=", "MEMX_CKPT_DIR="):
                if line.startswith(name):
                    try:
                        words = shlex.split(line[len(name):])
                    except ValueError:
                        continue
                    if words:
                        if name == "MEMX_RUN_DIR=":
                            run = Path(words[0])
                        else:
                            ckpt = Path(words[0])
    if run is None:
        raise SpecError("this script does not continue itself (its job saves no checkpoints), so it keeps no run "
                        "state", field="RUN", found=str(path),
                        allowed="a run folder, a checkpoint folder, or a script rendered with checkpoint.save")
    return run, ckpt


def _slurm_states(segments: list[Segment]) -> list[Segment]:
    from ..slurm.local_cluster import slurm_available
    from ..slurm.submit import job_states

    if not segments or not slurm_available(timeout=5.0):
        return segments
    out = []
    for s in segments[-50:]:  # the recent ones: one sacct call each
        states = job_states(s.job_id) if s.job_id else ()
        first = next((st for jid, st in states if jid in (s.job_id, f"{s.job_id}+0")), None)
        out.append(replace(s, slurm_state=first))
    return segments[:-50] + out


def run_status(path: str | Path, *, ask_slurm: bool = True) -> RunStatus:
    """Where the run at ``path`` (run folder, checkpoint folder or rendered script) stands.
    SpecError (exit 1) when ``path`` is none of these."""
    p = Path(path)
    run_dir = ckpt = None
    if p.is_file():
        run_dir, ckpt = _from_script(p)
    elif p.is_dir():
        if (p / STATE_FILE).is_file() or (p / CHECKPOINT_POINTER).is_file():
            run_dir = p
        elif (p / TRACKER_FILE).is_file():
            ckpt = p
        else:
            raise SpecError(f"neither a run folder ({STATE_FILE}) nor a checkpoint folder ({TRACKER_FILE})",
                            field="RUN", found=str(p))
    else:
        raise SpecError("no such file or folder", field="RUN", found=str(p))
    if run_dir is not None and ckpt is None:
        try:
            line = (run_dir / CHECKPOINT_POINTER).read_text(encoding="utf-8", errors="replace")[:4096].strip()
            ckpt = Path(line) if line and "\n" not in line else None
        except OSError:
            ckpt = None
    events, bad = ([], 0)
    if run_dir is not None and (run_dir / STATE_FILE).is_file():
        events, bad = read_segments(run_dir / STATE_FILE)
    segs = _segments(events)
    if ask_slurm:
        segs = _slurm_states(segs)
    it = _tracker(ckpt) if ckpt is not None else None
    target = next((_int(e.get("target_iters")) for e in reversed(events) if _int(e.get("target_iters"))), None)
    state, why = _verdict(segs, it, target)
    return RunStatus(run_dir=str(run_dir) if run_dir else None, checkpoint_dir=str(ckpt) if ckpt else None,
                     checkpoint_iteration=it, target_iters=target, segments=tuple(segs), state=state, why=why,
                     skipped_lines=bad)


_ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
          "DEADLINE")


def _verdict(segs: list[Segment], it: int | None, target: int | None) -> tuple[str, str]:
    """The run's state and one line saying why."""
    at = f"checkpoint iteration {it if it is not None else 0}" + (f" of {target}" if target else "")
    if not segs:
        if it is not None and target is not None and it >= target:
            return "complete", f"training is complete: {at}"
        return "unknown", f"{at}; no segment recorded (a run folder of a continuing run has {STATE_FILE})"
    last = segs[-1]
    if last.outcome == "complete":
        return "complete", f"training is complete: {at}, after {last.segment} segment(s)"
    if last.outcome == "continued":
        return "waiting", (f"{at}; segment {last.segment} (job {last.job_id}) ended and submitted segment "
                           f"{last.segment + 1} as job {last.next_job_id}")
    if last.outcome == "running":
        if last.slurm_state in _ENDED:
            return "stopped", (f"{at}; job {last.job_id} of segment {last.segment} ended {last.slurm_state} without "
                               f"its end record (killed before its shell could write it); submit the script again "
                               f"to go on")
        return "running", f"{at}; segment {last.segment} is job {last.job_id}" + (
            f" ({last.slurm_state})" if last.slurm_state else "")
    if last.outcome == "terminated":
        return "stopped", (f"{at}; job {last.job_id} of segment {last.segment} was ended by Slurm (scancel, "
                           f"preemption, the time limit or a node failure); with --requeue a preempted job starts "
                           f"again by itself, otherwise submit the script again to go on")
    if last.outcome == "no-progress":
        return "stopped", (f"{at}; segment {last.segment} (job {last.job_id}) wrote no checkpoint newer than "
                           f"iteration {last.start_iteration} (step exit code {last.exit_code}): see its log, fix "
                           f"the cause and submit the script again")
    if last.outcome == "max-segments":
        return "stopped", f"{at}; the run reached checkpoint.max_segments ({last.segment} segments)"
    return "stopped", f"{at}; sbatch did not take segment {last.segment + 1}: submit the script again to go on"


# --------------------------------------------------------------------------- what is in place for a site


@dataclass(frozen=True, kw_only=True)
class SiteStatus:
    """What a plan on ``site`` would start from (``memx-hpc status --site``): where the store,
    the prediction cache and the predictor are (by the rule plan and search use), whether
    Slurm is installed and answers (and which of the site's partitions ``sinfo`` shows), the
    store's summary per GPU type, the site's end-to-end runs, and per GPU type of the site
    where its numbers would come from (:func:`memx_hpc.search.report.coverage` rows)."""

    site: str
    store: Path
    cache: Path
    predictor: Path | None  # the saved predictor, when there is one
    slurm_installed: bool
    slurm_answers: bool
    partitions_seen: dict[str, bool]  # site partition -> shown by sinfo (empty when Slurm does not answer)
    store_summary: list[dict]
    e2e_runs: int
    site_gpu_types: list[dict]


def site_status(site, store: str | Path | None = None) -> SiteStatus:
    """What is in place for ``site`` (a :class:`~memx_hpc.spec.Site` or its file); ``store``:
    the profile store (default: the site's, then ``$MEMX_STORE``, as plan and search choose)."""
    import shutil

    from ..model.assemble import store_paths
    from ..search.report import coverage
    from ..slurm.local_cluster import partitions, slurm_available
    from ..spec import Site, load_site

    site = site if isinstance(site, Site) else load_site(site)
    paths = store_paths(site, store)
    installed = shutil.which("sbatch") is not None
    up = slurm_available() if installed else False
    seen: dict[str, bool] = {}
    if up:
        found = partitions()
        seen = {p.name: (p.name in found) for p in site.partitions}
    summary: list[dict] = []
    records: list = []
    if paths.store.exists():
        from ..profile.store import ProfileStore

        st = ProfileStore(paths.store)
        summary = st.summary()
        records = st.e2e_records(site=site.name)
    return SiteStatus(site=site.name, store=paths.store, cache=paths.cache,
                      predictor=paths.predictor if paths.predictor.exists() else None, slurm_installed=installed,
                      slurm_answers=up, partitions_seen=seen, store_summary=summary, e2e_runs=len(records),
                      site_gpu_types=coverage(site, summary, records))
