"""The file readers: a site file to :class:`~memx_hpc.spec.site.Site`, a job file to
:class:`~memx_hpc.spec.job.TrainJob`, and a model mapping (a preset, a Hugging Face
``config.json`` or an explicit shape) to :class:`~memx_hpc.spec.model.ModelSpec`.

They only map documents to keyword arguments; the specs check the values when they are
built. Errors name the file and the field path (``partitions[1].gpus_per_node``).
"""

from __future__ import annotations

import os
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Mapping

from ..errors import SpecError
from .catalog import model_presets
from .checks import MAX_PARTITIONS, _build, _short, _suggest, _wrap_file
from .gpu import GpuType
from .hfconfig import HfModel, read_hf
from .job import DEFAULT_MAX_SEGMENTS, Checkpointing, LRSchedule, TrainData, TrainJob, TrainLogging
from .model import MODEL_FIELD_KEYS, ModelSpec, model_from_fields
from .modes import CONTAINER_RUNTIMES, FP8_FORMATS, RECOMPUTE_MODES
from .site import Link, Partition, Site
from .yamlio import _Reader, load_yaml


#: the parallel degrees a site (what its Megatron-LM builds and networks are meant for) or a job
#: lets the search choose among
DEGREE_KEYS = ("virtual_stages", "context_parallel_sizes", "expert_parallel_sizes", "expert_tensor_parallel_sizes")
SITE_KEYS = ("name", "partitions", "gpu_types", "links", "inter_partition_gbytes_per_s", "inter_partition_gbps",
             "scheduler", "slurm",
             "store", "cache", "work_dir", "pipeline_comm", "memory_safety_margin", "megatron_version",
             "objective", "reference_data", "prefer_source") + DEGREE_KEYS
PARTITION_KEYS = ("name", "gpu_type", "nodes", "gpus_per_node", "intra_node_gbytes_per_s", "inter_node_gbytes_per_s",
                  "intra_node_gbps", "inter_node_gbps",
                  "gres_type", "account", "qos", "time_limit_min", "exclusive", "cpus_per_task", "mem_per_node_gib",
                  "setup", "env", "python", "container", "megatron_entry", "module_purge", "transformer_impl",
                  "stand_in_for", "link_curves_from", "fabric", "nics_per_node", "nvlink_domain_gpus")


def load_site(path: str | os.PathLike) -> Site:
    """Load and validate a site file."""
    file = str(path)
    data = load_yaml(path)
    return _wrap_file(lambda: site_from_mapping(data, source_file=file), file)


def _partition_from(pr: _Reader) -> Partition:
    p = _build(
        Partition, pr.path,
        name=pr.str("name"),
        gpu_type=pr.str("gpu_type"),
        nodes=pr.int("nodes"),
        gpus_per_node=pr.int("gpus_per_node"),
        intra_node_gbps=pr.rate("intra_node_gbytes_per_s", None),
        inter_node_gbps=pr.rate("inter_node_gbytes_per_s", None),
        link_curves_from=pr.str("link_curves_from", None),
        fabric=pr.str("fabric", ""),
        nics_per_node=pr.int("nics_per_node", None),
        nvlink_domain_gpus=pr.int("nvlink_domain_gpus", None),
        gres_type=pr.str("gres_type", None),
        account=pr.str("account", None),
        qos=pr.str("qos", None),
        time_limit_min=pr.int("time_limit_min", None),
        exclusive=pr.bool("exclusive", None),
        cpus_per_task=pr.int("cpus_per_task", None),
        mem_per_node_gib=pr.float("mem_per_node_gib", None),
        setup=pr.str_list("setup"),
        env=pr.str_map("env"),
        python=pr.str("python", "python3"),
        container=pr.str("container", None),
        megatron_entry=pr.str("megatron_entry", "pretrain_gpt.py"),
        module_purge=pr.bool("module_purge", False),
        transformer_impl=pr.str("transformer_impl", None),
        stand_in_for=pr.str("stand_in_for", None),
    )
    pr.finish(PARTITION_KEYS)
    return p


