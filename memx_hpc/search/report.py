"""What a search shows people and writes for machines: the three picks (recommended,
fastest, MemX's weighted best) explained, the top-K table, the Pareto-front PNG, one plan
JSON per plan in a folder of its own per run, a JSON summary, and a progress bar on stderr."""

from __future__ import annotations

import math
import os
import secrets
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..planfile import job_record, save_plan
from ..spec import Plan, Site, TrainJob
from .engine import ScoredPlan, SearchResult
from .objective import MemoryErrorBand

if TYPE_CHECKING:
    from ..model.links import LinkModel
    from .space import PlanSpace

GiB = 2**30


class ProgressBar:
    """A one-line progress bar on stderr (a line every 10 % when stderr is not a terminal)."""

    def __init__(self, label: str, *, enabled: bool = True, stream=None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.perf_counter()
        self._last = -1

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        frac = done / total
        if self.tty:
            width = 30
            fill = int(round(frac * width))
            self.stream.write(f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] {frac:4.0%} "
                              f"{done:,}/{total:,} ({time.perf_counter() - self.t0:.1f} s)")
            if done >= total:
                self.stream.write("\n")
            self.stream.flush()
            return
        step = int(frac * 10)
        if step != self._last and (step > self._last):
            self._last = step
            print(f"{self.label}: {frac:.0%} ({done:,}/{total:,}, {time.perf_counter() - self.t0:.1f} s)",
                  file=self.stream, flush=True)


def stage_summary(plan: Plan, *, compact: bool = False) -> str:
    """``gpu_a100:12/none | gpu_v100:4+4/full:2`` — consecutive stages of one partition together.
    ``compact``: ``gpu_a100:12|gpu_v100:4+4/full:2`` (no recompute is not written)."""
    parts = []
    for name, idx in plan.component_groups():
        layers = "+".join(str(plan.stages[i].num_layers) for i in idx)
        rcs = [plan.stages[i].recompute.label() for i in idx]
        rc = rcs[0] if len(set(rcs)) == 1 else ",".join(rcs)
        parts.append(f"{name}:{layers}" + ("" if compact and rc == "none" else f"/{rc}"))
    return ("|" if compact else " | ").join(parts)


def space_notes(space: "PlanSpace") -> list[str]:
    """What the space holds of a job's request that a reader might expect otherwise, one line
    each: a narrowing of virtual stages or context parallel that leaves out 1 (honoured by every
    plan: layouts that cannot take a listed degree are left out, never given 1) and cross-vendor
    plans left out for this job (:meth:`~memx_hpc.search.space.PlanSpace.cross_vendor_note`)."""
    out = []
    for name, cands in (("virtual_stages", space.vp_candidates()), ("context_parallel_sizes", space.cp_candidates())):
        if cands and 1 not in cands:
            whose = "job's" if getattr(space.job, name) else "site's"
            what = ("layouts of one stage, or whose micro-batches per iteration are not a multiple of their stages, "
                    "are left out" if name == "virtual_stages" else
                    "layouts on partitions without Transformer Engine are left out")
            out.append(f"the {whose} {name} {cands} leave out 1: every plan takes one of them; {what}")
    note = space.cross_vendor_note()
    if note is not None:
        out.append(note)
    return out


def gpu_types_of(site: Site) -> list[str]:
    seen: dict[str, None] = {}
    for p in site.partitions:
        seen.setdefault(p.gpu_type, None)
    return list(seen)


def gib(nbytes: float) -> str:
    """GiB with enough digits to tell small models' stages apart."""
    x = nbytes / GiB
    return f"{x:.1f}" if x >= 10 else (f"{x:.2f}" if x >= 1 else f"{x:.3g}")


# --------------------------------------------------------------------------- the three picks

#: The plans every report shows and writes, in this order: (role, file name, words).
ROLES = (("recommended", "recommended.json", "recommended"),
         ("fastest", "fastest.json", "fastest that fits"),
         ("weighted", "weighted.json", "MemX weighted best"))


def picks(result: SearchResult) -> dict[str, ScoredPlan]:
    """role -> plan for the roles that have one (none when nothing fits)."""
    out = {"recommended": result.recommended, "fastest": result.fastest, "weighted": result.weighted_best}
    return {k: v for k, v in out.items() if v is not None}


