"""The HDF5 profile store: round trip, dedupe, hashing, the writer lock, atomicity under kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import pytest

from memx_hpc.errors import SpecError
from memx_hpc.profile.store import SCHEMA_VERSION, ProfileStore, StoreLocked
from memx_hpc.spec import LayerSample, LayerShape, ProfilePoint, Provenance

SHAPE = LayerShape(hidden_size=256, num_attention_heads=4, num_query_groups=4, ffn_hidden_size=1024,
                   seq_length=128, vocab_size=1024)
REPO = Path(__file__).resolve().parents[2]


def sample(gpu: str = "cpu-4g", mbs: int = 1, tp: int = 1, recompute: str = "none", fwd: float = 1.25,
           origin: str = "measured", kind: str = "layer", group_size: int = 1, message_bytes: int = 0,
           inter_node: bool = False, **kw) -> LayerSample:
    point = ProfilePoint(gpu_type=gpu, kind=kind, shape=SHAPE, tp=tp, micro_batch_size=mbs, recompute=recompute,
                         precision="fp32", group_size=group_size, message_bytes=message_bytes, inter_node=inter_node)
    return LayerSample(point=point, forward_ms=fwd, backward_ms=2 * fwd + 0.1, activation_bytes=1000 * mbs + 7,
                       peak_allocated_bytes=3 * 2**20 + mbs, origin=origin, source="test",
                       provenance=Provenance.of({"host": "h", "note": "comma, quote \" and ünïcode"}), **kw)


def test_round_trip_keeps_every_field(tmp_path):
    st = ProfileStore(tmp_path / "s.h5")
    assert not (tmp_path / "s.h5").exists()  # constructing does no I/O
    assert st.samples() == [] and st.gpu_types() == []
    batch = [sample(mbs=m, fwd=0.1 * m + 1e-9) for m in (1, 2, 4)]
    batch += [sample(gpu="A100-80", tp=2, recompute="full", infeasible=True, weight=0.25, origin="imported")]
    batch += [sample(kind="allreduce", fwd=3.0, group_size=2, message_bytes=2**20, inter_node=True)]
    assert st.append(batch) == 5
    again = ProfileStore(tmp_path / "s.h5")
    got = again.samples()
    assert sorted(got, key=repr) == sorted(batch, key=repr)
    assert again.gpu_types() == ["A100-80", "cpu-4g"]
    assert [s.point.kind for s in again.samples(kind="allreduce")] == ["allreduce"]
    assert again.samples(gpu_type="A100-80", origins=["imported"])[0].infeasible is True
    assert again.samples(gpu_type="A100-80", origins=["measured"]) == []


def test_file_layout_has_schema_version_and_unit_columns(tmp_path):
    st = ProfileStore(tmp_path / "s.h5")
    st.append([sample()])
    with h5py.File(tmp_path / "s.h5", "r") as f:
        assert int(f.attrs["schema_version"]) == SCHEMA_VERSION
        g = f["gpu/cpu-4g"]
        for col in ("forward_ms", "backward_ms", "activation_bytes", "peak_allocated_bytes",
                    "device_footprint_bytes", "origin.end", "provenance.end"):
            assert col in g and g[col].shape == (1,)
        # text: the rows' UTF-8 bytes and where each ends
        assert json.loads(g["provenance.utf8"][:g["provenance.end"][0]].tobytes().decode())["host"] == "h"


def test_dedupe_and_order_independent_hash(tmp_path):
    a, b = ProfileStore(tmp_path / "a.h5"), ProfileStore(tmp_path / "b.h5")
    xs = [sample(mbs=m) for m in (1, 2, 4, 8)]
    assert a.append(xs + xs[:2]) == 4  # duplicates inside one call
    assert a.append(xs[1:]) == 0  # duplicates of stored samples
    b.append(list(reversed(xs)))
    assert a.content_hash() == b.content_hash()
    before = a.content_hash()
    a.append([sample(mbs=1, fwd=1.2500001)])  # a different measurement of a stored point is kept
    assert len(a.samples()) == 5 and a.content_hash() != before


def test_has_point_ignores_augmented(tmp_path):
    st = ProfileStore(tmp_path / "s.h5")
    real, aug = sample(mbs=1), sample(mbs=2, origin="augmented")
    st.append([real, aug])
    assert st.has_point(real.point)
    assert not st.has_point(aug.point)
    assert not st.has_point(sample(mbs=3).point)


def test_device_figures_and_summary(tmp_path):
    st = ProfileStore(tmp_path / "s.h5")
    assert st.device_figures("cpu-4g") is None
    figs = {"peak_tflops_fp32": 0.11, "peak_tflops_bf16": 0.04, "hbm_gbps": 12.5, "memory_gib": 4}
    st.set_device_figures("cpu-4g", figs)
    st.append([sample(), sample(mbs=2, infeasible=True), sample(gpu="V100-32", origin="imported")])
    assert st.device_figures("cpu-4g") == {k: float(v) for k, v in figs.items()}
    summ = {r["gpu_type"]: r for r in st.summary()}
    assert summ["cpu-4g"]["samples"] == 2 and summ["cpu-4g"]["infeasible"] == 1
    assert summ["V100-32"]["by_origin"] == {"imported": 1}
    with pytest.raises(SpecError, match="incomplete"):
        st.set_device_figures("cpu-4g", {"hbm_gbps": 3})
    with pytest.raises(SpecError, match="positive"):
        st.set_device_figures("cpu-4g", {**figs, "hbm_gbps": -1})


def test_rejects_files_that_are_not_stores(tmp_path):
    p = tmp_path / "other.h5"
    with h5py.File(p, "w") as f:
        f.attrs["format"] = "something-else"
    with pytest.raises(SpecError, match="not a memx profile store"):
        ProfileStore(p).samples()
    with pytest.raises(SpecError, match="gpu_type: not a safe name"):  # refused by the spec itself
        ProfileStore(tmp_path / "x.h5").append([sample(gpu="a/b")])


def _spawn(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_second_writer_gets_store_locked_by_pid(tmp_path):
    path = tmp_path / "s.h5"
    holder = _spawn(f"""
        import sys, time
        from memx_hpc.profile.store import ProfileStore
        st = ProfileStore({str(path)!r})
        with st.writer():
            print("held", flush=True)
            time.sleep(30)
    """)
    try:
        assert holder.stdout.readline().strip() == "held"
        st = ProfileStore(path)
        with pytest.raises(StoreLocked, match=f"store locked by PID {holder.pid}"):
            st.append([sample()])
        assert st.samples() == []  # readers do not lock
    finally:
        holder.kill()
        holder.wait()
    # the holder is dead now: its lock is stale and is broken with a warning
    with pytest.warns(UserWarning, match=f"stale lock .* PID {holder.pid}"):
        assert ProfileStore(path).append([sample()]) == 1
    assert not Path(str(path) + ".lock").exists()


def test_kill_mid_append_never_corrupts(tmp_path):
    """SIGKILL a writer at varying moments: the file always opens and holds whole batches only."""
    batch = 300
    counts = set()
    for trial, delay in enumerate((0.05, 0.13, 0.29, 0.41)):
        path = tmp_path / f"s{trial}.h5"
        w = _spawn(f"""
            import sys
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            from test_store import sample
            from memx_hpc.profile.store import ProfileStore
            st = ProfileStore({str(path)!r})
            for k in range(10**6):
                st.append([sample(mbs=k * {batch} + i + 1) for i in range({batch})])
                print(k, flush=True)
        """)
        assert w.stdout.readline().strip() == "0", w.stderr.read()  # at least one batch is in
        time.sleep(delay)
        w.send_signal(signal.SIGKILL)
        w.wait()
        st = ProfileStore(path)
        mbs = [s.point.micro_batch_size for s in st.samples()]
        assert len(mbs) % batch == 0 and len(mbs) >= batch  # whole batches only
        assert sorted(mbs) == list(range(1, len(mbs) + 1))  # no torn or repeated rows
        counts.add(len(mbs))
        # The next writer works: a stale lock of the dead PID is broken, its temp file removed.
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert st.append([sample(mbs=2**16)]) == 1  # the largest micro-batch a spec allows
        if any("stale lock" in str(c.message) for c in caught):
            assert str(w.pid) in str(caught[0].message)
        assert not any(".tmp-" in p.name for p in tmp_path.iterdir())
        assert len(ProfileStore(path).samples()) == len(mbs) + 1
    assert len(counts) >= 2  # the kills landed at different moments


def test_the_lock_names_its_holder_from_the_first_moment(tmp_path, monkeypatch):
    # the lock is created by linking a file that already holds the PID, so no reader ever
    # sees an empty lock (a writer killed between create and write used to leave one that
    # blocked every later writer); a dead holder's lock and its own file are both removed
    import socket
    import memx_hpc.profile.store as store_mod
    path = tmp_path / "s.h5"
    st = ProfileStore(path)
    seen = []
    real_link = os.link

    def link(src, dst):
        seen.append(Path(src).read_text().strip())
        real_link(src, dst)
        seen.append(Path(dst).read_text().strip())

    monkeypatch.setattr(store_mod.os, "link", link)
    assert st.append([sample(mbs=1)]) == 1
    me = f"{os.getpid()}@{socket.gethostname()}"
    assert seen == [me, me]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    lock = path.with_name(path.name + ".lock")
    lock.write_text(f"{dead}@{socket.gethostname()}\n")
    own = path.with_name(f"{path.name}.lock.{dead}")
    own.write_text(f"{dead}@{socket.gethostname()}\n")
    with pytest.warns(UserWarning, match="stale lock"):
        assert st.append([sample(mbs=2)]) == 1
    assert not lock.exists() and not own.exists()
    assert not list(tmp_path.glob("s.h5.lock*"))


# --------------------------------------------------------------------------- end-to-end records


def e2e(job_id: str = "7", ms: float = 123.5, site: str = "local", job: str = "tiny-gpt", **kw):
    from memx_hpc.profile.store import E2ERecord

    base = dict(key=f"k{job_id}", plan={"format": "memx-plan/1", "tp": 1, "dp": 1, "micro_batch_size": 2,
                                       "global_batch_size": 8,
                                       "stages": [{"partition": "nvidia_a100", "num_layers": 4, "recompute": "none"}]},
                site=site, job=job, iters=3, iteration_ms=ms, peak_allocated_bytes={"0": 10 * 2**20, "1": 2**20},
                peak_footprint_bytes_by_rank={"0": 400 * 2**20, "1": 300 * 2**20},
                gpu_type_by_rank={"0": "cpu-4g", "1": "cpu-2g"}, stage_by_rank={"0": 0, "1": 1}, job_id=job_id,
                log_file="/runs/x.out", prediction={"iteration_ms": 100.0, "stages": [{"peak_bytes": 1}]},
                job_spec={"name": job, "global_batch_size": 8}, provenance={"host": "h", "note": "ünïcode, \"q\""})
    base.update(kw)
    return E2ERecord(**base)


def test_e2e_records_round_trip_filter_and_dedupe(tmp_path):
    st = ProfileStore(tmp_path / "s.h5")
    assert st.e2e_records() == []
    st.append([sample()])
    hash_samples = st.content_hash()
    empty_e2e = st.e2e_hash()
    recs = [e2e("1"), e2e("2", ms=99.0, job="other"), e2e("3", site="elsewhere")]
    assert st.append_e2e(recs + recs[:1]) == 3
    assert st.append_e2e([recs[1]]) == 0  # an exact duplicate
    again = ProfileStore(tmp_path / "s.h5")
    assert again.e2e_records() == recs  # stored order, every field
    assert [r.job_id for r in again.e2e_records(site="local")] == ["1", "2"]
    assert [r.job_id for r in again.e2e_records(site="local", job="tiny-gpt")] == ["1"]
    r = again.e2e_records()[0]
    assert r.peak_footprint_bytes == 400 * 2**20 and r.gpu_types == ("cpu-2g", "cpu-4g")
    assert r.by_gpu_type(r.peak_allocated_bytes) == {"cpu-4g": 10 * 2**20, "cpu-2g": 2**20}
    # layer samples survive e2e writes and e2e records survive sample writes
    assert len(again.samples()) == 1
    again.append([sample(mbs=2)])
    again.set_device_figures("cpu-4g", {"peak_tflops_fp32": 0.1, "peak_tflops_bf16": 0.1, "hbm_gbps": 1,
                                        "memory_gib": 4})
    assert len(ProfileStore(tmp_path / "s.h5").e2e_records()) == 3
    # the sample hash does not see e2e records; the e2e hash does, in any order
    b = ProfileStore(tmp_path / "b.h5")
    b.append([sample()])
    assert b.content_hash() == hash_samples
    b.append_e2e(list(reversed(recs)))
    assert b.content_hash() == hash_samples and b.e2e_hash() == ProfileStore(tmp_path / "s.h5").e2e_hash()
    assert b.e2e_hash() != empty_e2e
    from memx_hpc.profile.store import records_hash
    assert records_hash(recs) == b.e2e_hash()
    with h5py.File(tmp_path / "s.h5", "r") as f:
        assert int(f.attrs["schema_version"]) == SCHEMA_VERSION == 5
        assert f["e2e/iteration_ms"].shape == (3,)
        first = f["e2e/plan_json.utf8"][:f["e2e/plan_json.end"][0]].tobytes().decode()
        assert json.loads(first)["micro_batch_size"] == 2


def test_e2e_bad_records_are_refused_by_field(tmp_path):
    st = ProfileStore(tmp_path / "s.h5")
    with pytest.raises(SpecError) as e:
        st.append_e2e([e2e(ms=0.0)])
    assert e.value.field == "iteration_ms"
    with pytest.raises(SpecError) as e:
        st.append_e2e([e2e(origin="guessed")])
    assert e.value.field == "origin"
    with pytest.raises(SpecError) as e:
        st.append_e2e([e2e(peak_footprint_bytes_by_rank={"0": -5})])
    assert e.value.field == "peak_footprint_bytes_by_rank.0"
    with pytest.raises(TypeError):
        st.append_e2e([sample()])
    assert not st.exists()


def test_version_1_files_still_open_and_upgrade_on_write(tmp_path):
    """A version-1 store (what this code wrote before e2e records: /gpu only) reads as a
    store without e2e records; its samples and their hash are unchanged; the next write makes it
    the current version (appendable tables)."""
    path = tmp_path / "v1.h5"
    batch = [sample(mbs=m) for m in (1, 2)] + [sample(gpu="A100-80", origin="imported")]
    ref = ProfileStore(tmp_path / "ref.h5")
    ref.append(batch)
    h = ref.content_hash()
    _write_version_2(path, batch)
    with h5py.File(path, "r+") as f:  # the version-1 layout: version 2 without the e2e table
        del f["e2e"]
        f.attrs["schema_version"] = 1
    v1 = ProfileStore(path)
    assert sorted(v1.samples(), key=repr) == sorted(batch, key=repr)
    assert v1.e2e_records() == [] and v1.content_hash() == h
    assert v1.append_e2e([e2e()]) == 1
    with h5py.File(path, "r") as f:
        assert int(f.attrs["schema_version"]) == SCHEMA_VERSION == 5
        assert f["gpu/A100-80/forward_ms"].maxshape == (None,)  # resizable: later appends go in place
    v2 = ProfileStore(path)
    assert len(v2.samples()) == 3 and len(v2.e2e_records()) == 1 and v2.content_hash() == h
    with h5py.File(path, "r+") as f:
        f.attrs["schema_version"] = 6
    with pytest.raises(SpecError) as e:
        ProfileStore(path).samples()
    assert e.value.field == "schema_version" and "1, 2, 3, 4, 5" in str(e.value)


def test_e2e_writer_lock_is_the_store_lock(tmp_path):
    path = tmp_path / "s.h5"
    holder = _spawn(f"""
        import time
        from memx_hpc.profile.store import ProfileStore
        with ProfileStore({str(path)!r}).writer():
            print("held", flush=True)
            time.sleep(30)
    """)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreLocked):
            ProfileStore(path).append_e2e([e2e()])
    finally:
        holder.kill()
        holder.wait()


def _write_version_2(path: Path, samples: list[LayerSample]) -> None:
    """The layout of schema 2 as written before tables became appendable: one whole
    (fixed-size) dataset per column, no committed count, no row digests."""
    import numpy as np

    from memx_hpc.profile.store import COLUMNS, E2E_COLUMNS, sample_to_row

    rows = [sample_to_row(s) for s in samples]
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "memx-profile-store"
        f.attrs["schema_version"] = 2
        top = f.create_group("gpu")
        for gpu in sorted({r["gpu_type"] for r in rows}):
            g = top.create_group(gpu)
            g.attrs["gpu_type"] = gpu
            g.attrs["device_figures"] = ""
            table = [r for r in rows if r["gpu_type"] == gpu]
            for c in COLUMNS[1:]:
                if c.since > 2:
                    continue
                vals = [r[c.name] for r in table]
                if c.kind == "str":
                    g.create_dataset(c.name, data=np.array(vals, dtype=object), dtype=h5py.string_dtype("utf-8"))
                else:
                    g.create_dataset(c.name, data=np.array(vals, dtype={"int": np.int64, "bool": np.bool_,
                                                                        "float": np.float64}[c.kind]))
        e = f.create_group("e2e")
        for c in E2E_COLUMNS:
            e.create_dataset(c.name, shape=(0,), dtype=h5py.string_dtype("utf-8") if c.kind == "str"
                             else (np.int64 if c.kind == "int" else np.float64))


def test_version_2_files_read_and_become_appendable(tmp_path):
    batch = [sample(mbs=m) for m in (1, 2)] + [sample(gpu="A100-80", origin="imported")]
    ref = ProfileStore(tmp_path / "ref.h5")
    ref.append(batch)
    old = tmp_path / "v2.h5"
    _write_version_2(old, batch)
    st = ProfileStore(old)
    assert sorted(st.samples(), key=repr) == sorted(batch, key=repr)
    assert st.content_hash() == ref.content_hash()  # the hash is of the samples, not the layout
    assert st.append(batch[:1]) == 0  # a duplicate of a stored row, found in the old layout too
    assert st.append([sample(mbs=3)]) == 1 and ref.append([sample(mbs=3)]) == 1
    with h5py.File(old, "r") as f:
        assert int(f.attrs["schema_version"]) == SCHEMA_VERSION
        assert f["gpu/cpu-4g/forward_ms"].maxshape == (None,) and int(f["gpu/cpu-4g"].attrs["committed_rows"]) == 3
    assert ProfileStore(old).content_hash() == ref.content_hash()


def test_rows_past_the_committed_count_are_invisible_and_overwritten(tmp_path):
    """What a writer killed between writing rows and committing them leaves behind."""
    path = tmp_path / "s.h5"
    st = ProfileStore(path)
    st.append([sample(mbs=1)])
    with h5py.File(path, "r+") as f:  # rows written, count not raised: a torn append
        g = f["gpu/cpu-4g"]
        for name in g:
            ds = g[name]
            ds.resize((ds.shape[0] + (7 if name.endswith(".utf8") else 1),))  # bytes of text, or a row
        g["forward_ms"][1] = 99.0
    assert [s.point.micro_batch_size for s in ProfileStore(path).samples()] == [1]
    assert ProfileStore(path).append([sample(mbs=2)]) == 1
    got = ProfileStore(path).samples()
    assert [s.point.micro_batch_size for s in got] == [1, 2] and got[1].forward_ms == 1.25


def test_an_append_left_in_progress_is_rebuilt_from_committed_rows(tmp_path):
    path = tmp_path / "s.h5"
    ProfileStore(path).append([sample(mbs=1)])
    with h5py.File(path, "r+") as f:
        f.attrs["append_in_progress"] = 1  # the flag a killed writer leaves set
    with pytest.warns(UserWarning, match="cut short"):
        assert ProfileStore(path).append([sample(mbs=2)]) == 1
    assert len(ProfileStore(path).samples()) == 2
    with h5py.File(path, "r") as f:
        assert int(f.attrs["append_in_progress"]) == 0


MOE_SHAPE = LayerShape(hidden_size=256, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=1024,
                       seq_length=128, vocab_size=1024, activation="swiglu", num_experts=8, moe_router_topk=2,
                       moe_ffn_hidden_size=512, moe_shared_expert_intermediate_size=256, head_dim=32)
MLA_SHAPE = LayerShape(hidden_size=256, num_attention_heads=4, num_query_groups=4, ffn_hidden_size=1024,
                       seq_length=128, vocab_size=1024, multi_latent_attention=True, kv_lora_rank=64,
                       qk_head_dim=32, qk_pos_emb_head_dim=16, v_head_dim=32)


def _digest_of_schema_4(row) -> str:
    """How a row's digest was computed before MoE/MLA columns existed (the 29 columns then)."""
    import hashlib

    from memx_hpc.profile.store import COLUMNS
    names = [c.name for c in COLUMNS][:29]
    assert names[-1] == "weight"
    text = json.dumps([repr(row[n]) if isinstance(row[n], float) else row[n] for n in names],
                      ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_moe_and_mla_layers_round_trip_and_dense_digests_stay(tmp_path):
    from memx_hpc.profile.store import _row_digest, sample_to_row

    dense = sample()
    moe = LayerSample(point=ProfilePoint(gpu_type="cpu-4g", kind="layer", shape=MOE_SHAPE, ep=2, precision="fp32"),
                      forward_ms=2.0, backward_ms=4.0)
    mla = LayerSample(point=ProfilePoint(gpu_type="cpu-4g", kind="layer", shape=MLA_SHAPE, precision="fp32"),
                      forward_ms=1.5)
    a2a = sample(kind="alltoall", group_size=2, message_bytes=4096, fwd=0.3)
    st = ProfileStore(tmp_path / "s.h5")
    assert st.append([dense, moe, mla, a2a]) == 4
    got = ProfileStore(tmp_path / "s.h5").samples()
    assert sorted(got, key=repr) == sorted([dense, moe, mla, a2a], key=repr)
    back = next(s for s in got if s.point.shape.is_moe)
    assert back.point.ep == 2 and back.point.shape.moe_shared_expert_intermediate_size == 256
    assert back.point.shape.q_lora_rank is None and back.point.shape.head_dim == 32
    # a dense row's digest is the one schema 4 gave it; an MoE row's differs from its dense twin's
    assert _row_digest(sample_to_row(dense)) == _digest_of_schema_4(sample_to_row(dense))
    assert _row_digest(sample_to_row(moe)) != _digest_of_schema_4(sample_to_row(moe))
    assert st.append([moe]) == 0  # its duplicate found by digest


def test_a_schema_4_file_reads_as_dense_layers_and_keeps_its_hash(tmp_path):
    from memx_hpc.profile.store import COLUMNS

    batch = [sample(mbs=m) for m in (1, 2)] + [sample(gpu="A100-80", origin="imported")]
    ref = ProfileStore(tmp_path / "ref.h5")
    ref.append(batch)
    path = tmp_path / "v4.h5"
    ProfileStore(path).append(batch)
    with h5py.File(path, "r+") as f:  # what schema 4 wrote: none of the later columns
        f.attrs["schema_version"] = 4
        for g in f["gpu"].values():
            for c in COLUMNS:
                if c.since >= 5:
                    del g[c.name]
    old = ProfileStore(path)
    assert sorted(old.samples(), key=repr) == sorted(batch, key=repr)
    assert old.content_hash() == ref.content_hash()
    assert old.append([sample(mbs=3)]) == 1 and old.append(batch[:1]) == 0  # written as schema 5 now
    with h5py.File(path, "r") as f:
        assert int(f.attrs["schema_version"]) == SCHEMA_VERSION == 5 and "num_experts" in f["gpu/cpu-4g"]
    assert len(ProfileStore(path).samples()) == 4


def test_a_store_path_that_is_no_file_is_named(tmp_path) -> None:
    import pytest as _pytest

    from memx_hpc.errors import SystemFailure
    from memx_hpc.profile.store import check_store_path

    assert check_store_path(tmp_path / "none.h5") is False
    (tmp_path / "real.h5").write_bytes(b"")
    assert check_store_path(tmp_path / "real.h5") is True
    (tmp_path / "null.h5").symlink_to("/dev/null")
    with _pytest.raises(SystemFailure, match="character device.*not a file"):
        check_store_path(tmp_path / "null.h5")
    (tmp_path / "gone.h5").symlink_to(tmp_path / "nowhere")
    with _pytest.raises(SystemFailure, match="symbolic link to nothing"):
        check_store_path(tmp_path / "gone.h5")