def site_from_mapping(data: Any, *, source_file: str | None = None) -> Site:
    """Map a site document to :class:`Site` keyword arguments (the Site checks them)."""
    r = _Reader(data, "", kind="a site mapping with 'name' and 'partitions'")
    g = r.raw("gpu_types", {})
    if not isinstance(g, Mapping):
        raise SpecError("expected a mapping of GPU type name to its figures", field="gpu_types", found=_short(g))
    gpu_types = []
    for gname, gdata in g.items():
        if not isinstance(gname, str):
            raise SpecError("GPU type names are strings", field="gpu_types", found=_short(gname))
        gpu_types.append(GpuType.from_mapping(gdata, f"gpu_types.{gname[:80]}", name=gname))

    slurm = r.sub("slurm")
    kw: dict[str, Any] = {}
    if slurm is not None:
        kw.update(scheduler=slurm.str("scheduler", "auto"), account=slurm.str("account", None),
                  qos=slurm.str("qos", None), time_limit_min=slurm.int("time_limit_min", 60),
                  exclusive=slurm.bool("exclusive", False), signal=slurm.str("signal", None),
                  requeue=slurm.bool("requeue", None),
                  container_runtime=slurm.str("container_runtime", None, choices=CONTAINER_RUNTIMES))
        slurm.finish(("scheduler", "account", "qos", "time_limit_min", "exclusive", "signal", "requeue",
                      "container_runtime"))

    items = r.items("partitions", required=True)
    if len(items) > MAX_PARTITIONS:
        raise SpecError(f"{len(items)} partitions", field="partitions", allowed=f"at most {MAX_PARTITIONS}")
    parts = [_partition_from(pr) for pr in items]

    links = []
    for lr in r.items("links"):
        pair = lr.str_list("between")
        if len(pair) != 2:
            raise SpecError("'between' names exactly two partitions", field=lr._p("between"), found=list(pair))
        links.append(_build(Link, lr.path, a=pair[0], b=pair[1], gbps=lr.rate("gbytes_per_s")))
        lr.finish(("between", "gbytes_per_s", "gbps"))

    pc = r.sub("pipeline_comm")
    if pc is not None:
        kw.update(pipeline_comm_backend=pc.str("backend", "nccl"), pipeline_comm_env=pc.str_map("env"))
        pc.finish(("backend", "env"))

    if r.raw("reference_data", None) is not None:
        kw["reference_data"] = r.bool("reference_data")
    pref = r.raw("prefer_source", None)
    if pref is not None:
        if isinstance(pref, str):
            kw["prefer_source"] = (("*", pref.lower()),)
        elif isinstance(pref, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in pref.items()):
            kw["prefer_source"] = tuple((k, v.lower()) for k, v in pref.items())
        else:
            raise SpecError("a source name (sailor, cephalo, measured), or a mapping of GPU type to one",
                            field="prefer_source", found=_short(pref))
    obj = r.sub("objective")
    if obj is not None:
        kw["objective_weights"] = (obj.float("time", 1.0), obj.float("memory", 0.5), obj.float("balance", 0.5))
        obj.finish(("time", "memory", "balance"))

    site = _build(
        Site, "",
        name=r.str("name"), partitions=tuple(parts), gpu_types=tuple(gpu_types), links=tuple(links),
        inter_partition_gbps=r.rate("inter_partition_gbytes_per_s", 12.5),
        store_path=r.str("store", "memx-store.h5"),
        cache_path=r.str("cache", None),
        work_dir=r.str("work_dir", "memx-runs"),
        memory_safety_margin=r.float("memory_safety_margin", 0.05),
        megatron_version=r.str("megatron_version", "core_r0.16.0"),
        **_degrees_from(r),
        source_file=source_file,
        **kw,
    )
    r.finish(SITE_KEYS)
    if source_file is not None:
        for i, part in enumerate(site.partitions):
            _check_relative_python(part.python, source_file, f"partitions[{i}].python")
    return site


