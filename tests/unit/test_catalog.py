"""The built-in catalog: capacities as devices report them, each with its source."""

from __future__ import annotations

import pytest

from memx_hpc.spec.catalog import catalog
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
                                       ("H200", 143771), ("B200", 183359), ("GB200", 189471), ("T4", 15360),
                                       ("GB300", 284208), ("B300", 275040)])
def test_binary_sizes_as_nvidia_smi_reports_them(name, mib):
    """memory.total in MiB / 1024, not the datasheet's GB x 1e9 / 2^30 (7 % lower)."""
    assert catalog().get(name).memory_gib == pytest.approx(mib / 1024, abs=0.01)


@pytest.mark.parametrize("name, mib", [("GB300", 284208), ("B300", 275040)])
def test_blackwell_ultra_memory_is_the_device_report_with_its_source(name, mib):
    """GB300 and B300 report 277.6 and 268.6 GiB (nvidia-smi memory.total), not the decimal
    reading of a third-party per-GPU listing (259.8 / 251.5 GiB), which leaves out 18 and
    17 GiB that plans run on these parts do use. The entry names the report it comes from."""
    g = catalog().get(name)
    assert g.memory_gib == pytest.approx(mib / 1024, abs=0.01)
    mem = g.source.split("memory:")[1]
    assert "nvidia-smi" in mem and f"{mib} MiB" in mem, name
    assert "no device report cited" not in mem, name


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


#: Parts with fp8 matrix units (Hopper, Ada, Blackwell, CDNA 3/4) and parts without (Volta,
#: Turing, Ampere, CDNA 2, Pascal): an fp8 rate on the second set, or none on the first, is a
#: catalog error, not a choice.
FP8_PARTS = ("H100-SXM", "H100-NVL", "H200", "GH200", "B200", "GB200", "GB300", "B300", "L40S", "L4",
             "MI300X", "MI325X", "MI350X", "MI355X")
NO_FP8_PARTS = ("V100-16", "V100-32", "V100-PCIE-16", "A100-40", "A100-80", "A10G", "A6000", "T4", "P100", "P40", "RTX-2080",
                "RTX-3090", "Titan-RTX", "MI210", "MI250X-GCD")


@pytest.mark.parametrize("name", FP8_PARTS)
def test_fp8_parts_have_a_dense_fp8_rate_twice_their_bf16(name):
    """Dense fp8 is twice dense bf16 on every part that has it; a ratio of 4 (sparse fp8
    beside dense bf16) or 1 (sparse bf16 beside dense fp8) would mean a mixed-up figure."""
    g = catalog().get(name)
    assert 1.95 <= g.peak_tflops_fp8 / g.peak_tflops_bf16 <= 2.05, (name, g.peak_tflops_fp8, g.peak_tflops_bf16)


@pytest.mark.parametrize("name", NO_FP8_PARTS)
def test_parts_without_fp8_units_have_no_fp8_rate(name):
    assert catalog().get(name).peak_tflops_fp8 == 0.0


def test_every_catalog_type_is_classed_for_fp8():
    names = {g.name for g in catalog() if not g.measured_at_profile_time}
    assert names == set(FP8_PARTS) | set(NO_FP8_PARTS)


@pytest.mark.parametrize("name", ("GB200", "GB300", "B300", "B200", "MI350X", "MI355X"))
def test_current_recipe_gpus_cite_a_datasheet_by_url_and_say_how_sparse_figures_were_read(name):
    g = catalog().get(name)
    assert "datasheet" in g.source and ("nvidia.com" in g.source or "amd.com" in g.source), name
    # every figure is dense: a source that starts from a sparse figure says it halved it
    if "sparsity" in g.source:
        assert "halved" in g.source, name
    # memory: a device report, or the entry says there is none and holds a lower bound
    mem = g.source.split("memory:")[1]
    assert "nvidia-smi" in mem or "rocm-smi" in mem or "amd-smi" in mem or "report cited" in mem, name


def test_lower_bound_memory_never_exceeds_the_capacity_the_datasheet_states():
    """An entry without a device report reads the datasheet's GB as decimal (or the vendor's
    own GiB table), and a device report is below it too (the part keeps some back): never
    above the binary reading of the stated capacity."""
    for name, stated_gb in (("GB300", 288), ("B300", 288), ("MI350X", 288), ("MI355X", 288)):
        assert catalog().get(name).memory_gib <= stated_gb, name


def test_every_gpu_states_how_it_is_built_into_a_node():
    """module (SXM / OAM / superchip) or card (PCIe): the transfer model's power term reads it."""
    for g in catalog():
        if g.measured_at_profile_time:
            continue
        assert g.form_factor in ("module", "card"), g.name
    for name in ("V100-16", "A100-80", "H100-SXM", "H200", "GH200", "B200", "GB200", "MI250X-GCD", "MI300X", "MI355X"):
        assert catalog().get(name).form_factor == "module", name
    for name in ("V100-PCIE-16", "H100-NVL", "L4", "T4", "L40S", "A10G", "RTX-3090", "MI210"):
        assert catalog().get(name).form_factor == "card", name
    with pytest.raises(SpecError, match="form_factor"):
        GpuType.from_mapping({"vendor": "nvidia", "memory_gib": 80, "peak_tflops_bf16": 989, "peak_tflops_fp32": 67,
                              "hbm_gbytes_per_s": 3350, "link_gbytes_per_s": 450, "form_factor": "sxm"}, "gpu_types.X",
                             name="X")
