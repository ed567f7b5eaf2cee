"""Importers of the shared real measurements (Sailor, Cephalo; MIT licence) in ../shared/data/.

Expected counts are computed here from the raw files, independently of the importer.
"""

from __future__ import annotations

import csv
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from memx_hpc.spec.catalog import preset
from memx_hpc.datapaths import shared_data
from memx_hpc.errors import SpecError
from memx_hpc.model import analytic as A
from memx_hpc.profile.importers import SAILOR_MODELS, import_cephalo, import_sailor
from memx_hpc.spec import ModelSpec

DATA = shared_data()
SAILOR = DATA / "sailor"
CEPHALO = DATA / "cephalo" / "model_latencies.json"


def _sailor_expected() -> tuple[int, int]:
    """(samples, skipped files): three samples (embedding, layer, head) per (mbs, tp) of every
    profile whose layer count fits its model; GPT-Neo-2.7/GH-96 is a copy of OPT-350's."""
    n = skipped = 0
    for f in sorted((SAILOR / "profiles").glob("*/*/profile.json")):
        d = json.loads(f.read_text())
        need = SAILOR_MODELS[f.parent.parent.name][1] + 2
        if min(len(layers) for by_tp in d.values() for layers in by_tp.values()) < need:
            skipped += 1
            continue
        n += 3 * sum(len(by_tp) for by_tp in d.values())
    return n, skipped


def test_sailor_counts_units_and_gpu_names():
    skipped: list[str] = []
    samples = import_sailor(SAILOR, skipped=skipped)
    n, n_skipped = _sailor_expected()
    assert len(samples) == n and len(skipped) == n_skipped == 1
    assert "GPT-Neo-2.7/GH-96" in skipped[0]
    assert {s.point.gpu_type for s in samples} == {"A100-40", "A100-80", "GH200", "V100-16", "RTX-2080",
                                                   "RTX-3090", "Titan-RTX"}
    assert all(s.origin == "imported" and s.source.startswith("sailor:profiles/") for s in samples)
    # seconds -> ms: OPT-350 on A100-40, mbs 1, tp 2, embedding row is [0.000824, 4e-06, 0.001504]
    raw = json.loads((SAILOR / "profiles/OPT-350/A100-40/profile.json").read_text())["1"]["2"]
    emb = [s for s in samples if s.source.endswith("OPT-350/A100-40/profile.json") and s.point.kind == "embedding"
           and s.point.micro_batch_size == 1 and s.point.tp == 2]
    assert len(emb) == 1 and emb[0].forward_ms == pytest.approx(raw["0"][0] * 1e3)
    assert emb[0].update_ms == pytest.approx(raw["0"][2] * 1e3)
    # transformer layer: the median over layer ids 1..24
    lay = [s for s in samples if s.source.endswith("OPT-350/A100-40/profile.json") and s.point.kind == "layer"
           and s.point.micro_batch_size == 1 and s.point.tp == 2][0]
    fwds = sorted(raw[str(i)][0] for i in range(1, 25))
    assert lay.forward_ms == pytest.approx((fwds[11] + fwds[12]) / 2 * 1e3)


def test_sailor_activation_bytes_from_llm_info():
    info = json.loads((SAILOR / "llm_info.json").read_text())
    samples = import_sailor(SAILOR)
    s = [x for x in samples if x.source.endswith("OPT-350/V100-16/profile.json") and x.point.kind == "layer"
         and x.point.tp == 4 and x.point.micro_batch_size == 8][0]
    assert s.activation_bytes == 8 * info["OPT-350"]["4"]["1"]["act_mem_bytes"]
    # llm_info has no TP 8 for LLAMA-3-8: unknown, not invented
    llama8 = [x for x in samples if "LLAMA-3-8" in x.source and x.point.tp == 8]
    assert llama8 and all(x.activation_bytes == 0 for x in llama8)


def test_sailor_shapes_reproduce_llm_info_parameter_counts():
    info = json.loads((SAILOR / "llm_info.json").read_text())
    for model, (shape, layers, _) in SAILOR_MODELS.items():
        swiglu = shape.activation == "swiglu"
        spec = ModelSpec(name=model, num_layers=layers, hidden_size=shape.hidden_size,
                         num_attention_heads=shape.num_attention_heads, num_query_groups=shape.num_query_groups,
                         ffn_hidden_size=shape.ffn_hidden_size, vocab_size=shape.vocab_size,
                         seq_length=shape.seq_length, activation=shape.activation,
                         position_embedding="rope" if swiglu else "learned",
                         normalization="rmsnorm" if swiglu else "layernorm", add_bias_linear=True)
        for tp, layers_info in info[model].items():
            assert layers_info["1"]["params_floats"] == A.layer_params(spec, int(tp)), (model, tp)
            assert layers_info["0"]["params_floats"] == A.embedding_params(spec, int(tp)), (model, tp)


def test_cephalo_counts_match_the_raw_lists():
    raw = json.loads(CEPHALO.read_text())
    expected = Counter()
    for model, by_gpu in raw.items():
        if "vit" in model:
            continue
        for gpu, by_seq in by_gpu.items():
            for seq, by_dtype in by_seq.items():
                for dtype, entry in by_dtype.items():
                    if isinstance(entry, list) and len(entry) == 4 and isinstance(entry[2], list):
                        expected[gpu] += len(entry[2])
    samples = import_cephalo(CEPHALO)
    assert len(samples) == sum(expected.values()) == 3044
    # the flattened CSV that ships beside it agrees (3369 rows, 325 of them vision models)
    rows = list(csv.DictReader(open(DATA / "cephalo" / "layer_latency_long.csv")))
    assert len([r for r in rows if "vit" not in r["model"]]) == len(samples)
    assert len({s.point.gpu_type for s in samples}) == 12
    assert Counter(s.point.gpu_type for s in samples)["A100-40"] == expected["a100x40"]
    one = [s for s in samples if s.source.endswith("deepspeedgpt_1.3b/a6000/512/float32")
           and s.point.micro_batch_size == 3][0]
    assert one.forward_ms == pytest.approx(16.531100000000034) and one.point.precision == "fp32"
    assert one.point.shape.num_attention_heads == 128  # Cephalo's GPT-1.3B has 128 heads of 16
    p40 = {s.point.attention for s in samples if s.point.gpu_type == "P40" and s.point.shape.activation == "swiglu"}
    assert p40 == {"core"}  # Cephalo's Llama runs eager attention on the P40


def test_unknown_gpu_is_a_clear_user_error(tmp_path: Path):
    src = tmp_path / "sailor"
    (src / "profiles" / "OPT-350" / "Z9000").mkdir(parents=True)
    shutil.copy(SAILOR / "llm_info.json", src / "llm_info.json")
    shutil.copy(SAILOR / "profiles/OPT-350/V100-16/profile.json", src / "profiles/OPT-350/Z9000/profile.json")
    with pytest.raises(SpecError, match="Z9000.*not in the catalog") as e:
        import_sailor(src)
    assert "profile.json" in str(e.value)
    ceph = tmp_path / "model_latencies.json"
    ceph.write_text(json.dumps({"deepspeedllama_7b": {"b9000": {"512": {"float16": [[1, 0], [2, 0], [1.0], [2.0]]}}}}))
    with pytest.raises(SpecError, match="b9000"):
        import_cephalo(ceph)


def test_missing_or_malformed_input(tmp_path: Path):
    with pytest.raises(SpecError, match="profiles"):
        import_sailor(tmp_path)
    bad = tmp_path / "model_latencies.json"
    bad.write_text("{not json")
    with pytest.raises(SpecError, match="JSON"):
        import_cephalo(bad)
