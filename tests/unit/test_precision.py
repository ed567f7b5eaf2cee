"""Precisions a GPU type's matrix units run natively (catalog data) and what the planner
does with a job in another one."""

from __future__ import annotations

from pathlib import Path

import pytest

from memx_hpc.spec.catalog import catalog, precision_notes
from memx_hpc.errors import SpecError
from memx_hpc.model.api import AnalyticCostModel
from memx_hpc.model.features import build
from memx_hpc.model.compose import layer_query
from memx_hpc.spec import GpuType, load_job, load_site

ROOT = Path(__file__).resolve().parents[2]


def test_volta_and_turing_have_no_bf16_units():
    cat = catalog()
    for name in ("V100-16", "V100-32", "V100-PCIE-16", "T4", "RTX-2080", "Titan-RTX"):
        g = cat.get(name)
        assert not g.native("bf16") and g.native("fp16")
        assert g.peak_tflops("bf16") == g.peak_tflops_fp32 < g.peak_tflops("fp16")
    for name in ("A100-80", "H100-SXM", "MI250X-GCD", "MI300X", "cpu"):
        assert cat.get(name).native("bf16")


def test_bf16_on_v100_is_modelled_slower_than_fp16_and_the_planner_says_so():
    import dataclasses
    site = load_site(ROOT / "site_configs" / "example-cross-vendor.yaml")
    job = load_job(ROOT / "jobs" / "llama2-7b.yaml")
    assert job.precision == "bf16"
    notes = precision_notes(site, job)
    assert len(notes) == 1 and notes[0].startswith("V100-32 has no native bf16") and "precision: fp16" in notes[0]
    assert precision_notes(site, dataclasses.replace(job, precision="fp16")) == []
    # a plan on the A100s alone (what predict reports) gets no V100 note
    assert precision_notes(site, job, gpu_types=["A100-80"]) == [] and precision_notes(site, job, ["V100-32"]) == notes
    model = AnalyticCostModel(site)
    qs = [layer_query(dataclasses.replace(job, precision=p), "V100-32", kind="layer", tp=1, micro_batch_size=1,
                      recompute="none", sequence_parallel=False) for p in ("bf16", "fp16")]
    t_bf16, t_fp16 = model.predict(qs)[:, 0]
    assert t_bf16 > 3 * t_fp16
    X, _ = build(qs, site)
    assert (X[0] != X[1]).any()  # the predictor sees the difference too (peak and matrix-unit features)


def test_site_gpu_types_may_list_precisions():
    base = {"vendor": "nvidia", "memory_gib": 16, "peak_tflops_bf16": 100, "peak_tflops_fp32": 10,
            "hbm_gbps": 900, "link_gbps": 100}
    assert GpuType.from_mapping(base, "x", name="G").precisions == ("bf16", "fp16", "fp32")
    assert GpuType.from_mapping({**base, "precisions": ["fp16", "fp32"]}, "x", name="G").precisions == ("fp16", "fp32")
    with pytest.raises(SpecError, match="precisions"):
        GpuType.from_mapping({**base, "precisions": ["fp8"]}, "x", name="G")


# --------------------------------------------------------------------------- FP8

import dataclasses  # noqa: E402

from memx_hpc.model.api import LayerQuery, roofline_components  # noqa: E402
from memx_hpc.spec import LayerShape, job_from_mapping  # noqa: E402

CROSS = ROOT / "site_configs" / "example-cross-vendor.yaml"


def _fp8_site(a100_as="H100-SXM", mi250x_as=None):
    """The cross-vendor example with its A100 partition holding another GPU type."""
    site = load_site(CROSS)
    parts = []
    for p in site.partitions:
        if p.name == "gpu_a100":
            p = dataclasses.replace(p, gpu_type=a100_as)
        if p.name == "gpu_mi250x" and mi250x_as:
            p = dataclasses.replace(p, gpu_type=mi250x_as)
        parts.append(p)
    return dataclasses.replace(site, partitions=tuple(parts))


def _fp8_job(fmt="hybrid", **kw):
    return job_from_mapping({"model": "GPT-3-2.7B", "global_batch_size": 64, "fp8": fmt, **kw})


def test_a_job_says_fp8_by_format_and_recipe():
    job = _fp8_job(fp8_recipe="tensorwise")
    assert (job.fp8, job.fp8_recipe, job.precision) == ("hybrid", "tensorwise", "bf16")
    assert _fp8_job("none").fp8 == "" and _fp8_job(False).fp8 == ""
    for bad, field in (({"fp8": "e5m2"}, "fp8"), ({"fp8": "hybrid", "fp8_recipe": "nvfp4"}, "fp8_recipe"),
                       ({"fp8": "hybrid", "precision": "fp32"}, "fp8")):
        with pytest.raises(SpecError) as e:
            job_from_mapping({"model": "GPT-3-2.7B", "global_batch_size": 64, **bad})
        assert e.value.field == field


