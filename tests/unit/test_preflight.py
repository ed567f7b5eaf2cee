"""The per-rank preflight of a rendered component (memx_hpc/slurm/preflight.py): it names
the partition and the problem, for each of the failures it exists to catch."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

from memx_hpc.slurm import preflight

ROOT = Path(__file__).resolve().parents[2]


def _torch(*, cuda: str | None = None, hip: str | None = None, gpu: bool = False, ucc: bool = False):
    """A torch as the preflight sees it: build, visible GPU, available backends."""
    dist = types.SimpleNamespace(is_nccl_available=lambda: cuda is not None or hip is not None,
                                 is_gloo_available=lambda: True, is_ucc_available=lambda: ucc)
    return types.SimpleNamespace(version=types.SimpleNamespace(cuda=cuda, hip=hip),
                                 cuda=types.SimpleNamespace(is_available=lambda: gpu), distributed=dist)


def test_vendor_and_backend_problems_are_named() -> None:
    cuda_torch = _torch(cuda="12.4", gpu=True)
    assert preflight._vendor_problems(cuda_torch, "nvidia") == []
    assert "built for CUDA 12.4" in preflight._vendor_problems(cuda_torch, "amd")[0]
    assert "built for ROCm 6.1" in preflight._vendor_problems(_torch(hip="6.1", gpu=True), "nvidia")[0]
    assert "CPU only" in preflight._vendor_problems(_torch(), "nvidia")[0]
    assert "no NVIDIA GPU is visible" in preflight._vendor_problems(_torch(cuda="12.4"), "nvidia")[0]
    assert preflight._vendor_problems(_torch(), "cpu") == []
    (ucc,) = preflight._backend_problems(cuda_torch, ["nccl", "ucc", "gloo"])
    assert "is_ucc_available()" in ucc
    assert preflight._backend_problems(_torch(cuda="12.4", ucc=True), ["nccl", "ucc"]) == []


def test_entry_problems(tmp_path: Path) -> None:
    entry = tmp_path / "pretrain_gpt.py"
    assert "is not a file" in preflight._entry_problems([str(entry)])[0]
    entry.write_text("")
    assert preflight._entry_problems([str(entry)]) == []
    assert preflight._entry_problems(["-m", "memx_hpc.train.pretrain_gpt"]) == []
    assert "not importable" in preflight._entry_problems(["-m", "no_such_module.train"])[0]


def test_runs_as_python_dash_c_and_exits_3_naming_the_partition(tmp_path: Path) -> None:
    """As the rendered script runs it: the file's text with ``python -c``, memx-hpc not imported."""
    code = (ROOT / "memx_hpc" / "slurm" / "preflight.py").read_text()
    ok = subprocess.run([sys.executable, "-c", code, "gpu_x", "cpu", "gloo", "-m", "json"], capture_output=True,
                        text=True, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([sys.executable, "-c", code, "gpu_mi250x", "amd", "gloo,ucc", str(tmp_path / "nope.py")],
                         capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == preflight.EXIT_PREFLIGHT
    lines = bad.stderr.strip().splitlines()
    assert all(line.startswith("memx-hpc preflight: partition gpu_mi250x: ") for line in lines)
    assert any("nope.py is not a file" in line for line in lines)
    assert any("AMD GPUs" in line for line in lines)  # this machine's torch is not a ROCm build
