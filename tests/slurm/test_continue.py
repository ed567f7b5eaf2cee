"""A run that continues itself on the local Slurm: a cross-partition hetjob (the project's entry)
trained on a corpus prepared here, with checkpoints at every iteration. Each segment gets Slurm's
time-limit warning as soon as it has written a new checkpoint -- ``scancel --batch --signal=USR1``,
what ``#SBATCH --signal=B:USR1@S`` delivers to the batch shell S seconds before the limit -- saves,
and submits its own continuation, until train_iters: at least three segments, with the losses of an
uninterrupted run (rel. 1e-5) and the TensorBoard events of every iteration. A segment that fails
without a new checkpoint ends the chain with a message. ``memx-hpc status`` follows the run.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from memx_hpc.planfile import load_plan
from memx_hpc.planner import run_status
from memx_hpc.slurm import render as rs
from memx_hpc.slurm import submit as sb
from memx_hpc.spec import job_from_mapping, load_site
from memx_hpc.train.logs import parse_log

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ITERS = 8
TIMEOUT_S = 240.0


def _job(prefix: str, tok_dir: Path, ckpt: Path, name: str):
    return job_from_mapping({
        "name": name, "model": "tiny-gpt", "global_batch_size": 8, "precision": "fp32",
        "train_iters": ITERS, "log_interval": 1,
        "data": {"paths": [prefix], "tokenizer": {"type": "HuggingFaceTokenizer", "model": str(tok_dir)},
                 "split": "100,0,0"},
        "lr_schedule": {"lr": 1.0e-3, "min_lr": 1.0e-4, "decay_style": "cosine", "warmup_iters": 1},
        "checkpoint": {"save": str(ckpt), "interval": 1}})


def _script(tmp: Path, job, name: str) -> Path:
    plan = load_plan(ROOT / "tests" / "golden" / "plans" / "local-pp2-a100-mi250.json")
    site = load_site(ROOT / "site_configs" / "local.yaml")
    return sb.write_script(tmp / f"{name}.sbatch", rs.render(plan, site, job, log_dir=str(tmp), workdir=str(ROOT),
                                                             job_name=name))


def _events(run_dir: Path) -> list[dict]:
    f = run_dir / "segments.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


def _tracker(ck: Path) -> int:
    t = ck / "latest_checkpointed_iteration.txt"
    return int(t.read_text().strip()) if t.exists() else 0


def _losses(tmp: Path, name: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for log in sorted(tmp.glob(f"{name}-*.out"), key=lambda p: int(p.stem.rsplit("-", 1)[1])):
        out.update({r.iteration: r.lm_loss for r in parse_log(log.read_text()).iterations})
    return out


def _logs(tmp: Path, name: str) -> str:
    return "\n".join(p.read_text()[-3000:] for p in sorted(tmp.glob(f"{name}-*.out")))


def _scalars(folder: Path) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[int, float] = {}
    for f in sorted(folder.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime):
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        if "lm loss" in acc.Tags()["scalars"]:
            out.update({e.step: e.value for e in acc.Scalars("lm loss")})
    return out


def test_a_run_continues_itself_through_segments_with_the_losses_of_an_uninterrupted_run(
        tmp_path: Path, tiny_corpus: tuple[str, Path]) -> None:
    prefix, tok_dir = tiny_corpus

    # uninterrupted: one segment that completes
    whole = _script(tmp_path, _job(prefix, tok_dir, tmp_path / "ck-whole", "memx-whole"), "memx-whole")
    job_id = sb.submit(whole)
    assert sb.wait(job_id, timeout_s=TIMEOUT_S).ok, _logs(tmp_path, "memx-whole")
    ref = _losses(tmp_path, "memx-whole")
    assert sorted(ref) == list(range(1, ITERS + 1))
    assert [e["outcome"] for e in _events(tmp_path / "memx-whole")] == ["running", "complete"]

    # continuing: every segment is warned once it has written a new checkpoint
    ck, run_dir = tmp_path / "ck", tmp_path / "memx-cont"
    script = _script(tmp_path, _job(prefix, tok_dir, ck, "memx-cont"), "memx-cont")
    text = script.read_text()
    assert "#SBATCH --signal=B:USR1@" in text and "#SBATCH --requeue" in text
    job_id = sb.submit(script)
    deadline = time.monotonic() + TIMEOUT_S
    warned: set[str] = set()
    while time.monotonic() < deadline:
        ev = _events(run_dir)
        if ev and ev[-1]["outcome"] == "complete":
            break
        assert not ev or ev[-1]["outcome"] in ("running", "continued"), _logs(tmp_path, "memx-cont")
        starts = [e for e in ev if e["event"] == "start"]
        if starts and ev[-1]["event"] == "start":
            cur = starts[-1]
            if cur["job_id"] not in warned and _tracker(ck) > cur["iteration"]:
                subprocess.run(["scancel", "--batch", "--signal=USR1", cur["job_id"]], check=True, timeout=30)
                warned.add(cur["job_id"])
        time.sleep(0.3)
    else:
        pytest.fail(f"the run did not complete:\n{_logs(tmp_path, 'memx-cont')}")
    ev = _events(run_dir)
    ends = [e for e in ev if e["event"] == "end"]
    assert len(ends) >= 3, ev
    assert [e["outcome"] for e in ends] == ["continued"] * (len(ends) - 1) + ["complete"]
    assert [e["segment"] for e in ends] == list(range(1, len(ends) + 1))
    assert all(a["next_job_id"] == b["job_id"] for a, b in zip(ends, ends[1:]))
    # every warned segment saved and exited cleanly (a failed save would show as exit code 1)
    assert [e["exit_code"] for e in ends] == [0] * len(ends), ends
    assert _tracker(ck) == ITERS
    logs = _logs(tmp_path, "memx-cont")
    assert "SIGUSR1 from Slurm" in logs and "resumed from" in logs and "training is complete" in logs
    got = _losses(tmp_path, "memx-cont")
    assert sorted(got) == list(range(1, ITERS + 1))
    for it, loss in got.items():
        assert loss == pytest.approx(ref[it], rel=1e-5), (it, loss, ref[it])
    # TensorBoard holds every iteration's loss, the same as the log's
    tb = _scalars(run_dir / "tensorboard")
    assert sorted(tb) == list(range(1, ITERS + 1))
    for it, loss in tb.items():
        assert loss == pytest.approx(ref[it], rel=1e-5)
    # status: from the run folder and from the script
    sb.wait(ends[-1]["job_id"], timeout_s=60)
    st = run_status(run_dir)
    assert st.state == "complete" and st.checkpoint_iteration == ITERS and len(st.segments) == len(ends)
    assert [s.slurm_state for s in st.segments] == ["COMPLETED"] * len(ends)
    assert run_status(script).checkpoint_dir == str(ck)

    # a segment that fails without a new checkpoint ends the chain: data that is not there
    bad = _job(str(tmp_path / "data" / "missing"), tok_dir, tmp_path / "ck-bad", "memx-bad")
    job_id = sb.submit(_script(tmp_path, bad, "memx-bad"))
    sb.wait(job_id, timeout_s=TIMEOUT_S)
    ev = _events(tmp_path / "memx-bad")
    assert [e["outcome"] for e in ev] == ["running", "no-progress"], ev
    assert "wrote no checkpoint newer than iteration 0" in _logs(tmp_path, "memx-bad")
    assert run_status(tmp_path / "memx-bad").state == "stopped"
