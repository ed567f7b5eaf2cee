"""The cluster: :class:`Site` (partitions, GPU types, links, Slurm defaults and where state
lives), :class:`Partition`, :class:`Link`, and the fabrics a partition may name."""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecError
from ..shellsafe import check_entry, check_path, check_setup_line
from .catalog import catalog
from .checks import (MAX_DEVICE_MEMORY_GIB, MAX_GBPS, MAX_GPUS_PER_NODE, MAX_LAYERS, MAX_NODES, MAX_PARTITIONS,
                     MAX_TIME_LIMIT_MIN, MAX_WEIGHT, MIN_DEVICE_MEMORY_GIB, MIN_RATE, _choice, _degrees,
                     _optional_bool, _real, _safe_name, _short, _slurm_signal, _str_pairs, _str_tuple, _suggest, _text,
                     _whole)
from .gpu import GpuType, check_gpu_names
from .modes import (COMM_BACKENDS, CONTAINER_RUNTIMES, LINK_CURVE_CLUSTERS, SCHEDULERS, STAND_IN_VENDORS,
                    TRANSFORMER_IMPLS, CommBackend, ContainerRuntime, LinkCurveCluster, Scheduler, StandInVendor,
                    TransformerImpl)

#: Between nodes, the figure a partition gets when the site file states none (GB/s per
#: direction, labelled ``generic`` wherever it is used): one HDR InfiniBand adapter,
#: 200 Gb/s = 25 GB/s per port (NVIDIA ConnectX-6 VPI adapter product brief: "up to 200Gb/s
#: InfiniBand HDR"), the rate HPE Slingshot-11's Cassini NIC also states (200 Gb/s, HPE
#: Slingshot interconnect datasheet). Only a stand-in: a site states its own figure.
GENERIC_INTER_NODE_GBPS = 25.0
@dataclass(frozen=True, kw_only=True)
class Fabric:
    """A fabric a partition may name (``fabric:``): one adapter's line rate in Gb/s (gigabits)
    per direction, how many adapters a node of the kind the source describes has (None: one
    per GPU, as DGX/HGX nodes are built; a partition's ``nics_per_node`` overrides it), the
    kind of link NCCL runs over (a key of :data:`memx_hpc.model.collectives.LINK_KINDS`) and
    where the figures are stated (page title and publisher)."""

    name: str
    adapter_gbits_per_s: float
    adapters_per_node: int | None
    link: str
    source: str

    def label(self) -> str:
        per = "" if self.adapters_per_node is None else f", {self.adapters_per_node} a node"
        return f"{self.adapter_gbits_per_s:g} Gb/s per adapter{per} ({self.source})"


def _fabrics(*rows: tuple[str, float, int | None, str, str]) -> dict[str, Fabric]:
    return {r[0]: Fabric(name=r[0], adapter_gbits_per_s=r[1], adapters_per_node=r[2], link=r[3], source=r[4])
            for r in rows}


