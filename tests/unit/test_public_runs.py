"""benchmarks/data/public_runs.csv (published Megatron runs) and benchmarks/public_runs.py:
every row names its source, licence and what was measured; the split is the locked rule;
the figures are physical; the benchmark predicts what the planner can state and lists the
rest by reason instead of failing."""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


bench = _load("public_runs_bench", ROOT / "benchmarks" / "public_runs.py")
extract = _load("public_runs_extract", ROOT / "benchmarks" / "data" / "extract_public_runs.py")
ROWS = bench.load_rows()


def test_every_row_names_its_source_licence_and_measurement():
    ids = [r["id"] for r in ROWS]
    assert len(ids) == len(set(ids)) and len(ROWS) >= 100
    for r in ROWS:
        assert r["source"] and r["table"] and r["measured"], r["id"]
        assert re.match(r"https://(github\.com|docs\.nvidia\.com)/", r["source_url"]), r["id"]
        assert re.search(r"(Apache-2\.0|BSD-3-Clause)", r["licence"]), r["id"]
        assert r["iteration_ms"] or r["peak_mem_bytes"], f"{r['id']}: neither time nor memory"
        # a pinned commit, so the cited page is the one the row was read from
        assert re.search(r"/blob/[0-9a-f]{40}/", r["source_url"]), r["id"]


def test_split_is_the_locked_rule():
    with open(bench.DATA) as fh:
        header = [next(fh), next(fh)]
    assert "locked before any prediction" in header[1]
    assert extract.VENDOR_TEST_FAMILIES == frozenset({"llama3-70b", "llama3-70b-sft", "qwen3-30b-a3b"})
    assert extract.CI_TEST_MODULUS == 5
    for r in ROWS:
        ci = r["id"].startswith("mlm-ci/")
        assert r["split"] == extract.split_of(r["family"], ci=ci), r["id"]
    # whole families: no family in both halves
    halves: dict[str, set] = {}
    for r in ROWS:
        halves.setdefault(r["family"], set()).add(r["split"])
    assert all(len(v) == 1 for v in halves.values())
    # each half holds every dimension
    for split in ("dev", "test"):
        dims = {d for r in ROWS if r["split"] == split for d in bench.dimensions(r)}
        assert dims == set(bench.DIMENSIONS), (split, dims)


def test_figures_are_physical():
    from memx_hpc.spec.catalog import catalog
    gpus = {g.name: g for g in catalog()}
    for r in ROWS:
        n, tp, pp, cp = int(r["gpus"]), int(r["tp"]), int(r["pp"]), int(r["cp"] or 1)
        assert n % (tp * pp * cp) == 0, r["id"]
        assert int(r["global_batch_size"]) % int(r["micro_batch_size"]) == 0, r["id"]
        assert r["gpu_type"] in gpus, r["id"]
        if r["iteration_ms"]:
            assert 1.0 < float(r["iteration_ms"]) < 1e6, r["id"]
        if r["peak_mem_bytes"]:
            mem = float(r["peak_mem_bytes"])
            assert 1e8 < mem <= gpus[r["gpu_type"]].memory_gib * 2**30, r["id"]
        if r["tokens_per_s_per_gpu"]:
            # the step time is the published throughput's exact inverse
            t = int(r["global_batch_size"]) * int(r["seq_length"]) / (float(r["tokens_per_s_per_gpu"]) * n) * 1e3
            assert float(r["iteration_ms"]) == pytest.approx(t, rel=1e-4), r["id"]
        if r["model_tflops_per_gpu"]:
            # below the GPU's dense peak at the lowest precision it has (fp4 rows: twice fp8)
            g = gpus[r["gpu_type"]]
            peak = max(g.peak_tflops_bf16, getattr(g, "peak_tflops_fp8", 0) or 0) * (2 if "fp4" in r["precision"] else 1)
            assert 0 < float(r["model_tflops_per_gpu"]) < peak, r["id"]


