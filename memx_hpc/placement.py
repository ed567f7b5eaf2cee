"""Where a plan's ranks run on a site: the one rule for "does this plan fit".

:func:`place` turns ``(Plan, Site, TrainJob)`` into a :class:`Placement`, or raises a
:class:`~memx_hpc.errors.SpecError` that says why the plan does not fit. The search
(which skeletons exist), the composition (which links a stage boundary and a data-parallel
ring use) and the renderer (the ``#SBATCH hetjob`` components) all read it, so what is
searched, what is predicted and what is launched are the same ranks on the same nodes.

The rule, as Slurm and Megatron-LM run a plan:

* Global ranks follow Megatron's default order ``tp-cp-ep-dp-pp``: TP fastest, then
  context parallel, then DP, then the pipeline stage, so a stage's ``tp * cp * dp`` ranks
  are contiguous and its TP, CP, DP and expert groups stay inside the stage's partition
  (the experts' ``etp * ep * edp`` ranks are the same ranks, see :func:`group_ranks`).
* A *component* (one ``#SBATCH hetjob`` component, one command line) is a run of
  consecutive stages on one partition that one recompute setting serves
  (:func:`shared_recompute`): Megatron-LM takes recompute flags per process.
* A component of ``r`` ranks on a partition of ``g`` GPUs per node takes
  ``n = ceil(r / g)`` whole nodes and ``r / n`` tasks on each (``--nodes n
  --ntasks-per-node r/n``): ``r`` must spread evenly, and a TP group never straddles a
  node boundary part-way: it stays inside a node (the tasks per node are a multiple of
  TP) or spans ``TP / g`` whole nodes (TP a multiple of ``g``; its collectives then cross
  the inter-node link, which :func:`memx_hpc.model.compose.tp_internode_ms` prices). Components do not share nodes, so the
  components on one partition need at most its node count together.

The space enumerates skeletons whose partition groups are one component each
(:func:`group_fits`); :func:`place_groups` places such a layout without building a Plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from .errors import SpecError
from .spec import Partition, Plan, Recompute, Site, Stage, TrainJob, check_plan_for_model

__all__ = ["ComponentPlacement", "Placement", "ProcessGroup", "GROUP_KINDS", "place", "place_groups",
           "group_fits", "node_shape", "PartitionFacts", "site_facts", "shared_recompute", "group_ranks",
           "group_kinds", "comm_vendor", "tp_placeable", "tp_spans_nodes"]

#: The process groups megatron-core communicates over in a dense GPT without context
#: parallel, in the order every rank creates them: ``tp``, ``dp``, ``pp``, ``mp`` (tp x pp),
#: ``embd`` (first and last stage of each pipeline), ``pos_embd`` (first stage) and
#: ``default`` (the world); :func:`group_kinds` adds the context- and expert-parallel ones.
GROUP_KINDS = ("tp", "dp", "pp", "mp", "embd", "pos_embd", "default")


# --------------------------------------------------------------------------- the rule, in pieces


def node_shape(partition: Partition, ranks: int, tp: int) -> tuple[int, int] | str:
    """``(nodes, tasks per node)`` of one component of ``ranks`` ranks on ``partition``, or
    the reason it cannot run there (a string). Its node count is not compared with the
    partition's here: components on one partition add up (see :func:`place`)."""
    gpn = partition.gpus_per_node
    if not tp_placeable(partition, tp):
        return (f"tensor-parallel size {tp} exceeds the {gpn} GPUs per node of partition {partition.name} and is "
                f"not a multiple of it: a TP group either stays inside a node or spans whole nodes")
    nodes = math.ceil(ranks / gpn)
    if ranks % nodes:
        return (f"{ranks} ranks do not spread evenly over {nodes} nodes of {gpn} GPUs in partition "
                f"{partition.name}")
    per_node = ranks // nodes
    if tp > gpn:  # whole nodes per TP group: ranks is a multiple of tp, so every node is full
        return nodes, per_node
    if per_node % tp:
        return (f"{per_node} ranks per node on partition {partition.name} would split a tensor-parallel "
                f"group of {tp} across nodes")
    return nodes, per_node


def tp_placeable(partition: Partition, tp: int, *, across_nodes: bool = True) -> bool:
    """Whether a TP group of ``tp`` can run on ``partition`` at all: inside one node (``tp`` at
    most its GPUs per node, which need not be a multiple of ``tp``: 6 GPUs a node hold one TP 4
    group, see :func:`node_shape`), or, where ``across_nodes``, over whole nodes (``tp`` a
    multiple of its GPUs per node). The one statement of the TP rule: :func:`node_shape`, the
    search space and its explanations all ask it."""
    gpn = partition.gpus_per_node
    return tp <= gpn or (across_nodes and tp % gpn == 0)


