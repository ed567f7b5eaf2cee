"""``memx-hpc search``: search the plans of a site with the predictor the store supports.

Also the machinery ``plan`` and ``simulate`` share: the search options, loading (or
fitting) the cost model, and the report.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import add_job, add_json, add_site, emit_json, table

HELP = "search the plan space with the fitted predictor (no profiling) and report the best plans"
DESCRIPTION = """\
Enumerate every plan Megatron-LM can run on the site (TP, DP, micro-batch, pipeline
stages on partitions, layers per stage, recompute per stage), predict each one's
iteration time and per-GPU peak memory from the predictor fitted on the profile
store (refitted when the store changed; estimated from datasheet figures for GPU
types the store has nothing on), drop the plans that do not fit in memory, and rank
the rest by T^w_t * M^w_m * B^w_b (iteration time, worst-GPU memory utilisation,
memory imbalance). Prints the top-K table beside the time-only ranking, writes one
plan JSON per plan, a Pareto-front PNG and summary.json. Use 'memx-hpc plan' to
profile what is missing first.

Under MPI (mpiexec -n N memx-hpc search ..., or srun --mpi=pmi2) the ranks split
the space; the answer is the same as with one process.

examples:
  memx-hpc search --site site_configs/example-cross-vendor.yaml --job jobs/gpt3-2.7b.yaml
  memx-hpc search --site S --job J --weights time=1,memory=0 --top 5 --json
  mpiexec -n 2 memx-hpc search --site S --job J --mpi
"""


def _int_list(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected whole numbers >= 1, got {text!r}")
    return vals


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {v}")
    return v


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
    p.add_argument("--weights", metavar="W", default=None,
                   help="objective exponents, e.g. time=1,memory=0.5,balance=0.5 (the default); "
                        "time=1,memory=0,balance=0 is the time-only ranking")
    p.add_argument("--top", type=_positive, default=top_default, metavar="K",
                   help=f"{top_help} (default {top_default})")
    if out:
        p.add_argument("--out", metavar="DIR", help="where plan files, pareto.png and summary.json go "
                                                    "(default: the site's work_dir/plan-<job>)")
    add_json(p)
    p.add_argument("--mpi", action="store_true",
                   help="require MPI (mpiexec/srun); without it MPI is still used when launched under it")
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
    g.add_argument("--micro-batch-sizes", type=_int_list, metavar="LIST",
                   help="micro-batch sizes (default: the job's)")
    g.add_argument("--split-within-groups", action="store_true",
                   help="enumerate every stage's layer count on the grid, not only per partition")
    g.add_argument("--sequence-parallel", action="store_true", help="plans with TP > 1 use sequence parallelism")
    g.add_argument("--selective-with-sdpa", action="store_true",
                   help="also enumerate selective recompute under fused attention")
    g.add_argument("--overlap-grad-reduce", action="store_true",
                   help="model Megatron's --overlap-grad-reduce (DP sync hidden behind the last backward)")
    g.add_argument("--block-size", type=_positive, default=65536, help=argparse.SUPPRESS)


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("search", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_site(p)
    add_job(p)
    add_search_options(p)
    return p


def run(args: argparse.Namespace) -> int:
    return execute(args, profile_first=False)


# --------------------------------------------------------------------------- shared machinery


def space_options(args: argparse.Namespace):
    from ..search.space import SpaceOptions
    return SpaceOptions(layer_granularity=args.layer_granularity, max_pipeline_stages=args.max_stages,
                        tp_degrees=args.tp or (), micro_batch_sizes=args.micro_batch_sizes or (),
                        full_recompute_steps=args.full_recompute_steps, recompute_spread=args.recompute_spread,
                        split_within_groups=args.split_within_groups, sequence_parallel=args.sequence_parallel,
                        selective_with_sdpa=args.selective_with_sdpa)


def search_options(args: argparse.Namespace, site=None):
    """Search options; the site's ``objective:`` weights are the default that --weights overrides."""
    from ..model.compose import CostOptions
    from ..search.engine import SearchOptions
    from ..search.objective import Weights, parse_weights
    default = Weights(**dict(zip(("time", "memory", "balance"), site.objective_weights))) if site is not None and site.objective_weights else None
    return SearchOptions(top_k=args.top, weights=parse_weights(args.weights, default=default),
                         block_size=args.block_size,
                         use_cache=not args.no_cache, cost=CostOptions(overlap_grad_reduce=args.overlap_grad_reduce))


