"""The weighted-product objective of MemX: ``score = T^w_t · M^w_m · B^w_b`` (lower is better).

``T`` is the iteration time (seconds), ``M`` the worst GPU's peak-memory utilisation
(peak / capacity, in (0, 1]), ``B`` the memory imbalance (max / mean utilisation over
the plan's GPUs, >= 1). A weighted product (not a weighted sum) needs no normalisation
of quantities with different units: scaling T by a constant scales every score by the
same factor and leaves the ranking unchanged. ``time=1`` alone (``w_m = w_b = 0``) is the
time-only ranking other planners use. Scores are computed as ``exp`` of a weighted sum
of logarithms so that large exponents stay finite; infeasible plans score ``inf``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from ..errors import SpecError
from ..model.api import Basis
from ..model.metrics import ape

WEIGHT_NAMES = ("time", "memory", "balance")


@dataclass(frozen=True, kw_only=True)
class Weights:
    """Exponents of the weighted product; each >= 0 and not all zero."""

    time: float = 1.0
    memory: float = 0.5
    balance: float = 0.5

    def __post_init__(self) -> None:
        for name in WEIGHT_NAMES:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise SpecError("a weight must be a finite number", field=f"weights.{name}", found=v)
            if v < 0:
                raise SpecError("a weight must be >= 0", field=f"weights.{name}", found=v)
        if self.time == 0 and self.memory == 0 and self.balance == 0:
            raise SpecError("at least one weight must be > 0", field="weights", found="all zero")

    @property
    def time_only(self) -> bool:
        return self.memory == 0 and self.balance == 0

    def label(self) -> str:
        return ",".join(f"{n}={getattr(self, n):g}" for n in WEIGHT_NAMES)


TIME_ONLY = Weights(time=1.0, memory=0.0, balance=0.0)


def parse_weights(text: str | None, *, default: Weights | None = None) -> Weights:
    """``"time=1,memory=0.5,balance=0.5"`` -> Weights; names left out are 0 (``time=1`` is
    the time-only ranking). Without ``text`` the result is ``default`` (the site's
    ``objective:`` weights) or MemX's defaults.

    Unknown names, repeated names, non-numbers and negative values raise SpecError
    naming the offending item and the allowed names.
    """
    base = default or Weights()
    if text is None or not text.strip():
        return base
    values = {n: 0.0 for n in WEIGHT_NAMES}
    seen: set[str] = set()
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, val = item.partition("=")
        name = name.strip()
        if not sep:
            raise SpecError("expected NAME=VALUE", field="--weights", found=item, allowed=", ".join(WEIGHT_NAMES))
        if name not in WEIGHT_NAMES:
            raise SpecError("unknown weight name", field="--weights", found=name, allowed=", ".join(WEIGHT_NAMES))
        if name in seen:
            raise SpecError("weight given twice", field=f"--weights.{name}", found=item)
        seen.add(name)
        try:
            v = float(val)
        except ValueError:
            raise SpecError("not a number", field=f"--weights.{name}", found=val.strip()) from None
        if not math.isfinite(v) or v < 0:
            raise SpecError("a weight must be a finite number >= 0", field=f"--weights.{name}", found=val.strip())
        values[name] = v
    return Weights(**values)


def log_score(iteration_ms, max_utilisation, balance, weights: Weights):
    """``log(T^w_t M^w_m B^w_b)`` with T in seconds (arrays or scalars); ``inf`` where T is inf.

    Ranking by the log score is ranking by the score (log is increasing), without
    overflow for large weights.
    """
    t = np.asarray(iteration_ms, dtype=np.float64) / 1e3
    m = np.asarray(max_utilisation, dtype=np.float64)
    b = np.asarray(balance, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = weights.time * np.log(t)
        if weights.memory:
            out = out + weights.memory * np.log(m)
        if weights.balance:
            out = out + weights.balance * np.log(b)
    return np.where(np.isfinite(t), out, np.inf)


def score(iteration_ms, max_utilisation, balance, weights: Weights):
    """``T^w_t · M^w_m · B^w_b`` (T in seconds); ``inf`` for infeasible plans (T = inf)."""
    with np.errstate(over="ignore"):
        return np.exp(log_score(iteration_ms, max_utilisation, balance, weights))


# --------------------------------------------------------------------------- the recommended plan
#
# MemX's weighted product trades time for memory headroom at a fixed exchange rate, even
# when the headroom buys nothing: once a plan fits, a GPU at 28 % of its memory is no safer
# than one at 72 % unless the prediction could be 40 % off. The recommended plan asks the
# question the user has instead: the fastest plan that will not run out of memory, given
# how wrong the memory prediction can be for each GPU type.
#
#   1. risk-feasible: every GPU's predicted peak, widened by the expected error of the
#      memory prediction for its GPU type (MemoryErrorBand), is within its capacity (and the
#      plan is feasible under the site's safety margin as well);
#   2. the fastest risk-feasible plan sets the time T0;
#   3. among risk-feasible plans within TIME_NOISE of T0 -- differences the time prediction
#      cannot tell apart -- the one with the lowest widened worst-GPU utilisation (whole
#      percent) wins, then the better balanced, then the faster, then the lower plan index.

#: Objectives ``--objective`` accepts: ``recommended`` (the default) and ``memx`` (the weighted product).
OBJECTIVES = ("recommended", "memx")
#: Plans this close in predicted time count as equally fast. The time predictor's error on
#: held-out runs is far larger (benchmarks/end_to_end.py), but most of it is shared by plans
#: on the same GPUs; 2 % is the spread of repeated measurements of one plan on a quiet node
#: (benchmarks/top1_cpu.py --repeat), i.e. below it a measurement cannot rank two plans.
TIME_NOISE = 0.02
#: Held-out runs of a GPU type needed before its own leave-one-out error replaces the table.
MIN_RUNS_FOR_OWN_BAND = 3


@dataclass(frozen=True, kw_only=True)
class MemoryErrorBand:
    """The expected relative error of one GPU type's predicted peak memory, and its source."""

    gpu_type: str
    fraction: float
    basis: str  # measured | imported | augmented | datasheet-only | calibrated | verify-loo
    source: str  # where the number comes from (a benchmark line, or the site's own runs)

    def label(self) -> str:
        return f"+-{self.fraction:.0%} ({self.basis})"

    def short_source(self) -> str:
        """The source in a few words: the statistic and the script (the full line is in ``source``)."""
        stat, _, where = self.source.partition(": ")
        return f"{stat.split(' (')[0]}, {where.split(',')[0]}" if where else stat


