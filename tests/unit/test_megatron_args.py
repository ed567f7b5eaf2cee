"""Megatron-LM is the judge of its own arguments: every rendered command line -- each golden
script's components and the top plans searched on both example sites -- goes through
Megatron-LM's ``parse_args`` + ``validate_args`` at core_v0.16.1 (``../shared/data/megatron-lm``,
BSD-3, NVIDIA), exactly as ``pretrain_gpt.py`` calls them (``initialize_megatron`` with
``args_defaults={'tokenizer_type': 'GPT2BPETokenizer'}``), with the job's world size.

Importing it: Megatron-LM's ``megatron/training/__init__.py`` imports its training loop,
whose ``initialize.py`` imports megatron-core's batch-invariant Triton kernels at module
level (``triton`` is a 286 MB wheel). Neither ``parse_args`` nor ``validate_args`` uses
them, so the package ``megatron.training`` is set up without running that ``__init__``:
its ``arguments`` module and what it imports (``utils``, ``global_vars``, the tokenizer
package, ...) load from the source unchanged, with the names ``utils`` takes from the
package (``get_args`` and friends) bound from ``global_vars`` as ``__init__`` binds them.
Nothing Megatron-LM runs while judging is replaced. ``six``, ``regex`` and ``pydantic`` come
from the ``test`` extra.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import shlex
import sys
import types
from pathlib import Path

import pytest

from memx_hpc.datapaths import shared_data
from memx_hpc.planfile import load_plan
from memx_hpc.slurm.render import describe, render
from memx_hpc.spec import load_job, load_site

ROOT = Path(__file__).resolve().parents[2]
DATA = shared_data(required=False) or ROOT.parent / "shared" / "data"  # $MEMX_SHARED_DATA or ../shared/data
MEGATRON_LM = DATA / "megatron-lm"
GOLDEN = ROOT / "tests" / "golden"
_TRAINING_NAMES = ("get_args", "get_signal_handler", "get_tokenizer", "get_tensorboard_writer", "get_wandb_writer",
                   "get_one_logger", "get_adlr_autoresume", "get_timers")


@pytest.fixture(autouse=True)
def _megatron_lm_source(needs) -> None:
    needs((MEGATRON_LM / "megatron" / "training" / "arguments.py").is_file(),
          f"Megatron-LM's source is not at {MEGATRON_LM}", "it is the shared data folder's megatron-lm/")


def _megatron_lm():
    """Megatron-LM's (parse_args, validate_args) from the shared source."""
    for mod in ("six", "regex", "pydantic"):
        try:
            importlib.import_module(mod)
        except ImportError:
            pytest.fail(f"{mod} is missing: install the test extra (pip install -e '.[test]')")
    if str(MEGATRON_LM) not in sys.path:
        sys.path.insert(0, str(MEGATRON_LM))
    import megatron

    extra = str(MEGATRON_LM / "megatron")
    if extra not in megatron.__path__:
        megatron.__path__.append(extra)
    if "megatron.training" not in sys.modules:
        pkg = types.ModuleType("megatron.training")
        pkg.__path__ = [str(MEGATRON_LM / "megatron" / "training")]
        sys.modules["megatron.training"] = pkg
        gv = importlib.import_module("megatron.training.global_vars")
        for name in _TRAINING_NAMES:
            setattr(pkg, name, getattr(gv, name))
    arguments = importlib.import_module("megatron.training.arguments")
    return arguments.parse_args, arguments.validate_args


#: The GPU generation validate_args is told it runs on (``get_device_arch_version``, which
#: reads cuda:0): 8, Ampere -- the branch that still asserts CUDA_DEVICE_MAX_CONNECTIONS=1
#: for tensor parallelism (Blackwell, 10, dropped it).
ARCH_MAJOR = 8


def judge(argv: list[str], world_size: int, monkeypatch: pytest.MonkeyPatch,
          env: dict[str, str] | None = None) -> object:
    """Megatron-LM's verdict on one rank's command line in environment ``env`` (what the
    component exports): its parsed args, or its exception."""
    parse_args, validate_args = _megatron_lm()
    arguments = sys.modules["megatron.training.arguments"]
    monkeypatch.setattr(arguments, "get_device_arch_version", lambda: ARCH_MAJOR)
    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *argv])
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    args = parse_args()
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # validate_args prints every argument
        validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
    return args


def _argv_of(text: str, component: int) -> list[str]:
    """One component's training command line as bash would split it (after the entry)."""
    body = text.split(f"memx_component_{component}() {{", 1)[1].split("\n}", 1)[0]
    words = shlex.split(body.split("  exec ", 1)[1].replace("\\\n", " "))
    words = words[:-1] if words[-1] == "$@" else words
    i = words.index("-m") + 2 if "-m" in words else next(k for k, w in enumerate(words) if w.endswith(".py")) + 1
    return words[i:]


def _exports(text: str, component: int) -> dict[str, str]:
    body = text.split(f"memx_component_{component}() {{", 1)[1].split("\n}", 1)[0]
    out = {}
    for line in body.splitlines():
        if line.startswith("  export ") and "=" in line and "$" not in line:
            k, v = shlex.split(line[len("  export "):])[0].split("=", 1)
            out[k] = v
    return out


def _judged_env(text: str, component: int) -> dict[str, str]:
    """The component's exports. A component that runs the project's megatron-core entry
    (cross-vendor, or CPU) is judged as Megatron-LM's pretrain_gpt.py would need to be
    launched with the same arguments (CUDA_DEVICE_MAX_CONNECTIONS=1); Megatron-LM's
    pretrain_gpt.py itself is judged with exactly what the script exports."""
    env = _exports(text, component)
    body = text.split(f"memx_component_{component}() {{", 1)[1].split("\n}", 1)[0]
    if "-m memx_hpc.train.pretrain_gpt" in body:
        env.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    return env


def _world(text: str) -> int:
    return int(text.split(" ranks in ", 1)[0].rsplit(" ", 1)[1])


GOLDENS = sorted(p.name for p in GOLDEN.glob("*.sbatch"))