def tp_spans_nodes(partition: Partition, tp: int) -> bool:
    """Whether a TP group of ``tp`` on ``partition`` spans nodes (its collectives cross the
    inter-node link)."""
    return tp > partition.gpus_per_node


def group_fits(partition: Partition, stages: int, *, tp: int, dp: int, cp: int = 1) -> bool:
    """Whether ``stages`` consecutive stages of ``tp x cp x dp`` ranks, one component, fit on
    ``partition`` (the search's question for a skeleton's partition group)."""
    shape = node_shape(partition, stages * tp * cp * dp, tp)
    return not isinstance(shape, str) and shape[0] <= partition.nodes


def shared_recompute(stages: Sequence[Stage]) -> Recompute | None:
    """The recompute setting of one command line that runs every stage of ``stages`` as it
    asks, or None when they need different command lines.

    Equal settings share trivially. Megatron-LM's ``--recompute-method block
    --recompute-num-layers k`` recomputes the first ``min(k, n)`` layers of a stage of
    ``n``: so stages that recompute ``k`` of their layers and stages of at most ``k`` layers
    that recompute all of theirs share ``full:k`` (what the search's per-group recompute
    level produces, see :class:`~memx_hpc.spec.Recompute.Level`)."""
    # a stage without layers (the embedding or the output layer alone) recomputes nothing:
    # any setting serves it
    stages = [s for s in stages if s.num_layers > 0] or list(stages[:1])
    first = stages[0].recompute
    if all(s.recompute == first for s in stages):
        return first
    if any(s.recompute.mode != "full" for s in stages):
        return None
    partial = set()
    whole = []  # layer counts of stages recomputed entirely
    for s in stages:
        k = s.num_layers if s.recompute.num_layers is None else min(s.recompute.num_layers, s.num_layers)
        if k == s.num_layers:
            whole.append(s.num_layers)
        else:
            partial.add(k)
    if len(partial) != 1:
        return None if partial else Recompute(mode="full")
    k = partial.pop()
    return Recompute(mode="full", num_layers=k) if all(n <= k for n in whole) else None


def comm_vendor(site: Site, partition: Partition) -> str:
    """The vendor whose collectives a partition's ranks speak: its GPU's, or, for a CPU
    partition rehearsing a cross-vendor job, the vendor it stands in for."""
    vendor = site.gpu(partition.gpu_type).vendor
    return partition.stand_in_for if vendor == "cpu" and partition.stand_in_for else vendor


def group_kinds(*, cp: int = 1, ep: int = 1, etp: int = 1) -> tuple[str, ...]:
    """The group kinds a job with these degrees creates, in creation order (``default`` last)."""
    extra = (("cp", "dp_cp") if cp > 1 else ()) + (("ep",) if ep > 1 else ()) + (("etp",) if etp > 1 else ()) \
        + (("edp",) if ep > 1 or etp > 1 else ())
    return GROUP_KINDS[:-1] + extra + GROUP_KINDS[-1:]


