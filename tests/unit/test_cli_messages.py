"""Messages that name the real cause, and outputs that go where they are asked to."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from memx_hpc.cli.main import main
from memx_hpc.search.report import risk_words

ROOT = Path(__file__).resolve().parents[2]
CROSS = str(ROOT / "site_configs" / "example-cross-vendor.yaml")
LLAMA = str(ROOT / "jobs" / "llama2-7b.yaml")
GPT3 = str(ROOT / "jobs" / "gpt3-2.7b.yaml")


def _plan(tmp_path, *extra):
    return ["plan", "--site", CROSS, "--job", LLAMA, "--no-profile", "--no-reference", "--analytic",
            "--store", str(tmp_path / "s.h5"), "--out", str(tmp_path / "o"), *extra]


def test_no_plan_generated_is_not_no_plan_fits(tmp_path, capsys):
    """--tp 3: no plan exists at all; the message says which constraint removed them."""
    assert main(_plan(tmp_path, "--tp", "3")) == 1
    err = capsys.readouterr().err
    assert "no plan was generated" in err and "fits in memory" not in err
    assert "--tp" in err and "TP 3 does not divide" in err and "FFN width" in err
    # TP 16 divides the heads and spans whole nodes, but no partition has 16 GPUs
    assert main(_plan(tmp_path, "--tp", "16")) == 1
    err = capsys.readouterr().err
    assert "no plan was generated" in err and "--tp-across-nodes" in err and "GPUs per node (4, 8)" in err
    assert main(_plan(tmp_path, "--tp", "16", "--tp-across-nodes")) == 1
    err = capsys.readouterr().err
    assert "no plan was generated" in err and "--tp" in err and "the largest has 8" in err


@pytest.mark.parametrize("r, margin, want", [
    (0.70, 0.05, "low"), (0.90, 0.05, "small"), (0.95, 0.05, "small"), (0.96, 0.05, "HIGH"), (0.98, 0.05, "HIGH"),
    (1.01, 0.05, "REAL"), (0.86, 0.0, "low"), (0.99, 0.0, "small")])
def test_risk_words_follow_the_drawn_limit(r, margin, want):
    """A widened peak past capacity x (1 - margin) is never "low" or "small" risk (a
    never-profiled MI250X at 98 % with its band under a 95 % line was called "small")."""
    words = risk_words(SimpleNamespace(risk_utilisation=r), margin=margin)
    assert f"OOM risk {want}" in words
    if r > 1 - margin:
        assert "low" not in words and "small" not in words


def test_render_out_dash_prints_the_script(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = ROOT / "tests" / "golden" / "plans" / "cross-vendor-gpt3-2.7b.json"
    args = ["render", "--plan", str(plan), "--site", CROSS, "--job", GPT3, "--no-test-only"]
    assert main([*args, "--out", str(tmp_path / "file.sbatch")]) == 0
    capsys.readouterr()
    assert main([*args, "--out", "-"]) == 0
    cap = capsys.readouterr()
    assert cap.out == (tmp_path / "file.sbatch").read_text()
    assert cap.out.startswith("#!/bin/bash") and "bash -n: ok" in cap.err
    assert not (tmp_path / "-").exists()
    assert main([*args, "--out", "-", "--submit"]) == 1
    assert "--submit needs the script in a file" in capsys.readouterr().err


def test_simulate_ranks_as_plan_does(tmp_path, capsys):
    """simulate's best plan is plan's recommended plan, not the weighted product's."""
    common = ["--site", CROSS, "--job", GPT3, "--store", str(tmp_path / "s.h5"), "--no-reference", "--analytic",
              "--max-stages", "2", "--json"]
    assert main(["simulate", *common, "--scale", "40"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert main(["plan", *common, "--no-profile", "--out", str(tmp_path / "o")]) == 0
    summary = json.loads(capsys.readouterr().out)
    own = sim["scales"][0]
    assert own["objective"] == "recommended"
    assert own["top"][0]["index"] == summary["recommended"]["index"]
    if summary["weighted"]["index"] != summary["recommended"]["index"]:
        assert own["top"][0]["index"] != summary["weighted"]["index"]


def test_overlap_flags_say_what_they_do(tmp_path, capsys):
    """Overlap is on by default where it runs (a note says which partitions and why the
    others not); --no-overlap turns it off; search's old --overlap-grad-reduce still runs and
    says it is the default now; predict's is refused naming the plan file's fields."""
    assert main(_plan(tmp_path, "--top", "1", "--max-stages", "1", "--overlap-grad-reduce")) == 0
    out = capsys.readouterr().out
    assert "--overlap-grad-reduce is deprecated and changes nothing" in out
    assert "cross-vendor plans run without --overlap-grad-reduce" in out
    assert "run Megatron's --overlap-grad-reduce" in out and "--tp-comm-overlap" in out
    plan = json.loads((tmp_path / "o" / "latest" / "recommended.json").read_text())
    assert plan["overlap_grad_reduce"] is True and plan["overlap_param_gather"] is True
    assert main(_plan(tmp_path, "--top", "1", "--max-stages", "1", "--no-overlap")) == 0
    assert "--no-overlap: every plan runs without" in capsys.readouterr().out
    plan = json.loads((tmp_path / "o" / "latest" / "recommended.json").read_text())
    assert plan["overlap_grad_reduce"] is False and plan["overlap_param_gather"] is False
    assert main(["predict", "--site", CROSS, "--job", LLAMA, "--plan", str(tmp_path / "o" / "latest" /
                                                                          "recommended.json"),
                 "--overlap-grad-reduce"]) == 1
    err = capsys.readouterr().err
    assert "no longer a predict option" in err and "overlap_grad_reduce" in err


def test_nothing_under_the_margin_names_what_fits_the_capacity(tmp_path, capsys):
    """A margin so wide that no plan fits under it: the search still times the plans that fit
    the GPUs' capacity, the report names the fastest with the margin that admits it, and the
    error says how many the margin alone set aside. With that margin the plan is searched."""
    site = (ROOT / "site_configs" / "example-h100-64.yaml").read_text()
    assert "memory_safety_margin: 0.05\n" in site
    wide = tmp_path / "wide.yaml"
    wide.write_text(site.replace("memory_safety_margin: 0.05\n", "memory_safety_margin: 0.6\n"))
    args = ["search", "--site", str(wide), "--job", str(ROOT / "jobs" / "llama3-70b.yaml"), "--analytic",
            "--no-reference", "--store", str(tmp_path / "s.h5"), "--top", "2", "--max-stages", "2"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 1
    out, err = capsys.readouterr()
    assert "fits in memory" in err and "only the margin sets them aside" in err
    line = next(x for x in out.splitlines() if "set aside by the 60% safety margin alone" in x)
    assert "no plan fits under the margin" in line
    admit = float(line.rsplit("memory_safety_margin: ", 1)[1].split()[0])
    assert 0.0 <= admit < 0.6
    # the plan itself, predicted under the wide margin: inside the margin, not out of memory
    assert main([*args, "--json", "--out", str(tmp_path / "j")]) == 1
    out, _ = capsys.readouterr()
    aside = json.loads(out)["margin_aside"]
    assert aside["plans"] > 0 and not aside["prediction"]["feasible"]
    plan_file = tmp_path / "aside.json"
    plan_file.write_text(json.dumps(aside["plan"]))
    assert main(["predict", "--site", str(wide), "--job", str(ROOT / "jobs" / "llama3-70b.yaml"), "--analytic",
                 "--no-reference", "--store", str(tmp_path / "s.h5"), "--plan", str(plan_file)]) == 0
    out, _ = capsys.readouterr()
    assert "OVER THE SAFETY MARGIN, not out of memory" in out and f"memory_safety_margin: {admit:g}" in out
    assert "DOES NOT FIT" not in out
    wide.write_text(site.replace("memory_safety_margin: 0.05\n", f"memory_safety_margin: {admit}\n"))
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    out, _ = capsys.readouterr()
    assert "recommended" in out