@pytest.mark.parametrize("name", GOLDENS)
def test_megatron_lm_accepts_every_golden_component(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (GOLDEN / name).read_text()
    n = text.count("() {\n")
    assert n >= 1
    for c in range(n):
        argv = _argv_of(text, c)
        args = judge(argv, _world(text), monkeypatch, _judged_env(text, c))
        flags = dict(zip(argv, argv[1:]))
        assert args.tensor_model_parallel_size == int(flags["--tensor-model-parallel-size"])
        assert args.transformer_impl == flags["--transformer-impl"]  # rendered explicitly, kept as given
        assert args.data_parallel_size * args.tensor_model_parallel_size * args.pipeline_model_parallel_size \
            == _world(text)


def test_megatron_lm_rejects_what_megatron_core_asserts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge is real: an argument set Megatron-LM refuses is refused here."""
    argv = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--max-position-embeddings", "32", "--micro-batch-size", "1", "--global-batch-size", "3",
            "--train-iters", "1", "--lr", "1e-4", "--mock-data", "--tokenizer-type", "NullTokenizer",
            "--vocab-size", "128"]
    judge(argv, 1, monkeypatch)
    with pytest.raises(AssertionError):
        judge(argv + ["--sequence-parallel", "--tensor-model-parallel-size", "1",
                      "--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Et*3|tL",
                      "--num-layers-per-virtual-pipeline-stage", "3"], 2, monkeypatch)


def _cli(*args: str) -> None:
    import subprocess

    r = subprocess.run([sys.executable, "-m", "memx_hpc.cli.main", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, f"memx-hpc {' '.join(args)}: {r.stderr[-2000:]}"


@pytest.fixture(scope="module")
def searched_plans(tmp_path_factory):
    """The top 3 plans (and the recommended and fastest) of ``plan --no-profile`` on both example sites: the local site with an
    empty store (datasheet figures), the cross-vendor site with the shared Sailor and Cephalo
    profiles imported, for the Llama-2-7B and GPT-3 2.7B jobs."""
    tmp = tmp_path_factory.mktemp("searched")
    data = DATA
    store = tmp / "imported.h5"
    _cli("profile", "import", "--store", str(store), "--format", "sailor", str(data / "sailor"))
    _cli("profile", "import", "--store", str(store), "--format", "cephalo", str(data / "cephalo" / "model_latencies.json"))
    cases = [(ROOT / "site_configs" / "local.yaml", ROOT / "jobs" / "tiny-gpt.yaml", tmp / "local.h5"),
             (ROOT / "site_configs" / "example-cross-vendor.yaml", ROOT / "jobs" / "llama2-7b.yaml", store),
             (ROOT / "site_configs" / "example-cross-vendor.yaml", ROOT / "jobs" / "gpt3-2.7b.yaml", store)]
    out = []
    for i, (site_file, job_file, st) in enumerate(cases):
        d = tmp / f"plans-{i}"
        _cli("plan", "--site", str(site_file), "--job", str(job_file), "--no-profile", "--store", str(st),
             "--top", "3", "--out", str(d), "--json")
        run = d / "latest" if (d / "latest").is_dir() else d  # plan writes one folder per run
        files = sorted(run.glob("plan-*.json")) + [run / f for f in ("recommended.json", "fastest.json")
                                                    if (run / f).is_file()]
        out.append((site_file, job_file, [load_plan(f) for f in files]))
    return out


@pytest.mark.slow
def test_megatron_lm_accepts_the_top_plans_of_both_example_sites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  searched_plans) -> None:
    for site_file, job_file, plans in searched_plans:
        site, job = load_site(site_file), load_job(job_file)
        assert plans, f"no plans searched for {site_file.name} + {job_file.name}"
        # and each as a training run: data, a tokenizer, sample-based length, checkpoints
        from dataclasses import replace

        from memx_hpc.spec import Checkpointing, TrainData

        trained = replace(job, train_iters=None, train_samples=100 * job.global_batch_size,
                          data=TrainData(paths=("0.6", "/d/a_text_document", "0.4", "/d/b_text_document"),
                                         tokenizer_type="HuggingFaceTokenizer", tokenizer_model="/d/tokenizer",
                                         split="98,2,0"),
                          checkpoint=Checkpointing(save_dir="/ck/run", load_dir="/ck/run", save_interval=50))
        for plan in plans:
            for j in (job, trained):
                req = describe(plan, site, j)
                text = render(plan, site, j)
                for c in range(len(req.components)):
                    args = judge(_argv_of(text, c), req.world_size, monkeypatch, _judged_env(text, c))
                    if j is trained:
                        assert (args.mock_data, args.ckpt_format, args.load) == (False, "torch_dist", "/ck/run")
                        assert args.train_samples == 100 * job.global_batch_size and args.train_iters is None
            for g in req.groups:  # and the groups follow the rule
                assert g.backend in (("ucc", "gloo", "cpu:gloo,cuda:ucc") if g.cross_vendor else ("nccl", "gloo"))


def test_megatron_lm_accepts_a_training_launch_with_data_schedule_and_checkpoints(monkeypatch: pytest.MonkeyPatch,
                                                                                  tmp_path: Path) -> None:
    """A job file that names real data, a tokenizer, the LR schedule and checkpoints renders
    to arguments Megatron-LM accepts; verify's short runs (mock_data=True) keep mock data."""
    from memx_hpc.errors import SpecError
    from memx_hpc.spec import job_from_mapping

    import yaml

    doc = yaml.safe_load((ROOT / "jobs" / "gpt3-2.7b.yaml").read_text())
    doc.update(data={"paths": [0.7, "/data/web_text_document", 0.3, "/data/code_text_document"],
                     "tokenizer": {"type": "GPT2BPETokenizer", "vocab_file": "/data/gpt2-vocab.json",
                                   "merge_file": "/data/gpt2-merges.txt"}, "split": "98,2,0"},
               lr_schedule={"lr": 3.0e-4, "min_lr": 3.0e-5, "decay_style": "cosine", "warmup_iters": 100,
                            "decay_iters": 5000},
               checkpoint={"save": "/ckpt/gpt3", "load": "/ckpt/gpt3", "interval": 500}, train_iters=10000)
    job = job_from_mapping(doc)
    site = load_site(ROOT / "site_configs" / "example-cross-vendor.yaml")
    from memx_hpc.spec import Plan, Stage

    plan = Plan(tp=2, dp=2, micro_batch_size=1, global_batch_size=64,
                stages=(Stage(partition="gpu_a100", num_layers=20), Stage(partition="gpu_v100", num_layers=12)))
    req = describe(plan, site, job)
    text = render(plan, site, job)
    for c in range(len(req.components)):
        argv = _argv_of(text, c)
        args = judge(argv, req.world_size, monkeypatch, _judged_env(text, c))
        assert args.data_path == ["0.7", "/data/web_text_document", "0.3", "/data/code_text_document"]
        assert (args.tokenizer_type, args.split, args.mock_data) == ("GPT2BPETokenizer", "98,2,0", False)
        assert (args.lr, args.min_lr, args.lr_decay_style, args.lr_warmup_iters, args.lr_decay_iters) == \
            (3.0e-4, 3.0e-5, "cosine", 100, 5000)
        assert (args.save, args.load, args.save_interval) == ("/ckpt/gpt3", "/ckpt/gpt3", 500)
    short = describe(plan, site, job, mock_data=True).megatron_argv[0]
    assert "--mock-data" in short and "--data-path" not in short
    # the project's entry (cross-vendor plans) builds GPT-2 BPE too: accepted by Megatron-LM as well;
    # a tokenizer it cannot build is refused, with the reason
    cross = Plan(tp=2, dp=2, micro_batch_size=1, global_batch_size=64,
                 stages=(Stage(partition="gpu_a100", num_layers=20), Stage(partition="gpu_mi250x", num_layers=12)))
    text = render(cross, site, job)
    req = describe(cross, site, job)
    for c in range(len(req.components)):
        args = judge(_argv_of(text, c), req.world_size, monkeypatch, _judged_env(text, c))
        assert (args.tokenizer_type, args.ckpt_format, args.train_iters) == ("GPT2BPETokenizer", "torch_dist", 10000)
        assert args.exit_duration_in_mins is not None and args.eval_iters == 10
    tik = job_from_mapping({**doc, "data": {**doc["data"], "tokenizer": {"type": "TikTokenizer",
                                                                        "model": "/data/tok.json"}}})
    with pytest.raises(SpecError) as e:
        describe(cross, site, tik)
    assert e.value.field == "data.tokenizer.type"
    for bad, field in (({"paths": ["/d/a;rm -rf x"], "tokenizer": {"type": "NullTokenizer"}}, "data.paths[0]"),
                       ({"paths": ["/d/a"], "tokenizer": {"type": "BertWordPiece"}}, "data.tokenizer.type")):
        with pytest.raises(SpecError) as e:
            job_from_mapping({**doc, "data": bad})
        assert e.value.field == field


def _dense_args(m) -> list[str]:
    """The dense shape's arguments as the renderer writes them (slurm/render.py ``_model_args``)."""
    a = ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size), "--ffn-hidden-size",
         str(m.ffn_hidden_size), "--num-attention-heads", str(m.num_attention_heads),
         "--seq-length", str(m.seq_length), "--max-position-embeddings", str(m.seq_length),
         "--swiglu", "--untie-embeddings-and-output-weights", "--position-embedding-type", "rope",
         "--normalization", "RMSNorm", "--disable-bias-linear"]
    if m.num_query_groups != m.num_attention_heads:
        a += ["--group-query-attention", "--num-query-groups", str(m.num_query_groups)]
    return a


