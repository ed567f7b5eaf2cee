"""Site and job files: valid ones load; malformed ones give exit 1 and name the field."""

from __future__ import annotations

import copy
import string
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memx_hpc.cli.main import main
from memx_hpc.errors import SpecError
from memx_hpc.spec import job_from_mapping, load_job, load_site, site_from_mapping

ROOT = Path(__file__).resolve().parents[2]
SITES = sorted((ROOT / "site_configs").glob("*.yaml"))
JOBS = sorted((ROOT / "jobs").glob("*.yaml"))

BASE_SITE = {
    "name": "t",
    "partitions": [
        {"name": "a", "gpu_type": "A100-80", "nodes": 2, "gpus_per_node": 4},
        {"name": "b", "gpu_type": "MI250X-GCD", "nodes": 1, "gpus_per_node": 8},
    ],
}
BASE_JOB = {"model": {"preset": "GPT-3-1.3B"}, "global_batch_size": 32}


def test_example_files_exist():
    assert {p.name for p in SITES} >= {"local.yaml", "example-cross-vendor.yaml"}
    assert JOBS


@pytest.mark.parametrize("path", SITES, ids=lambda p: p.name)
def test_example_sites_load(path):
    site = load_site(path)
    assert site.partitions and site.total_gpus == sum(p.nodes * p.gpus_per_node for p in site.partitions)
    for p in site.partitions:
        assert site.gpu(p.gpu_type).memory_gib > 0


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.name)
def test_example_jobs_load(path):
    job = load_job(path)
    assert job.model.hidden_size % job.model.num_attention_heads == 0
    assert job.global_batch_size >= 1


def test_cross_vendor_example_has_two_vendors_and_about_20_gpus():
    site = load_site(ROOT / "site_configs/example-cross-vendor.yaml")
    vendors = {site.gpu(p.gpu_type).vendor for p in site.partitions}
    assert len(vendors) >= 2 and len(site.partitions) == 3
    assert 16 <= site.total_gpus <= 24


