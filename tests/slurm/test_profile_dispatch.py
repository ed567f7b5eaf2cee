"""Profiling through the real local Slurm cluster (scripts/slurm-local.sh start).

Real job arrays on the fake-GPU partitions, real megatron-core layers on the CPU
nodes, the real HDF5 store. Each scenario uses its own partition of the local
site so that the scenarios do not queue behind each other's jobs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from memx_hpc.profile.points import minimal_set
from memx_hpc.profile.runner import RunSettings
from memx_hpc.profile.store import ProfileStore
from memx_hpc.profile.campaign import point_key, profile
from memx_hpc.spec import job_from_mapping, load_job, load_site, site_from_mapping

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
LOCAL_SITE = REPO / "site_configs" / "local.yaml"
TINY_JOB = REPO / "jobs" / "tiny-gpt.yaml"
PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
QUICK = ["--warmup", "1", "--iters", "2", "--points-per-task", "4"]


def _site_file(tmp: Path, **changes) -> Path:
    """The local site with its store and run folder under ``tmp`` and Slurm forced."""
    data = yaml.safe_load(LOCAL_SITE.read_text())
    data["store"] = str(tmp / "store.h5")
    data["work_dir"] = str(tmp / "runs")
    data["slurm"]["scheduler"] = "slurm"
    for p in data["partitions"]:
        p["python"] = PYTHON
    data.update(changes)
    out = tmp / "site.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


def _cli(*args: str) -> list[str]:
    return [PYTHON, "-m", "memx_hpc.cli.main", "profile", *args]


def _small_job(**kw):
    """A tiny GPT with one micro-batch size and no recompute: the fewest points per GPU type."""
    return job_from_mapping({"name": "tiny-small", "model": {"preset": "tiny-gpt"}, "global_batch_size": 8,
                             "precision": "fp32", "micro_batch_sizes": [1], "recompute_modes": ["none"], **kw})


@pytest.fixture(scope="module")
def interrupted_then_resumed(tmp_path_factory):
    """Profile tiny-gpt on one partition with the CLI, SIGKILL it once some samples are in
    and other jobs still run, then run the same command again to completion."""
    tmp = tmp_path_factory.mktemp("profile-kill")
    site_file = _site_file(tmp)
    cmd = _cli("--site", str(site_file), "--job", str(TINY_JOB), "--partition", "nvidia_v100", "--json", *QUICK)
    env = dict(os.environ)
    first = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    store = ProfileStore(tmp / "store.h5")
    ledger = Path(str(store.path) + ".jobs.json")
    deadline = time.monotonic() + 240
    killed_with = None
    while time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.5)
        if store.exists() and len(store) > 0 and ledger.exists():
            states = [t["state"] for t in json.loads(ledger.read_text())["tasks"].values()]
            if "submitted" in states:
                first.send_signal(signal.SIGKILL)
                killed_with = states
                break
    first.wait(timeout=30)
    before = json.loads(ledger.read_text()) if ledger.exists() else {"tasks": {}}
    n_before = len(store) if store.exists() else 0
    second = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    return {"tmp": tmp, "site_file": site_file, "store": store, "ledger_before": before, "killed_with": killed_with,
            "first_rc": first.returncode, "n_before": n_before, "second": second,
            "ledger_after": json.loads(ledger.read_text())}


def test_profile_fills_the_store_through_job_arrays(interrupted_then_resumed):
    r = interrupted_then_resumed
    assert r["second"].returncode == 0, r["second"].stderr[-3000:]
    site = load_site(r["site_file"])
    job = load_job(TINY_JOB)
    store: ProfileStore = r["store"]
    wanted = [p for p in minimal_set(site, job) if p.gpu_type == "cpu-2g"]
    assert store.stored_points() >= set(wanted)
    kinds = {s.point.kind for s in store.samples(gpu_type="cpu-2g")}
    assert kinds == {"layer", "embedding", "head", "optimizer", "allreduce", "p2p"}
    # job arrays: several tasks of one submission share an array job id
    ids = [t["job_id"] for t in r["ledger_after"]["tasks"].values()]
    assert any("_" in i for i in ids), ids
    for s in store.samples(kind="layer"):
        prov = s.provenance.as_dict()
        assert prov["partition"] == "nvidia_v100" and prov["slurm_job_id"] and s.source.startswith("slurm:")
        assert s.forward_ms > 0 and s.activation_bytes > 0 and s.peak_allocated_bytes > 0
        assert not s.infeasible
    tp2 = [s for s in store.samples(kind="layer") if s.point.tp == 2]
    assert tp2 and tp2[0].provenance.as_dict()["world_size"] == 2  # a multi-task job
    figs = store.device_figures("cpu-2g")
    assert figs and figs["peak_tflops_fp32"] > 0 and figs["memory_gib"] == 2.0


def test_killed_midway_then_rerun_has_no_duplicates(interrupted_then_resumed):
    r = interrupted_then_resumed
    assert r["killed_with"] is not None, "the first run finished before it could be killed"
    assert r["first_rc"] == -signal.SIGKILL
    assert 0 < r["n_before"]
    store: ProfileStore = r["store"]
    points = [s.point for s in store.samples()]
    assert len(points) == len(set(points))  # one sample per point
    # nothing that was submitted before the kill was submitted again
    keys_per_task = [k for t in r["ledger_after"]["tasks"].values() for k in t["points"]]
    assert len(keys_per_task) == len(set(keys_per_task))
    earlier = set(r["ledger_before"]["tasks"])
    assert earlier and earlier <= set(r["ledger_after"]["tasks"])
    assert all(r["ledger_after"]["tasks"][k]["state"] == "collected" for k in earlier)
    report = json.loads(r["second"].stdout)
    assert set(report["job_ids"]) & earlier  # re-attached to the jobs still running
    # and a third run has nothing left to do
    third = subprocess.run(_cli("--site", str(r["site_file"]), "--job", str(TINY_JOB), "--partition",
                                "nvidia_v100", "--json"), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert third.returncode == 0, third.stderr
    rep3 = json.loads(third.stdout)
    assert rep3["scheduled"] == 0 and rep3["job_ids"] == [] and rep3["skipped"] == len(
        [p for p in minimal_set(load_site(r["site_file"]), load_job(TINY_JOB)) if p.gpu_type == "cpu-2g"])


@pytest.fixture(scope="module")
def failures_and_caps(tmp_path_factory):
    """One run over two partitions at once: nvidia_a100 (cpu-4g) and amd_mi250 offered as
    a 3 MiB device in which no tiny-gpt layer fits (about 4 MB of weights, gradients and
    activations at micro-batch 1). The first task to start fails once as a whole (it is
    retried, then fine); every optimizer point fails on each attempt (retried, then
    reported with its reasons)."""
    tmp = tmp_path_factory.mktemp("profile-failures")
    site_file = _site_file(tmp)
    data = yaml.safe_load(site_file.read_text())
    data["gpu_types"]["cpu-3m"] = {**data["gpu_types"]["cpu-2g"], "memory_gib": 3 / 1024,
                                   "source": "test: a budget no layer fits in"}
    for p in data["partitions"]:
        if p["name"] == "amd_mi250":
            p["gpu_type"] = "cpu-3m"
    site = site_from_mapping(data, source_file=str(site_file))
    job = _small_job()
    store = ProfileStore(tmp / "store.h5")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEMX_PROFILE_FAIL", "task:1,optimizer")
        mp.setenv("MEMX_PROFILE_FAIL_STATE", str(tmp / "fail-state"))
        report = profile(site, job, store, partitions=["nvidia_a100", "amd_mi250"], max_retries=1, progress=False,
                         settings=RunSettings(warmup=1, iters=2))
    return {"tmp": tmp, "site": site, "job": job, "store": store, "report": report}


def test_failing_task_is_retried_then_reported(failures_and_caps):
    r = failures_and_caps
    site, job, store, report = r["site"], r["job"], r["store"], r["report"]
    home = {"cpu-4g": "nvidia_a100", "cpu-3m": "amd_mi250"}  # the partitions profiled
    mini = [p for p in minimal_set(site, job) if p.gpu_type in home]
    opt = [p for p in mini if p.kind == "optimizer"]
    assert report.failed == len(opt) == 4  # TP 1 and 2 on both GPU types
    for f in report.failures:
        assert f.point.kind == "optimizer" and f.attempts == 2 and f.partition == home[f.point.gpu_type]
        assert f.reason.count("injected failure") == 2  # both attempts' reasons are kept
    # everything else was measured, including the points of the task that failed once
    others = [p for p in mini if p.kind != "optimizer"]
    assert store.stored_points() >= set(others)
    assert report.measured + report.infeasible == len(others)
    ledger = json.loads(Path(str(store.path) + ".jobs.json").read_text())
    failed_tasks = [t for t in ledger["tasks"].values() if t["state"] == "failed"]
    assert any("InjectedFailure" in " ".join(t["reasons"]) for t in failed_tasks)
    assert [p.name for p in (r["tmp"] / "fail-state").glob("task-*")] == ["task-0"]


def test_point_over_the_memory_cap_is_stored_infeasible(failures_and_caps):
    store, report = failures_and_caps["store"], failures_and_caps["report"]
    layers = store.samples(gpu_type="cpu-3m", kind="layer")
    assert {s.point.tp for s in layers} == {1, 2}
    assert all(s.infeasible for s in layers)
    assert all(s.peak_allocated_bytes > 3 * 2**20 for s in layers)
    assert report.infeasible >= 2
    # the same layers fit the 4 GiB device; collectives carry no layer memory
    assert not any(s.infeasible for s in store.samples(gpu_type="cpu-4g", kind="layer"))
    assert not any(s.infeasible for s in store.samples(gpu_type="cpu-3m", kind="allreduce"))
