"""Kernel efficiency that saturates (memx_hpc.model.anchors: Anchors.saturation) and the host
floor's operator counts (memx_hpc.model.host): beyond what a chip was measured at, a layer
never runs its kernels more efficiently than the chip's best measured point, a chip never
measured no more efficiently than the median measured chip, and a wider TP share is never
more efficient than the work it splits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from memx_hpc.model import host
from memx_hpc.model.anchors import Anchors, _work_ratio
from memx_hpc.model.api import LayerQuery, resolve_gpu, roofline_components
from memx_hpc.spec import LayerSample, LayerShape, ProfilePoint
from memx_hpc.spec.catalog import catalog

CAT = catalog()
SHAPE = LayerShape(hidden_size=2048, num_attention_heads=16, num_query_groups=16, ffn_hidden_size=8192,
                   seq_length=2048, vocab_size=50257)
#: a larger shape no chip ran: its work lies beyond every measured point
BIG = LayerShape(hidden_size=8192, num_attention_heads=64, num_query_groups=64, ffn_hidden_size=32768,
                 seq_length=2048, vocab_size=50257)
#: the measured efficiency (ratio of time to roofline) of each chip at each micro-batch:
#: rising with the work, as kernels fill the GPU
RATIO = {1: 4.0, 2: 3.0, 4: 2.2, 8: 1.8}
CHIPS = {"A100-40": 1.0, "V100-16": 1.3, "A10G": 1.6}  # a chip's factor over RATIO


def q(gpu: str, shape: LayerShape, mbs: int, tp: int = 1) -> LayerQuery:
    return LayerQuery(gpu_type=gpu, kind="layer", shape=shape, tp=tp, micro_batch_size=mbs, recompute="none",
                      precision="fp16", attention="sdpa")


def roof(x: LayerQuery) -> float:
    c = roofline_components(x, resolve_gpu(CAT, x.gpu_type))
    return c["compute_ms"] + c["memory_ms"] + c["comm_ms"]


def device_ratio(x: LayerQuery, rt: float) -> float:
    """The ratio of the device work's time (less the TP collectives) to its roofline."""
    c = roofline_components(x, resolve_gpu(CAT, x.gpu_type))
    return (math.exp(rt) * roof(x) - c["comm_ms"]) / (c["compute_ms"] + c["memory_ms"])


@pytest.fixture(scope="module")
def anchors() -> Anchors:
    out = []
    for gpu, f in CHIPS.items():
        for mbs, r in RATIO.items():
            t = f * r * roof(q(gpu, SHAPE, mbs))
            out.append(LayerSample(point=ProfilePoint(gpu_type=gpu, kind="layer", shape=SHAPE, micro_batch_size=mbs,
                                                      precision="fp16"),
                                   forward_ms=t / 3, backward_ms=2 * t / 3, origin="imported", source="test"))
    return Anchors.from_samples(out).bind(CAT)


def test_saturation_is_the_chips_best_measured_point(anchors):
    for gpu, f in CHIPS.items():
        chip = resolve_gpu(CAT, gpu).chip_id
        assert math.exp(anchors.saturation(chip, "layer", "half", "sdpa")) == pytest.approx(f * RATIO[8], rel=1e-6)
    # the bound of a chip never measured: the most efficient measured chip's
    assert math.exp(anchors.saturation(None, "layer", "half", "sdpa")) == pytest.approx(RATIO[8], rel=1e-6)
    # nothing measured of this kind: no bound
    assert anchors.saturation("GA100-SXM4", "head", "half", "sdpa") == -math.inf


def test_work_ratio_takes_the_collectives_out():
    # [mbs, r_time, r_mem, log flops, log roofline, compute, memory, comm]: 10 ms measured,
    # 2 ms of collectives, 4 ms of work at the roofline
    r = [1.0, math.log(10.0 / 6.0), math.nan, 0.0, math.log(6.0), 3.0, 1.0, 2.0]
    assert math.exp(_work_ratio(r)) == pytest.approx(8.0 / 4.0)


