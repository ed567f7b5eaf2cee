"""The CPU trainer (``python -m memx_hpc.train.pretrain_gpt``): Megatron-LM's command line,
real runs of 1 and 2 processes over gloo, and its Megatron-LM style log lines."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from memx_hpc.errors import SystemFailure
from memx_hpc.train.args import parse_args
from memx_hpc.train.checkpoint import _older_naming
from memx_hpc.train.logs import iteration_line, memory_line, parse_log
from memx_hpc.model.analytic import padded_vocab_size
from memx_hpc.train.pretrain_gpt import dist_env

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--max-position-embeddings", "32", "--vocab-size", "128", "--micro-batch-size", "2",
        "--global-batch-size", "4", "--log-interval", "1", "--mock-data", "--tokenizer-type", "NullTokenizer"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(argv: list[str], world: int, *, timeout: float = 120.0, extra_env: dict[str, str] | None = None,
            patch: str = "") -> list[subprocess.CompletedProcess]:
    """``world`` trainer processes with torchrun's variables (one thread each: 2 cores here);
    ``patch``, Python run on the entry's module ``p`` before its main."""
    port = str(_free_port())
    procs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, OMP_NUM_THREADS="1", **(extra_env or {}))
        entry = ["-c", f"import sys; import memx_hpc.train.pretrain_gpt as p; {patch}; sys.exit(p.main())"] \
            if patch else ["-m", "memx_hpc.train.pretrain_gpt"]
        procs.append(subprocess.Popen([sys.executable, *entry, *argv], env=env,
                                      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    out = []
    try:
        for p in procs:
            stdout, _ = p.communicate(timeout=timeout)
            out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, ""))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return out


def test_single_process_trains_and_logs_like_megatron() -> None:
    (r,) = _launch([*TINY, "--train-iters", "2", "--bf16", "--use-distributed-optimizer"], 1)
    assert r.returncode == 0, r.stdout[-3000:]
    log = parse_log(r.stdout)
    assert [i.iteration for i in log.iterations] == [1, 2] and log.iterations[0].train_iters == 2
    assert all(i.elapsed_ms > 0 and i.lm_loss is not None for i in log.iterations)
    # random tokens over a 128-word vocabulary (padded to 128 + 1 EOD -> 256): loss ~ ln(256)
    assert 4.0 < log.iterations[0].lm_loss < 7.0
    assert [(m.rank, m.iteration) for m in log.memory] == [(0, 1), (0, 2)]
    last = log.memory[-1]
    assert 0 < last.allocated_mb <= last.max_allocated_mb and last.reserved_mb <= last.max_reserved_mb
    (layout,) = log.layouts
    assert layout["layers"] == "0-3" and layout["embedding"] == layout["loss"] == "True"
    # GPU-only requests are not silently dropped: each says what was done instead
    assert "--bf16 requested: training in fp32 on the CPU" in r.stdout
    assert "--use-distributed-optimizer requested" in r.stdout


@pytest.mark.slow
def test_two_stage_pipeline_with_layout_and_own_recompute() -> None:
    """PP=2 over gloo with an uneven layout (3 + 1 layers) and full recompute: both ranks run
    the same command line here; under Slurm each component gets its own recompute flags."""
    argv = [*TINY, "--train-iters", "3", "--pipeline-model-parallel-size", "2",
            "--pipeline-model-parallel-layout", "Et*3|tL", "--recompute-granularity", "full",
            "--recompute-method", "block", "--recompute-num-layers", "2"]
    r0, r1 = _launch(argv, 2)
    assert r0.returncode == 0 and r1.returncode == 0, (r0.stdout[-2000:], r1.stdout[-2000:])
    log = parse_log(r0.stdout + r1.stdout)
    assert log.iterations_done == 3
    assert "iteration" not in r0.stdout.replace("iterations)", "")  # only the last rank logs iterations
    by_rank = {d["rank"]: d for d in log.layouts}
    assert (by_rank["0"]["layers"], by_rank["0"]["num layers"], by_rank["0"]["loss"]) == ("0-2", "3", "False")
    assert (by_rank["1"]["layers"], by_rank["1"]["num layers"], by_rank["1"]["embedding"]) == ("3-3", "1", "False")
    assert by_rank["0"]["recompute"] == "full/block/2"
    assert sorted(log.peak_memory_mb()) == [0, 1]


