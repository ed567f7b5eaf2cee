"""``memx-hpc simulate``: search larger versions of the site (replicated partitions)."""

from __future__ import annotations

import argparse
import sys

from .common import add_job, add_site, emit_json, table
from .search import _int_list, add_search_options, request_from_args

HELP = "search the site scaled up to more GPUs (replicated partitions) and report search time and plans"
DESCRIPTION = """\
Scale the site to larger GPU counts by replicating each partition's nodes (the
ratio of GPU types is kept), search each scaled site with the same predictor, and
report the space size, search time and the best plan found, as the MemX paper does
for 40 and 60 GPUs. The best plan is ranked as 'plan' ranks it: the recommended plan
(--objective memx: MemX's weighted product). The best plan of each scale is re-timed with the event-driven
1F1B simulator (the search evaluates the same schedule vectorised), and compared with
the textbook closed form sum(f+b) + (m-1) max(f+b).

examples:
  memx-hpc simulate --site site_configs/example-cross-vendor.yaml --job jobs/gpt3-2.7b.yaml --scale 40,60
  mpiexec -n 2 memx-hpc simulate --site S --job J --scale 60 --mpi
"""


def _scales(text: str) -> tuple[int, ...]:
    """GPU counts like ``40,60`` (the same rule as every comma-separated option)."""
    return _int_list(text)


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("simulate", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_site(p)
    add_job(p)
    p.add_argument("--scale", type=_scales, default=None, metavar="N,N",
                   help="GPU counts to scale the site to (default: 2x and 3x the site)")
    add_search_options(p, out=False)
    return p


def run(args: argparse.Namespace) -> int:
    from ..planner import simulate_scales
    from ..search.report import scored_to_dict, stage_summary

    run_ = simulate_scales(request_from_args(args), args.scale)
    if not run_.rank0:
        return 0
    site, job, opts, notes = run_.site, run_.job, run_.options, run_.notes
    rows, out = [], []
    for sc in run_.scales:
        s, res, wall = sc.site, sc.search, sc.wall_s
        ranked = res.ranking(args.objective)  # as 'plan' ranks: the recommended plan first by default
        entry = {"gpus": s.total_gpus, "partitions": {p.name: p.total_gpus for p in s.partitions},
                 "plans": res.stats.plans, "feasible": res.stats.feasible, "search_s": wall,
                 "plans_per_s": res.stats.plans / wall if wall > 0 else None, "ranks": res.stats.ranks,
                 "peak_rss_bytes": res.stats.peak_rss_bytes, "objective": args.objective,
                 "top": [scored_to_dict(x) for x in ranked]}
        if ranked:
            best = ranked[0]
            check = entry["best_check"] = sc.best_check
            rows.append([s.total_gpus, res.stats.plans, res.stats.feasible, f"{wall:.2f}",
                         f"{res.stats.plans / wall:,.0f}", f"{res.stats.peak_rss_bytes / 2**20:.0f}",
                         f"{best.prediction.iteration_ms / 1e3:.3f}", f"{best.prediction.tokens_per_s:,.0f}",
                         f"{best.prediction.max_utilisation:.0%}",
                         f"{(check['pipeline_ms_textbook'] / check['pipeline_ms_event_driven'] - 1) * 100:+.1f}%",
                         f"tp{best.plan.tp} dp{best.plan.dp} mbs{best.plan.micro_batch_size} "
                         + stage_summary(best.plan)])
        else:
            rows.append([s.total_gpus, res.stats.plans, 0, f"{wall:.2f}", "-", "-", "-", "-", "-", "-",
                         "no plan fits"])
        out.append(entry)
    if args.json:
        emit_json({"site": site.name, "job": job.name, "weights": opts.weights.label(), "scales": out,
                   "provenance": run_.provenance, "notes": notes})
        return 0
    best_is = ("the recommended plan, as 'plan' recommends it (fastest whose peak plus its error band fits)"
               if args.objective == "recommended" else f"MemX's weighted best ({opts.weights.label()})")
    print(f"{job.name} on {site.name} scaled by replicating partitions; best plan: {best_is}")
    table(rows, ["GPUs", "plans", "feasible", "search s", "plans/s", "peak RSS MiB", "best iter s", "tokens/s",
                 "worst GPU", "textbook vs sim", "best plan"])
    print("textbook vs sim: the closed form sum(f+b) + (m-1) max(f+b) against the event-driven 1F1B "
          "simulator on the best plan's stages (the search uses the simulator's schedule)")
    for n in notes:
        print(f"note: {n}", file=sys.stdout)
    return 0
