"""Fixtures for tests that need a real Slurm cluster (``@pytest.mark.slurm``).

Every test marked ``slurm`` in this folder first checks once per session that
Slurm answers. When it does not:

* with the environment variable ``CI`` set (CI runs ``.ci/run``, which starts
  the local cluster), the test FAILS: a CI run that silently skipped the Slurm
  tests would prove nothing;
* otherwise (a developer's machine) it is skipped, with the command that starts
  the local cluster.
"""

from __future__ import annotations

import pytest

from memx_hpc.slurm.local_cluster import START_HINT, slurm_available


@pytest.fixture(scope="session")
def slurm_cluster(needs) -> None:
    """Ensures Slurm is reachable; fails under CI, skips elsewhere."""
    needs(slurm_available(timeout=5.0),
          "Slurm is not reachable (sbatch not on PATH, or sinfo did not answer within 5 s)",
          f".ci/run must run scripts/slurm-local.sh start before pytest; {START_HINT}")


@pytest.fixture
def local_site_copy():
    """Writes the local site into a folder, changed: ``local_site_copy(tmp_path, store=...)``."""
    return _local_site_copy


def _local_site_copy(tmp_path, **changes):
    """``site_configs/local.yaml`` written into ``tmp_path`` with ``changes`` applied, its
    partitions' relative ``python`` made absolute from the checkout (a site file copied out of
    the checkout must name the nodes' Python absolutely: the loader refuses a relative path
    that names no file from the copy's folder)."""
    from pathlib import Path

    import yaml

    from memx_hpc.spec.readers import find_relative_to_site

    local = Path(__file__).resolve().parents[2] / "site_configs" / "local.yaml"
    data = yaml.safe_load(local.read_text())
    for part in data["partitions"]:
        python = part.get("python")
        if python and "/" in python and not Path(python).is_absolute():
            found = find_relative_to_site(python, str(local))
            assert found is not None, f"{local} names {python}, which is not there: run scripts/install.sh"
            part["python"] = str(found)
    data.update(changes)
    site_file = tmp_path / "site.yaml"
    site_file.write_text(yaml.safe_dump(data))
    return site_file


@pytest.fixture
def tiny_corpus(tmp_path):
    """A 200-document corpus prepared with the unit tests' tiny Hugging Face tokenizer in
    ``tmp_path``: ``(data prefix, tokenizer folder)``."""
    import sys
    from pathlib import Path

    from memx_hpc.train.prepare import prepare
    from memx_hpc.train.tokenizer import load_tokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    from test_data_prepare import corpus, hf_tokenizer  # noqa: E402 - the unit test's tiny tokenizer

    tok_dir = hf_tokenizer(tmp_path)
    out = prepare([str(corpus(tmp_path, n=200))], str(tmp_path / "data" / "corpus"),
                  load_tokenizer("HuggingFaceTokenizer", model=str(tok_dir)))
    return out.prefix, tok_dir