@pytest.mark.slow
def test_cross_vendor_pipeline_trains_on_explicit_groups() -> None:
    """Ranks declared on two vendors (as a rendered cross-vendor script declares them): the
    trainer builds megatron-core's groups itself from the group rule, logs the designed
    backends, runs them on gloo here, and trains with a tied embedding across the stages."""
    argv = [*TINY, "--train-iters", "2", "--pipeline-model-parallel-size", "2",
            "--pipeline-model-parallel-layout", "Et*3|tL", "--pipeline-model-parallel-comm-backend", "ucc"]
    r0, r1 = _launch(argv, 2, extra_env={"MEMX_RANK_VENDORS": "nvidia*1,amd*1", "MEMX_CROSS_VENDOR_BACKEND": "ucc"})
    assert r0.returncode == 0 and r1.returncode == 0, (r0.stdout[-3000:], r1.stdout[-3000:])
    log = parse_log(r0.stdout + r1.stdout)
    assert log.iterations_done == 2
    # the same job on megatron-core's own groups (one vendor): the same losses, so the
    # explicit groups carry what parallel_state's would (tied-embedding sync included)
    p0, p1 = _launch(argv, 2)
    assert p0.returncode == 0 and p1.returncode == 0, (p0.stdout[-3000:], p1.stdout[-3000:])
    plain = parse_log(p0.stdout + p1.stdout)
    assert "process group pp: gloo x1 (inside one vendor (cpu))" in p0.stdout
    assert [i.lm_loss for i in log.iterations] == pytest.approx([i.lm_loss for i in plain.iterations], rel=1e-6)
    assert "process group pp: ucc x1 (spans vendors" in r0.stdout
    assert "process group mp: gloo x1 (spans vendors, cold" in r0.stdout
    assert "process group embd: ucc x1" in r0.stdout and "[gloo on the CPU]" in r0.stdout
    assert "process group tp: nccl x1 (inside one vendor (nvidia)) [0]; nccl x1 (inside one vendor (amd)) [1]" \
        in r0.stdout


def _lrs(stdout: str) -> list[float]:
    import re

    return [float(x) for x in re.findall(r"learning rate: ([0-9.E+-]+)", stdout)]


def _token_dataset(prefix: Path, vocab: int, docs: int = 40, seed: int = 0) -> None:
    """Megatron-LM's pre-tokenized format (.bin/.idx), written by megatron-core's own builder."""
    import numpy as np
    import torch  # noqa: F401 - megatron-core needs it first
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    b = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for _ in range(docs):
        doc = rng.integers(0, vocab, size=int(rng.integers(20, 60))).astype(np.int64)
        b.add_document(doc, [len(doc)])
    b.finalize(f"{prefix}.idx")


