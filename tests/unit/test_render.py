"""The sbatch renderer: golden scripts of the example sites, Megatron-LM argument names,
refusals with reasons, and hostile site/job values that must be quoted or refused.

Regenerate the golden files after an intended change with ``MEMX_UPDATE_GOLDEN=1 pytest
tests/unit/test_render.py`` and review the diff.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memx_hpc.cli.main import main
from memx_hpc.errors import SpecError
from memx_hpc.planfile import load_plan
from memx_hpc.slurm.render import describe, pipeline_layout, recompute_args, render
from memx_hpc.spec import Plan, Recompute, Stage, load_job, load_site, site_from_mapping

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
LOCAL = ROOT / "site_configs" / "local.yaml"
CROSS = ROOT / "site_configs" / "example-cross-vendor.yaml"

# (golden name, site, job, plan, iters)
CASES = [
    ("local-pp2-a100-mi250", LOCAL, "tiny-gpt", "local-pp2-a100-mi250", 5),
    ("local-tp2-v100", LOCAL, "tiny-gpt", "local-tp2-v100", None),
    ("local-pp3", LOCAL, "tiny-gpt", "local-pp3", 3),
    ("cross-vendor-gpt3-2.7b", CROSS, "gpt3-2.7b", "cross-vendor-gpt3-2.7b", 20),
    ("cross-vendor-llama2-7b", CROSS, "llama2-7b", "cross-vendor-llama2-7b", None),
    # a run on data with checkpoints: it continues itself past the time limit (the continuation block)
    ("local-pp2-data-continues", LOCAL, "tiny-gpt-data", "local-pp2-a100-mi250", None),
]


def _render_case(site: Path, job: str, plan: str, iters: int | None) -> str:
    text = render(load_plan(GOLDEN / "plans" / f"{plan}.json"), load_site(site), load_job(ROOT / "jobs" / f"{job}.yaml"),
                  iters=iters)
    # the only machine-specific part: the site's work_dir, resolved next to the site file
    return text.replace(str(ROOT), "@REPO@")


@pytest.mark.parametrize("name,site,job,plan,iters", CASES, ids=[c[0] for c in CASES])
def test_golden(name: str, site: Path, job: str, plan: str, iters: int | None, tmp_path: Path) -> None:
    text = _render_case(site, job, plan, iters)
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("MEMX_UPDATE_GOLDEN") == "1":
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"no golden file {path}; run with MEMX_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(encoding="utf-8"), f"{name}: rendered script differs from {path}"
    script = tmp_path / "s.sbatch"
    script.write_text(text)
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _argv_of(text: str, component: int) -> list[str]:
    """The command line of one component's function, as bash would split it."""
    body = text.split(f"memx_component_{component}() {{", 1)[1].split("\n}", 1)[0]
    exec_part = body.split("  exec ", 1)[1].replace("\\\n", " ")
    return shlex.split(exec_part)


def test_cross_vendor_arguments_and_components() -> None:
    site, job = load_site(CROSS), load_job(ROOT / "jobs" / "gpt3-2.7b.yaml")
    plan = load_plan(GOLDEN / "plans" / "cross-vendor-gpt3-2.7b.json")
    req = describe(plan, site, job)
    assert [(c.partition, c.stages, c.first_rank, c.num_ranks, c.nodes, c.tasks_per_node) for c in req.components] == [
        ("gpu_a100", (0, 1), 0, 8, 2, 4), ("gpu_mi250x", (2, 3), 8, 8, 1, 8), ("gpu_v100", (4,), 16, 4, 1, 4)]
    text = render(plan, site, job)
    argv = [_argv_of(text, i) for i in range(3)]
    for a in argv:
        flags = dict(zip(a, a[1:]))
        assert flags["--tensor-model-parallel-size"] == "2" and flags["--pipeline-model-parallel-size"] == "5"
        assert flags["--pipeline-model-parallel-layout"] == "Et*9|t*9|t*5|t*5|t*4L"
        assert flags["--pipeline-model-parallel-comm-backend"] == "ucc"
        assert flags["--micro-batch-size"] == "1" and flags["--global-batch-size"] == "64"
        assert "--bf16" in a and "--use-distributed-optimizer" in a
        assert flags["--num-layers"] == "32" and flags["--hidden-size"] == "2560"
    # heterogeneous recomputation: each component carries its own flags, and only its own
    assert "--recompute-granularity" not in argv[0]
    assert dict(zip(argv[1], argv[1][1:]))["--recompute-granularity"] == "selective"
    v = dict(zip(argv[2], argv[2][1:]))
    assert (v["--recompute-granularity"], v["--recompute-method"], v["--recompute-num-layers"]) == ("full", "block", "2")
    # vendor environments and the site's UCC settings reach every component
    comp = text.split("memx_component_1() {", 1)[1].split("\n}", 1)[0]
    assert "module load rocm/6.1" in comp and "export NCCL_SOCKET_IFNAME=hsn0" in comp
    assert "export UCC_TLS=ucp" in comp and "--rocm" not in comp  # no container on this site
    assert "#SBATCH --account=proj123" in text and "#SBATCH --qos=normal" in text
    assert "#SBATCH --gres=gpu:mi250x:8" in text and text.count("#SBATCH hetjob") == 2
    # one srun across three components, in rank order
    srun = text[text.index("\nsrun "):]
    assert shlex.split(srun.replace("\\\n", " ")).count(":") == 2
    assert srun.index("memx_component_0") < srun.index("memx_component_1") < srun.index("memx_component_2")


