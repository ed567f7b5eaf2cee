"""End to end on the real local Slurm: a plan whose two pipeline stages sit on two different
partitions is rendered, submitted as a heterogeneous job, trained with the local site's
Megatron entry (megatron-core on the CPU), and checked from its log: the requested
iterations, one rank per component on the component's node, and the stage layout.

World size 2 (one rank per core of this 2-core machine), tiny-gpt shapes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memx_hpc.planfile import load_plan
from memx_hpc.slurm import render as rs
from memx_hpc.slurm.submit import launch, wait
from memx_hpc.spec import load_job, load_site
from memx_hpc.train.logs import parse_log

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ITERS = 4
TIMEOUT_S = 180.0


def test_two_partition_pipeline_trains_as_a_hetjob(tmp_path: Path) -> None:
    plan = load_plan(ROOT / "tests" / "golden" / "plans" / "local-pp2-a100-mi250.json")
    site = load_site(ROOT / "site_configs" / "local.yaml")
    job = load_job(ROOT / "jobs" / "tiny-gpt.yaml")
    # the local site names its python relative to the repository: run the job from there
    text = rs.render(plan, site, job, iters=ITERS, log_dir=str(tmp_path), workdir=str(ROOT),
                     job_name="memx-hetjob-test")
    job_id = str(launch(text, tmp_path / "job.sbatch", submit_job=True).job_id)
    outcome = wait(job_id, timeout_s=TIMEOUT_S)
    log_file = tmp_path / f"memx-hetjob-test-{job_id}.out"
    text = log_file.read_text() if log_file.exists() else "(no log)"
    assert outcome.ok, f"job {job_id} ended {outcome.state} {outcome.components}:\n{text[-4000:]}"
    assert [s for _, s in outcome.components] == ["COMPLETED", "COMPLETED"]  # two hetjob components

    log = parse_log(text)
    assert log.iterations_done == ITERS and [r.iteration for r in log.iterations] == list(range(1, ITERS + 1))
    assert all(r.train_iters == ITERS and r.elapsed_ms > 0 for r in log.iterations)
    assert all(r.lm_loss is not None and 5.0 < r.lm_loss < 8.0 for r in log.iterations)  # ~ln(vocab) at start

    by_rank = {int(d["rank"]): d for d in log.layouts}
    assert sorted(by_rank) == [0, 1]
    r0, r1 = by_rank[0], by_rank[1]
    # rank 0: component 0 on nvidia_a100's node, embedding + layers 0-2; rank 1: component 1
    # on amd_mi250's node, layer 3 + loss, with that component's own (full) recompute
    assert (r0["component"], r0["partition"], r0["node"]) == ("0", "nvidia_a100", "a100n0")
    assert (r1["component"], r1["partition"], r1["node"]) == ("1", "amd_mi250", "mi250n0")
    assert (r0["pp stage"], r0["layers"], r0["embedding"], r0["loss"]) == ("0/2", "0-2", "True", "False")
    assert (r1["pp stage"], r1["layers"], r1["embedding"], r1["loss"]) == ("1/2", "3-3", "False", "True")
    assert r0["recompute"] == "none" and r1["recompute"] == "full/uniform/1"
    assert r0["world"] == r1["world"] == "2"

    peaks = log.peak_memory_mb()
    assert sorted(peaks) == [0, 1]
    # the first stage holds the embedding and three layers, the last one layer: more memory
    assert peaks[0] > peaks[1] > 0
    assert "[after training is done]" in text

    # the partitions stand in for NVIDIA and AMD: the groups that span them are planned on
    # UCC (hot) and gloo (cold), logged as planned by rank 0, and run on gloo here
    groups = rs.process_groups(plan, site)
    assert {(g.kind, g.ranks, g.backend) for g in groups if g.cross_vendor} == {
        ("pp", (0, 1), "ucc"), ("embd", (0, 1), "ucc"), ("mp", (0, 1), "gloo"),
        ("default", (0, 1), "cpu:gloo,cuda:ucc")}
    assert {(g.kind, g.ranks, g.backend) for g in groups if not g.cross_vendor} >= {
        ("tp", (0,), "nccl"), ("tp", (1,), "nccl"), ("dp", (1,), "nccl")}
    for line in ("process group pp: ucc x1 (spans vendors, hot", "process group mp: gloo x1 (spans vendors, cold",
                 "process group tp: nccl x1 (inside one vendor (nvidia)) [0]; nccl x1 (inside one vendor (amd)) [1]"):
        assert line in text, line
    assert "[gloo on the CPU]" in text


def test_preflight_stops_a_component_and_names_its_partition(tmp_path: Path) -> None:
    """A component whose entry is missing fails before training starts, and says where."""
    import dataclasses

    plan = load_plan(ROOT / "tests" / "golden" / "plans" / "local-tp2-v100.json")
    site = load_site(ROOT / "site_configs" / "local.yaml")
    parts = tuple(dataclasses.replace(p, megatron_entry="no/such/pretrain_gpt.py") for p in site.partitions)
    site = dataclasses.replace(site, partitions=parts)
    text = rs.render(plan, site, load_job(ROOT / "jobs" / "tiny-gpt.yaml"), iters=1, log_dir=str(tmp_path),
                     workdir=str(ROOT), job_name="memx-preflight-test")
    job_id = str(launch(text, tmp_path / "job.sbatch", submit_job=True).job_id)
    outcome = wait(job_id, timeout_s=TIMEOUT_S)
    text = (tmp_path / f"memx-preflight-test-{job_id}.out").read_text()
    assert not outcome.ok
    assert "memx-hpc preflight: partition nvidia_v100: the training entry no/such/pretrain_gpt.py is not a file" \
        in text, text[-3000:]
    assert not parse_log(text).iterations and "layout |" not in text  # no rank started training