def test_fp8_roofline_runs_the_linear_gemms_at_the_catalog_fp8_rate():
    """GEMM FLOPs at the fp8 rate, attention scores at the 16-bit one, plus the cast traffic:
    a Llama-3-8B layer on H100 is faster in FP8 but by less than the 2x of the rates."""
    from memx_hpc.spec.catalog import preset
    from memx_hpc.model import analytic
    g = catalog().get("H100-SXM")
    shape = LayerShape.of(preset("Llama-3-8B"))
    q = LayerQuery(gpu_type="H100-SXM", shape=shape, tp=1, micro_batch_size=1, recompute="none", precision="bf16")
    f = dataclasses.replace(q, fp8="hybrid")
    c16, c8 = roofline_components(q, g), roofline_components(f, g)
    total = 3 * analytic.layer_flops(shape, micro_batch_size=1)
    scores = 3 * analytic.attention_score_flops(shape, micro_batch_size=1)
    assert c8["compute_ms"] == pytest.approx(((total - scores) / 1979e12 + scores / 989e12) * 1e3, rel=1e-9)
    assert c8["memory_ms"] > c16["memory_ms"]  # the casts
    t16, t8 = sum(c16[k] for k in ("compute_ms", "memory_ms", "comm_ms")), \
        sum(c8[k] for k in ("compute_ms", "memory_ms", "comm_ms"))
    assert 1.1 < t16 / t8 < 2.0
    with pytest.raises(SpecError) as e:  # an A100 has no FP8 units
        roofline_components(dataclasses.replace(f, gpu_type="A100-80"), catalog().get("A100-80"))
    assert e.value.field == "fp8"
    with pytest.raises(SpecError):  # the output layer stays 16-bit
        dataclasses.replace(f, kind="head")


def test_the_predictor_scales_its_16bit_answer_by_the_fp8_roofline_and_says_so():
    from memx_hpc.model.api import roofline_ms
    from memx_hpc.model.predictor import Predictor
    from memx_hpc.spec import LayerSample, ProfilePoint
    from memx_hpc.spec.catalog import preset
    shape = LayerShape.of(preset("GPT-3-1.3B"))
    samples = [LayerSample(point=ProfilePoint(gpu_type="H100-SXM", kind="layer", shape=shape, tp=1,
                                              micro_batch_size=b), forward_ms=2.0 * b, backward_ms=4.0 * b,
                           activation_bytes=10**8 * b) for b in (1, 2, 4)]
    p = Predictor(augment=False).fit(samples, catalog())
    q = LayerQuery(gpu_type="H100-SXM", shape=shape, tp=1, micro_batch_size=2, recompute="none", precision="bf16")
    f = dataclasses.replace(q, fp8="e4m3")
    (t16, a16), (t8, a8) = p.predict([q, f])
    g = catalog().get("H100-SXM")
    assert t8 == pytest.approx(t16 * roofline_ms(f, g) / roofline_ms(q, g), rel=1e-9) and t8 < t16
    # the 16-bit activations scaled by the analytic ratio: TE keeps FP8 GEMM inputs
    from memx_hpc.model.api import analytic_activation_bytes
    assert a8 == pytest.approx(a16 * analytic_activation_bytes(f) / analytic_activation_bytes(q), rel=1e-9)
    assert a8 < a16
    assert p.explain([q, f]) == ["measured", "measured+fp8-roofline"]


def test_fp8_layers_keep_their_gemm_inputs_in_fp8():
    """Transformer Engine saves the quantised GEMM inputs for the weight gradients: the QKV
    and fc1 inputs (h) and fc2's input (f) at 1 byte instead of 2, plus a 1-byte copy of the
    attention output beside the 16-bit one the fused kernel keeps: h + f bytes less per token."""
    from memx_hpc.spec.catalog import preset
    from memx_hpc.model import analytic
    m = preset("Llama-3-8B")
    h, f, s, b = m.hidden_size, m.ffn_hidden_size, m.seq_length, 2
    for tp, sp in ((1, False), (2, True)):
        kw = dict(micro_batch_size=b, tp=tp, recompute="none", precision="bf16", attention="sdpa",
                  sequence_parallel=sp)
        bf16 = analytic.activation_bytes_per_layer(m, **kw)
        fp8 = analytic.activation_bytes_per_layer(m, **kw, fp8="hybrid")
        assert bf16 - fp8 == pytest.approx(s * b * (h + f) / tp, abs=2)
        # full recompute keeps the 16-bit layer input either way
        full = dict(kw, recompute="full")
        assert analytic.activation_bytes_per_layer(m, **full, fp8="hybrid") == analytic.activation_bytes_per_layer(m, **full)


