"""Cost composition against hand-computed cases, and the vectorised path against the scalar one."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest

from memx_hpc.errors import SpecError
from memx_hpc.model import analytic, host
from memx_hpc.model import collectives as coll
from memx_hpc.model.compose import (Composer, CostOptions, p2p_bytes, predict_general, predict_plan, required_queries,
                                  stage_layout, sync_ms_per_param)
from memx_hpc.model.compose import logits_transient_bytes
from memx_hpc.model.links import SITE_LATENCY_US
from memx_hpc.placement import place_groups
from memx_hpc.model.memory import PRIORS
from memx_hpc.model.schedule import simulate_1f1b
from memx_hpc.search.space import PlanSpace, SpaceOptions
from memx_hpc.spec import (GeneralPlan, GeneralStage, Link, ModelSpec, Partition, Plan, Recompute, Replica, Site,
                           Stage, job_for_model)

GiB = 2**30


class LinearModel:
    """A small explicit cost model: every number can be worked out by hand.

    Layer time ``T[gpu] * mbs / tp`` ms, times 1 / 1.25 / 4/3 for none / selective / full;
    activations ``act * mbs / tp`` bytes (act = 1e8 unless given) times 1 / 0.8 / 0.1;
    embedding 1 ms and 1e6 bytes,
    head 5 ms and 5e7 bytes per micro-batch; 1 GiB of runtime overhead per GPU.
    """

    T = {"A100-80": 10.0, "V100-32": 25.0, "H100-SXM": 5.0}
    MODE_T = {"none": 1.0, "selective": 1.25, "full": 4 / 3}
    MODE_A = {"none": 1.0, "selective": 0.8, "full": 0.1}

    def __init__(self, scale: float = 1.0, act: float = 1e8) -> None:
        self.scale = scale
        self.act = act
        self.identity = hashlib.sha256(f"linear-{scale}-{act}".encode()).hexdigest()
        self.calls = 0
        self.rows = 0

    def predict(self, queries):
        self.calls += 1
        self.rows += len(queries)
        out = np.zeros((len(queries), 2))
        for i, q in enumerate(queries):
            b = q.micro_batch_size
            if q.kind == "layer":
                out[i] = (self.scale * self.T[q.gpu_type] * b / q.tp * self.MODE_T[q.recompute],
                          self.act * b / q.tp * self.MODE_A[q.recompute])
            elif q.kind == "embedding":
                out[i] = (1.0 * b, 1e6 * b)
            else:
                out[i] = (5.0 * b, 5e7 * b)
        return out

    def overhead_bytes(self, gpu_type):
        return GiB

    def provenance(self, gpu_type):
        return "measured"


def small_model(layers=4):
    return ModelSpec(name="small", num_layers=layers, hidden_size=1024, num_attention_heads=8, num_query_groups=8,
                     ffn_hidden_size=4096, vocab_size=1000, seq_length=512)


def two_partition_site(**kw) -> Site:
    parts = (Partition(name="pA", gpu_type="A100-80", nodes=1, gpus_per_node=4, inter_node_gbps=25),
             Partition(name="pV", gpu_type="V100-32", nodes=1, gpus_per_node=4, inter_node_gbps=12.5))
    return Site(name="two", partitions=parts, links=(Link(a="pA", b="pV", gbps=10.0),), **kw)


def test_hand_computed_plan():
    site = two_partition_site()
    job = job_for_model(small_model(), 4, precision="bf16", optimizer="adam", distributed_optimizer=True)
    plan = Plan(tp=1, dp=2, micro_batch_size=1, global_batch_size=4,
                stages=(Stage(partition="pA", num_layers=3), Stage(partition="pV", num_layers=1,
                                                                   recompute=Recompute(mode="full"))))
    pred = predict_plan(plan, site, job, LinearModel())
    s0, s1 = pred.stages
    assert pred.num_microbatches == 2
    # times per micro-batch: 3 A100 layers + embedding; 1 V100 layer fully recomputed + head
    assert s0.forward_ms + s0.backward_ms == pytest.approx(3 * 10 + 1)
    assert s0.forward_ms == pytest.approx((3 * 10 + 1) / 3)
    assert s1.forward_ms + s1.backward_ms == pytest.approx(25 * 4 / 3 + 5)
    assert s1.forward_ms == pytest.approx(25 * 4 / 3 / 4 + 5 / 3)
    # activations: stage 0 holds min(2 - 0, 2) = 2 micro-batches, stage 1 one, plus the rebuilt layer
    assert s0.in_flight == 2 and s1.in_flight == 1
    assert s0.activation_bytes == 2 * (3e8 + 1e6)
    assert s1.activation_bytes == 1e7 + 5e7 + (1e8 - 1e7)
    p0 = analytic.stage_params(job.model, 3, first=True, last=False, tp=1, pp=2)
    p1 = analytic.stage_params(job.model, 1, first=False, last=True, tp=1, pp=2)
    st0 = analytic.state_bytes(p0, precision="bf16", optimizer="adam", distributed_optimizer=True, dp=2)
    st1 = analytic.state_bytes(p1, precision="bf16", optimizer="adam", distributed_optimizer=True, dp=2)
    # device memory = state + a x activations + b: the NVIDIA prior's a on the activations
    # alone, the state (allocated once, exact-size) at its size (the model reports b = 1 GiB)
    a = PRIORS["nvidia"].a
    assert s0.state_bytes == st0 and s0.peak_bytes == round(st0 + a * 2 * (3e8 + 1e6) + GiB)
    assert s1.peak_bytes == round(st1 + a * (1e7 + 5e7 + 9e7) + GiB)
    # no measured or imported curves: the site's figures as latency + bytes / bandwidth
    lat = {k: v * 1e-3 for k, v in SITE_LATENCY_US.items()}
    # p2p: s*b*h*2 bytes over the 10 GB/s link between the partitions, as NCCL sends it (collectives.py):
    # base + one network hop of latency, the bytes at InfiniBand's peak fraction
    ib = coll.LINK_KINDS["ib"]
    c = (coll.BASE_LATENCY_US + ib.ring_hop_latency_us) * 1e-3 + 512 * 1 * 1024 * 2 / (10 * ib.peak_fraction * 1e6)
    assert s0.send_ms == pytest.approx(c)
    # DP sync: distributed optimizer, reduce-scatter (4-byte grads) + all-gather (2-byte params), one bucket
    # each (no --overlap-grad-reduce), NCCL's ring inside one node (collectives.py): per call the base and one
    # NVLink step of latency, (d-1)/d of the bytes at NVLink's peak fraction of the site's figure
    call = (coll.BASE_LATENCY_US + coll.LINK_KINDS["nvlink"].ring_hop_latency_us) * 1e-3
    peak = coll.LINK_KINDS["nvlink"].peak_fraction
    assert s0.grad_sync_ms == pytest.approx(2 * call + p0 * 0.5 * 6 / (300 * peak * 1e6))
    assert s1.grad_sync_ms == pytest.approx(2 * call + p1 * 0.5 * 6 / (150 * peak * 1e6))
    tied = 2 * lat["cross"] + analytic.embedding_params(job.model, 1) * 4 / (10 * 1e6)
    sim = simulate_1f1b([s0.forward_ms, s1.forward_ms], [s0.backward_ms, s1.backward_ms], [c], 2)
    opt0 = analytic.optimizer_step_ms(p0, site.gpu("A100-80"), precision="bf16", optimizer="adam",
                                      distributed_optimizer=True, dp=2)
    opt1 = analytic.optimizer_step_ms(p1, site.gpu("V100-32"), precision="bf16", optimizer="adam",
                                      distributed_optimizer=True, dp=2)
    want = max(sim.stage_finish_ms[0] + s0.grad_sync_ms + opt0 + tied,
               sim.stage_finish_ms[1] + s1.grad_sync_ms + opt1 + tied)
    assert pred.iteration_ms == pytest.approx(want)
    assert pred.pipeline_ms == pytest.approx(sim.total_ms)
    assert pred.tokens_per_s == pytest.approx(4 * 512 / (want / 1e3))
    # utilisation is over what a process can allocate: the reported memory x its usable fraction
    u0, u1 = s0.peak_bytes / site.gpu("A100-80").capacity_bytes, s1.peak_bytes / site.gpu("V100-32").capacity_bytes
    assert pred.max_utilisation == pytest.approx(max(u0, u1))
    assert pred.balance == pytest.approx(max(u0, u1) / ((u0 + u1) / 2))
    assert pred.feasible and pred.peak_by_gpu_type() == {"A100-80": s0.peak_bytes, "V100-32": s1.peak_bytes}


def test_partial_full_recompute_costs_k_full_and_the_rest_none():
    site = two_partition_site()
    job = job_for_model(small_model(8), 4)
    mk = lambda rc: Plan(tp=1, dp=1, micro_batch_size=1, global_batch_size=4,  # noqa: E731
                         stages=(Stage(partition="pA", num_layers=8, recompute=rc),))
    model = LinearModel()
    k3 = predict_plan(mk(Recompute(mode="full", num_layers=3)), site, job, model).stages[0]
    assert k3.time_ms == pytest.approx(3 * 10 * 4 / 3 + 5 * 10 + 1 + 5)
    # the one stage is also the last: its transient is the larger of the recomputed layer
    # and the logits beside their fp32 copy
    logits = logits_transient_bytes(job, 1, 1)
    assert logits > 0
    assert k3.activation_bytes == round(1 * (3 * 1e7 + 5 * 1e8 + 1e6 + 5e7) + max(1e8 - 1e7, logits))
    assert k3.recompute.label() == "full:3"
    sel = predict_plan(mk(Recompute(mode="selective")), site, job, model).stages[0]
    assert sel.time_ms == pytest.approx(8 * 12.5 + 6) and sel.activation_bytes == round(8 * 0.8e8 + 1e6 + 5e7 + logits)


def test_interleaved_last_stage_holds_one_loss_beside_its_waiting_chunks():
    """Under interleaving the last stage holds 3 chunks of 3 layers (p = 2, v = 2, m = 4:
    warm-up (v - 1)·p = 2, then a forward) but the output layer and loss of one micro-batch:
    its last chunk's backward follows its forward. The search composes the same (the last
    stage is the fuller one, so its peak is the plan's utilisation)."""
    site = two_partition_site(memory_safety_margin=0.3)
    job = job_for_model(small_model(8), 4)
    plan = Plan(tp=1, dp=1, micro_batch_size=1, global_batch_size=4, virtual_stages=2,
                stages=(Stage(partition="pA", num_layers=2), Stage(partition="pV", num_layers=6)))
    model = LinearModel()
    pred = predict_plan(plan, site, job, model)
    last = pred.stages[-1]
    assert last.activation_bytes == round(3 / 2 * 6 * 1e8 + 1 * 5e7 + logits_transient_bytes(job, 1, 1))
    assert last.peak_bytes > pred.stages[0].peak_bytes
    one = predict_plan(dataclasses.replace(plan, virtual_stages=1), site, job, model).stages[-1]
    assert one.activation_bytes == round(1 * (6 * 1e8 + 5e7) + logits_transient_bytes(job, 1, 1))
    space = PlanSpace(site, dataclasses.replace(job, virtual_stages=(2,)), SpaceOptions(layer_granularity=1, max_pipeline_stages=2, recompute_spread=None,
                                                                                    overlap=False))
    _, cost = _composed(space, model, CostOptions())
    hits = [i for i in range(len(space)) if space.plan_at(i) == plan]
    assert hits, "the search space holds the interleaved plan"
    assert cost.max_utilisation[hits[0]] == pytest.approx(pred.max_utilisation, rel=1e-12)


