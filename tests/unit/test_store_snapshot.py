"""``<store>.snapshot``: the parsed store reused while the store's bytes are the same, rebuilt
whole and atomically when they change, a damaged or foreign snapshot ignored and rebuilt."""

from __future__ import annotations

import os
import pickle

import pytest

from memx_hpc.profile import snapshot
from memx_hpc.profile.store import ProfileStore
from memx_hpc.spec import LayerSample, LayerShape, ProfilePoint, Provenance

SHAPE = LayerShape(hidden_size=256, num_attention_heads=4, num_query_groups=4, ffn_hidden_size=1024,
                   seq_length=128, vocab_size=1024)


def sample(gpu: str = "cpu-4g", mbs: int = 1, fwd: float = 1.25, origin: str = "measured") -> LayerSample:
    point = ProfilePoint(gpu_type=gpu, kind="layer", shape=SHAPE, tp=1, micro_batch_size=mbs, recompute="none",
                         precision="fp32")
    return LayerSample(point=point, forward_ms=fwd, backward_ms=2 * fwd, activation_bytes=1000 * mbs,
                       peak_allocated_bytes=3 * 2**20 + mbs, origin=origin, source="test",
                       provenance=Provenance.of({"host": "h"}))


def _no_hdf5(monkeypatch):
    """Reading the HDF5 file fails from here on: what a store answers comes from its snapshot."""
    def fail(self):
        raise AssertionError("read the HDF5 file although the snapshot matched")
    monkeypatch.setattr(ProfileStore, "_read_file", fail)


def _stored(tmp_path, n: int = 3):
    path = tmp_path / "s.h5"
    batch = [sample(mbs=m, fwd=0.5 * m) for m in range(1, n + 1)] + [sample(gpu="A100-80", origin="imported")]
    ProfileStore(path).append(batch)
    return path, batch


def test_a_second_reader_answers_from_the_snapshot(tmp_path, monkeypatch):
    path, batch = _stored(tmp_path)
    first = ProfileStore(path)
    assert sorted(first.samples(), key=repr) == sorted(batch, key=repr)
    assert snapshot.snapshot_path(path).is_file()
    _no_hdf5(monkeypatch)
    again = ProfileStore(path)
    assert again.samples() == first.samples()
    assert again.samples(gpu_type="A100-80", origins=["imported"]) == first.samples(gpu_type="A100-80",
                                                                                    origins=["imported"])
    assert again.samples(kind="layer", gpu_type="cpu-4g") == first.samples(kind="layer", gpu_type="cpu-4g")
    assert again.content_hash() == first.content_hash() and again.gpu_types() == first.gpu_types()


def test_a_changed_store_rebuilds_the_snapshot(tmp_path):
    path, batch = _stored(tmp_path)
    ProfileStore(path).samples()
    old = snapshot.snapshot_path(path).read_bytes()
    extra = sample(mbs=8, fwd=9.0)
    assert ProfileStore(path).append([extra]) == 1
    got = ProfileStore(path).samples()  # a new reader: the snapshot no longer matches the bytes
    assert extra in got and len(got) == len(batch) + 1
    new = snapshot.snapshot_path(path).read_bytes()
    assert new != old
    head = pickle.loads(new)  # the first pickle of the file: the header naming the store's bytes
    assert head[2] == snapshot.store_digest(path)
    # rebuilt whole: the snapshot alone answers with the new sample
    snap, samples = snapshot.load(path, snapshot.store_digest(path))
    assert extra in samples and len(samples) == len(batch) + 1


def test_same_size_and_time_but_other_bytes_is_a_miss(tmp_path):
    # keyed by the store's bytes, not its size and time: a store replaced by one of the same
    # size with its time set back is still read again
    path, _ = _stored(tmp_path)
    ProfileStore(path).samples()
    digest = snapshot.store_digest(path)
    assert snapshot.load(path, digest) is not None
    assert snapshot.load(path, "0" * 64) is None


