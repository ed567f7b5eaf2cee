"""Whole plans against real runs (../shared/data/sailor, MIT licence): loose guards well above
what benchmarks/end_to_end.py reports, on its dev split only, so that a regression of the
composition, the link curves or the device-memory model fails CI without tuning to today's
numbers (the goals and the test split are the benchmark's)."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from memx_hpc.datapaths import shared_data
from memx_hpc.model.compose import predict_general
from memx_hpc.model.memory import fit_device_memory, prior_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("end_to_end_bench", ROOT / "benchmarks" / "end_to_end.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def runs(bench):
    logging.getLogger("memx_hpc.profile.importers").setLevel(logging.ERROR)
    predictor, _ = bench.fit_predictor(shared_data())
    root = shared_data() / "sailor" / "validation_dev" / "clariden" / "GPT-NEO"
    out = []
    for f in sorted(root.glob("N*/plan_config_*.json")):
        nodes = int(f.parent.name[1:])
        if bench.split_of_sailor(nodes) != "dev":
            continue
        plan, site, job, real_ms, mem = bench.sailor_case(f)
        pred = predict_general(plan, site, job, predictor, links=bench.sailor_links(site))
        top = max(pred.stages, key=lambda s: s.peak_bytes)
        out.append(dict(name=f.name, model=job.model.name, real_ms=real_ms, pred=pred, mem=float(mem),
                        alloc=float(top.state_bytes + top.activation_bytes), state=float(top.state_bytes), red_grads_ms=json.loads(f.read_text())["red_grads"] * 1e3))
    return out


def test_a_plan_at_profiled_layers_composes_to_its_measured_time(runs):
    # OPT-350 on GH200 (N4_D4) was profiled by Sailor layer by layer: with those layer times the
    # composition (schedule, DP synchronisation, optimizer) must land near the measured iteration
    r = next(r for r in runs if r["model"] == "OPT-350")
    assert abs(r["pred"].iteration_ms - r["real_ms"]) / r["real_ms"] < 0.10


def test_leave_one_out_device_memory(runs):
    errs = []
    for i, r in enumerate(runs):
        others = [x for j, x in enumerate(runs) if j != i]
        fit = fit_device_memory([x["alloc"] for x in others], [x["mem"] for x in others], prior_for("nvidia"),
                                state_bytes=[x["state"] for x in others])
        errs.append(abs(fit.footprint(r["alloc"], r["state"]) - r["mem"]) / r["mem"])
    assert np.mean(errs) < 0.08 and max(errs) < 0.15


def test_synchronisation_is_a_small_physical_share(runs):
    # the DP all-reduce on Sailor's GH200 curves: never above what Sailor measured for the whole
    # gradient reduction, and a few % of the iteration
    for r in runs:
        sync = max(s.grad_sync_ms for s in r["pred"].stages)
        assert sync <= r["red_grads_ms"] * 1.05 or r["model"] == "OPT-350"
        assert sync < 0.1 * r["pred"].iteration_ms
