"""Interleaved 1F1B (virtual pipeline stages): the op order against megatron-core's own schedule
table and warm-up counts, the simulated time against the closed form of Narayanan et al. 2021,
and the activations each stage holds."""

from __future__ import annotations

import types

import numpy as np
import pytest

from memx_hpc.errors import SpecError
from memx_hpc.model.schedule import (in_flight_chunks, in_flight_last_chunk, interleaved_warmup, schedule_1f1b, schedule_interleaved,
                                     simulate_1f1b, simulate_interleaved)


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 16, 4), (2, 4, 2), (8, 16, 5), (4, 12, 3), (8, 8, 2)])
def test_uniform_stages_match_the_closed_form(p, m, v):
    # Narayanan et al. 2021, §2.2.2: the bubble shrinks to (p - 1)(f + b)/v
    f, b = 1.0, 2.0
    sim = simulate_interleaved(np.full((p, v), f / v), np.full((p, v), b / v), [0.0] * p, m)
    assert sim.total_ms == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v)
    assert sim.bubble_fraction == pytest.approx((p - 1) / v / (m + (p - 1) / v))


def test_one_chunk_is_plain_1f1b_with_links():
    f, b, links = [1.0, 1.5, 2.0, 1.0], [2.0, 3.0, 4.0, 2.0], [0.3, 0.2, 0.5]
    one = simulate_interleaved(np.array(f)[:, None], np.array(b)[:, None], links, 7)
    assert one.total_ms == pytest.approx(simulate_1f1b(f, b, links, 7).total_ms)
    assert [(k, j) for k, j, _ in schedule_interleaved(1, 4, 7, 1)] == schedule_1f1b(1, 4, 7)


def test_interleaving_pays_the_wrap_link_per_chunk():
    p, m, v = 4, 8, 2
    f, b = np.full((p, v), 0.5), np.full((p, v), 1.0)
    free = simulate_interleaved(f, b, [0.0] * p, m).total_ms
    wrap = simulate_interleaved(f, b, [0.0] * (p - 1) + [0.4], m).total_ms
    assert wrap > free  # the last-to-first stage link is on the critical path only when interleaving


def test_activations_held_per_stage():
    # first stage of p = 4, v = 2: 11 chunks of L/8 layers = 1.375 x the p micro-batches of 1F1B
    assert in_flight_chunks(0, 4, 8, 2) / 2 == pytest.approx(4 * (1 + 3 / 8))
    assert [in_flight_chunks(i, 4, 8, 1) for i in range(4)] == [4, 3, 2, 1]
    assert in_flight_chunks(0, 4, 4, 4) == 16  # everything in warm-up: all m·v


def _live_at_peak(stage, p, m, v, g=None):
    """(chunks, last-chunk micro-batches) held when the op order holds the most chunks."""
    live, best = set(), (0, 0)
    for kind, j, c in schedule_interleaved(stage, p, m, v, g):
        if kind == "F":
            live.add((j, c))
            best = max(best, (len(live), sum(cc == v - 1 for _, cc in live)))
        else:
            live.remove((j, c))
    return best


@pytest.mark.parametrize("p,m,v,g", [(4, 4, 8, None), (4, 8, 2, None), (4, 12, 3, None), (2, 6, 3, 3),
                                     (4, 10, 2, 5), (4, 4, 4, None), (8, 16, 5, None)])
def test_the_last_stage_holds_one_loss_however_many_chunks_wait(p, m, v, g):
    # the last stage's last chunk ends in the loss: its backward follows its forward, so one
    # micro-batch's logits are live beside the earlier chunks' waiting activations
    chunks, last = _live_at_peak(p - 1, p, m, v, g)
    assert chunks == in_flight_chunks(p - 1, p, m, v, g) and chunks > v
    assert in_flight_last_chunk(p - 1, p, m, v, g) == last
    all_warmup = interleaved_warmup(p - 1, p, m, v, g) >= m * v
    assert last == (m if all_warmup else 1)
    assert in_flight_last_chunk(p - 1, p, m, 1) == 1


def test_megatron_rules_are_refused_by_name():
    with pytest.raises(SpecError) as e:
        schedule_interleaved(0, 4, 6, 2)  # last group of 2 < p
    assert e.value.field == "num_microbatches"
    with pytest.raises(SpecError):
        schedule_interleaved(0, 4, 3, 2)  # fewer micro-batches than stages