def _check_relative_python(python: str, source_file: str, field: str) -> None:
    """A relative ``python`` path is the site file's: found from its folder or a folder above
    it, and executable. Found only from the current folder (a site file copied out of the
    checkout it names a Python of), every profiling task would run another interpreter, or
    none, and die before writing a line."""
    if "/" not in python or os.path.isabs(python):
        return  # a name looked up on the nodes' PATH, or the nodes' own absolute path
    found = find_relative_to_site(python, source_file)
    if found is None:
        raise SpecError("a relative Python path names no file from the site file's folder or the folders above "
                        "it; give the absolute path of the nodes' Python, or one relative to the site file",
                        field=field, found=python)
    if not found.is_file() or not os.access(found, os.X_OK):
        raise SpecError(f"{found} is not an executable file", field=field, found=python,
                        allowed="an executable Python, relative to the site file's folder or absolute")


def find_relative_to_site(path: str, source_file: str | None) -> Path | None:
    """A relative path (a partition's ``python``) found from the site file's folder or a folder
    above it (a repository's ``.venv/bin/python`` named in ``site_configs/local.yaml``); for a
    site built without a file, from the current folder. None when it names no file there."""
    if source_file:
        base = Path(source_file).resolve().parent
        for d in (base, *base.parents):
            if (d / path).exists():
                return d / path
        return None
    cand = Path.cwd() / path
    return cand.resolve() if cand.exists() else None


JOB_KEYS = ("name", "model", "global_batch_size", "precision", "optimizer", "distributed_optimizer",
            "attention", "micro_batch_sizes", "recompute_modes", "train_iters", "train_samples", "train_tokens",
            "log_interval", "eval_interval", "eval_iters", "max_pipeline_stages", "data", "lr_schedule", "checkpoint",
            "logging", "virtual_stages", "context_parallel_sizes", "expert_parallel_sizes", "expert_tensor_parallel_sizes",
            "fp8", "fp8_recipe", "grad_reduce_in_fp32", "fp8_param_gather")
MODEL_KEYS = ("preset", "hf_config") + MODEL_FIELD_KEYS


def load_job(path: str | os.PathLike) -> TrainJob:
    """Load and validate a job file."""
    file = str(path)
    data = load_yaml(path)
    return _wrap_file(lambda: job_from_mapping(data, source_file=file), file)


def model_from_mapping(data: Any, path: str = "model", *, base_dir: str | os.PathLike | None = None) -> ModelSpec:
    """A model from a preset name, a preset with overrides, a Hugging Face ``config.json``
    (``hf_config``, relative to ``base_dir``) with overrides, or an explicit shape."""
    if isinstance(data, str):
        data = {"preset": data}
    r = _Reader(data, path)
    base: dict[str, Any] = {}
    if r.has("preset") and r.has("hf_config"):
        raise SpecError("give a preset or a Hugging Face config, not both", field=f"{path}.hf_config",
                        found=r.raw("hf_config"))
    if r.has("preset"):
        presets = model_presets()
        pname = r.str("preset")
        if pname not in presets:
            raise SpecError("unknown model preset" + _suggest(pname, sorted(presets)), field=f"{path}.preset",
                            found=pname, allowed=", ".join(sorted(presets)) + "; or hf_config: path/to/config.json")
        base = {f.name: getattr(presets[pname], f.name) for f in fields(ModelSpec)}
    else:
        r.used.add("preset")
    hf = None
    if r.has("hf_config"):
        where = Path(os.path.expanduser(r.str("hf_config")))
        if not where.is_absolute() and base_dir is not None:
            where = Path(base_dir) / where
        hf = read_hf(where)
        base = hf.kwargs
    else:
        r.used.add("hf_config")
    try:
        m = model_from_fields(r, base, path=path)
    except SpecError as e:
        raise _blame_config(e, hf, r, path) from None
    r.finish(MODEL_KEYS)
    return m


