"""Link curves: Sailor's published formula, physical bounds, and the order measured > imported (where the
site says it is that cluster) > site figure > generic figure."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from memx_hpc.datapaths import shared_data
from memx_hpc.errors import SpecError
from memx_hpc.model.compose import predict_plan
from memx_hpc.model.links import (SITE_LATENCY_US, CommCurve, LinkModel, import_sailor_network, link_notes,
                                  ring_allreduce_ms)
from memx_hpc.spec import (GENERIC_INTER_NODE_GBPS, ModelSpec, Partition, Plan, Site, Stage, job_for_model,
                           site_from_mapping)

SAILOR = shared_data(required=False)


def site2(claim: str | None = "sailor", **kw) -> Site:
    """GH200 and A100 partitions; ``claim``: the cluster both say their nodes are (link_curves_from)."""
    return Site(name="s", partitions=(Partition(name="g", gpu_type="GH200", nodes=4, gpus_per_node=4,
                                                inter_node_gbps=25.0, link_curves_from=claim),
                                      Partition(name="a", gpu_type="A100-40", nodes=2, gpus_per_node=4,
                                                inter_node_gbps=25.0, link_curves_from=claim)), **kw)


def imp(gpu: str, gbps: float, source: str = "Sailor (test) imp", **kw) -> CommCurve:
    return CommCurve(kind="p2p", scope=kw.pop("scope", "inter"), gpu_types=(gpu,), provenance="imported",
                     source=source, form="alpha-beta", gbps=gbps, **kw)


def measured(scope: str, parts: tuple[str, ...], ms_per_mb: float, kind: str = "p2p", group: int = 2) -> CommCurve:
    sizes = (2**20, 2**24, 2**28)
    return CommCurve(kind=kind, scope=scope, gpu_types=("GH200",), partitions=parts, provenance="measured",
                     source="test", form="points", group_size=group, sizes_bytes=sizes,
                     times_ms=tuple(0.01 + s / 2**20 * ms_per_mb for s in sizes))


@pytest.mark.skipif(SAILOR is None or not (SAILOR / "sailor").is_dir(), reason="shared data absent")
def test_sailor_curves_follow_sailors_formula_inside_the_fitted_range():
    curves = import_sailor_network(SAILOR / "sailor")
    raw = json.loads((SAILOR / "sailor" / "network_coeffs_all_homo.json").read_text())
    coeffs, max_bps = raw["inter"]["GH-96"]["1"]
    c = next(c for c in curves if c.scope == "inter" and c.gpu_types == ("GH200",) and c.streams == 1)
    for x in (4e6, 32e6, 64e6):  # below the parabola's vertex and the measured maximum
        bw = float(np.polyval(coeffs, math.log2(x / 1e6)))
        assert bw * 1e9 < max_bps
        assert c.time_ms(x) == pytest.approx((x / 1e9) / bw * 1e3, rel=1e-9)
    # held physical outside it: never faster per byte than the largest measured bandwidth,
    # time grows with size, no negative bandwidths at small sizes
    xs = np.geomspace(1e3, 1e10, 60)
    ts = np.array([c.time_ms(x) for x in xs])
    assert np.all(np.diff(ts) > 0) and np.all(ts > 0)
    assert all(x / (t * 1e-3) <= max_bps * (1 + 1e-9) for x, t in zip(xs, ts))
    # intra keys count GPUs of the node (pairs = k / 2); inter keys count sending GPUs
    intra4 = next(c for c in curves if c.scope == "intra" and c.gpu_types == ("GH200",) and "[4]" in c.source)
    assert intra4.streams == 2
    assert {c.streams for c in curves if c.scope == "inter" and c.gpu_types == ("RTX-3090",)} == {1, 2, 4, 8}


def test_ring_allreduce_from_p2p():
    assert ring_allreduce_ms(lambda x: x / 1e6, 8e6, 4) == pytest.approx(2 * 3 * 2.0)
    assert ring_allreduce_ms(lambda x: 1.0, 8e6, 1) == 0.0


def test_measured_before_imported_before_site_figure():
    site = site2()
    imported = imp("GH200", 5.0)
    plain = LinkModel(site)
    c = plain.p2p(1e8, "g", "g")
    assert c.provenance == "site-figure" and "inter_node_gbytes_per_s" in c.source
    assert c.ms == pytest.approx(SITE_LATENCY_US["inter"] * 1e-3 + 1e8 / 25e6)
    got = LinkModel(site, [imported]).p2p(1e8, "g", "g")
    assert got.provenance == "imported" and got.ms == pytest.approx(1e8 / 5e6)
    both = LinkModel(site, [imported, measured("inter", ("g",), 0.5)]).p2p(2**24, "g", "g")
    assert both.provenance == "measured" and both.ms == pytest.approx(0.01 + 16 * 0.5)
    # intra-node and the other partition are untouched by an inter curve of g; inside a
    # node the site file states nothing: the GPU type's datasheet link, labelled generic
    intra = LinkModel(site, [imported]).p2p(1e8, "g", "g", same_node=True)
    assert intra.provenance == "generic" and "datasheet" in intra.source
    assert LinkModel(site, [imported]).p2p(1e8, "a", "a").provenance == "site-figure"


def test_another_clusters_curves_only_where_the_site_says_it_is_that_cluster():
    imported = imp("GH200", 5.0)
    own = site2(claim=None)
    c = LinkModel(own, [imported]).p2p(1e8, "g", "g")
    assert c.provenance == "site-figure" and c.ms == pytest.approx(SITE_LATENCY_US["inter"] * 1e-3 + 1e8 / 25e6)
    notes = link_notes(LinkModel(own, [imported]))
    assert any("sailor's imported network curves for g (GH200) not used" in n for n in notes), notes
    assert not any("not used" in n for n in link_notes(LinkModel(site2(), [imported])))
    # a curve of another cluster than the one the site names is not used either
    other = imp("GH200", 5.0, source="Elsewhere lab curves")
    assert LinkModel(site2(), [other]).p2p(1e8, "g", "g").provenance == "site-figure"
    # no figure in the site file: the generic one, labelled so
    bare = Site(name="b", partitions=(Partition(name="g", gpu_type="GH200", nodes=2, gpus_per_node=4),))
    g = LinkModel(bare).p2p(1e8, "g", "g")
    assert g.provenance == "generic" and "HDR" in g.source
    assert g.ms == pytest.approx(SITE_LATENCY_US["inter"] * 1e-3 + 1e8 / (GENERIC_INTER_NODE_GBPS * 1e6))
    assert any(n.startswith("links from a generic figure") for n in link_notes(LinkModel(bare)))


def test_a_named_fabric_gives_the_generic_figure_of_that_fabric():
    """fabric: its adapters' line rate / 8 per GPU (one adapter per GPU unless nics_per_node
    says fewer), labelled generic and named; a stated inter_node_gbytes_per_s still wins."""
    doc = {"name": "s", "partitions": [
        {"name": "ndr", "gpu_type": "H100-SXM", "nodes": 4, "gpus_per_node": 8, "fabric": "ib-ndr"},
        {"name": "one", "gpu_type": "H100-SXM", "nodes": 4, "gpus_per_node": 8, "fabric": "ib-ndr",
         "nics_per_node": 2},
        {"name": "own", "gpu_type": "H100-SXM", "nodes": 4, "gpus_per_node": 8, "fabric": "ib-hdr",
         "inter_node_gbytes_per_s": 40}]}
    site = site_from_mapping(doc)
    gbps, prov, what = site.inter_figure("ndr")
    assert gbps == pytest.approx(50.0) and prov == "generic" and "ib-ndr" in what and "400 Gb/s" in what
    gbps, prov, what = site.inter_figure("one")
    assert gbps == pytest.approx(12.5) and "2 adapter(s) shared by 8 GPUs" in what
    assert site.inter_figure("own")[:2] == (40.0, "site-figure")
    p2p = LinkModel(site).p2p(1e8, "ndr", "ndr")
    assert p2p.provenance == "generic" and "ib-ndr" in p2p.source
    slow = LinkModel(site).p2p(1e8, "one", "one")
    assert slow.ms > 3 * p2p.ms
    for bad, field in (({"fabric": "infiniband"}, "fabric"), ({"nics_per_node": 2}, "nics_per_node")):
        d = {"name": "s", "partitions": [{"name": "g", "gpu_type": "H100-SXM", "nodes": 1, "gpus_per_node": 8, **bad}]}
        with pytest.raises(SpecError) as e:
            site_from_mapping(d)
        assert e.value.field.endswith(field) and "ib-ndr" in str(e.value)


def test_link_curves_from_is_validated():
    with pytest.raises(SpecError) as e:
        Partition(name="g", gpu_type="GH200", nodes=1, gpus_per_node=4, link_curves_from="clariden")
    assert e.value.field == "link_curves_from" and "sailor" in str(e.value)
    doc = {"name": "s", "partitions": [{"name": "g", "gpu_type": "GH200", "nodes": 1, "gpus_per_node": 4,
                                        "link_curves_from": "sailor"}]}
    assert site_from_mapping(doc).partitions[0].link_curves_from == "sailor"


@pytest.mark.skipif(SAILOR is None or not (SAILOR / "sailor").is_dir(), reason="shared data absent")
def test_a_store_without_the_named_clusters_curves_is_refused(tmp_path):
    from memx_hpc.model.links import load_links
    from memx_hpc.profile.comm import import_sailor_comm, write_comm_curves
    store = tmp_path / "s.h5"
    write_comm_curves(store, import_sailor_comm(SAILOR / "sailor"))
    site = Site(name="s", partitions=(Partition(name="a", gpu_type="A100-40", nodes=2, gpus_per_node=4,
                                                inter_node_gbps=25.0),
                                      Partition(name="h", gpu_type="H100-NVL", nodes=1, gpus_per_node=4,
                                                link_curves_from="sailor")))
    with pytest.raises(SpecError) as e:
        load_links(site, store)
    assert e.value.field == "partitions[1].link_curves_from" and "H100-NVL" in str(e.value)
    # the case: the site's 25 GB/s stands for A100 between nodes, not Sailor's curve
    ok = dataclasses.replace(site, partitions=site.partitions[:1])
    lm = load_links(ok, store)
    assert lm.p2p(64 * 2**20, "a", "a").provenance == "site-figure"
    claimed = dataclasses.replace(ok, partitions=(dataclasses.replace(ok.partitions[0], link_curves_from="sailor"),))
    c = load_links(claimed, store).p2p(64 * 2**20, "a", "a")
    assert c.provenance == "imported" and "Sailor" in c.source
    assert 64 * 2**20 / (c.ms * 1e6) < 10  # Sailor's A100 inter-node curve: a few GB/s, not 25


def test_cross_partition_uses_measured_pair_or_the_slower_imported_curve():
    site = site2()
    fast = imp("GH200", 20.0, source="Sailor fast")
    slow = imp("A100-40", 2.0, source="Sailor slow")
    lm = LinkModel(site, [fast, slow])
    c = lm.p2p(1e8, "g", "a")
    assert c.provenance == "imported" and "slow" in c.source
    pair = measured("cross", ("a", "g"), 1.0)
    assert LinkModel(site, [fast, slow, pair]).p2p(2**24, "g", "a").provenance == "measured"
    # only one type imported: the site's link figure (labelled)
    assert LinkModel(site, [fast]).p2p(1e8, "g", "a").provenance == "site-figure"


def test_streams_share_a_curve_measured_with_that_many_senders():
    site = site2()
    one = imp("GH200", 10.0, source="Sailor x1", streams=1)
    four_shared = imp("GH200", 10.0, source="Sailor x4", streams=4)  # four senders share one 10 GB/s adapter
    own = LinkModel(site, [one]).p2p(4e8, "g", "g", streams=4)
    shared = LinkModel(site, [one, four_shared]).p2p(4e8, "g", "g", streams=4)
    assert own.ms == pytest.approx(1e8 / 10e6)  # each sender its own path
    assert shared.ms == pytest.approx(4e8 / 10e6)


def test_measured_allreduce_converts_by_bus_bandwidth():
    site = site2()
    ar = measured("inter", ("g",), 1.0, kind="allreduce", group=4)
    lm = LinkModel(site, [ar])
    t4 = lm.allreduce(2**24, 4, ["g"]).ms
    t8 = lm.allreduce(2**24, 8, ["g"]).ms
    assert t4 == pytest.approx(0.01 + 16.0)
    assert t8 == pytest.approx(t4 * (2 * 7 / 8) / (2 * 3 / 4))


def test_points_curve_is_exact_at_its_points_and_monotone():
    c = CommCurve(kind="p2p", scope="inter", gpu_types=("x",), provenance="measured", source="t", form="points",
                  sizes_bytes=(1e3, 1e6, 1e8), times_ms=(0.02, 0.1, 8.0))
    assert [c.time_ms(x) for x in (1e3, 1e6, 1e8)] == pytest.approx([0.02, 0.1, 8.0])
    xs = np.geomspace(10, 1e10, 50)
    assert np.all(np.diff([c.time_ms(x) for x in xs]) >= 0)
    with pytest.raises(SpecError):
        CommCurve(kind="p2p", scope="inter", gpu_types=("x",), provenance="measured", source="t", form="points",
                  sizes_bytes=(1e3,), times_ms=(0.02,))
    with pytest.raises(SpecError):
        CommCurve(kind="bcast", scope="inter", gpu_types=("x",), provenance="measured", source="t", form="alpha-beta",
                  gbps=1.0)


class FlatModel:
    """Every layer 10 ms and 1 MB of activations; 1 GiB of runtime overhead."""

    identity = "flat"

    def predict(self, queries):
        return np.array([[10.0, 1e6] for _ in queries])

    def overhead_bytes(self, gpu_type):
        return 2**30

    def provenance(self, gpu_type):
        return "measured"


def test_composition_uses_the_links():
    site = Site(name="s", partitions=(Partition(name="g", gpu_type="GH200", nodes=4, gpus_per_node=4,
                                                inter_node_gbps=25.0, link_curves_from="sailor"),))
    model = ModelSpec(name="small", num_layers=8, hidden_size=1024, num_attention_heads=8, num_query_groups=8,
                      ffn_hidden_size=4096, vocab_size=1000, seq_length=512)
    job = job_for_model(model, 64, precision="bf16", optimizer="adam", distributed_optimizer=False)
    plan = Plan(tp=4, dp=2, micro_batch_size=1, global_batch_size=64,
                stages=(Stage(partition="g", num_layers=4), Stage(partition="g", num_layers=4)))
    base = predict_plan(plan, site, job, FlatModel())
    slow = imp("GH200", 0.1, source="Sailor slow")
    pred = predict_plan(plan, site, job, FlatModel(), links=LinkModel(site, [slow]))
    assert pred.stages[0].send_ms > 100 * base.stages[0].send_ms
    assert pred.stages[0].grad_sync_ms > 100 * base.stages[0].grad_sync_ms
    assert pred.iteration_ms > base.iteration_ms


def test_replicas_on_two_gpu_types_sync_over_the_slower_link():
    from memx_hpc.model.compose import predict_general
    from memx_hpc.spec import GeneralPlan, GeneralStage, Replica
    site = Site(name="mixed", partitions=(
        Partition(name="fast", gpu_type="A100-40", nodes=2, gpus_per_node=4, link_curves_from="sailor"),
        Partition(name="slow", gpu_type="V100-16", nodes=2, gpus_per_node=4, link_curves_from="sailor")))
    model = ModelSpec(name="small", num_layers=8, hidden_size=1024, num_attention_heads=8, num_query_groups=8,
                      ffn_hidden_size=4096, vocab_size=1000, seq_length=512)
    job = job_for_model(model, 16, precision="fp16", optimizer="adam", distributed_optimizer=False)
    fast = imp("A100-40", 20.0, source="Sailor fast")
    slow = imp("V100-16", 1.0, source="Sailor slow")
    links = LinkModel(site, [fast, slow])

    def plan(parts):
        return GeneralPlan(micro_batch_size=1, global_batch_size=16, stages=(
            GeneralStage(num_layers=8, replicas=tuple(Replica(gpu_type=site.partition(p).gpu_type, tp=4, partition=p)
                                                      for p in parts)),))

    homo = predict_general(plan(["fast", "fast"]), site, job, FlatModel(), links=links).stages[0].grad_sync_ms
    mixed = predict_general(plan(["fast", "slow"]), site, job, FlatModel(), links=links).stages
    # the two replicas' ring crosses the pair's link: the slower partition's curve (1 GB/s), not 20 GB/s
    assert all(s.grad_sync_ms == pytest.approx(20 * homo, rel=0.05) for s in mixed)


def _tp_site(gpus_per_node: int, inter: float = 25.0) -> Site:
    nodes = 8 // gpus_per_node
    return Site(name="s", partitions=(Partition(name="g", gpu_type="H100-SXM", nodes=nodes,
                                                gpus_per_node=gpus_per_node, inter_node_gbps=inter),))


def test_tp_over_whole_nodes_pays_its_collectives_on_the_inter_node_link():
    """TP 8 on two 4-GPU nodes: the same layers as on one 8-GPU node, plus the difference of
    its TP collectives between the inter-node link and the NVLink the layer cost priced;
    more so on a slower network; the search's vectorised composition prices it alike."""
    from memx_hpc.model.compose import TP_COLLECTIVE_UNITS, tp_internode_ms
    from memx_hpc.model.links import LinkModel as LM
    from memx_hpc.search.space import PlanSpace, SpaceOptions
    model = ModelSpec(name="small", num_layers=8, hidden_size=4096, num_attention_heads=32, num_query_groups=32,
                      ffn_hidden_size=16384, vocab_size=32000, seq_length=2048)
    job = job_for_model(model, 8, precision="bf16", optimizer="adam", distributed_optimizer=False)
    plan = Plan(tp=8, dp=1, micro_batch_size=1, global_batch_size=8, stages=(Stage(partition="g", num_layers=8),))
    inside, spans, slow = _tp_site(8), _tp_site(4), _tp_site(4, inter=5.0)
    assert tp_internode_ms(LM(inside, []), job, partition="g", gpu_type="H100-SXM", tp=8, micro_batch_size=1) == 0.0
    x = tp_internode_ms(LM(spans, []), job, partition="g", gpu_type="H100-SXM", tp=8, micro_batch_size=1)
    x_slow = tp_internode_ms(LM(slow, []), job, partition="g", gpu_type="H100-SXM", tp=8, micro_batch_size=1)
    # two all-reduces of s*b*h bf16 per layer forward as NCCL runs them over two nodes of 4 (ring
    # through the node's NVLink, the node's 4 x 25 GB/s of fabric shared; or tree, the faster:
    # collectives.py), less the same volume over 450 GB/s NVLink
    from memx_hpc.model import collectives as coll
    nbytes = 2 * 2 * 2048 * 4096
    shape = coll.group_shape(ranks=8, gpus_per_node=4, intra_gbytes_per_s=spans.intra_gbps("g"),
                             inter_gbytes_per_s=25.0)
    assert shape.domains == 2 and shape.ranks_per_domain == 4
    assert x == pytest.approx(coll.allreduce_ms(nbytes, shape) - 2 * 7 / 8 * nbytes / 450e9 * 1e3, rel=1e-6)
    assert x_slow > 4 * x
    a = predict_plan(plan, inside, job, FlatModel())
    b = predict_plan(plan, spans, job, FlatModel())
    u_base, _, u_emb, u_head = TP_COLLECTIVE_UNITS
    extra = (8 * u_base + u_emb + u_head) * x  # per micro-batch, fwd + bwd, one stage
    assert b.stages[0].forward_ms + b.stages[0].backward_ms == pytest.approx(
        a.stages[0].forward_ms + a.stages[0].backward_ms + extra, rel=1e-6)
    assert b.iteration_ms > a.iteration_ms
    # the search's vectorised composition gives the same numbers as the one-plan path
    from memx_hpc.model.compose import Composer, required_queries
    space = PlanSpace(spans, job, SpaceOptions(tp_degrees=(4, 8), micro_batch_sizes=(1,), layer_granularity=2, tp_across_nodes=True))
    inputs = space.composition_inputs()
    qs = required_queries(inputs)
    comp = Composer(inputs, {q: tuple(v) for q, v in zip(qs, FlatModel().predict(qs))},
                    overhead_bytes={"H100-SXM": FlatModel().overhead_bytes("H100-SXM")})
    cost = comp.compose(space.decode(0, len(space)))
    tps = set()
    for i in range(len(space)):
        p = space.plan_at(i)
        tps.add(p.tp)
        assert cost.iteration_ms[i] == pytest.approx(predict_plan(p, spans, job, FlatModel()).iteration_ms, rel=1e-9)
    assert tps == {4, 8}
