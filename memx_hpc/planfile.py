"""The plan JSON format (``memx-plan/1``), read and written in one place.

A Megatron-runnable plan::

    {"format": "memx-plan/1", "tp": 2, "dp": 1, "micro_batch_size": 1,
     "global_batch_size": 64, "sequence_parallel": false, "virtual_stages": 2, "cp": 2,
     "stages": [{"partition": "gpu_a100", "num_layers": 14, "recompute": "none"},
                {"partition": "gpu_v100", "num_layers": 10, "recompute": "full:4"}]}

``overlap_grad_reduce`` and ``overlap_param_gather`` are Megatron-LM's performance options of
the plan (``--overlap-grad-reduce``, ``--overlap-param-gather``), priced by the composition and
written into the script; ``plan`` writes both, true or false. A file written before them reads
as both off, and :attr:`PlanOrigin.unstated` names them so that ``predict`` can say so.
``ddp_bucket_size`` (``--ddp-bucket-size``, parameters per gradient bucket under
``overlap_grad_reduce``) is written where given and read as megatron-core's default where absent.

``recompute`` is ``none``, ``selective``, ``full`` (all layers of the stage) or
``full:K`` (K of its layers). ``virtual_stages`` (model chunks per pipeline rank), ``cp``
(context parallel), ``ep`` and ``etp`` (expert parallel, expert tensor parallel) are written
where they are not 1 and read as 1 where absent, so files written before them still read;
``microbatch_group_size_per_vp_stage`` (Megatron-LM's
``--microbatch-group-size-per-virtual-pipeline-stage``) is written where given and read as
megatron-core's default (``pp``) where absent.
A general plan, as other planners produce them, gives
per stage a list of data-parallel replicas, each with its own GPU type and TP::

    {"format": "memx-plan/1", "micro_batch_size": 1, "global_batch_size": 64,
     "stages": [{"num_layers": 16, "replicas": [{"gpu_type": "A100-40", "tp": 2},
                                                 {"gpu_type": "V100-16", "tp": 4}]}, ...]}

General plans can be predicted but never rendered. Extra top-level keys written by
``plan`` (``prediction``, ``rank``, ...) are kept for people and ignored on read.

A plan belongs to a job and a site. ``plan`` writes both::

    "job": {"name": "llama2-7b", "fingerprint": "3f0c9a1e22b4", "global_batch_size": 128,
            "precision": "bf16", "num_layers": 32, "hidden_size": 4096, "seq_length": 4096},
    "site": "example-cross-vendor"

``fingerprint`` is a hash of the model shape, the global batch and the precision
(:func:`job_fingerprint`). ``predict`` and ``render`` refuse a plan whose job or site
differs from the one they are given (:func:`check_belongs`), naming both. Hand-written
plans and other planners' plans carry neither and are accepted as they are.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, fields
from typing import Any

from .errors import SpecError
from .spec import (FP8_FORMATS, FP8_RECIPES, MODEL_EXTENSION_FIELDS, PERFORMANCE_OPTIONS, GeneralPlan, GeneralStage, ModelSpec, Plan,
                   Recompute, Replica, Stage, _build, _Reader, load_json)

FORMAT = "memx-plan/1"
#: the plan's degrees beyond TP/DP/PP, written when not 1 (etp and the interleaving group:
#: when given)
_DEGREES = ("virtual_stages", "cp", "ep", "etp", "microbatch_group_size_per_vp_stage")
_OPTIONAL_DEGREES = ("etp", "microbatch_group_size_per_vp_stage")
_EXTRA = ("format", "prediction", "job", "site", "rank", "score", "provenance", "note", "role", "objective", "run",
          "memory_error", "why")


def plan_to_dict(plan: Plan, **extra: Any) -> dict:
    d = {"format": FORMAT, "tp": plan.tp, "dp": plan.dp, "micro_batch_size": plan.micro_batch_size,
         "global_batch_size": plan.global_batch_size, "sequence_parallel": plan.sequence_parallel}
    # the degrees beyond TP/DP/PP only where they are not 1 (files without them read as 1)
    d.update({k: getattr(plan, k) for k in _DEGREES
              if getattr(plan, k) != (None if k in _OPTIONAL_DEGREES else 1)})
    if plan.distributed_optimizer is not None:
        d["distributed_optimizer"] = plan.distributed_optimizer
    # always written: a file that lacks them was written before they existed (read as off)
    d.update({k: getattr(plan, k) for k in PERFORMANCE_OPTIONS})
    if plan.ddp_bucket_size is not None:  # absent: megatron-core's default
        d["ddp_bucket_size"] = plan.ddp_bucket_size
    # where the plan states its FP8 ("none": 16 bits, as job files spell it); a file without
    # them runs as its job says
    if plan.fp8 is not None:
        d["fp8"] = plan.fp8 or "none"
    if plan.fp8_recipe is not None:
        d["fp8_recipe"] = plan.fp8_recipe
    d["stages"] = [{"partition": s.partition, "num_layers": s.num_layers, "recompute": s.recompute.label()}
                   for s in plan.stages]
    d.update(extra)
    return d


def plan_from_mapping(data: Any) -> Plan | GeneralPlan:
    r = _Reader(data, "", kind="a plan mapping")
    fmt = r.raw("format", FORMAT)
    if fmt != FORMAT:
        raise SpecError("unsupported plan format", field="format", found=fmt, allowed=FORMAT)
    stages = r.items("stages", required=True)
    if not stages:
        raise SpecError("a plan needs at least one stage", field="stages", found=[])
    general = any(s.has("replicas") for s in stages)
    mbs = r.int("micro_batch_size", min=1)
    gbs = r.int("global_batch_size", min=1)
    for k in _EXTRA:
        r.used.add(k)
    if general:
        gstages = []
        for sr in stages:
            reps = []
            for rr in sr.items("replicas", required=True):
                reps.append(_build(Replica, rr.path, gpu_type=rr.str("gpu_type"), tp=rr.int("tp", min=1),
                                   partition=rr.str("partition", None)))
                rr.finish()
            if not reps:
                raise SpecError("a stage needs at least one replica", field=sr._p("replicas"))
            gstages.append(_build(GeneralStage, sr.path, num_layers=sr.int("num_layers", min=1), replicas=tuple(reps),
                                  recompute=Recompute.parse(sr.raw("recompute", None), sr._p("recompute"))))
            sr.finish()
        r.finish()
        return _build(GeneralPlan, "", micro_batch_size=mbs, global_batch_size=gbs, stages=tuple(gstages))
    out = []
    for sr in stages:
        # 0: a first/last stage of the embedding or the output layer alone (the Plan checks where)
        out.append(_build(Stage, sr.path, partition=sr.str("partition"), num_layers=sr.int("num_layers", min=0),
                          recompute=Recompute.parse(sr.raw("recompute", None), sr._p("recompute"))))
        sr.finish()
    tp = r.int("tp", min=1)
    dp = r.int("dp", min=1)
    sp = r.bool("sequence_parallel", False)
    degrees = {k: r.int(k, None if k in _OPTIONAL_DEGREES else 1, min=1) for k in _DEGREES}
    degrees["distributed_optimizer"] = r.bool("distributed_optimizer", None)
    degrees.update({k: r.bool(k, False) for k in PERFORMANCE_OPTIONS})
    degrees["ddp_bucket_size"] = r.int("ddp_bucket_size", None, min=1)
    fp8 = r.str("fp8", None, choices=("none",) + FP8_FORMATS)
    degrees["fp8"] = "" if fp8 == "none" else fp8
    degrees["fp8_recipe"] = r.str("fp8_recipe", None, choices=FP8_RECIPES)
    r.finish()
    try:
        return Plan(tp=tp, dp=dp, micro_batch_size=mbs, global_batch_size=gbs, stages=tuple(out),
                    sequence_parallel=sp, **degrees)
    except SpecError as e:
        raise SpecError(e.detail, field=e.field or "plan", found=e.found) from None


def load_plan(path: str | os.PathLike) -> Plan | GeneralPlan:
    return load_plan_with_origin(path)[0]


def load_plan_with_origin(path: str | os.PathLike) -> tuple[Plan | GeneralPlan, "PlanOrigin"]:
    """The plan in ``path`` and the job and site it was made for (empty when not recorded)."""
    data = load_json(path)  # bounded: size, depth, duplicate keys
    try:
        return plan_from_mapping(data), origin_of(data)
    except SpecError as e:
        raise e.with_file(str(path)) from None


# --------------------------------------------------------------------------- plans belong to jobs


def job_fingerprint(job: Any) -> str:
    """12 hex digits of a SHA-256 over what a plan's numbers depend on: the model shape
    (every field but its name), the global batch and the precision. The fields beyond the
    dense GPT shape (MoE, MLA, ...) count where they differ from their defaults, so a dense
    model's fingerprint is the one it had before they existed."""
    defaults = {f.name: f.default for f in fields(ModelSpec)}
    shape = {k: v for k, v in asdict(job.model).items()
             if k != "name" and not (k in MODEL_EXTENSION_FIELDS and v == defaults[k])}
    doc = {"model": shape, "global_batch_size": job.global_batch_size, "precision": job.precision}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:12]


