"""``plan --finish`` against the real local Slurm: with one partition busy (a sleeping job
of the test's own) the plan that finishes first by Slurm's own ``sbatch --test-only``
answers is ranked first; drained nodes are not planned on.

The cluster is shared: the busy window is this test's own job, cancelled in a ``finally``;
the drained node is resumed in a ``finally``; both windows last seconds.
"""

from __future__ import annotations

import json
import math
import subprocess
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from memx_hpc.cli.main import main
from memx_hpc.planner import usable_site
from memx_hpc.slurm.discover import read_cluster
from memx_hpc.slurm.estimate import estimate_start
from memx_hpc.spec import load_site

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
#: a model whose iteration time the GPU types' figures set (tiny-gpt's is host overhead on
#: every one of them): A100-80 plans are clearly faster than MI250X-GCD or V100-16 ones
MID_GPT = """\
name: mid-gpt
model: {name: mid-gpt, num_layers: 4, hidden_size: 2048, num_attention_heads: 16, vocab_size: 32000,
        seq_length: 1024}
global_batch_size: 16
precision: fp16
micro_batch_sizes: [1, 2]
"""
BUSY = "nvidia_a100"
#: how far two sbatch --test-only answers for the same script, seconds apart, may differ
ESTIMATE_SLACK_S = 5.0


def discover_site(tmp_path: Path, capsys) -> Path:
    site = tmp_path / "site.yaml"
    rc = main(["site", "discover", "--out", str(site)])
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()
    return site


def _plan_finish(site_file: Path, tmp_path: Path, capsys, n: int | str, tag: str) -> dict:
    job = tmp_path / "mid-gpt.yaml"
    job.write_text(MID_GPT)
    rc = main(["plan", "--site", str(site_file), "--job", str(job), "--no-profile", "--store",
               str(tmp_path / "store.h5"), "--out", str(tmp_path / tag), "--max-stages", "2", "--top", "3",
               "--finish", str(n), "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)["finish"]


def _check_against_slurm(finish: dict) -> list[tuple[datetime, dict]]:
    """Ask Slurm again about every script; the ranking's first must finish first by its answers."""
    mine = []
    for c in finish["candidates"]:
        if not c["slurm"]["accepted"]:
            continue
        asked = datetime.now().astimezone().replace(microsecond=0)
        again = estimate_start(c["script"])
        assert again.accepted, again.message
        start = max(again.start, asked)
        assert abs((start - datetime.fromisoformat(c["start"])).total_seconds()) <= ESTIMATE_SLACK_S, (c, again)
        assert set(again.nodes) == set(c["slurm"]["nodes"])
        mine.append((start + timedelta(seconds=c["run_s"]), c))
    assert mine
    first = finish["candidates"][0]
    assert first["rank"] == 1
    best_by_slurm = min(f for f, _ in mine)
    finish_first = next(f for f, c in mine if c["rank"] == 1)
    assert (finish_first - best_by_slurm).total_seconds() <= ESTIMATE_SLACK_S, mine
    return mine


def _uses(c: dict, partition: str) -> bool:
    return any(p == partition for p, _ in c["components"])


def test_plan_finish_prefers_what_finishes_first_on_a_busy_partition(tmp_path: Path, capsys) -> None:
    site_file = discover_site(tmp_path, capsys)
    busy = subprocess.run(["sbatch", "--parsable", "-p", BUSY, "--gres=gpu:a100:2", "-n", "2", "--time=5",
                           "-J", "memx-test-busy", "-o", "/dev/null", "--wrap", "sleep 300"],
                          capture_output=True, text=True, check=True)
    job_id = busy.stdout.strip().split(";")[0]
    try:
        # a short run: waiting minutes for the busy partition does not pay
        short = _plan_finish(site_file, tmp_path, capsys, 100, "short")
        mine = _check_against_slurm(short)
        waiting = [c for _, c in mine if _uses(c, BUSY)]
        free = [c for _, c in mine if not _uses(c, BUSY)]
        assert waiting and free
        assert all(c["wait_s"] >= 60 for c in waiting)  # they wait for the sleeping job
        assert not _uses(short["candidates"][0], BUSY)

        # a run long enough that the fastest plan, which waits, still finishes first
        fastest = min(waiting, key=lambda c: c["iteration_s"])
        other = min(free, key=lambda c: c["iteration_s"])
        gain_per_iter = other["iteration_s"] - fastest["iteration_s"]
        assert gain_per_iter > 0, "A100-80 plans are expected to be the fastest on the datasheet figures"
        n = math.ceil(3 * max(c["wait_s"] for c in waiting) / gain_per_iter)
        long = _plan_finish(site_file, tmp_path, capsys, n, "long")
        _check_against_slurm(long)
        assert _uses(long["candidates"][0], BUSY) and long["candidates"][0]["wait_s"] >= 60
    finally:
        subprocess.run(["scancel", job_id], check=False)


def test_drained_nodes_are_not_planned_on(tmp_path: Path, capsys) -> None:
    site = load_site(discover_site(tmp_path, capsys))
    node = read_cluster().nodes_of("nvidia_v100")[0].name
    subprocess.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=memx-hpc test"], check=True)
    try:
        view = read_cluster()
    finally:
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=True)
    usable, notes = usable_site(site, view)
    assert "nvidia_v100" not in {p.name for p in usable.partitions}
    assert any(node in n and "drain" in n and "memx-hpc test" in n for n in notes)  # drained, or draining
