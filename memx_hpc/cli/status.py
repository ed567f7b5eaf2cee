"""``memx-hpc status``: what the tool sees — the site, Slurm, the store, the predictor, the cache;
``memx-hpc status RUN``: where a training run stands (memx_hpc/planner/runs.py)."""

from __future__ import annotations

import argparse

from .common import add_json, add_site, emit_json, table

HELP = "show what is in place (Slurm, the store, the predictor), or where a training run stands"
DESCRIPTION = """\
Show the state a plan would start from: whether Slurm answers (and its partitions),
what the profile store holds per GPU type (measured, imported, augmented samples),
whether a fitted predictor is saved next to the store, and the prediction cache.

With a run (its folder, its checkpoint folder or the rendered script): the Slurm jobs
(segments) it went through, with their states where sacct answers, the latest checkpoint
iteration of the training length, and why it stopped if it did.

examples:
  memx-hpc status --site site_configs/local.yaml
  memx-hpc status memx-local/runs/tiny-gpt-data
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("status", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", metavar="RUN",
                   help="a training run: its folder (<log dir>/<job name>), checkpoint folder or rendered script")
    add_site(p, required=False)
    p.add_argument("--store", metavar="PATH", help="profile store (default: the site's, then $MEMX_STORE)")
    add_json(p)
    return p


def run(args: argparse.Namespace) -> int:
    from ..errors import SpecError

    if args.run is not None:
        return _run_status(args)
    if args.site is None:
        raise SpecError("give a site file (what is in place) or a run (where it stands)", field="--site",
                        allowed="--site SITE.yaml, or RUN")
    from ..planner import site_status
    from ..search.report import coverage_table

    st = site_status(args.site, args.store)
    store_path, cache_path = st.store, st.cache
    out: dict = {"site": st.site, "store": str(store_path), "cache": str(cache_path),
                 "slurm": {"installed": st.slurm_installed, "answers": st.slurm_answers}}
    if st.slurm_answers:
        out["slurm"]["partitions"] = dict(st.partitions_seen)
    out["e2e_runs"] = st.e2e_runs
    out["store_summary"] = st.store_summary
    out["site_gpu_types"] = st.site_gpu_types
    out["predictor"] = str(st.predictor) if st.predictor is not None else None
    has_sbatch, up = st.slurm_installed, st.slurm_answers
    if args.json:
        emit_json(out)
        return 0
    print(f"site {st.site}")
    if not has_sbatch:
        print("slurm: not installed here (plans profile through local subprocesses)")
    elif not up:
        print("slurm: installed but not answering (scripts/slurm-local.sh start for the local cluster)")
    else:
        missing = [k for k, v in out["slurm"]["partitions"].items() if not v]
        print("slurm: answers" + (f"; partitions missing from sinfo: {', '.join(missing)}" if missing else
                                  "; every site partition is there"))
    print(f"store: {store_path}" + ("" if store_path.exists() else " (empty: nothing profiled or imported yet)"))
    print("the site's GPU types:")
    coverage_table(out["site_gpu_types"])
    if out["store_summary"]:
        print("the store (every GPU type it holds):")
        rows = []
        for r in out["store_summary"]:
            rows.append((r.get("gpu_type"), r.get("samples", r.get("total", "")),
                         ", ".join(f"{k} {v}" for k, v in sorted(r.get("by_origin", {}).items())),
                         ", ".join(f"{k} {v}" for k, v in sorted(r.get("by_kind", {}).items()))))
        table(rows, ["gpu type", "samples", "by origin", "by kind"])
    print(f"end-to-end runs measured on this site: {out['e2e_runs']}"
          + (" (plan, search and predict calibrate with them)" if out["e2e_runs"] else " (memx-hpc verify adds them)"))
    print(f"predictor: {out['predictor'] or 'not fitted yet (memx-hpc fit, or plan fits it)'}")
    print(f"cache: {cache_path}" + ("" if cache_path.exists() else " (none yet)"))
    return 0


def _run_status(args: argparse.Namespace) -> int:
    from ..planner import run_status

    st = run_status(args.run)
    if args.json:
        import dataclasses

        emit_json(dataclasses.asdict(st))
        return 0
    print(f"run: {st.run_dir or '(no run folder known)'}")
    print(f"checkpoints: {st.checkpoint_dir or '(unknown)'}; latest iteration "
          f"{st.checkpoint_iteration if st.checkpoint_iteration is not None else 'none yet'}"
          + (f" of {st.target_iters}" if st.target_iters else ""))
    if st.segments:
        table([(s.segment, s.job_id + (f" (restart {s.restart})" if s.restart else ""), s.slurm_state or "-",
                "-" if s.start_iteration is None else s.start_iteration,
                "-" if s.end_iteration is None else s.end_iteration, s.outcome,
                "-" if s.exit_code is None else s.exit_code) for s in st.segments],
              ["segment", "job", "slurm", "from iter", "to iter", "outcome", "exit"])
    if st.skipped_lines:
        print(f"({st.skipped_lines} malformed line(s) of the state file left out)")
    print(f"{st.state}: {st.why}")
    return 0
