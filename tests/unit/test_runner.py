"""The profiling runner on this CPU: real megatron-core layers, real gloo process groups.

Each case runs in a fresh Python process (megatron-core's parallel state and the
process group are per process), as it does under Slurm.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memx_hpc.profile.runner import ProfileTask, RunSettings, TaskResult
from memx_hpc.spec import LayerShape, ProfilePoint

REPO = Path(__file__).resolve().parents[2]
SHAPE = LayerShape(hidden_size=128, num_attention_heads=4, num_query_groups=4, ffn_hidden_size=512,
                   seq_length=64, vocab_size=500)


def point(kind: str = "layer", *, mbs: int = 2, tp: int = 1, recompute: str = "none", attention: str = "sdpa",
          **kw) -> ProfilePoint:
    return ProfilePoint(gpu_type="cpu-test", kind=kind, shape=SHAPE, tp=tp, micro_batch_size=mbs,
                        recompute=recompute, precision="fp32", attention=attention, **kw)


def run_tasks(tmp_path: Path, tasks: list[ProfileTask], *, ranks: int = 1, env: dict | None = None,
              timeout: float = 240) -> list[TaskResult]:
    """Run ``tasks`` one after the other in ``ranks`` fresh processes wired as one Slurm job
    would wire them (one import of torch and megatron-core per process)."""
    tp = tmp_path / "tasks.pkl"
    tp.write_bytes(pickle.dumps(tasks))
    procs = []
    for r in range(ranks):
        e = {**os.environ, **(env or {})}
        if ranks > 1:
            e.update(SLURM_PROCID=str(r), SLURM_NTASKS=str(ranks), SLURM_LOCALID=str(r), SLURM_CPUS_PER_TASK="1",
                     SLURM_JOB_ID=f"test{os.getpid()}{tmp_path.name[-6:]}")
        else:
            for k in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID"):
                e.pop(k, None)
        out = tmp_path / f"result{r}.pkl"
        code = textwrap.dedent(f"""
            import pickle
            from memx_hpc.profile.runner import run_task
            tasks = pickle.load(open({str(tp)!r}, "rb"))
            pickle.dump([run_task(t) for t in tasks], open({str(out)!r}, "wb"))
        """)
        procs.append((subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=e, stderr=subprocess.PIPE,
                                       text=True), out))
    for p, _ in procs:
        _, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err[-3000:]
    return pickle.loads(procs[0][1].read_bytes())


def korthikanti_bytes(*, s: int, b: int, h: int, a: int, e: int, m: int, recompute: str, attention: str,
                      f: int | None = None, kv: int | None = None, swiglu: bool = False) -> int:
    """Per-layer activation bytes, Korthikanti et al. 2022 Eq. 1-2 generalised to e bytes
    per element, m per dropout-mask element, FFN width f, K/V width kv (GQA) and SwiGLU
    (the paper: e=2, m=1, f=4h, kv=h gives sbh(34 + 5as/h)). Fused (SDPA) attention keeps
    the fp32 log-sum-exp (4asb) instead of the s^2 matrices."""
    f = 4 * h if f is None else f
    kv = h if kv is None else kv
    if recompute == "full":
        return e * s * b * h
    # norm inputs 2eh, QKV and fc1 inputs 2eh, two dropout masks 2mh; Q + K + V, the
    # projection input, and the MLP interior (GeLU: 2f, SwiGLU: its 2f input and fc2's f)
    base = s * b * (4 * e * h + 2 * m * h + e * h + 2 * e * kv + e * h + e * f * (3 if swiglu else 2))
    if recompute == "selective":
        return base
    return base + (4 * a * s * b if attention == "sdpa" else a * s * s * b * (2 * e + m))


SWIGLU = LayerShape(hidden_size=128, num_attention_heads=4, num_query_groups=4, ffn_hidden_size=352,
                    seq_length=64, vocab_size=500, activation="swiglu")
GQA = LayerShape(hidden_size=128, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=512,
                 seq_length=64, vocab_size=500)


CASES = [("none", "sdpa", 2), ("selective", "sdpa", 2), ("full", "sdpa", 2), ("none", "core", 1), ("none", "sdpa", 4)]


@pytest.fixture(scope="module")
def one_rank_results(tmp_path_factory) -> list[TaskResult]:
    """Two tasks in one process: the activation cases, and a task with a 1 MiB budget and
    an injected optimizer failure."""
    tmp = tmp_path_factory.mktemp("runner")
    quick = RunSettings(warmup=1, iters=2)
    pts = tuple(point(recompute=r, attention=att, mbs=b) for r, att, b in CASES)
    pts += (dataclasses.replace(point(), shape=SWIGLU), dataclasses.replace(point(), shape=GQA))
    layers = ProfileTask(gpu_type="cpu-test", vendor="cpu", memory_cap_bytes=2**32, settings=quick, points=pts,
                         rendezvous_dir=str(tmp))
    capped = ProfileTask(gpu_type="cpu-test", vendor="cpu", memory_cap_bytes=2**20, settings=quick,
                         points=(point(mbs=1), point("optimizer"), point("embedding"), point("head")),
                         rendezvous_dir=str(tmp), measure_device=True)
    return run_tasks(tmp, [layers, capped], env={"MEMX_PROFILE_FAIL": "optimizer"})


@pytest.mark.slow
def test_layer_activation_bytes_match_korthikanti(one_rank_results):
    res = one_rank_results[0]
    assert res.failures == ()
    assert len(res.samples) == len(CASES) + 2
    for s, (r, att, b) in zip(res.samples, CASES):
        want = korthikanti_bytes(s=SHAPE.seq_length, b=b, h=SHAPE.hidden_size, a=SHAPE.num_attention_heads, e=4,
                                 m=1, recompute=r, attention=att)
        assert abs(s.activation_bytes / want - 1) < 0.02, (r, att, b, s.activation_bytes, want)
        assert s.forward_ms > 0 and s.backward_ms > 0
        assert s.peak_allocated_bytes > s.activation_bytes
        assert not s.infeasible and s.origin == "measured"
        prov = s.provenance.as_dict()
        assert prov["torch"] and prov["megatron_core"] and prov["vendor"] == "cpu" and prov["host"]
        assert prov["settings"]["iters"] == 2
        assert prov["transformer_impl"] == "local" and s.transformer_impl == "local"  # what was measured
    # SwiGLU through Megatron's fused bias-SwiGLU (what Megatron-LM runs by default): 2f + f
    sw = res.samples[len(CASES)]
    want = korthikanti_bytes(s=64, b=2, h=128, a=4, e=4, m=1, recompute="none", attention="sdpa", f=352, swiglu=True)
    assert abs(sw.activation_bytes / want - 1) < 0.02, (sw.activation_bytes, want)
    # GQA: megatron-core 0.16 keeps the whole mixed QKV buffer alive (K and V are views of
    # it) and Q as a reshaped copy: one e*s*b*h more than the formula's Q + K + V
    gqa = res.samples[len(CASES) + 1]
    want = korthikanti_bytes(s=64, b=2, h=128, a=4, e=4, m=1, recompute="none", attention="sdpa", kv=64)
    assert abs(gqa.activation_bytes / (want + 4 * 64 * 2 * 128) - 1) < 0.02, (gqa.activation_bytes, want)
    # recompute trades time for memory: full keeps least, then selective, then none
    by = {(p.point.recompute, p.point.attention, p.point.micro_batch_size): p for p in res.samples[:len(CASES)]}
    assert by[("full", "sdpa", 2)].activation_bytes < by[("selective", "sdpa", 2)].activation_bytes \
        < by[("none", "sdpa", 2)].activation_bytes < by[("none", "sdpa", 4)].activation_bytes


@pytest.mark.slow
def test_memory_cap_gives_infeasible_and_failures_are_reported(one_rank_results):
    res = one_rank_results[1]
    kinds = {s.point.kind: s for s in res.samples}
    # a layer does not fit in 1 MiB: known before running (fake tensors) and stored as infeasible
    assert kinds["layer"].infeasible and kinds["layer"].peak_allocated_bytes > 2**20
    assert kinds["layer"].forward_ms == 0  # not run
    assert "FakeTensorMode" in kinds["layer"].provenance.as_dict()["note"]
    assert [f.point.kind for f in res.failures] == ["optimizer"]
    assert "injected failure" in res.failures[0].reason
    assert {"embedding", "head"} <= set(kinds)
    figs = res.device_figures
    assert figs and figs["peak_tflops_fp32"] > 0 and figs["hbm_gbps"] > 0 and figs["memory_gib"] == 1 / 1024


@pytest.mark.slow
def test_two_ranks_tp_layer_and_collectives(tmp_path):
    msg = 2 * SHAPE.seq_length * SHAPE.hidden_size * 4
    pts = (point(tp=2), point("allreduce", tp=2, group_size=2, message_bytes=msg),
           point("p2p", group_size=2, message_bytes=msg), point("optimizer", tp=2))
    task = ProfileTask(gpu_type="cpu-test", vendor="cpu", memory_cap_bytes=2**32, points=pts, world_size=2,
                       settings=RunSettings(warmup=1, iters=2), rendezvous_dir=str(tmp_path))
    (res,) = run_tasks(tmp_path, [task], ranks=2)
    assert res.failures == ()
    kinds = {s.point.kind: s for s in res.samples}
    assert set(kinds) == {"layer", "allreduce", "p2p", "optimizer"}
    assert kinds["allreduce"].forward_ms > 0 and kinds["p2p"].forward_ms > 0
    assert kinds["layer"].provenance.as_dict()["world_size"] == 2
    # TP=2 halves what each rank keeps of Q/K/V, the projection and MLP interiors
    want = korthikanti_bytes(s=SHAPE.seq_length, b=2, h=SHAPE.hidden_size, a=SHAPE.num_attention_heads, e=4, m=1,
                             recompute="none", attention="sdpa")
    assert kinds["layer"].activation_bytes < 0.8 * want
    assert kinds["optimizer"].provenance.as_dict()["params"] < 12 * SHAPE.hidden_size ** 2 * 0.6


@pytest.mark.slow
def test_dispatch_through_submitit_local_executor(tmp_path):
    """Where there is no Slurm: the same tasks through submitit's LocalExecutor."""
    from memx_hpc.profile.store import ProfileStore
    from memx_hpc.profile.campaign import profile
    from memx_hpc.spec import job_from_mapping, site_from_mapping

    # the partition's python through a path with every non-alphanumeric character a path
    # may hold: submitit writes it into a shell command line, quoted
    odd = tmp_path / "py=1,a@b+c:d%e_f.g-h"
    odd.mkdir()
    # a wrapper, not a symlink: a symlinked venv interpreter outside its venv finds no
    # pyvenv.cfg and starts as the base Python, without the venv's packages
    (odd / "python").write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    (odd / "python").chmod(0o755)
    site = site_from_mapping({
        "name": "one-cpu", "slurm": {"scheduler": "local"}, "work_dir": str(tmp_path / "runs"),
        "gpu_types": {"cpu-1g": {"vendor": "cpu", "memory_gib": 1, "peak_tflops_bf16": 0.05, "peak_tflops_fp32": 0.1,
                                 "hbm_gbps": 10, "link_gbps": 5, "measured_at_profile_time": True}},
        "partitions": [{"name": "cpu", "gpu_type": "cpu-1g", "nodes": 1, "gpus_per_node": 1,
                        "python": str(odd / "python"), "setup": ["export MEMX_SETUP_SEEN=1"]}]})
    job = job_from_mapping({"model": {"preset": "tiny-gpt"}, "global_batch_size": 8, "precision": "fp32",
                            "micro_batch_sizes": [1], "recompute_modes": ["none"]})
    store = ProfileStore(tmp_path / "store.h5")
    rep = profile(site, job, store, progress=False, settings=RunSettings(warmup=1, iters=2))
    assert rep.scheduler == "local" and rep.failed == 0
    assert {s.point.kind for s in store.samples()} == {"layer", "embedding", "head", "optimizer"}
    assert rep.measured == len(store) == rep.scheduled
    assert store.device_figures("cpu-1g")["peak_tflops_fp32"] > 0
    # nothing left to do the second time, and nothing is submitted
    again = profile(site, job, store, progress=False)
    assert again.scheduled == 0 and again.skipped == rep.scheduled and again.job_ids == ()