PROVENANCE_WORDS = {"measured": "measured by the profiler", "imported": "imported measurements",
                    "augmented": "interpolated from measurements (augmented)",
                    "datasheet-only": "estimated from datasheet figures only"}


def load_cost_model(site, job, store_path: Path, *, analytic: bool, notes: list[str], fit: bool = True,
                    calibrate: bool = True):
    """The cost model for ``site``: the predictor fitted on the store for GPU types it has
    samples of (fitted or reloaded: see fit_or_load), the datasheet roofline for the rest;
    calibrated by the end-to-end runs the store holds for the site (see
    :mod:`memx_hpc.model.calibrate`) unless ``calibrate`` is False or ``analytic`` is set."""
    model = _uncalibrated_cost_model(site, job, store_path, analytic=analytic, notes=notes, fit=fit)
    if analytic or not calibrate or not store_path.is_file():
        return model
    return calibrated(model, site, job, store_path, notes)


def calibrated(model, site, job, store_path: Path, notes: list[str]):
    """``model`` wrapped in the calibration from the store's end-to-end runs of ``site``
    (``model`` itself when there are none); what was used goes into ``notes``."""
    from ..model.calibrate import CalibratedCostModel
    from ..profile.store import ProfileStore

    records = ProfileStore(store_path).e2e_records(site=site.name)
    if not records:
        return model
    cm = CalibratedCostModel(model, records, site, job).fit()
    cal = cm.calibration_
    if not cal.runs:
        notes.append(f"end-to-end runs in {store_path} not used for calibration: " + "; ".join(cal.skipped[:3]))
        return model
    notes.append(f"calibrated by end-to-end runs (memx-hpc verify): {cal.describe()}"
                 + (f"; {len(cal.skipped)} run(s) left out" if cal.skipped else "")
                 + "; its held-out (leave-one-out) error: memx-hpc verify")
    return cm


def base_of(model):
    """The model under a calibration (the model itself when it is not calibrated)."""
    from ..model.calibrate import CalibratedCostModel
    return model.base if isinstance(model, CalibratedCostModel) else model


def _uncalibrated_cost_model(site, job, store_path: Path, *, analytic: bool, notes: list[str], fit: bool = True):
    from ..model.api import AnalyticCostModel
    from ..model.routed import RoutedCostModel
    fallback = AnalyticCostModel(site)
    site_gpus = sorted({p.gpu_type for p in site.partitions})
    if analytic:
        notes.append("--analytic: every number is a datasheet roofline estimate")
        return fallback
    if not store_path.is_file():
        notes.append(f"no profile store at {store_path}: every number is estimated from datasheet figures "
                     f"(run 'memx-hpc plan' or 'memx-hpc profile' to measure)")
        return fallback
    from ..model.api import with_store_figures
    from ..profile.store import ProfileStore
    store = ProfileStore(store_path)
    samples = store.samples()
    # CPU "devices" (measured_at_profile_time): the speeds measured when profiling, as
    # memx-hpc fit uses them, so both fit the same model from the same figures
    gpus = with_store_figures(site, store)
    fallback = AnalyticCostModel(gpus)
    if not samples:
        notes.append(f"the profile store {store_path} is empty: estimates from datasheet figures only")
        return fallback
    have = set()
    for s in samples:
        try:
            have.add(site.gpu(s.point.gpu_type).name)
        except Exception:  # a GPU type this site does not know: still training data
            pass
    covered = [g for g in site_gpus if site.gpu(g).name in have]
    missing = [g for g in site_gpus if g not in covered]
    if not covered:
        notes.append(f"the profile store has no samples for {', '.join(site_gpus)}: estimates from datasheet "
                     f"figures only")
        return fallback
    if not fit:
        return fallback
    try:
        from ..model.predictor import fit_or_load
    except ImportError as e:  # xgboost missing from this installation
        notes.append(f"the predictor cannot be loaded ({e}): estimates from datasheet figures only")
        return fallback
    model_path = store_path.with_suffix(".predictor.ubj")
    import time
    t0 = time.perf_counter()
    print(f"predictor: reusing {model_path} or fitting it on {len(samples):,} samples from {store_path} ...",
          file=sys.stderr, flush=True)
    predictor = fit_or_load(samples, model_path, gpus)
    print(f"predictor: ready in {time.perf_counter() - t0:.1f} s (covers {', '.join(covered)})", file=sys.stderr,
          flush=True)
    if missing:
        # The predictor's datasheet booster estimates a GPU type it has no samples of from
        # that type's figures, which is about half the roofline's error on held-out types
        # (benchmarks/accuracy.py, new-gpu) -- but only when the store spans several GPU
        # types to learn that mapping from; with fewer, the plain roofline is safer.
        layer_types = {s.point.gpu_type for s in samples if s.point.kind == "layer"}
        if len(layer_types) >= MIN_TYPES_FOR_DATASHEET_TRANSFER:
            notes.append(f"no samples for {', '.join(missing)} in {store_path}: the predictor estimates those "
                         f"GPU types from their datasheet figures and the {len(layer_types)} profiled types")
            return RoutedCostModel({g: predictor for g in site_gpus}, fallback)
        notes.append(f"no samples for {', '.join(missing)} in {store_path}: those GPU types use the datasheet "
                     f"roofline (AnalyticCostModel)")
    return RoutedCostModel({g: predictor for g in covered}, fallback)


