"""Device memory = state + a x activations + b: priors, what the slope applies to, and how
the fit shrinks toward the priors."""

from __future__ import annotations

import numpy as np
import pytest

from memx_hpc.errors import SpecError
from memx_hpc.model.memory import GiB, PRIORS, DeviceMemoryModel, fit_device_memory, prior_for


def test_no_runs_is_the_prior():
    m = fit_device_memory([], [], prior_for("nvidia"))
    assert (m.a, m.b_bytes, m.runs) == (PRIORS["nvidia"].a, PRIORS["nvidia"].b_bytes, 0)
    with pytest.raises(SpecError):
        prior_for("fpga")


def test_many_runs_of_different_sizes_recover_the_line():
    A = np.linspace(8, 60, 12) * GiB
    F = 1.2 * A + 3.0 * GiB
    m = fit_device_memory(A, F, prior_for("nvidia"))
    assert m.a == pytest.approx(1.2, abs=0.02)
    assert m.b_bytes / GiB == pytest.approx(3.0, abs=0.3)
    # the constant-only model fitted on the large plans overshoots the small ones; this does not
    small = 8 * GiB
    const = float(np.median(F[-4:] - A[-4:]))
    assert abs(m.footprint(small) - (1.2 * small + 3 * GiB)) < abs(small + const - (1.2 * small + 3 * GiB))


def test_one_run_moves_part_way_from_the_prior():
    p = prior_for("nvidia")
    A, F = 20 * GiB, 30 * GiB
    m = fit_device_memory([A], [F], p)
    prior_err = F - DeviceMemoryModel.from_prior(p).footprint(A)
    assert 0 < F - m.footprint(A) < prior_err  # closer than the prior, not all the way
    many = fit_device_memory([A] * 20, [F] * 20, p)
    assert abs(F - many.footprint(A)) < abs(F - m.footprint(A))


def test_slope_stays_physical():
    A = np.array([10, 11]) * GiB
    m = fit_device_memory(A, np.array([5, 60]) * GiB, prior_for("amd"), noise_fraction=0.001)
    assert 0.9 <= m.a <= 2.0 and m.b_bytes >= 0


def test_the_slope_applies_to_the_activations_not_the_state():
    """The caching allocator's slack is that of the short-lived activation blocks; the state
    (weights, gradient buffer, optimizer shards: allocated once, exact-size) counts at its size."""
    from memx_hpc.model.memory import device_peak
    from memx_hpc.model.stage_memory import stage_peak_bytes

    m = DeviceMemoryModel(a=1.14, b_bytes=4 * GiB)
    state, act = 50 * GiB, 20 * GiB
    assert m.footprint(state + act, state) == pytest.approx(state + 1.14 * act + 4 * GiB)
    assert m.footprint(state + act) == pytest.approx(1.14 * (state + act) + 4 * GiB)  # no state named: all of it
    # a stage: 3 in-flight units of 5 GiB and a 1 GiB transient on top of its state
    peak = stage_peak_bytes(state, 3.0, 5 * GiB, 1 * GiB, 1.14, 4 * GiB)
    assert peak == pytest.approx(device_peak(state + 16 * GiB, state, 1.14, 4 * GiB))
    assert peak == pytest.approx(state + 1.14 * 16 * GiB + 4 * GiB)
    # twice the state adds the state once, whatever the slope; twice the activations adds a x them
    assert stage_peak_bytes(2 * state, 3.0, 5 * GiB, 1 * GiB, 1.14, 4 * GiB) - peak == pytest.approx(state)
    assert stage_peak_bytes(state, 6.0, 5 * GiB, 2 * GiB, 1.14, 4 * GiB) - peak == pytest.approx(1.14 * 16 * GiB)


def test_fit_separates_the_state_from_the_activations():
    # footprints made by the rule: least squares recovers a and b whatever share of the peak is state
    rng = np.random.default_rng(0)
    act = np.linspace(5, 40, 10) * GiB
    state = rng.uniform(2, 50, 10) * GiB
    F = state + 1.2 * act + 3.0 * GiB
    m = fit_device_memory(state + act, F, prior_for("nvidia"), state_bytes=state, prior_weight=0.0)
    assert m.a == pytest.approx(1.2, abs=0.02) and m.b_bytes / GiB == pytest.approx(3.0, abs=0.3)
    assert m.footprint(state[0] + act[0], state[0]) == pytest.approx(F[0], rel=0.01)
    with pytest.raises(SpecError):
        fit_device_memory([1.0, 2.0], [3.0, 4.0], prior_for("nvidia"), state_bytes=[1.0])