@pytest.mark.slow
def test_real_data_lr_schedule_and_checkpoint_resume(tmp_path: Path) -> None:
    """The job file's data (pre-tokenized, read by megatron-core's GPTDataset), learning-rate
    schedule and checkpoints: two iterations saved, then a resumed run does the third only."""
    prefix = tmp_path / "corpus_text_document"
    _token_dataset(prefix, vocab=128)
    base = [a for a in TINY if a not in ("--mock-data",)]
    ck = tmp_path / "ckpt"
    common = [*base, "--data-path", str(prefix), "--split", "100,0,0", "--lr", "0.001", "--min-lr", "0.0001",
              "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--lr-decay-iters", "3"]
    (r,) = _launch([*common, "--train-iters", "2", "--save", str(ck), "--save-interval", "1"], 1)
    assert r.returncode == 0, r.stdout[-3000:]
    log = parse_log(r.stdout)
    assert [i.iteration for i in log.iterations] == [1, 2]
    assert all(i.lm_loss is not None and 3.0 < i.lm_loss < 7.0 for i in log.iterations)
    assert _lrs(r.stdout)[0] == pytest.approx(0.001)  # end of the 1-iteration warm-up
    assert (ck / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert (ck / "iter_0000001" / "common.pt").is_file() and (ck / "iter_0000001" / ".metadata").is_file()
    (r2,) = _launch([*common, "--train-iters", "3", "--load", str(ck)], 1)
    assert r2.returncode == 0, r2.stdout[-3000:]
    assert "resumed from" in r2.stdout and [i.iteration for i in parse_log(r2.stdout).iterations] == [3]
    (lr3,) = _lrs(r2.stdout)
    assert 0.0001 <= lr3 < 0.001  # cosine decay continued from the checkpoint's scheduler
    with pytest.raises(SystemExit):
        parse_args([*base, "--train-iters", "1"])  # neither data nor mock data
    with pytest.raises(SystemExit):
        parse_args([*common, "--train-iters", "1", "--mock-data"])


def test_unknown_argument_is_refused_like_megatron(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        parse_args([*TINY, "--train-iters", "1", "--no-such-flag"])
    assert e.value.code == 2 and "--no-such-flag" in capsys.readouterr().err


def test_argument_checks_follow_megatron() -> None:
    with pytest.raises(SystemExit):
        parse_args([*TINY, "--train-iters", "1", "--recompute-granularity", "full"])  # needs a method
    with pytest.raises(SystemExit):
        parse_args([*TINY, "--train-iters", "1", "--bf16", "--fp16"])
    a = parse_args([*TINY, "--train-iters", "1", "--recompute-activations", "--no-gradient-accumulation-fusion"])
    assert a.recompute_granularity == "selective"  # Megatron-LM: --recompute-activations = selective
    assert a.ignored == (("--no-gradient-accumulation-fusion", "gradient accumulation fusion is a CUDA kernel"),)


def test_rank_from_torchrun_then_slurm_variables() -> None:
    e = dist_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234",
                  "SLURM_PROCID": "0", "SLURM_NTASKS": "9"})
    assert (e.rank, e.world_size, e.local_rank, e.master_addr, e.master_port, e.source) == (3, 4, 1, "10.0.0.1", 1234,
                                                                                          "torchrun")
    e = dist_env({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "MASTER_PORT": "5"})
    assert (e.rank, e.world_size, e.source) == (1, 2, "slurm")
    assert dist_env({}).world_size == 1


def test_vocab_padding_is_megatrons() -> None:
    # NullTokenizer adds EOD; pad to a multiple of make_vocab_size_divisible_by * tp
    assert padded_vocab_size(1024, 1, 128) == 1152
    assert padded_vocab_size(50257, 2, 128) == 50432
    assert padded_vocab_size(127, 1, 128) == 128


def test_log_lines_round_trip() -> None:
    text = "\n".join([
        iteration_line(iteration=1, train_iters=3, consumed_samples=8, elapsed_ms=900.0, learning_rate=1e-4,
                       global_batch_size=8, lm_loss=7.0, grad_norm=1.5, timestamp="2025-01-01 00:00:00"),
        iteration_line(iteration=2, train_iters=3, consumed_samples=16, elapsed_ms=410.0, learning_rate=1e-4,
                       global_batch_size=8, lm_loss=6.9, grad_norm=None, timestamp="2025-01-01 00:00:01"),
        iteration_line(iteration=3, train_iters=3, consumed_samples=24, elapsed_ms=390.0, learning_rate=1e-4,
                       global_batch_size=8, lm_loss=None, grad_norm=None, timestamp="2025-01-01 00:00:02"),
        memory_line(rank=1, iteration=3, allocated_bytes=2**20, max_allocated_bytes=3 * 2**20,
                    reserved_bytes=5 * 2**20, max_reserved_bytes=6 * 2**20),
        "unrelated noise | iteration",
    ])
    log = parse_log(text)
    assert log.iterations_done == 3 and log.iteration_ms() == pytest.approx(400.0)  # median of 2, 3
    assert log.iterations[1].lm_loss == pytest.approx(6.9) and log.iterations[2].lm_loss is None
    assert log.peak_memory_mb() == {1: 3.0} and log.peak_reserved_mb() == {1: 6.0}


