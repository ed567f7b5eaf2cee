"""A measured layer time at its host-dispatch floor bounds the device time; it does not set
the device's efficiency (memx_hpc.model.anchors: near_host_floor, device_bound)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from memx_hpc.spec.catalog import catalog
from memx_hpc.model.anchors import HOST_BOUND_MARGIN, Anchors, _below_bounds, device_bound, near_host_floor
from memx_hpc.model.api import LayerQuery, resolve_gpu, roofline_components
from memx_hpc.model.host import layer_host_ms
from memx_hpc.spec import LayerSample, LayerShape, ProfilePoint

CAT = catalog()
GPU = "A100-40"
#: the measured chip runs this shape at 1/EFF of its roofline wherever the device is the bound
EFF = 1.8
SHAPE = LayerShape(hidden_size=2048, num_attention_heads=16, num_query_groups=16, ffn_hidden_size=8192,
                   seq_length=1024, vocab_size=50257)
#: a shape never measured, with less work than any device-bound point
SMALL = LayerShape(hidden_size=1024, num_attention_heads=16, num_query_groups=16, ffn_hidden_size=4096,
                   seq_length=1024, vocab_size=50257)


def q(shape: LayerShape, mbs: int, tp: int = 1) -> LayerQuery:
    return LayerQuery(gpu_type=GPU, kind="layer", shape=shape, tp=tp, micro_batch_size=mbs, recompute="none",
                      precision="fp16", attention="sdpa")


def roof(x: LayerQuery) -> float:
    c = roofline_components(x, resolve_gpu(CAT, GPU))
    return c["compute_ms"] + c["memory_ms"] + c["comm_ms"]


def samples(floor_ms: float) -> list[LayerSample]:
    """TP 1, micro-batches 1-8 of SHAPE: ``max(EFF x roofline, floor_ms)``."""
    out = []
    for mbs in (1, 2, 4, 8):
        t = max(EFF * roof(q(SHAPE, mbs)), floor_ms)
        out.append(LayerSample(point=ProfilePoint(gpu_type=GPU, kind="layer", shape=SHAPE, micro_batch_size=mbs,
                                                  precision="fp16"),
                               forward_ms=t / 3, backward_ms=2 * t / 3, origin="imported", source="test"))
    return out


@pytest.fixture(scope="module")
def host_bound_anchors():
    host = layer_host_ms("none", 1)
    # micro-batch 1 sits just above the floor (its device work is below it); the rest are device-bound
    assert EFF * roof(q(SHAPE, 1)) < host < EFF * roof(q(SHAPE, 2)) / HOST_BOUND_MARGIN
    return Anchors.from_samples(samples(1.1 * host)).bind(CAT)


def test_near_the_floor_is_an_upper_bound_only():
    host = layer_host_ms("none", 1)
    row = [1.0, math.log(1.2 * host), math.nan, 0.0, 0.0, 0.0, 0.0, 0.0, math.nan, host]
    far = [1.0, math.log(1.6 * host), math.nan, 0.0, 0.0, 0.0, 0.0, 0.0, math.nan, host]
    assert near_host_floor(row) and not near_host_floor(far)
    assert device_bound([row, far]) == [far]
    assert device_bound([row]) == [row]  # nothing device-bound: the bound is all there is
    # an upper bound at log work 1.0: its time caps smaller work (time monotone), its ratio larger work
    assert _below_bounds(5.0, 0.5, [(1.0, 2.0)]) == pytest.approx(2.5)
    assert _below_bounds(1.0, 0.5, [(1.0, 2.0)]) == 1.0
    assert _below_bounds(5.0, 1.5, [(1.0, 2.0)]) == 2.0
    assert _below_bounds(1.0, 1.5, [(1.0, 2.0)]) == 1.0


def test_smaller_unmeasured_work_gets_the_device_efficiency_not_the_floor(host_bound_anchors):
    """A shape below every device-bound point: the chip's efficiency there, not the ratio of
    the host-bound micro-batch 1 (which would make the work look slower than the device is)."""
    g = resolve_gpu(CAT, GPU)
    x = q(SMALL, 2)
    assert roof(x) < roof(q(SHAPE, 1))
    rt, _, how = host_bound_anchors.answer(x, g)
    assert how == "extrapolated"
    assert math.exp(rt) == pytest.approx(EFF, rel=1e-6)


def test_tensor_parallel_share_uses_the_device_bound_points(host_bound_anchors):
    """At TP 2 a rank does half the work at the device's efficiency plus the collectives, and
    stays no slower than the host-bound TP 1 point of less work allows."""
    g = resolve_gpu(CAT, GPU)
    x = q(SHAPE, 2, tp=2)
    c = roofline_components(x, g)
    w = c["compute_ms"] + c["memory_ms"]
    assert w < roof(q(SHAPE, 2))
    rt, _, how = host_bound_anchors.answer(x, g)
    assert how == "extrapolated"
    assert math.exp(rt) * roof(x) == pytest.approx(EFF * w + c["comm_ms"], rel=1e-6)


def test_a_chip_measured_only_at_its_floor_keeps_its_points():
    """Every point at the floor: no device-bound point to learn from, so the measurements
    answer as before (an upper bound is still a bound: never faster than the roofline)."""
    t = 1.2 * layer_host_ms("none", 1)
    a = Anchors.from_samples(samples(t)[:1]).bind(CAT)
    g = resolve_gpu(CAT, GPU)
    rt, _, how = a.answer(q(SMALL, 1), g)
    assert how == "extrapolated" and np.isfinite(rt)
    assert math.exp(rt) == pytest.approx(t / roof(q(SHAPE, 1)), rel=1e-6)
