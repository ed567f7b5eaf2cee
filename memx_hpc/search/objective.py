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

import numpy as np

from ..errors import SpecError

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
    """``"time=1,memory=0.5,balance=0.5"`` -> Weights; names left out keep their default.

    Unknown names, repeated names, non-numbers and negative values raise SpecError
    naming the offending item and the allowed names.
    """
    base = default or Weights()
    if text is None or not text.strip():
        return base
    values = {n: getattr(base, n) for n in WEIGHT_NAMES}
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