def _blame_config(e: SpecError, hf: HfModel | None, r: _Reader, path: str) -> SpecError:
    """``e`` naming the Hugging Face config and its own key where the refused value came from
    the config (the job's mapping does not override it), else ``e`` as it is."""
    prefix = f"{path}."
    if hf is None or not e.field or not e.field.startswith(prefix):
        return e
    name = e.field[len(prefix):].split(".")[0].split("[")[0]
    if name not in hf.kwargs or r.has(name):
        return e
    return SpecError(e.detail, file=hf.file, field=hf.key(name), found=e.found, allowed=e.allowed)


def _data_from(d: "_Reader | None") -> TrainData | None:
    if d is None:
        return None
    paths = d.raw("paths")
    if not isinstance(paths, list):
        raise SpecError("expected a list of dataset prefixes (optionally weight, prefix, ...)", field=d._p("paths"),
                        found=_short(paths))
    tok = d.sub("tokenizer", required=True)
    out = _build(TrainData, d.path, paths=tuple(str(p) for p in paths), tokenizer_type=tok.str("type"),
                 tokenizer_model=tok.str("model", None), vocab_file=tok.str("vocab_file", None),
                 merge_file=tok.str("merge_file", None), split=d.str("split", "969,30,1"))
    tok.finish(("type", "model", "vocab_file", "merge_file"))
    d.finish(("paths", "tokenizer", "split"))
    return out


def _lr_from(d: "_Reader | None") -> LRSchedule:
    if d is None:
        return LRSchedule()
    out = _build(LRSchedule, d.path, lr=d.float("lr", 1.0e-4), min_lr=d.float("min_lr", 0.0),
                 decay_style=d.str("decay_style", "linear"), warmup_iters=d.int("warmup_iters", 0),
                 decay_iters=d.int("decay_iters", None))
    d.finish(("lr", "min_lr", "decay_style", "warmup_iters", "decay_iters"))
    return out


def _checkpoint_from(d: "_Reader | None") -> Checkpointing | None:
    if d is None:
        return None
    out = _build(Checkpointing, d.path, save_dir=d.str("save", None), load_dir=d.str("load", None),
                 save_interval=d.int("interval", None), max_segments=d.int("max_segments", DEFAULT_MAX_SEGMENTS))
    d.finish(("save", "load", "interval", "max_segments"))
    return out


def _logging_from(d: "_Reader | None") -> TrainLogging:
    """``logging: {tensorboard: true, wandb_project: NAME, wandb_exp_name: NAME}``."""
    if d is None:
        return TrainLogging()
    out = _build(TrainLogging, d.path, tensorboard=d.bool("tensorboard", True),
                 wandb_project=d.raw("wandb_project", None), wandb_exp_name=d.raw("wandb_exp_name", None))
    d.finish(("tensorboard", "wandb_project", "wandb_exp_name"))
    return out


def _dist_opt(r: "_Reader") -> "bool | str":
    """A job's ``distributed_optimizer``: true, false or ``both`` (searched)."""
    v = r.raw("distributed_optimizer", True)
    if not isinstance(v, bool) and v != "both":
        raise SpecError("expected true, false or both (the search tries each plan with and without it)",
                        field="distributed_optimizer", found=_short(v), allowed="true, false, both")
    return v


def _degrees_from(r: "_Reader") -> dict[str, tuple]:
    """The degree lists of a site or job mapping (:data:`DEGREE_KEYS`), as given (checked by the spec)."""
    out = {}
    for name in DEGREE_KEYS:
        v = r.raw(name, [])
        if isinstance(v, bool) or not isinstance(v, (list, int)):
            raise SpecError("expected a list of whole numbers >= 1", field=name, found=_short(v))
        out[name] = tuple(v) if isinstance(v, list) else (v,)
    return out