def job_record(job: Any) -> dict:
    """The ``job`` entry of a plan file."""
    m = job.model
    return {"name": job.name, "fingerprint": job_fingerprint(job), "global_batch_size": job.global_batch_size,
            "precision": job.precision, "model": m.name, "num_layers": m.num_layers, "hidden_size": m.hidden_size,
            "seq_length": m.seq_length}


@dataclass(frozen=True, kw_only=True)
class PlanOrigin:
    """The job and site a plan file says it was made for (None: not recorded)."""

    job: str | None = None
    fingerprint: str | None = None
    site: str | None = None
    job_detail: str = ""
    #: the performance options (:data:`~memx_hpc.spec.PERFORMANCE_OPTIONS`) a Megatron-runnable
    #: plan's file does not state: written before they existed, read as off
    unstated: tuple[str, ...] = ()


def origin_of(data: Any) -> PlanOrigin:
    if not isinstance(data, dict):
        return PlanOrigin()
    job, site = data.get("job"), data.get("site")
    site = site if isinstance(site, str) else None
    stages = data.get("stages")
    general = isinstance(stages, list) and any(isinstance(s, dict) and "replicas" in s for s in stages)
    unstated = () if general else tuple(k for k in PERFORMANCE_OPTIONS if k not in data)
    if isinstance(job, dict):
        detail = ", ".join(f"{k} {job[k]}" for k in ("model", "num_layers", "hidden_size", "seq_length",
                                                      "global_batch_size", "precision") if k in job)
        return PlanOrigin(job=str(job.get("name")), fingerprint=str(job.get("fingerprint") or "") or None,
                          site=site, job_detail=detail, unstated=unstated)
    return PlanOrigin(job=job if isinstance(job, str) else None, site=site, unstated=unstated)


