"""``memx-hpc search``: search the plans of a site with the predictor the store supports.

Also the machinery ``plan`` and ``simulate`` share: the search options, loading (or
fitting) the cost model, and the report.
"""

from __future__ import annotations

import argparse
import sys

from .common import TABLE_WIDTH, add_job, add_json, add_site, emit_json, table

HELP = "search the plan space with the fitted predictor (no profiling) and report the best plans"
DESCRIPTION = """\
Enumerate every plan Megatron-LM can run on the site (TP, DP, micro-batch, pipeline
stages on partitions, layers per stage, recompute per stage), predict each one's
iteration time and per-GPU peak memory from the predictor fitted on the profile
store (refitted when the store changed; estimated from datasheet figures for GPU
types the store has nothing on), drop the plans that do not fit in memory, and
report three plans side by side:

  recommended  the fastest plan whose peak memory, widened by the predictor's
               measured error for each GPU type (the "mem+err" column), still fits;
               within 2 % of its time, lower and better-balanced memory wins
  fastest      the fastest plan that fits (site safety margin only)
  weighted     MemX's weighted product T^w_t * M^w_m * B^w_b (iteration time,
               worst-GPU memory utilisation, memory imbalance; --weights)

with one line each on time, memory headroom and out-of-memory risk (and, where a plan
that fits every GPU's memory but not the site's memory_safety_margin would be faster,
one line naming it and the margin that admits it: the margin is policy, not a call of
out of memory), the top-K of --objective's ranking, and writes into a new folder per run (--out/<run id>/, with
--out/latest pointing at it): plan-01.json ... in ranking order, recommended.json,
fastest.json, weighted.json, pareto.png and summary.json. Use 'memx-hpc plan' to
profile what is missing first.

Under MPI (.venv/bin/mpiexec -n N .venv/bin/memx-hpc search ... --mpi, or
srun --mpi=pmi2 -n N ...) the ranks split the space; the answer is the same as with
one process.

examples:
  memx-hpc search --site site_configs/example-cross-vendor.yaml --job jobs/gpt3-2.7b.yaml
  memx-hpc search --site S --job J --objective memx --weights time=1,memory=1 --top 5 --json
  .venv/bin/mpiexec -n 2 .venv/bin/memx-hpc search --site S --job J --mpi
"""


