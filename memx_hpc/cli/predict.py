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
    p.add_argument("--overlap-grad-reduce", nargs=0, action=_PlanDecidesOverlap, help=argparse.SUPPRESS)
    add_json(p)
    return p


class _PlanDecidesOverlap(argparse.Action):
    """The flag predict once had: the plan file now carries its overlap options (what render
    writes), so a flag here would price a run that does not happen: refused, saying where."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # noqa: ANN001
        parser.error("--overlap-grad-reduce is no longer a predict option: the plan file's own overlap_grad_reduce "
                     "and overlap_param_gather are priced (they are what render writes into the script); set them "
                     "in the plan file, or plan again (a plan file without them reads as both off)")


def run(args: argparse.Namespace) -> int:
    from ..planner import PredictRequest, predict
    from .search import PROVENANCE_WORDS

    res = predict(PredictRequest(site=args.site, job=args.job, plan=args.plan, store=args.store,
                                 analytic=args.analytic, reference=False if args.no_reference else None))
    plan, pred, bands, risk, links, notes = res.plan, res.prediction, res.bands, res.risk, res.links, res.notes
    gpus, provenance = res.gpu_types, res.provenance
    if args.json:
        d = pred.to_dict()
        d.update({"plan": str(args.plan), "general": res.general, "provenance": provenance,
                  "links": links, "source_disagreements": res.disagreements, "notes": notes, "risk_utilisation": risk,
                  "memory_error": {g: b.fraction for g, b in bands.items() if g in gpus}})
        emit_json(d)
        return 0
    kind = "general plan (predict only; never rendered)" if res.general else "plan"
    print(f"{kind} {args.plan}: {len(pred.stage_ms)} stages, {pred.num_microbatches} micro-batches of "
          f"{plan.micro_batch_size}, global batch {plan.global_batch_size}")
    print(f"iteration {pred.iteration_ms / 1e3:.3f} s (pipeline {pred.pipeline_ms / 1e3:.3f} s), "
          f"{pred.tokens_per_s:,.0f} tokens/s; worst GPU at {pred.max_utilisation:.1%} of its memory, "
          f"balance {pred.balance:.3f}")
    if not pred.feasible and pred.max_utilisation <= 1.0:
        from ..search.report import admitting_margin
        print(f"OVER THE SAFETY MARGIN, not out of memory: {pred.reason}; every GPU's peak fits its capacity, and "
              f"memory_safety_margin: {admitting_margin(pred.max_utilisation):g} in the site file would admit it")
    elif not pred.feasible:
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
