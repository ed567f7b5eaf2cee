"""A plan file rendered into its sbatch script (``memx-hpc render``), and the script written,
checked and, when asked, submitted.

Two steps, as the renderer itself has them: :func:`render_plan` is pure (a plan file, the
site and the job in; the launch request and the script text out: nothing is written), and
:func:`launch_script` acts (writes the script, ``bash -n``, ``sbatch --test-only``, submits).
The CLI parses arguments and prints what they return.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..errors import SpecError
from ..planfile import check_belongs, load_plan_with_origin
from ..spec import GeneralPlan, Site, TrainJob, load_job, load_site
from .resume import resume_job

if TYPE_CHECKING:
    from ..slurm.render import LaunchRequest
    from ..slurm.submit import Launch, TestOnly

__all__ = ["PLAN_FIELDS", "RenderedPlan", "render_plan", "launch_script", "check_script"]

#: the fields of a plan file: an error about one of them names the plan file
PLAN_FIELDS = ("stages", "tp", "dp", "pp", "cp", "ep", "etp", "micro_batch_size", "global_batch_size",
               "sequence_parallel", "virtual_stages", "layout")


@dataclass(frozen=True, kw_only=True)
class RenderedPlan:
    """A plan file rendered: the site and job it was rendered for (the job continued from a
    checkpoint with ``resume``), the launch request (components, world size, run folder,
    continuation) and the script text. ``notes``: what a person should read (the resume)."""

    site: Site
    job: TrainJob
    request: "LaunchRequest"
    script: str
    notes: tuple[str, ...] = ()


def render_plan(plan_file: str | Path, site: str | Path | Site, job: str | Path | TrainJob, *,
                iters: int | None = None, extra: Sequence[str] = (), log_dir: str | None = None,
                workdir: str | None = None, resume: str | None = None) -> RenderedPlan:
    """The script for the plan in ``plan_file`` on ``site`` for ``job`` (paths or loaded
    specs). Nothing is written. ``resume``: the checkpoint folder to load (checked as a plain
    path and against the job's model before anything else; :func:`~memx_hpc.planner.resume_job`).

    SpecError naming the plan file for a plan made for another job or site, a general plan
    (Megatron-LM cannot run it), or a field of the plan that does not fit the model or the site."""
    # jinja2 is imported with the renderer, only when a plan is rendered
    from ..slurm import render as r

    site = site if isinstance(site, Site) else load_site(site)
    job = job if isinstance(job, TrainJob) else load_job(job)
    notes: list[str] = []
    if resume:
        job, note = resume_job(job, resume)
        notes.append(note)
    plan, origin = load_plan_with_origin(plan_file)
    check_belongs(origin, plan_file, site=site, job=job)
    if isinstance(plan, GeneralPlan):
        raise SpecError("a general plan (per-replica GPU types or TP) can be predicted but Megatron-LM cannot "
                        "run it; render needs uniform tp and dp with one partition per stage", file=str(plan_file))
    try:
        request = r.describe(plan, site, job, iters=iters, extra=list(extra), log_dir=log_dir, workdir=workdir)
    except SpecError as e:
        # a field of the plan (its stages, degrees, batch) that does not fit the model or the
        # site: the plan file is what to fix, so it is named
        head = (e.field or "").split("[")[0].split(".")[0]
        if e.file is None and head in PLAN_FIELDS:
            raise e.with_file(str(plan_file)) from None
        raise
    return RenderedPlan(site=site, job=job, request=request, script=r.render_request(request), notes=tuple(notes))


def launch_script(script: str, out: str | Path, *, test_only: bool = True, submit: bool = False) -> "Launch":
    """Write ``script`` to ``out``, check it with ``bash -n``, ask ``sbatch --test-only`` where
    Slurm answers (``test_only``), and submit it with ``submit`` unless Slurm refused it."""
    from ..slurm.submit import launch

    return launch(script, out, test_only_when="auto" if test_only else "never", submit_job=submit)


def check_script(script: str, *, test_only: bool = True) -> "TestOnly | None":
    """``bash -n`` and, where Slurm answers (``test_only``), ``sbatch --test-only`` on a
    temporary copy of ``script`` (for a script printed rather than written); Slurm's verdict,
    or None when it was not asked."""
    from ..slurm.submit import launch

    with tempfile.TemporaryDirectory(prefix="memx-render-") as tmp:
        return launch(script, Path(tmp) / "train.sbatch", test_only_when="auto" if test_only else "never").test_only