def test_fp8_runs_only_where_the_gpus_have_it_and_holds_its_weight_copies():
    from memx_hpc.model.compose import predict_plan
    from memx_hpc.placement import place
    from memx_hpc.search.space import PlanSpace
    from memx_hpc.spec import Plan, Stage
    job, plain = _fp8_job(), _fp8_job("none")
    site = _fp8_site()
    plan = Plan(tp=4, dp=2, micro_batch_size=8, global_batch_size=64,
                stages=(Stage(partition="gpu_a100", num_layers=32),))
    model = AnalyticCostModel(site)
    a, b = predict_plan(plan, site, plain, model), predict_plan(plan, site, job, model)
    assert b.iteration_ms < a.iteration_ms
    from memx_hpc.model import analytic
    layers = analytic.stage_params(job.model, 32, first=True, last=True, tp=4, pp=1) - \
        analytic.stage_params(job.model, 0, first=True, last=True, tp=4, pp=1)
    assert b.stages[0].state_bytes - a.stages[0].state_bytes == pytest.approx(2 * layers, rel=1e-6)
    # the example as it is: A100s, MI250X and V100s have no FP8 units
    with pytest.raises(SpecError) as e:
        place(plan, load_site(CROSS), job)
    assert e.value.field == "fp8" and "A100-80" in str(e.value)
    space = PlanSpace(load_site(CROSS), job)
    assert len(space) == 0 and space.why_empty()[0] == "fp8"
    # on the H100 variant the search keeps to the H100 partition
    space = PlanSpace(site, job)
    assert len(space) and {site.partitions[i].name for sk in space.skeletons for i, _ in sk.groups} == {"gpu_a100"}


def test_fp8_parameters_replace_the_16_bit_layer_weights_and_bf16_grads_halve_the_buffer():
    """--fp8-param-gather: the layers' weights are the FP8 tensors (1 byte + transpose), not
    2 bytes of bf16 beside them; --grad-reduce-in-bf16: a 2-byte gradient buffer per parameter
    (megatron-core distributed_data_parallel.py); the optimizer shards do not move."""
    from memx_hpc.model import analytic
    from memx_hpc.model.compose import predict_plan
    from memx_hpc.spec import Plan, Stage
    site = _fp8_site()
    model = AnalyticCostModel(site)
    plan = Plan(tp=4, dp=2, micro_batch_size=1, global_batch_size=64,
                stages=(Stage(partition="gpu_a100", num_layers=32),))
    base = _fp8_job()
    fp8w = dataclasses.replace(base, fp8_param_gather=True)
    bf16g = dataclasses.replace(base, grad_reduce_in_fp32=False)
    params = analytic.stage_params(base.model, 32, first=True, last=True, tp=4, pp=1)
    layers = params - analytic.stage_params(base.model, 0, first=True, last=True, tp=4, pp=1)
    s0, s1, s2 = (predict_plan(plan, site, j, model).stages[0] for j in (base, fp8w, bf16g))
    assert s0.state_bytes - s1.state_bytes == pytest.approx(2 * layers, rel=1e-6)
    assert s0.state_bytes - s2.state_bytes == pytest.approx(2 * params, rel=1e-6)
    assert s1.activation_bytes == s0.activation_bytes == s2.activation_bytes
    parts = analytic.state_parts(params, precision="bf16", optimizer="adam", distributed_optimizer=True, dp=2,
                                 grad_reduce_in_fp32=False)
    assert parts["grads"] == 2 * params and parts["weights"] == 2 * params
    assert parts["optimizer"] == analytic.state_parts(params, precision="bf16", optimizer="adam",
                                                      distributed_optimizer=True, dp=2)["optimizer"]
    # fp16 keeps its fp16 gradient buffer either way
    assert analytic.state_bytes(params, precision="fp16", optimizer="adam", distributed_optimizer=True, dp=2,
                                grad_reduce_in_fp32=False) == analytic.state_bytes(
        params, precision="fp16", optimizer="adam", distributed_optimizer=True, dp=2)
    # Megatron-LM takes --fp8-param-gather with the distributed optimizer only, and FP8 matmuls
    with pytest.raises(SpecError) as e:
        dataclasses.replace(base, fp8_param_gather=True, distributed_optimizer=False)
    assert e.value.field == "fp8_param_gather"
    with pytest.raises(SpecError):
        dataclasses.replace(_fp8_job("none"), fp8_param_gather=True)


