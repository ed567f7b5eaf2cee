"""The collective model: limits, monotonicity, the slower hop, Megatron's buckets and their overlap."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from memx_hpc.errors import SpecError
from memx_hpc.model import collectives as c

NVLINK = 450.0  # H100 NVLink, GB/s per direction
IB = 50.0  # 400 Gb/s per GPU


def node(ranks: int = 8) -> c.GroupShape:
    return c.group_shape(ranks=ranks, gpus_per_node=8, intra_gbytes_per_s=NVLINK, inter_gbytes_per_s=IB)


def nodes(m: int, *, stride: int = 1, inter: float = IB) -> c.GroupShape:
    return c.group_shape(ranks=8 * m // stride, gpus_per_node=8, stride=stride, intra_gbytes_per_s=NVLINK,
                         inter_gbytes_per_s=inter)


SIZES = 2.0 ** np.arange(10, 34)


@pytest.mark.parametrize("fn", [c.allreduce_ms, c.reduce_scatter_ms, c.all_gather_ms, c.all_to_all_ms])
def test_one_rank_and_no_bytes_cost_nothing(fn):
    one = c.GroupShape(ranks=1, ranks_per_domain=1, intra_gbytes_per_s=NVLINK)
    assert fn(2**30, one) == 0.0
    assert fn(0, node()) == 0.0
    assert np.all(fn(SIZES, one) == 0.0)


def test_allreduce_bandwidth_term_tends_to_twice_bytes_over_busbw():
    # latency-free view: (t - latency) * busbw / bytes -> 2 as n grows
    ratios = []
    for n in (2, 4, 8, 64, 1024):
        shape = c.GroupShape(ranks=n, ranks_per_domain=n, intra_gbytes_per_s=NVLINK)
        s = 2**33
        bw_ms = c.allreduce_ms(s, shape, algorithm="ring") - c.ring_latency_us(shape) * 1e-3
        ratios.append(bw_ms * c.peak_busbw_gbytes_per_s(shape) * 1e6 / s)
    assert ratios == sorted(ratios)
    assert ratios[0] == pytest.approx(1.0)  # 2(n-1)/n at n = 2
    assert ratios[-1] == pytest.approx(2.0, rel=2e-3)


def test_rs_and_ag_are_half_an_allreduce_in_bandwidth():
    shape = node()
    s = 2**34
    ar = c.allreduce_ms(s, shape, algorithm="ring") - c.ring_latency_us(shape) * 1e-3
    rs = c.reduce_scatter_ms(s, shape) - c.ring_latency_us(shape, "reduce_scatter") * 1e-3
    ag = c.all_gather_ms(s, shape) - c.ring_latency_us(shape, "all_gather") * 1e-3
    assert rs == pytest.approx(ar / 2) and ag == pytest.approx(ar / 2)


@pytest.mark.parametrize("collective", c.COLLECTIVES)
def test_monotone_in_bytes(collective):
    for shape in (node(), nodes(4), nodes(16, stride=8)):
        t = c.collective_ms(collective, SIZES, shape)
        assert np.all(np.diff(t) > 0), (collective, shape)


@pytest.mark.parametrize("collective", c.COLLECTIVES)
def test_monotone_in_ranks(collective):
    # inside a node, then across more and more nodes
    shapes = [node(n) for n in (2, 4, 8)] + [nodes(m) for m in (2, 4, 8, 16, 32)]
    for s in (2**20, 2**26, 2**30):
        t = [c.collective_ms(collective, s, sh) for sh in shapes]
        assert t == sorted(t), (collective, s, t)


def test_busbw_is_the_nccl_tests_definition():
    shape = nodes(4)
    s = 2**28
    t = c.allreduce_ms(s, shape)
    assert c.busbw_gbytes_per_s(s, shape) == pytest.approx(s / (t * 1e6) * 2 * 31 / 32)


def test_hierarchical_group_is_bounded_by_the_slower_hop():
    s = 2**33
    for m in (2, 4, 16):
        for inter in (6.25, 12.5, 25.0, 50.0, 100.0):
            shape = nodes(m, inter=inter)
            bw = c.busbw_gbytes_per_s(s, shape)
            k = shape.ranks_per_domain
            assert bw <= NVLINK * c.LINK_KINDS["nvlink"].peak_fraction + 1e-9
            assert bw <= k * inter * c.LINK_KINDS["ib"].peak_fraction + 1e-9
    # a slow fabric sets the pace; a fast one leaves NVLink the bound
    slow = c.peak_busbw_gbytes_per_s(nodes(4, inter=6.25))
    assert slow == pytest.approx(8 * 6.25 * c.LINK_KINDS["ib"].peak_fraction)
    assert c.peak_busbw_gbytes_per_s(nodes(4, inter=100.0)) == pytest.approx(370.0)


def test_one_gpu_per_node_gets_only_its_own_fabric_share():
    # a DP group of stride 8 (TP = 8) has one rank per node: the ring crosses the fabric every hop
    shape = nodes(4, stride=8)
    assert shape.ranks == 4 and shape.ranks_per_domain == 1 and shape.domains == 4
    assert c.peak_busbw_gbytes_per_s(shape) == pytest.approx(IB * c.LINK_KINDS["ib"].peak_fraction)
    # and is far slower than the same bytes over whole nodes
    assert c.allreduce_ms(2**30, shape) > 5 * c.allreduce_ms(2**30, nodes(4))


def test_a_domain_larger_than_a_node_keeps_traffic_on_nvlink():
    # GB200 NVL72: 18 nodes of 4 GPUs in one NVLink domain; a 32-GPU group spans 8 nodes
    rack = c.group_shape(ranks=32, gpus_per_node=4, domain_size=72, intra_gbytes_per_s=900.0,
                         inter_gbytes_per_s=50.0)
    assert rack.domains == 1
    assert c.peak_busbw_gbytes_per_s(rack) == pytest.approx(900.0 * c.LINK_KINDS["nvlink"].peak_fraction)
    # the fabric's bandwidth plays no part
    slow_fabric = c.group_shape(ranks=32, gpus_per_node=4, domain_size=72, intra_gbytes_per_s=900.0,
                                inter_gbytes_per_s=0.1)
    assert c.allreduce_ms(2**30, rack) == c.allreduce_ms(2**30, slow_fabric)
    per_node = c.group_shape(ranks=32, gpus_per_node=4, intra_gbytes_per_s=900.0, inter_gbytes_per_s=50.0)
    assert per_node.domains == 8
    assert c.allreduce_ms(2**30, rack) < c.allreduce_ms(2**30, per_node)


def test_tree_latency_grows_with_log_of_nodes_ring_with_ranks():
    lat_tree = [c.tree_latency_us(nodes(m)) for m in (2, 4, 8, 16, 32)]
    steps = np.diff(lat_tree)
    assert np.allclose(steps, steps[0])  # equal steps per doubling
    lat_ring = [c.ring_latency_us(nodes(m)) for m in (2, 4, 8, 16, 32)]
    assert np.all(np.diff(np.diff(lat_ring)) > 0)  # linear in m: grows with each doubling
    # auto takes the faster: the tree for mid-sized messages on many nodes
    shape = nodes(32)
    s = 2**22
    assert c.allreduce_ms(s, shape) == pytest.approx(min(c.allreduce_ms(s, shape, algorithm="ring"),
                                                        c.allreduce_ms(s, shape, algorithm="tree")))
    assert c.allreduce_ms(s, shape, algorithm="tree") < c.allreduce_ms(s, shape, algorithm="ring")


def test_efa_runs_the_all_reduce_as_a_ring():
    """Over EFA NCCL's all-reduce is a ring (AWS: NCCL_ALGO=ring for large all-reduces, no LL
    protocols), so ``auto`` never takes the tree's log2 latency across nodes there; inside one
    node both algorithms stay available, and InfiniBand keeps the tree."""
    efa = c.group_shape(ranks=256, gpus_per_node=8, intra_gbytes_per_s=NVLINK, inter_gbytes_per_s=IB,
                        inter_link="efa")
    ib = dataclasses.replace(efa, inter_link="ib")
    assert c.allreduce_algorithms(efa) == ("ring",) and "tree" in c.allreduce_algorithms(ib)
    s = np.array([2.0**20, 2.0**22, 2.0**26])
    assert np.allclose(c.allreduce_ms(s, efa), c.allreduce_ms(s, efa, algorithm="ring"))
    assert c.allreduce_ms(2**22, ib) < c.allreduce_ms(2**22, efa)  # the tree wins there on IB
    one_node = c.group_shape(ranks=8, gpus_per_node=8, intra_gbytes_per_s=NVLINK, inter_link="efa")
    assert "tree" in c.allreduce_algorithms(one_node)


def test_efficiency_curve_within_zero_and_peak():
    for peak in (0.5, 0.82, 1.0):
        for half in (0.0, 1e3, 2**24, 1e12):
            e = c.bus_efficiency(SIZES, half_saturation_bytes=half, peak_fraction=peak)
            assert np.all(e > 0) and np.all(e <= peak)
            assert np.all(np.diff(e) >= 0)
    e = c.bus_efficiency(2**24, half_saturation_bytes=2**24, peak_fraction=0.8)
    assert e == pytest.approx(0.4)
    with pytest.raises(SpecError, match="peak_fraction"):
        c.bus_efficiency(1.0, half_saturation_bytes=1.0, peak_fraction=1.2)


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "all_gather"])
def test_efficiency_curve_is_what_the_ring_model_gives(collective):
    for shape in (node(), nodes(2), nodes(16), nodes(8, stride=8)):
        half = c.half_saturation_bytes(shape, collective)
        peak_bw = c.peak_busbw_gbytes_per_s(shape)
        line = peak_bw / c.bus_efficiency(1e30, half_saturation_bytes=half, peak_fraction=1.0)
        x = SIZES
        t = (c.ring_latency_us(shape, collective) * 1e-3
             + c.bus_bytes(x, shape.ranks, collective) / (peak_bw * 1e6))
        achieved = c.bus_bytes(x, shape.ranks, collective) / (t * 1e6)
        assert np.allclose(achieved, line * c.bus_efficiency(x, half_saturation_bytes=half, peak_fraction=1.0))


def test_all_to_all_crosses_the_fabric_once_per_byte():
    shape = nodes(2)
    s = 2**32
    lat = (c.BASE_LATENCY_US + c.LINK_KINDS["ib"].ring_hop_latency_us) * 1e-3
    want = s * 8 / 16 / (IB * c.LINK_KINDS["ib"].peak_fraction * 1e6)  # half the peers are on the other node
    assert c.all_to_all_ms(s, shape) - lat == pytest.approx(want)


def test_send_intra_faster_than_inter_and_has_latency():
    s = 64 * 2**20
    intra = c.send_ms(s, gbytes_per_s=NVLINK, link="nvlink")
    inter = c.send_ms(s, gbytes_per_s=IB, link="ib")
    assert intra < inter
    assert c.send_ms(1, gbytes_per_s=IB, link="ib") == pytest.approx(
        (c.BASE_LATENCY_US + c.LINK_KINDS["ib"].ring_hop_latency_us) * 1e-3, rel=1e-3)
    assert c.send_ms(0, gbytes_per_s=IB, link="ib") == 0.0


def test_fabric_share_of_shared_adapters():
    # p4d: 4 x 100 Gb/s EFA for 8 GPUs
    assert c.fabric_share_gbytes_per_s(100, gpus_per_node=8, adapters_per_node=4) == pytest.approx(6.25)
    assert c.fabric_share_gbytes_per_s(100, gpus_per_node=8, adapters_per_node=4, gpus_sending=2) == 12.5
    assert c.fabric_share_gbytes_per_s(400, gpus_per_node=8) == 50.0
    # p5: 32 x 100 Gb/s EFA for 8 GPUs: four adapters each, and no more when fewer GPUs send
    assert c.fabric_share_gbytes_per_s(100, gpus_per_node=8, adapters_per_node=32) == 50.0
    assert c.fabric_share_gbytes_per_s(100, gpus_per_node=8, adapters_per_node=32, gpus_sending=1) == 50.0


# --------------------------------------------------------------------------- Megatron's buckets


def test_default_bucket_size_follows_megatron_core():
    assert c.default_bucket_size_params(8, overlap_grad_reduce=True) == 40_000_000
    assert c.default_bucket_size_params(128, overlap_grad_reduce=True) == 128_000_000
    assert c.default_bucket_size_params(8, overlap_grad_reduce=False) is None
    assert c.default_bucket_size_params(8, overlap_grad_reduce=True, first_pp_stage=False) is None
    assert c.default_bucket_size_params(8, overlap_grad_reduce=True, first_model_chunk=False) is None
    assert c.default_bucket_size_params(8, overlap_grad_reduce=True, ddp_bucket_size=10) == 10


def test_buckets_fill_backwards_and_close_at_the_size():
    # model order: embedding, 3 layers, head
    numels = [100, 30, 30, 30, 20]
    assert c.megatron_buckets(numels, 50) == [50, 60, 100]
    assert c.megatron_buckets(numels, None) == [210]
    assert sum(c.megatron_buckets(numels, 7)) == 210
    assert c.uniform_buckets(100e6, 40_000_000) == [40e6, 40e6, 20e6]
    assert c.uniform_buckets(100e6, None) == [100e6]


def test_no_overlap_exposes_all():
    comm = [3.0, 3.0, 1.0]
    assert c.exposed_grad_sync_ms(comm, 1000.0, overlap=False) == pytest.approx(7.0)
    assert c.exposed_param_gather_ms(comm, 1000.0, overlap=False) == pytest.approx(7.0)


def test_overlap_exposes_at_most_one_bucket_plus_the_excess():
    rng = np.random.default_rng(0)
    for _ in range(500):
        b = int(rng.integers(1, 12))
        per = float(rng.uniform(0.1, 20.0))
        comm = [per] * b  # equal buckets
        backward = float(rng.uniform(0.0, 200.0))
        exposed = c.exposed_grad_sync_ms(comm, backward, overlap=True)
        excess = max(0.0, sum(comm) - backward)
        assert comm[-1] - 1e-9 <= exposed <= comm[-1] + excess + 1e-9
        assert exposed <= sum(comm) + 1e-9
    # uneven buckets: never more than all of it, never less than the last bucket
    for _ in range(500):
        b = int(rng.integers(1, 12))
        comm = list(rng.uniform(0.0, 20.0, b))
        params = list(rng.uniform(1.0, 5.0, b))
        backward = float(rng.uniform(0.0, 200.0))
        exposed = c.exposed_grad_sync_ms(comm, backward, overlap=True, bucket_params=params)
        assert comm[-1] - 1e-9 <= exposed <= sum(comm) + 1e-9


def test_overlap_with_long_backward_hides_all_but_the_last_bucket():
    comm = [2.0, 2.0, 2.0, 0.5]
    assert c.exposed_grad_sync_ms(comm, 1e6, overlap=True) == pytest.approx(0.5)
    # no compute to hide behind: all of it
    assert c.exposed_grad_sync_ms(comm, 0.0, overlap=True) == pytest.approx(6.5)
    # a later pipeline stage hides its (single-bucket) reduction in its predecessors' cool-down
    idle = c.pipeline_idle_after_last_backward_ms(2, [10.0, 12.0, 11.0, 9.0], send_ms_between=0.5)
    assert idle == pytest.approx(23.0)
    assert c.exposed_grad_sync_ms([30.0], 11.0, overlap=True, idle_after_ms=idle) == pytest.approx(7.0)
    assert c.exposed_grad_sync_ms([30.0], 11.0, overlap=False, idle_after_ms=idle) == pytest.approx(7.0)


def test_param_gather_overlap():
    g = [1.0, 4.0, 4.0]
    # one bucket ahead: the first gather exposed, the rest behind the forward of the bucket before
    assert c.exposed_param_gather_ms(g, 30.0, overlap=True) == pytest.approx(1.0)
    assert c.exposed_param_gather_ms(g, 3.0, overlap=True) == pytest.approx(1.0 + 3.0 + 3.0)
    # all queued at once
    assert c.exposed_param_gather_ms(g, 30.0, overlap=True, aligned=True) == pytest.approx(1.0)
    assert c.exposed_param_gather_ms(g, 0.0, overlap=True, aligned=True) == pytest.approx(9.0)
    for aligned in (False, True):
        e = c.exposed_param_gather_ms(g, 5.0, overlap=True, aligned=aligned)
        assert g[0] <= e <= sum(g)


def test_bucketed_sync_of_a_real_size():
    # a 7B-parameter stage, DP = 16 over 2 whole nodes of 8 H100
    shape = nodes(2)
    size = c.default_bucket_size_params(16, overlap_grad_reduce=True)
    buckets = c.uniform_buckets(7e9, size)
    comm = [c.reduce_scatter_ms(p * 4, shape) for p in buckets]  # fp32 main grads reduce-scattered
    whole = c.reduce_scatter_ms(7e9 * 4, shape)
    lat_ms = c.ring_latency_us(shape, "reduce_scatter") * 1e-3
    assert sum(comm) == pytest.approx(whole + (len(buckets) - 1) * lat_ms)  # buckets add only latency
    exposed = c.exposed_grad_sync_ms(comm, backward_ms=2 * sum(comm), overlap=True)
    assert exposed == pytest.approx(comm[-1], rel=1e-6)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, field", [
    (dict(ranks=0, ranks_per_domain=1, intra_gbytes_per_s=1.0), "ranks"),
    (dict(ranks=8, ranks_per_domain=16, intra_gbytes_per_s=1.0), "ranks_per_domain"),
    (dict(ranks=8, ranks_per_domain=3, intra_gbytes_per_s=1.0), "ranks_per_domain"),
    (dict(ranks=8, ranks_per_domain=4, intra_gbytes_per_s=1.0), "inter_gbytes_per_s"),
    (dict(ranks=8, ranks_per_domain=4, intra_gbytes_per_s=1.0, inter_gbytes_per_s=math.nan), "inter_gbytes_per_s"),
    (dict(ranks=8, ranks_per_domain=8, intra_gbytes_per_s=-1.0), "intra_gbytes_per_s"),
    (dict(ranks=8, ranks_per_domain=8, intra_gbytes_per_s=1.0, intra_link="ib"), "intra_link"),
    (dict(ranks=8, ranks_per_domain=8, intra_gbytes_per_s=1.0, inter_link="warp"), "inter_link"),
])
def test_bad_shapes_name_the_field(kwargs, field):
    with pytest.raises(SpecError) as e:
        c.GroupShape(**kwargs)
    assert e.value.field == field


def test_bad_inputs_name_the_field():
    with pytest.raises(SpecError, match="collective"):
        c.collective_ms("broadcast", 1.0, node())
    with pytest.raises(SpecError, match="nbytes"):
        c.allreduce_ms(-1.0, node())
    with pytest.raises(SpecError, match="algorithm"):
        c.allreduce_ms(1.0, node(), algorithm="nvls")
    with pytest.raises(SpecError, match="bucket_comm_ms"):
        c.exposed_grad_sync_ms([1.0, math.inf], 1.0, overlap=True)
    with pytest.raises(SpecError, match="bucket_params"):
        c.exposed_grad_sync_ms([1.0, 1.0], 1.0, overlap=True, bucket_params=[1.0])
    with pytest.raises(SpecError, match="stage"):
        c.pipeline_idle_after_last_backward_ms(3, [1.0, 1.0])
