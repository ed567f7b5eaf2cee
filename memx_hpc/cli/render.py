"""``memx-hpc render``: the sbatch script for a plan, checked with ``bash -n`` and, where
Slurm answers, ``sbatch --test-only``; ``--submit`` submits it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import add_job, add_json, add_site, emit_json, shown

HELP = "write the heterogeneous sbatch script that launches a plan with Megatron-LM"

DESCRIPTION = """\
Render a plan (from 'memx-hpc plan', or written by hand) into an sbatch script with one
'#SBATCH hetjob' component per run of consecutive pipeline stages on one partition,
one srun across the components, and the Megatron-LM command line (argument names of
Megatron-LM core_r0.16.0) with each component's own recompute flags.

The run is the job file's: its data: section (prepared with 'memx-hpc data prepare'),
training length (train_iters, train_samples or train_tokens), lr_schedule, log/eval
intervals and checkpoint: folders. A job without data: renders a synthetic-data run
(mock data) and the script's first line says so. The job's log folder is created.

Plans Megatron-LM cannot run are refused with the reason (unknown partition, TP larger
than a node, more nodes than the partition has, a cross-vendor pipeline without
pipeline_comm.backend: ucc, ...). The script is checked with 'bash -n'; when Slurm
answers, 'sbatch --test-only' says whether this cluster would accept it.

