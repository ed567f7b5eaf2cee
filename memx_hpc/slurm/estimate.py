"""When Slurm would start a job: ``sbatch --test-only`` read as a start time and nodes.

``sbatch --test-only`` submits nothing; Slurm 22.05 answers on stderr, for one job
``sbatch: Job 25 to start at 2026-12-01T21:39:54 using 2 processors on nodes a100n0 in
partition nvidia_a100`` and for a heterogeneous job ``sbatch: Job 5 to start at ... using
4 processors on a100n0,mi250n0``; a request it cannot place exits 1 ("Requested node
configuration is not available"). The estimate is the backfill scheduler's: it counts
running jobs' time limits, pending jobs of higher priority and reservations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .discover import expand_hostlist, parse_time

__all__ = ["StartEstimate", "parse_test_only", "estimate_start"]

_ANSWER = re.compile(r"Job\s+(\d+)\s+to start at\s+(\S+)\s+using\s+(\d+)\s+processors on\s+(?:nodes\s+)?(\S+)"
                     r"(?:\s+in partition\s+(\S+))?")


@dataclass(frozen=True, kw_only=True)
class StartEstimate:
    """Slurm's answer for one script. ``accepted`` False: it cannot place the request
    (``message`` says why); ``start`` None with ``accepted``: it gave no time."""

    accepted: bool
    message: str
    start: datetime | None = None
    processors: int | None = None
    nodes: tuple[str, ...] = ()
    partition: str | None = None

    def wait_s(self, now: datetime) -> float | None:
        """Seconds from ``now`` to the expected start (0 when it would start at once)."""
        if self.start is None:
            return None
        return max(0.0, (self.start - now).total_seconds())


def parse_test_only(message: str, *, accepted: bool = True) -> StartEstimate:
    """``sbatch --test-only``'s output (stderr, or both streams) as an estimate."""
    text = message.strip()
    m = _ANSWER.search(text)
    if not accepted or m is None:
        line = next((ln for ln in reversed(text.splitlines()) if ln.strip()), text)
        return StartEstimate(accepted=accepted and m is not None, message=line.strip() or "no answer")
    return StartEstimate(accepted=True, message=m.group(0), start=parse_time(m.group(2)),
                         processors=int(m.group(3)), nodes=expand_hostlist(m.group(4)), partition=m.group(5))


def estimate_start(script_path: str | Path, *, timeout_s: float = 30.0) -> StartEstimate:
    """Ask Slurm when it would start the script (nothing is submitted). SystemFailure when
    sbatch is missing or does not answer."""
    from .submit import test_only

    verdict = test_only(script_path, timeout_s=timeout_s)
    return parse_test_only(verdict.message, accepted=verdict.accepted)
