"""The planner as a library (memx_hpc.planner) and the plan command's exit contract on profiling faults."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from pathlib import Path

import pytest

from memx_hpc.cli.main import main
from memx_hpc.errors import SystemFailure
from memx_hpc.planner import PlanRequest, plan, scale_site, store_paths
from memx_hpc.search.space import SpaceOptions
from memx_hpc.spec import load_site

ROOT = Path(__file__).resolve().parents[2]
SITE = str(ROOT / "site_configs" / "local.yaml")
JOB = str(ROOT / "jobs" / "tiny-gpt.yaml")


def _request(tmp_path: Path, **kw) -> PlanRequest:
    base = dict(site=SITE, job=JOB, store=tmp_path / "store.h5", out_dir=tmp_path / "out", top_k=3,
                space=SpaceOptions(max_pipeline_stages=2), progress=False)
    base.update(kw)
    return PlanRequest(**base)


def test_library_plan_matches_the_cli_and_writes_its_files(tmp_path, capsys):
    result = plan(_request(tmp_path))
    assert result.rank0 and len(result.search.top) == 3
    assert [s.rank for s in result.search.top] == [1, 2, 3]
    # no store: every number is a datasheet estimate, and the notes say so
    assert set(result.provenance.values()) == {"datasheet-only"}
    assert any("no profile store" in n for n in result.notes)
    # each run writes into a folder of its own under out_dir, 'latest' pointing at it
    run = result.out_dir
    assert run.parent == tmp_path / "out" and (tmp_path / "out" / "latest").resolve() == run.resolve()
    for name in ("plan-01.json", "plan-03.json", "pareto.png", "summary.json"):
        assert str(run / name) in result.files and (run / name).is_file()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["job"] == "tiny-gpt" and set(summary.get("files", [])) <= set(result.files)
    # the CLI is a thin wrapper: the same request gives the same ranking
    rc = main(["search", "--site", SITE, "--job", JOB, "--store", str(tmp_path / "store.h5"), "--out",
               str(tmp_path / "cli"), "--top", "3", "--max-stages", "2", "--json"])
    assert rc == 0
    cli = json.loads(capsys.readouterr().out)
    assert [t["index"] for t in cli["top"]] == [s.index for s in result.ranked]


def test_write_false_writes_nothing(tmp_path):
    result = plan(_request(tmp_path, write=False))
    assert result.search.top and result.files == [] and not (tmp_path / "out").exists()


def test_store_paths_one_rule():
    site = load_site(SITE)
    default = store_paths(site)
    assert default.store == site.store and default.cache == site.cache
    assert default.predictor == site.store.with_suffix(".predictor.ubj")
    mine = store_paths(site, "/x/y/s.h5")  # an explicit store keeps its cache and predictor beside it
    assert mine.store == Path("/x/y/s.h5") and mine.cache == Path("/x/y/s.cache.sqlite")
    assert mine.predictor == Path("/x/y/s.predictor.ubj")


def test_scale_site_keeps_the_gpu_mix():
    site = load_site(SITE)
    big = scale_site(site, site.total_gpus * 3)
    assert big.total_gpus == site.total_gpus * 3
    assert [p.gpu_type for p in big.partitions] == [p.gpu_type for p in site.partitions]


def _lock(store: Path) -> Path:
    """A writer lock held by a live process (this one), as a concurrent 'memx-hpc profile' leaves it."""
    lock = Path(str(store) + ".lock")
    lock.write_text(f"{os.getpid()}@{socket.gethostname()}\n")
    return lock


def test_plan_exits_2_naming_the_store_when_it_is_locked(tmp_path, capsys):
    store = tmp_path / "store.h5"
    lock = _lock(store)
    rc = main(["plan", "--site", SITE, "--job", JOB, "--store", str(store), "--out", str(tmp_path / "out"),
               "--max-stages", "2"])
    err = capsys.readouterr().err
    assert rc == 2
    assert str(store) in err and "--allow-datasheet" in err and "Traceback" not in err
    assert lock.exists() and not (tmp_path / "out").exists()  # nothing planned, the other writer's lock kept


def test_plan_library_raises_system_failure_when_profiling_cannot_run(tmp_path):
    _lock(tmp_path / "store.h5")
    with pytest.raises(SystemFailure, match="store.h5"):
        plan(_request(tmp_path, profile=True))


@pytest.mark.parametrize("flag, note", [("--allow-datasheet", "--allow-datasheet"),
                                        ("--no-profile", "--no-profile")])
def test_plan_with_a_locked_store_goes_on_when_asked(tmp_path, capsys, flag, note):
    store = tmp_path / "store.h5"
    _lock(store)
    rc = main(["plan", "--site", SITE, "--job", JOB, "--store", str(store), "--out", str(tmp_path / "out"),
               "--max-stages", "2", "--top", "2", flag, "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert any(note in n for n in out["notes"]), out["notes"]
    assert (tmp_path / "out" / "latest" / "plan-01.json").is_file()


def test_simulate_scales_searches_each_scale_with_one_model(tmp_path):
    from memx_hpc.planner import simulate_scales
    site = load_site(SITE)
    run = simulate_scales(_request(tmp_path), (site.total_gpus * 2,))
    assert [sc.site.total_gpus for sc in run.scales] == [site.total_gpus, site.total_gpus * 2]
    for sc in run.scales:
        assert sc.search.top and sc.wall_s > 0
        check = sc.best_check  # the search's vectorised schedule is the event-driven simulator's
        assert check["pipeline_ms_search"] == pytest.approx(check["pipeline_ms_event_driven"], rel=1e-9)
        assert check["pipeline_ms_textbook"] > 0 and 0 <= check["bubble_fraction"] < 1
    assert not (tmp_path / "out").exists()  # simulate writes nothing


def test_verify_rows_are_typed_and_keep_their_json_keys():
    from types import SimpleNamespace

    from memx_hpc.planner import VerifyRow, _rows_mape, _verify_row
    rec = SimpleNamespace(prediction={"iteration_ms": 110.0}, key="k1", job_id="17", iteration_ms=100.0,
                          peak_footprint_bytes=2 * 2**30, peak_allocated_max_bytes=2**30)
    held = SimpleNamespace(before_ms=120.0, after_ms=105.0, before_footprint_bytes=3 * 2**30,
                           after_footprint_bytes=2 * 2**30, fitted_on=4)
    row = _verify_row("runs/plan-01.json", rec, True, held)
    assert isinstance(row, VerifyRow) and row.after_ms == 105.0 and row.measured_peak_mib == 2048.0
    assert list(row.to_dict())[:4] == ["plan", "key", "job_id", "new"] and row.to_dict()["calibrated_on_runs"] == 4
    m = _rows_mape([row])
    assert m["mape_time_before_pct"] == pytest.approx(20.0) and m["mape_memory_after_pct"] == pytest.approx(0.0)
    kept = _verify_row("p.json", rec, False, None)
    assert kept.before_ms is None and kept.after_peak_mib is None and not kept.new


def test_sequence_parallel_is_not_planned_where_render_refuses_it() -> None:
    """CPU devices train with torch's LayerNorm, which refuses sequence parallel: the space
    leaves it out with a note, an explicit --sequence-parallel on is a user error, and render
    refuses such a plan naming the field; GPU sites keep it searched."""
    import dataclasses

    from memx_hpc.errors import SpecError
    from memx_hpc.planner import launchable_space
    from memx_hpc.slurm.render import describe
    from memx_hpc.spec import Plan, Stage, load_job

    local, job = load_site(ROOT / "site_configs" / "local.yaml"), load_job(ROOT / "jobs" / "tiny-gpt.yaml")
    options, notes = launchable_space(local, job, SpaceOptions())
    assert options.sequence_parallel is False
    assert any("sequence parallel left out" in n and "LayerNorm" in n for n in notes)
    with pytest.raises(SpecError, match="sequence parallel"):
        launchable_space(local, job, SpaceOptions(sequence_parallel=True))
    cross = load_site(ROOT / "site_configs" / "example-cross-vendor.yaml")
    gpu_options, gpu_notes = launchable_space(cross, load_job(ROOT / "jobs" / "llama2-7b.yaml"), SpaceOptions())
    assert gpu_options.sequence_parallel is None and not any("sequence parallel" in n for n in gpu_notes)
    part = local.partitions[0]
    sp = Plan(tp=2, dp=1, micro_batch_size=1, global_batch_size=job.global_batch_size, sequence_parallel=True,
              stages=(Stage(partition=part.name, num_layers=job.model.num_layers),))
    describe(dataclasses.replace(sp, sequence_parallel=False), local, job)
    with pytest.raises(SpecError, match="CPU devices"):
        describe(sp, local, job)


def _checkpoint(base: Path, iteration: int = 2, **args) -> str:
    """A megatron-core torch_dist checkpoint folder as far as resume reads it: the tracker
    file, the dist-checkpoint metadata and the common state (``args``, ``iteration``)."""
    import argparse
    import json as json_

    import torch

    path = base / f"iter_{iteration:07d}"
    path.mkdir(parents=True)
    (base / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    (path / "metadata.json").write_text(json_.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                                                      "common_backend": "torch", "common_backend_version": 1}))
    torch.save({"args": argparse.Namespace(**args), "iteration": iteration}, path / "common.pt")
    return str(base)


def test_resume_names_every_model_argument_the_checkpoint_differs_in(tmp_path):
    """resume_job compares the arguments Megatron saved with the checkpoint against the job
    before anything is rendered: SpecError naming --resume, the checkpoint and each argument."""
    pytest.importorskip("megatron.core")
    from memx_hpc.errors import SpecError
    from memx_hpc.planner import resume_job
    from memx_hpc.spec import load_job

    job = load_job(ROOT / "jobs" / "tiny-gpt.yaml")
    m = job.model
    same = dict(num_layers=m.num_layers, hidden_size=m.hidden_size, ffn_hidden_size=m.ffn_hidden_size,
                num_attention_heads=m.num_attention_heads, seq_length=m.seq_length,
                group_query_attention=m.num_query_groups != m.num_attention_heads,
                num_query_groups=m.num_query_groups, swiglu=m.activation == "swiglu", num_experts=None,
                vocab_size=m.vocab_size, tokenizer_type="NullTokenizer", tensor_model_parallel_size=2,
                pipeline_model_parallel_size=1, data_parallel_size=1, global_batch_size=job.global_batch_size)
    ok = _checkpoint(tmp_path / "ok", **same)
    resumed, note = resume_job(dataclasses.replace(job, train_iters=10), ok)
    assert resumed.checkpoint.load_dir == ok and "iteration 2, written with tp/pp/dp 2/1/1" in note
    bad = _checkpoint(tmp_path / "bad", **{**same, "hidden_size": m.hidden_size * 2, "swiglu": not same["swiglu"],
                                           "num_experts": 8, "vocab_size": m.vocab_size + 7})
    with pytest.raises(SpecError) as e:
        resume_job(dataclasses.replace(job, train_iters=10), bad)
    assert e.value.field == "--resume"
    text = str(e.value)
    assert bad in text
    for name in ("hidden_size", "swiglu", "num_experts", "vocab_size"):
        assert name in text, text
    assert "num_layers" not in text
    # a checkpoint of multi-latent attention (the entry and Megatron-LM save its arguments) is
    # another model than the job's standard attention
    mla = _checkpoint(tmp_path / "mla", **{**same, "multi_latent_attention": True, "kv_lora_rank": 32})
    with pytest.raises(SpecError, match="multi_latent_attention"):
        resume_job(dataclasses.replace(job, train_iters=10), mla)


def test_plans_on_cpu_devices_do_not_overlap_and_old_plan_files_are_predicted_as_off(tmp_path):
    """This machine's CPU partitions run the project's entry, which has no streams to overlap
    on: every plan is off, priced so, and the notes say why; a plan file written before the
    options is predicted as off, and predict says so."""
    from memx_hpc.planner import PredictRequest, predict

    r = plan(_request(tmp_path, write=False, analytic=True))
    assert r.ranked and not any(c.plan.overlap_grad_reduce or c.plan.overlap_param_gather for c in r.ranked)
    assert any("no CUDA streams to overlap on" in n for n in r.notes)
    res = predict(PredictRequest(site=SITE, job=JOB, plan=ROOT / "tests" / "golden" / "plans" / "local-pp3.json",
                                 analytic=True, store=tmp_path / "store.h5"))
    assert not res.plan.overlap_grad_reduce
    assert any("states no overlap_grad_reduce or overlap_param_gather" in n for n in res.notes)