examples:
  memx-hpc render --site site_configs/local.yaml --job jobs/tiny-gpt.yaml \
      --plan memx-local/runs/plan-tiny-gpt/latest/recommended.json --out train.sbatch
  memx-hpc render --site mysite.yaml --job job.yaml --plan plan-01.json --iters 50 --submit
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("render", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", required=True, metavar="PLAN.json", help="plan file (memx-plan/1)")
    add_site(p)
    add_job(p)
    p.add_argument("--out", metavar="FILE", help="where to write the script (default: the plan file with .sbatch); "
                                                 "'-': print it on stdout (the report goes to stderr)")
    p.add_argument("--iters", type=int, metavar="N", help="training iterations (default: the job's train_iters)")
    p.add_argument("--log-dir", metavar="DIR", help="folder for the job's output (default: the site's work_dir)")
    p.add_argument("--chdir", metavar="DIR", help="the job's working directory (default: where it is submitted)")
    p.add_argument("--extra", action="append", default=[], metavar="ARG",
                   help="a further Megatron-LM argument for every rank, after the rendered ones (repeat; e.g. "
                        "--extra=--seed --extra=7); data, tokenizer and checkpoints come from the job file")
    p.add_argument("--resume", metavar="CKPT", help="load the checkpoint folder CKPT (the saved run's --save) and go on "
                   "saving; its model must be the job's (see 'memx-hpc plan --resume')")
    p.add_argument("--no-test-only", action="store_true",
                   help="skip 'sbatch --test-only' (e.g. when rendering for another cluster)")
    p.add_argument("--submit", action="store_true", help="submit the script and print the job id")
    add_json(p)
    return p


def run(args: argparse.Namespace) -> int:
    from ..errors import SpecError
    from ..planner import launch_script, render_plan
    from ..spec import load_job, load_site

    site = load_site(args.site)
    job = load_job(args.job)
    if args.resume:
        from ..planner import resume_job

        # a folder with shell characters is refused there, by its option's name, before the
        # checkpoint is read (plan --resume shares the check)
        job, note = resume_job(job, args.resume)
        print(f"memx-hpc render: {note}", file=sys.stderr)
    rendered = render_plan(args.plan, site, job, iters=args.iters, extra=args.extra, log_dir=args.log_dir,
                           workdir=args.chdir)
    request = rendered.request
    script = rendered.script
    if args.out == "-":
        return _to_stdout(args, script, request)
    out = Path(args.out) if args.out else Path(args.plan).with_suffix(".sbatch")
    if out.exists() and out.resolve() == Path(args.plan).resolve():
        # the default is the plan's name with .sbatch: for a plan file named *.sbatch that
        # is the plan itself, which the script would replace
        raise SpecError("the script would replace the plan file it is rendered from; name another file",
                        field="--out", found=shown(out))
    # written, checked with bash -n, its log folder made (Slurm does not), asked, submitted
    done = launch_script(script, out, test_only=not args.no_test_only, submit=args.submit)
    verdict, job_id = done.test_only, done.job_id

    if args.json:
        emit_json({
            "script": shown(out), "bash_n": "ok", "megatron_version": request.megatron_version,
            "world_size": request.world_size, "layout": request.layout,
            "components": [{"index": c.index, "partition": c.partition, "stages": list(c.stages),
                            "ranks": [c.first_rank, c.first_rank + c.num_ranks - 1], "nodes": c.nodes,
                            "tasks_per_node": c.tasks_per_node, "layers": c.num_layers,
                            "recompute": c.recompute.label()} for c in request.components],
            "test_only": None if verdict is None else {"accepted": verdict.accepted, "message": verdict.message},
            "job_id": job_id, "run_dir": request.run_dir,
            "continues": None if request.continuation is None else {
                "signal": request.continuation.slurm_signal, "target_iters": request.continuation.target_iters,
                "max_segments": request.continuation.max_segments,
                "state_file": request.continuation.state_file},
        })
    else:
        print(f"wrote {shown(out)}: {len(request.components)} hetjob component(s), {request.world_size} rank(s)")
        for c in request.components:
            print(f"  component {c.index}: {c.partition}, stages {c.stages_label}, ranks {c.ranks_label}, "
                  f"{c.nodes} node(s) x {c.tasks_per_node} task(s), layers {c.layers_label}, "
                  f"recompute {c.recompute_label}")
        print("bash -n: ok")
        if request.run_dir is not None:
            print(f"run folder: {request.run_dir} (TensorBoard events in tensorboard/"
                  + ("; the run's segments: memx-hpc status " + request.run_dir + ")" if request.continuation else ")"))
        if request.continuation is not None:
            k = request.continuation
            print(f"continues by itself: Slurm warns it {k.warning_s} s before the time limit (SIG{k.signal}), it "
                  f"saves and submits itself again until iteration {k.target_iters} (at most {k.max_segments} jobs)")
        if verdict is not None:
            print(f"sbatch --test-only: {'accepted' if verdict.accepted else 'REJECTED'}: {verdict.message}")
        elif not args.no_test_only:
            print("sbatch --test-only: skipped (Slurm did not answer)")
        if job_id is not None:
            print(f"submitted: job {job_id}")
    if verdict is not None and not verdict.accepted:
        if not args.json:
            print("memx-hpc render: this cluster would not run the script (see above); --no-test-only skips "
                  "the check", flush=True)
        return 1
    return 0


def _to_stdout(args: argparse.Namespace, script: str, request) -> int:
    """``--out -``: the script on stdout, checked (bash -n, sbatch --test-only) through a
    temporary copy; what was checked goes to stderr so that stdout is the script alone."""
    from ..errors import SpecError
    from ..planner import check_script

    if args.submit:
        raise SpecError("--submit needs the script in a file Slurm can read", field="--out", found="-",
                        allowed="a file name")
    if args.json:
        raise SpecError("--json prints the report on stdout, where '--out -' prints the script", field="--out",
                        found="-", allowed="a file name with --json")
    verdict = check_script(script, test_only=not args.no_test_only)
    sys.stdout.write(script)
    sys.stdout.flush()
    print(f"rendered {len(request.components)} hetjob component(s), {request.world_size} rank(s); bash -n: ok",
          file=sys.stderr)
    if verdict is not None:
        print(f"sbatch --test-only: {'accepted' if verdict.accepted else 'REJECTED'}: {verdict.message}",
              file=sys.stderr)
        return 0 if verdict.accepted else 1
    return 0
