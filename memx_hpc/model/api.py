"""The interface between cost models and the search: what is asked, what comes back.

The search composes a plan from per-layer costs. It asks a :class:`CostModel` for a
batch of :class:`LayerQuery` rows and gets an ``(n, 2)`` array: forward+backward
milliseconds of ONE layer (or embedding / head) for ONE micro-batch on one GPU of a
TP group (recomputation and the layer's own tensor-parallel collectives included),
and the activation bytes that layer keeps for backward per in-flight micro-batch.

Two implementations: :class:`AnalyticCostModel` (datasheet roofline + the analytic
memory formula; the fallback before anything is fitted, and the "pure roofline"
baseline) and :class:`memx_hpc.model.predictor.Predictor` (XGBoost, fitted on samples).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from ..errors import SpecError
from ..spec import FP8_FORMATS, PRECISIONS, GpuType, LayerShape, Recompute
from . import analytic

QUERY_KINDS = ("layer", "embedding", "head")

#: Whose kernels run a layer (:attr:`LayerQuery.kernels`): ``megatron`` -- Megatron-LM,
#: megatron-core or Megatron-DeepSpeed, whose layer fuses its memory-bound steps (layer norm,
#: bias + activation, bias + dropout + residual add, masked softmax); what a plan runs -- or
#: ``eager``, a layer written in plain PyTorch, each elementwise operation its own kernel
#: reading and writing the whole activation (Cephalo times Hugging Face models that way).
KERNELS = ("megatron", "eager")

#: Imported sources whose layers are ``eager`` (the prefix of :attr:`LayerSample.source`):
#: Cephalo's latencies time one Hugging Face layer with PyTorch (its data README). Sailor's
#: profiles come from Megatron-DeepSpeed (its ``profile.sh``), and the site's own profiles
#: from megatron-core: both ``megatron``.
EAGER_SOURCES = ("cephalo:",)


def kernels_of(sample: Any) -> str:
    """:data:`KERNELS` entry of a sample, by its source."""
    return "eager" if str(getattr(sample, "source", "")).startswith(EAGER_SOURCES) else "megatron"


PROVENANCES = ("measured", "imported", "augmented", "datasheet-only")


@dataclass(frozen=True, kw_only=True)
class Basis:
    """What a cost model's numbers for one GPU type are built from: ``kind`` (one of
    :data:`PROVENANCES`, or ``calibrated`` where the site's end-to-end runs correct them) and,
    for a type answered by the measurements of another type of its chip, that type.
    :meth:`label` is how reports write it: ``imported (same chip as V100-16)``."""

    kind: str
    same_chip_as: str | None = None

    def label(self) -> str:
        return self.kind if self.same_chip_as is None else f"{self.kind} (same chip as {self.same_chip_as})"

#: Runtime memory beyond allocated tensors, per device, when nothing was measured:
#: the driver context (CUDA 12 with lazy module loading ~0.5 GiB on A100/H100; HIP's is
#: larger), NCCL/RCCL communicator buffers (NCCL_BUFFSIZE 4 MiB x channels x peers, a few
#: hundred MiB for TP + DP + PP groups), cuBLAS/hipBLAS workspaces, and the caching
#: allocator's reserved-but-unallocated slack. Sailor's measured GH200 plans
#: (../shared/data/sailor/validation_dev) show the device figure exceeding allocated bytes
#: by GiBs, so these defaults are deliberately not small. A fitted Predictor replaces them.
DEFAULT_OVERHEAD_GIB = {"nvidia": 4.0, "amd": 2.0, "intel": 1.5, "cpu": 0.25}


@dataclass(frozen=True, kw_only=True)
class LayerQuery:
    """One cost question: a layer of ``shape`` on ``gpu_type`` at one setting.

    ``kind`` is ``layer`` (one transformer layer), ``embedding`` (input embedding) or
    ``head`` (final norm, output layer and loss). ``tp`` is the tensor-parallel degree;
    costs are per GPU of the TP group. ``fp8``: the layer's GEMMs run in FP8 through
    Transformer Engine (a format of :data:`memx_hpc.spec.FP8_FORMATS`; "" none); only
    transformer layers take it (Megatron-LM's embedding and output layer stay 16-bit).
    """

    gpu_type: str
    kind: str = "layer"
    shape: LayerShape
    tp: int
    micro_batch_size: int
    recompute: str  # a Recompute.mode
    precision: str
    attention: str = "sdpa"
    sequence_parallel: bool = False
    fp8: str = ""
    #: an MoE layer's expert-parallel degree (its ``num_experts / ep`` experts on this rank, the
    #: token all-to-all over ``ep`` ranks) and expert tensor-parallel degree (None: ``tp``)
    ep: int = 1
    etp: int | None = None
    #: whose kernels run the layer (:data:`KERNELS`); a plan's layers are Megatron's
    kernels: str = "megatron"

    def __post_init__(self) -> None:
        if self.kind not in QUERY_KINDS:
            raise SpecError("unknown query kind", field="kind", found=self.kind, allowed=", ".join(QUERY_KINDS))
        Recompute.check_mode(self.recompute)
        if self.precision not in PRECISIONS:
            raise SpecError("unknown precision", field="precision", found=self.precision,
                            allowed=", ".join(PRECISIONS))
        if self.kernels not in KERNELS:
            raise SpecError("unknown kernels", field="kernels", found=self.kernels, allowed=", ".join(KERNELS))
        if self.attention not in analytic.ATTENTION_KINDS:
            raise SpecError("unknown attention kind", field="attention", found=self.attention,
                            allowed=", ".join(analytic.ATTENTION_KINDS))
        for name in ("tp", "micro_batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SpecError(f"{name} must be a whole number >= 1", field=name, found=v)
        if self.sequence_parallel and self.tp == 1:
            raise SpecError("sequence parallelism needs tp > 1", field="sequence_parallel", found=True)
        if self.fp8 and (self.fp8 not in FP8_FORMATS or self.kind != "layer" or self.precision == "fp32"):
            raise SpecError("FP8 applies to the GEMMs of a 16-bit transformer layer", field="fp8", found=self.fp8,
                            allowed=", ".join(FP8_FORMATS) + " on kind layer, precision bf16 or fp16")
        for name in ("ep", "etp"):
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SpecError(f"{name} must be a whole number >= 1", field=name, found=v)
            if (v > 1 or name == "etp") and not (self.kind == "layer" and self.shape.is_moe):
                raise SpecError("expert parallelism applies to an MoE layer", field=name, found=v,
                                allowed="1" if name == "ep" else "none")
        if self.ep > 1 and self.shape.num_experts % self.ep:
            raise SpecError(f"EP must divide the layer's {self.shape.num_experts} experts", field="ep", found=self.ep)

    @property
    def expert_tp(self) -> int:
        """The expert layers' tensor-parallel degree (``etp``, else ``tp``)."""
        return self.tp if self.etp is None else self.etp


@runtime_checkable
class CostModel(Protocol):
    """What the search needs from a cost model."""

    identity: str  # stable hex digest; changes when the model or its training data change

    def predict(self, queries: Sequence[LayerQuery]) -> np.ndarray:
        """``(n, 2)`` float64: ``[:, 0]`` forward+backward ms of ONE layer for ONE micro-batch
        (recompute included), ``[:, 1]`` activation bytes kept for backward per in-flight
        micro-batch."""
        ...

    def overhead_bytes(self, gpu_type: str) -> int:
        """Per-device runtime context + communication buffers + allocator slack beyond
        allocated tensors."""
        ...

    def provenance(self, gpu_type: str) -> str:
        """Where this GPU type's numbers come from, as reports write it (:meth:`Basis.label`)."""
        ...


def forward_fraction(recompute: str) -> float:
    """Share of the forward pass in a layer's forward+backward time.

    Backward costs about twice the forward (two matmuls per forward matmul: Narayanan
    et al. 2021, §5.1), so 1/3 without recompute. Full recompute runs the forward again
    inside the backward: 1/(1 + 1 + 2) = 1/4. Selective recompute repeats only the
    attention scores (a few % of the layer), so it stays at 1/3.
    """
    Recompute.check_mode(recompute)
    return 0.25 if recompute == "full" else 1.0 / 3.0


def resolve_gpu(where: Any, name: str) -> GpuType:
    """A GPU type from a Site (site types, then the catalog, aliases included) or a Catalog."""
    if hasattr(where, "gpu"):
        return where.gpu(name)
    if hasattr(where, "get"):
        return where.get(name)
    raise TypeError(f"expected a Site or a Catalog, got {type(where).__name__}")


# --------------------------------------------------------------------------- roofline


def roofline_components(q: LayerQuery, gpu: GpuType) -> dict[str, float]:
    """The per-kernel roofline of one query on ``gpu`` at datasheet peaks (ms).

    ``compute_ms``: FLOPs per TP rank / peak dense throughput; ``memory_ms``: bytes the
    memory-bound kernels move / peak bandwidth (Williams et al. 2009, "Roofline");
    ``comm_ms``: the layer's TP collectives over the GPU's link (ring all-reduce);
    each for forward+backward with recomputation. ``fwd_*`` are the forward parts.
    """
    peak = gpu.peak_tflops(q.precision) * 1e12
    bw = gpu.hbm_gbps * 1e9
    s = q.shape
    b, t = q.micro_batch_size, q.tp
    e = analytic.BYTES_PER_ELEMENT[q.precision]
    fp8_share = 0.0  # the part of the layer's FLOPs its FP8 GEMMs run (at the fp8 rate)
    fwd_a2a = 0.0
    moe_terms: dict[str, float] = {}
    if q.kind == "layer":
        if s.is_moe:
            parts = analytic.moe_layer_flops(s, micro_batch_size=b, tp=t, ep=q.ep, etp=q.etp)
            fwd_flops = sum(parts.values())
            # dispatch and combine over the EP group: on the GPU's own link until the composer
            # prices the group's links (what the named term is for)
            fwd_a2a = 2 * analytic.alltoall_ms(analytic.moe_alltoall_bytes(s, micro_batch_size=b,
                                                                           precision=q.precision, ep=q.ep),
                                               q.ep, gpu.link_gbps)
            moe_terms = {f"moe_{k}_flops": 3 * v for k, v in parts.items()}
            moe_terms["moe_imbalance"] = analytic.moe_imbalance(q.ep)
        else:
            fwd_flops = analytic.layer_flops(s, micro_batch_size=b) / t
        fwd_bytes = analytic.layer_traffic_bytes(s, micro_batch_size=b, tp=t, precision=q.precision,
                                                 attention=q.attention, sequence_parallel=q.sequence_parallel)
        if q.fp8:
            if gpu.peak_tflops_fp8 <= 0:
                raise SpecError(f"{gpu.name} has no FP8 units (no fp8 rate in its catalog entry)", field="fp8",
                                found=q.fp8)
            # Transformer Engine runs the linear layers' GEMMs in FP8; the attention scores and
            # their product with the values stay 16-bit (no fp8_dot_product_attention)
            fwd_gemm = fwd_flops - analytic.attention_score_flops(s, micro_batch_size=b) / t
            fp8_share = fwd_gemm / fwd_flops
            fwd_bytes += analytic.fp8_cast_bytes(s, micro_batch_size=b, tp=t, precision=q.precision)
        fwd_comm = analytic.ring_allreduce_ms(analytic.tp_allreduce_bytes(s, micro_batch_size=b, precision=q.precision),
                                              t, gpu.link_gbps) + fwd_a2a
        flops, traffic, comm = 3 * fwd_flops, 3 * fwd_bytes, 2 * fwd_comm
        if q.recompute == "full":
            flops, traffic, comm = flops + fwd_flops, traffic + fwd_bytes, comm + fwd_comm
        elif q.recompute == "selective":
            flops += analytic.attention_score_flops(s, micro_batch_size=b) / t
            if q.attention == "core":
                traffic += s.num_attention_heads * s.seq_length ** 2 * b * 3 * e / t
    elif q.kind == "embedding":
        v = analytic.padded_vocab_size(s.vocab_size, t)
        sbh = s.seq_length * b * s.hidden_size
        fwd_flops = 0.0
        fwd_bytes = (2 * e + 1) * sbh
        # backward: a dense gradient of the (V/t) x h table is zeroed, scattered into and
        # accumulated into the fp32 main-gradient buffer.
        flops, traffic = 0.0, fwd_bytes + e * sbh + (e + 4 + 4) * v * s.hidden_size / t
        fwd_comm = analytic.ring_allreduce_ms(e * sbh, t, gpu.link_gbps)
        comm = fwd_comm
    else:  # head: final norm, output layer, vocab-parallel cross entropy
        v = analytic.padded_vocab_size(s.vocab_size, t)
        sb = s.seq_length * b
        fwd_flops = 2.0 * sb * s.hidden_size * v / t
        # logits written (e), cast to fp32 (read e, write 4), softmax read/write (4 + 4),
        # plus the final norm (read + write e·sbh)
        fwd_bytes = (3 * e + 12) * sb * v / t + 2 * e * sb * s.hidden_size
        flops, traffic = 3 * fwd_flops, 3 * fwd_bytes
        fwd_comm = analytic.ring_allreduce_ms(3 * 4 * sb, t, gpu.link_gbps)
        comm = fwd_comm + analytic.ring_allreduce_ms(e * sb * s.hidden_size, t, gpu.link_gbps)
    # the all-to-all is part of comm_ms and named on its own: forward 2, backward 2 (and the
    # recomputed forward's 2 under full recompute)
    a2a = fwd_a2a * (3 if q.recompute == "full" else 2)
    if fp8_share:
        # the FP8 GEMMs at the catalog's fp8 rate, the rest at the 16-bit rate (the share of
        # each pass's FLOPs is the forward's: backward repeats the same GEMMs twice over)
        rate = 1.0 / ((1.0 - fp8_share) / peak + fp8_share / (gpu.peak_tflops_fp8 * 1e12))
    else:
        rate = peak
    return {"compute_ms": flops / rate * 1e3, "memory_ms": traffic / bw * 1e3, "comm_ms": comm,
            "fwd_compute_ms": fwd_flops / rate * 1e3, "fwd_memory_ms": fwd_bytes / bw * 1e3, "fwd_comm_ms": fwd_comm,
            "flops": flops, "traffic_bytes": traffic, "alltoall_ms": a2a, "fwd_alltoall_ms": fwd_a2a, **moe_terms}


def roofline_terms(q: LayerQuery, gpu: GpuType) -> str:
    """The roofline's named terms of an MoE or multi-latent-attention layer query, for
    :meth:`memx_hpc.model.predictor.Predictor.explain` while no sample of its kind was measured:
    the FLOPs by part, the all-to-all and the imbalance margin (``ms`` at datasheet peaks)."""
    c = roofline_components(q, gpu)
    peak = gpu.peak_tflops(q.precision) * 1e12
    parts = []
    if q.shape.multi_latent_attention:
        parts.append("multi-latent attention (its down/up projections and per-head sizes)")
    if q.shape.is_moe:
        for k in ("attention", "router", "routed", "shared"):
            v = c.get(f"moe_{k}_flops", 0.0)
            if v:
                name = {"routed": f"routed experts ({q.shape.num_experts // q.ep} of {q.shape.num_experts} on "
                                  f"this rank, top-{q.shape.moe_router_topk})"}.get(k, k)
                parts.append(f"{name} {v / peak * 1e3:.3g} ms")
        parts.append(f"all-to-all over EP {q.ep} {c['alltoall_ms']:.3g} ms")
        parts.append(f"imbalance margin {c['moe_imbalance']:g} (analytic.MOE_IMBALANCE)")
    parts.append(f"memory-bound kernels {c['memory_ms']:.3g} ms")
    return "roofline terms: " + ", ".join(parts)


def roofline_ms(q: LayerQuery, gpu: GpuType) -> float:
    """Forward+backward ms at datasheet peaks: compute + memory-bound kernels + TP collectives."""
    c = roofline_components(q, gpu)
    return c["compute_ms"] + c["memory_ms"] + c["comm_ms"]


def analytic_activation_bytes(q: LayerQuery, *, dropout_mask_bytes: int = 1) -> int:
    """The analytic memory formula for any query kind (see :mod:`memx_hpc.model.analytic`)."""
    if q.kind == "layer":
        return analytic.activation_bytes_per_layer(
            q.shape, micro_batch_size=q.micro_batch_size, tp=q.tp, recompute=q.recompute, precision=q.precision,
            attention=q.attention, sequence_parallel=q.sequence_parallel, dropout_mask_bytes=dropout_mask_bytes,
            etp=q.etp, moe_imbalance=analytic.moe_imbalance(q.ep), fp8=q.fp8)
    if q.kind == "embedding":
        return analytic.embedding_activation_bytes(q.shape, micro_batch_size=q.micro_batch_size, tp=q.tp,
                                                   precision=q.precision, sequence_parallel=q.sequence_parallel,
                                                   dropout_mask_bytes=dropout_mask_bytes)
    return analytic.head_activation_bytes(q.shape, micro_batch_size=q.micro_batch_size, tp=q.tp,
                                          precision=q.precision, sequence_parallel=q.sequence_parallel)


def default_overhead_bytes(gpu: GpuType) -> int:
    """:data:`DEFAULT_OVERHEAD_GIB` for the GPU's vendor, in bytes."""
    return int(DEFAULT_OVERHEAD_GIB.get(gpu.vendor, 1.5) * 2**30)


class AnalyticCostModel:
    """Datasheet roofline time and analytic activation memory: no data needed.

    The fallback the search uses before a predictor is fitted, and the benchmark's
    "pure roofline" baseline. ``compute_efficiency`` scales the peak throughput
    (1.0: the pure roofline; real layers reach 0.3-0.7 of peak).
    """

    def __init__(self, site: Any, *, compute_efficiency: float = 1.0, dropout_mask_bytes: int = 1) -> None:
        if not 0 < compute_efficiency <= 1:
            raise SpecError("compute efficiency must be in (0, 1]", field="compute_efficiency",
                            found=compute_efficiency)
        self.site = site
        self.compute_efficiency = compute_efficiency
        self.dropout_mask_bytes = dropout_mask_bytes
        self.identity = _digest({"model": "analytic-roofline", "version": 1, "efficiency": compute_efficiency,
                                 "mask": dropout_mask_bytes,
                                 # resolved figures: measured CPU speeds (MeasuredFigures) included
                                 "site_gpus": [asdict(resolve_gpu(site, g.name)) for g in getattr(site, "gpu_types", ())],
                                 "measured": getattr(site, "figures", {})})

    def predict(self, queries: Sequence[LayerQuery]) -> np.ndarray:
        out = np.empty((len(queries), 2), dtype=np.float64)
        gpus: dict[str, GpuType] = {}
        for i, q in enumerate(queries):
            g = gpus.get(q.gpu_type)
            if g is None:
                g = gpus[q.gpu_type] = resolve_gpu(self.site, q.gpu_type)
            c = roofline_components(q, g)
            out[i, 0] = c["compute_ms"] / self.compute_efficiency + c["memory_ms"] + c["comm_ms"]
            out[i, 1] = analytic_activation_bytes(q, dropout_mask_bytes=self.dropout_mask_bytes)
        return out

    def overhead_bytes(self, gpu_type: str) -> int:
        return default_overhead_bytes(resolve_gpu(self.site, gpu_type))

    def basis(self, gpu_type: str) -> Basis:
        resolve_gpu(self.site, gpu_type)  # unknown names are a user error here too
        return Basis(kind="datasheet-only")

    def provenance(self, gpu_type: str) -> str:
        return self.basis(gpu_type).label()


class MeasuredFigures:
    """A Site (or Catalog) whose ``measured_at_profile_time`` types take the speed figures the
    profiler measured on the node (``ProfileStore.device_figures``) instead of placeholders.

    Only throughput and bandwidth are replaced; the memory size stays what the site says
    (it is the budget plans must fit in). Resolves names like ``Site.gpu``.
    """

    SPEED_KEYS = ("peak_tflops_fp32", "peak_tflops_bf16", "hbm_gbps")

    def __init__(self, site: Any, figures: dict[str, dict[str, float]]) -> None:
        self.site = site
        self.figures = {k: dict(v) for k, v in figures.items() if v}
        self.gpu_types = getattr(site, "gpu_types", ())

    def gpu(self, name: str) -> GpuType:
        from dataclasses import replace
        g = resolve_gpu(self.site, name)
        fig = self.figures.get(name) or self.figures.get(g.name)
        if not g.measured_at_profile_time or not fig:
            return g
        return replace(g, **{k: float(fig[k]) for k in self.SPEED_KEYS if k in fig})


def with_store_figures(site: Any, store: Any) -> Any:
    """``site`` with the figures ``store`` measured for its profile-time-measured types."""
    names = set(store.gpu_types())
    return MeasuredFigures(site, {n: store.device_figures(n) for n in names})


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """SHA-256 of the code and data every prediction is computed from: the sources of
    ``memx_hpc/model`` and the catalog/preset data. Identities that feed the signature
    cache or a saved predictor include it, so a new version of the package never answers
    from numbers an older one computed (a saved model's identity alone does not change
    when the code that turns it into predictions does)."""
    from importlib import resources

    h = hashlib.sha256()
    for pkg in ("memx_hpc.model", "memx_hpc.data"):
        for entry in sorted(resources.files(pkg).iterdir(), key=lambda e: e.name):
            if entry.name.endswith((".py", ".yaml")) and entry.is_file():
                h.update(entry.name.encode() + b"\0" + entry.read_bytes() + b"\0")
    return h.hexdigest()


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