#: profiled GPU types a store needs before the predictor estimates unprofiled types itself
MIN_TYPES_FOR_DATASHEET_TRANSFER = 3


def provenance_of(cost_model, site) -> dict[str, str]:
    return {g: cost_model.provenance(g) for g in sorted({p.gpu_type for p in site.partitions})}


@dataclass(frozen=True, kw_only=True)
class SearchRun:
    """A finished search as the commands use it: what was searched, with which model, the
    result, and (on rank 0) the files written and the JSON summary. ``rank0`` is False on
    the other MPI ranks, which have nothing to report."""

    site: Any
    job: Any
    cost_model: Any
    result: Any
    notes: list[str]
    provenance: dict[str, str]
    out_dir: Path
    files: list[str]
    summary: dict
    rank0: bool


def execute(args: argparse.Namespace, *, profile_first: bool) -> int:
    run = run_search(args, profile_first=profile_first)
    if not run.rank0:
        return 0
    report(run, args)
    return 0


def report(run: SearchRun, args: argparse.Namespace) -> None:
    """Print the search (table or --json); SpecError when no plan fits."""
    from ..errors import SpecError

    if args.json:
        emit_json(run.summary)
    else:
        print_report(run.result, run.site, run.job, run.provenance, run.notes, run.files)
    if not run.result.top:
        site, job = run.site, run.job
        raise SpecError(f"none of the {run.result.stats.plans:,} plans fits in memory on {site.name} "
                        f"(capacity minus the {site.memory_safety_margin:.0%} safety margin); allow more "
                        f"recompute, smaller micro-batches, more pipeline stages (--max-stages), or add GPUs",
                        file=job.source_file)


def run_search(args: argparse.Namespace, *, profile_first: bool, site=None, job=None) -> SearchRun:
    """Profile what is missing (``profile_first``), load the cost model, search, and on rank 0
    write the plan files, pareto.png and summary.json. Prints nothing on stdout."""
    from ..search.cache import PredictionCache
    from ..search.engine import launched_under_mpi, mpi_comm, search
    from ..search.report import ProgressBar, pareto_png, result_to_json, write_plan_files
    from ..search.space import PlanSpace
    from ..spec import load_job, load_site

    site = site or load_site(args.site)
    job = job or load_job(args.job)
    space_opts = space_options(args)
    opts = search_options(args, site)  # bad --weights stop here, before any work
    comm = mpi_comm(required=True) if args.mpi else (mpi_comm() if launched_under_mpi() else None)
    rank0 = comm is None or comm.Get_rank() == 0
    notes: list[str] = []
    store_path = Path(args.store) if args.store else site.store
    if profile_first:
        if rank0:
            profile_missing(site, job, store_path, args, notes)
        if comm is not None:
            notes = comm.bcast(notes, root=0)
    # rank 0 fits (and saves) the predictor; the others then load what it saved
    if comm is not None and not rank0:
        comm.barrier()
    cost_model = load_cost_model(site, job, store_path, analytic=args.analytic, notes=notes)
    if comm is not None and rank0:
        comm.barrier()
    space = PlanSpace(site, job, space_opts)
    cache = None
    if not args.no_cache:
        cache_path = site.cache if (site.cache_path or not args.store) else store_path.with_suffix(".cache.sqlite")
        cache = PredictionCache(identity=cost_model.identity, path=cache_path)
    progress = ProgressBar("search", enabled=rank0)
    result = search(space, cost_model, options=opts, cache=cache, comm=comm, progress=progress)
    provenance = provenance_of(cost_model, site)
    out_dir = Path(args.out) if getattr(args, "out", None) else site.resolve(site.work_dir) / f"plan-{job.name}"
    if not rank0:
        return SearchRun(site=site, job=job, cost_model=cost_model, result=result, notes=notes,
                         provenance=provenance, out_dir=out_dir, files=[], summary={}, rank0=False)
    files: list[str] = []
    if result.top:
        files += [str(p) for p in write_plan_files(result, out_dir, site=site, job=job, provenance=provenance)]
        files.append(str(pareto_png(result, out_dir / "pareto.png",
                                    title=f"{job.name} on {site.name}: {result.stats.feasible:,} feasible plans")))
    summary = result_to_json(result, site=site, job=job, provenance=provenance, notes=notes, files=files)
    if result.top:
        out_dir.mkdir(parents=True, exist_ok=True)
        import json
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        files.append(str(out_dir / "summary.json"))
        summary["files"] = files
    return SearchRun(site=site, job=job, cost_model=cost_model, result=result, notes=notes, provenance=provenance,
                     out_dir=out_dir, files=files, summary=summary, rank0=True)