def test_cross_vendor_groups_follow_the_rule_and_the_environment_megatron_core_accepts() -> None:
    """The cross-vendor example's plan: every group that spans vendors on UCC (hot) or gloo
    (cold), every group inside one vendor on NCCL/RCCL; the project's megatron-core entry
    builds them; no CUDA_DEVICE_MAX_CONNECTIONS=1 beside the UCC pipeline; UCX may move GPU
    memory on each vendor; a preflight per component names its partition and backends."""
    from memx_hpc.slurm.groups import group_backends

    site, job = load_site(CROSS), load_job(ROOT / "jobs" / "llama2-7b.yaml")
    plan = load_plan(GOLDEN / "plans" / "cross-vendor-llama2-7b.json")
    req = describe(plan, site, job)
    assert req.cross_vendor
    vendors = ["nvidia"] * 8 + ["amd"] * 4 + ["nvidia"] * 4
    assert req.groups == group_backends(vendors, tp=4, dp=1, pp=4, cross_vendor_backend="ucc")
    by_kind = {}
    for g in req.groups:
        by_kind.setdefault(g.kind, set()).add((g.ranks, g.backend))
        spans = len({vendors[r] for r in g.ranks}) > 1
        assert g.cross_vendor == spans
        if not spans:
            assert g.backend == "nccl"
        elif g.kind in ("mp",):
            assert g.backend == "gloo"
        elif g.kind == "default":
            assert g.backend == "cpu:gloo,cuda:ucc"
        else:
            assert g.backend == "ucc"
    assert by_kind["pp"] == {((t, 4 + t, 8 + t, 12 + t), "ucc") for t in range(4)}
    assert by_kind["tp"] == {(tuple(range(4 * s, 4 * s + 4)), "nccl") for s in range(4)}
    assert by_kind["embd"] == {((t, 12 + t), "nccl") for t in range(4)}  # stage 0 and 3: both NVIDIA
    text = render(plan, site, job)
    for c in req.components:
        body = text.split(f"memx_component_{c.index}() {{", 1)[1].split("\n}", 1)[0]
        assert "CUDA_DEVICE_MAX_CONNECTIONS" not in body
        assert f"exec {c.python[-1]} -m memx_hpc.train.pretrain_gpt" in body
        tls = dict(e.split("=", 1) for e in shlex.split(" ".join(
            line.split("export ", 1)[1] for line in body.splitlines() if "export UCX_TLS=" in line)))["UCX_TLS"]
        assert ("rocm_copy" if c.vendor == "amd" else "cuda_copy") in tls.split(",")
        assert f"-c \"$MEMX_PREFLIGHT\" {c.partition} {c.vendor} " in body
    assert req.components[2].backends == ("gloo", "nccl", "ucc")
    assert "#   pp: ucc x4 (spans vendors" in text
    # one vendor: Megatron-LM's own entry, NVIDIA's serial connections for TP overlap
    one = describe(_plan(("gpu_a100", 16), ("gpu_v100", 16), gbs=64), site, load_job(ROOT / "jobs" / "gpt3-2.7b.yaml"))
    assert not one.cross_vendor and {g.backend for g in one.groups} == {"nccl"}
    assert one.components[0].entry == ("/opt/Megatron-LM/pretrain_gpt.py",)
    assert any(e.name == "CUDA_DEVICE_MAX_CONNECTIONS" and e.value == "1" for e in one.components[0].env)
    assert "--pipeline-model-parallel-comm-backend" not in one.megatron_argv[0]


def test_mixed_recompute_on_one_partition_splits_components() -> None:
    req = describe(load_plan(GOLDEN / "plans" / "cross-vendor-llama2-7b.json"), load_site(CROSS),
                   load_job(ROOT / "jobs" / "llama2-7b.yaml"))
    assert [(c.partition, c.stages, c.recompute.label()) for c in req.components] == [
        ("gpu_a100", (0,), "none"), ("gpu_a100", (1,), "full:4"), ("gpu_mi250x", (2,), "selective"),
        ("gpu_v100", (3,), "full")]
    argv = req.megatron_argv
    assert "--sequence-parallel" in argv[0] and "--swiglu" in argv[0] and "--untie-embeddings-and-output-weights" in argv[0]
    assert argv[0][argv[0].index("--normalization") + 1] == "RMSNorm"
    assert argv[0][argv[0].index("--position-embedding-type") + 1] == "rope"
    assert argv[0][argv[0].index("--seq-length") + 1] == "2048"


def test_layout_and_recompute_flags() -> None:
    st = [Stage(partition="a", num_layers=n) for n in (3, 1, 1)]
    assert pipeline_layout(st) == "Et*3|t|tL"
    assert pipeline_layout(st[:1]) == "Et*3L"
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    parsed = PipelineParallelLayerLayout.parse_str_to_list("Et*9|t*9|t*5|t*5|t*4L")
    assert [sum(x.name == "decoder" for x in stage) for stage in parsed] == [9, 9, 5, 5, 4]
    assert recompute_args(Recompute(), 4) == ()
    assert recompute_args(Recompute(mode="full", num_layers=0), 4) == ()
    assert recompute_args(Recompute(mode="full", num_layers=9), 4)[-1] == ("--recompute-num-layers", "4")
    assert recompute_args(Recompute(mode="full"), 4)[1] == ("--recompute-method", "uniform")


def test_rendered_arguments_parse_in_the_trainer() -> None:
    """The local site's entry takes exactly what the renderer emits (Megatron-LM's names)."""
    from memx_hpc.train.args import parse_args

    req = describe(load_plan(GOLDEN / "plans" / "local-pp2-a100-mi250.json"), load_site(LOCAL),
                   load_job(ROOT / "jobs" / "tiny-gpt.yaml"), iters=5)
    a0, a1 = (parse_args(argv) for argv in req.megatron_argv)
    assert a0.pipeline_model_parallel_layout == "Et*3|tL" and a0.train_iters == 5
    assert a0.recompute_granularity is None
    assert (a1.recompute_granularity, a1.recompute_method, a1.recompute_num_layers) == ("full", "uniform", 1)


# --------------------------------------------------------------------------- refusals


def _local():
    return load_site(LOCAL), load_job(ROOT / "jobs" / "tiny-gpt.yaml")


def _plan(*stages: tuple[str, int], tp: int = 1, dp: int = 1, mbs: int = 1, gbs: int = 8, sp: bool = False) -> Plan:
    return Plan(tp=tp, dp=dp, micro_batch_size=mbs, global_batch_size=gbs, sequence_parallel=sp,
                stages=tuple(Stage(partition=p, num_layers=n) for p, n in stages))


