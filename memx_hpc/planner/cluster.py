"""What the planner asks Slurm before it plans or writes a site: whether Slurm answers at all
(:func:`require_slurm`), and the site file its partitions support (:func:`discover_site`)."""

from __future__ import annotations

from typing import Iterable, Mapping

from ..errors import SystemFailure
from ..sitegen import Discovery, discover
from ..spec import GpuType

__all__ = ["require_slurm", "discover_site"]


def require_slurm(message: str, *, timeout_s: float = 5.0) -> None:
    """SystemFailure (exit 2) saying ``message`` and how to start the local cluster when
    Slurm does not answer (``sinfo``) within ``timeout_s``. A controller that is down makes
    every later client call retry for long, so commands ask this once, briefly, first."""
    # looked up when called: tests stand in for the cluster by replacing slurm_available
    from ..slurm import local_cluster

    if not local_cluster.slurm_available(timeout=timeout_s):
        raise SystemFailure(f"{message} {local_cluster.START_HINT}")


def discover_site(*, mapping: Mapping[str, str] | None = None, partitions: Iterable[str] | None = None,
                  site_types: Iterable[GpuType] = (), name: str | None = None) -> Discovery:
    """The site Slurm's partitions support (:func:`memx_hpc.sitegen.discover` on what
    ``scontrol`` reports); SystemFailure when Slurm does not answer."""
    from ..slurm.discover import read_cluster

    require_slurm("Slurm does not answer (sinfo): site discover reads the cluster through it.")
    return discover(read_cluster(), mapping=mapping, partitions=partitions, site_types=site_types, name=name)
