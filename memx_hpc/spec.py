"""Typed, frozen specifications that cross the borders of the system.

Site and job files are YAML (``yaml.safe_load``). Every value is checked when it
is read: bad input raises :class:`~memx_hpc.errors.SpecError` naming the file,
the field path (``partitions[1].gpus_per_node``), what was found and what is
allowed. Unknown keys are rejected with the nearest valid name suggested.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import yaml

from .errors import SpecError

VENDORS = ("nvidia", "amd", "intel", "cpu")
PRECISIONS = ("bf16", "fp16", "fp32")
ACTIVATIONS = ("gelu", "swiglu")
RECOMPUTE_MODES = ("none", "selective", "full")
ATTENTIONS = ("sdpa", "core")
SCHEDULERS = ("auto", "slurm", "local")
COMM_BACKENDS = ("nccl", "ucc")
BYTES_PER_ELEMENT = {"bf16": 2, "fp16": 2, "fp32": 4}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# --------------------------------------------------------------------------- reading helpers


class _Reader:
    """Reads one mapping of a YAML document, tracking the field path for errors."""

    def __init__(self, data: Any, path: str, *, kind: str = "a mapping") -> None:
        if not isinstance(data, Mapping):
            raise SpecError(f"expected {kind}", field=path or None, found=_short(data))
        self.data = data
        self.path = path
        self.used: set[str] = set()

    def _p(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def has(self, name: str) -> bool:
        return name in self.data and self.data[name] is not None

    def raw(self, name: str, default: Any = ...) -> Any:
        self.used.add(name)
        if name not in self.data or self.data[name] is None:
            if default is ...:
                raise SpecError("required field is missing", field=self._p(name))
            return default
        return self.data[name]

    def int(self, name: str, default: Any = ..., *, min: int | None = None) -> int:
        v = self.raw(name, default)
        if v is default and default is not ...:
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer() and math.isfinite(v):
                v = int(v)
            else:
                raise SpecError("expected a whole number", field=self._p(name), found=_short(v),
                                allowed=f"integers >= {min}" if min is not None else "integers")
        if min is not None and v < min:
            raise SpecError(f"must be >= {min}", field=self._p(name), found=v)
        return v

    def float(self, name: str, default: Any = ..., *, min: float | None = None,
              max: float | None = None, strict_min: bool = False) -> float:
        v = self.raw(name, default)
        if v is default and default is not ...:
            return v
        try:
            ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(float(v))
        except OverflowError:
            ok = False
        if not ok:
            raise SpecError("expected a finite number", field=self._p(name), found=_short(v))
        v = float(v)
        if min is not None and (v <= min if strict_min else v < min):
            raise SpecError(f"must be {'>' if strict_min else '>='} {min:g}", field=self._p(name), found=v)
        if max is not None and v > max:
            raise SpecError(f"must be <= {max:g}", field=self._p(name), found=v)
        return v

    def str(self, name: str, default: Any = ..., *, choices: Iterable[str] | None = None) -> str:
        v = self.raw(name, default)
        if v is default and default is not ...:
            return v
        if not isinstance(v, str) or not v.strip():
            raise SpecError("expected a non-empty string", field=self._p(name), found=_short(v))
        if choices is not None:
            choices = tuple(choices)
            if v not in choices:
                raise SpecError("not an allowed value" + _suggest(v, choices), field=self._p(name),
                                found=v, allowed=", ".join(choices))
        return v

    def bool(self, name: str, default: Any = ...) -> bool:
        v = self.raw(name, default)
        if not isinstance(v, bool):
            raise SpecError("expected true or false", field=self._p(name), found=_short(v))
        return v

    def str_list(self, name: str, default: Any = ()) -> tuple[str, ...]:
        v = self.raw(name, default)
        if isinstance(v, tuple):
            return v
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise SpecError("expected a list of strings", field=self._p(name), found=_short(v))
        return tuple(v)

    def str_map(self, name: str) -> tuple[tuple[str, str], ...]:
        v = self.raw(name, {})
        if not isinstance(v, Mapping):
            raise SpecError("expected a mapping of NAME: value", field=self._p(name), found=_short(v))
        out = []
        for k, val in v.items():
            if not isinstance(k, str) or not _ENV_NAME.fullmatch(k):
                raise SpecError("environment variable names are letters, digits and _",
                                field=f"{self._p(name)}.{k}", found=k)
            if isinstance(val, bool) or not isinstance(val, (str, int, float)):
                raise SpecError("expected a string or number", field=f"{self._p(name)}.{k}", found=_short(val))
            out.append((k, str(val)))
        return tuple(out)

    def sub(self, name: str, *, required: bool = False) -> "_Reader | None":
        if not self.has(name):
            if required:
                self.raw(name)
            self.used.add(name)
            return None
        return _Reader(self.raw(name), self._p(name))

    def items(self, name: str, *, required: bool = False) -> list["_Reader"]:
        v = self.raw(name, ... if required else [])
        if not isinstance(v, list):
            raise SpecError("expected a list", field=self._p(name), found=_short(v))
        return [_Reader(x, f"{self._p(name)}[{i}]") for i, x in enumerate(v)]

    def finish(self, allowed: Iterable[str] | None = None) -> None:
        allowed = set(allowed) if allowed is not None else self.used
        for key in self.data:
            if key not in allowed:
                raise SpecError("unknown field" + _suggest(str(key), sorted(allowed)),
                                field=self._p(str(key)), allowed=", ".join(sorted(allowed)))


def _short(v: Any) -> Any:
    if isinstance(v, (dict, list)):
        text = repr(v)
        return text if len(text) < 60 else text[:57] + "..."
    return v


def _suggest(word: str, options: Iterable[str]) -> str:
    near = difflib.get_close_matches(word, list(options), n=1, cutoff=0.5)
    return f"; did you mean {near[0]!r}?" if near else ""


def load_yaml(path: str | os.PathLike) -> Any:
    """Read a YAML file with ``safe_load``, turning every failure into a SpecError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError("file not found", file=str(path)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"cannot read file: {e}", file=str(path)) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"not valid YAML{where}: {getattr(e, 'problem', None) or e}", file=str(path)) from None


