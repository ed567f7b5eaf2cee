"""The plan JSON format (``memx-plan/1``), read and written in one place.

A Megatron-runnable plan::

    {"format": "memx-plan/1", "tp": 2, "dp": 1, "micro_batch_size": 1,
     "global_batch_size": 64, "sequence_parallel": false,
     "stages": [{"partition": "gpu_a100", "num_layers": 14, "recompute": "none"},
                {"partition": "gpu_v100", "num_layers": 10, "recompute": "full:4"}]}

``recompute`` is ``none``, ``selective``, ``full`` (all layers of the stage) or
``full:K`` (K of its layers). A general plan, as other planners produce them, gives
per stage a list of data-parallel replicas, each with its own GPU type and TP::

    {"format": "memx-plan/1", "micro_batch_size": 1, "global_batch_size": 64,
     "stages": [{"num_layers": 16, "replicas": [{"gpu_type": "A100-40", "tp": 2},
                                                 {"gpu_type": "V100-16", "tp": 4}]}, ...]}

General plans can be predicted but never rendered. Extra top-level keys written by
``plan`` (``prediction``, ``job``, ``site``, ``rank``) are kept for people and ignored on read.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .errors import SpecError
from .spec import GeneralPlan, GeneralStage, Plan, Recompute, Replica, Stage, _Reader, load_json

FORMAT = "memx-plan/1"
_EXTRA = ("format", "prediction", "job", "site", "rank", "score", "provenance", "note")


def parse_recompute(text: Any, field: str) -> Recompute:
    if text is None:
        return Recompute()
    if not isinstance(text, str):
        raise SpecError("expected none, selective, full or full:K", field=field, found=text)
    mode, _, k = text.partition(":")
    try:
        return Recompute(mode=mode, num_layers=int(k) if k else None)
    except (SpecError, ValueError):
        raise SpecError("expected none, selective, full or full:K", field=field, found=text) from None


def plan_to_dict(plan: Plan, **extra: Any) -> dict:
    d = {"format": FORMAT, "tp": plan.tp, "dp": plan.dp, "micro_batch_size": plan.micro_batch_size,
         "global_batch_size": plan.global_batch_size, "sequence_parallel": plan.sequence_parallel,
         "stages": [{"partition": s.partition, "num_layers": s.num_layers, "recompute": s.recompute.label()}
                    for s in plan.stages]}
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
                reps.append(Replica(gpu_type=rr.str("gpu_type"), tp=rr.int("tp", min=1),
                                    partition=rr.str("partition", None)))
                rr.finish()
            if not reps:
                raise SpecError("a stage needs at least one replica", field=sr._p("replicas"))
            gstages.append(GeneralStage(num_layers=sr.int("num_layers", min=1), replicas=tuple(reps),
                                        recompute=parse_recompute(sr.raw("recompute", None), sr._p("recompute"))))
            sr.finish()
        r.finish()
        return GeneralPlan(micro_batch_size=mbs, global_batch_size=gbs, stages=tuple(gstages))
    out = []
    for sr in stages:
        out.append(Stage(partition=sr.str("partition"), num_layers=sr.int("num_layers", min=1),
                         recompute=parse_recompute(sr.raw("recompute", None), sr._p("recompute"))))
        sr.finish()
    tp = r.int("tp", min=1)
    dp = r.int("dp", min=1)
    sp = r.bool("sequence_parallel", False)
    r.finish()
    try:
        return Plan(tp=tp, dp=dp, micro_batch_size=mbs, global_batch_size=gbs, stages=tuple(out),
                    sequence_parallel=sp)
    except SpecError as e:
        raise SpecError(e.detail, field=e.field or "plan", found=e.found) from None


def load_plan(path: str | os.PathLike) -> Plan | GeneralPlan:
    data = load_json(path)  # bounded: size, depth, duplicate keys
    try:
        return plan_from_mapping(data)
    except SpecError as e:
        raise e.with_file(str(path)) from None


def save_plan(plan: Plan, path: str | os.PathLike, **extra: Any) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(plan_to_dict(plan, **extra), f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
