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


# --------------------------------------------------------------------------- a training run


def _event(event, outcome, segment, job, it, **more):
    return json.dumps({"event": event, "outcome": outcome, "segment": segment, "job_id": job, "restart": 0,
                       "iteration": it, "target_iters": 6, "exit_code": more.get("rc", 0),
                       "next_job_id": more.get("next", ""), "time": "2025-01-01T00:00:00Z"})


def _run_folder(tmp_path, lines, tracker="4"):
    run, ck = tmp_path / "runs" / "job", tmp_path / "ck"
    run.mkdir(parents=True)
    ck.mkdir()
    (ck / "latest_checkpointed_iteration.txt").write_text(tracker)
    (run / "checkpoint_dir.txt").write_text(f"{ck}\n")
    (run / "segments.jsonl").write_text("\n".join(lines) + "\n")
    return run, ck


def test_status_of_a_run_shows_its_segments_checkpoint_and_why_it_stopped(tmp_path, capsys):
    from memx_hpc.planner import run_status

    run, ck = _run_folder(tmp_path, [
        _event("start", "running", 1, "11", 0), _event("end", "continued", 1, "11", 2, next="12"),
        "not json {", _event("start", "running", 2, "12", 2), _event("end", "no-progress", 2, "12", 2, rc=1)],
        tracker="2")
    st = run_status(run, ask_slurm=False)
    assert [(s.segment, s.job_id, s.start_iteration, s.end_iteration, s.outcome) for s in st.segments] == [
        (1, "11", 0, 2, "continued"), (2, "12", 2, 2, "no-progress")]
    assert (st.state, st.checkpoint_iteration, st.target_iters, st.skipped_lines) == ("stopped", 2, 6, 1)
    assert "wrote no checkpoint newer than iteration 2 (step exit code 1)" in st.why
    # the checkpoint folder alone: its tracker
    assert run_status(ck, ask_slurm=False).checkpoint_iteration == 2
    assert main(["status", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["state"] == "stopped" and len(out["segments"]) == 2 and out["checkpoint_dir"] == str(ck)
    assert main(["status", str(run)]) == 0
    text = capsys.readouterr().out
    assert "no-progress" in text and "latest iteration 2 of 6" in text and "stopped:" in text


def test_status_of_a_running_waiting_and_complete_run(tmp_path):
    from memx_hpc.planner import run_status

    a, _ = _run_folder(tmp_path / "a", [_event("start", "running", 1, "11", 0)], tracker="1")
    assert run_status(a, ask_slurm=False).state == "running"
    b, _ = _run_folder(tmp_path / "b", [_event("start", "running", 1, "11", 0),
                                        _event("end", "continued", 1, "11", 3, next="12")], tracker="3")
    st = run_status(b, ask_slurm=False)
    assert st.state == "waiting" and "submitted segment 2 as job 12" in st.why
    c, _ = _run_folder(tmp_path / "c", [_event("start", "running", 3, "13", 4),
                                        _event("end", "complete", 3, "13", 6)], tracker="6")
    assert run_status(c, ask_slurm=False).state == "complete"


def test_status_refuses_what_is_not_a_run_and_reads_only_the_end_of_a_huge_state_file(tmp_path, capsys):
    from memx_hpc.planner import runs

    assert main(["status", str(tmp_path / "nothing")]) == 1
    assert "RUN" in capsys.readouterr().err
    (tmp_path / "plain.sbatch").write_text("#!/bin/bash\nsrun true\n")
    assert main(["status", str(tmp_path / "plain.sbatch")]) == 1
    assert "does not continue itself" in capsys.readouterr().err
    assert main(["status"]) == 1
    run, _ = _run_folder(tmp_path / "big", [])
    line = _event("start", "running", 1, "11", 0)
    with open(run / "segments.jsonl", "w") as f:
        for _ in range(runs.MAX_STATE_BYTES // len(line) * 3):
            f.write(line + "\n")
        f.write(_event("end", "complete", 1, "11", 6) + "\n")
    st = runs.run_status(run, ask_slurm=False)
    assert st.state == "complete" and len(st.segments) < runs.MAX_STATE_BYTES // len(line) + 2
