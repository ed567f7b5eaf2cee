"""The wheel carries the templates and the catalog data; every subcommand teaches with --help."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from memx_hpc.cli.main import SUBCOMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_contains_templates_and_data(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    wheel = next(tmp_path.glob("memx_hpc-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    templates = sorted(p.name for p in (ROOT / "templates").glob("*.j2"))
    assert templates, "templates/ holds no Jinja templates"
    for t in templates:
        assert f"memx_hpc/templates/{t}" in names
    assert "memx_hpc/data/gpus.yaml" in names and "memx_hpc/data/models.yaml" in names
    # the reference profiles a new store starts from, with their licences and provenance
    ref = ROOT / "memx_hpc" / "data" / "reference"
    shipped = sorted(p.relative_to(ROOT).as_posix() for p in ref.rglob("*") if p.is_file())
    assert len(shipped) >= 23 and set(shipped) <= names, sorted(set(shipped) - names)
    assert {"memx_hpc/data/reference/sailor/LICENSE", "memx_hpc/data/reference/cephalo/LICENSE",
            "memx_hpc/data/reference/PROVENANCE.md"} <= names
    entry = [n for n in names if n.endswith("entry_points.txt")]
    assert entry and b"memx-hpc = memx_hpc.cli.main:entry" in zipfile.ZipFile(wheel).read(entry[0])


def test_every_design_subcommand_is_registered():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == set(SUBCOMMANDS)


@pytest.mark.parametrize("cmd", SUBCOMMANDS)
def test_help_teaches(cmd, capsys):
    assert main([cmd, "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: memx-hpc " + cmd in out
    assert "example" in out.lower(), f"'memx-hpc {cmd} --help' shows no example"


def test_unknown_option_is_bad_input(capsys):
    assert main(["validate", "--sitee", "x"]) == 1
    assert "unrecognized arguments" in capsys.readouterr().err


def test_module_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "memx_hpc", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "memx-hpc" in r.stdout