@pytest.mark.parametrize("name, cc", [("A100-80", (8, 0)), ("H100-SXM", (9, 0)), ("H200", (9, 0)),
                                      ("GH200", (9, 0)), ("L40S", (8, 9)), ("B200", (10, 0)), ("GB200", (10, 0)),
                                      ("B300", (10, 3)), ("GB300", (10, 3))])
def test_nvidia_parts_state_their_compute_capability(name, cc):
    """NVIDIA's CUDA GPUs table; B300 and GB300 report 10.3 (nvidia-smi compute_cap)."""
    assert catalog().get(name).compute_capability == cc
    assert catalog().get("MI300X").compute_capability is None


def test_compute_capability_is_read_as_major_minor_and_checked():
    from memx_hpc.spec import parse_compute_capability
    assert parse_compute_capability("10.3", "f") == (10, 3) and parse_compute_capability(9.0, "f") == (9, 0)
    assert parse_compute_capability(None, "f") is None
    for bad in ("10", "ten.0", "9.10", True, [9, 0]):
        with pytest.raises(SpecError) as e:
            parse_compute_capability(bad, "gpu_types.X.compute_capability")
        assert e.value.field == "gpu_types.X.compute_capability"
    row = {"vendor": "nvidia", "memory_gib": 80, "peak_tflops_bf16": 989, "peak_tflops_fp32": 67,
           "hbm_gbytes_per_s": 3350, "link_gbytes_per_s": 450}
    assert GpuType.from_mapping({**row, "compute_capability": "9.0"}, "gpu_types.X", name="X").compute_capability \
        == (9, 0)
    with pytest.raises(SpecError) as e:
        GpuType.from_mapping({**row, "vendor": "amd", "compute_capability": "9.0"}, "gpu_types.X", name="X")
    assert e.value.field == "gpu_types.X.compute_capability"


def test_fp8_weights_keep_a_transpose_only_where_fp8_gemms_need_tn_layouts():
    """Transformer Engine's is_non_tn_fp8_gemm_supported(): (10, 0) <= capability < (12, 0) or
    >= (13, 0). There a per-tensor-scaled FP8 weight is one byte per parameter (no transpose);
    on Hopper two (weight + transpose); MXFP8 keeps its row- and column-wise quantizations
    everywhere; a part without a stated capability is read as keeping the transpose."""
    import dataclasses as dc
    from memx_hpc.model import analytic
    from memx_hpc.model.stage_memory import fp8_state_bytes
    from memx_hpc.spec import fp8_gemm_takes_non_tn_layouts
    cat = catalog()
    for name in ("B200", "GB200", "B300", "GB300"):
        assert fp8_gemm_takes_non_tn_layouts(cat.get(name)), name
    for name in ("H100-SXM", "H200", "GH200", "L40S", "A100-80", "MI300X"):
        assert not fp8_gemm_takes_non_tn_layouts(cat.get(name)), name
    h100 = cat.get("H100-SXM")
    for cc, yes in (((12, 0), False), ((12, 1), False), ((13, 0), True), ((11, 0), True)):
        assert fp8_gemm_takes_non_tn_layouts(dc.replace(h100, compute_capability=cc)) is yes, cc
    assert analytic.fp8_weight_bytes(1.0, "delayed") == 2.0
    assert analytic.fp8_weight_bytes(1.0, "tensorwise", non_tn_gemm=True) == 1.0
    assert analytic.fp8_weight_bytes(1.0, "delayed", non_tn_gemm=True) == 1.0
    assert analytic.fp8_weight_bytes(1.0, "mxfp8", non_tn_gemm=True) == analytic.fp8_weight_bytes(1.0, "mxfp8")
    assert analytic.fp8_weight_bytes(1.0, "blockwise", non_tn_gemm=True) == 2.0
    job = _fp8_job(fp8_recipe="tensorwise")
    assert fp8_state_bytes(job, 1000.0, gpu=cat.get("B200")) == 1000.0
    assert fp8_state_bytes(job, 1000.0, gpu=h100) == fp8_state_bytes(job, 1000.0) == 2000.0
    # --fp8-param-gather: the FP8 weight replaces the 16-bit one, a byte below it on Blackwell
    gather = dc.replace(job, fp8_param_gather=True)
    assert fp8_state_bytes(gather, 1000.0, gpu=cat.get("GB300")) == -1000.0
    assert fp8_state_bytes(gather, 1000.0, gpu=h100) == 0.0


