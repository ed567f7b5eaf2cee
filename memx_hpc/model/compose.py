"""Composition of per-layer predictions into a plan's iteration time and per-GPU memory.

Per stage ``i`` of a plan (``n_i`` layers, ``k_i`` of them under full recompute, the
rest under the stage's base mode ``none`` or ``selective``), from the cost model's
per-layer answers ``t`` (forward+backward ms per micro-batch) and ``a`` (activation
bytes kept per in-flight micro-batch; the questions: :mod:`memx_hpc.model.queries`):

* each layer's time is at least its host-dispatch floor (:mod:`memx_hpc.model.host`:
  eager operators x host cost per operator; ``max(device, host)``);
* time per micro-batch ``T_i = k_i t_full + (n_i - k_i) t_base`` + embedding (first
  stage) + output layer and loss (last stage), split into forward and backward with
  :func:`memx_hpc.model.api.forward_fraction` (:func:`stage_time_ms`);
* memory: the activations held by the in-flight micro-batches, weights, gradients and
  optimizer states, as the device reports them (``a·A + b``), against the capacity less the
  site's safety margin (:mod:`memx_hpc.model.stage_memory`);
* communication: point-to-point sends between stages over the link between their GPUs,
  each stage's gradient synchronisation over its data-parallel group in Megatron's buckets
  (what the plan's ``overlap_grad_reduce`` / ``overlap_param_gather`` hide behind the last
  backward and the next forward does not count), the tied-embedding all-reduce, TP across
  NVLink domains, context and expert parallel's exchanges (:mod:`memx_hpc.model.comm_costs`,
  NCCL's cost model in :mod:`memx_hpc.model.collectives` where a link has no measured curve);
* the pipeline: Megatron's 1F1B schedule evaluated exactly (see
  :mod:`memx_hpc.model.schedule`), giving each stage's finish time; each stage then
  synchronises its gradients and steps its optimizer. The iteration ends when the last
  stage does.

:class:`Composer` evaluates :class:`Block` s of plans with numpy, from plain inputs (the
layouts' placements, the recompute levels: :class:`CompositionInputs`); :func:`predict_plan`
and :func:`predict_general` evaluate one plan (the same
formulas; the tests check that they agree).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Literal, Mapping, Sequence

import math

import numpy as np

from ..errors import SpecError
from ..placement import Placement, place
from ..spec import fp8_gemm_takes_non_tn_layouts, job_for_plan, GeneralPlan, Plan, Recompute, Site, TrainJob
from . import analytic
from .api import LayerQuery, forward_fraction
from .comm_costs import (TP_COLLECTIVE_UNITS, StageExtras, dp_sync_ms, exposed_dp_sync_ms, link_model_for,
                         one_bucket_terms, send_ms, stage_extras, stage_links, stage_sync_terms, tied_sync_ms,
                         tp_internode_ms)
from .host import HOST_US_PER_OP, host_bound, host_us_per_op
from .memory import memory_scale_of
from .queries import MODE_FULL, MODE_NAMES, context_queries, layer_query
from .schedule import interleaved_finish
from .stage_memory import (activations_as_run, dense_stage_state, fits, held_activation_bytes, in_flight_heads,
                           in_flight_units, logits_transient_bytes, memory_limit, stage_activation_bytes,
                           stage_peak_bytes, stage_state)
# Not used here: re-exported for the tests and benchmarks that import them from this module.
from .comm_costs import p2p_bytes, stage_layout, sync_ms_per_param  # noqa: F401
from .queries import shape_of  # noqa: F401
from .stage_memory import fp8_state_bytes  # noqa: F401

Predictions = Mapping[LayerQuery, tuple[float, float]]


@dataclass(frozen=True, kw_only=True)
class CostOptions:
    """Options of the composition that no plan states. Megatron's ``--overlap-grad-reduce`` /
    ``--overlap-param-gather`` / ``--ddp-bucket-size`` are the plan's own
    (:class:`~memx_hpc.spec.Plan`, :class:`Layout`): one source of truth.

    ``ddp_bucketing``: which ranks cut their gradients into buckets under gradient-reduce
    overlap. ``"megatron"`` (every plan the tool renders): megatron-core's DDP, the first
    pipeline rank's first model chunk only (the others reduce one bucket per chunk after their
    cool-down). ``"every_stage"``: PyTorch's ``DistributedDataParallel`` as runtimes built on it
    run it (nanotron: ``bucket_cap_mb`` on every rank), for pricing measurements of such runs."""

    ddp_bucketing: Literal["megatron", "every_stage"] = "megatron"

    def __post_init__(self) -> None:
        if self.ddp_bucketing not in ("megatron", "every_stage"):
            raise SpecError("unknown gradient bucketing", field="ddp_bucketing", found=self.ddp_bucketing,
                            allowed="megatron, every_stage")


@dataclass(frozen=True, kw_only=True)
class StagePrediction:
    """One GPU of one stage (for general plans: of one replica of the stage)."""

    stage: int
    replica: int
    partition: str | None
    gpu_type: str
    tp: int
    num_layers: int
    recompute: Recompute  # the stage's (written by its label: none | selective | full | full:K)
    forward_ms: float  # per micro-batch
    backward_ms: float
    in_flight: int
    activation_bytes: int
    state_bytes: int
    overhead_bytes: int
    peak_bytes: int
    capacity_bytes: int
    send_ms: float  # one p2p message to the next stage
    grad_sync_ms: float
    optimizer_ms: float
    finish_ms: float  # end of this stage's work in the iteration

    @property
    def utilisation(self) -> float:
        return self.peak_bytes / self.capacity_bytes

    @property
    def time_ms(self) -> float:
        return self.forward_ms + self.backward_ms


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """Predicted iteration of one plan."""

    iteration_ms: float
    pipeline_ms: float
    tokens_per_s: float
    num_microbatches: int
    stages: tuple[StagePrediction, ...]
    max_utilisation: float
    balance: float
    feasible: bool
    reason: str = ""
    limit_fraction: float = 0.95
    virtual_stages: int = 1  # model chunks per stage the pipeline was priced with

    @property
    def stage_ms(self) -> tuple[float, ...]:
        """Forward+backward ms per micro-batch of each stage (its slowest replica)."""
        out: dict[int, float] = {}
        for s in self.stages:
            out[s.stage] = max(out.get(s.stage, 0.0), s.time_ms)
        return tuple(out[i] for i in sorted(out))

    def peak_by_gpu_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.stages:
            out[s.gpu_type] = max(out.get(s.gpu_type, 0), s.peak_bytes)
        return out

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stage_ms"] = list(self.stage_ms)
        d["peak_bytes_by_gpu_type"] = self.peak_by_gpu_type()
        for s, sd in zip(self.stages, d["stages"]):
            sd["utilisation"] = s.utilisation
            sd["recompute"] = s.recompute.label()
        return d


# --------------------------------------------------------------------------- shared pieces


# --------------------------------------------------------------------------- the stage formulas
#
# One implementation of each rule of the module docstring, written with operators that
# work on floats and on numpy arrays alike: the vectorised Composer and the one-plan path
# (predict_plan, predict_general) both call these.


def stage_time_ms(k, nb, t_full, t_base, ff_base, first, last, t_emb, t_head):
    """(forward, forward+backward) ms per micro-batch of a stage: ``k`` fully recomputed
    layers, ``nb`` under the base mode (forward fraction ``ff_base``), plus the embedding on
    the first stage and the output layer and loss on the last."""
    ff_full, ff_none = forward_fraction("full"), forward_fraction("none")
    ends = first * t_emb + last * t_head
    fwd = k * t_full * ff_full + nb * t_base * ff_base + ends * ff_none
    total = k * t_full + nb * t_base + ends
    return fwd, total


# --------------------------------------------------------------------------- vectorised composition


@dataclass(frozen=True, kw_only=True)
class BlockCost:
    """Scores' inputs for a block: iteration ms (inf when infeasible), worst-GPU memory
    utilisation, balance (max / mean utilisation over the plan's GPUs), feasibility, and the
    worst-GPU utilisation with each peak widened by its GPU type's expected memory error
    (the recommended plan's check; see search/objective.py)."""

    iteration_ms: np.ndarray
    max_utilisation: np.ndarray
    balance: np.ndarray
    feasible: np.ndarray
    risk_utilisation: np.ndarray
    #: iteration ms of the plans whose every peak stays within its GPU's capacity but not
    #: under the site's safety margin (inf elsewhere): set aside by the margin alone
    aside_ms: np.ndarray | None = None


@dataclass(frozen=True, kw_only=True)
class Layout:
    """One parallel layout the composer prices: where its stages run (a
    :class:`~memx_hpc.placement.Placement`) and its micro-batch size. A search skeleton in
    the model's terms; a new parallel dimension is a field of the placement and of this."""

    placement: Placement
    micro_batch_size: int
    #: Megatron-LM's --sequence-parallel (TP > 1 only): its layer predictions, 1/TP sends
    sequence_parallel: bool = False
    #: model chunks per pipeline rank (interleaved 1F1B)
    virtual_stages: int = 1
    #: the plan's --microbatch-group-size-per-virtual-pipeline-stage (None: megatron-core's default, pp)
    microbatch_group_size_per_vp_stage: int | None = None
    #: the plan's --use-distributed-optimizer (None: the job's)
    distributed_optimizer: bool | None = None
    #: the plan's --overlap-grad-reduce / --overlap-param-gather (what hides the DP synchronisation)
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    #: the plan's --ddp-bucket-size (parameters; None: megatron-core's default)
    ddp_bucket_size: int | None = None

    @property
    def tp(self) -> int:
        return self.placement.tp

    @property
    def cp(self) -> int:
        return self.placement.cp

    @property
    def dp(self) -> int:
        return self.placement.dp

    @property
    def pp(self) -> int:
        return self.placement.pp


@dataclass(frozen=True, kw_only=True)
class CompositionInputs:
    """What the vectorised composition needs to know of the plans it will be given: the site,
    the job, every layout (a :class:`Block`'s ``skeleton`` indexes ``layouts``) and the
    recompute levels (its ``levels`` index ``levels``)."""

    site: Site
    job: TrainJob
    layouts: tuple[Layout, ...]
    levels: tuple[Recompute.Level, ...]

    @property
    def max_pp(self) -> int:
        return max((lay.pp for lay in self.layouts), default=1)

    def contexts(self) -> list[tuple[str, int, int, bool]]:
        """Every (GPU type, TP, micro-batch, sequence parallel) some stage of some layout runs, sorted."""
        return sorted({(c.gpu_type, lay.tp, lay.micro_batch_size, lay.sequence_parallel) for lay in self.layouts
                       for c in lay.placement.components})


@dataclass(frozen=True, kw_only=True)
class Block:
    """A run of consecutive plans as arrays (B plans, P = most stages), what the composer prices.

    ``skeleton`` indexes :attr:`CompositionInputs.layouts`; ``layers`` / ``levels`` are (B, P)
    with 0 / -1 past a plan's last stage (``levels`` index :attr:`CompositionInputs.levels`);
    ``group_max`` holds, per stage, the most layers of a stage in its partition group (what
    full recompute's k is taken from, see :class:`~memx_hpc.spec.Recompute.Level`).
    """

    start: int
    skeleton: np.ndarray
    layers: np.ndarray
    levels: np.ndarray
    group_max: np.ndarray

    def __len__(self) -> int:
        return int(self.skeleton.shape[0])

    @property
    def indices(self) -> np.ndarray:
        return np.arange(self.start, self.start + len(self), dtype=np.int64)


class _LayoutTables:
    """Per layout and stage, indices into tables of the numbers that do not depend on the
    layer split: the (GPU, TP, micro-batch) context, the state bytes, optimizer step and DP
    synchronisation by layer count, the link to the next stage, the tied-embedding sync.
    Rows are shared between layouts that need the same numbers (most do)."""

    def __init__(self, inputs: CompositionInputs, links, context_row, host_us: float = HOST_US_PER_OP,
                 ddp_bucketing: str = "megatron") -> None:
        self.inputs, self.links, self._context_row = inputs, links, context_row
        self.host_us = float(host_us)
        self.ddp_bucketing = ddp_bucketing
        S, P = len(inputs.layouts), max(inputs.max_pp, 1)
        self.ns = np.arange(inputs.job.model.num_layers + 1)
        self.ctx_ids: dict[tuple[str, int, int, bool], int] = {}
        self.ctx_rows: list[list[float]] = []
        self._state_ids: dict[tuple, int] = {}
        self.state_rows: list[np.ndarray] = []
        self.param_rows: list[np.ndarray] = []
        self.expert_rows: list[np.ndarray] = []
        self._extra_memo: dict[tuple, StageExtras] = {}
        self._opt_ids: dict[tuple, int] = {}
        self.opt_rows: list[np.ndarray] = []
        self._sync_ids: dict[tuple, int] = {}
        self.sync_rows: list[np.ndarray] = []
        self._send_memo: dict[tuple, float] = {}
        self.sk = {name: np.zeros((S, P), dtype=np.int64) for name in ("ctx", "state", "opt", "sync")}
        self.sk.update({name: np.zeros((S, P), dtype=np.float64)
                        for name in ("inflight", "heads", "first", "last", "link", "tied", "tpx", "xf", "xb")})
        self.sk.update({name: np.ones((S, P), dtype=np.float64) for name in ("lscale", "escale", "ascale")})
        self.m = np.zeros(S, dtype=np.int64)
        self.pp = np.zeros(S, dtype=np.int64)
        self.vp = np.ones(S, dtype=np.int64)
        self.vg = np.zeros(S, dtype=np.int64)  # the micro-batch group per virtual stage; 0: the default
        for li, lay in enumerate(inputs.layouts):
            self._add(li, lay)

    def _add(self, li: int, lay: Layout) -> None:
        job = self._job(lay.distributed_optimizer)
        pl, pp, tp, dp, mbs = lay.placement, lay.pp, lay.tp, lay.dp, lay.micro_batch_size
        sp, cp, ep, etp, v = lay.sequence_parallel, pl.cp, pl.ep, pl.etp, lay.virtual_stages
        m = job.global_batch_size // (mbs * dp)
        g = lay.microbatch_group_size_per_vp_stage if v > 1 else None
        self.m[li], self.pp[li], self.vp[li], self.vg[li] = m, pp, v, g or 0
        names = pl.stage_partitions
        bounds, one_node = stage_links(pl, self.inputs.site)
        tied = tied_sync_ms(self.links, job, tp, pp, names[0], names[-1])
        comps = [c for c in pl.components for _ in c.stages]
        for i, name in enumerate(names):
            gpu = comps[i].gpu_type
            first, last = i == 0, i == pp - 1
            c = self.sk["ctx"][li, i] = self._context(gpu, tp, mbs, sp)
            s = self.sk["state"][li, i] = self._state(tp, pp, dp, first, last, cp, ep, etp, job, gpu)
            self.sk["opt"][li, i] = self._opt(gpu, s, dp * cp, job)
            self.sk["inflight"][li, i] = in_flight_units(pp, i, m, v, group=g)
            self.sk["heads"][li, i] = in_flight_heads(pp, i, m, v, group=g) if last else 1
            self.sk["first"][li, i] = first
            self.sk["last"][li, i] = last
            if i < pp - 1:
                self.sk["link"][li, i] = self._send(mbs, tp, sp, bounds[i], cp)
            self.sk["sync"][li, i] = self._sync(s, dp, name, one_node[i], tp, cp, ep, etp, job, first=first, v=v,
                                                ogr=lay.overlap_grad_reduce, opg=lay.overlap_param_gather,
                                                bucket=lay.ddp_bucket_size)
            self.sk["tpx"][li, i] = self._tpx(name, gpu, tp, mbs)
            if first or last:
                self.sk["tied"][li, i] = tied
            if cp > 1 or ep > 1 or job.model.is_moe:
                x = self._extras(name, comps[i].tasks_per_node, tp, cp, ep, etp, mbs, c)
                for key, val in (("lscale", x.layer_scale), ("escale", x.ends_scale), ("ascale", x.act_scale),
                                 ("xf", x.extra_fwd_ms), ("xb", x.extra_bwd_ms)):
                    self.sk[key][li, i] = val

    def _extras(self, name: str, per_node: int, tp: int, cp: int, ep: int, etp: int | None, mbs: int,
                ctx: int) -> StageExtras:
        key = (name, per_node, tp, cp, ep, etp, mbs, ctx)
        x = self._extra_memo.get(key)
        if x is None:
            fwd = self.ctx_rows[ctx][0] * forward_fraction("none")
            x = self._extra_memo[key] = stage_extras(self.links, self.inputs.job, partition=name,
                                                     tasks_per_node=per_node, tp=tp, cp=cp, ep=ep, etp=etp,
                                                     micro_batch_size=mbs, layer_fwd_ms=fwd, host_us=self.host_us)
        return x

    def _context(self, gpu: str, tp: int, mbs: int, sp: bool) -> int:
        key = (gpu, tp, mbs, sp)
        c = self.ctx_ids.get(key)
        if c is None:
            c = self.ctx_ids[key] = len(self.ctx_rows)
            self.ctx_rows.append(self._context_row(gpu, tp, mbs, sp))
        return c

    def _job(self, distributed_optimizer: bool | None) -> TrainJob:
        """The job as a layout runs it: with its own distributed-optimizer choice, if any."""
        job = self.inputs.job
        if distributed_optimizer is None or distributed_optimizer == job.distributed_optimizer:
            return job
        return dataclasses.replace(job, distributed_optimizer=distributed_optimizer)

    def _state(self, tp: int, pp: int, dp: int, first: bool, last: bool, cp: int = 1, ep: int = 1,
               etp: int | None = None, job: TrainJob | None = None, gpu: str | None = None) -> int:
        job = job or self.inputs.job
        g = None if gpu is None else self.inputs.site.gpu(gpu)
        # GPU types share state rows unless their FP8 weights differ (a transpose or not)
        non_tn = bool(job.fp8) and g is not None and fp8_gemm_takes_non_tn_layouts(g)
        key = (tp, pp, dp, first, last, cp, ep, etp, job.distributed_optimizer, non_tn)
        s = self._state_ids.get(key)
        if s is None:
            s = self._state_ids[key] = len(self.state_rows)
            rows = np.array([stage_state(job, int(n), first=first, last=last, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep,
                                         etp=etp, gpu=g) for n in self.ns],
                            dtype=np.float64).reshape(len(self.ns), 3)
            self.param_rows.append(np.ascontiguousarray(rows[:, 0]))
            self.expert_rows.append(np.ascontiguousarray(rows[:, 1]))
            self.state_rows.append(np.ascontiguousarray(rows[:, 2]))
        return s

    def _opt(self, gpu: str, s: int, dp: int, job: TrainJob | None = None) -> int:
        job = job or self.inputs.job
        key = (gpu, s, dp, job.distributed_optimizer)
        o = self._opt_ids.get(key)
        if o is None:
            o = self._opt_ids[key] = len(self.opt_rows)
            g = self.inputs.site.gpu(gpu)
            self.opt_rows.append(np.array([analytic.optimizer_step_ms(int(x), g, precision=job.precision,
                                                                      optimizer=job.optimizer,
                                                                      distributed_optimizer=job.distributed_optimizer,
                                                                      dp=dp) for x in self.param_rows[s]]))
        return o

    def _send(self, mbs: int, tp: int, sp: bool, bound: tuple[str, str, bool], cp: int = 1) -> float:
        key = (mbs, tp, sp, cp, *bound)
        v = self._send_memo.get(key)
        if v is None:
            a, b, same = bound
            v = self._send_memo[key] = send_ms(self.links, self.inputs.job, micro_batch_size=mbs, tp=tp,
                                               sequence_parallel=sp, a=a, b=b, same_node=same, cp=cp)
        return v

    def _tpx(self, name: str, gpu: str, tp: int, mbs: int) -> float:
        key = ("tpx", name, gpu, tp, mbs)
        v = self._send_memo.get(key)
        if v is None:
            v = self._send_memo[key] = tp_internode_ms(self.links, self.inputs.job, partition=name, gpu_type=gpu,
                                                       tp=tp, micro_batch_size=mbs)
        return v

    def _sync(self, s: int, dp: int, name: str, one_node: bool, tp: int, cp: int = 1, ep: int = 1,
              etp: int | None = None, job: TrainJob | None = None, *, first: bool = False, v: int = 1,
              ogr: bool = False, opg: bool = False, bucket: int | None = None) -> int:
        job = job or self.inputs.job
        key = (s, dp, name, one_node, tp, cp, ep, etp, job.distributed_optimizer, first, v, ogr, opg, bucket)
        y = self._sync_ids.get(key)
        if y is None:
            y = self._sync_ids[key] = len(self.sync_rows)
            streams = min(tp, self.inputs.site.partition(name).gpus_per_node)
            self.sync_rows.append(stage_sync_terms(
                self.links, job, params=self.param_rows[s], expert_params=self.expert_rows[s], dp=dp, cp=cp, tp=tp,
                ep=ep, etp=etp, partition=name, one_node=one_node, streams=streams, first_stage=first,
                virtual_stages=v, overlap_grad_reduce=ogr, overlap_param_gather=opg, ddp_bucket_size=bucket,
                bucketing=self.ddp_bucketing))
        return y


class Composer:
    """Composes blocks of plans from a table of per-query predictions (numpy, vectorised).

    ``inputs`` describe the layouts and recompute levels the blocks refer to; nothing here
    knows how they were enumerated."""

    def __init__(self, inputs: CompositionInputs, predictions: Predictions, *, overhead_bytes: Mapping[str, int],
                 options: CostOptions | None = None, memory_error: Mapping[str, float] | None = None,
                 links=None, memory_scale: Mapping[str, float] | None = None,
                 host_us_per_op: float = HOST_US_PER_OP) -> None:
        self.inputs = inputs
        self.site, self.job = inputs.site, inputs.job
        self.options = options or CostOptions()
        self._host_us = float(host_us_per_op)
        self.links = link_model_for(self.site, None, links)
        prior = memory_scale_of(None, self.site)
        self._memory_scale = {p.gpu_type: float(prior(p.gpu_type)) for p in self.site.partitions}
        self._memory_scale.update(memory_scale or {})
        self._lev_base = np.array([0 if lv.base == "none" else 1 for lv in inputs.levels], dtype=np.int64)
        self._lev_frac = np.array([lv.full_fraction for lv in inputs.levels], dtype=np.float64)
        self._ff = np.array([forward_fraction(m) for m in MODE_NAMES], dtype=np.float64)
        def context_row(gpu: str, tp: int, mbs: int, sp: bool) -> list[float]:
            return self._context_row(predictions, overhead_bytes, gpu, tp, mbs, sp)

        tables = _LayoutTables(inputs, self.links, context_row, self._host_us, self.options.ddp_bucketing)
        self._set_tables(tables)
        # 1 + the expected relative error of the predicted peak, per context's GPU type
        err = memory_error or {}
        self._ctx_widen = np.array([1.0 + float(err.get(gpu, 0.0)) for gpu, _, _, _ in self.contexts])

    def _set_tables(self, t: _LayoutTables) -> None:
        L = self.job.model.num_layers
        # columns: t[none, selective, full], a[none, selective, full], embedding (t, a), head (t, a),
        # runtime overhead bytes, capacity bytes, memory scale (a of a·A + b)
        ctx = np.array(t.ctx_rows, dtype=np.float64).reshape(len(t.ctx_rows), 13)
        self._ctx_t = np.ascontiguousarray(ctx[:, 0:3])
        self._ctx_a = np.ascontiguousarray(ctx[:, 3:6])
        self._ctx_emb = np.ascontiguousarray(ctx[:, 6:8])
        self._ctx_head = np.ascontiguousarray(ctx[:, 8:10])
        self._ctx_over = ctx[:, 10]
        self._ctx_cap = ctx[:, 11]
        self._ctx_scale = ctx[:, 12]
        self._state = np.array(t.state_rows).reshape(len(t.state_rows), L + 1)
        self._params = np.array(t.param_rows).reshape(len(t.param_rows), L + 1)
        self._opt = np.array(t.opt_rows).reshape(len(t.opt_rows), L + 1)
        sync = np.array(t.sync_rows).reshape(len(t.sync_rows), L + 1, *t.sync_rows[0].shape[1:]) \
            if t.sync_rows else np.zeros((0, L + 1, 1, 1))
        # (rows, layers, dense | experts, terms); a model without routed experts keeps the dense terms only
        self._sync = np.ascontiguousarray(sync[:, :, 0, :] if not sync[:, :, 1:, :].any() else sync)
        self._sk = t.sk
        self._sk_m, self._sk_pp, self._sk_vp, self._sk_vg = t.m, t.pp, t.vp, t.vg
        self.contexts = tuple(t.ctx_ids)
        self._ctx_logits = np.array([logits_transient_bytes(self.job, tp, mbs) for _, tp, mbs, _ in self.contexts],
                                    dtype=np.float64)

    def set_predictions(self, predictions: Predictions) -> None:
        """Replace the per-layer values of every context with those ``predictions`` holds
        (values it lacks are kept)."""
        for c, (gpu, tp, mbs, sp) in enumerate(self.contexts):
            qs = context_queries(self.job, gpu, tp, mbs, sp)
            for j, q in enumerate(qs):
                v = predictions.get(q)
                if v is None:
                    continue
                v = tuple(activations_as_run(self.job, [q], host_bound([q], [v], self._host_us))[0])
                if j < 3:
                    self._ctx_t[c, j], self._ctx_a[c, j] = v
                elif j == 3:
                    self._ctx_emb[c] = v
                else:
                    self._ctx_head[c] = v

    def _context_row(self, predictions: Predictions, overhead: Mapping[str, int], gpu: str, tp: int, mbs: int,
                     sp: bool) -> list[float]:
        qs = context_queries(self.job, gpu, tp, mbs, sp)
        try:
            vals = [predictions[q] for q in qs]
        except KeyError as e:  # pragma: no cover - the engine predicts every context first
            raise RuntimeError(f"no prediction for {e.args[0]}") from None
        vals = activations_as_run(self.job, qs, host_bound(qs, vals, self._host_us))
        t = [v[0] for v in vals]
        a = [v[1] for v in vals]
        return t[0:3] + a[0:3] + [t[3], a[3], t[4], a[4], float(overhead[gpu]),
                                  float(self.site.gpu(gpu).capacity_bytes), float(self._memory_scale.get(gpu, 1.0))]

    def compose(self, block: Block) -> BlockCost:
        """Iteration time, worst utilisation, balance and feasibility of every plan in ``block``."""
        sk = block.skeleton
        B = len(block)
        P = block.layers.shape[1]
        g = {k: v[sk, :P] for k, v in self._sk.items()}
        n = block.layers.astype(np.float64)
        valid = block.levels >= 0
        lev = np.where(valid, block.levels, 0)
        base = self._lev_base[lev]
        # k per partition group (one --recompute-num-layers per hetjob component), at most n
        k = np.minimum(n, np.ceil(block.group_max * self._lev_frac[lev] - 1e-9))
        nb = n - k
        ctx = g["ctx"]
        tpx = g["tpx"]  # TP groups over whole nodes: their collectives' inter-node extra
        u_base, u_full, u_emb, u_head = TP_COLLECTIVE_UNITS
        t_base = self._ctx_t[ctx, base] + u_base * tpx
        t_full = self._ctx_t[ctx, MODE_FULL] + u_full * tpx
        a_base = self._ctx_a[ctx, base]
        a_full = self._ctx_a[ctx, MODE_FULL]
        a_none = self._ctx_a[ctx, 0]
        emb, head = self._ctx_emb[ctx], self._ctx_head[ctx]
        first, last = g["first"], g["last"]
        ls, es = g["lscale"], g["escale"]
        fwd, total = stage_time_ms(k, nb, t_full * ls, t_base * ls, self._ff[base], first, last,
                                   (emb[..., 0] + u_emb * tpx) * es, (head[..., 0] + u_head * tpx) * es)
        # context- and expert-parallel communication per layer (recomputed layers repeat the forward's)
        fwd = fwd + n * g["xf"]
        total = total + n * (g["xf"] + g["xb"]) + k * g["xf"]
        bwd = total - fwd
        act, transient = stage_activation_bytes(k, nb, a_full, a_base, a_none, first, last, emb[..., 1],
                                                head[..., 1], self._ctx_logits[ctx])
        act, transient = act * g["ascale"], transient * g["ascale"]
        ni = block.layers.astype(np.int64)
        state = self._state[g["state"], ni]
        peak = stage_peak_bytes(state, g["inflight"], act, transient, self._ctx_scale[ctx], self._ctx_over[ctx],
                                last * head[..., 1] * g["ascale"], g["heads"])
        cap = self._ctx_cap[ctx]
        ok = fits(peak, cap, self.site) | ~valid
        feasible = ok.all(axis=1)
        # within capacity: the plans that fit and those only the site's safety margin refuses
        # (the margin is >= 0, so every plan that fits is within capacity)
        within = ((peak <= cap) | ~valid).all(axis=1)
        util = np.where(valid, peak / cap, 0.0)
        umax = util.max(axis=1)
        risk = (util * self._ctx_widen[ctx]).max(axis=1)
        pp = self._sk_pp[sk]
        balance = umax * pp / util.sum(axis=1)
        iteration = np.full(B, np.inf)
        if within.any():
            fidx = np.flatnonzero(within)
            # the tail after the pipeline (gradient sync, optimizer step, tied embedding) of the
            # plans within capacity only: a plan over it has no time (row by row, the same numbers)
            fs, nf = g["sync"][fidx], ni[fidx]
            tail = exposed_dp_sync_ms(self._sync[fs, nf], fwd[fidx], bwd[fidx]) + self._opt[g["opt"][fidx], nf] \
                + g["tied"][fidx]
            m = self._sk_m[sk]
            vp = self._sk_vp[sk]
            vg = self._sk_vg[sk]
            for (p_, m_, v_, g_), at in _schedule_groups(fidx, pp, m, vp, vg):
                rows = fidx[at]
                fin = interleaved_finish(fwd[rows, :p_], bwd[rows, :p_], g["link"][rows, :max(p_ - 1, 0)], m_, v_,
                                         g_ or None)
                iteration[rows] = np.max(fin + tail[at, :p_], axis=1)
        aside = np.where(feasible, np.inf, iteration)
        return BlockCost(iteration_ms=np.where(feasible, iteration, np.inf), max_utilisation=umax, balance=balance,
                         feasible=feasible, risk_utilisation=risk, aside_ms=aside)


def _schedule_groups(fidx: np.ndarray, *columns: np.ndarray):
    """The rows ``fidx`` grouped by their values in ``columns`` (whole numbers >= 0: stages,
    micro-batches, virtual stages, group), as ``(values, positions in fidx)`` in ascending
    order of the values, each group's positions ascending. The columns are packed into one integer per row
    (mixed radix), so grouping is one 1-D sort, not ``np.unique(axis=0)``'s sort of row
    records (about 0.4 s of a warm cross-vendor plan)."""
    cols = [c[fidx] for c in columns]
    radix = [int(c.max()) + 1 if len(c) else 1 for c in cols]
    key = np.zeros(len(fidx), dtype=np.int64)
    for c, r in zip(cols, radix):
        key = key * r + c
    if math.prod(radix) >= 2 ** 62:  # pragma: no cover - no space has such counts
        raise OverflowError("schedule keys do not fit 64 bits")
    order = np.argsort(key, kind="stable")
    sk = key[order]
    starts = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1]])
    ends = np.r_[starts[1:], len(sk)]
    for a, b in zip(starts.tolist(), ends.tolist()):
        yield tuple(int(c[order[a]]) for c in cols), order[a:b]


