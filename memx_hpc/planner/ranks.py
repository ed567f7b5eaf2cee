"""Whether the ranks of an MPI launch share a search: rank 0 decides, the others follow.

A rank costs its own start (Python, the planner's imports, MPI, the cost model loaded after
rank 0's) and a share of the predictions exchanged; below :data:`MIN_PLANS_PER_RANK` plans
per rank that costs more than the rank's share of the search saves, and rank 0 searches
alone. Only rank 0 counts the space: the other ranks wait here, before anything heavy is
imported (the CLI asks :func:`follow_rank0` first), so a rank left idle costs no more than
its interpreter and MPI's start -- 2 ranks are then no slower than one.

The messages, rank 0 to every other rank (point to point, polled: MPICH's blocking receive
spins on a core rank 0 needs):

* the decision (:data:`DECISION_TAG`): ``"together"``, ``"alone"``, or ``(error type,
  text)`` when rank 0 failed before it could decide (a bad site file): every rank then stops
  with that error;
* after an ``"alone"``, the outcome (:data:`OUTCOME_TAG`): None, or ``(error type, text)``.

Light on purpose: no numpy, no cost model (``memx_hpc.search.mpi`` is the world).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..errors import MemxError, SpecError, SystemFailure
from ..search.mpi import launched_under_mpi, mpi_comm

if TYPE_CHECKING:
    from mpi4py.MPI import Comm

__all__ = ["MIN_PLANS_PER_RANK", "DECISION_TAG", "OUTCOME_TAG", "TOGETHER", "ALONE", "world", "decides",
           "follow_rank0", "tell_decision", "tell_outcome", "failure_of", "ranks_follow", "tell_ranks_failed"]

#: Plans each MPI rank must get before starting it pays (``PlanRequest.min_plans_per_rank``).
#: Measured with ``memx-hpc plan --no-profile --json --mpi --min-plans-per-rank 0`` under
#: ``mpiexec -n 2`` against one rank, alternately, twice each, warm store and cache, on the
#: 2-core development machine (shared: load 2.6-3.9); wall seconds, 1 rank / 2 ranks, on the
#: cross-vendor example with llama2-7b: 491,289 plans: 6.4 / 8.5, 5.6 / 4.3; --max-stages 6,
#: 1,032,882: 5.9 / 5.3, 5.2 / 7.6; and --layer-granularity 2, 4,578,078: 18.6 / 16.0,
#: 16.7 / 16.9. Since the search composes about 200,000 plans a second a rank, a second rank
#: saves little until millions of plans, while its start (interpreter, MPI, the cost model
#: loaded after rank 0's) and the merge are paid in full; 2 ranks took 1.3-1.8x the CPU time
#: everywhere. Up to 2.3 million plans a rank one rank won or tied: 2,500,000 plans a rank.
#: (Before the faster composition of the same release, 800,000 a rank.)
MIN_PLANS_PER_RANK = 2_500_000
DECISION_TAG = 7318
OUTCOME_TAG = 7319
TOGETHER, ALONE = "together", "alone"
_POLL_S = 0.01  # a waiting rank wakes 100 times a second (microseconds of CPU each); it exits at most 10 ms after rank 0


def world(mpi: str) -> "Comm | None":
    """The MPI world for an ``mpi`` mode (``auto``: when launched under MPI; ``require``: or
    SystemFailure; ``off``: None)."""
    if mpi == "require":
        return mpi_comm(required=True)
    if mpi == "auto" and launched_under_mpi():
        return mpi_comm()
    return None


def decides(min_plans_per_rank: int, finish: object = None) -> bool:
    """Whether rank 0 decides (and tells the others) who searches: a threshold is set and the
    search is not ranked by finish (which asks Slurm on every rank)."""
    return min_plans_per_rank > 0 and finish is None


def failure_of(e: MemxError) -> tuple[str, str]:
    return ("SpecError" if isinstance(e, SpecError) else "SystemFailure", str(e))


def _raise(failure: tuple[str, str]) -> None:
    kind, message = failure
    raise (SpecError if kind == "SpecError" else SystemFailure)(message)


def _wait(comm: "Comm", tag: int):
    while not comm.Iprobe(source=0, tag=tag):
        time.sleep(_POLL_S)
    return comm.recv(source=0, tag=tag)


def tell_decision(comm: "Comm", decision: str | tuple[str, str]) -> None:
    """Rank 0: ``TOGETHER``, ``ALONE`` or a failure (:func:`failure_of`) to every other rank."""
    for r in range(1, comm.Get_size()):
        comm.send(decision, dest=r, tag=DECISION_TAG)


def tell_outcome(comm: "Comm", failure: tuple[str, str] | None) -> None:
    """Rank 0, after searching alone: None (done) or the failure, to every other rank."""
    for r in range(1, comm.Get_size()):
        comm.send(failure, dest=r, tag=OUTCOME_TAG)


def follow_rank0(comm: "Comm") -> bool:
    """A rank other than 0: wait for rank 0's decision. True when rank 0 searched alone and
    finished (nothing is left for this rank); False when every rank searches. Rank 0's error,
    before or during its search, is raised here too, so every rank says why it stopped."""
    decision = _wait(comm, DECISION_TAG)
    if decision == TOGETHER:
        return False
    if decision != ALONE:
        _raise(decision)
    failure = _wait(comm, OUTCOME_TAG)
    if failure is not None:
        _raise(failure)
    return True


def ranks_follow(mpi: str, min_plans_per_rank: int, finish: object = None) -> bool | None:
    """For a command about to plan or search: on a rank other than 0 of an MPI launch where
    rank 0 decides, wait for it (:func:`follow_rank0`: True, rank 0 searched alone and this
    rank is done; False, search with every rank, the decision taken). None elsewhere (rank 0,
    no MPI, no threshold): go on."""
    if not decides(min_plans_per_rank, finish):
        return None
    comm = world(mpi)
    if comm is None or comm.Get_rank() == 0:
        return None
    return follow_rank0(comm)


def tell_ranks_failed(mpi: str, min_plans_per_rank: int, finish: object, error: MemxError) -> None:
    """Rank 0 failed before the planner decided (building its request, reading a checkpoint):
    the ranks waiting in :func:`ranks_follow` stop with the same error instead of waiting."""
    if not decides(min_plans_per_rank, finish):
        return
    comm = world(mpi)
    if comm is not None and comm.Get_rank() == 0:
        tell_decision(comm, failure_of(error))