def test_megatron_lm_log_line_parses() -> None:
    """A line as Megatron-LM's training_log prints it on a GPU cluster."""
    line = (" [2025-03-01 12:00:00] iteration       10/     100 | consumed samples:          640 | elapsed time per "
            "iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 150.2 | learning rate: 1.500000E-04 | "
            "global batch size:    64 | lm loss: 8.123456E+00 | loss scale: 1.0 | grad norm: 2.345 | "
            "number of skipped iterations:   0 | number of nan iterations:   0 |")
    mem = "[Rank 0] (after 10 iterations) memory (MB) | allocated: 1000.5 | max allocated: 30000.25 | " \
          "reserved: 32000.0 | max reserved: 32000.0"
    log = parse_log([line, mem])
    (it,) = log.iterations
    assert (it.iteration, it.train_iters, it.elapsed_ms, it.lm_loss) == (10, 100, 1234.5, pytest.approx(8.123456))
    assert log.peak_memory_mb() == {0: 30000.25}


def test_memory_tracker_counts_storages_once() -> None:
    import torch  # noqa: F401 - megatron-core needs it first

    from memx_hpc.train.cpu import TensorMemoryTracker

    with TensorMemoryTracker() as t:
        a = torch.zeros(1000, 250)  # 1,000,000 bytes
        v = a.view(-1)  # a view: no new storage
        b = a + 1
        assert t.allocated_bytes == 2_000_000 and t.max_allocated_bytes == 2_000_000
        del b
        assert t.allocated_bytes == 1_000_000
        c = torch.ones(10)
        assert t.max_allocated_bytes == 2_000_000 and t.allocated_bytes == 1_000_040
    del a, v, c


def test_measurement_records_keys_and_torn_lines(tmp_path: Path) -> None:
    import dataclasses
    import json as _json

    from memx_hpc.errors import SpecError
    from memx_hpc.planfile import load_plan
    from memx_hpc.spec import load_job, load_site
    from memx_hpc.train.measure import E2ERecord, plan_key, read_records

    site = load_site(ROOT / "site_configs" / "local.yaml")
    job = load_job(ROOT / "jobs" / "tiny-gpt.yaml")
    plan = load_plan(ROOT / "tests" / "golden" / "plans" / "local-pp2-a100-mi250.json")
    k = plan_key(plan, site, job, 5)
    assert k == plan_key(plan, load_site(ROOT / "site_configs" / "local.yaml"), job, 5)  # stable across loads
    assert k != plan_key(plan, site, job, 6)
    assert k != plan_key(dataclasses.replace(plan, micro_batch_size=4), site, job, 5)
    assert k != plan_key(plan, site, dataclasses.replace(job, precision="bf16"), 5)

    rec = E2ERecord(key=k, plan={}, site="local", job="tiny-gpt", iters=5, iteration_ms=12.5,
                    peak_allocated_bytes={"0": 10, "1": 20}, peak_footprint_bytes_by_rank={"0": 30, "1": 50},
                    gpu_type_by_rank={"0": "cpu-4g", "1": "cpu-4g"}, job_id="7", log_file="x.out")
    path = tmp_path / "store.e2e.jsonl"
    rec.append_to(path)
    rec.append_to(path)
    with open(path, "a") as f:
        f.write('{"format": "memx-e2e/1", "key": "tor')  # a crash while appending
    got = read_records(path)
    assert len(got) == 2 and got[0] == rec and got[0].peak_footprint_bytes == 50
    path.write_text(_json.dumps({"format": "other"}) + "\n" + path.read_text())
    with pytest.raises(SpecError) as e:
        read_records(path)
    assert e.value.field == "line 1"


