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

import pytest

from memx_hpc.slurm.local_cluster import START_HINT, slurm_available


@pytest.fixture(scope="session")
def slurm_cluster(needs) -> None:
    """Ensures Slurm is reachable; fails under CI, skips elsewhere."""
    needs(slurm_available(timeout=5.0),
          "Slurm is not reachable (sbatch not on PATH, or sinfo did not answer within 5 s)",
          f".ci/run must run scripts/slurm-local.sh start before pytest; {START_HINT}")
