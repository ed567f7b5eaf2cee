"""Which profiling points to measure: the full grid, the minimal set, and what is missing.

The full layer grid of one GPU type is every (TP, micro-batch, recompute) the search
may use for a layer of the job's shape:

* TP: divisors of the GPUs per node (of any partition carrying the type) that divide
  both the attention heads and the query groups (Megatron-LM needs both);
* micro-batch: the job's ``micro_batch_sizes``, or every divisor of the global batch
  up to 16 when the job names none;
* recompute: the job's ``recompute_modes`` (none, selective, full).

The minimal set, per GPU type, measures a layer at (``T`` TP values sorted,
``M`` micro-batch sizes sorted):

1. ``recompute=none`` at ``(T_min, M_min)``, ``(T_min, M_max)`` and ``(T_max, M_max)``:
   the two ends of the micro-batch line (time is near-linear in tokens per GPU and
   memory linear in the micro-batch, the axes the augmentation interpolates along),
   and the largest TP at the largest micro-batch, which carries the TP all-reduce cost
   and the sharded shapes at the size where they matter;
2. one interior point ``(T_mid, M_mid)`` (medians, ``recompute=none``) when either axis
   has three or more values, to catch curvature the corners cannot show;
3. each other recompute mode once, at ``(T_min, M_max)``: recomputation repeats part of
   the forward pass, so its cost relative to ``none`` is close to a constant ratio per
   device (Korthikanti et al. 2022, §5: selective recompute adds the attention-core
   forward, full recompute one whole forward), and its memory follows the activation
   formula; one point per mode calibrates both;
4. beside the layer: the embedding and the output layer at ``(T_min, M_max)`` and
   ``(T_max, M_max)``, the optimizer step at ``T_min`` and ``T_max``, the TP all-reduce
   at every TP size above 1 for the messages of ``M_min`` and ``M_max``
   (``b·s·h·e`` bytes, Megatron's activation all-reduce), and point-to-point sends of
   those two messages between two devices of one node, and between two nodes where a
   partition has several.
5. a mixture of experts: the layer points above for each kind of layer the model has
   (dense and MoE when ``moe_layer_freq`` mixes them); where a node has two or more
   devices, the MoE layer once at the smallest expert-parallel size above 1 that divides
   the experts (``(1, M_max)``, its experts spread over those ranks and its tokens
   dispatched by megatron-core's all-to-all), and the all-to-all itself (``alltoall``) over
   the smallest and largest such EP group for the dispatch messages of ``M_min`` and ``M_max``
   (``(ep - 1) / ep`` of ``k·b·s·h·e`` bytes sent per rank).

The minimal set never grows with the number of micro-batch sizes or TP values, so its
share of the grid shrinks as the grid grows; ``python benchmarks/profiling_cost.py``
prints both for the example sites.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from ..errors import SpecError
from ..spec import BYTES_PER_ELEMENT, LayerShape, ProfilePoint, Site, TrainJob

if TYPE_CHECKING:
    from .store import ProfileStore

__all__ = ["GridAxes", "grid_axes", "full_grid", "minimal_set", "missing_points", "estimate_seconds",
           "points_by_gpu_type", "layer_points"]

#: The micro-batch sizes tried when a job names none (TrainJob: "every divisor up to 16").
DEFAULT_MAX_MICRO_BATCH = 16


@dataclass(frozen=True, kw_only=True)
class GridAxes:
    """The candidate values of each grid axis for one GPU type."""

    gpu_type: str
    tps: tuple[int, ...]
    micro_batch_sizes: tuple[int, ...]
    recompute_modes: tuple[str, ...]
    multi_node: bool  # some partition of this type has two or more nodes

    @property
    def layer_grid_size(self) -> int:
        return len(self.tps) * len(self.micro_batch_sizes) * len(self.recompute_modes)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _site_gpu_types(site: Site) -> list[str]:
    """GPU types of the site in partition order, each once (by canonical name)."""
    out: list[str] = []
    for p in site.partitions:
        name = site.gpu(p.gpu_type).name
        if name not in out:
            out.append(name)
    return out


def grid_axes(site: Site, job: TrainJob) -> list[GridAxes]:
    """The grid axes of every GPU type of the site, in partition order."""
    m = job.model
    mbs = tuple(job.micro_batch_sizes) or tuple(d for d in _divisors(job.global_batch_size)
                                                if d <= DEFAULT_MAX_MICRO_BATCH)
    modes = tuple(job.recompute_modes)
    if not modes:
        raise SpecError("a job needs at least one recompute mode", field="recompute_modes", found=[])
    out = []
    for gpu in _site_gpu_types(site):
        parts = [p for p in site.partitions if site.gpu(p.gpu_type).name == gpu]
        per_node = max(p.gpus_per_node for p in parts)
        tps = tuple(t for t in _divisors(per_node)
                    if m.num_attention_heads % t == 0 and m.num_query_groups % t == 0)
        out.append(GridAxes(gpu_type=gpu, tps=tps, micro_batch_sizes=mbs, recompute_modes=modes,
                            multi_node=any(p.nodes > 1 for p in parts)))
    return out


def _shape(job: TrainJob, moe: bool | None) -> LayerShape:
    """The job's layer shape of one kind (``moe`` None: the MoE layer of a model whose layers
    are of two kinds, else its one kind), as the composition asks for it."""
    kinds = set(job.model.moe_layers)
    if moe is None and len(kinds) > 1:
        moe = True
    return LayerShape.of(job.model, moe=moe)


def _layer_kinds(job: TrainJob) -> list[bool | None]:
    """The layer kinds a job's layer points cover: its one kind, or dense and MoE."""
    return [False, True] if len(set(job.model.moe_layers)) > 1 else [None]


