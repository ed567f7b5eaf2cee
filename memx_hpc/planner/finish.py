"""Plans ranked by when they would finish on the cluster as it is now (``plan --finish``).

Slurm, not a stopwatch, says which plan is done first: nodes a job cannot get now are left
out of the search (:func:`usable_site`); the ranking's plans and the best plan on each set
of partitions are rendered for the goal's iterations and Slurm is asked when it would start
each (``sbatch --test-only``); they are ranked by that start + the predicted run time
(:func:`rank_by_finish`), and :func:`submit_finish` submits the first.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys
import tempfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import SpecError, SystemFailure
from ..search.engine import ScoredPlan, SearchResult, search
from ..slurm import render as rs
from ..slurm.discover import ClusterView, SlurmNode, read_cluster
from ..slurm.estimate import estimate_start
from ..slurm.submit import check_syntax, launch, submit
from ..spec import MAX_TIME_LIMIT_MIN, Partition, Site, TrainJob, _suggest
from .request import (FINISH_UNITS, FinishCandidate, FinishGoal, FinishRanking, PlanRequest, PlanResult,
                      Prepared, parse_finish)
from .precision import search_precisions
from .space import launchable_space

if TYPE_CHECKING:
    from mpi4py.MPI import Comm

__all__ = ["FinishGoal", "parse_finish", "FinishCandidate", "FinishRanking", "usable_site", "cluster_view",
           "rank_by_finish", "finish_order", "submit_finish", "FINISH_TIME_SLACK", "FINISH_STARTUP_MIN",
           "MAX_FINISH_CANDIDATES", "MAX_SUBSET_PARTITIONS", "FINISH_UNITS"]

# --------------------------------------------------------------------------- ranked by when they finish

#: The time limit a finish candidate's script asks for: its predicted run time with this
#: slack, plus a start-up allowance (imports, dataset index building and checkpoint loading
#: take minutes on a cold node), so that a run predicted a little too fast is not killed.
#: A longer limit only delays a start under backfill; the finish time does not include either.
FINISH_TIME_SLACK = 1.10
FINISH_STARTUP_MIN = 10
#: scripts asked about (one sbatch --test-only each), fastest first
MAX_FINISH_CANDIDATES = 12
#: partitions up to which every subset of them is searched for its own best plan
MAX_SUBSET_PARTITIONS = 4
def _node_fits(node: SlurmNode, p: Partition, vendor: str) -> bool:
    """Whether a Slurm node carries what the site partition asks of each node."""
    if p.gres_type is not None:
        return any(g.type == p.gres_type and g.count >= p.gpus_per_node for g in node.gpus)
    if vendor != "cpu":
        return sum(g.count for g in node.gpus) >= p.gpus_per_node
    return True


def usable_site(site: Site, view: ClusterView) -> tuple[Site, list[str]]:
    """``site`` with each partition's nodes cut to those Slurm can give a job now (down,
    drained, draining, failing, reserved nodes and nodes without the partition's GPUs left
    out), partitions without any dropped; the notes say what was left out. SpecError for a
    site partition Slurm does not have; SystemFailure when no partition keeps a node."""
    notes: list[str] = []
    parts = []
    names = [p.name for p in view.partitions]
    for i, p in enumerate(site.partitions):
        if view.partition(p.name) is None:
            raise SpecError("not a partition of this Slurm cluster" + _suggest(p.name, names),
                            file=site.source_file, field=f"partitions[{i}].name", found=p.name,
                            allowed=", ".join(names))
        vendor = site.gpu(p.gpu_type).vendor
        fits, held, misfit = [], [], 0
        for node, verdict in view.verdicts(p.name):
            if not _node_fits(node, p, vendor):
                misfit += 1
            elif verdict.usable:
                fits.append(node)
            else:
                held.append(f"{node.name} {verdict.why}")
        n = min(p.nodes, len(fits))
        ask = f"gpu:{p.gres_type}:{p.gpus_per_node}" if p.gres_type else f"{p.gpus_per_node} GPUs"
        if held:
            more = f"; and {len(held) - 4} more" if len(held) > 4 else ""
            notes.append(f"{p.name}: {len(held)} node{'s' if len(held) != 1 else ''} a job cannot get now, not "
                         f"planned on: " + "; ".join(held[:4]) + more)
        if n == 0:
            why = (f"no node of Slurm partition {p.name} carries {ask}" if not held and misfit else
                   "no node a job can get now")
            notes.append(f"{p.name}: {why}; left out of the plans")
            continue
        if n < p.nodes:
            notes.append(f"{p.name}: planned on {n} of the site's {p.nodes} nodes (Slurm can give {len(fits)} "
                         f"with {ask} now)")
        parts.append(dataclasses.replace(p, nodes=n) if n != p.nodes else p)
    if not parts:
        raise SystemFailure(f"no partition of site {site.name} has a node a job can get now: " + "; ".join(notes))
    kept = {p.name for p in parts}
    return dataclasses.replace(site, partitions=tuple(parts),
                               links=tuple(lk for lk in site.links if lk.a in kept and lk.b in kept)), notes


def cluster_view(comm: "Comm | None", rank0: bool) -> ClusterView:
    """Slurm's view, read once (rank 0) and shared, so that every rank searches the same site."""
    if comm is None:
        return read_cluster()
    view, failure = None, None
    if rank0:
        try:
            view = read_cluster()
        except SystemFailure as e:
            failure = str(e)
    view, failure = comm.bcast((view, failure), root=0)
    if failure is not None:
        raise SystemFailure(failure)
    return view


