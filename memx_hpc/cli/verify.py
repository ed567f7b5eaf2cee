"""``memx-hpc verify``: run the top plans for real, measure them, compare with the prediction.

Each plan becomes a short heterogeneous job (the same script ``render`` writes, with
``--iters``), submitted one after another so that measured runs do not compete for the
same nodes; iteration time and peak memory are read from its Megatron-LM log. Every
measurement is appended, with its provenance, to the site's end-to-end record (a JSON
Lines file next to the profile store); a plan already measured with the same site, job
and iteration count is not run again.
"""

from __future__ import annotations

import argparse

from .common import add_job, add_json, add_site, emit_json

HELP = "run the top plans as short real jobs and compare measured with predicted time and memory"

DESCRIPTION = """\
Submit plan files (as 'memx-hpc plan' writes them: plan-1.json, plan-2.json, ...) as
short real runs, one heterogeneous job each, and report measured against predicted
iteration time and peak memory. Measurements are kept in <store>.e2e.jsonl with their
provenance; plans measured before are skipped (use --rerun to measure again).

example:
  memx-hpc verify --site site_configs/local.yaml --job jobs/tiny-gpt.yaml --top 2 \
      --plans memx-local/runs/plan-tiny-gpt/plan-*.json
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("verify", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_site(p)
    add_job(p)
    p.add_argument("--plans", nargs="+", required=True, metavar="PLAN.json",
                   help="plan files; ordered by their 'rank' field when they have one")
    p.add_argument("--top", type=int, default=3, metavar="K", help="measure the first K plans (default 3)")
    p.add_argument("--iters", type=int, default=5, metavar="N", help="iterations per run (the first is warm-up)")
    p.add_argument("--timeout", type=float, default=1800.0, metavar="S", help="seconds to wait for each job")
    p.add_argument("--chdir", metavar="DIR", help="working directory of the jobs (default: here)")
    p.add_argument("--rerun", action="store_true", help="measure plans again even when already measured")
    add_json(p)
    return p


def run(args: argparse.Namespace) -> int:
    import json
    import os
    from pathlib import Path

    from ..errors import SpecError, SystemFailure
    from ..planfile import load_plan
    from ..slurm.local_cluster import START_HINT, slurm_available
    from ..spec import GeneralPlan, load_job, load_site
    from ..train.measure import measure_plan, plan_key, read_records

    if args.top < 1:
        raise SpecError("must be >= 1", field="--top", found=args.top)
    if args.iters < 2:
        raise SpecError("at least 2 iterations (the first is warm-up)", field="--iters", found=args.iters)
    site = load_site(args.site)
    job = load_job(args.job)
    entries = []
    for i, f in enumerate(args.plans):
        plan = load_plan(f)
        if isinstance(plan, GeneralPlan):
            raise SpecError("a general plan cannot be run by Megatron-LM", file=f)
        try:
            raw = json.loads(Path(f).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raw = {}
        rank = raw.get("rank") if isinstance(raw.get("rank"), int) else None
        entries.append((rank if rank is not None else 10**9, i, f, plan, raw.get("prediction")))
    entries.sort(key=lambda e: (e[0], e[1]))
    entries = entries[:args.top]
    if not slurm_available(timeout=5.0):
        raise SystemFailure(f"Slurm does not answer (sinfo); verify runs real jobs. {START_HINT}")

    record_path = site.store.with_suffix(".e2e.jsonl")
    done = {r.key: r for r in read_records(record_path)}
    log_dir = Path(os.path.normpath(site.resolve(site.work_dir))) / "verify"
    results = []
    for _, _, f, plan, prediction in entries:
        key = plan_key(plan, site, job, args.iters)
        if key in done and not args.rerun:
            rec, fresh = done[key], False
        else:
            rec = measure_plan(plan, site, job, iters=args.iters, log_dir=log_dir, workdir=args.chdir,
                               timeout_s=args.timeout, plan_file=str(f), prediction=prediction)
            rec.append_to(record_path)
            done[key] = rec
            fresh = True
        results.append((f, rec, fresh))

    rows = [_row(f, rec, fresh) for f, rec, fresh in results]
    if args.json:
        emit_json({"records": str(record_path), "plans": rows,
                   "mape_time_pct": _mape(rows, "predicted_ms", "measured_ms"),
                   "mape_memory_pct": _mape(rows, "predicted_peak_mib", "measured_peak_mib")})
    else:
        from .common import table

        table([[Path(r["plan"]).name, r["predicted_ms"] if r["predicted_ms"] is not None else "-", r["measured_ms"],
                _err(r["predicted_ms"], r["measured_ms"]),
                r["predicted_peak_mib"] if r["predicted_peak_mib"] is not None else "-", r["measured_peak_mib"],
                _err(r["predicted_peak_mib"], r["measured_peak_mib"]), r["job_id"],
                "new" if r["new"] else "kept"] for r in rows],
              ["plan", "pred ms", "meas ms", "err", "pred peak MiB", "meas peak MiB", "err", "job", "run"])
        mt, mm = _mape(rows, "predicted_ms", "measured_ms"), _mape(rows, "predicted_peak_mib", "measured_peak_mib")
        if mt is not None:
            print(f"MAPE: iteration time {mt:.1f}%" + (f", peak memory {mm:.1f}%" if mm is not None else ""))
        print(f"measurements: {record_path}")
    return 0


def _row(f: str, rec, fresh: bool) -> dict:
    pred = rec.prediction or {}
    pred_ms = pred.get("iteration_ms")
    peaks = [s.get("peak_bytes") for s in pred.get("stages", []) if isinstance(s, dict) and s.get("peak_bytes")]
    return {"plan": f, "key": rec.key, "job_id": rec.job_id, "new": fresh,
            "predicted_ms": float(pred_ms) if isinstance(pred_ms, (int, float)) else None,
            "measured_ms": rec.iteration_ms,
            "predicted_peak_mib": max(peaks) / 2**20 if peaks else None,
            "measured_peak_mib": rec.peak_footprint_bytes / 2**20}


def _err(pred, meas) -> str:
    if pred is None or not meas:
        return "-"
    return f"{100.0 * (pred - meas) / meas:+.0f}%"


def _mape(rows: list[dict], p: str, m: str) -> float | None:
    pairs = [(r[p], r[m]) for r in rows if r[p] is not None and r[m]]
    if not pairs:
        return None
    return 100.0 * sum(abs(a - b) / b for a, b in pairs) / len(pairs)