def _fullest(s: ScoredPlan, band_of=lambda gpu: 0.0) -> tuple[str, float, int, int]:
    """(GPU type, utilisation, peak bytes, capacity bytes) of the plan's fullest GPU once each
    peak is widened by its type's error band (``band_of``): the GPU the OOM risk words speak
    of, which on a plan of two GPU types with unlike bands need not be the one with the
    highest bare peak."""
    st = max(s.prediction.stages, key=lambda x: (x.peak_bytes * (1.0 + band_of(x.gpu_type)) / x.capacity_bytes,
                                                 x.peak_bytes / x.capacity_bytes))
    return st.gpu_type, st.peak_bytes / st.capacity_bytes, st.peak_bytes, st.capacity_bytes


def _band_of(bands: Mapping[str, MemoryErrorBand] | None, result: SearchResult, gpu: str) -> float:
    if bands and gpu in bands:
        return bands[gpu].fraction
    return float(result.memory_error.get(gpu, 0.0))


#: a widened peak this far below the memory limit is "low" risk; between it and the limit "small"
RISK_LOW_MARGIN = 0.10


def risk_words(s: ScoredPlan, *, margin: float = 0.0) -> str:
    """OOM risk of a plan in words, from its widened worst-GPU utilisation, against the
    same limit the plot draws: capacity x (1 - the site's safety ``margin``). A widened
    peak past that limit is never "low" or "small"."""
    r = s.risk_utilisation
    if r != r:  # nan: no band known
        return "OOM risk unknown (no error band)"
    limit = 1.0 - margin
    if r > 1.0:
        return "OOM risk REAL: its peak plus the expected error exceeds the GPU's memory"
    if r > limit:
        return (f"OOM risk HIGH: its peak plus the expected error passes the {limit:.0%} memory limit "
                f"(the {margin:.0%} safety margin)")
    if r <= limit - RISK_LOW_MARGIN:
        return "OOM risk low"
    return f"OOM risk small (the band's edge is near the {limit:.0%} memory limit)"


def link_rows(links: "LinkModel | None") -> list[dict]:
    """Which curve each link of the site uses (:meth:`memx_hpc.model.links.LinkModel.describe`;
    an assembled cost model's ``links``); empty for None."""
    return links.describe() if links is not None else []


def rests_on(s: ScoredPlan, provenance: Mapping[str, str] | None, links: Sequence[Mapping[str, str]] | None) -> str:
    """What a plan's numbers rest on beyond measurements: its GPU types with datasheet
    figures only, and the links it uses that are the site file's default figures
    (``links``: :meth:`memx_hpc.model.links.LinkModel.describe` rows). Empty when none."""
    stages = s.prediction.stages
    gpus = sorted({st.gpu_type for st in stages})
    parts = {st.partition for st in stages}
    weak = []
    sheet = [g for g in gpus if (provenance or {}).get(g) == "datasheet-only"]
    if sheet:
        weak.append(f"{', '.join(sheet)} datasheet-only")
    used = [f"{r['link']} {r['scope']}" for r in (links or ()) if r.get("provenance") in ("site-figure", "generic")
            and set(x.strip() for x in r["link"].split("<->")) <= parts]
    if used:
        weak.append(f"default links ({', '.join(used)})")
    return f" [rests on: {'; '.join(weak)}]" if weak else ""


def admitting_margin(utilisation: float) -> float:
    """The largest safety margin, in whole percent rounded down, under which a GPU at
    ``utilisation`` of its capacity fits (0 when only no margin at all admits it)."""
    return max(0.0, math.floor((1.0 - utilisation) * 100.0 + 1e-9) / 100.0)


