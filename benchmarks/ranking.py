"""Ranking is the product: does the predicted fastest plan of a group run fastest?

Within each group of plans that compete for the same GPUs (same model, GPU count and
global batch), every plan is predicted with the search's own composition and the group
is scored by

* top-1: whether the predicted fastest plan is the measured fastest;
* regret: the measured time of the predicted fastest over the measured fastest, minus 1;

beside the rule of thumb "largest DP that fits, then smallest TP, then largest
micro-batch" (:func:`memx_hpc.search.rule.rule_key`, the planner's fallback) scored the
same way. Nothing here is fitted to the runs it scores.

Sets (every public multi-plan set in ../shared/data; sources and licences in
memx_hpc.datapaths.SOURCES):

1. vTrain (KAIST, MIT licence): ground_truth_single.csv, 1,440 single-node A100 runs in
   144 groups (model x GPU count x global batch). Locked split as in
   benchmarks/end_to_end.py: the 20-layer models are test (VTRAIN_TEST_LAYERS).
2. Sailor (ETH Zurich, MIT licence): validation_dev/clariden/GPT-NEO, GH200 runs on 2-64
   nodes; a group is the GPT-Neo-2.7 runs of one node count and global batch (two plans
   each: 2 or 4 pipeline stages at the data-parallel width that fills the nodes; the
   OPT-350 run and N2's single plan form no group). Locked split as in end_to_end.py:
   8 and 32 nodes are test (SAILOR_TEST_NODES).
3. Cephalo (MIT licence): model_memory.json and model_latencies.json hold one
   configuration per (model, GPU set, batch) -- FSDP memory curves and per-layer
   latencies -- with no competing plans of the same GPUs, so they form no ranking group;
   they score the layer times and memory in benchmarks/accuracy.py.

Each set is scored twice: with the store as shipped (Sailor's and Cephalo's per-layer
profiles: the chip of the set is profiled, provenance measured / interpolated /
extrapolated) and with every sample of the set's chip removed from the store before the
fit (the chip is then never profiled: provenance datasheet-only, the transfer model of
memx_hpc.model.anchors answers it). The site kind of a set is (single-node | multi-node,
profiled | datasheet-only): memx_hpc/data/ranking.yaml copies the dev rows of the last
table, and `memx-hpc plan` recommends the rule's plan on a site of a kind whose dev
top-1 is below the rule's (and says so).

Also printed: the plans' time MAPE by the provenance of their layer times (the least
direct provenance of any layer query of the plan: measured < interpolated < extrapolated
< datasheet-only), and the memory MAPE with its bias (mean signed error: negative = the
prediction is low) against Sailor's recorded device peaks (max_mem).

Run from the repository root:  .venv/bin/python benchmarks/ranking.py
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from end_to_end import (SAILOR_TEST_NODES, VTRAIN_TEST_LAYERS, sailor_case, sailor_links,  # noqa: E402
                        split_of_sailor, split_of_vtrain)

from memx_hpc.catalog import catalog  # noqa: E402
from memx_hpc.datapaths import SOURCES, shared_data  # noqa: E402
from memx_hpc.model.api import AnalyticCostModel  # noqa: E402
from memx_hpc.model.compose import layer_query, predict_general, predict_plan  # noqa: E402
from memx_hpc.model.metrics import ape  # noqa: E402
from memx_hpc.search.rule import ranking_table, rule_key  # noqa: E402
from memx_hpc.spec import ModelSpec, Partition, Plan, Recompute, Site, Stage, job_for_model  # noqa: E402
from memx_hpc.tables import table  # noqa: E402

#: Plans the recommended ranking keeps (PlanRequest.top_k's default): the rule picks among these.
TOP_K = 10


def _fallback_kind(nodes: str, chip: str) -> bool:
    row = (ranking_table().get(nodes) or {}).get(chip)
    return bool(row) and float(row["predictor_top1"]) < float(row["rule_top1"])


HOW_ORDER = ("measured", "interpolated", "extrapolated", "datasheet-only")


def store_samples(data: Path):
    from memx_hpc.profile.importers import import_cephalo, import_sailor
    skipped: list[str] = []
    return import_sailor(data / "sailor", skipped=skipped) + import_cephalo(
        data / "cephalo" / "model_latencies.json", skipped=skipped)


def fit_without(samples, chip: str | None):
    """The predictor fitted on ``samples`` less every sample of GPU chip ``chip``."""
    from memx_hpc.model.predictor import Predictor
    cat = catalog()
    keep = [s for s in samples if chip is None or _chip(cat, s.point.gpu_type) != chip]
    return Predictor().fit(keep, cat)


def _chip(cat, name: str) -> str | None:
    try:
        return cat.get(name).chip_id
    except Exception:
        return None


def _least_direct(model, queries) -> str:
    if not hasattr(model, "explain"):
        return "datasheet-only"
    how = model.explain(queries)
    return max(how, key=HOW_ORDER.index) if how else "datasheet-only"


# --------------------------------------------------------------------------- sets


def vtrain_runs():
    path = shared_data() / "vtrain" / "ground_truth_single.csv"
    with open(path, newline="") as fh:
        rows = [r for r in csv.reader(fh) if r and not r[0].startswith("#")]
    site = Site(name="a100-node", partitions=(Partition(name="a100", gpu_type="A100-40", nodes=1, gpus_per_node=8),))
    runs = []
    for r in rows:
        gpus, gbs, mbs, h, a, L, s, tp, dp, pp = (int(x) for x in r[:10])
        m = ModelSpec(name=f"gpt-h{h}-l{L}", num_layers=L, hidden_size=h, num_attention_heads=a, num_query_groups=a,
                      ffn_hidden_size=4 * h, vocab_size=50257, seq_length=s)
        job = job_for_model(m, gbs, precision="fp16", optimizer="adam", distributed_optimizer=False)
        plan = Plan(tp=tp, dp=dp, micro_batch_size=mbs, global_batch_size=gbs,
                    stages=tuple(Stage(partition="a100", num_layers=L // pp, recompute=Recompute(mode="full"))
                                 for _ in range(pp)))
        runs.append(dict(group=(h, a, L, s, gpus, gbs), split=split_of_vtrain(L), measured=float(r[10]),
                         dp=dp, tp=tp, mbs=mbs, pp=pp,
                         predict=lambda model, plan=plan, job=job: predict_plan(plan, site, job, model),
                         queries=[layer_query(job, "A100-40", kind="layer", tp=tp, micro_batch_size=mbs,
                                              recompute="full", sequence_parallel=False)]))
    return path, "GA100-SXM4", "single-node", runs


def sailor_runs():
    root = shared_data() / "sailor" / "validation_dev" / "clariden" / "GPT-NEO"
    runs = []
    for f in sorted(root.glob("N*/plan_config_*.json"), key=lambda f: (int(f.parent.name[1:]), f.name)):
        plan, site, job, real_ms, mem = sailor_case(f)
        nodes = int(f.parent.name[1:])
        links = sailor_links(site)
        rep = plan.stages[0].replicas[0]
        runs.append(dict(group=(job.model.name, nodes, plan.global_batch_size), split=split_of_sailor(nodes),
                         measured=real_ms, mem=float(mem), dp=len(plan.stages[0].replicas), tp=rep.tp,
                         mbs=plan.micro_batch_size, pp=len(plan.stages), name=f"{f.parent.name}/{f.name}",
                         predict=lambda model, plan=plan, site=site, job=job, links=links:
                         predict_general(plan, site, job, model, links=links),
                         queries=[layer_query(job, rep.gpu_type, kind="layer", tp=rep.tp,
                                              micro_batch_size=plan.micro_batch_size, recompute="none",
                                              sequence_parallel=False)]))
    return root, "GH200", "multi-node", runs


# --------------------------------------------------------------------------- scoring


def score_groups(runs, key: str) -> dict[str, dict[str, float]]:
    """Per split: top-1 and regret of ``key``'s predictions and of the rule, over groups of >= 2 plans."""
    groups: dict[tuple, list] = defaultdict(list)
    for r in runs:
        groups[r["group"]].append(r)
    out = {}
    for split in ("dev", "test"):
        gs = [g for g in groups.values() if len(g) >= 2 and g[0]["split"] == split]
        top1 = rule1 = 0
        regret, rule_regret = [], []
        for g in gs:
            meas = np.array([r["measured"] for r in g])
            pick = int(np.argmin([r[key] for r in g]))
            rule = max(range(len(g)), key=lambda i: rule_key(g[i]["dp"], g[i]["tp"], g[i]["mbs"]))
            top1 += int(meas[pick] == meas.min())
            rule1 += int(meas[rule] == meas.min())
            regret.append(meas[pick] / meas.min() - 1)
            rule_regret.append(meas[rule] / meas.min() - 1)
        n = len(gs)
        out[split] = dict(groups=n, top1=top1 / n if n else float("nan"), rule_top1=rule1 / n if n else float("nan"),
                          regret=float(np.mean(regret)) * 100 if n else float("nan"),
                          rule_regret=float(np.mean(rule_regret)) * 100 if n else float("nan"),
                          top1_n=top1, rule_n=rule1)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.parse_args(argv)
    data = shared_data()
    print(f"data: {data} ({SOURCES['vtrain']}; {SOURCES['sailor']}; {SOURCES['cephalo']})")
    samples = store_samples(data)
    print(f"store: {len(samples)} per-layer samples (Sailor profiles + Cephalo latencies)")
    sets = [vtrain_runs(), sailor_runs()]
    rank_rows: list = []
    prov: dict[tuple, list] = defaultdict(list)
    kind_rows, mem_rows = [], []
    for path, chip, nodes_kind, runs in sets:
        name = "vTrain" if "vtrain" in str(path) else "Sailor"
        for store_kind, drop in (("profiled", None), ("datasheet-only", chip)):
            model = fit_without(samples, drop)
            roof = AnalyticCostModel(catalog())
            for r in runs:
                pr = r["predict"](model)
                r["pred"] = pr.iteration_ms
                r["roof"] = r["predict"](roof).iteration_ms
                r["peak"] = max(st.peak_bytes for st in pr.stages)
                how = _least_direct(model, r["queries"])
                prov[(name, how, r["split"])].append(float(ape(r["pred"], r["measured"])))
            # what `memx-hpc plan` recommends: the rule among the predictor's top-K where the
            # shipped table (memx_hpc/data/ranking.yaml) says the rule ranks better there
            fallback = _fallback_kind(nodes_kind, store_kind)
            for r in runs:
                r["plan_pick"] = r["pred"]
            if fallback:
                groups = defaultdict(list)
                for r in runs:
                    groups[r["group"]].append(r)
                for g in groups.values():
                    kept = sorted(g, key=lambda r: r["pred"])[:TOP_K]
                    pick = max(kept, key=lambda r: rule_key(r["dp"], r["tp"], r["mbs"]))
                    for r in g:
                        r["plan_pick"] = 0.0 if r is pick else 1.0 + r["pred"]
            models = [("pred", "predictor"), ("plan_pick", "plan (fallback)" if fallback else "plan (predictor)")]
            if store_kind == "profiled":
                models.append(("roof", "roofline"))
            for key, label in models:
                s = score_groups(runs, key)
                for split in ("dev", "test"):
                    o = s[split]
                    if not o["groups"]:
                        continue
                    mape = (float(np.mean([ape(r[key], r["measured"]) for r in runs if r["split"] == split]))
                            if key != "plan_pick" else float("nan"))
                    rank_rows.append([name, store_kind, split, label, o["groups"],
                                      f"{o['top1_n']}/{o['groups']} ({o['top1']:.0%})",
                                      f"{o['rule_n']}/{o['groups']} ({o['rule_top1']:.0%})",
                                      f"{o['regret']:.1f}", f"{o['rule_regret']:.1f}",
                                      "-" if mape != mape else f"{mape:.1f}"])
                    if label == "predictor":
                        kind_rows.append((nodes_kind, store_kind, split, name, o))
            if name == "Sailor":
                for split in ("dev", "test"):
                    err = [(r["peak"] - r["mem"]) / r["mem"] * 100 for r in runs if r["split"] == split]
                    mem_rows.append([name, store_kind, split, len(err), f"{np.mean(np.abs(err)):.1f}",
                                     f"{np.mean(err):+.1f}", f"{max(np.abs(err)):.1f}"])
    print(f"\nRanking within groups of plans for the same GPUs (test: vTrain {sorted(VTRAIN_TEST_LAYERS)}-layer "
          f"models, Sailor {sorted(SAILOR_TEST_NODES)} nodes; groups of >= 2 plans):")
    table(rank_rows, ["set", "chip in store", "split", "cost model", "groups", "top-1", "rule top-1",
                      "mean regret %", "rule regret %", "time MAPE %"])
    print("regret: measured time of the picked plan over the group's measured fastest, minus 1. 'datasheet-only': "
          "every sample of the set's chip (vTrain GA100-SXM4, Sailor GH200) removed from the store before the fit.")
    print("\nTime MAPE of the predictor's plans by the least direct provenance of their layer times:")
    rows = [[name, how, split, len(v), f"{np.mean(v):.1f}", f"{np.median(v):.1f}"]
            for name in ("vTrain", "Sailor") for how in HOW_ORDER for split in ("dev", "test")
            for v in [prov.get((name, how, split), [])] if v]
    table(rows, ["set", "provenance", "split", "plans", "time MAPE %", "median APE %"])
    print("\nMemory: predicted device peak (uncalibrated) against Sailor's recorded max_mem (bias: mean signed "
          "error, negative = predicted low):")
    table(mem_rows, ["set", "chip in store", "split", "plans", "MAPE %", "bias %", "max APE %"])
    print("\nBy site kind (predictor against the rule; memx_hpc/data/ranking.yaml copies the dev rows):")
    agg: dict[tuple, list] = defaultdict(lambda: [0, 0, 0])
    for nodes_kind, store_kind, split, _, o in kind_rows:
        a = agg[(nodes_kind, store_kind, split)]
        a[0] += o["groups"]
        a[1] += o["top1_n"]
        a[2] += o["rule_n"]
    rows = [[nk, sk, split, n, f"{t / n:.0%}", f"{r / n:.0%}", "predictor" if t >= r else "rule"]
            for (nk, sk, split), (n, t, r) in sorted(agg.items())]
    table(rows, ["nodes", "chip in store", "split", "groups", "predictor top-1", "rule top-1", "recommends"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