def test_grad_reduce_formulas():
    job = job_for_model(small_model(), 8, precision="bf16", distributed_optimizer=False)
    # ring all-reduce of fp32 gradients: 2 (d-1)/d * 4 bytes per parameter
    assert sync_ms_per_param(job, 4, 25.0) == pytest.approx(2 * 3 / 4 * 4 / 25e6)
    assert sync_ms_per_param(job, 1, 25.0) == 0.0
    fp16 = dataclasses.replace(job, precision="fp16")
    assert sync_ms_per_param(fp16, 2, 10.0) == pytest.approx(2 * 1 / 2 * 2 / 10e6)
    dist = dataclasses.replace(job, distributed_optimizer=True)
    assert sync_ms_per_param(dist, 4, 25.0) == pytest.approx(3 / 4 * (4 + 2) / 25e6)
    assert p2p_bytes(job, micro_batch_size=2, tp=4, sequence_parallel=True) == 512 * 2 * 1024 * 2 / 4
    assert p2p_bytes(job, micro_batch_size=2, tp=4, sequence_parallel=False) == 512 * 2 * 1024 * 2


def test_stage_layout_intra_and_inter_node():
    site = Site(name="s", partitions=(Partition(name="a", gpu_type="A100-80", nodes=2, gpus_per_node=4,
                                                intra_node_gbps=300, inter_node_gbps=25),
                                      Partition(name="b", gpu_type="V100-32", nodes=1, gpus_per_node=4)),
                inter_partition_gbps=5)
    # tp*dp = 2, three stages on a: one component of 6 ranks, 3 on each of 2 nodes (as sbatch
    # --nodes 2 --ntasks-per-node 3 runs it): a0 = ranks 0-1 (node 0), a1 = 2-3 (nodes 0 and 1),
    # a2 = 4-5 (node 1); every boundary has a sender whose peer is on the other node
    links, dps = stage_layout(site, place_groups(site, tp=1, dp=2, groups=[("a", 3), ("b", 1)]))
    assert links == [25, 25, 5]
    assert dps == [300, 25, 300, site.intra_gbps("b")]
    # two stages of 4 ranks: one per node
    links, dps = stage_layout(site, place_groups(site, tp=1, dp=4, groups=[("a", 2)]))
    assert links == [25] and dps == [300, 300]
    # tp*dp = 8 spans both nodes: the DP ring crosses the network
    links, dps = stage_layout(site, place_groups(site, tp=2, dp=4, groups=[("a", 1)]))
    assert dps == [25]
    # 3 ranks per node would split a TP group of 2: the layout does not fit
    with pytest.raises(SpecError, match="split a tensor-parallel group"):
        place_groups(site, tp=2, dp=1, groups=[("a", 3)])