# --------------------------------------------------------------------------- hardware


@dataclass(frozen=True, kw_only=True)
class GpuType:
    """One accelerator model. Figures are vendor datasheet numbers (``source`` says which).

    ``link_gbps`` is the typical per-direction intra-node bandwidth of one device
    (NVLink / Infinity Fabric / PCIe) in GB/s; partitions may override it.
    ``precisions``: the precisions its matrix units run natively (Volta and Turing have
    fp16 tensor cores but no bf16; ``peak_tflops_bf16`` is then the fp16 figure).
    """

    name: str
    vendor: str
    memory_gib: float
    peak_tflops_bf16: float
    peak_tflops_fp32: float
    hbm_gbps: float
    link_gbps: float
    source: str = ""
    aliases: tuple[str, ...] = ()
    measured_at_profile_time: bool = False
    precisions: tuple[str, ...] = PRECISIONS
    #: the silicon this type is a board/memory variant of (V100-16 and V100-32 are one
    #: chip): variants share layer times and differ only in memory. Empty: its own chip.
    chip: str = ""

    def native(self, precision: str) -> bool:
        """Whether the part's matrix units run ``precision`` (bf16 on a V100 does not)."""
        return precision in self.precisions

    @property
    def chip_id(self) -> str:
        """The chip identity: ``chip`` when given, else the type's own name."""
        return self.chip or self.name

    def peak_tflops(self, precision: str) -> float:
        """Dense matrix throughput for ``precision`` (fp16 and bf16 share a figure). A 16-bit
        precision the part has no units for runs at best at its fp32 rate."""
        if precision == "fp32" or not self.native(precision):
            return self.peak_tflops_fp32
        return self.peak_tflops_bf16

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    @staticmethod
    def from_mapping(data: Any, path: str, *, name: str | None = None) -> "GpuType":
        r = _Reader(data, path)
        g = GpuType(
            name=name if name is not None else r.str("name"),
            vendor=r.str("vendor", choices=VENDORS),
            memory_gib=r.float("memory_gib", min=0, strict_min=True),
            peak_tflops_bf16=r.float("peak_tflops_bf16", min=0, strict_min=True),
            peak_tflops_fp32=r.float("peak_tflops_fp32", min=0, strict_min=True),
            hbm_gbps=r.float("hbm_gbps", min=0, strict_min=True),
            link_gbps=r.float("link_gbps", min=0, strict_min=True),
            source=r.str("source", ""),
            aliases=r.str_list("aliases"),
            measured_at_profile_time=r.bool("measured_at_profile_time", False),
            precisions=_precisions(r, "precisions"),
            chip=r.str("chip", ""),
        )
        r.finish()
        return g


