"""Plans ranked by when they finish: Slurm's start estimates, the usable part of a site,
and finish goals, on real captured output (see tests/unit/test_discover.py for the node,
partition and reservation captures; ``testonly-*.txt`` are ``sbatch --test-only``'s stderr
and exit code on that cluster for a busy node, a drained one, a reserved one, an
impossible request and an unknown partition).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from memx_hpc.errors import SpecError, SystemFailure
from memx_hpc.cli.main import main
from memx_hpc.planner import FinishCandidate, FinishGoal, finish_order, parse_finish, usable_site
from memx_hpc.sitegen import discover
from memx_hpc.slurm.discover import ClusterView, parse_nodes, parse_partitions, parse_reservations
from memx_hpc.slurm.estimate import StartEstimate, parse_test_only
from memx_hpc.spec import load_job, load_site, parse_yaml, site_from_mapping

OUT = Path(__file__).parent / "slurm_output"
ROOT = Path(__file__).resolve().parents[2]


def text(name: str) -> str:
    return (OUT / name).read_text()


def view(nodes: str = "nodes-idle.txt", reservations: str = "res-none.txt"):
    res = parse_reservations(text(reservations))
    return ClusterView(name="memx", partitions=parse_partitions(text("partitions.txt")), nodes=parse_nodes(text(nodes)),
                       reservations=res, read_at=res[0].start if res else datetime.now().astimezone())


def test_test_only_answers():
    busy = parse_test_only(text("testonly-busy.txt"))
    assert busy.accepted and busy.nodes == ("a100n0",) and busy.partition == "nvidia_a100" and busy.processors == 2
    assert busy.start == datetime.fromisoformat("2026-12-01T21:39:54").astimezone()
    assert busy.wait_s(busy.start) == 0 and busy.wait_s(busy.start.replace(second=0)) == 54
    het = parse_test_only("sbatch: Job 5 to start at 2026-12-01T21:38:51 using 4 processors on a100n0,mi250n0\n")
    assert het.accepted and het.nodes == ("a100n0", "mi250n0") and het.partition is None
    for name in ("testonly-drained.txt", "testonly-reserved.txt", "testonly-impossible.txt", "testonly-badpart.txt"):
        body = text(name).rsplit("rc=", 1)[0]
        e = parse_test_only(body, accepted=False)
        assert not e.accepted and e.start is None and e.message
    assert "Invalid partition" in parse_test_only(text("testonly-badpart.txt").rsplit("rc=", 1)[0],
                                                  accepted=False).message


# --------------------------------------------------------------------------- planning on what a job can get


def test_usable_site_drops_drained_and_reserved_nodes():
    site = discover(view()).site()
    usable, notes = usable_site(site, view("nodes-mixed.txt", "res-one.txt"))
    assert [p.name for p in usable.partitions] == ["nvidia_a100"]  # a busy node is usable: it frees up
    joined = " ".join(notes)
    assert "v100n0 drained" in joined and "held by reservation" in joined and "left out of the plans" in joined
    with pytest.raises(SystemFailure, match="no partition"):
        usable_site(site, ClusterView(name="memx", partitions=parse_partitions(text("partitions.txt")),
                                      nodes=tuple(n for n in parse_nodes(text("nodes-mixed.txt"))
                                                  if n.name == "v100n0")))


def test_usable_site_refuses_a_partition_slurm_lacks():
    site = load_site(ROOT / "site_configs" / "example-cross-vendor.yaml")
    with pytest.raises(SpecError, match=r"partitions\[0\].name.*not a partition of this Slurm cluster"):
        usable_site(site, view())


def test_usable_site_counts_only_nodes_with_the_partitions_gpus():
    data = parse_yaml(discover(view()).yaml())
    data["partitions"][0]["gres_type"] = "a100x"
    site = site_from_mapping(data)
    usable, notes = usable_site(site, view())
    assert "nvidia_a100" not in [p.name for p in usable.partitions]
    assert any("carries gpu:a100x:2" in n for n in notes)


@pytest.mark.parametrize("text_, amount, unit", [("1000", 1000, "iterations"), ("5k it", 5000, "iterations"),
                                                 ("2M samples", 2e6, "samples"), ("1.5Btokens", 1.5e9, "tokens"),
                                                 ("1e3iters", 1000, "iterations")])
def test_finish_goals(text_, amount, unit):
    g = parse_finish(text_)
    assert (g.amount, g.unit) == (amount, unit)


def test_finish_goal_in_iterations():
    job = load_job(ROOT / "jobs" / "tiny-gpt.yaml")  # global batch 8, sequence 128
    assert parse_finish("1000").iterations(job) == 1000
    assert parse_finish("801 samples").iterations(job) == 101
    assert parse_finish("1024 tokens").iterations(job) == 1
    assert parse_finish("1025 tokens").iterations(job) == 2
    for bad in ("", "ten", "5 parsecs", "-3"):
        with pytest.raises(SpecError, match="--finish"):
            parse_finish(bad)
    with pytest.raises(SpecError, match="--finish"):
        FinishGoal(amount=0)
    with pytest.raises(SpecError, match="at most"):
        parse_finish("1T").iterations(job)


def _candidate(name: str, *, wait_s: float | None, run_s: float, accepted: bool = True):
    now = datetime.fromisoformat("2026-12-01T21:00:00").astimezone()
    start = None if wait_s is None else now + timedelta(seconds=wait_s)
    est = StartEstimate(accepted=accepted, message=name, start=start if accepted else None)
    return FinishCandidate(scored=None, sources=(name,), iterations=1, run_s=run_s, time_limit_min=1,
                           components=(), estimate=est, asked_at=now.replace(microsecond=250_000))


def test_candidates_are_ordered_by_finish_not_by_speed_or_start():
    now_slow = _candidate("starts now, runs 100 s", wait_s=0, run_s=100)
    wait_fast = _candidate("waits 60 s, runs 30 s", wait_s=60, run_s=30)
    wait_long = _candidate("waits 200 s, runs 1 s", wait_s=200, run_s=1)
    no_time = _candidate("no start time", wait_s=None, run_s=1)
    refused = _candidate("refused", wait_s=0, run_s=1, accepted=False)
    order = finish_order([refused, no_time, now_slow, wait_long, wait_fast])
    assert [c.sources[0] for c in order] == ["waits 60 s, runs 30 s", "starts now, runs 100 s",
                                             "waits 200 s, runs 1 s", "no start time", "refused"]
    assert wait_fast.wait_s == 60 and now_slow.wait_s == 0  # Slurm's whole second is "now"
    assert (wait_fast.finish_at - now_slow.finish_at).total_seconds() == -10
    assert refused.finish_at is None and refused.wait_s is None


def test_finish_input_errors_are_bad_input(capsys):
    site, job = str(ROOT / "site_configs" / "local.yaml"), str(ROOT / "jobs" / "tiny-gpt.yaml")
    assert main(["plan", "--site", site, "--job", job, "--finish", "5 parsecs"]) == 1
    assert "--finish" in capsys.readouterr().err
    assert main(["plan", "--site", site, "--job", job, "--finish", "100", "--iters", "5"]) == 1
    assert "--iters" in capsys.readouterr().err
