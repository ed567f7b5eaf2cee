"""The fitted cost model: one XGBoost model with two outputs (time, memory).

What it learns. For each sample the analytic model gives a base estimate — the
per-kernel roofline time on the GPU's datasheet numbers and the Korthikanti et al.
activation bytes. The model learns the *log ratio* of the measurement to that base
(``log(measured / base)``), two targets in one booster. Predicting the ratio keeps the
physics (a layer twice the FLOPs takes about twice the time, on any GPU) and leaves to
the trees only what the datasheet does not say: achieved efficiency, kernel overheads,
allocator behaviour. That is what lets it estimate a GPU type, a model or a size that
is not in the data. ``benchmarks/accuracy.py`` measures this choice against predicting
log time directly (the "no physics features" ablation).

Missing targets. Not every sample carries both numbers (Cephalo has no memory; a
memory-only measurement has no time). Before the two-output fit each missing target is
set to the analytic prior (log ratio 0: "the formula holds"), which shrinks the memory
output toward Korthikanti et al. wherever nothing was measured. ``impute="model"``
imputes with a single-output model fitted on the rows that have the target instead. On
Sailor's llm_info.json the two are close (one model held out: 11.1 % vs 11.6 % MAPE; one
TP held out between profiled ones: 0.8 % vs 1.5 %); the prior is kept because it costs
no extra fit and cannot carry an imputer's extrapolation into the joint fit (an earlier
version, fitted also on Sailor's embedding/head bytes, reached 48 % that way).

Who answers the time. The trees do not, wherever a GPU chip has measurements: there
:mod:`memx_hpc.model.anchors` answers -- the measurement itself at a measured point (the
GH200 OPT-350 TP 4 layer is its sample, not 1.30x it), log-log interpolation along a
measured series, and beyond the measured range or for a shape never run on the chip the
roofline times an achieved-efficiency curve learned from all measured chips plus the
chip's own offset (monotone in work, never below the roofline, labelled
``extrapolated``). A chip never measured gets the same curve at the median chip's offset:
the efficiency measured chips reach on work of the same size relative to the GPU. This
replaced a second booster that saw the neighbouring profiled points: its interpolation
error was similar (2.7 % / 2.2 % on held-out micro-batches), but it returned 1.30x a
profiled sample, and outside the profiled shapes the trees' flat edges made an A100 layer
at hidden 12288 and TP 8 13x its roofline and TP 2 slower than TP 1. The pooled curve
also beat this booster on unseen chips in the dev split of ``benchmarks/accuracy.py``
(leave-one-type-out mean 31 % vs 37 %; H100-NVL from pre-Hopper types 17 % vs 28 %).
The booster stays for a query of a kind and precision class no chip has measured, and
for a memory residual (bounded by :data:`MEMORY_RESIDUAL_BOUND`, which the dev split set
to 0: memory is the measured series' where one exists on any GPU, else the formula).

Persistence. ``save`` writes XGBoost's ``.ubj`` with the training-data hash, the feature
schema and the fitted side tables (overhead and provenance per GPU type) stored as
booster attributes, with the anchors and their parts fits. ``load`` refuses a model whose
schema differs from this code's, or whose data hash differs from ``expected_data_hash`` (a
stale model), with a SpecError. It reads those attributes from the start of the file
itself (:func:`_ubj_attributes`) and hands the trees to XGBoost only when a query needs
them: a plan whose every layer the anchors answer is predicted without importing XGBoost
(and the scikit-learn and SciPy it imports), which was a third of a warm ``predict``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import uuid
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import SpecError, SystemFailure
from ..spec import LayerSample, transformer_impls
from . import anchors as anchors_mod
from . import augment as augment_mod
from . import features
from .api import (PROVENANCES, QUERY_KINDS, Basis, LayerQuery, analytic_activation_bytes, code_fingerprint, default_overhead_bytes,
                  resolve_gpu, roofline_ms, roofline_terms)
from .metrics import ape  # noqa: F401 (error_summary below; importers of predictor.ape keep working)

MODEL_FORMAT = "memx-predictor"
MODEL_FORMAT_VERSION = 2  # 2: measured anchors instead of a neighbour booster

#: Hyperparameters, fixed a priori for small tabular data (a few thousand rows, ~35
#: features): shallow trees, shrinkage and row/column subsampling against memorising.
#: 200 trees: 400 gave the same benchmark errors (within 0.3 points) at twice the time.
#: Monotone constraints (ratio rising with peak throughput, falling with FLOPs per GPU)
#: were tried on six Cephalo types held out and made the unseen-GPU error worse (19.7 %
#: -> 21.8 %); none are used.
#: The booster's memory output is a residual on the analytic (Korthikanti et al.) bytes for
#: shapes no series measured, bounded to a factor exp(+-bound). On the dev split (Sailor's
#: llm_info.json, one model held out) any learned residual made it worse than the formula
#: alone (14.0 % at bound 0.1 and 0.3, 10.3 % at 0), so the bound is 0: the formula stands
#: wherever nothing of that shape was measured; measured series anchor the rest.
MEMORY_RESIDUAL_BOUND = 0.0
#: Largest log ratio to the roofline the datasheet booster may give (e^4.5 = 90x: below any
#: layer's measured ratio here) -- and the smallest is 0: never faster than the roofline.
MAX_LOG_RATIO = 4.5

DEFAULT_PARAMS = {
    "n_estimators": 200,
    "max_depth": 5,
    "learning_rate": 0.05,
    "subsample": 0.8,
    "colsample_bytree": 0.8,
    "min_child_weight": 2.0,
    "reg_lambda": 1.0,
}


def sample_key(s: LayerSample) -> tuple:
    """The fields of a sample that a fit depends on, as ``(name, value)`` pairs (the point's
    fields, its shape's nested, then the measured values; canonical, for hashing)."""
    return (("point", anchors_mod.named_values(s.point)), ("fwd", round(float(s.forward_ms), 9)),
            ("bwd", round(float(s.backward_ms), 9)), ("act", int(s.activation_bytes)),
            ("peak", int(s.peak_allocated_bytes)), ("foot", int(s.device_footprint_bytes)),
            ("inf", bool(s.infeasible)), ("origin", str(s.origin)), ("w", round(float(s.weight), 9)))


def samples_hash(samples: Sequence[LayerSample]) -> str:
    """Order-independent SHA-256 of the samples' contents: of the sorted digests of each
    sample's :func:`sample_key` as ``repr`` writes it (floats in their shortest round-trip
    form; a tenth of the cost of canonical JSON, which was most of a warm ``predict``)."""
    rows = sorted(hashlib.sha256(repr(sample_key(s)).encode()).hexdigest() for s in samples)
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()


def usable(s: LayerSample) -> bool:
    """Samples the predictor learns from: layer/embedding/head, feasible, with a time or memory."""
    return (s.point.kind in QUERY_KINDS and not s.infeasible
            and (s.forward_ms + s.backward_ms > 0 or s.activation_bytes > 0))


def _xgb():
    # deferred: importing xgboost imports scikit-learn and SciPy (~0.6 s, a third of a
    # warm ``predict``); a loaded predictor imports it only when a query needs the booster
    import xgboost
    return xgboost


_UBJ_INT = {b"i": (1, True), b"U": (1, False), b"I": (2, True), b"l": (4, True), b"L": (8, True)}


def _ubj_attributes(data: bytes) -> dict[str, str] | None:
    """The booster attributes of an XGBoost UBJSON model (``learner.attributes``), read from
    the start of the file without XGBoost; None where the file does not begin as XGBoost
    writes it (``{"learner": {"attributes": {...}, ...}, ...}``, keys sorted), so that the
    caller loads it through XGBoost and reports what XGBoost says. UBJSON: ubjson.org,
    draft 12 (a key is a length then UTF-8 bytes; a string value is ``S``, a length, bytes)."""
    pos = 0

    def byte() -> bytes:
        nonlocal pos
        b = data[pos:pos + 1]
        pos += 1
        return b

    def length() -> int:
        nonlocal pos
        size_signed = _UBJ_INT.get(byte())
        if size_signed is None:
            raise ValueError("not a UBJSON length")
        size, signed = size_signed
        n = int.from_bytes(data[pos:pos + size], "big", signed=signed)
        pos += size
        if n < 0 or pos + n > len(data):
            raise ValueError("UBJSON length out of range")
        return n

    def text() -> str:
        nonlocal pos
        n = length()
        pos += n
        return data[pos - n:pos].decode("utf-8")

    try:
        if byte() != b"{" or text() != "learner" or byte() != b"{" or text() != "attributes" or byte() != b"{":
            return None
        out: dict[str, str] = {}
        while data[pos:pos + 1] != b"}":
            key = text()
            if byte() != b"S":
                return None
            out[key] = text()
        return out
    except (ValueError, UnicodeDecodeError):
        return None


class Predictor:
    """Dual-output XGBoost cost model implementing :class:`memx_hpc.model.api.CostModel`.

    Parameters (all keyword): ``augment`` (interpolation augmentation before fitting),
    ``physics`` (learn ratios to the analytic model, with the physics features; False:
    learn log time and log bytes from shape and datasheet features only), ``dual_output``
    (one two-output booster; False: two single-output boosters), ``seed``, ``nthread``,
    and XGBoost hyperparameters overriding :data:`DEFAULT_PARAMS`.

    ``nthread`` defaults to 1: these fits are small (seconds), and on a shared 2-core
    login node OpenMP threads that wait for each other made a 200-tree fit of the shared
    data take 30 s of wall time with 2 threads against 2.6 s with one (load ~7).
    """

    def __init__(self, *, augment: bool = True, physics: bool = True, dual_output: bool = True,
                 anchors: bool = True, impute: str = "prior",
                 augment_weight: float = augment_mod.DEFAULT_WEIGHT, seed: int = 0, nthread: int = 1,
                 **xgb_params: Any) -> None:
        unknown = set(xgb_params) - set(DEFAULT_PARAMS)
        if unknown:
            raise SpecError("unknown predictor parameter", found=sorted(unknown), allowed=", ".join(DEFAULT_PARAMS))
        if impute not in ("model", "prior"):
            raise SpecError("unknown imputation", field="impute", found=impute, allowed="model, prior")
        self.augment = augment
        self.anchors = anchors
        self.impute = impute
        self.physics = physics
        self.dual_output = dual_output
        self.augment_weight = augment_weight
        self.seed = seed
        self.nthread = nthread
        self.params = {**DEFAULT_PARAMS, **xgb_params}
        self.gpus: Any = None
        #: a callable taking one line of progress (e.g. print to stderr) while fitting, or None
        self.progress: Any = None

    # ------------------------------------------------------------------ fitting

    def _settings(self) -> dict[str, Any]:
        return {"augment": self.augment, "physics": self.physics, "dual_output": self.dual_output,
                "anchors": self.anchors, "impute": self.impute,
                "augment_weight": self.augment_weight, "seed": self.seed, **self.params}

    def _booster_params(self) -> dict[str, Any]:
        p = self.params
        return {"objective": "reg:squarederror", "tree_method": "hist", "max_depth": p["max_depth"],
                "eta": p["learning_rate"], "subsample": p["subsample"], "colsample_bytree": p["colsample_bytree"],
                "min_child_weight": p["min_child_weight"], "lambda": p["reg_lambda"], "seed": self.seed,
                "nthread": self.nthread, "verbosity": 0}

    def _train(self, X: np.ndarray, Y: np.ndarray, w: np.ndarray, names: Sequence[str]):
        xgb = _xgb()
        d = xgb.DMatrix(X, label=Y, weight=w, feature_names=list(names), nthread=self.nthread)
        rounds = int(self.params["n_estimators"])
        callbacks = [_progress_callback(self.progress, rounds, len(X))] if self.progress is not None else None
        return xgb.train(self._booster_params(), d, num_boost_round=rounds, callbacks=callbacks)

    def _targets(self, samples: Sequence[LayerSample], base: np.ndarray) -> np.ndarray:
        t = np.array([s.forward_ms + s.backward_ms for s in samples], dtype=np.float64)
        m = np.array([s.activation_bytes for s in samples], dtype=np.float64)
        Y = np.full((len(samples), 2), np.nan)
        ok_t, ok_m = t > 0, m > 0
        if self.physics:
            Y[ok_t, 0] = np.log(t[ok_t] / base[ok_t, 0])
            Y[ok_m, 1] = np.log(m[ok_m] / base[ok_m, 1])
        else:
            Y[ok_t, 0] = np.log(t[ok_t])
            Y[ok_m, 1] = np.log(m[ok_m])
        return Y

    def _fit_boosters(self, X: np.ndarray, Y: np.ndarray, w: np.ndarray, base: np.ndarray,
                      names: Sequence[str]) -> list[Any]:
        """One two-output booster (or two single-output ones) on rows ``X`` with targets ``Y``
        (NaN: unknown). Unknown targets are imputed first (see the module docstring)."""
        have = ~np.isnan(Y)
        prior = np.zeros_like(Y) if self.physics else np.log(base)
        if not self.dual_output:
            return [self._train(X[have[:, j]], Y[have[:, j], j], w[have[:, j]], names) if have[:, j].any() else None
                    for j in range(2)]
        Yf = Y.copy()
        for j in range(2):
            miss = ~have[:, j]
            if not miss.any():
                continue
            if self.impute == "model" and have[:, j].any():
                imp = self._train(X[have[:, j]], Y[have[:, j], j], w[have[:, j]], names)
                Yf[miss, j] = imp.predict(_xgb().DMatrix(X[miss], feature_names=list(names)))
            else:
                # the analytic prior (ratio 1): shrink toward the formula where nothing was measured
                Yf[miss, j] = prior[miss, j]
        return [self._train(X, Yf, w, names)]

    def fit(self, samples: Sequence[LayerSample], site_or_catalog: Any) -> "Predictor":
        """Fit on ``samples`` (GPU names resolve through ``site_or_catalog``); returns self."""
        return self._fit(samples, site_or_catalog)

    def _fit(self, samples: Sequence[LayerSample], site_or_catalog: Any, *, lazy: bool = False,
             anchors: "anchors_mod.Anchors | None" = None) -> "Predictor":
        """:meth:`fit`. ``lazy``: augment and train the boosters when a query first needs
        them, and leave out what predictions do not use (the row count, provenance and
        overhead tables, the data hash and identity): for :func:`cross_validate`, whose
        held-out points the anchors answer, so that its folds fit no trees; the boosters
        come out the same either way. ``anchors``: the anchors of these samples, built already."""
        train = [s for s in samples if usable(s)]
        if not train:
            raise SpecError("no usable samples to fit on (layer/embedding/head samples with a time or memory)",
                            found=len(samples))
        self.gpus = site_or_catalog
        real = [s for s in train if s.origin != "augmented"]
        derived = [s for s in train if s.origin == "augmented"]
        self.transformer_impls_ = transformer_impls(real)  # refuses a GPU type measured with two
        self.feature_names_ = features.feature_names(physics=self.physics)
        # A target is known where it was measured (see _targets: NaN elsewhere). Augmented
        # rows are interpolated between measured ones, so they neither add nor remove one.
        if not any(s.forward_ms + s.backward_ms > 0 for s in train):
            raise SpecError("no sample carries a time; the predictor needs forward/backward times")
        self.has_memory_ = any(s.activation_bytes > 0 for s in train)

        def training_rows() -> list[LayerSample]:
            extra = augment_mod.augment(real, weight=self.augment_weight) if self.augment else []
            return real + derived + extra

        rows = [] if lazy else training_rows()

        def boosters() -> list[Any]:
            rows_ = rows or training_rows()
            queries = [features.query_of(s) for s in rows_]
            X, base = features.build(queries, site_or_catalog, physics=self.physics)
            Y = self._targets(rows_, base)
            w = np.array([s.weight for s in rows_], dtype=np.float64)
            return self._fit_boosters(X, Y, w, base, self.feature_names_)

        if lazy:
            self._lazy_boosters = boosters
        else:
            self.boosters_ = boosters()
        if anchors is None:
            anchors = anchors_mod.Anchors.from_samples(real if self.anchors else [])
        self.anchors_ = anchors.bind(site_or_catalog)
        if lazy:
            return self
        self.n_samples_ = len(rows)
        self.provenance_ = self._provenance_table(rows, site_or_catalog)
        self.overhead_ = self._overhead_table(rows, site_or_catalog)
        self.data_hash_ = samples_hash(train)
        self.identity = hashlib.sha256(json.dumps(
            {"format": MODEL_FORMAT, "version": MODEL_FORMAT_VERSION, "schema": features.FEATURE_SCHEMA_VERSION,
             "features": list(self.feature_names_), "data": self.data_hash_, "settings": self._settings(),
             "code": code_fingerprint()},
            sort_keys=True).encode()).hexdigest()
        return self

    @staticmethod
    def _name(gpus: Any, name: str) -> str:
        try:
            return resolve_gpu(gpus, name).name
        except Exception:  # a GPU type the site does not know: keep its own name
            return name

    @classmethod
    def _provenance_table(cls, train: Sequence[LayerSample], gpus: Any) -> dict[str, str]:
        rank = {"measured": 0, "imported": 1, "augmented": 2}
        out: dict[str, str] = {}
        names: dict[str, str] = {}  # thousands of samples, a few dozen GPU names
        for s in train:
            g = names.get(s.point.gpu_type)
            if g is None:
                g = names[s.point.gpu_type] = cls._name(gpus, s.point.gpu_type)
            cur = out.get(g)
            if cur is None or rank[s.origin] < rank[cur]:
                out[g] = s.origin
        return out

    @classmethod
    def _overhead_table(cls, train: Sequence[LayerSample], gpus: Any) -> dict[str, int]:
        """Median of (device footprint - peak allocated) over samples that measured both."""
        per: dict[str, list[int]] = {}
        names: dict[str, str] = {}
        for s in train:
            if s.device_footprint_bytes > 0 and s.peak_allocated_bytes > 0:
                g = names.get(s.point.gpu_type)
                if g is None:
                    g = names[s.point.gpu_type] = cls._name(gpus, s.point.gpu_type)
                per.setdefault(g, []).append(
                    s.device_footprint_bytes - s.peak_allocated_bytes)
        return {g: int(np.median(v)) for g, v in per.items()}

    # ------------------------------------------------------------------ CostModel

    @property
    def boosters_(self) -> list[Any]:
        """The XGBoost boosters (None for an output without one); a loaded predictor builds
        them from the file's bytes on first use."""
        if "_boosters" not in self.__dict__:
            make = self.__dict__.get("_lazy_boosters")
            if make is None:
                raise AttributeError("boosters_")
            self._boosters = make()
            del self._lazy_boosters
        return self._boosters

    @boosters_.setter
    def boosters_(self, boosters: list[Any]) -> None:
        self._boosters = boosters
        self.__dict__.pop("_lazy_boosters", None)

    def _check_fitted(self) -> None:
        if "_boosters" not in self.__dict__ and "_lazy_boosters" not in self.__dict__:
            raise SpecError("the predictor is not fitted; call fit() or Predictor.load()")

    def predict(self, queries: Sequence[LayerQuery]) -> np.ndarray:
        """``(n, 2)``: forward+backward ms of one layer per micro-batch, activation bytes kept.

        Time: where the query's GPU chip has measurements, the anchors answer (the
        measurement itself at a measured point; log-log interpolation between measured
        points; beyond them the nearest measured efficiency times the roofline ratio of the
        work: :mod:`memx_hpc.model.anchors`); a chip never measured gets the datasheet
        booster's efficiency. Never below the roofline. Memory: the measured ratio to the
        analytic bytes along a measured series, else the analytic prior times the
        booster's residual bounded to ``exp(+-MEMORY_RESIDUAL_BOUND)``.
        :meth:`explain` says which answered each query.
        """
        return self._predict(queries)[0]

    def explain(self, queries: Sequence[LayerQuery]) -> list[str]:
        """Per query: ``measured`` (a measured point), ``interpolated`` (between measured
        points of that GPU chip), ``extrapolated`` (beyond them: nearest measured point scaled
        by the roofline ratio of the work) or ``datasheet-only``; an FP8 layer adds
        ``+fp8-roofline`` (its 16-bit twin's answer scaled by the roofline's FP8 ratio). A layer
        no sample of its kind measured (an MoE layer, multi-latent attention) adds, after
        ``"; "``, the roofline terms it is built from (:func:`~memx_hpc.model.api.roofline_terms`)."""
        how = self._predict(queries)[1]
        out = []
        for q, h in zip(queries, how):
            if q.kind == "layer" and (q.shape.is_moe or q.shape.multi_latent_attention) and h != "measured":
                h = f"{h}; {roofline_terms(q, resolve_gpu(self.gpus, q.gpu_type))}"
            out.append(h)
        return out

    def _predict(self, queries: Sequence[LayerQuery]) -> tuple[np.ndarray, list[str]]:
        self._check_fitted()
        if not len(queries):
            return np.empty((0, 2), dtype=np.float64), []
        if any(q.fp8 for q in queries):
            return self._predict_fp8(queries)
        return self._predict_16bit(queries)

    def _predict_fp8(self, queries: Sequence[LayerQuery]) -> tuple[np.ndarray, list[str]]:
        """FP8 layers until an FP8 layer is profiled: the 16-bit twin's prediction (what was
        measured, interpolated or extrapolated at bf16) times the roofline's ratio of the FP8
        layer to the 16-bit one -- the linear GEMMs at the catalog's fp8 rate, the attention
        scores at the 16-bit rate, plus Transformer Engine's cast traffic
        (:func:`memx_hpc.model.api.roofline_components`). Memory: the twin's activation bytes
        times the analytic ratio of the FP8 layer's to the 16-bit one's (Transformer Engine
        keeps the FP8 copies of the GEMM inputs for backward in place of 16-bit ones:
        :func:`memx_hpc.model.analytic.activation_bytes_per_layer`); the FP8 weight copies
        are state (:func:`memx_hpc.model.analytic.fp8_weight_bytes`)."""
        twins = [dataclasses.replace(q, fp8="") if q.fp8 else q for q in queries]
        out, how = self._predict_16bit(twins)
        out = out.copy()
        for i, q in enumerate(queries):
            if q.fp8:
                g = resolve_gpu(self.gpus, q.gpu_type)
                out[i, 0] *= roofline_ms(q, g) / roofline_ms(twins[i], g)
                out[i, 1] *= analytic_activation_bytes(q) / max(analytic_activation_bytes(twins[i]), 1)
                how[i] = how[i] + "+fp8-roofline"
        return out, how

    def _predict_16bit(self, queries: Sequence[LayerQuery]) -> tuple[np.ndarray, list[str]]:
        X, base = features.build(queries, self.gpus, physics=self.physics)
        n = len(queries)
        # log ratios to the roofline / analytic bytes: the anchors' where they answer, else
        # the booster's (NaN: not answered by the anchors)
        anchored = np.full((n, 2), np.nan)
        how = ["datasheet-only"] * n
        if self.anchors:
            anchors = self.anchors_.bind(self.gpus)
            cache: dict[str, Any] = {}
            for i, q in enumerate(queries):
                g = cache.get(q.gpu_type)
                if g is None:
                    g = cache[q.gpu_type] = resolve_gpu(self.gpus, q.gpu_type)
                rt, rm, h = anchors.answer(q, g)
                if math.isnan(rm):
                    rm = anchors.memory(q)
                if not math.isnan(rm):
                    anchored[i, 1] = rm
                if h is None:
                    # a chip never measured: the roofline's parts at the costs the measured
                    # chips show (anchors.datasheet); the booster only where nothing of this
                    # kind and precision class was measured at all
                    anchored[i, 0] = anchors.datasheet(q, g)
                    continue
                if not math.isnan(rt):
                    anchored[i, 0] = rt
                    how[i] = h
        # The booster answers only the rows the anchors leave open: its time where nothing
        # anchored it, its memory residual where that can be nonzero. Trees predict each row
        # on its own, so the rows it is asked come out as they would in a full batch; a
        # loaded predictor whose every query is anchored never imports XGBoost.
        need_t = np.isnan(anchored[:, 0])
        need_m = np.isnan(anchored[:, 1]) & (self.has_memory_ and MEMORY_RESIDUAL_BOUND > 0)
        raw = np.zeros((n, 2))
        rows = np.flatnonzero(need_t | need_m)
        if len(rows):
            b = self._raw(self.boosters_, X[rows], base[rows], self.feature_names_)
            if not self.physics:
                b = b - np.log(base[rows])  # log ratios to the roofline / analytic bytes, as anchored
            if not self.has_memory_:
                b[:, 1] = 0.0
            b[:, 1] = np.clip(b[:, 1], -MEMORY_RESIDUAL_BOUND, MEMORY_RESIDUAL_BOUND)
            b[:, 0] = np.clip(b[:, 0], 0.0, MAX_LOG_RATIO)
            raw[rows] = b
        raw = np.where(np.isnan(anchored), raw, anchored)
        return np.exp(raw) * base, how

    def _raw(self, boosters: list[Any], X: np.ndarray, base: np.ndarray, names: Sequence[str]) -> np.ndarray:
        d = _xgb().DMatrix(X, feature_names=list(names), nthread=self.nthread)
        if len(boosters) == 1:
            return np.asarray(boosters[0].predict(d), dtype=np.float64).reshape(len(X), 2)
        raw = np.zeros((len(X), 2))
        for j, b in enumerate(boosters):
            raw[:, j] = b.predict(d) if b is not None else (0.0 if self.physics else np.log(base[:, j]))
        return raw

    def shape_profiled(self, q: LayerQuery) -> bool:
        """Whether ``q``'s layer shape (precision, attention kernel) was measured on its GPU's
        chip: if not, its times are the chip's measured efficiency scaled to the work."""
        self._check_fitted()
        return self.anchors_.bind(self.gpus).has_series(q, resolve_gpu(self.gpus, q.gpu_type))

    def _donor(self, g: Any) -> str | None:
        """The GPU type whose measurements answer for ``g``: itself, else one of its chip."""
        if g.name in self.provenance_:
            return g.name
        self.anchors_.bind(self.gpus)
        d = self.anchors_.donor(g.name, g.chip_id)
        return d if d in self.provenance_ else None

    def overhead_bytes(self, gpu_type: str) -> int:
        self._check_fitted()
        g = resolve_gpu(self.gpus, gpu_type)
        for name in (gpu_type, g.name, self._donor(g)):
            if name in self.overhead_:
                return self.overhead_[name]
        return default_overhead_bytes(g)

    def basis(self, gpu_type: str) -> Basis:
        """measured | imported | augmented | datasheet-only; a type answered by the measurements
        of another type of its chip names that type."""
        self._check_fitted()
        g = resolve_gpu(self.gpus, gpu_type)
        donor = self._donor(g)
        if donor is None:
            return Basis(kind="datasheet-only")
        p = self.provenance_[donor]
        assert p in PROVENANCES
        return Basis(kind=p, same_chip_as=None if donor == g.name else donor)

    def provenance(self, gpu_type: str) -> str:
        """:meth:`basis` as reports write it: ``imported (same chip as V100-16)``."""
        return self.basis(gpu_type).label()

    # ------------------------------------------------------------------ persistence

    def _meta(self) -> dict[str, Any]:
        return {"format": MODEL_FORMAT, "version": MODEL_FORMAT_VERSION,
                "feature_schema_version": features.FEATURE_SCHEMA_VERSION, "feature_names": list(self.feature_names_),
                "data_hash": self.data_hash_, "settings": self._settings(), "identity": self.identity,
                "code": code_fingerprint(),
                "has_memory": self.has_memory_, "n_samples": self.n_samples_, "provenance": self.provenance_,
                "overhead": self.overhead_, "global_boosters": len(self.boosters_),
                "present": [b is not None for b in self.boosters_],
                "anchors": self.anchors_.to_json(), "parts": self.anchors_.bind(self.gpus).parts_json()}

    def save(self, path: str | Path) -> Path:
        """Write ``.ubj`` (one file per booster: ``path`` and, for two single-output boosters,
        ``path`` with ``.mem`` before the suffix), metadata inside."""
        self._check_fitted()
        path = Path(path)
        if path.suffix != ".ubj":
            raise SpecError("predictor files are XGBoost UBJSON", field="path", found=str(path), allowed="*.ubj")
        meta = json.dumps(self._meta(), sort_keys=True)
        _remove_dead_temporaries(path)
        for i, b in enumerate(self.boosters_):
            if b is None:
                continue
            b.set_attr(memx_meta=meta, memx_part=str(i))
            target = path if i == 0 else path.with_name(path.stem + f".part{i}.ubj")
            # a temporary name of this process alone: two fits at once each replace whole files
            tmp = target.with_name(f".{target.stem}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp.ubj")
            try:
                raw = b.save_raw(raw_format="ubj")
            except _xgb().core.XGBoostError as e:
                raise SystemFailure(f"{target}: cannot serialise the predictor: {_xgb_reason(e)}") from None
            try:
                # Python writes the bytes, not XGBoost: a read-only folder or a full disk is
                # then an OSError that says so, not XGBoost's message ending in a C backtrace.
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(tmp, "xb") as fh:
                    fh.write(raw)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, target)  # atomic: a reader never sees half a model
            except OSError as e:
                raise SystemFailure(f"{target}: cannot write the predictor: {e.strerror or e}") from None
            finally:
                with contextlib.suppress(OSError):
                    tmp.unlink()
        return path

    @classmethod
    def load(cls, path: str | Path, expected_data_hash: str | None = None, *, site: Any = None) -> "Predictor":
        """Load a saved predictor; refuse a foreign file, another feature schema, or (when
        ``expected_data_hash`` is given) a model fitted on other data."""
        if Path(path).is_dir():
            raise SystemFailure(f"{path}: a folder where the predictor file should be")
        try:
            return cls._load(Path(path), expected_data_hash, site=site)
        except (KeyError, TypeError, ValueError, UnicodeDecodeError, *_xgb_errors()) as e:
            # random bytes, a truncated file, metadata of the wrong shape
            raise SpecError(f"not a predictor file memx-hpc can read ({type(e).__name__})", file=str(path)) from None

    @classmethod
    def _load(cls, path: Path, expected_data_hash: str | None, *, site: Any) -> "Predictor":
        if not path.is_file():
            raise SpecError("predictor file not found", file=str(path))
        data = _read_model_bytes(path)
        attrs = _ubj_attributes(data)
        b0 = None
        if attrs is None:  # not laid out as XGBoost writes UBJSON: let XGBoost read it and say why not
            b0 = _booster_from(data, path)
            raw = b0.attr("memx_meta")
        else:
            raw = attrs.get("memx_meta")
        if not raw:
            raise SpecError("an XGBoost model, but not one memx-hpc wrote (no metadata)", file=str(path))
        meta = json.loads(raw)
        if meta.get("format") != MODEL_FORMAT or meta.get("version") != MODEL_FORMAT_VERSION:
            raise SpecError("predictor file of another format or version", file=str(path),
                            found=(meta.get("format"), meta.get("version")),
                            allowed=f"{MODEL_FORMAT} v{MODEL_FORMAT_VERSION}")
        settings = meta["settings"]
        expect_names = list(features.feature_names(physics=settings.get("physics", True)))
        if (meta.get("feature_schema_version") != features.FEATURE_SCHEMA_VERSION
                or meta.get("feature_names") != expect_names):
            raise SpecError("predictor was fitted with another feature schema; refit it (memx-hpc fit)",
                            file=str(path), found=meta.get("feature_schema_version"),
                            allowed=str(features.FEATURE_SCHEMA_VERSION))
        if meta.get("code") != code_fingerprint():
            raise SpecError("predictor was fitted by another version of memx-hpc's prediction code; refit it "
                            "(memx-hpc fit)", file=str(path), found=str(meta.get("code"))[:12],
                            allowed=code_fingerprint()[:12])
        if expected_data_hash is not None and meta["data_hash"] != expected_data_hash:
            raise SpecError("predictor is stale: it was fitted on other data than the store holds now; "
                            "refit it (memx-hpc fit)", file=str(path), found=meta["data_hash"][:12],
                            allowed=expected_data_hash[:12])
        xgb_params = {k: settings[k] for k in DEFAULT_PARAMS}
        self = cls(augment=settings["augment"], physics=settings["physics"], dual_output=settings["dual_output"],
                   anchors=settings["anchors"], impute=settings["impute"], augment_weight=settings["augment_weight"],
                   seed=settings["seed"], **xgb_params)
        # the boosters' bytes are read now (one snapshot of the files) and handed to XGBoost
        # only when a query needs the trees (Predictor._predict)
        parts: list[tuple[bytes, Path] | None] = []
        for i, present in enumerate(meta["present"]):
            if not present:
                parts.append(None)
            elif i == 0:
                parts.append((data, path))
            else:
                part = path.with_name(path.stem + f".part{i}.ubj")
                if not part.is_file():
                    raise SpecError("predictor part file missing", file=str(part))
                parts.append((_read_model_bytes(part), part))
        parts = parts[:meta["global_boosters"]]
        if b0 is not None:
            self.boosters_ = [None if x is None else (b0 if j == 0 else _booster_from(*x))
                              for j, x in enumerate(parts)]
        else:
            self._lazy_boosters = lambda: [None if x is None else _booster_from(*x) for x in parts]
        self.feature_names_ = tuple(meta["feature_names"])
        self.data_hash_ = meta["data_hash"]
        self.has_memory_ = meta["has_memory"]
        self.n_samples_ = meta["n_samples"]
        self.provenance_ = meta["provenance"]
        self.overhead_ = {k: int(v) for k, v in meta["overhead"].items()}
        self.identity = meta["identity"]
        self.anchors_ = anchors_mod.Anchors.from_json(meta["anchors"], meta.get("parts"))
        if site is None:
            from ..spec.catalog import catalog
            site = catalog()
        self.gpus = site
        return self


