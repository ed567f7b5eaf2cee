"""The measuring loop on the real local Slurm: ``verify`` (searched top plan and given plan
files) stores end-to-end runs in the profile store, skips what was measured, reports
before/after-calibration errors leave-one-out; ``plan`` then uses the calibration; and
``plan --submit`` submits the best plan as a job Slurm knows.

Short on purpose: tiny-gpt, ``--top 1``, ``--iters 3`` (each run is a real job of ~20 s here).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from memx_hpc.cli.main import main
from memx_hpc.profile.store import ProfileStore

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "tiny-gpt.yaml"
PP2 = ROOT / "tests" / "golden" / "plans" / "local-pp2-a100-mi250.json"


@pytest.fixture
def local_site(local_site_copy):
    """The local site with its store and run folder in ``tmp_path``."""
    return lambda tmp_path: local_site_copy(tmp_path, store=str(tmp_path / "store.h5"),
                                            work_dir=str(tmp_path / "runs"))


@pytest.mark.slurm
@pytest.mark.slow
def test_verify_searches_measures_stores_and_calibrates(tmp_path: Path, capsys: pytest.CaptureFixture, local_site) -> None:
    site_file = local_site(tmp_path)
    common = ["--site", str(site_file), "--job", str(JOB), "--iters", "3", "--chdir", str(ROOT), "--json"]

    # 1. no --plans: search (datasheet model: the store is empty), run the top plan for real
    assert main(["verify", "--top", "1", *common]) == 0
    first = json.loads(capsys.readouterr().out)
    (row,) = first["plans"]
    assert row["new"] is True and row["measured_ms"] > 0 and row["measured_peak_mib"] > 0
    assert Path(row["plan"]).name == "plan-01.json" and Path(row["plan"]).is_file()
    # predicted at the time = what the search ranked it with
    summary = json.loads((tmp_path / "runs" / "plan-tiny-gpt" / "latest" / "summary.json").read_text())
    assert row["predicted_at_the_time_ms"] == pytest.approx(summary["top"][0]["prediction"]["iteration_ms"])
    # one run only: the leave-one-out 'after' has nothing to learn from
    assert row["calibrated_on_runs"] == 0 and row["after_ms"] == pytest.approx(row["before_ms"])
    store = ProfileStore(tmp_path / "store.h5")
    (rec,) = store.e2e_records(site="local", job="tiny-gpt")
    assert rec.job_id == row["job_id"] and rec.iters == 3 and rec.origin == "measured"
    assert rec.provenance["slurm_state"] == "COMPLETED" and rec.job_spec["model"]["num_layers"] == 4
    assert set(rec.gpu_type_by_rank) == set(rec.stage_by_rank) and rec.peak_footprint_bytes > 0
    assert not (tmp_path / "store.e2e.jsonl").exists()
    assert first["calibration"]["runs"] == 1

    # 2. a plan file on two partitions: a second run; each is now predicted from the other
    argv = ["verify", "--plans", str(PP2), "--top", "1", *common]
    assert main(argv) == 0
    second = json.loads(capsys.readouterr().out)
    (row2,) = second["plans"]
    assert row2["new"] is True and row2["calibrated_on_runs"] == 1
    assert row2["after_ms"] != pytest.approx(row2["before_ms"])
    assert second["all_runs_leave_one_out"]["runs"] == 2
    recs = store.e2e_records(site="local")
    assert [r.job_id for r in recs] == [row["job_id"], row2["job_id"]]
    assert recs[1].gpu_type_by_rank == {"0": "cpu-4g", "1": "cpu-4g"} and recs[1].stage_by_rank == {"0": 0, "1": 1}

    # 3. the same plan again: nothing runs, nothing is added
    assert main(argv) == 0
    (again,) = json.loads(capsys.readouterr().out)["plans"]
    assert again["new"] is False and again["job_id"] == row2["job_id"]
    assert len(store.e2e_records()) == 2

    # 4. plan and predict now use the calibration (fitted on both runs) and say so
    assert main(["plan", "--site", str(site_file), "--job", str(JOB), "--no-profile", "--top", "3",
                 "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert any("calibrated by end-to-end runs" in n and "2 run(s) of job tiny-gpt" in n for n in planned["notes"])
    assert main(["predict", "--site", str(site_file), "--job", str(JOB), "--plan", str(PP2), "--json"]) == 0
    predicted = json.loads(capsys.readouterr().out)
    assert any("calibrated by end-to-end runs" in n for n in predicted["notes"])
    # the datasheet figures are far too fast for this CPU: the calibrated prediction is closer
    assert abs(predicted["iteration_ms"] - row2["measured_ms"]) < abs(row2["before_ms"] - row2["measured_ms"])


@pytest.mark.slurm
def test_plan_submit_returns_a_job_slurm_knows(tmp_path: Path, capsys: pytest.CaptureFixture, local_site) -> None:
    site_file = local_site(tmp_path)
    assert main(["plan", "--site", str(site_file), "--job", str(JOB), "--no-profile", "--top", "2", "--submit",
                 "--iters", "2", "--chdir", str(ROOT), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    sub = out["submitted"]
    job_id = sub["job_id"]
    try:
        assert job_id.isdigit()
        script = Path(sub["script"])
        assert script.resolve() == (tmp_path / "runs" / "plan-tiny-gpt" / "latest" / "plan-01.sbatch").resolve()
        assert script.is_file()
        assert "#SBATCH" in script.read_text() and str(script) in out["files"]
        shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30)
        assert shown.returncode == 0 and f"JobId={job_id}" in shown.stdout
        assert "JobName=memx-tiny-gpt" in shown.stdout
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)


def test_plan_submit_without_slurm_is_a_system_error(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch, local_site) -> None:
    site_file = local_site(tmp_path)
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty) + os.pathsep + "/usr/bin/no-slurm-here")  # no sinfo, no sbatch
    assert main(["plan", "--site", str(site_file), "--job", str(JOB), "--no-profile", "--submit"]) == 2
    err = capsys.readouterr().err
    assert "Slurm does not answer" in err and "nothing was submitted" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # stopped before searching


def test_runs_kept_as_json_lines_by_earlier_versions_move_into_the_store(tmp_path: Path) -> None:
    from memx_hpc.train.measure import move_legacy_records
    from memx_hpc.records import E2ERecord

    rec = E2ERecord(key="k1", plan={"format": "memx-plan/1"}, site="local", job="tiny-gpt", iters=5,
                    iteration_ms=12.5, peak_allocated_bytes={"0": 10}, peak_footprint_bytes_by_rank={"0": 30},
                    gpu_type_by_rank={"0": "cpu-4g"}, job_id="7", log_file="x.out")
    rec.append_to(tmp_path / "store.e2e.jsonl")  # what verify wrote before runs lived in the store
    store = ProfileStore(tmp_path / "store.h5")
    notes: list[str] = []
    assert move_legacy_records(store, notes) == 1
    assert store.e2e_records("local") == [rec] and "moved 1 run(s)" in notes[0]
    assert move_legacy_records(store, notes) == 0 and len(notes) == 1  # moved once