def margin_aside_words(result: SearchResult, margin: float) -> str | None:
    """A line on the fastest plan that fits every GPU's capacity but that the site's safety
    margin alone sets aside, where it is faster than the fastest plan that fits (or nothing
    fits): its time, its fullest GPU, and the margin that would admit it. None otherwise.
    The margin is the site's policy, not a prediction: the line shows what it costs."""
    s = result.margin_aside
    if s is None or margin <= 0.0:
        return None
    fast = result.fastest
    t = s.prediction.iteration_ms
    if fast is not None and t >= fast.prediction.iteration_ms:
        return None
    g, u, peak, cap = _fullest(s)
    admit = admitting_margin(u)
    vs = (f"{t / fast.prediction.iteration_ms - 1:+.1%} time vs the fastest that fits" if fast is not None
          else "no plan fits under the margin")
    n = result.margin_aside_count
    return (f"set aside by the {margin:.0%} safety margin alone: {n:,} plan{'s' if n != 1 else ''} fit every GPU's "
            f"capacity but not the margin; the fastest, tp {s.plan.tp} dp {s.plan.dp} micro-batch "
            f"{s.plan.micro_batch_size} {stage_summary(s.plan, compact=True)}, {t / 1e3:.3f} s/iteration ({vs}), "
            f"peaks at {u:.1%} of its fullest GPU ({g}, {peak / GiB:.1f} of {cap / GiB:.1f} GiB); "
            f"memory_safety_margin: {admit:g} in the site file would admit it")


def explain(result: SearchResult, *, bands: Mapping[str, MemoryErrorBand] | None = None,
            files: Mapping[str, str] | None = None, margin: float = 0.0,
            provenance: Mapping[str, str] | None = None,
            links: Sequence[Mapping[str, str]] | None = None) -> list[str]:
    """One line per pick: time against the fastest, memory headroom of the fullest GPU,
    OOM risk against the site's limit (``margin``), what its numbers rest on beyond
    measurements (:func:`rests_on`); then one line on why the recommended plan is not the
    fastest."""
    p = picks(result)
    aside = margin_aside_words(result, margin)
    if not p:
        return [aside] if aside else []
    fast = p.get("fastest")
    t0 = fast.prediction.iteration_ms if fast else None
    lines = []
    for role, fname, words in ROLES:
        s = p.get(role)
        if s is None:
            if role == "recommended":
                lines.append(f"{words:<19} none: every plan that fits has a GPU whose peak is within the expected "
                             f"error of its capacity")
            continue
        g, u, peak, cap = _fullest(s, lambda gpu: _band_of(bands, result, gpu))
        band = _band_of(bands, result, g)
        t = s.prediction.iteration_ms
        cost = ("the fastest" if t0 is None or abs(t - t0) <= 1e-9 * t0
                else f"{(t / t0 - 1):+.1%} time vs the fastest")
        same = [w2 for r2, _, w2 in ROLES if r2 != role and p.get(r2) is not None and p[r2].index == s.index]
        if same and role != "recommended":
            where = f" -> {files[role]}" if files and role in files else ""
            lines.append(f"{words:<19} the same plan as the {same[0]}{where}")
            continue
        where = f" -> {files[role]}" if files and role in files else ""
        lines.append(f"{words:<19} {t / 1e3:.3f} s/iteration ({cost}); fullest GPU {g} at {u:.0%} "
                     f"({(cap - peak) / GiB:.1f} GiB free), {u * (1 + band):.0%} with its +{band:.0%} error band: "
                     f"{risk_words(s, margin=margin)}{rests_on(s, provenance, links)}{where}")
    rec = p.get("recommended")
    if rec is not None and result.recommended_by != "predictor":
        lines.append(result.recommended_by)
    elif rec is not None and fast is not None:
        if rec.index == fast.index:
            lines.append("the recommended plan is the fastest plan that fits: its peak plus the expected error stays "
                         "within every GPU's memory")
        elif not fast.risk_feasible:
            safe = result.fastest_safe
            tail = ""
            if safe is not None and safe.index != rec.index:
                tail = (f"; the fastest of those ({safe.prediction.iteration_ms / fast.prediction.iteration_ms - 1:+.1%}"
                        f") is within the time noise ({result.time_noise:.0%}) of the recommended, which keeps its "
                        f"memory lower")
            lines.append(f"the fastest plan's memory sits inside the error band of its GPU's capacity: the "
                         f"recommended plan ({rec.prediction.iteration_ms / fast.prediction.iteration_ms - 1:+.1%} "
                         f"time) is chosen among the plans whose peak plus the error fits{tail}")
        else:
            lines.append(f"the recommended plan is within the time noise ({result.time_noise:.0%}) of the fastest "
                         f"and keeps its memory lower and better balanced")
    w = p.get("weighted")
    if w is not None and rec is not None and w.index != rec.index:
        extra = w.prediction.iteration_ms / rec.prediction.iteration_ms - 1
        if extra > result.time_noise and w.risk_utilisation <= 1.0 and rec.risk_utilisation <= 1.0:
            lines.append(f"MemX's weighted product pays {extra:+.1%} time for headroom the error band does not need "
                         f"(weights {result.weights.label()}; --objective memx ranks by it)")
    if aside:
        lines.append(aside)
    return lines


