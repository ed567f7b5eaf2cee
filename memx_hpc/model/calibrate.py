"""Calibration of a cost model from end-to-end runs (``memx-hpc verify``): the refit path.

The predictor learns single layers; a whole run shows what layer profiles miss: the
runtime's memory beyond the tensors the plan holds (interpreter, libraries, communicator
buffers, allocator slack, fragmentation over many iterations) and the time a pipeline of
real processes spends beyond its layers (launch overheads, cache effects, contention).
:class:`CalibratedCostModel` wraps any :class:`~memx_hpc.model.api.CostModel` and corrects
both per GPU type from the runs measured on the site, leaving the base model untouched.

Memory: the device-memory model ``F = S + a_g (A - S) + b_g`` (:mod:`memx_hpc.model.memory`:
the allocator's slack on the activations, the state ``S`` at its size). For
every rank ``k`` of run ``r`` that reported memory, its measured footprint ``F_k`` (what
the device reports: ``max reserved`` or the driver's figure; peak RSS on the CPU) and the
allocator peak ``A_k`` the base model predicts for its stage (state ``S_k`` + in-flight
activations + the recompute transient; :mod:`memx_hpc.model.compose`). Each run gives
one triple per GPU type, the medians over its ranks of that type (a run with many ranks
does not outvote one with few); ``a_g`` and ``b_g`` are the posterior mean of a linear
fit through those triples with the vendor's prior (allocator reserve ~10 %, context and
communicator buffers), so one run moves them part of the way and runs of different
sizes separate the slope from the offset. A constant alone, fitted on large plans,
overshoots small ones by the reserve it attributes to the constant.

Time: one multiplicative factor ``f_g`` per GPU type on the forward+backward time of
every layer query of that type (transformer layer, embedding, head). A run's predicted
iteration time ``T_r(f)`` is the planner's own composition (1F1B schedule, p2p, data-
parallel synchronisation, optimizer step) with the scaled layer times, so ``f`` enters
non-linearly (communication and optimizer are not scaled) and the factors of the GPU
types of a heterogeneous plan are fitted jointly::

    minimise over log f:   sum_r (log T_meas,r - log T_r(f))^2  +  lambda * sum_g (log f_g)^2

Log space, because errors are relative: twice too slow costs as much as twice too fast.
The second term shrinks the factors toward 1 (the base model is right) when there are
few runs: it is the MAP estimate under log-normal measurement noise with a log-normal
prior on ``f_g`` centred at 1 whose variance equals one run's noise variance, i.e. a
prior worth ``lambda`` = :data:`PRIOR_RECORDS` = 1 run. With ``n`` runs on one GPU type
whose time is proportional to ``f``, ``log f = sum_r e_r / (n + 1)``: half of the mean
log error after one run, 90 % after nine. Solved with ``scipy.optimize.least_squares``
(trust region, bounds ``1/MAX_FACTOR .. MAX_FACTOR``).

Honesty. A calibration is never scored on the runs it was fitted on:
:func:`leave_one_out` fits on all runs but one, predicts the one left out, and repeats;
that error is the number to report. Other runs of the very same plan (``--rerun``) are
left out with it, so a repeat cannot tell the calibration the answer.

Which runs. Runs of the site (by name) whose plan still runs on the site's partitions
(same partitions, same GPU types as when measured). When a job is given and the site
has runs of that job, only those (a layer-time factor learned on one model shape is the
best guess for that shape); otherwise every run of the site.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from ..errors import SpecError
from ..records import E2ERecord, job_from_spec, records_hash
from ..spec import Plan, Site, TrainJob
from .api import LayerQuery
from .metrics import mape

if TYPE_CHECKING:
    from .links import LinkModel

__all__ = ["CalibratedCostModel", "Calibration", "HeldOut", "MAX_FACTOR", "PRIOR_RECORDS", "error_summary",
           "leave_one_out", "select_records"]

#: Weight of the prior "factor = 1", in runs (see the module docstring).
PRIOR_RECORDS = 1.0
#: Time factors are kept within [1/MAX_FACTOR, MAX_FACTOR]: beyond that the base model is
#: not off by a calibration, it is wrong, and a run that far out is more likely broken.
MAX_FACTOR = 20.0
CALIBRATION_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """What was learned: per GPU type a layer-time factor and a device overhead (bytes)."""

    time_factor: Mapping[str, float]
    overhead_bytes: Mapping[str, int]
    runs: int  # runs it was fitted on
    runs_by_gpu_type: Mapping[str, int]
    selection: str  # which runs, in words
    skipped: tuple[str, ...] = ()  # runs left out, with the reason
    # factor for GPU types with no runs: the run-weighted geometric mean of the fitted
    # factors. What the base model gets wrong for every type alike (framework overhead,
    # the schedule) is corrected there too; without it, calibrating one type would make
    # the uncalibrated ones look faster by comparison and the search would move to them.
    default_time_factor: float = 1.0
    # a of footprint = state + a x activations + b per GPU type (b is overhead_bytes); see memx_hpc.model.memory
    memory_scale: Mapping[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        if not self.runs:
            return f"no usable end-to-end runs ({self.selection}): no correction"
        parts = []
        for g in sorted(self.runs_by_gpu_type):
            f = self.time_factor.get(g, 1.0)
            o = self.overhead_bytes.get(g)
            a = self.memory_scale.get(g)
            mem = (f", device memory state + {a:.3f} x activations + {o / 2**20:,.0f} MiB" if o is not None and a is not None
                   else f", device overhead {o / 2**20:,.0f} MiB" if o is not None else "")
            parts.append(f"{g}: layer time x{f:.3f}" + mem + f" ({self.runs_by_gpu_type[g]} run(s))")
        if abs(self.default_time_factor - 1.0) > 1e-9:
            parts.append(f"other GPU types: layer time x{self.default_time_factor:.3f}")
        return f"{self.selection}; " + "; ".join(parts)


@dataclass(frozen=True, kw_only=True)
class HeldOut:
    """One run predicted by a calibration fitted without it (and by the base model)."""

    key: str
    job_id: str
    plan: dict
    measured_ms: float
    before_ms: float  # base model
    after_ms: float  # calibrated on the other runs
    measured_footprint_bytes: int  # largest over the ranks
    before_footprint_bytes: int  # largest predicted peak over the stages
    after_footprint_bytes: int
    fitted_on: int  # runs the 'after' calibration saw
    before: Any = field(default=None, compare=False, repr=False)  # the whole Predictions
    after: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class _Run:
    record: E2ERecord
    plan: Plan
    job: TrainJob
    gpu_types: tuple[str, ...]
    base: Any = field(compare=False)  # the base model's Prediction


# --------------------------------------------------------------------------- cost-model views


class _Memo:
    """The base model with every answer kept: calibration asks for the same layers again and again."""

    def __init__(self, base: Any, site: Site, links: "LinkModel | None" = None) -> None:
        self.base = base
        self.site = site
        self.table: dict[LayerQuery, tuple[float, float]] = {}
        self.overheads: dict[str, int] = {}
        self.links = links  # what every run is composed over (None: the site's figures)
        from .memory import memory_scale_of
        self.memory_scale = memory_scale_of(base, site)

    def predict(self, queries: Sequence[LayerQuery]) -> np.ndarray:
        missing = [q for q in dict.fromkeys(queries) if q not in self.table]
        if missing:
            vals = np.asarray(self.base.predict(missing), dtype=np.float64).reshape(len(missing), 2)
            for q, v in zip(missing, vals):
                self.table[q] = (float(v[0]), float(v[1]))
        out = np.empty((len(queries), 2), dtype=np.float64)
        for i, q in enumerate(queries):
            out[i] = self.table[q]
        return out

    def overhead_bytes(self, gpu_type: str) -> int:
        v = self.overheads.get(gpu_type)
        if v is None:
            v = self.overheads[gpu_type] = int(self.base.overhead_bytes(gpu_type))
        return v


class _Corrected:
    """``memo`` with layer times scaled by ``factors``, overheads replaced by ``overheads`` and
    the device-memory slope by ``scales``."""

    def __init__(self, memo: _Memo, factors: Mapping[str, float], overheads: Mapping[str, int],
                 default_factor: float = 1.0, scales: Mapping[str, float] | None = None) -> None:
        self.memo, self.factors, self.overheads = memo, dict(factors), dict(overheads)
        self.default_factor = default_factor
        self.scales = dict(scales or {})
        self.links = memo.links

    @staticmethod
    def of(memo: _Memo, cal: "Calibration") -> "_Corrected":
        return _Corrected(memo, cal.time_factor, cal.overhead_bytes, cal.default_time_factor, cal.memory_scale)

    def memory_scale(self, gpu_type: str) -> float:
        v = self.scales.get(gpu_type)
        return float(v) if v is not None else float(self.memo.memory_scale(gpu_type))

    def predict(self, queries: Sequence[LayerQuery]) -> np.ndarray:
        out = self.memo.predict(queries).copy()
        if self.factors or self.default_factor != 1.0:
            out[:, 0] *= np.array([self.factors.get(q.gpu_type, self.default_factor) for q in queries])
        return out

    def overhead_bytes(self, gpu_type: str) -> int:
        v = self.overheads.get(gpu_type)
        return int(v) if v is not None else self.memo.overhead_bytes(gpu_type)


# --------------------------------------------------------------------------- selecting and preparing runs


def select_records(records: Sequence[E2ERecord], site: Site, job: TrainJob | None = None
                   ) -> tuple[list[E2ERecord], str]:
    """The runs a calibration of ``site`` (for ``job``) uses, and that choice in words."""
    of_site = [r for r in records if r.site == site.name]
    if job is not None:
        same = [r for r in of_site if r.job == job.name]
        if same:
            return same, f"{len(same)} run(s) of job {job.name} on site {site.name}"
        if of_site:
            return of_site, (f"{len(of_site)} run(s) of other jobs on site {site.name} (none of job {job.name})")
    return of_site, f"{len(of_site)} run(s) on site {site.name}"


def _prepare(records: Sequence[E2ERecord], site: Site, job: TrainJob | None, memo: _Memo,
             options: Any) -> tuple[list[_Run], list[str]]:
    from ..planfile import plan_from_mapping
    from .compose import predict_plan

    runs, skipped = [], []
    for r in records:
        where = f"run {r.key} (job {r.job_id})"
        try:
            plan = plan_from_mapping(r.plan)
        except SpecError as e:
            skipped.append(f"{where}: its plan does not read ({e})")
            continue
        if not isinstance(plan, Plan):
            skipped.append(f"{where}: a general plan")
            continue
        if r.job_spec:
            try:
                rjob = job_from_spec(r.job_spec)
            except SpecError as e:
                skipped.append(f"{where}: {e}")
                continue
        elif job is not None and r.job == job.name:
            rjob = job  # records written before job shapes were kept
        else:
            skipped.append(f"{where}: the record does not say the shape of job {r.job!r}")
            continue
        try:
            types = tuple(site.partition(s.partition).gpu_type for s in plan.stages)
        except SpecError:
            skipped.append(f"{where}: the site no longer has partition(s) "
                           f"{sorted({s.partition for s in plan.stages} - {p.name for p in site.partitions})}")
            continue
        measured_on = set(r.gpu_type_by_rank.values())
        if measured_on and not measured_on <= set(types):
            skipped.append(f"{where}: measured on {sorted(measured_on)}, the site now runs its partitions on "
                           f"{sorted(set(types))}")
            continue
        if not (r.iteration_ms > 0 and math.isfinite(r.iteration_ms)):
            skipped.append(f"{where}: no iteration time")
            continue
        try:
            base = predict_plan(plan, site, rjob, memo, options=options, links=memo.links)
        except SpecError as e:
            skipped.append(f"{where}: the plan cannot be predicted on this site ({e})")
            continue
        runs.append(_Run(record=r, plan=plan, job=rjob, gpu_types=tuple(sorted(set(types))), base=base))
    return runs, skipped


# --------------------------------------------------------------------------- fitting


def _device_memory(runs: Sequence[_Run], memo: _Memo, site: Site,
                   prior_records: float = PRIOR_RECORDS) -> tuple[dict[str, int], dict[str, float]]:
    """Per GPU type, ``footprint = S + a x (allocator peak - S) + b`` (``S`` the state)
    fitted on the runs (:func:`memx_hpc.model.memory.fit_device_memory`, shrunk toward the
    vendor's prior): one (allocator peak, state, footprint) triple per run, the medians over
    its ranks of that type."""
    from .memory import fit_device_memory, prior_for
    pairs: dict[str, list[tuple[float, float, float]]] = {}
    for run in runs:
        width = run.plan.gpus_per_stage
        per: dict[str, list[tuple[float, float, float]]] = {}
        for rank, foot in run.record.peak_footprint_bytes_by_rank.items():
            try:
                stage = run.record.stage_by_rank.get(str(rank), int(rank) // width)
            except ValueError:
                continue
            if not 0 <= stage < len(run.base.stages) or foot <= 0:
                continue
            sp = run.base.stages[stage]
            alloc = float(sp.state_bytes + sp.activation_bytes)
            per.setdefault(sp.gpu_type, []).append((alloc, float(sp.state_bytes), float(foot)))
        for g, vals in per.items():
            pairs.setdefault(g, []).append(tuple(statistics.median(v[k] for v in vals) for k in range(3)))
    overheads, scales = {}, {}
    for g, ps in pairs.items():
        m = fit_device_memory([a for a, _, _ in ps], [f for _, _, f in ps], prior_for(site.gpu(g).vendor),
                              state_bytes=[st for _, st, _ in ps],
                              prior_weight=prior_records / PRIOR_RECORDS if PRIOR_RECORDS else 1.0)
        overheads[g], scales[g] = int(round(m.b_bytes)), float(m.a)
    return overheads, scales


def _time_factors(runs: Sequence[_Run], memo: _Memo, site: Site, prior_records: float,
                  options: Any) -> dict[str, float]:
    from scipy.optimize import least_squares

    from .compose import predict_plan

    types = sorted({g for r in runs for g in r.gpu_types})
    if not types:
        return {}
    meas = np.log([r.record.iteration_ms for r in runs])
    w = math.sqrt(prior_records)

    def residuals(x: np.ndarray) -> np.ndarray:
        view = _Corrected(memo, dict(zip(types, np.exp(x))), {})
        pred = np.log([predict_plan(r.plan, site, r.job, view, options=options, links=memo.links).iteration_ms
                       for r in runs])
        return np.concatenate([meas - pred, w * x])

    lim = math.log(MAX_FACTOR)
    sol = least_squares(residuals, np.zeros(len(types)), bounds=(-lim, lim), method="trf", diff_step=1e-6,
                        xtol=1e-10, ftol=1e-12, gtol=1e-12)
    return {g: float(math.exp(v)) for g, v in zip(types, sol.x)}


def _fit(runs: Sequence[_Run], memo: _Memo, site: Site, *, prior_records: float, options: Any, selection: str,
         skipped: Sequence[str]) -> Calibration:
    by_type: dict[str, int] = {}
    for r in runs:
        for g in r.gpu_types:
            by_type[g] = by_type.get(g, 0) + 1
    factors = _time_factors(runs, memo, site, prior_records, options)
    default = 1.0
    if factors:
        weights = {g: by_type.get(g, 0) for g in factors}
        total = sum(weights.values())
        if total:
            default = math.exp(sum(weights[g] * math.log(f) for g, f in factors.items()) / total)
    overheads, scales = _device_memory(runs, memo, site, prior_records)
    return Calibration(time_factor=factors, overhead_bytes=overheads, memory_scale=scales, runs=len(runs),
                       runs_by_gpu_type=by_type,
                       selection=selection, skipped=tuple(skipped), default_time_factor=default)


# --------------------------------------------------------------------------- the model


class CalibratedCostModel:
    """``base`` corrected per GPU type by the end-to-end runs of ``site`` (see the module docstring).

    Implements :class:`~memx_hpc.model.api.CostModel`. ``records``: end-to-end records (any
    site; those of ``site`` are used, of ``job`` when given and present). Construction only
    selects and hashes; :meth:`fit` (called on first use) predicts the runs and solves.
    ``identity`` covers the base model's identity and the runs used, so the signature cache
    drops its answers when a run is added. ``links``: the site's links the runs are composed
    over (None: the site's figures alone). Learned: ``calibration_``.
    """

    def __init__(self, base: Any, records: Sequence[E2ERecord], site: Site, job: TrainJob | None = None, *,
                 prior_records: float = PRIOR_RECORDS, options: Any = None, links: "LinkModel | None" = None) -> None:
        if not (prior_records >= 0 and math.isfinite(prior_records)):
            raise SpecError("the prior's weight is a number of runs >= 0", field="prior_records",
                            found=prior_records)
        self.base = base
        self.site = site
        self.job = job
        self.prior_records = float(prior_records)
        self.options = options
        self.records, self.selection = select_records(records, site, job)
        self.identity = hashlib.sha256(json.dumps(
            {"base": base.identity, "e2e": records_hash(self.records), "prior_records": self.prior_records,
             "calibration": CALIBRATION_VERSION}, sort_keys=True).encode()).hexdigest()
        self.links = links
        self._memo = _Memo(base, site, links)
        self._view: _Corrected | None = None

    def fit(self) -> "CalibratedCostModel":
        runs, skipped = _prepare(self.records, self.site, self.job, self._memo, self.options)
        self.calibration_ = _fit(runs, self._memo, self.site, prior_records=self.prior_records, options=self.options,
                                 selection=self.selection, skipped=skipped)
        self._view = _Corrected.of(self._memo, self.calibration_)
        return self

    def _corrected(self) -> _Corrected:
        if self._view is None:
            self.fit()
        assert self._view is not None
        return self._view

    def predict(self, queries: Sequence[LayerQuery]) -> np.ndarray:
        return self._corrected().predict(queries)

    def overhead_bytes(self, gpu_type: str) -> int:
        return self._corrected().overhead_bytes(gpu_type)

    def memory_scale(self, gpu_type: str) -> float:
        """``a`` of ``footprint = state + a x activations + b`` (:mod:`memx_hpc.model.memory`)."""
        return self._corrected().memory_scale(gpu_type)

    def basis(self, gpu_type: str):
        # where the layer numbers come from; the calibration is reported beside it
        return self.base.basis(gpu_type)

    def provenance(self, gpu_type: str) -> str:
        return self.base.provenance(gpu_type)


# --------------------------------------------------------------------------- the honest number


def leave_one_out(base: Any, records: Sequence[E2ERecord], site: Site, job: TrainJob | None = None, *,
                  prior_records: float = PRIOR_RECORDS, options: Any = None,
                  links: "LinkModel | None" = None) -> list[HeldOut]:
    """Every usable run of the selection, predicted by the base model and by a calibration
    fitted on the runs of other plans only (other runs of the same plan are left out too),
    composed over ``links`` (None: the site's figures). With nothing else to learn from,
    'after' is the base model."""
    from .compose import predict_plan

    selected, selection = select_records(records, site, job)
    memo = _Memo(base, site, links)
    runs, skipped = _prepare(selected, site, job, memo, options)
    out = []
    for i, run in enumerate(runs):
        rest = [r for r in runs if r.record.key != run.record.key]
        cal = _fit(rest, memo, site, prior_records=prior_records, options=options, selection=selection,
                   skipped=skipped)
        after = predict_plan(run.plan, site, run.job, _Corrected.of(memo, cal), options=options, links=memo.links)
        out.append(HeldOut(key=run.record.key, job_id=run.record.job_id, plan=run.record.plan,
                           measured_ms=run.record.iteration_ms, before_ms=run.base.iteration_ms,
                           after_ms=after.iteration_ms, measured_footprint_bytes=run.record.peak_footprint_bytes,
                           before_footprint_bytes=max(s.peak_bytes for s in run.base.stages),
                           after_footprint_bytes=max(s.peak_bytes for s in after.stages), fitted_on=len(rest),
                           before=run.base, after=after))
    return out


def error_summary(held: Sequence[HeldOut]) -> dict[str, float | int | None]:
    """MAPE (%) of iteration time and of device footprint, before calibration and after it
    (leave-one-out), over ``held``."""
    time = [h.measured_ms for h in held]
    memory = [h.measured_footprint_bytes for h in held]
    return {"runs": len(held),
            "mape_time_before_pct": mape([h.before_ms for h in held], time),
            "mape_time_after_pct": mape([h.after_ms for h in held], time),
            "mape_memory_before_pct": mape([h.before_footprint_bytes for h in held], memory),
            "mape_memory_after_pct": mape([h.after_footprint_bytes for h in held], memory)}