def test_cpu_tasks_measure_one_at_a_time_on_a_host(tmp_path, monkeypatch):
    """Concurrent CPU profiling tasks on one host would time each other's contention: the
    second task's rank 0 waits for the first's lock; GPU tasks never wait."""
    import fcntl
    import threading

    from memx_hpc.profile.runner import ProfileTask
    from memx_hpc.profile import campaign

    monkeypatch.setattr(campaign, "CPU_LOCK", tmp_path / "cpu.lock")
    cpu = ProfileTask(gpu_type="cpu-4g", vendor="cpu", memory_cap_bytes=1, points=())
    gpu = ProfileTask(gpu_type="A100-80", vendor="nvidia", memory_cap_bytes=1, points=())
    entered = threading.Event()
    with open(tmp_path / "cpu.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another task is measuring

        def second():
            with campaign._one_cpu_measurement_at_a_time(cpu):
                entered.set()

        t = threading.Thread(target=second)
        t.start()
        assert not entered.wait(0.5), "a CPU task measured while another held the host lock"
        with campaign._one_cpu_measurement_at_a_time(gpu):
            pass  # a GPU task is not held up
        fcntl.flock(held, fcntl.LOCK_UN)
    t.join(5)
    assert entered.is_set()


def test_transformer_engine_without_a_gpu_fails_the_task_naming_the_partition(tmp_path):
    """A partition that trains with Transformer Engine is not profiled with another layer."""
    task = ProfileTask(gpu_type="cpu-test", vendor="cpu", memory_cap_bytes=2**32, points=(point(),),
                       settings=RunSettings(warmup=0, iters=1), rendezvous_dir=str(tmp_path), label="gpu_h100",
                       transformer_impl="transformer_engine")
    with pytest.raises(AssertionError) as e:
        run_tasks(tmp_path, [task])
    assert "partition gpu_h100 trains with transformer_engine" in str(e.value)
    with pytest.raises(Exception):
        ProfileTask(gpu_type="x", vendor="cpu", memory_cap_bytes=1, points=(), transformer_impl="te")


def test_predictor_refuses_to_mix_transformer_implementations():
    from memx_hpc.errors import SpecError
    from memx_hpc.spec import LayerSample, Provenance, transformer_impls

    def sample(impl, origin="measured"):
        prov = Provenance.of({"transformer_impl": impl}) if impl else Provenance()
        return LayerSample(point=point(), forward_ms=1.0, backward_ms=2.0, activation_bytes=10, origin=origin,
                           provenance=prov)

    assert transformer_impls([sample("local"), sample(None)]) == {"cpu-test": "local"}
    assert transformer_impls([sample(None, origin="imported")]) == {"cpu-test": "unknown"}
    assert transformer_impls([sample("transformer_engine"), sample(None, origin="imported")]) == \
        {"cpu-test": "transformer_engine"}
    with pytest.raises(SpecError) as e:
        transformer_impls([sample("local"), sample("transformer_engine")])
    assert e.value.field == "transformer_impl" and "cpu-test" in str(e.value)
    from memx_hpc.spec.catalog import catalog
    from memx_hpc.model.predictor import Predictor

    with pytest.raises(SpecError):
        Predictor().fit([sample("local"), sample("transformer_engine")], catalog())


def _gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


GPU_SHAPE = LayerShape(hidden_size=1024, num_attention_heads=16, num_query_groups=16, ffn_hidden_size=4096,
                       seq_length=1024, vocab_size=50257)


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_available(), reason="needs a CUDA/ROCm GPU")
def test_gpu_points_record_allocator_reserved_and_driver_memory(tmp_path):
    """On a GPU every point -- layers, embedding, head, optimizer, all-reduce -- stores the
    allocator's peak, the reserved peak and the driver-reported memory of the process,
    with CUDA-event times, on the layer implementation the partition trains with."""
    import torch

    try:
        import transformer_engine  # noqa: F401
        impl = "transformer_engine"
    except Exception:  # noqa: BLE001
        impl = "local"
    pts = tuple(ProfilePoint(gpu_type="gpu-test", kind=k, shape=GPU_SHAPE, micro_batch_size=2, precision="bf16",
                             recompute=r, **({"group_size": 1, "message_bytes": 2**24} if k == "allreduce" else {}))
                for k, r in (("layer", "none"), ("layer", "selective"), ("layer", "full"), ("embedding", "none"),
                             ("head", "none"), ("optimizer", "none"), ("allreduce", "none")))
    task = ProfileTask(gpu_type="gpu-test", vendor="amd" if torch.version.hip else "nvidia",
                       memory_cap_bytes=torch.cuda.get_device_properties(0).total_memory, points=pts,
                       settings=RunSettings(warmup=2, iters=5), rendezvous_dir=str(tmp_path), transformer_impl=impl)
    (res,) = run_tasks(tmp_path, [task])
    assert res.failures == () and len(res.samples) == len(pts)
    for s in res.samples:
        assert 0 < s.peak_allocated_bytes <= s.peak_reserved_bytes <= s.device_footprint_bytes, s
        prov = s.provenance.as_dict()
        assert prov["backend"] == "nccl" and prov["peak_source"] == "max_memory_allocated"
    layers = [s for s in res.samples if s.point.kind == "layer"]
    assert all(s.forward_ms > 0 and s.backward_ms > 0 and s.transformer_impl == impl for s in layers)
    none, sel, full = layers
    assert full.activation_bytes < sel.activation_bytes <= none.activation_bytes