def test_infeasible_above_capacity_minus_margin():
    site = two_partition_site(memory_safety_margin=0.1)
    job = job_for_model(small_model(4), 64)
    model = LinearModel(act=1e9)
    plan = Plan(tp=1, dp=1, micro_batch_size=8, global_batch_size=64, stages=(Stage(partition="pA", num_layers=4),))
    pred = predict_plan(plan, site, job, model)
    cap = site.gpu("A100-80").memory_bytes
    a = PRIORS["nvidia"].a
    logits = logits_transient_bytes(job, 1, 8)
    assert pred.stages[0].peak_bytes == round(pred.stages[0].state_bytes + a * (4 * 8e9 + 1e6 * 8 + 5e7 * 8 + logits)
                                              + GiB)
    assert pred.feasible == (pred.stages[0].peak_bytes <= 0.9 * cap) and pred.feasible
    deep = Plan(tp=1, dp=1, micro_batch_size=8, global_batch_size=64,
                stages=(Stage(partition="pV", num_layers=2), Stage(partition="pA", num_layers=2)))
    d = predict_plan(deep, site, job, model)
    assert d.stages[0].in_flight == 2
    assert not d.feasible and "stage 0 (V100-32)" in d.reason and "90%" in d.reason
    ok = predict_plan(dataclasses.replace(deep, stages=(Stage(partition="pV", num_layers=2,
                                                              recompute=Recompute(mode="full")),
                                                        deep.stages[1])), site, job, model)
    assert ok.feasible  # recomputing on the memory-poor GPU makes it fit