def test_preset_override_and_explicit_shape():
    job = job_from_mapping({"model": {"preset": "Llama-2-7B", "seq_length": 1024}, "global_batch_size": 8})
    assert job.model.seq_length == 1024 and job.model.activation == "swiglu"
    job = job_from_mapping({"model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                                      "vocab_size": 100, "seq_length": 32}, "global_batch_size": 2})
    assert job.model.ffn_hidden_size == 256 and job.model.num_query_groups == 4


def _set(d, path, value):
    d = copy.deepcopy(d)
    cur = d
    keys = path.split(".")
    for k in keys[:-1]:
        cur = cur[int(k)] if k.isdigit() else cur[k]
    last = keys[-1]
    if value is _DELETE:
        del cur[int(last) if last.isdigit() else last]
    else:
        cur[int(last) if last.isdigit() else last] = value
    return d


_DELETE = object()

# (mutation path, value, text the message must contain)
SITE_CASES = [
    ("partitions.1.gpus_per_node", 0, "partitions[1].gpus_per_node"),
    ("objective", {"time": 1, "memroy": 1}, "did you mean 'memory'"),
    ("objective", {"time": -1}, "objective.time"),
    ("objective", {"time": 0, "memory": 0, "balance": 0}, "at least one weight"),
    ("partitions.0.gpus_per_node", "four", "partitions[0].gpus_per_node"),
    ("partitions.0.nodes", -1, "partitions[0].nodes"),
    ("partitions.0.gpu_type", "A100-81", "did you mean"),
    ("partitions.1.gpu_type", "NoSuchGPU", "partitions[1].gpu_type"),
    ("partitions.1.name", "a", "duplicate partition name"),
    ("partitions.0.gpus_per_nod", 4, "did you mean 'gpus_per_node'"),
    ("partitions.0.name", "a b", "partitions[0].name"),
    ("partitions.0.inter_node_gbps", 0, "partitions[0].inter_node_gbps"),
    ("partitions.0.env", {"BAD NAME": "x"}, "partitions[0].env"),
    ("partitions.0.setup", {"x": 1}, "partitions[0].setup"),
    ("partitions", [], "at least one partition"),
    ("partitions", "a100", "partitions"),
    ("name", _DELETE, "name"),
    ("memory_safety_margin", 1.5, "memory_safety_margin"),
    ("partiton", [], "did you mean 'partitions'"),
    ("slurm", {"scheduler": "pbs"}, "slurm.scheduler"),
    ("pipeline_comm", {"backend": "mpi"}, "pipeline_comm.backend"),
    ("links", [{"between": ["a", "zz"], "gbps": 10}], "links[0].between[1]"),
    ("links", [{"between": ["a", "b"], "gbps": -1}], "links[0].gbps"),
    ("gpu_types", {"X1": {"vendor": "acme", "memory_gib": 1, "peak_tflops_bf16": 1, "peak_tflops_fp32": 1,
                          "hbm_gbps": 1, "link_gbps": 1}}, "gpu_types.X1.vendor"),
    ("gpu_types", {"X1": {"vendor": "amd", "memory_gib": 1}}, "gpu_types.X1.peak_tflops_bf16"),
    ("gpu_types", {"X1": {"vendor": "amd", "memory_gib": 16, "peak_tflops_bf16": 1, "peak_tflops_fp32": 1,
                          "hbm_gbps": 1, "link_gbps": 1, "aliases": ["A100"]}}, "gpu_types.X1.aliases[0]"),
    ("gpu_types", {"X1": {"vendor": "amd", "memory_gib": 1e300, "peak_tflops_bf16": 1, "peak_tflops_fp32": 1,
                          "hbm_gbps": 1, "link_gbps": 1}}, "gpu_types.X1.memory_gib"),
    ("gpu_types", {"X1": {"vendor": "amd", "memory_gib": 16, "peak_tflops_bf16": 1, "peak_tflops_fp32": 1,
                          "hbm_gbps": 1, "link_gbps": 1, "tdp_w": -300}}, "gpu_types.X1.tdp_w"),
    ("partitions.0.nodes", 10**50, "partitions[0].nodes"),
    ("partitions.0.name", "../x", "partitions[0].name"),
    ("partitions", [{"name": f"p{i}", "gpu_type": "T4", "nodes": 1, "gpus_per_node": 1} for i in range(65)],
     "partitions"),
]

JOB_CASES = [
    ("global_batch_size", 0, "global_batch_size"),
    ("global_batch_size", 2.5, "global_batch_size"),
    ("precision", "fp8", "precision"),
    ("model.preset", "GPT-3-1.4B", "did you mean"),
    ("model.hidden_size", 1000, "model.num_attention_heads"),
    ("model.num_query_groups", 5, "model.num_query_groups"),
    ("model.seq_length", 0, "model.seq_length"),
    ("model.seq_length", -5, "model.seq_length"),
    ("model.activation", "relu", "model.activation"),
    ("model.vocab", 5, "did you mean 'vocab_size'"),
    ("micro_batch_sizes", [3], "micro_batch_sizes[0]"),
    ("micro_batch_sizes", "1", "micro_batch_sizes"),
    ("recompute_modes", ["none", "ful"], "recompute_modes[1]"),
    ("distributed_optimizer", "yes", "distributed_optimizer"),
    ("model", _DELETE, "model"),
    ("globl_batch_size", 3, "did you mean 'global_batch_size'"),
    ("global_batch_size", 2**64, "global_batch_size"),
    ("name", "x/../../..", "name"),
    ("name", "-rf", "name"),
    ("train_iters", 10**40, "train_iters"),
]


def _write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


@pytest.mark.parametrize("path,value,needle", SITE_CASES, ids=[c[0] + ":" + repr(c[1])[:20] for c in SITE_CASES])
def test_malformed_site_exit_1_names_field(tmp_path, capsys, path, value, needle):
    f = _write(tmp_path, "site.yaml", _set(BASE_SITE, path, value))
    assert main(["validate", "--site", str(f)]) == 1
    err = capsys.readouterr().err
    assert str(f) in err and needle in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("path,value,needle", JOB_CASES, ids=[c[0] + ":" + repr(c[1])[:20] for c in JOB_CASES])
def test_malformed_job_exit_1_names_field(tmp_path, capsys, path, value, needle):
    f = _write(tmp_path, "job.yaml", _set(BASE_JOB, path, value))
    assert main(["validate", "--job", str(f)]) == 1
    err = capsys.readouterr().err
    assert str(f) in err and needle in err, err


@pytest.mark.parametrize("text,needle", [
    ("name: [unclosed", "not valid YAML at line 1"),
    ("- just\n- a list\n", "expected a site mapping"),
    ("", "expected a site mapping"),
])
def test_unparseable_site(tmp_path, capsys, text, needle):
    f = _write(tmp_path, "site.yaml", text)
    assert main(["validate", "--site", str(f)]) == 1
    assert needle in capsys.readouterr().err


def test_missing_file(capsys):
    assert main(["validate", "--site", "/nonexistent/site.yaml"]) == 1
    assert "file not found" in capsys.readouterr().err


def test_validate_prints_summary(capsys):
    assert main(["validate", "--site", str(ROOT / "site_configs/example-cross-vendor.yaml"), "--json"]) == 0
    import json
    out = json.loads(capsys.readouterr().out)
    assert out["site"]["total_gpus"] == 20 and set(out["site"]["vendors"]) == {"amd", "nvidia"}


def test_validate_prints_the_degrees_the_search_takes(tmp_path, capsys):
    """A job's VP / CP / EP lists, FP8 and gradient settings are what validate prints back."""
    import json
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump({"name": "moe", "model": {"preset": "Mixtral-8x7B", "seq_length": 8192},
                                 "global_batch_size": 64, "virtual_stages": [1, 2], "context_parallel_sizes": [1, 2],
                                 "expert_parallel_sizes": [2, 8], "distributed_optimizer": "both",
                                 "grad_reduce_in_fp32": False}))
    assert main(["validate", "--job", str(f)]) == 0
    text = capsys.readouterr().out
    assert "virtual stages [1, 2]; context parallel [1, 2]; expert parallel [2, 8]" in text
    assert "distributed optimizer searched (on and off)" in text and "gradients reduced in bf16" in text
    assert main(["validate", "--job", str(ROOT / "jobs/tiny-gpt.yaml"), "--json"]) == 0
    j = json.loads(capsys.readouterr().out)["job"]
    assert j["virtual_stages"].startswith("searched [1, 2, 4]") and j["fp8"] is None
    assert main(["validate", "--list-gpus", "--json"]) == 0
    gpus = {g["name"]: g for g in json.loads(capsys.readouterr().out)}
    assert gpus["H100-SXM"]["form_factor"] == "module" and gpus["H100-SXM"]["peak_tflops_fp8"] > 0


def test_site_objective_weights_are_the_search_default():
    import dataclasses
    from memx_hpc.planner import PlanRequest, search_options
    site = site_from_mapping({**BASE_SITE, "objective": {"time": 2, "memory": 0, "balance": 0.25}})
    request = PlanRequest(site=site, job="jobs/tiny-gpt.yaml", top_k=3, block_size=1024)
    w = search_options(request, site).weights
    assert (w.time, w.memory, w.balance) == (2, 0, 0.25)
    # --weights replaces the site's weights: the names left out are 0
    w = search_options(dataclasses.replace(request, weights="memory=1"), site).weights
    assert (w.time, w.memory, w.balance) == (0, 1, 0)


def test_site_defined_gpu_type_is_used(tmp_path):
    data = _set(BASE_SITE, "gpu_types", {"Acme-1": {"vendor": "intel", "memory_gib": 48, "peak_tflops_bf16": 400,
                                                     "peak_tflops_fp32": 50, "hbm_gbps": 2000, "link_gbps": 100}})
    data = _set(data, "partitions.1.gpu_type", "Acme-1")
    site = site_from_mapping(data)
    assert site.gpu_of("b").memory_gib == 48 and site.gpu_of("b").vendor == "intel"


# ---- property-based: random documents never produce a traceback, only SpecError or success

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.integers(min_value=10**300, max_value=10**400), st.floats(allow_nan=True),
                     st.text(string.printable, max_size=12))
