"""One Slurm request per job component (memx_hpc/slurm/request.py): the #SBATCH lines of a
rendered script and submitit's parameters come from the same object, memory is never
truncated, and the site's Slurm options are validated once, where the site is built."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from memx_hpc.errors import SpecError
from memx_hpc.slurm.render import describe, render
from memx_hpc.slurm.request import SlurmRequest
from memx_hpc.spec import Partition, Plan, Site, Stage, load_job, load_site, site_from_mapping

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "site_configs" / "local.yaml"
TINY = ROOT / "jobs" / "tiny-gpt.yaml"
PLAN2 = Plan(tp=1, dp=1, micro_batch_size=2, global_batch_size=8,
             stages=(Stage(partition="nvidia_a100", num_layers=3), Stage(partition="amd_mi250", num_layers=1)))


def _local(**site_changes) -> Site:
    return dataclasses.replace(load_site(LOCAL), **site_changes)


def _with_partition(site: Site, i: int, **changes) -> Site:
    parts = list(site.partitions)
    parts[i] = dataclasses.replace(parts[i], **changes)
    return dataclasses.replace(site, partitions=tuple(parts))


def _sbatch(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH")]


@pytest.mark.parametrize("gib,mib", [(0.5, 512), (2.2, 2253), (4.0, 4096), (1.0001, 1025), (0.0011, 2)])
def test_memory_is_mib_rounded_up_never_truncated(gib: float, mib: int) -> None:
    site = _with_partition(_local(), 0, mem_per_node_gib=gib)
    req = SlurmRequest.of(site, "nvidia_a100", nodes=1, tasks_per_node=1)
    assert req.mem_mib == mib
    assert f"#SBATCH --mem={mib}M" in req.sbatch_lines()
    assert req.submitit_parameters()["mem"] == f"{mib}M"


def test_a_rendered_fractional_memory_partition_asks_for_512_mib(tmp_path: Path) -> None:
    """0.5 GiB was --mem=0G in one of the old mappings: all of the node's memory to Slurm."""
    site = _with_partition(_local(), 0, mem_per_node_gib=0.5)
    text = render(PLAN2, site, load_job(TINY))
    lines = _sbatch(text)
    first, second = lines[:lines.index("#SBATCH hetjob")], lines[lines.index("#SBATCH hetjob") + 1:]
    assert "#SBATCH --mem=512M" in first and not any(s.startswith("#SBATCH --mem") for s in second)
    assert not any(s.startswith("#SBATCH --mem=0") for s in lines)
    script = tmp_path / "s.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_submitit_parameters_and_sbatch_lines_come_from_one_request(tmp_path: Path) -> None:
    """submitit's own sbatch writer, fed the request's parameters, writes the request's
    #SBATCH lines (the signal aside: submitit signals its own handler with USR2, at the
    site's lead time)."""
    from submitit.slurm.slurm import _make_sbatch_string

    site = _with_partition(_local(account="proj1", qos="high", exclusive=True, signal="USR1@120", requeue=False),
                           0, mem_per_node_gib=0.5, time_limit_min=45, qos="low")
    req = SlurmRequest.of(site, "nvidia_a100", nodes=1, tasks_per_node=2, job_name="memx-profile-cpu-4g")
    ours = req.sbatch_lines()
    theirs = _make_sbatch_string(command="true", folder=tmp_path, **req.submitit_parameters()).splitlines()
    assert [x for x in ours if not x.startswith("#SBATCH --signal")] == \
        [x for x in ours if x in theirs], (ours, theirs)
    assert "#SBATCH --signal=USR1@120" in ours and "#SBATCH --signal=USR2@120" in theirs
    for line in ("#SBATCH --mem=512M", "#SBATCH --qos=low", "#SBATCH --account=proj1", "#SBATCH --time=45",
                 "#SBATCH --exclusive", "#SBATCH --no-requeue", "#SBATCH --gres=gpu:a100:2",
                 "#SBATCH --ntasks-per-node=2", "#SBATCH --cpus-per-task=1"):
        assert line in ours, line
    # the rendered training script of the same partition asks for the same
    comp = describe(PLAN2, site, load_job(TINY)).components[0]
    assert comp.slurm == dataclasses.replace(req, tasks_per_node=1, gres="gpu:a100:1", job_name="tiny-gpt",
                                             output=comp.slurm.output)


def test_job_wide_options_sit_on_the_first_component_only() -> None:
    site = _local(exclusive=True, signal="B:USR1@60", requeue=True)
    lines = _sbatch(render(PLAN2, site, load_job(TINY)))
    cut = lines.index("#SBATCH hetjob")
    first, second = lines[:cut], lines[cut + 1:]
    for opt in ("--signal=B:USR1@60", "--requeue", "--job-name=tiny-gpt"):
        assert f"#SBATCH {opt}" in first and f"#SBATCH {opt}" not in second
    assert "#SBATCH --exclusive" in first and "#SBATCH --exclusive" in second
    # a partition overrides the site's exclusive
    lines = _sbatch(render(PLAN2, _with_partition(site, 1, exclusive=False), load_job(TINY)))
    assert "#SBATCH --exclusive" not in lines[lines.index("#SBATCH hetjob"):]


