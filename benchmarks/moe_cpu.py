"""A small mixture of experts trained for real on this machine's CPU with expert parallel 2,
through the command line memx-hpc renders, on the local Slurm; its measured iteration time and
peak memory beside the plan's prediction.

Steps (each a memx-hpc command a user runs): the corpus and tokenizer of docs/training.md's
walk-through (scripts/tiny_corpus.py, ``memx-hpc data prepare``) when memx-local/ lacks them;
``memx-hpc plan`` of jobs/tiny-moe.yaml on site_configs/local.yaml (the search's recommended
plan, which must have EP 2); ``memx-hpc render``; ``sbatch --wait``; the log read with
memx_hpc.train.logs. Prints predicted and measured iteration time (median after the first
two iterations) and peak allocated memory per rank, and their ratios.

    .venv/bin/python benchmarks/moe_cpu.py [--iters N] [--out DIR] [--json PATH]

Needs the local Slurm (scripts/slurm-local.sh status); exits 2 naming what is missing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def _run(cmd: list[str], what: str) -> str:
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if p.returncode:
        print(f"{what} failed (exit {p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-2000:]}",
              file=sys.stderr)
        raise SystemExit(2)
    return p.stdout


def prepare_data() -> None:
    if (REPO / "memx-local" / "data" / "tiny_text_document.bin").exists():
        return
    _run([PY, "scripts/tiny_corpus.py", "memx-local"], "scripts/tiny_corpus.py")
    _run([PY, "-m", "memx_hpc", "data", "prepare", "--input", "memx-local/corpus.jsonl", "--output-prefix",
          "memx-local/data/tiny", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
          "memx-local/tokenizer"], "memx-hpc data prepare")


def run(*, iters: int, out: Path, job: Path = REPO / "jobs" / "tiny-moe.yaml",
        site: Path = REPO / "site_configs" / "local.yaml", fresh: bool = True) -> dict:
    """Plan, render, train ``iters`` iterations and read the log: the numbers, as a dict."""
    import shutil

    from memx_hpc.train.logs import parse_log

    prepare_data()
    out.mkdir(parents=True, exist_ok=True)
    ckpt = REPO / "memx-local" / "ckpt" / "tiny-moe"
    if fresh and ckpt.exists():
        shutil.rmtree(ckpt)  # a run from iteration 0, not one resumed from an older checkpoint
    _run([PY, "-m", "memx_hpc", "plan", "--site", str(site), "--job", str(job), "--no-profile", "--no-reference",
          "--store", str(out / "store.h5"), "--out", str(out / "plans"), "--max-stages", "1", "--top", "3"],
         "memx-hpc plan")
    plan_file = out / "plans" / "latest" / "recommended.json"
    plan = json.loads(plan_file.read_text())
    if plan.get("ep", 1) != 2:
        print(f"the recommended plan has ep {plan.get('ep', 1)}, not 2: {plan_file}", file=sys.stderr)
        raise SystemExit(1)
    script = out / "train.sbatch"
    _run([PY, "-m", "memx_hpc", "render", "--site", str(site), "--job", str(job), "--plan", str(plan_file),
          "--out", str(script), "--iters", str(iters)], "memx-hpc render")
    job_id = _run(["sbatch", "--parsable", "--wait", str(script)], "sbatch --wait").strip().split(";")[0]
    logs = sorted((REPO / "memx-local" / "runs").glob(f"*-{job_id}.out"))
    if not logs:
        print(f"no log of Slurm job {job_id} under memx-local/runs/", file=sys.stderr)
        raise SystemExit(2)
    text = logs[0].read_text()
    log = parse_log(text)
    pred = plan["prediction"]
    st = pred["stages"][0]
    measured_ms = log.iteration_ms(skip_first=2)
    peaks = log.peak_memory_mb()
    measured_peak = max(peaks.values()) * 2**20 if peaks else None
    predicted_alloc = st["peak_bytes"] - st["overhead_bytes"]  # the allocator's peak, before runtime overhead
    losses = [r.lm_loss for r in sorted(log.iterations, key=lambda r: r.iteration) if r.lm_loss is not None]
    return {"job_id": job_id, "log": str(logs[0]), "plan": str(plan_file), "ep": plan["ep"], "tp": plan["tp"],
            "dp": plan["dp"], "micro_batch_size": plan["micro_batch_size"], "iterations": log.iterations_done,
            "layouts": [dict(x) for x in log.layouts], "losses": losses,
            "predicted_iteration_ms": pred["iteration_ms"], "measured_iteration_ms": measured_ms,
            "predicted_peak_allocated_bytes": predicted_alloc, "measured_peak_allocated_bytes": measured_peak}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[1:]))
    ap.add_argument("--iters", type=int, default=12, help="training iterations (default 12)")
    ap.add_argument("--out", type=Path, default=REPO / "memx-local" / "moe-bench", help="plan, script and store")
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    a = ap.parse_args(argv)
    r = run(iters=a.iters, out=a.out)
    ratio_t = r["measured_iteration_ms"] / r["predicted_iteration_ms"]
    ratio_m = r["measured_peak_allocated_bytes"] / r["predicted_peak_allocated_bytes"]
    print(f"tiny-moe on the local Slurm: plan tp {r['tp']} dp {r['dp']} ep {r['ep']} micro-batch "
          f"{r['micro_batch_size']}, {r['iterations']} iterations (job {r['job_id']}, {r['log']})")
    print(f"loss {r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}")
    print(f"{'':28}{'predicted':>12}{'measured':>12}{'ratio':>8}")
    print(f"{'iteration time (ms)':28}{r['predicted_iteration_ms']:12.1f}{r['measured_iteration_ms']:12.1f}"
          f"{ratio_t:8.2f}")
    print(f"{'peak allocated (MiB)':28}{r['predicted_peak_allocated_bytes'] / 2**20:12.1f}"
          f"{r['measured_peak_allocated_bytes'] / 2**20:12.1f}{ratio_m:8.2f}")
    if a.json:
        a.json.write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