@pytest.mark.parametrize("key,value", [("python", "touch {marker}; /usr/bin/python3"),
                                       ("python", "$(touch {marker})"),
                                       ("container", "img.sif --bind /:/x; touch {marker}"),
                                       ("setup", ["}}; touch {marker}; f() {{"]),
                                       ("setup", [":; }}; touch {marker}; f() {{ :"])])
def test_hostile_partition_values_are_refused_before_profiling(tmp_path, key, value):
    """The site loader and every way of building a partition refuse what would reach a shell
    on the nodes; the profiler takes only built partitions (memx_hpc/slurm/request.py writes
    their values quoted), so nothing is submitted and nothing runs."""
    import copy
    import dataclasses

    from memx_hpc.errors import SpecError
    from memx_hpc.shellsafe import setup_commands
    from memx_hpc.spec import site_from_mapping

    marker = tmp_path / "pwned"
    value = [v.format(marker=marker) for v in value] if isinstance(value, list) else value.format(marker=marker)
    doc = {"name": "one-cpu", "slurm": {"scheduler": "local"}, "work_dir": str(tmp_path / "runs"),
           "partitions": [{"name": "cpu", "gpu_type": "cpu", "nodes": 1, "gpus_per_node": 1,
                           "python": sys.executable}]}
    bad = copy.deepcopy(doc)
    bad["partitions"][0][key] = value
    with pytest.raises(SpecError) as e:
        site_from_mapping(bad)
    assert e.value.field.startswith(f"partitions[0].{key}")
    site = site_from_mapping(doc)
    with pytest.raises(SpecError) as e:
        dataclasses.replace(site.partitions[0], **{key: tuple(value) if isinstance(value, list) else value})
    assert e.value.field.startswith(key)
    if key == "setup":  # and written anyway, the quoted eval runs nothing of it
        r = subprocess.run(["bash", "-c", "\n".join(setup_commands(value) + ["echo after"])], capture_output=True,
                           text=True)
        assert "syntax error" in r.stderr and "after" in r.stdout
    assert not marker.exists()


