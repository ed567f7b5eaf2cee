"""The profiling job ledger (memx_hpc/profile/ledger.py): typed, frozen entries, and the
file format earlier versions wrote still read and written the same way."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from memx_hpc.errors import SystemFailure
from memx_hpc.profile.ledger import Ledger, LedgerEntry, point_from_json, point_key

# one point as version 1 of the ledger stored it (memx_hpc/slurm/dispatch.py before the move)
POINT = {"gpu_type": "cpu-4g", "kind": "layer",
         "shape": {"hidden_size": 256, "num_attention_heads": 4, "num_query_groups": 4, "ffn_hidden_size": 1024,
                   "seq_length": 128, "vocab_size": 1024, "activation": "gelu"},
         "tp": 1, "micro_batch_size": 1, "recompute": "none", "precision": "fp32", "attention": "sdpa",
         "group_size": 1, "message_bytes": 0, "inter_node": False}
KEY = point_key(point_from_json(POINT))


def _entry(job_id: str, state: str, **more) -> dict:
    return {"job_id": job_id, "executor": "slurm", "folder": "/runs/profile", "partition": "nvidia_a100",
            "gpu_type": "cpu-4g", "world_size": 1, "nodes": 1, "measure_device": False, "points": [KEY],
            "point_data": [POINT], "state": state, "attempt": 1, "submitted_at": 1764620000.5, "pid": 4242,
            "reasons": [], **more}


OLD = {"version": 1, "tasks": {
    "101": _entry("101", "submitted"),
    "102": _entry("102", "collected", failures=["layer tp=1: OOM"], wall_s=12.5, collected_at=1764620100.0),
    "103": _entry("103", "failed", attempt=2, reasons=["TIMEOUT: UncompletedJobError: job 103 timed out"]),
    "104": _entry("104", "lost"),
}}


def test_a_ledger_written_by_an_earlier_version_reads_into_typed_entries(tmp_path: Path) -> None:
    path = tmp_path / "store.h5.jobs.json"
    path.write_text(json.dumps(OLD, indent=1, sort_keys=True))
    ledger = Ledger.beside(tmp_path / "store.h5").load()
    assert set(ledger.entries) == {"101", "102", "103", "104"}
    e = ledger.entries["102"]
    assert isinstance(e, LedgerEntry) and e.state == "collected" and e.wall_s == 12.5
    assert e.failures == ("layer tp=1: OOM",) and e.points == (point_from_json(POINT),) and e.point_keys == {KEY}
    assert ledger.entries["103"].attempt == 2 and ledger.entries["103"].reasons[0].startswith("TIMEOUT")
    assert [x.job_id for x in ledger.submitted("slurm")] == ["101"] and ledger.submitted("local") == []
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.state = "submitted"  # type: ignore[misc]


def test_saving_writes_the_same_format_back(tmp_path: Path) -> None:
    path = tmp_path / "store.h5.jobs.json"
    path.write_text(json.dumps(OLD))
    Ledger(path).load().save()
    again = json.loads(path.read_text())
    assert again.keys() == OLD.keys() and again["version"] == 1
    for key, old in OLD["tasks"].items():
        new = again["tasks"][key]
        assert set(new) == set(old), key
        assert {k: v for k, v in new.items() if k != "point_data"} == \
            {k: v for k, v in old.items() if k != "point_data"}, key
        assert [point_from_json(d) for d in new["point_data"]] == [point_from_json(d) for d in old["point_data"]]


def test_update_replaces_an_entry(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.json")
    ledger.put(LedgerEntry(job_id="7", executor="local", folder="/f", partition="p", gpu_type="g", world_size=2,
                           nodes=1, points=(point_from_json(POINT),)))
    before = ledger.entries["7"]
    after = ledger.update("7", state="collected", wall_s=1.0, collected_at=2.0)
    assert before.state == "submitted" and after.state == "collected" and ledger.entries["7"] is after
    ledger.save()
    assert json.loads((tmp_path / "l.json").read_text())["tasks"]["7"]["wall_s"] == 1.0


@pytest.mark.parametrize("change,field", [
    (lambda d: d["tasks"]["101"].pop("job_id"), "tasks.101.job_id"),
    (lambda d: d["tasks"]["101"].update(world_size="two"), "tasks.101.world_size"),
    (lambda d: d["tasks"]["102"].update(state="done"), "tasks.102.state"),
    (lambda d: d["tasks"]["103"].update(attempt=True), "tasks.103.attempt"),
    (lambda d: d["tasks"]["104"].update(point_data=[{"kind": "layer"}]), "tasks.104.point_data[0]"),
    (lambda d: d["tasks"]["101"].update(points=[1]), "tasks.101.points"),
    (lambda d: d.update(version=2), "version"),
    (lambda d: d.update(tasks=[]), "tasks"),
])
def test_a_damaged_entry_is_named(tmp_path: Path, change, field: str) -> None:
    data = copy.deepcopy(OLD)
    change(data)
    path = tmp_path / "store.h5.jobs.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SystemFailure) as e:
        Ledger(path).load()
    assert f"job ledger {path}: {field}:" in str(e.value)