def group_ranks(kind: str, *, tp: int, dp: int, pp: int, cp: int = 1, ep: int = 1,
                etp: int | None = None) -> list[tuple[int, ...]]:
    """The global ranks of every group of ``kind`` (see :func:`group_kinds`) in a
    ``tp x cp x dp x pp`` job (``ep`` / ``etp`` for its experts), in Megatron's rank order
    ``tp-cp-ep-dp-pp`` (megatron-core ``parallel_state``: the decoder's ``RankGenerator`` over
    tp, cp, dp, pp; the experts' over expert TP, EP and expert DP, pp)."""
    def rank(t: int, d: int, s: int, c: int = 0) -> int:
        return ((s * dp + d) * cp + c) * tp + t

    if kind == "tp":
        return [tuple(rank(t, d, s, c) for t in range(tp)) for s in range(pp) for d in range(dp) for c in range(cp)]
    if kind == "dp":
        return [tuple(rank(t, d, s, c) for d in range(dp)) for s in range(pp) for c in range(cp) for t in range(tp)]
    if kind == "cp":
        return [tuple(rank(t, d, s, c) for c in range(cp)) for s in range(pp) for d in range(dp) for t in range(tp)]
    if kind == "dp_cp":
        return [tuple(rank(t, d, s, c) for d in range(dp) for c in range(cp)) for s in range(pp) for t in range(tp)]
    pipes = [tuple(rank(t, d, s, c) for s in range(pp)) for d in range(dp) for c in range(cp) for t in range(tp)]
    if kind == "pp":
        return pipes
    if kind == "mp":
        return [tuple(rank(t, d, s, c) for s in range(pp) for t in range(tp)) for d in range(dp) for c in range(cp)]
    if kind == "embd":
        return [(p[0], p[-1]) if len(p) > 1 else (p[0],) for p in pipes]
    if kind == "pos_embd":
        return [(p[0],) for p in pipes]
    if kind == "default":
        return [tuple(range(tp * cp * dp * pp))]
    if kind in ("ep", "etp", "edp"):
        # the experts' rank generator: expert TP fastest, then EP, then expert DP, per stage
        et = tp if etp is None else etp
        per_stage = tp * cp * dp
        if per_stage % (et * ep):
            raise ValueError(f"expert TP x EP = {et * ep} does not divide the {per_stage} ranks of a stage")
        edp = per_stage // (et * ep)

        def erank(t: int, e: int, d: int, s: int) -> int:
            return s * per_stage + (d * ep + e) * et + t
        if kind == "ep":
            return [tuple(erank(t, e, d, s) for e in range(ep)) for s in range(pp) for d in range(edp) for t in range(et)]
        if kind == "etp":
            return [tuple(erank(t, e, d, s) for t in range(et)) for s in range(pp) for d in range(edp) for e in range(ep)]
        return [tuple(erank(t, e, d, s) for d in range(edp)) for s in range(pp) for e in range(ep) for t in range(et)]
    raise ValueError(f"unknown group kind {kind!r}; known: {', '.join(group_kinds(cp=2, ep=2, etp=2))}")


# --------------------------------------------------------------------------- the result


@dataclass(frozen=True, kw_only=True)
class ComponentPlacement:
    """One ``#SBATCH hetjob`` component: consecutive stages on one partition, one command line.

    ``first_node``: its first node among the nodes the plan takes of its partition
    (components never share a node). ``vendor`` is the GPU's, ``comm_vendor`` the one whose
    collectives its ranks speak (:func:`comm_vendor`)."""

    index: int
    partition: str
    gpu_type: str
    vendor: str
    comm_vendor: str
    stages: tuple[int, ...]
    first_rank: int
    num_ranks: int
    nodes: int
    tasks_per_node: int
    first_node: int
    recompute: Recompute | None = None  # the shared setting (None where placed without a Plan)

    @property
    def gpus(self) -> int:
        return self.num_ranks

    def node_of(self, rank: int) -> int:
        """The partition node (see ``first_node``) global rank ``rank`` of this component runs on."""
        return self.first_node + (rank - self.first_rank) // self.tasks_per_node


@dataclass(frozen=True, kw_only=True)
class ProcessGroup:
    """One process group of a placed plan: its kind, its global ranks and their vendors."""

    kind: str
    ranks: tuple[int, ...]
    vendors: tuple[str, ...]  # sorted, distinct communication vendors

    @property
    def cross_vendor(self) -> bool:
        return len(self.vendors) > 1


