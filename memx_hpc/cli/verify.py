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
    import os
    from pathlib import Path

    from ..errors import SpecError, SystemFailure
    from ..profile.store import ProfileStore
    from ..slurm.local_cluster import START_HINT, slurm_available
    from ..spec import load_job, load_site
    from ..train.measure import measure_plan, plan_key
    from ..planner import base_of, load_cost_model, plan, store_paths
    from .search import request_from_args

    if args.iters < 2:
        raise SpecError("at least 2 iterations (the first is warm-up)", field="--iters", found=args.iters)
    site = load_site(args.site)
    job = load_job(args.job)
    entries = _plan_entries(args.plans, args.top) if args.plans else None
    if not slurm_available(timeout=5.0):
        raise SystemFailure(f"Slurm does not answer (sinfo); verify runs real jobs. {START_HINT}")
    store_path = store_paths(site, args.store).store
    store = ProfileStore(store_path)
    notes: list[str] = []
    moved = _move_legacy_records(store, notes)

    if entries is None:
        searched = plan(request_from_args(args, site=site, job=job))
        notes += searched.notes
        if not searched.ranked:
            raise SpecError(f"none of the {searched.result.stats.plans:,} plans fits in memory on {site.name}"
                            + (" with the expected memory error (--objective memx ranks without it)"
                               if searched.result.top else "") + "; nothing to verify", file=job.source_file)
        entries = [(str(searched.out_dir / f"plan-{s.rank:02d}.json"), s.plan, _prediction_dict(s))
                   for s in searched.ranked[:args.top]]
        base = base_of(searched.cost_model)
    else:
        base = base_of(load_cost_model(site, job, store_path, analytic=args.analytic, notes=notes))

    done = {r.key: r for r in store.e2e_records(site=site.name)}  # the latest run of each key wins
    log_dir = Path(os.path.normpath(site.resolve(site.work_dir))) / "verify"
    measured = []
    for name, plan, prediction in entries:
        key = plan_key(plan, site, job, args.iters)
        if key in done and not args.rerun:
            measured.append((name, done[key], False))
            continue
        print(f"verify: running {Path(str(name)).name} ({args.iters} iterations) ...", file=_stderr(), flush=True)
        rec = measure_plan(plan, site, job, iters=args.iters, log_dir=log_dir, workdir=args.chdir,
                           timeout_s=args.timeout, plan_file=str(name), prediction=prediction)
        store.append_e2e([rec])  # at once: a later failure must not lose this run
        done[key] = rec
        measured.append((name, rec, True))

    from ..model.calibrate import CalibratedCostModel, error_summary, leave_one_out

    records = store.e2e_records(site=site.name)
    held = {(h.key, h.job_id): h for h in leave_one_out(base, records, site, job)}
    rows = [_row(name, rec, fresh, held.get((rec.key, rec.job_id))) for name, rec, fresh in measured]
    now = CalibratedCostModel(base, records, site, job).fit().calibration_
    summary_rows = error_summary([h for h in held.values()])
    out = {"store": str(store_path), "plans": rows, "notes": notes,
           "moved_from_jsonl": moved,
           "these_plans": _mapes(rows),
           "all_runs_leave_one_out": summary_rows,
           "calibration": {"runs": now.runs, "selection": now.selection, "time_factor": dict(now.time_factor),
                           "overhead_bytes": dict(now.overhead_bytes), "memory_scale": dict(now.memory_scale),
                           "skipped": list(now.skipped),
                           "describe": now.describe()}}
    if args.json:
        emit_json(out)
        return 0
    from .common import table

    def pct(p, m):
        return "-" if p is None or not m else f"{100.0 * (p - m) / m:+.0f}%"

    table([[Path(str(r["plan"])).name, r["measured_ms"], r["before_ms"], pct(r["before_ms"], r["measured_ms"]),
            r["after_ms"] if r["after_ms"] is not None else "-", pct(r["after_ms"], r["measured_ms"]),
            r["measured_peak_mib"], r["before_peak_mib"], pct(r["before_peak_mib"], r["measured_peak_mib"]),
            r["after_peak_mib"] if r["after_peak_mib"] is not None else "-",
            pct(r["after_peak_mib"], r["measured_peak_mib"]), r["job_id"], "new" if r["new"] else "kept"]
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


def _stderr():
    import sys
    return sys.stderr


def _plan_entries(files: list[str], top: int) -> list[tuple[str, object, dict | None]]:
    """(file, plan, prediction) of the first ``top`` plan files by their 'rank' field."""
    import json
    from pathlib import Path

    from ..errors import SpecError
    from ..planfile import load_plan
    from ..spec import GeneralPlan

    entries = []
    for i, f in enumerate(files):
        plan = load_plan(f)
        if isinstance(plan, GeneralPlan):
            raise SpecError("a general plan cannot be run by Megatron-LM", file=f)
        try:
            raw = json.loads(Path(f).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raw = {}
        rank = raw.get("rank") if isinstance(raw.get("rank"), int) else None
        pred = raw.get("prediction") if isinstance(raw.get("prediction"), dict) else None
        entries.append((rank if rank is not None else 10**9, i, f, plan, pred))
    entries.sort(key=lambda e: (e[0], e[1]))
    return [(f, plan, pred) for _, _, f, plan, pred in entries[:top]]


def _prediction_dict(scored) -> dict:
    d = scored.prediction.to_dict()
    d["rank"], d["time_only_rank"], d["score"] = scored.rank, scored.time_rank, scored.score
    return d


def _move_legacy_records(store, notes: list[str]) -> int:
    """Runs an earlier version kept in ``<store>.e2e.jsonl`` go into the store (the file stays)."""
    from ..train.measure import read_records

    legacy = store.path.with_suffix(".e2e.jsonl")
    records = read_records(legacy)
    if not records:
        return 0
    added = store.append_e2e(records)
    if added:
        notes.append(f"moved {added} run(s) from {legacy} into the store's end-to-end table (the file can go)")
    return added


def _row(name, rec, fresh: bool, held) -> dict:
    MiB = 2**20
    pred = rec.prediction or {}
    at_time = pred.get("iteration_ms")
    return {"plan": str(name), "key": rec.key, "job_id": rec.job_id, "new": fresh,
            "measured_ms": rec.iteration_ms, "measured_peak_mib": rec.peak_footprint_bytes / MiB,
            "measured_allocated_mib": rec.peak_allocated_max_bytes / MiB,
            "predicted_at_the_time_ms": float(at_time) if isinstance(at_time, (int, float)) else None,
            "before_ms": held.before_ms if held else None,
            "after_ms": held.after_ms if held else None,
            "before_peak_mib": held.before_footprint_bytes / MiB if held else None,
            "after_peak_mib": held.after_footprint_bytes / MiB if held else None,
            "calibrated_on_runs": held.fitted_on if held else None}


def _mape1(rows: list[dict], p: str, m: str) -> float | None:
    from ..model.metrics import mape
    return mape([r[p] for r in rows], [r[m] for r in rows])


def _mapes(rows: list[dict]) -> dict:
    return {"mape_time_before_pct": _mape1(rows, "before_ms", "measured_ms"),
            "mape_time_after_pct": _mape1(rows, "after_ms", "measured_ms"),
            "mape_memory_before_pct": _mape1(rows, "before_peak_mib", "measured_peak_mib"),
            "mape_memory_after_pct": _mape1(rows, "after_peak_mib", "measured_peak_mib")}


def _f(x) -> str:
    return "-" if x is None else f"{x:.1f}%"
