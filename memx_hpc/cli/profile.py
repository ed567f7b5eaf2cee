"""``memx-hpc profile``: measure the minimal set on the site's partitions; list, import, export the store."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from ..errors import SpecError
from .common import TABLE_WIDTH, add_json, emit_json, table

HELP = "profile the minimal set of points on the site's partitions; ls/import/export the profile store"
DESCRIPTION = """\
Profile what the predictor needs and the store lacks: for every GPU type of the
site, the minimal set of (tensor-parallel degree, micro-batch, recompute) points of
one transformer layer of the job's shape, plus embedding, output layer, optimizer
step and collectives. Points go out as Slurm job arrays (one per partition and task
shape; submitit's local executor where there is no Slurm); results land in the
HDF5 store. Interrupting and rerunning resubmits nothing that finished or still runs.

actions:
  (none)   profile:  --site S --job J [--partition P] [--dry-run]
  ls       summarise the store (samples per GPU type by kind and origin)
  import   add samples: a CSV file (--format csv), a Sailor data folder holding
           profiles/ and llm_info.json (--format sailor), or Cephalo's
           model_latencies.json (--format cephalo)
  export   write every sample to --csv FILE (the interchange format of
           memx_hpc/profile/csvio.py: header row, units in column names)

The store is --store, else the site's (with --site), else $MEMX_STORE.

examples:
  memx-hpc profile --site site_configs/local.yaml --job jobs/tiny-gpt.yaml --dry-run
  memx-hpc profile --site site_configs/local.yaml --job jobs/tiny-gpt.yaml
  memx-hpc profile ls --site site_configs/local.yaml
  memx-hpc profile import --store s.h5 --format sailor ../shared/data/sailor
  memx-hpc profile export --store s.h5 --csv samples.csv
"""
FORMATS = ("csv", "sailor", "cephalo")


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("profile", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, top=True)
    p.add_argument("--job", metavar="JOB.yaml", help="job file (model shape, batch, precision)")
    p.add_argument("--partition", action="append", metavar="P",
                   help="profile only on this partition (repeat for several)")
    p.add_argument("--dry-run", action="store_true",
                   help="print per GPU type the points chosen against the full grid and the estimated "
                        "GPU-seconds; submit nothing")
    p.add_argument("--max-retries", type=int, default=2, metavar="N",
                   help="resubmissions of a failed task or point (default: 2)")
    p.add_argument("--iters", type=int, default=None, metavar="N", help="timed iterations per point (default: 5)")
    p.add_argument("--warmup", type=int, default=None, metavar="N", help="warm-up iterations per point (default: 2)")
    p.add_argument("--points-per-task", type=int, default=None, metavar="N",
                   help="most points one array task measures (default: 6; each task pays a Python start)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    from .search import add_reference
    add_reference(p)
    p.add_argument("--links", action="store_true",
                   help="also measure the communication curves (p2p, all-reduce over message sizes) inside a node, "
                        "between nodes of each partition and between every pair of partitions (Slurm only)")
    # The actions are sub-subcommands, so that options may come before or after them and
    # `profile --site S --job J` (no action) still profiles.
    acts = p.add_subparsers(dest="action", metavar="ACTION")
    ls = acts.add_parser("ls", help="summarise the store", description="Samples per GPU type by kind and origin.")
    _common(ls)
    imp = acts.add_parser("import", help="add samples from CSV, Sailor or Cephalo data",
                          description="PATH: a CSV file (--format csv), a Sailor data folder holding profiles/ "
                                      "and llm_info.json (--format sailor), or Cephalo's model_latencies.json "
                                      "(--format cephalo).")
    imp.add_argument("path", metavar="PATH", help="the file or folder to import")
    imp.add_argument("--format", choices=FORMATS, default="csv", help="import format (default: csv)")
    _common(imp)
    exp = acts.add_parser("export", help="write every sample to a CSV file",
                          description="The interchange format of memx_hpc/profile/csvio.py.")
    exp.add_argument("--csv", required=True, metavar="FILE", help="the CSV file to write")
    _common(exp)
    return p


def _common(p: argparse.ArgumentParser, *, top: bool = False) -> None:
    """--site, --store and --json, accepted before and after the action."""
    d = {} if top else {"default": argparse.SUPPRESS}
    p.add_argument("--site", metavar="SITE.yaml", help="site file (partitions, GPU types, Slurm options)", **d)
    p.add_argument("--store", metavar="PATH", help="profile store (HDF5); default: the site's, then $MEMX_STORE",
                   **d)
    if top:
        add_json(p)
    else:
        p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                       help="print machine-readable JSON instead of tables")


def _store_path(args: argparse.Namespace, site=None) -> Path:
    if args.store:
        return Path(args.store)
    if site is not None:
        return site.store
    env = os.environ.get("MEMX_STORE")
    if env:
        return Path(env)
    raise SpecError("no profile store given", field="--store",
                    allowed="--store PATH, or --site SITE.yaml (its 'store'), or the MEMX_STORE environment variable")


def _load_site(args: argparse.Namespace):
    if not args.site:
        return None
    from ..spec import load_site

    return load_site(args.site)


def run(args: argparse.Namespace) -> int:
    from ..profile.store import ProfileStore

    if args.action is None:
        return _profile(args)
    store = ProfileStore(_store_path(args, _load_site(args)))
    return {"ls": _ls, "import": _import, "export": _export}[args.action](store, args)


def _ls(store, args: argparse.Namespace) -> int:
    if not store.exists():
        raise SpecError("profile store does not exist (yet)", file=str(store.path))
    rows = store.summary()
    site = _load_site(args)
    cover = None
    if site is not None:
        from ..search.report import coverage
        cover = coverage(site, rows, store.e2e_records(site=site.name))
    disagree = source_disagreements(store, site)
    if args.json:
        emit_json({"store": str(store.path), "content_hash": store.content_hash(), "gpu_types": rows,
                   "source_disagreements": disagree.to_json(),
                   **({"site_gpu_types": cover} if cover is not None else {})})
        return 0
    kinds = ("layer", "embedding", "head", "optimizer", "allreduce", "p2p")
    print(f"store: {store.path}")
    table([[r["gpu_type"], r["samples"], *[r["by_kind"].get(k, 0) for k in kinds],
            r["by_origin"].get("measured", 0), r["by_origin"].get("imported", 0),
            r["by_origin"].get("augmented", 0), r["infeasible"],
            "yes" if r["device_figures"] else "-"] for r in rows],
          ["gpu type", "samples", *kinds, "measured", "imported", "augmented", "infeasible", "figures"],
          drop_empty=True, max_width=TABLE_WIDTH)
    if disagree.disagreements:
        print("\nsources that disagree (time over the roofline at comparable work; memx_hpc/model/sources.py):")
        table([[d.gpu_type, d.kind, d.precision_class, d.slower, d.faster, f"{d.ratio:.2f}x", d.pairs,
                d.preferred or "both kept", d.reason] for d in disagree.disagreements],
              ["gpu type", "kind", "precision", "slower", "faster", "ratio", "pairs", "followed", "why"],
              max_width=TABLE_WIDTH)
    if cover is not None:
        from ..search.report import coverage_table
        print(f"\nthe GPU types of site {site.name}:")
        coverage_table(cover)
    return 0


def source_disagreements(store, site):
    """Where two sources in the store disagree for one GPU type and kind, and which one the
    predictor follows by the site's ``prefer_source`` or the shipped evidence (the store's
    own end-to-end runs are weighed when planning: :func:`memx_hpc.planner.consistent_sources`)."""
    from ..spec.catalog import catalog
    from ..model.sources import resolve, shipped_preferences
    gpus = site if site is not None else catalog()
    prefer = dict(site.prefer_source) if site is not None and site.prefer_source else None
    return resolve(store.samples(), gpus, prefer=prefer, prior=shipped_preferences())[1]


def _import(store, args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not path.exists():
        raise SpecError("file or folder not found", file=str(path))
    if args.format == "csv":
        from ..profile.csvio import read_csv

        samples = read_csv(path)
    else:
        try:
            from ..profile.importers import import_cephalo, import_sailor
        except ImportError as e:
            raise SpecError(f"the {args.format} importer is not available in this installation ({e})") from None
        samples = import_sailor(path) if args.format == "sailor" else import_cephalo(path)
    added = store.append(samples)
    curves = 0
    if args.format == "sailor" and (path / "network_coeffs_all_homo.json").is_file():
        from ..profile.comm import import_sailor_comm, write_comm_curves
        curves = write_comm_curves(store.path, import_sailor_comm(path))  # Sailor's network curves
    if args.json:
        emit_json({"store": str(store.path), "read": len(samples), "added": added,
                   "duplicates_skipped": len(samples) - added, "link_curves": curves})
    else:
        print(f"{store.path}: read {len(samples)} samples from {path} ({args.format}), added {added}, "
              f"skipped {len(samples) - added} already stored" + (f"; {curves} network curves" if curves else ""))
    return 0


def _export(store, args: argparse.Namespace) -> int:
    from ..profile.csvio import write_csv

    if not store.exists():
        raise SpecError("profile store does not exist (yet)", file=str(store.path))
    n = write_csv(store.samples(), args.csv)
    if args.json:
        emit_json({"store": str(store.path), "csv": args.csv, "rows": n})
    else:
        print(f"wrote {n} samples to {args.csv}")
    return 0


def _profile(args: argparse.Namespace) -> int:
    from ..profile.runner import RunSettings
    from ..profile.store import ProfileStore
    from ..profile.campaign import profile
    from ..spec import load_job

    if not args.site or not args.job:
        raise SpecError("profiling needs --site and --job (or an action: ls, import, export)",
                        field="--site" if not args.site else "--job")
    site = _load_site(args)
    job = load_job(args.job)
    if not args.dry_run:
        from ..planner import start_store
        start_notes: list[str] = []
        start_store(site, _store_path(args, site), start_notes, reference=False if args.no_reference else None,
                    progress=not args.json)
        for n in start_notes:
            print(n, file=sys.stderr)
    store = ProfileStore(_store_path(args, site))
    kw = {}
    if args.iters is not None:
        kw["iters"] = args.iters
    if args.warmup is not None:
        kw["warmup"] = args.warmup
    settings = RunSettings(**kw)
    report = profile(site, job, store, partitions=args.partition, dry_run=args.dry_run,
                     progress=not args.no_progress and not args.json, max_retries=args.max_retries,
                     settings=settings, **({"points_per_task": args.points_per_task}
                                           if args.points_per_task else {}))
    links = None
    if args.links and not report.dry_run:
        if report.scheduler != "slurm":
            print("links: not measured (the comm jobs need Slurm: a hetjob per pair of partitions)", file=sys.stderr)
        else:
            from ..profile.link_campaign import profile_comm
            links = profile_comm(site, store.path, site.resolve(site.work_dir) / "comm")
    links_failed = bool(links and links.failures)
    if args.json:
        emit_json({"store": str(store.path), **report.to_json(),
                   **({"links": {"curves": links.written, "jobs": [dataclasses.asdict(j) for j in links.jobs], "failures": links.failures,
                                 "task_seconds": links.task_seconds}} if links else {})})
        return 2 if (report.failed or links_failed) and not report.dry_run else 0
    rows = []
    for p in report.plans:
        share = p.minimal_layer_points / p.full_grid_layer_points if p.full_grid_layer_points else 0.0
        rows.append([p.gpu_type, p.minimal_layer_points, p.full_grid_layer_points, f"{100 * share:.1f}%",
                     p.minimal_points, p.full_grid_points, p.missing_points, p.est_minimal_gpu_s,
                     p.est_full_grid_gpu_s, p.est_missing_gpu_s])
    print(f"store: {store.path}")
    table(rows, ["gpu type", "layer pts", "layer grid", "share", "all pts", "all grid", "missing",
                 "est GPU-s min", "est GPU-s grid", "est GPU-s missing"])
    if report.dry_run:
        print(f"dry run: {sum(len(t.points) for t in report.tasks)} points in {len(report.tasks)} task(s) "
              f"would be submitted; {report.skipped} already stored")
        for f in report.failures:
            print(f"  cannot schedule: {f.point.kind if f.point else 'task'} on {f.point.gpu_type if f.point else ''}:"
                  f" {f.reason}")
        return 0
    print(f"{report.scheduler}: scheduled {report.scheduled}, measured {report.measured}, infeasible "
          f"{report.infeasible}, failed {report.failed}, already stored {report.skipped} "
          f"({report.wall_s:.0f} s, jobs {', '.join(report.job_ids) or '-'})")
    for f in report.failures:
        what = (f"{f.point.gpu_type} {f.point.kind} tp={f.point.tp} mbs={f.point.micro_batch_size} "
                f"recompute={f.point.recompute}" if f.point else "task")
        print(f"  failed after {f.attempts} attempt(s): {what} [{f.partition}]: {f.reason}", file=sys.stderr)
    if links:
        print(f"links: {links.written} curves from {len(links.jobs)} job(s), {links.task_seconds:.0f} task-seconds")
        for f in links.failures:
            print(f"  links failed: {f}", file=sys.stderr)
    return 2 if report.failed or links_failed else 0