_keys = st.sampled_from(["name", "partitions", "gpu_type", "nodes", "gpus_per_node", "model", "preset",
                         "global_batch_size", "hidden_size", "num_attention_heads", "seq_length", "links",
                         "between", "gbps", "env", "setup", "slurm", "scheduler", "gpu_types", "vendor",
                         "micro_batch_sizes", "precision", "x"])
_docs = st.recursive(_scalars, lambda ch: st.one_of(st.lists(ch, max_size=4),
                                                     st.dictionaries(_keys, ch, max_size=6)), max_leaves=25)


def _mutations():
    paths = [c[0] for c in SITE_CASES]
    return st.tuples(st.sampled_from(paths), _docs)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_docs)
def test_random_documents_never_traceback(doc):
    for fn in (site_from_mapping, job_from_mapping):
        try:
            fn(doc)
        except SpecError as e:
            assert str(e)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mut=_mutations())
def test_random_field_values_never_traceback(mut):
    path, value = mut
    try:
        data = _set(BASE_SITE, path, value)
    except (KeyError, IndexError, TypeError):
        return
    try:
        site_from_mapping(data)
    except SpecError as e:
        assert str(e)


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=200))
def test_random_yaml_text_via_cli_exit_0_or_1(tmp_path_factory, text):
    f = tmp_path_factory.mktemp("y") / "site.yaml"
    f.write_text(text)
    assert main(["validate", "--site", str(f)]) in (0, 1)


