"""An accelerator model (:class:`GpuType`) and the rule that no two types share a name.

GPU models are data: the built-in ones are read from ``memx_hpc/data/gpus.yaml``
(:mod:`memx_hpc.spec.catalog`), others from a site file's ``gpu_types:``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal

from ..errors import SpecError
from .checks import (MAX_DEVICE_MEMORY_GIB, MAX_GBPS, MAX_TFLOPS, MIN_DEVICE_MEMORY_GIB, MIN_RATE,
                     MIN_USABLE_FRACTION, _build, _choice, _real, _safe_name, _short, _str_tuple)
from .modes import FORM_FACTORS, PRECISIONS, VENDORS, FormFactor, Precision, Vendor
from .yamlio import _Reader


@dataclass(frozen=True, kw_only=True)
class GpuType:
    """One accelerator model. Rates are vendor datasheet numbers (``source`` says which).

    ``memory_gib`` is the device memory as the device reports it (``nvidia-smi``
    memory.total, ``amd-smi``/``rocm-smi`` VRAM total), not the datasheet's decimal GB:
    HBM and GDDR come in binary sizes (an A100-80GB reports 81,920 MiB). ``usable_fraction``
    is the share of it one process can allocate at all (``torch.cuda.mem_get_info``'s total
    over memory.total: the driver keeps the rest); the runtime's own context and
    communicator buffers are not in it but in the footprint model's fixed term
    (:mod:`memx_hpc.model.memory`). ``capacity_bytes`` is their product, what plans are
    checked against. ``peak_tflops_fp8``: dense fp8 matrix rate, 0 where the part has none.

    ``link_gbps`` is the typical per-direction intra-node bandwidth of one device
    (NVLink / Infinity Fabric / PCIe) in GB/s; partitions may override it.
    ``precisions``: the precisions its matrix units run natively (Volta and Turing have
    fp16 tensor cores but no bf16; ``peak_tflops_bf16`` is then the fp16 figure).
    """

    name: str
    vendor: Vendor
    memory_gib: float
    peak_tflops_bf16: float
    peak_tflops_fp32: float
    hbm_gbps: float
    link_gbps: float
    source: str = ""
    aliases: tuple[str, ...] = ()
    measured_at_profile_time: bool = False
    precisions: tuple[Precision, ...] = PRECISIONS
    #: the silicon this type is a board/memory variant of (V100-16 and V100-32 are one
    #: chip): variants share layer times and differ only in memory. Empty: its own chip.
    chip: str = ""
    #: board (module) power limit in W as the datasheet states it; 0: not known. Peak
    #: FLOP/s per W says how far the datasheet peak is beyond what the power cap sustains.
    tdp_w: float = 0.0
    #: share of ``memory_gib`` a process can allocate (what the driver does not keep back)
    usable_fraction: float = 1.0
    #: dense fp8 matrix throughput in TFLOP/s; 0: no fp8 units (or not rated)
    peak_tflops_fp8: float = 0.0
    #: ``module`` (SXM / OAM mezzanine or superchip: a power and cooling budget sized for
    #: sustained matrix load) or ``card`` (PCIe add-in board, its power set by the slot and
    #: the card's cooler: the rated peak assumes boost clocks the cap does not sustain);
    #: "" not stated (read as a card). A module's peak per W counts at most as the smallest
    #: of a measured module's (:meth:`memx_hpc.model.anchors.Anchors.datasheet`).
    form_factor: FormFactor | Literal[""] = ""
    #: CUDA compute capability ``(major, minor)`` as the device reports it
    #: (``torch.cuda.get_device_capability()``, ``nvidia-smi --query-gpu=compute_cap``) and
    #: NVIDIA's CUDA GPUs table lists it; None: not an NVIDIA part, or not stated. Kernels
    #: and libraries branch on it (Transformer Engine keeps no transposed FP8 weight where
    #: its FP8 GEMMs take non-TN layouts: :func:`fp8_gemm_takes_non_tn_layouts`).
    compute_capability: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        _safe_name(self.name, "name")
        _choice(self.vendor, "vendor", VENDORS)
        _real(self.memory_gib, "memory_gib", MIN_DEVICE_MEMORY_GIB, MAX_DEVICE_MEMORY_GIB)
        for name in ("peak_tflops_bf16", "peak_tflops_fp32"):
            _real(getattr(self, name), name, MIN_RATE, MAX_TFLOPS)
        for name in ("hbm_gbps", "link_gbps"):
            _real(getattr(self, name), name, MIN_RATE, MAX_GBPS)
        if not isinstance(self.source, str):
            raise SpecError("expected a string", field="source", found=_short(self.source))
        _str_tuple(self.aliases, "aliases")
        for i, a in enumerate(self.aliases):
            _safe_name(a, f"aliases[{i}]")
        if not isinstance(self.measured_at_profile_time, bool):
            raise SpecError("expected true or false", field="measured_at_profile_time",
                            found=_short(self.measured_at_profile_time))
        _str_tuple(self.precisions, "precisions")
        if not self.precisions:
            raise SpecError("expected at least one precision", field="precisions", allowed=", ".join(PRECISIONS))
        for i, v in enumerate(self.precisions):
            _choice(v, f"precisions[{i}]", PRECISIONS)
        if self.chip != "":
            _safe_name(self.chip, "chip")
        if self.tdp_w != 0.0:
            _real(self.tdp_w, "tdp_w", 1.0, 100_000.0)
        _real(self.usable_fraction, "usable_fraction", MIN_USABLE_FRACTION, 1.0)
        if self.peak_tflops_fp8 != 0.0:
            _real(self.peak_tflops_fp8, "peak_tflops_fp8", MIN_RATE, MAX_TFLOPS)
        if self.form_factor != "":
            _choice(self.form_factor, "form_factor", FORM_FACTORS)
        if self.compute_capability is not None:
            cc = self.compute_capability
            if (not isinstance(cc, tuple) or len(cc) != 2 or not all(isinstance(x, int) and not isinstance(x, bool)
                                                                      for x in cc) or not (1 <= cc[0] <= 99)
                    or not (0 <= cc[1] <= 9)):
                raise SpecError("expected a CUDA compute capability 'major.minor' (e.g. '9.0', '10.3')",
                                field="compute_capability", found=_short(cc))
            if self.vendor != "nvidia":
                raise SpecError("a CUDA compute capability belongs to an NVIDIA part", field="compute_capability",
                                found=f"{cc[0]}.{cc[1]} on vendor {self.vendor}")

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
        """The device memory as the device reports it, in bytes."""
        return int(self.memory_gib * 2**30)

    @property
    def capacity_bytes(self) -> int:
        """What one process can allocate: the reported memory times ``usable_fraction``."""
        return int(self.memory_gib * self.usable_fraction * 2**30)

    @staticmethod
    def from_mapping(data: Any, path: str, *, name: str | None = None) -> "GpuType":
        r = _Reader(data, path)
        g = _build(
            GpuType, path,
            name=name if name is not None else r.str("name"),
            vendor=r.str("vendor"),
            memory_gib=r.float("memory_gib"),
            peak_tflops_bf16=r.float("peak_tflops_bf16"),
            peak_tflops_fp32=r.float("peak_tflops_fp32"),
            hbm_gbps=r.rate("hbm_gbytes_per_s"),
            link_gbps=r.rate("link_gbytes_per_s"),
            source=r.str("source", ""),
            aliases=r.str_list("aliases"),
            measured_at_profile_time=r.bool("measured_at_profile_time", False),
            precisions=r.str_list("precisions") or PRECISIONS,
            chip=r.str("chip", ""),
            tdp_w=r.float("tdp_w", 0.0, min=0.0),
            usable_fraction=r.float("usable_fraction", 1.0),
            peak_tflops_fp8=r.float("peak_tflops_fp8", 0.0, min=0.0),
            form_factor=r.str("form_factor", ""),
            compute_capability=parse_compute_capability(r.raw("compute_capability", None),
                                                        f"{path}.compute_capability"),
        )
        r.finish()
        return g


def parse_compute_capability(value: Any, field: str) -> tuple[int, int] | None:
    """``"10.3"`` (as NVIDIA's CUDA GPUs table and ``nvidia-smi --query-gpu=compute_cap``
    write it; a YAML number such as ``9.0`` too) to ``(10, 3)``; None stays None."""
    if value is None:
        return None
    text = str(value).strip() if isinstance(value, (str, int, float)) and not isinstance(value, bool) else ""
    major, dot, minor = text.partition(".")
    if not (dot and major.isdigit() and minor.isdigit() and len(minor) == 1):
        raise SpecError("expected a CUDA compute capability 'major.minor' (e.g. '9.0', '10.3')", field=field,
                        found=_short(value))
    return int(major), int(minor)


def fp8_gemm_takes_non_tn_layouts(gpu: GpuType) -> bool:
    """Whether cuBLAS runs FP8 GEMMs in non-TN layouts on ``gpu``, so that Transformer Engine
    keeps no transposed (column-wise) copy of a per-tensor-scaled FP8 tensor beside the row-wise
    one: the backward GEMMs read the row-wise data transposed. Transformer Engine's
    ``is_non_tn_fp8_gemm_supported()`` (transformer_engine/pytorch/utils.py; the JAX
    build's cpp_extensions/gemm.py alike) is ``(10, 0) <= capability < (12, 0) or
    capability >= (13, 0)``: data-centre Blackwell (B200, GB200 10.0; B300, GB300 10.3) yes;
    Hopper (9.0), Ada (8.9) and the 12.x Blackwell parts (RTX 50, RTX PRO, GB10) no. A part
    whose capability is not stated is read as needing the transpose (the larger footprint)."""
    cc = gpu.compute_capability
    return cc is not None and ((10, 0) <= cc < (12, 0) or cc >= (13, 0))


def check_gpu_names(types: Iterable[GpuType], path: str = "gpu_types",
                    outer: Callable[[str], str | None] | None = None) -> None:
    """Refuse a GPU name or alias that also names another type (case-insensitively).

    An alias that names another type would silently swap figures (memory sizes) for
    every partition and sample that uses that name. ``outer(name)`` is the type a name
    resolves to outside ``types`` (the catalog, for site-defined types); a site type may
    reuse its own catalog namesake's aliases, since it replaces that entry.
    """
    owner: dict[str, str] = {}
    for g in types:
        for i, n in enumerate((g.name,) + tuple(g.aliases)):
            where = f"{path}.{g.name}" + (f".aliases[{i - 1}]" if i else "")
            prev = owner.get(n.lower())
            if prev is not None and prev != g.name:
                raise SpecError(f"names GPU type {prev!r} too; one would silently replace the other's figures",
                                field=where, found=n)
            owner[n.lower()] = g.name
            if i and outer is not None:
                other = outer(n)
                if other is not None and other.lower() != g.name.lower():
                    raise SpecError(f"names the built-in GPU type {other!r}; it would silently replace its "
                                    "figures (memory, throughput) wherever that name is used", field=where, found=n)
