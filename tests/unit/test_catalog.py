"""The built-in catalog: capacities as devices report them, each with its source."""

from __future__ import annotations

import pytest

from memx_hpc.catalog import catalog
from memx_hpc.errors import SpecError
from memx_hpc.spec import GpuType


def test_every_gpu_says_where_its_memory_figure_comes_from():
    for g in catalog():
        if g.measured_at_profile_time:
            continue
        assert "memory:" in g.source, g.name
        assert 0.5 <= g.usable_fraction <= 1.0, g.name
        assert g.capacity_bytes == int(g.memory_gib * g.usable_fraction * 2**30)
        assert g.capacity_bytes <= g.memory_bytes


@pytest.mark.parametrize("name, mib", [("A100-80", 81920), ("A100-40", 40960), ("H100-SXM", 81559),
                                       ("H200", 143771), ("B200", 183359), ("GB200", 189471), ("T4", 15360)])
def test_binary_sizes_as_nvidia_smi_reports_them(name, mib):
    """memory.total in MiB / 1024, not the datasheet's GB x 1e9 / 2^30 (7 % lower)."""
    assert catalog().get(name).memory_gib == pytest.approx(mib / 1024, abs=0.01)


def test_current_recipe_gpus_are_in_the_catalog_with_fp8_rates():
    for name in ("GB200", "GB300", "B300", "MI350X", "MI355X"):
        g = catalog().get(name)
        assert g.peak_tflops_fp8 >= 2 * g.peak_tflops_bf16 * 0.99, name
        assert g.tdp_w >= 1000 and g.hbm_gbps >= 7000, name
    assert catalog().get("MI250X-GCD").peak_tflops_fp8 == 0.0  # CDNA 2 has no fp8 units


def test_usable_fraction_is_checked():
    g = catalog().get("A100-80")
    import dataclasses
    with pytest.raises(SpecError, match="usable_fraction"):
        dataclasses.replace(g, usable_fraction=99.0)  # a percentage, not a fraction
    with pytest.raises(SpecError, match="usable_fraction"):
        GpuType.from_mapping({"vendor": "nvidia", "memory_gib": 16, "peak_tflops_bf16": 1, "peak_tflops_fp32": 1,
                              "hbm_gbytes_per_s": 1, "link_gbytes_per_s": 1, "usable_fraction": 0.1}, "gpu_types.X", name="X")
