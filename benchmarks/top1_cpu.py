"""Planner top-1 against measured top-1 on this machine, through the real local Slurm.

A small space of plans that fit this 2-core machine (world size <= 2, so ranks never
share a core; one thread per rank) is built by hand: tensor, pipeline and data
parallel degrees, micro-batch, layer split across two partitions, and recompute per
stage are varied. Every plan is

* predicted by the planner's own composition (``memx_hpc.search.cost.predict_plan``,
  the search's cost model) with the site's cost model: the XGBoost predictor fitted on
  the site's profile store when the store holds samples of every GPU type of the site,
  else the datasheet roofline (``AnalyticCostModel``), and the output says which;
* rendered (``memx_hpc.slurm.render``), submitted to the real local Slurm as a (het)job
  that runs the local site's Megatron entry (megatron-core on the CPU), and measured
  from its Megatron-LM style log: median iteration time after the first iteration, the
  peak of live tensor bytes (``max allocated``) and the process footprint (``max
  reserved`` = peak RSS) of every rank.

It prints one row per plan and then: planner top-1 vs measured top-1 under the
time-only ranking and under the weighted-product ranking (MemX's objective, the same
weights for both sides), Spearman rank correlation between predicted and measured
orders, and MAPE of iteration time and of peak memory. The MemX paper's claim to beat:
it was the only method whose top-1 was the measured best under both rankings.

Memory comparison: measured ``max allocated`` against the predicted peak without the
predicted runtime overhead (both are tensor bytes); measured peak RSS against the
predicted peak with it (both are what the device, here the process, holds). The
measured utilisation used in the weighted ranking is peak RSS / the GPU type's capacity.

Run from the repository root with the local cluster up (``scripts/slurm-local.sh start``):

    .venv/bin/python benchmarks/top1_cpu.py [--iters 4] [--max-plans N] [--json results.json]

Each plan is one Slurm job of ~15-40 s here (interpreter start-up, then the iterations);
plans run one after another so that they do not compete for the two cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from memx_hpc.errors import MemxError, SpecError  # noqa: E402
from memx_hpc.spec import Plan, Recompute, Site, Stage, TrainJob, load_job, load_site  # noqa: E402


# --------------------------------------------------------------------------- the space


def small_space(site: Site, job: TrainJob, *, first: str, second: str) -> list[Plan]:
    """Plans of world size <= 2 on ``first`` (and ``second`` for the second pipeline stage)."""
    L = job.model.num_layers
    gbs = job.global_batch_size
    mbs_choices = [m for m in (1, 4) if gbs % m == 0] or [1]
    plans: list[Plan] = []
    none, full = Recompute(), Recompute(mode="full")
    for tp, dp in ((1, 1), (2, 1), (1, 2)):
        for mbs in mbs_choices:
            if gbs % (mbs * dp):
                continue
            for rc in (none, full):
                plans.append(Plan(tp=tp, dp=dp, micro_batch_size=mbs, global_batch_size=gbs,
                                  stages=(Stage(partition=first, num_layers=L, recompute=rc),)))
    for k in sorted({1, L // 2, L - 1}):
        if not 0 < k < L:
            continue
        for mbs in mbs_choices:
            for rc0, rc1 in ((none, none), (none, full)):
                plans.append(Plan(tp=1, dp=1, micro_batch_size=mbs, global_batch_size=gbs,
                                  stages=(Stage(partition=first, num_layers=k, recompute=rc0),
                                          Stage(partition=second, num_layers=L - k, recompute=rc1))))
    return plans


def label(p: Plan) -> str:
    stages = "|".join(f"{s.partition.split('_')[-1]}:{s.num_layers}:{s.recompute.label()}" for s in p.stages)
    return f"tp{p.tp} pp{p.pp} dp{p.dp} mb{p.micro_batch_size} {stages}"


# --------------------------------------------------------------------------- the cost model


def cost_model_for(site: Site, choice: str):
    """(cost model, description). ``auto``: the fitted predictor when the store covers every
    GPU type of the site, else the datasheet roofline."""
    from memx_hpc.model.api import AnalyticCostModel

    if choice == "analytic":
        return AnalyticCostModel(site), "datasheet roofline (AnalyticCostModel): no profiles used"
    why = "no profile store at " + str(site.store)
    if site.store.exists():
        from memx_hpc.profile.store import ProfileStore

        store = ProfileStore(site.store)
        samples = store.samples()
        types = {site.partition(p.name).gpu_type for p in site.partitions}
        have = {s.point.gpu_type for s in samples}
        if types <= have:
            from memx_hpc.model.predictor import fit_or_load

            model = fit_or_load(samples, site.store.with_suffix(".predictor.ubj"), site)
            return model, f"XGBoost predictor fitted on {len(samples)} samples of {site.store}"
        why = f"the store at {site.store} has no samples of {sorted(types - have)}"
    if choice == "store":
        raise SpecError(f"--cost-model store: {why}; profile the site first")
    return AnalyticCostModel(site), f"datasheet roofline (AnalyticCostModel): {why}"


# --------------------------------------------------------------------------- measuring


@dataclasses.dataclass(frozen=True, kw_only=True)
class Measured:
    iteration_ms: float
    alloc_bytes_by_rank: dict[int, float]
    rss_bytes_by_rank: dict[int, float]
    gpu_by_rank: dict[int, str]
    job_id: str
    seconds: float
    load: float  # 1-minute load average around the run: > ranks means something else ran too


def measure(plan: Plan, site: Site, job: TrainJob, *, iters: int, log_dir: Path, name: str,
            timeout_s: float) -> Measured:
    from memx_hpc.slurm import render as rs
    from memx_hpc.train.logs import MB, parse_log

    script = log_dir / f"{name}.sbatch"
    script.write_text(rs.render(plan, site, job, iters=iters, log_dir=str(log_dir), workdir=str(ROOT),
                                job_name=name))
    t0 = time.monotonic()
    load_before = os.getloadavg()[0]
    job_id = rs.submit(script)
    outcome = rs.wait(job_id, timeout_s=timeout_s)
    text = (log_dir / f"{name}-{job_id}.out").read_text(errors="replace")
    if not outcome.ok:
        raise RuntimeError(f"job {job_id} ({label(plan)}) ended {outcome.state}:\n{text[-3000:]}")
    log = parse_log(text)
    if log.iterations_done != iters:
        raise RuntimeError(f"job {job_id} ran {log.iterations_done} of {iters} iterations:\n{text[-3000:]}")
    gpu = {int(d["rank"]): site.partition(d["partition"]).gpu_type for d in log.layouts}
    return Measured(iteration_ms=float(log.iteration_ms(skip_first=1)),
                    alloc_bytes_by_rank={r: v * MB for r, v in log.peak_memory_mb().items()},
                    rss_bytes_by_rank={r: v * MB for r, v in log.peak_reserved_mb().items()},
                    gpu_by_rank=gpu, job_id=job_id, seconds=time.monotonic() - t0,
                    load=max(load_before, os.getloadavg()[0]))


# --------------------------------------------------------------------------- statistics


def ranks_of(values: list[float]) -> list[int]:
    """1 = smallest; ties share the smallest rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0] * len(values)
    for pos, i in enumerate(order):
        out[i] = pos + 1 if pos == 0 or values[order[pos - 1]] != values[i] else out[order[pos - 1]]
    return out