def test_replace_gets_the_same_checks_as_files():
    """dataclasses.replace() cannot build what a file could not: the spec checks itself."""
    import dataclasses
    site = site_from_mapping(BASE_SITE)
    job = job_from_mapping(BASE_JOB)
    for obj, kw, field in ((site.gpu("A100-80"), {"memory_gib": 1e-300}, "memory_gib"),
                           (site.partitions[0], {"gpus_per_node": 0}, "gpus_per_node"),
                           (site, {"memory_safety_margin": float("nan")}, "memory_safety_margin"),
                           (job, {"name": "a/b"}, "name"),
                           (job.model, {"hidden_size": 2**40}, "hidden_size")):
        with pytest.raises(SpecError) as e:
            dataclasses.replace(obj, **kw)
        assert e.value.field == field


def test_sites_and_jobs_name_the_parallel_degrees_the_search_may_choose():
    """``context_parallel_sizes`` and friends are read (not refused as unknown fields) in both
    files; what Megatron-LM cannot run for the job's model is refused naming the entry."""
    site_doc = yaml.safe_load((ROOT / "site_configs" / "example-cross-vendor.yaml").read_text())
    site = site_from_mapping({**site_doc, "context_parallel_sizes": [1, 2, 4], "expert_parallel_sizes": [1, 2, 8],
                              "virtual_stages": [1, 2]})
    assert (site.context_parallel_sizes, site.expert_parallel_sizes, site.virtual_stages) == ((1, 2, 4), (1, 2, 8),
                                                                                              (1, 2))
    with pytest.raises(SpecError) as e:
        site_from_mapping({**site_doc, "context_parallel_sizes": [2, 0]})
    assert e.value.field == "context_parallel_sizes[1]"
    with pytest.raises(SpecError) as e:
        site_from_mapping({**site_doc, "context_parallel_size": [2]})
    assert "context_parallel_sizes" in str(e.value)  # the nearest name suggested
    dense = {"model": {"preset": "Llama-2-7B", "seq_length": 4096}, "global_batch_size": 64}
    job = job_from_mapping({**dense, "context_parallel_sizes": [4, 1, 2, 2], "virtual_stages": [2, 1]})
    assert job.context_parallel_sizes == (1, 2, 4) and job.virtual_stages == (1, 2)
    for doc, field, words in (
            ({**dense, "context_parallel_sizes": [1, 3]}, "context_parallel_sizes[1]", "2 x cp = 6"),
            ({**dense, "expert_parallel_sizes": [2]}, "expert_parallel_sizes", "dense"),
            ({**dense, "virtual_stages": "two"}, "virtual_stages", "list of whole numbers"),
            ({"model": "Mixtral-8x7B", "global_batch_size": 64, "expert_parallel_sizes": [3]},
             "expert_parallel_sizes[0]", "8 experts")):
        with pytest.raises(SpecError, match=words) as e:
            job_from_mapping(doc)
        assert e.value.field == field
    moe = job_from_mapping({"model": "Mixtral-8x7B", "global_batch_size": 64, "expert_parallel_sizes": [8, 2],
                            "expert_tensor_parallel_sizes": [1]})
    assert moe.expert_parallel_sizes == (2, 8) and moe.expert_tensor_parallel_sizes == (1,)


def test_closed_sets_are_the_literal_types_of_the_fields():
    """Each mode tuple is its Literal type's values, and the dataclass fields carry the type."""
    import typing
    from dataclasses import fields as dc_fields

    from memx_hpc.spec import modes
    from memx_hpc.spec import GpuType, ModelSpec, Site, TrainJob
    for name in dir(modes):
        alias = getattr(modes, name)
        if typing.get_origin(alias) is typing.Literal:
            tuples = [v for k, v in vars(modes).items() if k.isupper() and v == typing.get_args(alias)]
            assert tuples, f"{name} has no tuple of its values"
    annotations = {(cls.__name__, f.name): f.type for cls in (GpuType, ModelSpec, Site, TrainJob)
                   for f in dc_fields(cls)}
    assert annotations[("GpuType", "vendor")] == "Vendor"
    assert annotations[("ModelSpec", "activation")] == "Activation"
    assert annotations[("Site", "scheduler")] == "Scheduler"
    assert annotations[("TrainJob", "precision")] == "Precision"