def print_report(result, site, job, provenance, notes, files, *, stream=None) -> None:
    from ..search.report import table_rows
    out = stream or sys.stdout
    st = result.stats
    parts = ", ".join(f"{p.name} {p.total_gpus}x {p.gpu_type}" for p in site.partitions)
    m = job.model
    print(f"site {site.name}: {site.total_gpus} GPUs ({parts})", file=out)
    print(f"job {job.name}: {m.name}, {m.num_layers} layers, hidden {m.hidden_size}, global batch "
          f"{job.global_batch_size}, seq {m.seq_length}, {job.precision}", file=out)
    print("numbers from: " + "; ".join(f"{g}: {PROVENANCE_WORDS.get(v, v)}" for g, v in provenance.items()),
          file=out)
    c = st.cache
    sp = st.space
    print(f"searched {st.plans:,} plans ({st.feasible:,} fit in memory) in {st.seconds:.2f} s "
          f"({st.plans_per_s:,.0f} plans/s, {st.ranks} rank{'s' if st.ranks > 1 else ''}); space: TP {sp['tp']}, "
          f"micro-batch {sp['micro_batch_sizes']}, up to {sp['max_pipeline_stages']} stages, layer grid "
          f"{sp['layer_granularity']}, recompute {', '.join(sp['recompute_levels'])}", file=out)
    print(f"signature cache: {c['unique']} signatures ({c['file_hits']} from {c['path'] or 'memory'}, "
          f"{c['predicted']} predicted"
          + (f", {c['invalidated']} stale rows dropped" if c["invalidated"] else "")
          + f"); {c['lookups']:,} stage look-ups, hit rate {c['hit_rate']:.2%}", file=out)
    if result.top:
        print(f"\ntop {len(result.top)} by T^{result.weights.time:g} * M^{result.weights.memory:g} * "
              f"B^{result.weights.balance:g} (time rank: the plan's rank by iteration time alone):", file=out)
        header, rows = table_rows(result.top, site)
        table(rows, header, file=out)
        if result.time_top:
            f = result.time_top[0]
            print(f"\nfastest plan by time alone: {f.prediction.iteration_ms / 1e3:.3f} s/iteration, peak "
                  f"{f.prediction.max_utilisation:.0%} of the fullest GPU (balance {f.prediction.balance:.2f})"
                  + ("; it is also the best by score" if result.top[0].index == f.index else ""), file=out)
        print(f"Pareto front (time vs peak memory): {len(result.pareto)} plans", file=out)
    if files:
        print("\nwrote: " + ", ".join(files[:2]) + (f", ... ({len(files)} files)" if len(files) > 2 else ""),
              file=out)
    for n in notes:
        print(f"note: {n}", file=out)


def profile_missing(site, job, store_path: Path, args, notes: list[str]) -> None:
    """Measure what the store lacks (the profiler), or say why that was skipped."""
    from ..errors import SystemFailure
    if getattr(args, "no_profile", False):
        notes.append("--no-profile: searched with what the store already holds")
        return
    try:
        from ..profile.store import ProfileStore
        from ..slurm.dispatch import profile
    except ImportError as e:  # an installation without the profiler
        notes.append(f"profiling not available ({e}); searched with what the store holds")
        return
    try:
        report = profile(site, job, ProfileStore(store_path), progress=True)
    except SystemFailure as e:
        notes.append(f"profiling skipped: {e}")
        return
    if report.failed:
        notes.append(f"profiling: {report.failed} point(s) failed after retries (see the store's job ledger); "
                     f"their GPU types lean on the other samples")
    if report.scheduled:
        notes.append(f"profiled {report.measured} point(s) ({report.infeasible} out of memory) via "
                     f"{report.scheduler} in {report.wall_s:.0f} s")