@pytest.mark.parametrize("plan,field,words", [
    (_plan(("nvidia_h100", 4)), "stages[0].partition", "unknown partition"),
    # TP 4 over two whole 2-GPU nodes would be placed, but the partition has one node
    (_plan(("nvidia_a100", 4), tp=4), "nodes", "needs 2 nodes of partition nvidia_a100"),
    (_plan(("nvidia_a100", 2), ("nvidia_a100", 2), tp=2), "nodes", "needs 2 nodes of partition nvidia_a100"),
    (_plan(("nvidia_a100", 3), ("amd_mi250", 2)), "stages", "hold 5 layers"),
    (_plan(("nvidia_a100", 4), sp=True), "sequence_parallel", "tensor-parallel size > 1"),
])
def test_refusals_name_the_reason(plan: Plan, field: str, words: str) -> None:
    site, job = _local()
    with pytest.raises(SpecError) as e:
        render(plan, site, job)
    assert field in (e.value.field or "") and words in str(e.value)


def test_cross_vendor_pipeline_needs_ucc() -> None:
    site = load_site(CROSS)
    site = dataclasses.replace(site, pipeline_comm_backend="nccl")
    job = load_job(ROOT / "jobs" / "gpt3-2.7b.yaml")
    plan = _plan(("gpu_a100", 16), ("gpu_mi250x", 16), gbs=64)
    with pytest.raises(SpecError) as e:
        render(plan, site, job)
    assert e.value.field == "pipeline_comm.backend" and "crosses vendors" in str(e.value)
    assert "gpu_a100 (nvidia) -> gpu_mi250x (amd)" in str(e.value)
    # same vendor on both sides: NCCL is fine
    render(_plan(("gpu_a100", 16), ("gpu_v100", 16), gbs=64), site, job)


def test_tp_that_does_not_divide_heads_is_refused() -> None:
    site = load_site(CROSS)
    job = load_job(ROOT / "jobs" / "gpt3-2.7b.yaml")  # 32 heads, hidden 2560
    with pytest.raises(SpecError, match="not divisible by the tensor-parallel size"):
        render(_plan(("gpu_mi250x", 32), tp=3, gbs=63), site, job)


def test_unsupported_megatron_version_is_refused() -> None:
    site, job = _local()
    with pytest.raises(SpecError) as e:
        render(_plan(("nvidia_a100", 4)), dataclasses.replace(site, megatron_version="core_r0.9.0"), job)
    assert e.value.field == "megatron_version"


# --------------------------------------------------------------------------- hostile values


HOSTILE = ["a'; echo pwned", "two words", "$(touch {marker})", "`touch {marker}`", '"; touch {marker}; "']
NEWLINE = "ok\ntouch {marker}"


def _site_with(tmp: Path, mutate) -> dict:
    import yaml

    data = yaml.safe_load(LOCAL.read_text())
    data = json.loads(json.dumps(data))
    data["work_dir"] = str(tmp / "runs")
    mutate(data)
    return data


def _fake_bin(tmp: Path) -> Path:
    """scontrol and srun stand-ins: srun runs each component's function locally, a process per task."""
    from memx_hpc.slurm.standin import write_standins

    return write_standins(tmp / "bin", node="a100n0")


