"""The recommendation falls back to the rule of thumb where the predictor ranks worse (benchmarks/ranking.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from memx_hpc.datapaths import sailor_dir
from memx_hpc.planner import PlanRequest, plan
from memx_hpc.profile.importers import import_sailor
from memx_hpc.profile.store import ProfileStore
from memx_hpc.search.report import explain
from memx_hpc.model.api import Basis
from memx_hpc.search.rule import ranking_table, rule_key, rule_pick, rule_row, site_kind
from memx_hpc.spec import Plan, Recompute, Stage, load_site

ROOT = Path(__file__).resolve().parents[2]


def _plan(tp, dp, mbs):
    return Plan(tp=tp, dp=dp, micro_batch_size=mbs, global_batch_size=64,
                stages=(Stage(partition="p", num_layers=8, recompute=Recompute(mode="none")),))


def test_the_rule_prefers_dp_then_small_tp_then_large_micro_batches():
    plans = [_plan(2, 4, 8), _plan(1, 4, 1), _plan(1, 8, 1), _plan(1, 8, 4), _plan(8, 1, 8)]
    assert rule_pick(plans) == 3
    assert rule_pick(plans[:2]) == 1  # same DP: the smaller TP, whatever its micro-batch
    assert rule_pick([]) is None
    assert rule_key(8, 1, 4) > rule_key(8, 2, 8) > rule_key(4, 1, 8)


def test_the_table_decides_by_kind_of_site():
    t = ranking_table()
    for nodes in ("single-node", "multi-node"):
        for chip in ("profiled", "datasheet-only"):
            row = t[nodes][chip]
            assert 0 <= row["predictor_top1"] <= 1 and 0 <= row["rule_top1"] <= 1 and row["groups"] > 0
            assert "benchmarks/ranking.py" in row["benchmark"]
    full = load_site(ROOT / "site_configs/example-cross-vendor.yaml")
    a100 = next(p for p in full.partitions if p.gpu_type == "A100-80")
    one = dataclasses.replace(full, partitions=(dataclasses.replace(a100, nodes=1),))
    two = dataclasses.replace(full, partitions=(a100,))
    assert site_kind(one, {"A100-80": Basis(kind="imported")}) == ("single-node", "profiled")
    assert site_kind(two, {"A100-80": Basis(kind="datasheet-only")}) == ("multi-node", "datasheet-only")
    assert site_kind(two, {}) == ("multi-node", "datasheet-only")  # a type the model does not name
    # the basis kind decides, not how a label reads: a type answered by another of its chip
    assert site_kind(one, {"A100-80": Basis(kind="imported", same_chip_as="A100-40")}) == ("single-node",
                                                                                            "profiled")
    assert site_kind(full, {}) is None  # MI250X: no public multi-plan set of that vendor
    expect = t["single-node"]["profiled"]["predictor_top1"] < t["single-node"]["profiled"]["rule_top1"]
    assert (rule_row(one, {"A100-80": Basis(kind="imported")}) is not None) == expect


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("rule") / "store.h5"
    ProfileStore(path).append(import_sailor(sailor_dir()))
    return path


def _table(pred: float, rule: float) -> dict:
    row = {"predictor_top1": pred, "rule_top1": rule, "groups": 7, "benchmark": "benchmarks/ranking.py, test row"}
    return {"single-node": {"profiled": row, "datasheet-only": row}, "multi-node": {"profiled": row}}


def test_plan_on_a_kind_of_site_where_the_rule_ranks_better_recommends_the_rules_plan_and_says_so(
        tmp_path, store, monkeypatch):
    import memx_hpc.search.rule as rule_mod
    full = load_site(ROOT / "site_configs/example-cross-vendor.yaml")
    a100 = next(p for p in full.partitions if p.gpu_type == "A100-80")
    site = dataclasses.replace(full, name="one-a100-node", partitions=(dataclasses.replace(a100, nodes=1),))
    job = str(ROOT / "jobs/gpt3-2.7b.yaml")

    def run(out, **kw):
        return plan(PlanRequest(site=site, job=job, store=store, out_dir=tmp_path / out, progress=False, top_k=10,
                                **kw))

    monkeypatch.setattr(rule_mod, "ranking_table", lambda: _table(0.5, 0.6))
    r = run("rule")
    ranked = r.ranked
    assert len(ranked) >= 2
    # the rule's plan of the kept plans is first; the others keep the predictor's order
    assert rule_pick([s.plan for s in ranked]) == 0
    assert [s.rank for s in ranked] == list(range(1, len(ranked) + 1))
    assert r.search.recommended is ranked[0]
    assert any("rule of thumb" in n and "50% of 7 groups" in n and "(60%" in n for n in r.notes), r.notes
    assert any("rule of thumb" in line for line in explain(r.search))
    # where the predictor ranks at least as well, its own order stands
    monkeypatch.setattr(rule_mod, "ranking_table", lambda: _table(0.6, 0.6))
    p = run("pred")
    assert not any("rule of thumb" in n for n in p.notes)
    assert p.search.recommended_by == "predictor"
    assert sorted(s.index for s in p.ranked) == sorted(s.index for s in ranked)
    assert [s.index for s in ranked[1:]] == [s.index for s in p.ranked if s.index != ranked[0].index]
    # MemX's weighted ranking is never changed
    monkeypatch.setattr(rule_mod, "ranking_table", lambda: _table(0.5, 0.6))
    m = run("memx", objective="memx")
    assert not any("rule of thumb" in n for n in m.notes)