def _error_table() -> dict:
    from importlib import resources

    import yaml
    text = resources.files("memx_hpc.data").joinpath("memory_error.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def table_band(gpu_type: str, basis: Basis) -> MemoryErrorBand:
    """The shipped expected error (data/memory_error.yaml, a row per ``basis.kind``) for a GPU
    type whose numbers come from ``basis``; a kind the table has no row for gets the widest
    (datasheet-only) row."""
    table = _error_table()
    known = basis.kind in table
    row = table[basis.kind] if known else table["datasheet-only"]
    return MemoryErrorBand(gpu_type=gpu_type, fraction=float(row["fraction"]),
                           basis=basis.label() if known else "datasheet-only",
                           source=f"{row['statistic']}: {row['benchmark']}")


def memory_error_bands(bases: Mapping[str, Basis], *, calibrated: Iterable[str] = (),
                       held_out: Sequence = ()) -> dict[str, MemoryErrorBand]:
    """Per GPU type of the site, the band the recommended plan widens its peak by.

    ``bases``: GPU type -> the cost model's :class:`~memx_hpc.model.api.Basis` for it.
    ``calibrated``: GPU types whose device overhead the site's end-to-end runs
    calibrate. ``held_out``: (:class:`memx_hpc.model.calibrate.HeldOut`, its E2ERecord) pairs
    of those runs (each run predicted by a calibration fitted on the others); a GPU type with at least
    :data:`MIN_RUNS_FOR_OWN_BAND` of them gets its own mean absolute error, never less
    than the table's calibrated row (a few lucky runs do not make a band narrower than
    what 12 runs elsewhere showed)."""
    cal = set(calibrated)
    own = _held_out_errors(held_out)
    out = {}
    for g, basis in bases.items():
        band = table_band(g, Basis(kind="calibrated") if g in cal else basis)
        errs = own.get(g, [])
        if g in cal and len(errs) >= MIN_RUNS_FOR_OWN_BAND:
            frac = max(sum(errs) / len(errs), band.fraction)
            band = MemoryErrorBand(gpu_type=g, fraction=frac, basis="verify-loo",
                                   source=f"leave-one-out over this site's {len(errs)} end-to-end runs of {g} "
                                          f"(mean absolute error {sum(errs) / len(errs):.1%}; floor: {band.source})")
        out[g] = band
    return out


def _held_out_errors(held_out: Sequence) -> dict[str, list[float]]:
    """Per GPU type, |predicted - measured| / measured of the largest footprint on that type,
    one value per held-out run. ``held_out``: (HeldOut, E2ERecord) pairs."""
    out: dict[str, list[float]] = {}
    for h, rec in held_out:
        types = rec.gpu_type_by_rank or {}
        meas_by_rank = rec.peak_footprint_bytes_by_rank or {}
        for g in sorted(set(types.values())):
            meas = max((v for r, v in meas_by_rank.items() if types.get(r) == g), default=0)
            pred = max((s.peak_bytes for s in h.after.stages if s.gpu_type == g), default=0)
            if meas > 0 and pred > 0:
                out.setdefault(g, []).append(float(ape(pred, meas)) / 100.0)  # as a fraction
    return out


def band_fraction(bands: Mapping[str, "MemoryErrorBand | float"], gpu_type: str) -> float:
    """The band of ``gpu_type`` as a fraction; 0 for a type ``bands`` does not name (the
    search widens by what it is given, as the vectorised composition does)."""
    b = bands.get(gpu_type)
    if b is None:
        return 0.0
    return float(b.fraction if isinstance(b, MemoryErrorBand) else b)


def risk_utilisation(prediction, bands: Mapping[str, "MemoryErrorBand | float"]) -> float:
    """Worst GPU's predicted peak widened by its type's band, as a fraction of its capacity."""
    return max(s.peak_bytes * (1.0 + band_fraction(bands, s.gpu_type)) / s.capacity_bytes
               for s in prediction.stages)


def risk_feasible(prediction, bands) -> bool:
    """Feasible under the site's margin and, widened by the band, within capacity."""
    return bool(prediction.feasible) and risk_utilisation(prediction, bands) <= 1.0


def tie_key(risk_util, balance):
    """Within the time noise: the lower widened worst-GPU utilisation wins, counted in whole
    percent (finer differences are far inside the error band); equal percentages go to the
    better balance. One number: percent x 1000 + balance (balance < 1000)."""
    r = np.floor(np.asarray(risk_util, dtype=np.float64) * 100.0 + 1e-9)
    return r * 1000.0 + np.minimum(np.asarray(balance, dtype=np.float64), 999.0)


def in_time_band(iteration_ms, noise: float = TIME_NOISE) -> np.ndarray:
    """Step 3's band: which of these (risk-feasible) plans are within ``noise`` of the fastest."""
    t = np.asarray(iteration_ms, dtype=np.float64)
    if not len(t):
        return np.zeros(0, dtype=bool)
    return t <= t.min() * (1.0 + noise)


def band_order(iteration_ms, key, index) -> np.ndarray:
    """Step 3's order of the plans in the band: by :func:`tie_key`, then time, then plan index."""
    return np.lexsort((np.asarray(index), np.asarray(iteration_ms), np.asarray(key)))


def pick_recommended(iteration_ms, risk_util, balance, feasible, *, noise: float = TIME_NOISE) -> int | None:
    """Position of the recommended plan in a list of predicted plans (None: no plan is
    risk-feasible): the rule above, with the pieces the search applies (:func:`in_time_band`,
    :func:`tie_key`, :func:`band_order`), for callers that hold a handful of plans
    (benchmarks, tests)."""
    t = np.asarray(iteration_ms, dtype=np.float64)
    r = np.asarray(risk_util, dtype=np.float64)
    ok = np.asarray(feasible, dtype=bool) & (r <= 1.0) & np.isfinite(t)
    idx = np.flatnonzero(ok)
    if not len(idx):
        return None
    band = idx[in_time_band(t[idx], noise)]
    key = tie_key(r[band], np.asarray(balance, dtype=np.float64)[band])
    return int(band[band_order(t[band], key, band)[0]])
