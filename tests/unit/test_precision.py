"""Precisions a GPU type's matrix units run natively (catalog data) and what the planner
does with a job in another one."""

from __future__ import annotations

from pathlib import Path

import pytest

from memx_hpc.catalog import catalog, precision_notes
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
