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
3. Megatron-LM's functional tests (NVIDIA, BSD-3-Clause; benchmarks/data/public_runs.csv, rows
   mlm-ci/): the cases of one platform (DGX H100 1 x 8, DGX GB200 2 x 4 and 1 x 4, DGX A100
   1 x 8), model shape, sequence, global batch and precision that differ in their parallel
   layout; a layout several cases ran counts once (median time). Small models (12 layers,
   hidden 512) whose step is dominated by fixed costs, run in deterministic mode: a test of
   the fixed and communication costs more than of the GEMMs. Locked split: the CSV's, by
   case family (a group is formed from the cases of one half).
4. ultrascale-dev (Hugging Face's Ultra-Scale Playbook, nanotron, Apache-2.0): H100 runs on
   1-64 nodes of 8, a group is one (model, nodes) panel of layouts that ran (each layout
   once), the plans' gradient synchronisation priced as nanotron runs it (PyTorch DDP: each
   25 MiB bucket's all-reduce overlapped with the backward on every pipeline rank; the site
   states EFA, whose all-reduce is a ring), its own section's last predictor pass.
   Locked split: 2, 8 and 32 nodes are test (ULTRASCALE_TEST_NODES). H100 is not in the
   store, so its runs are datasheet-only in both passes (as MLM-CI's H100 cases); a panel of
   one node counts as single-node, the others as multi-node. Its own section (also
   ``--only ultrascale``) adds the passes without overlap and with Megatron's buckets, the plans
   that never ran, the false-OOM calls, and the memory of the layouts that ran: pipeline stage 0's
   prediction against the measured ``gpu_mem_gib`` (PyTorch's reserved peak of global rank 0:
   :data:`ULTRASCALE_MEM_SOURCE`) at the allocator's reserved level, by split and family.
5. Cephalo (MIT licence): model_memory.json and model_latencies.json hold one
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
import dataclasses
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

from memx_hpc.spec.catalog import catalog  # noqa: E402
from memx_hpc.datapaths import SOURCES, shared_data  # noqa: E402
from memx_hpc.model.api import AnalyticCostModel  # noqa: E402
from memx_hpc.model.compose import CostOptions, layer_query, predict_general, predict_plan  # noqa: E402
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
    # a label may carry a suffix (``+fp8-roofline``, an MoE layer's roofline terms)
    base = [next((h for h in HOW_ORDER if x.startswith(h)), "datasheet-only") for x in how]
    return max(base, key=HOW_ORDER.index) if base else "datasheet-only"


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


def mlm_ci_runs():
    """Megatron-LM's functional-test runs (benchmarks/data/public_runs.csv, rows ``mlm-ci/``,
    BSD-3-Clause) that compete for the same GPUs: one platform, GPU count, model shape,
    sequence, global batch and precision, different parallel layouts. A layout several cases
    ran (their other flags differ: deterministic mode, resume, loss variants) counts once, at
    the median of their times. The CSV's locked split by case family holds: a dev group is
    formed from dev cases only, a test group from test cases only. A case the planner cannot
    state (Megatron-FSDP, multi-token prediction, offloading, ...) is left out."""
    import public_runs as pr
    shape = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
             "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "seq_length", "global_batch_size",
             "precision", "vocab_size")
    cat = catalog()
    layouts: dict[tuple, list] = defaultdict(list)
    for row in pr.load_rows(pr.DATA):
        if not row["id"].startswith("mlm-ci/") or not row["iteration_ms"]:
            continue
        try:
            plan, site, job = pr.build(row)
        except pr.NotExpressible:
            continue
        group = ("mlm-ci", row["gpu_type"], int(row["gpus"])) + tuple(row[c] for c in shape) + (row["split"],)
        layout = (plan.tp, plan.dp, plan.cp, len(plan.stages), plan.virtual_stages, plan.ep, plan.etp,
                  plan.micro_batch_size, tuple(st.recompute.label() for st in plan.stages), plan.sequence_parallel,
                  tuple(st.num_layers for st in plan.stages))
        layouts[(group, layout)].append((row, plan, site, job))
    runs = []
    for (group, layout), members in layouts.items():
        row, plan, site, job = members[0]
        nodes = -(-int(row["gpus"]) // int(row["gpus_per_node"]))
        runs.append(dict(group=group, split=row["split"],
                         measured=float(np.median([float(m[0]["iteration_ms"]) for m in members])),
                         dp=plan.dp, tp=plan.tp, mbs=plan.micro_batch_size, pp=len(plan.stages),
                         nodes_kind="single-node" if nodes == 1 else "multi-node", chip=_chip(cat, row["gpu_type"]),
                         name=row["family"], layout=layout, cases=len(members),
                         predict=lambda model, plan=plan, site=site, job=job: predict_plan(plan, site, job, model),
                         queries=[layer_query(job, row["gpu_type"], kind="layer", tp=plan.tp,
                                              micro_batch_size=plan.micro_batch_size,
                                              recompute=plan.stages[0].recompute.mode,
                                              sequence_parallel=plan.sequence_parallel)]))
    return pr.DATA, "GA100-SXM4", None, runs


#: ultrascale-dev's locked split, fixed before any of its results were looked at: the panels
#: of 2, 8 and 32 nodes (every other power of two from 2) are test, those of 1, 4, 16 and 64 dev
ULTRASCALE_TEST_NODES = frozenset({2, 8, 32})
#: EFA on the playbook's nodes: 3,200 Gb/s a node of 8 GPUs = 400 Gb/s = 50 GB/s a GPU
ULTRASCALE_EFA_GBPS = 50.0
ULTRASCALE_GPU = "H100-SXM"
#: nanotron's gradient buckets: ``ddp_bucket_cap_mb: int = 25`` (huggingface/nanotron
#: src/nanotron/config/config.py) handed to PyTorch's DistributedDataParallel as ``bucket_cap_mb``
#: (src/nanotron/trainer.py), which counts MiB of gradient: 25 MiB of bf16 gradients
NANOTRON_BUCKET_PARAMS = 25 * 1024 * 1024 // 2
#: how the playbook's runs synchronise gradients: PyTorch DDP, which overlaps each bucket's
#: all-reduce with the backward and buckets on every pipeline rank (megatron-core buckets only
#: the first)
NANOTRON_DDP = CostOptions(ddp_bucketing="every_stage")


def split_of_ultrascale(nodes: int) -> str:
    return "test" if int(nodes) in ULTRASCALE_TEST_NODES else "dev"


def ultrascale_site(nodes: int) -> Site:
    """``nodes`` x 8 H100-SXM; NVLink inside a node (the catalog's figure), AWS EFA between
    nodes (``fabric: efa``: NCCL's all-reduce runs as a ring there) at its 50 GB/s a GPU, stated
    as the site file would state it."""
    return Site(name=f"ultrascale-n{nodes}", partitions=(Partition(
        name="h100", gpu_type=ULTRASCALE_GPU, nodes=int(nodes), gpus_per_node=8, fabric="efa",
        inter_node_gbps=ULTRASCALE_EFA_GBPS),))


def ultrascale_job(row: dict, distributed_optimizer: bool):
    """The row's Llama-style model (SwiGLU, RMSNorm, RoPE, MHA, tied embeddings, no biases,
    no dropout: nanotron's Llama has none) at sequence 4,096, global batch 256, bf16 with fp32
    gradient accumulation and reduction (nanotron's ``accumulate_grad_in_fp32``)."""
    heads = int(row["num_heads"])
    m = ModelSpec(name=f"ultrascale-{row['model']}", num_layers=int(row["num_layers"]),
                  hidden_size=int(row["hidden_size"]), num_attention_heads=heads,
                  num_query_groups=int(row["num_kv_heads"] or heads), ffn_hidden_size=int(row["ffn_hidden_size"]),
                  vocab_size=int(row["vocab_size"]), seq_length=int(row["seq_len"]), activation="swiglu",
                  tied_embeddings=row["tie_word_embeddings"] == "1", position_embedding="rope",
                  normalization="rmsnorm", add_bias_linear=False, hidden_dropout=0.0)
    return job_for_model(m, int(row["gbs_seqs"]), precision="bf16", optimizer="adam",
                         distributed_optimizer=distributed_optimizer, recompute_modes=("none",))


def ultrascale_layers(num_layers: int, pp: int) -> list[int]:
    """Layers per stage: an even split, the remainder on the first stages (the last one
    carries the 131k-vocabulary head; nanotron balances its blocks by cost)."""
    base, rem = divmod(num_layers, pp)
    return [base + (i < rem) for i in range(pp)]


def ultrascale_case(row: dict):
    """(plan, site, job) of a row, or None where the planner cannot state it (more stages
    than layers)."""
    nodes, tp, pp, dp, mbs = (int(row[k]) for k in ("nodes", "tp", "pp", "dp", "mbs"))
    if pp > int(row["num_layers"]):
        return None
    site = ultrascale_site(nodes)
    job = ultrascale_job(row, distributed_optimizer=row["zero_stage"] == "1")
    plan = Plan(tp=tp, dp=dp, micro_batch_size=mbs, global_batch_size=int(row["gbs_seqs"]),
                stages=tuple(Stage(partition="h100", num_layers=n, recompute=Recompute(mode="none"))
                             for n in ultrascale_layers(int(row["num_layers"]), pp)),
                sequence_parallel=tp > 1)
    return plan, site, job


def ultrascale_runs(path: Path | None = None, panels=None):
    """The ultrascale-dev set (../shared/data/ultrascale-dev/runs.csv, Apache-2.0): a group is
    one (model, nodes) panel. Returns ``(path, timed, untimed, left_out)``:

    * ``timed``: one run per layout that ran (``ok``) at the stated global batch of 256; a
      layout measured twice counts once, at the median of its times. Rows whose dp·mbs·gas
      is not 256 (``gbs_consistent`` 0) are left out (their implied-batch time would be a
      rescaling, not a measurement of the plan);
    * ``untimed``: layouts that never ran (``crashed_or_oom``, and ``crashed_or_oom_with_metrics``:
      slow runs killed), one per layout; a crashed repeat of a layout that also ran is not one;
    * ``left_out``: reason -> count.

    ``panels``: an iterable of (model, nodes) to keep (None: all)."""
    path = path or shared_data() / "ultrascale-dev" / "runs.csv"
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    keep = None if panels is None else {(str(m), int(n)) for m, n in panels}
    left: dict[str, int] = defaultdict(int)
    layouts: dict[tuple, list] = defaultdict(list)
    for row in rows:
        if keep is not None and (row["model"], int(row["nodes"])) not in keep:
            continue
        key = tuple(row[k] for k in ("model", "nodes", "dp", "tp", "pp", "mbs", "gas", "zero_stage"))
        layouts[key].append(row)
    timed, untimed = [], []
    for key, members in layouts.items():
        ok = [r for r in members if r["status"] == "ok"]
        if ok and all(r["gbs_consistent"] == "0" for r in ok):
            left["ok, gbs_consistent 0 (dp*mbs*gas != 256)"] += len(ok)
            continue
        ok = [r for r in ok if r["gbs_consistent"] == "1"]
        row = (ok or members)[0]
        case = ultrascale_case(row)
        if case is None:
            left[f"{'ok' if ok else 'not run'}, more stages than layers"] += 1
            continue
        plan, site, job = case
        nodes = int(row["nodes"])
        run = dict(group=(row["model"], nodes), split=split_of_ultrascale(nodes), model=row["model"], nodes=nodes,
                   dp=plan.dp, tp=plan.tp, pp=plan.pp, mbs=plan.micro_batch_size, gas=int(row["gas"]),
                   zero=int(row["zero_stage"]), plan=plan, site=site, job=job, cases=len(ok),
                   predict=lambda model, overlap="nanotron", plan=plan, site=site, job=job:
                   ultrascale_predict_one(plan, site, job, model, overlap))
        if ok:
            run["measured"] = float(np.median([float(r["iter_time_s"]) for r in ok])) * 1e3
            run["mem_gib"] = float(np.median([float(r["gpu_mem_gib"]) for r in ok]))
            timed.append(run)
        else:
            run["status"] = ("crashed_or_oom_with_metrics"
                             if any(r["status"] == "crashed_or_oom_with_metrics" for r in members)
                             else "crashed_or_oom")
            untimed.append(run)
    return path, timed, untimed, dict(left)


#: how a pass prices the playbook's gradient synchronisation: no overlap; Megatron's DDP
#: (default buckets on the first pipeline rank) over a fabric the site does not name (the
#: pricing before EFA's ring: NCCL's ring or tree, as on InfiniBand); Megatron's DDP over EFA;
#: nanotron's (PyTorch DDP: 25 MiB buckets on every rank) over EFA
ULTRASCALE_SYNC = ("off", "megatron-unnamed-fabric", "megatron", "nanotron")


def ultrascale_predict_one(plan, site, job, model, overlap="nanotron"):
    """One plan's prediction with its gradient synchronisation priced as ``overlap`` says
    (:data:`ULTRASCALE_SYNC`; False / True: off / megatron)."""
    sync = {False: "off", True: "megatron"}.get(overlap, overlap)
    if sync == "off":
        return predict_plan(plan, site, job, model)
    if sync == "megatron-unnamed-fabric":
        site = dataclasses.replace(site, partitions=tuple(dataclasses.replace(p, fabric="") for p in site.partitions))
        return predict_plan(dataclasses.replace(plan, overlap_grad_reduce=True), site, job, model)
    if sync == "megatron":
        return predict_plan(dataclasses.replace(plan, overlap_grad_reduce=True), site, job, model)
    return predict_plan(dataclasses.replace(plan, overlap_grad_reduce=True, ddp_bucket_size=NANOTRON_BUCKET_PARAMS),
                        site, job, model, options=NANOTRON_DDP)


def ultrascale_ranking_runs(panels=None):
    """The ultrascale-dev layouts that ran, as the cross-set tables take them: ``(path, chip,
    nodes_kind, runs)`` like :func:`mlm_ci_runs`, each run with its own chip (H100, never in
    the store: datasheet-only in both passes) and site kind (one node: single-node, else
    multi-node), its plan with ``overlap_grad_reduce`` off (``predict(model)``: the first pass
    of :func:`score_ultrascale`)."""
    path, timed, _, _ = ultrascale_runs(panels=panels)
    chip = _chip(catalog(), ULTRASCALE_GPU)
    for r in timed:
        plan = r["plan"]
        r.update(name=r["model"], chip=chip, nodes_kind="single-node" if r["nodes"] == 1 else "multi-node",
                 queries=[layer_query(r["job"], ULTRASCALE_GPU, kind="layer", tp=plan.tp,
                                      micro_batch_size=plan.micro_batch_size, recompute="none",
                                      sequence_parallel=plan.sequence_parallel)])
    return path, None, None, timed


def ultrascale_family(r) -> str:
    """The layout family a time error is reported by."""
    if r["tp"] > 8:
        return "TP across nodes (tp > 8)"
    return "pp = 1" if r["pp"] == 1 else "pp > 1"


ULTRASCALE_FAMILIES = ("pp = 1", "pp > 1", "TP across nodes (tp > 8)")


def ultrascale_predict(timed, untimed, model, overlap="off") -> None:
    """Fill ``pred`` (iteration ms), ``feasible`` and ``pred_fit`` (the predicted time of a
    plan predicted to fit, else far behind every one that does), the plans' gradient
    synchronisation as ``overlap`` says (:data:`ULTRASCALE_SYNC`)."""
    for r in list(timed) + list(untimed):
        p = r["predict"](model, overlap)
        r["pred"], r["feasible"], r["prediction"] = p.iteration_ms, p.feasible, p
        r["pred_fit"] = p.iteration_ms if p.feasible else 1e12 + p.iteration_ms


def score_ultrascale(timed, untimed, model, roof=None) -> list[list]:
    """Rows of the ultrascale table: per pass (the gradient synchronisation priced without
    overlap, as Megatron's DDP runs it, as nanotron's runs it: :data:`ULTRASCALE_SYNC`) and
    split, the ranking of the predictor (all plans that ran; and only those it predicts fit),
    time MAPE overall and by family, and the false-OOM calls."""
    rows = []
    passes = [("predictor", model, sync) for sync in ULTRASCALE_SYNC]
    if roof is not None:
        passes.append(("roofline", roof, "nanotron"))
    for label, m, overlap in passes:
        ultrascale_predict(timed, untimed, m, overlap)
        s_all, s_fit = score_groups(timed, "pred"), score_groups(timed, "pred_fit")
        for split in ("dev", "test"):
            half = [r for r in timed if r["split"] == split]
            crashed = [r for r in untimed if r["split"] == split]
            if not half:
                continue
            fam = {f: [ape(r["pred"], r["measured"]) for r in half if ultrascale_family(r) == f]
                   for f in ULTRASCALE_FAMILIES}
            for which, s in (("all that ran", s_all), ("predicted to fit", s_fit)):
                o = s[split]
                rows.append([label, ULTRASCALE_SYNC_WORDS[overlap], split, which, o["groups"],
                             f"{o['top1_n']}/{o['groups']}", f"{o['rule_n']}/{o['groups']}",
                             f"{o['regret']:.1f} / {o['regret_median']:.1f}",
                             f"{o['rule_regret']:.1f} / {o['rule_regret_median']:.1f}",
                             f"{np.mean([ape(r['pred'], r['measured']) for r in half]):.1f}",
                             *(f"{np.mean(v):.1f} ({len(v)})" if v else "-" for v in fam.values()),
                             f"{sum(not r['feasible'] for r in half)}/{len(half)}",
                             f"{sum(not r['feasible'] for r in crashed)}/{len(crashed)}"])
    return rows


ULTRASCALE_SYNC_WORDS = {"off": "not overlapped", "megatron-unnamed-fabric": "Megatron DDP, fabric unnamed",
                         "megatron": "Megatron DDP buckets",
                         "nanotron": "nanotron DDP (as run)"}
ULTRASCALE_HEADERS = ["cost model", "gradient sync priced", "split", "predictor picks among", "groups", "top-1",
                      "rule top-1", "regret % mean / median", "rule regret % mean / median", "time MAPE %",
                      "MAPE pp = 1 (n)", "MAPE pp > 1 (n)", "MAPE tp > 8 (n)", "false OOM (ran, predicted not to fit)",
                      "never ran, predicted not to fit"]


def ultrascale_section(model=None, panels=None) -> int:
    """Print the ultrascale-dev tables; ``model``: the predictor (None: fitted here on the store)."""
    path, timed, untimed, left = ultrascale_runs(panels=panels)
    if model is None:
        model = fit_without(store_samples(shared_data()), None)
    print(f"\nultrascale-dev: {path} (Hugging Face's Ultra-Scale Playbook, nanotron, Apache-2.0): "
          f"{len(timed)} layouts that ran, {len(untimed)} that never ran "
          f"({sum(r['status'] == 'crashed_or_oom_with_metrics' for r in untimed)} of them slow runs killed after "
          f"logging); left out: " + (", ".join(f"{k}: {v}" for k, v in sorted(left.items())) or "none"))
    print(f"site: nodes x 8 {ULTRASCALE_GPU} (NVLink: the catalog's {catalog().get(ULTRASCALE_GPU).link_gbps:g} GB/s; "
          f"EFA {ULTRASCALE_EFA_GBPS:g} GB/s a GPU between nodes); chip in store: "
          f"{'no (datasheet-only: the transfer model answers H100)' if not _profiled(model) else 'yes'}")
    rows = score_ultrascale(timed, untimed, model, AnalyticCostModel(catalog()))
    print(f"\nRanking within (model, nodes) panels (test: {sorted(ULTRASCALE_TEST_NODES)} nodes, locked; groups of "
          f">= 2 layouts that ran; 'predicted to fit': plans the tool predicts do not fit are ranked behind every "
          f"plan it predicts fit, as the search drops them):")
    table(rows, ULTRASCALE_HEADERS)
    print("regret: measured time of the pick over the panel's measured fastest, minus 1. The rule picks among the "
          "layouts that ran (ties between ZeRO-0 and ZeRO-1 of one layout go to the first row of the file). "
          "false OOM: layouts that ran that the tool predicts do not fit.")
    ultrascale_memory_section(timed, model)
    return 0


#: What the playbook's ``gpu_mem_gib`` is, from the code that logged it (not from the rows).
#: nanotron's benchmark mode (``NANOTRON_BENCHMARK=1``) has global rank 0 append one row to the
#: benchmark CSV at iteration 3 (huggingface/nanotron at e24d2483, 2025-02-19, the playbook's
#: publication day: src/nanotron/trainer.py ``train_step_logs`` -> src/nanotron/helpers.py
#: ``log_throughput`` / ``create_table_log``), with ``"Mem Alloc (GB)" =
#: torch.cuda.max_memory_allocated() / 1024**3`` and ``"Mem Res (GB)" =
#: torch.cuda.max_memory_reserved() / 1024**3``. The playbook figure's "GPU memory" (and so
#: ``gpu_mem_gib``) is the second: its 1B 1-node dp8 mbs2 ZeRO-0 point reads 50.2 where the sweep's
#: CSV (bench_final2_mfu2.csv, a copy in eyao600/Rapid-LLM validation_scripts/huggingface_data/)
#: has Mem Res 50.18 and Mem Alloc 25.07; dp8 mbs1: 36.7 vs 36.67 / 25.07; dp4 tp2 mbs8: 68.3
#: vs 68.32 / 12.82. Mem Alloc is no training peak: ``log_memory`` (src/nanotron/logging.py)
#: resets the peak statistics after each of the first five ``train_batch_iter``, so it is the
#: peak of the optimizer step; the reserved high-water survives the reset (the caching allocator
#: keeps what it reserved, and nothing empties its cache in the loop). Global rank 0 is pipeline
#: stage 0, TP rank 0, DP rank 0 (nanotron's ParallelContext lays the ranks out as
#: (ep, pp, dp, cp, tp) with tp fastest).
ULTRASCALE_MEM_SOURCE = ("gpu_mem_gib = nanotron's benchmark-CSV 'Mem Res (GB)' = torch.cuda.max_memory_reserved() / "
                         "2**30 of global rank 0 (pipeline stage 0), logged at iteration 3 (huggingface/nanotron "
                         "e24d2483 src/nanotron/helpers.py create_table_log / log_throughput; matched to the sweep's "
                         "CSV, bench_final2_mfu2.csv, row by row: 50.2 = Mem Res 50.18, Mem Alloc 25.07)")

#: the levels a stage-0 prediction is compared at: (name, bytes of a StagePrediction)
ULTRASCALE_MEM_LEVELS = (
    ("reserved: S + a*act (no b)", lambda s: s.peak_bytes - s.overhead_bytes),
    ("allocated: S + act (no a, no b)", lambda s: s.state_bytes + s.activation_bytes),
    ("device: S + a*act + b", lambda s: s.peak_bytes),
)
ULTRASCALE_MEM_GROUPS = (("all", lambda r: True),
                         *((f, lambda r, f=f: ultrascale_family(r) == f) for f in ULTRASCALE_FAMILIES),
                         ("ZeRO-0", lambda r: r["zero"] == 0), ("ZeRO-1", lambda r: r["zero"] == 1))
ULTRASCALE_MEM_HEADERS = ["split", "layouts", "rows", "memory MAPE %", "median signed error %", "p10 signed %",
                          "p90 signed %"]


def ultrascale_memory_errors(timed, model) -> None:
    """Fill each run's ``mem_err``: level name -> signed error % of the predicted memory of
    pipeline stage 0 (global rank 0's stage, the one the playbook logged) against the measured
    ``mem_gib`` (positive: the prediction is high). Nothing is fitted here."""
    for r in timed:
        s0 = next(s for s in r["predict"](model, "nanotron").stages if s.stage == 0)
        r["mem_err"] = {name: 100.0 * (f(s0) / 2**30 - r["mem_gib"]) / r["mem_gib"]
                        for name, f in ULTRASCALE_MEM_LEVELS}
        r["mem_pred_gib"] = {name: f(s0) / 2**30 for name, f in ULTRASCALE_MEM_LEVELS}


def memory_error_row(split: str, group: str, errors) -> list:
    e = np.asarray(errors, dtype=float)
    if not len(e):
        return [split, group, 0, "-", "-", "-", "-"]
    return [split, group, len(e), f"{np.mean(np.abs(e)):.1f}", f"{np.median(e):+.1f}",
            f"{np.percentile(e, 10):+.1f}", f"{np.percentile(e, 90):+.1f}"]


def score_ultrascale_memory(timed, level: str) -> list[list]:
    """Rows of the memory table at ``level``: per split (the locked one) and layout group."""
    rows = []
    for split in ("dev", "test"):
        half = [r for r in timed if r["split"] == split]
        for group, keep in ULTRASCALE_MEM_GROUPS:
            rows.append(memory_error_row(split, group, [r["mem_err"][level] for r in half if keep(r)]))
    return rows


def worst_memory_rows(timed, level: str, n: int = 3) -> list[list]:
    """The ``n`` lowest and the ``n`` highest signed errors of each split at ``level``."""
    rows = []
    for split in ("dev", "test"):
        half = sorted((r for r in timed if r["split"] == split), key=lambda r: r["mem_err"][level])
        for r in half[:n] + half[-n:]:
            rows.append([split, f"{r['model']} n{r['nodes']} dp{r['dp']} tp{r['tp']} pp{r['pp']} mbs{r['mbs']} "
                                f"zero{r['zero']}", ultrascale_family(r), f"{r['mem_gib']:.1f}",
                         f"{r['mem_pred_gib'][level]:.1f}", f"{r['mem_err'][level]:+.1f}"])
    return rows


def ultrascale_memory_section(timed, model) -> None:
    """Print the memory accuracy of the layouts that ran: the like-for-like level (what the
    playbook logged: the caching allocator's reserved peak of stage 0) by split and group, the
    other two levels for all rows, and the largest errors. Measured against predicted; the
    predictor is the one the ranking used, fitted on the store, never on these rows."""
    ultrascale_memory_errors(timed, model)
    like = ULTRASCALE_MEM_LEVELS[0][0]
    print(f"\nMemory of the layouts that ran (ultrascale-dev, pipeline stage 0 predicted against the measured "
          f"gpu_mem_gib; signed error = (predicted - measured) / measured, negative: predicted low; nothing fitted "
          f"to these rows).\nCompared at the allocator's reserved level, {like}: {ULTRASCALE_MEM_SOURCE}. "
          f"S = state, act = held activations, a = allocator slope, b = CUDA context / NCCL / cuBLAS outside "
          f"PyTorch's allocator.")
    table(score_ultrascale_memory(timed, like), ULTRASCALE_MEM_HEADERS)
    print("\nAll layouts at each level (reserved is the like-for-like one; allocated and device bracket it):")
    table([[lvl] + row for lvl, _ in ULTRASCALE_MEM_LEVELS for row in score_ultrascale_memory(timed, lvl)
           if row[1] == "all"], ["level"] + ULTRASCALE_MEM_HEADERS)
    print("\nExtremes at the reserved level (per split the 3 lowest signed errors, then the 3 highest):")
    table(worst_memory_rows(timed, like), ["split", "layout", "family", "measured GiB", "predicted GiB",
                                           "signed error %"])


def _profiled(model) -> bool:
    if not hasattr(model, "explain"):
        return False
    q = layer_query(ultrascale_job({"num_heads": "32", "num_kv_heads": "32", "model": "1B", "num_layers": "16",
                                    "hidden_size": "2048", "ffn_hidden_size": "8192", "vocab_size": "131072",
                                    "seq_len": "4096", "tie_word_embeddings": "1", "gbs_seqs": "256"}, True),
                    ULTRASCALE_GPU, kind="layer", tp=1, micro_batch_size=1, recompute="none", sequence_parallel=False)
    return not _least_direct(model, [q]).startswith("datasheet")


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
                          regret_median=float(np.median(regret)) * 100 if n else float("nan"),
                          rule_regret_median=float(np.median(rule_regret)) * 100 if n else float("nan"),
                          top1_n=top1, rule_n=rule1)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=("ultrascale",), help="score only this set")
    ap.add_argument("--explain", choices=("ultrascale",),
                    help="print the predicted iteration of representative layouts term by term against the "
                         "measured time (benchmarks/ultrascale_terms.py)")
    args = ap.parse_args(argv)
    if args.explain:
        import ultrascale_terms
        return ultrascale_terms.main([])
    if args.only == "ultrascale":
        return ultrascale_section()
    data = shared_data()
    print(f"data: {data} ({SOURCES['vtrain']}; {SOURCES['sailor']}; {SOURCES['cephalo']})")
    samples = store_samples(data)
    print(f"store: {len(samples)} per-layer samples (Sailor profiles + Cephalo latencies)")
    sets = [("vTrain",) + vtrain_runs(), ("Sailor",) + sailor_runs(), ("MLM-CI",) + mlm_ci_runs(),
            ("ultrascale-dev",) + ultrascale_ranking_runs()]
    rank_rows: list = []
    prov: dict[tuple, list] = defaultdict(list)
    kind_rows, mem_rows = [], []
    cat = catalog()
    stored = {_chip(cat, s.point.gpu_type) for s in samples}
    fits: dict = {}
    for name, path, chip, nodes_kind, all_runs in sets:
        for store_kind, drop in (("profiled", None), ("datasheet-only", chip)):
            if drop not in fits:
                fits[drop] = fit_without(samples, drop)
            model = fits[drop]
            # a set whose GPU types the store never held (the CI's H100 and GB200 runs, the
            # ultrascale H100 sweep) is datasheet-only in both passes: its "profiled" pass keeps
            # the profiled types only
            runs = [r for r in all_runs if store_kind == "datasheet-only" or r.get("chip", chip) in stored]
            for kind in sorted({r.get("nodes_kind", nodes_kind) for r in runs}):
                sub = [r for r in runs if r.get("nodes_kind", nodes_kind) == kind]
                label = name if nodes_kind else f"{name} {kind}"
                _score_pass(label, kind, store_kind, sub, model, prov, rank_rows, kind_rows, mem_rows)
    _print_tables(rank_rows, prov, kind_rows, mem_rows)
    # its own tables after the others' (which it leaves as they were): H100 is not in the
    # store, so the predictor fitted on all of it is the one that answers
    return ultrascale_section(fits[None])


