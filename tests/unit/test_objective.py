"""The weighted-product objective and the --weights parser."""

from __future__ import annotations

import math

import numpy as np
import pytest

from memx_hpc.errors import SpecError
from memx_hpc.search.objective import TIME_ONLY, Weights, log_score, parse_weights, score


def test_parse_weights():
    assert parse_weights("time=1,memory=0.5,balance=0.5") == Weights(time=1, memory=0.5, balance=0.5)
    # names left out are 0: time=1 alone is the time-only ranking, not time=1 with MemX's defaults
    assert parse_weights(" memory = 2 ") == Weights(time=0, memory=2, balance=0)
    assert parse_weights("time=1") == TIME_ONLY
    assert parse_weights("time=1,memory=0") == TIME_ONLY
    site_default = Weights(time=2, memory=1, balance=0)
    assert parse_weights(None, default=site_default) == site_default
    assert parse_weights("balance=1", default=site_default) == Weights(time=0, memory=0, balance=1)
    assert parse_weights("time=1,memory=0,balance=0") == TIME_ONLY and TIME_ONLY.time_only
    assert parse_weights(None) == Weights() and parse_weights("") == Weights()


@pytest.mark.parametrize("text,match", [
    ("speed=1", "unknown weight name.*allowed: time, memory, balance"),
    ("time=-1", "finite number >= 0"),
    ("time=abc", "not a number"),
    ("time", "expected NAME=VALUE"),
    ("time=1,time=2", "given twice"),
    ("time=0,memory=0,balance=0", "at least one weight"),
    ("memory=inf", "finite"),
])
def test_bad_weights_name_the_problem(text, match):
    with pytest.raises(SpecError, match=match) as e:
        parse_weights(text)
    assert "weights" in str(e.value)


def test_score_is_the_weighted_product():
    w = Weights(time=1.0, memory=0.5, balance=2.0)
    # T = 1500 ms -> 1.5 s, M = 0.64, B = 1.1
    assert score(1500.0, 0.64, 1.1, w) == pytest.approx(1.5 * 0.8 * 1.21)
    assert log_score(1500.0, 0.64, 1.1, w) == pytest.approx(math.log(1.5 * 0.8 * 1.21))
    assert score(np.inf, 0.5, 1.0, w) == np.inf  # infeasible plans
    assert score(1000.0, 0.9, 1.3, TIME_ONLY) == pytest.approx(1.0)


def test_rankings():
    t = np.array([1000.0, 1100.0, 900.0, 950.0])
    m = np.array([0.9, 0.5, 0.95, 0.6])
    b = np.array([1.0, 1.0, 1.4, 1.0])
    # time alone: the time-only ranking other planners use
    assert list(np.argsort(log_score(t, m, b, TIME_ONLY))) == list(np.argsort(t))
    # memory-aware, by hand: 1.0*0.9*1 = 0.9, 1.1*0.5 = 0.55, 0.9*0.95*1.4 = 1.197, 0.95*0.6 = 0.57:
    # the fastest plan (95 % full, imbalance 1.4) drops to last
    order = list(np.argsort(log_score(t, m, b, Weights(time=1, memory=1, balance=1))))
    assert order == [1, 3, 0, 2]
    # units of T do not change the ranking (a product, not a sum)
    w = Weights(time=2, memory=1, balance=0.5)
    assert list(np.argsort(log_score(t, m, b, w))) == list(np.argsort(log_score(t * 1000, m, b, w)))


def test_weights_validation():
    with pytest.raises(SpecError, match="weights.memory"):
        Weights(memory=-0.1)
    with pytest.raises(SpecError, match="weights.time"):
        Weights(time=float("nan"))


# --------------------------------------------------------------------------- the recommended plan


def test_shipped_error_table_names_its_benchmark_rows_and_is_wider_without_data():
    from memx_hpc.model.api import Basis
    from memx_hpc.search.objective import table_band
    kinds = ("calibrated", "measured", "imported", "augmented", "datasheet-only")
    rows = {b: table_band("X", Basis(kind=b)) for b in kinds}
    for b, band in rows.items():
        assert 0 < band.fraction < 1 and "benchmarks/" in band.source and band.basis == b
    assert rows["calibrated"].fraction < rows["imported"].fraction < rows["datasheet-only"].fraction
    assert table_band("X", Basis(kind="something new")).basis == "datasheet-only"
    same_chip = table_band("V100-32", Basis(kind="imported", same_chip_as="V100-16"))
    assert same_chip.fraction == rows["imported"].fraction and same_chip.basis == "imported (same chip as V100-16)"


