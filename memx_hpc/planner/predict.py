"""One plan predicted (``memx-hpc predict``): a :class:`PredictRequest` in, a :class:`PredictResult` out."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from ..spec.catalog import precision_notes
from ..errors import SpecError
from ..model.assemble import load_cost_model, store_paths
from ..model.compose import CostOptions, Prediction, predict_general, predict_plan
from ..placement import comm_vendor
from ..planfile import check_belongs, load_plan_with_origin
from ..search.objective import MemoryErrorBand, risk_utilisation
from ..slurm.cmdline import overlap_refusal, site_launches
from ..spec import GeneralPlan, Plan, Site, TrainJob, job_for_plan
from .conductor import error_bands, load_specs
from .request import PlanRequest

__all__ = ["PredictRequest", "PredictResult", "predict"]


@dataclass(frozen=True, kw_only=True)
class PredictRequest:
    """What to predict: the plan file ``plan`` (a Megatron-runnable plan or a general one)
    for ``site`` and ``job`` (specs or paths of their YAML files). ``store``: the profile
    store (None: the site's); ``analytic``: datasheet roofline only; ``reference``: as
    :attr:`memx_hpc.planner.PlanRequest.reference`; ``cost``: the composition's options."""

    site: Site | str | Path
    job: TrainJob | str | Path
    plan: str | Path
    store: str | Path | None = None
    analytic: bool = False
    reference: bool | None = None
    cost: CostOptions = field(default_factory=CostOptions)


@dataclass(frozen=True, kw_only=True)
class PredictResult:
    """A predicted plan. ``job``: the job as predicted (with the plan's global batch).
    ``provenance``: per GPU type the plan uses, where its numbers come from. ``bands``: per
    GPU type the expected peak-memory error; ``risk``: the fullest GPU's peak widened by it,
    as a fraction of its memory. ``links``: the links between the plan's partitions
    (:meth:`memx_hpc.model.links.LinkModel.describe` rows); ``disagreements``: the store's
    disagreeing sources for the plan's GPU types."""

    site: Site
    job: TrainJob
    plan: Plan | GeneralPlan
    prediction: Prediction
    provenance: dict[str, str]
    bands: dict[str, MemoryErrorBand]
    risk: float
    links: list[dict]
    disagreements: list[dict]
    notes: list[str]

    @property
    def general(self) -> bool:
        return isinstance(self.plan, GeneralPlan)

    @property
    def gpu_types(self) -> list[str]:
        return sorted({s.gpu_type for s in self.prediction.stages})


def predict(request: PredictRequest) -> PredictResult:
    """Load the specs and the plan (SpecError when the plan file was made for another site or
    job), assemble the cost model and predict the plan as it would run (its own global batch)."""
    site, job = load_specs(PlanRequest(site=request.site, job=request.job))
    plan_, origin = load_plan_with_origin(request.plan)
    check_belongs(origin, request.plan, site=site, job=job)
    notes: list[str] = []
    if origin.unstated:
        notes.append(f"the plan file states no {' or '.join(origin.unstated)} (written before plans carried "
                     f"Megatron's overlap options): predicted as off, as render launches it; plan again to get them "
                     f"where they run")
    if isinstance(plan_, Plan) and plan_.fp8 is None and job.fp8_search:
        notes.append(f"the plan file states no FP8 and the job lets the search choose (fp8: [none, "
                     f"{job.fp8_search}]): predicted in 16 bits, as render launches it; plan again to get each plan's "
                     f"precision")
    elif isinstance(plan_, Plan) and plan_.fp8:
        notes.append(f"the plan runs FP8 {plan_.fp8} (recipe {job_for_plan(job, plan_).fp8_recipe}), as its file "
                     f"states")
    known = {p.name for p in site.partitions}
    if isinstance(plan_, Plan) and plan_.overlap_grad_reduce and all(s.partition in known for s in plan_.stages):
        parts = [s.partition for s in plan_.stages]
        cross = len({comm_vendor(site, site.partition(p)) for p in dict.fromkeys(parts)}) > 1
        why = overlap_refusal(site_launches(site, parts, cross_vendor=cross), cross_vendor=cross)
        if why is not None:
            notes.append(f"the plan has overlap_grad_reduce, which this launch would not run ({why.reason}): "
                         f"predicted as the plan says; render refuses it")
    if isinstance(plan_, Plan):
        for name in dict.fromkeys(s.partition for s in plan_.stages if s.partition in known):
            part = site.partition(name)
            if plan_.tp > part.domain_gpus:
                notes.append(f"TP {plan_.tp} spans NVLink domains of partition {name} ({part.domain_gpus} GPUs each): "
                             f"its collectives cross the fabric every layer, priced so")
            elif plan_.tp > part.gpus_per_node:
                notes.append(f"TP {plan_.tp} spans nodes of partition {name} inside one NVLink domain "
                             f"(nvlink_domain_gpus {part.domain_gpus}): priced on NVLink")
    if plan_.global_batch_size != job.global_batch_size:
        # the plan's own batch: a plan is predicted as it would run
        notes.append(f"the plan's global batch {plan_.global_batch_size} is used, not the job file's "
                     f"{job.global_batch_size}")
        job = dataclasses.replace(job, global_batch_size=plan_.global_batch_size)
    store = store_paths(site, request.store).store
    model = load_cost_model(site, job, store, analytic=request.analytic, notes=notes, reference=request.reference)
    try:
        if isinstance(plan_, GeneralPlan):
            pred = predict_general(plan_, site, job, model, options=request.cost)
        else:
            pred = predict_plan(plan_, site, job, model, options=request.cost)
    except SpecError as e:
        raise e.with_file(str(request.plan)) from None
    gpus = sorted({s.gpu_type for s in pred.stages})
    # a general plan names GPU types, a plan partitions: the site's name of each wins
    provenance = {g: model.provenance(g) for g in gpus}
    provenance.update({g: v for g, v in model.provenance_by_type.items() if g in gpus})
    notes += precision_notes(site, job, gpu_types=gpus)
    bands = error_bands(model, site, job, store, notes)
    parts = {s.partition for s in pred.stages if s.partition}
    links = [r for r in model.links.describe() if {x.strip() for x in r["link"].split("<->")} <= parts]
    disagree = model.sources.to_json(gpus) if model.sources is not None else []
    return PredictResult(site=site, job=job, plan=plan_, prediction=pred, provenance=provenance, bands=bands,
                         risk=risk_utilisation(pred, bands), links=links, disagreements=disagree, notes=notes)
