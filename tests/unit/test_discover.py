"""Reading Slurm and writing a site from it, on real captured output.

``tests/unit/slurm_output/`` holds what Slurm 22.05.8 printed on the local cluster of
``scripts/slurm-local.sh`` (three nodes, one per partition, two typed fake GPUs each, and
the default partition ``debug`` holding all three): ``scontrol show node --oneliner`` with
every node idle (``nodes-idle.txt``) and with a job on ``a100n0``, ``v100n0`` drained and
``mi250n0`` in a reservation (``nodes-mixed.txt``, ``res-one.txt``); ``scontrol show
partition --oneliner`` and ``scontrol show reservation --oneliner``.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import pytest

from memx_hpc.errors import SpecError
from memx_hpc.spec.catalog import catalog
from memx_hpc.sitegen import discover, match_gpu, parse_map
from memx_hpc.slurm.discover import (ClusterView, GresItem, SlurmNode, SlurmPartition, expand_hostlist,
                                     parse_cluster_name, parse_minutes, parse_nodes, parse_partitions,
                                     parse_records, parse_reservations)
from memx_hpc.spec import load_site

OUT = Path(__file__).parent / "slurm_output"
ROOT = Path(__file__).resolve().parents[2]


def text(name: str) -> str:
    return (OUT / name).read_text()


def view(nodes: str = "nodes-idle.txt", reservations: str = "res-none.txt", when: datetime | None = None):
    res = parse_reservations(text(reservations))
    return ClusterView(name="memx", partitions=parse_partitions(text("partitions.txt")), nodes=parse_nodes(text(nodes)),
                       reservations=res, read_at=when or (res[0].start if res else datetime.now().astimezone()))


# --------------------------------------------------------------------------- parsing


def test_records_keep_values_with_spaces_and_equals_signs():
    rec = parse_records(text("nodes-idle.txt"), "NodeName")[0]
    assert rec["OS"] == "Linux 6.18.44-fc-v1045 #1 SMP PREEMPT_DYNAMIC @0"
    assert rec["CfgTRES"] == "cpu=2,mem=6000M,billing=2,gres/gpu=2,gres/gpu:a100=2"
    assert rec["Partitions"] == "nvidia_a100,debug"


def test_nodes_idle():
    nodes = parse_nodes(text("nodes-idle.txt"))
    assert [n.name for n in nodes] == ["a100n0", "mi250n0", "v100n0"]
    a = nodes[0]
    assert a.partitions == ("nvidia_a100", "debug")
    assert a.gpus == (GresItem(name="gpu", type="a100", count=2),)
    assert (a.cpus, a.real_memory_mib, a.state, a.flags, a.features) == (2, 6000, "IDLE", (), ())
    assert all(n.verdict().usable and n.condition == "idle" for n in nodes)


def test_nodes_busy_drained_and_reserved():
    v = view("nodes-mixed.txt", "res-one.txt")
    a, m, g = v.nodes
    assert (a.state, a.busy, a.condition) == ("MIXED", True, "busy") and a.verdict().usable
    assert (g.state, g.flags, g.condition) == ("IDLE", ("DRAIN",), "drained")
    assert g.reason.startswith("memx-hpc discover test")
    assert not g.verdict().usable and "drained" in g.verdict().why
    # a reservation does not show in the node's state: it is read from the reservation
    assert m.state == "IDLE" and m.flags == ()
    assert v.reserved_nodes() == {"mi250n0": "memx-discover-capture"}
    assert [n.name for n in v.usable("debug")] == ["a100n0"]
    assert v.usable("amd_mi250") == ()
    why = dict((n.name, x.why) for n, x in v.verdicts("amd_mi250"))
    assert why == {"mi250n0": "held by reservation memx-discover-capture"}


def test_reservation_is_over_after_its_end():
    r = parse_reservations(text("res-one.txt"))[0]
    assert r.node_names == ("mi250n0",) and r.state == "ACTIVE"
    assert view("nodes-mixed.txt", "res-one.txt", when=r.end).reserved_nodes() == {}
    assert view("nodes-mixed.txt", "res-one.txt", when=r.start).reserved_nodes() == {"mi250n0": r.name}
    future = type(r)(name=r.name, start=r.start, end=r.end, node_names=r.node_names, state="INACTIVE")
    assert future.active_at(r.start) and not future.active_at(r.end)
    assert not future.active_at(r.start.replace(year=r.start.year - 1))
    assert parse_reservations(text("res-none.txt")) == ()


def test_partitions():
    parts = parse_partitions(text("partitions.txt"))
    assert [p.name for p in parts] == ["nvidia_a100", "amd_mi250", "nvidia_v100", "debug"]
    d = parts[-1]
    assert d.default and d.up and d.max_time_min is None and d.total_nodes == 3
    assert d.node_names == ("a100n0", "mi250n0", "v100n0")


@pytest.mark.parametrize("value, minutes", [("UNLIMITED", None), ("INFINITE", None), ("30", 30), ("30:00", 30),
                                            ("30:01", 31), ("2:00:00", 120), ("1-00:00:00", 1440), ("2-12", 3600),
                                            ("1-01:30", 1530)])
def test_slurm_time_limits(value, minutes):
    assert parse_minutes(value) == minutes


@pytest.mark.parametrize("expr, names", [
    ("a100n0", ("a100n0",)),
    ("gpu[001-003,7],login1", ("gpu001", "gpu002", "gpu003", "gpu7", "login1")),
    ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
    ("(null)", ()),
])
def test_hostlists(expr, names):
    assert expand_hostlist(expr) == names


def test_cluster_name():
    assert parse_cluster_name("AuthType                = auth/munge\nClusterName             = memx\n") == "memx"
    assert parse_cluster_name("nothing here") is None


# --------------------------------------------------------------------------- naming GPUs


TYPES = tuple(catalog())


@pytest.mark.parametrize("gres, gpu", [
    ("a100", "A100-80"), ("mi250", "MI250X-GCD"), ("A100-40", "A100-40"),
    ("nvidia_a100-sxm4-80gb", "A100-80"), ("nvidia_a100-sxm4-40gb", "A100-40"),
    ("tesla_v100-sxm2-32gb", "V100-32"), ("tesla_v100-pcie-16gb", "V100-PCIE-16"),
    ("nvidia_h100_80gb_hbm3", "H100-SXM"), ("amd_instinct_mi300x", "MI300X"),
])
def test_gres_names_to_catalog_types(gres, gpu):
    assert match_gpu(gres, TYPES).gpu_type == gpu


def test_an_alias_names_its_siblings_and_an_ambiguous_name_is_not_guessed():
    m = match_gpu("a100", TYPES)
    assert m.gpu_type == "A100-80" and "A100-40" in m.alternatives
    amb = match_gpu("nvidia_v100-sxm2", TYPES)  # 16 or 32 GB: the name does not say
    assert amb.gpu_type is None and {"V100-16", "V100-32"} <= set(amb.alternatives)
    assert match_gpu("xpu9000", TYPES).gpu_type is None


def test_untyped_gres_by_node_features():
    assert match_gpu(None, TYPES, features=["ib", "v100-32gb"]).gpu_type == "V100-32"
    assert match_gpu(None, TYPES, features=["ib"]).gpu_type is None


def test_map_checks_types():
    assert parse_map(["a100=A100-40GB"], TYPES) == {"a100": "A100-40"}
    with pytest.raises(SpecError, match="--map a100.*did you mean"):
        parse_map(["a100=A100-41"], TYPES)
    with pytest.raises(SpecError, match="GRES=GPU-TYPE"):
        parse_map(["a100"], TYPES)


# --------------------------------------------------------------------------- the site


def test_discovered_site_reads_back_as_validate_reads_it(tmp_path):
    d = discover(view())
    assert [p.name for p in d.partitions] == ["nvidia_a100", "amd_mi250", "nvidia_v100"]
    assert [p.gpu_type for p in d.partitions] == ["A100-80", "MI250X-GCD", "V100-16"]
    assert d.skipped[0][0] == "debug" and "3 GPU types" in d.skipped[0][1]
    text_ = d.yaml()
    path = tmp_path / "site.yaml"
    path.write_text(text_)
    site = load_site(path)
    a = site.partition("nvidia_a100")
    assert (a.gres_type, a.nodes, a.gpus_per_node, a.cpus_per_task) == ("a100", 1, 2, 1)
    assert site.scheduler == "slurm" and site.pipeline_comm_backend == "ucc"  # nvidia and amd
    # the links are labelled defaults, and so are the launcher fields
    assert text_.count("default, not measured") == 4 and "profile --links" in text_
    # Slurm says nothing of the fabric: no figure is written as the site's, the links are generic
    assert a.inter_node_gbps is None and site.inter_figure("nvidia_a100")[1] == "generic"
    assert "also fits A100-40" in text_ and "python: python3" in text_


def test_states_are_noted_not_subtracted():
    d = discover(view("nodes-mixed.txt", "res-one.txt"))
    states = {p.name: dict(p.states) for p in d.partitions}
    assert states == {"nvidia_a100": {"busy": 1}, "amd_mi250": {"reserved": 1}, "nvidia_v100": {"drained": 1}}
    assert all(p.nodes == 1 for p in d.partitions)


def _node(name, part, gres, cpus=64, mem=512000, features=(), state="IDLE"):
    return SlurmNode(name=name, partitions=(part,), state=state, cpus=cpus, real_memory_mib=mem,
                     gres=tuple(g for g in (GresItem.parse(x) for x in gres) if g), features=tuple(features))


def test_unknown_gres_types_are_listed_with_how_to_name_them():
    v = ClusterView(name="c", partitions=(SlurmPartition(name="p1"), SlurmPartition(name="p2"),
                                          SlurmPartition(name="cpu")),
                    nodes=(_node("n1", "p1", ["gpu:xpu9000:4"]), _node("n2", "p1", ["gpu:xpu9000:4"]),
                           _node("n3", "p2", ["gpu:v100:4", "gpu:a100:4"]), _node("n4", "cpu", [])))
    d = discover(v)
    with pytest.raises(SpecError) as e:
        d.yaml()
    msg = str(e.value)
    assert "gpu:xpu9000 (p1: 2 nodes x 4)" in msg and "--map xpu9000=GPU-TYPE" in msg and "--skip-unknown" in msg
    skipped = dict(d.skipped)
    assert "several types each" in skipped["p2"] and "no GPUs" in skipped["cpu"]
    with pytest.raises(SpecError, match="no partition"):
        d.named().yaml()
    site = discover(v, mapping={"xpu9000": "MI300X"}).site()
    assert site.partition("p1").gpu_type == "MI300X" and site.partition("p1").nodes == 2


def test_mixed_gpu_counts_keep_the_largest_share_and_say_so():
    v = ClusterView(name="c", partitions=(SlurmPartition(name="gpu"),),
                    nodes=tuple(_node(f"g{i}", "gpu", ["gpu:a100:8"]) for i in range(3)) +
                          (_node("g9", "gpu", ["gpu:a100:4"]), _node("login", "gpu", [])))
    p = discover(v).partitions[0]
    assert (p.nodes, p.gpus_per_node, p.cpus_per_task) == (3, 8, 8)
    assert any("1 node with 4 GPUs" in n for n in p.notes) and any("without GPUs" in n for n in p.notes)


def test_map_and_partition_filters_are_checked():
    with pytest.raises(SpecError, match="--map nope"):
        discover(view(), mapping={"nope": "A100-40"})
    with pytest.raises(SpecError, match="--partition"):
        discover(view(), partitions=["gpu_x"])
    d = discover(view(), partitions=["nvidia_v100"], mapping={"nvidia_v100": "V100-32"})
    assert [(p.name, p.gpu_type) for p in d.partitions] == [("nvidia_v100", "V100-32")]
    assert "pipeline_comm" not in d.yaml()  # one vendor


def test_down_partitions_are_left_out():
    parts = tuple(SlurmPartition(name=p.name, state="DOWN" if p.name == "nvidia_v100" else p.state,
                                 node_names=p.node_names) for p in parse_partitions(text("partitions.txt")))
    v = ClusterView(name="memx", partitions=parts, nodes=parse_nodes(text("nodes-idle.txt")))
    d = discover(v)
    assert "nvidia_v100" not in [p.name for p in d.partitions]
    assert "state DOWN" in dict(d.skipped)["nvidia_v100"]


def test_gpu_types_of_ones_own_are_written_into_the_site(tmp_path):
    from memx_hpc.spec import GpuType

    own = GpuType(name="XPU-9000", vendor="intel", memory_gib=48.0, peak_tflops_bf16=400, peak_tflops_fp32=50,
                  hbm_gbps=2000, link_gbps=100, source="vendor datasheet", aliases=("xpu9000",))
    v = ClusterView(name="c", partitions=(SlurmPartition(name="pvc"),),
                    nodes=(_node("n1", "pvc", ["gpu:xpu9000:4"]),))
    d = discover(v, site_types=(own,))
    assert d.partitions[0].gpu_type == "XPU-9000" and "alias" in d.partitions[0].match.how
    path = tmp_path / "site.yaml"
    path.write_text(d.yaml())
    site = load_site(path)
    assert site.gpu_of("pvc") == own
    assert parse_map(["xpu9000=XPU-9000"], (own,)) == {"xpu9000": "XPU-9000"}


def test_hostlists_are_bounded_before_they_expand(monkeypatch):
    from memx_hpc.slurm import discover as d

    monkeypatch.setattr(d, "MAX_HOSTLIST_NAMES", 100)
    assert len(expand_hostlist("n[1-100]")) == 100
    for bad, words in (("n[1-101]", "more than 100"), ("n[0-9][0-9][0-9]", "more than 100"),
                       ("a100n[x-y]", "'x-y'"), ("n[5-1]", "backwards")):
        with pytest.raises(d.HostlistError, match=re.escape(words)):
            expand_hostlist(bad)


def test_impossible_gpu_counts_are_kept_aside_by_node():
    line = text("nodes-idle.txt").splitlines()[0].replace("Gres=gpu:a100:2", "Gres=gpu:a100:10^20")
    node = parse_nodes(line)[0]
    assert node.gpus == () and node.bad_gpus == ("gpu:a100:10^20",)


def test_local_cluster_helpers_stop_reading_a_client_that_never_stops(monkeypatch):
    """sinfo/sacct answers are read with a bound: a client that prints without end reads as
    "no answer" (None), without running the caller out of memory."""
    from memx_hpc.slurm import local_cluster

    monkeypatch.setattr(local_cluster, "MAX_ANSWER_BYTES", 2**16)
    assert local_cluster._run(["yes"], 10.0) is None
    ok = local_cluster._run(["printf", "a\\xe9b"], 10.0)  # Latin-1 bytes decode, replaced
    assert ok is not None and ok.returncode == 0 and ok.stdout == "a\ufffdb"