class _Stage:
    def __init__(self, gpu, peak, cap):
        self.gpu_type, self.peak_bytes, self.capacity_bytes = gpu, peak, cap


class _Pred:
    def __init__(self, *stages, feasible=True):
        self.stages, self.feasible = stages, feasible


def test_risk_utilisation_widens_each_gpu_by_its_own_band():
    from memx_hpc.search.objective import risk_feasible, risk_utilisation
    p = _Pred(_Stage("A", 70, 100), _Stage("B", 50, 100))
    assert risk_utilisation(p, {"A": 0.1, "B": 0.5}) == pytest.approx(0.77)
    assert risk_utilisation(p, {"A": 0.1, "B": 0.9}) == pytest.approx(0.95)
    assert risk_feasible(p, {"A": 0.1, "B": 0.9})
    assert not risk_feasible(p, {"A": 0.5})  # 70 * 1.5 = 105 % of capacity
    assert not risk_feasible(_Pred(_Stage("A", 1, 100), feasible=False), {})
    assert risk_utilisation(p, {}) == pytest.approx(0.7)  # types not named: not widened


def test_bands_follow_provenance_and_the_sites_own_runs():
    from memx_hpc.model.api import Basis
    from memx_hpc.search.objective import MIN_RUNS_FOR_OWN_BAND, memory_error_bands, table_band
    prov = {g: Basis(kind=k)
            for g, k in (("A100-80", "imported"), ("MI250X-GCD", "datasheet-only"), ("cpu", "measured"))}
    calibrated = Basis(kind="calibrated")
    b = memory_error_bands(prov)
    assert b["MI250X-GCD"].fraction > b["A100-80"].fraction
    assert b["cpu"].basis == "measured"
    b = memory_error_bands(prov, calibrated=["cpu"])
    assert b["cpu"].basis == "calibrated" and b["cpu"].fraction == table_band("cpu", calibrated).fraction

    class Rec:
        def __init__(self, meas):
            self.gpu_type_by_rank = {"0": "cpu", "1": "cpu"}
            self.peak_footprint_bytes_by_rank = {"0": meas, "1": meas // 2}

    class Held:
        def __init__(self, pred):
            self.after = _Pred(_Stage("cpu", pred, 10**12))

    # three runs each 40 % off: the site's own band replaces the table's
    held = [(Held(140), Rec(100)) for _ in range(MIN_RUNS_FOR_OWN_BAND)]
    b = memory_error_bands(prov, calibrated=["cpu"], held_out=held)
    assert b["cpu"].basis == "verify-loo" and b["cpu"].fraction == pytest.approx(0.4)
    assert "3 end-to-end runs" in b["cpu"].source
    # fewer runs than that: the table; a tiny own error never narrows the table's floor
    assert memory_error_bands(prov, calibrated=["cpu"], held_out=held[:2])["cpu"].basis == "calibrated"
    exact = [(Held(100), Rec(100)) for _ in range(4)]
    assert memory_error_bands(prov, calibrated=["cpu"], held_out=exact)["cpu"].fraction == \
        table_band("cpu", calibrated).fraction


def test_pick_recommended_follows_the_rule():
    from memx_hpc.search.objective import pick_recommended
    t = [100.0, 101.0, 101.5, 90.0, 120.0]
    risk = [0.90, 0.60, 0.60, 1.10, 0.20]  # the fastest (90 ms) is inside the band: not risk-feasible
    bal = [1.0, 1.3, 1.1, 1.0, 1.0]
    feas = [True, True, True, True, True]
    # 100 ms is the fastest safe plan; 101 and 101.5 are within 2 %; 60 % beats 90 %, then balance 1.1 wins
    assert pick_recommended(t, risk, bal, feas) == 2
    assert pick_recommended(t, risk, bal, feas, noise=0.0) == 0
    assert pick_recommended(t, [1.5] * 5, bal, feas) is None
    assert pick_recommended(t, risk, bal, [False, True, True, True, True]) == 2
