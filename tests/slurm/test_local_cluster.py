"""Tests against the real local Slurm cluster (scripts/slurm-local.sh start).

The cluster has one fake node per vendor partition, each with two typed fake
GPUs: nvidia_a100 (a100n0, gpu:a100:2), amd_mi250 (mi250n0, gpu:mi250:2),
nvidia_v100 (v100n0, gpu:v100:2), plus the default partition ``debug`` with all
three nodes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import submitit
from submitit.core.utils import FailedJobError

from memx_hpc.slurm.local_cluster import partitions, slurm_available, wait_sacct_state

pytestmark = pytest.mark.slurm

# Jobs run in a fresh interpreter that cannot import this test module by name
# (pytest puts tests/ dirs on sys.path only in this process), so ship its
# functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

VENDOR_PARTITIONS = {
    # partition: (node, GPU type)
    "nvidia_a100": ("a100n0", "a100"),
    "amd_mi250": ("mi250n0", "mi250"),
    "nvidia_v100": ("v100n0", "v100"),
}

JOB_TIMEOUT_S = 90.0


def _probe(value: int) -> dict[str, Any]:
    """Runs inside the Slurm job: echoes its value and what Slurm gave it."""
    return {
        "value": value * 2,
        "host": socket.gethostname(),
        "node": os.environ.get("SLURMD_NODENAME"),
        "partition": os.environ.get("SLURM_JOB_PARTITION"),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "SLURM_JOB_GPUS": os.environ.get("SLURM_JOB_GPUS"),
    }


def _boom(message: str) -> None:
    raise ValueError(message)


def _executor(folder: Path, partition: str, **params: Any) -> submitit.AutoExecutor:
    # AutoExecutor picks slurm wherever sbatch exists; say so explicitly anyway.
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    ex.update_parameters(
        slurm_partition=partition,
        # submitit asks Slurm for USR2 90 s before the limit: with 2 min that came 30 s into
        # the job, before a slow (loaded) Python had installed submitit's handler
        timeout_min=10,
        nodes=1,
        tasks_per_node=1,
        cpus_per_task=1,
        name=f"memx-test-{partition}",
        **params,
    )
    return ex


def _wait(job: submitit.Job, timeout: float = JOB_TIMEOUT_S) -> None:
    """job.wait() without a bound would hang the suite on a stuck job."""
    deadline = time.monotonic() + timeout
    while not job.done():
        if time.monotonic() > deadline:
            job.cancel(check=False)
            pytest.fail(f"Slurm job {job.job_id} not done after {timeout} s (state {job.state})")
        time.sleep(0.25)


def test_slurm_available() -> None:
    assert slurm_available()


def test_vendor_partitions_have_typed_gpus() -> None:
    parts = partitions()
    for name, (node, gpu_type) in VENDOR_PARTITIONS.items():
        assert name in parts, f"partition {name} missing from sinfo: {sorted(parts)}"
        p = parts[name]
        assert p["nodes"] == [node]
        assert p["gres"] == [f"gpu:{gpu_type}:2"]
        assert p["gpus"] == {gpu_type: 2}
        assert p["available"] == "up"
    debug = parts["debug"]
    assert debug["default"] is True
    assert debug["nodes"] == sorted(node for node, _ in VENDOR_PARTITIONS.values())
    assert debug["gpus"] == {t: 2 for _, t in VENDOR_PARTITIONS.values()}


# Each partition asks for its typed GPU in a different way submitit offers.
GPU_REQUESTS = {
    "nvidia_a100": {"slurm_gres": "gpu:a100:1"},
    "amd_mi250": {"slurm_additional_parameters": {"gpus": "mi250:1"}},
    "nvidia_v100": {"slurm_additional_parameters": {"gpus_per_node": "v100:2"}},
}


@pytest.mark.parametrize("partition", sorted(VENDOR_PARTITIONS))
def test_submitit_runs_on_each_vendor_partition(tmp_path: Path, partition: str) -> None:
    node, _gpu_type = VENDOR_PARTITIONS[partition]
    ex = _executor(tmp_path / "submitit", partition, **GPU_REQUESTS[partition])
    job = ex.submit(_probe, 21)
    _wait(job)
    out = job.result()
    assert out["value"] == 42
    assert out["partition"] == partition
    assert out["node"] == node
    # the typed GPU request reached the job: Slurm exported the fake GPUs
    assert out["CUDA_VISIBLE_DEVICES"] or out["SLURM_JOB_GPUS"], out
    n_gpus = 2 if partition == "nvidia_v100" else 1
    visible = (out["CUDA_VISIBLE_DEVICES"] or out["SLURM_JOB_GPUS"]).split(",")
    assert len(visible) == n_gpus, out


def test_failing_job_raises_failed_job_error(tmp_path: Path) -> None:
    ex = _executor(tmp_path / "submitit", "debug")
    job = ex.submit(_boom, "boom from a slurm job")
    _wait(job)
    with pytest.raises(FailedJobError, match="boom from a slurm job"):
        job.result()
    # the job itself failed in Slurm's eyes too (submitit re-raises in the job)
    assert wait_sacct_state(job.job_id, timeout=JOB_TIMEOUT_S) == "FAILED"


def test_sacct_shows_completed_job(tmp_path: Path) -> None:
    out = tmp_path / "hostname.out"
    r = subprocess.run(
        ["sbatch", "--parsable", "-p", "debug", "-t", "1", "-o", str(out), "--wrap", "hostname"],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().split(";")[0]
    # Slurm writes a job to the accounting database a moment after it ends.
    assert wait_sacct_state(job_id, timeout=JOB_TIMEOUT_S) == "COMPLETED"
    assert out.read_text().strip() == socket.gethostname()


def test_sacct_shows_submitit_job_completed(tmp_path: Path) -> None:
    ex = _executor(tmp_path / "submitit", "nvidia_a100", slurm_gres="gpu:a100:1")
    job = ex.submit(_probe, 1)
    _wait(job)
    assert job.result()["value"] == 2
    assert wait_sacct_state(job.job_id, timeout=JOB_TIMEOUT_S) == "COMPLETED"
