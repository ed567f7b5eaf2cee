"""memx-hpc status reports what is in place, from an empty store to a filled one."""

from __future__ import annotations

import json
from pathlib import Path

from memx_hpc.cli.main import main
from memx_hpc.profile.store import ProfileStore
from memx_hpc.spec import LayerSample, LayerShape, ProfilePoint

ROOT = Path(__file__).resolve().parents[2]
SITE = str(ROOT / "site_configs/local.yaml")


def test_status_of_an_empty_then_filled_store(tmp_path, capsys):
    store = tmp_path / "s.h5"
    assert main(["status", "--site", SITE, "--store", str(store), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["store_summary"] == [] and out["predictor"] is None and out["e2e_runs"] == 0
    assert out["cache"] == str(store.with_suffix(".cache.sqlite"))
    shape = LayerShape(hidden_size=64, num_attention_heads=4, num_query_groups=4, ffn_hidden_size=256,
                       seq_length=32, vocab_size=100)
    samples = [LayerSample(point=ProfilePoint(gpu_type="cpu-4g", kind="layer", shape=shape, micro_batch_size=m),
                           forward_ms=1.0 * m, backward_ms=2.0 * m, activation_bytes=1000 * m)
               for m in (1, 2, 4)]
    assert ProfileStore(store).append(samples) == 3
    assert main(["status", "--site", SITE, "--store", str(store), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["gpu_type"]: r for r in out["store_summary"]}
    assert set(rows) == {"cpu-4g"}
    assert main(["status", "--site", SITE, "--store", str(store)]) == 0
    text = capsys.readouterr().out
    assert "cpu-4g" in text and "end-to-end runs measured on this site: 0" in text


def test_status_and_profile_ls_say_which_of_the_sites_gpu_types_have_data(tmp_path, capsys):
    """Per GPU type of the site: where its numbers come from and the expected memory error."""
    from memx_hpc.model.api import Basis
    from memx_hpc.search.objective import table_band
    site = str(ROOT / "site_configs/example-cross-vendor.yaml")
    store = tmp_path / "s.h5"
    shape = LayerShape(hidden_size=64, num_attention_heads=4, num_query_groups=4, ffn_hidden_size=256,
                       seq_length=32, vocab_size=100)
    samples = [LayerSample(point=ProfilePoint(gpu_type="A100-80", kind="layer", shape=shape, micro_batch_size=m),
                           forward_ms=1.0 * m, backward_ms=2.0 * m, activation_bytes=1000 * m, origin="imported")
               for m in (1, 2)]
    samples.append(LayerSample(point=ProfilePoint(gpu_type="V100-16", kind="layer", shape=shape, micro_batch_size=1),
                               forward_ms=1.0, backward_ms=2.0, activation_bytes=1000, origin="imported"))
    assert ProfileStore(store).append(samples) == 3
    assert main(["status", "--site", site, "--store", str(store), "--json"]) == 0
    rows = {r["gpu_type"]: r for r in json.loads(capsys.readouterr().out)["site_gpu_types"]}
    assert list(rows) == ["A100-80", "MI250X-GCD", "V100-32"]
    assert rows["A100-80"]["data"] == "imported" and rows["A100-80"]["samples"] == 2
    assert rows["MI250X-GCD"]["data"] == "datasheet-only" and rows["MI250X-GCD"]["samples"] == 0
    assert rows["V100-32"]["via"] == "V100-16" and rows["V100-32"]["data"] == "imported"
    assert rows["MI250X-GCD"]["memory_error"] == table_band("x", Basis(kind="datasheet-only")).fraction
    assert rows["MI250X-GCD"]["memory_error"] > rows["A100-80"]["memory_error"]
    assert main(["status", "--site", site, "--store", str(store)]) == 0
    text = capsys.readouterr().out
    assert "MI250X-GCD" in text and "datasheet-only" in text and "same chip as V100-16" in text
    assert main(["profile", "ls", "--site", site, "--store", str(store)]) == 0
    text = capsys.readouterr().out
    assert "the GPU types of site example-cross-vendor" in text and "MI250X-GCD" in text
    assert max(len(line) for line in text.splitlines()) <= 120