@pytest.mark.parametrize("p,m,v,g", [(4, 8, 2, None), (4, 12, 3, None), (2, 6, 3, 3), (4, 10, 2, 5)])
def test_order_and_warmup_are_megatron_cores(p, m, v, g):
    sched = pytest.importorskip("megatron.core.pipeline_parallel.schedules")
    group = p if g is None else g
    table = sched.get_schedule_table(m, v, group)
    for i in range(p):
        comm = types.SimpleNamespace(pp_group=types.SimpleNamespace(size=lambda: p, rank=lambda i=i: i),
                                     virtual_pipeline_model_parallel_size=v)
        _, _, warmup, _ = sched.get_pp_rank_microbatches(m, v, group, p2p_communicator=comm)
        assert interleaved_warmup(i, p, m, v, g) == warmup
        ops = schedule_interleaved(i, p, m, v, g)
        assert [(j, c) for k, j, c in ops if k == "F"] == [tuple(x) for x in table]
        assert [(j, c) for k, j, c in ops if k == "B"] == [(j, v - 1 - c) for j, c in table]


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 16, 4), (3, 9, 3)])
def test_the_searchs_interleaved_pricing_against_the_exact_schedule(p, m, v):
    """What the composition prices (1F1B of m·v micro-batches of 1/v of each stage) against the
    exact interleaved schedule: equal on uniform stages without links, within 5 % on uneven
    stages with links, and always below plain 1F1B (the bubble shrinks)."""
    from memx_hpc.model.compose import interleaved_finish

    rng = np.random.default_rng(p * 100 + m * 10 + v)
    f = np.full((p, v), 1.0)
    uniform = simulate_interleaved(f, 2 * f, [0.0] * p, m).total_ms
    got = float(interleaved_finish(np.full((1, p), v * 1.0), np.full((1, p), v * 2.0), np.zeros((1, p - 1)), m,
                                   v).max())
    assert got == pytest.approx(uniform, rel=1e-9)
    for _ in range(5):
        stage = rng.uniform(1.0, 2.0, p)
        links = rng.uniform(0.0, 0.05, p)
        exact = simulate_interleaved(np.repeat(stage[:, None] / v, v, axis=1),
                                     np.repeat(2 * stage[:, None] / v, v, axis=1), list(links), m).total_ms
        priced = float(interleaved_finish(stage[None], 2 * stage[None], links[None, :p - 1], m, v).max())
        plain = float(interleaved_finish(stage[None], 2 * stage[None], links[None, :p - 1], m, 1).max())
        assert exact * (1 - 1e-3) <= priced <= exact * 1.06
        assert priced < plain


def test_a_micro_batch_group_runs_megatron_cores_order_and_prices_it():
    """p = 2, v = 2, m = 6, ``--microbatch-group-size-per-virtual-pipeline-stage 3``: megatron-core's
    ``get_schedule_table(6, 2, 3)`` runs micro-batches 0-2 through chunk 0, then chunk 1, then 3-5;
    the last stage warms up with ``(v - 1)·G = 3`` forwards (the first ``2(p - 1) + 3 = 5``) and
    backwards take the chunks in reverse. The composition prices that order, simulated."""
    from memx_hpc.model.compose import interleaved_finish
    table = [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (3, 0), (4, 0), (5, 0), (3, 1), (4, 1), (5, 1)]
    assert [(j, c) for k, j, c in schedule_interleaved(0, 2, 6, 2, 3) if k == "F"] == table
    assert [interleaved_warmup(i, 2, 6, 2, 3) for i in range(2)] == [5, 3]
    last = [f"{k}{j}{c}" for k, j, c in schedule_interleaved(1, 2, 6, 2, 3)]
    assert last == ("F00 F10 F20 F01 B01 F11 B11 F21 B21 F30 B00 F40 B10 F50 B20 F31 B31 F41 B41 F51 B51 "
                    "B30 B40 B50").split()
    assert in_flight_chunks(1, 2, 6, 2, 3) == 4 and in_flight_chunks(1, 2, 6, 2) == 3
    stage, links = np.array([[1.0, 1.7]]), np.array([[0.2]])
    exact = simulate_interleaved(np.repeat(stage.T / 2, 2, axis=1), np.repeat(2 * stage.T / 2, 2, axis=1),
                                 [0.2, 0.0], 6, group=3)
    got = interleaved_finish(stage, 2 * stage, links, 6, 2, 3)[0]
    assert tuple(got) == pytest.approx(exact.stage_finish_ms, rel=1e-12)
    # the default group (None or p) keeps the search's 1F1B-of-m·v pricing
    assert tuple(interleaved_finish(stage, 2 * stage, links, 6, 2, 2)[0]) == \
        tuple(interleaved_finish(stage, 2 * stage, links, 6, 2)[0])