def _row(pattern: str) -> dict:
    return next(r for r in ROWS if re.search(pattern, r["id"]))


def test_benchmark_predicts_and_lists_what_it_cannot_state():
    from memx_hpc.model.api import AnalyticCostModel
    from memx_hpc.spec import Partition, Site
    rows = [_row(r"mlm-ci/gpt/gpt3_7b_tp4_pp1_memory_speed/dgx_h100$"), _row(r"mlm-ci/gpt/gpt3_mcore_te_tp2_pp2_cp2/dgx_h100$"),
            _row(r"mlm-ci/gpt/gpt3_mcore_te_tp1_pp4_vp1/dgx_h100$"), _row(r"^bridge-.*LLAMA3_70B/nvfp4/")]
    site = Site(name="s", partitions=(Partition(name="p", gpu_type="H100-SXM", nodes=1, gpus_per_node=8),))
    lines: list[str] = []
    out = bench.run(rows, AnalyticCostModel(site), out=lines.append)
    assert out["predicted"] == 3 and out["refused"] == 1
    assert any("nvfp4" in k for k in out["reasons"])
    dev_vp = out[("dev", "VP")]
    assert dev_vp["n_time"] == 1 and math.isfinite(dev_vp["time_mape"]) and dev_vp["time_mape"] > 0
    cp = out[("dev", "CP")] if rows[1]["split"] == "dev" else out[("test", "CP")]
    assert cp["n_mem"] == 1 and math.isfinite(cp["mem_mape"])
    assert any("not expressible yet" in ln for ln in lines)


def test_rows_become_the_plans_they_ran():
    plan, site, job = bench.build(_row(r"mlm-ci/gpt/gpt3_mcore_te_tp1_pp4_vp1/dgx_h100$"))
    # 12 layers, 4 stages, one layer per virtual stage: 3 chunks per rank
    assert (plan.tp, plan.pp, plan.dp, plan.virtual_stages) == (1, 4, 2, 3)
    assert [s.num_layers for s in plan.stages] == [3, 3, 3, 3]
    assert job.attention == "core" and site.partitions[0].gpus_per_node == 8
    plan, _, _ = bench.build(_row(r"mlm-ci/gpt/gpt3_mcore_te_tp2_pp2_cp2/dgx_h100$"))
    assert (plan.tp, plan.pp, plan.cp, plan.dp) == (2, 2, 2, 1)
    assert bench._even(126, 8) == [15, 16, 16, 16, 16, 16, 16, 15]
    with pytest.raises(bench.NotExpressible, match="nvfp4"):
        bench.build(_row(r"^bridge-.*LLAMA3_70B/nvfp4/"))


def test_embedding_and_loss_counted_as_layers_of_the_pipeline_split():
    # Llama-3.1-405B's recipe: 126 layers + embedding + loss over pp 8 x vp 4 = 32 chunks of 4;
    # the first chunk holds the embedding and 3 layers, the last 3 layers and the loss
    plan, _, job = bench.build(_row(r"^bridge-.*26\.06/DGX-GB300/LLAMA3\.1_405B/fp8-tensorwise/"))
    assert (plan.pp, plan.virtual_stages) == (8, 4) and job.model.num_layers == 126
    assert [s.num_layers for s in plan.stages] == [15] + [16] * 6 + [15]
    assert plan.chunk_layers(0) == (3, 4, 4, 4)
    assert bench._accounted_layers(7, 2, 1, True, False) == [3, 4]
    with pytest.raises(bench.NotExpressible, match="do not split evenly"):
        bench._accounted_layers(126, 8, 3, True, True)
    # the CI case: both flags in its arguments
    row = _row(r"mlm-ci/gpt/gpt3_mcore_te_tp1_pp4_vp2_account_for_embedding_loss_in_pipeline_split/dgx_h100$")
    assert bench._accounted(row) == (True, True)


