"""Interpolation augmentation: linear along micro-batch and 1/TP, never past the profiled range."""

from __future__ import annotations


import pytest

from memx_hpc.spec.catalog import preset
from memx_hpc.model.augment import augment
from memx_hpc.spec import LayerSample, LayerShape, ProfilePoint

SHAPE = LayerShape.of(preset("GPT-3-1.3B"))


def _s(mbs: int, tp: int = 1, *, fwd: float, bwd: float, act: int = 0, gpu: str = "A100-80") -> LayerSample:
    return LayerSample(point=ProfilePoint(gpu_type=gpu, kind="layer", shape=SHAPE, tp=tp, micro_batch_size=mbs),
                       forward_ms=fwd, backward_ms=bwd, activation_bytes=act, origin="measured", source=f"m{mbs}t{tp}")


def test_micro_batch_gaps_filled_linearly_and_flagged():
    got = augment([_s(2, fwd=2.0, bwd=4.0, act=200), _s(8, fwd=8.0, bwd=16.0, act=800)], tp_grid=(1,))
    by_mbs = {s.point.micro_batch_size: s for s in got}
    assert sorted(by_mbs) == [3, 4, 6]  # the default grid between 2 and 8, nothing outside
    s4 = by_mbs[4]
    assert (s4.forward_ms, s4.backward_ms, s4.activation_bytes) == (pytest.approx(4.0), pytest.approx(8.0), 400)
    assert s4.origin == "augmented" and s4.weight < 1
    prov = s4.provenance.as_dict()
    assert prov["from"] == [2, 8] and prov["extrapolated"] is False and set(prov["sources"]) == {"m2t1", "m8t1"}


def test_tp_interpolates_in_one_over_tp_then_micro_batch():
    samples = [_s(1, 1, fwd=8.0, bwd=16.0, act=1000), _s(1, 4, fwd=2.0, bwd=4.0, act=400),
               _s(4, 1, fwd=32.0, bwd=64.0), _s(4, 4, fwd=8.0, bwd=16.0)]
    got = augment(samples, mbs_grid=(1, 2, 4))
    tp2 = {s.point.micro_batch_size: s for s in got if s.point.tp == 2}
    # 1/tp: 1 -> 1, 4 -> 0.25, 2 -> 0.5: one third of the way from tp 1 to tp 4
    assert tp2[1].forward_ms == pytest.approx(8.0 - (8.0 - 2.0) * (0.5 / 0.75))
    assert tp2[1].activation_bytes == round(1000 - 600 * (0.5 / 0.75))
    assert tp2[4].activation_bytes == 0  # memory unknown at a neighbour: not invented
    # the mbs-2 point at tp 2 is filled from the tp-filled points, with a doubly reduced weight
    both = [s for s in got if s.point.tp == 2 and s.point.micro_batch_size == 2]
    assert len(both) == 1 and both[0].weight == pytest.approx(0.3 * 0.3)


def test_no_extrapolation_unless_asked():
    base = [_s(2, fwd=2.0, bwd=4.0), _s(4, fwd=4.0, bwd=8.0)]
    assert augment(base, mbs_grid=(1, 8), tp_grid=(1,)) == []
    ext = augment(base, mbs_grid=(1, 8), tp_grid=(1,), extrapolate=True)
    assert {s.point.micro_batch_size for s in ext} == {1, 8}
    assert all(s.provenance.as_dict()["extrapolated"] for s in ext)
    assert all(s.weight < 0.3 for s in ext)


def test_series_are_not_mixed_and_existing_points_kept():
    a = [_s(1, fwd=1.0, bwd=2.0), _s(4, fwd=4.0, bwd=8.0)]
    b = [_s(2, fwd=100.0, bwd=200.0, gpu="V100-16"), _s(3, fwd=150.0, bwd=300.0, gpu="V100-16")]
    got = augment(a + b + [_s(2, fwd=2.5, bwd=5.0)], tp_grid=(1,))
    assert {(s.point.gpu_type, s.point.micro_batch_size) for s in got} == {("A100-80", 3)}
    assert got[0].forward_ms == pytest.approx(2.5 + (4.0 - 2.5) * 1 / 2)  # from the measured mbs-2 point
