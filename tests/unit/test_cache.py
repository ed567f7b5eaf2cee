"""The hash-signature cache: stable signatures, persistence, invalidation, concurrent writers."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import subprocess
import sys

import numpy as np
import pytest

from memx_hpc.model.api import LayerQuery
from memx_hpc.search.cache import PredictionCache, predict_with_cache, signature
from memx_hpc.spec import LayerShape

SHAPE = LayerShape(hidden_size=1024, num_attention_heads=8, num_query_groups=8, ffn_hidden_size=4096,
                   seq_length=512, vocab_size=1000)


def q(**kw) -> LayerQuery:
    base = dict(gpu_type="A100-80", kind="layer", shape=SHAPE, tp=1, micro_batch_size=1, recompute="none",
                precision="bf16")
    base.update(kw)
    return LayerQuery(**base)


class CountingModel:
    identity = "a" * 64

    def __init__(self) -> None:
        self.rows = 0

    def predict(self, queries):
        self.rows += len(queries)
        return np.array([[float(x.tp * 10 + x.micro_batch_size), 1e6 * x.micro_batch_size] for x in queries])


def test_signature_is_stable_across_processes_and_sensitive_to_every_feature():
    s = signature("id1", q())
    code = ("from memx_hpc.search.cache import signature; from memx_hpc.model.api import LayerQuery; "
            "from memx_hpc.spec import LayerShape; import json,sys; "
            "sh = LayerShape(hidden_size=1024, num_attention_heads=8, num_query_groups=8, ffn_hidden_size=4096, "
            "seq_length=512, vocab_size=1000); "
            "print(signature('id1', LayerQuery(gpu_type='A100-80', kind='layer', shape=sh, tp=1, micro_batch_size=1, "
            "recompute='none', precision='bf16')))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", "PATH": ""}).stdout.strip()
    assert other == s and len(s) == 64
    variants = [q(tp=2), q(micro_batch_size=2), q(recompute="full"), q(kind="head"), q(gpu_type="V100-32"),
                q(precision="fp16"), q(attention="core"), q(shape=dataclasses.replace(SHAPE, seq_length=1024)),
                q(tp=2, sequence_parallel=True)]
    sigs = {signature("id1", v) for v in variants} | {s, signature("id2", q())}
    assert len(sigs) == len(variants) + 2


def test_misses_are_predicted_once_and_persist(tmp_path):
    path = tmp_path / "cache.sqlite"
    model = CountingModel()
    qs = [q(tp=t, micro_batch_size=b) for t in (1, 2) for b in (1, 2, 4)]
    c1 = PredictionCache(identity=model.identity, path=path)
    out = predict_with_cache(model, qs + qs[:2], c1)
    assert model.rows == 6 and c1.stats.predicted == 6 and c1.stats.hits == 0
    assert out[q(tp=2, micro_batch_size=4)] == (24.0, 4e6)
    # a new process-level object on the same file: everything hits, nothing is predicted
    c2 = PredictionCache(identity=model.identity, path=path)
    predict_with_cache(model, qs, c2)
    assert model.rows == 6 and c2.stats.file_hits == 6 and c2.stats.hit_rate == 1.0 and len(c2) == 6


def test_rows_of_other_prediction_code_are_not_served(tmp_path, monkeypatch):
    # the same cost-model identity under a new version of the prediction code: the rows an
    # older version computed are dropped, not answered
    import memx_hpc.search.cache as cache_mod
    path = tmp_path / "cache.sqlite"
    model = CountingModel()
    predict_with_cache(model, [q(tp=1), q(tp=2)], PredictionCache(identity=model.identity, path=path))
    assert model.rows == 2
    monkeypatch.setattr(cache_mod, "code_fingerprint", lambda: "another version")
    newer = PredictionCache(identity=model.identity, path=path)
    predict_with_cache(model, [q(tp=1), q(tp=2)], newer)
    assert model.rows == 4 and newer.stats.invalidated == 2 and newer.stats.file_hits == 0


def test_new_predictor_identity_invalidates(tmp_path):
    path = tmp_path / "cache.sqlite"
    old = PredictionCache(identity="old", path=path)
    old.put_many({signature("old", q(tp=t)): (1.0, 2.0) for t in (1, 2, 4)})
    new = PredictionCache(identity="new", path=path).open()
    assert new.stats.invalidated == 3 and len(new) == 0
    assert PredictionCache(identity="old", path=path).get_many([signature("old", q())]) == {}


def _writer(path: str, worker: int, n: int) -> None:
    c = PredictionCache(identity="shared", path=__import__("pathlib").Path(path))
    for k in range(n):
        # overlapping keys between workers: the same signature always carries the same value
        c.put_many({f"sig{(worker * 7 + k) % 60}": (float((worker * 7 + k) % 60), 1.0)})
        c.get_many([f"sig{k}"])


def test_several_processes_share_the_file(tmp_path):
    path = tmp_path / "shared.sqlite"
    PredictionCache(identity="shared", path=path).open()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), w, 40)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    c = PredictionCache(identity="shared", path=path)
    got = c.get_many([f"sig{i}" for i in range(60)])
    assert len(got) == len({(w * 7 + k) % 60 for w in range(4) for k in range(40)})
    assert all(v == (float(s[3:]), 1.0) for s, v in got.items())


def test_memory_only_cache():
    model = CountingModel()
    c = PredictionCache(identity=model.identity)
    predict_with_cache(model, [q(), q(tp=2)], c)
    predict_with_cache(model, [q(), q(tp=2), q(tp=4)], c)
    assert model.rows == 3 and len(c) == 3 and c.stats.hits == 2


def test_unwritable_cache_is_a_system_failure(tmp_path):
    from memx_hpc.errors import SystemFailure
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SystemFailure, match="prediction cache"):
        PredictionCache(identity="x", path=blocker / "sub" / "c.sqlite").open()
    assert json.dumps(PredictionCache(identity="x").stats.to_dict())


def test_a_damaged_row_is_a_miss_predicted_again_and_replaced(tmp_path):
    import sqlite3

    path = tmp_path / "c.sqlite"
    c = PredictionCache(identity="m1", path=path)
    c.put_many({"a": (1.0, 2.0), "b": (3.0, 4.0)})
    con = sqlite3.connect(str(path))
    con.execute("UPDATE predictions SET time_ms = 'not a number' WHERE signature = 'a'")
    con.execute("UPDATE predictions SET activation_bytes = -1 WHERE signature = 'b'")
    con.commit()
    con.close()
    fresh = PredictionCache(identity="m1", path=path)
    assert fresh.get_many(["a", "b"]) == {} and fresh.stats.damaged == 2
    fresh.put_many({"a": (1.5, 2.0)})
    assert PredictionCache(identity="m1", path=path).get_many(["a"]) == {"a": (1.5, 2.0)}