def _fp8_of(r: "_Reader") -> tuple[str, str]:
    """``fp8``: a format (FP8_FORMATS) every plan runs, none / false / absent for no FP8, or
    ``[none, FORMAT]``: the search tries each plan in 16 bits and in FORMAT. Returns the job's
    ``(fp8, fp8_search)``."""
    v = r.raw("fp8", None)
    if isinstance(v, list):
        formats = [x for x in v if x != "none"]
        if (len(v) != 2 or "none" not in v or len(formats) != 1 or not isinstance(formats[0], str)
                or formats[0] not in FP8_FORMATS):
            raise SpecError("a searched FP8 choice is 'none' and one format", field="fp8", found=_short(v),
                            allowed=", ".join(f"[none, {f}]" for f in FP8_FORMATS))
        return "", formats[0]
    if v is None or v is False or v == "none":
        return "", ""
    if not isinstance(v, str) or v not in FP8_FORMATS:
        raise SpecError("unknown FP8 format", field="fp8", found=_short(v),
                        allowed=", ".join(("none",) + FP8_FORMATS) + ", or a list [none, FORMAT] to search both")
    return v, ""


def job_from_mapping(data: Any, *, source_file: str | None = None) -> TrainJob:
    """Map a job document to :class:`TrainJob` keyword arguments (the TrainJob checks them)."""
    r = _Reader(data, "", kind="a job mapping with 'model' and 'global_batch_size'")
    model = model_from_mapping(r.raw("model"), "model",
                               base_dir=Path(source_file).parent if source_file else None)
    mbs = r.raw("micro_batch_sizes", [])
    if not isinstance(mbs, list):
        raise SpecError("expected a list of whole numbers >= 1", field="micro_batch_sizes", found=_short(mbs))
    job = _build(
        TrainJob, "",
        name=r.str("name", model.name),
        model=model,
        global_batch_size=r.int("global_batch_size"),
        precision=r.str("precision", "bf16"),
        optimizer=r.str("optimizer", "adam"),
        distributed_optimizer=_dist_opt(r) is not False,
        distributed_optimizer_searched=_dist_opt(r) == "both",
        attention=r.str("attention", "sdpa"),
        # kept in file order here, so an error names the entry as written
        micro_batch_sizes=tuple(mbs),
        recompute_modes=r.str_list("recompute_modes", RECOMPUTE_MODES),
        recompute_modes_given=r.has("recompute_modes"),
        train_iters=r.int("train_iters", None),
        train_samples=r.int("train_samples", None),
        train_tokens=r.int("train_tokens", None),
        log_interval=r.int("log_interval", 10),
        eval_interval=r.int("eval_interval", 1000),
        eval_iters=r.int("eval_iters", 10),
        max_pipeline_stages=r.int("max_pipeline_stages", None),
        **_degrees_from(r),
        fp8=_fp8_of(r)[0],
        fp8_search=_fp8_of(r)[1],
        fp8_recipe=r.str("fp8_recipe", "delayed"),
        grad_reduce_in_fp32=r.bool("grad_reduce_in_fp32", True),
        fp8_param_gather=r.bool("fp8_param_gather", False),
        data=_data_from(r.sub("data")),
        lr_schedule=_lr_from(r.sub("lr_schedule")),
        checkpoint=_checkpoint_from(r.sub("checkpoint")),
        logging=_logging_from(r.sub("logging")),
        source_file=source_file,
    )
    r.finish(JOB_KEYS)
    return replace(job, micro_batch_sizes=tuple(sorted(set(job.micro_batch_sizes))),
                   **{n: tuple(sorted(set(getattr(job, n)))) for n in DEGREE_KEYS})


def job_for_model(model: ModelSpec, global_batch_size: int, **kw: Any) -> TrainJob:
    """A job for a model built in code (tests, benchmarks)."""
    return TrainJob(name=kw.pop("name", model.name), model=model, global_batch_size=global_batch_size, **kw)
