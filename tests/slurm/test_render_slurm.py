"""Rendered scripts against the real local Slurm: ``sbatch --test-only`` accepts every script
rendered for the local site, and refuses one that asks for more than the cluster has.

(The example cross-vendor site's partitions do not exist here: only its bash syntax is
checked, in tests/unit/test_render.py.)
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from memx_hpc.cli.main import main
from memx_hpc.planfile import load_plan
from memx_hpc.slurm import submit
from memx_hpc.slurm.render import render
from memx_hpc.spec import Plan, Stage, load_job, load_site

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
PLANS = sorted((ROOT / "tests" / "golden" / "plans").glob("local-*.json"))
LOCAL = ROOT / "site_configs" / "local.yaml"
JOB = ROOT / "jobs" / "tiny-gpt.yaml"


@pytest.mark.parametrize("plan_file", PLANS, ids=[p.stem for p in PLANS])
def test_local_scripts_pass_test_only(plan_file: Path, tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(render(load_plan(plan_file), load_site(LOCAL), load_job(JOB), log_dir=str(tmp_path)))
    verdict = submit.test_only(script)
    assert verdict.accepted, verdict.message
    assert "to start at" in verdict.message


def test_quoted_paths_with_spaces_pass_test_only(tmp_path: Path) -> None:
    site = load_site(LOCAL)
    site = dataclasses.replace(site, work_dir=str(tmp_path / "a dir; with $(odd) chars"))
    script = tmp_path / "job.sbatch"
    script.write_text(render(load_plan(PLANS[0]), site, load_job(JOB)))
    verdict = submit.test_only(script)
    assert verdict.accepted, verdict.message


def test_cli_reports_test_only_verdict(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "s.sbatch"
    rc = main(["render", "--plan", str(PLANS[0]), "--site", str(LOCAL), "--job", str(JOB), "--out", str(out),
               "--log-dir", str(tmp_path), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0 and data["test_only"]["accepted"] is True and "to start at" in data["test_only"]["message"]


def test_more_nodes_than_the_cluster_has_is_rejected_by_slurm(tmp_path: Path, capsys: pytest.CaptureFixture, local_site_copy) -> None:
    """The site file may claim more than the cluster has; render cannot know, Slurm does."""
    site_file = local_site_copy(tmp_path)
    data = yaml.safe_load(site_file.read_text())
    data["partitions"][0]["nodes"] = 2
    site_file.write_text(yaml.safe_dump(data))
    plan = Plan(tp=2, dp=1, micro_batch_size=1, global_batch_size=8,
                stages=(Stage(partition="nvidia_a100", num_layers=2), Stage(partition="nvidia_a100", num_layers=2)))
    from memx_hpc.planfile import save_plan

    save_plan(plan, tmp_path / "plan.json")
    rc = main(["render", "--plan", str(tmp_path / "plan.json"), "--site", str(site_file), "--job", str(JOB),
               "--log-dir", str(tmp_path), "--json"])
    verdict = json.loads(capsys.readouterr().out)["test_only"]
    assert rc == 1 and verdict["accepted"] is False and verdict["message"]


def test_the_sites_slurm_options_pass_test_only(tmp_path: Path) -> None:
    """What a SlurmRequest writes, Slurm takes: memory in MiB (half a GiB: --mem=512M, not
    --mem=0), whole nodes, a signal before the time limit, no requeue."""
    site = load_site(LOCAL)
    parts = list(site.partitions)
    parts[0] = dataclasses.replace(parts[0], mem_per_node_gib=0.5)
    site = dataclasses.replace(site, partitions=tuple(parts), exclusive=True, signal="B:USR1@60", requeue=False)
    text = render(load_plan(PLANS[0]), site, load_job(JOB), log_dir=str(tmp_path))
    for line in ("#SBATCH --mem=512M", "#SBATCH --exclusive", "#SBATCH --signal=B:USR1@60", "#SBATCH --no-requeue"):
        assert line in text.splitlines(), line
    done = submit.launch(text, tmp_path / "job.sbatch", test_only_when="always")
    assert done.test_only is not None and done.test_only.accepted, done.test_only
    assert done.job_id is None  # asked, not submitted
