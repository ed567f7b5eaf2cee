"""Source consistency: two sources of measurements that disagree for the same GPU type and kernel.

The store may hold layer times of one GPU type from several sources -- this site's own
profiling (``measured``) and published profiles imported from others (Sailor's,
Cephalo's: ``origin="imported"``, the source named before the first ``:`` of the
sample's ``source``). They measure different shapes, often with different attention
kernels, so they are compared after normalising each point by its roofline (the
datasheet time of its own work, :class:`memx_hpc.model.api.AnalyticCostModel`): the log
ratio ``r = log(t / roofline)`` is the inverse of the efficiency the kernel reached.

Detection (:func:`detect`). Per GPU type x sample kind x precision class, every pair of
points from two sources that ran the same TP at *comparable work* -- rooflines within a
factor :data:`COMPARABLE_WORK` -- gives one ratio ``exp(r_a - r_b)``; the median over the
pairs is the sources' disagreement. At :data:`DISAGREE_RATIO` or more (far beyond the
repeat spread of one kernel, a few per cent, and the gap between a fused and an unfused
attention kernel, which the roofline already counts) the two disagree: Sailor's A100
profiles run 1.7x slower than Cephalo's at comparable work.

Preference (:func:`resolve`), first that applies:

1. the user's word: ``prefer_source`` in the site file (``{A100-40: cephalo}``, or one
   name for every GPU type);
2. end-to-end runs on that GPU type (:class:`RunCase`: the store's ``verify`` runs, or a
   benchmark's published runs): for each source, the predictor fitted with the other
   source put on its level (below) predicts the runs; the source with the lower MAPE is
   preferred -- computed, never a name written here;
3. the shipped evidence (``memx_hpc/data/source_preference.yaml``), written by
   ``benchmarks/end_to_end.py --write-source-preference`` from published end-to-end runs
   by rule 2 (vTrain's A100 runs, dev split only), for a store whose own runs do not decide;
4. no evidence: both kept as they are, and the report says that nothing decided.

A preferred source does not delete the other: the other's points of that GPU type and
kind are scaled by the measured disagreement onto the preferred source's level, so the
shapes and kernels only it measured (Sailor's unfused ``core`` attention on A100) keep
their relative costs at the level the preferred source (and the runs) show.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import SpecError
from ..spec import LayerSample

__all__ = ["COMPARABLE_WORK", "DISAGREE_RATIO", "RunCase", "SourceDisagreement", "SourceReport", "detect",
           "resolve", "shipped_preferences", "source_of", "cases_from_records"]

#: Two points are at comparable work when their rooflines are within this factor.
COMPARABLE_WORK = 2.0
#: Median time ratio at comparable work from which two sources are said to disagree.
DISAGREE_RATIO = 1.5
#: Fewest comparable pairs for a verdict.
MIN_PAIRS = 3

_PC = {"fp16": "half", "bf16": "half", "fp32": "fp32"}


def source_of(s: LayerSample) -> str:
    """The source family of a sample: an imported sample's dataset (``sailor``,
    ``cephalo``: its ``source`` before the first ``:``), ``measured`` for this site's own."""
    if s.origin == "imported":
        head = (s.source or "imported").split(":", 1)[0].strip().lower()
        return head or "imported"
    return s.origin


@dataclass(frozen=True, kw_only=True)
class SourceDisagreement:
    """Two sources of one GPU type and kind whose times differ at comparable work.

    ``ratio``: the slower source's time over the faster's (median over ``pairs``
    comparable pairs, each normalised by its roofline), >= 1. ``preferred``: the source
    the predictor follows (None: none chosen, both kept); ``reason`` says why.
    """

    gpu_type: str
    kind: str
    precision_class: str
    slower: str
    faster: str
    ratio: float
    pairs: int
    points: Mapping[str, int]
    preferred: str | None = None
    reason: str = ""

    def describe(self) -> str:
        head = (f"{self.gpu_type} {self.kind} ({self.precision_class}): {self.slower} {self.ratio:.2f}x slower than "
                f"{self.faster} at comparable work ({self.pairs} pairs; {self.slower} {self.points[self.slower]} "
                f"points, {self.faster} {self.points[self.faster]})")
        if self.preferred is None:
            return head + f"; both kept as measured ({self.reason})"
        other = self.slower if self.preferred == self.faster else self.faster
        return head + f"; following {self.preferred}, {other}'s points scaled onto it ({self.reason})"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["points"] = dict(self.points)
        d["ratio"] = round(self.ratio, 4)
        return d


