"""A small mixture of experts trains for real on the local Slurm with expert parallel 2,
through the plan the search recommends and the script render writes (benchmarks/moe_cpu.py,
shortened to 6 iterations): the loss falls, each of the two ranks holds 2 of the 4 experts
(an EP group of 2), the checkpoint exists, and the measured numbers sit beside the prediction."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("moe_cpu", ROOT / "benchmarks" / "moe_cpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tiny_moe_trains_with_ep_2_on_slurm(slurm_cluster, tmp_path):
    r = _bench().run(iters=6, out=tmp_path)
    assert r["ep"] == 2 and r["iterations"] == 6
    assert r["losses"][-1] < r["losses"][0] - 0.5, r["losses"]
    assert sorted(x["ep rank"] for x in r["layouts"]) == ["0/2", "1/2"]
    assert {x["experts"] for x in r["layouts"]} == {"2/4"}
    ckpt = ROOT / "memx-local" / "ckpt" / "tiny-moe"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "6"
    assert r["measured_iteration_ms"] > 0 and r["predicted_iteration_ms"] > 0
    assert 0.5 < r["measured_peak_allocated_bytes"] / r["predicted_peak_allocated_bytes"] < 2.0