@dataclass(frozen=True, kw_only=True)
class Placement:
    """What :func:`place` returns: every rank's partition and node, by component.

    The stage width (ranks per stage) is ``tp * cp * dp``; expert parallelism lays the
    experts over the same ranks (``etp * ep`` divides it), see :func:`group_ranks`."""

    tp: int
    dp: int
    stage_partitions: tuple[str, ...]
    components: tuple[ComponentPlacement, ...]
    cp: int = 1
    ep: int = 1
    etp: int | None = None

    @property
    def pp(self) -> int:
        return len(self.stage_partitions)

    @property
    def ranks_per_stage(self) -> int:
        return self.tp * self.cp * self.dp

    def group_kinds(self) -> tuple[str, ...]:
        """The kinds of groups this plan's ranks build (:func:`group_kinds`)."""
        experts = self.ep > 1 or (self.etp is not None and self.etp > 1)
        return group_kinds(cp=self.cp, ep=self.ep, etp=(self.tp if self.etp is None else self.etp) if experts else 1)

    @property
    def world_size(self) -> int:
        return self.ranks_per_stage * self.pp

    def _by_partition(self, what: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.components:
            out[c.partition] = out.get(c.partition, 0) + getattr(c, what)
        return out

    def ranks_by_partition(self) -> dict[str, int]:
        """Ranks (= GPUs) the plan takes of each partition."""
        return self._by_partition("num_ranks")

    def nodes_by_partition(self) -> dict[str, int]:
        """Whole nodes the plan takes of each partition."""
        return self._by_partition("nodes")

    def gpus_by_gpu_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.components:
            out[c.gpu_type] = out.get(c.gpu_type, 0) + c.num_ranks
        return out

    def component_of_stage(self, stage: int) -> ComponentPlacement:
        for c in self.components:
            if stage in c.stages:
                return c
        raise IndexError(f"stage {stage} outside 0..{self.pp - 1}")

    def node_of(self, rank: int) -> tuple[str, int]:
        """``(partition, node)`` of global rank ``rank``."""
        c = self.component_of_stage(rank // self.ranks_per_stage)
        return c.partition, c.node_of(rank)

    def boundary_same_node(self, stage: int) -> bool:
        """Whether every rank of ``stage`` sends to its peer of ``stage + 1`` inside a node."""
        w = self.ranks_per_stage
        a, b = self.component_of_stage(stage), self.component_of_stage(stage + 1)
        if a.partition != b.partition:
            return False
        first = stage * w
        return all(a.node_of(r) == b.node_of(r + w) for r in range(first, first + w))

    def stage_on_one_node(self, stage: int) -> bool:
        """Whether all of a stage's ranks (so its data-parallel groups) share one node."""
        c = self.component_of_stage(stage)
        first = stage * self.ranks_per_stage
        return c.node_of(first) == c.node_of(first + self.ranks_per_stage - 1)

    def rank_vendors(self) -> tuple[str, ...]:
        """The communication vendor of every global rank, in Megatron's rank order."""
        out: list[str] = []
        for c in self.components:
            out += [c.comm_vendor] * c.num_ranks
        return tuple(out)

    @property
    def cross_vendor(self) -> bool:
        return len({c.comm_vendor for c in self.components}) > 1

    def process_groups(self) -> tuple[ProcessGroup, ...]:
        """Every process group megatron-core builds for this plan, with the vendors of its ranks."""
        vendors = self.rank_vendors()
        return tuple(ProcessGroup(kind=kind, ranks=ranks, vendors=tuple(sorted({vendors[r] for r in ranks})))
                     for kind in self.group_kinds()
                     for ranks in group_ranks(kind, tp=self.tp, dp=self.dp, pp=self.pp, cp=self.cp, ep=self.ep,
                                              etp=self.etp))

    def cross_vendor_groups(self) -> tuple[ProcessGroup, ...]:
        """The groups whose ranks span vendors: each needs a backend both vendors speak."""
        return tuple(g for g in self.process_groups() if g.cross_vendor)


# --------------------------------------------------------------------------- placing


@dataclass(frozen=True, kw_only=True)
class PartitionFacts:
    """What placing reads of one partition, looked up once (the space places thousands of
    layouts on the same site): the partition, its index in the site file, its GPU's vendor
    and its ranks' communication vendor."""

    partition: Partition
    index: int
    vendor: str
    comm_vendor: str


def site_facts(site: Site) -> dict[str, PartitionFacts]:
    """:class:`PartitionFacts` of every partition of ``site``, by name."""
    return {p.name: PartitionFacts(partition=p, index=i, vendor=site.gpu(p.gpu_type).vendor,
                                   comm_vendor=comm_vendor(site, p)) for i, p in enumerate(site.partitions)}


def _place(facts: dict[str, PartitionFacts], tp: int, dp: int, stage_partitions: Sequence[str],
           runs: Sequence[tuple[str, Sequence[int], Recompute | None]], *, cp: int = 1, ep: int = 1,
           etp: int | None = None) -> Placement:
    """Place components ``(partition, stage indices, shared recompute)`` in pipeline order."""
    w = tp * cp * dp
    used: dict[str, int] = {}
    comps = []
    for ci, (name, idx, rc) in enumerate(runs):
        f = facts[name]
        p = f.partition
        ranks = w * len(idx)
        shape = node_shape(p, ranks, tp)
        if isinstance(shape, str):
            label = str(idx[0]) if len(idx) == 1 else f"{idx[0]}-{idx[-1]}"
            tp_rule = "tensor-parallel" in shape
            raise SpecError(f"stages {label}: {shape}", field="tp" if tp_rule else "dp", found=tp if tp_rule else dp)
        nodes, per_node = shape
        first_node = used.get(name, 0)
        used[name] = first_node + nodes
        if used[name] > p.nodes:
            raise SpecError(f"the plan needs {used[name]} nodes of partition {name}, which has {p.nodes} "
                            f"(hetjob components do not share nodes)", field=f"partitions[{f.index}].nodes",
                            found=p.nodes)
        comps.append(ComponentPlacement(
            index=ci, partition=name, gpu_type=p.gpu_type, vendor=f.vendor, comm_vendor=f.comm_vendor,
            stages=tuple(idx), first_rank=idx[0] * w, num_ranks=ranks, nodes=nodes, tasks_per_node=per_node,
            first_node=first_node, recompute=rc))
    return Placement(tp=tp, dp=dp, stage_partitions=tuple(stage_partitions), components=tuple(comps), cp=cp,
                     ep=ep, etp=etp)


def place_groups(site: Site, *, tp: int, dp: int, groups: Sequence[tuple[str, int]],
                 facts: dict[str, PartitionFacts] | None = None, cp: int = 1, ep: int = 1,
                 etp: int | None = None) -> Placement:
    """Place a layout given as partition groups ``((partition, stages), ...)`` in pipeline
    order, each group one component (a search skeleton; no Plan is built). ``facts``:
    :func:`site_facts` of ``site``, for callers that place many layouts."""
    names: list[str] = []
    runs = []
    for name, n in groups:
        runs.append((name, list(range(len(names), len(names) + n)), None))
        names += [name] * n
    return _place(facts or site_facts(site), tp, dp, names, runs, cp=cp, ep=ep, etp=etp)


def component_runs(plan: Plan) -> list[tuple[str, list[int], Recompute]]:
    """``(partition, stage indices, shared recompute)`` of each component of ``plan``: runs of
    consecutive stages on one partition, split where no one recompute setting serves them."""
    runs: list[tuple[str, list[int], Recompute]] = []
    for part, idx in plan.component_groups():
        cur: list[int] = []
        for i in idx:
            trial = cur + [i]
            if cur and shared_recompute([plan.stages[j] for j in trial]) is None:
                runs.append((part, cur, shared_recompute([plan.stages[j] for j in cur])))
                trial = [i]
            cur = trial
        runs.append((part, cur, shared_recompute([plan.stages[j] for j in cur])))
    return runs


def place(plan: Plan, site: Site, job: TrainJob, *, by_partition: bool = False) -> Placement:
    """The placement of ``plan`` on ``site``; SpecError naming the field when it does not fit:
    an unknown partition, a layer count other than the model's, context- or expert-parallel
    degrees the model cannot take (:func:`~memx_hpc.spec.check_plan_for_model`), a component that cannot
    spread over whole nodes, or more nodes of a partition than it has.

    ``by_partition``: one component per run of stages on a partition whatever their
    recompute settings, as the search prices a skeleton. Plans whose stages on one
    partition recompute differently (the search's ``recompute_spread`` above 0) are
    predicted so; Megatron-LM runs them only as separate components, which is what the
    default (the renderer's) places."""
    for i, s in enumerate(plan.stages):
        try:
            site.partition(s.partition)
        except SpecError as e:
            raise SpecError(e.detail, field=f"stages[{i}].partition", found=e.found, allowed=e.allowed) from None
    if job.fp8:
        for i, s in enumerate(plan.stages):
            g = site.gpu_of(s.partition)
            if g.peak_tflops_fp8 <= 0:
                raise SpecError(f"the job asks for FP8 and stage {i}'s partition {s.partition} has {g.name} GPUs, "
                                f"which have no FP8 units (no fp8 rate in the catalog)", field="fp8", found=job.fp8,
                                allowed="fp8: none, or partitions of GPUs with FP8 units")
    if plan.num_layers != job.model.num_layers:
        raise SpecError(f"the plan's stages hold {plan.num_layers} layers, the model has {job.model.num_layers}",
                        field="stages", found=[s.num_layers for s in plan.stages])
    check_plan_for_model(plan, job.model)
    runs = ([(part, idx, shared_recompute([plan.stages[i] for i in idx])) for part, idx in plan.component_groups()]
            if by_partition else component_runs(plan))
    return _place(site_facts(site), plan.tp, plan.dp, [s.partition for s in plan.stages], runs, cp=plan.cp,
                  ep=plan.ep, etp=plan.etp)
