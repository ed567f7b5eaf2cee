"""The dual-output predictor: fit/predict conventions, persistence checks, fit_or_load, baselines."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np
import pytest

from memx_hpc.spec.catalog import catalog
from memx_hpc.datapaths import shared_data
from memx_hpc.errors import SpecError
from memx_hpc.model.api import AnalyticCostModel, CostModel, LayerQuery, analytic_activation_bytes
from memx_hpc.model.baselines import NearestPointScaling
from memx_hpc.model.features import query_of
from memx_hpc.model.predictor import Predictor, error_summary, fit_or_load, samples_hash
from memx_hpc.profile.importers import import_cephalo, import_sailor

CAT = catalog()


@pytest.fixture(scope="module")
def sailor():
    return import_sailor(shared_data() / "sailor")


@pytest.fixture(scope="module")
def cephalo_small():
    c = import_cephalo(shared_data() / "cephalo" / "model_latencies.json")
    return [s for s in c if s.point.micro_batch_size <= 4]


@pytest.fixture(scope="module")
def fitted(sailor, cephalo_small):
    return Predictor(n_estimators=150).fit(sailor + cephalo_small, CAT)


def test_fit_returns_self_and_predicts_in_batches(fitted, sailor):
    assert isinstance(fitted, CostModel)
    qs = [query_of(s) for s in sailor[:50]]
    out = fitted.predict(qs)
    assert out.shape == (50, 2) and out.dtype == np.float64 and np.all(out > 0)
    one = np.vstack([fitted.predict([q]) for q in qs[:5]])
    np.testing.assert_allclose(one, out[:5], rtol=1e-6)
    assert fitted.predict([]).shape == (0, 2)
    assert len(fitted.identity) == 64 and fitted.n_samples_ > len(sailor)  # augmented rows added


def test_fits_its_training_data_closely(fitted, sailor):
    lay = [s for s in sailor if s.point.kind == "layer"]
    pred = fitted.predict([query_of(s) for s in lay])
    t = np.array([s.forward_ms + s.backward_ms for s in lay])
    assert error_summary(pred[:, 0], t)["mape"] < 10
    m = np.array([s.activation_bytes for s in lay])
    ok = m > 0
    assert error_summary(pred[ok, 1], m[ok])["mape"] < 10


def test_unseen_gpu_type_is_estimated_from_its_datasheet(fitted, sailor):
    q = query_of(next(s for s in sailor if s.point.kind == "layer" and s.point.gpu_type == "A100-80"))
    h200 = replace(q, gpu_type="H200")
    p80, p200 = fitted.predict([q, h200])
    assert np.isfinite(p200).all() and p200[0] > 0
    assert p200[0] < p80[0] * 1.5  # an H200 is not much slower than an A100
    assert fitted.provenance("H200") == "datasheet-only"
    assert fitted.provenance("a100x40") == "imported"  # aliases resolve
    assert fitted.overhead_bytes("H200") > 0


def test_datasheet_path_gives_a_newer_part_a_plausible_fraction_of_peak(fitted):
    """A part never profiled, newer than any measured (B200): a dense Llama-3-8B-like layer
    (bf16, TP 1, sequence 8192) runs at a fraction of the datasheet peak the measured chips
    suggest, not at peak. Public Megatron training runs of dense Llama-3 on B200 report
    about 35-50 % model FLOPs utilisation; the band here is wider (a plausibility check)."""
    from memx_hpc.model.api import resolve_gpu, roofline_components
    from memx_hpc.spec import LayerShape
    shape = LayerShape(hidden_size=4096, num_attention_heads=32, num_query_groups=8, ffn_hidden_size=14336,
                       seq_length=8192, vocab_size=128256, activation="swiglu")
    b200 = resolve_gpu(CAT, "B200")
    for mbs in (1, 2):
        q = LayerQuery(gpu_type="B200", kind="layer", shape=shape, tp=1, micro_batch_size=mbs, recompute="none",
                       precision="bf16", attention="sdpa")
        t = fitted.predict([q])[0, 0]
        mfu = roofline_components(q, b200)["flops"] / (t * 1e-3) / (b200.peak_tflops("bf16") * 1e12)
        assert 0.25 < mfu < 0.65, (mbs, t, mfu)
        assert fitted.explain([q]) == ["datasheet-only"]


def _transfer_ms(fitted, q, g):
    """The transfer model's time for ``q`` on the (possibly edited) GPU type ``g``."""
    import math

    from memx_hpc.model.api import roofline_components
    c = roofline_components(q, g)
    return math.exp(fitted.anchors_.bind(CAT).datasheet(q, g)) * (c["compute_ms"] + c["memory_ms"] + c["comm_ms"])


