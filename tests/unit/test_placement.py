"""The one fit rule: what place() returns, and that search, composition and render share it."""

from __future__ import annotations

from pathlib import Path

import pytest

from memx_hpc.errors import SpecError
from memx_hpc.placement import group_fits, place, place_groups, shared_recompute
from memx_hpc.search.space import PlanSpace, SpaceOptions
from memx_hpc.slurm.render import describe
from memx_hpc.spec import Plan, Recompute, Stage, load_job, load_site

ROOT = Path(__file__).resolve().parents[2]
CROSS = ROOT / "site_configs" / "example-cross-vendor.yaml"
LOCAL = ROOT / "site_configs" / "local.yaml"


def _plan(*stages, tp=1, dp=1, gbs=64):
    return Plan(tp=tp, dp=dp, micro_batch_size=1, global_batch_size=gbs,
                stages=tuple(Stage(partition=p, num_layers=n, recompute=rc or Recompute()) for p, n, rc in stages))


def test_cross_vendor_plan_ranks_nodes_and_groups():
    site, job = load_site(CROSS), load_job(ROOT / "jobs" / "gpt3-2.7b.yaml")  # 32 layers
    plan = _plan(("gpu_a100", 12, None), ("gpu_a100", 12, None), ("gpu_mi250x", 8, None), tp=2, dp=2)
    pl = place(plan, site, job)
    assert pl.world_size == 12 and pl.pp == 3
    assert pl.ranks_by_partition() == {"gpu_a100": 8, "gpu_mi250x": 4}
    assert pl.nodes_by_partition() == {"gpu_a100": 2, "gpu_mi250x": 1}
    (a, m) = pl.components
    assert (a.stages, a.first_rank, a.nodes, a.tasks_per_node) == ((0, 1), 0, 2, 4)
    assert (m.stages, m.first_rank, m.nodes, m.tasks_per_node, m.vendor) == ((2,), 8, 1, 4, "amd")
    assert pl.rank_vendors() == ("nvidia",) * 8 + ("amd",) * 4 and pl.cross_vendor
    assert pl.node_of(5) == ("gpu_a100", 1) and not pl.boundary_same_node(0)
    crossing = {g.kind for g in pl.cross_vendor_groups()}
    # the pipeline, model-parallel, embedding and world groups span the two stages' vendors
    assert crossing == {"pp", "mp", "embd", "default"}
    assert all(not g.cross_vendor for g in pl.process_groups() if g.kind in ("tp", "dp", "pos_embd"))


@pytest.mark.parametrize("stages,tp,dp,words", [
    ((("gpu_v100", 32, None),), 6, 1, "exceeds the 4 GPUs per node of partition gpu_v100 and is not a multiple"),
    ((("gpu_v100", 32, None),), 8, 1, "needs 2 nodes of partition gpu_v100"),  # whole nodes, but it has one
    ((("gpu_a100", 16, None), ("gpu_a100", 8, None), ("gpu_a100", 8, None)), 2, 1, "split a tensor-parallel group"),
    ((("gpu_a100", 32, None),), 2, 8, "needs 4 nodes of partition gpu_a100"),
    ((("gpu_a100", 31, None),), 1, 1, "hold 31 layers"),
    ((("gpu_h100", 32, None),), 1, 1, "unknown partition"),
])
def test_what_does_not_fit_names_why(stages, tp, dp, words):
    site, job = load_site(CROSS), load_job(ROOT / "jobs" / "gpt3-2.7b.yaml")
    with pytest.raises(SpecError, match=words):
        place(_plan(*stages, tp=tp, dp=dp), site, job)


