"""Fixtures for tests that need a real Slurm cluster (``@pytest.mark.slurm``).

Every test marked ``slurm`` in this folder first checks once per session that
Slurm answers. When it does not:

* with the environment variable ``CI`` set (CI runs ``.ci/run``, which starts
  the local cluster), the test FAILS: a CI run that silently skipped the Slurm
  tests would prove nothing;
* otherwise (a developer's machine) it is skipped, with the command that starts
  the local cluster.
"""

from __future__ import annotations

import os

import pytest

from memx_hpc.slurm.local_cluster import START_HINT, slurm_available


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """Ensures Slurm is reachable; fails under CI, skips elsewhere."""
    if slurm_available(timeout=5.0):
        return
    msg = "Slurm is not reachable (sbatch not on PATH, or sinfo did not answer within 5 s)"
    if _in_ci():
        pytest.fail(
            f"{msg}. CI is set, so Slurm tests must not be skipped: .ci/run must run "
            f"scripts/slurm-local.sh start before pytest.",
            pytrace=False,
        )
    pytest.skip(f"{msg}; {START_HINT}")


@pytest.fixture(autouse=True)
def _require_slurm(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("slurm") is not None:
        request.getfixturevalue("slurm_cluster")