def test_moe_fields_are_one_table_for_the_spec_and_the_training_entry():
    from dataclasses import fields as dc_fields

    from memx_hpc.spec import MODEL_EXTENSION_FIELDS, MOE_FIELDS, ModelSpec
    from memx_hpc.train.args import build_parser
    model = {f.name: f.default for f in dc_fields(ModelSpec)}
    assert all(f.name in model and f.name in MODEL_EXTENSION_FIELDS for f in MOE_FIELDS)
    actions = {a.dest: a for a in build_parser()._actions}
    for f in MOE_FIELDS:
        if f.project_entry:
            a = actions[f.name]
            assert a.option_strings == [f.flag]
            assert a.default == (str(model[f.name]) if f.kind == "freq" else model[f.name])
            assert tuple(a.choices or ()) == f.choices
        else:
            assert f.name not in actions


@pytest.mark.parametrize("fabric,gpus,nics,gbytes", [
    ("efa", 8, None, 50.0),         # p5: 32 x 100 Gb/s, four adapters a GPU
    ("efa-200", 8, None, 50.0),     # p5en: 16 x 200 Gb/s
    ("efa-400", 8, None, 50.0),     # p6-b200: 8 x 400 Gb/s
    ("gcp-tcpxo", 8, None, 25.0),   # A3 Mega: 8 x 200 Gb/s a VM
    ("gcp-tcpx", 8, None, 12.5),    # A3 High: 4 x 200 Gb/s shared by 8 GPUs
    ("azure-ndr", 8, None, 50.0),   # ND H100 v5: 8 x 400 Gb/s NDR
    ("roce-800", 8, None, 100.0),
    ("efa", 8, 4, 6.25),            # a site that states its adapters overrides the fabric's count
    ("ib-ndr", 8, None, 50.0),      # one adapter a GPU where the fabric names no count
])
def test_cloud_fabrics_give_their_cited_figure_per_gpu(fabric, gpus, nics, gbytes, tmp_path, capsys):
    """A partition naming a cloud fabric validates and gets its adapters' rate / 8 times the
    node's adapters over its GPUs, labelled generic and naming the fabric and its source."""
    from memx_hpc.spec import FABRICS

    part = {"name": "g", "gpu_type": "H100-SXM", "nodes": 2, "gpus_per_node": gpus, "fabric": fabric}
    if nics is not None:
        part["nics_per_node"] = nics
    doc = {"name": "cloud", "partitions": [part]}
    site = site_from_mapping(doc)
    figure, provenance, what = site.inter_figure("g")
    assert figure == pytest.approx(gbytes) and provenance == "generic"
    assert f"fabric {fabric}" in what and FABRICS[fabric].source in what
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", "--site", str(path)]) == 0
    assert "ok" in capsys.readouterr().out


def test_every_fabric_cites_its_rate_and_link_kind():
    from memx_hpc.model.collectives import LINK_KINDS
    from memx_hpc.spec import FABRICS

    for name, f in FABRICS.items():
        assert f.name == name and f.adapter_gbits_per_s > 0 and f.link in LINK_KINDS
        assert f"{f.adapter_gbits_per_s:g} Gb/s" in f.source, name  # the rate is the source's words
        assert f.adapters_per_node is None or f"{f.adapters_per_node} " in f.source, name


# ---------------------------------------------------------------- NVLink domains of several nodes (GB200/GB300 NVL72)


def test_nvlink_domain_defaults_to_a_node_and_takes_whole_nodes(tmp_path, capsys):
    """``nvlink_domain_gpus``: a node by default; an NVL72 rack of 4-GPU nodes states 72; a
    domain that does not hold whole nodes, or is no whole number, is refused naming the field."""
    part = {"name": "g", "gpu_type": "GB200", "nodes": 18, "gpus_per_node": 4}
    assert site_from_mapping({"name": "n", "partitions": [part]}).partition("g").domain_gpus == 4
    rack = site_from_mapping({"name": "n", "partitions": [dict(part, nvlink_domain_gpus=72)]})
    assert rack.partition("g").domain_gpus == 72
    for bad, needle in ((70, "multiple of gpus_per_node"), (0, "between"), ("rack", "whole number"),
                        (4096, "between")):
        with pytest.raises(SpecError) as e:
            site_from_mapping({"name": "n", "partitions": [dict(part, nvlink_domain_gpus=bad)]})
        assert e.value.field.endswith("nvlink_domain_gpus") and needle in str(e.value)
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({"name": "n", "partitions": [dict(part, nvlink_domain_gpus=70)]}))
    assert main(["validate", "--site", str(path)]) == 1
    err = capsys.readouterr().err
    assert "partitions[0].nvlink_domain_gpus" in err and "site.yaml" in err and "Traceback" not in err