def test_one_command_line_serves_a_shared_block_recompute():
    full, k2 = Recompute(mode="full"), Recompute(mode="full", num_layers=2)
    # block k=2 recomputes 2 of 3 layers and both of a 2-layer stage: one component
    assert shared_recompute([Stage(partition="p", num_layers=3, recompute=k2),
                             Stage(partition="p", num_layers=2, recompute=full)]) == k2
    # a 3-layer stage recomputed entirely needs k >= 3: two command lines
    assert shared_recompute([Stage(partition="p", num_layers=3, recompute=k2),
                             Stage(partition="p", num_layers=3, recompute=full)]) is None
    assert shared_recompute([Stage(partition="p", num_layers=3),
                             Stage(partition="p", num_layers=3, recompute=full)]) is None
    site, job = load_site(LOCAL), load_job(ROOT / "jobs" / "tiny-gpt.yaml")  # 4 layers, 1-node partitions
    plan = _plan(("nvidia_a100", 2, Recompute(mode="full", num_layers=1)), ("nvidia_a100", 1, full),
                 ("amd_mi250", 1, None), gbs=8)
    req = describe(plan, site, job)
    assert [c.stages for c in req.components] == [(0, 1), (2,)]
    assert req.megatron_argv[0][-6:] == ["--recompute-granularity", "full", "--recompute-method", "block",
                                         "--recompute-num-layers", "1"]