def _recorder(tmp: Path) -> Path:
    """A stand-in python: records its argv and environment, runs nothing."""
    p = tmp / "record-python"
    p.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, sys
        with open(os.path.join({str(tmp)!r}, "rank%s.json" % os.environ["RANK"]), "w") as f:
            json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, f)
        """))
    p.chmod(0o755)
    return p


def _run_script(tmp: Path, text: str) -> subprocess.CompletedProcess:
    script = tmp / "job.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    env = dict(os.environ, PATH=f"{_fake_bin(tmp)}:{os.environ['PATH']}", SLURM_JOB_ID="4242",
               SLURM_JOB_NODELIST_HET_GROUP_0="a100n0")
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp, timeout=60)


PLAN2 = _plan(("nvidia_a100", 3), ("amd_mi250", 1), mbs=2)


def _two_partitions(data: dict, key: str, value) -> None:
    for p in data["partitions"][:2]:
        p[key] = value


@pytest.mark.parametrize("raw", HOSTILE + [NEWLINE])
def test_hostile_env_values_arrive_verbatim_or_are_refused(raw: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    value = raw.format(marker=marker)
    rec = _recorder(tmp_path)

    def mutate(d: dict) -> None:
        for p in d["partitions"]:
            p["python"] = str(rec)
            p["megatron_entry"] = "-m memx_hpc.train.pretrain_gpt"
            p["env"] = {"MEMX_TEST_VALUE": value}
        d["pipeline_comm"] = {"backend": "ucc", "env": {"UCX_TLS": value}}
        d["name"] = value if "\n" not in value else "local"

    if "\n" in value:  # refused when the site is loaded, so validate refuses what render would
        with pytest.raises(SpecError) as e:
            site_from_mapping(_site_with(tmp_path, mutate))
        assert (e.value.field or "").endswith((".env.MEMX_TEST_VALUE", "pipeline_comm.env.UCX_TLS"))
        return
    site = site_from_mapping(_site_with(tmp_path, mutate))
    job = load_job(ROOT / "jobs" / "tiny-gpt.yaml")
    r = _run_script(tmp_path, render(PLAN2, site, job, extra=[value]))
    assert r.returncode == 0, r.stderr
    assert not marker.exists(), "a hostile value was executed"
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["env"]["MEMX_TEST_VALUE"] == value
        assert got["argv"][-1] == value  # the extra argument, one word, unchanged
        assert got["env"]["RANK"] == str(rank) and got["env"]["MASTER_ADDR"] == "127.0.0.1"
        assert got["env"]["MASTER_PORT"] == str(20000 + 4242 % 20000)


@pytest.mark.parametrize("raw", HOSTILE + [NEWLINE, "-c touch {marker}", "~/x $HOME/y"])
def test_hostile_launcher_paths_are_refused_everywhere(raw: str, tmp_path: Path) -> None:
    """python, container and megatron_entry are paths: the site loader (what validate runs)
    and every way of building a partition refuse a value that is not, naming the field;
    render and the profiler take only built partitions, so they see none of these."""
    marker = tmp_path / "pwned"
    value = raw.format(marker=marker)
    for key in ("python", "megatron_entry", "container"):
        with pytest.raises(SpecError) as e:
            site_from_mapping(_site_with(tmp_path, lambda d: _two_partitions(d, key, value)))
        assert e.value.field == f"partitions[0].{key}"
        site = load_site(LOCAL)
        with pytest.raises(SpecError) as e:  # replace() runs the same checks
            dataclasses.replace(site.partitions[0], **{key: value})
        assert e.value.field == key
    assert not marker.exists()


def test_setup_lines_cannot_close_their_component(tmp_path: Path) -> None:
    """A setup line that would close the component's function and run at the top of the
    batch script is refused by the loader; written into a script anyway (past every check),
    it is one quoted word of an eval inside its component and still runs nothing."""
    from memx_hpc.slurm.render import render_request

    marker = tmp_path / "pwned"
    escapes = [f"}}; touch {marker}; f() {{", f":; }}; touch {marker}; f() {{ :", f"( touch {marker}",
               f"if true; then touch {marker}"]
    for line in escapes:
        with pytest.raises(SpecError) as e:
            site_from_mapping(_site_with(tmp_path, lambda d: d["partitions"][0].update(setup=[line])))
        assert e.value.field == "partitions[0].setup[0]" and "bash -n" in str(e.value)
    rec = _recorder(tmp_path)
    site = site_from_mapping(_site_with(tmp_path, lambda d: [p.update(python=str(rec)) for p in d["partitions"]]))
    req = describe(PLAN2, site, load_job(ROOT / "jobs" / "tiny-gpt.yaml"))
    forced = dataclasses.replace(req, components=tuple(dataclasses.replace(c, setup=tuple(escapes))
                                                        for c in req.components))
    text = render_request(forced)
    r = _run_script(tmp_path, text)
    assert not marker.exists(), "a setup line broke out of its component"
    assert r.returncode != 0 and "syntax error" in r.stderr  # the component fails, at its own setup


@pytest.mark.parametrize("key", ["gres_type", "account", "qos", "name"])
@pytest.mark.parametrize("raw", HOSTILE + [NEWLINE])
def test_hostile_slurm_names_are_refused(key: str, raw: str, tmp_path: Path) -> None:
    value = raw.format(marker=tmp_path / "pwned")
    site = load_site(LOCAL)
    with pytest.raises(SpecError) as e:  # the spec refuses it when built, so no sbatch line sees it
        parts = list(site.partitions)
        parts[0] = dataclasses.replace(parts[0], **{key: value})
        site = dataclasses.replace(site, partitions=tuple(parts))
        plan = PLAN2 if key != "name" else _plan((value, 3), ("amd_mi250", 1), mbs=2)
        render(plan, site, load_job(ROOT / "jobs" / "tiny-gpt.yaml"))
    assert key in (e.value.field or "") or "partition" in (e.value.field or "")


@pytest.mark.parametrize("raw", HOSTILE + [NEWLINE])
def test_hostile_site_slurm_options_and_job_name_are_refused(raw: str, tmp_path: Path) -> None:
    value = raw.format(marker=tmp_path / "pwned")
    site, job = _local()
    for kw, field in (({"account": value}, "slurm.account"), ({"qos": value}, "slurm.qos")):
        with pytest.raises(SpecError) as e:
            render(PLAN2, dataclasses.replace(site, **kw), job)
        assert e.value.field == field
    with pytest.raises(SpecError) as e:
        render(PLAN2, site, dataclasses.replace(job, name=value))
    assert e.value.field == "name"


@pytest.mark.parametrize("raw", HOSTILE)
def test_hostile_work_dir_is_quoted(raw: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    value = raw.format(marker=marker)
    site, job = _local()
    text = render(PLAN2, dataclasses.replace(site, work_dir=str(tmp_path / value)), job)
    out = [line for line in text.splitlines() if line.startswith("#SBATCH --output=")][0]
    assert shlex.split(out.split("=", 1)[1]) == [f"{tmp_path / value}/tiny-gpt-%j.out"]
    with pytest.raises(SpecError):
        render(PLAN2, dataclasses.replace(site, work_dir=str(tmp_path) + "\nx"), job)


def test_setup_lines_run_only_inside_their_component(tmp_path: Path) -> None:
    """Setup lines are shell code by contract (module load ...): never run by the batch
    part of the script, only by each component on its nodes; lines that would escape their
    component's function are refused."""
    marker = tmp_path / "setup-ran"
    rec = _recorder(tmp_path)

    def mutate(d: dict) -> None:
        for p in d["partitions"]:
            p["python"] = str(rec)
            p["setup"] = [f"touch {marker}.$MEMX_PARTITION_SEEN", "export MEMX_SETUP_DONE=yes"]
    site = site_from_mapping(_site_with(tmp_path, mutate))
    text = render(PLAN2, site, load_job(ROOT / "jobs" / "tiny-gpt.yaml"))
    batch_part = text[:text.index("memx_component_0() {")] + text[text.index("\nsrun "):]
    assert "touch" not in batch_part
    assert f"  eval {shlex.quote(f'touch {marker}.$MEMX_PARTITION_SEEN')}" in text
    r = _run_script(tmp_path, text)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "setup-ran.").exists()  # ran in the components, before their environment
    assert json.loads((tmp_path / "rank1.json").read_text())["env"]["MEMX_SETUP_DONE"] == "yes"
    for bad in ("echo 'unbalanced", "cat <<EOF", "a\nb"):
        with pytest.raises(SpecError) as e:
            site_from_mapping(_site_with(tmp_path, lambda d: d["partitions"][0].update(setup=[bad])))
        assert e.value.field == "partitions[0].setup[0]"


