"""The weighted-product objective and the --weights parser."""

from __future__ import annotations

import math

import numpy as np
import pytest

from memx_hpc.errors import SpecError
from memx_hpc.search.objective import TIME_ONLY, Weights, log_score, parse_weights, score


def test_parse_weights():
    assert parse_weights("time=1,memory=0.5,balance=0.5") == Weights(time=1, memory=0.5, balance=0.5)
    assert parse_weights(" memory = 2 ") == Weights(time=1, memory=2, balance=0.5)  # others keep defaults
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
