"""The space of plans Megatron-LM can run on a site, enumerated by index.

A plan is a *skeleton* (TP, DP, micro-batch, and an ordered sequence of partition
groups, each hosting one or more consecutive pipeline stages) times a *layer split*
times a *recompute assignment*:

* **Skeletons.** TP is a power of two that divides the attention heads, the query
  groups and the FFN width (Megatron shards all three by TP). DP divides
  ``global_batch / micro_batch``. Partition groups are ordered sequences of distinct
  partitions (stage order matters: in 1F1B the first stage holds the most in-flight
  micro-batches); a group of ``s`` stages is one hetjob component of ``s * tp * dp``
  ranks, and it must fit its partition by the one rule of :mod:`memx_hpc.placement`
  (whole nodes, evenly spread, TP groups inside a node).
* **Layer splits** (``layer_granularity`` = g). Each group's total layer count is a
  multiple of g (the last group also takes ``num_layers % g``); inside a group the
  layers are split as evenly as possible, the remainder going to the group's later
  stages (they hold fewer in-flight micro-batches). With ``split_within_groups`` every
  stage's count is on the g grid instead (all compositions; larger). A group split of
  ``u = num_layers // g`` units over G groups gives C(u-1, G-1) splits, so the count is
  set by g, not by how uneven a split may be.
* **Sequence parallel** (``sequence_parallel``, searched by default): every layout with
  TP > 1 comes with and without it (Megatron-LM's ``--sequence-parallel``: activations
  outside the TP-split matmuls divided by TP, the TP all-reduces replaced by all-gather +
  reduce-scatter of the same volume, stage-to-stage sends of ``1/TP``), so the count of
  such layouts doubles; TP 1 has none.
* **Virtual pipeline stages** (interleaved 1F1B, Megatron's virtual pipeline): every
  layout of ``pp >= 2`` stages whose micro-batches per iteration are a multiple of ``pp``
  (the interleaved schedule's groups) comes with ``v`` model chunks per stage for each
  candidate ``v`` (:meth:`PlanSpace.vp_candidates`: the job's / site's ``virtual_stages``,
  else 1, 2 and 4), on uniform and uneven layer splits alike (the rendered pipeline layout
  carries each stage's chunks), for the splits whose every stage has at least ``v``
  layers. Full recompute of part of a stage is not combined with ``v > 1`` (Megatron would
  recompute ``k`` layers of each chunk): such layouts take the levels none, selective and full.
* **Context parallel** (ring attention): CP degrees ``c`` (:meth:`PlanSpace.cp_candidates`:
  the job's / site's ``context_parallel_sizes``, else powers of two with ``seq_length`` a
  multiple of ``2c`` and at least :data:`CP_MIN_TOKENS` tokens per rank) widen each stage
  to ``tp x c x dp`` ranks. Only on partitions that train with Transformer Engine
  (megatron-core's local attention has no context parallel).
* **Expert parallel** (MoE models only): per layout, every ``(ep, etp)`` with ``ep``
  dividing the experts and ``etp x ep`` the stage's ``tp x c x dp`` ranks
  (:meth:`PlanSpace.expert_choices`; expert TP: TP's, and 1 when TP > 1).
* **Distributed optimizer** (a job's ``distributed_optimizer: both``): every layout whose
  ``dp x cp`` ranks could share the optimizer states comes with and without it.
* **Performance options** (not searched: set per layout): Megatron-LM's
  ``--overlap-grad-reduce``, and ``--overlap-param-gather`` with the distributed optimizer, are
  on wherever the launched entry runs them (:func:`memx_hpc.slurm.cmdline.performance_options`:
  Megatron-LM's ``pretrain_gpt.py`` on GPUs; not the project's entry, not CPU devices), as
  production recipes run them; ``SpaceOptions.overlap`` False turns them off everywhere.
* Cross-vendor layouts run the project's megatron-core entry, which takes the degrees
  :data:`memx_hpc.slurm.cmdline.PROJECT_ENTRY_DEGREES` names (today virtual stages: its
  interleaved schedule over the cross-vendor pipeline group; CP: ring attention inside each
  stage; EP). CP and EP groups never leave a stage, so never a partition nor a vendor: the group
  rule (:mod:`memx_hpc.slurm.groups`) gives them their vendor's library. An FP8 job keeps to one
  vendor (:meth:`PlanSpace.cross_vendor_note`: the entry has no FP8 path).
* **Narrowing.** A job's or site's ``virtual_stages`` / ``context_parallel_sizes`` /
  ``expert_parallel_sizes`` are honoured by every plan: a layout that cannot take a listed
  degree (one stage where the list leaves out 1; cross-vendor where the entry cannot) is left
  out, never given 1 instead, and a space left empty says which field and why (:meth:`why_empty`).
* **Recompute.** Each stage gets its own level from ``none < selective < full on
  k = ceil(n_max*j/steps) layers`` (j = 1..steps; n_max the largest stage of its
  partition group, a stage recomputing min(k, n): one ``--recompute-num-layers`` per
  hetjob component, see :class:`~memx_hpc.spec.Recompute.Level`), restricted to the modes the job allows —
  heterogeneous recomputation: memory-poor partitions recompute while memory-rich ones
  do not. Within one
  partition group the levels never increase along the pipeline: the group's stages run
  on identical GPUs with (nearly) equal layers, and an earlier stage holds at least as
  many in-flight micro-batches (``min(p - i, m)``), so recomputing more on a later
  stage than on an earlier one of the same group never lowers the peak memory and
  costs the same time. ``recompute_spread`` bounds how far a group's levels may differ
  (default 0: one level per group, which keeps the space at C(u-1, G-1) x R^G plans per
  skeleton for R levels and G groups).

Enumeration is deterministic and needs no materialised list of plans: ``len(space)``
is computed from closed-form counts, and any index range can be decoded on its own
(``iter_range``, ``decode``), so MPI ranks split the space without talking.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..errors import SpecError
from ..model.compose import Block, CompositionInputs, Layout
from .. import placement
from ..placement import comm_vendor, group_fits, place_groups, site_facts
from ..slurm.cmdline import cross_vendor_refusal, performance_options
from ..spec import Plan, Recompute, Site, Stage, TrainJob

#: The fewest tokens per rank at which context parallel is searched by default: below it
#: the ring's K/V blocks are too small to hide behind attention (Megatron-LM's long-context
#: recipes start CP at 8k-token sequences, CP 2). A job or site naming its
#: ``context_parallel_sizes`` searches exactly those.
CP_MIN_TOKENS = 4096
#: Virtual stages per pipeline rank searched when neither the job nor the site names them.
DEFAULT_VIRTUAL_STAGES = (1, 2, 4)


@dataclass(frozen=True, kw_only=True)
class SpaceOptions:
    """Knobs that set the size of the space (see the module docstring).

    ``layer_granularity`` None: ``max(1, num_layers // 8)``, so a group split has at most
    8 units (on the 20-GPU example site a grid of 8 layers loses 15-25 % in score against
    4 or 2, and 2 finds nothing better than 4). ``max_pipeline_stages`` None: the job's
    limit, else ``min(num_layers, 4)``. ``tp_degrees`` / ``micro_batch_sizes`` empty: powers
    of two / the job's candidates (every power of two dividing the global batch up to 16
    when the job names none). ``recompute_spread``: how far the levels of one partition
    group's stages may differ (0: one level per group; None: any non-increasing
    sequence; values above 0 give plans whose stages on one partition recompute
    differently — predicted as such, but a hetjob component takes one recompute setting,
    so they are for comparison, not for rendering). ``selective_with_sdpa``: with fused
    attention (the job's ``attention: sdpa``) selective recompute repeats the attention
    kernel but saves only its per-head log-sum-exp statistics (``4·a·s·b`` bytes per layer, Korthikanti et al. 2022 as
    generalised in :mod:`memx_hpc.model.analytic`), so it is dominated by ``none`` and
    left out unless this is set.
    """

    layer_granularity: int | None = None
    max_pipeline_stages: int | None = None
    tp_degrees: tuple[int, ...] = ()
    micro_batch_sizes: tuple[int, ...] = ()
    full_recompute_steps: int = 2
    recompute_spread: int | None = 0
    selective_with_sdpa: bool = False
    split_within_groups: bool = False
    #: None: searched (every TP > 1 layout with and without); True: on wherever TP > 1; False: off
    sequence_parallel: bool | None = None
    #: also place TP groups over whole nodes (TP a multiple of a partition's GPUs per node;
    #: their collectives cross the inter-node link). Off by default: the space stays what it
    #: was (TP inside a node), since over slower links such groups rarely win and every
    #: multi-node partition would add layouts; ``--tp-across-nodes`` (with ``--tp`` for degrees
    #: above the largest node) asks for them.
    tp_across_nodes: bool = False
    max_partitions: int | None = None
    #: only plans whose partitions all speak one vendor's collectives: what the planner asks
    #: for when a cross-vendor plan could not launch for this job and site (the project's
    #: entry cannot build the job's tokenizer, or the site names no cross-vendor backend)
    single_vendor: bool = False
    #: Refuse a space of more plans, or of more skeletons (the part held in memory), than
    #: this instead of exhausting time or memory (see :func:`space_size`).
    max_plans: int = 200_000_000
    max_skeletons: int = 1_000_000
    #: Megatron-LM's gradient-reduce and parameter-gather overlap on every plan whose launch runs
    #: them (the default, as production recipes); False: off on every plan (``--no-overlap``)
    overlap: bool = True

    def __post_init__(self) -> None:
        for name in ("layer_granularity", "max_pipeline_stages", "max_partitions", "max_plans", "max_skeletons"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise SpecError(f"{name} must be a whole number >= 1", field=name, found=v)
        if self.recompute_spread is not None and (not isinstance(self.recompute_spread, int)
                                                  or self.recompute_spread < 0):
            raise SpecError("must be a whole number >= 0", field="recompute_spread", found=self.recompute_spread)
        for name in ("tp_across_nodes", "overlap"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError("expected true or false", field=name, found=getattr(self, name))
        if self.sequence_parallel not in (None, True, False):
            raise SpecError("expected true, false or none (searched)", field="sequence_parallel",
                            found=self.sequence_parallel)
        if not isinstance(self.full_recompute_steps, int) or self.full_recompute_steps < 1:
            raise SpecError("must be a whole number >= 1", field="full_recompute_steps",
                            found=self.full_recompute_steps)
        for name in ("tp_degrees", "micro_batch_sizes"):
            for v in getattr(self, name):
                if not isinstance(v, int) or v < 1:
                    raise SpecError("expected whole numbers >= 1", field=name, found=getattr(self, name))


def recompute_levels(job: TrainJob, steps: int, *, selective_with_sdpa: bool = False) -> tuple[Recompute.Level, ...]:
    """Levels ordered by memory saved (and time spent): none < selective < full fractions.

    Selective is left out under fused attention unless asked for (see SpaceOptions) or named
    in the job's ``recompute_modes``, and kept when it is the only mode the job allows
    besides full.
    """
    out = []
    if "none" in job.recompute_modes:
        out.append(Recompute.Level(base="none", full_fraction=0.0))
    dominated = (job.attention == "sdpa" and not selective_with_sdpa and not job.recompute_modes_given
                 and "none" in job.recompute_modes)
    if "selective" in job.recompute_modes and not dominated:
        out.append(Recompute.Level(base="selective", full_fraction=0.0))
    if "full" in job.recompute_modes:
        out += [Recompute.Level(base="none", full_fraction=j / steps) for j in range(1, steps + 1)]
    if not out:
        raise SpecError("no recompute mode allowed", field="recompute_modes", found=list(job.recompute_modes),
                        allowed="none, selective, full")
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class Skeleton:
    """TP, DP, micro-batch and the ordered partition groups ``((partition index, stages), ...)``."""

    tp: int
    dp: int
    micro_batch_size: int
    groups: tuple[tuple[int, int], ...]
    sequence_parallel: bool = False
    vp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    distributed_optimizer: bool | None = None  # None: the job's
    #: Megatron-LM's performance options of the layout's plans (Plan fields of the same names)
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False

    @property
    def pp(self) -> int:
        return sum(s for _, s in self.groups)

    @property
    def structure(self) -> tuple[int, ...]:
        return tuple(s for _, s in self.groups)

    def stage_partitions(self) -> list[int]:
        return [p for p, s in self.groups for _ in range(s)]


def _powers_of_two(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def _compositions(total: int, lows: list[int]) -> list[tuple[int, ...]]:
    """All (x_1..x_G) with x_i >= lows[i] and sum == total, in lexicographic order."""
    out: list[tuple[int, ...]] = []

    def rec(i: int, left: int, acc: list[int]) -> None:
        if i == len(lows) - 1:
            if left >= lows[i]:
                out.append(tuple(acc + [left]))
            return
        rest = sum(lows[i + 1:])
        for x in range(lows[i], left - rest + 1):
            rec(i + 1, left - x, acc + [x])

    if sum(lows) <= total:
        rec(0, total, [])
    return out


class PlanSpace:
    """Every plan of ``job`` on ``site`` that the options allow, by index (see module doc).

    Construction enumerates skeletons only (thousands, not plans); plans are decoded
    from indices on demand.
    """

    def __init__(self, site: Site, job: TrainJob, options: SpaceOptions | None = None) -> None:
        self.site = site
        self.job = job
        self.options = options = options or SpaceOptions()
        model = job.model
        L = model.num_layers
        self.granularity = options.layer_granularity or max(1, L // 8)
        if self.granularity > L:
            raise SpecError(f"larger than the model's {L} layers", field="layer_granularity",
                            found=self.granularity)
        limit = options.max_pipeline_stages or job.max_pipeline_stages or min(L, 4)
        self.max_stages = min(limit, L)
        self.levels = recompute_levels(job, options.full_recompute_steps,
                                       selective_with_sdpa=options.selective_with_sdpa)
        self.partitions = site.partitions
        self._room: dict[tuple[int, int, int], dict[int, list[int]]] = {}
        self._te: set[int] | None = None
        self._vendor = [comm_vendor(site, p) for p in site.partitions]
        self._perf: dict[tuple, dict[str, bool]] = {}
        self.size = space_size(self)
        self.size.check(self)
        self._split_tables: dict[tuple[int, ...], np.ndarray] = {}
        self._gmax_tables: dict[tuple[int, ...], np.ndarray] = {}
        self._level_tables: dict[tuple[int, ...], np.ndarray] = {}
        self.skeletons = self._enumerate_skeletons()
        counts = np.array([self._count(sk) for sk in self.skeletons], dtype=np.int64)
        self._counts = counts
        self._ends = np.cumsum(counts) if len(counts) else np.zeros(0, dtype=np.int64)
        self._starts = self._ends - counts
        # Flat per-skeleton descriptors for vectorised decoding.
        self._nlev = np.array([len(self._level_table(sk.structure, sk.vp)) for sk in self.skeletons], dtype=np.int64)
        self.max_pp = max((sk.pp for sk in self.skeletons), default=1)
        self._inputs: CompositionInputs | None = None

    def why_empty(self) -> tuple[str, str]:
        """Why the space holds no plan: (the option or job field to change, the reason in
        words naming the constraint that removed every candidate). Meaningful when empty."""
        m, o = self.job.model, self.options
        asked = tuple(sorted(set(o.tp_degrees))) if o.tp_degrees else None
        tps = self.tp_candidates()
        if not tps:
            if asked is None:
                return "model", "no power-of-two TP degree divides the attention heads, query groups and FFN width"
            bad = []
            for t in asked:
                which = [n for n, v in (("attention heads", m.num_attention_heads),
                                        ("query groups", m.num_query_groups), ("FFN width", m.ffn_hidden_size))
                         if v % t]
                bad.append(f"TP {t} does not divide the {', '.join(which)} ({m.num_attention_heads} heads, "
                           f"{m.num_query_groups} query groups, FFN {m.ffn_hidden_size})")
            return "--tp", "; ".join(bad)
        if self.job.fp8 and not any(self.site.gpu(p.gpu_type).peak_tflops_fp8 > 0 for p in self.partitions):
            types = sorted({p.gpu_type for p in self.partitions})
            return "fp8", (f"the job asks for FP8 (fp8: {self.job.fp8}) and no partition's GPU has FP8 units "
                           f"({', '.join(types)}: no fp8 rate in the catalog)")
        mbs = self.micro_batch_candidates()
        if not mbs:
            asked_mbs = o.micro_batch_sizes or self.job.micro_batch_sizes
            return ("--micro-batch-sizes" if o.micro_batch_sizes else "micro_batch_sizes",
                    f"no micro-batch size {list(asked_mbs)} divides the global batch {self.job.global_batch_size}")
        placed = [t for t in tps if any(self.tp_placeable(p, t) for p in self.partitions)]
        if not placed:
            per_node = sorted({p.gpus_per_node for p in self.partitions})
            if not o.tp_across_nodes and any(placement.tp_placeable(p, t) for t in tps for p in self.partitions):
                return ("--tp-across-nodes",
                        f"TP {', '.join(map(str, tps))} exceeds every partition's GPUs per node "
                        f"({', '.join(map(str, per_node))}); a TP group over whole nodes is searched only with "
                        f"--tp-across-nodes")
            return ("--tp" if asked else "partitions",
                    f"TP {', '.join(map(str, tps))} exceeds every partition's GPUs per node "
                    f"({', '.join(map(str, per_node))}) and is not a multiple of them (a TP group stays inside a "
                    f"node or spans whole nodes)")
        big = max(p.total_gpus for p in self.partitions)
        if all(t > big for t in placed):
            return ("--tp" if asked else "partitions",
                    f"TP {', '.join(map(str, placed))} needs that many GPUs of one partition; the largest has {big}")
        degree = self._why_no_degree()
        if degree is not None:
            return degree
        return ("--max-stages",
                f"no pipeline layout: with at most {self.max_stages} stages, layer grid {self.granularity} and "
                f"{len(self.partitions)} partition(s), no split of the {m.num_layers} layers fits the GPUs "
                f"(TP {', '.join(map(str, placed))}, micro-batch {', '.join(map(str, mbs))})")

    def _why_no_degree(self) -> tuple[str, str] | None:
        """The context- or expert-parallel constraint that left no layout (``why_empty``'s
        form), or None when neither did."""
        for name in ("context_parallel_sizes", "expert_parallel_sizes", "expert_tensor_parallel_sizes"):
            site_v, job_v = getattr(self.site, name), getattr(self.job, name)
            if site_v and job_v and not set(site_v) & set(job_v):
                if name != "context_parallel_sizes" and not self.job.model.is_moe:
                    continue
                return name, (f"the job's {name} {list(job_v)} and the site's {list(site_v)} share no value: "
                              f"the search takes the degrees both allow")
        cps = self.cp_candidates()
        whose = "job's" if self.job.context_parallel_sizes else "site's"
        if not cps:
            given = list(self._allowed("context_parallel_sizes", ()))
            s = self.job.model.seq_length
            if self.job.attention == "core":
                return "context_parallel_sizes", (f"the {whose} context_parallel_sizes {given} leave out 1, and "
                                                  f"context parallel needs fused attention (the job's attention is "
                                                  f"core)")
            return "context_parallel_sizes", (f"the {whose} context_parallel_sizes {given} leave out 1, and "
                                              f"seq_length {s} is not a multiple of 2 x any of them (ring "
                                              f"attention splits the sequence into 2 x CP chunks)")
        if 1 not in cps and not self._te_partitions():
            names = " or ".join(p.name for p in self.partitions)
            impls = ", ".join(f"{p.name}: {p.transformer_impl_for(self.site.gpu(p.gpu_type).vendor)}"
                              for p in self.partitions)
            return "context_parallel_sizes", (f"the {whose} context_parallel_sizes {cps} need transformer_impl "
                                              f"transformer_engine on partition {names} (it trains with {impls}; "
                                              f"megatron-core's local attention has no context parallel)")
        # a narrowing that leaves out 1 is honoured or refused, never dropped: say why nothing takes it
        cross = [] if self.single_vendor() or len(set(self._vendor)) < 2 else [
            r.reason for r in (cross_vendor_refusal("virtual_stages", 2),) if r is not None]
        vps = self.vp_candidates()
        if vps and 1 not in vps:
            whose = "job's" if self.job.virtual_stages else "site's"
            return "virtual_stages", (
                f"the {whose} virtual_stages {vps} leave out 1, and no layout takes them: interleaving needs at "
                f"least 2 pipeline stages of at least v layers each, and micro-batches per iteration (global batch "
                f"{self.job.global_batch_size} / (micro-batch x DP)) a multiple of the stages"
                + (f"; cross-vendor plans cannot take them ({'; '.join(cross)})" if cross else "")
                + "; add 1 to the list to allow plans without interleaving")
        if 1 not in cps and len(set(self._vendor)) > 1 and not self.single_vendor() \
                and not all(self.cross_vendor_cp(c) for c in cps):
            why = cross_vendor_refusal("cp", max(cps))
            return "context_parallel_sizes", (
                f"the {whose} context_parallel_sizes {cps} leave out 1, and no layout takes them: each stage's "
                f"TP x CP x DP ranks must fit one partition that trains with Transformer Engine"
                + (f"; cross-vendor plans cannot take them ({why.reason})" if why else ""))
        return None

    # ------------------------------------------------------------------ candidates

    def tp_candidates(self) -> list[int]:
        m = self.job.model
        tps = self.options.tp_degrees or tuple(_powers_of_two(max(p.gpus_per_node for p in self.partitions)))
        return [t for t in sorted(set(tps))
                if m.num_attention_heads % t == 0 and m.num_query_groups % t == 0 and m.ffn_hidden_size % t == 0]

    def micro_batch_candidates(self) -> list[int]:
        gbs = self.job.global_batch_size
        mbs = self.options.micro_batch_sizes or self.job.micro_batch_sizes or tuple(
            b for b in _powers_of_two(16) if gbs % b == 0)
        return sorted(b for b in set(mbs) if gbs % b == 0)

    def _dp_candidates(self, mbs: int) -> list[int]:
        n = self.job.global_batch_size // mbs
        return [d for d in range(1, n + 1) if n % d == 0]

    def _allowed(self, name: str, default: tuple[int, ...]) -> tuple[int, ...]:
        """The degrees of ``name`` (a :data:`~memx_hpc.spec.DEGREE_KEYS` list) the job and the site
        allow: both lists' common values where both give one, else the one given, else ``default``."""
        lists = [tuple(getattr(x, name)) for x in (self.site, self.job) if getattr(x, name)]
        if not lists:
            return default
        out = set(lists[0])
        for extra in lists[1:]:
            out &= set(extra)
        return tuple(sorted(out))

    def cp_candidates(self) -> list[int]:
        """Context-parallel degrees: the job's / site's list (sizes Megatron-LM cannot run for
        this sequence left out), else 1 and the powers of two ``c`` with ``seq_length`` a multiple
        of ``2c`` and at least :data:`CP_MIN_TOKENS` tokens per rank. Fused attention only."""
        s = self.job.model.seq_length
        given = self._allowed("context_parallel_sizes", ())
        if given:
            cands = [c for c in given if c == 1 or s % (2 * c) == 0]
        else:
            cands = [c for c in _powers_of_two(s) if c == 1 or (s % (2 * c) == 0 and s // c >= CP_MIN_TOKENS)]
        if self.job.attention == "core":
            cands = [c for c in cands if c == 1]
        return cands

    def vp_candidates(self) -> list[int]:
        """Virtual stages per pipeline rank: the job's / site's ``virtual_stages``, else
        :data:`DEFAULT_VIRTUAL_STAGES` (1 always among them unless a list leaves it out)."""
        return [v for v in self._allowed("virtual_stages", DEFAULT_VIRTUAL_STAGES) if v <= self.job.model.num_layers]

    def expert_choices(self, tp: int, cp: int, dp: int) -> list[tuple[int, int | None]]:
        """``(ep, etp)`` of an MoE model's experts on stages of ``tp x cp x dp`` ranks (etp None:
        TP's): EP divides the experts and ``etp x ep`` the stage's ranks. Dense: ``[(1, None)]``."""
        m = self.job.model
        if not m.is_moe:
            return [(1, None)]
        width = tp * cp * dp
        eps = self._allowed("expert_parallel_sizes", tuple(e for e in range(1, m.num_experts + 1)
                                                           if m.num_experts % e == 0))
        etps = self._allowed("expert_tensor_parallel_sizes", ())
        etp_opts: list[int | None] = ([None if e == tp else e for e in etps] if etps
                                      else ([None, 1] if tp > 1 else [None]))
        out = []
        for ep in eps:
            for etp in etp_opts:
                et = tp if etp is None else etp
                if m.num_experts % ep == 0 and width % (et * ep) == 0 and m.expert_ffn_hidden_size % et == 0:
                    out.append((ep, etp))
        return out

    def _te_partitions(self) -> set[int]:
        """Partitions that train with Transformer Engine (what context parallel needs)."""
        if self._te is None:
            self._te = {i for i, p in enumerate(self.partitions)
                        if p.transformer_impl_for(self.site.gpu(p.gpu_type).vendor) == "transformer_engine"}
        return self._te

    def room(self, tp: int, dp: int, cp: int = 1) -> dict[int, list[int]]:
        """Per partition index, the stage counts a partition group of ``tp x cp x dp`` stages can
        have there (the one fit rule, :func:`memx_hpc.placement.group_fits`); partitions with
        none are left out, and with ``cp > 1`` those without Transformer Engine."""
        key = (tp, dp, cp)
        r = self._room.get(key)
        if r is None:
            r = {}
            for i, p in enumerate(self.partitions):
                if not self.tp_placeable(p, tp):
                    continue
                if cp > 1 and i not in self._te_partitions():
                    continue
                sizes = [s for s in range(1, self.max_stages + 1) if group_fits(p, s, tp=tp, dp=dp, cp=cp)]
                if sizes:
                    r[i] = sizes
            self._room[key] = r
        return r

    def tp_placeable(self, partition, tp: int) -> bool:
        """Whether this space places TP groups of ``tp`` on ``partition``: inside a node, or
        over whole nodes where :attr:`SpaceOptions.tp_across_nodes` asks for it. A job with FP8
        runs only on partitions whose GPU has FP8 units."""
        if self.job.fp8 and self.site.gpu(partition.gpu_type).peak_tflops_fp8 <= 0:
            return False
        return placement.tp_placeable(partition, tp, across_nodes=self.options.tp_across_nodes)

    def distributed_optimizer_choices(self, shards: int) -> tuple[bool | None, ...]:
        """With and without Megatron-LM's distributed optimizer where the job says ``both`` and
        ``shards`` (``dp x cp``) ranks share the optimizer states; else the job's (None)."""
        if self.job.distributed_optimizer_searched and shards > 1:
            return (True, False)
        return (None,)

    def vp_choices(self, pp: int, num_microbatches: int, cross_vendor: bool) -> list[int]:
        """The virtual stages a layout of ``pp`` stages may take: the candidates with ``pp >= 2``
        and micro-batches in whole groups of ``pp`` (across vendors only where the project's
        entry runs interleaving), else 1 -- unless the job's or site's ``virtual_stages`` leave 1
        out: then such a layout takes none (is not searched), never 1 in the list's place."""
        cands = self.vp_candidates()
        if pp < 2 or num_microbatches % pp or (cross_vendor and cross_vendor_refusal("virtual_stages", 2)):
            return [1] if 1 in cands else []
        return cands

    def single_vendor(self) -> bool:
        """Whether only plans inside one vendor are searched: asked for (:attr:`SpaceOptions.single_vendor`),
        or the job trains in FP8 (:meth:`cross_vendor_note` says why)."""
        return self.options.single_vendor or bool(self.job.fp8)

    def cross_vendor_note(self) -> str | None:
        """Why this job's cross-vendor plans are left out of the space although the site has
        partitions of two vendors, or None. FP8: Megatron-LM runs FP8 GEMMs through Transformer
        Engine, and a cross-vendor plan's ranks run the project's megatron-core entry, which has
        no FP8 path (``render`` refuses such a plan: :func:`memx_hpc.slurm.render.fp8_refusal`)."""
        if not self.job.fp8 or self.options.single_vendor or len(set(self._vendor)) < 2:
            return None
        return (f"cross-vendor plans left out of the search: the job trains in FP8 (fp8: {self.job.fp8}), and plans "
                f"spanning vendors run the project's megatron-core entry, which has no FP8 path (Megatron-LM runs "
                f"FP8 GEMMs through Transformer Engine only in its own pretrain_gpt.py); 'fp8: none' searches them")

    def cross_vendor_cp(self, cp: int) -> bool:
        """Whether a cross-vendor layout may take context-parallel degree ``cp`` (its CP groups
        stay inside each stage's partition; the project's entry must build them)."""
        return cp == 1 or cross_vendor_refusal("cp", cp) is None

    def _partition_sequences(self, tp: int) -> list[tuple[int, ...]]:
        usable = [i for i, p in enumerate(self.partitions) if self.tp_placeable(p, tp)]
        most = min(len(usable), self.options.max_partitions or len(usable), self.max_stages)
        out = []
        for g in range(1, most + 1):
            out += list(itertools.permutations(usable, g))
        if self.single_vendor():
            out = [seq for seq in out if len({self._vendor[i] for i in seq}) == 1]
        return out

    def sequence_parallel_choices(self, tp: int) -> tuple[bool, ...]:
        """Sequence parallel off and/or on for layouts of TP degree ``tp`` (only off at TP 1:
        it splits along the TP group)."""
        o = self.options.sequence_parallel
        if tp == 1 or o is False:
            return (False,)
        return (True,) if o else (False, True)

    def layout_degrees(self) -> Iterator[tuple[int, int, int, int, dict[int, list[int]], int]]:
        """``(tp, cp, micro-batch, dp, room, micro-batches per iteration)`` of every degree
        combination some partition has room for (:meth:`room`), in enumeration order: the one
        loop that both the skeletons and their count (:func:`space_size`) walk."""
        for tp in self.tp_candidates():
            for cp in self.cp_candidates():
                for mbs in self.micro_batch_candidates():
                    for dp in self._dp_candidates(mbs):
                        room = self.room(tp, dp, cp)
                        if room:
                            yield tp, cp, mbs, dp, room, self.job.global_batch_size // (mbs * dp)

    def _enumerate_skeletons(self) -> list[Skeleton]:
        out: list[Skeleton] = []
        seqs_of: dict[int, list[tuple[int, ...]]] = {}
        for tp, cp, mbs, dp, room, m in self.layout_degrees():
            if tp not in seqs_of:
                seqs_of[tp] = self._partition_sequences(tp)
            sps = self.sequence_parallel_choices(tp)
            experts = self.expert_choices(tp, cp, dp)
            dopts = self.distributed_optimizer_choices(dp * cp)
            for seq in seqs_of[tp]:
                ranges = [room.get(i, ()) for i in seq]
                if any(len(r) == 0 for r in ranges):
                    continue
                cross = len({self._vendor[i] for i in seq}) > 1
                if cross and not self.cross_vendor_cp(cp):
                    continue
                for counts in itertools.product(*ranges):
                    pp = sum(counts)
                    if pp > self.max_stages:
                        continue
                    structure = tuple(counts)
                    groups = tuple(zip(seq, counts))
                    vps = [v for v in self.vp_choices(pp, m, cross) if len(self._split_table(structure, v))]
                    perf = {do: self._performance(seq, cross, do) for do in dopts}
                    out += [Skeleton(tp=tp, dp=dp, micro_batch_size=mbs, groups=groups, sequence_parallel=sp, vp=v,
                                     cp=cp, ep=ep, etp=etp, distributed_optimizer=do, **perf[do])
                            for sp in sps for v in vps for ep, etp in experts for do in dopts]
        return out

    def _performance(self, seq: tuple[int, ...], cross: bool, distributed_optimizer: bool | None) -> dict[str, bool]:
        """The performance options of plans on the partitions ``seq`` (one rule with render's)."""
        key = (seq, cross, distributed_optimizer)
        got = self._perf.get(key)
        if got is None:
            got = self._perf[key] = performance_options(
                self.site, [self.partitions[i].name for i in seq], self.job, cross_vendor=cross,
                distributed_optimizer=distributed_optimizer, wanted=self.options.overlap)
        return got

    # ------------------------------------------------------------------ splits and levels

    def _split_table(self, structure: tuple[int, ...], vp: int = 1) -> np.ndarray:
        """(n_splits, pp) layers per stage for a group structure ``(s_1, ..., s_G)`` whose
        stages hold at least ``vp`` layers each (one per model chunk)."""
        t = self._split_tables.get((structure, vp))
        if t is not None:
            return t
        g = self.granularity
        u, r, lows = self._split_lows(structure, vp)
        pp = sum(structure)
        rows: list[list[int]] = []
        if self.options.split_within_groups:
            for comp in _compositions(u, lows):
                row = [c * g for c in comp]
                row[-1] += r
                if row[-1] >= vp:
                    rows.append(row)
        else:
            for comp in _compositions(u, lows):
                totals = [c * g for c in comp]
                totals[-1] += r
                row: list[int] = []
                for n, s in zip(totals, structure):
                    base, rem = divmod(n, s)
                    row += [base + (1 if i >= s - rem else 0) for i in range(s)]
                if min(row) >= vp:
                    rows.append(row)
        t = np.array(rows, dtype=np.int32).reshape(len(rows), pp)
        self._split_tables[(structure, vp)] = t
        return t

    def _split_lows(self, structure: tuple[int, ...], vp: int = 1) -> tuple[int, int, list[int]]:
        """``(units, remainder, lowest units per part)`` of a layer split: ``units`` grid steps of
        ``granularity`` layers go to the parts (groups, or stages with ``split_within_groups``),
        each at least its low, and the last part also takes the ``remainder`` layers. Every
        stage holds at least ``vp`` layers (a group of ``s`` stages, split evenly, ``vp * s``)."""
        L, g = self.job.model.num_layers, self.granularity
        u, r = divmod(L, g)
        if self.options.split_within_groups:
            # every stage on the grid; the last stage also takes the remainder
            pp = sum(structure)
            return u, r, [max(1, math.ceil(vp / g))] * (pp - 1) + [max(1, math.ceil((vp - r) / g))]
        return u, r, [math.ceil(vp * s / g) for s in structure[:-1]] + [max(0, math.ceil((vp * structure[-1] - r) / g))]

    def _group_max_table(self, structure: tuple[int, ...], vp: int = 1) -> np.ndarray:
        """(n_splits, pp): per stage, the largest stage of its partition group."""
        t = self._gmax_tables.get((structure, vp))
        if t is None:
            split = self._split_table(structure, vp)
            t = np.empty_like(split)
            a = 0
            for n in structure:
                t[:, a:a + n] = split[:, a:a + n].max(axis=1, keepdims=True) if len(split) else 0
                a += n
            self._gmax_tables[(structure, vp)] = t
        return t

    def _level_table(self, structure: tuple[int, ...], vp: int = 1) -> np.ndarray:
        """(n_assignments, pp) recompute level per stage, non-increasing within each group
        (with ``vp > 1`` only the levels that recompute none or all of a stage's layers)."""
        key = (structure, vp > 1)
        t = self._level_tables.get(key)
        if t is not None:
            return t
        per_group = []
        for s in structure:
            # combinations_with_replacement gives non-decreasing tuples; reversed -> non-increasing
            per_group.append(self._group_levels(s, vp))
        rows = [sum(parts, ()) for parts in itertools.product(*per_group)]
        t = np.array(rows, dtype=np.int8).reshape(len(rows), sum(structure))
        self._level_tables[key] = t
        return t

    def _level_ids(self, vp: int) -> list[int]:
        """Indices of the recompute levels a layout with ``vp`` virtual stages takes."""
        if vp == 1:
            return list(range(len(self.levels)))
        return [i for i, lv in enumerate(self.levels) if lv.full_fraction in (0.0, 1.0)]

    def _group_levels(self, stages: int, vp: int = 1) -> list[tuple[int, ...]]:
        """The recompute levels of one partition group of ``stages`` stages, non-increasing."""
        # combinations_with_replacement gives non-decreasing tuples; reversed -> non-increasing
        ids = self._level_ids(vp)
        seqs = [tuple(reversed(c)) for c in itertools.combinations_with_replacement(ids, stages)]
        spread = self.options.recompute_spread
        # the spread counts steps among the levels this layout takes
        pos = {lv: j for j, lv in enumerate(ids)}
        return [c for c in seqs if spread is None or pos[c[0]] - pos[c[-1]] <= spread]

    def _count(self, sk: Skeleton) -> int:
        return len(self._split_table(sk.structure, sk.vp)) * len(self._level_table(sk.structure, sk.vp))

    # ------------------------------------------------------------------ indexing

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def skeleton_of(self, index: int) -> int:
        if not 0 <= index < len(self):
            raise IndexError(f"plan index {index} outside 0..{len(self) - 1}")
        return int(np.searchsorted(self._ends, index, side="right"))

    def decode(self, start: int, stop: int) -> Block:
        """Plans ``start..stop-1`` as arrays (vectorised; no Plan objects)."""
        start, stop = max(0, start), min(stop, len(self))
        idx = np.arange(start, stop, dtype=np.int64)
        P = self.max_pp
        sk = np.searchsorted(self._ends, idx, side="right").astype(np.int64)
        local = idx - self._starts[sk]
        nlev = self._nlev[sk]
        split_id, level_id = np.divmod(local, nlev)
        layers = np.zeros((len(idx), P), dtype=np.int32)
        gmax = np.zeros((len(idx), P), dtype=np.int32)
        levels = np.full((len(idx), P), -1, dtype=np.int8)
        if len(idx):
            # Consecutive indices share a skeleton in runs: fill each run with one gather.
            bounds = np.flatnonzero(np.diff(sk)) + 1
            for a, b in zip(np.r_[0, bounds], np.r_[bounds, len(idx)]):
                s = self.skeletons[int(sk[a])]
                st, v = s.structure, s.vp
                pp = s.pp
                layers[a:b, :pp] = self._split_table(st, v)[split_id[a:b]]
                gmax[a:b, :pp] = self._group_max_table(st, v)[split_id[a:b]]
                levels[a:b, :pp] = self._level_table(st, v)[level_id[a:b]]
        return Block(start=start, skeleton=sk, layers=layers, levels=levels, group_max=gmax)

    def iter_blocks(self, start: int = 0, stop: int | None = None, *, block_size: int = 65536) -> Iterator[Block]:
        """Decode ``start..stop-1`` in blocks of at most ``block_size`` plans (streaming)."""
        stop = len(self) if stop is None else min(stop, len(self))
        for a in range(start, stop, block_size):
            yield self.decode(a, min(a + block_size, stop))

    def plan_at(self, index: int) -> Plan:
        """The Plan object at ``index``."""
        s = self.skeletons[self.skeleton_of(index)]
        b = self.decode(index, index + 1)
        return self.plan_from(s, b.layers[0, :s.pp].tolist(), b.levels[0, :s.pp].tolist(),
                              b.group_max[0, :s.pp].tolist())

    def plan_from(self, s: Skeleton, layers: list[int], levels: list[int],
                  group_max: list[int] | None = None) -> Plan:
        parts = s.stage_partitions()
        group_max = group_max or [None] * len(layers)
        stages = tuple(Stage(partition=self.partitions[p].name, num_layers=int(n),
                             recompute=self.levels[int(lv)].for_stage(int(n), None if g is None else int(g)))
                       for p, n, lv, g in zip(parts, layers, levels, group_max))
        return Plan(tp=s.tp, dp=s.dp, micro_batch_size=s.micro_batch_size,
                    global_batch_size=self.job.global_batch_size, stages=stages,
                    sequence_parallel=s.sequence_parallel, virtual_stages=s.vp, cp=s.cp, ep=s.ep, etp=s.etp,
                    distributed_optimizer=s.distributed_optimizer, overlap_grad_reduce=s.overlap_grad_reduce,
                    overlap_param_gather=s.overlap_param_gather)

    def iter_range(self, start: int, stop: int) -> Iterator[tuple[int, Plan]]:
        """``(index, Plan)`` for ``start..stop-1``; for tests and reports (slow path)."""
        for b in self.iter_blocks(start, stop, block_size=4096):
            for j in range(len(b)):
                s = self.skeletons[int(b.skeleton[j])]
                yield b.start + j, self.plan_from(s, b.layers[j, :s.pp].tolist(), b.levels[j, :s.pp].tolist(),
                                                  b.group_max[j, :s.pp].tolist())

    def rank_range(self, rank: int, size: int) -> tuple[int, int]:
        """The contiguous index range of ``rank`` among ``size`` (balanced to one plan)."""
        n = len(self)
        return n * rank // size, n * (rank + 1) // size

    def composition_inputs(self) -> CompositionInputs:
        """The space's layouts (one per skeleton, placed by the one fit rule) and recompute
        levels, as the composition takes them (built once)."""
        if self._inputs is None:
            facts = site_facts(self.site)
            names = [p.name for p in self.partitions]
            layouts = tuple(Layout(placement=place_groups(self.site, tp=sk.tp, dp=sk.dp, facts=facts, groups=[
                (names[p], n) for p, n in sk.groups], cp=sk.cp, ep=sk.ep, etp=sk.etp),
                micro_batch_size=sk.micro_batch_size, sequence_parallel=sk.sequence_parallel, virtual_stages=sk.vp,
                distributed_optimizer=sk.distributed_optimizer, overlap_grad_reduce=sk.overlap_grad_reduce,
                overlap_param_gather=sk.overlap_param_gather)
                for sk in self.skeletons)
            self._inputs = CompositionInputs(site=self.site, job=self.job, layouts=layouts, levels=self.levels)
        return self._inputs

    def describe(self) -> dict:
        return {"plans": len(self), "skeletons": len(self.skeletons), "layer_granularity": self.granularity,
                "max_pipeline_stages": self.max_stages, "recompute_levels": [lv.label() for lv in self.levels],
                "tp": self.tp_candidates(), "micro_batch_sizes": self.micro_batch_candidates(),
                "virtual_stages": self.vp_candidates(), "cp": self.cp_candidates(),
                "ep": sorted({e for e, _ in self.expert_choices(1, 1, 1 << 20)})}


# --------------------------------------------------------------------------- the size before the search


@dataclass(frozen=True, kw_only=True)
class SpaceSize:
    """How many plans and skeletons a space holds, counted without building either."""

    plans: int
    skeletons: int
    exceeded: bool = False  # counting stopped past the limits: the true size is larger

    def check(self, space: "PlanSpace") -> None:
        """Refuse a space beyond its limits with the options that shrink it."""
        o = space.options
        if self.plans <= o.max_plans and self.skeletons <= o.max_skeletons:
            return
        what = (f"more than {o.max_plans:,} plans" if self.plans > o.max_plans
                else f"more than {o.max_skeletons:,} parallel layouts (TP x DP x micro-batch x partition order)")
        tps = ",".join(map(str, space.tp_candidates()))
        mbs = ",".join(map(str, space.micro_batch_candidates()))
        degrees = [f"virtual_stages (now {','.join(map(str, space.vp_candidates()))})",
                   f"context_parallel_sizes (now {','.join(map(str, space.cp_candidates()))})"]
        if space.job.model.is_moe:
            eps = sorted({e for e, _ in space.expert_choices(1, 1, 1 << 20)})
            degrees.append(f"expert_parallel_sizes (now {','.join(map(str, eps))})")
        raise SpecError(
            f"holds {what}; shrink it with --layer-granularity (now {space.granularity}; "
            f"larger: fewer layer splits), --max-stages (now {space.max_stages}), --tp (now {tps}), "
            f"--micro-batch-sizes (now {mbs}), fewer degrees in the job or site file's "
            f"{', '.join(degrees)}, or fewer partitions in the site file (now "
            f"{len(space.partitions)}); or search a part of the site at a time", field="search space",
            found=f"at least {self.plans:,} plans" if self.exceeded else f"{self.plans:,} plans")


def space_size(space: "PlanSpace") -> SpaceSize:
    """Count the plans of ``space`` in closed form, stopping once a limit is passed.

    Per (TP, CP, micro-batch, DP) and ordered group structure ``(s_1..s_G)``: layer splits are
    compositions with lower bounds (stars and bars: ``C(u - sum(lows) + k - 1, k - 1)``; a
    layout of ``v`` virtual stages raises each stage's low to ``v`` layers), recompute
    assignments multiply per group, and the ordered choices of distinct partitions with room
    for ``s_j`` stages each are counted by :func:`_assignments`, apart for choices inside one
    vendor (which take virtual stages and CP) and across vendors. Sequence-parallel and
    expert-parallel choices multiply. Work: the number of structures (at most
    ``2^max_stages``) per degree, not the number of plans.
    """
    o = space.options
    level_counts: dict[tuple[int, bool], int] = {}
    plans = skeletons = 0

    def levels_of(s: int, vp: int) -> int:
        key = (s, vp > 1)
        if key not in level_counts:
            level_counts[key] = len(space._group_levels(s, vp))
        return level_counts[key]

    def n_splits(structure: tuple[int, ...], vp: int) -> int:
        u, _, lows = space._split_lows(structure, vp)
        free = u - sum(lows)
        return math.comb(free + len(lows) - 1, len(lows) - 1) if free >= 0 else 0

    vendors = sorted(set(space._vendor))
    for tp, cp, mbs, dp, room, m in space.layout_degrees():
        sp_choices = len(space.sequence_parallel_choices(tp))
        usable = [p for p in space.partitions if space.tp_placeable(p, tp)]
        most_groups = min(len(usable), o.max_partitions or len(usable), space.max_stages)
        n_experts = len(space.expert_choices(tp, cp, dp)) * len(space.distributed_optimizer_choices(dp * cp))
        ways_of = _assignments(room.values())
        # ordered choices inside one vendor, per vendor
        single_of = [_assignments([r for i, r in room.items() if space._vendor[i] == v]) for v in vendors]
        sizes = sorted({s for r in room.values() for s in r})
        stack: list[tuple[int, ...]] = [(s,) for s in sizes]
        while stack:
            structure = stack.pop()
            ways = ways_of(structure)
            if not ways:
                continue  # adding groups never makes room
            if not n_splits(structure, 1):
                continue  # nor for any longer structure: the lowest split only grows
            single = sum(f(structure) for f in single_of) if len(vendors) > 1 else ways
            cross = 0 if (space.single_vendor() or not space.cross_vendor_cp(cp)) else ways - single
            cross_vps = set(space.vp_choices(sum(structure), m, True))
            for vp in sorted(set(space.vp_choices(sum(structure), m, False)) | cross_vps):
                splits = n_splits(structure, vp)
                if not splits:
                    continue
                per = splits
                for st in structure:
                    per *= levels_of(st, vp)
                w = (single if vp in space.vp_choices(sum(structure), m, False) else 0) + \
                    (cross if vp in cross_vps else 0)
                plans += per * w * sp_choices * n_experts
                skeletons += w * sp_choices * n_experts
            if plans > o.max_plans or skeletons > o.max_skeletons:
                return SpaceSize(plans=plans, skeletons=skeletons, exceeded=True)
            if len(structure) < most_groups:
                left = space.max_stages - sum(structure)
                stack.extend(structure + (s,) for s in sizes if s <= left)
    return SpaceSize(plans=plans, skeletons=skeletons)


def _assignments(rooms):
    """``structure -> ways``: how many ordered choices of distinct partitions give group j a
    partition with room for ``structure[j]`` stages, ``rooms`` holding each partition's
    stage counts. Which counts fit is not monotone (3 stages of 2 ranks on nodes of 4 GPUs
    split a TP group of 2; 4 stages do not), so partitions are grouped by the set of counts
    they take and the choices counted over those classes (few; memoised)."""
    import functools
    from collections import Counter

    classes = Counter(frozenset(r) for r in rooms)
    kinds = list(classes)
    start = tuple(classes[k] for k in kinds)

    @functools.lru_cache(maxsize=None)
    def count(structure: tuple[int, ...], left: tuple[int, ...]) -> int:
        if not structure:
            return 1
        s, rest = structure[0], structure[1:]
        total = 0
        for c, k in enumerate(kinds):
            if left[c] and s in k:
                total += left[c] * count(rest, left[:c] + (left[c] - 1,) + left[c + 1:])
        return total

    return lambda structure: count(tuple(structure), start)
