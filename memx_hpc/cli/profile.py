"""``memx-hpc profile``: measure the minimal set on the site's partitions; list, import, export the store."""

from __future__ import annotations

import argparse
import sys

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


def _store_request(args: argparse.Namespace) -> dict:
    return {"site": args.site or None, "store": args.store}


def run(args: argparse.Namespace) -> int:
    if args.action is None:
        return _profile(args)
    return {"ls": _ls, "import": _import, "export": _export}[args.action](args)


def _ls(args: argparse.Namespace) -> int:
    from ..planner import StoreRequest, list_store

    listing = list_store(StoreRequest(**_store_request(args)))
    rows, disagree, site, cover = listing.gpu_types, listing.disagreements, listing.site, listing.coverage
    if args.json:
        emit_json(listing.to_json())
        return 0
    kinds = ("layer", "embedding", "head", "optimizer", "allreduce", "p2p")
    print(f"store: {listing.store}")
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


def _import(args: argparse.Namespace) -> int:
    from ..planner import ImportRequest, import_samples

    res = import_samples(ImportRequest(path=args.path, format=args.format, **_store_request(args)))
    if args.json:
        emit_json(res.to_json())
    else:
        print(f"{res.store}: read {res.read} samples from {res.path} ({res.format}), added {res.added}, "
              f"skipped {res.read - res.added} already stored"
              + (f"; {res.link_curves} network curves" if res.link_curves else ""))
    return 0


def _export(args: argparse.Namespace) -> int:
    from ..planner import ExportRequest, export_samples

    res = export_samples(ExportRequest(csv=args.csv, **_store_request(args)))
    if args.json:
        emit_json(res.to_json())
    else:
        print(f"wrote {res.rows} samples to {res.csv}")
    return 0


def _profile(args: argparse.Namespace) -> int:
    from ..planner import ProfileRequest, profile_site

    if not args.site or not args.job:
        raise SpecError("profiling needs --site and --job (or an action: ls, import, export)",
                        field="--site" if not args.site else "--job")
    res = profile_site(ProfileRequest(site=args.site, job=args.job, store=args.store, partitions=args.partition,
                                      dry_run=args.dry_run, max_retries=args.max_retries, iters=args.iters,
                                      warmup=args.warmup, points_per_task=args.points_per_task, links=args.links,
                                      reference=False if args.no_reference else None,
                                      progress=not args.no_progress and not args.json, store_progress=not args.json),
                       note=lambda n: print(n, file=sys.stderr))
    report, links = res.report, res.links
    if res.links_skipped:
        print(f"links: not measured ({res.links_skipped})", file=sys.stderr)
    if args.json:
        emit_json(res.to_json())
        return 2 if res.failed else 0
    rows = []
    for p in report.plans:
        share = p.minimal_layer_points / p.full_grid_layer_points if p.full_grid_layer_points else 0.0
        rows.append([p.gpu_type, p.minimal_layer_points, p.full_grid_layer_points, f"{100 * share:.1f}%",
                     p.minimal_points, p.full_grid_points, p.missing_points, p.est_minimal_gpu_s,
                     p.est_full_grid_gpu_s, p.est_missing_gpu_s])
    print(f"store: {res.store}")
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
    return 2 if res.failed else 0