def _scalars(folder: Path) -> dict[str, dict[int, float]]:
    """Every scalar of the TensorBoard event files in ``folder``, read back by TensorBoard's own
    reader: tag -> step -> value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    for f in sorted(folder.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    return out


def test_tensorboard_events_hold_loss_learning_rate_throughput_and_memory(tmp_path: Path) -> None:
    """--tensorboard-dir: real event files, Megatron-LM's tags, one value per logged iteration, on the
    last rank; --wandb-project without wandb installed is said once and ignored."""
    pytest.importorskip("tensorboard")
    tb = tmp_path / "tb"
    r0, r1 = _launch([*TINY, "--train-iters", "3", "--pipeline-model-parallel-size", "2",
                      "--tensorboard-dir", str(tb), "--tensorboard-log-interval", "1", "--log-throughput",
                      "--log-memory-to-tensorboard", "--log-timers-to-tensorboard", "--wandb-project", "p",
                      "--wandb-exp-name", "e", "--wandb-save-dir", str(tmp_path / "wandb")], 2)
    assert r0.returncode == 0 and r1.returncode == 0, r0.stdout[-3000:] + r1.stdout[-3000:]
    assert "TensorBoard events in" in r1.stdout and "TensorBoard" not in r0.stdout
    got = _scalars(tb)
    for tag in ("lm loss", "learning-rate", "throughput", "iteration-time", "grad-norm", "mem-allocated-bytes",
                "mem-max-allocated-bytes", "mem-reserved-bytes", "batch-size"):
        assert sorted(got[tag]) == [1, 2, 3], tag
    losses = {r.iteration: r.lm_loss for r in parse_log(r1.stdout).iterations}
    for it, loss in losses.items():
        assert got["lm loss"][it] == pytest.approx(loss, rel=1e-5)
    assert all(v > 0 for v in got["throughput"].values()) and "throughput per GPU (TFLOP/s/GPU)" in r1.stdout
    try:
        import wandb  # noqa: F401
    except ImportError:
        assert "wandb is not installed" in r1.stdout


@pytest.mark.slow
def test_cross_vendor_pipeline_interleaves_virtual_stages_and_resumes(tmp_path: Path) -> None:
    """Virtual stages across vendors: the layout's four chunks on two stages declared on two
    vendors train on the group rule's explicit groups with megatron-core's interleaved
    schedule, lose what the same run on parallel_state's groups loses, and a run stopped after
    one iteration resumes from its checkpoint (keys model0, model1) to the uninterrupted losses."""
    argv = [*TINY, "--train-iters", "3", "--pipeline-model-parallel-size", "2",
            "--pipeline-model-parallel-layout", "Et|t|t|tL", "--pipeline-model-parallel-comm-backend", "ucc"]
    cross = {"MEMX_RANK_VENDORS": "nvidia*1,amd*1", "MEMX_CROSS_VENDOR_BACKEND": "ucc"}
    full = _launch(argv, 2, extra_env=cross)
    assert all(p.returncode == 0 for p in full), [p.stdout[-3000:] for p in full]
    losses = [i.lm_loss for i in parse_log(full[0].stdout + full[1].stdout).iterations]
    assert len(losses) == 3
    assert "virtual stages: 2" in full[0].stdout and "layers: 0-0,2-2" in full[0].stdout
    plain = _launch(argv, 2)
    assert [i.lm_loss for i in parse_log(plain[0].stdout + plain[1].stdout).iterations] == pytest.approx(losses,
                                                                                                        rel=1e-6)
    ck = str(tmp_path / "ck")
    first = _launch(argv + ["--save", ck, "--save-interval", "1", "--exit-interval", "1"], 2, extra_env=cross)
    assert all(p.returncode == 0 for p in first)
    rest = _launch(argv + ["--save", ck, "--load", ck], 2, extra_env=cross)
    assert all(p.returncode == 0 for p in rest), [p.stdout[-3000:] for p in rest]
    resumed = parse_log(rest[0].stdout + rest[1].stdout)
    assert [i.lm_loss for i in resumed.iterations] == pytest.approx(losses[1:], rel=1e-6)


@pytest.mark.slow
def test_cross_vendor_pipeline_of_experts_builds_the_rules_expert_groups() -> None:
    """A mixture of experts across vendors (EP 2 inside each stage, two stages on two vendors,
    virtual stages too): the entry hands megatron-core the group rule's expert groups (ep, edp;
    the router's stage-wide group) and loses what the same run on parallel_state's groups loses."""
    argv = [*TINY, "--train-iters", "2", "--global-batch-size", "8", "--pipeline-model-parallel-size", "2",
            "--pipeline-model-parallel-layout", "Et|t|t|tL", "--pipeline-model-parallel-comm-backend", "ucc",
            "--num-experts", "4", "--expert-model-parallel-size", "2", "--swiglu", "--disable-bias-linear"]
    cross = _launch(argv, 4, timeout=300,
                    extra_env={"MEMX_RANK_VENDORS": "nvidia*2,amd*2", "MEMX_CROSS_VENDOR_BACKEND": "ucc"})
    assert all(p.returncode == 0 for p in cross), [p.stdout[-3000:] for p in cross]
    out = "".join(p.stdout for p in cross)
    assert "process group ep: nccl x1 (inside one vendor (nvidia)) [0, 1]; nccl x1 (inside one vendor (amd)) [2, 3]" \
        in out and "experts: 2/4" in out
    plain = _launch(argv, 4, timeout=300)
    assert all(p.returncode == 0 for p in plain), [p.stdout[-3000:] for p in plain]
    losses = [i.lm_loss for i in parse_log(out).iterations]
    assert len(losses) == 2
    assert [i.lm_loss for i in parse_log("".join(p.stdout for p in plain)).iterations] == pytest.approx(losses,
                                                                                                       rel=1e-6)


def test_context_parallel_without_transformer_engine_is_refused_by_name() -> None:
    """CP (which cross-vendor plans may carry inside each stage) runs on Transformer Engine's
    attention only: without it (here, the CPU) every rank stops with exit 1 saying why."""
    argv = [*TINY, "--train-iters", "1", "--context-parallel-size", "2"]
    runs = _launch(argv, 2)
    assert [p.returncode for p in runs] == [1, 1], [p.stdout[-2000:] for p in runs]
    assert "error: --context-parallel-size 2 needs Transformer Engine's attention" in runs[0].stdout
    with pytest.raises(SystemExit):  # ring attention's 2 x CP chunks, as Megatron-LM asserts
        parse_args([*TINY, "--train-iters", "1", "--context-parallel-size", "3"])


MLA = [*TINY, "--multi-latent-attention", "--q-lora-rank", "32", "--kv-lora-rank", "16", "--qk-head-dim", "16",
       "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16", "--qk-layernorm", "--position-embedding-type", "rope",
       "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear", "--lr", "0.01",
       "--lr-decay-style", "constant"]


def _checkpoint_keys(path: Path) -> set[str]:
    from torch.distributed.checkpoint import FileSystemReader

    return set(FileSystemReader(str(path)).read_metadata().state_dict_metadata)


def test_multi_latent_attention_trains_saves_transformer_engine_keys_and_resumes(tmp_path: Path) -> None:
    """A tiny MLA model (megatron-core's MLASelfAttention, MLATransformerConfig, YaRN by default
    as Megatron-LM) trains on the CPU with falling loss; its torch_dist checkpoint names the
    latent norms as Transformer Engine's layer does, and a run stopped after three iterations
    resumes to the uninterrupted run's losses."""
    argv = [*MLA, "--train-iters", "6"]
    (full,) = _launch(argv, 1)
    assert full.returncode == 0, full.stdout[-3000:]
    losses = [i.lm_loss for i in parse_log(full.stdout).iterations]
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.3
    assert "multi-latent attention: True" in full.stdout
    ck = tmp_path / "ck"
    (first,) = _launch(argv + ["--save", str(ck), "--save-interval", "3", "--exit-interval", "3"], 1)
    assert first.returncode == 0, first.stdout[-3000:]
    keys = {k for k in _checkpoint_keys(ck / "iter_0000003") if k.startswith("decoder.layers.")}
    attn = "decoder.layers.self_attention."
    assert {"decoder.layers.input_layernorm.weight", attn + "linear_q_down_proj.weight",
            attn + "linear_q_up_proj.weight", attn + "linear_q_up_proj.layer_norm_weight",
            attn + "linear_kv_down_proj.weight", attn + "linear_kv_up_proj.weight",
            attn + "linear_kv_up_proj.layer_norm_weight", attn + "linear_proj.weight",
            "decoder.layers.mlp.linear_fc1.layer_norm_weight", "decoder.layers.mlp.linear_fc1.weight",
            "decoder.layers.mlp.linear_fc2.weight"} <= keys
    assert not any("q_layernorm" in k or "kv_layernorm" in k or "pre_mlp_layernorm" in k for k in keys)
    (rest,) = _launch(argv + ["--save", str(ck), "--load", str(ck)], 1)
    assert rest.returncode == 0, rest.stdout[-3000:]
    assert "resumed from" in rest.stdout
    assert [i.lm_loss for i in parse_log(rest.stdout).iterations] == pytest.approx(losses[3:], rel=1e-5)