@pytest.mark.parametrize("fp8_recipe, saved_per_param", [("tensorwise", 1.0), ("delayed", 1.0), ("mxfp8", 0.0)])
def test_a_blackwell_stage_holds_one_byte_less_per_layer_parameter_than_a_hopper_stage(fp8_recipe, saved_per_param):
    """The memory model's difference: the same plan on B200 and on H100 holds the same
    16-bit weights, gradients and optimizer shards; with per-tensor FP8 the B200 stage holds
    one byte per layer parameter less (no transposed FP8 weight), with MXFP8 the same."""
    from memx_hpc.model import analytic
    from memx_hpc.model.compose import predict_plan
    from memx_hpc.spec import Plan, Stage
    job = _fp8_job(fp8_recipe=fp8_recipe)
    plan = Plan(tp=4, dp=2, micro_batch_size=1, global_batch_size=64,
                stages=(Stage(partition="gpu_a100", num_layers=32),))
    layers = analytic.stage_params(job.model, 32, first=True, last=True, tp=4, pp=1) - \
        analytic.stage_params(job.model, 0, first=True, last=True, tp=4, pp=1)
    hopper, blackwell = (predict_plan(plan, site, job, AnalyticCostModel(site)).stages[0]
                         for site in (_fp8_site("H100-SXM"), _fp8_site("B200")))
    assert hopper.state_bytes - blackwell.state_bytes == pytest.approx(saved_per_param * layers, rel=1e-6)


def test_render_gives_megatron_the_fp8_recipe_and_refuses_where_it_cannot_run():
    from memx_hpc.slurm.render import render
    from memx_hpc.spec import Plan, Stage
    job = _fp8_job(fp8_recipe="delayed")
    plan = Plan(tp=4, dp=2, micro_batch_size=1, global_batch_size=64, stages=(Stage(partition="gpu_a100", num_layers=32),))
    text = render(plan, _fp8_site(), job)
    assert "--fp8-format hybrid" in text and "--fp8-recipe delayed" in text and "--bf16" in text
    assert "--transformer-impl transformer_engine" in text
    # an MI300X partition trains with the local spec unless it says Transformer Engine
    amd = _fp8_site(mi250x_as="MI300X")
    mi = Plan(tp=4, dp=2, micro_batch_size=1, global_batch_size=64, stages=(Stage(partition="gpu_mi250x", num_layers=32),))
    with pytest.raises(SpecError) as e:
        render(mi, amd, job)
    assert e.value.field == "fp8" and "transformer_impl: transformer_engine" in str(e.value)
    te = dataclasses.replace(amd, partitions=tuple(dataclasses.replace(p, transformer_impl="transformer_engine")
                                                   if p.name == "gpu_mi250x" else p for p in amd.partitions))
    assert "--fp8-format hybrid" in render(mi, te, job)
    # a cross-vendor pipeline runs the project's local-spec entry
    both = Plan(tp=4, dp=2, micro_batch_size=1, global_batch_size=64,
                stages=(Stage(partition="gpu_a100", num_layers=16), Stage(partition="gpu_mi250x", num_layers=16)))
    with pytest.raises(SpecError) as e:
        render(both, te, job)
    assert e.value.field == "fp8" and "cross-vendor" in str(e.value)
    # CPU devices: no Transformer Engine
    local, tiny = load_site(ROOT / "site_configs" / "local.yaml"), load_job(ROOT / "jobs" / "tiny-gpt.yaml")
    cpu_site = dataclasses.replace(local, gpu_types=tuple(dataclasses.replace(g, peak_tflops_fp8=1.0)
                                                          for g in local.gpu_types))
    small = Plan(tp=1, dp=1, micro_batch_size=1, global_batch_size=tiny.global_batch_size,
                 stages=(Stage(partition=local.partitions[0].name, num_layers=tiny.model.num_layers),))
    with pytest.raises(SpecError) as e:
        render(small, cpu_site, dataclasses.replace(tiny, precision="bf16", fp8="hybrid"))
    assert e.value.field == "fp8" and "CPU" in str(e.value)


def test_the_planner_says_where_fp8_runs_and_where_its_times_come_from():
    site, job = _fp8_site(), _fp8_job()
    notes = precision_notes(site, job)
    assert any("MI250X-GCD, V100-32 have no FP8 units" in n for n in notes)
    assert any("FP8 layer times on H100-SXM" in n and "roofline" in n for n in notes)
    assert not any("fp8" in n for n in precision_notes(site, _fp8_job("none")))