# --------------------------------------------------------------------------- the table

TABLE_FOOTER = ("GPUs: peak GiB; mem+err: fullest GPU + expected error, % of memory; bal: fullest/mean GPU memory; "
                "score: T^{t}*M^{m}*B^{b}\nstages: partition:layers[/recompute], one entry per run of stages on "
                "one partition")


def table_rows(plans: Sequence[ScoredPlan], site: Site) -> tuple[list[str], list[list[Any]]]:
    """Header and rows of the plan table; GPU-type columns hold predicted peak GiB."""
    gpus = gpu_types_of(site)
    header = ["rank", "time#", "s/iter"] + gpus + ["mem+err", "bal", "score", "tp.dp.mb", "stages"]
    rows = []
    for s in plans:
        p = s.prediction
        peaks = p.peak_by_gpu_type()
        risk = "-" if s.risk_utilisation != s.risk_utilisation else f"{s.risk_utilisation:.0%}"
        rows.append([s.rank, s.time_rank, f"{p.iteration_ms / 1e3:.3f}"]
                    + [gib(peaks[g]) if g in peaks else "-" for g in gpus]
                    + [risk, f"{p.balance:.2f}", f"{s.score:.3g}",
                       f"{s.plan.tp}.{s.plan.dp}.{s.plan.micro_batch_size}" + (f" {s.plan.fp8}" if s.plan.fp8 else ""),
                       stage_summary(s.plan, compact=True)])
    return header, rows


def table_footer(result: SearchResult, site: Site) -> str:
    w = result.weights
    return TABLE_FOOTER.format(t=f"{w.time:g}", m=f"{w.memory:g}", b=f"{w.balance:g}")


# --------------------------------------------------------------------------- machines


def scored_to_dict(s: ScoredPlan) -> dict:
    from ..planfile import plan_to_dict
    return {"rank": s.rank, "time_only_rank": s.time_rank, "index": s.index, "score": s.score,
            "risk_utilisation": s.risk_utilisation, "plan": plan_to_dict(s.plan), "prediction": s.prediction.to_dict()}


def bands_to_dict(bands: Mapping[str, MemoryErrorBand] | None) -> dict:
    return {g: {"fraction": b.fraction, "basis": b.basis, "source": b.source} for g, b in (bands or {}).items()}


def result_to_json(result: SearchResult, *, site: Site, job: TrainJob, provenance: Mapping[str, str],
                   notes: Sequence[str] = (), files: Sequence[str] = (), objective: str = "recommended",
                   bands: Mapping[str, MemoryErrorBand] | None = None, run_id: str | None = None,
                   links: Sequence[Mapping[str, str]] | None = None) -> dict:
    """``top``: the ranking of ``objective``; ``recommended``, ``fastest``, ``weighted``: the
    three picks; ``weighted_top``/``time_only``: MemX's and the time-only rankings."""
    p = picks(result)
    return {"site": site.name, "job": job.name, "job_fingerprint": job_record(job)["fingerprint"],
            "run_id": run_id, "objective": objective, "weights": result.weights.label(),
            "time_noise": result.time_noise, "memory_error": bands_to_dict(bands),
            "provenance": dict(provenance), "notes": list(notes), "stats": result.stats.to_dict(),
            "risk_feasible": result.risk_feasible,
            "margin_aside": ({"plans": result.margin_aside_count, **scored_to_dict(result.margin_aside)}
                             if result.margin_aside is not None else None),
            **{role: (scored_to_dict(p[role]) if role in p else None) for role, _, _ in ROLES},
            "explanation": explain(result, bands=bands, margin=site.memory_safety_margin, provenance=provenance,
                                   links=links),
            "top": [scored_to_dict(s) for s in result.ranking(objective)],
            "weighted_top": [scored_to_dict(s) for s in result.top],
            "time_only": [scored_to_dict(s) for s in result.time_top],
            "pareto": [{"index": p.index, "iteration_ms": p.iteration_ms, "max_utilisation": p.max_utilisation}
                       for p in result.pareto],
            "files": list(files)}