def test_single_component_job_finds_its_head_node(tmp_path: Path) -> None:
    """A one-component job is not a hetjob: the rendezvous comes from SLURM_JOB_NODELIST."""
    rec = _recorder(tmp_path)
    site = site_from_mapping(_site_with(tmp_path, lambda d: [p.update(python=str(rec)) for p in d["partitions"]]))
    text = render(_plan(("nvidia_v100", 4), tp=2), site, load_job(ROOT / "jobs" / "tiny-gpt.yaml"))
    assert "#SBATCH hetjob" not in text
    script = tmp_path / "one.sbatch"
    script.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PATH=f"{_fake_bin(tmp_path)}:{os.environ['PATH']}", SLURM_JOB_ID="7", SLURM_JOB_NODELIST="v100n0")
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "rank0.json").read_text())["env"]["MASTER_PORT"] == "20007"


# --------------------------------------------------------------------------- command line


def test_cli_render_writes_and_checks(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "s.sbatch"
    rc = main(["render", "--plan", str(GOLDEN / "plans" / "cross-vendor-gpt3-2.7b.json"), "--site", str(CROSS),
               "--job", str(ROOT / "jobs" / "gpt3-2.7b.yaml"), "--out", str(out), "--no-test-only", "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["bash_n"] == "ok" and data["world_size"] == 20 and len(data["components"]) == 3
    assert out.read_text().startswith("#!/bin/bash")


def test_cli_render_general_plan_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    plan = tmp_path / "general.json"
    plan.write_text(json.dumps({"format": "memx-plan/1", "micro_batch_size": 1, "global_batch_size": 8, "stages": [
        {"num_layers": 4, "replicas": [{"gpu_type": "A100-80", "tp": 2}, {"gpu_type": "V100-32", "tp": 1}]}]}))
    rc = main(["render", "--plan", str(plan), "--site", str(LOCAL), "--job", str(ROOT / "jobs" / "tiny-gpt.yaml"),
               "--no-test-only"])
    assert rc == 1 and "cannot run it" in capsys.readouterr().err


def test_cli_render_bad_plan_names_field(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"format": "memx-plan/1", "tp": 1, "dp": 1, "micro_batch_size": 1,
                                "global_batch_size": 8, "stages": [{"partition": "gpu_a100", "num_layers": 4}]}))
    rc = main(["render", "--plan", str(plan), "--site", str(LOCAL), "--job", str(ROOT / "jobs" / "tiny-gpt.yaml"),
               "--no-test-only"])
    err = capsys.readouterr().err
    assert rc == 1 and "stages[0].partition" in err and "Traceback" not in err


def test_launch_fields_are_checked_where_the_site_is_loaded(tmp_path: Path) -> None:
    """validate (the loader) refuses what render and profiling would: a CPU partition set to
    Transformer Engine, a GPU partition standing in for a vendor, unknown choices."""
    cases = [({"transformer_impl": "transformer_engine"}, "partitions[0].transformer_impl"),
             ({"transformer_impl": "te"}, "partitions[0].transformer_impl"),
             ({"stand_in_for": "cpu"}, "partitions[0].stand_in_for"),
             ({"module_purge": "yes"}, "partitions[0].module_purge")]
    for change, field in cases:
        with pytest.raises(SpecError) as e:
            site_from_mapping(_site_with(tmp_path, lambda d: d["partitions"][0].update(change)))
        assert e.value.field == field, (change, e.value)
    cross = load_site(CROSS)
    with pytest.raises(SpecError) as e:
        dataclasses.replace(cross, partitions=(dataclasses.replace(cross.partitions[0], stand_in_for="amd"),
                                               *cross.partitions[1:]))
    assert e.value.field == "partitions[0].stand_in_for"


def test_cross_vendor_environment_that_megatron_core_or_ucx_would_refuse_is_refused() -> None:
    site, job = load_site(CROSS), load_job(ROOT / "jobs" / "llama2-7b.yaml")
    plan = load_plan(GOLDEN / "plans" / "cross-vendor-llama2-7b.json")

    def with_env(i: int, **env: str):
        parts = list(site.partitions)
        parts[i] = dataclasses.replace(parts[i], env=tuple({**dict(parts[i].env), **env}.items()))
        return dataclasses.replace(site, partitions=tuple(parts))

    with pytest.raises(SpecError) as e:
        describe(plan, with_env(1, UCX_TLS="rc,sm,self"), job)
    assert e.value.field == "partitions[1].env.UCX_TLS" and "rocm_copy" in str(e.value)
    with pytest.raises(SpecError) as e:
        describe(plan, with_env(0, CUDA_DEVICE_MAX_CONNECTIONS="1"), job)
    assert e.value.field == "partitions[0].env.CUDA_DEVICE_MAX_CONNECTIONS"
    describe(plan, with_env(1, UCX_TLS="all"), job)  # UCX's default: every transport
    # one vendor: neither applies (Megatron-LM's own entry wants CUDA_DEVICE_MAX_CONNECTIONS=1)
    describe(_plan(("gpu_a100", 16), ("gpu_v100", 16), gbs=64), with_env(0, UCX_TLS="rc"),
             load_job(ROOT / "jobs" / "gpt3-2.7b.yaml"))


# --------------------------------------------------------------------------- virtual, context, expert parallel


def test_virtual_stages_go_into_the_layout_in_megatrons_chunk_order() -> None:
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    st = [Stage(partition="a", num_layers=n) for n in (5, 3, 4)]
    text = pipeline_layout(st, 2)
    # chunk k of rank i at k*pp + i; the remainder of a stage's layers to its later chunk
    assert text == "Et*2|t|t*2|t*3|t*2|t*2L"
    layout = PipelineParallelLayerLayout(text, 3)
    per_rank = [[sum(x.name == "decoder" for x in chunk) for chunk in rank] for rank in layout.layout]
    assert per_rank == [[2, 3], [1, 2], [2, 2]]
    layout.validate_layer_layout(12, None)  # what megatron-core checks when it builds the model
    plan = Plan(tp=1, dp=1, micro_batch_size=1, global_batch_size=6, virtual_stages=2, stages=tuple(st))
    assert [list(plan.chunk_layers(i)) for i in range(3)] == per_rank


def test_context_and_expert_parallel_arguments_and_groups() -> None:
    from memx_hpc.spec.catalog import preset
    from memx_hpc.spec import job_for_model

    site = load_site(CROSS)
    job = load_job(ROOT / "jobs" / "gpt3-2.7b.yaml")
    plan = Plan(tp=2, dp=1, cp=2, micro_batch_size=1, global_batch_size=64, virtual_stages=2, sequence_parallel=True,
                stages=(Stage(partition="gpu_a100", num_layers=16), Stage(partition="gpu_a100", num_layers=16)))
    req = describe(plan, site, job)
    argv = req.megatron_argv[0]
    assert argv[argv.index("--context-parallel-size") + 1] == "2"
    assert argv[argv.index("--pipeline-model-parallel-layout") + 1] == "Et*8|t*8|t*8|t*8L"
    assert "--num-virtual-stages-per-pipeline-rank" not in argv  # the layout carries them
    assert req.world_size == 8 and "cp=2" in req.summary and "vp=2" in req.summary
    assert {g.kind for g in req.groups} >= {"cp", "dp_cp"}
    moe = job_for_model(preset("Mixtral-8x7B"), 64, train_iters=10)
    ep = Plan(tp=2, dp=2, ep=4, etp=1, micro_batch_size=1, global_batch_size=64,
              stages=(Stage(partition="gpu_a100", num_layers=32),))
    argv = describe(ep, site, moe).megatron_argv[0]
    assert argv[argv.index("--expert-model-parallel-size") + 1] == "4"
    assert argv[argv.index("--expert-tensor-parallel-size") + 1] == "1"


def test_what_the_new_degrees_cannot_run_is_refused_by_name() -> None:
    site = load_site(CROSS)
    job = load_job(ROOT / "jobs" / "gpt3-2.7b.yaml")
    two = (Stage(partition="gpu_a100", num_layers=16), Stage(partition="gpu_a100", num_layers=16))
    # full:3 of 16 layers cannot be shared by 2 chunks (Megatron recomputes k of each chunk)
    odd = (Stage(partition="gpu_a100", num_layers=16, recompute=Recompute(mode="full", num_layers=3)), two[1])
    with pytest.raises(SpecError) as e:
        describe(Plan(tp=2, dp=1, micro_batch_size=1, global_batch_size=64, virtual_stages=2, stages=odd), site, job)
    assert e.value.field == "stages[0].recompute"
    even = (Stage(partition="gpu_a100", num_layers=16, recompute=Recompute(mode="full", num_layers=4)), two[1])
    argv = describe(Plan(tp=2, dp=1, micro_batch_size=1, global_batch_size=64, virtual_stages=2, stages=even),
                    site, job).megatron_argv[0]
    assert argv[argv.index("--recompute-num-layers") + 1] == "2"  # 2 of each chunk's 8 = 4 of the stage
    # cross-vendor plans run the project's entry: virtual stages (its interleaved schedule), no CP
    cross = (Stage(partition="gpu_a100", num_layers=16), Stage(partition="gpu_mi250x", num_layers=16))
    argv = describe(Plan(tp=2, dp=1, micro_batch_size=1, global_batch_size=64, stages=cross, virtual_stages=2),
                    site, job).megatron_argv[0]
    assert argv[argv.index("--pipeline-model-parallel-layout") + 1].count("|") == 3
    for kw, field in ((dict(cp=2), "cp"),):
        with pytest.raises(SpecError) as e:
            describe(Plan(tp=2, dp=1, micro_batch_size=1, global_batch_size=64, stages=cross, **kw), site, job)
        # CP: the MI250X partition's local layer refuses it before the entry does
        assert e.value.field == field and ("project's megatron-core entry" in str(e.value)
                                           or (field == "cp" and "Transformer Engine" in str(e.value)))


def test_plan_files_carry_the_new_degrees_and_old_files_still_read(tmp_path: Path) -> None:
    from memx_hpc.planfile import plan_from_mapping, plan_to_dict, save_plan

    plan = Plan(tp=2, dp=2, cp=2, ep=4, etp=1, virtual_stages=2, micro_batch_size=1, global_batch_size=64,
                stages=(Stage(partition="gpu_a100", num_layers=16), Stage(partition="gpu_a100", num_layers=16)))
    save_plan(plan, tmp_path / "p.json")
    assert load_plan(tmp_path / "p.json") == plan
    plain = dataclasses.replace(plan, cp=1, ep=1, etp=None, virtual_stages=1)
    d = plan_to_dict(plain)
    assert not {"cp", "ep", "etp", "virtual_stages"} & set(d)  # files of plain plans are as before
    assert plan_from_mapping(d) == plain
    with pytest.raises(SpecError) as e:
        plan_from_mapping({**plan_to_dict(plan), "virtual_stages": 0})
    assert e.value.field == "virtual_stages"


def test_context_parallel_is_refused_where_the_local_layer_trains() -> None:
    site, job = _local()  # CPU partitions: megatron-core's local spec
    plan = Plan(tp=1, dp=1, cp=2, micro_batch_size=1, global_batch_size=8,
                stages=(Stage(partition="nvidia_a100", num_layers=4),))
    with pytest.raises(SpecError) as e:
        describe(plan, site, job)
    assert e.value.field == "cp" and "Transformer Engine" in str(e.value)


# --------------------------------------------------------------------------- a run that continues itself


def _trainer_standin(tmp: Path) -> Path:
    """A stand-in python for the continuation's bash: the preflight passes; the "training" moves
    the checkpoint tracker of --save on by $FAKE_STEP iterations (rank 0), records its argv, and with
    $FAKE_WAIT waits for SIGTERM first (saving then, as --exit-signal-handler does)."""
    p = tmp / "fake-python"
    p.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, signal, sys, time
        if sys.argv[1] == "-c":
            sys.exit(0)
        argv = sys.argv[1:]
        rank = os.environ["RANK"]
        with open(os.path.join({str(tmp)!r}, "argv%s.json" % rank), "w") as f:
            json.dump(argv, f)
        save = argv[argv.index("--save") + 1]
        total = int(argv[argv.index("--train-iters") + 1])
        tracker = os.path.join(save, "latest_checkpointed_iteration.txt")
        if os.environ.get("FAKE_WAIT"):
            hit = []
            signal.signal(signal.SIGTERM, lambda *a: hit.append(1))
            with open(os.path.join({str(tmp)!r}, "pid%s" % rank), "w") as f:
                f.write(str(os.getpid()))
            while not hit:
                time.sleep(0.05)
        if rank == "0":
            os.makedirs(save, exist_ok=True)
            cur = int(open(tracker).read()) if os.path.exists(tracker) else 0
            with open(tracker, "w") as f:
                f.write(str(min(total, cur + int(os.environ.get("FAKE_STEP", "2")))))
        sys.exit(int(os.environ.get("FAKE_RC", "0")))
        """))
    p.chmod(0o755)
    return p


def _slurm_clients(tmp: Path) -> Path:
    """sbatch and scancel stand-ins beside scontrol and srun: sbatch records its arguments and
    prints a job id; scancel records its own and sends SIGTERM to the stand-in ranks."""
    b = _fake_bin(tmp)
    (b / "sbatch").write_text(f"#!/bin/bash\nprintf '%s\\n' \"$@\" > {shlex.quote(str(tmp))}/sbatch-args\necho 777\n")
    (b / "scancel").write_text(textwrap.dedent(f"""\
        #!/bin/bash
        printf '%s\\n' "$@" > {shlex.quote(str(tmp))}/scancel-args
        for f in {shlex.quote(str(tmp))}/pid*; do kill -TERM "$(cat "$f")"; done
        """))
    for f in ("sbatch", "scancel"):
        (b / f).chmod(0o755)
    return b


def _continuing(tmp: Path, log_dir: str, *, iters: int = 5, max_segments: int = 1000) -> tuple[str, Path]:
    from memx_hpc.spec import job_from_mapping

    py = _trainer_standin(tmp)
    site = site_from_mapping(_site_with(tmp, lambda d: [p.update(python=str(py)) for p in d["partitions"]]))
    ck = tmp / "ck"
    job = job_from_mapping({"name": "cont", "model": "tiny-gpt", "global_batch_size": 8, "precision": "fp32",
                            "train_iters": iters, "checkpoint": {"save": str(ck), "interval": 1,
                                                                 "max_segments": max_segments}})
    return render(PLAN2, site, job, log_dir=log_dir), ck


def _segment(tmp: Path, text: str, segment: int | None = None, **env_more: str) -> subprocess.CompletedProcess:
    script = tmp / "job.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    for f in tmp.glob("sbatch-args"):
        f.unlink()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MEMX_"))}
    env.update(PATH=f"{_slurm_clients(tmp)}:{os.environ['PATH']}", SLURM_JOB_ID="4242",
               SLURM_JOB_NODELIST_HET_GROUP_0="a100n0", **env_more)
    if segment is not None:
        env["MEMX_SEGMENT"] = str(segment)
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp, timeout=60)


def _states(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "segments.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("raw", ["plain", "a'; echo pwned $(touch {marker})"])
def test_a_run_continues_segment_after_segment_until_its_length(raw: str, tmp_path: Path) -> None:
    """The rendered bash, without Slurm: each segment that moves the checkpoint on submits the same
    script as a dependent job (the next segment number in its environment); the next one loads the
    checkpoint; the one that reaches train_iters says so and submits nothing. A hostile log folder
    is one word everywhere."""
    marker = tmp_path / "pwned"
    log_dir = str(tmp_path / raw.format(marker=marker))
    text, ck = _continuing(tmp_path, log_dir)
    head = text.split("\nset -euo pipefail", 1)[0]
    assert "#SBATCH --signal=B:USR1@180" in head and "#SBATCH --requeue" in head
    assert "#SBATCH --open-mode=append" in head
    run_dir = Path(log_dir) / "cont"
    seen = []
    segment = None
    for n in (1, 2, 3):
        r = _segment(tmp_path, text, segment)
        assert r.returncode == 0, r.stdout + r.stderr
        argv = json.loads((tmp_path / "argv0.json").read_text())
        seen.append(argv[-2:] if argv[-2] == "--load" else None)
        if n < 3:
            args = (tmp_path / "sbatch-args").read_text().splitlines()
            assert args[:3] == ["--parsable", "--dependency=afterany:4242", f"--export=ALL,MEMX_SEGMENT={n + 1}"]
            assert args[3] == str(tmp_path / "job.sbatch")  # the same script
            segment = n + 1
        else:
            assert not (tmp_path / "sbatch-args").exists()
            assert "training is complete: checkpoint iteration 5 of 5" in r.stdout
    assert seen == [None, ["--load", str(ck)], ["--load", str(ck)]]
    assert argv[argv.index("--tensorboard-dir") + 1] == f"{run_dir}/tensorboard"
    states = _states(run_dir)
    assert [(s["event"], s["outcome"], s["segment"], s["iteration"]) for s in states] == [
        ("start", "running", 1, 0), ("end", "continued", 1, 2), ("start", "running", 2, 2),
        ("end", "continued", 2, 4), ("start", "running", 3, 4), ("end", "complete", 3, 5)]
    assert states[1]["next_job_id"] == "777" and states[1]["job_id"] == "4242"
    assert not marker.exists()
    # submitted once more after the end: nothing to do
    r = _segment(tmp_path, text, 4)
    assert r.returncode == 0 and "training is complete" in r.stdout and not (tmp_path / "sbatch-args").exists()


def test_a_segment_without_a_new_checkpoint_ends_the_run_with_a_message(tmp_path: Path) -> None:
    text, ck = _continuing(tmp_path, str(tmp_path / "logs"))
    r = _segment(tmp_path, text, FAKE_STEP="2")
    assert r.returncode == 0
    r = _segment(tmp_path, text, 2, FAKE_STEP="0", FAKE_RC="1")
    assert r.returncode == 1 and not (tmp_path / "sbatch-args").exists()
    assert "segment 2 wrote no checkpoint newer than iteration 2 (step exit code 1" in r.stderr
    assert _states(tmp_path / "logs" / "cont")[-1] | {"time": ""} == {
        "event": "end", "outcome": "no-progress", "segment": 2, "job_id": "4242", "restart": 0, "iteration": 2,
        "target_iters": 5, "exit_code": 1, "next_job_id": "", "time": ""}


def test_the_segment_bound_stops_a_run_that_would_go_on(tmp_path: Path) -> None:
    text, _ = _continuing(tmp_path, str(tmp_path / "logs"), max_segments=2)
    assert _segment(tmp_path, text).returncode == 0
    r = _segment(tmp_path, text, 2)
    assert r.returncode == 1 and "after 2 segments (checkpoint.max_segments)" in r.stderr
    assert not (tmp_path / "sbatch-args").exists()
    assert _states(tmp_path / "logs" / "cont")[-1]["outcome"] == "max-segments"


def test_the_warning_signal_makes_every_rank_save_then_the_run_goes_on(tmp_path: Path) -> None:
    """Slurm's warning (B:USR1) reaches the batch shell while its step runs: the trap sends SIGTERM
    to the job's steps (scancel --signal=TERM), the ranks save and exit, the next segment is submitted."""
    import signal
    import time

    text, _ = _continuing(tmp_path, str(tmp_path / "logs"))
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MEMX_"))}
    env.update(PATH=f"{_slurm_clients(tmp_path)}:{os.environ['PATH']}", SLURM_JOB_ID="4242",
               SLURM_JOB_NODELIST_HET_GROUP_0="a100n0", FAKE_WAIT="1")
    p = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         cwd=tmp_path)
    deadline = time.monotonic() + 30
    while not ((tmp_path / "pid0").exists() and (tmp_path / "pid1").exists()) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    p.send_signal(signal.SIGUSR1)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, out + err
    assert (tmp_path / "scancel-args").read_text().split() == ["--signal=TERM", "4242"]
    assert "SIGUSR1 from Slurm: the time limit is near" in out and "segment 2 is job 777" in out
    assert _states(tmp_path / "logs" / "cont")[-1]["outcome"] == "continued"


