"""benchmarks/top1_cpu.py's cross-vendor line, run as a user runs it (no Slurm needed): the
recommended plan is within 3 % of the fastest plan that fits, or that plan's memory is
inside the error band, and the line says which."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cross_vendor_line_says_met_or_exempt(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "top1_cpu.py"), "--cross-vendor-only",
                           "--xv-store", str(tmp_path / "xv.h5")], capture_output=True, text=True, env=env,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = {ln.split()[0]: ln for ln in proc.stdout.splitlines() if ln.startswith(("llama2-7b", "gpt3-2.7b"))}
    assert set(lines) == {"llama2-7b", "gpt3-2.7b"}
    for job, line in lines.items():
        slower = float(line.split()[3].rstrip("%"))
        fast_risk = float(line.split()[4].rstrip("%"))
        assert slower >= 0, line  # the recommended plan is never faster than the fastest that fits
        if "met:" in line:
            assert slower <= 3.0, line
        else:
            assert "exempt:" in line and fast_risk > 100, line