# --------------------------------------------------------------------------- one folder per run


def new_run_id() -> str:
    """``20261130-221530-3fa2``: UTC time of the run and 4 random hex digits (two runs in one second)."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def new_run_dir(base: Path, run_id: str | None = None, *, latest: bool = True) -> Path:
    """``base/<run id>/``, created, with ``base/latest`` pointing at it unless ``latest`` is
    False (then :func:`point_latest` moves it once the run is complete)."""
    run_id = run_id or new_run_id()
    out = base / run_id
    out.mkdir(parents=True, exist_ok=False)
    if latest:
        point_latest(base, run_id)
    return out


def point_latest(base: Path, run_id: str) -> None:
    """``base/latest`` -> ``run_id`` (replaced atomically: a reader sees the old run or the new
    one, never a mix)."""
    link = base / "latest"
    tmp = base / f".latest.{os.getpid()}"
    try:
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        os.symlink(run_id, tmp)
        os.replace(tmp, link)
    except OSError:
        # a file system without symbolic links: a file naming the run instead
        (base / "latest.txt").write_text(run_id + "\n", encoding="utf-8")


#: Plan files a run writes at most (plan-01.json ...): ``--top`` may rank many more, which the
#: table and summary.json list, but a file per plan of a huge ``--top`` filled the folder
#: (4,127 files, 69 MB for tiny-gpt at --top 1000000000).
MAX_PLAN_FILES = 100


def write_plan_files(result: SearchResult, out_dir: Path, *, site: Site, job: TrainJob,
                     provenance: Mapping[str, str], objective: str = "recommended",
                     bands: Mapping[str, MemoryErrorBand] | None = None, run_id: str | None = None) -> list[Path]:
    """``plan-01.json`` ... (the first :data:`MAX_PLAN_FILES` of the ranking of ``objective``) and ``recommended.json``,
    ``fastest.json``, ``weighted.json`` (the three picks) in ``out_dir``, planfile format,
    each with its job (name and fingerprint), site, prediction and why it is there."""
    out_dir.mkdir(parents=True, exist_ok=True)
    w = result.weights
    memx = f"T^{w.time:g} M^{w.memory:g} B^{w.balance:g}"
    common = {"job": job_record(job), "site": site.name, "provenance": dict(provenance), "run": run_id,
              "memory_error": bands_to_dict(bands)}

    def save(s: ScoredPlan, path: Path, *, rank: int, role: str, why: str) -> Path:
        pred = s.prediction.to_dict()
        pred["time_only_rank"] = s.time_rank
        pred["weights"] = w.label()
        pred["risk_utilisation"] = s.risk_utilisation
        save_plan(s.plan, path, prediction=pred, rank=rank, score=s.score, role=role, objective=objective,
                  note=why, **common)
        return path

    n = result.stats.feasible
    paths = []
    ranking = result.ranking(objective)
    for s in ranking[:MAX_PLAN_FILES]:
        why = (f"rank {s.rank} of {result.risk_feasible:,} plans whose peak fits with the expected memory error "
               f"(recommended ranking); rank {s.time_rank} by iteration time alone" if objective == "recommended"
               else f"rank {s.rank} of {n:,} feasible plans by {memx}; rank {s.time_rank} by iteration time alone")
        paths.append(save(s, out_dir / f"plan-{s.rank:02d}.json", rank=s.rank, role=objective, why=why))
    p = picks(result)
    whys = {"recommended": "the fastest plan whose peak, widened by the expected memory error, fits; within "
                           f"{result.time_noise:.0%} of it lower and better-balanced memory wins",
            "fastest": f"the fastest of the {n:,} plans that fit (site safety margin only, no error band)",
            "weighted": f"the best of the {n:,} plans that fit by MemX's weighted product {memx}"}
    for role, fname, _ in ROLES:
        if role in p:
            paths.append(save(p[role], out_dir / fname, rank=p[role].rank, role=role, why=whys[role]))
    return paths


# --------------------------------------------------------------------------- the plot


#: The tEXt keyword of pareto.png that holds :func:`figure_key` of what it shows.
FIGURE_KEY_TEXT = "memx-figure-key"


def figure_key(result: SearchResult, *, title: str, site: Site | None = None,
               bands: Mapping[str, MemoryErrorBand] | None = None) -> str:
    """SHA-256 of everything :func:`pareto_png` draws from (each plotted plan's time,
    memory and roles, the weights, the memory limit and bands, the title) and of what it
    draws with (this module's source, matplotlib's version): two figures with one key are
    the same pixels."""
    import hashlib
    from importlib import metadata

    def pts(plans) -> list:
        return [(p.index, p.prediction.iteration_ms, p.prediction.max_utilisation) for p in plans]

    what = (title, [(p.iteration_ms, p.max_utilisation) for p in result.pareto], pts(result.top),
            sorted((role, s.index, s.prediction.iteration_ms, s.prediction.max_utilisation)
                   for role, s in picks(result).items()),
            result.weights.label(), site.memory_safety_margin if site is not None else None,
            sorted((g, b.fraction) for g, b in (bands or {}).items()))
    h = hashlib.sha256(repr(what).encode())
    h.update(Path(__file__).read_bytes())
    try:
        h.update(metadata.version("matplotlib").encode())
    except metadata.PackageNotFoundError:  # pragma: no cover - matplotlib is a dependency
        pass
    return h.hexdigest()


def _png_text(path: Path, keyword: str) -> str | None:
    """The value of a PNG file's tEXt chunk ``keyword`` (read up to the image data), else None."""
    import struct
    try:
        with open(path, "rb") as fh:
            if fh.read(8) != b"\x89PNG\r\n\x1a\n":
                return None
            while True:
                head = fh.read(8)
                if len(head) < 8:
                    return None
                n, kind = struct.unpack(">I4s", head)
                if kind == b"IDAT" or n > 1 << 20:
                    return None
                data = fh.read(n)
                fh.read(4)  # CRC
                if kind == b"tEXt":
                    k, _, v = data.partition(b"\0")
                    if k.decode("latin-1") == keyword:
                        return v.decode("latin-1")
    except OSError:
        return None


