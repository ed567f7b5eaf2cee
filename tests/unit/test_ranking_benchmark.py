"""benchmarks/ranking.py's scoring: top-1 and regret within groups, beside the rule of thumb."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import ranking  # noqa: E402


def _run(group, split, measured, pred, dp, tp, mbs):
    return dict(group=group, split=split, measured=measured, pred=pred, dp=dp, tp=tp, mbs=mbs)


def test_groups_are_scored_against_the_measured_fastest_and_the_rule():
    runs = [
        # group A (dev): the predictor picks the fastest (TP 2), the rule picks DP 4 (slower by 25 %)
        _run("A", "dev", 100.0, 90.0, 2, 2, 4), _run("A", "dev", 125.0, 95.0, 4, 1, 2),
        # group B (dev): the predictor is wrong by 50 %, the rule right
        _run("B", "dev", 150.0, 10.0, 1, 8, 1), _run("B", "dev", 100.0, 20.0, 8, 1, 1),
        # a lone plan is no group; a test group is scored apart
        _run("C", "dev", 1.0, 1.0, 1, 1, 1),
        _run("D", "test", 10.0, 11.0, 2, 1, 1), _run("D", "test", 12.0, 10.0, 1, 2, 1),
    ]
    s = ranking.score_groups(runs, "pred")
    assert s["dev"]["groups"] == 2 and s["test"]["groups"] == 1
    assert s["dev"]["top1"] == 0.5 and s["dev"]["rule_top1"] == 0.5
    assert s["dev"]["regret"] == pytest.approx((0.0 + 50.0) / 2)
    assert s["dev"]["rule_regret"] == pytest.approx((25.0 + 0.0) / 2)
    assert s["test"]["top1"] == 0.0 and s["test"]["rule_top1"] == 1.0
    assert s["test"]["regret"] == pytest.approx(20.0)


def test_megatron_ci_groups_hold_competing_layouts_of_one_half():
    """The CI set's groups: one platform, GPU count, model and batch; each layout once; the
    cases of a group all from one half of the CSV's locked split."""
    from collections import defaultdict

    import public_runs
    path, chip, nodes_kind, runs = ranking.mlm_ci_runs()
    assert path == public_runs.DATA and chip == "GA100-SXM4" and nodes_kind is None
    groups = defaultdict(list)
    for r in runs:
        groups[r["group"]].append(r)
    multi = {k: g for k, g in groups.items() if len(g) >= 2}
    assert len(multi) >= 6
    assert {r["split"] for g in multi.values() for r in g} == {"dev", "test"}
    for key, g in multi.items():
        assert {r["split"] for r in g} == {key[-1]}
        gpus = key[2]
        assert all(r["measured"] > 0 and r["nodes_kind"] in ("single-node", "multi-node") for r in g)
        assert all(r["dp"] * r["tp"] * r["pp"] <= gpus for r in g)
        # a layout counts once: no two runs of a group predict the same plan
        assert len({r["layout"] for r in g}) == len(g)
    assert any(r["cases"] > 1 for r in runs)  # several cases of one layout: one run, their median


def test_ultrascale_panels_form_groups_with_the_locked_split_and_one_pick_each():
    """ultrascale-dev: a group is one (model, nodes) panel, 2, 8 and 32 nodes are test; the
    rule and the predictor each pick one layout that ran per panel."""
    from collections import defaultdict

    from memx_hpc.model.api import AnalyticCostModel
    from memx_hpc.search.rule import rule_key
    assert ranking.ULTRASCALE_TEST_NODES == {2, 8, 32}
    assert [ranking.split_of_ultrascale(n) for n in (1, 2, 4, 8)] == ["dev", "test", "dev", "test"]
    path, timed, untimed, left = ranking.ultrascale_runs(panels=[("1B", 1), ("1B", 2)])
    assert path.name == "runs.csv"
    groups = defaultdict(list)
    for r in timed:
        groups[r["group"]].append(r)
    assert set(groups) == {("1B", 1), ("1B", 2)}
    assert {r["split"] for r in groups[("1B", 1)]} == {"dev"} and {r["split"] for r in groups[("1B", 2)]} == {"test"}
    for (model, nodes), g in groups.items():
        assert len(g) >= 2
        assert all(r["dp"] * r["tp"] * r["pp"] == 8 * nodes and r["measured"] > 0 for r in g)
        assert all(r["plan"].sequence_parallel == (r["tp"] > 1) for r in g)
        # a layout counts once
        assert len({(r["dp"], r["tp"], r["pp"], r["mbs"], r["zero"]) for r in g}) == len(g)
    assert untimed and all(r["status"].startswith("crashed_or_oom") for r in untimed)
    # the roofline keeps it quick: the pick is the same code path whatever the cost model
    ranking.ultrascale_predict(timed, untimed[:3], AnalyticCostModel(ranking.catalog()), False)
    for g in groups.values():
        pick = min(g, key=lambda r: r["pred"])
        rule = max(g, key=lambda r: rule_key(r["dp"], r["tp"], r["mbs"]))
        assert pick in g and rule in g
    s = ranking.score_groups(timed, "pred")
    assert s["dev"]["groups"] == 1 and s["test"]["groups"] == 1
    assert 0 <= s["dev"]["top1_n"] <= 1 and s["test"]["regret_median"] >= 0


def test_the_site_kind_table_counts_the_ultrascale_panels_as_multi_node_h100_groups():
    """The 'By site kind' table (what memx_hpc/data/ranking.yaml is copied from) holds the
    ultrascale-dev panels: H100 is never in the store, so datasheet-only; a panel of 2 or more
    nodes in the multi-node rows (4 nodes dev, 2 test: the locked split), one node single-node."""
    from collections import defaultdict

    from memx_hpc.model.api import AnalyticCostModel
    path, chip, nodes_kind, runs = ranking.ultrascale_ranking_runs(panels=[("1B", 1), ("1B", 2), ("1B", 4)])
    assert path.name == "runs.csv" and chip is None and nodes_kind is None
    assert {(r["nodes"], r["nodes_kind"], r["split"]) for r in runs} == {
        (1, "single-node", "dev"), (2, "multi-node", "test"), (4, "multi-node", "dev")}
    assert {r["chip"] for r in runs} == {ranking._chip(ranking.catalog(), "H100-SXM")}
    assert all(not r["plan"].overlap_grad_reduce and r["queries"] for r in runs)
    prov, rank_rows, kind_rows, mem_rows = defaultdict(list), [], [], []
    roof = AnalyticCostModel(ranking.catalog())  # quick: the rows are the same code path whatever the model
    multi = [r for r in runs if r["nodes_kind"] == "multi-node"]
    ranking._score_pass("ultrascale-dev multi-node", "multi-node", "datasheet-only", multi, roof, prov, rank_rows,
                        kind_rows, mem_rows)
    # another set's multi-node groups of the same kind are summed with them
    other = dict(groups=3, top1_n=2, rule_n=1)
    kind_rows.append(("multi-node", "datasheet-only", "dev", "MLM-CI multi-node", other))
    rows = {tuple(r[:3]): r for r in ranking.site_kind_rows(kind_rows)}
    assert rows[("multi-node", "datasheet-only", "dev")][3] == 1 + 3
    assert rows[("multi-node", "datasheet-only", "test")][3] == 1
    assert all(k[0] == "multi-node" for k in rows)