def _xgb_errors() -> tuple[type, ...]:
    """XGBoost's error type where XGBoost is loaded (nothing to catch from it otherwise):
    an ``except`` clause that named it would import XGBoost on every error it sees."""
    import sys
    mod = sys.modules.get("xgboost")
    return (mod.core.XGBoostError,) if mod is not None else ()


def _read_model_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise SpecError(f"cannot read the predictor file: {e.strerror or e}", file=str(path)) from None


def _booster_from(data: bytes, path: Path) -> Any:
    """An XGBoost booster from a model file's bytes; SpecError naming ``path`` when XGBoost
    cannot read them."""
    xgb = _xgb()
    b = xgb.Booster()
    try:
        b.load_model(bytearray(data))
    except xgb.core.XGBoostError as e:
        raise SpecError(f"not an XGBoost model: {str(e).splitlines()[0]}", file=str(path)) from None
    return b


def fit_or_load(samples: Sequence[LayerSample], path: str | Path, site: Any, *, progress: Any = None,
                **predictor_kw: Any) -> Predictor:
    """Reuse the predictor saved at ``path`` when it was fitted on exactly these samples
    with these settings; otherwise fit one and save it there. ``progress``: a callable
    given a line now and then while a fit runs longer than 2 s."""
    path = Path(path)
    fresh = Predictor(**predictor_kw)
    fresh.progress = progress
    want = samples_hash([s for s in samples if usable(s)])
    if path.is_file():
        try:
            p = Predictor.load(path, expected_data_hash=want, site=site)
            if p._settings() == fresh._settings():
                return p
        except SpecError:
            pass  # stale, foreign or another schema: refit below
    try:
        fresh.fit(samples, site)
    finally:
        fresh.progress = None  # a caller's callback is not part of the model
    fresh.save(path)
    return fresh


