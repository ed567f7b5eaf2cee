"""``memx-hpc predict``: iteration time, per-stage time and per-GPU peak memory of one plan."""

from __future__ import annotations

import argparse

from .common import TABLE_WIDTH, add_job, add_json, add_site, emit_json, table

HELP = "predict one plan file: iteration time, per-stage time, per-GPU peak memory"
DESCRIPTION = """\
Predict a plan given as a plan JSON (memx-plan/1, as 'plan' writes them). Besides
Megatron-runnable plans (uniform TP and DP, stages on partitions) it accepts general
plans as other planners produce them: per stage a list of data-parallel replicas,
each with its own GPU type and TP degree, mixed GPU types inside a stage. A stage's
time is then its slowest replica's, and its gradient synchronisation runs over the
slowest link between its replicas. General plans are predicted, never rendered.

  {"format": "memx-plan/1", "micro_batch_size": 1, "global_batch_size": 64,
   "stages": [{"num_layers": 16, "recompute": "none",
               "replicas": [{"gpu_type": "A100-40", "tp": 2}, {"gpu_type": "V100-16", "tp": 4}]},
              {"num_layers": 16, "replicas": [{"gpu_type": "A100-40", "tp": 2, "partition": "gpu_a100"}]}]}

examples:
  memx-hpc predict --site S --job J --plan memx-runs/plan-llama2-7b/latest/recommended.json
  memx-hpc predict --site S --job J --plan sailor-plan.json --json
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("predict", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_site(p)
    add_job(p)
    p.add_argument("--plan", required=True, metavar="PLAN.json", help="the plan file")
    p.add_argument("--store", metavar="PATH", help="profile store (default: the site's store)")
    p.add_argument("--analytic", action="store_true", help="datasheet roofline only")
    from .search import add_reference
    add_reference(p)
    p.add_argument("--overlap-grad-reduce", action="store_true",
                   help="model Megatron's --overlap-grad-reduce")
    add_json(p)
    return p


def run(args: argparse.Namespace) -> int:
    from ..planfile import check_belongs, load_plan_with_origin
    from ..model.compose import CostOptions, predict_general, predict_plan
    from ..spec import GeneralPlan, load_job, load_site
    from ..planner import load_cost_model, provenance_of, store_paths
    from .search import PROVENANCE_WORDS

    site = load_site(args.site)
    job = load_job(args.job)
    plan, origin = load_plan_with_origin(args.plan)
    check_belongs(origin, args.plan, site=site, job=job)
    notes: list[str] = []
    if plan.global_batch_size != job.global_batch_size:
        # the plan's own batch: a plan is predicted as it would run
        import dataclasses
        notes.append(f"the plan's global batch {plan.global_batch_size} is used, not the job file's "
                     f"{job.global_batch_size}")
        job = dataclasses.replace(job, global_batch_size=plan.global_batch_size)
    store = store_paths(site, args.store).store
    model = load_cost_model(site, job, store, analytic=args.analytic, notes=notes,
                            reference=False if args.no_reference else None)
    opts = CostOptions(overlap_grad_reduce=args.overlap_grad_reduce)
    try:
        if isinstance(plan, GeneralPlan):
            pred = predict_general(plan, site, job, model, options=opts)
        else:
            pred = predict_plan(plan, site, job, model, options=opts)
    except Exception as e:
        from ..errors import SpecError
        if isinstance(e, SpecError):
            raise e.with_file(str(args.plan)) from None
        raise
    gpus = sorted({s.gpu_type for s in pred.stages})
    provenance = {g: model.provenance(g) for g in gpus}
    provenance.update({g: v for g, v in provenance_of(model, site).items() if g in gpus})
    from ..spec.catalog import precision_notes
    from ..planner import error_bands
    notes += precision_notes(site, job, gpu_types=gpus)
    from ..search.objective import risk_utilisation
    bands = error_bands(model, site, job, store, notes)
    risk = risk_utilisation(pred, bands)
    links = plan_links(model, pred)
    sources = getattr(model, "sources", None) or getattr(getattr(model, "base", None), "sources", None)
    disagree = sources.to_json(gpus) if sources is not None else []
    if args.json:
        d = pred.to_dict()
        d.update({"plan": str(args.plan), "general": isinstance(plan, GeneralPlan), "provenance": provenance,
                  "links": links, "source_disagreements": disagree, "notes": notes, "risk_utilisation": risk,
                  "memory_error": {g: b.fraction for g, b in bands.items() if g in gpus}})
        emit_json(d)
        return 0
    kind = "general plan (predict only; never rendered)" if isinstance(plan, GeneralPlan) else "plan"
    print(f"{kind} {args.plan}: {len(pred.stage_ms)} stages, {pred.num_microbatches} micro-batches of "
          f"{plan.micro_batch_size}, global batch {plan.global_batch_size}")
    print(f"iteration {pred.iteration_ms / 1e3:.3f} s (pipeline {pred.pipeline_ms / 1e3:.3f} s), "
          f"{pred.tokens_per_s:,.0f} tokens/s; worst GPU at {pred.max_utilisation:.1%} of its memory, "
          f"balance {pred.balance:.3f}")
    if not pred.feasible:
        print(f"DOES NOT FIT: {pred.reason}")
    else:
        print("with each GPU type's expected peak-memory error ("
              + ", ".join(f"{g} +{bands[g].fraction:.0%}" for g in gpus if g in bands)
              + f"): fullest GPU at {risk:.0%} of its memory"
              + (": fits" if risk <= 1.0 else ": MAY RUN OUT OF MEMORY (inside the error band)"))
    rows = []
    for s in pred.stages:
        rows.append([s.stage, s.replica, s.partition or "-", s.gpu_type, s.tp, s.num_layers, s.recompute.label(),
                     s.forward_ms, s.backward_ms, s.in_flight, f"{s.peak_bytes / 2**30:.2f}",
                     f"{s.capacity_bytes / 2**30:.1f}", f"{s.utilisation:.1%}", s.grad_sync_ms, s.finish_ms])
    table(rows, ["stage", "rep", "partition", "gpu", "tp", "layers", "recompute", "fwd ms", "bwd ms", "in flight",
                 "peak GiB", "cap GiB", "util", "dp ms", "done ms"], drop_empty=True, max_width=TABLE_WIDTH)
    print("rep: data-parallel replica; in flight: micro-batches whose activations a stage holds at once; dp ms: "
          "gradient synchronisation")
    print("numbers from: " + "; ".join(f"{g}: {PROVENANCE_WORDS.get(v, v)}" for g, v in provenance.items()))
    for r in links:
        print(f"link {r['link']} {r['scope']}: {r['provenance']}, {r['gbps_at_64MiB']} GB/s at 64 MiB ({r['source']})")
    for n in notes:
        print(f"note: {n}")
    return 0


def plan_links(model, pred) -> list[dict]:
    """The links a predicted plan's stages use (:meth:`memx_hpc.model.links.LinkModel.describe`
    rows between its partitions): where each figure came from. Empty for a model without links."""
    links = getattr(model, "links", None)
    if links is None:
        return []
    parts = {s.partition for s in pred.stages if s.partition}
    return [r for r in links.describe() if {x.strip() for x in r["link"].split("<->")} <= parts]