def required_queries(inputs: CompositionInputs) -> list[LayerQuery]:
    """Every query the composition of ``inputs``' layouts needs, once each, in a stable order."""
    seen: dict[LayerQuery, None] = {}
    for gpu, tp, mbs, sp in inputs.contexts():
        for q in context_queries(inputs.job, gpu, tp, mbs, sp):
            seen.setdefault(q, None)
    return list(seen)


# --------------------------------------------------------------------------- one plan


@dataclass(frozen=True, kw_only=True)
class _Replica:
    gpu_type: str
    tp: int
    partition: str | None
    sync_tp: int | None = None  # TP whose shard size the DP synchronisation moves (None: tp)


@dataclass(frozen=True, kw_only=True)
class _Composing:
    """What the composition of every replica of one plan reads (see :func:`_predict_from`)."""

    site: Site
    job: TrainJob
    micro_batch_size: int
    pp: int
    microbatches: tuple[int, ...]  # per stage: its micro-batches per iteration
    most_microbatches: int
    dp_per_stage: tuple[int, ...]
    cp: int
    virtual_stages: int
    vp_group: int | None  # micro-batches per virtual-stage group (None: megatron-core's default, pp)
    options: CostOptions
    overhead_of: object
    memory_scale: object
    sync_of: object
    state_of: object