def _progress_callback(say: Any, rounds: int, rows: int, every_s: float = 2.0) -> Any:
    """An XGBoost callback that gives ``say`` a line every ``every_s`` seconds of boosting
    (nothing for a short fit)."""
    import time

    class Progress(_xgb().callback.TrainingCallback):
        def __init__(self) -> None:
            super().__init__()
            self.t0 = self.last = time.monotonic()

        def after_iteration(self, model: Any, epoch: int, evals_log: Any) -> bool:
            now = time.monotonic()
            if now - self.last >= every_s:
                self.last = now
                say(f"predictor: fitting {rows:,} rows, tree {epoch + 1}/{rounds} ({now - self.t0:.0f} s)")
            return False

    return Progress()


def error_summary(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """MAPE, median and max APE (%) and the number of points."""
    e = ape(np.asarray(pred, dtype=np.float64), np.asarray(true, dtype=np.float64))
    if e.size == 0:
        return {"mape": math.nan, "median_ape": math.nan, "max_ape": math.nan, "n": 0}
    return {"mape": float(e.mean()), "median_ape": float(np.median(e)), "max_ape": float(e.max()), "n": int(e.size)}


def held_out_micro_batch_folds(samples: Sequence[LayerSample]) -> list[tuple[list[int], list[int]]]:
    """Leave-one-micro-batch-size-out folds for interpolation error: fold ``m`` trains on
    every sample whose micro-batch is not ``m`` and scores the samples at ``m`` whose series
    (GPU type, kind, shape, TP, precision, attention, recompute, source file) has profiled
    micro-batches both below and above ``m`` — interpolation, never extrapolation."""
    series: dict[tuple, set[int]] = {}

    def key(s: LayerSample) -> tuple:
        p = s.point
        return (p.gpu_type, p.kind, p.shape, p.tp, p.precision, p.attention, p.recompute, s.source.split(":")[0])

    for s in samples:
        series.setdefault(key(s), set()).add(s.point.micro_batch_size)
    folds = []
    for m in sorted({s.point.micro_batch_size for s in samples}):
        test = [i for i, s in enumerate(samples) if s.point.micro_batch_size == m
                and min(series[key(s)]) < m < max(series[key(s)])]
        if test:
            train = [i for i, s in enumerate(samples) if s.point.micro_batch_size != m]
            folds.append((train, test))
    return folds


def _fold_micro_batches(samples: Sequence[LayerSample], folds: list[tuple[list[int], list[int]]]) -> list[int]:
    """The micro-batch size each fold of :func:`held_out_micro_batch_folds` holds out."""
    return [samples[test[0]].point.micro_batch_size for _, test in folds]


def cross_validate(samples: Sequence[LayerSample], site_or_catalog: Any, *, progress: Any = None,
                   **predictor_kw: Any) -> dict[str, Any]:
    """Leave-one-micro-batch-size-out error of the predictor on ``samples``. ``progress``:
    called with (folds done, folds) after each fold.

    Returns per-target summaries (``time``: forward+backward ms; ``memory``: activation
    bytes, where measured), overall and per GPU type, and the number of folds.
    """
    data = [s for s in samples if usable(s) and s.origin != "augmented"]
    folds = held_out_micro_batch_folds(data)
    pred = np.full((len(data), 2), np.nan)
    # A fold trains on every sample of the other micro-batch sizes, so its anchors are the
    # anchors of all the data less that micro-batch size's points (Anchors.without), built
    # once; its boosters are trained only if a held-out point is not anchored.
    anchored = predictor_kw.get("anchors", True)
    whole = anchors_mod.Anchors.from_samples(data if anchored else [])
    for k, (m, (train, test)) in enumerate(zip(_fold_micro_batches(data, folds), folds)):
        p = Predictor(**predictor_kw)._fit([data[i] for i in train], site_or_catalog, lazy=True,
                                           anchors=whole.without(micro_batch_size=m))
        pred[test] = p.predict([features.query_of(data[i]) for i in test])
        if progress is not None:
            progress(k + 1, len(folds))
    scored = ~np.isnan(pred[:, 0])
    t = np.array([s.forward_ms + s.backward_ms for s in data])
    m = np.array([s.activation_bytes for s in data], dtype=np.float64)
    out: dict[str, Any] = {"folds": len(folds), "scored": int(scored.sum()), "per_gpu_type": {}}

    def summarise(mask: np.ndarray) -> dict[str, Any]:
        tm = mask & (t > 0)
        mm = mask & (m > 0)
        return {"time": error_summary(pred[tm, 0], t[tm]), "memory": error_summary(pred[mm, 1], m[mm])}

    out.update(summarise(scored))
    for g in sorted({s.point.gpu_type for s in data}):
        mask = scored & np.array([s.point.gpu_type == g for s in data])
        if mask.any():
            out["per_gpu_type"][g] = summarise(mask)
    return out


def _remove_dead_temporaries(path: Path) -> None:
    """Remove the temporary files of :meth:`Predictor.save` (``.<stem>.<PID>-<hex>.tmp.ubj``,
    also of the ``.partN`` files) whose writer no longer runs: a fit killed while saving
    leaves one that nothing else would remove. A live writer's temporaries are left alone."""
    from ..profile.store import pid_alive

    pattern = re.compile(re.escape(f".{path.stem}") + r"(\.part\d+)?\.(\d+)-[0-9a-f]{8}\.tmp\.ubj")
    with contextlib.suppress(OSError):
        for t in path.parent.iterdir():
            m = pattern.fullmatch(t.name)
            if m and int(m.group(2)) != os.getpid() and not pid_alive(int(m.group(2))):
                with contextlib.suppress(OSError):
                    t.unlink()


def _xgb_reason(e: Exception) -> str:
    """XGBoost's message without the C++ backtrace it appends (``[bt] (8) ...`` lines)."""
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip() and not ln.strip().startswith(("[bt]", "Stack trace"))]
    return lines[0] if lines else type(e).__name__
