"""Prediction error, one definition for the whole project: absolute percentage error
(APE) and its mean (MAPE), as the accuracy benchmarks, ``memx-hpc verify`` and the
calibration report them."""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

__all__ = ["ape", "mape"]


def ape(pred, true) -> np.ndarray:
    """Absolute percentage errors ``|pred - true| / |true|``, in %, element by element."""
    pred = np.asarray(pred, dtype=np.float64)
    true = np.asarray(true, dtype=np.float64)
    return np.abs(pred - true) / np.abs(true) * 100.0


def mape(pred: Iterable[float | None], true: Iterable[float | None]) -> float | None:
    """Mean APE (%) over the pairs that can be scored: a finite prediction and a positive,
    finite measurement (a run that measured nothing, or a plan that was not predicted, is
    left out, not counted as an error). None when no pair can be scored."""
    pairs = [(float(p), float(t)) for p, t in zip(pred, true)
             if p is not None and t is not None and math.isfinite(p) and math.isfinite(t) and t > 0]
    if not pairs:
        return None
    p, t = zip(*pairs)
    return float(ape(p, t).mean())