def test_experts_checkpoint_of_the_earlier_naming_resumes_and_is_rewritten(tmp_path: Path) -> None:
    """An MoE checkpoint written under megatron-core's local-spec names (the MLP norm as
    ``mlp.linear_fc1.layer_norm_``, what the entry wrote before it kept ``pre_mlp_layernorm``
    for MoE layers as Transformer Engine does) resumes to the uninterrupted losses, says so once,
    and the next checkpoint has the current name."""
    argv = [*TINY, "--train-iters", "4", "--num-experts", "4", "--swiglu", "--disable-bias-linear", "--lr", "0.01",
            "--lr-decay-style", "constant"]
    (full,) = _launch(argv, 1)
    assert full.returncode == 0, full.stdout[-3000:]
    losses = [i.lm_loss for i in parse_log(full.stdout).iterations]
    ck = tmp_path / "ck"
    older = ("p.te_checkpoint_keys = lambda a: {'input_layernorm.': 'self_attention.linear_qkv.layer_norm_', "
             "'pre_mlp_layernorm.': 'mlp.linear_fc1.layer_norm_'}")
    (first,) = _launch(argv + ["--save", str(ck), "--save-interval", "2", "--exit-interval", "2"], 1, patch=older)
    assert first.returncode == 0, first.stdout[-3000:]
    norm, fused = "decoder.layers.pre_mlp_layernorm.weight", "decoder.layers.mlp.linear_fc1.layer_norm_weight"
    keys = _checkpoint_keys(ck / "iter_0000002")
    assert fused in keys and norm not in keys
    (rest,) = _launch(argv + ["--save", str(ck), "--load", str(ck)], 1)
    assert rest.returncode == 0, rest.stdout[-3000:]
    assert rest.stdout.count("read under an earlier release's names mlp.linear_fc1.layer_norm_*") == 1
    assert [i.lm_loss for i in parse_log(rest.stdout).iterations] == pytest.approx(losses[2:], rel=1e-5)
    keys = _checkpoint_keys(ck / "iter_0000004")
    assert norm in keys and fused not in keys
    with pytest.raises(SystemFailure, match=f"^CK: the checkpoint holds no tensor {norm} \\(nor the older {fused}\\)"):
        _older_naming("CK", {norm, "decoder.layers.mlp.router.weight"}, {"decoder.layers.mlp.router.weight"})