def _subsets(names: list[str]) -> list[tuple[str, ...]]:
    """Partition sets whose own best plan is a candidate: every proper subset for a few
    partitions, else each one alone and each one left out."""
    if len(names) <= 1:
        return []
    if len(names) <= MAX_SUBSET_PARTITIONS:
        return [c for k in range(1, len(names)) for c in itertools.combinations(names, k)]
    return [(n,) for n in names] + [tuple(x for x in names if x != n) for n in names]


#: Room left before the last date Python can write for Slurm's start estimate, which lies
#: ahead of now (at most a year: the longest time limit Slurm is asked for).
_START_ALLOWANCE = timedelta(days=366)


def rank_by_finish(request: "PlanRequest", pr: "Prepared", site: Site, result: SearchResult, view: ClusterView,
                   out_dir: Path | None, *, progress: bool = True) -> FinishRanking:
    """The candidates ranked by when they would finish ``request.finish`` of training.

    Candidates: the ranking's plans and, for each set of partitions (:func:`_subsets`), the
    best plan on those partitions alone (on a busy cluster the plan that can start is often
    not among the fastest); of the plans that ask Slurm for the same nodes, the fastest.
    Each is rendered (``--train-iters`` N, a time limit of its predicted run: see
    FINISH_TIME_SLACK) and Slurm is asked when it would start it (``sbatch --test-only``);
    the ranking is by that start + N x the predicted iteration time. Scripts are written as
    ``finish-NN.sbatch`` into ``out_dir`` in that order (nowhere when it is None).
    SpecError naming ``--finish`` when even the fastest candidate would finish past the
    last date that can be written."""
    goal, job = request.finish, pr.job
    iters = goal.iterations(job)
    notes: list[str] = []
    pool = _candidate_pool(request, pr, site, result, notes)
    chosen = _one_per_request(pool, site, job, iters, notes)
    chosen = _within_horizon(chosen, goal, job, iters, datetime.now().astimezone(), notes)
    if progress:
        print(f"finish: asking Slurm when each of {len(chosen)} candidate plans would start (sbatch --test-only)",
              file=sys.stderr, flush=True)
    ranked = _ask_slurm(chosen, site, job, iters, view, out_dir)
    refused = [c for c in ranked if not c.estimate.accepted]
    if refused:
        notes.append(f"Slurm would not place {len(refused)} candidate{'s' if len(refused) != 1 else ''}: "
                     + "; ".join(f"#{c.rank}: {c.estimate.message}" for c in refused[:3]))
    notes.append("finish = Slurm's expected start (sbatch --test-only, the backfill scheduler's estimate from the "
                 "running jobs' time limits, the queue and reservations) + iterations x predicted iteration time; "
                 "start-up and checkpoint time are not included")
    return FinishRanking(goal=goal, iterations=iters, candidates=tuple(ranked), notes=tuple(notes))


