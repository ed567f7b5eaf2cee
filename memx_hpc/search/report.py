"""What a search shows people and writes for machines: the top-K table, the Pareto-front
PNG, one plan JSON per plan, a JSON summary, and a progress bar on stderr."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..planfile import save_plan
from ..spec import Plan, Site, TrainJob
from .engine import ScoredPlan, SearchResult

GiB = 2**30


class ProgressBar:
    """A one-line progress bar on stderr (a line every 10 % when stderr is not a terminal)."""

    def __init__(self, label: str, *, enabled: bool = True, stream=None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.perf_counter()
        self._last = -1

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        frac = done / total
        if self.tty:
            width = 30
            fill = int(round(frac * width))
            self.stream.write(f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] {frac:4.0%} "
                              f"{done:,}/{total:,} ({time.perf_counter() - self.t0:.1f} s)")
            if done >= total:
                self.stream.write("\n")
            self.stream.flush()
            return
        step = int(frac * 10)
        if step != self._last and (step > self._last):
            self._last = step
            print(f"{self.label}: {frac:.0%} ({done:,}/{total:,}, {time.perf_counter() - self.t0:.1f} s)",
                  file=self.stream, flush=True)


def stage_summary(plan: Plan) -> str:
    """``gpu_a100:12/none | gpu_v100:4+4/full:2`` — consecutive stages of one partition together."""
    parts = []
    for name, idx in plan.component_groups():
        layers = "+".join(str(plan.stages[i].num_layers) for i in idx)
        rcs = [plan.stages[i].recompute.label() for i in idx]
        rc = rcs[0] if len(set(rcs)) == 1 else ",".join(rcs)
        parts.append(f"{name}:{layers}/{rc}")
    return " | ".join(parts)


def gpu_types_of(site: Site) -> list[str]:
    seen: dict[str, None] = {}
    for p in site.partitions:
        seen.setdefault(p.gpu_type, None)
    return list(seen)


def gib(nbytes: float) -> str:
    """GiB with enough digits to tell small models' stages apart."""
    x = nbytes / GiB
    return f"{x:.1f}" if x >= 10 else (f"{x:.2f}" if x >= 1 else f"{x:.3g}")


def table_rows(plans: Sequence[ScoredPlan], site: Site) -> tuple[list[str], list[list[Any]]]:
    gpus = gpu_types_of(site)
    header = ["rank", "time rank", "iter s", "tokens/s"] + [f"peak GiB {g}" for g in gpus] + \
        ["balance", "score", "tp", "dp", "mbs", "stages"]
    rows = []
    for s in plans:
        p = s.prediction
        peaks = p.peak_by_gpu_type()
        rows.append([s.rank, s.time_rank, p.iteration_ms / 1e3, p.tokens_per_s]
                    + [gib(peaks[g]) if g in peaks else "-" for g in gpus]
                    + [f"{p.balance:.3f}", f"{s.score:.4g}", s.plan.tp, s.plan.dp, s.plan.micro_batch_size,
                       stage_summary(s.plan)])
    return header, rows


def scored_to_dict(s: ScoredPlan) -> dict:
    from ..planfile import plan_to_dict
    return {"rank": s.rank, "time_only_rank": s.time_rank, "index": s.index, "score": s.score,
            "plan": plan_to_dict(s.plan), "prediction": s.prediction.to_dict()}


def result_to_json(result: SearchResult, *, site: Site, job: TrainJob, provenance: Mapping[str, str],
                   notes: Sequence[str] = (), files: Sequence[str] = ()) -> dict:
    return {"site": site.name, "job": job.name, "weights": result.weights.label(),
            "provenance": dict(provenance), "notes": list(notes), "stats": result.stats.to_dict(),
            "top": [scored_to_dict(s) for s in result.top],
            "time_only": [scored_to_dict(s) for s in result.time_top],
            "pareto": [{"index": p.index, "iteration_ms": p.iteration_ms, "max_utilisation": p.max_utilisation}
                       for p in result.pareto],
            "files": list(files)}


def write_plan_files(result: SearchResult, out_dir: Path, *, site: Site, job: TrainJob,
                     provenance: Mapping[str, str]) -> list[Path]:
    """``plan-01.json`` ... in ``out_dir``: each plan with its prediction (planfile format)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in result.top:
        path = out_dir / f"plan-{s.rank:02d}.json"
        pred = s.prediction.to_dict()
        pred["time_only_rank"] = s.time_rank
        pred["weights"] = result.weights.label()
        save_plan(s.plan, path, prediction=pred, rank=s.rank, score=s.score, job=job.name, site=site.name,
                  provenance=dict(provenance),
                  note=f"memx-hpc plan: rank {s.rank} of {result.stats.feasible:,} feasible plans by "
                       f"T^{result.weights.time:g} M^{result.weights.memory:g} B^{result.weights.balance:g}; "
                       f"rank {s.time_rank} by iteration time alone")
        paths.append(path)
    return paths


def pareto_png(result: SearchResult, path: Path, *, title: str) -> Path:
    """Iteration time against worst-GPU peak memory: the Pareto front, the top-K by score,
    the fastest plan. matplotlib's Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    if result.pareto:
        xs = [p.iteration_ms / 1e3 for p in result.pareto]
        ys = [p.max_utilisation * 100 for p in result.pareto]
        ax.step(xs, ys, where="post", color="0.6", lw=1)
        ax.scatter(xs, ys, s=18, color="0.3", label=f"Pareto front ({len(xs)} plans)", zorder=2)
    if result.top:
        ax.scatter([s.prediction.iteration_ms / 1e3 for s in result.top],
                   [s.prediction.max_utilisation * 100 for s in result.top], s=40, marker="o", facecolors="none",
                   edgecolors="tab:blue", label=f"top {len(result.top)} by score ({result.weights.label()})", zorder=3)
        best = result.top[0]
        ax.annotate("best", (best.prediction.iteration_ms / 1e3, best.prediction.max_utilisation * 100),
                    textcoords="offset points", xytext=(6, 6), color="tab:blue")
    if result.time_top:
        f = result.time_top[0]
        ax.scatter([f.prediction.iteration_ms / 1e3], [f.prediction.max_utilisation * 100], s=60, marker="x",
                   color="tab:red", label="fastest (time-only)", zorder=4)
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("peak memory, worst GPU (% of capacity)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
