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

With --finish N (iterations; or samples, tokens: 2M samples, 1.5Btokens) plan asks
Slurm, not a stopwatch, which plan is done first: nodes a job cannot get now (down,
drained, draining, reserved) are left out of the search; the ranking's plans and the
best plan on each set of partitions are rendered for N iterations (time limit: the
predicted run plus a margin) and Slurm is asked when it would start each
('sbatch --test-only': its backfill estimate from running jobs, the queue and
reservations). They are ranked by that start + N x the predicted iteration time,
shown with wait, run time and finish, and written as finish-01.sbatch ... in that
order; --submit then submits finish-01.sbatch.

The predictor is calibrated by the end-to-end runs 'memx-hpc verify' stored for the
site, when there are any (the notes say so).

Every number says where it came from: measured, imported, augmented, or estimated
from datasheet figures only. Works without Slurm and without a GPU.

examples:
  memx-hpc plan --site site_configs/example-cross-vendor.yaml --job jobs/llama2-7b.yaml --no-profile
  memx-hpc plan --site site_configs/local.yaml --job jobs/tiny-gpt.yaml --top 5
  memx-hpc plan --site S --job J --objective memx --weights time=1,memory=1 --no-profile --json
  memx-hpc plan --site site_configs/local.yaml --job jobs/tiny-gpt.yaml --submit
  memx-hpc plan --site S --job J --resume /ckpt/run --no-profile   # continue a run on other partitions
  memx-hpc plan --site mysite.yaml --job jobs/llama2-7b.yaml --no-profile --finish 2B tokens
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
    g.add_argument("--resume", metavar="CKPT", help="plan the continuation of the run that saved into CKPT (a "
                   "megatron-core distributed checkpoint folder): same model, any partitions and TP/PP/DP; the "
                   "submitted script loads it")
    f = p.add_argument_group("ranked by when they finish (asks Slurm)")
    f.add_argument("--finish", metavar="N",
                   help="rank candidates by Slurm's expected start + N x predicted iteration time; N in "
                        "iterations, or with a unit: 2M samples, 1.5Btokens (multipliers k, M, G/B, T)")
    return p


def run(args: argparse.Namespace) -> int:
    from ..errors import MemxError, SpecError
    from .search import follow_rank0, leading, report, request_from_args

    if args.iters is not None and args.iters < 1:
        raise SpecError("must be >= 1", field="--iters", found=args.iters)
    if args.finish is not None:
        from ..planner import parse_finish
        parse_finish(args.finish)  # bad input is exit 1, before Slurm is asked anything
    if args.finish is not None and args.iters is not None:
        raise SpecError("--finish sets the iterations of the scripts it renders; leave out --iters",
                        field="--iters", found=args.iters)
    if args.finish is not None or args.submit:
        from ..planner import require_slurm  # with the site discovery, only when Slurm is asked
    if args.finish is not None:
        require_slurm("--finish asks Slurm when each plan would start, and Slurm does not answer (sinfo).")
    if args.submit:
        # before the search: no point planning for minutes to find there is nowhere to submit
        require_slurm("--submit: Slurm does not answer (sinfo), nothing was submitted.")
    # under MPI the ranks other than 0 wait here for rank 0 to say whether they search
    follows = follow_rank0(args)
    if follows:
        return 0
    try:
        request = request_from_args(args, profile=True, follower=follows is False)
        if args.resume:
            import dataclasses

            from ..planner import resume_job
            from ..spec import load_job

            job, note = resume_job(load_job(args.job), args.resume)
            request = dataclasses.replace(request, job=job, notes=request.notes + (note,))
    except MemxError as e:
        if follows is None:
            leading(args, e)
        raise
    from ..planner import plan, submit_best, submit_finish

    outcome = plan(request)
    if not outcome.rank0:
        return 0
    if args.submit and outcome.finish is not None and outcome.ranked:
        outcome.summary["submitted"] = submit_finish(outcome)
    elif args.submit and outcome.ranked:
        outcome.summary["submitted"] = submit_best(outcome, iters=args.iters, workdir=args.chdir)
    report(outcome, args)
    if outcome.finish is not None and not args.json:
        print_finish(outcome.finish, outcome.job)
    sub = outcome.summary.get("submitted")
    if sub and not args.json:
        which = "finish-01" if "finish_rank" in sub else "plan-01"
        print(f"\nsubmitted {which} as Slurm job {sub['job_id']}: {sub['script']} (log in {sub['log_dir']})")
    return 0


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{seconds:.1f} s" if 0 < seconds < 10 else f"{s} s"
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    return (f"{d}d " if d else "") + (f"{h}:{m:02d}:{sec:02d}" if h or d else f"{m}:{sec:02d}")


def _clock(when, ref) -> str:
    if when is None:
        return "-"
    return when.strftime("%H:%M:%S") if when.date() == ref.date() else when.strftime("%Y-%m-%d %H:%M")


def print_finish(finish, job, *, stream=None) -> None:
    """The candidates by expected finish: wait, run time, finish, Slurm's nodes, the script."""
    import sys

    from ..search.report import stage_summary
    from .common import TABLE_WIDTH, table

    out = stream or sys.stdout
    cands = finish.candidates
    goal = finish.goal.label(job) + ("" if finish.goal.unit == "iterations" else f" = {finish.iterations:,} iterations")
    print(f"\nranked by when they finish {goal} "
          f"(Slurm asked at {_clock(cands[0].asked_at, cands[0].asked_at) if cands else '-'}):", file=out)
    if not cands:
        print("  no candidate plan could be rendered", file=out)
    else:
        ref = cands[0].asked_at
        rows = [[c.rank, f"{c.scored.prediction.iteration_ms / 1e3:.3f}", _duration(c.wait_s), _duration(c.run_s),
                 _clock(c.start_at, ref), _clock(c.finish_at, ref),
                 ",".join(c.estimate.nodes) if c.estimate.accepted else "refused",
                 f"{c.scored.plan.tp}.{c.scored.plan.dp}.{c.scored.plan.micro_batch_size}",
                 stage_summary(c.scored.plan, compact=True), c.script.name if c.script else "-"]
                for c in cands]
        table(rows, ["rank", "s/iter", "wait", "run", "starts", "finishes", "slurm nodes", "tp.dp.mb", "stages",
                     "script"], file=out, max_width=TABLE_WIDTH)
        best = finish.best
        if best is not None:
            first = next((c for c in cands if c.finish_at is not None and "#1 of the ranking" in c.sources), None)
            line = (f"finishes first: #{best.rank} ({stage_summary(best.scored.plan, compact=True)}), waits "
                    f"{_duration(best.wait_s)}, runs {_duration(best.run_s)}")
            if first is not None and first is not best:
                gain = (first.finish_at - best.finish_at).total_seconds()
                line += (f"; {_duration(gain)} before the ranking's first plan, which waits "
                         f"{_duration(first.wait_s)}")
            print(line, file=out)
        for c in cands:
            for n in c.notes:
                print(f"note: finish #{c.rank}: {n}", file=out)
    for n in finish.notes:
        print(f"note: {n}", file=out)
