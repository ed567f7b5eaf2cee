"""``memx-hpc simulate``: search larger versions of the site (replicated partitions)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from .common import add_job, add_site, emit_json, table
from .search import _int_list, add_search_options, load_cost_model, provenance_of, search_options, space_options

HELP = "search the site scaled up to more GPUs (replicated partitions) and report search time and plans"
DESCRIPTION = """\
Scale the site to larger GPU counts by replicating each partition's nodes (the
ratio of GPU types is kept), search each scaled site with the same predictor, and
report the space size, search time and the best plans found, as the MemX paper does
for 40 and 60 GPUs. The best plan of each scale is re-timed with the event-driven
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


def scale_site(site, gpus: int):
    """``site`` with every partition's node count multiplied by ``gpus / site.total_gpus``
    (rounded, at least one node)."""
    from ..errors import SpecError
    factor = gpus / site.total_gpus
    parts = tuple(dataclasses.replace(p, nodes=max(1, round(p.nodes * factor))) for p in site.partitions)
    scaled = dataclasses.replace(site, partitions=parts, name=f"{site.name}-x{factor:g}")
    if scaled.total_gpus < 1:  # pragma: no cover - nodes >= 1
        raise SpecError("scaled site has no GPUs", field="--scale", found=gpus)
    return scaled


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..search.cache import PredictionCache
    from ..search.engine import launched_under_mpi, mpi_comm, search
    from ..search.report import ProgressBar, scored_to_dict, stage_summary
    from ..model.schedule import closed_form_ms, simulate_1f1b
    from ..search.space import PlanSpace
    from ..spec import load_job, load_site

    site = load_site(args.site)
    job = load_job(args.job)
    opts = search_options(args, site)
    sopts = space_options(args)
    comm = mpi_comm(required=True) if args.mpi else (mpi_comm() if launched_under_mpi() else None)
    rank0 = comm is None or comm.Get_rank() == 0
    notes: list[str] = []
    from pathlib import Path
    store_path = Path(args.store) if args.store else site.store
    if comm is not None and not rank0:
        comm.barrier()
    model = load_cost_model(site, job, store_path, analytic=args.analytic, notes=notes)
    if comm is not None and rank0:
        comm.barrier()
    scales = args.scale or (site.total_gpus * 2, site.total_gpus * 3)
    cache = None
    if not args.no_cache:
        cache = PredictionCache(identity=model.identity, path=site.cache if not args.store
                                else store_path.with_suffix(".cache.sqlite"))
    rows, out = [], []
    for gpus in (site.total_gpus,) + tuple(s for s in scales if s != site.total_gpus):
        s = site if gpus == site.total_gpus else scale_site(site, gpus)
        t0 = time.perf_counter()
        space = PlanSpace(s, job, sopts)
        res = search(space, model, options=opts, cache=cache, comm=comm,
                     progress=ProgressBar(f"search {s.total_gpus} GPUs", enabled=rank0))
        wall = time.perf_counter() - t0
        if not rank0:
            continue
        entry = {"gpus": s.total_gpus, "partitions": {p.name: p.total_gpus for p in s.partitions},
                 "plans": res.stats.plans, "feasible": res.stats.feasible, "search_s": wall,
                 "plans_per_s": res.stats.plans / wall if wall > 0 else None, "ranks": res.stats.ranks,
                 "peak_rss_bytes": res.stats.peak_rss_bytes, "top": [scored_to_dict(x) for x in res.top]}
        if res.top:
            best = res.top[0]
            st = best.prediction.stages
            f = [x.forward_ms for x in st]
            b = [x.backward_ms for x in st]
            c = [x.send_ms for x in st[:-1]]
            m = best.prediction.num_microbatches
            sim = simulate_1f1b(f, b, c, m)
            textbook = float(closed_form_ms(np.array(f), np.array(b), np.array(c), m))
            entry["best_check"] = {"pipeline_ms_search": best.prediction.pipeline_ms,
                                   "pipeline_ms_event_driven": sim.total_ms, "pipeline_ms_textbook": textbook,
                                   "bubble_fraction": sim.bubble_fraction}
            rows.append([s.total_gpus, res.stats.plans, res.stats.feasible, f"{wall:.2f}",
                         f"{res.stats.plans / wall:,.0f}", f"{res.stats.peak_rss_bytes / 2**20:.0f}",
                         f"{best.prediction.iteration_ms / 1e3:.3f}", f"{best.prediction.tokens_per_s:,.0f}",
                         f"{best.prediction.max_utilisation:.0%}",
                         f"{(textbook / sim.total_ms - 1) * 100:+.1f}%",
                         f"tp{best.plan.tp} dp{best.plan.dp} mbs{best.plan.micro_batch_size} "
                         + stage_summary(best.plan)])
        else:
            rows.append([s.total_gpus, res.stats.plans, 0, f"{wall:.2f}", "-", "-", "-", "-", "-", "-",
                         "no plan fits"])
        out.append(entry)
    if not rank0:
        return 0
    if args.json:
        emit_json({"site": site.name, "job": job.name, "weights": opts.weights.label(), "scales": out,
                   "provenance": provenance_of(model, site), "notes": notes})
        return 0
    print(f"{job.name} on {site.name} scaled by replicating partitions; weights {opts.weights.label()}")
    table(rows, ["GPUs", "plans", "feasible", "search s", "plans/s", "peak RSS MiB", "best iter s", "tokens/s",
                 "worst GPU", "textbook vs sim", "best plan"])
    print("textbook vs sim: the closed form sum(f+b) + (m-1) max(f+b) against the event-driven 1F1B "
          "simulator on the best plan's stages (the search uses the simulator's schedule)")
    for n in notes:
        print(f"note: {n}", file=sys.stdout)
    return 0