def _llama8b_query(gpu_type: str, tp: int) -> LayerQuery:
    from memx_hpc.spec import LayerShape
    shape = LayerShape(hidden_size=4096, num_attention_heads=32, num_query_groups=8, ffn_hidden_size=14336,
                       seq_length=8192, vocab_size=128256, activation="swiglu")
    return LayerQuery(gpu_type=gpu_type, kind="layer", shape=shape, tp=tp, micro_batch_size=1, recompute="none",
                      precision="bf16", attention="sdpa", sequence_parallel=tp > 1)


def test_the_transfer_model_prices_every_part_at_least_at_its_roofline(fitted):
    """Cephalo's sdpa series are TP 1 only, so nothing there says what a TP collective costs;
    the transfer model must then price it at the link's datasheet rate, not at nothing: a
    slower link makes a TP 8 layer slower by at least the roofline's extra transfer time."""
    from memx_hpc.model.api import roofline_components
    an = fitted.anchors_.bind(CAT)
    coef, *_ = an._parts_fit("layer", "half", "sdpa")
    assert (coef >= an.PARTS_FLOOR - 1e-12).all(), coef
    g = CAT.get("H100-SXM")
    slow = replace(g, link_gbps=g.link_gbps / 4)
    q = _llama8b_query("H100-SXM", 8)
    extra = roofline_components(q, slow)["comm_ms"] - roofline_components(q, g)["comm_ms"]
    assert extra > 0
    assert _transfer_ms(fitted, q, slow) - _transfer_ms(fitted, q, g) >= 0.999 * extra


def test_the_power_term_prices_a_card_not_a_module(fitted, monkeypatch):
    """A PCIe card's rated peak per W says how far its power cap keeps it below that peak (L4,
    T4, H100-NVL); a module's (SXM, OAM) does not: the same H100-SXM figures at 350 W instead of
    700 W are the same module, while as a 350 W card they run slower."""
    g = CAT.get("H100-SXM")
    assert g.form_factor == "module"
    q = _llama8b_query("H100-SXM", 1)
    t = _transfer_ms(fitted, q, g)
    assert _transfer_ms(fitted, q, replace(g, tdp_w=350.0)) == pytest.approx(t, rel=1e-9)
    card = _transfer_ms(fitted, q, replace(g, tdp_w=350.0, form_factor="card"))
    assert card > 1.1 * t
    # a module's peak per W counts up to the smallest of a measured module's, not beyond
    coef, fpw_median, fpw_module = fitted.anchors_.bind(CAT)._parts_fit("layer", "half", q.attention)
    assert 0 < fpw_module < g.peak_tflops(q.precision) / g.tdp_w
    at_max = replace(g, tdp_w=g.peak_tflops(q.precision) / fpw_module)
    assert _transfer_ms(fitted, q, at_max) == pytest.approx(t, rel=1e-9)
    # below it a module is priced by its own figure, as a card with that figure is
    low = replace(g, tdp_w=4 * at_max.tdp_w)
    assert _transfer_ms(fitted, q, low) == pytest.approx(_transfer_ms(fitted, q, replace(low, form_factor="card")),
                                                         rel=1e-9)
    if coef[1] > 0:
        # a large layer may sit at the prior's saturation either way (Anchors.saturation);
        # the power term itself prices the lower peak per W faster
        assert _transfer_ms(fitted, q, low) <= t
        from memx_hpc.model.anchors import Anchors
        monkeypatch.setattr(Anchors, "_saturate", lambda self, rt, q, g, chip: rt)
        assert _transfer_ms(fitted, q, low) < _transfer_ms(fitted, q, g)