def test_untyped_gpus_and_cpu_partitions() -> None:
    site = Site(name="s", partitions=(Partition(name="g", gpu_type="A100-80", nodes=2, gpus_per_node=4),
                                      Partition(name="c", gpu_type="cpu", nodes=1, gpus_per_node=2)))
    assert SlurmRequest.of(site, "g", nodes=2, tasks_per_node=4).gres == "gpu:4"
    assert SlurmRequest.of(site, "c", nodes=1, tasks_per_node=2).gres is None
    assert "gres" not in SlurmRequest.of(site, "c", nodes=1, tasks_per_node=2).submitit_parameters()


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_one_container_runtime_per_site(runtime: str, tmp_path: Path) -> None:
    site = Site(name="s", container_runtime=runtime, partitions=(
        Partition(name="a", gpu_type="A100-80", nodes=1, gpus_per_node=4, container="/img/cuda.sqsh",
                  python="/usr/bin/python3", megatron_entry="/opt/m/pretrain_gpt.py"),
        Partition(name="m", gpu_type="MI250X-GCD", nodes=1, gpus_per_node=8, container="/img/rocm.sif",
                  python="/usr/bin/python3", megatron_entry="/opt/m/pretrain_gpt.py")))
    a = SlurmRequest.of(site, "a", nodes=1, tasks_per_node=4)
    m = SlurmRequest.of(site, "m", nodes=1, tasks_per_node=8)
    if runtime == "pyxis":
        assert a.launcher("/usr/bin/python3") == ("/usr/bin/python3",)
        assert a.submitit_parameters()["srun_args"] == ["--container-image=/img/cuda.sqsh"]
        assert a.submitit_python("/usr/bin/python3") == "/usr/bin/python3"
        assert ("container-image", "/img/rocm.sif") in [(o.name, o.value) for o in m.srun_options()]
    else:
        assert a.launcher("/usr/bin/python3") == ("apptainer", "exec", "--nv", "/img/cuda.sqsh", "/usr/bin/python3")
        assert m.launcher("py") == ("apptainer", "exec", "--rocm", "/img/rocm.sif", "py")
        assert "srun_args" not in a.submitit_parameters()
        assert a.submitit_python("/usr/bin/python3") == "apptainer exec --nv /img/cuda.sqsh /usr/bin/python3"
    job = load_job(ROOT / "jobs" / "gpt3-2.7b.yaml")
    text = render(Plan(tp=4, dp=1, micro_batch_size=1, global_batch_size=8,
                       stages=(Stage(partition="a", num_layers=32),)), site, job)
    srun = text[text.index("\nsrun "):]
    assert ("--container-image=/img/cuda.sqsh" in srun) == (runtime == "pyxis")
    assert ("apptainer exec --nv /img/cuda.sqsh /usr/bin/python3" in text) == (runtime == "apptainer")
    script = tmp_path / "s.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def _site_doc(**slurm) -> dict:
    return {"name": "s", "slurm": slurm,
            "partitions": [{"name": "a", "gpu_type": "A100-80", "nodes": 1, "gpus_per_node": 4}]}


@pytest.mark.parametrize("slurm,field", [
    ({"container_runtime": "docker"}, "slurm.container_runtime"),
    ({"exclusive": "yes"}, "slurm.exclusive"),
    ({"requeue": 1}, "slurm.requeue"),
    ({"signal": "USR1@soon"}, "slurm.signal"),
    ({"signal": "USR1@70000"}, "slurm.signal"),
    ({"signal": "USR1; touch x"}, "slurm.signal"),
    ({"signal": "USR1\n@60"}, "slurm.signal"),
])
def test_site_slurm_options_are_validated_where_the_site_is_loaded(slurm: dict, field: str) -> None:
    with pytest.raises(SpecError) as e:
        site_from_mapping(_site_doc(**slurm))
    assert e.value.field == field


def test_a_container_needs_the_sites_runtime() -> None:
    doc = _site_doc()
    doc["partitions"][0]["container"] = "/img/x.sif"
    with pytest.raises(SpecError) as e:
        site_from_mapping(doc)
    assert e.value.field == "slurm.container_runtime" and "pyxis, apptainer" in str(e.value)
    doc["slurm"]["container_runtime"] = "apptainer"
    assert site_from_mapping(doc).container_runtime == "apptainer"
    doc["partitions"][0]["exclusive"] = "no"
    with pytest.raises(SpecError) as e:
        site_from_mapping(doc)
    assert e.value.field == "partitions[0].exclusive"


@pytest.mark.parametrize("kw,field", [({"nodes": 0}, "nodes"), ({"tasks_per_node": True}, "tasks_per_node"),
                                      ({"job_name": "two words"}, "job name"), ({"output": "a\nb"}, "output"),
                                      ({"chdir": "x\r"}, "workdir")])
def test_what_a_caller_adds_is_checked(kw: dict, field: str) -> None:
    args = {"nodes": 1, "tasks_per_node": 1, **kw}
    with pytest.raises(SpecError) as e:
        SlurmRequest.of(_local(), "nvidia_a100", **args)
    assert e.value.field == field