def test_a_dropout_free_model_keeps_no_dropout_masks():
    """hidden_dropout 0 (the Llama-family Bridge recipes): each layer not fully recomputed
    keeps 2·s·b·h mask bytes fewer (divided by TP under sequence parallelism), the embedding
    s·b·h fewer; a fully recomputed layer and the state do not move; the renderer passes
    --hidden-dropout to Megatron where it is not Megatron-LM's 0.1."""
    from memx_hpc.model.compose import predict_plan
    from memx_hpc.model.compose import in_flight_units
    from memx_hpc.slurm.render import render
    from memx_hpc.spec import Plan, Recompute, Stage
    site = _fp8_site()
    model = AnalyticCostModel(site)
    job = _fp8_job("none")
    free = dataclasses.replace(job, model=dataclasses.replace(job.model, hidden_dropout=0.0))
    m = job.model
    for rec, layer_masks in ((Recompute(), 2), (Recompute(mode="full"), 0)):
        plan = Plan(tp=4, dp=1, micro_batch_size=2, global_batch_size=64, sequence_parallel=True,
                    stages=(Stage(partition="gpu_a100", num_layers=16, recompute=rec),
                            Stage(partition="gpu_a100", num_layers=16, recompute=rec)))
        a, b = predict_plan(plan, site, job, model).stages[0], predict_plan(plan, site, free, model).stages[0]
        sbh = m.seq_length * 2 * m.hidden_size / 4
        units = float(in_flight_units(2, 0, 32))
        # under full recompute the one layer rebuilt during the backward has no masks either
        want = units * (16 * layer_masks * sbh + sbh) + (2 * sbh if rec.mode == "full" else 0)
        assert a.activation_bytes - b.activation_bytes == pytest.approx(want, rel=1e-6)
        assert a.state_bytes == b.state_bytes
    plan = Plan(tp=4, dp=2, micro_batch_size=1, global_batch_size=64, stages=(Stage(partition="gpu_a100", num_layers=32),))
    assert "--hidden-dropout 0.0" in render(plan, site, free) and "--hidden-dropout" not in render(plan, site, job)
    with pytest.raises(SpecError):
        dataclasses.replace(job.model, hidden_dropout=1.0)


# --------------------------------------------------------------------------- FP8 searched

H100_64 = ROOT / "site_configs" / "example-h100-64.yaml"


def _searched_job(**kw):
    return job_from_mapping({"model": "GPT-3-6.7B", "global_batch_size": 64, "fp8": ["none", "hybrid"],
                             "fp8_recipe": "tensorwise", **kw})


def test_a_job_may_ask_the_search_to_choose_fp8_and_old_jobs_keep_their_meaning():
    job = _searched_job()
    assert (job.fp8, job.fp8_search, job.fp8_recipe) == ("", "hybrid", "tensorwise")
    assert job_from_mapping({"model": "GPT-3-2.7B", "global_batch_size": 64, "fp8": ["e4m3", "none"]}).fp8_search \
        == "e4m3"
    for old in ("hybrid", "none", False, None):
        j = job_from_mapping({"model": "GPT-3-2.7B", "global_batch_size": 64, "fp8": old})
        assert j.fp8_search == "" and j.fp8 == ("hybrid" if old == "hybrid" else "")
    assert _searched_job(fp8_param_gather=True).fp8_param_gather
    for bad in (["hybrid", "e4m3"], ["none"], ["none", "none"], ["none", "e5m2"], ["none", 8], [], "search",
                ["none", "hybrid", "e4m3"]):
        with pytest.raises(SpecError) as e:
            job_from_mapping({"model": "GPT-3-2.7B", "global_batch_size": 64, "fp8": bad})
        assert e.value.field == "fp8", bad
    with pytest.raises(SpecError) as e:
        _searched_job(precision="fp32")
    assert e.value.field == "fp8"
    with pytest.raises(SpecError) as e:
        dataclasses.replace(_searched_job(), fp8="e4m3")  # one way only
    assert e.value.field == "fp8"


