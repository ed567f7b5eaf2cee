"""Measuring plans for real and learning from them (``memx-hpc verify``).

:func:`verify` searches (or takes plan files), runs each plan as a short real job one after
another, stores every run in the store's end-to-end table and reports measured against
predicted, before calibration and after it (leave-one-out).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecError, SystemFailure
from ..model.assemble import load_cost_model, store_paths
from ..model.calibrate import CalibratedCostModel, Calibration, HeldOut, error_summary, leave_one_out
from ..model.metrics import mape
from ..planfile import load_plan
from ..profile.store import ProfileStore
from ..records import E2ERecord
from ..search.engine import ScoredPlan
from ..slurm.local_cluster import START_HINT, slurm_available
from ..spec import GeneralPlan, Plan, Site, TrainJob
from ..train.measure import measure_plan, move_legacy_records, plan_key
from .conductor import load_specs, plan
from .request import PlanRequest

__all__ = ["VerifyRequest", "VerifyResult", "VerifyRow", "plan_file_entries", "verify"]


@dataclass(frozen=True, kw_only=True)
class VerifyRequest:
    """Measure plans for real (``memx-hpc verify``).

    ``search``: the site, job, store and search options; when ``plans`` is None its search
    runs first and its top ``search.top_k`` plans (in ``search.objective``'s order) are
    measured. ``plans``: (name, plan, prediction at planning time or None) to measure
    instead (:func:`plan_file_entries` reads them from plan files). ``iters`` per run (the
    first is warm-up), ``timeout_s`` per job, ``workdir`` of the jobs; ``rerun`` measures
    plans already measured with the same site, job, plan and iteration count again.
    """

    search: PlanRequest
    plans: tuple | list | None = None
    iters: int = 5
    timeout_s: float = 1800.0
    workdir: str | None = None
    rerun: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.iters, bool) or not isinstance(self.iters, int) or self.iters < 2:
            raise SpecError("at least 2 iterations (the first is warm-up)", field="--iters", found=self.iters)


@dataclass(kw_only=True)
class VerifyResult:
    """What ``verify`` measured and learned. ``rows``: per plan measured (or kept), the
    measurement against the prediction before calibration and after it (leave-one-out).
    ``calibration``: the :class:`~memx_hpc.model.calibrate.Calibration` fitted on every run of
    the site now (what plan, search and predict use from now on). ``summary``: all of it as
    JSON (what ``--json`` prints)."""

    site: Site
    job: TrainJob
    store: Path
    rows: list[VerifyRow]
    calibration: Calibration
    notes: list[str]
    summary: dict


def plan_file_entries(files: list[str], top: int) -> list[tuple[str, Plan, dict | None]]:
    """(file, plan, prediction) of the first ``top`` plan files by their 'rank' field
    (files without one keep their order, after those with one)."""
    entries = []
    for i, f in enumerate(files):
        plan_ = load_plan(f)
        if isinstance(plan_, GeneralPlan):
            raise SpecError("a general plan cannot be run by Megatron-LM", file=f)
        try:
            raw = json.loads(Path(f).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raw = {}
        rank = raw.get("rank") if isinstance(raw.get("rank"), int) else None
        pred = raw.get("prediction") if isinstance(raw.get("prediction"), dict) else None
        entries.append((rank if rank is not None else 10**9, i, f, plan_, pred))
    entries.sort(key=lambda e: (e[0], e[1]))
    return [(f, plan_, pred) for _, _, f, plan_, pred in entries[:top]]


def _prediction_dict(scored: ScoredPlan) -> dict:
    d = scored.prediction.to_dict()
    d["rank"], d["time_only_rank"], d["score"] = scored.rank, scored.time_rank, scored.score
    return d


@dataclass(frozen=True, kw_only=True)
class VerifyRow:
    """One plan ``verify`` measured (or kept from an earlier run): the measurement, what was
    predicted when it was planned, and the prediction before calibration and after it
    (leave-one-out: calibrated on the site's other runs; None when there are none)."""

    plan: str
    key: str
    job_id: str
    new: bool
    measured_ms: float
    measured_peak_mib: float
    measured_allocated_mib: float
    predicted_at_the_time_ms: float | None
    before_ms: float | None
    after_ms: float | None
    before_peak_mib: float | None
    after_peak_mib: float | None
    calibrated_on_runs: int | None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _verify_row(name: str, rec: E2ERecord, fresh: bool, held: HeldOut | None) -> VerifyRow:
    MiB = 2**20
    pred = rec.prediction or {}
    at_time = pred.get("iteration_ms")
    return VerifyRow(plan=str(name), key=rec.key, job_id=rec.job_id, new=fresh,
                     measured_ms=rec.iteration_ms, measured_peak_mib=rec.peak_footprint_bytes / MiB,
                     measured_allocated_mib=rec.peak_allocated_max_bytes / MiB,
                     predicted_at_the_time_ms=float(at_time) if isinstance(at_time, (int, float)) else None,
                     before_ms=held.before_ms if held else None,
                     after_ms=held.after_ms if held else None,
                     before_peak_mib=held.before_footprint_bytes / MiB if held else None,
                     after_peak_mib=held.after_footprint_bytes / MiB if held else None,
                     calibrated_on_runs=held.fitted_on if held else None)


def _rows_mape(rows: list[VerifyRow]) -> dict:
    def of(p: str, m: str) -> float | None:
        return mape([getattr(r, p) for r in rows], [getattr(r, m) for r in rows])

    return {"mape_time_before_pct": of("before_ms", "measured_ms"),
            "mape_time_after_pct": of("after_ms", "measured_ms"),
            "mape_memory_before_pct": of("before_peak_mib", "measured_peak_mib"),
            "mape_memory_after_pct": of("after_peak_mib", "measured_peak_mib")}


def verify(request: VerifyRequest) -> VerifyResult:
    """Search (or take ``request.plans``), run each plan as a short real job one after
    another, store every run in the store's end-to-end table as soon as it ends, and report
    measured against predicted before calibration and after it (leave-one-out: a run is
    never used to predict itself). SystemFailure when Slurm does not answer or a job fails."""
    site, job = load_specs(request.search)
    if not slurm_available(timeout=5.0):
        raise SystemFailure(f"Slurm does not answer (sinfo); verify runs real jobs. {START_HINT}")
    store_path = store_paths(site, request.search.store).store
    store = ProfileStore(store_path)
    notes: list[str] = []
    moved = move_legacy_records(store, notes)

    entries = request.plans
    if entries is None:
        searched = plan(dataclasses.replace(request.search, site=site, job=job))
        notes += searched.notes
        if not searched.ranked:
            raise SpecError(f"none of the {searched.result.stats.plans:,} plans fits in memory on {site.name}"
                            + (" with the expected memory error (--objective memx ranks without it)"
                               if searched.result.top else "") + "; nothing to verify", file=job.source_file)
        entries = [(str(searched.out_dir / f"plan-{s.rank:02d}.json"), s.plan, _prediction_dict(s))
                   for s in searched.ranked[:request.search.top_k]]
        cost_model = searched.cost_model
    else:
        cost_model = load_cost_model(site, job, store_path, analytic=request.search.analytic, notes=notes,
                                     progress=request.search.progress)
    # the runs are predicted by the model before calibration, composed over the same links
    base, links = cost_model.base, cost_model.links

    done = {r.key: r for r in store.e2e_records(site=site.name)}  # the latest run of each key wins
    log_dir = Path(os.path.normpath(site.resolve(site.work_dir))) / "verify"
    measured = []
    for name, plan_, prediction in entries:
        key = plan_key(plan_, site, job, request.iters)
        if key in done and not request.rerun:
            measured.append((name, done[key], False))
            continue
        print(f"verify: running {Path(str(name)).name} ({request.iters} iterations) ...", file=sys.stderr,
              flush=True)
        rec = measure_plan(plan_, site, job, iters=request.iters, log_dir=log_dir, workdir=request.workdir,
                           timeout_s=request.timeout_s, plan_file=str(name), prediction=prediction)
        store.append_e2e([rec])  # at once: a later failure must not lose this run
        done[key] = rec
        measured.append((name, rec, True))

    records = store.e2e_records(site=site.name)
    held = {(h.key, h.job_id): h for h in leave_one_out(base, records, site, job, links=links)}
    rows = [_verify_row(name, rec, fresh, held.get((rec.key, rec.job_id))) for name, rec, fresh in measured]
    now = CalibratedCostModel(base, records, site, job, links=links).fit().calibration_
    summary = {"store": str(store_path), "plans": [r.to_dict() for r in rows], "notes": notes,
               "moved_from_jsonl": moved,
               "these_plans": _rows_mape(rows),
               "all_runs_leave_one_out": error_summary(list(held.values())),
               "calibration": {"runs": now.runs, "selection": now.selection, "time_factor": dict(now.time_factor),
                               "overhead_bytes": dict(now.overhead_bytes), "memory_scale": dict(now.memory_scale),
                               "skipped": list(now.skipped),
                               "describe": now.describe()}}
    return VerifyResult(site=site, job=job, store=store_path, rows=rows, calibration=now, notes=notes,
                        summary=summary)