def _composed(space, model, options=None):
    inputs = space.composition_inputs()
    preds = {q: tuple(v) for q, v in zip(required_queries(inputs), model.predict(required_queries(inputs)))}
    comp = Composer(inputs, preds, overhead_bytes={p.gpu_type: model.overhead_bytes(p.gpu_type)
                                                   for p in space.partitions}, options=options)
    return comp, comp.compose(space.decode(0, len(space)))


@pytest.mark.parametrize("overlap", [False, True])
def test_vectorised_composition_equals_scalar(overlap):
    site = two_partition_site(memory_safety_margin=0.3)
    job = job_for_model(small_model(6), 16, recompute_modes=("none", "selective", "full"), attention="core")
    space = PlanSpace(site, job, SpaceOptions(layer_granularity=1, max_pipeline_stages=3, recompute_spread=None,
                                              overlap=overlap))
    model = LinearModel(act=1e9)
    opts = CostOptions()
    _, cost = _composed(space, model, opts)
    assert 0 < cost.feasible.sum() < len(space)  # both kinds present
    rng = np.random.default_rng(0)
    sample = sorted(rng.choice(len(space), 500, replace=False))
    assert {space.plan_at(int(i)).sequence_parallel for i in sample} == {False, True}  # searched where TP > 1
    for i in sample:
        plan = space.plan_at(int(i))
        assert not overlap or plan.overlap_grad_reduce  # the plans carry the option the composition priced
        pred = predict_plan(plan, site, job, model, options=opts)
        assert pred.feasible == cost.feasible[i]
        assert pred.max_utilisation == pytest.approx(cost.max_utilisation[i], rel=1e-12)
        assert pred.balance == pytest.approx(cost.balance[i], rel=1e-12)
        if pred.feasible:
            assert pred.iteration_ms == pytest.approx(cost.iteration_ms[i], rel=1e-12)
        else:
            assert cost.iteration_ms[i] == np.inf