def test_prior_offsets_are_what_uncalibrated_models_report():
    from memx_hpc.model.api import DEFAULT_OVERHEAD_GIB
    assert {v: p.b_bytes / GiB for v, p in PRIORS.items()} == DEFAULT_OVERHEAD_GIB


def test_the_last_stage_holds_the_logits_beside_their_fp32_copy():
    """The loss runs on ``logits.float()``: on the last stage the bf16/fp16 logits are live
    beside the fp32 copy the cross entropy keeps; not at the same time as a recomputed layer."""
    import numpy as np

    from memx_hpc.model.analytic import head_logits_transient_bytes, padded_vocab_size
    from memx_hpc.model.compose import stage_activation_bytes
    from memx_hpc.spec import LayerShape

    shape = LayerShape(hidden_size=512, num_attention_heads=8, num_query_groups=8, ffn_hidden_size=2048,
                       vocab_size=50257, seq_length=1024)
    v = padded_vocab_size(50257, 2)
    assert head_logits_transient_bytes(shape, micro_batch_size=4, tp=2, precision="bf16") == 2 * 1024 * 4 * v // 2
    assert head_logits_transient_bytes(shape, micro_batch_size=4, tp=2, precision="fp32") == 0
    logits = 100.0
    # last stage, no recompute: the logits; a first stage never holds them
    assert stage_activation_bytes(0, 4, 10.0, 10.0, 30.0, 0, 1, 5.0, 7.0, logits)[1] == logits
    assert stage_activation_bytes(0, 4, 10.0, 10.0, 30.0, 1, 0, 5.0, 7.0, logits)[1] == 0.0
    # recomputing last stage: the larger of the rebuilt layer (30 - 10) and the logits, not their sum
    assert stage_activation_bytes(2, 2, 10.0, 10.0, 30.0, 0, 1, 5.0, 7.0, logits)[1] == logits
    assert stage_activation_bytes(2, 2, 10.0, 10.0, 300.0, 0, 1, 5.0, 7.0, logits)[1] == 290.0
    vec = stage_activation_bytes(np.array([0, 2]), np.array([4, 2]), 10.0, 10.0, 30.0, 0, np.array([1, 0]), 5.0, 7.0,
                                 np.array([logits, logits]))[1]
    assert list(vec) == [logits, 20.0]


# --------------------------------------------------------------------------- expandable segments


def test_expandable_segments_lower_the_nvidia_slope_and_keep_the_offset():
    from memx_hpc.model.memory import PRIORS, expandable_segments, prior_for

    grown = prior_for("nvidia", expandable_segments=True)
    assert grown.a < PRIORS["nvidia"].a and grown.a >= 1.0
    assert grown.b_bytes == PRIORS["nvidia"].b_bytes
    assert prior_for("cpu", expandable_segments=True) == PRIORS["cpu"]  # no caching allocator there
    assert expandable_segments((("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128,expandable_segments:True"),))
    assert not expandable_segments((("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False"),))
    assert not expandable_segments((("OTHER", "expandable_segments:True"),))


def test_the_prior_slope_follows_the_partition_environment():
    """memory_scale_of reads PYTORCH_CUDA_ALLOC_CONF from the partitions of a GPU type: all of
    them must set expandable segments for the lower slope."""
    from memx_hpc.model.memory import PRIORS, memory_scale_of, prior_for
    from memx_hpc.spec import Partition, Site

    env = (("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),)
    on = Partition(name="a", gpu_type="H100-SXM", nodes=1, gpus_per_node=8, env=env)
    off = Partition(name="b", gpu_type="H100-SXM", nodes=1, gpus_per_node=8)
    assert memory_scale_of(None, Site(name="s", partitions=(on,)))("H100-SXM") == \
        prior_for("nvidia", expandable_segments=True).a
    assert memory_scale_of(None, Site(name="s", partitions=(on, off)))("H100-SXM") == PRIORS["nvidia"].a