def test_save_load_round_trip_and_refusals(fitted, sailor, tmp_path):
    path = fitted.save(tmp_path / "p.ubj")
    qs = [query_of(s) for s in sailor[:30]]
    back = Predictor.load(path, expected_data_hash=fitted.data_hash_)
    np.testing.assert_array_equal(back.predict(qs), fitted.predict(qs))
    assert back.identity == fitted.identity
    with pytest.raises(SpecError, match="stale"):
        Predictor.load(path, expected_data_hash="0" * 64)
    # a model someone else wrote
    import xgboost as xgb
    foreign = xgb.train({"verbosity": 0}, xgb.DMatrix(np.ones((4, 2)), label=np.ones(4)), 2)
    foreign.save_model(str(tmp_path / "f.ubj"))
    with pytest.raises(SpecError, match="not one memx-hpc wrote"):
        Predictor.load(tmp_path / "f.ubj")
    # another feature schema
    b = xgb.Booster()
    b.load_model(str(path))
    meta = json.loads(b.attr("memx_meta"))
    meta["feature_names"] = meta["feature_names"][:-1]
    b.set_attr(memx_meta=json.dumps(meta))
    b.save_model(str(tmp_path / "old.ubj"))
    with pytest.raises(SpecError, match="feature schema"):
        Predictor.load(tmp_path / "old.ubj")
    (tmp_path / "junk.ubj").write_bytes(b"\x00junk")
    with pytest.raises(SpecError, match="not an XGBoost model"):
        Predictor.load(tmp_path / "junk.ubj")
    with pytest.raises(SpecError, match="ubj"):
        fitted.save(tmp_path / "p.json")


def test_fit_or_load_reuses_and_refits(sailor, tmp_path):
    path = tmp_path / "m.ubj"
    a = fit_or_load(sailor, path, CAT, n_estimators=40)
    stamp = os.stat(path).st_mtime_ns
    b = fit_or_load(list(reversed(sailor)), path, CAT, n_estimators=40)  # same data, other order
    assert b.identity == a.identity and os.stat(path).st_mtime_ns == stamp
    changed = sailor[:-1] + [replace(sailor[-1], forward_ms=sailor[-1].forward_ms * 2)]
    c = fit_or_load(changed, path, CAT, n_estimators=40)
    assert c.data_hash_ == samples_hash(changed) != a.data_hash_
    assert os.stat(path).st_mtime_ns != stamp


def test_a_predictor_saved_by_other_prediction_code_is_refitted(sailor, tmp_path, monkeypatch):
    # the saved boosters and anchors are data, but the code that turns them into numbers
    # changes between versions: a file from another version must not be reused as is
    import memx_hpc.model.predictor as predictor_mod
    path = tmp_path / "m.ubj"
    a = fit_or_load(sailor, path, CAT, n_estimators=40)
    stamp = os.stat(path).st_mtime_ns
    monkeypatch.setattr(predictor_mod, "code_fingerprint", lambda: "another version")
    with pytest.raises(SpecError, match="another version of memx-hpc's prediction code"):
        Predictor.load(path, site=CAT)
    b = fit_or_load(sailor, path, CAT, n_estimators=40)
    assert b.identity != a.identity and os.stat(path).st_mtime_ns != stamp


def test_two_single_output_models_and_no_memory_data(sailor, cephalo_small, tmp_path):
    two = Predictor(dual_output=False, n_estimators=60).fit(sailor, CAT)
    q = [query_of(s) for s in sailor[:10]]
    assert two.predict(q).shape == (10, 2)
    two.save(tmp_path / "two.ubj")
    np.testing.assert_array_equal(Predictor.load(tmp_path / "two.ubj").predict(q), two.predict(q))
    # Cephalo carries no memory: the memory output falls back to the analytic formula
    p = Predictor(n_estimators=60).fit(cephalo_small, CAT)
    qs = [query_of(s) for s in cephalo_small[:20]]
    np.testing.assert_allclose(p.predict(qs)[:, 1], [analytic_activation_bytes(x) for x in qs], rtol=1e-9)


def test_nothing_to_fit_is_a_user_error():
    with pytest.raises(SpecError, match="no usable samples"):
        Predictor().fit([], CAT)
    with pytest.raises(SpecError, match="not fitted"):
        Predictor().predict([])


def test_baselines(sailor):
    lay = [s for s in sailor if s.point.kind == "layer"]
    near = NearestPointScaling().fit(lay[::2], CAT)
    pred = near.predict([query_of(s) for s in lay[1::2]])
    t = np.array([s.forward_ms + s.backward_ms for s in lay[1::2]])
    assert pred.shape == (len(t), 2) and error_summary(pred[:, 0], t)["mape"] < 50
    roof = AnalyticCostModel(CAT).predict([query_of(s) for s in lay])
    assert np.all(roof[:, 0] < np.array([s.forward_ms + s.backward_ms for s in lay]))  # a roofline is a lower bound