@pytest.mark.parametrize("signal_spec,field_words", [("TERM@60", "SIGTERM cannot be"), ("B:15@60", "SIGTERM cannot"),
                                                     ("R:USR1@60", "reservation")])
def test_a_warning_the_script_cannot_tell_from_a_cancel_is_refused(signal_spec: str, field_words: str) -> None:
    from memx_hpc.spec import job_from_mapping

    site, _ = _local()
    job = job_from_mapping({"name": "cont", "model": "tiny-gpt", "global_batch_size": 8, "train_iters": 5,
                            "checkpoint": {"save": "/ck"}})
    with pytest.raises(SpecError) as e:
        render(PLAN2, dataclasses.replace(site, signal=signal_spec), job)
    assert e.value.field == "slurm.signal" and field_words in str(e.value)
    text = render(PLAN2, dataclasses.replace(site, signal="USR2@600", requeue=False), job)
    assert "#SBATCH --signal=B:USR2@600" in text and "#SBATCH --no-requeue" in text and "' USR2\n" in text
    # no checkpoints to continue from: one job, the site's own signal, no continuation
    once = render(PLAN2, dataclasses.replace(site, signal="USR1@60"), dataclasses.replace(job, checkpoint=None))
    assert "#SBATCH --signal=USR1@60" in once and "MEMX_STATE_FILE" not in once and "sbatch --parsable" not in once