MOE_SHAPE = dataclasses.replace(SHAPE, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=256)


@pytest.mark.slow
def test_moe_layer_and_alltoall_on_one_and_two_ranks(tmp_path):
    """megatron-core's MoE layer (local spec, SequentialMLP experts, all-to-all dispatcher) runs
    on this CPU: with its 4 experts on one rank, and at EP 2 over two gloo ranks beside the
    all-to-all of its dispatch message; what it keeps for backward is of the size the analytic
    formula says (router scores, k routed copies, the experts' interiors)."""
    from memx_hpc.model.api import LayerQuery, analytic_activation_bytes

    msg = 2 * SHAPE.seq_length * 2 * SHAPE.hidden_size * 4 // 2  # mbs 2, top-2, fp32, half leaves the rank
    one = ProfileTask(gpu_type="cpu-test", vendor="cpu", memory_cap_bytes=2**32,
                      points=(ProfilePoint(gpu_type="cpu-test", kind="layer", shape=MOE_SHAPE, micro_batch_size=2,
                                           precision="fp32"),), world_size=1,
                      settings=RunSettings(warmup=1, iters=2), rendezvous_dir=str(tmp_path))
    two = ProfileTask(gpu_type="cpu-test", vendor="cpu", memory_cap_bytes=2**32,
                      points=(ProfilePoint(gpu_type="cpu-test", kind="layer", shape=MOE_SHAPE, micro_batch_size=2,
                                           precision="fp32", ep=2),
                              ProfilePoint(gpu_type="cpu-test", kind="alltoall", shape=MOE_SHAPE, group_size=2,
                                           message_bytes=msg, precision="fp32")),
                      world_size=2, settings=RunSettings(warmup=1, iters=2), rendezvous_dir=str(tmp_path))
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    (r1,) = run_tasks(tmp_path / "one", [one])
    (r2,) = run_tasks(tmp_path / "two", [two], ranks=2)
    assert r1.failures == () and r2.failures == ()
    (moe1,) = r1.samples
    kinds = {s.point.kind: s for s in r2.samples}
    moe2, a2a = kinds["layer"], kinds["alltoall"]
    assert moe1.forward_ms > 0 and moe2.forward_ms > 0 and a2a.forward_ms > 0
    assert moe2.point.ep == 2 and moe2.provenance.as_dict()["world_size"] == 2
    q = LayerQuery(gpu_type="cpu-test", kind="layer", shape=MOE_SHAPE, tp=1, micro_batch_size=2, recompute="none",
                   precision="fp32")
    want = analytic_activation_bytes(q, dropout_mask_bytes=1)
    assert 0.6 * want < moe1.activation_bytes < 1.6 * want, (moe1.activation_bytes, want)