def _precisions(r: "_Reader", key: str) -> tuple[str, ...]:
    vals = r.str_list(key)
    if not vals:
        return PRECISIONS
    for v in vals:
        if v not in PRECISIONS:
            raise SpecError("unknown precision", field=r._p(key), found=v, allowed=", ".join(PRECISIONS))
    return tuple(vals)


@dataclass(frozen=True, kw_only=True)
class Partition:
    """A Slurm partition whose nodes all carry one GPU type."""

    name: str
    gpu_type: str
    nodes: int
    gpus_per_node: int
    intra_node_gbps: float | None = None  # None: the GPU type's link_gbps
    inter_node_gbps: float = 25.0
    gres_type: str | None = None  # Slurm GRES type name (gpu:<type>:N); None: untyped
    account: str | None = None
    qos: str | None = None
    time_limit_min: int | None = None
    cpus_per_task: int | None = None
    mem_per_node_gib: float | None = None
    setup: tuple[str, ...] = ()  # shell lines run before launching (module load ...)
    env: tuple[tuple[str, str], ...] = ()
    python: str = "python3"
    container: str | None = None
    megatron_entry: str = "pretrain_gpt.py"

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True, kw_only=True)
class Link:
    """Bandwidth between two partitions (per direction, GB/s)."""

    a: str
    b: str
    gbps: float


@dataclass(frozen=True, kw_only=True)
class Site:
    """A cluster: its partitions, GPU types, links, and where state lives."""

    name: str
    partitions: tuple[Partition, ...]
    gpu_types: tuple[GpuType, ...] = ()  # site-defined types; the catalog supplies the rest
    links: tuple[Link, ...] = ()
    inter_partition_gbps: float = 12.5
    scheduler: str = "auto"
    account: str | None = None
    qos: str | None = None
    time_limit_min: int = 60
    store_path: str = "memx-store.h5"
    cache_path: str | None = None
    work_dir: str = "memx-runs"
    pipeline_comm_backend: str = "nccl"
    pipeline_comm_env: tuple[tuple[str, str], ...] = ()
    memory_safety_margin: float = 0.05
    megatron_version: str = "core_r0.16.0"
    # (time, memory, balance) exponents of the weighted-product objective; None: the
    # planner's default. ``--weights`` on the command line overrides them.
    objective_weights: tuple[float, float, float] | None = None
    source_file: str | None = None

    def partition(self, name: str) -> Partition:
        for p in self.partitions:
            if p.name == name:
                return p
        raise SpecError(f"unknown partition{_suggest(name, [p.name for p in self.partitions])}",
                        found=name, allowed=", ".join(p.name for p in self.partitions))

    def gpu(self, name: str) -> GpuType:
        """The GPU type called ``name``: site-defined first, then the built-in catalog."""
        for g in self.gpu_types:
            if g.name == name or name in g.aliases:
                return g
        from .catalog import catalog
        return catalog().get(name)

    def gpu_of(self, partition: str) -> GpuType:
        return self.gpu(self.partition(partition).gpu_type)

    @property
    def total_gpus(self) -> int:
        return sum(p.total_gpus for p in self.partitions)

    def intra_gbps(self, partition: str) -> float:
        p = self.partition(partition)
        return p.intra_node_gbps if p.intra_node_gbps is not None else self.gpu(p.gpu_type).link_gbps

    def link_gbps(self, a: str, b: str) -> float:
        """Per-direction bandwidth between a GPU in partition ``a`` and one in ``b``."""
        if a == b:
            return self.partition(a).inter_node_gbps
        for link in self.links:
            if {link.a, link.b} == {a, b}:
                return link.gbps
        return min(self.inter_partition_gbps, self.partition(a).inter_node_gbps,
                   self.partition(b).inter_node_gbps)

    def resolve(self, path: str) -> Path:
        """Resolve a path from the site file relative to the site file's folder."""
        p = Path(os.path.expandvars(os.path.expanduser(path)))
        if p.is_absolute() or not self.source_file:
            return p
        return Path(self.source_file).resolve().parent / p

    @property
    def store(self) -> Path:
        env = os.environ.get("MEMX_STORE")
        if env and self.store_path == "memx-store.h5":
            return Path(env)
        return self.resolve(self.store_path)

    @property
    def cache(self) -> Path:
        if self.cache_path:
            return self.resolve(self.cache_path)
        return self.store.with_suffix(".cache.sqlite")


