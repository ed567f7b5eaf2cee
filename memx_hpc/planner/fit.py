"""The predictor fitted on the profile store and its error measured (``memx-hpc fit``): a
:class:`FitRequest` in, a :class:`FitResult` out."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager

from ..errors import SpecError
from ..model.assemble import start_store, store_paths
from ..spec import Site, load_site

if TYPE_CHECKING:
    from ..model.predictor import Predictor

__all__ = ["FitRequest", "FitResult", "fit"]


@dataclass(frozen=True, kw_only=True)
class FitRequest:
    """What to fit: the predictor of ``site`` (a spec or the path of its YAML file) on every
    sample of ``store`` (None: the site's). ``out``: where to save it (None: beside the
    store). ``cross_validate``: also measure its leave-one-micro-batch-size-out error;
    ``augment``: fit with interpolation augmentation; ``reference``: as
    :attr:`memx_hpc.planner.PlanRequest.reference`; ``progress``: the cross-validation's
    progress bar, the booster's progress lines and the store's start on stderr."""

    site: Site | str | Path
    store: str | Path | None = None
    out: str | Path | None = None
    cross_validate: bool = True
    augment: bool = True
    reference: bool | None = None
    progress: bool = True


@dataclass(frozen=True, kw_only=True)
class FitResult:
    """A fitted and saved predictor. ``samples``: the store's samples it was fitted on;
    ``cross_validation``: :func:`memx_hpc.model.predictor.cross_validate`'s summary (None
    when not asked for); ``notes``: what starting the store found."""

    store: Path
    path: Path
    predictor: "Predictor"
    samples: int
    gpu_types: tuple[str, ...]
    cross_validation: dict | None
    notes: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        p = self.predictor
        return {"store": str(self.store), "predictor": str(self.path), "identity": p.identity,
                "data_hash": p.data_hash_, "samples": self.samples, "rows_fitted": p.n_samples_,
                "provenance": {g: p.provenance(g) for g in self.gpu_types}, "cross_validation": self.cross_validation}


def _no_step(label: str) -> ContextManager[Any]:
    return contextlib.nullcontext()


def _ignore(note: str) -> None:
    pass


def fit(request: FitRequest, *, step: Callable[[str], ContextManager[Any]] = _no_step,
        note: Callable[[str], None] = _ignore) -> FitResult:
    """Fit the predictor on the store's samples (SpecError when there is no store or it holds
    none), cross-validate it when asked, and save it. ``step(label)`` wraps each long step
    (reading, cross-validation, fitting), so that a caller can show it running; ``note`` gets
    each note of starting the store at once (they are also in the result)."""
    # XGBoost, h5py and the predictor's features load here, not when the planner is imported:
    # the CLI's --help and light commands do without them
    from ..model.api import with_store_figures
    from ..model.predictor import Predictor, cross_validate
    from ..profile.store import ProfileStore
    from ..search.report import ProgressBar

    site = request.site if isinstance(request.site, Site) else load_site(request.site)
    store_path = store_paths(site, request.store).store
    notes: list[str] = []
    start_store(site, store_path, notes, reference=request.reference, progress=request.progress)
    for n in notes:
        note(n)
    if not store_path.is_file():
        raise SpecError("profile store not found; run 'memx-hpc profile' or 'memx-hpc profile import' first",
                        file=str(store_path))
    with step(f"fit: reading {store_path}"):
        store = ProfileStore(store_path)
        samples = store.samples()
        gpus = with_store_figures(site, store)  # CPU "devices": the speeds measured when profiling
    if not samples:
        raise SpecError("the profile store holds no samples", file=str(store_path))
    kw = {"augment": request.augment}
    cv = None
    if request.cross_validate:
        with step(f"fit: cross-validation on {len(samples):,} samples (one fit per held-out micro-batch size)"):
            cv = cross_validate(samples, gpus, progress=ProgressBar("fit: cross-validation folds",
                                                                   enabled=request.progress), **kw)
    with step(f"fit: fitting the predictor on {len(samples):,} samples"):
        predictor = Predictor(**kw)
        if request.progress:
            predictor.progress = lambda line: print(line, file=sys.stderr, flush=True)  # every 2 s of boosting
        predictor.fit(samples, gpus)
        predictor.progress = None
    out = Path(request.out) if request.out else store_paths(site, store_path).predictor
    predictor.save(out)
    return FitResult(store=store_path, path=out, predictor=predictor, samples=len(samples),
                     gpu_types=tuple(sorted({s.point.gpu_type for s in samples})), cross_validation=cv,
                     notes=tuple(notes))