#: Fabrics a partition may name (``fabric:``) when the site file states no inter-node figure.
#: The generic figure a GPU gets is the adapter's rate / 8 times the node's adapters over its
#: GPUs (``nics_per_node``, else the fabric's adapters per node, else one per GPU): fewer
#: adapters than GPUs are shared, more give each GPU several (p5: 32 EFA adapters, 4 a GPU);
#: labelled ``generic`` wherever it is used. Cloud fabrics state the adapters of the machine
#: type their source describes (a VM is a node).
FABRICS: dict[str, Fabric] = _fabrics(
    ("ib-edr", 100.0, None, "ib", "InfiniBand EDR, 100 Gb/s per port: NVIDIA ConnectX-5 adapter product brief, NVIDIA"),
    ("ib-hdr", 200.0, None, "ib", "InfiniBand HDR, 200 Gb/s per port: NVIDIA ConnectX-6 VPI adapter product brief, "
                                  "NVIDIA"),
    ("ib-ndr", 400.0, None, "ib", "InfiniBand NDR, 400 Gb/s per port: NVIDIA ConnectX-7 adapter product brief, NVIDIA"),
    ("ib-xdr", 800.0, None, "ib", "InfiniBand XDR, 800 Gb/s per port: NVIDIA ConnectX-8 SuperNIC product brief, "
                                  "NVIDIA"),
    ("slingshot-11", 200.0, None, "slingshot", "HPE Slingshot-11, 200 Gb/s per Cassini NIC: HPE Slingshot "
                                               "interconnect datasheet, Hewlett Packard Enterprise"),
    ("roce-100", 100.0, None, "roce", "RoCE over 100 Gb/s Ethernet (the port's line rate)"),
    ("roce-200", 200.0, None, "roce", "RoCE over 200 Gb/s Ethernet (the port's line rate)"),
    ("roce-400", 400.0, None, "roce", "RoCE over 400 Gb/s Ethernet (the port's line rate)"),
    ("roce-800", 800.0, None, "roce", "RoCE over 800 Gb/s Ethernet, the port's line rate: NVIDIA ConnectX-8 "
                                      "SuperNIC product brief (up to 800 Gb/s InfiniBand or Ethernet), NVIDIA"),
    ("opa-100", 100.0, None, "ib", "Intel Omni-Path 100 Series, 100 Gb/s per port: Intel Omni-Path host fabric "
                                   "adapter 100 Series product brief, Intel"),
    ("ethernet-25", 25.0, None, "tcp", "TCP over 25 Gb/s Ethernet (the port's line rate; NCCL's socket transport)"),
    ("efa", 100.0, 32, "efa", "AWS Elastic Fabric Adapter on p5/p5e, 32 network cards of 100 Gb/s = 3,200 Gb/s a "
                              "node: 'Maximize network bandwidth on accelerated computing instances with EFA', "
                              "Amazon EC2 User Guide, Amazon Web Services"),
    ("efa-200", 200.0, 16, "efa", "AWS EFA (EFAv3) on p5en, 16 adapters of 200 Gb/s = 3,200 Gb/s a node: 'Amazon "
                                  "EC2 P5 Instances', Amazon Web Services"),
    ("efa-400", 400.0, 8, "efa", "AWS EFA (EFAv4) on p6-b200, 8 adapters of 400 Gb/s = 3,200 Gb/s a node: 'Amazon "
                                 "EC2 P6 Instances', Amazon Web Services"),
    ("gcp-tcpxo", 200.0, 8, "tcp", "Google Cloud A3 Mega (a3-megagpu-8g), GPUDirect-TCPXO, 8 GPU NICs of 200 Gb/s "
                                   "= 1,600 Gb/s a VM: 'GPU machine types', Google Cloud documentation"),
    ("gcp-tcpx", 200.0, 4, "tcp", "Google Cloud A3 High (a3-highgpu-8g), GPUDirect-TCPX, 4 GPU NICs of 200 Gb/s = "
                                  "800 Gb/s a VM: 'GPU machine types', Google Cloud documentation"),
    ("azure-ndr", 400.0, 8, "ib", "Azure ND H100 v5, 8 NVIDIA Quantum-2 ConnectX-7 InfiniBand NDR adapters of "
                                  "400 Gb/s = 3.2 Tb/s a VM: 'ND H100 v5 sizes series', Microsoft Learn, Microsoft"),
)
#: the most network adapters a node may state (``nics_per_node``)
MAX_NICS_PER_NODE = 64
#: the most GPUs one NVLink domain may state (``nvlink_domain_gpus``; NVIDIA's NVL576 has 576)
MAX_NVLINK_DOMAIN_GPUS = 1024