def _microbatches(job: TrainJob, mbs: int, dp_per_stage: Sequence[int]) -> list[int]:
    """Each stage's micro-batches per iteration; SpecError where its replicas do not divide the batch."""
    gbs = job.global_batch_size
    ms = []
    for i, d in enumerate(dp_per_stage):
        if gbs % (mbs * d):
            raise SpecError(f"global_batch_size {gbs} is not a multiple of micro_batch_size x replicas "
                            f"({mbs} x {d}) of stage {i}", field=f"stages[{i}].replicas", found=d)
        ms.append(gbs // (mbs * d))
    return ms


_ROW_QUERIES = (("base", "layer", None), ("full", "layer", "full"), ("none", "layer", "none"),
                ("emb", "embedding", "none"), ("head", "head", "none"))


def _replica_values(job: TrainJob, stages, mbs: int, sequence_parallel: bool, model_predict,
                    host_us: float) -> list[dict[str, np.ndarray]]:
    """Per replica in stage order, the predicted (time, memory) of its base, fully recomputed
    and plain layers, its embedding and its head, predicted in one call."""
    queries: list[LayerQuery] = []
    rows = []
    for n, base, k, reps in stages:
        for r in reps:
            sp = sequence_parallel and r.tp > 1
            row = {}
            for name, kind, mode in _ROW_QUERIES:
                row[name] = len(queries)
                queries.append(layer_query(job, r.gpu_type, kind=kind, tp=r.tp, micro_batch_size=mbs,
                                           recompute=base if mode is None else mode, sequence_parallel=sp))
            rows.append(row)
    vals = activations_as_run(job, queries, host_bound(
        queries, np.asarray(model_predict(queries), dtype=np.float64).reshape(len(queries), 2), host_us))
    return [{name: vals[q] for name, q in row.items()} for row in rows]


def _replica_times(c: _Composing, i: int, n: int, base: str, kk: int, v, x: StageExtras,
                   tpx: float) -> tuple[float, float]:
    """(forward, forward + backward) ms of a replica of stage ``i`` per iteration's share
    (``tpx``: its TP collective's inter-node ms, 0 inside a node)."""
    first, last = i == 0, i == c.pp - 1
    (tb, _), (tf, _), (te, _), (th, _) = v["base"], v["full"], v["emb"], v["head"]
    u_base, u_full, u_emb, u_head = TP_COLLECTIVE_UNITS
    tb, tf, te, th = tb + u_base * tpx, tf + u_full * tpx, te + u_emb * tpx, th + u_head * tpx
    nb = n - kk
    ls, es = x.layer_scale, x.ends_scale
    fwd, total = stage_time_ms(kk, nb, tf * ls, tb * ls, forward_fraction(base), first, last, te * es, th * es)
    fwd, total = fwd + n * x.extra_fwd_ms, total + n * (x.extra_fwd_ms + x.extra_bwd_ms) + kk * x.extra_fwd_ms
    # the stage's share of micro-batches differs from m when its replica count does
    scale = c.microbatches[i] / c.most_microbatches
    return fwd * scale, total * scale


def _replica_state(c: _Composing, i: int, n: int, r: _Replica) -> tuple[float, float, float]:
    """``(params, expert params, state bytes)`` of replica ``r`` of stage ``i``: the caller's
    ``state_of``, else the dense rule."""
    first, last = i == 0, i == c.pp - 1
    if c.state_of is not None:
        return c.state_of(i, n, first, last, r.tp, r.gpu_type)
    return dense_stage_state(c.job, n, first=first, last=last, tp=r.tp, pp=c.pp, dp=c.dp_per_stage[i],
                             gpu=c.site.gpu(r.gpu_type))


def _replica_prediction(c: _Composing, i: int, ri: int, stage, r: _Replica, v, x: StageExtras,
                        tpx: float) -> dict:
    """One replica's stage prediction (the fields of :class:`StagePrediction`, its unrounded
    peak and time, and ``send_ms`` still 0: the pipeline sets it)."""
    n, base, kk, _ = stage
    job, site, p, mbs = c.job, c.site, c.pp, c.micro_batch_size
    first, last = i == 0, i == p - 1
    (_, ab), (_, af), (_, an), (_, ae), (_, ah) = v["base"], v["full"], v["none"], v["emb"], v["head"]
    fwd, total = _replica_times(c, i, n, base, kk, v, x, tpx)
    act, transient = stage_activation_bytes(kk, n - kk, af, ab, an, first, last, ae, ah,
                                            logits_transient_bytes(job, r.tp, mbs))
    act, transient = float(act) * x.act_scale, float(transient) * x.act_scale
    head = float(last * ah) * x.act_scale
    heads = float(in_flight_heads(p, i, c.microbatches[i], c.virtual_stages, group=c.vp_group)) if last else 1.0
    params, experts, state = _replica_state(c, i, n, r)
    units = float(in_flight_units(p, i, c.microbatches[i], c.virtual_stages, group=c.vp_group))
    over = int(c.overhead_of(r.gpu_type))
    scale = float(c.memory_scale(r.gpu_type)) if c.memory_scale else 1.0
    peak = float(stage_peak_bytes(state, units, act, transient, scale, over, head, heads))
    sync_params = params if r.sync_tp in (None, r.tp) else analytic.stage_params(
        job.model, n, first=first, last=last, tp=r.sync_tp, pp=p)
    synced = c.sync_of(i, float(sync_params), float(experts)) if experts else c.sync_of(i, float(sync_params))
    sync = float(exposed_dp_sync_ms(synced, fwd, total - fwd))
    opt = analytic.optimizer_step_ms(params, site.gpu(r.gpu_type), precision=job.precision,
                                     optimizer=job.optimizer, distributed_optimizer=job.distributed_optimizer,
                                     dp=c.dp_per_stage[i] * c.cp)
    return dict(stage=i, replica=ri, partition=r.partition, gpu_type=r.gpu_type, tp=r.tp, num_layers=n,
                recompute=Recompute.of_layers(base, kk, n), forward_ms=float(fwd), backward_ms=float(total - fwd),
                in_flight=int(math.ceil(units - 1e-9)),
                activation_bytes=int(round(held_activation_bytes(units, act, transient, head, heads))),
                state_bytes=int(state), overhead_bytes=over, peak_bytes=int(round(peak)),
                capacity_bytes=site.gpu(r.gpu_type).capacity_bytes, send_ms=0.0, grad_sync_ms=float(sync),
                optimizer_ms=float(opt), peak_float=float(peak), total=float(total))


def _finish_stages(site: Site, per: list[dict], fin, link_ms: Sequence[float], tied: float, p: int,
                   limit: float) -> tuple[list[StagePrediction], list[float], bool, str]:
    """Each replica's finish (pipeline end, gradient sync, optimizer step, tied embedding) and
    memory check: ``(stage predictions, utilisations, feasible, the first reason it is not)``."""
    feasible, reason = True, ""
    out = []
    utils: list[float] = []  # from the unrounded peaks, as the vectorised path computes them
    for d in per:
        i = d["stage"]
        end = fin[i] + d["grad_sync_ms"] + d["optimizer_ms"] + (tied if i in (0, p - 1) else 0.0)
        d["send_ms"] = float(link_ms[i]) if i < p - 1 else 0.0
        d["finish_ms"] = float(end)
        if feasible and not fits(d["peak_float"], d["capacity_bytes"], site):
            feasible = False
            reason = (f"stage {i} ({d['gpu_type']}) needs {d['peak_float'] / 2**30:.2f} GiB, above "
                      f"{limit:.0%} of its {d['capacity_bytes'] / 2**30:.2f} GiB")
        utils.append(d.pop("peak_float") / d["capacity_bytes"])
        d.pop("total")
        out.append(StagePrediction(**d))
    return out, utils, feasible, reason


def _predict_from(site: Site, job: TrainJob, model_predict, overhead_of, *, micro_batch_size: int,
                  stages: Sequence[tuple[int, str, int | None, Sequence[_Replica]]], dp_per_stage: Sequence[int],
                  link_ms: Sequence[float], sync_of, tied_ms: float, sequence_parallel: bool,
                  options: CostOptions, memory_scale=None, host_us: float = HOST_US_PER_OP,
                  links=None, virtual_stages: int = 1, extras: Sequence[StageExtras] | None = None, state_of=None,
                  cp: int = 1, extras_of=None, vp_group: int | None = None) -> Prediction:
    """The scalar composition shared by :func:`predict_plan` and :func:`predict_general`.

    ``stages``: per stage (layers, base mode of the layers not fully recomputed, number of
    fully recomputed layers, replicas). ``extras``: per stage, what context and expert
    parallel change (:func:`stage_extras`; None: nothing); ``state_of(stage, layers, first,
    last, tp, gpu type)``: ``(params, expert params, state bytes)`` (None: the dense rule). ``vp_group``:
    the plan's ``microbatch_group_size_per_vp_stage`` (None: megatron-core's default, ``pp``).
    """
    p = len(stages)
    mbs = micro_batch_size
    gbs = job.global_batch_size
    ms = _microbatches(job, mbs, dp_per_stage)
    m = max(ms)
    values = iter(_replica_values(job, stages, mbs, sequence_parallel, model_predict, host_us))
    c = _Composing(site=site, job=job, micro_batch_size=mbs, pp=p, microbatches=tuple(ms), most_microbatches=m,
                   dp_per_stage=tuple(dp_per_stage), cp=cp, virtual_stages=virtual_stages,
                   vp_group=vp_group if virtual_stages > 1 else None, options=options,
                   overhead_of=overhead_of, memory_scale=memory_scale, sync_of=sync_of, state_of=state_of)
    limit = memory_limit(site)
    per: list[dict] = []
    fwd_stage, bwd_stage = [], []
    for i, stage in enumerate(stages):
        best = None
        for ri, r in enumerate(stage[3]):
            v = next(values)
            tn = v["none"][0]
            x = extras[i] if extras is not None else (
                extras_of(i, float(tn) * forward_fraction("none")) if callable(extras_of) else StageExtras())
            tpx = tp_internode_ms(links, job, partition=r.partition, gpu_type=r.gpu_type, tp=r.tp,
                                  micro_batch_size=mbs) if links is not None else 0.0
            d = _replica_prediction(c, i, ri, stage, r, v, x, tpx)
            per.append(d)
            fwd, total = d["forward_ms"], d["total"]
            if best is None or total > best[1]:
                best = (fwd, total)
        fwd_stage.append(best[0])
        bwd_stage.append(best[1] - best[0])
    link_ms = list(link_ms)
    fin = interleaved_finish(np.array([fwd_stage]), np.array([bwd_stage]), np.array([link_ms]).reshape(1, -1), m,
                             virtual_stages, c.vp_group)[0]
    out, utils, feasible, reason = _finish_stages(site, per, fin, link_ms, tied_ms, p, limit)
    iteration = max(s.finish_ms for s in out)
    umax = max(utils)
    # balance over all GPUs of the plan: weight each entry by the GPUs it stands for
    # (a Plan's stages all have tp x dp; a general plan's replicas have their own tp)
    weights = [s.tp * (1 if len(stages[s.stage][3]) > 1 else dp_per_stage[s.stage]) for s in out]
    mean = sum(u * w for u, w in zip(utils, weights)) / sum(weights)
    tokens = gbs * job.model.seq_length / (iteration / 1e3)
    return Prediction(virtual_stages=int(virtual_stages), iteration_ms=float(iteration), pipeline_ms=float(max(fin)),
                      tokens_per_s=float(tokens),
                      num_microbatches=m, stages=tuple(out), max_utilisation=float(umax),
                      balance=float(umax / mean), feasible=feasible, reason=reason, limit_fraction=limit)


def predict_plan(plan: Plan, site: Site, job: TrainJob, cost_model, *, options: CostOptions | None = None,
                 links=None) -> Prediction:
    """Predict one Megatron-runnable plan (the same composition as the search)."""
    job = job_for_plan(job, plan)  # the plan's own distributed-optimizer choice, where it has one
    # the one fit rule (SpecError naming the field when the plan does not fit), with one
    # component per partition run, as the search prices plans
    placement = place(plan, site, job, by_partition=True)
    names = list(placement.stage_partitions)
    lm = link_model_for(site, cost_model, links)
    bounds, one_node = stage_links(placement, site)
    sp = plan.sequence_parallel and plan.tp > 1
    cp, ep, etp = plan.cp, plan.ep, plan.etp
    link_ms = [send_ms(lm, job, micro_batch_size=plan.micro_batch_size, tp=plan.tp, sequence_parallel=sp, a=a, b=b,
                       same_node=same, cp=cp) for a, b, same in bounds]

    def sync_of(i: int, params: float, experts: float = 0.0) -> np.ndarray:
        return stage_sync_terms(lm, job, params=np.array([params]), expert_params=np.array([experts]), dp=plan.dp,
                                cp=cp, tp=plan.tp, ep=ep, etp=etp, partition=names[i], one_node=one_node[i],
                                streams=min(plan.tp, site.partition(names[i]).gpus_per_node), first_stage=i == 0,
                                virtual_stages=plan.virtual_stages, overlap_grad_reduce=plan.overlap_grad_reduce,
                                overlap_param_gather=plan.overlap_param_gather, ddp_bucket_size=plan.ddp_bucket_size,
                                bucketing=(options or CostOptions()).ddp_bucketing)[0]

    def state_of(i: int, n: int, first: bool, last: bool, tp: int, gpu_type: str) -> tuple[int, int, int]:
        return stage_state(job, n, first=first, last=last, tp=tp, pp=plan.pp, dp=plan.dp, cp=cp, ep=ep, etp=etp,
                           gpu=site.gpu(gpu_type))

    per_node = [placement.component_of_stage(i).tasks_per_node for i in range(plan.pp)]
    need_extras = cp > 1 or ep > 1 or job.model.is_moe

    def extras_of(i: int, layer_fwd_ms: float) -> StageExtras:
        return stage_extras(lm, job, partition=names[i], tasks_per_node=per_node[i], tp=plan.tp, cp=cp, ep=ep,
                            etp=etp, micro_batch_size=plan.micro_batch_size, layer_fwd_ms=layer_fwd_ms,
                            host_us=host_us_per_op(cost_model))

    stages = []
    for i, s in enumerate(plan.stages):
        base, k = s.recompute.split(s.num_layers, f"stages[{i}].recompute")
        gpu = site.partition(s.partition).gpu_type
        stages.append((s.num_layers, base, k, [_Replica(gpu_type=gpu, tp=plan.tp, partition=s.partition)]))
    return _predict_from(site, job, cost_model.predict, cost_model.overhead_bytes,
                         micro_batch_size=plan.micro_batch_size, stages=stages, dp_per_stage=[plan.dp] * plan.pp,
                         link_ms=link_ms, sync_of=sync_of, tied_ms=tied_sync_ms(lm, job, plan.tp, plan.pp, names[0],
                                                                                names[-1]),
                         sequence_parallel=plan.sequence_parallel, options=options or CostOptions(),
                         memory_scale=memory_scale_of(cost_model, site), host_us=host_us_per_op(cost_model),
                         links=lm, virtual_stages=plan.virtual_stages, state_of=state_of, cp=cp,
                         extras_of=extras_of if need_extras else None,
                         vp_group=plan.microbatch_group_size_per_vp_stage)


def _check_general_fits(plan: GeneralPlan, site: Site, stages: list) -> None:
    """Refuse a general plan that needs more GPUs than its partitions (or the whole site) have,
    before any of its work: the schedule of a plan of 512 one-layer stages on a site of 6 GPUs
    took 2.9 GiB to evaluate for a plan that cannot run there."""
    total = sum(r.tp for _, _, _, reps in stages for r in reps)
    have = sum(p.total_gpus for p in site.partitions)
    if total > have:
        raise SpecError(f"the plan's {len(plan.stages)} stages need {total:,} GPUs (the sum of their replicas' "
                        f"TP); the site has {have:,}", field="stages", allowed=f"at most {have:,} GPUs")
    used: dict[str, int] = {}
    for _, _, _, reps in stages:
        for r in reps:
            if r.partition is not None:
                used[r.partition] = used.get(r.partition, 0) + r.tp
    for name, n in used.items():
        gpus = site.partition(name).total_gpus
        if n > gpus:
            raise SpecError(f"the plan places {n:,} GPUs on partition {name}, which has {gpus:,}",
                            field="stages", allowed=f"at most {gpus:,} GPUs of partition {name}")


def predict_general(plan: GeneralPlan, site: Site, job: TrainJob, cost_model, *,
                    options: CostOptions | None = None, links=None) -> Prediction:
    """Predict a general plan: per stage, data-parallel replicas with their own GPU type and TP.

    A stage's time is its slowest replica's; its gradient synchronisation runs over the
    slowest link among its replicas, moving the largest per-GPU shard (the replica with
    the smallest TP). A replica without a partition is placed on the first partition of
    its GPU type; when the site has none, its links are the site's inter-partition link.
    Stages with different replica counts process different numbers of micro-batches; the
    schedule is evaluated with the largest count and each stage's time scaled by its share.
    """
    stages = _general_stages(plan, site, job)
    _check_general_fits(plan, site, stages)
    lm = link_model_for(site, cost_model, links)
    link_ms, groups = _general_links(site, job, lm, stages, plan.micro_batch_size)

    def sync_of(i: int, params: float) -> np.ndarray:
        parts, one, streams = groups[i]
        return one_bucket_terms(dp_sync_ms(lm, job, dp=len(parts), params=params, partitions=parts, one_node=one,
                                           streams=streams))

    first, lastp = stages[0][3][0], stages[-1][3][0]
    return _predict_from(site, job, cost_model.predict, cost_model.overhead_bytes,
                         micro_batch_size=plan.micro_batch_size, stages=stages,
                         dp_per_stage=[len(s.replicas) for s in plan.stages], link_ms=link_ms, sync_of=sync_of,
                         tied_ms=tied_sync_ms(lm, job, first.tp, len(stages), first.partition, lastp.partition),
                         sequence_parallel=False, options=options or CostOptions(),
                         memory_scale=memory_scale_of(cost_model, site), host_us=host_us_per_op(cost_model),
                         links=lm)


def _general_stages(plan: GeneralPlan, site: Site, job: TrainJob) -> list:
    """Per stage of a general plan (layers, base mode, fully recomputed layers, replicas), each
    replica on its partition (or its GPU type's first) and synchronising the stage's largest
    shard; SpecError naming the field where a stage, GPU type, partition or TP is wrong."""
    if sum(s.num_layers for s in plan.stages) != job.model.num_layers:
        raise SpecError(f"stages hold {sum(s.num_layers for s in plan.stages)} layers, the model has "
                        f"{job.model.num_layers}", field="stages")
    stages = []
    for i, s in enumerate(plan.stages):
        reps = []
        for ri, r in enumerate(s.replicas):
            gpu = site.gpu(r.gpu_type).name if _known(site, r.gpu_type) else None
            if gpu is None:
                raise SpecError("unknown GPU type", field=f"stages[{i}].replicas[{ri}].gpu_type", found=r.gpu_type)
            part = r.partition
            if part is not None:
                try:
                    site.partition(part)
                except SpecError as e:
                    raise SpecError(e.detail, field=f"stages[{i}].replicas[{ri}].partition", found=part,
                                    allowed=e.allowed) from None
            else:
                part = next((p.name for p in site.partitions if site.gpu(p.gpu_type).name == gpu), None)
            heads = job.model.num_attention_heads
            if heads % r.tp:
                raise SpecError(f"tp {r.tp} does not divide the {heads} attention heads",
                                field=f"stages[{i}].replicas[{ri}].tp", found=r.tp)
            reps.append(_Replica(gpu_type=r.gpu_type, tp=r.tp, partition=part))
        # the largest shard (smallest TP) bottlenecks the DP ring: every replica moves it
        tmin = min(r.tp for r in reps)
        reps = [_Replica(gpu_type=r.gpu_type, tp=r.tp, partition=r.partition, sync_tp=tmin) for r in reps]
        base, k = s.recompute.split(s.num_layers, f"stages[{i}].recompute")
        stages.append((s.num_layers, base, k, reps))
    return stages


def _general_links(site: Site, job: TrainJob, lm, stages: list,
                   micro_batch_size: int) -> tuple[list[float], list[tuple[list, bool, int]]]:
    """A general plan's links: the slowest send across each stage boundary, and per stage its
    DP group (partitions, on one node, streams), with the replicas packed onto their
    partition's GPUs in stage order, ``tp`` GPUs each."""
    used: dict[str, int] = {}
    slots: list[list[int | None]] = []
    for _, _, _, reps in stages:
        row: list[int | None] = []
        for r in reps:
            if r.partition is None:
                row.append(None)
                continue
            row.append(used.get(r.partition, 0))
            used[r.partition] = used.get(r.partition, 0) + r.tp
        slots.append(row)

    def node(part: str | None, slot: int | None) -> int | None:
        return None if part is None or slot is None else slot // site.partition(part).gpus_per_node

    link_ms = []
    for i in range(len(stages) - 1):
        cur, nxt = stages[i][3], stages[i + 1][3]
        worst = 0.0
        for j, r in enumerate(cur):  # replica j sends to replica j mod d of the next stage
            k = j % len(nxt)
            peer = nxt[k]
            same = (r.partition is not None and r.partition == peer.partition
                    and node(r.partition, slots[i][j]) == node(peer.partition, slots[i + 1][k]))
            worst = max(worst, send_ms(lm, job, micro_batch_size=micro_batch_size, tp=r.tp,
                                       sequence_parallel=False, a=r.partition, b=peer.partition, same_node=same))
        link_ms.append(worst)
    groups = []
    for i, (_, _, _, reps) in enumerate(stages):
        parts = [r.partition for r in reps]
        nodes = {(r.partition, node(r.partition, slots[i][j])) for j, r in enumerate(reps)}
        last = (reps[-1].partition, node(reps[-1].partition, (slots[i][-1] or 0) + reps[-1].tp - 1))
        one = None not in parts and len(nodes | {last}) == 1
        streams = min(min(r.tp for r in reps), min(site.partition(p).gpus_per_node for p in parts if p) if any(parts)
                      else 1)
        groups.append((parts, one, streams))
    return link_ms, groups


def _known(site: Site, name: str) -> bool:
    try:
        site.gpu(name)
        return True
    except SpecError:
        return False


__all__ = ["Block", "BlockCost", "Composer", "CompositionInputs", "Layout", "CostOptions", "Prediction",
           "Predictions", "StagePrediction", "predict_general", "predict_plan", "required_queries", "stage_time_ms",
           # re-exported for tests and benchmarks
           "TP_COLLECTIVE_UNITS", "context_queries", "fp8_state_bytes", "in_flight_heads", "in_flight_units",
           "interleaved_finish", "layer_query", "link_model_for", "logits_transient_bytes", "memory_scale_of",
           "p2p_bytes", "shape_of", "stage_activation_bytes", "stage_extras", "stage_layout", "sync_ms_per_param",
           "tp_internode_ms"]
