"""What the planner is asked and what it answers: :class:`PlanRequest`, :class:`PlanResult`,
the search's prepared inputs (:class:`Prepared`) and the finish-time goal and ranking
(:class:`FinishGoal`, :class:`FinishRanking`). Types only, so that the conductor and the
rooms it calls (finish-time ranking, verify, simulate) share them without importing each other.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import SpecError
from ..model.assembled import AssembledCostModel
from ..model.compose import CostOptions
from ..search.cache import PredictionCache
from ..search.engine import ScoredPlan, SearchOptions, SearchResult
from ..search.objective import OBJECTIVES, MemoryErrorBand, Weights
from ..search.report import scored_to_dict
from ..search.space import SpaceOptions
from ..slurm.estimate import StartEstimate
from ..spec import MAX_TRAIN_ITERS, Site, TrainJob

if TYPE_CHECKING:
    from mpi4py.MPI import Comm

__all__ = ["PlanRequest", "PlanResult", "Prepared", "FinishGoal", "parse_finish", "FinishCandidate", "FinishRanking",
           "FINISH_UNITS"]

FINISH_UNITS = ("iterations", "samples", "tokens")
_UNIT_WORDS = {"": "iterations", "it": "iterations", "its": "iterations", "iter": "iterations",
               "iters": "iterations", "iteration": "iterations", "iterations": "iterations",
               "sample": "samples", "samples": "samples", "seq": "samples", "seqs": "samples",
               "sequences": "samples", "tok": "tokens", "token": "tokens", "tokens": "tokens"}
_MULTIPLIERS = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12}


@dataclass(frozen=True, kw_only=True)
class FinishGoal:
    """How much training to finish: ``amount`` of ``unit`` (iterations, samples or tokens)."""

    amount: float
    unit: str = "iterations"
    text: str = ""

    def __post_init__(self) -> None:
        if self.unit not in FINISH_UNITS:
            raise SpecError("unknown unit", field="--finish", found=self.unit, allowed=", ".join(FINISH_UNITS))
        if isinstance(self.amount, bool) or not isinstance(self.amount, (int, float)) \
                or not math.isfinite(self.amount) or self.amount <= 0:
            raise SpecError("expected an amount > 0", field="--finish", found=self.amount)

    def iterations(self, job: TrainJob) -> int:
        """Iterations of ``job`` that train that much (a partial iteration counts whole)."""
        per = {"iterations": 1, "samples": job.global_batch_size,
               "tokens": job.global_batch_size * job.model.seq_length}[self.unit]
        n = max(1, math.ceil(self.amount / per - 1e-9))
        if n > MAX_TRAIN_ITERS:
            raise SpecError(f"{self.label(job)} is {n:,} iterations", field="--finish", found=self.text or self.amount,
                            allowed=f"at most {MAX_TRAIN_ITERS:,} iterations")
        return n

    def label(self, job: TrainJob) -> str:
        if self.unit == "iterations":
            return f"{self.amount:,.0f} iterations"
        per = job.global_batch_size * (job.model.seq_length if self.unit == "tokens" else 1)
        return f"{self.amount:,.0f} {self.unit} ({per:,} per iteration)"


def parse_finish(text: str) -> FinishGoal:
    """``1000`` or ``1000it`` (iterations), ``2M samples``, ``1.5B tokens``; multipliers k, M,
    G or B, T. SpecError naming ``--finish`` for anything else."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][0-9]+)?)\s*([kKMGBT]?)\s*([A-Za-z]*)\s*", text or "")
    if m is None or m.group(3).lower() not in _UNIT_WORDS:
        raise SpecError("expected an amount with an optional multiplier and unit", field="--finish", found=text,
                        allowed="e.g. 1000 (iterations), 5000it, 2M samples, 1.5Btokens; multipliers k, M, G/B, T")
    return FinishGoal(amount=float(m.group(1)) * _MULTIPLIERS[m.group(2)], unit=_UNIT_WORDS[m.group(3).lower()],
                      text=text.strip())


