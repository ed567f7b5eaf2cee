"""What a command that only predicts loads: no training stack (torch, megatron-core), no
plotting, and no XGBoost when the measured anchors answer every query of the plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from memx_hpc.cli.main import main
from memx_hpc.datapaths import sailor_dir

ROOT = Path(__file__).resolve().parents[2]

#: Runs ``memx-hpc ARGS`` in a fresh interpreter, then prints which heavy packages it imported.
PROBE = """
import json, sys
from memx_hpc.cli.main import main
rc = main(sys.argv[1:])
heavy = ("torch", "megatron", "matplotlib", "xgboost", "sklearn", "mpi4py", "submitit", "jinja2")
print(json.dumps({"rc": rc, "imported": [m for m in heavy if m in sys.modules]}))
"""


def _probe(args: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_warm_predict_imports_no_training_stack_and_no_xgboost(tmp_path):
    store = tmp_path / "store.h5"
    assert main(["profile", "import", "--store", str(store), "--format", "sailor", str(sailor_dir())]) == 0
    args = ["predict", "--site", str(ROOT / "site_configs" / "example-cross-vendor.yaml"),
            "--job", str(ROOT / "jobs" / "llama2-7b.yaml"), "--store", str(store),
            "--plan", str(ROOT / "tests" / "golden" / "plans" / "cross-vendor-llama2-7b.json"), "--json"]
    cold = _probe(args)  # fits the predictor and saves it beside the store: XGBoost is needed
    assert cold["rc"] == 0 and "xgboost" in cold["imported"]
    warm = _probe(args)  # reloads it: every query of this plan is anchored
    assert warm == {"rc": 0, "imported": []}


def test_the_help_states_the_planners_rank_threshold(capsys):
    from memx_hpc.planner import MIN_PLANS_PER_RANK
    assert main(["plan", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"searches (default {MIN_PLANS_PER_RANK})" in text


def test_a_warm_plan_copies_an_unchanged_figure_without_matplotlib(tmp_path):
    from memx_hpc.search.report import FIGURE_KEY_TEXT, _png_text
    out = tmp_path / "out"
    args = ["plan", "--site", str(ROOT / "site_configs" / "example-cross-vendor.yaml"),
            "--job", str(ROOT / "jobs" / "gpt3-2.7b.yaml"), "--analytic", "--no-profile",
            "--out", str(out), "--max-stages", "2", "--top", "4", "--json"]
    first = _probe(args)
    assert first["rc"] == 0 and "matplotlib" in first["imported"]
    drawn = (out / "latest" / "pareto.png").resolve()
    assert _png_text(drawn, FIGURE_KEY_TEXT)  # the key of what it shows, in the PNG
    second = _probe(args)  # the same answer: the last run's figure is copied, matplotlib not loaded
    assert second["rc"] == 0 and "matplotlib" not in second["imported"]
    copied = (out / "latest" / "pareto.png").resolve()
    assert copied != drawn and copied.read_bytes() == drawn.read_bytes()
    third = _probe(args[:-3] + ["--top", "3", "--json"])  # another top-K: another figure, drawn
    assert third["rc"] == 0 and "matplotlib" in third["imported"]
    assert _png_text((out / "latest" / "pareto.png").resolve(), FIGURE_KEY_TEXT) != _png_text(drawn, FIGURE_KEY_TEXT)