def test_cli_refuses_bad_input(tmp_path, capsys):
    assert bench.main(["--limit", "-1"]) == 1
    assert bench.main(["--source", "no-such-source", "--analytic"]) == 1
    assert bench.main(["--data", str(tmp_path / "missing.csv")]) == 2
    assert "missing.csv" in capsys.readouterr().err


def test_fp8_rows_become_fp8_jobs_once_the_job_has_fp8():
    import dataclasses
    from memx_hpc.spec import TrainJob
    row = _row(r"^nemo-24.07/.*LLAMA3-70B/")  # FP8 (delayed scaling), TP4 PP4 CP2 VP5 on 64 H100
    assert row["precision"] == "fp8-delayed"
    if "fp8" in {f.name for f in dataclasses.fields(TrainJob)}:
        plan, _, job = bench.build(row)
        assert (job.precision, job.fp8) == ("bf16", "hybrid")
        assert (plan.tp, plan.pp, plan.cp, plan.virtual_stages, plan.dp) == (4, 4, 2, 5, 2)
    else:
        with pytest.raises(bench.NotExpressible, match="FP8"):
            bench.build(row)


def test_bridge_rows_carry_what_their_recipe_sets_and_nothing_elsewhere():
    """The performance summary's Llama/Qwen3 recipes reduce gradients in bf16 and their FP8
    presets keep FP8 weights; the memory-tuning study's FP8 preset keeps FP8 weights but its
    gradient dtype is not stated; the NeMo 24.07 runs that the launcher's run scripts at tag
    24.07 state reduce gradients in bf16 and keep 16-bit weights; the CI rows keep Megatron-LM's
    defaults."""
    _, _, job = bench.build(_row(r"^bridge-performance-summary-archive/26.06/DGX-GB200/LLAMA3.1_405B/fp8-tensorwise/"))
    assert (job.grad_reduce_in_fp32, job.fp8_param_gather) == (False, True)
    _, _, job = bench.build(_row(r"^bridge-skill/memory-tuning/llama3-70b-sft/tp4pp4vp5$"))
    assert (job.grad_reduce_in_fp32, job.fp8_param_gather) == (True, True)
    _, _, job = bench.build(_row(r"^nemo-24.07/.*LLAMA3-70B/"))
    assert (job.grad_reduce_in_fp32, job.fp8_param_gather, job.model.hidden_dropout) == (False, False, 0.0)
    _, _, job = bench.build(_row(r"^nemo-24.07/.*GPT3-175B/fp8-delayed/r3v0"))
    assert (job.grad_reduce_in_fp32, job.fp8_param_gather, job.model.hidden_dropout) == (False, False, 0.1)
    # GPT-3 175B on 512 GPUs: no published script states that run, so Megatron-LM's default stays
    _, _, job = bench.build(_row(r"^nemo-24.07/.*GPT3-175B/fp8-delayed/r4v0"))
    assert job.grad_reduce_in_fp32
    _, _, job = bench.build(_row(r"mlm-ci/gpt/gpt3_mcore_te_tp1_pp4_vp1/dgx_h100$"))
    assert (job.grad_reduce_in_fp32, job.fp8_param_gather, job.model.hidden_dropout) == (True, False, 0.1)
    _, _, job = bench.build(_row(r"^bridge-performance-summary-archive/26.06/DGX-GB200/LLAMA3.1_405B/fp8-tensorwise/"))
    assert job.model.hidden_dropout == 0.0


