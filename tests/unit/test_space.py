"""The plan space: every plan valid, nothing valid missed, deterministic indexing."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest
import yaml

from memx_hpc.errors import SpecError
from memx_hpc.placement import group_fits, place, tp_placeable
from memx_hpc.spec import ModelSpec, Partition, Site, job_for_model, load_job, load_site
from memx_hpc.search.space import PlanSpace, SpaceOptions, recompute_levels

ROOT = Path(__file__).resolve().parents[2]


def tiny_site(*, gpn=(2, 4), nodes=(1, 1)) -> Site:
    parts = tuple(Partition(name=f"p{i}", gpu_type=g, nodes=n, gpus_per_node=k)
                  for i, (g, n, k) in enumerate(zip(("A100-80", "V100-32"), nodes, gpn)))
    return Site(name="t", partitions=parts)


def tiny_job(layers=6, heads=4, gbs=8, **kw):
    m = ModelSpec(name="m", num_layers=layers, hidden_size=64 * heads, num_attention_heads=heads,
                  num_query_groups=heads, ffn_hidden_size=256 * heads, vocab_size=1000, seq_length=128)
    return job_for_model(m, gbs, **kw)


def all_plans(space):
    return [p for _, p in space.iter_range(0, len(space))]


def test_len_matches_enumeration_and_indices_are_contiguous():
    space = PlanSpace(tiny_site(), tiny_job(), SpaceOptions(layer_granularity=1, max_pipeline_stages=3))
    plans = list(space.iter_range(0, len(space)))
    assert len(plans) == len(space) > 100
    assert [i for i, _ in plans] == list(range(len(space)))
    # decoding any single index gives the plan the stream gave
    for i in (0, 1, len(space) // 3, len(space) - 1):
        assert space.plan_at(i) == plans[i][1]
    with pytest.raises(IndexError):
        space.plan_at(len(space))


def test_every_plan_is_runnable():
    site, job = tiny_site(), tiny_job()
    space = PlanSpace(site, job, SpaceOptions(layer_granularity=1, max_pipeline_stages=3))
    for p in all_plans(space):
        assert job.model.num_attention_heads % p.tp == 0 and job.model.num_query_groups % p.tp == 0
        assert job.global_batch_size % (p.micro_batch_size * p.dp) == 0
        assert p.num_layers == job.model.num_layers and all(s.num_layers >= 1 for s in p.stages)
        assert 1 <= p.pp <= 3
        used: dict[str, int] = {}
        for s in p.stages:
            part = site.partition(s.partition)
            assert tp_placeable(part, p.tp, across_nodes=False)
            used[s.partition] = used.get(s.partition, 0) + p.tp * p.dp
        for name, n in used.items():
            assert n <= site.partition(name).total_gpus
        # a partition's stages are consecutive (one hetjob component per group)
        names = [g for g, _ in p.component_groups()]
        assert len(names) == len(set(names))
        for s in p.stages:
            if s.recompute.mode == "full" and s.recompute.num_layers is not None:
                assert 0 < s.recompute.num_layers < s.num_layers


def _fits_whole_nodes(part, ranks, tp, across=False):
    """The hetjob rule, stated on its own: ceil(ranks / gpn) nodes, the same tasks on each,
    no TP group across a node (``across``: or TP groups of whole nodes), at most the
    partition's nodes."""
    gpn = part.gpus_per_node
    nodes = -(-ranks // gpn)
    if across and tp > gpn:
        return tp % gpn == 0 and ranks % gpn == 0 and ranks // gpn <= part.nodes
    return tp <= gpn and ranks % nodes == 0 and (ranks // nodes) % tp == 0 and nodes <= part.nodes


@pytest.mark.parametrize("across", [False, True])
def test_skeletons_are_exactly_the_valid_ones(across):
    """Brute force over every (tp, mbs, dp, ordered partitions, stage counts) combination."""
    site, job = tiny_site(gpn=(2, 4), nodes=(2, 1)), tiny_job(gbs=8)
    space = PlanSpace(site, job, SpaceOptions(layer_granularity=1, max_pipeline_stages=4, tp_across_nodes=across))
    got = {(s.tp, s.dp, s.micro_batch_size, s.groups) for s in space.skeletons}
    want = set()
    parts = site.partitions
    for tp, mbs, dp in itertools.product((1, 2, 4, 8), (1, 2, 4, 8), range(1, 9)):
        if job.model.num_attention_heads % tp or job.global_batch_size % (mbs * dp):
            continue
        for g in range(1, 3):
            for seq in itertools.permutations(range(len(parts)), g):
                for counts in itertools.product(range(1, 5), repeat=g):
                    if sum(counts) > 4:
                        continue
                    ok = all(_fits_whole_nodes(parts[i], c * tp * dp, tp, across) for i, c in zip(seq, counts))
                    if ok and sum(counts) <= job.model.num_layers:
                        want.add((tp, dp, mbs, tuple(zip(seq, counts))))
    assert got == want
    # across nodes, TP 4 runs on the 2-GPU partition too (two whole nodes); not by default
    assert any(sk.tp == 4 and site.partitions[sk.groups[0][0]].gpus_per_node == 2 for sk in space.skeletons) == across


@pytest.mark.parametrize("across", [False, True])
def test_six_gpus_a_node_take_tp_4_where_placement_does(across):
    """6 GPUs a node hold one TP 4 group a node (4 <= 6, 4 tasks on it): the space searches
    exactly the groups the one rule of :mod:`memx_hpc.placement` places, and places every plan
    it enumerates (it once asked for GPUs per node a multiple of TP and left TP 4 out)."""
    site, job = tiny_site(gpn=(6, 4), nodes=(2, 1)), tiny_job(gbs=8)
    six = site.partitions[0]
    space = PlanSpace(site, job, SpaceOptions(layer_granularity=1, max_pipeline_stages=3, tp_across_nodes=across))
    assert any(sk.tp == 4 and p == 0 for sk in space.skeletons for p, _ in sk.groups)
    for tp, dp in itertools.product((1, 2, 4), (1, 2, 4, 8)):
        want = [s for s in range(1, 4) if group_fits(six, s, tp=tp, dp=dp)]
        assert space.room(tp, dp).get(0, []) == want, (tp, dp)
    assert space.room(4, 1)[0] == [1, 2] and space.room(4, 2)[0] == [1]  # 12 ranks would split a TP group
    for i in range(0, len(space), max(1, len(space) // 200)):
        plan = space.plan_at(i)
        place(plan, site, job)  # raises where the space and placement disagree
    one = Site(name="six", partitions=(six,))
    assert len(PlanSpace(one, job, SpaceOptions(layer_granularity=1, tp_degrees=(4,))))
    field, why = PlanSpace(one, tiny_job(heads=8, gbs=8), SpaceOptions(layer_granularity=1, tp_degrees=(8,))).why_empty()
    assert field == "--tp" and "TP 8 exceeds every partition's GPUs per node (6)" in why


def test_layer_splits_follow_the_grid():
    job = tiny_job(layers=10)
    space = PlanSpace(tiny_site(), job, SpaceOptions(layer_granularity=4, max_pipeline_stages=3))
    seen_totals = set()
    for p in all_plans(space):
        groups = p.component_groups()
        totals = [sum(p.stages[i].num_layers for i in idx) for _, idx in groups]
        # every group's total is a multiple of 4, the last also takes 10 % 4 = 2
        assert all(t % 4 == 0 for t in totals[:-1]) and (totals[-1] - 2) % 4 == 0
        for _, idx in groups:  # inside a group: as even as possible, remainder to later stages
            ns = [p.stages[i].num_layers for i in idx]
            assert max(ns) - min(ns) <= 1 and ns == sorted(ns)
        seen_totals.add(tuple(totals))
    assert (4, 6) in seen_totals and (8, 2) in seen_totals and (10,) in seen_totals


def test_split_within_groups_enumerates_stage_compositions():
    job = tiny_job(layers=6)
    opts = SpaceOptions(layer_granularity=1, max_pipeline_stages=3, split_within_groups=True,
                        tp_degrees=(1,), micro_batch_sizes=(1,))
    site = Site(name="one", partitions=(Partition(name="p", gpu_type="A100-80", nodes=1, gpus_per_node=4),))
    space = PlanSpace(site, job, opts)
    splits = {tuple(s.num_layers for s in p.stages) for p in all_plans(space) if p.pp == 3 and p.dp == 1}
    assert splits == {c for c in itertools.product(range(1, 5), repeat=3) if sum(c) == 6}


def test_heterogeneous_recompute_levels():
    job = tiny_job(recompute_modes=("none", "selective", "full"), attention="core")
    levels = recompute_levels(job, 2)
    assert [lv.label() for lv in levels] == ["none", "selective", "full:0.5", "full"]
    # fused attention: selective saves only the softmax statistics, so it is left out by default
    assert [lv.label() for lv in recompute_levels(dataclasses.replace(job, attention="sdpa"), 2)] == \
        ["none", "full:0.5", "full"]
    assert len(recompute_levels(dataclasses.replace(job, attention="sdpa"), 2, selective_with_sdpa=True)) == 4
    assert [lv.label() for lv in recompute_levels(dataclasses.replace(job, recompute_modes=("full",)), 1)] == ["full"]

    site = tiny_site()
    for spread in (0, 1, None):
        space = PlanSpace(site, job, SpaceOptions(layer_granularity=1, max_pipeline_stages=3, recompute_spread=spread))
        mixed = False
        for p in all_plans(space):
            for _, idx in p.component_groups():
                lv = [_level(p.stages[i]) for i in idx]
                assert lv == sorted(lv, reverse=True)  # non-increasing along the pipeline
                if spread is not None:
                    assert lv[0] - lv[-1] <= spread
            if len({p.stages[i].recompute.mode for i in range(p.pp)}) > 1:
                mixed = True
        assert mixed  # stages of one plan do recompute differently


def _level(stage) -> int:
    """none 0, selective 1, full (on any k) 2. The full:0.5 level of a 1-layer stage is a
    full recompute of its one layer, so the two full levels are not told apart here."""
    return {"none": 0, "selective": 1}.get(stage.recompute.mode, 2)


def test_full_k_layers_follow_fraction():
    job = tiny_job(layers=7)
    space = PlanSpace(tiny_site(), job, SpaceOptions(layer_granularity=1, max_pipeline_stages=2,
                                                     full_recompute_steps=2))
    ks = {(s.num_layers, s.recompute.num_layers) for p in all_plans(space) for s in p.stages
          if s.recompute.mode == "full"}
    assert (5, 3) in ks and (5, None) in ks and (4, 2) in ks  # ceil(5/2) = 3, ceil(4/2) = 2


def test_full_recompute_k_is_shared_by_a_partition_group():
    """One --recompute-num-layers per hetjob component: k from the group's largest stage."""
    job = tiny_job(layers=9)
    site = Site(name="one", partitions=(Partition(name="p", gpu_type="A100-80", nodes=1, gpus_per_node=4),))
    space = PlanSpace(site, job, SpaceOptions(layer_granularity=1, max_pipeline_stages=2, tp_degrees=(1,),
                                              micro_batch_sizes=(1,)))
    seen = set()
    for p in all_plans(space):
        if p.pp == 2 and p.stages[0].recompute.mode == "full":
            ks = [s.recompute.num_layers or s.num_layers for s in p.stages]
            seen.add((tuple(s.num_layers for s in p.stages), tuple(ks)))
    # 9 layers over two stages of one partition: 4 + 5; k = ceil(5/2) = 3 on both, or all
    assert seen == {((4, 5), (3, 3)), ((4, 5), (4, 5))}


def test_rank_ranges_partition_the_space():
    space = PlanSpace(tiny_site(), tiny_job(), SpaceOptions(layer_granularity=1))
    n = len(space)
    for size in (1, 2, 3, 7):
        ranges = [space.rank_range(r, size) for r in range(size)]
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        assert max(b - a for a, b in ranges) - min(b - a for a, b in ranges) <= 1


def test_blocks_decode_the_same_plans_whatever_their_size():
    space = PlanSpace(tiny_site(), tiny_job(), SpaceOptions(layer_granularity=1))
    a = list(space.iter_blocks(0, len(space), block_size=7))
    b = list(space.iter_blocks(0, len(space), block_size=100000))
    import numpy as np
    assert np.array_equal(np.concatenate([x.layers for x in a]), b[0].layers)
    assert np.array_equal(np.concatenate([x.levels for x in a]), b[0].levels)
    assert np.array_equal(np.concatenate([x.skeleton for x in a]), b[0].skeleton)


def test_deterministic_across_constructions():
    s1 = PlanSpace(tiny_site(), tiny_job(), SpaceOptions(layer_granularity=2))
    s2 = PlanSpace(tiny_site(), tiny_job(), SpaceOptions(layer_granularity=2))
    assert len(s1) == len(s2) and all(s1.plan_at(i) == s2.plan_at(i) for i in range(0, len(s1), 17))


def test_prunes_tp_that_does_not_divide_heads_or_groups():
    m = ModelSpec(name="gqa", num_layers=4, hidden_size=384, num_attention_heads=6, num_query_groups=2,
                  ffn_hidden_size=1536, vocab_size=1000, seq_length=64)
    space = PlanSpace(tiny_site(gpn=(8, 8)), job_for_model(m, 4), SpaceOptions(layer_granularity=1))
    assert space.tp_candidates() == [1, 2]


def test_bad_options_are_spec_errors():
    with pytest.raises(SpecError, match="layer_granularity"):
        SpaceOptions(layer_granularity=0)
    with pytest.raises(SpecError, match="recompute_spread"):
        SpaceOptions(recompute_spread=-1)
    with pytest.raises(SpecError, match="layer_granularity"):
        PlanSpace(tiny_site(), tiny_job(layers=4), SpaceOptions(layer_granularity=5))


def test_example_site_space_sizes():
    """The 20-GPU example site: MemX searched 31,240 plans. With an 8-layer grid ours is of
    that size (a little over 100,000 now that cross-vendor layouts interleave virtual stages too);
    the default 4-layer grid (better plans) is a few hundred thousand."""
    site = load_site(ROOT / "site_configs" / "example-cross-vendor.yaml")
    for job_file in ("gpt3-2.7b.yaml", "llama2-7b.yaml"):
        job = load_job(ROOT / "jobs" / job_file)
        coarse = PlanSpace(site, job, SpaceOptions(layer_granularity=8))
        default = PlanSpace(site, job)
        assert 10_000 <= len(coarse) < 200_000
        assert 100_000 <= len(default) < 1_000_000


@pytest.mark.parametrize("opts", [SpaceOptions(), SpaceOptions(layer_granularity=2, max_pipeline_stages=6),
                                  SpaceOptions(split_within_groups=True), SpaceOptions(max_partitions=1),
                                  SpaceOptions(recompute_spread=None, full_recompute_steps=3)])
def test_size_is_counted_exactly_before_the_space_is_built(opts):
    from memx_hpc.search.space import space_size
    site, job = load_site(ROOT / "site_configs/example-cross-vendor.yaml"), load_job(ROOT / "jobs/gpt3-2.7b.yaml")
    space = PlanSpace(site, job, opts)
    size = space_size(space)
    assert (size.plans, size.skeletons, size.exceeded) == (len(space), len(space.skeletons), False)


def test_a_space_beyond_the_limit_is_refused_with_the_options_that_shrink_it():
    from memx_hpc.spec import site_from_mapping
    site = site_from_mapping({"name": "wide", "partitions": [
        {"name": f"p{i}", "gpu_type": "A100-80", "nodes": 2, "gpus_per_node": 4} for i in range(30)]})
    job = load_job(ROOT / "jobs/gpt3-2.7b.yaml")
    with pytest.raises(SpecError) as e:
        PlanSpace(site, job)  # 30 partitions: billions of plans; refused in milliseconds
    for option in ("--layer-granularity", "--max-stages", "--tp", "--micro-batch-sizes", "fewer partitions"):
        assert option in str(e.value)
    assert e.value.field == "search space"
    small = PlanSpace(site, job, SpaceOptions(max_partitions=1, max_pipeline_stages=2, tp_degrees=(4,)))
    assert 0 < len(small) <= SpaceOptions().max_plans


def test_sequence_parallel_is_searched_wherever_tp_is_above_one():
    site, job = tiny_site(), tiny_job()
    opts = dict(layer_granularity=1, max_pipeline_stages=3)
    searched = PlanSpace(site, job, SpaceOptions(**opts))
    off = PlanSpace(site, job, SpaceOptions(sequence_parallel=False, **opts))
    on = PlanSpace(site, job, SpaceOptions(sequence_parallel=True, **opts))
    layouts = lambda sp: {(s.tp, s.dp, s.micro_batch_size, s.groups) for s in searched.skeletons  # noqa: E731
                          if s.sequence_parallel == sp}
    assert layouts(True) == {(s.tp, s.dp, s.micro_batch_size, s.groups) for s in off.skeletons if s.tp > 1}
    assert layouts(False) == {(s.tp, s.dp, s.micro_batch_size, s.groups) for s in off.skeletons}
    assert not any(s.sequence_parallel for s in off.skeletons)
    assert all(s.sequence_parallel == (s.tp > 1) for s in on.skeletons)
    tp1 = sum(searched._count(s) for s in off.skeletons if s.tp == 1)
    assert len(searched) == 2 * len(off) - tp1 and len(on) == len(off)
    plans = all_plans(searched)
    assert {p.sequence_parallel for p in plans if p.tp > 1} == {False, True}
    assert not any(p.sequence_parallel for p in plans if p.tp == 1)
    from memx_hpc.search.space import space_size
    assert space_size(searched).plans == len(searched)
    with pytest.raises(SpecError):
        SpaceOptions(sequence_parallel="yes")


# --------------------------------------------------------------------------- virtual, context, expert parallel


def _long_site():
    from memx_hpc.spec import site_from_mapping
    return site_from_mapping({"name": "mixed", "partitions": [
        {"name": "h100", "gpu_type": "H100-SXM", "nodes": 2, "gpus_per_node": 4},
        {"name": "mi250", "gpu_type": "MI250X-GCD", "nodes": 1, "gpus_per_node": 8},
        {"name": "a100", "gpu_type": "A100-80", "nodes": 1, "gpus_per_node": 4}],
        "pipeline_comm": {"backend": "ucc"}})


@pytest.mark.parametrize("model,extra", [
    ({"preset": "Llama-2-7B", "seq_length": 16384, "num_layers": 8}, {}),
    ({"preset": "Mixtral-8x7B", "seq_length": 8192, "num_layers": 8}, {}),
    ({"preset": "Llama-2-7B", "seq_length": 16384, "num_layers": 8},
     {"virtual_stages": [1, 2], "context_parallel_sizes": [1, 2, 4]}),
])
def test_the_new_dimensions_are_enumerated_and_counted_exactly(model, extra):
    from memx_hpc.search.space import space_size
    from memx_hpc.spec import job_from_mapping
    site = _long_site()
    job = job_from_mapping({"model": model, "global_batch_size": 16, "micro_batch_sizes": [1], **extra})
    for opts in (SpaceOptions(layer_granularity=2, max_pipeline_stages=4),
                 SpaceOptions(layer_granularity=1, max_pipeline_stages=3, split_within_groups=True),
                 SpaceOptions(layer_granularity=2, single_vendor=True)):
        space = PlanSpace(site, job, opts)
        size = space_size(space)
        assert (size.plans, size.skeletons) == (len(space), len(space.skeletons))
    space = PlanSpace(site, job, SpaceOptions(layer_granularity=2, max_pipeline_stages=4))
    vendor = {p.name: space._vendor[i] for i, p in enumerate(site.partitions)}
    seen = set()
    for sk in space.skeletons:
        parts = [site.partitions[p].name for p, _ in sk.groups]
        cross = len({vendor[n] for n in parts}) > 1
        seen.add((sk.vp > 1, sk.cp > 1, sk.ep > 1, cross))
        if cross:  # the project's entry: the degrees it builds (memx_hpc.slurm.cmdline.PROJECT_ENTRY_DEGREES)
            from memx_hpc.slurm.cmdline import cross_vendor_refusal
            assert cross_vendor_refusal("virtual_stages", sk.vp) is None and cross_vendor_refusal("cp", sk.cp) is None
        if sk.cp > 1:  # ring attention needs Transformer Engine: the NVIDIA partitions here
            assert set(parts) <= {"h100", "a100"}
        if sk.vp > 1:
            m = job.global_batch_size // (sk.micro_batch_size * sk.dp)
            assert sk.pp >= 2 and m % sk.pp == 0
        if sk.ep > 1:
            assert job.model.num_experts % sk.ep == 0 and (sk.tp * sk.cp * sk.dp) % ((sk.etp or sk.tp) * sk.ep) == 0
    assert (True, False, False, False) in seen and (False, True, False, False) in seen
    assert any(e for _, _, e, _ in seen) == job.model.is_moe
    if extra:
        assert {sk.vp for sk in space.skeletons} == {1, 2} and {sk.cp for sk in space.skeletons} <= {1, 2, 4}
    plans = [space.plan_at(i) for i in range(0, len(space), max(1, len(space) // 400))]
    for plan in plans:  # every plan decodes to one Megatron-LM runs (the Plan checks itself)
        assert plan.world_size <= site.total_gpus
        if plan.virtual_stages > 1:
            assert all(s.recompute.num_layers is None for s in plan.stages)


def test_context_parallel_is_left_out_for_short_sequences():
    from memx_hpc.spec import job_from_mapping
    short = job_from_mapping({"model": {"preset": "Llama-2-7B", "seq_length": 4096}, "global_batch_size": 16})
    assert PlanSpace(_long_site(), short, SpaceOptions(layer_granularity=8, max_pipeline_stages=2)).cp_candidates() == [1]
    long = job_from_mapping({"model": {"preset": "Llama-2-7B", "seq_length": 32768}, "global_batch_size": 16})
    assert PlanSpace(_long_site(), long, SpaceOptions(layer_granularity=8, max_pipeline_stages=2)).cp_candidates() \
        == [1, 2, 4, 8]


def test_the_new_dimensions_count_toward_the_refusal_of_an_over_large_space():
    from memx_hpc.search.space import space_size
    from memx_hpc.spec import job_from_mapping
    site = _long_site()
    doc = {"model": {"preset": "Mixtral-8x7B", "seq_length": 32768, "num_layers": 16}, "global_batch_size": 64,
           "micro_batch_sizes": [1]}
    opts = dict(layer_granularity=2, max_pipeline_stages=4)
    narrow = PlanSpace(site, job_from_mapping({**doc, "virtual_stages": [1], "context_parallel_sizes": [1],
                                               "expert_parallel_sizes": [1]}), SpaceOptions(**opts))
    wide = job_from_mapping(doc)
    n = space_size(PlanSpace(site, wide, SpaceOptions(**opts, max_plans=10**12))).plans
    assert n > 1.5 * len(narrow)  # VP, CP and EP multiply the space (2.0x here)
    with pytest.raises(SpecError) as e:
        PlanSpace(site, wide, SpaceOptions(**opts, max_plans=(n + len(narrow)) // 2))
    for words in ("virtual_stages (now 1,2,4)", "context_parallel_sizes (now 1,2,4,8)", "expert_parallel_sizes"):
        assert words in str(e.value)
    PlanSpace(site, wide, SpaceOptions(**opts, max_plans=n))  # exactly its size: searched


def test_distributed_optimizer_both_searches_each_layout_with_and_without_it():
    from memx_hpc.model.compose import predict_plan
    from memx_hpc.model.api import AnalyticCostModel
    from memx_hpc.search.space import space_size
    from memx_hpc.slurm.render import describe
    from memx_hpc.spec import job_from_mapping
    site = load_site(ROOT / "site_configs" / "example-cross-vendor.yaml")
    doc = yaml.safe_load((ROOT / "jobs" / "gpt3-2.7b.yaml").read_text())
    opts = SpaceOptions(layer_granularity=8, max_pipeline_stages=2)
    one = PlanSpace(site, job_from_mapping(doc), opts)
    both = PlanSpace(site, job_from_mapping({**doc, "distributed_optimizer": "both"}), opts)
    assert space_size(both).plans == len(both) > len(one)
    choices = {(sk.distributed_optimizer, sk.dp * sk.cp > 1) for sk in both.skeletons}
    assert choices == {(True, True), (False, True), (None, False)}
    plans = [both.plan_at(i) for i in range(len(both))]
    on = next(p for p in plans if p.distributed_optimizer is True and p.cp == 1 and p.dp >= 2)
    # without the distributed optimizer there is no parameter gather to overlap (Megatron refuses it)
    off = dataclasses.replace(on, distributed_optimizer=False, overlap_param_gather=False)
    model = AnalyticCostModel(site)
    p_on, p_off = (predict_plan(p, site, both.job, model) for p in (on, off))
    assert p_on.stages[0].state_bytes < p_off.stages[0].state_bytes  # states sharded over DP
    argv_on, argv_off = (describe(p, site, both.job).megatron_argv[0] for p in (on, off))
    assert "--use-distributed-optimizer" in argv_on and "--use-distributed-optimizer" not in argv_off
    with pytest.raises(SpecError) as e:
        job_from_mapping({**doc, "distributed_optimizer": "sometimes"})
    assert e.value.field == "distributed_optimizer"


@pytest.mark.parametrize("extra,attr,wanted", [({"virtual_stages": [2]}, "vp", {2}),
                                               ({"context_parallel_sizes": [2]}, "cp", {2}),
                                               ({"virtual_stages": [2, 4]}, "vp", {2, 4})])
def test_a_narrowing_that_leaves_out_1_is_honoured_by_every_plan_or_refused_by_name(extra, attr, wanted):
    """A job's virtual_stages / context_parallel_sizes without 1: every layout takes one of the
    listed degrees (single-stage and cross-vendor layouts that cannot are left out, not given 1),
    the count agrees, and a space that holds none says which field and why."""
    from memx_hpc.search.space import space_size
    from memx_hpc.slurm.cmdline import cross_vendor_refusal
    from memx_hpc.spec import job_from_mapping
    site = _long_site()
    job = job_from_mapping({"model": {"preset": "Llama-2-7B", "seq_length": 16384, "num_layers": 8},
                            "global_batch_size": 16, "micro_batch_sizes": [1], **extra})
    for opts in (SpaceOptions(layer_granularity=2, max_pipeline_stages=4),
                 SpaceOptions(layer_granularity=2, max_pipeline_stages=3, single_vendor=True)):
        space = PlanSpace(site, job, opts)
        size = space_size(space)
        assert (size.plans, size.skeletons) == (len(space), len(space.skeletons)) and len(space)
        assert {getattr(sk, attr) for sk in space.skeletons} == wanted
        vendor = {p.name: space._vendor[i] for i, p in enumerate(site.partitions)}
        crossing = [sk for sk in space.skeletons
                    if len({vendor[site.partitions[p].name] for p, _ in sk.groups}) > 1]
        field = "virtual_stages" if attr == "vp" else "cp"
        if cross_vendor_refusal(field, 2) is not None or opts.single_vendor:
            assert not crossing
        elif attr == "vp":  # (CP also needs Transformer Engine on both vendors: not this site's AMD)
            assert crossing
    # one stage cannot interleave: nothing left, refused by the field's name
    if attr == "vp":
        empty = PlanSpace(site, job, SpaceOptions(layer_granularity=2, max_pipeline_stages=1))
        assert len(empty) == 0
        field, why = empty.why_empty()
        assert field == "virtual_stages" and "leave out 1" in why


def test_fp8_leaves_cross_vendor_plans_out_and_the_notes_say_why():
    """FP8 runs through Transformer Engine in Megatron-LM's pretrain_gpt.py; cross-vendor plans run
    the project's entry, which has none: an FP8 job's space holds single-vendor plans only, counted
    exactly, and the search's notes say so (as they say when a narrowing leaves out 1)."""
    from memx_hpc.search.report import space_notes
    from memx_hpc.search.space import space_size
    from memx_hpc.spec import job_from_mapping
    site = load_site(ROOT / "site_configs" / "example-h100-mi300x.yaml")
    base = {"model": {"preset": "Llama-2-7B", "num_layers": 8}, "global_batch_size": 16, "micro_batch_sizes": [1]}
    plain = PlanSpace(site, job_from_mapping(base), SpaceOptions(layer_granularity=2))
    fp8 = PlanSpace(site, job_from_mapping({**base, "fp8": "hybrid"}), SpaceOptions(layer_granularity=2))
    vendors = {p.name: plain._vendor[i] for i, p in enumerate(site.partitions)}

    def crossing(space):
        return [sk for sk in space.skeletons if len({vendors[site.partitions[p].name] for p, _ in sk.groups}) > 1]

    assert crossing(plain) and not crossing(fp8) and len(fp8)
    size = space_size(fp8)
    assert (size.plans, size.skeletons) == (len(fp8), len(fp8.skeletons))
    assert space_notes(plain) == []
    assert any("FP8" in n and "cross-vendor plans left out" in n for n in space_notes(fp8))
    narrowed = PlanSpace(site, job_from_mapping({**base, "virtual_stages": [2]}), SpaceOptions(layer_granularity=2))
    assert any(n.startswith("the job's virtual_stages [2] leave out 1") for n in space_notes(narrowed))