def _candidate_pool(request: "PlanRequest", pr: "Prepared", site: Site, result: SearchResult,
                    notes: list[str]) -> list[tuple[ScoredPlan, str]]:
    """The ranking's plans and the best plan of each set of partitions alone, each with
    where it came from."""
    job = pr.job
    pool = [(s, f"#{s.rank} of the ranking") for s in result.ranking(request.objective)]
    for names in _subsets([p.name for p in site.partitions]):
        sub = dataclasses.replace(site, partitions=tuple(p for p in site.partitions if p.name in names),
                                  links=tuple(lk for lk in site.links if lk.a in names and lk.b in names))
        try:
            r = search_precisions(sub, job, request.space, launchable_space(sub, job, request.space)[0],
                                  lambda space, step: search(space, pr.cost_model, options=pr.options,
                                                             cache=pr.cache, comm=None, progress=None),
                                  [], top_k=pr.options.top_k)
        except SpecError as e:  # a subset on which no plan can be built (too few GPUs for the model)
            notes.append(f"no plan searched on {'+'.join(names)} alone: {e}")
            continue
        best = r.ranking(request.objective)
        if best:
            pool.append((best[0], f"best on {'+'.join(names)}"))
    return pool


_Chosen = tuple[tuple[tuple[str, int, int], ...], tuple[ScoredPlan, tuple[str, ...]]]


def _one_per_request(pool: list[tuple[ScoredPlan, str]], site: Site, job: TrainJob, iters: int,
                     notes: list[str]) -> list[_Chosen]:
    """One candidate per Slurm request (the same nodes per component): the fastest plan of
    it, with every source that asked for it; the :data:`MAX_FINISH_CANDIDATES` fastest."""
    by_request: dict[tuple, list] = {}
    for s, source in pool:
        try:
            req = rs.describe(s.plan, site, job, iters=iters)
        except SpecError as e:
            notes.append(f"{source} cannot be rendered: {e}")
            continue
        # the same nodes in another component order is the same request to Slurm
        key = tuple(sorted((c.partition, c.nodes, c.tasks_per_node) for c in req.components))
        have = by_request.get(key)
        if have is None or s.prediction.iteration_ms < have[0].prediction.iteration_ms:
            by_request[key] = [s, (have[1] if have else ()) + (source,)]
        else:
            have[1] = have[1] + (source,)
    chosen = sorted(((k, (v[0], v[1])) for k, v in by_request.items()), key=lambda kv: kv[1][0].prediction.iteration_ms)
    if len(chosen) > MAX_FINISH_CANDIDATES:
        notes.append(f"{len(chosen)} distinct Slurm requests among the candidates; asked about the "
                     f"{MAX_FINISH_CANDIDATES} fastest")
        chosen = chosen[:MAX_FINISH_CANDIDATES]
    return chosen


def _within_horizon(chosen: list[_Chosen], goal: FinishGoal, job: TrainJob, iters: int, now: datetime,
                    notes: list[str]) -> list[_Chosen]:
    """The candidates whose run ends before the last date Python can write (less a year for
    Slurm's start); the others are left out with a note. SpecError naming ``--finish`` and
    the most it can price when none is left."""
    latest = datetime.max.replace(tzinfo=now.tzinfo) - _START_ALLOWANCE
    room_s = (latest - now).total_seconds()
    kept = [c for c in chosen if iters * c[1][0].prediction.iteration_ms / 1e3 <= room_s]
    if chosen and not kept:
        fastest_s = chosen[0][1][0].prediction.iteration_ms / 1e3
        years = iters * fastest_s / (365.25 * 86400)
        raise SpecError(f"{goal.label(job)} is {iters:,} iterations of {fastest_s:,.1f} s on the fastest plan: "
                        f"{years:,.0f} years, past the last date a finish can be written",
                        field="--finish", found=goal.text or goal.amount,
                        allowed=f"at most {int(room_s / fastest_s):,} iterations on that plan (finishing by "
                                f"{latest:%Y-%m-%d})")
    if len(kept) < len(chosen):
        notes.append(f"{len(chosen) - len(kept)} slower candidate(s) left out: they would finish past the last "
                     f"date that can be written ({latest:%Y-%m-%d})")
    return kept


