"""Every script under scripts/ and benchmarks/ answers --help: it prints what it does and
exits 0, doing nothing else (scripts/test.sh --help used to install Debian packages)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*ROOT.glob("scripts/*.sh"), *ROOT.glob("scripts/*.py"), *ROOT.glob("benchmarks/*.py")])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_help(script, tmp_path):
    cmd = ["bash", str(script)] if script.suffix == ".sh" else [sys.executable, str(script)]
    before = set(ROOT.iterdir())
    r = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert len(r.stdout.strip().splitlines()) >= 2, r.stdout
    assert set(ROOT.iterdir()) == before and not list(tmp_path.iterdir())  # wrote nothing