def _int_list(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected whole numbers >= 1, got {text!r}")
    return vals


def _at_least(minimum: int):  # noqa: ANN202 - an argparse type
    """An argparse type: a whole number >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {v}")
        return v

    return parse


_positive, _whole = _at_least(1), _at_least(0)


def _spread(text: str) -> int | None:
    if text == "any":
        return None
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0 or 'any', got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0 or 'any', got {v}")
    return v


def add_search_options(p: argparse.ArgumentParser, *, out: bool = True, top_default: int = 10,
                       top_help: str = "plans to report") -> None:
    """Options shared by plan, search, simulate and verify."""
    p.add_argument("--store", metavar="PATH", help="profile store (default: the site's store)")
    add_reference(p)
    p.add_argument("--objective", choices=("recommended", "memx"), default="recommended",
                   help="which ranking plan-01.json ... follow: 'recommended' (default: fastest plan that fits "
                        "with the memory error band) or 'memx' (the weighted product); all three picks are "
                        "always written")
    p.add_argument("--weights", metavar="W", default=None,
                   help="MemX's exponents, e.g. time=1,memory=0.5,balance=0.5 (default: the site's objective:, "
                        "else these); names left out are 0, so time=1 is the time-only ranking")
    p.add_argument("--top", type=_positive, default=top_default, metavar="K",
                   help=f"{top_help} (default {top_default})")
    if out:
        p.add_argument("--out", metavar="DIR", help="each run writes into DIR/<run id>/, DIR/latest points at the "
                                                    "newest (default DIR: the site's work_dir/plan-<job>)")
    add_json(p)
    from ..planner.ranks import MIN_PLANS_PER_RANK  # light: no numpy, no cost model
    p.add_argument("--mpi", action="store_true",
                   help="require MPI (mpiexec/srun); without it MPI is still used when launched under it")
    p.add_argument("--min-plans-per-rank", type=_whole, default=None, metavar="N",
                   help="under MPI, a space of fewer plans than N per rank is searched by rank 0 alone (starting "
                        "a rank costs more than its share of a small search; a note says so); 0: every rank "
                        f"searches (default {MIN_PLANS_PER_RANK})")
    p.add_argument("--analytic", action="store_true",
                   help="use the datasheet roofline model only, even where the store has measurements")
    p.add_argument("--no-cache", action="store_true",
                   help="do not use the signature cache: ask the cost model for every stage of every plan")
    g = p.add_argument_group("search space")
    g.add_argument("--layer-granularity", type=_positive, metavar="G",
                   help="layers per partition group are multiples of G (default: num_layers // 8)")
    g.add_argument("--max-stages", type=_positive, metavar="N",
                   help="most pipeline stages (default: the job's max_pipeline_stages, else 4)")
    g.add_argument("--recompute-spread", type=_spread, default=0, metavar="S",
                   help="how far recompute levels of one partition's stages may differ (0 = one level per "
                        "partition, the default; 'any')")
    g.add_argument("--full-recompute-steps", type=_positive, default=2, metavar="N",
                   help="full recompute on ceil(n*j/N) of a stage's n layers, j = 1..N (default 2)")
    g.add_argument("--tp", type=_int_list, metavar="LIST", help="tensor-parallel degrees (default: powers of two)")
    g.add_argument("--tp-across-nodes", action="store_true",
                   help="also place TP groups over whole nodes (TP a multiple of a partition's GPUs per node; "
                        "their collectives priced on the inter-node link); with --tp for degrees above the "
                        "largest node, e.g. --tp 8,16 on 8-GPU nodes")
    g.add_argument("--micro-batch-sizes", type=_int_list, metavar="LIST",
                   help="micro-batch sizes (default: the job's)")
    g.add_argument("--split-within-groups", action="store_true",
                   help="enumerate every stage's layer count on the grid, not only per partition")
    g.add_argument("--sequence-parallel", choices=("search", "on", "off"), default="search",
                   help="sequence parallelism for plans with TP > 1: searched with and without (default), "
                        "always on, or off")
    g.add_argument("--selective-with-sdpa", action="store_true",
                   help="also enumerate selective recompute under fused attention")
    g.add_argument("--no-overlap", action="store_true",
                   help="plans without Megatron's --overlap-grad-reduce and --overlap-param-gather (default: on "
                        "wherever the launched Megatron-LM runs them, priced and written into the script)")
    # the default now; kept so that scripts that passed it still run (with a note)
    g.add_argument("--overlap-grad-reduce", action="store_true",
                   help="deprecated: gradient-reduce overlap is the default now (see --no-overlap)")
    g.add_argument("--block-size", type=_positive, default=65536, help=argparse.SUPPRESS)


def add_reference(p: argparse.ArgumentParser) -> None:
    """--no-reference: a store that does not exist yet starts empty."""
    p.add_argument("--no-reference", action="store_true",
                   help="a profile store that does not exist yet starts empty instead of from the shipped "
                        "reference profiles (Sailor's and Cephalo's published measurements; the site's "
                        "'reference_data: false' does the same)")


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("search", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_site(p)
    add_job(p)
    add_search_options(p)
    return p


def run(args: argparse.Namespace) -> int:
    return execute(args, profile_first=False)


# --------------------------------------------------------------------------- arguments -> request


def space_options(args: argparse.Namespace):
    from ..planner import SpaceOptions
    return SpaceOptions(layer_granularity=args.layer_granularity, max_pipeline_stages=args.max_stages,
                        tp_degrees=args.tp or (), micro_batch_sizes=args.micro_batch_sizes or (),
                        full_recompute_steps=args.full_recompute_steps, recompute_spread=args.recompute_spread,
                        split_within_groups=args.split_within_groups, sequence_parallel={"search": None, "on": True, "off": False}[args.sequence_parallel],
                        selective_with_sdpa=args.selective_with_sdpa,
                        tp_across_nodes=getattr(args, "tp_across_nodes", False), overlap=not args.no_overlap)


def min_plans_per_rank(args: argparse.Namespace) -> int:
    from ..planner import MIN_PLANS_PER_RANK
    given = getattr(args, "min_plans_per_rank", None)
    return MIN_PLANS_PER_RANK if given is None else given


def follow_rank0(args: argparse.Namespace) -> bool | None:
    """Under MPI, on a rank other than 0: wait for rank 0 to say whether the space is large
    enough to share, before anything heavy is imported (:mod:`memx_hpc.planner.ranks`). True:
    rank 0 searched alone, this rank has nothing to do; False: search with every rank; None:
    rank 0, or no MPI."""
    from ..planner import ranks_follow
    return ranks_follow("require" if args.mpi else "auto", min_plans_per_rank(args), getattr(args, "finish", None))


def leading(args: argparse.Namespace, error) -> None:
    """Rank 0 failed before the planner told the other ranks anything: tell them (they stop
    with the same error instead of waiting)."""
    from ..planner import tell_ranks_failed
    tell_ranks_failed("require" if args.mpi else "auto", min_plans_per_rank(args), getattr(args, "finish", None),
                      error)


def request_from_args(args: argparse.Namespace, *, profile: bool = False, site=None, job=None,
                      follower: bool = False):
    """The :class:`~memx_hpc.planner.PlanRequest` the search options describe; ``site`` and
    ``job`` replace the files named by --site/--job when given (already loaded). ``follower``:
    a rank other than 0 that rank 0 told to search with every rank (it decides nothing more)."""
    from ..planner import PlanRequest

    no_profile = profile and getattr(args, "no_profile", False)
    finish = getattr(args, "finish", None)
    if finish is not None:
        from ..planner import parse_finish
        finish = parse_finish(finish)
    return PlanRequest(site=site if site is not None else args.site, job=job if job is not None else args.job,
                       store=args.store, weights=args.weights, space=space_options(args),
                       top_k=args.top,
                       block_size=args.block_size, profile=profile and not no_profile,
                       allow_datasheet=getattr(args, "allow_datasheet", False),
                       out_dir=getattr(args, "out", None), mpi="require" if args.mpi else "auto",
                       analytic=args.analytic, use_cache=not args.no_cache,
                       objective=getattr(args, "objective", "recommended"), finish=finish,
                       min_plans_per_rank=0 if follower else min_plans_per_rank(args),
                       reference=False if getattr(args, "no_reference", False) else None,
                       notes=(("--no-profile: searched with what the store already holds",) if no_profile else ())
                       + ((OVERLAP_FLAG_NOTE,) if args.overlap_grad_reduce else ()))


OVERLAP_FLAG_NOTE = ("--overlap-grad-reduce is deprecated and changes nothing: every plan whose launch runs it has "
                     "Megatron's --overlap-grad-reduce (and --overlap-param-gather with the distributed optimizer) "
                     "by default, priced and written into the script; --no-overlap turns both off")


def _link_rows(cost_model) -> list[dict]:
    from ..search.report import link_rows
    return link_rows(cost_model.links if cost_model is not None else None)


PROVENANCE_WORDS = {"measured": "measured by the profiler", "imported": "imported measurements",
                    "augmented": "interpolated from measurements (augmented)",
                    "datasheet-only": "estimated from datasheet figures only"}


def execute(args: argparse.Namespace, *, profile_first: bool) -> int:
    from ..errors import MemxError

    follows = follow_rank0(args)
    if follows:
        return 0
    try:
        request = request_from_args(args, profile=profile_first, follower=follows is False)
    except MemxError as e:
        if follows is None:
            leading(args, e)
        raise
    from ..planner import plan

    outcome = plan(request)
    if not outcome.rank0:
        return 0
    report(outcome, args)
    return 0


def report(run, args: argparse.Namespace) -> None:
    """Print a :class:`~memx_hpc.planner.PlanResult` (table or --json); SpecError when no plan fits."""
    from ..errors import SpecError

    if args.json:
        emit_json(run.summary)
    else:
        print_report(run.search, run.site, run.job, run.provenance, run.notes, run.files,
                     objective=run.objective, bands=run.bands, out_dir=run.out_dir if run.files else None,
                     links=_link_rows(run.cost_model))
    if not run.search.top:
        site, job = run.site, run.job
        if run.search.stats.plans == 0:
            from ..planner import why_empty
            field, why = why_empty(site, job, space_options(args))
            raise SpecError(f"no plan was generated, so none was predicted: {why}", field=field,
                            file=job.source_file if field not in ("--tp", "--micro-batch-sizes", "--max-stages")
                            else None)
        aside = run.search.margin_aside_count
        inside = (f"; {aside:,} of them fit the GPUs' capacity and only the margin sets them aside (the report "
                  f"above names the fastest and the memory_safety_margin that admits it)" if aside else "")
        raise SpecError(f"none of the {run.search.stats.plans:,} plans fits in memory on {site.name} "
                        f"(capacity minus the {site.memory_safety_margin:.0%} safety margin){inside}; allow more "
                        f"recompute, smaller micro-batches, more pipeline stages (--max-stages), or add GPUs",
                        file=job.source_file)


def print_report(result, site, job, provenance, notes, files, *, stream=None, objective: str = "recommended",
                 bands=None, out_dir=None, links=None) -> None:
    from ..search.report import ROLES, explain, table_footer, table_rows
    out = stream or sys.stdout
    st = result.stats
    parts = ", ".join(f"{p.name} {p.total_gpus}x {p.gpu_type}" for p in site.partitions)
    m = job.model
    print(f"site {site.name}: {site.total_gpus} GPUs ({parts})", file=out)
    print(f"job {job.name}: {m.name}, {m.num_layers} layers, hidden {m.hidden_size}, global batch "
          f"{job.global_batch_size}, seq {m.seq_length}, {job.precision}", file=out)
    print("numbers from (expected peak-memory error):", file=out)
    for g, v in provenance.items():
        b = (bands or {}).get(g)
        print(f"  {g}: {PROVENANCE_WORDS.get(v, v)}" + (f"; +-{b.fraction:.0%} ({b.short_source()})" if b else ""),
              file=out)
    if bands:
        print("  (the recommended plan widens each GPU's predicted peak by its type's error; a plan whose widened "
              "peak exceeds the memory may run out; the benchmark lines: summary.json, memory_error)", file=out)
    c = st.cache
    sp = st.space
    print(f"searched {st.plans:,} plans ({st.feasible:,} fit in memory, {result.risk_feasible:,} also with the "
          f"error band) in {st.seconds:.2f} s ({st.plans_per_s:,.0f} plans/s, {st.ranks} "
          f"rank{'s' if st.ranks > 1 else ''}); space: TP {sp['tp']}, micro-batch {sp['micro_batch_sizes']}, up to "
          f"{sp['max_pipeline_stages']} stages, layer grid {sp['layer_granularity']}, recompute "
          f"{', '.join(sp['recompute_levels'])}", file=out)
    print(f"signature cache: {c['unique']} signatures ({c['file_hits']} from {c['path'] or 'memory'}, "
          f"{c['predicted']} predicted"
          + (f", {c['invalidated']} stale rows dropped" if c["invalidated"] else "")
          + f"); {c['lookups']:,} stage look-ups, hit rate {c['hit_rate']:.2%}", file=out)
    if result.top:
        names = {role: fname for role, fname, _ in ROLES}
        print("\nthe three picks:", file=out)
        for line in explain(result, bands=bands, files=names if files else None, margin=site.memory_safety_margin,
                            provenance=provenance, links=links):
            print("  " + line, file=out)
        ranked = result.ranking(objective)
        what = ("recommended ranking (the plans within the time noise of the fastest safe plan by memory, then "
                "the other safe plans by time)" if objective == "recommended" else
                f"MemX's T^{result.weights.time:g} * M^{result.weights.memory:g} * B^{result.weights.balance:g}")
        if ranked:
            print(f"\ntop {len(ranked)}, {what}:", file=out)
            header, rows = table_rows(ranked, site)
            table(rows, header, file=out, drop_empty=True, max_width=TABLE_WIDTH)
            print(table_footer(result, site), file=out)
        print(f"Pareto front (time vs peak memory): {len(result.pareto)} plans", file=out)
    else:
        for line in explain(result, margin=site.memory_safety_margin):  # nothing fits: what the margin set aside
            print(line, file=out)
    if files and out_dir is not None:
        print(f"\nwrote {len(files)} files into {out_dir} ({out_dir.parent / 'latest'} points there): "
              f"plan-01.json ... , recommended.json, fastest.json, weighted.json, pareto.png, summary.json", file=out)
    elif files:
        print("\nwrote: " + ", ".join(files[:2]) + (f", ... ({len(files)} files)" if len(files) > 2 else ""),
              file=out)
    for n in notes:
        print(f"note: {n}", file=out)