def test_gelu_experts_train_and_experts_with_biases_are_refused() -> None:
    """Experts with Megatron's default GeLU (no --swiglu, no biases) train on the entry's local
    experts; experts with linear biases are refused by name before anything runs (megatron-core
    0.16.1's local experts add the expert bias in place, which autograd refuses, and with GeLU
    its fused bias activation takes no router scale)."""
    (r,) = _launch([*TINY, "--train-iters", "2", "--num-experts", "4", "--disable-bias-linear"], 1)
    assert r.returncode == 0, r.stdout[-3000:]
    assert len(parse_log(r.stdout).iterations) == 2
    with pytest.raises(SystemExit):
        parse_args([*TINY, "--train-iters", "1", "--num-experts", "4"])


def test_multi_latent_attention_with_experts_and_unfused_attention() -> None:
    """MLA with an MoE MLP and megatron-core's unfused attention (the adapter that takes MLA's
    k/v head sizes), plain RoPE: two iterations train."""
    (r,) = _launch([*MLA, "--train-iters", "2", "--num-experts", "4", "--attention-backend", "unfused",
                    "--rope-type", "rope"], 1)
    assert r.returncode == 0, r.stdout[-3000:]
    assert len(parse_log(r.stdout).iterations) == 2 and "attention: core" in r.stdout


