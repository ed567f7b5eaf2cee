"""The README's showcase runs on a fresh clone and prints what the README shows.

Every fenced block under a ``<!-- readme-check: NAME -->`` marker is compared line by line
with what the command of that name prints, so the README and the code cannot drift apart:
a change that moves a number fails here until the README shows the new one.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from memx_hpc.cli.main import main
from memx_hpc.profile.reference import reference_dir

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _blocks() -> dict[str, list[str]]:
    text = README.read_text(encoding="utf-8")
    out = {}
    for m in re.finditer(r"<!-- readme-check: ([\w-]+) -->\n```[^\n]*\n(.*?)\n```", text, re.S):
        out[m.group(1)] = m.group(2).splitlines()
    return out


def _showcase_command() -> list[str]:
    """The plan command exactly as the README writes it (continuation lines joined)."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## What `plan` reports"):]
    block = re.search(r"```bash\n(.*?)\n```", section, re.S).group(1)
    line = block.replace("\\\n", " ")
    words = line.split()
    assert words[0] == ".venv/bin/memx-hpc" and words[1] == "plan", words
    return words[1:]


def test_reference_data_is_shipped_with_licences():
    root = reference_dir()
    for sub in ("sailor", "cephalo"):
        assert "MIT License" in (root / sub / "LICENSE").read_text()
    assert (root / "PROVENANCE.md").is_file()
    assert len(list((root / "sailor" / "profiles").glob("*/*/profile.json"))) == 17
    assert (root / "cephalo" / "model_latencies.json").is_file()


def test_readme_showcase_prints_what_the_readme_shows(tmp_path, monkeypatch, capsys):
    """A fresh store (no ../shared, no MEMX_SHARED_DATA) started from the shipped reference
    profiles; the three picks are the README's lines, character for character."""
    monkeypatch.delenv("MEMX_SHARED_DATA", raising=False)
    monkeypatch.chdir(ROOT)
    argv = _showcase_command()
    store, out = tmp_path / "xv-store.h5", tmp_path / "xv-plans"
    argv[argv.index("--store") + 1] = str(store)
    argv[argv.index("--out") + 1] = str(out)
    assert main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    want = _blocks()["plan-picks"]
    start = printed.index(want[0])
    assert printed[start:start + len(want)] == want
    assert any("started from the shipped reference profiles" in line for line in printed)
    # predict of the recommended plan gives the time the README shows for it
    t = re.search(r"recommended\s+([0-9.]+) s/iteration", want[1]).group(1)
    assert main(["predict", "--site", "site_configs/example-cross-vendor.yaml", "--job", "jobs/llama2-7b.yaml",
                 "--store", str(store), "--plan", str(out / "latest" / "recommended.json")]) == 0
    assert f"iteration {t} s" in capsys.readouterr().out


def test_no_reference_starts_an_empty_store(tmp_path, capsys):
    """--no-reference: the store is not created from the reference data, and every number is
    a datasheet estimate (the note says so)."""
    store = tmp_path / "s.h5"
    assert main(["plan", "--site", str(ROOT / "site_configs/example-cross-vendor.yaml"),
                 "--job", str(ROOT / "jobs/gpt3-2.7b.yaml"), "--store", str(store), "--no-profile",
                 "--no-reference", "--out", str(tmp_path / "o"), "--top", "1"]) == 0
    text = capsys.readouterr().out
    assert "no profile store at" in text and "reference profiles" not in text
    assert not store.exists()


def test_existing_store_is_left_alone(tmp_path):
    from memx_hpc.profile.reference import seed_store
    store = tmp_path / "s.h5"
    first = seed_store(store)
    assert first is not None and first.samples > 3000 and first.link_curves > 0
    assert seed_store(store) is None


@pytest.mark.parametrize("setting, want", [(None, True), (False, False), (True, True)])
def test_site_field_reference_data(setting, want):
    from memx_hpc.profile.reference import wanted
    import dataclasses

    from memx_hpc.spec import load_site
    site = load_site(ROOT / "site_configs/example-cross-vendor.yaml")
    assert wanted(dataclasses.replace(site, reference_data=setting)) is want
    assert wanted(dataclasses.replace(site, reference_data=setting), False) is False
    local = load_site(ROOT / "site_configs/local.yaml")
    assert wanted(local) is False  # every partition a CPU: measured where it runs


def test_site_field_reference_data_is_checked(tmp_path):
    from memx_hpc.errors import SpecError
    from memx_hpc.spec import load_site
    text = (ROOT / "site_configs/example-cross-vendor.yaml").read_text()
    bad = tmp_path / "site.yaml"
    bad.write_text(text + "\nreference_data: maybe\n")
    with pytest.raises(SpecError, match="reference_data"):
        load_site(bad)
    good = tmp_path / "site2.yaml"
    good.write_text(text + "\nreference_data: false\n")
    assert load_site(good).reference_data is False