def _score_pass(name, nodes_kind, store_kind, runs, model, prov, rank_rows, kind_rows, mem_rows) -> None:
    """Predict ``runs`` with ``model`` (and the roofline) and append their rows to the tables."""
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


def _print_tables(rank_rows, prov, kind_rows, mem_rows) -> None:
    print(f"\nRanking within groups of plans for the same GPUs (test: vTrain {sorted(VTRAIN_TEST_LAYERS)}-layer "
          f"models, Sailor {sorted(SAILOR_TEST_NODES)} nodes, MLM-CI the CSV's test case families, ultrascale-dev "
          f"{sorted(ULTRASCALE_TEST_NODES)} nodes; groups of >= 2 plans):")
    table(rank_rows, ["set", "chip in store", "split", "cost model", "groups", "top-1", "rule top-1",
                      "mean regret %", "rule regret %", "time MAPE %"])
    print("regret: measured time of the picked plan over the group's measured fastest, minus 1. 'datasheet-only': "
          "every sample of the set's chip (vTrain GA100-SXM4, Sailor GH200, MLM-CI GA100-SXM4) removed from the "
          "store before the fit; MLM-CI's H100-SXM and GB200 were never profiled, so its 'profiled' rows hold "
          "its A100 groups only; ultrascale-dev (H100-SXM, never profiled) has datasheet-only rows only, its "
          "gradient synchronisation priced as nanotron ran it (its own section below scores the other ways too).")
    print("\nTime MAPE of the predictor's plans by the least direct provenance of their layer times:")
    rows = [[name, how, split, len(v), f"{np.mean(v):.1f}", f"{np.median(v):.1f}"]
            for name in dict.fromkeys(k[0] for k in prov) for how in HOW_ORDER for split in ("dev", "test")
            for v in [prov.get((name, how, split), [])] if v]
    table(rows, ["set", "provenance", "split", "plans", "time MAPE %", "median APE %"])
    print("\nMemory: predicted device peak (uncalibrated) against Sailor's recorded max_mem (bias: mean signed "
          "error, negative = predicted low):")
    table(mem_rows, ["set", "chip in store", "split", "plans", "MAPE %", "bias %", "max APE %"])
    print("\nBy site kind (predictor against the rule, every set's groups of that kind counted; "
          "memx_hpc/data/ranking.yaml copies the dev rows):")
    table(site_kind_rows(kind_rows), ["nodes", "chip in store", "split", "groups", "predictor top-1", "rule top-1",
                                      "recommends"])


def site_kind_rows(kind_rows) -> list[list]:
    """The 'By site kind' table: per (nodes, chip in store, split), the groups of every set of
    that kind (``kind_rows``: what :func:`_score_pass` appends) and their top-1 counts summed."""
    agg: dict[tuple, list] = defaultdict(lambda: [0, 0, 0])
    for nodes_kind, store_kind, split, _, o in kind_rows:
        a = agg[(nodes_kind, store_kind, split)]
        a[0] += o["groups"]
        a[1] += o["top1_n"]
        a[2] += o["rule_n"]
    return [[nk, sk, split, n, f"{t / n:.0%}", f"{r / n:.0%}", "predictor" if t >= r else "rule"]
            for (nk, sk, split), (n, t, r) in sorted(agg.items())]


if __name__ == "__main__":
    raise SystemExit(main())