def test_general_plan_matches_plan_and_takes_the_slowest_replica():
    site = two_partition_site()
    job = job_for_model(small_model(4), 8)
    model = LinearModel()
    plan = Plan(tp=1, dp=2, micro_batch_size=1, global_batch_size=8,
                stages=(Stage(partition="pA", num_layers=2), Stage(partition="pA", num_layers=2)))
    same = GeneralPlan(micro_batch_size=1, global_batch_size=8, stages=tuple(
        GeneralStage(num_layers=2, replicas=(Replica(gpu_type="A100-80", tp=1, partition="pA"),) * 2)
        for _ in range(2)))
    a = predict_plan(plan, site, job, model)
    b = predict_general(same, site, job, model)
    assert [s.time_ms for s in a.stages] == pytest.approx([s.time_ms for s in b.stages[::2]])
    assert a.stages[0].peak_bytes == b.stages[0].peak_bytes
    mixed = GeneralPlan(micro_batch_size=1, global_batch_size=8, stages=(
        GeneralStage(num_layers=2, replicas=(Replica(gpu_type="A100-80", tp=2), Replica(gpu_type="V100-32", tp=4))),
        GeneralStage(num_layers=2, replicas=(Replica(gpu_type="A100-80", tp=1),))))
    m = predict_general(mixed, site, job, model)
    assert m.stage_ms[0] == pytest.approx(max(2 * 10 / 2 + 1, 2 * 25 / 4 + 1) * 4 / 8)  # 4 micro-batches of 8
    assert m.stage_ms[1] == pytest.approx(2 * 10 + 5)
    assert {s.gpu_type for s in m.stages} == {"A100-80", "V100-32"} and len(m.stages) == 3
    # the V100 replica synchronises the A100 replica's (tp 2) shard, twice its own
    v = next(s for s in m.stages if s.gpu_type == "V100-32")
    a2 = next(s for s in m.stages if s.gpu_type == "A100-80" and s.stage == 0)
    assert v.grad_sync_ms == pytest.approx(a2.grad_sync_ms)


def test_bad_plans_are_spec_errors():
    site = two_partition_site()
    job = job_for_model(small_model(4), 8)
    model = LinearModel()
    with pytest.raises(SpecError, match="unknown partition"):
        predict_plan(Plan(tp=1, dp=1, micro_batch_size=1, global_batch_size=8,
                          stages=(Stage(partition="nope", num_layers=4),)), site, job, model)
    with pytest.raises(SpecError, match="layers"):
        predict_plan(Plan(tp=1, dp=1, micro_batch_size=1, global_batch_size=8,
                          stages=(Stage(partition="pA", num_layers=3),)), site, job, model)
    with pytest.raises(SpecError, match="needs 2 nodes of partition pA"):
        predict_plan(Plan(tp=4, dp=2, micro_batch_size=1, global_batch_size=8,
                          stages=(Stage(partition="pA", num_layers=4),)), site, job, model)
    with pytest.raises(SpecError, match="full recompute of 5"):
        predict_plan(Plan(tp=1, dp=1, micro_batch_size=1, global_batch_size=8,
                          stages=(Stage(partition="pA", num_layers=4, recompute=Recompute(mode="full", num_layers=5)),)),
                     site, job, model)
    with pytest.raises(SpecError, match="unknown GPU type"):
        predict_general(GeneralPlan(micro_batch_size=1, global_batch_size=8, stages=(
            GeneralStage(num_layers=4, replicas=(Replica(gpu_type="Z9000", tp=1),)),)), site, job, model)