@dataclass(frozen=True, kw_only=True)
class Partition:
    """A Slurm partition whose nodes all carry one GPU type."""

    name: str
    gpu_type: str
    nodes: int
    gpus_per_node: int
    intra_node_gbps: float | None = None  # None: the GPU type's link_gbps (catalog, labelled generic)
    inter_node_gbps: float | None = None  # None: the fabric's figure, else GENERIC_INTER_NODE_GBPS (generic)
    #: the cluster (one of LINK_CURVE_CLUSTERS) whose imported network curves are this
    #: partition's own: its nodes are that cluster's. None: imported curves are not used.
    link_curves_from: LinkCurveCluster | None = None
    #: the fabric between its nodes (one of FABRICS; "" not stated) and the adapters a node has
    #: for it (None: the fabric's own count, else one per GPU): the generic inter-node figure
    #: where the site file states none
    fabric: str = ""  # a key of FABRICS
    nics_per_node: int | None = None
    #: GPUs that share one NVLink/xGMI domain: a node (None, the default), or several whole
    #: nodes whose GPUs an NVLink switch joins (a GB200/GB300 NVL72 rack: 72 GPUs, 18 nodes of
    #: 4). Collectives and sends between GPUs of one domain run over NVLink, not the fabric.
    nvlink_domain_gpus: int | None = None
    gres_type: str | None = None  # Slurm GRES type name (gpu:<type>:N); None: untyped
    account: str | None = None
    qos: str | None = None
    time_limit_min: int | None = None
    exclusive: bool | None = None  # None: the site's slurm.exclusive
    cpus_per_task: int | None = None
    mem_per_node_gib: float | None = None  # --mem in MiB, rounded up (memx_hpc/slurm/request.py)
    setup: tuple[str, ...] = ()  # shell lines run before launching (module load ...)
    env: tuple[tuple[str, str], ...] = ()
    python: str = "python3"
    container: str | None = None
    megatron_entry: str = "pretrain_gpt.py"
    # launch details (memx_hpc.slurm.render): start each component from a clean module
    # environment; the Transformer Engine layer or megatron-core's local one (None: TE on
    # NVIDIA, local elsewhere); on CPU partitions, the vendor whose place they take in
    # a cross-vendor rehearsal (process groups are planned as for that vendor, run on gloo)
    module_purge: bool = False
    transformer_impl: TransformerImpl | None = None
    stand_in_for: StandInVendor | None = None

    def __post_init__(self) -> None:
        _safe_name(self.name, "name")
        _safe_name(self.gpu_type, "gpu_type")
        _whole(self.nodes, "nodes", 1, MAX_NODES)
        _whole(self.gpus_per_node, "gpus_per_node", 1, MAX_GPUS_PER_NODE)
        _whole(self.nvlink_domain_gpus, "nvlink_domain_gpus", 1, MAX_NVLINK_DOMAIN_GPUS, optional=True)
        if self.nvlink_domain_gpus is not None and self.nvlink_domain_gpus % self.gpus_per_node:
            raise SpecError("an NVLink domain holds whole nodes: a multiple of gpus_per_node",
                            field="nvlink_domain_gpus", found=self.nvlink_domain_gpus,
                            allowed=f"a multiple of gpus_per_node ({self.gpus_per_node}), e.g. 72 for a GB200 NVL72 "
                                    f"rack of 4-GPU nodes")
        _real(self.intra_node_gbps, "intra_node_gbps", MIN_RATE, MAX_GBPS, optional=True)
        _real(self.inter_node_gbps, "inter_node_gbps", MIN_RATE, MAX_GBPS, optional=True)
        if self.fabric != "":
            _choice(self.fabric, "fabric", tuple(FABRICS))
        if self.nics_per_node is not None:
            if (isinstance(self.nics_per_node, bool) or not isinstance(self.nics_per_node, numbers.Integral)
                    or not 1 <= self.nics_per_node <= MAX_NICS_PER_NODE):
                raise SpecError("the fabric's network adapters in one node", field="nics_per_node",
                                found=_short(self.nics_per_node),
                                allowed=f"a whole number from 1 to {MAX_NICS_PER_NODE}")
            if not self.fabric:
                raise SpecError("nics_per_node says how a fabric's adapters are shared: name the fabric too",
                                field="nics_per_node", found=self.nics_per_node, allowed=", ".join(FABRICS))
        if self.link_curves_from is not None and self.link_curves_from not in LINK_CURVE_CLUSTERS:
            raise SpecError("names no cluster whose network curves can be imported", field="link_curves_from",
                            found=_short(self.link_curves_from), allowed=", ".join(LINK_CURVE_CLUSTERS))
        for name in ("gres_type", "account", "qos"):
            _safe_name(getattr(self, name), name, optional=True)
        _whole(self.time_limit_min, "time_limit_min", 1, MAX_TIME_LIMIT_MIN, optional=True)
        _optional_bool(self.exclusive, "exclusive")
        _whole(self.cpus_per_task, "cpus_per_task", 1, 1 << 16, optional=True)
        _real(self.mem_per_node_gib, "mem_per_node_gib", MIN_DEVICE_MEMORY_GIB, MAX_DEVICE_MEMORY_GIB,
              lo_open=True, optional=True)
        _str_tuple(self.setup, "setup")
        _str_pairs(self.env, "env")
        _text(self.python, "python")
        _text(self.container, "container", optional=True)
        _text(self.megatron_entry, "megatron_entry")
        # what reaches a shell on the nodes: the rules render and profiling apply
        check_path(self.python, "python")
        if self.container is not None:
            check_path(self.container, "container")
        check_entry(self.megatron_entry, "megatron_entry")
        for k, line in enumerate(self.setup):
            check_setup_line(line, f"setup[{k}]")
        if not isinstance(self.module_purge, bool):
            raise SpecError("expected true or false", field="module_purge", found=_short(self.module_purge))
        for name, allowed in (("transformer_impl", TRANSFORMER_IMPLS), ("stand_in_for", STAND_IN_VENDORS)):
            if getattr(self, name) is not None and getattr(self, name) not in allowed:
                raise SpecError("not an allowed value", field=name, found=_short(getattr(self, name)),
                                allowed=", ".join(allowed))

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def domain_gpus(self) -> int:
        """GPUs of one NVLink/xGMI domain (``nvlink_domain_gpus``, else a node)."""
        return self.nvlink_domain_gpus or self.gpus_per_node

    def transformer_impl_for(self, vendor: str) -> str:
        """The transformer layer this partition trains with (``--transformer-impl``) when its
        ranks are ``vendor``'s: its own setting, else Transformer Engine on NVIDIA (Megatron-LM's
        default there) and the local spec elsewhere."""
        if self.transformer_impl is not None:
            return self.transformer_impl
        return "transformer_engine" if vendor == "nvidia" else "local"


