"""``memx-hpc plan``: profile what is missing, fit or reuse the predictor, search, report."""

from __future__ import annotations

import argparse

from .common import add_job, add_site
from .search import add_search_options

HELP = "profile what is missing, fit the predictor, search, and report the best plans"
DESCRIPTION = """\
The main command, run on a login node:

  1. profile the minimal set of points the profile store lacks for the site's GPU
     types (Slurm job arrays through submitit, or local processes; skipped with
     --no-profile). When profiling fails or the store is locked, plan exits 2 naming
     the store, unless --allow-datasheet asks to plan from what the store holds and
     datasheet figures for the rest (with a note),
  2. fit the dual-output predictor on the store, or reuse the saved one when the
     store did not change (GPU types without samples: datasheet roofline),
  3. search every plan Megatron-LM can run on the site (see 'memx-hpc search'),
  4. print three plans side by side, each with what it costs in time and buys in
     memory headroom and out-of-memory risk: the recommended plan (the fastest whose
     peak, widened by the predictor's measured memory error for each GPU type, fits),
     the fastest plan that fits, and MemX's weighted-product best (T^w_t * M^w_m *
     B^w_b); then the top-K of --objective's ranking. Each run writes into its own
     folder, --out/<run id>/ (--out/latest points at the newest): plan-01.json ...,
     recommended.json, fastest.json, weighted.json, pareto.png, summary.json,
  5. with --submit: render plan-01 (the recommended plan unless --objective memx)
     into a heterogeneous sbatch script (plan-01.sbatch beside it; 'bash -n'
     checked), submit it and print the job id.

The predictor is calibrated by the end-to-end runs 'memx-hpc verify' stored for the
site, when there are any (the notes say so).

Every number says where it came from: measured, imported, augmented, or estimated
from datasheet figures only. Works without Slurm and without a GPU.

examples:
  memx-hpc plan --site site_configs/example-cross-vendor.yaml --job jobs/llama2-7b.yaml --no-profile
  memx-hpc plan --site site_configs/local.yaml --job jobs/tiny-gpt.yaml --top 5
  memx-hpc plan --site S --job J --objective memx --weights time=1,memory=1 --no-profile --json
  memx-hpc plan --site site_configs/local.yaml --job jobs/tiny-gpt.yaml --submit
  memx-hpc render --site site_configs/local.yaml --job jobs/tiny-gpt.yaml \
      --plan memx-local/runs/plan-tiny-gpt/latest/recommended.json
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("plan", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_site(p)
    add_job(p)
    p.add_argument("--no-profile", action="store_true", help="do not profile; search with what the store holds")
    p.add_argument("--allow-datasheet", action="store_true",
                   help="when profiling fails or the store is locked, plan from what the store holds and "
                        "datasheet figures (with a note) instead of exiting 2")
    add_search_options(p)
    g = p.add_argument_group("submitting the best plan")
    g.add_argument("--submit", action="store_true",
                   help="render the best plan (plan-01.sbatch next to the plan files), submit it, print the job id")
    g.add_argument("--iters", type=int, metavar="N", help="training iterations of the submitted job "
                                                          "(default: the job's train_iters)")
    g.add_argument("--chdir", metavar="DIR", help="working directory of the submitted job (default: here)")
    return p


def run(args: argparse.Namespace) -> int:
    from ..errors import SpecError, SystemFailure
    from ..planner import plan, submit_best
    from .search import report, request_from_args

    if args.iters is not None and args.iters < 1:
        raise SpecError("must be >= 1", field="--iters", found=args.iters)
    if args.submit:
        from ..slurm.local_cluster import START_HINT, slurm_available

        # before the search: no point planning for minutes to find there is nowhere to submit
        if not slurm_available(timeout=5.0):
            raise SystemFailure(f"--submit: Slurm does not answer (sinfo), nothing was submitted. {START_HINT}")
    outcome = plan(request_from_args(args, profile=True))
    if not outcome.rank0:
        return 0
    if args.submit and outcome.ranked:
        outcome.summary["submitted"] = submit_best(outcome, iters=args.iters, workdir=args.chdir)
    report(outcome, args)
    sub = outcome.summary.get("submitted")
    if sub and not args.json:
        print(f"\nsubmitted plan-01 as Slurm job {sub['job_id']}: {sub['script']} (log in {sub['log_dir']})")
    return 0