def test_a_plan_states_its_fp8_and_job_for_plan_gives_the_job_as_it_runs():
    from memx_hpc.spec import Plan, Stage, job_for_plan
    job = _searched_job(fp8_param_gather=True)
    base = dict(tp=1, dp=8, micro_batch_size=1, global_batch_size=64, stages=(Stage(partition="h100", num_layers=32),))
    fp8 = job_for_plan(job, Plan(**base, fp8="hybrid", fp8_recipe="delayed"))
    assert (fp8.fp8, fp8.fp8_search, fp8.fp8_recipe, fp8.fp8_param_gather) == ("hybrid", "", "delayed", True)
    plain = job_for_plan(job, Plan(**base, fp8=""))
    assert (plain.fp8, plain.fp8_search, plain.fp8_param_gather) == ("", "", False)
    # a plan that states nothing runs as the job says (the job without a plan is 16-bit)
    assert job_for_plan(job, Plan(**base)).fp8 == ""
    fixed = _fp8_job()
    assert job_for_plan(fixed, Plan(**base)) is fixed and job_for_plan(fixed, Plan(**base, fp8="")).fp8 == ""
    for bad in ({"fp8": "e5m2"}, {"fp8_recipe": "nvfp4"}, {"fp8": "none"}):
        with pytest.raises(SpecError) as e:
            Plan(**base, **bad)
        assert e.value.field == next(iter(bad))


def test_a_plan_file_round_trips_its_fp8_and_an_old_one_reads_as_the_jobs():
    from memx_hpc.planfile import plan_from_mapping, plan_to_dict
    from memx_hpc.spec import Plan, Stage
    base = dict(tp=2, dp=4, micro_batch_size=1, global_batch_size=64, stages=(Stage(partition="h100", num_layers=32),))
    for plan in (Plan(**base, fp8="e4m3", fp8_recipe="blockwise"), Plan(**base, fp8=""), Plan(**base)):
        d = plan_to_dict(plan)
        assert plan_from_mapping(json_round(d)) == plan
    assert plan_to_dict(Plan(**base, fp8=""))["fp8"] == "none"
    old = plan_to_dict(Plan(**base))
    assert "fp8" not in old and "fp8_recipe" not in old
    for bad in ({"fp8": "e5m2"}, {"fp8": ""}, {"fp8": 8}, {"fp8_recipe": "nvfp4"}):
        with pytest.raises(SpecError) as e:
            plan_from_mapping({**old, **bad})
        assert e.value.field == next(iter(bad)), bad


def json_round(d):
    import json
    return json.loads(json.dumps(d))


@pytest.fixture(scope="module")
def fp8_searched(tmp_path_factory):
    """One search of a 6.7B model with FP8 searched on 64 H100s (datasheet numbers, the
    reference profiles: no profiling)."""
    from memx_hpc.planner import PlanRequest, plan
    from memx_hpc.search.space import SpaceOptions
    tmp = tmp_path_factory.mktemp("fp8")
    site = load_site(H100_64)
    job = _searched_job()
    return plan(PlanRequest(site=site, job=job, store=tmp / "store.h5", out_dir=tmp / "out", top_k=8,
                            space=SpaceOptions(max_pipeline_stages=2), progress=False, mpi="off"))


def test_the_search_ranks_plans_of_both_precisions_and_prices_fp8_from_the_plan(fp8_searched):
    from memx_hpc.model.compose import predict_plan
    from memx_hpc.planfile import load_plan
    from memx_hpc.search.space import PlanSpace
    r = fp8_searched
    site, job, result = r.site, r.job, r.search
    seen = {s.plan.fp8 for s in result.top + result.time_top + result.recommended_top}
    assert seen == {"", "hybrid"}
    assert all(s.plan.fp8_recipe == ("tensorwise" if s.plan.fp8 else None) for s in result.time_top)
    for ranking in (result.top, result.time_top, result.recommended_top):
        assert [s.rank for s in ranking] == list(range(1, len(ranking) + 1))
        assert len({s.index for s in ranking}) == len(ranking)
    times = [s.prediction.iteration_ms for s in result.time_top]
    assert times == sorted(times) and result.time_top[0].time_rank == 1
    assert [s.score for s in result.top] == sorted((s.score for s in result.top), reverse=True)
    # the same plan in FP8 is faster: a 6.7B model's GEMMs dominate its layers
    for s in result.time_top:
        twin = (dataclasses.replace(s.plan, fp8="", fp8_recipe=None) if s.plan.fp8 else
                dataclasses.replace(s.plan, fp8="hybrid", fp8_recipe="tensorwise"))
        other = predict_plan(twin, site, job, r.cost_model)
        fast, slow = (s.prediction, other) if s.plan.fp8 else (other, s.prediction)
        assert fast.iteration_ms < slow.iteration_ms
    # predict from the plan (what `predict` does with a plan file) equals the search's price
    for s in result.recommended_top[:4] + result.time_top[:4]:
        again = predict_plan(s.plan, site, job, r.cost_model)
        assert again.iteration_ms == pytest.approx(s.prediction.iteration_ms, rel=1e-9)
        assert again.max_utilisation == pytest.approx(s.prediction.max_utilisation, rel=1e-9)
    # the plan files carry the precision
    files = sorted(f for f in r.files if f.endswith(".json") and "/plan-" in f)
    assert {load_plan(f).fp8 for f in files} == {"", "hybrid"}
    # one search per precision, each of the space a fixed-precision job searches
    from memx_hpc.planner.space import launchable_space
    from memx_hpc.search.space import SpaceOptions
    n16 = len(PlanSpace(site, job, launchable_space(site, job, SpaceOptions(max_pipeline_stages=2))[0]))
    assert result.stats.plans == 2 * n16 and result.stats.space["precisions"] == ["bf16", "hybrid"]
    assert any(n.startswith("fp8: [none, hybrid] (recipe tensorwise): each plan searched") for n in r.notes)