# --------------------------------------------------------------------------- model and job


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A GPT-style decoder. ``ffn_hidden_size`` is the per-branch width (SwiGLU has two)."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    vocab_size: int
    seq_length: int
    activation: str = "gelu"
    tied_embeddings: bool = True
    position_embedding: str = "learned"  # learned | rope
    normalization: str = "layernorm"  # layernorm | rmsnorm
    add_bias_linear: bool = True

    @property
    def kv_channels(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def check(self, path: str = "model") -> None:
        def bad(fieldname: str, msg: str, found: Any, allowed: str | None = None) -> SpecError:
            return SpecError(msg, field=f"{path}.{fieldname}", found=found, allowed=allowed)

        if self.hidden_size % self.num_attention_heads:
            raise bad("num_attention_heads", f"hidden_size {self.hidden_size} is not divisible by it",
                      self.num_attention_heads)
        if self.num_attention_heads % self.num_query_groups:
            raise bad("num_query_groups", f"num_attention_heads {self.num_attention_heads} is not divisible by it",
                      self.num_query_groups, "divisors of num_attention_heads")
        if self.activation not in ACTIVATIONS:
            raise bad("activation", "not an allowed value", self.activation, ", ".join(ACTIVATIONS))


@dataclass(frozen=True, kw_only=True)
class TrainJob:
    """What to train: a model, the batch, precision and optimizer."""

    name: str
    model: ModelSpec
    global_batch_size: int
    precision: str = "bf16"
    optimizer: str = "adam"
    distributed_optimizer: bool = True
    attention: str = "sdpa"  # sdpa (flash/fused: no s^2 matrix kept) | core (unfused)
    micro_batch_sizes: tuple[int, ...] = ()  # candidates; () = every divisor up to 16
    recompute_modes: tuple[str, ...] = RECOMPUTE_MODES
    train_iters: int = 20
    max_pipeline_stages: int | None = None
    source_file: str | None = None

    @property
    def bytes_per_element(self) -> int:
        return BYTES_PER_ELEMENT[self.precision]


# --------------------------------------------------------------------------- plans


@dataclass(frozen=True, kw_only=True)
class Recompute:
    """Activation recomputation of one stage: ``full`` on ``num_layers`` of its layers (None: all)."""

    mode: str = "none"
    num_layers: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in RECOMPUTE_MODES:
            raise SpecError("unknown recompute mode", found=self.mode, allowed=", ".join(RECOMPUTE_MODES))
        if self.mode != "full" and self.num_layers is not None:
            raise SpecError("num_layers applies to full recompute only", found=self.num_layers)
        if self.num_layers is not None and self.num_layers < 0:
            raise SpecError("num_layers must be >= 0", found=self.num_layers)

    def label(self) -> str:
        if self.mode == "full" and self.num_layers is not None:
            return f"full:{self.num_layers}"
        return self.mode


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One pipeline stage: consecutive layers on GPUs of one partition."""

    partition: str
    num_layers: int
    recompute: Recompute = field(default_factory=Recompute)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A configuration Megatron-LM can run: uniform TP, DP and micro-batch; ordered stages.

    Derived quantities are properties, not stored (one product check, as torchtitan's
    ParallelDims).
    """

    tp: int
    dp: int
    micro_batch_size: int
    global_batch_size: int
    stages: tuple[Stage, ...]
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        for name in ("tp", "dp", "micro_batch_size", "global_batch_size"):
            if getattr(self, name) < 1:
                raise SpecError(f"{name} must be >= 1", found=getattr(self, name))
        if not self.stages:
            raise SpecError("a plan needs at least one stage")
        if any(s.num_layers < 1 for s in self.stages):
            raise SpecError("every stage needs at least one layer", found=[s.num_layers for s in self.stages])
        if self.global_batch_size % (self.micro_batch_size * self.dp):
            raise SpecError("global_batch_size must be a multiple of micro_batch_size * dp",
                            found=(self.global_batch_size, self.micro_batch_size, self.dp))

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def gpus_per_stage(self) -> int:
        return self.tp * self.dp

    @property
    def world_size(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def num_microbatches(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def num_layers(self) -> int:
        return sum(s.num_layers for s in self.stages)

    def component_groups(self) -> list[tuple[str, list[int]]]:
        """Runs of consecutive stages on one partition: ``[(partition, [stage indices])]``."""
        groups: list[tuple[str, list[int]]] = []
        for i, s in enumerate(self.stages):
            if groups and groups[-1][0] == s.partition:
                groups[-1][1].append(i)
            else:
                groups.append((s.partition, [i]))
        return groups


@dataclass(frozen=True, kw_only=True)
class Replica:
    """One data-parallel replica of a stage in a general plan: its GPU type and TP degree."""

    gpu_type: str
    tp: int
    partition: str | None = None


@dataclass(frozen=True, kw_only=True)
class GeneralStage:
    """A stage of a general plan: replicas may differ in GPU type and TP (predict only)."""

    num_layers: int
    replicas: tuple[Replica, ...]
    recompute: Recompute = field(default_factory=Recompute)


@dataclass(frozen=True, kw_only=True)
class GeneralPlan:
    """Plans other planners produce (Sailor, Metis): predicted and compared, never rendered."""

    micro_batch_size: int
    global_batch_size: int
    stages: tuple[GeneralStage, ...]


# --------------------------------------------------------------------------- profiling


@dataclass(frozen=True, kw_only=True)
class LayerShape:
    """The shape numbers one transformer layer's cost depends on."""

    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    seq_length: int
    vocab_size: int
    activation: str = "gelu"

    @staticmethod
    def of(model: ModelSpec) -> "LayerShape":
        return LayerShape(hidden_size=model.hidden_size, num_attention_heads=model.num_attention_heads,
                          num_query_groups=model.num_query_groups, ffn_hidden_size=model.ffn_hidden_size,
                          seq_length=model.seq_length, vocab_size=model.vocab_size,
                          activation=model.activation)


SAMPLE_KINDS = ("layer", "embedding", "head", "optimizer", "allreduce", "p2p")
SAMPLE_ORIGINS = ("measured", "imported", "augmented")


@dataclass(frozen=True, kw_only=True)
class ProfilePoint:
    """What to measure: one kind of operation on one GPU type at one setting."""

    gpu_type: str
    kind: str  # one of SAMPLE_KINDS
    shape: LayerShape
    tp: int = 1
    micro_batch_size: int = 1
    recompute: str = "none"
    precision: str = "bf16"
    attention: str = "sdpa"
    # collectives: group size and message size; p2p: 2 ranks, inter_node says where
    group_size: int = 1
    message_bytes: int = 0
    inter_node: bool = False


@dataclass(frozen=True, kw_only=True)
class LayerSample:
    """What was measured (or imported, or augmented) at one ProfilePoint.

    Times are per call in milliseconds; bytes are per device. ``device_footprint_bytes``
    is what the driver reports for the process (allocator reserved peak plus runtime
    context and communication buffers); 0 when unknown. ``update_ms`` is the optimizer
    step for this layer's parameter shard.
    """

    point: ProfilePoint
    forward_ms: float = 0.0
    backward_ms: float = 0.0
    update_ms: float = 0.0
    activation_bytes: int = 0
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    device_footprint_bytes: int = 0
    infeasible: bool = False
    origin: str = "measured"  # measured | imported | augmented
    source: str = ""  # where it came from: host/job id, or the imported file
    provenance: str = "{}"  # JSON: host, device, driver, versions, settings, time
    weight: float = 1.0


# --------------------------------------------------------------------------- loading files


SITE_KEYS = ("name", "partitions", "gpu_types", "links", "inter_partition_gbps", "scheduler", "slurm",
             "store", "cache", "work_dir", "pipeline_comm", "memory_safety_margin", "megatron_version",
             "objective")
PARTITION_KEYS = ("name", "gpu_type", "nodes", "gpus_per_node", "intra_node_gbps", "inter_node_gbps",
                  "gres_type", "account", "qos", "time_limit_min", "cpus_per_task", "mem_per_node_gib",
                  "setup", "env", "python", "container", "megatron_entry")


def _wrap_file(fn: Callable[[], Any], file: str) -> Any:
    try:
        return fn()
    except SpecError as e:
        raise e.with_file(file) from None


def load_site(path: str | os.PathLike) -> Site:
    """Load and validate a site file."""
    file = str(path)
    data = load_yaml(path)
    return _wrap_file(lambda: site_from_mapping(data, source_file=file), file)


def site_from_mapping(data: Any, *, source_file: str | None = None) -> Site:
    r = _Reader(data, "", kind="a site mapping with 'name' and 'partitions'")
    name = r.str("name")

    gpu_types = []
    seen_gpu: set[str] = set()
    g = r.raw("gpu_types", {})
    if not isinstance(g, Mapping):
        raise SpecError("expected a mapping of GPU type name to its figures", field="gpu_types", found=_short(g))
    for gname, gdata in g.items():
        if not isinstance(gname, str):
            raise SpecError("GPU type names are strings", field="gpu_types", found=gname)
        gpu_types.append(GpuType.from_mapping(gdata, f"gpu_types.{gname}", name=gname))
        seen_gpu.add(gname)

    from .catalog import catalog
    cat = catalog()
    known = set(cat.names()) | seen_gpu | {a for gt in gpu_types for a in gt.aliases}

    slurm = r.sub("slurm")
    scheduler = "auto"
    account = qos = None
    time_limit = 60
    if slurm is not None:
        scheduler = slurm.str("scheduler", "auto", choices=SCHEDULERS)
        account = slurm.str("account", None)
        qos = slurm.str("qos", None)
        time_limit = slurm.int("time_limit_min", 60, min=1)
        slurm.finish(("scheduler", "account", "qos", "time_limit_min"))

    parts = []
    names: set[str] = set()
    items = r.items("partitions", required=True)
    if not items:
        raise SpecError("a site needs at least one partition", field="partitions", found=[])
    for pr in items:
        pname = pr.str("name")
        if not all(c.isalnum() or c in "_-." for c in pname):
            raise SpecError("partition names are letters, digits, '_', '-' and '.'",
                            field=pr._p("name"), found=pname)
        if pname in names:
            raise SpecError("duplicate partition name", field=pr._p("name"), found=pname)
        names.add(pname)
        gt = pr.str("gpu_type")
        if gt not in known:
            raise SpecError("unknown GPU type" + _suggest(gt, sorted(known)), field=pr._p("gpu_type"), found=gt,
                            allowed="a catalog name (memx-hpc validate --list-gpus) or one defined under gpu_types")
        gres = pr.str("gres_type", None)
        if gres is not None and not all(c.isalnum() or c in "_-." for c in gres):
            raise SpecError("GRES type names are letters, digits, '_', '-' and '.'", field=pr._p("gres_type"),
                            found=gres)
        entry = pr.str("megatron_entry", "pretrain_gpt.py")
        parts.append(Partition(
            name=pname, gpu_type=gt,
            nodes=pr.int("nodes", min=1),
            gpus_per_node=pr.int("gpus_per_node", min=1),
            intra_node_gbps=pr.float("intra_node_gbps", None, min=0, strict_min=True),
            inter_node_gbps=pr.float("inter_node_gbps", 25.0, min=0, strict_min=True),
            gres_type=gres,
            account=pr.str("account", None),
            qos=pr.str("qos", None),
            time_limit_min=pr.int("time_limit_min", None, min=1),
            cpus_per_task=pr.int("cpus_per_task", None, min=1),
            mem_per_node_gib=pr.float("mem_per_node_gib", None, min=0, strict_min=True),
            setup=pr.str_list("setup"),
            env=pr.str_map("env"),
            python=pr.str("python", "python3"),
            container=pr.str("container", None),
            megatron_entry=entry,
        ))
        pr.finish(PARTITION_KEYS)

    links = []
    for lr in r.items("links"):
        pair = lr.str_list("between")
        if len(pair) != 2:
            raise SpecError("'between' names exactly two partitions", field=lr._p("between"), found=list(pair))
        for i, pn in enumerate(pair):
            if pn not in names:
                raise SpecError("unknown partition" + _suggest(pn, sorted(names)), field=f"{lr._p('between')}[{i}]",
                                found=pn, allowed=", ".join(sorted(names)))
        links.append(Link(a=pair[0], b=pair[1], gbps=lr.float("gbps", min=0, strict_min=True)))
        lr.finish(("between", "gbps"))

    pc = r.sub("pipeline_comm")
    backend, comm_env = "nccl", ()
    if pc is not None:
        backend = pc.str("backend", "nccl", choices=COMM_BACKENDS)
        comm_env = pc.str_map("env")
        pc.finish(("backend", "env"))

    obj = r.sub("objective")
    weights = None
    if obj is not None:
        weights = (obj.float("time", 1.0, min=0), obj.float("memory", 0.5, min=0), obj.float("balance", 0.5, min=0))
        obj.finish(("time", "memory", "balance"))
        if not any(weights):
            raise SpecError("at least one weight must be > 0", field="objective", found=dict(obj.data))

    site = Site(
        name=name, partitions=tuple(parts), gpu_types=tuple(gpu_types), links=tuple(links),
        inter_partition_gbps=r.float("inter_partition_gbps", 12.5, min=0, strict_min=True),
        scheduler=scheduler, account=account, qos=qos, time_limit_min=time_limit,
        store_path=r.str("store", "memx-store.h5"),
        cache_path=r.str("cache", None),
        work_dir=r.str("work_dir", "memx-runs"),
        pipeline_comm_backend=backend, pipeline_comm_env=comm_env,
        memory_safety_margin=r.float("memory_safety_margin", 0.05, min=0, max=0.9),
        megatron_version=r.str("megatron_version", "core_r0.16.0"),
        objective_weights=weights,
        source_file=source_file,
    )
    r.finish(SITE_KEYS)
    vendors = {site.gpu(p.gpu_type).vendor for p in site.partitions}
    if len(vendors - {"cpu"}) > 1 and backend == "nccl" and len(site.partitions) > 1:
        # Not an error: stages may stay within one vendor. Plans that cross vendors
        # are refused at render time with this reason.
        pass
    return site


JOB_KEYS = ("name", "model", "global_batch_size", "precision", "optimizer", "distributed_optimizer",
            "attention", "micro_batch_sizes", "recompute_modes", "train_iters", "max_pipeline_stages")
MODEL_KEYS = ("preset", "name", "num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
              "ffn_hidden_size", "vocab_size", "seq_length", "activation", "tied_embeddings",
              "position_embedding", "normalization", "add_bias_linear")


def load_job(path: str | os.PathLike) -> TrainJob:
    """Load and validate a job file."""
    file = str(path)
    data = load_yaml(path)
    return _wrap_file(lambda: job_from_mapping(data, source_file=file), file)


def model_from_mapping(data: Any, path: str = "model") -> ModelSpec:
    """A model from a preset name, a preset with overrides, or an explicit shape."""
    from .catalog import model_presets
    if isinstance(data, str):
        data = {"preset": data}
    r = _Reader(data, path)
    base: dict[str, Any] = {}
    if r.has("preset"):
        presets = model_presets()
        pname = r.str("preset")
        if pname not in presets:
            raise SpecError("unknown model preset" + _suggest(pname, sorted(presets)), field=f"{path}.preset",
                            found=pname, allowed=", ".join(sorted(presets)))
        base = {f.name: getattr(presets[pname], f.name) for f in fields(ModelSpec)}
    else:
        r.used.add("preset")

    def get(kind: str, name: str, **kw: Any) -> Any:
        default = base.get(name, kw.pop("default", ...))
        return getattr(r, kind)(name, default, **kw)

    hidden = get("int", "hidden_size", min=1)
    heads = get("int", "num_attention_heads", min=1)
    activation = get("str", "activation", default="gelu", choices=ACTIVATIONS)
    default_ffn = 4 * hidden if activation == "gelu" else int(256 * math.ceil((8 * hidden / 3) / 256))
    m = ModelSpec(
        name=get("str", "name", default=base.get("name", "custom")),
        num_layers=get("int", "num_layers", min=1),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=get("int", "num_query_groups", default=heads, min=1),
        ffn_hidden_size=get("int", "ffn_hidden_size", default=default_ffn, min=1),
        vocab_size=get("int", "vocab_size", min=1),
        seq_length=get("int", "seq_length", min=1),
        activation=activation,
        tied_embeddings=get("bool", "tied_embeddings", default=True),
        position_embedding=get("str", "position_embedding", default="learned", choices=("learned", "rope")),
        normalization=get("str", "normalization", default="layernorm", choices=("layernorm", "rmsnorm")),
        add_bias_linear=get("bool", "add_bias_linear", default=True),
    )
    r.finish(MODEL_KEYS)
    m.check(path)
    return m


def job_from_mapping(data: Any, *, source_file: str | None = None) -> TrainJob:
    r = _Reader(data, "", kind="a job mapping with 'model' and 'global_batch_size'")
    model = model_from_mapping(r.raw("model"), "model")
    mbs = r.raw("micro_batch_sizes", [])
    if not isinstance(mbs, list) or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in mbs):
        raise SpecError("expected a list of whole numbers >= 1", field="micro_batch_sizes", found=_short(mbs))
    gbs = r.int("global_batch_size", min=1)
    for i, b in enumerate(mbs):
        if gbs % b:
            raise SpecError(f"does not divide global_batch_size {gbs}", field=f"micro_batch_sizes[{i}]", found=b)
    modes = r.str_list("recompute_modes", RECOMPUTE_MODES)
    for i, mo in enumerate(modes):
        if mo not in RECOMPUTE_MODES:
            raise SpecError("unknown recompute mode" + _suggest(mo, RECOMPUTE_MODES), field=f"recompute_modes[{i}]",
                            found=mo, allowed=", ".join(RECOMPUTE_MODES))
    job = TrainJob(
        name=r.str("name", model.name),
        model=model,
        global_batch_size=gbs,
        precision=r.str("precision", "bf16", choices=PRECISIONS),
        optimizer=r.str("optimizer", "adam", choices=("adam", "sgd")),
        distributed_optimizer=r.bool("distributed_optimizer", True),
        attention=r.str("attention", "sdpa", choices=ATTENTIONS),
        micro_batch_sizes=tuple(sorted(set(mbs))),
        recompute_modes=modes,
        train_iters=r.int("train_iters", 20, min=1),
        max_pipeline_stages=r.int("max_pipeline_stages", None, min=1),
        source_file=source_file,
    )
    r.finish(JOB_KEYS)
    return job


def job_for_model(model: ModelSpec, global_batch_size: int, **kw: Any) -> TrainJob:
    """A job for a model built in code (tests, benchmarks)."""
    return TrainJob(name=kw.pop("name", model.name), model=model, global_batch_size=global_batch_size, **kw)