HF_CONFIGS = ROOT / "tests" / "data" / "hf_configs"


@pytest.mark.parametrize("source,world,par", [
    ("Mixtral-8x7B", 16, dict(tp=2, pp=1, sequence_parallel=True, ep=8)),
    ("Qwen3-30B-A3B", 32, dict(tp=2, pp=2, sequence_parallel=True, ep=8, etp=1, virtual_stages=3)),
    ("DeepSeek-V2-Lite", 8, dict(tp=1, pp=1, ep=8)),
    ("DeepSeek-V3.json", 64, dict(tp=2, pp=1, sequence_parallel=True, ep=8, etp=1)),  # 61 layers: no even PP
    ("Qwen1.5-MoE-A2.7B.json", 8, dict(tp=2, pp=1, sequence_parallel=True, ep=4)),
    ("Llama-3.1-405B", 64, dict(tp=8, pp=4, sequence_parallel=True, virtual_stages=3, cp=2)),
    ("Llama-3-70B", 64, dict(tp=4, pp=8, sequence_parallel=True, virtual_stages=5)),
])
def test_megatron_lm_accepts_moe_mla_and_the_new_parallel_degrees(source, world, par, monkeypatch):
    """Megatron-LM's parse_args + validate_args on the model and parallelism arguments of
    memx_hpc.megatron_args, for the MoE/MLA presets and configs and a long-context and a
    70B-class dense layout (NVIDIA's Llama-3-70B recipe: TP4 PP8, 5 virtual stages)."""
    from memx_hpc.spec.catalog import preset
    from memx_hpc.spec.hfconfig import read_hf_config
    from memx_hpc.megatron_args import flat, model_extension_args, parallel_args
    from memx_hpc.spec import ModelSpec

    m = ModelSpec(**read_hf_config(HF_CONFIGS / source)) if source.endswith(".json") else preset(source)
    if source.startswith("DeepSeek-V3"):
        m = dataclasses.replace(m, seq_length=4096)
    pp = par.pop("pp")
    argv = (_dense_args(m) + flat(model_extension_args(m)) + flat(parallel_args(m, **par))
            + ["--tensor-model-parallel-size", str(par["tp"]), "--pipeline-model-parallel-size", str(pp),
               "--micro-batch-size", "1", "--global-batch-size", str(world * 4), "--train-iters", "1",
               "--lr", "1e-4", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size",
               str(m.vocab_size), "--bf16", "--use-distributed-optimizer"])
    args = judge(argv, world, monkeypatch, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert args.num_experts == m.num_experts
    assert args.expert_model_parallel_size == par.get("ep", 1)
    assert args.context_parallel_size == par.get("cp", 1)
    assert (args.virtual_pipeline_model_parallel_size or 1) == par.get("virtual_stages", 1)
    assert args.sequence_parallel == par.get("sequence_parallel", False)
    if m.is_moe:
        pattern = args.moe_layer_freq
        got = [i % pattern == 0 for i in range(m.num_layers)] if isinstance(pattern, int) else [bool(x) for x in pattern]
        assert tuple(got) == m.moe_layers
        assert args.moe_router_topk == m.moe_router_topk and args.moe_ffn_hidden_size == m.expert_ffn_hidden_size
    if m.multi_latent_attention:
        assert (args.kv_lora_rank, args.q_lora_rank, args.qk_pos_emb_head_dim) == \
            (m.kv_lora_rank, m.q_lora_rank, m.qk_pos_emb_head_dim)
    assert args.rotary_base == m.rotary_base


def test_megatron_lm_refuses_more_expert_ranks_than_experts(monkeypatch):
    from memx_hpc.spec.catalog import preset
    from memx_hpc.megatron_args import flat, model_extension_args, parallel_args

    m = preset("Mixtral-8x7B")
    argv = (_dense_args(m) + flat(model_extension_args(m)) + flat(parallel_args(m, tp=1, ep=16))
            + ["--micro-batch-size", "1", "--global-batch-size", "64", "--train-iters", "1", "--lr", "1e-4",
               "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(m.vocab_size), "--bf16"])
    with pytest.raises(AssertionError):
        judge(argv, 16, monkeypatch, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})


@pytest.mark.parametrize("preset", ["Llama-3.1-8B", "Mixtral-8x7B", "DeepSeek-V2-Lite", "Qwen3-30B-A3B"])
def test_megatron_lm_builds_the_model_named(preset: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ModelSpec field Megatron-LM needs reaches its command line: RoPE base and scaling,
    head width, QK norm, multi-latent attention, experts (single-vendor plans, Megatron-LM's
    entry); the project's entry refuses what it does not build, by name."""
    from memx_hpc.spec.catalog import preset as get_preset
    from memx_hpc.errors import SpecError
    from memx_hpc.spec import Plan, Stage, job_for_model

    model = get_preset(preset)
    site = load_site(ROOT / "site_configs" / "example-cross-vendor.yaml")
    job = job_for_model(model, 64, precision="bf16", train_iters=100)
    n = model.num_layers
    plan = Plan(tp=2, dp=1, micro_batch_size=1, global_batch_size=64,
                stages=(Stage(partition="gpu_a100", num_layers=n - n // 2), Stage(partition="gpu_v100", num_layers=n // 2)))
    req = describe(plan, site, job)
    text = render(plan, site, job)
    args = judge(_argv_of(text, 0), req.world_size, monkeypatch, _judged_env(text, 0))
    assert args.rotary_base == model.rotary_base
    if model.rope_scaling == "llama3":
        assert args.use_rope_scaling and args.rope_scaling_factor == model.rope_scaling_factor
    if model.num_experts is not None:
        assert (args.num_experts, args.moe_router_topk) == (model.num_experts, model.moe_router_topk)
    if model.multi_latent_attention:
        assert args.multi_latent_attention and args.kv_lora_rank == model.kv_lora_rank
    if model.qk_layernorm:
        assert args.qk_layernorm
    if model.head_dim is not None and model.head_dim != model.hidden_size // model.num_attention_heads:
        assert args.kv_channels == model.head_dim
    cross = Plan(tp=2, dp=1, micro_batch_size=1, global_batch_size=64,
                 stages=(Stage(partition="gpu_a100", num_layers=n - n // 2), Stage(partition="gpu_mi250x", num_layers=n // 2)))
    # the project's entry (cross-vendor plans) builds layers all dense or all MoE, standard or
    # multi-latent attention
    if len(set(model.moe_layers)) > 1:
        with pytest.raises(SpecError) as e:
            describe(cross, site, job)
        assert e.value.field == "model.moe_layer_freq"
    else:
        describe(cross, site, job)


def _cross_vendor_mla(**changes):
    """DeepSeek-V2-Lite with every layer MoE (multi-latent attention, YaRN, shared experts), on a
    plan whose two stages span NVIDIA and AMD partitions."""
    from memx_hpc.spec import Plan, Stage, job_for_model
    from memx_hpc.spec.catalog import preset

    model = dataclasses.replace(preset("DeepSeek-V2-Lite"), moe_layer_freq=1, **changes)
    site = load_site(ROOT / "site_configs" / "example-cross-vendor.yaml")
    job = job_for_model(model, 64, precision="bf16", train_iters=100)
    n = model.num_layers
    plan = Plan(tp=2, dp=1, micro_batch_size=1, global_batch_size=64,
                stages=(Stage(partition="gpu_a100", num_layers=n - n // 2),
                        Stage(partition="gpu_mi250x", num_layers=n // 2)))
    return model, site, job, plan


_MLA_NAMES = ("multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
              "v_head_dim", "rope_type", "rotary_scaling_factor", "mscale", "mscale_all_dim", "qk_layernorm",
              "num_experts", "moe_router_topk", "moe_shared_expert_intermediate_size", "normalization")


def test_megatron_lm_and_the_project_entry_read_a_cross_vendor_mla_model_alike(monkeypatch):
    """A cross-vendor plan of a multi-latent-attention model renders; every component's command
    line is read by Megatron-LM's parse_args + validate_args and by the project's entry
    (memx_hpc.train.args) to the same MLA, YaRN and expert settings."""
    from memx_hpc.train.args import parse_args as entry_parse_args

    model, site, job, plan = _cross_vendor_mla()
    text = render(plan, site, job)
    req = describe(plan, site, job)
    for component in (0, 1):
        argv = _argv_of(text, component)
        assert "-m memx_hpc.train.pretrain_gpt" in text and "--multi-latent-attention" in argv
        theirs = judge(argv, req.world_size, monkeypatch, _judged_env(text, component))
        ours = entry_parse_args(argv)
        assert {k: getattr(ours, k) for k in _MLA_NAMES} == {k: getattr(theirs, k) for k in _MLA_NAMES}
    assert (ours.rope_type, ours.rotary_scaling_factor) == ("yarn", model.rope_scaling_factor)
    assert (ours.kv_lora_rank, ours.qk_pos_emb_head_dim) == (model.kv_lora_rank, model.qk_pos_emb_head_dim)


@pytest.mark.parametrize("changes,field", [
    (dict(moe_router_num_groups=8, moe_router_group_topk=2), "model.moe_router_num_groups"),
    (dict(moe_router_enable_expert_bias=True), "model.moe_router_enable_expert_bias"),
    (dict(moe_shared_expert_gate=True), "model.moe_shared_expert_gate"),
])
def test_the_project_entry_refuses_router_options_it_does_not_build_by_name(changes, field):
    from memx_hpc.errors import SpecError

    _, site, job, plan = _cross_vendor_mla(**changes)
    with pytest.raises(SpecError) as e:
        describe(plan, site, job)
    assert e.value.field == field and "does not build it" in str(e.value)


def test_the_project_entry_refuses_experts_with_linear_biases_by_name():
    """megatron-core 0.16.1's local experts add the expert bias in place to the TP reduce's
    output, which autograd refuses: a cross-vendor MoE plan with biases is refused naming
    model.add_bias_linear before the queue, not in the first forward on the cluster."""
    from memx_hpc.errors import SpecError

    _, site, job, plan = _cross_vendor_mla(add_bias_linear=True, moe_shared_expert_intermediate_size=None)
    with pytest.raises(SpecError) as e:
        describe(plan, site, job)
    assert e.value.field == "model.add_bias_linear" and "in place" in str(e.value)


def test_megatron_lm_reads_a_checkpoint_of_the_project_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stock Megatron-LM's loader (checkpointing._load_base_checkpoint, check_checkpoint_args)
    finds, types and accepts what the project's entry saved: tracker file, iter_XXXXXXX folder,
    a global torch_dist checkpoint with its args, iteration and checkpoint version."""
    import subprocess

    ck = tmp_path / "ck"
    argv = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--max-position-embeddings", "32", "--vocab-size", "128", "--micro-batch-size", "2",
            "--global-batch-size", "2", "--mock-data", "--tokenizer-type", "NullTokenizer", "--lr", "1e-4",
            "--ckpt-format", "torch_dist"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "memx_hpc.train.pretrain_gpt", *argv, "--train-iters", "1",
                        "--save", str(ck)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    args = judge(argv + ["--train-iters", "2", "--load", str(ck)], 1, monkeypatch,
                 {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    checkpointing = importlib.import_module("megatron.training.checkpointing")
    gv = sys.modules["megatron.training.global_vars"]
    monkeypatch.setattr(gv, "_GLOBAL_ARGS", args)
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        state, name, release, kind = checkpointing._load_base_checkpoint(str(ck), args, rank0=True)
    assert (Path(name), release, kind.name) == (ck / "iter_0000001", False, "GLOBAL")
    assert state["iteration"] == 1 and state["checkpoint_version"] == 3.0
    assert {"args", "optimizer", "opt_param_scheduler"} <= set(state)
    checkpointing.set_checkpoint_version(state["checkpoint_version"])
    checkpointing.check_checkpoint_args(state["args"])  # the model Megatron-LM would build is the one saved


@pytest.mark.parametrize("job_name,par", [
    ("gpt3-2.7b", dict(tp=2, dp=1, cp=2, virtual_stages=2, sequence_parallel=True)),
    ("Mixtral-8x7B", dict(tp=2, dp=2, ep=4, etp=1, sequence_parallel=True)),
])
def test_megatron_lm_accepts_rendered_virtual_context_and_expert_parallel(job_name, par, monkeypatch):
    """The renderer's own command line for plans with virtual stages (in the layout), context
    and expert parallel: Megatron-LM reads back the degrees the plan has."""
    from memx_hpc.spec.catalog import preset
    from memx_hpc.spec import Plan, Stage, job_for_model

    site = load_site(ROOT / "site_configs" / "example-cross-vendor.yaml")
    job = (load_job(ROOT / "jobs" / f"{job_name}.yaml") if job_name.startswith("gpt3")
           else job_for_model(preset(job_name), 64, train_iters=10))
    stages = (Stage(partition="gpu_a100", num_layers=16),) * 2 if par.get("virtual_stages") else \
        (Stage(partition="gpu_a100", num_layers=32),)
    plan = Plan(micro_batch_size=1, global_batch_size=64, stages=stages, **par)
    text = render(plan, site, job)
    req = describe(plan, site, job)
    args = judge(_argv_of(text, 0), req.world_size, monkeypatch, _judged_env(text, 0))
    assert args.context_parallel_size == plan.cp and args.expert_model_parallel_size == plan.ep
    assert (args.virtual_pipeline_model_parallel_size or 1) == plan.virtual_stages
    assert args.data_parallel_size == plan.dp  # world / (tp x cp x pp): CP ranks are not data-parallel
    assert args.world_size == plan.world_size


@pytest.mark.parametrize("fmt,recipe", [("hybrid", "delayed"), ("e4m3", "tensorwise"), ("hybrid", "mxfp8")])
def test_megatron_lm_accepts_the_rendered_fp8_arguments(fmt, recipe, monkeypatch):
    """A job with FP8 on H100s (the cross-vendor example's A100 partition holding H100s): the
    rendered component carries --fp8-format / --fp8-recipe beside --bf16 and Transformer
    Engine's layer, and Megatron-LM reads them back."""
    from memx_hpc.spec import Plan, Stage, job_from_mapping

    site = load_site(ROOT / "site_configs" / "example-cross-vendor.yaml")
    site = dataclasses.replace(site, partitions=tuple(dataclasses.replace(p, gpu_type="H100-SXM")
                                                      if p.name == "gpu_a100" else p for p in site.partitions))
    job = job_from_mapping({"model": "GPT-3-2.7B", "global_batch_size": 64, "train_iters": 10, "fp8": fmt,
                            "fp8_recipe": recipe})
    plan = Plan(tp=2, dp=2, micro_batch_size=1, global_batch_size=64, sequence_parallel=True,
                stages=(Stage(partition="gpu_a100", num_layers=16), Stage(partition="gpu_a100", num_layers=16)))
    text = render(plan, site, job)
    args = judge(_argv_of(text, 0), describe(plan, site, job).world_size, monkeypatch, _judged_env(text, 0))
    assert (args.fp8, args.fp8_recipe, args.transformer_impl) == (fmt, recipe, "transformer_engine")
    assert args.bf16 and args.params_dtype.__repr__() == "torch.bfloat16"  # the weights stay bf16


def test_megatron_lm_reads_back_bf16_gradient_reduction_and_fp8_parameters(monkeypatch):
    """grad_reduce_in_fp32: false renders --grad-reduce-in-bf16 and fp8_param_gather: true
    --fp8-param-gather; Megatron-LM's parser turns them into a bf16 gradient buffer
    (accumulate_allreduce_grads_in_fp32 False) and FP8 parameters."""
    from memx_hpc.spec import Plan, Stage, job_from_mapping

    site = load_site(ROOT / "site_configs" / "example-cross-vendor.yaml")
    site = dataclasses.replace(site, partitions=tuple(dataclasses.replace(p, gpu_type="H100-SXM")
                                                      if p.name == "gpu_a100" else p for p in site.partitions))
    plan = Plan(tp=2, dp=2, micro_batch_size=1, global_batch_size=64, sequence_parallel=True,
                stages=(Stage(partition="gpu_a100", num_layers=16), Stage(partition="gpu_a100", num_layers=16)))
    for extra, fp32_grads, fp8_params in (({}, True, False),
                                          ({"grad_reduce_in_fp32": False, "fp8_param_gather": True}, False, True)):
        job = job_from_mapping({"model": "GPT-3-2.7B", "global_batch_size": 64, "train_iters": 10, "fp8": "hybrid",
                                "fp8_recipe": "tensorwise", **extra})
        text = render(plan, site, job)
        args = judge(_argv_of(text, 0), describe(plan, site, job).world_size, monkeypatch, _judged_env(text, 0))
        assert args.accumulate_allreduce_grads_in_fp32 is fp32_grads
        assert args.fp8_param_gather is fp8_params


def test_megatron_lm_accepts_stages_that_hold_only_the_embedding_or_the_output_layer(monkeypatch):
    from memx_hpc.spec import Plan, Stage

    site = load_site(ROOT / "site_configs" / "example-cross-vendor.yaml")
    job = load_job(ROOT / "jobs" / "gpt3-2.7b.yaml")
    for stages, layout in (((Stage(partition="gpu_a100", num_layers=0), Stage(partition="gpu_a100", num_layers=32)),
                            "E|t*32L"),
                           ((Stage(partition="gpu_a100", num_layers=32), Stage(partition="gpu_a100", num_layers=0)),
                            "Et*32|L")):
        plan = Plan(tp=2, dp=1, micro_batch_size=1, global_batch_size=64, stages=stages)
        text = render(plan, site, job)
        args = judge(_argv_of(text, 0), describe(plan, site, job).world_size, monkeypatch, _judged_env(text, 0))
        assert args.pipeline_model_parallel_size == 2 and str(args.pipeline_model_parallel_layout) == layout
    # interleaved, the first chunk the embedding alone and the last the loss alone (Megatron's
    # --account-for-embedding/loss-in-pipeline-split shape)
    plan = Plan(tp=1, dp=1, micro_batch_size=1, global_batch_size=64, virtual_stages=2,
                stages=tuple(Stage(partition="gpu_a100", num_layers=n) for n in (1, 15, 15, 1)))
    text = render(plan, site, job)
    args = judge(_argv_of(text, 0), describe(plan, site, job).world_size, monkeypatch, _judged_env(text, 0))
    assert str(args.pipeline_model_parallel_layout) == "E|t*7|t*7|t|t|t*8|t*8|L"
    assert args.virtual_pipeline_model_parallel_size == 2


@pytest.fixture(scope="module")
def new_dimension_plans(tmp_path_factory):
    """The top plans the planner library finds (real search, no profiling: the shipped reference
    profiles and datasheet figures) on the 64-GPU example site for a long-context dense job, a
    70B-class dense job and an MoE job."""
    from memx_hpc.planner import PlanRequest, plan

    tmp = tmp_path_factory.mktemp("dimensions")
    site = ROOT / "site_configs" / "example-h100-64.yaml"
    out = {}
    for name in ("llama3-8b-32k", "llama3-70b", "mixtral-8x7b", "deepseek-v2-lite"):
        r = plan(PlanRequest(site=site, job=ROOT / "jobs" / f"{name}.yaml", store=tmp / f"{name}.h5", top_k=5,
                             write=False, progress=False))
        out[name] = (load_site(site), load_job(ROOT / "jobs" / f"{name}.yaml"), [c.plan for c in r.ranked])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name,dimension", [("llama3-8b-32k", "cp"), ("llama3-70b", "virtual_stages"),
                                            ("mixtral-8x7b", "ep"), ("deepseek-v2-lite", "ep")])
def test_megatron_lm_accepts_the_top_plans_of_the_new_dimensions(name, dimension, new_dimension_plans, monkeypatch):
    """Issue 16's first "done when": Megatron-LM's own parse_args + validate_args accept every
    rendered component of the top plans of a dense 32k-token job (CP > 1 among them), a
    70B-class dense job on 64 GPUs (virtual stages among them) and an MoE job (EP > 1 among
    them), and read back the degrees each plan has."""
    site, job, plans = new_dimension_plans[name]
    assert len(plans) >= 3
    assert any(getattr(p, dimension) > 1 for p in plans), [(p.tp, p.pp, p.dp, p.virtual_stages, p.cp, p.ep)
                                                          for p in plans]
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    for plan in plans:
        assert plan.world_size <= site.total_gpus == 64
        text = render(plan, site, job)
        req = describe(plan, site, job)
        for c in range(len(req.components)):
            args = judge(_argv_of(text, c), req.world_size, monkeypatch, _judged_env(text, c))
            assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.data_parallel_size,
                    args.context_parallel_size) == (plan.tp, plan.pp, plan.dp, plan.cp)
            assert (args.virtual_pipeline_model_parallel_size or 1) == plan.virtual_stages
            assert args.expert_model_parallel_size == plan.ep
            if job.model.is_moe:
                assert args.expert_tensor_parallel_size == plan.expert_tp
                assert args.num_experts == job.model.num_experts
            assert args.seq_length == job.model.seq_length and args.sequence_parallel == plan.sequence_parallel
            if plan.pp > 1:  # what megatron-core checks of the layout when it builds the model
                layout = PipelineParallelLayerLayout(args.pipeline_model_parallel_layout, plan.pp)
                layout.validate_layer_layout(job.model.num_layers, None)
                assert layout.virtual_pipeline_model_parallel_size == plan.virtual_stages


def test_megatron_lm_accepts_the_logging_and_continuation_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """TensorBoard, throughput/memory/timer logging, Weights & Biases and the exit arguments of a
    run that continues itself, as Megatron-LM reads them (LoggerConfig, TrainingConfig)."""
    from memx_hpc.spec import job_from_mapping

    doc = {"name": "tb-run", "model": "tiny-gpt", "global_batch_size": 8, "train_iters": 50, "log_interval": 5,
           "checkpoint": {"save": "/ck/run", "interval": 10},
           "logging": {"wandb_project": "memx", "wandb_exp_name": "tiny.1"}}
    plan = load_plan(GOLDEN / "plans" / "local-pp2-a100-mi250.json")
    site = load_site(ROOT / "site_configs" / "local.yaml")
    req = describe(plan, site, job_from_mapping(doc), log_dir="/runs")
    assert req.run_dir == "/runs/tb-run" and req.continuation is not None
    text = render(plan, site, job_from_mapping(doc), log_dir="/runs")
    for c in range(len(req.components)):
        args = judge(_argv_of(text, c), req.world_size, monkeypatch, _judged_env(text, c))
        assert (args.tensorboard_dir, args.tensorboard_log_interval) == ("/runs/tb-run/tensorboard", 5)
        assert args.log_throughput and args.log_memory_to_tensorboard and args.log_timers_to_tensorboard
        assert (args.wandb_project, args.wandb_exp_name, args.wandb_save_dir) == ("memx", "tiny.1", "/runs/tb-run/wandb")
        assert args.exit_signal_handler and args.save == "/ck/run"
        # what a later segment appends: the save folder as --load (the last flag wins)
        again = judge(_argv_of(text, c) + ["--load", "/ck/run"], req.world_size, monkeypatch, _judged_env(text, c))
        assert again.load == "/ck/run"


# ---------------------------------------------------------------- Megatron's overlap options


def test_megatron_lm_accepts_the_rendered_overlap_options_and_refuses_what_render_refuses(monkeypatch):
    """A single-vendor GPU plan with both options renders arguments Megatron-LM accepts and
    reads back; the one combination render refuses (the parameter gather without the
    distributed optimizer) Megatron-LM refuses too."""
    from memx_hpc.spec import Plan, Stage

    site, job = load_site(ROOT / "site_configs" / "example-cross-vendor.yaml"), load_job(ROOT / "jobs" /
                                                                                        "gpt3-2.7b.yaml")
    plan = Plan(tp=2, dp=2, micro_batch_size=1, global_batch_size=64, overlap_grad_reduce=True,
                overlap_param_gather=True,
                stages=(Stage(partition="gpu_a100", num_layers=20), Stage(partition="gpu_v100", num_layers=12)))
    text = render(plan, site, job)
    req = describe(plan, site, job)
    for c in range(len(req.components)):
        argv = _argv_of(text, c)
        assert "--overlap-grad-reduce" in argv and "--overlap-param-gather" in argv
        args = judge(argv, req.world_size, monkeypatch, _judged_env(text, c))
        assert args.overlap_grad_reduce and args.overlap_param_gather and args.use_distributed_optimizer
        assert not args.align_param_gather  # Megatron forces it off without virtual stages
        bare = [a for a in argv if a != "--use-distributed-optimizer"]
        with pytest.raises(AssertionError, match="distributed optimizer"):
            judge(bare, req.world_size, monkeypatch, _judged_env(text, c))
        with pytest.raises(AssertionError, match="overlap-grad-reduce"):
            judge([a for a in argv if a != "--overlap-grad-reduce"], req.world_size, monkeypatch,
                  _judged_env(text, c))


def test_megatron_lm_reads_the_plans_bucket_size_and_the_plan_file_keeps_it(monkeypatch, tmp_path):
    """A plan's ddp_bucket_size renders as --ddp-bucket-size, which Megatron-LM's parser reads
    back as that many parameters; the plan file writes and reads it; a plan without it renders
    none (megatron-core's default)."""
    from memx_hpc.planfile import load_plan, save_plan
    from memx_hpc.spec import Plan, Stage

    site, job = load_site(ROOT / "site_configs" / "example-cross-vendor.yaml"), load_job(ROOT / "jobs" /
                                                                                        "gpt3-2.7b.yaml")
    plan = Plan(tp=2, dp=2, micro_batch_size=1, global_batch_size=64, overlap_grad_reduce=True,
                overlap_param_gather=True, ddp_bucket_size=12_500_000,
                stages=(Stage(partition="gpu_a100", num_layers=20), Stage(partition="gpu_v100", num_layers=12)))
    text = render(plan, site, job)
    req = describe(plan, site, job)
    argv = _argv_of(text, 0)
    assert argv[argv.index("--ddp-bucket-size") + 1] == "12500000"
    args = judge(argv, req.world_size, monkeypatch, _judged_env(text, 0))
    assert args.ddp_bucket_size == 12_500_000 and args.overlap_grad_reduce
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    assert load_plan(path) == plan
    bare = dataclasses.replace(plan, ddp_bucket_size=None)
    assert "--ddp-bucket-size" not in render(bare, site, job)
    save_plan(bare, path)
    assert "ddp_bucket_size" not in path.read_text() and load_plan(path) == bare


@pytest.mark.slow
def test_the_recommended_70b_plan_on_64_h100_renders_both_overlap_options(new_dimension_plans, monkeypatch):
    """jobs/llama3-70b.yaml on site_configs/example-h100-64.yaml: the recommended plan (and every
    top plan: one partition of H100s launching Megatron-LM's pretrain_gpt.py) carries
    --overlap-grad-reduce and --overlap-param-gather, and Megatron-LM accepts them."""
    site, job, plans = new_dimension_plans["llama3-70b"]
    assert job.distributed_optimizer
    for k, plan in enumerate(plans):
        assert plan.overlap_grad_reduce and plan.overlap_param_gather, k
        text = render(plan, site, job)
        req = describe(plan, site, job)
        for c in range(len(req.components)):
            argv = _argv_of(text, c)
            assert "--overlap-grad-reduce" in argv and "--overlap-param-gather" in argv
            args = judge(argv, req.world_size, monkeypatch, _judged_env(text, c))
            assert args.overlap_grad_reduce and args.overlap_param_gather
            assert args.align_param_gather == (plan.virtual_stages > 1)


# --------------------------------------------------------------------------- interleaving group size


def test_megatron_lm_accepts_the_rendered_microbatch_group_size_per_virtual_stage(monkeypatch):
    """A plan with ``microbatch_group_size_per_vp_stage`` renders
    --microbatch-group-size-per-virtual-pipeline-stage, and Megatron-LM's parse_args +
    validate_args read the group back (megatron-core's ModelParallelConfig field)."""
    from memx_hpc.spec import Plan, Stage

    site = load_site(ROOT / "site_configs" / "example-cross-vendor.yaml")
    job = load_job(ROOT / "jobs" / "gpt3-2.7b.yaml")
    # 64 / (1 x 2) = 32 micro-batches in groups of 4 over 2 stages x 2 chunks
    plan = Plan(tp=2, dp=2, micro_batch_size=1, global_batch_size=64, sequence_parallel=True, virtual_stages=2,
                microbatch_group_size_per_vp_stage=4, stages=(Stage(partition="gpu_a100", num_layers=16),) * 2)
    text = render(plan, site, job)
    assert "--microbatch-group-size-per-virtual-pipeline-stage 4" in text
    args = judge(_argv_of(text, 0), describe(plan, site, job).world_size, monkeypatch, _judged_env(text, 0))
    assert args.microbatch_group_size_per_vp_stage == 4
    assert (args.virtual_pipeline_model_parallel_size or 1) == 2
    # without the field nothing is rendered and megatron-core's default (pp) holds
    plain = render(dataclasses.replace(plan, microbatch_group_size_per_vp_stage=None), site, job)
    assert "--microbatch-group-size-per-virtual-pipeline-stage" not in plain


XVENDOR_JOBS = {  # job file (under jobs/), the narrowing appended, the Plan field it sets, the degree
    "llama3-70b": ("llama3-70b.yaml", "virtual_stages: [2]\n", "virtual_stages", 2),
    "llama3-8b-128k": ("llama3-8b-32k.yaml", "context_parallel_sizes: [2]\n", "cp", 2),
    "mixtral-8x7b": ("mixtral-8x7b.yaml", "expert_parallel_sizes: [8]\n", "ep", 8),
}


@pytest.fixture(scope="module")
def cross_vendor_plans(tmp_path_factory):
    """The top ten plans the planner library finds on one H100 node and one MI300X node
    (site_configs/example-h100-mi300x.yaml; shipped reference profiles and datasheet figures)
    for a 70B job narrowed to 2 virtual stages, a 128k-token 8B job narrowed to CP 2 and
    Mixtral narrowed to EP 8."""
    from memx_hpc.planner import PlanRequest, plan

    tmp = tmp_path_factory.mktemp("xvendor")
    site = ROOT / "site_configs" / "example-h100-mi300x.yaml"
    out = {}
    for name, (base, extra, _, _) in XVENDOR_JOBS.items():
        text = (ROOT / "jobs" / base).read_text() + extra
        if name == "llama3-8b-128k":
            text = text.replace("seq_length: 32768", "seq_length: 131072").replace("global_batch_size: 64",
                                                                                  "global_batch_size: 16")
        job_file = tmp / f"{name}.yaml"
        job_file.write_text(text)
        r = plan(PlanRequest(site=site, job=job_file, store=tmp / f"{name}.h5", top_k=10, write=False,
                             progress=False))
        out[name] = (load_site(site), load_job(job_file), [c.plan for c in r.ranked])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", list(XVENDOR_JOBS))
def test_cross_vendor_top_plans_keep_the_jobs_degree_and_megatron_lm_accepts_them(name, cross_vendor_plans,
                                                                                    monkeypatch):
    """Cross-vendor plans speak Megatron's vocabulary: on one H100 and one MI300X node, every one
    of the top ten plans has the degree the job names (virtual stages 2, CP 2, EP 8), at least one
    spans both vendors, and every rendered component is accepted by Megatron-LM's parse_args +
    validate_args and by the project's entry (which cross-vendor plans run)."""
    from memx_hpc.train.args import parse_args as entry_parse_args

    site, job, plans = cross_vendor_plans[name]
    _, _, field, degree = XVENDOR_JOBS[name]
    assert len(plans) == 10
    assert all(getattr(p, field) == degree for p in plans), [(p.pp, p.virtual_stages, p.cp, p.ep) for p in plans]
    vendor = {p.name: site.gpu(p.gpu_type).vendor for p in site.partitions}
    spanning = [p for p in plans if len({vendor[s.partition] for s in p.stages}) > 1]
    assert spanning
    for plan in plans:
        text = render(plan, site, job)
        req = describe(plan, site, job)
        for c in range(len(req.components)):
            argv = _argv_of(text, c)
            args = judge(argv, req.world_size, monkeypatch, _judged_env(text, c))
            assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size,
                    args.expert_model_parallel_size) == (plan.tp, plan.pp, plan.cp, plan.ep)
            assert (args.virtual_pipeline_model_parallel_size or 1) == plan.virtual_stages
            if plan in spanning:
                assert "-m memx_hpc.train.pretrain_gpt" in text
                mine = entry_parse_args(argv)
                assert (mine.context_parallel_size, mine.expert_model_parallel_size) == (plan.cp, plan.ep)


# --------------------------------------------------------------------------- FP8 searched


def test_megatron_lm_accepts_the_plans_of_a_search_that_chose_fp8(tmp_path: Path, monkeypatch) -> None:
    """A job with ``fp8: [none, hybrid]`` on 64 H100s: the plans of both precisions render
    their own arguments (the FP8 ones --fp8-format / --fp8-recipe and the job's
    --fp8-param-gather, the 16-bit ones neither), and Megatron-LM reads each back as planned."""
    from memx_hpc.planner import PlanRequest, plan as search_plans
    from memx_hpc.search.space import SpaceOptions
    from memx_hpc.spec import job_from_mapping

    site = load_site(ROOT / "site_configs" / "example-h100-64.yaml")
    job = job_from_mapping({"model": "GPT-3-6.7B", "global_batch_size": 64, "train_iters": 10,
                            "fp8": ["none", "hybrid"], "fp8_recipe": "tensorwise", "fp8_param_gather": True})
    result = search_plans(PlanRequest(site=site, job=job, store=tmp_path / "store.h5", write=False, top_k=30,
                                      space=SpaceOptions(max_pipeline_stages=2), progress=False, mpi="off"))
    ranked = result.search.time_top + result.search.recommended_top + result.search.top
    picked = {p.plan.fp8: p.plan for p in reversed(ranked)}
    assert set(picked) == {"", "hybrid"}
    for fp8, plan in picked.items():
        text = render(plan, site, job)
        req = describe(plan, site, job)
        args = judge(_argv_of(text, 0), req.world_size, monkeypatch, _judged_env(text, 0))
        assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (plan.tp, plan.pp)
        if fp8:
            assert (args.fp8, args.fp8_recipe, args.transformer_impl) == ("hybrid", "tensorwise", "transformer_engine")
            assert args.fp8_param_gather is bool(args.use_distributed_optimizer)
        else:
            assert args.fp8 is None and not args.fp8_param_gather and "--fp8" not in text
        assert args.bf16
