"""Where the composition goes wrong on ultrascale-dev: predicted iterations term by term.

For a handful of representative layouts of the Ultra-Scale Playbook's H100 runs
(../shared/data/ultrascale-dev, Apache-2.0; the set benchmarks/ranking.py ``--only
ultrascale`` scores), the predicted iteration of memx_hpc.model.compose.predict_plan is cut
into its terms and set beside the measured time:

* compute: micro-batches x the slowest stage's forward + backward per micro-batch (the layer
  cost model's times, TP collectives inside them);
* TP in node / TP across nodes: the part of compute that is TP communication: inside a node
  the ring of the two s·b·h collectives per layer forward at the catalog's NVLink figure (what
  the roofline prices; the layer cost model carries its own), across nodes what the
  composition adds for a TP group over several NVLink domains (compose.tp_internode_ms: NCCL's
  model of the group's shape, collectives.py);
* bubble: the 1F1B schedule with free links less compute; p2p: what the links add to it;
* DP sync: the gradient synchronisation the critical stage waits for, priced by collectives.py
  (all of it with ``--sync off``; in Megatron's buckets with ``--sync megatron``: the last
  bucket and what outruns the first stage's last backward; by default as nanotron runs it,
  PyTorch DDP's 25 MiB buckets on every pipeline rank, ring all-reduce over EFA);
* optimizer, tied embeddings (the first/last-stage all-reduce), fixed: none priced.

Then the evidence of scaling at fixed layout, measured against predicted: DP scaling across
node counts, micro-batch scaling, pipeline depth, TP across nodes and ZeRO-1 against ZeRO-0.
Nothing is fitted; the cost model is the one benchmarks/ranking.py scores.

Run from the repository root:  .venv/bin/python benchmarks/ultrascale_terms.py [--sync off|megatron|nanotron]
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import ranking  # noqa: E402

from memx_hpc.spec.catalog import catalog  # noqa: E402
from memx_hpc.datapaths import shared_data  # noqa: E402
from memx_hpc.model import analytic  # noqa: E402
from memx_hpc.model.compose import (interleaved_finish, link_model_for, shape_of, tp_internode_ms)  # noqa: E402
from memx_hpc.tables import table  # noqa: E402

#: TP-collective forwards per layer, per embedding, per head (compose.TP_COLLECTIVE_UNITS, no recompute)
TP_UNITS_LAYER, TP_UNITS_END = 2.0, 0.5

TERMS = ("compute", "TP in node", "TP across nodes", "bubble", "p2p", "DP sync", "optimizer", "tied emb", "fixed")


def terms_of(r, model) -> dict[str, float]:
    """The predicted iteration of run ``r`` (its ``prediction``) cut into :data:`TERMS` (ms).
    compute, bubble, p2p, DP sync, optimizer and tied add up to the iteration; the TP terms
    are parts of compute."""
    p = r["prediction"]
    plan, site, job = r["plan"], r["site"], r["job"]
    m = p.num_microbatches
    st = sorted(p.stages, key=lambda s: s.stage)
    fwd = np.array([[s.forward_ms for s in st]])
    bwd = np.array([[s.backward_ms for s in st]])
    free = interleaved_finish(fwd, bwd, np.zeros((1, max(1, len(st) - 1))), m)[0]
    compute = m * float(max(s.time_ms for s in st))
    crit = max(st, key=lambda s: s.finish_ms)
    links = np.array([[s.send_ms for s in st[:-1]]]) if len(st) > 1 else np.zeros((1, 1))
    fin = interleaved_finish(fwd, bwd, links, m)[0]  # the Prediction's own schedule
    tied = crit.finish_ms - float(fin[crit.stage]) - crit.grad_sync_ms - crit.optimizer_ms
    lm = link_model_for(site, model)
    layers = max(s.num_layers for s in st)
    units = m * (TP_UNITS_LAYER * layers + TP_UNITS_END)
    nbytes = analytic.tp_allreduce_bytes(shape_of(job), micro_batch_size=plan.micro_batch_size,
                                         precision=job.precision)
    gpu = site.gpu(crit.gpu_type)
    tp_in = units * analytic.ring_allreduce_ms(nbytes, min(plan.tp, 8), gpu.link_gbps)
    tp_x = units * tp_internode_ms(lm, job, partition=crit.partition, gpu_type=crit.gpu_type, tp=plan.tp,
                                   micro_batch_size=plan.micro_batch_size)
    return {"compute": compute, "TP in node": tp_in, "TP across nodes": tp_x,
            "bubble": float(max(free)) - compute, "p2p": p.pipeline_ms - float(max(free)),
            "DP sync": crit.grad_sync_ms, "optimizer": crit.optimizer_ms, "tied emb": max(0.0, tied), "fixed": 0.0}


def _name(r) -> str:
    return (f"{r['model']} n{r['nodes']} dp{r['dp']} tp{r['tp']} pp{r['pp']} mbs{r['mbs']} z{r['zero']}")


def representative(timed) -> list[tuple[str, dict]]:
    """The layouts of the term table, chosen by rule (not by their errors): per model, the
    pp = 1 layout of the largest DP and micro-batch 1 at 1, 8 and 64 nodes; the fastest
    measured pp > 1 layout at 8 nodes; the tp 16 and tp 32 layouts (pp 1, mbs 1) at 8 nodes;
    and micro-batch 1 against 4 of one layout (pp 1, tp 1, 1 node)."""
    by = defaultdict(list)
    for r in timed:
        by[(r["model"], r["nodes"])].append(r)
    out = []

    def first(rs, why):
        rs = sorted(rs, key=lambda r: (r["zero"], r["measured"]))
        if rs:
            out.append((why, rs[0]))

    for model in ("1B", "3B"):
        for nodes in (1, 8, 64):
            g = [r for r in by[(model, nodes)] if r["pp"] == 1 and r["mbs"] == 1]
            if g:
                dp = max(r["dp"] for r in g)
                first([r for r in g if r["dp"] == dp], f"DP-only, {nodes} node(s)")
        g = [r for r in by[(model, 8)] if r["pp"] > 1]
        if g:
            out.append(("pp > 1: fastest measured", min(g, key=lambda r: r["measured"])))
        for tp in (16, 32):
            first([r for r in by[(model, 8)] if r["tp"] == tp and r["pp"] == 1 and r["mbs"] == 1],
                  f"TP {tp} across nodes")
        # micro-batch 1 against 4 of one pp = 1 layout: the fewest nodes, then the smallest TP that ran both
        pairs = defaultdict(dict)
        for r in timed:
            if r["model"] == model and r["pp"] == 1 and r["mbs"] in (1, 4):
                pairs[(r["nodes"], r["tp"], r["zero"])][r["mbs"]] = r
        both = sorted(k for k, v in pairs.items() if len(v) == 2)
        if both:
            out += [(f"mbs {mbs} of one layout", pairs[both[0]][mbs]) for mbs in (1, 4)]
    return out


def term_table(timed, model) -> None:
    rows = []
    for why, r in representative(timed):
        t = terms_of(r, model)
        rows.append([why, _name(r), f"{r['measured']:.0f}", f"{r['pred']:.0f}", f"{r['pred'] / r['measured']:.2f}",
                     r["prediction"].num_microbatches, *(f"{t[k]:.0f}" for k in TERMS)])
    table(rows, ["layout family", "layout", "measured ms", "predicted ms", "pred/meas", "m", *TERMS])


def _ratio_rows(timed, vary: str, fixed: tuple[str, ...], base) -> dict:
    """measured and predicted t(vary = v) / t(vary = base) at fixed ``fixed`` keys, per v."""
    groups = defaultdict(dict)
    for r in timed:
        groups[tuple(r[k] for k in fixed)][r[vary]] = r
    out = defaultdict(list)
    for g in groups.values():
        b = g.get(base)
        if b is None:
            continue
        for v, r in g.items():
            if v != base:
                out[v].append((r["measured"] / b["measured"], r["pred"] / b["pred"]))
    return out


def _print_ratio(title, timed, vary, fixed, base) -> None:
    res = _ratio_rows(timed, vary, fixed, base)
    rows = []
    for v in sorted(res):
        a = np.array(res[v])
        rows.append([f"{vary} {v} / {vary} {base}", len(a), f"{np.median(a[:, 0]):.2f}", f"{np.median(a[:, 1]):.2f}",
                     f"{np.median(a[:, 1] / a[:, 0]):.2f}"])
    print(f"\n{title}")
    table(rows, ["ratio", "pairs", "measured (median)", "predicted (median)", "predicted / measured"])


def dp_scaling(timed, model) -> None:
    """Per model, the pp = 1 layouts of one TP and micro-batch across node counts: GPU-seconds
    (time x GPUs) per iteration, measured and predicted, and the predicted terms."""
    print("\nDP scaling at fixed layout (pp 1, mbs 1, ZeRO-1 where run, else ZeRO-0; tp 1 to 32 nodes, tp 2 "
          "everywhere): time x GPUs is constant where communication is free")
    rows = []
    for model_name in ("1B", "3B"):
        for tp in (1, 2):
            for nodes in (1, 2, 4, 8, 16, 32, 64):
                c = [r for r in timed if r["model"] == model_name and r["nodes"] == nodes and r["pp"] == 1
                     and r["tp"] == tp and r["mbs"] == 1]
                if not c:
                    continue
                r = sorted(c, key=lambda r: -r["zero"])[0]
                t = terms_of(r, model)
                rows.append([model_name, tp, nodes, r["dp"], r["zero"], f"{r['measured']:.0f}", f"{r['pred']:.0f}",
                             f"{r['measured'] * r['nodes'] * 8 / 1e3:.1f}", f"{r['pred'] * r['nodes'] * 8 / 1e3:.1f}",
                             f"{t['compute']:.0f}", f"{t['DP sync']:.0f}",
                             f"{r['measured'] - t['compute']:.0f}"])
    table(rows, ["model", "tp", "nodes", "dp", "zero", "measured ms", "predicted ms", "measured GPU-s",
                 "predicted GPU-s", "pred compute ms", "pred DP sync ms", "measured - pred compute ms"])


def pipeline_excess(timed) -> None:
    """pp > 1 layouts (tp <= 8) by node count: measured minus predicted time per micro-batch,
    for those whose stage boundaries cross nodes (a stage of dp x tp >= 8 GPUs fills its
    nodes) and those whose boundaries stay inside a node."""
    rows = []
    for cross in (False, True):
        for nodes in sorted({r["nodes"] for r in timed}):
            g = [r for r in timed if r["pp"] > 1 and r["tp"] <= 8 and r["nodes"] == nodes
                 and (r["dp"] * r["tp"] >= 8) == cross]
            if not g:
                continue
            x = np.array([(r["measured"] - r["pred"]) / r["prediction"].num_microbatches for r in g])
            rows.append(["stage >= a node: every one crosses" if cross else "stage < a node: some inside", nodes, len(g), f"{np.median(x):.0f}",
                         f"{np.percentile(x, 25):.0f}", f"{np.percentile(x, 75):.0f}",
                         f"{np.mean(x > 500):.0%}"])
    print("\nPipelines (pp > 1, tp <= 8): measured - predicted ms per micro-batch, by where the stage boundaries run")
    table(rows, ["boundaries", "nodes", "layouts", "median", "p25", "p75", "share > 500 ms"])


def family_bias(timed) -> None:
    rows = []
    fam = defaultdict(list)
    for r in timed:
        fam[(r["model"], ranking.ultrascale_family(r), "1 node" if r["nodes"] == 1 else "multi-node")].append(
            r["pred"] / r["measured"])
    for k in sorted(fam):
        v = np.array(fam[k])
        rows.append([*k, len(v), f"{np.median(v):.2f}", f"{np.percentile(v, 10):.2f}", f"{np.percentile(v, 90):.2f}"])
    print("\nPredicted / measured time by family (below 1: predicted too fast)")
    table(rows, ["model", "family", "nodes", "layouts", "median", "p10", "p90"])


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sync", choices=ranking.ULTRASCALE_SYNC, default="nanotron",
                    help="how the gradient synchronisation is priced: not overlapped, in Megatron's DDP buckets "
                         "(--overlap-grad-reduce, default bucket size on the first pipeline rank), or as nanotron "
                         "runs it (PyTorch DDP, 25 MiB buckets on every rank; the default)")
    args = ap.parse_args(argv)
    _, timed, untimed, _ = ranking.ultrascale_runs()
    model = ranking.fit_without(ranking.store_samples(shared_data()), None)
    ranking.ultrascale_predict(timed, [], model, args.sync)
    print(f"ultrascale-dev, {catalog().get(ranking.ULTRASCALE_GPU).name} x 8 a node, EFA "
          f"{ranking.ULTRASCALE_EFA_GBPS:g} GB/s a GPU; gradient sync priced "
          f"{ranking.ULTRASCALE_SYNC_WORDS[args.sync]}; ms per iteration")
    print("\nPredicted iteration term by term (compute + bubble + p2p + DP sync + optimizer + tied emb = predicted; "
          "the TP terms are inside compute)")
    term_table(timed, model)
    dp_scaling(timed, model)
    family_bias(timed)
    pipeline_excess(timed)
    for fam, keep in (("pp = 1, tp <= 8", lambda r: r["pp"] == 1 and r["tp"] <= 8),
                      ("pp > 1, tp <= 8", lambda r: r["pp"] > 1 and r["tp"] <= 8)):
        _print_ratio(f"Micro-batch scaling at fixed (model, nodes, dp, tp, pp, zero), {fam} (same work, "
                     f"fewer micro-batches)", [r for r in timed if keep(r)], "mbs",
                     ("model", "nodes", "dp", "tp", "pp", "zero"), 1)
    _print_ratio("Pipeline depth at fixed (model, nodes, tp, mbs, zero): dp shrinks as pp grows", timed, "pp",
                 ("model", "nodes", "tp", "mbs", "zero"), 1)
    _print_ratio("TP at fixed (model, nodes, mbs, zero), pp = 1 (dp shrinks as tp grows): tp > 8 crosses nodes",
                 [r for r in timed if r["pp"] == 1], "tp", ("model", "nodes", "pp", "mbs", "zero"), 8)
    _print_ratio("ZeRO-1 (distributed optimizer) against ZeRO-0 of one layout", timed, "zero",
                 ("model", "nodes", "dp", "tp", "pp", "mbs"), 0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
