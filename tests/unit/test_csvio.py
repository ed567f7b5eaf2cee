"""The CSV interchange format: lossless round trip through the store and the CLI, clear errors."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memx_hpc.cli.main import main
from memx_hpc.errors import SpecError
from memx_hpc.profile.csvio import CSV_COLUMNS, read_csv, write_csv
from memx_hpc.profile.store import ProfileStore
from memx_hpc.spec import LayerSample, LayerShape, ProfilePoint, Provenance

SHAPE = LayerShape(hidden_size=2560, num_attention_heads=32, num_query_groups=8, ffn_hidden_size=6912,
                   seq_length=2048, vocab_size=50257, activation="swiglu")


def tricky() -> list[LayerSample]:
    p = ProfilePoint(gpu_type="A100-80", kind="layer", shape=SHAPE, tp=2, micro_batch_size=4, recompute="selective",
                     precision="bf16", attention="core")
    q = ProfilePoint(gpu_type="MI250X-GCD", kind="p2p", shape=SHAPE, group_size=2,
                     message_bytes=2**31 + 3, inter_node=True)
    return [
        LayerSample(point=p, forward_ms=0.1 + 0.2, backward_ms=1e-300, update_ms=123456789.123456789,
                    activation_bytes=2**53 + 1, peak_allocated_bytes=7, peak_reserved_bytes=8,
                    device_footprint_bytes=9, origin="imported", source="sailor:profiles/x.json",
                    provenance=Provenance.of({"line\nbreak": "a,b", "q": "\"", "u": "é✓"}), weight=0.3),
        LayerSample(point=q, forward_ms=5e-324, infeasible=True, origin="augmented", weight=1 / 3,
                    source="MI250X GCD, \"odd\" name"),  # GPU names are safe names; free text sits here
    ]


def test_round_trip_is_lossless(tmp_path):
    samples = tricky()
    assert write_csv(samples, tmp_path / "a.csv") == 2
    back = read_csv(tmp_path / "a.csv")
    assert back == samples  # dataclass equality: every field, floats bit for bit
    header = (tmp_path / "a.csv").read_text(encoding="utf-8").splitlines()[0].split(",")
    assert tuple(header) == CSV_COLUMNS and "forward_ms" in header and "activation_bytes" in header


# any value a sample may hold (times and weights are never negative; see LayerSample)
_ms = st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False, width=64)
_weight = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=40, deadline=None)
@given(fwd=_ms, bwd=_ms, w=_weight, act=st.integers(0, 2**62), text=st.text(max_size=30))
def test_round_trip_any_values(tmp_path_factory, fwd, bwd, w, act, text):
    d = tmp_path_factory.mktemp("h")
    p = ProfilePoint(gpu_type="V100-32", kind="head", shape=SHAPE, micro_batch_size=3)
    s = LayerSample(point=p, forward_ms=fwd, backward_ms=bwd, weight=w, activation_bytes=act, source=text,
                    provenance=Provenance.of({"t": text}))
    write_csv([s], d / "x.csv")
    assert read_csv(d / "x.csv") == [s]


def test_store_export_import_via_cli(tmp_path, capsys):
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    ProfileStore(a).append(tricky())
    assert main(["profile", "export", "--store", str(a), "--csv", str(tmp_path / "x.csv")]) == 0
    assert main(["profile", "import", "--store", str(b), "--format", "csv", str(tmp_path / "x.csv")]) == 0
    assert ProfileStore(b).content_hash() == ProfileStore(a).content_hash()
    # importing again adds nothing (exact duplicates)
    capsys.readouterr()
    assert main(["profile", "import", "--store", str(b), str(tmp_path / "x.csv"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["added"] == 0 and out["duplicates_skipped"] == 2


def test_minimal_columns_take_defaults(tmp_path):
    f = tmp_path / "m.csv"
    f.write_text("kind,gpu_type,hidden_size,num_attention_heads,num_query_groups,ffn_hidden_size,seq_length,"
                 "vocab_size,forward_ms\nlayer,T4,1024,16,16,4096,2048,50272,12.5\n", encoding="utf-8")
    (s,) = read_csv(f)
    assert s.point.tp == 1 and s.point.recompute == "none" and s.origin == "measured" and s.forward_ms == 12.5
    assert s.provenance == Provenance() and s.weight == 1.0


@pytest.mark.parametrize("text,match", [
    ("", "empty file"),
    ("kind,gpu_type,colour\n", "unknown column"),
    ("kind,gpu_type\nlayer,T4\n", "required column"),
    ("gpu_type,kind,hidden_size,num_attention_heads,num_query_groups,ffn_hidden_size,seq_length,vocab_size\n"
     "T4,layer,1024,16,16,4096,2048,lots\n", "line 2: vocab_size"),
    ("gpu_type,kind,hidden_size,num_attention_heads,num_query_groups,ffn_hidden_size,seq_length,vocab_size\n"
     "T4,sideways,1024,16,16,4096,2048,5\n", "unknown sample kind"),
    ("gpu_type,kind,hidden_size,num_attention_heads,num_query_groups,ffn_hidden_size,seq_length,vocab_size,"
     "provenance\nT4,layer,1024,16,16,4096,2048,5,not json\n", "provenance must be JSON"),
    ("gpu_type,kind,hidden_size,num_attention_heads,num_query_groups,ffn_hidden_size,seq_length,vocab_size\n"
     "T4,layer,1024,16\n", "4 cells for 8 columns"),
])
def test_bad_csv_names_file_line_and_column(tmp_path, text, match):
    f = tmp_path / "bad.csv"
    f.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError, match=match) as e:
        read_csv(f)
    assert str(f) in str(e.value)


def test_cli_reports_bad_csv_without_traceback(tmp_path, capsys):
    f = tmp_path / "bad.csv"
    f.write_text("kind,gpu_type,colour\n", encoding="utf-8")
    assert main(["profile", "import", "--store", str(tmp_path / "s.h5"), str(f)]) == 1
    err = capsys.readouterr().err
    assert "unknown column" in err and "Traceback" not in err