def _job_words(job: Any) -> str:
    m = job.model
    return (f"model {m.name}, num_layers {m.num_layers}, hidden_size {m.hidden_size}, seq_length {m.seq_length}, "
            f"global_batch_size {job.global_batch_size}, precision {job.precision}")


def check_belongs(origin: PlanOrigin, path: str | os.PathLike, *, site: Any, job: Any) -> None:
    """SpecError (exit 1) when the plan file was made for another job or site, naming both.

    A job is the same when its fingerprint matches (a renamed job file with the same shape
    and batch is the same job); files without a fingerprint are compared by name only when
    they carry one, and plans without any record are accepted."""
    if origin.site is not None and origin.site != site.name:
        raise SpecError(f"this plan was made for site '{origin.site}', not '{site.name}' "
                        f"({site.source_file or '--site'}); plan again for this site, or pass the plan's own site file",
                        file=str(path), field="site", found=origin.site, allowed=site.name)
    if origin.fingerprint is not None:
        if origin.fingerprint != job_fingerprint(job):
            raise SpecError(f"this plan was made for job '{origin.job}' ({origin.job_detail}; fingerprint "
                            f"{origin.fingerprint}), not '{job.name}' from {job.source_file or '--job'} "
                            f"({_job_words(job)}; fingerprint {job_fingerprint(job)}); pass the plan's own job file "
                            f"or plan again for this job", file=str(path), field="job", found=origin.job,
                            allowed=job.name)
    elif origin.job is not None and origin.job != job.name:
        raise SpecError(f"this plan was made for job '{origin.job}', not '{job.name}' "
                        f"({job.source_file or '--job'}); pass the plan's own job file or plan again for this job",
                        file=str(path), field="job", found=origin.job, allowed=job.name)


def save_plan(plan: Plan, path: str | os.PathLike, **extra: Any) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(plan_to_dict(plan, **extra), f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