@dataclass(frozen=True, kw_only=True)
class FinishCandidate:
    """One candidate plan with Slurm's answer. ``components``: (partition, nodes) per hetjob
    component; ``wait_s``: from asking to the expected start; ``finish_at``: the expected
    start + ``iterations`` x the predicted iteration time (start-up not included); None
    where Slurm gave no start. ``script``: the sbatch script Slurm was asked about."""

    scored: ScoredPlan
    sources: tuple[str, ...]
    iterations: int
    run_s: float
    time_limit_min: int
    components: tuple[tuple[str, int], ...]
    estimate: StartEstimate
    asked_at: datetime
    script: Path | None = None
    rank: int = 0
    notes: tuple[str, ...] = ()

    @property
    def _now(self) -> datetime:
        # Slurm answers in whole seconds: a job that starts at once reads as this second
        return self.asked_at.replace(microsecond=0)

    @property
    def wait_s(self) -> float | None:
        return self.estimate.wait_s(self._now) if self.estimate.accepted else None

    @property
    def start_at(self) -> datetime | None:
        if not self.estimate.accepted or self.estimate.start is None:
            return None
        return max(self.estimate.start, self._now)

    @property
    def finish_at(self) -> datetime | None:
        start = self.start_at
        return None if start is None else start + timedelta(seconds=self.run_s)

    def to_json(self) -> dict:
        e = self.estimate
        fin = self.finish_at
        return {"rank": self.rank, "sources": list(self.sources), "iterations": self.iterations,
                "iteration_s": self.scored.prediction.iteration_ms / 1e3, "run_s": self.run_s,
                "time_limit_min": self.time_limit_min, "components": [list(c) for c in self.components],
                "asked_at": self.asked_at.isoformat(timespec="seconds"),
                "slurm": {"accepted": e.accepted, "message": e.message,
                          "start": e.start.isoformat(timespec="seconds") if e.start else None,
                          "nodes": list(e.nodes), "processors": e.processors},
                "wait_s": self.wait_s,
                "start": self.start_at.isoformat(timespec="seconds") if self.start_at else None,
                "finish": fin.isoformat(timespec="seconds") if fin else None,
                "script": str(self.script) if self.script else None, "notes": list(self.notes),
                "plan": scored_to_dict(self.scored)}


