"""Calibration from end-to-end runs: known factors and overheads are recovered, the prior
shrinks, the identity follows the runs, leave-one-out never sees the run it predicts."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from memx_hpc.errors import SpecError
from memx_hpc.model.api import AnalyticCostModel, CostModel
from memx_hpc.model.calibrate import (CalibratedCostModel, error_summary, leave_one_out, select_records)
from memx_hpc.model.compose import predict_plan
from memx_hpc.planfile import plan_to_dict
from memx_hpc.records import E2ERecord, job_to_spec
from memx_hpc.spec import Plan, Recompute, Stage, load_job, load_site
from memx_hpc.train.measure import plan_key

ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20


@pytest.fixture(scope="module")
def site():
    return load_site(ROOT / "site_configs" / "local.yaml")


@pytest.fixture(scope="module")
def job():
    return dataclasses.replace(load_job(ROOT / "jobs" / "tiny-gpt.yaml"), distributed_optimizer=False)


class Truth:
    """The 'real machine' of these tests: the roofline with its layer times scaled and its
    overhead replaced, per GPU type (the very correction the calibration learns)."""

    def __init__(self, base, factor: dict[str, float], overhead: dict[str, int]) -> None:
        self.base, self.factor, self.overhead = base, factor, overhead
        self.identity = "truth"

    def predict(self, queries):
        out = np.asarray(self.base.predict(queries), dtype=float).copy()
        out[:, 0] *= [self.factor[q.gpu_type] for q in queries]
        return out

    def overhead_bytes(self, g):
        return self.overhead[g]

    def provenance(self, g):
        return "measured"


def plans(site, job) -> list[Plan]:
    L, gbs = job.model.num_layers, job.global_batch_size
    none, full = Recompute(), Recompute(mode="full")
    out = []
    for part in ("nvidia_a100", "nvidia_v100"):
        for tp, dp, mbs, rc in ((1, 1, 1, none), (1, 2, 2, full), (2, 1, 4, none), (1, 1, 2, full)):
            out.append(Plan(tp=tp, dp=dp, micro_batch_size=mbs, global_batch_size=gbs,
                            stages=(Stage(partition=part, num_layers=L, recompute=rc),)))
    for k in (1, 3):
        out.append(Plan(tp=1, dp=1, micro_batch_size=1, global_batch_size=gbs,
                        stages=(Stage(partition="nvidia_a100", num_layers=k),
                                Stage(partition="nvidia_v100", num_layers=L - k, recompute=full))))
    return out


def record_of(plan: Plan, site, job, truth, *, time_noise: float = 1.0, job_id: str = "1",
              extra_footprint: int = 0) -> E2ERecord:
    """What verify would store had ``truth`` been the machine."""
    pred = predict_plan(plan, site, job, truth)
    foot, alloc, gpus, stages = {}, {}, {}, {}
    for s in pred.stages:
        for d in range(plan.dp):
            for t in range(plan.tp):
                r = str(s.stage * plan.tp * plan.dp + d * plan.tp + t)
                gpus[r] = s.gpu_type
                stages[r] = s.stage
                if d == 0:  # only DP rank 0 reports memory, as Megatron-LM
                    foot[r] = s.peak_bytes + extra_footprint
                    alloc[r] = s.peak_bytes - s.overhead_bytes
    return E2ERecord(key=plan_key(plan, site, job, 3), plan=plan_to_dict(plan), site=site.name, job=job.name,
                     iters=3, iteration_ms=pred.iteration_ms * time_noise, peak_allocated_bytes=alloc,
                     peak_footprint_bytes_by_rank=foot, gpu_type_by_rank=gpus, stage_by_rank=stages,
                     job_spec=job_to_spec(job), job_id=job_id, log_file="-", prediction=None)


TRUE_FACTOR = {"cpu-4g": 2.5, "cpu-2g": 0.6}
TRUE_OVERHEAD = {"cpu-4g": 300 * MiB, "cpu-2g": 180 * MiB}


def test_known_factors_and_overheads_are_recovered(site, job):
    base = AnalyticCostModel(site)
    truth = Truth(base, TRUE_FACTOR, TRUE_OVERHEAD)
    recs = [record_of(p, site, job, truth) for p in plans(site, job)]
    # without the prior the fit is exact: the truth is inside the model family
    cm = CalibratedCostModel(base, recs, site, job, prior_records=0.0)
    assert isinstance(cm, CostModel)
    cal = cm.fit().calibration_
    assert cal.runs == len(recs) and cal.skipped == ()
    for g in TRUE_FACTOR:
        assert cal.time_factor[g] == pytest.approx(TRUE_FACTOR[g], rel=1e-4)
        assert cal.overhead_bytes[g] == pytest.approx(TRUE_OVERHEAD[g], abs=2)
    # and the calibrated model predicts every run as measured
    for p, r in zip(plans(site, job), recs):
        got = predict_plan(p, site, job, cm)
        assert got.iteration_ms == pytest.approx(r.iteration_ms, rel=1e-4)
        assert max(s.peak_bytes for s in got.stages) == pytest.approx(r.peak_footprint_bytes, abs=4)
    # embedding and head are scaled too; activation bytes are not touched
    from memx_hpc.model.compose import context_queries
    qs = context_queries(job, "cpu-4g", 1, 2, False)
    assert np.allclose(cm.predict(qs)[:, 0], base.predict(qs)[:, 0] * cm.calibration_.time_factor["cpu-4g"])
    assert np.array_equal(cm.predict(qs)[:, 1], base.predict(qs)[:, 1])


def test_prior_shrinks_toward_one_and_fades_with_more_runs(site, job):
    base = AnalyticCostModel(site)
    truth = Truth(base, TRUE_FACTOR, TRUE_OVERHEAD)
    a100 = [p for p in plans(site, job) if {s.partition for s in p.stages} == {"nvidia_a100"}]
    one = CalibratedCostModel(base, [record_of(a100[0], site, job, truth)], site, job).fit().calibration_
    many = CalibratedCostModel(base, [record_of(p, site, job, truth) for p in a100], site, job).fit().calibration_
    f1, f4 = one.time_factor["cpu-4g"], many.time_factor["cpu-4g"]
    assert 1.0 < f1 < f4 < TRUE_FACTOR["cpu-4g"]
    # one run with a time proportional to f: log f is half the log error (prior worth one run)
    assert math.log(f1) == pytest.approx(0.5 * math.log(TRUE_FACTOR["cpu-4g"]), rel=0.15)
    assert "cpu-2g" not in one.time_factor and one.runs_by_gpu_type == {"cpu-4g": 1}
    # a GPU type without runs keeps the base model's numbers
    cm = CalibratedCostModel(base, [record_of(a100[0], site, job, truth)], site, job)
    assert cm.overhead_bytes("cpu-2g") == base.overhead_bytes("cpu-2g")


def test_overhead_is_a_median_one_disturbed_run_does_not_move_it(site, job):
    base = AnalyticCostModel(site)
    truth = Truth(base, TRUE_FACTOR, TRUE_OVERHEAD)
    a100 = [p for p in plans(site, job) if {s.partition for s in p.stages} == {"nvidia_a100"}]
    recs = [record_of(p, site, job, truth) for p in a100[:3]]
    recs.append(record_of(a100[3], site, job, truth, extra_footprint=3 * 2**30))
    cal = CalibratedCostModel(base, recs, site, job).fit().calibration_
    # the 3 GiB disturbance gets no weight; only the vendor prior's pull on three runs remains
    assert cal.overhead_bytes["cpu-4g"] == pytest.approx(TRUE_OVERHEAD["cpu-4g"], rel=1e-3)
    assert cal.memory_scale["cpu-4g"] == pytest.approx(1.0, rel=1e-3)


def test_identity_follows_base_and_runs_not_their_order(site, job):
    base = AnalyticCostModel(site)
    truth = Truth(base, TRUE_FACTOR, TRUE_OVERHEAD)
    recs = [record_of(p, site, job, truth) for p in plans(site, job)[:3]]
    a = CalibratedCostModel(base, recs, site, job)
    assert a.identity == CalibratedCostModel(base, list(reversed(recs)), site, job).identity
    assert a.identity != base.identity
    assert a.identity != CalibratedCostModel(base, recs[:2], site, job).identity
    other_base = AnalyticCostModel(site, compute_efficiency=0.5)
    assert a.identity != CalibratedCostModel(other_base, recs, site, job).identity
    # runs of another site are not used and do not change the identity
    foreign = dataclasses.replace(recs[0], site="elsewhere", job_id="99")
    assert a.identity == CalibratedCostModel(base, recs + [foreign], site, job).identity


def test_selection_prefers_the_job_and_skips_what_no_longer_runs(site, job):
    base = AnalyticCostModel(site)
    truth = Truth(base, TRUE_FACTOR, TRUE_OVERHEAD)
    p = plans(site, job)
    mine = record_of(p[0], site, job, truth)
    other = dataclasses.replace(record_of(p[1], site, job, truth), job="other-job")
    assert select_records([mine, other], site, job)[0] == [mine]
    assert select_records([other], site, job)[0] == [other]  # none of this job: the site's runs
    assert select_records([mine, other], site, None)[0] == [mine, other]
    moved = dataclasses.replace(mine, plan={**mine.plan, "stages": [{"partition": "gone", "num_layers": 4}]})
    swapped = dataclasses.replace(mine, gpu_type_by_rank={"0": "A100-80"}, job_id="2")
    shapeless = dataclasses.replace(mine, job_spec=None, job="unknown-job", job_id="3")
    cal = CalibratedCostModel(base, [moved, swapped, shapeless], site, None).fit().calibration_
    assert cal.runs == 0 and len(cal.skipped) == 3
    assert "no longer has partition" in cal.skipped[0] and "measured on ['A100-80']" in cal.skipped[1]
    assert "does not say the shape" in cal.skipped[2]
    assert "no usable" in cal.describe()
    with pytest.raises(SpecError, match="prior"):
        CalibratedCostModel(base, [], site, job, prior_records=-1)


def test_leave_one_out_never_sees_the_held_out_run(site, job):
    base = AnalyticCostModel(site)
    truth = Truth(base, TRUE_FACTOR, TRUE_OVERHEAD)
    ps = plans(site, job)
    recs = [record_of(p, site, job, truth, job_id=str(i)) for i, p in enumerate(ps)]
    held = leave_one_out(base, recs, site, job, prior_records=0.0)
    assert len(held) == len(recs) and all(h.fitted_on == len(recs) - 1 for h in held)
    s = error_summary(held)
    assert s["mape_time_before_pct"] > 30 and s["mape_time_after_pct"] < 1e-2
    assert s["mape_memory_after_pct"] < 1e-3 < s["mape_memory_before_pct"]
    # a run whose GPU types no other run has is predicted by the base model alone
    only = leave_one_out(base, recs[:1], site, job)
    assert only[0].after_ms == pytest.approx(only[0].before_ms) and only[0].fitted_on == 0
    # a second run of the same plan is left out with it: it would tell the answer
    twice = leave_one_out(base, [recs[0], dataclasses.replace(recs[0], job_id="again")], site, job)
    assert [h.fitted_on for h in twice] == [0, 0] and twice[0].after_ms == pytest.approx(twice[0].before_ms)
    # a corrupted run: leave-one-out shows it as an error, a fit on it would hide it
    bad = recs[:3] + [dataclasses.replace(recs[3], iteration_ms=recs[3].iteration_ms * 3)]  # all cpu-4g
    held = {h.job_id: h for h in leave_one_out(base, bad, site, job, prior_records=0.0)}
    assert held["3"].after_ms == pytest.approx(recs[3].iteration_ms, rel=1e-3)  # learned from the others
    fitted = CalibratedCostModel(base, bad, site, job, prior_records=0.0)
    assert predict_plan(ps[3], site, job, fitted).iteration_ms > 1.2 * recs[3].iteration_ms  # pulled by it


def test_gpu_types_without_runs_take_the_pooled_time_factor(site, job):
    """Calibrating one type must not make the others look faster by comparison: a type with
    no runs gets the run-weighted geometric mean of the fitted factors."""
    base = AnalyticCostModel(site)
    truth = Truth(base, {"cpu-4g": 3.0, "cpu-2g": 3.0}, TRUE_OVERHEAD)
    a100 = [p for p in plans(site, job) if {s.partition for s in p.stages} == {"nvidia_a100"}]
    cm = CalibratedCostModel(base, [record_of(p, site, job, truth) for p in a100], site, job).fit()
    cal = cm.calibration_
    assert "cpu-2g" not in cal.time_factor
    assert cal.default_time_factor == pytest.approx(cal.time_factor["cpu-4g"], rel=1e-12)
    from memx_hpc.model.compose import context_queries
    q2 = context_queries(job, "cpu-2g", 1, 2, False)
    assert np.allclose(cm.predict(q2)[:, 0], base.predict(q2)[:, 0] * cal.default_time_factor)
    # so the same plan on the two partitions (same CPU here) keeps its order after calibration
    p4 = a100[0]
    p2 = dataclasses.replace(p4, stages=tuple(dataclasses.replace(s, partition="nvidia_v100") for s in p4.stages))
    ratio_before = predict_plan(p4, site, job, base).iteration_ms / predict_plan(p2, site, job, base).iteration_ms
    ratio_after = predict_plan(p4, site, job, cm).iteration_ms / predict_plan(p2, site, job, cm).iteration_ms
    assert ratio_after == pytest.approx(ratio_before, rel=1e-9)
    assert "other GPU types" in cal.describe()