def test_profiled_series_are_answered_from_their_measurements(sailor):
    """A held-out micro-batch between two profiled ones is interpolated from its series; a
    shape never profiled on that GPU is scaled from the chip's measured efficiency (and
    says it extrapolated); a GPU never profiled is estimated from its datasheet."""
    p = Predictor(n_estimators=80).fit([s for s in sailor if s.point.micro_batch_size != 4], CAT)
    held = [s for s in sailor if s.point.micro_batch_size == 4 and s.point.kind == "layer"
            and s.source.endswith("OPT-350/A100-80/profile.json")]
    qs = [query_of(s) for s in held]
    pred = p.predict(qs)[:, 0]
    assert error_summary(pred, np.array([s.forward_ms + s.backward_ms for s in held]))["mape"] < 8
    assert set(p.explain(qs)) == {"interpolated"}
    q = qs[0]
    # 2.5x wider, about 6x the FLOPs: the GPT-Neo series of this GPU answers
    wide = replace(q, shape=replace(q.shape, hidden_size=2560, num_attention_heads=32, ffn_hidden_size=10240))
    huge = replace(q, shape=replace(q.shape, hidden_size=16384, num_attention_heads=128, ffn_hidden_size=65536), tp=8)
    out = p.predict([wide, q, huge])
    assert np.isfinite(out).all() and out[0, 0] > 1.5 * out[1, 0]
    assert p.explain([huge, replace(q, gpu_type="B200")]) == ["extrapolated", "datasheet-only"]
    roof = AnalyticCostModel(CAT).predict([huge])[0, 0]
    assert roof <= out[2, 0] < 6 * roof  # the chip's efficiency, not a tree's edge


def test_exact_at_profiled_points(sailor, cephalo_small):
    """Every profiled point comes back as its measurement (median of repeats; a running
    maximum over the micro-batch where a measurement was faster than a smaller one)."""
    data = sailor + cephalo_small
    p = Predictor(n_estimators=40).fit(data, CAT)
    gh = [s for s in sailor if s.point.gpu_type == "GH200" and s.point.shape.hidden_size == 1024
          and s.point.tp == 4 and s.point.micro_batch_size == 1]
    assert {s.point.kind for s in gh} == {"layer", "embedding", "head"}
    for s in gh:
        got = p.predict([query_of(s)])[0, 0]
        assert got == pytest.approx(s.forward_ms + s.backward_ms, rel=0.03), s.point.kind
    assert set(p.explain([query_of(s) for s in gh])) == {"measured"}
    t = np.array([s.forward_ms + s.backward_ms for s in data])
    pred = p.predict([query_of(s) for s in data])[:, 0]
    assert np.median(np.abs(pred / t - 1)) < 1e-9
    assert error_summary(pred, t)["mape"] < 3


def test_same_chip_variants_share_layer_times(sailor):
    """V100-32 has no samples; it is the V100-16's chip (gpus.yaml chip:), so it gets the
    imported V100-16 layer times, and says so. Aliases resolve to the same data."""
    p = Predictor(n_estimators=40).fit(sailor, CAT)
    v16 = [query_of(s) for s in sailor if s.point.gpu_type == "V100-16" and s.point.kind == "layer"][:20]
    v32 = [replace(q, gpu_type="V100-32") for q in v16]
    np.testing.assert_allclose(p.predict(v32)[:, 0], p.predict(v16)[:, 0], rtol=1e-12)
    assert set(p.explain(v32)) <= {"measured", "interpolated"}
    assert p.provenance("V100-32") == "imported (same chip as V100-16)"
    assert p.provenance("v100x32") == p.provenance("V100-32")
    gh = [query_of(s) for s in sailor if s.point.gpu_type == "GH200"][:10]
    np.testing.assert_array_equal(p.predict([replace(q, gpu_type="GH-96") for q in gh]), p.predict(gh))
    assert p.provenance("GH-96") == "imported"
    assert p.provenance("V100-PCIE-16") == "datasheet-only"  # another board, another clock: not one chip