@dataclass(frozen=True, kw_only=True)
class FinishRanking:
    """The candidates by expected finish (those Slurm gave no start, then those it refused,
    last), the goal, and what the user should know."""

    goal: FinishGoal
    iterations: int
    candidates: tuple[FinishCandidate, ...]
    notes: tuple[str, ...] = ()

    @property
    def best(self) -> FinishCandidate | None:
        c = self.candidates[0] if self.candidates else None
        return c if c is not None and c.finish_at is not None else None

    def to_json(self) -> dict:
        return {"goal": {"amount": self.goal.amount, "unit": self.goal.unit, "text": self.goal.text},
                "iterations": self.iterations, "candidates": [c.to_json() for c in self.candidates],
                "notes": list(self.notes)}


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """What to plan.

    ``site``/``job``: the specs, or paths of their YAML files. ``store``: the profile store
    (None: the site's). ``weights``: the objective's exponents as ``Weights`` or text
    (``"time=1,memory=0.5"``; None: the site's ``objective:``, else the default).
    ``space``/``cost``: the search-space and composition options. ``profile``: measure
    what the store lacks first; ``scheduler`` overrides the site's (``slurm`` | ``local``);
    ``allow_datasheet``: a failed or locked profiling run becomes a note instead of an
    error. ``out_dir``: where files go (None: the site's ``work_dir/plan-<job>``);
    ``write`` False writes nothing. ``mpi``: ``"auto"`` (use MPI when launched under
    it), ``"require"`` or ``"off"``; ``comm`` an explicit communicator (wins over
    ``mpi``). ``analytic``: datasheet roofline only; ``use_cache`` False: no signature
    cache. ``progress``: progress lines on stderr. ``notes``: notes the result starts with
    (what the caller chose, in words). ``objective``: ``recommended`` or ``memx`` (which
    ranking ``PlanResult.ranked`` and plan-NN.json follow). ``run_folder`` False writes
    into ``out_dir`` itself instead of a new run folder under it. ``finish``: rank the best
    candidates by when they would finish that much training on the cluster as it is now
    (:func:`rank_by_finish`: Slurm's ``--test-only`` start + the predicted run time); nodes a
    job cannot get now (down, drained, reserved) are not planned on. ``min_plans_per_rank``:
    under MPI, a space of fewer plans than this per rank is searched by rank 0 alone, the
    other ranks waiting for its outcome (:data:`MIN_PLANS_PER_RANK` is what the CLI passes;
    0: every rank searches, however small the space).
    """

    site: Site | str | Path
    job: TrainJob | str | Path
    store: str | Path | None = None
    weights: Weights | str | None = None
    space: SpaceOptions = field(default_factory=SpaceOptions)
    cost: CostOptions = field(default_factory=CostOptions)
    top_k: int = 10
    block_size: int = 65536
    profile: bool = False
    scheduler: str | None = None
    allow_datasheet: bool = False
    out_dir: str | Path | None = None
    write: bool = True
    mpi: str = "auto"
    comm: "Comm | None" = None
    analytic: bool = False
    use_cache: bool = True
    progress: bool = True
    notes: tuple[str, ...] = ()
    objective: str = "recommended"
    run_folder: bool = True
    finish: FinishGoal | None = None
    min_plans_per_rank: int = 0
    #: a store that does not exist yet starts from the shipped reference profiles: True/False
    #: (``--no-reference``), None: the site's ``reference_data`` (:func:`start_store`)
    reference: bool | None = None

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise SpecError("unknown objective", field="objective", found=self.objective,
                            allowed=", ".join(OBJECTIVES))
        if self.mpi not in ("auto", "require", "off"):
            raise SpecError("unknown MPI mode", field="mpi", found=self.mpi, allowed="auto, require, off")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
            raise SpecError("must be a whole number >= 1", field="top", found=self.top_k)
        if self.finish is not None and not isinstance(self.finish, FinishGoal):
            raise SpecError("expected a FinishGoal (parse_finish)", field="finish", found=self.finish)
        if (isinstance(self.min_plans_per_rank, bool) or not isinstance(self.min_plans_per_rank, int)
                or self.min_plans_per_rank < 0):
            raise SpecError("must be a whole number >= 0", field="min_plans_per_rank", found=self.min_plans_per_rank)


@dataclass(kw_only=True)
class PlanResult:
    """A finished plan.

    ``search``: the :class:`~memx_hpc.search.engine.SearchResult` (``top``: ranked
    ``ScoredPlan``s, ``time_top``, ``pareto``, ``weights``, ``stats``). ``provenance``:
    per GPU type of the site where its numbers come from (measured | imported |
    augmented | datasheet-only). ``notes``: what the user should know, in words.
    ``cost_model``: the model the search used. ``files``: paths written (plan files,
    pareto.png, summary.json; an sbatch script after :func:`submit_best`). ``summary``:
    the JSON summary (what ``--json`` prints). ``rank0`` is False on the other ranks of
    an MPI run, which write and report nothing. ``finish``: with ``PlanRequest.finish``, the
    candidates ranked by when they would finish (``site`` is then the usable part of the
    cluster the search ran on).
    """

    site: Site
    job: TrainJob
    cost_model: AssembledCostModel | None
    search: SearchResult | None
    notes: list[str]
    provenance: dict[str, str]
    out_dir: Path
    files: list[str]
    summary: dict
    rank0: bool = True
    objective: str = "recommended"
    bands: dict[str, MemoryErrorBand] = field(default_factory=dict)
    run_id: str | None = None
    finish: FinishRanking | None = None

    @property
    def ranked(self) -> tuple:
        """The plans as ``objective`` ranks them (recommended first by default)."""
        return self.search.ranking(self.objective)

    @property
    def result(self) -> "SearchResult":
        """The search result (the name earlier callers used)."""
        return self.search


@dataclass(kw_only=True)
class Prepared:
    """Everything a search needs, made once per request (:func:`prepare`)."""

    site: Site
    job: TrainJob
    options: SearchOptions
    comm: "Comm | None"
    rank0: bool
    notes: list[str]
    cost_model: AssembledCostModel
    cache: PredictionCache | None
    bands: dict[str, MemoryErrorBand] = field(default_factory=dict)
