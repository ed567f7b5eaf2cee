"""The composition's communication as collectives.py prices it: gradient buckets and what the
plan's overlap options hide, TP over NVLink domains (NVL72), and sends between stages."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from memx_hpc.model import collectives as coll
from memx_hpc.model.comm_costs import (SYNC_TERMS, bucket_terms, exposed_dp_sync_ms, group_shape_of, link_model_for,
                                       one_bucket_terms, stage_sync_terms, tp_internode_ms)
from memx_hpc.model.compose import predict_plan
from memx_hpc.spec import ModelSpec, Partition, Plan, Site, Stage, job_for_model

from test_cost import LinearModel


def _h100_site(nodes: int = 8, **kw) -> Site:
    return Site(name="h", partitions=(Partition(name="h", gpu_type="H100-SXM", nodes=nodes, gpus_per_node=8,
                                                inter_node_gbps=50.0, **kw),))


def _model(layers: int = 8) -> ModelSpec:
    return ModelSpec(name="m", num_layers=layers, hidden_size=4096, num_attention_heads=32, num_query_groups=32,
                     ffn_hidden_size=16384, vocab_size=32000, seq_length=2048)


@pytest.mark.parametrize("params,size", [(100e6, 40e6), (80e6, 40e6), (30e6, 40e6), (250e6, 60e6)])
@pytest.mark.parametrize("backward", [0.0, 5.0, 50.0, 500.0])
def test_bucket_terms_reproduce_the_per_bucket_timeline(params, size, backward):
    """The closed form over full buckets and a remainder is collectives.exposed_grad_sync_ms /
    exposed_param_gather_ms of the bucket list megatron_buckets builds."""
    def grad(x):
        return 0.05 + np.asarray(x) * 4 / 40e9 * 1e3

    def gather(x):
        return 0.03 + np.asarray(x) * 2 / 40e9 * 1e3

    t = bucket_terms(np.array([params]), size, grad, gather, hide_grad=True, hide_gather=True)[0]
    buckets = coll.uniform_buckets(params, int(size))
    want_g = coll.exposed_grad_sync_ms([float(grad(b)) for b in buckets], backward, overlap=True,
                                       bucket_params=buckets)
    fwd = backward / 2
    rev = buckets[::-1]
    want_a = coll.exposed_param_gather_ms([float(gather(b)) for b in rev], fwd, overlap=True, bucket_params=rev)
    assert float(exposed_dp_sync_ms(t, fwd, backward)) == pytest.approx(want_g + want_a, rel=1e-9)
    off = bucket_terms(np.array([params]), None, grad, gather, hide_grad=False, hide_gather=False)[0]
    assert float(exposed_dp_sync_ms(off, fwd, backward)) == pytest.approx(float(grad(params) + gather(params)))


def test_one_bucket_terms_are_never_hidden():
    assert float(exposed_dp_sync_ms(one_bucket_terms(7.0), 100.0, 100.0)) == pytest.approx(7.0)


def test_overlap_is_priced_from_the_plan():
    """The plan's overlap_grad_reduce hides the first stage's bucketed reduction behind its last
    backward; overlap_param_gather the all-gather behind the forward; off, the whole of both."""
    site = _h100_site(4)
    job = job_for_model(_model(), 256, distributed_optimizer=True)
    plan = Plan(tp=1, dp=32, micro_batch_size=1, global_batch_size=256, stages=(Stage(partition="h", num_layers=8),))
    model = LinearModel(act=1e6)
    off = predict_plan(plan, site, job, model)
    on = predict_plan(dataclasses.replace(plan, overlap_grad_reduce=True), site, job, model)
    both = predict_plan(dataclasses.replace(plan, overlap_grad_reduce=True, overlap_param_gather=True), site, job,
                        model)
    assert both.stages[0].grad_sync_ms < on.stages[0].grad_sync_ms < off.stages[0].grad_sync_ms
    assert both.iteration_ms < on.iteration_ms < off.iteration_ms
    assert off.stages[0].grad_sync_ms > 0 and both.stages[0].grad_sync_ms > 0  # the last bucket shows


def test_dp_group_shares_its_domain_and_per_bucket_latency_grows_with_nodes():
    """A DP group of stride TP puts 8 / TP ranks on each node (NCCL's ring through the node, the
    node's adapters shared); per-call latency makes many buckets dearer on more nodes."""
    site = _h100_site(64)
    assert group_shape_of(site, "h", ranks=64, stride=8).ranks_per_domain == 1
    assert group_shape_of(site, "h", ranks=256, stride=2).ranks_per_domain == 4
    lm = link_model_for(site)
    job = job_for_model(_model(), 512)
    kw = dict(params=np.array([1e9]), expert_params=np.array([0.0]), cp=1, tp=8, ep=1, etp=None, partition="h",
              one_node=False, streams=8, first_stage=True, virtual_stages=1, overlap_grad_reduce=True,
              overlap_param_gather=False)
    small = stage_sync_terms(lm, job, dp=8, **kw)[0, 0]
    large = stage_sync_terms(lm, job, dp=64, **kw)[0, 0]
    assert large[1] > small[1]  # one bucket's reduction, the same bytes, more nodes


def test_the_plans_bucket_size_and_every_stage_bucketing_are_priced():
    """The plan's ddp_bucket_size cuts the first stage's gradients into that many parameters a
    bucket (more calls, each one's latency paid); the other stages keep one bucket under
    Megatron's DDP and are cut too under PyTorch DDP's rule (every_stage)."""
    site = _h100_site(8)
    lm = link_model_for(site)
    job = job_for_model(_model(), 512)
    kw = dict(params=np.array([1e9]), expert_params=np.array([0.0]), dp=64, cp=1, tp=1, ep=1, etp=None,
              partition="h", one_node=False, streams=1, virtual_stages=1, overlap_grad_reduce=True,
              overlap_param_gather=False)
    idx = {n: i for i, n in enumerate(SYNC_TERMS)}
    default = stage_sync_terms(lm, job, first_stage=True, **kw)[0, 0]
    small = stage_sync_terms(lm, job, first_stage=True, ddp_bucket_size=10_000_000, **kw)[0, 0]
    assert small[idx["grad_first"]] < default[idx["grad_first"]]  # a smaller first bucket
    assert small[idx["grad_total"]] > default[idx["grad_total"]]  # 100 calls' latency against 25
    later = stage_sync_terms(lm, job, first_stage=False, ddp_bucket_size=10_000_000, **kw)[0, 0]
    every = stage_sync_terms(lm, job, first_stage=False, ddp_bucket_size=10_000_000, bucketing="every_stage",
                             **kw)[0, 0]
    assert later[idx["grad_first"]] == pytest.approx(later[idx["grad_total"]])  # one bucket
    assert every == pytest.approx(small)
    # through a plan: a smaller bucket starts reducing sooner behind a long backward
    plan = Plan(tp=1, dp=64, micro_batch_size=1, global_batch_size=512, overlap_grad_reduce=True,
                stages=(Stage(partition="h", num_layers=8),))
    model = LinearModel(act=1e6)
    a = predict_plan(plan, site, job, model)
    b = predict_plan(dataclasses.replace(plan, ddp_bucket_size=10_000_000), site, job, model)
    assert a.stages[0].grad_sync_ms != pytest.approx(b.stages[0].grad_sync_ms)


def test_tp_inside_an_nvl72_rack_stays_on_nvlink():
    """TP 8 on 4-GPU GB200 nodes: across nodes without an NVLink domain, on NVLink inside an
    NVL72 rack (nvlink_domain_gpus: 72); TP over two racks pays the fabric again."""
    job = job_for_model(_model(), 64)

    def site(domain):
        return Site(name="gb", partitions=(Partition(name="g", gpu_type="GB200", nodes=36, gpus_per_node=4,
                                                     inter_node_gbps=50.0, nvlink_domain_gpus=domain),))

    for tp, domain, zero in ((8, None, False), (8, 72, True), (144, 72, False)):
        s = site(domain)
        x = tp_internode_ms(link_model_for(s), job, partition="g", gpu_type="GB200", tp=tp, micro_batch_size=1)
        assert (x == 0.0) == zero, (tp, domain, x)


def test_send_between_stages_pays_the_network_latency():
    """A send between nodes: NCCL's base and network hop latency plus the bytes at the fabric's
    peak fraction, over the fabric the partition names."""
    from memx_hpc.model.comm_costs import send_ms
    job = job_for_model(_model(), 64)
    for fabric, kind in (("", "ib"), ("efa", "efa")):
        s = _h100_site(2, fabric=fabric) if fabric else _h100_site(2)
        ms = send_ms(link_model_for(s), job, micro_batch_size=1, tp=1, sequence_parallel=False, a="h", b="h",
                     same_node=False)
        k = coll.LINK_KINDS[kind]
        nbytes = 2048 * 4096 * 2
        assert ms == pytest.approx((coll.BASE_LATENCY_US + k.ring_hop_latency_us) * 1e-3
                                   + nbytes / (50.0 * k.peak_fraction * 1e6))
