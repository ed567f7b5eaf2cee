"""A real training run on the local Slurm, end to end: a corpus prepared with a tokenizer
built here, a cross-partition hetjob (two stand-in vendors, the project's entry) trained on
it with megatron-core distributed checkpoints, killed mid-run, resumed by submitting the
same script again, with the losses of an uninterrupted run (rel. 1e-5); then the
checkpoint loads under a plan with another TP/PP and training goes on.

World size 2 (one rank per core of this 2-core machine), tiny-gpt shapes.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from memx_hpc.planfile import load_plan
from memx_hpc.slurm import render as rs
from memx_hpc.slurm import submit as sb
from memx_hpc.spec import job_from_mapping, load_site
from memx_hpc.train.logs import parse_log

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ITERS = 6
TIMEOUT_S = 300.0


def _job(prefix: str, tok_dir: Path, ckpt: Path, iters: int):
    return job_from_mapping({
        "name": "memx-resume-test", "model": "tiny-gpt", "global_batch_size": 8, "precision": "fp32",
        "train_iters": iters, "log_interval": 1,
        "data": {"paths": [prefix], "tokenizer": {"type": "HuggingFaceTokenizer", "model": str(tok_dir)},
                 "split": "100,0,0"},
        "lr_schedule": {"lr": 1.0e-3, "min_lr": 1.0e-4, "decay_style": "cosine", "warmup_iters": 1},
        "checkpoint": {"save": str(ckpt), "load": str(ckpt), "interval": 2}})


def _script(tmp: Path, plan_name: str, job, tag: str) -> Path:
    plan = load_plan(ROOT / "tests" / "golden" / "plans" / f"{plan_name}.json")
    site = load_site(ROOT / "site_configs" / "local.yaml")
    return sb.write_script(tmp / f"{tag}.sbatch",
                           rs.render(plan, site, job, log_dir=str(tmp), workdir=str(ROOT), job_name=f"memx-{tag}"))


def _run(script: Path, tmp: Path, tag: str) -> str:
    job_id = sb.submit(script)
    outcome = sb.wait(job_id, timeout_s=TIMEOUT_S)
    text = (tmp / f"memx-{tag}-{job_id}.out").read_text()
    assert outcome.ok, f"job {job_id} ended {outcome.state}:\n{text[-4000:]}"
    return text


def _losses(text: str) -> dict[int, float]:
    return {r.iteration: r.lm_loss for r in parse_log(text).iterations}


def test_killed_run_resumes_with_the_same_losses_then_goes_on_under_another_plan(tmp_path: Path, tiny_corpus) -> None:
    prefix, tok_dir = tiny_corpus
    # uninterrupted
    whole = _run(_script(tmp_path, "local-pp2-a100-mi250", _job(prefix, tok_dir, tmp_path / "ck-whole", ITERS),
                         "whole"), tmp_path, "whole")
    ref = _losses(whole)
    assert sorted(ref) == list(range(1, ITERS + 1)) and "TRAINING RUN" in whole
    assert all(2.0 < v < 8.0 for v in ref.values())

    # interrupted: killed once iteration 3 is done (checkpoint of iteration 2 written)
    ck = tmp_path / "ck"
    script = _script(tmp_path, "local-pp2-a100-mi250", _job(prefix, tok_dir, ck, ITERS), "cut")
    job_id = sb.submit(script)
    log = tmp_path / f"memx-cut-{job_id}.out"
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        if 3 in _losses(text):
            break
        assert not sb.job_states(job_id) or any(s in ("RUNNING", "PENDING") for _, s in sb.job_states(job_id)), \
            text[-3000:]
        time.sleep(0.5)
    else:
        pytest.fail(f"job {job_id} did not reach iteration 3:\n{log.read_text()[-3000:] if log.exists() else ''}")
    subprocess.run(["scancel", job_id], check=True, timeout=30)
    outcome = sb.wait(job_id, timeout_s=120)
    assert outcome.state != "COMPLETED"
    first = _losses(log.read_text())
    assert ITERS not in first  # it really stopped mid-run
    # the interval's checkpoint of iteration 2, or the one SIGTERM saves after the iteration it lands in
    assert (ck / "latest_checkpointed_iteration.txt").read_text().strip() in ("2", "3", "4")

    # the same script again: resumes from the checkpoint
    again = _run(script, tmp_path, "cut")
    assert "resumed from" in again and "same TP/PP: RNG restored" in again
    resumed = _losses(again)
    start = min(resumed)
    assert start in (3, 4, 5) and sorted(resumed) == list(range(start, ITERS + 1))
    for it, loss in resumed.items():
        assert loss == pytest.approx(ref[it], rel=1e-5), (it, loss, ref[it])

    # another plan: TP 2 on one partition (was PP 2 across two); two more iterations
    other = _run(_script(tmp_path, "local-tp2-v100", _job(prefix, tok_dir, ck, ITERS + 2), "other"),
                 tmp_path, "other")
    assert "resharded" in other
    more = _losses(other)
    assert sorted(more) == [ITERS + 1, ITERS + 2]
    # training goes on: the loss continues from where the checkpoint left it, not from scratch
    assert all(v < ref[1] for v in more.values()), (more, ref)
    assert (ck / "latest_checkpointed_iteration.txt").read_text().strip() == str(ITERS + 2)

    # plan --resume / render --resume read what the checkpoint says about the run
    import dataclasses

    from memx_hpc.errors import SpecError
    from memx_hpc.planner import resume_job

    fresh = dataclasses.replace(_job(prefix, tok_dir, ck, ITERS + 4), checkpoint=None)
    job, note = resume_job(fresh, str(ck))
    assert (job.checkpoint.load_dir, job.checkpoint.save_dir) == (str(ck), str(ck))
    assert f"iteration {ITERS + 2}, written with tp/pp/dp 2/1/1" in note
    text = rs.render(load_plan(ROOT / "tests" / "golden" / "plans" / "local-pp2-a100-mi250.json"),
                     load_site(ROOT / "site_configs" / "local.yaml"), job)
    assert f"--load {ck}" in text and "--ckpt-format torch_dist" in text
    with pytest.raises(SpecError) as e:
        resume_job(dataclasses.replace(fresh, model=dataclasses.replace(fresh.model, hidden_size=128)), str(ck))
    assert e.value.field == "--resume" and "hidden_size" in str(e.value)
    with pytest.raises(SpecError) as e:
        resume_job(dataclasses.replace(fresh, train_iters=ITERS), str(ck))
    assert e.value.field == "train_iters"
