"""The GPU check behind scripts/gpu-check.sh: on one GPU, profile a handful of points, fit,
plan, train a few iterations with NCCL through the rendered script's own component
function (preflight, environment, entry), and print predicted against measured time and
memory (allocator peak, reserved peak, driver-reported).

Steps (each one is the project's own command or function, nothing is re-implemented):

1. a site file for this machine: one partition, this GPU (catalog type when the device
   name matches one), submitit's local executor, Transformer Engine when it imports;
2. ``memx-hpc profile`` of the job's minimal set on that partition;
3. ``memx-hpc plan --no-profile`` and ``memx-hpc predict`` of the recommended plan;
4. ``render`` of that plan, run through stand-ins of ``srun``/``scontrol`` that start the
   script's ``memx_component_0`` function once per rank, as Slurm would;
5. the training log read back (``memx_hpc.train.logs``) against the prediction.

``--cpu-rehearsal`` runs the same steps on this machine's CPU (gloo, tiny model): what
the test suite runs where there is no GPU. Exit 0 when every step ran, 2 when one failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU_JOB = {"name": "gpu-check", "model": {"preset": "OPT-350M", "seq_length": 1024}, "global_batch_size": 16,
           "precision": "bf16", "distributed_optimizer": False, "micro_batch_sizes": [1, 2, 4],
           "recompute_modes": ["none", "full"], "train_iters": 12}
CPU_JOB = {"name": "gpu-check", "model": {"preset": "tiny-gpt"}, "global_batch_size": 4, "precision": "fp32",
           "micro_batch_sizes": [2], "recompute_modes": ["none"], "train_iters": 6}
WARMUP_ITERS = 2  # iterations left out of the measured time (allocator and kernel warm-up)


def _fail(msg: str) -> None:
    print(f"[gpu-check] {msg}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _say(msg: str) -> None:
    print(f"[gpu-check] {msg}", file=sys.stderr, flush=True)


def _cli(*args: str, out: Path | None = None, timeout_s: float = 400) -> str:
    cmd = [sys.executable, "-m", "memx_hpc.cli.main", *args]
    _say("$ memx-hpc " + " ".join(shlex.quote(a) for a in args))
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    _say(f"  exit {r.returncode} in {time.monotonic() - t0:.1f} s")
    if r.returncode != 0:
        _fail(f"memx-hpc {args[0]} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    if out is not None:
        out.write_text(r.stdout)
    return r.stdout


def _device(cpu: bool) -> dict:
    import torch

    if cpu:
        return {"gpu_type": "cpu-check", "vendor": "cpu", "name": "cpu", "impl": "local",
                "custom": {"vendor": "cpu", "memory_gib": 4.0, "peak_tflops_bf16": 0.05, "peak_tflops_fp32": 0.12,
                           "hbm_gbytes_per_s": 20, "link_gbytes_per_s": 5, "measured_at_profile_time": True,
                           "source": "this machine's CPU (gpu-check rehearsal)"}}
    if not torch.cuda.is_available():
        _fail("no CUDA/ROCm GPU is visible (torch.cuda.is_available() is false)")
    from memx_hpc.spec.catalog import catalog

    props = torch.cuda.get_device_properties(0)
    name = props.name
    cat = catalog()
    found = None
    for cand in re.findall(r"[A-Za-z]+\d+[A-Za-z]*(?:[- ]\w+)?", name.replace("NVIDIA ", "").replace("AMD ", "")):
        for guess in (cand, cand.split()[0], cand.replace(" ", "-")):
            g = cat.find(guess)
            if g is not None:
                found = g
                break
        if found:
            break
    try:
        import transformer_engine  # noqa: F401
        impl = "transformer_engine"
    except Exception:  # noqa: BLE001
        impl = "local"
    vendor = "amd" if torch.version.hip else "nvidia"
    if found is None:
        _fail(f"{name} is not in the catalog (memx-hpc validate --list-gpus); add it")
    return {"gpu_type": found.name, "vendor": vendor, "name": name, "impl": impl, "custom": None,
            "total_bytes": props.total_memory}


def _site(out: Path, dev: dict) -> Path:
    import yaml

    part = {"name": "gpu" if dev["vendor"] != "cpu" else "cpu", "gpu_type": dev["gpu_type"], "nodes": 1,
            "gpus_per_node": 1, "python": sys.executable, "megatron_entry": "-m memx_hpc.train.pretrain_gpt",
            "transformer_impl": dev["impl"]}
    site = {"name": "gpu-check", "slurm": {"scheduler": "local", "time_limit_min": 10},
            "store": str(out / "store.h5"), "work_dir": str(out / "runs"), "partitions": [part]}
    if dev["custom"]:
        site["gpu_types"] = {dev["gpu_type"]: dev["custom"]}
    path = out / "site.yaml"
    path.write_text(yaml.safe_dump(site, sort_keys=False))
    return path


def _driver_mb(text: str) -> float | None:
    vals = [float(x) for x in re.findall(r"device memory used \(driver\) after iteration \d+: ([0-9.]+) MB", text)]
    return max(vals) if vals else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the site, store, plans, script and logs")
    ap.add_argument("--cpu-rehearsal", action="store_true", help="the same steps on the CPU (tests)")
    ap.add_argument("--iters", type=int, default=None, help="training iterations (default: the job's)")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    import yaml

    dev = _device(a.cpu_rehearsal)
    _say(f"device: {dev['name']} as {dev['gpu_type']} ({dev['vendor']}), layer: {dev['impl']}")
    site_file = _site(out, dev)
    job = dict(CPU_JOB if a.cpu_rehearsal else GPU_JOB)
    job_file = out / "job.yaml"
    job_file.write_text(yaml.safe_dump(job, sort_keys=False))
    quick = ["--warmup", "1", "--iters", "2" if a.cpu_rehearsal else "5", "--points-per-task", "12", "--no-progress"]
    _cli("profile", "--site", str(site_file), "--job", str(job_file), *quick, out=out / "profile.txt")
    _cli("plan", "--site", str(site_file), "--job", str(job_file), "--no-profile", "--top", "3",
         "--out", str(out / "plan"), "--json", out=out / "plan.json")
    plan_file = out / "plan" / "latest" / "recommended.json"
    predicted = json.loads(_cli("predict", "--site", str(site_file), "--job", str(job_file), "--plan", str(plan_file),
                                "--json", out=out / "predict.json"))

    from memx_hpc.planfile import load_plan
    from memx_hpc.slurm.render import render
    from memx_hpc.slurm.submit import write_script
    from memx_hpc.spec import load_job, load_site
    from memx_hpc.train.logs import parse_log

    plan, site, tj = load_plan(plan_file), load_site(site_file), load_job(job_file)
    iters = a.iters or tj.train_iters
    script = write_script(out / "train.sbatch", render(plan, site, tj, iters=iters, log_dir=str(out),
                                                        workdir=str(ROOT), job_name="gpu-check"))
    _say(f"training {iters} iterations of {plan.tp}x{plan.dp}x{plan.pp} (tp x dp x pp), micro-batch "
         f"{plan.micro_batch_size}, recompute {plan.stages[0].recompute.label()}, through {script.name}")
    from memx_hpc.slurm.standin import write_standins

    env = dict(os.environ, PATH=f"{write_standins(out / 'bin')}:{os.environ['PATH']}", SLURM_JOB_ID=str(40000 + os.getpid() % 9999),
               SLURM_JOB_NODELIST="localhost", PYTHONPATH=str(ROOT))
    t0 = time.monotonic()
    r = subprocess.run(["bash", str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    (out / "train.log").write_text(r.stdout + r.stderr)
    _say(f"  exit {r.returncode} in {time.monotonic() - t0:.1f} s (log: {out / 'train.log'})")
    if r.returncode != 0:
        _fail(f"training failed:\n{(r.stdout + r.stderr)[-4000:]}")
    log = parse_log(r.stdout)
    if log.iterations_done != iters:
        _fail(f"the log shows {log.iterations_done} of {iters} iterations")
    backend = next((d.get("backend") for d in log.layouts), "?")
    times = [it.elapsed_ms for it in log.iterations if it.iteration > WARMUP_ITERS] or \
        [it.elapsed_ms for it in log.iterations]
    mem = max(log.memory, key=lambda m: m.max_allocated_mb)
    stage = predicted["stages"][0]
    mb = 2 ** 20
    rows = [
        ("iteration time (ms)", predicted["iteration_ms"], statistics.median(times)),
        ("allocator peak (MB): states + activations", (stage["state_bytes"] + stage["activation_bytes"]) / mb,
         mem.max_allocated_mb),
        ("reserved peak (MB)", None, mem.max_reserved_mb),
        ("device, as the driver reports (MB)", stage["peak_bytes"] / mb, _driver_mb(r.stdout + r.stderr)),
    ]
    print(f"gpu-check on {dev['name']} ({dev['gpu_type']}, {dev['impl']} layer, backend {backend}), "
          f"{tj.model.name} seq {tj.model.seq_length}, plan tp={plan.tp} dp={plan.dp} pp={plan.pp} "
          f"mbs={plan.micro_batch_size} gbs={plan.global_batch_size} recompute={plan.stages[0].recompute.label()}")
    print(f"{'quantity':45s} {'predicted':>12s} {'measured':>12s} {'error':>8s}")
    for name, p, m in rows:
        err = f"{(p - m) / m * 100:+.1f}%" if p is not None and m else "-"
        ps = f"{p:12.1f}" if p is not None else f"{'-':>12s}"
        ms = f"{m:12.1f}" if m is not None else f"{'-':>12s}"
        print(f"{name:45s} {ps} {ms} {err:>8s}")
    print(f"(measured time: median of iterations {WARMUP_ITERS + 1}-{iters}; whole check {time.monotonic() - t_start:.0f} s)")
    (out / "result.json").write_text(json.dumps({"device": dev["name"], "gpu_type": dev["gpu_type"], "impl": dev["impl"],
                                                 "backend": backend, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
