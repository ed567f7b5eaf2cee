"""``memx-hpc plan``: profile what is missing, fit or reuse the predictor, search, report."""

from __future__ import annotations

import argparse

from .common import add_job, add_site
from .search import add_search_options, execute

HELP = "profile what is missing, fit the predictor, search, and report the best plans"
DESCRIPTION = """\
The main command, run on a login node:

  1. profile the minimal set of points the profile store lacks for the site's GPU
     types (Slurm job arrays through submitit; skipped, with a note, when no
     scheduler answers or with --no-profile),
  2. fit the dual-output predictor on the store, or reuse the saved one when the
     store did not change (GPU types without samples: datasheet roofline),
  3. search every plan Megatron-LM can run on the site (see 'memx-hpc search'),
  4. print the top-K plans by T^w_t * M^w_m * B^w_b beside their time-only rank,
     and write one plan JSON per plan, pareto.png and summary.json to --out.

Every number says where it came from: measured, imported, augmented, or estimated
from datasheet figures only. Works without Slurm and without a GPU.

examples:
  memx-hpc plan --site site_configs/example-cross-vendor.yaml --job jobs/llama2-7b.yaml
  memx-hpc plan --site site_configs/local.yaml --job jobs/tiny-gpt.yaml --top 5
  memx-hpc plan --site S --job J --weights time=1,memory=1,balance=0 --no-profile --json
  memx-hpc render --site S --plan <out>/plan-01.json
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("plan", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_site(p)
    add_job(p)
    p.add_argument("--no-profile", action="store_true", help="do not profile; search with what the store holds")
    add_search_options(p)
    return p


def run(args: argparse.Namespace) -> int:
    return execute(args, profile_first=True)