def test_the_fp8_pass_leaves_out_partitions_without_fp8_and_cross_vendor_plans(tmp_path):
    """On the cross-vendor example with H100s in place of its A100s, the FP8 pass keeps to
    the H100 partition, the 16-bit pass mixes vendors, and the notes say why."""
    from memx_hpc.planner import PlanRequest, plan
    from memx_hpc.search.space import SpaceOptions
    site = _fp8_site()
    job = job_from_mapping({"model": "GPT-3-2.7B", "global_batch_size": 64, "fp8": ["none", "hybrid"]})
    r = plan(PlanRequest(site=site, job=job, store=tmp_path / "store.h5", write=False, top_k=6,
                         space=SpaceOptions(max_pipeline_stages=2), progress=False, mpi="off"))
    plans = [s.plan for s in r.search.top + r.search.time_top + r.search.recommended_top]
    assert all({st.partition for st in p.stages} == {"gpu_a100"} for p in plans if p.fp8)
    note = next(n for n in r.notes if n.startswith("fp8: [none, hybrid]"))
    assert "left out of the FP8 pass" in note and "gpu_mi250x" in note and "gpu_a100" not in note.split("left out")[1]


def test_rendered_fp8_and_16_bit_plans_carry_their_own_flags(fp8_searched):
    from memx_hpc.slurm.render import render
    r = fp8_searched
    by = {s.plan.fp8: s.plan for s in r.search.time_top + r.search.top}
    fp8_text, plain_text = render(by["hybrid"], r.site, r.job), render(by[""], r.site, r.job)
    assert "--fp8-format hybrid" in fp8_text and "--fp8-recipe tensorwise" in fp8_text
    assert "--fp8-format" not in plain_text and "--fp8-recipe" not in plain_text


def test_predict_of_an_fp8_plan_file_is_the_searchs_price(fp8_searched):
    """``memx-hpc predict`` of the written plan files (one per precision) gives each the price
    the search gave it, and says which precision the plan runs."""
    from memx_hpc.planfile import load_plan
    from memx_hpc.planner.predict import PredictRequest, predict
    r = fp8_searched
    store = r.out_dir.parents[1] / "store.h5"  # the fixture's: out/<run>/ beside store.h5
    assert store.is_file()
    by_plan = {s.plan: s for s in r.search.ranking("recommended")}
    files = [f for f in r.files if "/plan-" in f and f.endswith(".json")]
    done = set()
    for f in files:
        p = load_plan(f)
        if p.fp8 in done or p not in by_plan:
            continue
        done.add(p.fp8)
        got = predict(PredictRequest(site=r.site, job=r.job, plan=f, store=store))
        assert got.prediction.iteration_ms == pytest.approx(by_plan[p].prediction.iteration_ms, rel=1e-9)
        assert any("runs FP8 hybrid (recipe tensorwise)" in n for n in got.notes) is bool(p.fp8)
    assert done == {"", "hybrid"}


def test_simulated_scales_search_both_precisions_too(tmp_path):
    """``memx-hpc simulate`` runs the same search as ``plan`` at each scale: a job that lets
    the search choose FP8 gets plans of both precisions at every scale, the note said once."""
    from memx_hpc.planner import PlanRequest
    from memx_hpc.planner.simulate import simulate_scales
    from memx_hpc.search.space import SpaceOptions
    out = simulate_scales(PlanRequest(site=load_site(H100_64), job=_searched_job(), store=tmp_path / "store.h5",
                                      write=False, top_k=8, space=SpaceOptions(max_pipeline_stages=1),
                                      progress=False, mpi="off"), (64, 128))
    assert len(out.scales) == 2
    for sc in out.scales:
        assert sc.search.stats.space["precisions"] == ["bf16", "hybrid"]
        assert {s.plan.fp8 for s in sc.search.time_top + sc.search.top} == {"", "hybrid"}
    assert sum(n.startswith("fp8: [none, hybrid]") for n in out.notes) == 1