def _ask_slurm(chosen: list[_Chosen], site: Site, job: TrainJob, iters: int, view: ClusterView,
               out_dir: Path | None) -> list[FinishCandidate]:
    """Each candidate rendered and its start asked of Slurm, ranked (:func:`finish_order`);
    the scripts kept as ``finish-NN.sbatch`` in ``out_dir`` (in a temporary folder when None)."""
    shared = _shared_nodes(view, site)
    tmp = tempfile.TemporaryDirectory(prefix="memx-finish-") if out_dir is None else None
    where = Path(tmp.name) if tmp is not None else out_dir
    try:
        cands = [_candidate(k, key, s, sources, site, job, iters, view, shared, where)
                 for k, (key, (s, sources)) in enumerate(chosen)]
        ranked = []
        for r, c in enumerate(finish_order(cands), start=1):
            final = None
            if tmp is None:
                final = where / f"finish-{r:02d}.sbatch"
                c.script.replace(final)
            ranked.append(dataclasses.replace(c, rank=r, script=final))
    except OSError as e:
        raise SystemFailure(f"cannot write the finish scripts into {where}: {e}") from None
    finally:
        if tmp is not None:
            tmp.cleanup()
    return ranked


def _candidate(k: int, key: tuple[tuple[str, int, int], ...], s: ScoredPlan, sources: tuple[str, ...], site: Site,
               job: TrainJob, iters: int, view: ClusterView, shared: list[tuple[str, str]],
               where: Path) -> FinishCandidate:
    """One candidate rendered with its time limit into ``where`` and Slurm's answer for it."""
    run_s = iters * s.prediction.iteration_ms / 1e3
    need_min = math.ceil(run_s * FINISH_TIME_SLACK / 60) + FINISH_STARTUP_MIN
    limits = [view.partition(part).max_time_min for part, _, _ in key]
    cap = min([m for m in limits if m is not None], default=None)
    limit = min(need_min, cap if cap is not None else MAX_TIME_LIMIT_MIN, MAX_TIME_LIMIT_MIN)
    cnotes = []
    if limit < need_min:
        cnotes.append(f"needs {need_min:,} min, the partitions allow {limit:,}: the run takes "
                      f"{math.ceil(need_min / limit)} jobs (checkpoint, resubmit); later waits not counted")
    parts_used = {part for part, _, _ in key}
    if any(a in parts_used and b in parts_used for a, b in shared):
        cnotes.append("its partitions share nodes: Slurm's --test-only answer for a hetjob whose "
                      "components may share a node is not reliable")
    timed = dataclasses.replace(site, time_limit_min=limit, partitions=tuple(
        dataclasses.replace(p, time_limit_min=None) for p in site.partitions))
    script = where / f".finish-{k:02d}.sbatch"
    # written as every script is (bash -n, its log folder); Slurm is asked below
    launch(rs.render(s.plan, timed, job, iters=iters, job_name=f"memx-{job.name}", log_dir=str(where)), script)
    asked = datetime.now().astimezone()
    est = estimate_start(script)
    return FinishCandidate(scored=s, sources=tuple(sources), iterations=iters, run_s=run_s, time_limit_min=limit,
                           components=tuple((p, n) for p, n, _ in key), estimate=est, asked_at=asked, script=script,
                           notes=tuple(cnotes))


def finish_order(cands: list[FinishCandidate]) -> list[FinishCandidate]:
    """By expected finish, then run time, then the order given; those Slurm accepted without
    a start time next, those it refused last."""
    def key_of(ic: tuple[int, FinishCandidate]):
        i, c = ic
        fin = c.finish_at
        group = 0 if fin is not None else (1 if c.estimate.accepted else 2)
        return (group, fin.timestamp() if fin is not None else 0.0, c.run_s, i)
    return [c for _, c in sorted(enumerate(cands), key=key_of)]


def _shared_nodes(view: ClusterView, site: Site) -> list[tuple[str, str]]:
    sets = {p.name: {n.name for n in view.nodes_of(p.name)} for p in site.partitions}
    names = list(sets)
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if sets[a] & sets[b]]


def submit_finish(outcome: "PlanResult") -> dict:
    """Submit the script of the plan that finishes first (``finish-01.sbatch``); the job id."""

    best = outcome.finish.best if outcome.finish is not None else None
    if best is None or best.script is None:
        raise SystemFailure("--submit: no candidate plan has a start time from Slurm; nothing was submitted")
    check_syntax(best.script)
    job_id = submit(best.script)
    return {"job_id": job_id, "script": str(best.script), "log_dir": str(best.script.parent),
            "plan_rank": best.scored.rank, "finish_rank": best.rank}