def test_a_measured_shape_asked_beyond_its_series_is_never_more_efficient_than_the_chip_was(anchors):
    """Micro-batches beyond the measured ones at a TP never measured: a rank's share is more
    work than any measured point, where the pooled trend says more work runs better; the
    chip's measured saturation caps it."""
    g = resolve_gpu(CAT, "A100-40")
    for tp, mbs in ((1, 64), (2, 64), (2, 256), (4, 512)):
        x = q("A100-40", SHAPE, mbs, tp)
        rt, _, how = anchors.answer(x, g)
        assert how == "extrapolated"
        assert device_ratio(x, rt) >= RATIO[8] * (1 - 1e-9)
    # beyond the measured micro-batches at a measured TP: the largest one's ratio held
    rt, _, how = anchors.answer(q("A100-40", SHAPE, 64), g)
    assert how == "extrapolated" and math.exp(rt) == pytest.approx(RATIO[8], rel=1e-6)


def test_a_shape_the_chip_never_ran_is_not_bounded_by_its_smaller_ones(anchors):
    """Larger layers than a chip ran do run more efficiently (the pooled curve's trend,
    validated on Cephalo's held-out hidden sizes): no per-chip bound there."""
    g = resolve_gpu(CAT, "A100-40")
    x = q("A100-40", BIG, 8)
    rt, _, how = anchors.answer(x, g)
    assert how == "extrapolated" and not anchors.has_series(x, g)
    assert rt == anchors._answer(x, g)[0]


def test_a_wider_tp_share_is_no_more_efficient_than_the_work_it_splits(anchors):
    g = resolve_gpu(CAT, "A100-40")
    for mbs in (1, 2, 4, 8):
        ratios = []
        for tp in (1, 2, 4, 8):
            x = q("A100-40", SHAPE, mbs, tp)
            rt, _, _ = anchors.answer(x, g)
            ratios.append(device_ratio(x, rt))
        assert all(b >= a * (1 - 1e-9) for a, b in zip(ratios, ratios[1:])), ratios
        assert ratios[0] >= RATIO[8] * (1 - 1e-9)


def test_a_chip_never_measured_saturates_at_the_prior(anchors):
    """The datasheet answer of an unmeasured chip: however large the work, its kernels run no
    more efficiently than the most efficient measured chip's best."""
    g = resolve_gpu(CAT, "H100-SXM")
    prior = math.exp(anchors.saturation(None, "layer", "half", "sdpa"))
    ratios = []
    for mbs in (1, 4, 16, 64):
        x = q("H100-SXM", BIG, mbs)
        assert anchors.answer(x, g)[2] is None
        rt = anchors.datasheet(x, g)
        assert np.isfinite(rt)
        ratios.append(device_ratio(x, rt))
    assert min(ratios) >= prior * (1 - 1e-9)


# --------------------------------------------------------------------------- host operators


def test_sequence_parallel_and_gated_mlp_dispatch_more():
    base = host.layer_ops("none", 2)
    assert host.layer_ops("none", 2, sequence_parallel=True) == base + (
        host.SP_COLLECTIVES_FORWARD - host.TP_COLLECTIVES_FORWARD
        + host.SP_COLLECTIVES_BACKWARD - host.TP_COLLECTIVES_BACKWARD)
    assert host.layer_ops("none", 1, sequence_parallel=True) == host.layer_ops("none", 1)  # no TP, no collectives
    assert host.layer_ops("none", 1, gated=True) == host.layer_ops("none", 1) + host.GATED_EXTRA_FORWARD \
        + host.GATED_EXTRA_BACKWARD
    # full recompute dispatches the gated forward and its collectives again
    assert host.layer_ops("full", 2, sequence_parallel=True, gated=True) - host.layer_ops(
        "none", 2, sequence_parallel=True, gated=True) == host.FORWARD_OPS + host.GATED_EXTRA_FORWARD \
        + host.SP_COLLECTIVES_FORWARD


def test_host_bound_reads_the_query():
    swiglu = LayerShape(hidden_size=1024, num_attention_heads=16, num_query_groups=16, ffn_hidden_size=2816,
                        seq_length=1024, vocab_size=32000, activation="swiglu")
    qs = [LayerQuery(gpu_type="H100-SXM", kind="layer", shape=swiglu, tp=4, micro_batch_size=1, recompute="none",
                     precision="bf16", attention="sdpa", sequence_parallel=True),
          LayerQuery(gpu_type="H100-SXM", kind="layer", shape=SHAPE, tp=4, micro_batch_size=1, recompute="none",
                     precision="bf16", attention="sdpa")]
    out = host.host_bound(qs, np.zeros((2, 2)))
    assert out[0, 0] == pytest.approx(host.layer_host_ms("none", 4, sequence_parallel=True, gated=True))
    assert out[1, 0] == pytest.approx(host.layer_host_ms("none", 4))
    assert out[0, 0] > out[1, 0]