def test_cli_fit_on_a_store(sailor, tmp_path, capsys):
    from memx_hpc.cli.main import main
    from memx_hpc.profile.store import ProfileStore
    store = tmp_path / "store.h5"
    ProfileStore(store).append([s for s in sailor if "OPT-350" in s.source])
    site = os.path.join(os.path.dirname(__file__), "..", "..", "site_configs", "local.yaml")
    assert main(["fit", "--site", site, "--store", str(store), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cross_validation"]["folds"] > 0 and out["cross_validation"]["time"]["mape"] < 15
    assert Predictor.load(out["predictor"], expected_data_hash=out["data_hash"]).identity == out["identity"]
    assert main(["fit", "--site", site, "--store", str(tmp_path / "none.h5")]) == 1
    assert "profile store not found" in capsys.readouterr().err


# --------------------------------------------------------------------------- properties

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_GPUS = ["A100-80", "A100-40", "GH200", "V100-16", "V100-32", "RTX-3090", "H200", "B200", "MI300X", "L4"]


@st.composite
def layer_queries(draw):
    heads = draw(st.sampled_from([8, 16, 32, 64]))
    head_dim = draw(st.sampled_from([64, 80, 128]))
    h = heads * head_dim
    from memx_hpc.spec import LayerShape
    shape = LayerShape(hidden_size=h, num_attention_heads=heads, num_query_groups=heads, ffn_hidden_size=4 * h,
                       seq_length=draw(st.sampled_from([512, 1024, 2048, 4096])),
                       vocab_size=draw(st.sampled_from([50257, 32000])), activation="gelu")
    return LayerQuery(gpu_type=draw(st.sampled_from(_GPUS)), shape=shape,
                      tp=draw(st.sampled_from([t for t in (1, 2, 4, 8) if heads % t == 0])),
                      micro_batch_size=draw(st.integers(1, 32)),
                      recompute=draw(st.sampled_from(["none", "selective", "full"])),
                      precision=draw(st.sampled_from(["fp16", "bf16", "fp32"])),
                      attention=draw(st.sampled_from(["core", "sdpa"])))


@pytest.fixture(scope="module")
def broad(sailor, cephalo_small):
    return Predictor(n_estimators=40).fit(sailor + cephalo_small, CAT)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(q=layer_queries(), more=st.integers(1, 16))
def test_more_tokens_or_wider_layers_never_faster_and_never_below_the_roofline(broad, q, more):
    bigger_batch = replace(q, micro_batch_size=q.micro_batch_size + more)
    s = q.shape
    wider = replace(q, shape=replace(s, num_attention_heads=2 * s.num_attention_heads,
                                     num_query_groups=2 * s.num_query_groups, hidden_size=2 * s.hidden_size,
                                     ffn_hidden_size=2 * s.ffn_hidden_size))
    t = broad.predict([q, bigger_batch, wider])[:, 0]
    roof = AnalyticCostModel(CAT).predict([q, bigger_batch, wider])[:, 0]
    assert np.all(t >= roof * (1 - 1e-9)), (t, roof, broad.explain([q, bigger_batch, wider]))
    assert t[1] >= t[0] * (1 - 1e-9), broad.explain([q, bigger_batch])
    assert t[2] >= t[0] * (1 - 1e-9), broad.explain([q, wider])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(q=layer_queries())
def test_less_tensor_sharding_never_faster_where_nothing_was_measured(broad, q):
    """Halving TP doubles the work per GPU. Away from measured series (where a measured
    TP step may be slower through its collectives, as on PCIe cards) that never gets
    faster -- unless the collectives it saves outweigh the work, which the roofline says."""
    if q.tp == 1:
        return
    q = replace(q, gpu_type="H200")  # never profiled: the datasheet path
    pair = [q, replace(q, tp=q.tp // 2)]
    roof = AnalyticCostModel(CAT).predict(pair)[:, 0]
    t = broad.predict(pair)[:, 0]
    if roof[1] >= roof[0]:
        assert t[1] >= t[0] * (1 - 1e-9)


def test_tensor_parallel_shares_are_the_work_per_rank_plus_collectives(fitted):
    """A100-40 ran the sdpa kernel at TP 1 only (Cephalo): at TP t a rank does 1/t of the
    layer at the efficiency the chip reaches at TP 1 for work that size, plus the layer's TP
    all-reduces -- not a TP ratio carried over from another kernel's series. So TP t at
    micro-batch 8 sits between the TP 1 layer of the same compute per rank (micro-batch
    8/t) and that layer scaled by the larger per-rank work (sharding leaves the norms
    unsplit), each plus the collectives; and it is faster than TP 1 for a layer this large."""
    from memx_hpc.model.api import resolve_gpu, roofline_components
    from memx_hpc.spec import LayerShape
    shape = LayerShape(hidden_size=2048, num_attention_heads=16, num_query_groups=16, ffn_hidden_size=8192,
                       seq_length=1024, vocab_size=50257)
    g = resolve_gpu(CAT, "A100-40")

    def q(tp, mbs, recompute):
        return LayerQuery(gpu_type="A100-40", kind="layer", shape=shape, tp=tp, micro_batch_size=mbs,
                          recompute=recompute, precision="fp16", attention="sdpa")

    def work(x):
        c = roofline_components(x, g)
        return c["compute_ms"] + c["memory_ms"], c["comm_ms"]

    for recompute in ("none", "full"):
        qs = [q(1, 8, recompute)] + [q(tp, 8, recompute) for tp in (2, 4, 8)]
        same = [q(1, 8 // tp, recompute) for tp in (2, 4, 8)]
        t = fitted.predict(qs + same)[:, 0]
        assert fitted.explain(qs)[1:] == ["extrapolated"] * 3
        assert np.all(t >= AnalyticCostModel(CAT).predict(qs + same)[:, 0] * (1 - 1e-9))
        for i, tp in enumerate((2, 4, 8)):
            (w, comm), (w1, _) = work(qs[i + 1]), work(same[i])
            assert comm > 0 and w >= w1
            lo, hi = t[4 + i] + comm, t[4 + i] * w / w1 + comm
            assert lo * (1 - 1e-6) <= t[i + 1] <= hi * (1 + 1e-6), (recompute, tp, lo, t[i + 1], hi)
            assert t[i + 1] < t[i], (recompute, tp, t)  # more sharding helps a layer this large


def test_an_unprofiled_moe_layer_names_its_roofline_terms(fitted):
    """An MoE layer (Mixtral-8x7B's) no sample measured: explain names the parts it is built
    from, the all-to-all over the EP group and the imbalance margin; a dense layer's label is
    the plain one."""
    from memx_hpc.spec.catalog import preset
    from memx_hpc.spec import LayerShape

    shape = LayerShape.of(preset("Mixtral-8x7B"))
    q = LayerQuery(gpu_type="A100-80", kind="layer", shape=shape, tp=1, micro_batch_size=1, recompute="none",
                   precision="bf16", attention="sdpa", ep=4)
    (label,) = fitted.explain([q])
    assert label.split(";")[0] in ("interpolated", "extrapolated", "datasheet-only")
    assert "routed experts (2 of 8 on this rank, top-2)" in label and "all-to-all over EP 4" in label
    assert "imbalance margin 1.25" in label
    t_ep4, t_ep1 = fitted.predict([q, replace(q, ep=1)])[:, 0]
    assert t_ep4 > t_ep1  # the all-to-all and the most loaded rank's share cost time


def test_the_memory_bound_cost_is_that_of_the_query_s_layer_code(fitted, sailor, cephalo_small, monkeypatch):
    """Cephalo times plain-PyTorch layers, Sailor Megatron-DeepSpeed's: each point prices the
    memory-bound kernels of its own code, and a plan's (Megatron) layer on a GPU never profiled
    takes the Megatron cost -- the roofline's where no Megatron point ran its attention kernel
    (Cephalo's sdpa points are all eager) -- not the unfused layers' several-fold cost."""
    from memx_hpc.model.api import kernels_of
    assert {kernels_of(s) for s in cephalo_small} == {"eager"}
    assert {kernels_of(s) for s in sailor} == {"megatron"}
    assert {query_of(s).kernels for s in cephalo_small[:20]} == {"eager"}
    with pytest.raises(SpecError, match="kernels"):
        replace(_llama8b_query("H100-SXM", 1), kernels="fused")
    an = fitted.anchors_.bind(CAT)
    coef, *_ = an._parts_fit("layer", "half", "sdpa")
    assert coef[2] == pytest.approx(an.PARTS_FLOOR[2]) and coef[3] > 2 * coef[2], coef
    g = CAT.get("H100-SXM")
    q = _llama8b_query("H100-SXM", 1)
    eager = replace(q, kernels="eager")
    from memx_hpc.model.api import roofline_components
    gap = (coef[3] - coef[2]) * roofline_components(q, g)["memory_ms"]
    # the parts fit itself, before the prior's saturation bounds the faster (Anchors.saturation)
    from memx_hpc.model.anchors import Anchors
    monkeypatch.setattr(Anchors, "_saturate", lambda self, rt, q, g, chip: rt)
    assert _transfer_ms(fitted, eager, g) - _transfer_ms(fitted, q, g) == pytest.approx(gap, rel=1e-6)
    # Sailor's core-attention points are Megatron's: there the Megatron cost is learned
    core, *_ = an._parts_fit("layer", "half", "core")
    assert core[2] >= an.PARTS_FLOOR[2]