# --------------------------------------------------------------------------- the host-dispatch floor


def test_operator_counts_follow_the_schedule():
    # recompute runs the forward again; tensor parallelism adds its collectives
    assert host.layer_ops("full", 1) == 2 * host.FORWARD_OPS + host.BACKWARD_OPS
    assert host.layer_ops("none", 1) < host.layer_ops("selective", 1) < host.layer_ops("full", 1)
    assert host.layer_ops("full", 2) == host.layer_ops("full", 1) + 6
    assert host.layer_host_ms("none", 1, us_per_op=10.0) == pytest.approx(host.layer_ops("none", 1) * 0.01)


def test_floor_raises_only_layers_below_it():
    job = job_for_model(small_model(), 4)
    from memx_hpc.model.compose import context_queries
    qs = context_queries(job, "A100-80", 1, 1, False)  # none, selective, full, embedding, head
    vals = np.array([[0.01, 1.0], [50.0, 2.0], [0.02, 3.0], [0.001, 4.0], [0.002, 5.0]])
    out = host.host_bound(qs, vals)
    assert out[0, 0] == pytest.approx(host.layer_host_ms("none", 1))
    assert out[1, 0] == 50.0  # above its floor: the device time stands
    assert out[2, 0] == pytest.approx(host.layer_host_ms("full", 1))
    assert out[3, 0] == 0.001 and out[4, 0] == 0.002  # embedding and head untouched
    assert (out[:, 1] == vals[:, 1]).all()  # bytes untouched
    assert vals[0, 0] == 0.01  # the input is not modified