def test_cli_render_names_the_run_folder_and_the_continuation(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: cont\nmodel: {preset: tiny-gpt}\nglobal_batch_size: 8\ntrain_iters: 7\n"
                   f"checkpoint: {{save: {tmp_path / 'ck'}, interval: 1}}\n")
    rc = main(["render", "--plan", str(GOLDEN / "plans" / "local-pp2-a100-mi250.json"), "--site", str(LOCAL),
               "--job", str(job), "--out", str(tmp_path / "t.sbatch"), "--log-dir", str(tmp_path / "logs"),
               "--no-test-only"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"run folder: {tmp_path / 'logs' / 'cont'}" in out and "until iteration 7" in out


def test_plan_files_carry_the_overlap_options_and_old_files_read_them_as_off(tmp_path: Path) -> None:
    from memx_hpc.planfile import load_plan_with_origin, plan_from_mapping, plan_to_dict, save_plan

    plan = Plan(tp=2, dp=2, micro_batch_size=1, global_batch_size=64, overlap_grad_reduce=True,
                overlap_param_gather=True, stages=(Stage(partition="gpu_a100", num_layers=32),))
    save_plan(plan, tmp_path / "p.json")
    back, origin = load_plan_with_origin(tmp_path / "p.json")
    assert back == plan and origin.unstated == ()
    d = plan_to_dict(dataclasses.replace(plan, overlap_grad_reduce=False, overlap_param_gather=False))
    assert (d["overlap_grad_reduce"], d["overlap_param_gather"]) == (False, False)  # always stated
    old = {k: v for k, v in plan_to_dict(plan).items() if not k.startswith("overlap")}
    (tmp_path / "old.json").write_text(json.dumps(old))
    back, origin = load_plan_with_origin(tmp_path / "old.json")
    assert not back.overlap_grad_reduce and not back.overlap_param_gather
    assert origin.unstated == ("overlap_grad_reduce", "overlap_param_gather")
    for bad, field in (({"overlap_grad_reduce": "yes"}, "overlap_grad_reduce"),
                       ({"overlap_grad_reduce": False}, "overlap_param_gather")):
        with pytest.raises(SpecError) as e:
            plan_from_mapping({**plan_to_dict(plan), **bad})
        assert e.value.field == field