def _point(job: TrainJob, gpu: str, kind: str, *, tp: int = 1, mbs: int = 1, recompute: str = "none",
           group_size: int = 1, message_bytes: int = 0, inter_node: bool = False, moe: bool | None = None,
           ep: int = 1) -> ProfilePoint:
    return ProfilePoint(gpu_type=gpu, kind=kind, shape=_shape(job, moe), tp=tp, micro_batch_size=mbs,
                        recompute=recompute, precision=job.precision, attention=job.attention,
                        group_size=group_size, message_bytes=message_bytes, inter_node=inter_node, ep=ep)


def _ep_sizes(job: TrainJob, per_node: int) -> list[int]:
    """Expert-parallel sizes above 1 that divide the experts and fit a node's devices."""
    m = job.model
    if not m.is_moe:
        return []
    return [e for e in _divisors(per_node) if e > 1 and m.num_experts % e == 0]


def _alltoall_message_bytes(job: TrainJob, mbs: int, ep: int) -> int:
    """What one rank sends in one token dispatch over ``ep`` ranks under balanced routing:
    ``(ep - 1) / ep`` of its ``k`` copies of ``b·s·h`` elements."""
    m = job.model
    return mbs * m.moe_router_topk * m.seq_length * m.hidden_size * BYTES_PER_ELEMENT[job.precision] * (ep - 1) // ep


def _moe_points(job: TrainJob, ax: GridAxes, per_node: int, *, minimal: bool) -> list[ProfilePoint]:
    """An MoE model's points that need 2+ devices of a node: the MoE layer at an EP above 1
    (the smallest; every one off the minimal set) and the all-to-all over each EP group
    (minimal: the smallest and largest), at the micro-batch sizes the collectives take."""
    eps = _ep_sizes(job, per_node)
    if not eps:
        return []
    mbs = ax.micro_batch_sizes if not minimal else tuple(dict.fromkeys((ax.micro_batch_sizes[0],
                                                                         ax.micro_batch_sizes[-1])))
    first = "none" if "none" in ax.recompute_modes else ax.recompute_modes[0]
    layer_eps = eps if not minimal else eps[:1]
    a2a_eps = eps if not minimal else list(dict.fromkeys((eps[0], eps[-1])))
    g = ax.gpu_type
    pts = [_point(job, g, "layer", tp=1, mbs=ax.micro_batch_sizes[-1], recompute=first, moe=True, ep=e)
           for e in layer_eps]
    pts += [_point(job, g, "alltoall", mbs=b, group_size=e, message_bytes=_alltoall_message_bytes(job, b, e))
            for e in a2a_eps for b in mbs]
    return pts


