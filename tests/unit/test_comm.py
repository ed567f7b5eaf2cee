"""Communication-curve jobs: what is measured, the job scripts, and the store's /comm table."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from memx_hpc.datapaths import shared_data
from memx_hpc.model.links import CommCurve
from memx_hpc.model.links import load_links
from memx_hpc.profile.comm import comm_jobs, import_sailor_comm, read_comm_curves, write_comm_curves
from memx_hpc.profile.link_campaign import render_comm_script
from memx_hpc.profile.store import ProfileStore
from memx_hpc.spec import LayerSample, LayerShape, Partition, ProfilePoint, Site

ROOT = Path(__file__).resolve().parents[2]


def site3() -> Site:
    return Site(name="s", partitions=(
        Partition(name="a", gpu_type="A100-80", nodes=2, gpus_per_node=4, gres_type="a100"),
        Partition(name="m", gpu_type="MI250X-GCD", nodes=1, gpus_per_node=8, setup=("module load rocm",),
                  env=(("X", "a'; echo pwned"),)),
        Partition(name="v", gpu_type="V100-32", nodes=3, gpus_per_node=1)))


def test_every_link_of_the_site_gets_a_job():
    jobs = {j.name: j for j in comm_jobs(site3())}
    assert set(jobs) == {"intra-a", "inter-a", "intra-m", "inter-v", "cross-a-m", "cross-a-v", "cross-m-v"}
    assert jobs["intra-a"].world_size == 4 and jobs["intra-m"].world_size == 8
    assert jobs["inter-a"].nodes == (2,) and jobs["inter-a"].world_size == 2
    assert jobs["cross-a-m"].vendors == ("nvidia", "amd") and jobs["cross-a-m"].world_size == 2


def test_scripts_are_valid_bash_and_a_hetjob_for_a_pair(tmp_path):
    site = site3()
    jobs = {j.name: j for j in comm_jobs(site)}
    cross = render_comm_script(jobs["cross-a-m"], site, task_file=tmp_path / "t 1.json", out_file=tmp_path / "o.json",
                               log_dir=tmp_path)
    assert cross.count("#SBATCH hetjob") == 1
    assert "#SBATCH --partition=a" in cross and "#SBATCH --partition=m" in cross
    # the MI250X partition has no GRES type: untyped --gres=gpu:N, as for every other job
    assert " : --nodes=1 --ntasks-per-node=1 bash -c " in cross
    assert "#SBATCH --gres=gpu:a100:1\n" in cross and "#SBATCH --gres=gpu:1\n" in cross
    assert "module load rocm" in cross  # each component runs its own partition's setup
    assert "echo pwned" in cross and "export X=a;" not in cross  # the hostile value is quoted, not run
    intra = render_comm_script(jobs["intra-a"], site, task_file=tmp_path / "t.json", out_file=tmp_path / "o.json",
                               log_dir=tmp_path)
    assert "hetjob" not in intra and "--ntasks-per-node=4" in intra
    for text in (cross, intra):
        f = tmp_path / "s.sh"
        f.write_text(text)
        assert subprocess.run(["bash", "-n", str(f)], capture_output=True).returncode == 0


def test_a_setup_line_ending_in_a_comment_does_not_swallow_the_worker(tmp_path):
    # each component runs ``bash -c BODY``; BODY must still reach its exec when a (valid)
    # setup line ends in a comment: the component's commands are run here for real, with
    # /bin/echo standing in for the partition's Python
    import shlex
    site = Site(name="s", partitions=(
        Partition(name="a", gpu_type="A100-80", nodes=1, gpus_per_node=2, python="/bin/echo",
                  setup=("export MARK=1  # site comment",)),))
    job = {j.name: j for j in comm_jobs(site)}["intra-a"]
    text = render_comm_script(job, site, task_file=tmp_path / "t.json", out_file=tmp_path / "o.json",
                              log_dir=tmp_path)
    assert text.count("\nsrun ") == 1, text
    argv = shlex.split(text[text.index("\nsrun ") + 1:])[1:]  # the step's command may span lines
    argv = argv[argv.index("bash"):]  # after the step's own options
    assert argv[:2] == ["bash", "-c"]
    run = subprocess.run(argv[:3], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    assert "-m memx_hpc.profile.comm worker --task" in run.stdout


def _curve(times, partitions=("a",), scope="inter", source="run 1") -> dict:
    c = CommCurve(kind="p2p", scope=scope, gpu_types=("A100-80",), partitions=partitions, provenance="measured",
                  source=source, form="points", sizes_bytes=(1e6, 1e8), times_ms=tuple(times))
    return {"curve": c.to_dict(), "provenance": {"hosts": ["n1", "n2"]}}


def test_store_table_keeps_samples_and_replaces_a_curve_by_key(tmp_path):
    path = tmp_path / "store.h5"
    shape = LayerShape(hidden_size=256, num_attention_heads=4, num_query_groups=4, ffn_hidden_size=1024,
                       seq_length=128, vocab_size=1000)
    point = ProfilePoint(gpu_type="A100-80", kind="layer", shape=shape, tp=1, micro_batch_size=1, recompute="none",
                         precision="bf16")
    store = ProfileStore(path)
    store.append([LayerSample(point=point, forward_ms=1.0, backward_ms=2.0, activation_bytes=10,
                              peak_allocated_bytes=100, origin="measured", source="test")])
    assert write_comm_curves(path, [_curve((0.1, 5.0)), _curve((0.2, 9.0), partitions=("a", "v"), scope="cross")]) == 2
    write_comm_curves(path, [_curve((0.3, 7.0), source="run 2")])  # the same link measured again
    curves = read_comm_curves(path)
    assert len(curves) == 2
    inter = next(c for c in curves if c.scope == "inter")
    assert inter.times_ms == (0.3, 7.0) and inter.source == "run 2"
    assert len(ProfileStore(path).samples()) == 1  # the layer table is untouched
    # and the curves outlive the store's own writes: an append in place, and a whole rewrite
    more = LayerSample(point=point.__class__(**{**point.__dict__, "micro_batch_size": 2}), forward_ms=2.0,
                       backward_ms=4.0, activation_bytes=20, peak_allocated_bytes=200, origin="measured", source="t")
    ProfileStore(path).append([more])
    st = ProfileStore(path)
    with st.writer():
        st._write(st._read())
    assert len(read_comm_curves(path)) == 2 and len(ProfileStore(path).samples()) == 2
    lm = load_links(site3(), path)
    assert lm.p2p(1e8, "a", "a").ms == pytest.approx(7.0)
    assert lm.p2p(1e8, "a", "v").provenance == "measured"
    assert lm.p2p(1e8, "m", "m").provenance == "generic"  # the site file states no figure for m


def test_a_new_store_gets_the_table(tmp_path):
    path = tmp_path / "new.h5"
    write_comm_curves(path, [_curve((0.1, 5.0))])
    assert len(read_comm_curves(path)) == 1 and len(ProfileStore(path).samples()) == 0
    assert read_comm_curves(tmp_path / "absent.h5") == []


@pytest.mark.skipif(shared_data(required=False) is None, reason="shared data absent")
def test_sailor_curves_import_into_the_store(tmp_path):
    rows = import_sailor_comm(shared_data() / "sailor")
    path = tmp_path / "s.h5"
    write_comm_curves(path, rows)
    curves = read_comm_curves(path)
    assert len(curves) == len(rows) and all(c.provenance == "imported" for c in curves)
    # Sailor's GH200 nodes (Clariden): the site says its partition is that cluster
    site = Site(name="c", partitions=(Partition(name="gh", gpu_type="GH-96", nodes=4, gpus_per_node=4,
                                                link_curves_from="sailor"),))
    c = load_links(site, path).p2p(64e6, "gh", "gh")
    assert c.provenance == "imported" and "GH-96" in c.source
    # a site that does not say so keeps its own (here generic) figure
    own = Site(name="c", partitions=(Partition(name="gh", gpu_type="GH-96", nodes=4, gpus_per_node=4),))
    assert load_links(own, path).p2p(64e6, "gh", "gh").provenance == "generic"


@pytest.mark.skipif(shared_data(required=False) is None, reason="shared data absent")
def test_profile_import_sailor_brings_its_network_curves(tmp_path, capsys):
    import json

    from memx_hpc.cli.main import main
    store = tmp_path / "s.h5"
    assert main(["profile", "import", "--store", str(store), "--format", "sailor", str(shared_data() / "sailor"),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["link_curves"] == len(read_comm_curves(store)) > 0