def test_over_capacity_share_and_the_peak_by_term_add_up():
    """Every row ran, so the share predicted over capacity is a memory error; the printed
    terms of the largest stage sum to its allocator peak, and S + a x (A - S) + b is its device
    peak (the allocator's slope on the activations, not on the state)."""
    from memx_hpc.model.api import AnalyticCostModel
    from memx_hpc.spec import Partition, Site
    row = _row(r"^bridge-performance-summary-archive/26.06/DGX-GB200/LLAMA3.1_405B/fp8-tensorwise/")
    site = Site(name="s", partitions=(Partition(name="p", gpu_type="GB200", nodes=1, gpus_per_node=4),))
    model = AnalyticCostModel(site)
    lines: list[str] = []
    out = bench.run([row], model, out=lines.append)
    vp = out[(row["split"], "VP")]
    assert vp["over_capacity_share"] in (0.0, 1.0) and vp["said_over_capacity"] == round(vp["over_capacity_share"])
    assert any("largest stage's predicted peak by term" in ln for ln in lines)
    x = bench.predict_row(row, model)["terms"]
    assert x["weights"] + x["grads"] + x["optimizer"] + x["fp8"] == pytest.approx(x["state"], rel=1e-6)
    assert x["state"] + x["activations"] == pytest.approx(x["alloc"], rel=1e-6)
    assert x["state"] + x["a"] * x["activations"] + x["b"] == pytest.approx(x["device"], rel=1e-6)
    # interleaved 1F1B on the second stage of 16 with 4 chunks: 2 x 14 + 3 x 16 warm-up chunk
    # forwards + 1 (megatron-core schedules.get_pp_rank_microbatches)
    assert x["stage"] == 1 and x["chunks"] == 77 and x["units"] == pytest.approx(77 / 4)
    # bf16 gradients (2 bytes); the FP8 weights are the parameters (--fp8-param-gather) and on
    # Blackwell (compute capability 10.0) keep no transpose: one byte a parameter, one below
    # the bf16 weight the state counts (a middle stage: no embedding or head parameters)
    assert x["grads"] == x["weights"] and x["fp8"] == pytest.approx(-x["weights"] / 2, rel=1e-9)
    # a device peak over the capacity is a false out-of-memory call; one inside the safety
    # margin only is the planner's limit, counted apart
    assert vp["said_over_capacity"] == int(x["device"] > x["capacity"])
    assert vp["over_limit"] == int(x["device"] > x["limit"]) and x["limit"] < x["capacity"]


def test_false_out_of_memory_calls_per_family_and_what_the_runs_set():
    """The share of rows called over capacity is printed per split and family; Bridge rows run
    with expandable segments (the slope of the allocator follows), others at the prior; the CI
    case with a micro-batch group per virtual stage becomes a plan instead of a refusal."""
    from memx_hpc.model.api import AnalyticCostModel
    from memx_hpc.model.memory import PRIORS, prior_for
    from memx_hpc.spec import Partition, Site
    bridge = _row(r"^bridge-performance-summary-archive/26.06/DGX-GB200/LLAMA3.1_405B/fp8-tensorwise/")
    ci = _row(r"mlm-ci/gpt/gpt3_mcore_te_tp1_pp4_vp1/dgx_h100$")
    site = Site(name="s", partitions=(Partition(name="p", gpu_type="GB200", nodes=1, gpus_per_node=4),))
    lines: list[str] = []
    out = bench.run([bridge, ci], AnalyticCostModel(site), out=lines.append)
    assert any("by split and family" in ln for ln in lines)
    fam = out[(bridge["split"], "family", bridge["family"])]
    assert fam["predicted"] == 1 and fam["said_over_capacity"] in (0, 1)
    assert out[(bridge["split"], "all")]["predicted"] >= 1
    assert bench.predict_row(bridge, AnalyticCostModel(site))["terms"]["a"] == \
        prior_for("nvidia", expandable_segments=True).a
    assert bench.predict_row(ci, AnalyticCostModel(site))["terms"]["a"] == PRIORS["nvidia"].a
    plan, _, _ = bench.build(_row(r"mlm-ci/gpt/gpt3_mcore_te_tp1_pp4_vp1_tunable_overlap/dgx_h100$"))
    assert (plan.microbatch_group_size_per_vp_stage, plan.num_microbatches, plan.pp) == (5, 5, 4)