def _per_node(site: Site, gpu: str) -> int:
    return max(p.gpus_per_node for p in site.partitions if site.gpu(p.gpu_type).name == gpu)


def _activation_message_bytes(job: TrainJob, mbs: int) -> int:
    """Bytes of one activation tensor ``b·s·h·e``: what TP all-reduces and what a
    pipeline stage sends to the next (Narayanan et al. 2021, §3.2)."""
    return mbs * job.model.seq_length * job.model.hidden_size * BYTES_PER_ELEMENT[job.precision]


def _others(job: TrainJob, ax: GridAxes, *, minimal: bool) -> list[ProfilePoint]:
    """Embedding, head, optimizer and collective points of one GPU type."""
    tps = ax.tps if not minimal else tuple(dict.fromkeys((ax.tps[0], ax.tps[-1])))
    mbs = ax.micro_batch_sizes if not minimal else tuple(dict.fromkeys((ax.micro_batch_sizes[0],
                                                                         ax.micro_batch_sizes[-1])))
    g = ax.gpu_type
    pts: list[ProfilePoint] = []
    emb_mbs = mbs if not minimal else (ax.micro_batch_sizes[-1],)
    for kind in ("embedding", "head"):
        pts += [_point(job, g, kind, tp=t, mbs=b) for t in tps for b in emb_mbs]
    pts += [_point(job, g, "optimizer", tp=t) for t in tps]
    for t in tps:
        if t > 1:
            pts += [_point(job, g, "allreduce", tp=t, mbs=b, group_size=t,
                           message_bytes=_activation_message_bytes(job, b)) for b in mbs]
    where = (False, True) if ax.multi_node else (False,)
    if max(ax.tps) > 1 or ax.multi_node:  # a p2p needs two devices
        for inter in where:
            pts += [_point(job, g, "p2p", mbs=b, group_size=2, message_bytes=_activation_message_bytes(job, b),
                           inter_node=inter) for b in mbs]
    return pts


def layer_points(points: Iterable[ProfilePoint]) -> list[ProfilePoint]:
    return [p for p in points if p.kind == "layer"]


def full_grid(site: Site, job: TrainJob) -> list[ProfilePoint]:
    """Every point the search could ask about, per GPU type: the layer at every
    (TP, micro-batch, recompute) and the other kinds at every (TP, micro-batch)."""
    out: list[ProfilePoint] = []
    for ax in grid_axes(site, job):
        out += [_point(job, ax.gpu_type, "layer", tp=t, mbs=b, recompute=r, moe=k) for k in _layer_kinds(job)
                for t in ax.tps for b in ax.micro_batch_sizes for r in ax.recompute_modes]
        out += _others(job, ax, minimal=False)
        out += _moe_points(job, ax, _per_node(site, ax.gpu_type), minimal=False)
    return out