@pytest.mark.parametrize("damage", [b"", b"not a pickle", None])
def test_a_damaged_snapshot_is_ignored_and_rebuilt(tmp_path, damage):
    path, batch = _stored(tmp_path)
    ProfileStore(path).samples()
    snap_file = snapshot.snapshot_path(path)
    whole = snap_file.read_bytes()
    snap_file.write_bytes(whole[: len(whole) // 2] if damage is None else damage)  # None: cut in half
    got = ProfileStore(path).samples()
    assert sorted(got, key=repr) == sorted(batch, key=repr)
    assert snapshot.load(path, snapshot.store_digest(path)) is not None  # rebuilt
    assert snap_file.read_bytes() == whole


def test_a_snapshot_others_may_write_is_not_loaded(tmp_path):
    path, _ = _stored(tmp_path)
    ProfileStore(path).samples()
    snap_file = snapshot.snapshot_path(path)
    os.chmod(snap_file, 0o666)
    assert snapshot.load(path, snapshot.store_digest(path)) is None
    ProfileStore(path).samples()  # rebuilt with the store's own mode
    assert snapshot.load(path, snapshot.store_digest(path)) is not None


def test_a_failed_write_leaves_the_old_snapshot_and_no_part(tmp_path, monkeypatch):
    path, batch = _stored(tmp_path)
    ProfileStore(path).samples()
    snap_file = snapshot.snapshot_path(path)
    before = snap_file.read_bytes()
    ProfileStore(path).append([sample(mbs=16)])

    real_dump = pickle.dump

    def dump_then_fail(obj, fh, *a, **kw):
        real_dump(obj, fh, *a, **kw)
        if not isinstance(obj, tuple) or len(obj) != 3 or obj[0] != snapshot.FORMAT:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(pickle, "dump", dump_then_fail)
    got = ProfileStore(path).samples()  # answers from the HDF5 file; the new snapshot fails half-way
    assert len(got) == len(batch) + 1
    assert snap_file.read_bytes() == before  # the old one, whole: os.replace never ran
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.h5", "s.h5.snapshot"]  # no temporary left


def test_a_read_only_folder_goes_without(tmp_path, monkeypatch):
    path, batch = _stored(tmp_path)

    def refuse(*a, **kw):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(snapshot.tempfile, "mkstemp", refuse)
    assert sorted(ProfileStore(path).samples(), key=repr) == sorted(batch, key=repr)
    assert not snapshot.snapshot_path(path).exists()


def test_a_plan_from_the_snapshot_ranks_as_one_from_the_hdf5_file(tmp_path, monkeypatch, capsys):
    # the fast path end to end: the same three picks, ranking and time ranks as the plan that
    # read the HDF5 file (and wrote the snapshot)
    import json
    from pathlib import Path

    from memx_hpc.cli.main import main
    from memx_hpc.datapaths import sailor_dir

    root = Path(__file__).resolve().parents[2]
    store = tmp_path / "store.h5"
    assert main(["profile", "import", "--store", str(store), "--format", "sailor", str(sailor_dir())]) == 0
    args = ["plan", "--site", str(root / "site_configs" / "example-cross-vendor.yaml"),
            "--job", str(root / "jobs" / "gpt3-2.7b.yaml"), "--store", str(store), "--no-profile",
            "--max-stages", "2", "--top", "5", "--json"]
    capsys.readouterr()

    def ranked(out: str) -> list:
        d = json.loads(out)
        return [(s["plan"], s["prediction"]["iteration_ms"], s.get("time_rank")) for s in d["top"]] + \
            [(role, d[role]["plan"]) for role in ("recommended", "fastest", "weighted") if d.get(role)]

    snapshot.snapshot_path(store).unlink(missing_ok=True)
    assert main(args + ["--out", str(tmp_path / "a")]) == 0  # reads the HDF5 file, writes the snapshot
    slow = ranked(capsys.readouterr().out)
    assert snapshot.snapshot_path(store).is_file()
    _no_hdf5(monkeypatch)
    assert main(args + ["--out", str(tmp_path / "b")]) == 0  # answers from the snapshot
    assert ranked(capsys.readouterr().out) == slow and slow