def spearman(a: list[float], b: list[float]) -> float:
    from scipy.stats import spearmanr

    if len(a) < 3:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def mape(pred: list[float], true: list[float]) -> float:
    pairs = [(p, t) for p, t in zip(pred, true) if t > 0 and math.isfinite(p)]
    return 100.0 * sum(abs(p - t) / t for p, t in pairs) / len(pairs) if pairs else float("nan")


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--site", default=str(ROOT / "site_configs" / "local.yaml"))
    ap.add_argument("--job", default=str(ROOT / "jobs" / "tiny-gpt.yaml"))
    ap.add_argument("--first", default="nvidia_a100", help="partition of the first (or only) stage")
    ap.add_argument("--second", default="amd_mi250", help="partition of the second pipeline stage")
    ap.add_argument("--iters", type=int, default=4, help="training iterations per plan (the first is warm-up)")
    ap.add_argument("--max-plans", type=int, default=0, help="run only the first N plans of the space (0: all)")
    ap.add_argument("--cost-model", choices=("auto", "store", "analytic"), default="auto")
    ap.add_argument("--weights", default=None, help="objective weights, e.g. time=1,memory=0.5,balance=0.5 "
                                                    "(default: the objective's defaults)")
    ap.add_argument("--threads-per-rank", type=int, default=1,
                    help="CPUs per rank (--cpus-per-task) when the site does not set it")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each plan this many times and keep its fastest run (other load on the machine "
                         "only ever slows a run down, so the minimum is the least disturbed measurement)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each job")
    ap.add_argument("--json", metavar="FILE", help="also write every number to FILE")
    args = ap.parse_args(argv)

    from memx_hpc.search.cost import predict_plan
    from memx_hpc.search.objective import log_score, parse_weights
    from memx_hpc.slurm.local_cluster import START_HINT, slurm_available

    if not slurm_available(timeout=5.0):
        print(f"Slurm does not answer; {START_HINT}", file=sys.stderr)
        return 2
    try:
        site = load_site(args.site)
        job = load_job(args.job)
        weights = parse_weights(args.weights)
        if job.distributed_optimizer and all(site.gpu(p.gpu_type).vendor == "cpu" for p in site.partitions):
            # The CPU trainer cannot shard optimizer state (gloo has no reduce-scatter): predict
            # what actually runs, not the sharded variant.
            job = dataclasses.replace(job, distributed_optimizer=False)
            print("note: CPU-only site: the distributed optimizer is off in runs and predictions alike")
        # one core per rank: the two ranks of a plan must not compete for the same core
        site = dataclasses.replace(site, partitions=tuple(
            p if p.cpus_per_task is not None else dataclasses.replace(p, cpus_per_task=args.threads_per_rank)
            for p in site.partitions))
        plans = small_space(site, job, first=args.first, second=args.second)
        if args.max_plans:
            plans = plans[:args.max_plans]
        model, model_desc = cost_model_for(site, args.cost_model)
        preds = [predict_plan(p, site, job, model) for p in plans]
    except MemxError as e:
        print(f"top1_cpu: {e}", file=sys.stderr)
        return e.exit_code

    print(f"site {site.name}, job {job.name}: {len(plans)} plans, {args.iters} iterations x {args.repeat} run(s) each, "
          f"{args.threads_per_rank} thread(s) per rank")
    print(f"cost model: {model_desc}")
    print(f"weights: {weights.label()}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="memx-top1-", dir=str(ROOT / "memx-local") if
                                     (ROOT / "memx-local").is_dir() else None) as tmp:
        for i, (plan, pred) in enumerate(zip(plans, preds)):
            runs = [measure(plan, site, job, iters=args.iters, log_dir=Path(tmp), name=f"memx-top1-{i:02d}-{k}",
                            timeout_s=args.timeout) for k in range(max(args.repeat, 1))]
            m = min(runs, key=lambda x: x.iteration_ms)
            cap = {g: site.gpu(g).memory_bytes for g in set(m.gpu_by_rank.values())}
            util = [m.rss_bytes_by_rank[r] / cap[m.gpu_by_rank[r]] for r in m.rss_bytes_by_rank]
            rows.append({
                "plan": label(plan), "job_id": m.job_id, "wall_s": m.seconds, "load": m.load,
                "meas_ms_runs": [x.iteration_ms for x in runs],
                "pred_ms": pred.iteration_ms, "meas_ms": m.iteration_ms,
                "pred_alloc": max(s.peak_bytes - s.overhead_bytes for s in pred.stages),
                "meas_alloc": max(m.alloc_bytes_by_rank.values()),
                "pred_footprint": max(s.peak_bytes for s in pred.stages),
                "meas_footprint": max(m.rss_bytes_by_rank.values()),
                "pred_util": pred.max_utilisation, "pred_balance": pred.balance, "pred_feasible": pred.feasible,
                "meas_util": max(util), "meas_balance": max(util) / (sum(util) / len(util)),
            })
            r = rows[-1]
            print(f"  [{i + 1:2d}/{len(plans)}] {r['plan']:<44} predicted {r['pred_ms']:9.1f} ms  measured "
                  f"{r['meas_ms']:9.1f} ms  (job {m.job_id}, {m.seconds:.0f} s, load {m.load:.1f})", flush=True)

    feasible = [r for r in rows if r["pred_feasible"]]
    for r in rows:
        r["pred_score"] = float(log_score(r["pred_ms"], r["pred_util"], r["pred_balance"], weights)) \
            if r["pred_feasible"] else math.inf
        r["meas_score"] = float(log_score(r["meas_ms"], r["meas_util"], r["meas_balance"], weights))
    pt, mt = ranks_of([r["pred_ms"] for r in rows]), ranks_of([r["meas_ms"] for r in rows])
    ps, ms = ranks_of([r["pred_score"] for r in rows]), ranks_of([r["meas_score"] for r in rows])
    from memx_hpc.cli.common import table

    print()
    table([[r["plan"], r["pred_ms"], r["meas_ms"], pt[i], mt[i], r["pred_alloc"] / 2**20, r["meas_alloc"] / 2**20,
            r["pred_footprint"] / 2**20, r["meas_footprint"] / 2**20, ps[i], ms[i]] for i, r in enumerate(rows)],
          ["plan", "pred ms", "meas ms", "pred t-rank", "meas t-rank", "pred alloc MiB", "meas alloc MiB",
           "pred footprint MiB", "meas RSS MiB", "pred score-rank", "meas score-rank"])

    def top1(pred_key: str, meas_key: str, *, regret: bool) -> dict:
        best_pred = min(feasible or rows, key=lambda r: r[pred_key])
        best_meas = min(rows, key=lambda r: r[meas_key])
        order = sorted(rows, key=lambda r: r[meas_key])
        return {"planner_top1": best_pred["plan"], "measured_top1": best_meas["plan"],
                "hit": best_pred is best_meas, "planner_top1_measured_rank": order.index(best_pred) + 1,
                # how much slower the planner's pick ran than the fastest plan
                "regret_pct": 100.0 * (best_pred["meas_ms"] - best_meas["meas_ms"]) / best_meas["meas_ms"]
                if regret else None}

    summary = {
        "plans": len(rows), "iters": args.iters, "cost_model": model_desc, "weights": weights.label(),
        "time_only": top1("pred_ms", "meas_ms", regret=True),
        "weighted_product": top1("pred_score", "meas_score", regret=False),
        "spearman_time": spearman([r["pred_ms"] for r in rows], [r["meas_ms"] for r in rows]),
        "spearman_score": spearman([r["pred_score"] for r in feasible], [r["meas_score"] for r in feasible]),
        "mape_time_pct": mape([r["pred_ms"] for r in rows], [r["meas_ms"] for r in rows]),
        "mape_alloc_pct": mape([r["pred_alloc"] for r in rows], [r["meas_alloc"] for r in rows]),
        "mape_footprint_pct": mape([r["pred_footprint"] for r in rows], [r["meas_footprint"] for r in rows]),
    }
    print()
    for key, name in (("time_only", "time-only"), ("weighted_product", f"weighted product ({weights.label()})")):
        s = summary[key]
        print(f"{name}: planner top-1 = {s['planner_top1']}; measured top-1 = {s['measured_top1']}; "
              f"{'HIT' if s['hit'] else 'miss'} (planner's pick is measured #{s['planner_top1_measured_rank']})"
              + (f", {s['regret_pct']:.1f}% slower than the best" if s["regret_pct"] is not None else ""))
    print(f"Spearman (predicted vs measured): time {summary['spearman_time']:.3f}, "
          f"weighted score {summary['spearman_score']:.3f}")
    print(f"MAPE: iteration time {summary['mape_time_pct']:.1f}%, peak allocated {summary['mape_alloc_pct']:.1f}%, "
          f"footprint {summary['mape_footprint_pct']:.1f}%")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rows": rows}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
