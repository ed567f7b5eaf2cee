"""Communication curves measured through the real local Slurm: a job inside one partition
and a hetjob across two, stored in the profile store and read back as the site's links."""

from __future__ import annotations

from pathlib import Path

import pytest

from memx_hpc.model.links import load_links
from memx_hpc.profile.comm import comm_jobs, read_comm_rows
from memx_hpc.profile.link_campaign import profile_comm
from memx_hpc.spec import load_site

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_intra_and_cross_partition_curves_are_measured_and_used(tmp_path: Path, slurm_cluster) -> None:
    site = load_site(ROOT / "site_configs" / "local.yaml")
    sizes = (2**16, 2**20)
    jobs = [j for j in comm_jobs(site, sizes_bytes=sizes) if j.name in ("intra-nvidia_a100",
                                                                        "cross-nvidia_a100-amd_mi250")]
    assert len(jobs) == 2
    store = tmp_path / "store.h5"
    rep = profile_comm(site, store, tmp_path / "work", jobs=jobs, timeout_s=600)
    assert rep.failures == () and rep.written == 4 and rep.task_seconds > 0
    rows = read_comm_rows(store)
    assert {(r["curve"]["kind"], r["curve"]["scope"]) for r in rows} == {
        ("p2p", "intra"), ("allreduce", "intra"), ("p2p", "cross"), ("allreduce", "cross")}
    for r in rows:
        assert r["provenance"]["backend"] == "gloo" and r["provenance"]["world_size"] == 2
        assert r["provenance"]["slurm_job_id"] and len(r["provenance"]["hosts"]) == 2
        assert all(t > 0 for t in r["curve"]["times_ms"])
    cross = next(r for r in rows if r["curve"]["scope"] == "cross")
    assert cross["curve"]["partitions"] == ["nvidia_a100", "amd_mi250"]  # one rank in each hetjob component
    links = load_links(site, store)
    assert links.p2p(2**20, "nvidia_a100", "amd_mi250").provenance == "measured"
    assert links.p2p(2**20, "nvidia_a100", "nvidia_a100", same_node=True).provenance == "measured"
    assert links.p2p(2**20, "nvidia_v100", "amd_mi250").provenance == "site-figure"
