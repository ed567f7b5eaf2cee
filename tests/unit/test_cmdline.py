"""The one rule for a component's Megatron-LM command line (memx_hpc/slurm/cmdline.py): a
training run is the job file's (length, schedule, intervals, data, checkpoints), a job
without data renders a synthetic-data run that says so first, verify's runs stay short."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from memx_hpc.cli.main import main
from memx_hpc.errors import SpecError
from memx_hpc.slurm.render import describe, render
from memx_hpc.spec import Plan, Stage, job_from_mapping, load_site

ROOT = Path(__file__).resolve().parents[2]
CROSS = ROOT / "site_configs" / "example-cross-vendor.yaml"
DATA = {"paths": ["/data/web_text_document"],
        "tokenizer": {"type": "HuggingFaceTokenizer", "model": "/data/tokenizer"}, "split": "98,2,0"}
PLAN = Plan(tp=2, dp=2, micro_batch_size=1, global_batch_size=64,
            stages=(Stage(partition="gpu_a100", num_layers=20), Stage(partition="gpu_v100", num_layers=12)))
CROSS_PLAN = Plan(tp=2, dp=2, micro_batch_size=1, global_batch_size=64,
                  stages=(Stage(partition="gpu_a100", num_layers=20), Stage(partition="gpu_mi250x", num_layers=12)))


def _job(**kw):
    doc = yaml.safe_load((ROOT / "jobs" / "gpt3-2.7b.yaml").read_text())
    doc.update(kw)
    return job_from_mapping(doc)


def _argv(req) -> list[str]:
    return req.megatron_argv[0]


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_a_job_with_data_and_a_warmup_never_renders_twenty_iterations() -> None:
    site = load_site(CROSS)
    job = _job(data=DATA, lr_schedule={"warmup_iters": 2000})
    with pytest.raises(SpecError) as e:  # no length: refused, never a silent default
        describe(PLAN, site, job)
    assert e.value.field == "train_iters" and "train_samples" in str(e.value)
    job = _job(data=DATA, lr_schedule={"warmup_iters": 2000, "decay_style": "cosine"}, train_iters=50000,
               log_interval=20, eval_interval=500, eval_iters=5, checkpoint={"save": "/ck", "load": "/ck",
                                                                             "interval": 1000})
    for plan in (PLAN, CROSS_PLAN):  # one rule for single- and cross-vendor plans
        req = describe(plan, site, job)
        argv = _argv(req)
        assert req.run_kind == "train" and "--mock-data" not in argv
        assert (_flag(argv, "--train-iters"), _flag(argv, "--lr-warmup-iters")) == ("50000", "2000")
        assert (_flag(argv, "--log-interval"), _flag(argv, "--eval-interval"), _flag(argv, "--eval-iters")) == \
            ("20", "500", "5")
        assert (_flag(argv, "--ckpt-format"), _flag(argv, "--save"), _flag(argv, "--load")) == \
            ("torch_dist", "/ck", "/ck")
        # stop (and save) before the site's time limit, and on SIGTERM
        assert 0 < int(_flag(argv, "--exit-duration-in-mins")) < site.time_limit_min
        assert "--exit-signal-handler" in argv
        assert (_flag(argv, "--tokenizer-type"), _flag(argv, "--tokenizer-model")) == \
            ("HuggingFaceTokenizer", "/data/tokenizer")
    text = render(PLAN, site, job)
    assert text.splitlines()[1].startswith("# TRAINING RUN: 50000 iterations")
    with pytest.raises(SpecError) as e:  # a warm-up as long as the run
        describe(PLAN, site, _job(data=DATA, lr_schedule={"warmup_iters": 2000}, train_iters=2000))
    assert e.value.field == "lr_schedule.warmup_iters"


def test_samples_and_tokens_give_sample_based_schedules() -> None:
    site = load_site(CROSS)
    job = _job(data=DATA, train_tokens=2048 * 64 * 1000 + 1, lr_schedule={"warmup_iters": 10, "decay_iters": 900})
    argv = _argv(describe(PLAN, site, job))
    assert "--train-iters" not in argv and "--lr-warmup-iters" not in argv
    seq = job.model.seq_length
    assert int(_flag(argv, "--train-samples")) == -(-(2048 * 64 * 1000 + 1) // seq)
    assert (_flag(argv, "--lr-warmup-samples"), _flag(argv, "--lr-decay-samples")) == ("640", "57600")
    with pytest.raises(SpecError) as e:
        _job(train_iters=5, train_samples=10)
    assert e.value.field == "train_samples"


def test_without_data_the_script_says_first_it_is_synthetic() -> None:
    site = load_site(CROSS)
    job = _job(train_iters=300)
    req = describe(PLAN, site, job)
    assert req.run_kind == "synthetic" and "--mock-data" in _argv(req)
    text = render(PLAN, site, job)
    lines = text.splitlines()
    assert lines[1].startswith("# SYNTHETIC-DATA RUN") and "300 iterations" in lines[1]
    assert "echo \"memx-hpc: \"'SYNTHETIC-DATA RUN" in text  # and in the job's log
    for c in range(len(req.components)):  # first line of every component
        body = text.split(f"memx_component_{c}() {{\n", 1)[1]
        assert body.startswith("  # SYNTHETIC-DATA RUN")
    # no length at all: the default is said, not hidden
    assert "20 iterations (the job names no length)" in describe(PLAN, site, _job()).banner


def test_verify_runs_stay_short_mock_runs_and_say_so() -> None:
    site = load_site(CROSS)
    job = _job(data=DATA, train_iters=50000, lr_schedule={"warmup_iters": 2000},
               checkpoint={"save": "/ck", "interval": 100})
    req = describe(PLAN, site, job, iters=4, mock_data=True)
    argv = _argv(req)
    assert req.run_kind == "measure" and req.banner.startswith("MEASUREMENT RUN")
    assert "--mock-data" in argv and "--data-path" not in argv and "--save" not in argv
    assert _flag(argv, "--train-iters") == "4" and "--lr-warmup-iters" not in argv
    assert _flag(argv, "--log-interval") == "1" and _flag(argv, "--eval-iters") == "0"


def test_llama3_renders_its_rotary_base() -> None:
    site = load_site(CROSS)
    doc = {"name": "l3", "model": "Llama-3-8B", "global_batch_size": 64, "train_iters": 10}
    job = job_from_mapping(doc)
    plan = Plan(tp=2, dp=2, micro_batch_size=1, global_batch_size=64,
                stages=(Stage(partition="gpu_a100", num_layers=16), Stage(partition="gpu_v100", num_layers=16)))
    argv = _argv(describe(plan, site, job))
    assert _flag(argv, "--rotary-base") == "500000"
    argv = _argv(describe(plan, site, job_from_mapping({**doc, "model": "Llama-2-7B"})))
    assert _flag(argv, "--rotary-base") == "10000"


def test_cross_vendor_plans_refuse_only_tokenizers_the_entry_cannot_build() -> None:
    site = load_site(CROSS)
    job = _job(data={**DATA, "tokenizer": {"type": "TikTokenizer", "model": "/t.json"}}, train_iters=10)
    describe(PLAN, site, job)  # Megatron-LM's own entry builds it
    with pytest.raises(SpecError) as e:
        describe(CROSS_PLAN, site, job)
    assert e.value.field == "data.tokenizer.type" and "TikTokenizer" in str(e.value)


def test_render_creates_the_log_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    plan_file = ROOT / "tests" / "golden" / "plans" / "local-pp3.json"
    logs = tmp_path / "not" / "yet" / "there"
    rc = main(["render", "--site", str(ROOT / "site_configs" / "local.yaml"), "--job", str(ROOT / "jobs" / "tiny-gpt.yaml"),
               "--plan", str(plan_file), "--out", str(tmp_path / "s.sbatch"), "--log-dir", str(logs),
               "--no-test-only", "--json"])
    assert rc == 0, capsys.readouterr().err
    assert logs.is_dir()
    assert json.loads(capsys.readouterr().out)["script"] == str(tmp_path / "s.sbatch")


def test_plan_leaves_out_cross_vendor_plans_render_would_refuse(tmp_path: Path) -> None:
    """A job whose tokenizer the project's entry cannot build: no recommended plan mixes
    vendors (render would refuse it), and the notes say what was left out and why."""
    from memx_hpc.placement import comm_vendor
    from memx_hpc.planner import PlanRequest, launchable_space, plan
    from memx_hpc.search.space import SpaceOptions
    from memx_hpc.spec import load_job

    site = load_site(ROOT / "site_configs" / "local.yaml")
    base = load_job(ROOT / "jobs" / "tiny-gpt.yaml")
    kept, notes = launchable_space(site, base, SpaceOptions())  # no cross-vendor plan to leave out
    assert not kept.single_vendor and not any(n.startswith("cross-vendor plans left out") for n in notes)
    import dataclasses

    from memx_hpc.spec import TrainData

    job = dataclasses.replace(base, data=TrainData(paths=("/d/a",), tokenizer_type="TikTokenizer",
                                                   tokenizer_model="/d/t.json"))
    result = plan(PlanRequest(site=site, job=job, store=tmp_path / "store.h5", out_dir=tmp_path / "out", top_k=5,
                              space=SpaceOptions(max_pipeline_stages=2), progress=False, write=False))
    note = next(n for n in result.notes if n.startswith("cross-vendor plans left out"))
    assert "TikTokenizer" in note
    assert result.ranked
    for r in result.ranked:
        vendors = {comm_vendor(site, site.partition(s.partition)) for s in r.plan.stages}
        assert len(vendors) == 1
        describe(r.plan, site, job)  # every one renders


# ---------------------------------------------------------------- Megatron's overlap options: the plan's, as run


def test_overlap_options_are_written_from_the_plan_and_nowhere_else() -> None:
    """The plan's overlap_grad_reduce / overlap_param_gather are what the command line carries:
    on, both flags (after --use-distributed-optimizer); off, neither."""
    import dataclasses

    site, job = load_site(CROSS), _job()
    assert job.distributed_optimizer
    on = dataclasses.replace(PLAN, overlap_grad_reduce=True, overlap_param_gather=True)
    argv = _argv(describe(on, site, job))
    assert "--overlap-grad-reduce" in argv and "--overlap-param-gather" in argv
    assert argv.index("--overlap-grad-reduce") > argv.index("--use-distributed-optimizer")
    grad = _argv(describe(dataclasses.replace(on, overlap_param_gather=False), site, job))
    assert "--overlap-grad-reduce" in grad and "--overlap-param-gather" not in grad
    off = _argv(describe(PLAN, site, job))
    assert not {"--overlap-grad-reduce", "--overlap-param-gather"} & set(off)


def test_overlap_the_launch_would_not_run_is_refused_naming_the_field() -> None:
    """What is priced is what runs: a plan (a hand-edited file) with overlap where its launch
    ignores it -- cross-vendor plans and CPU devices run the project's entry, whose DDP does not
    overlap -- or where Megatron-LM refuses it (param gather without the distributed optimizer)."""
    import dataclasses

    from memx_hpc.planfile import load_plan

    site, job = load_site(CROSS), _job()
    with pytest.raises(SpecError) as e:
        describe(dataclasses.replace(CROSS_PLAN, overlap_grad_reduce=True), site, job)
    assert e.value.field == "overlap_grad_reduce" and "cross-vendor" in str(e.value)
    local = load_plan(ROOT / "tests" / "golden" / "plans" / "local-tp2-v100.json")
    assert not local.overlap_grad_reduce  # a file written before the options reads as off
    with pytest.raises(SpecError) as e:
        describe(dataclasses.replace(local, overlap_grad_reduce=True), load_site(ROOT / "site_configs" / "local.yaml"),
                 job_from_mapping(yaml.safe_load((ROOT / "jobs" / "tiny-gpt.yaml").read_text())))
    assert e.value.field == "overlap_grad_reduce" and "CPU devices" in str(e.value)
    with pytest.raises(SpecError) as e:
        describe(dataclasses.replace(PLAN, overlap_grad_reduce=True, overlap_param_gather=True), site,
                 _job(distributed_optimizer=False))
    assert e.value.field == "overlap_param_gather" and "distributed optimizer" in str(e.value)
    with pytest.raises(SpecError) as e:  # Megatron-LM's own order of the two
        dataclasses.replace(PLAN, overlap_param_gather=True)
    assert e.value.field == "overlap_param_gather" and "--overlap-grad-reduce" in str(e.value)


def test_performance_options_are_on_where_megatron_lm_runs_them() -> None:
    from memx_hpc.slurm.cmdline import PROJECT_ENTRY_MODULE, performance_options

    site, job = load_site(CROSS), _job()
    both = {"overlap_grad_reduce": True, "overlap_param_gather": True}
    assert performance_options(site, ["gpu_a100", "gpu_v100"], job, cross_vendor=False) == both
    assert performance_options(site, ["gpu_a100"], job, cross_vendor=False, distributed_optimizer=False) == \
        {"overlap_grad_reduce": True, "overlap_param_gather": False}
    assert performance_options(site, ["gpu_a100"], _job(distributed_optimizer=False), cross_vendor=False) == \
        {"overlap_grad_reduce": True, "overlap_param_gather": False}
    none = {"overlap_grad_reduce": False, "overlap_param_gather": False}
    assert performance_options(site, ["gpu_a100", "gpu_mi250x"], job, cross_vendor=True) == none
    assert performance_options(site, ["gpu_a100"], job, cross_vendor=False, wanted=False) == none
    local = load_site(ROOT / "site_configs" / "local.yaml")
    assert performance_options(local, [local.partitions[0].name], job, cross_vendor=False) == none
    import dataclasses
    own = dataclasses.replace(site, partitions=tuple(dataclasses.replace(p, megatron_entry=f"-m {PROJECT_ENTRY_MODULE}")
                                                     for p in site.partitions))
    assert performance_options(own, ["gpu_a100"], job, cross_vendor=False) == none