def test_mla_arguments_follow_megatron() -> None:
    a = parse_args([*MLA, "--train-iters", "1"])
    assert (a.multi_latent_attention, a.q_lora_rank, a.kv_lora_rank, a.rope_type, a.rotary_scaling_factor,
            a.mscale, a.mscale_all_dim) == (True, 32, 16, None, 1.0, 1.0, 0.0)
    b = parse_args([*TINY, "--train-iters", "1", "--multi-latent-attention"])
    assert (b.q_lora_rank, b.kv_lora_rank, b.qk_head_dim, b.qk_pos_emb_head_dim, b.v_head_dim) == (None, 32, 128, 64, 128)
    with pytest.raises(SystemExit):  # Megatron-LM: GQA and MLA are mutually exclusive
        parse_args([*MLA, "--train-iters", "1", "--group-query-attention", "--num-query-groups", "2"])
    with pytest.raises(SystemExit):  # Megatron-LM: other attention takes rope only
        parse_args([*TINY, "--train-iters", "1", "--rope-type", "yarn"])


def test_throughput_counts_mla_flops_as_megatron() -> None:
    """training_flops of an MLA model: Megatron-LM's MLA attention term (num_floating_point_operations)."""
    from memx_hpc.train.logs import training_flops

    a = parse_args([*MLA, "--train-iters", "1"])
    h, s, n, heads = 64, 32, 4, 4
    q_term = 32 * (h + heads * (16 + 8) + 1)
    attn = q_term + 16 * (h + heads * (16 + 16) + 1) + h * 8 + heads * 16 * h + s * heads * 24 / 2 + s * heads * 16 / 2
    mlp = 4 * h * 3 * n  # SwiGLU's two branches of width 4h (--ffn-hidden-size not given)
    want = 2 * s * (6 * h * mlp + 6 * attn * n + 6 * h * 256)
    assert training_flops(a, batch_size=2, padded_vocab_size=256) == pytest.approx(want)


def test_qk_layernorm_builds_the_q_and_k_norms() -> None:
    """--qk-layernorm reaches the layer spec (as Megatron-LM's gpt_builders passes it): each of
    the 4 layers gains a LayerNorm (weight and bias) of the head size (16) on Q and on K."""
    runs = [_launch([*TINY, "--train-iters", "1", *extra], 1)[0] for extra in ([], ["--qk-layernorm"])]
    assert all(r.returncode == 0 for r in runs), [r.stdout[-2000:] for r in runs]
    plain, normed = (int(parse_log(r.stdout).layouts[0]["parameters"]) for r in runs)
    assert normed - plain == 4 * 2 * 2 * 16