@dataclass(frozen=True, kw_only=True)
class RunCase:
    """One measured end-to-end run: a plan on a site with a job, its measured iteration."""

    plan: Any
    site: Any
    job: Any
    measured_ms: float
    gpu_types: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class SourceReport:
    """What :func:`resolve` found and did."""

    disagreements: tuple[SourceDisagreement, ...] = ()

    def notes(self, gpu_types: Sequence[str] | None = None) -> list[str]:
        keep = set(gpu_types) if gpu_types is not None else None
        return ["sources disagree: " + d.describe() for d in self.disagreements
                if keep is None or d.gpu_type in keep]

    def to_json(self, gpu_types: Sequence[str] | None = None) -> list[dict[str, Any]]:
        keep = set(gpu_types) if gpu_types is not None else None
        return [d.to_dict() for d in self.disagreements if keep is None or d.gpu_type in keep]


# --------------------------------------------------------------------------- detection


def _points(samples: Sequence[LayerSample], gpus: Any) -> dict[tuple, dict[str, list[tuple[float, float, int]]]]:
    """Per (GPU type, kind, precision class), per source: (log roofline, log ratio, tp) of
    each timed sample."""
    from .api import AnalyticCostModel
    from .features import query_of

    known: dict[str, bool] = {}

    def resolves(name: str) -> bool:  # a GPU type neither the site nor the catalog knows has no roofline
        if name not in known:
            try:
                gpus.gpu(name) if hasattr(gpus, "gpu") else gpus.get(name)
                known[name] = True
            except SpecError:
                known[name] = False
        return known[name]

    timed = [s for s in samples if s.forward_ms + s.backward_ms > 0 and not s.infeasible
             and s.origin != "augmented" and s.point.kind in ("layer", "embedding", "head")
             and resolves(s.point.gpu_type)]
    by: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    if not timed:
        return by
    # sources per (type, kind) first: the roofline only for groups with two or more
    fam: dict[tuple, set] = defaultdict(set)
    for s in timed:
        fam[(s.point.gpu_type, s.point.kind, _PC[s.point.precision])].add(source_of(s))
    timed = [s for s in timed if len(fam[(s.point.gpu_type, s.point.kind, _PC[s.point.precision])]) > 1]
    if not timed:
        return by
    roof = AnalyticCostModel(gpus).predict([query_of(s) for s in timed])[:, 0]
    for s, r in zip(timed, roof):
        if not (r > 0 and math.isfinite(r)):
            continue
        t = s.forward_ms + s.backward_ms
        by[(s.point.gpu_type, s.point.kind, _PC[s.point.precision])][source_of(s)].append(
            (math.log(r), math.log(t / r), s.point.tp))
    return by


def detect(samples: Sequence[LayerSample], gpus: Any, *, ratio: float = DISAGREE_RATIO) -> list[SourceDisagreement]:
    """Every (GPU type, kind, precision class) where two sources' times differ by ``ratio``
    or more at comparable work (see the module docstring); ``gpus``: a Site or Catalog."""
    out = []
    window = math.log(COMPARABLE_WORK)
    for (gpu, kind, pc), per in sorted(_points(samples, gpus).items()):
        names = sorted(per)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                pa = np.array(per[a])
                pb = np.array(per[b])
                diffs = []
                for x, r, tp in pa:
                    near = (pb[:, 2] == tp) & (np.abs(pb[:, 0] - x) <= window)
                    diffs.extend((r - pb[near, 1]).tolist())
                if len(diffs) < MIN_PAIRS:
                    continue
                m = float(np.median(diffs))
                if math.exp(abs(m)) < ratio:
                    continue
                slower, faster = (a, b) if m > 0 else (b, a)
                out.append(SourceDisagreement(gpu_type=gpu, kind=kind, precision_class=pc, slower=slower,
                                              faster=faster, ratio=math.exp(abs(m)), pairs=len(diffs),
                                              points={a: len(pa), b: len(pb)}))
    return out


# --------------------------------------------------------------------------- preference


def _onto(samples: Sequence[LayerSample], d: SourceDisagreement, preferred: str) -> list[LayerSample]:
    """``samples`` with the other source's points of ``d`` scaled onto ``preferred``'s level."""
    other = d.slower if preferred == d.faster else d.faster
    f = 1.0 / d.ratio if other == d.slower else d.ratio
    out = []
    for s in samples:
        if (s.point.gpu_type == d.gpu_type and s.point.kind == d.kind and _PC[s.point.precision] == d.precision_class
                and source_of(s) == other):
            s = dataclasses.replace(s, forward_ms=s.forward_ms * f, backward_ms=s.backward_ms * f,
                                    update_ms=s.update_ms)
        out.append(s)
    return out


def _mape(model: Any, cases: Sequence[RunCase], predict_ms: Callable[[Any, RunCase], float]) -> float:
    errs = [abs(predict_ms(model, c) - c.measured_ms) / c.measured_ms for c in cases]
    return 100.0 * float(np.mean(errs))


