"""Bandwidth fields say their unit: *_gbytes_per_s (GB/s). The *_gbps names they had
(which read as gigabits to anyone used to network figures) are still read, with a
deprecation warning naming the new one; both at once is refused."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml

from memx_hpc.errors import SpecError
from memx_hpc.spec import RENAMED_RATE_FIELDS, DeprecatedField, load_site, site_from_mapping

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["example-cross-vendor.yaml", "local.yaml"])
def test_shipped_sites_use_the_new_names_without_warnings(name):
    text = (ROOT / "site_configs" / name).read_text()
    assert not any(f"{old}:" in text for old in RENAMED_RATE_FIELDS.values())
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecatedField)
        load_site(ROOT / "site_configs" / name)


def _old_names(d):
    for p in d["partitions"]:
        if "inter_node_gbytes_per_s" in p:
            p["inter_node_gbps"] = p.pop("inter_node_gbytes_per_s")
    d["inter_partition_gbps"] = d.pop("inter_partition_gbytes_per_s")
    d["links"] = [{"between": ["gpu_a100", "gpu_v100"], "gbps": 7}]
    return d


def test_old_names_are_read_with_a_deprecation_note():
    d = yaml.safe_load((ROOT / "site_configs" / "example-cross-vendor.yaml").read_text())
    new = site_from_mapping(yaml.safe_load((ROOT / "site_configs" / "example-cross-vendor.yaml").read_text()))
    with pytest.warns(DeprecatedField, match=r"partitions\[0\]\.inter_node_gbps: read as inter_node_gbytes_per_s"):
        old = site_from_mapping(_old_names(d))
    assert old.partitions[0].inter_node_gbps == new.partitions[0].inter_node_gbps == 25
    assert old.inter_partition_gbps == new.inter_partition_gbps and old.links[0].gbps == 7


def test_both_names_at_once_are_refused():
    d = yaml.safe_load((ROOT / "site_configs" / "example-cross-vendor.yaml").read_text())
    d["partitions"][0]["inter_node_gbps"] = 200  # the gigabit figure typed under the old name
    with pytest.raises(SpecError, match=r"partitions\[0\]\.inter_node_gbytes_per_s: given twice"):
        site_from_mapping(d)


def test_a_bad_value_is_named_as_the_file_spells_it():
    d = yaml.safe_load((ROOT / "site_configs" / "example-cross-vendor.yaml").read_text())
    d["partitions"][0]["inter_node_gbytes_per_s"] = 0
    with pytest.raises(SpecError, match=r"partitions\[0\]\.inter_node_gbytes_per_s"):
        site_from_mapping(d)


def test_site_discover_writes_the_new_names():
    """A GPU type site discover writes reads back under the new names, without a warning."""
    from memx_hpc import sitegen
    from memx_hpc.spec.catalog import catalog
    from memx_hpc.spec import GpuType
    lines = sitegen._gpu_type_lines(catalog().get("H100-SXM"))
    text = "\n".join(lines)
    assert "hbm_gbytes_per_s:" in text and "link_gbytes_per_s:" in text and "_gbps:" not in text
    data = yaml.safe_load("gpu_types:\n" + text)["gpu_types"]
    (name, body), = data.items()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecatedField)
        g = GpuType.from_mapping(body, f"gpu_types.{name}", name=name)
    assert g.hbm_gbps == catalog().get("H100-SXM").hbm_gbps