@dataclass(frozen=True, kw_only=True)
class Link:
    """Bandwidth between two partitions (per direction, GB/s)."""

    a: str
    b: str
    gbps: float

    def __post_init__(self) -> None:
        _safe_name(self.a, "between[0]")
        _safe_name(self.b, "between[1]")
        _real(self.gbps, "gbps", MIN_RATE, MAX_GBPS)


@dataclass(frozen=True, kw_only=True)
class Site:
    """A cluster: its partitions, GPU types, links, and where state lives."""

    name: str
    partitions: tuple[Partition, ...]
    gpu_types: tuple[GpuType, ...] = ()  # site-defined types; the catalog supplies the rest
    links: tuple[Link, ...] = ()
    inter_partition_gbps: float = 12.5
    scheduler: Scheduler = "auto"
    account: str | None = None
    qos: str | None = None
    time_limit_min: int = 60
    # what every job asks of Slurm (memx_hpc/slurm/request.py): whole nodes, a signal before
    # the time limit, requeue after preemption or node failure (None: Slurm's default)
    exclusive: bool = False
    signal: str | None = None
    requeue: bool | None = None
    container_runtime: ContainerRuntime | None = None  # needed once a partition names a container
    store_path: str = "memx-store.h5"
    cache_path: str | None = None
    work_dir: str = "memx-runs"
    pipeline_comm_backend: CommBackend = "nccl"
    pipeline_comm_env: tuple[tuple[str, str], ...] = ()
    memory_safety_margin: float = 0.05
    megatron_version: str = "core_r0.16.0"
    # (time, memory, balance) exponents of the weighted-product objective; None: the
    # planner's default. ``--weights`` on the command line overrides them.
    objective_weights: tuple[float, float, float] | None = None
    #: whether a new profile store starts from the shipped reference profiles (Sailor,
    #: Cephalo); None: yes unless every partition is a CPU (memx_hpc.profile.reference)
    reference_data: bool | None = None
    #: which source of layer times to follow where two disagree for a GPU type
    #: (memx_hpc.model.sources): (GPU type or "*", source) pairs; () decides by end-to-end runs
    prefer_source: tuple[tuple[str, str], ...] = ()
    #: the parallel degrees the search may choose among on this site (empty: any; a job's own
    #: lists narrow them further): see :class:`TrainJob`
    virtual_stages: tuple[int, ...] = ()
    context_parallel_sizes: tuple[int, ...] = ()
    expert_parallel_sizes: tuple[int, ...] = ()
    expert_tensor_parallel_sizes: tuple[int, ...] = ()
    source_file: str | None = None

    def __post_init__(self) -> None:
        _text(self.name, "name")
        _degrees(self.virtual_stages, "virtual_stages", MAX_LAYERS)
        for name in ("context_parallel_sizes", "expert_parallel_sizes", "expert_tensor_parallel_sizes"):
            _degrees(getattr(self, name), name, 1 << 16)
        if not isinstance(self.gpu_types, tuple) or not all(isinstance(g, GpuType) for g in self.gpu_types):
            raise SpecError("expected GPU types", field="gpu_types", found=_short(self.gpu_types))
        cat = catalog()

        def builtin(n: str) -> str | None:
            g = cat.find(n)
            return g.name if g is not None else None
        check_gpu_names(self.gpu_types, "gpu_types", builtin)

        if not isinstance(self.partitions, tuple) or not all(isinstance(p, Partition) for p in self.partitions):
            raise SpecError("expected a list of partitions", field="partitions", found=_short(self.partitions))
        if not self.partitions:
            raise SpecError("a site needs at least one partition", field="partitions", found=[])
        if len(self.partitions) > MAX_PARTITIONS:
            raise SpecError(f"{len(self.partitions)} partitions", field="partitions",
                            allowed=f"at most {MAX_PARTITIONS}")
        names: set[str] = set()
        for i, p in enumerate(self.partitions):
            if p.name in names:
                raise SpecError("duplicate partition name", field=f"partitions[{i}].name", found=p.name)
            names.add(p.name)
            try:
                vendor = self.gpu(p.gpu_type).vendor
            except SpecError as e:
                raise SpecError(e.detail, field=f"partitions[{i}].gpu_type", found=e.found,
                                allowed="a catalog name (memx-hpc validate --list-gpus) or one defined "
                                        "under gpu_types") from None
            if p.stand_in_for is not None and vendor != "cpu":
                raise SpecError("only CPU partitions stand in for another vendor", field=f"partitions[{i}].stand_in_for",
                                found=p.stand_in_for)
            if p.transformer_impl == "transformer_engine" and vendor == "cpu":
                raise SpecError("Transformer Engine needs a GPU; CPU partitions train megatron-core's local layer",
                                field=f"partitions[{i}].transformer_impl", found=p.transformer_impl, allowed="local")
        for i, link in enumerate(self.links):
            if not isinstance(link, Link):
                raise SpecError("expected a link", field=f"links[{i}]", found=_short(link))
            for j, pn in enumerate((link.a, link.b)):
                if pn not in names:
                    raise SpecError("unknown partition" + _suggest(pn, sorted(names)),
                                    field=f"links[{i}].between[{j}]", found=pn, allowed=", ".join(sorted(names)))
        _real(self.inter_partition_gbps, "inter_partition_gbps", MIN_RATE, MAX_GBPS)
        if not isinstance(self.prefer_source, tuple):
            raise SpecError("expected (GPU type, source) pairs", field="prefer_source", found=_short(self.prefer_source))
        for pair in self.prefer_source:
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise SpecError("expected (GPU type, source) pairs", field="prefer_source", found=_short(pair))
            where = "prefer_source" if pair[0] == "*" else f"prefer_source.{pair[0]}"
            if pair[0] != "*":
                _safe_name(pair[0], "prefer_source")
            _safe_name(pair[1], where)
        _choice(self.scheduler, "slurm.scheduler", SCHEDULERS)
        _safe_name(self.account, "slurm.account", optional=True)
        _safe_name(self.qos, "slurm.qos", optional=True)
        _whole(self.time_limit_min, "slurm.time_limit_min", 1, MAX_TIME_LIMIT_MIN)
        if not isinstance(self.exclusive, bool):
            raise SpecError("expected true or false", field="slurm.exclusive", found=_short(self.exclusive))
        _slurm_signal(self.signal, "slurm.signal")
        _optional_bool(self.requeue, "slurm.requeue")
        if self.container_runtime is not None:
            _choice(self.container_runtime, "slurm.container_runtime", CONTAINER_RUNTIMES)
        with_image = [i for i, p in enumerate(self.partitions) if p.container is not None]
        if with_image and self.container_runtime is None:
            raise SpecError(f"partitions[{with_image[0]}].container names an image: say which runtime starts it",
                            field="slurm.container_runtime", found=None, allowed=", ".join(CONTAINER_RUNTIMES))
        _text(self.store_path, "store")
        _text(self.cache_path, "cache", optional=True)
        _text(self.work_dir, "work_dir")
        _choice(self.pipeline_comm_backend, "pipeline_comm.backend", COMM_BACKENDS)
        _str_pairs(self.pipeline_comm_env, "pipeline_comm.env")
        _real(self.memory_safety_margin, "memory_safety_margin", 0.0, 0.9)
        _text(self.megatron_version, "megatron_version")
        if self.objective_weights is not None:
            w = self.objective_weights
            if not isinstance(w, tuple) or len(w) != 3:
                raise SpecError("expected (time, memory, balance)", field="objective", found=_short(w))
            for name, v in zip(("time", "memory", "balance"), w):
                _real(v, f"objective.{name}", 0.0, MAX_WEIGHT)
            if not any(w):
                raise SpecError("at least one weight must be > 0", field="objective", found=w)

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
        return catalog().get(name)

    def gpu_of(self, partition: str) -> GpuType:
        return self.gpu(self.partition(partition).gpu_type)

    @property
    def total_gpus(self) -> int:
        return sum(p.total_gpus for p in self.partitions)

    def intra_gbps(self, partition: str) -> float:
        return self.intra_figure(partition)[0]

    def link_gbps(self, a: str, b: str) -> float:
        """Per-direction bandwidth between a GPU in partition ``a`` and one in ``b``."""
        return self.link_figure(a, b)[0]

    def intra_figure(self, partition: str) -> tuple[float, str, str]:
        """Inside a node of ``partition``: ``(GB/s, provenance, what)``; provenance
        ``site-figure`` when the site file states ``intra_node_gbytes_per_s``, else
        ``generic``: the GPU type's catalog link figure (NVLink / Infinity Fabric / PCIe
        from its datasheet, memx_hpc/data/gpus.yaml)."""
        p = self.partition(partition)
        if p.intra_node_gbps is not None:
            return p.intra_node_gbps, "site-figure", f"site partition {p.name} intra_node_gbytes_per_s"
        g = self.gpu(p.gpu_type)
        return g.link_gbps, "generic", f"generic: {g.name} datasheet link (gpu type link_gbytes_per_s)"

    def inter_figure(self, partition: str) -> tuple[float, str, str]:
        """Between nodes of ``partition``: ``(GB/s, provenance, what)`` as :meth:`intra_figure`;
        the generic figure is :data:`GENERIC_INTER_NODE_GBPS`."""
        p = self.partition(partition)
        if p.inter_node_gbps is not None:
            return p.inter_node_gbps, "site-figure", f"site partition {p.name} inter_node_gbytes_per_s"
        if p.fabric:
            f = FABRICS[p.fabric]
            nics = p.nics_per_node or f.adapters_per_node or p.gpus_per_node
            # a GPU's share of its node's adapters: shared when fewer, several of its own when
            # more (NCCL maps a GPU's channels to the adapters nearest it)
            share = nics / p.gpus_per_node
            shared = ("" if share == 1 else f", {nics} adapter(s) shared by {p.gpus_per_node} GPUs" if share < 1
                      else f", {nics} adapters for {p.gpus_per_node} GPUs")
            return (f.adapter_gbits_per_s / 8.0 * share, "generic",
                    f"generic: partition {p.name} fabric {p.fabric}, {f.label()}{shared}; no inter_node_gbytes_per_s "
                    f"in the site file")
        return (GENERIC_INTER_NODE_GBPS, "generic",
                "generic: no inter_node_gbytes_per_s in the site file, one HDR InfiniBand adapter (200 Gb/s)")

    def link_figure(self, a: str, b: str) -> tuple[float, str, str]:
        """Between a GPU of ``a`` and one of ``b`` (other nodes): ``(GB/s, provenance, what)``.
        Between partitions: the site's ``links`` entry for the pair, else the slowest of
        ``inter_partition_gbytes_per_s`` and both partitions' inter-node figures (generic
        when the slowest is a figure the site file does not state)."""
        if a == b:
            return self.inter_figure(a)
        for link in self.links:
            if {link.a, link.b} == {a, b}:
                return link.gbps, "site-figure", f"site link {a}-{b}"
        cands = [(self.inter_partition_gbps, "site-figure", "site inter_partition_gbytes_per_s"),
                 self.inter_figure(a), self.inter_figure(b)]
        gbps = min(c[0] for c in cands)
        for c in cands:  # the site's own figure when it ties with a generic one
            if c[0] == gbps and c[1] == "site-figure":
                return gbps, "site-figure", f"link {a}-{b}: {c[2]}"
        return next((gbps, c[1], f"link {a}-{b}: {c[2]}") for c in cands if c[0] == gbps)

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