def test_host_bound_plans_split_host_work_across_pipeline_stages():
    """With device work far below the floor, the iteration is the host's: tensor parallelism
    does not shorten it, pipeline stages (one process each) do."""
    site = two_partition_site()
    job = job_for_model(small_model(4), 8, precision="bf16")
    tiny = LinearModel(scale=1e-4)

    def plan(tp, pp):
        return Plan(tp=tp, dp=1, micro_batch_size=1, global_batch_size=8,
                    stages=tuple(Stage(partition="pA", num_layers=4 // pp, recompute=Recompute(mode="full"))
                                 for _ in range(pp)))

    t11 = predict_plan(plan(1, 1), site, job, tiny)
    t21 = predict_plan(plan(2, 1), site, job, tiny)
    t12 = predict_plan(plan(1, 2), site, job, tiny)
    floor = host.layer_host_ms("full", 1)
    assert t11.stages[0].time_ms >= 4 * floor
    assert t21.iteration_ms >= t11.iteration_ms  # TP: same host work, plus its collectives
    assert t12.iteration_ms < 0.75 * t11.iteration_ms  # two processes dispatch half the layers each


def test_vectorised_composition_applies_the_same_floor():
    site = two_partition_site(memory_safety_margin=0.3)
    job = job_for_model(small_model(6), 16, recompute_modes=("none", "full"), attention="core")
    space = PlanSpace(site, job, SpaceOptions(layer_granularity=1, max_pipeline_stages=3, recompute_spread=None))
    model = LinearModel(scale=1e-3)  # layers of 0.01-0.03 ms: every one at its floor
    _, cost = _composed(space, model, None)
    rng = np.random.default_rng(1)
    checked = 0
    for i in sorted(rng.choice(len(space), 200, replace=False)):
        pred = predict_plan(space.plan_at(int(i)), site, job, model)
        assert pred.feasible == cost.feasible[i]
        if pred.feasible:
            checked += 1
            assert pred.iteration_ms == pytest.approx(cost.iteration_ms[i], rel=1e-12)
    assert checked > 0


def test_a_model_of_dense_and_moe_layers_prices_each_stage_by_its_layers():
    """A model whose first layer is dense (DeepSeek's first_k_dense_replace): a middle
    stage holds MoE layers only, the first stage the dense layer, and the vectorised search
    and the one-plan path agree on every plan's time and memory."""
    from memx_hpc.model.api import AnalyticCostModel
    from memx_hpc.params import expert_params, layers_params
    moe = ModelSpec(name="mixed", num_layers=6, hidden_size=1024, num_attention_heads=8, num_query_groups=8,
                    ffn_hidden_size=2048, vocab_size=1000, seq_length=512, num_experts=4, moe_router_topk=2,
                    moe_ffn_hidden_size=1024, moe_layer_freq=(0, 1, 1, 1, 1, 1))
    assert analytic.stage_first_layer(moe, 2, first=False, last=False) >= 1  # past the dense layer
    mid = analytic.stage_params(moe, 2, first=False, last=False, tp=1, pp=3)
    assert mid == layers_params(moe, 4, 2) > layers_params(moe, 0, 2)  # two MoE layers outweigh dense + MoE
    assert expert_params(moe, 0, 2) == expert_params(moe, 4, 2) // 2
    site = two_partition_site(memory_safety_margin=0.3)
    job = job_for_model(moe, 16, attention="core", precision="bf16", optimizer="adam", distributed_optimizer=True)
    space = PlanSpace(site, job, SpaceOptions(layer_granularity=1, max_pipeline_stages=3, recompute_spread=None))
    model = AnalyticCostModel(site)
    _, cost = _composed(space, model, None)
    rng = np.random.default_rng(3)
    middles = 0
    for i in sorted(rng.choice(len(space), min(len(space), 150), replace=False)):
        plan = space.plan_at(int(i))
        pred = predict_plan(plan, site, job, model)
        assert pred.feasible == cost.feasible[i]
        assert pred.max_utilisation == pytest.approx(cost.max_utilisation[i], rel=1e-9)
        if pred.feasible:
            assert pred.iteration_ms == pytest.approx(cost.iteration_ms[i], rel=1e-9)
        middles += plan.pp == 3
    assert middles > 0


def test_context_parallel_splits_device_work_not_host_work():
    """A host-bound layer under CP: every rank of the group still dispatches the whole layer
    and ring attention's steps, so the stage takes at least that host time per layer and
    micro-batch, and CP does not shorten a host-bound plan."""
    site = two_partition_site()
    job = job_for_model(small_model(4), 8, precision="bf16")
    tiny = LinearModel(scale=1e-4)

    def plan(cp):
        return Plan(tp=1, dp=1, cp=cp, micro_batch_size=1, global_batch_size=8,
                    stages=(Stage(partition="pA", num_layers=4, recompute=Recompute()),))

    t1, t2 = predict_plan(plan(1), site, job, tiny), predict_plan(plan(2), site, job, tiny)
    hf, hb = host.layer_host_ms_parallel("none", 1, cp=2, moe_share=0.0, local_experts=1, ep=1)
    assert hf + hb > host.layer_host_ms("none", 1)  # ring attention adds operators
    assert t2.stages[0].time_ms >= 4 * (hf + hb)  # per micro-batch: four layers at least their host time
    assert t2.iteration_ms > t1.iteration_ms


def test_host_floor_leaves_large_layers_alone():
    """The CP/EP host floor only lifts layers whose device part is shorter than it."""
    from memx_hpc.model.compose import link_model_for, stage_extras
    site = two_partition_site()
    job = job_for_model(small_model(4), 8, precision="bf16")
    links = link_model_for(site)
    kw = dict(partition="pA", tasks_per_node=4, tp=1, cp=2, ep=1, etp=None, micro_batch_size=1)
    big = stage_extras(links, job, layer_fwd_ms=50.0, **kw)
    assert big == stage_extras(links, job, layer_fwd_ms=50.0, host_us=0.0, **kw)
    small = stage_extras(links, job, layer_fwd_ms=1e-4, **kw)
    bare = stage_extras(links, job, layer_fwd_ms=1e-4, host_us=0.0, **kw)
    hf, hb = host.layer_host_ms_parallel("none", 1, cp=2, moe_share=0.0, local_experts=1, ep=1)
    assert small.extra_fwd_ms == pytest.approx(max(bare.extra_fwd_ms, hf - 1e-4 * small.layer_scale))
    assert small.extra_bwd_ms == pytest.approx(max(bare.extra_bwd_ms, hb - 2e-4 * small.layer_scale))


def test_moe_host_operators_follow_the_layer_structure():
    f1, b1 = host.parallel_host_ops(cp=1, moe=True, local_experts=2, ep=1)
    f2, b2 = host.parallel_host_ops(cp=1, moe=True, local_experts=4, ep=1)
    fe, _ = host.parallel_host_ops(cp=1, moe=True, local_experts=2, ep=2)
    assert f2 - f1 == 2 * host.MLP_OPS  # two more local experts, their FC1, activation, FC2 each
    assert b1 == 2 * f1 and b2 == 2 * f2  # autograd: about two operators per forward one
    assert fe - f1 == host.MOE_EP_EXCHANGE_OPS  # the EP all-to-alls and count exchange
    assert host.parallel_host_ops(cp=1, moe=False, local_experts=1, ep=1) == (0, 0)


def test_a_micro_batch_group_per_virtual_stage_is_priced_in_memory_and_time():
    """``microbatch_group_size_per_vp_stage`` = 3 on p = 2, v = 2, m = 6: the last stage's
    warm-up is ``(v - 1)·G`` = 3 chunk forwards (the default G = p: 2), so it holds 4 chunks of 3
    layers, not 3, beside one micro-batch's output layer and loss; the pipeline is Megatron's
    interleaved order for that group, simulated; and the vectorised search prices the same."""
    from memx_hpc.model.schedule import simulate_interleaved
    site = two_partition_site(memory_safety_margin=0.3)
    job = job_for_model(small_model(8), 6)
    plan = Plan(tp=1, dp=1, micro_batch_size=1, global_batch_size=6, virtual_stages=2,
                microbatch_group_size_per_vp_stage=3,
                stages=(Stage(partition="pA", num_layers=2), Stage(partition="pV", num_layers=6)))
    model = LinearModel()
    pred = predict_plan(plan, site, job, model)
    default = predict_plan(dataclasses.replace(plan, microbatch_group_size_per_vp_stage=None), site, job, model)
    logits = logits_transient_bytes(job, 1, 1)
    assert pred.stages[-1].activation_bytes == round(4 / 2 * 6 * 1e8 + 1 * 5e7 + logits)
    assert default.stages[-1].activation_bytes == round(3 / 2 * 6 * 1e8 + 1 * 5e7 + logits)
    assert pred.stages[-1].peak_bytes > default.stages[-1].peak_bytes
    f = np.array([[s.forward_ms / 2] * 2 for s in pred.stages])
    b = np.array([[s.backward_ms / 2] * 2 for s in pred.stages])
    exact = simulate_interleaved(f, b, [pred.stages[0].send_ms, 0.0], 6, group=3)
    assert pred.pipeline_ms == pytest.approx(exact.total_ms, rel=1e-12)
    assert pred.num_microbatches == 6

    space = PlanSpace(site, dataclasses.replace(job, virtual_stages=(2,)),
                      SpaceOptions(layer_granularity=1, max_pipeline_stages=2, recompute_spread=None, overlap=False))
    inputs = space.composition_inputs()
    grouped = tuple(dataclasses.replace(lay, microbatch_group_size_per_vp_stage=3)
                    if lay.virtual_stages > 1 and job.global_batch_size // (lay.micro_batch_size * lay.dp) == 6
                    else lay for lay in inputs.layouts)
    inputs = dataclasses.replace(inputs, layouts=grouped)
    queries = required_queries(inputs)
    preds = {q: tuple(v) for q, v in zip(queries, model.predict(queries))}
    comp = Composer(inputs, preds, overhead_bytes={p.gpu_type: model.overhead_bytes(p.gpu_type)
                                                   for p in space.partitions})
    cost = comp.compose(space.decode(0, len(space)))
    checked = 0
    for i in range(len(space)):
        lay = grouped[int(space.decode(i, i + 1).skeleton[0])]
        if not lay.microbatch_group_size_per_vp_stage:
            continue
        p = predict_plan(dataclasses.replace(space.plan_at(i), microbatch_group_size_per_vp_stage=3), site, job,
                         model)
        assert p.feasible == cost.feasible[i]
        assert p.max_utilisation == pytest.approx(cost.max_utilisation[i], rel=1e-12)
        if p.feasible:
            checked += 1
            assert p.iteration_ms == pytest.approx(cost.iteration_ms[i], rel=1e-12)
    assert checked > 0
