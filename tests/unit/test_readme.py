"""The README's showcase runs on a fresh clone and prints what the README shows.

Every fenced block under a ``<!-- readme-check: NAME -->`` marker is compared line by line
with what the command of that name prints, so the README and the code cannot drift apart:
a change that moves a number fails here until the README shows the new one. The README stays
short (the rest is one page per topic under docs/), and every relative link of the README and
of docs/*.md reaches an existing file and heading.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from memx_hpc.cli.main import main
from memx_hpc.profile.reference import reference_dir

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: the README is a few screens; topics go to docs/
README_MAX_BYTES = 20 * 1024


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



def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _without_fences(text: str) -> str:
    """The text with fenced code blocks blanked, so a `# comment` in a shell block is no heading."""
    return re.sub(r"^```.*?^```[^\n]*$", "", text, flags=re.S | re.M)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation but '-' and '_' dropped (backticks too),
    spaces to '-', a repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", _without_fences(path.read_text(encoding="utf-8")), re.M):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _broken_links(page: Path) -> list[str]:
    """Relative links of a Markdown page that reach no file, or no heading of that file."""
    text = re.sub(r"`[^`\n]*`", "", _without_fences(page.read_text(encoding="utf-8")))
    bad = []
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            bad.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.name}")
    return bad


def test_readme_is_short():
    size = len(README.read_bytes())
    assert size < README_MAX_BYTES, f"README.md is {size} bytes; move topics to docs/"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    """Every relative link reaches a file of the repository, and its #anchor a heading there."""
    assert _broken_links(page) == [], page.relative_to(ROOT)


def test_link_check_finds_what_is_broken(tmp_path):
    page = tmp_path / "a.md"
    page.write_text("# What `plan` reports\n\n```bash\n# not a heading\n```\n\n"
                    "[ok](#what-plan-reports) [gone](b.md) [no heading](a.md#nowhere) "
                    "[web](https://example.org/x) `[code](c.md)`\n")
    assert _anchors(page) == {"what-plan-reports"}
    assert _broken_links(page) == [f"b.md: no file {tmp_path / 'b.md'}", "a.md#nowhere: no heading #nowhere in a.md"]
