"""scripts/gpu-check.sh: the CPU rehearsal runs every step here (profile, plan, predict, the
rendered script's component function through srun/scontrol stand-ins, the comparison);
the real check runs where a GPU is present and is skipped only without one."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"


def _run(out: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=os.environ.get("PYTHON", str(ROOT / ".venv" / "bin" / "python")))
    if not Path(env["PYTHON"]).exists():
        import sys

        env["PYTHON"] = sys.executable
    return subprocess.run(["bash", str(SCRIPT), str(out), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.slow
def test_cpu_rehearsal_runs_every_step(tmp_path: Path) -> None:
    r = _run(tmp_path, "--cpu-rehearsal", timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "iteration time (ms)" in r.stdout and "allocator peak (MB)" in r.stdout
    res = json.loads((tmp_path / "result.json").read_text())
    assert res["backend"] == "gloo" and res["impl"] == "local"
    rows = {name: (p, m) for name, p, m in res["rows"]}
    assert rows["iteration time (ms)"][0] > 0 and rows["iteration time (ms)"][1] > 0
    assert rows["allocator peak (MB): states + activations"][1] > 0
    log = (tmp_path / "train.log").read_text()
    assert "memx-hpc preflight" not in log  # the preflight passed, quietly
    assert "[after training is done]" in log
    # what ran is what was rendered: the script's component function and its entry
    assert "exec " in (tmp_path / "train.sbatch").read_text()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA/ROCm GPU")
def test_gpu_check_on_this_gpu(tmp_path: Path) -> None:
    """The real check: NCCL, CUDA events, allocator and driver memory, within 8 minutes."""
    r = _run(tmp_path, timeout=540)
    assert r.returncode == 0, r.stderr[-4000:]
    print(r.stdout)
    res = json.loads((tmp_path / "result.json").read_text())
    assert res["backend"] == "nccl"
    rows = {name: (p, m) for name, p, m in res["rows"]}
    assert rows["device, as the driver reports (MB)"][1] >= rows["reserved peak (MB)"][1] \
        >= rows["allocator peak (MB): states + activations"][1] > 0
