"""Fixtures for tests that need a real MPI (``@pytest.mark.mpi``): the venv's MPICH.

When ``mpiexec`` (next to the venv's Python, else on PATH) or ``mpi4py`` is missing:

* with the environment variable ``CI`` set (CI runs ``.ci/run`` on a fresh install,
  which has both), the test FAILS: a CI run that silently skipped the MPI tests would
  prove nothing;
* otherwise (a developer's machine) it is skipped, with the command that installs them.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

INSTALL_HINT = "scripts/install.sh installs both (the mpich and mpi4py packages)"


def find_mpiexec() -> str | None:
    """The venv's mpiexec, else the first on PATH."""
    mine = Path(sys.executable).parent / "mpiexec"
    return str(mine) if mine.exists() else shutil.which("mpiexec")


@pytest.fixture(scope="session")
def mpiexec(needs) -> str:
    """The path of a working ``mpiexec`` with mpi4py importable; fails under CI, skips elsewhere."""
    exe = find_mpiexec()
    missing = [what for what, ok in (("mpiexec", exe is not None),
                                     ("mpi4py", importlib.util.find_spec("mpi4py") is not None)) if not ok]
    needs(not missing, f"MPI tests need {' and '.join(missing)}, which this environment lacks", INSTALL_HINT)
    return exe