def pareto_png(result: SearchResult, path: Path, *, title: str, site: Site | None = None,
               bands: Mapping[str, MemoryErrorBand] | None = None, reuse: Path | None = None) -> Path:
    """Iteration time (log axis) against the fullest GPU's peak memory (% of its capacity):
    the Pareto front, the top-K of the weighted product, and the three picks marked and
    labelled; the site's memory limit and, dashed, where the expected error would cross
    it. matplotlib's Agg backend (no display needed).

    ``reuse``: an earlier pareto.png (the last run's); when its :func:`figure_key` is this
    figure's, it is copied instead of drawn: importing matplotlib and drawing was about a
    second of a warm ``plan`` that found what the last one found."""
    key = figure_key(result, title=title, site=site, bands=bands)
    if _reused(reuse, key, path):
        return path
    # the Figure API, not pyplot: no global backend switch and no figure registry to close
    # (savefig draws with Agg by itself; the same pixels). It imports about as much as pyplot.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 6.4), dpi=110)
    ax = fig.subplots()
    limit = 100.0 * (1.0 - site.memory_safety_margin) if site is not None else None
    pts: list[tuple[float, float]] = []
    if result.pareto:
        xs = [p.iteration_ms / 1e3 for p in result.pareto]
        ys = [p.max_utilisation * 100 for p in result.pareto]
        pts += list(zip(xs, ys))
        ax.step(xs, ys, where="post", color="0.65", lw=1.2, zorder=1)
        ax.scatter(xs, ys, s=22, color="0.35", label=f"Pareto front: no plan is both faster and leaner "
                                                     f"({len(xs)} plans)", zorder=2)
    if result.top:
        xs = [s.prediction.iteration_ms / 1e3 for s in result.top]
        ys = [s.prediction.max_utilisation * 100 for s in result.top]
        pts += list(zip(xs, ys))
        ax.scatter(xs, ys, s=36, marker="o", facecolors="none", edgecolors="tab:purple", lw=1,
                   label=f"top {len(result.top)} by MemX's weighted product", zorder=3)
    p = picks(result)
    style = {"recommended": ("*", 260, "tab:green", "recommended"),
             "fastest": ("X", 120, "tab:red", "fastest that fits"),
             "weighted": ("D", 90, "tab:purple", f"weighted best ({result.weights.label()})")}
    # labels on rows of their own (axes fraction), above their points' x: clustered
    # points do not stack their labels on each other
    rows = {"fastest": 0.70, "recommended": 0.62, "weighted": 0.54}
    for role in ("weighted", "fastest", "recommended"):
        s = p.get(role)
        if s is None:
            continue
        x, y = s.prediction.iteration_ms / 1e3, s.prediction.max_utilisation * 100
        pts.append((x, y))
        marker, size, color, label = style[role]
        ax.scatter([x], [y], s=size, marker=marker, color=color, edgecolors="black", linewidths=0.6, zorder=5,
                   label=f"{label}: {x:.3g} s, {y:.0f} %")
        same = [r for r in ("recommended", "fastest", "weighted") if r in p and p[r].index == s.index]
        if same[0] != role:
            continue  # one label per point: the first role that names it
        ax.annotate(" = ".join(style[r][3].split(" (")[0] for r in same), (x, y), xycoords="data",
                    textcoords=("data", "axes fraction"), xytext=(x, rows[role]), fontsize=10, color=color,
                    fontweight="bold", ha="left", va="center",
                    arrowprops={"arrowstyle": "-", "color": color, "lw": 0.8, "shrinkB": 6})
    if limit is not None:
        ax.axhline(limit, color="tab:red", lw=1.2, ls="-", zorder=0)
        ax.text(0.995, limit, f"memory limit {limit:.0f} % (safety margin {site.memory_safety_margin:.0%})",
                transform=ax.get_yaxis_transform(), ha="right", va="bottom", fontsize=9, color="tab:red")
        widest = max((b.fraction for b in (bands or {}).values()), default=0.0)
        if widest > 0:
            edge = 100.0 / (1.0 + widest)
            ax.axhline(edge, color="tab:orange", lw=1.0, ls="--", zorder=0)
            ax.text(0.995, edge, f"{edge:.0f} %: a +{widest:.0%} memory error reaches capacity",
                    transform=ax.get_yaxis_transform(), ha="right", va="top", fontsize=9, color="tab:orange")
    if pts:
        _time_axis(ax, pts, [p[r].prediction.iteration_ms / 1e3 for r in p])
    ax.set_xlabel("predicted iteration time (s, log scale)", fontsize=11)
    ax.set_ylabel("peak memory of the fullest GPU (% of its capacity)", fontsize=11)
    # the title holds the site's and job's names as written: a '$' pair in them is text, not
    # mathtext (whose parser raised on '$\\frac{$' and stopped the run before its summary)
    ax.set_title(title, fontsize=12, parse_math=False)
    ax.tick_params(labelsize=10)
    ax.grid(alpha=0.3, which="both")
    # below the axes: no point or label of the plot can sit under it
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight", metadata={FIGURE_KEY_TEXT: key})
    return path