def test_every_plan_the_space_enumerates_is_placed_as_the_renderer_places_it():
    """Search and render share the rule: with one recompute level per partition group (the
    default), every plan of the space fits, with one component per partition group."""
    site, job = load_site(CROSS), load_job(ROOT / "jobs" / "gpt3-2.7b.yaml")
    space = PlanSpace(site, job, SpaceOptions(layer_granularity=8, max_pipeline_stages=4))
    for sk in space.skeletons:
        for p, n in sk.groups:
            assert group_fits(site.partitions[p], n, tp=sk.tp, dp=sk.dp)
    step = max(1, len(space) // 400)
    for i in range(0, len(space), step):
        plan = space.plan_at(i)
        pl = place(plan, site, job)
        assert len(pl.components) == len(plan.component_groups())
        sk = space.skeletons[space.skeleton_of(i)]
        priced = place_groups(site, tp=sk.tp, dp=sk.dp, groups=[(site.partitions[p].name, n) for p, n in sk.groups])
        shape = lambda c: (c.partition, c.stages, c.first_rank, c.nodes, c.tasks_per_node, c.first_node)  # noqa: E731
        assert [shape(c) for c in pl.components] == [shape(c) for c in priced.components]


# --------------------------------------------------------------------------- context and expert parallel


def test_context_parallel_widens_every_stage_and_builds_its_groups():
    site, job = load_site(CROSS), load_job(ROOT / "jobs" / "gpt3-2.7b.yaml")  # seq 2048
    base = _plan(("gpu_a100", 16, None), ("gpu_a100", 16, None), tp=2, dp=1)
    plan = Plan(tp=2, dp=1, cp=2, micro_batch_size=1, global_batch_size=64, stages=base.stages)
    pl = place(plan, site, job)
    assert (pl.ranks_per_stage, pl.world_size, plan.world_size) == (4, 8, 8)
    assert pl.nodes_by_partition() == {"gpu_a100": 2}
    kinds = {g.kind for g in pl.process_groups()}
    assert {"cp", "dp_cp"} <= kinds and "ep" not in kinds
    # rank order tp-cp-dp-pp: the CP peers of rank 0 are TP apart, inside the stage's ranks
    assert [g.ranks for g in pl.process_groups() if g.kind == "cp"][0] == (0, 2)
    # a CP group never leaves its stage, so never its partition or vendor
    assert not any(g.cross_vendor for g in pl.process_groups() if g.kind in ("cp", "dp_cp"))
    # cp 4 on stages of 2 x 4 ranks: 2 stages x 8 ranks = 4 nodes of the 2 there are
    with pytest.raises(SpecError, match="nodes of partition gpu_a100"):
        place(Plan(tp=2, dp=1, cp=4, micro_batch_size=1, global_batch_size=64, stages=base.stages), site, job)


def test_context_and_expert_parallel_need_what_the_model_has():
    from memx_hpc.spec.catalog import preset
    from memx_hpc.spec import job_for_model

    site = load_site(CROSS)
    job = load_job(ROOT / "jobs" / "gpt3-2.7b.yaml")
    stages = (Stage(partition="gpu_a100", num_layers=32),)
    with pytest.raises(SpecError) as e:  # 2048 is not a multiple of 2 x 3
        place(Plan(tp=1, dp=1, cp=3, micro_batch_size=1, global_batch_size=64, stages=stages), site, job)
    assert e.value.field == "cp"
    with pytest.raises(SpecError) as e:  # a dense model has no experts
        place(Plan(tp=1, dp=2, ep=2, micro_batch_size=1, global_batch_size=64, stages=stages), site, job)
    assert e.value.field == "ep" and "dense" in str(e.value)
    moe = job_for_model(preset("Mixtral-8x7B"), 64)  # 8 experts, 32 layers
    pl = place(Plan(tp=2, dp=2, ep=4, etp=1, micro_batch_size=1, global_batch_size=64, stages=stages), site, moe)
    assert "ep" in pl.group_kinds() and "edp" in pl.group_kinds()
    assert [g.ranks for g in pl.process_groups() if g.kind == "ep"] == [(0, 1, 2, 3)]
    with pytest.raises(SpecError) as e:
        place(Plan(tp=1, dp=4, ep=3, micro_batch_size=1, global_batch_size=64, stages=stages), site, moe)
    assert e.value.field == "ep"


def test_plan_refuses_degrees_megatron_cannot_run():
    st = (Stage(partition="p", num_layers=4), Stage(partition="p", num_layers=2))
    ok = Plan(tp=2, dp=2, micro_batch_size=1, global_batch_size=8, stages=st, virtual_stages=2)
    assert ok.chunk_layers(0) == (2, 2) and ok.chunk_layers(1) == (1, 1)
    assert dataclasses_replace(ok, virtual_stages=1).world_size == 8
    # the last stage's last chunk may hold the loss alone, the first stage's first the embedding alone
    loss_only = dataclasses_replace(ok, virtual_stages=3)
    assert loss_only.chunk_layers(0) == (1, 1, 2) and loss_only.chunk_layers(1) == (1, 1, 0)
    edge = Plan(tp=1, dp=1, micro_batch_size=1, global_batch_size=8, virtual_stages=2,
                stages=tuple(Stage(partition="p", num_layers=n) for n in (1, 2, 2, 1)))
    assert edge.chunk_layers(0) == (0, 1) and edge.chunk_layers(3) == (1, 0)
    with pytest.raises(SpecError, match="stage 1 has 1 layers, fewer than its 2 model chunks"):
        dataclasses_replace(edge, stages=tuple(Stage(partition="p", num_layers=n) for n in (2, 1, 2, 1)))
    for kw, field, words in ((dict(virtual_stages=4), "virtual_stages", "fewer than its 4 model chunks"),
                             (dict(global_batch_size=6), "virtual_stages", "leave a last group of 1, fewer than pp = 2"),
                             (dict(stages=st[:1]), "virtual_stages", "at least 2 stages"),
                             (dict(virtual_stages=1, ep=8), "ep", "must divide the 4 ranks"),
                             (dict(virtual_stages=1, cp=0), "cp", "between 1")):
        with pytest.raises(SpecError, match=words) as e:
            dataclasses_replace(ok, **kw)
        assert e.value.field == field


def dataclasses_replace(plan, **kw):
    import dataclasses

    return dataclasses.replace(plan, **kw)


def test_a_tp_group_may_span_whole_nodes():
    """TP 8 on two 4-GPU nodes: one group over both nodes, every node full (Megatron runs it;
    its collectives then cross the inter-node link)."""
    site, job = load_site(CROSS), load_job(ROOT / "jobs" / "gpt3-2.7b.yaml")
    pl = place(_plan(("gpu_a100", 32, None), tp=8), site, job)
    (c,) = pl.components
    assert (c.nodes, c.tasks_per_node) == (2, 4)
    (tp_group,) = [g.ranks for g in pl.process_groups() if g.kind == "tp"]
    assert {pl.node_of(r) for r in tp_group} == {("gpu_a100", 0), ("gpu_a100", 1)}
    assert group_fits(site.partition("gpu_a100"), 1, tp=8, dp=1)
    assert not group_fits(site.partition("gpu_a100"), 1, tp=8, dp=2)  # 16 GPUs: the partition has 8
    assert not group_fits(site.partition("gpu_a100"), 1, tp=6, dp=1)  # neither inside a node nor whole nodes


def test_tp_over_nodes_is_searched_only_where_asked():
    """The default space keeps TP within a node; ``tp_degrees`` opts in to TP over whole nodes."""
    site, job = load_site(CROSS), load_job(ROOT / "jobs" / "gpt3-2.7b.yaml")
    default = PlanSpace(site, job)
    assert max(sk.tp for sk in default.skeletons) <= 8
    assert not any(site.partitions[i].name == "gpu_a100" and sk.tp == 8 for sk in default.skeletons for i, _ in sk.groups)
    asked = PlanSpace(site, job, SpaceOptions(tp_degrees=(8,), tp_across_nodes=True))
    wide = [sk for sk in asked.skeletons if any(site.partitions[i].name == "gpu_a100" for i, _ in sk.groups)]
    assert wide and all(sk.tp == 8 for sk in asked.skeletons)
    # without the option the same --tp 8 keeps to the 8-GPU partition
    narrow = PlanSpace(site, job, SpaceOptions(tp_degrees=(8,)))
    assert len(narrow) and all(site.partitions[i].name == "gpu_mi250x" for sk in narrow.skeletons for i, _ in sk.groups)
    asked16 = PlanSpace(site, job, SpaceOptions(tp_degrees=(16,), tp_across_nodes=True))
    assert len(asked16) == 0 and "the largest has 8" in asked16.why_empty()[1]  # whole nodes, but no partition has 16 GPUs


def test_a_first_or_last_stage_may_hold_only_the_embedding_or_the_output_layer():
    """Megatron's layout takes 'E|t*32L' and 'Et*16|t*16|L': a stage without layers at either
    end is placed, priced (its embedding or head alone) and rendered; anywhere else, or with a
    recompute setting, it is refused naming the stage."""
    from memx_hpc.model.api import AnalyticCostModel
    from memx_hpc.model.compose import predict_plan
    from memx_hpc.slurm.cmdline import pipeline_layout

    site, job = load_site(CROSS), load_job(ROOT / "jobs" / "gpt3-2.7b.yaml")  # 32 layers
    emb_only = _plan(("gpu_a100", 0, None), ("gpu_a100", 32, None), tp=2)
    head_only = _plan(("gpu_a100", 16, None), ("gpu_a100", 16, Recompute(mode="full")), ("gpu_mi250x", 0, None), tp=2)
    assert pipeline_layout(emb_only.stages) == "E|t*32L"
    assert pipeline_layout(head_only.stages) == "Et*16|t*16|L"
    pl = place(head_only, site, job)
    assert [c.stages for c in pl.components] == [(0,), (1,), (2,)]  # the two a100 stages recompute differently
    model = AnalyticCostModel(site)
    p = predict_plan(emb_only, site, job, model)
    first, rest = p.stages
    assert first.num_layers == 0 and 0 < first.forward_ms < rest.forward_ms / 32  # the embedding alone
    q = predict_plan(head_only, site, job, model)
    assert q.stages[2].num_layers == 0 and q.stages[2].state_bytes > 0  # the output layer's weights
    from memx_hpc.planfile import load_plan, save_plan
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        save_plan(head_only, Path(d) / "p.json")
        assert load_plan(Path(d) / "p.json").stages == head_only.stages  # a plan file keeps the empty stage
    with pytest.raises(SpecError) as e:
        _plan(("gpu_a100", 16, None), ("gpu_a100", 0, None), ("gpu_a100", 16, None))
    assert e.value.field == "stages[1].num_layers"
    with pytest.raises(SpecError) as e:
        _plan(("gpu_a100", 0, Recompute(mode="full")), ("gpu_a100", 32, None))
    assert e.value.field == "stages[0].recompute"
    with pytest.raises(SpecError):
        _plan(("gpu_a100", 0, None))
