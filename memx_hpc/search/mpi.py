"""Whether this process runs under an MPI launcher, and its world.

Light on purpose (no numpy, no cost model): a rank that rank 0 leaves idle asks here and
nothing more (:mod:`memx_hpc.planner.ranks`). mpi4py is imported only when a launcher
started the process.
"""

from __future__ import annotations

import os

from ..errors import SystemFailure

__all__ = ["MPI_ENV_VARS", "launched_under_mpi", "mpi_comm"]

#: Environment variables that MPI launchers (MPICH/Hydra, Open MPI, PMIx, Slurm's srun)
#: set in every rank; without one of them mpi4py is never imported.
MPI_ENV_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE",
                "SLURM_STEP_NUM_TASKS")


def launched_under_mpi() -> bool:
    """True when an MPI launcher started this process with more than one task (or may have)."""
    env = os.environ
    if env.get("SLURM_STEP_NUM_TASKS", "1") not in ("", "1"):
        return True
    return any(v in env for v in MPI_ENV_VARS if v != "SLURM_STEP_NUM_TASKS")


def mpi_comm(*, required: bool = False):
    """``MPI.COMM_WORLD`` when running under MPI with more than one rank, else None.

    ``required``: raise SystemFailure instead of returning None (the ``--mpi`` flag).
    """
    if not launched_under_mpi():
        if required:
            raise SystemFailure("--mpi given, but this process was not started by an MPI launcher; "
                                "run it as 'mpiexec -n N memx-hpc ...' or 'srun --mpi=pmi2 -n N memx-hpc ...'")
        return None
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise SystemFailure(f"launched under MPI but mpi4py cannot be imported: {e}") from None
    comm = MPI.COMM_WORLD
    if comm.Get_size() <= 1:
        if required:
            raise SystemFailure("--mpi given, but the MPI world has one rank (with srun, pass --mpi=pmi2)")
        return None
    return comm