def _overrides(prefer: Any) -> dict[str, str]:
    """``prefer_source`` as {GPU type or '*': source}."""
    if not prefer:
        return {}
    if isinstance(prefer, str):
        return {"*": prefer.lower()}
    return {str(k): str(v).lower() for k, v in dict(prefer).items()}


def shipped_preferences() -> list[dict[str, Any]]:
    """The entries of ``memx_hpc/data/source_preference.yaml`` (empty when absent)."""
    from importlib import resources

    import yaml
    try:
        text = resources.files("memx_hpc.data").joinpath("source_preference.yaml").read_text()
    except (FileNotFoundError, OSError):
        return []
    rows = yaml.safe_load(text) or []
    return [r for r in rows if isinstance(r, dict)]


def resolve(samples: Sequence[LayerSample], gpus: Any, *, prefer: Any = None,
            cases: Sequence[RunCase] = (), fit: Callable[[Sequence[LayerSample]], Any] | None = None,
            predict_ms: Callable[[Any, RunCase], float] | None = None, evidence: str = "end-to-end runs",
            prior: Sequence[Mapping[str, Any]] = ()) -> tuple[list[LayerSample], SourceReport]:
    """The samples the predictor is fitted on, and what was found: each disagreement
    (:func:`detect`) settled by ``prefer`` (the site's ``prefer_source``), else by the
    ``cases`` on its GPU type (``fit(samples)`` makes a cost model from samples and
    ``predict_ms(model, case)`` its iteration time of a run -- the composition, passed in so
    that this module stays below it; the source whose model predicts the runs with the lower
    MAPE), else left as measured. A
    ``prefer_source`` naming a source that is not one of a disagreement's two is refused
    (SpecError naming the field)."""
    found = detect(samples, gpus)
    over = _overrides(prefer)
    out = list(samples)
    settled = []
    for d in found:
        want = over.get(d.gpu_type, over.get("*"))
        if want is not None and want not in (d.slower, d.faster):
            if d.gpu_type in over:
                raise SpecError(f"{d.gpu_type}'s {d.kind} times come from {d.slower} and {d.faster}",
                                field=f"prefer_source.{d.gpu_type}", found=want, allowed=f"{d.slower}, {d.faster}")
            want = None  # a site-wide name that is not one of this pair's
        if want is not None:
            d = dataclasses.replace(d, preferred=want, reason="prefer_source in the site file")
        else:
            mine = [c for c in cases if d.gpu_type in c.gpu_types]
            if mine and fit is not None and predict_ms is not None:
                scores = {src: _mape(fit(_onto(out, d, src)), mine, predict_ms) for src in (d.faster, d.slower)}
                best = min(scores, key=lambda k: (scores[k], k))
                d = dataclasses.replace(d, preferred=best, reason=(
                    f"agrees with {len(mine)} {evidence} on {d.gpu_type}: time MAPE "
                    + ", ".join(f"{k} {v:.1f} %" for k, v in sorted(scores.items(), key=lambda kv: kv[1]))))
            else:
                known = [p for p in prior if p.get("gpu_type") == d.gpu_type and p.get("kind") == d.kind
                         and p.get("precision_class") == d.precision_class
                         and {p.get("preferred"), p.get("over")} == {d.slower, d.faster}]
                if known:
                    d = dataclasses.replace(d, preferred=str(known[0]["preferred"]),
                                            reason=f"agrees with {known[0].get('evidence', 'published runs')}")
                else:
                    d = dataclasses.replace(d, reason=f"no end-to-end runs on {d.gpu_type} to decide: run "
                                                      f"'memx-hpc verify' there, or set prefer_source")
        if d.preferred is not None:
            out = _onto(out, d, d.preferred)
        settled.append(d)
    return out, SourceReport(disagreements=tuple(settled))


def cases_from_records(records: Sequence[Any], site: Any) -> list[RunCase]:
    """The store's end-to-end runs (``memx-hpc verify``) of ``site`` as :class:`RunCase`
    (runs whose plan or job shape does not read any more are left out)."""
    from ..planfile import plan_from_mapping
    from ..records import job_from_spec
    from ..spec import Plan

    out = []
    for r in records:
        try:
            plan = plan_from_mapping(r.plan)
            if not isinstance(plan, Plan) or not r.job_spec or not (r.iteration_ms > 0):
                continue
            job = job_from_spec(r.job_spec)
            types = tuple(sorted({site.gpu(site.partition(s.partition).gpu_type).name for s in plan.stages}))
        except SpecError:
            continue
        out.append(RunCase(plan=plan, site=site, job=job, measured_ms=float(r.iteration_ms), gpu_types=types))
    return out