def minimal_set(site: Site, job: TrainJob) -> list[ProfilePoint]:
    """The minimal set (the rule is in the module docstring), deterministic order."""
    out: list[ProfilePoint] = []
    for ax in grid_axes(site, job):
        t0, t1 = ax.tps[0], ax.tps[-1]
        b0, b1 = ax.micro_batch_sizes[0], ax.micro_batch_sizes[-1]
        first = "none" if "none" in ax.recompute_modes else ax.recompute_modes[0]
        chosen = [(t0, b0, first), (t0, b1, first), (t1, b1, first)]
        if len(ax.tps) >= 3 or len(ax.micro_batch_sizes) >= 3:
            chosen.append((ax.tps[(len(ax.tps) - 1) // 2], ax.micro_batch_sizes[(len(ax.micro_batch_sizes) - 1) // 2],
                           first))
        chosen += [(t0, b1, r) for r in ax.recompute_modes if r != first]
        layer = [_point(job, ax.gpu_type, "layer", tp=t, mbs=b, recompute=r, moe=k) for k in _layer_kinds(job)
                 for t, b, r in dict.fromkeys(chosen)]
        out += layer + _others(job, ax, minimal=True)
        out += _moe_points(job, ax, _per_node(site, ax.gpu_type), minimal=True)
    return out


def missing_points(site: Site, job: TrainJob, store: "ProfileStore") -> list[ProfilePoint]:
    """The minimal set less what the store already has (measured or imported, feasible or not)."""
    have = store.stored_points()
    return [p for p in minimal_set(site, job) if p not in have]


def points_by_gpu_type(points: Iterable[ProfilePoint]) -> dict[str, list[ProfilePoint]]:
    out: dict[str, list[ProfilePoint]] = {}
    for p in points:
        out.setdefault(p.gpu_type, []).append(p)
    return out


# --------------------------------------------------------------------------- cost estimates

#: Fraction of datasheet peak a single layer reaches; Narayanan et al. 2021 (§5.1) report
#: 44-52 % of peak for whole GPT models on A100, a lone layer with small batches less.
MATMUL_EFFICIENCY = 0.35
#: Seconds per task to start a Python process, import torch + megatron-core and build the
#: layer (measured on this project's CPU nodes: 4-8 s; GPU nodes add CUDA context creation).
TASK_STARTUP_S = 8.0


def _layer_forward_flops(shape: LayerShape, mbs: int) -> float:
    """Forward FLOPs of one layer, all TP ranks together: Narayanan et al. 2021, §5.1,
    ``24bsh² + 4bs²h`` generalised to the FFN width, GQA and SwiGLU (2 FLOPs per MAC)."""
    s, b, h, f = shape.seq_length, mbs, shape.hidden_size, shape.ffn_hidden_size
    kv = shape.num_query_groups * (h // shape.num_attention_heads)
    mats = 3 if shape.activation == "swiglu" else 2
    return 2 * s * b * h * (h + 2 * kv) + 2 * s * b * h * h + 2 * s * b * h * f * mats + 4 * b * s * s * h


def estimate_seconds(site: Site, point: ProfilePoint, *, warmup: int = 2, iters: int = 5) -> float:
    """Estimated device-seconds of one point (all devices it occupies): startup plus
    ``warmup + iters`` forward+backward passes at :data:`MATMUL_EFFICIENCY` of the
    datasheet peak. A planning figure for dry runs, not a prediction."""
    gpu = site.gpu(point.gpu_type)
    flops_per_s = gpu.peak_tflops(point.precision) * 1e12 * MATMUL_EFFICIENCY
    sh = point.shape
    if point.kind == "layer":
        f = 3 * _layer_forward_flops(sh, point.micro_batch_size)  # forward + 2x backward
        if point.recompute == "full":
            f += _layer_forward_flops(sh, point.micro_batch_size)
        elif point.recompute == "selective":
            f += 4 * point.micro_batch_size * sh.seq_length ** 2 * sh.hidden_size
        f /= point.tp
    elif point.kind in ("embedding", "head"):
        f = 3 * 2 * sh.seq_length * point.micro_batch_size * sh.hidden_size * sh.vocab_size / point.tp
        if point.kind == "embedding":
            f /= 50  # a gather, not a matmul: memory-bound, a small fraction of the head
    elif point.kind == "optimizer":
        params = 12 * sh.hidden_size ** 2 / point.tp
        f = 0.0
        per_pass = params * 16 / (gpu.hbm_gbps * 1e9)  # Adam reads/writes ~16 B per parameter
        return TASK_STARTUP_S + (warmup + iters) * per_pass
    else:
        link = gpu.link_gbps * 1e9
        per_pass = 2 * point.message_bytes / link + 1e-4
        devices = point.group_size
        return devices * (TASK_STARTUP_S + (warmup + iters) * per_pass)
    devices = point.tp * point.ep if point.kind == "layer" else point.tp
    return devices * (TASK_STARTUP_S + (warmup + iters) * f / flops_per_s)