def _reused(reuse: Path | None, key: str, path: Path) -> bool:
    """Copy ``reuse`` (the last run's pareto.png) to ``path`` when it shows ``key``; False
    when it does not exist, shows something else or cannot be copied (then it is drawn)."""
    if reuse is None or _png_text(reuse, FIGURE_KEY_TEXT) != key:
        return False
    import shutil
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        shutil.copyfile(reuse, path)
        return True
    except OSError:
        return False


def _time_axis(ax, pts: list[tuple[float, float]], marked: list[float]) -> None:
    """The log time axis from the fastest point to at most 3x it (or the slowest marked pick),
    round ticks, a note of the plans beyond it; the memory axis from 0 to above every point."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter, NullLocator

    xs = sorted(x for x, _ in pts)
    lo = xs[0]
    # clip outliers: the axis ends at 3x the fastest plan (or the slowest plan marked)
    hi = min(xs[-1], lo * 3.0)
    hi = max(hi, max(marked, default=hi))
    ax.set_xscale("log")
    ax.set_xlim(lo / 1.06, hi * 1.12)
    clipped = sum(1 for x in xs if x > hi * 1.12)
    if clipped:
        ax.text(0.995, 0.02, f"{clipped} slower plan(s) beyond the axis", transform=ax.transAxes, ha="right",
                fontsize=8, color="0.4")
    # at most 3x wide: evenly spaced round numbers read better than powers of ten
    ticks = [v for v in MaxNLocator(nbins=7).tick_values(lo / 1.06, hi * 1.12) if lo / 1.06 <= v <= hi * 1.12]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(0, max(105.0, max(y for _, y in pts) + 5))


# --------------------------------------------------------------------------- what the store covers


def coverage(site: Site, summary: Sequence[Mapping[str, Any]], e2e_records: Sequence[Any] = ()) -> list[dict]:
    """Per GPU type of ``site``: where its numbers would come from and the expected error
    of its predicted peak memory (``status`` and ``profile ls``), from the store's
    summary without fitting anything.

    ``data``: ``calibrated`` (end-to-end runs of the site), ``measured`` (profiled here),
    ``imported``, ``augmented``, or ``datasheet-only``; ``via``: for a type without samples
    of its own, the variant of the same chip (the catalog's ``chip``) whose layer times
    the predictor uses, and ``data`` is that variant's."""
    from ..model.api import Basis
    from .objective import table_band

    def resolve(name: str):
        try:
            return site.gpu(name)
        except Exception:  # a GPU type this site does not know
            return None

    own: dict[str, dict[str, int]] = {}
    for r in summary:
        g = resolve(str(r["gpu_type"]))
        if g is None:
            continue
        acc = own.setdefault(g.name, {})
        for origin, n in dict(r.get("by_origin", {})).items():
            acc[origin] = acc.get(origin, 0) + int(n)
    chips: dict[str, list[str]] = {}
    for name in own:
        g = resolve(name)
        chips.setdefault(getattr(g, "chip_id", name) if g is not None else name, []).append(name)
    runs: dict[str, int] = {}
    for rec in e2e_records:
        for t in set(getattr(rec, "gpu_type_by_rank", {}).values()):
            g = resolve(t)
            if g is not None:
                runs[g.name] = runs.get(g.name, 0) + 1
    out = []
    for name in dict.fromkeys(p.gpu_type for p in site.partitions):
        g = site.gpu(name)
        counts = own.get(g.name, {})
        via = ""
        def kind(c: Mapping[str, int]) -> str:
            return next((k for k in ("measured", "imported", "augmented") if c.get(k)), "datasheet-only")

        if runs.get(g.name):
            data = "calibrated"
        elif counts:
            data = kind(counts)
        else:
            # no samples of its own: the predictor uses a same-chip variant's layer times
            others = [o for o in chips.get(getattr(g, "chip_id", g.name), []) if o != g.name]
            via = others[0] if others else ""
            data = kind(own[via]) if via else "datasheet-only"
        band = table_band(name, Basis(kind=data))
        out.append({"gpu_type": name, "partitions": [p.name for p in site.partitions if p.gpu_type == name],
                    "samples": sum(counts.values()), "by_origin": counts, "e2e_runs": runs.get(g.name, 0),
                    "data": data, "via": via, "memory_error": band.fraction, "memory_error_source": band.source})
    return out


def coverage_table(rows: Sequence[Mapping[str, Any]], *, file=None) -> None:
    """The coverage rows as a table that fits 120 columns, with a one-line footer."""
    from ..tables import TABLE_WIDTH, table
    table([[r["gpu_type"], ",".join(r["partitions"]), r["samples"], r["e2e_runs"],
            r["data"] + (f" (same chip as {r['via']})" if r["via"] else ""), f"+-{r['memory_error']:.0%}"]
           for r in rows],
          ["site gpu type", "partitions", "samples", "e2e runs", "numbers from", "mem err"], file=file,
          max_width=TABLE_WIDTH)
    print("mem err: expected error of the predicted peak memory, which the recommended plan allows for "
          "(data/memory_error.yaml)", file=file or sys.stdout)
