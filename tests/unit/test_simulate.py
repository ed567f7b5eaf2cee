"""The 1F1B simulator: hand-computed schedules, the closed form on uniform stages, and the
vectorised evaluation the search uses."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memx_hpc.errors import SpecError
from memx_hpc.model.schedule import (closed_form_ms, pipeline_finish_batch, schedule_1f1b, simulate_1f1b,
                                      uniform_closed_form_ms)


def test_schedule_order_is_megatrons():
    # stage 0 of 3 with 4 micro-batches: 2 warm-up forwards, 2 steady pairs, 2 cooldown backwards
    assert schedule_1f1b(0, 3, 4) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)]
    assert schedule_1f1b(2, 3, 4) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]
    # fewer micro-batches than stages: warm-up capped at m
    assert schedule_1f1b(0, 4, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


def test_two_stages_by_hand():
    # f0=1 b0=2, f1=2 b1=4, link 0.5, m=2, worked out on paper:
    # S0: F0 0-1, F1 1-2;  S1: F0 1.5-3.5, B0 3.5-7.5, F1 7.5-9.5, B1 9.5-13.5
    # S0: B0 8-10 (gradient arrives 7.5 + 0.5), B1 14-16
    sim = simulate_1f1b([1, 2], [2, 4], [0.5], 2)
    assert sim.total_ms == pytest.approx(16.0)
    assert sim.stage_finish_ms == pytest.approx((16.0, 13.5))
    ops = {(o.stage, o.kind, o.microbatch): (o.start_ms, o.end_ms) for o in sim.ops}
    assert ops[(1, "F", 1)] == (7.5, 9.5) and ops[(0, "B", 0)] == (8.0, 10.0)
    assert sim.stage_busy_ms == (6.0, 12.0)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 16])
@pytest.mark.parametrize("c", [0.0, 0.3, 5.0])
def test_closed_form_on_uniform_stages(p, m, c):
    sim = simulate_1f1b([1.2] * p, [2.5] * p, [c] * (p - 1), m)
    assert sim.total_ms == pytest.approx(uniform_closed_form_ms(1.2, 2.5, c, p, m), rel=1e-12)
    if c == 0:
        assert sim.total_ms == pytest.approx((m + p - 1) * 3.7)  # the textbook form
        assert sim.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


def test_textbook_form_overestimates_heterogeneous_stages():
    rng = np.random.default_rng(3)
    gaps = []
    for _ in range(50):
        p, m = int(rng.integers(2, 6)), int(rng.integers(2, 20))
        f = rng.uniform(1, 3, p)
        b = 2 * f
        sim = simulate_1f1b(f, b, [0.0] * (p - 1), m).total_ms
        cf = float(closed_form_ms(f, b, np.zeros(p - 1), m))
        assert cf >= sim - 1e-9  # without links it never underestimates
        gaps.append(cf / sim - 1)
    assert max(gaps) > 0.02  # and it is not exact: the reason the search simulates


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 12), seed=st.integers(0, 2**31))
def test_vectorised_equals_event_driven(p, m, seed):
    _batch_equals_event_driven(p, m, seed, plans=4, max_elements=64)  # tiny chunks: exercise the chunking


def _batch_equals_event_driven(p, m, seed, *, plans, max_elements):
    """``plans`` random p-stage plans of m micro-batches: the vectorised finish times in chunks
    of ``max_elements`` equal the event-driven simulation's, bit for bit."""
    rng = np.random.default_rng(seed)
    f = rng.uniform(0.1, 3, (plans, p))
    b = rng.uniform(0.1, 6, (plans, p))
    c = rng.uniform(0, 2, (plans, max(p - 1, 0)))
    got = pipeline_finish_batch(f, b, c, m, max_elements=max_elements)
    for r in range(plans):
        assert np.array_equal(got[r], np.array(simulate_1f1b(f[r], b[r], c[r], m).stage_finish_ms))


@settings(max_examples=30, deadline=None)
@given(p=st.integers(6, 10), m=st.integers(1, 9), seed=st.integers(0, 2**31))
def test_ring_of_levels_reaches_far_back(p, m, seed):
    # with fewer micro-batches than stages an op's input lies up to ~2p levels back (the
    # warm-up's chain): the ring of recent levels must hold them all; 37 plans in chunks
    # of a few rows (the ring's rows bound a chunk) cross chunk boundaries too
    _batch_equals_event_driven(p, m, seed, plans=37, max_elements=200)


def test_bad_inputs():
    with pytest.raises(SpecError):
        simulate_1f1b([1, 2], [1], [0.1], 2)
    with pytest.raises(SpecError):
        simulate_1f1b([1, 2], [1, 2], [], 2)
    with pytest.raises(SpecError):
        simulate_1f1b([1], [1], [], 0)
    with pytest.raises(SpecError):
        simulate_1f1b([-1], [1], [], 1)


def test_many_micro_batches_extend_the_steady_state_closely():
    """Past MAX_SIMULATED_MICROBATCHES the finish times are the simulated ones extended along
    their steady-state slope (bounded time): within 1e-3 of simulating every micro-batch."""
    from memx_hpc.model import schedule

    rng = np.random.default_rng(3)
    p, m = 4, 5000
    f = rng.uniform(0.5, 3, (8, p))
    b = f * rng.uniform(1.5, 2.5, (8, p))
    c = rng.uniform(0, 1.0, (8, p - 1))
    extended = pipeline_finish_batch(f, b, c, m)
    saved = schedule.MAX_SIMULATED_MICROBATCHES
    try:
        schedule.MAX_SIMULATED_MICROBATCHES = m  # every micro-batch simulated
        full = pipeline_finish_batch(f, b, c, m)
    finally:
        schedule.MAX_SIMULATED_MICROBATCHES = saved
    assert m > saved and np.max(np.abs(extended - full) / full) < 1e-3
