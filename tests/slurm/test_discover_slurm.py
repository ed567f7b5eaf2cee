"""``site discover`` against the real local Slurm (typed GRES, scripts/slurm-local.sh):
the file it writes is what Slurm reports, ``validate`` accepts it and ``plan`` plans on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memx_hpc.cli.main import main
from memx_hpc.slurm.discover import read_cluster
from memx_hpc.spec import load_site

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "tiny-gpt.yaml"


def discover_site(tmp_path: Path, capsys) -> Path:
    site = tmp_path / "site.yaml"
    rc = main(["site", "discover", "--out", str(site)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return site


def test_discovered_site_is_validated_and_planned_on(tmp_path: Path, capsys) -> None:
    site_file = discover_site(tmp_path, capsys)
    site = load_site(site_file)
    slurm = read_cluster()
    for p in site.partitions:  # what Slurm says, partition by partition
        nodes = slurm.nodes_of(p.name)
        assert p.nodes == len(nodes) and all(g.type == p.gres_type and g.count == p.gpus_per_node
                                             for n in nodes for g in n.gpus)
    assert {"nvidia_a100", "amd_mi250", "nvidia_v100"} <= {p.name for p in site.partitions}
    assert "debug" not in {p.name for p in site.partitions}  # three GPU types in one partition
    assert main(["validate", "--site", str(site_file)]) == 0
    capsys.readouterr()
    rc = main(["plan", "--site", str(site_file), "--job", str(JOB), "--no-profile", "--store",
               str(tmp_path / "store.h5"), "--out", str(tmp_path / "plans"), "--max-stages", "2", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert rc == 0 and summary["site"] == site.name and summary["top"]
    used = {s["partition"] for s in summary["top"][0]["plan"]["stages"]}
    assert used <= {p.name for p in site.partitions}


def test_discover_refuses_to_overwrite_and_names_unknown_map_keys(tmp_path: Path, capsys) -> None:
    site_file = discover_site(tmp_path, capsys)
    assert main(["site", "discover", "--out", str(site_file)]) == 1
    assert "--force" in capsys.readouterr().err
    assert main(["site", "discover", "--map", "h100=H100-SXM"]) == 1
    assert "GRES types: a100, mi250, v100" in capsys.readouterr().err
