"""The search space as far as ``render`` would launch its plans (:func:`launchable_space`), and why
a space holds no plan at all (:func:`why_empty`)."""

from __future__ import annotations

import dataclasses

from ..errors import SpecError
from ..placement import comm_vendor
from ..search.report import space_notes
from ..search.space import PlanSpace, SpaceOptions
from ..slurm.cmdline import project_entry_refusal
from ..slurm.render import sequence_parallel_refusal
from ..spec import Site, TrainJob

__all__ = ["launchable_space", "why_empty"]


def launchable_space(site: Site, job: TrainJob, options: SpaceOptions) -> tuple[SpaceOptions, list[str]]:
    """The search options with only plans ``render`` would launch for this job and site, and
    a note per exclusion saying what was left out and why. A plan whose stages speak more
    than one vendor's collectives runs the project's megatron-core entry over a cross-vendor
    backend: the space leaves such plans out when that entry cannot build the job's
    tokenizer or the site names no cross-vendor pipeline backend (render refuses both). The
    notes end with what the space holds of the job's request that a reader might expect
    otherwise (:func:`memx_hpc.search.report.space_notes`)."""
    options, notes = _launchable(site, job, options)
    return options, notes + space_notes(PlanSpace(site, job, options))


def _launchable(site: Site, job: TrainJob, options: SpaceOptions) -> tuple[SpaceOptions, list[str]]:
    options, notes = _launchable_sequence_parallel(site, options)
    vendors = sorted({comm_vendor(site, p) for p in site.partitions})
    if len(vendors) < 2 or options.single_vendor:
        return options, notes
    why = []
    refusal = project_entry_refusal(job)
    if refusal is not None:
        why.append(refusal.reason)
    if site.pipeline_comm_backend != "ucc":
        why.append(f"the site's pipeline_comm.backend is {site.pipeline_comm_backend}, and NCCL/RCCL do not talk "
                   f"to each other (set it to ucc)")
    if not why:
        return options, notes
    note = (f"cross-vendor plans left out of the search (partitions of {', '.join(vendors)} are not mixed in one "
            f"plan): render would refuse them: " + "; ".join(why))
    return dataclasses.replace(options, single_vendor=True), notes + [note]


def why_empty(site: Site, job: TrainJob, options: SpaceOptions) -> tuple[str, str]:
    """For a space of ``job`` on ``site`` that holds no plan: the option or job field that
    left it empty and why (:meth:`memx_hpc.search.space.PlanSpace.why_empty`)."""
    return PlanSpace(site, job, options).why_empty()


def _launchable_sequence_parallel(site: Site, options: SpaceOptions) -> tuple[SpaceOptions, list[str]]:
    """Sequence parallel left out of the search where render would refuse it (CPU devices);
    asked for explicitly there, it is a user error naming the option."""
    if options.sequence_parallel is False:
        return options, []
    why = sequence_parallel_refusal(site, [p.name for p in site.partitions])
    if why is None:
        return options, []
    if options.sequence_parallel is True:
        raise SpecError(why, field="--sequence-parallel", found="on", allowed="off, search")
    return (dataclasses.replace(options, sequence_parallel=False),
            [f"sequence parallel left out of the search: {why}"])
