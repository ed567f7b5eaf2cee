"""``memx-hpc verify``: run the top plans for real, measure them, store the runs, recalibrate.

Without ``--plans`` the search of ``memx-hpc search`` runs first (same options, same
plan files) and its top K plans are measured; with ``--plans`` the given plan files are.
Each plan becomes a short heterogeneous job (the same script ``render`` writes, with
``--iters``), submitted one after another so that measured runs do not compete for the
same nodes; iteration time and peak memory are read from its Megatron-LM log. Every run
goes into the profile store's end-to-end table with its provenance as soon as it ends; a
plan already measured with the same site, job and iteration count is not run again.

The runs calibrate the predictor (:mod:`memx_hpc.model.calibrate`; ``plan``, ``search``
and ``predict`` use the calibration from then on). The report shows, per plan, the
measured numbers against the prediction before calibration and after it, where "after"
is always a calibration fitted on the OTHER runs of the site (leave-one-out): a run is
never used to predict itself.
"""

from __future__ import annotations

import argparse

from .common import add_job, add_site, emit_json
from .search import add_search_options

HELP = "run the top plans as short real jobs, store the measurements, and recalibrate the predictor"

DESCRIPTION = """\
Search the site (as 'memx-hpc search' does, with the same options) and run the top K
plans as short real jobs, one heterogeneous job each, one after another; or run the
plan files given with --plans (as 'memx-hpc plan' writes them), in their 'rank' order.
Measured iteration time and peak memory go into the profile store's end-to-end table
with their provenance; plans measured before (same site, job, plan and --iters) are not
run again (--rerun measures them again).

The stored runs calibrate the predictor per GPU type (device memory overhead, and a
layer-time factor shrunk toward 1 while runs are few); 'plan', 'search' and 'predict'
use the calibration from then on. The table shows measured against predicted before
calibration and after it; "after" comes from a calibration fitted on the site's other
runs only (leave-one-out), so it is an honest error, not a fit to itself.

examples:
  memx-hpc verify --site site_configs/local.yaml --job jobs/tiny-gpt.yaml --top 2 --iters 3
  memx-hpc verify --site site_configs/local.yaml --job jobs/tiny-gpt.yaml --top 2 \\
      --plans memx-local/runs/plan-tiny-gpt/latest/plan-*.json
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("verify", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_site(p)
    add_job(p)
    p.add_argument("--plans", nargs="+", metavar="PLAN.json",
                   help="plan files to measure instead of searching; ordered by their 'rank' field when they have one")
    p.add_argument("--iters", type=int, default=5, metavar="N", help="iterations per run (the first is warm-up)")
    p.add_argument("--timeout", type=float, default=1800.0, metavar="S", help="seconds to wait for each job")
    p.add_argument("--chdir", metavar="DIR", help="working directory of the jobs (default: here)")
    p.add_argument("--rerun", action="store_true", help="measure plans again even when already measured")
    add_search_options(p, top_default=3, top_help="measure the first K plans")
    return p


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..planner import VerifyRequest, plan_file_entries, verify
    from .search import request_from_args

    entries = plan_file_entries(args.plans, args.top) if args.plans else None
    result = verify(VerifyRequest(search=request_from_args(args), plans=entries, iters=args.iters,
                                  timeout_s=args.timeout, workdir=args.chdir, rerun=args.rerun))
    out, rows, now, notes, store_path = result.summary, result.rows, result.calibration, result.notes, result.store
    summary_rows = out["all_runs_leave_one_out"]
    if args.json:
        emit_json(out)
        return 0
    from .common import table

    def pct(p, m):
        return "-" if p is None or not m else f"{100.0 * (p - m) / m:+.0f}%"

    table([[Path(r.plan).name, r.measured_ms, r.before_ms, pct(r.before_ms, r.measured_ms),
            r.after_ms if r.after_ms is not None else "-", pct(r.after_ms, r.measured_ms),
            r.measured_peak_mib, r.before_peak_mib, pct(r.before_peak_mib, r.measured_peak_mib),
            r.after_peak_mib if r.after_peak_mib is not None else "-",
            pct(r.after_peak_mib, r.measured_peak_mib), r.job_id, "new" if r.new else "kept"]
           for r in rows],
          ["plan", "meas ms", "before ms", "err", "after ms", "err", "meas peak MiB", "before MiB", "err",
           "after MiB", "err", "job", "run"])
    print("before: the predictor without calibration; after: calibrated on the site's other runs "
          "(leave-one-out, never on the run itself)")
    m = out["these_plans"]
    if m["mape_time_before_pct"] is not None:
        print(f"these plans, MAPE before -> after: iteration time {_f(m['mape_time_before_pct'])} -> "
              f"{_f(m['mape_time_after_pct'])}, peak memory {_f(m['mape_memory_before_pct'])} -> "
              f"{_f(m['mape_memory_after_pct'])}")
    a = summary_rows
    if a["runs"]:
        print(f"{now.selection}, leave-one-out MAPE before -> after: iteration time "
              f"{_f(a['mape_time_before_pct'])} -> {_f(a['mape_time_after_pct'])}, peak memory "
              f"{_f(a['mape_memory_before_pct'])} -> {_f(a['mape_memory_after_pct'])}")
    print(f"calibration now (used by plan, search, predict): {now.describe()}")
    print(f"measurements: {store_path} (end-to-end table)")
    for n in notes:
        print(f"note: {n}")
    return 0


def _f(x) -> str:
    return "-" if x is None else f"{x:.1f}%"
