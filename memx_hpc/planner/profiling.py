"""The profile store as ``memx-hpc profile`` works on it: the minimal set measured on the site's
partitions (:func:`profile_site`), and the store listed (:func:`list_store`), filled from
published measurements (:func:`import_samples`) and written out as CSV (:func:`export_samples`).
Each takes a typed request and answers a typed result; the CLI prints it.

The profile rooms (campaign, runner, importers, h5py) are imported inside each function:
``memx-hpc --help`` and the commands that do not touch the store do without them.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..errors import SpecError
from ..spec import Site, load_job, load_site

if TYPE_CHECKING:
    from ..model.sources import SourceReport
    from ..profile.campaign import ProfileReport
    from ..profile.link_campaign import CommReport

__all__ = ["IMPORT_FORMATS", "StoreRequest", "StoreListing", "ImportRequest", "ImportResult", "ExportRequest",
           "ExportResult", "ProfileRequest", "ProfileResult", "profile_store_path", "list_store", "import_samples",
           "export_samples", "source_disagreements", "profile_site"]

#: What ``profile import`` reads: a CSV file, a Sailor data folder, Cephalo's model_latencies.json.
IMPORT_FORMATS = ("csv", "sailor", "cephalo")


def _ignore(note: str) -> None:
    pass


def _site(site: Site | str | Path | None) -> Site | None:
    if site is None or isinstance(site, Site):
        return site
    return load_site(site)


def profile_store_path(store: str | Path | None, site: Site | None = None) -> Path:
    """The store a profile command works on: ``store``, else the site's, else ``$MEMX_STORE``;
    SpecError naming ``--store`` when none is given."""
    if store:
        return Path(store)
    if site is not None:
        return site.store
    env = os.environ.get("MEMX_STORE")
    if env:
        return Path(env)
    raise SpecError("no profile store given", field="--store",
                    allowed="--store PATH, or --site SITE.yaml (its 'store'), or the MEMX_STORE environment variable")


# --------------------------------------------------------------------------- ls


@dataclass(frozen=True, kw_only=True)
class StoreRequest:
    """Which store: ``store``, else ``site``'s (a spec or its YAML file), else ``$MEMX_STORE``."""

    site: Site | str | Path | None = None
    store: str | Path | None = None


@dataclass(frozen=True, kw_only=True)
class StoreListing:
    """What the store holds: per GPU type the sample counts by kind and origin
    (:meth:`memx_hpc.profile.store.ProfileStore.summary` rows), the sources that disagree,
    and, with a site, where each of its GPU types' numbers would come from (``coverage``:
    :func:`memx_hpc.search.report.coverage` rows)."""

    store: Path
    content_hash: str
    gpu_types: list[dict]
    disagreements: "SourceReport"
    site: Site | None
    coverage: list[dict] | None

    def to_json(self) -> dict[str, Any]:
        return {"store": str(self.store), "content_hash": self.content_hash, "gpu_types": self.gpu_types,
                "source_disagreements": self.disagreements.to_json(),
                **({"site_gpu_types": self.coverage} if self.coverage is not None else {})}


def list_store(request: StoreRequest) -> StoreListing:
    """Summarise the store (SpecError when it does not exist)."""
    from ..profile.store import ProfileStore  # h5py

    site = _site(request.site)
    store = ProfileStore(profile_store_path(request.store, site))
    if not store.exists():
        raise SpecError("profile store does not exist (yet)", file=str(store.path))
    rows = store.summary()
    cover = None
    if site is not None:
        from ..search.report import coverage
        cover = coverage(site, rows, store.e2e_records(site=site.name))
    return StoreListing(store=store.path, content_hash=store.content_hash(), gpu_types=rows,
                        disagreements=source_disagreements(store, site), site=site, coverage=cover)


def source_disagreements(store: Any, site: Site | None) -> "SourceReport":
    """Where two sources in the store disagree for one GPU type and kind, and which one the
    predictor follows by the site's ``prefer_source`` or the shipped evidence (the store's
    own end-to-end runs are weighed when planning: :func:`memx_hpc.planner.consistent_sources`)."""
    from ..model.sources import resolve, shipped_preferences
    from ..spec.catalog import catalog
    gpus = site if site is not None else catalog()
    prefer = dict(site.prefer_source) if site is not None and site.prefer_source else None
    return resolve(store.samples(), gpus, prefer=prefer, prior=shipped_preferences())[1]


# --------------------------------------------------------------------------- import, export


@dataclass(frozen=True, kw_only=True)
class ImportRequest:
    """Add the samples of ``path`` (``format``: one of :data:`IMPORT_FORMATS`) to the store
    (chosen as in :class:`StoreRequest`)."""

    path: str | Path
    format: str = "csv"
    site: Site | str | Path | None = None
    store: str | Path | None = None


@dataclass(frozen=True, kw_only=True)
class ImportResult:
    """``read`` samples found in ``path``, ``added`` of them new to the store; ``link_curves``:
    network curves stored with them (Sailor's)."""

    store: Path
    path: Path
    format: str
    read: int
    added: int
    link_curves: int

    def to_json(self) -> dict[str, Any]:
        return {"store": str(self.store), "read": self.read, "added": self.added,
                "duplicates_skipped": self.read - self.added, "link_curves": self.link_curves}


def import_samples(request: ImportRequest) -> ImportResult:
    """Read the samples (SpecError when ``path`` is not there or the importer is missing) and
    append those the store lacks."""
    from ..profile.store import ProfileStore

    store = ProfileStore(profile_store_path(request.store, _site(request.site)))
    path = Path(request.path)
    if not path.exists():
        raise SpecError("file or folder not found", file=str(path))
    if request.format not in IMPORT_FORMATS:
        raise SpecError("unknown import format", field="--format", found=request.format,
                        allowed=", ".join(IMPORT_FORMATS))
    if request.format == "csv":
        from ..profile.csvio import read_csv

        samples = read_csv(path)
    else:
        try:
            from ..profile.importers import import_cephalo, import_sailor
        except ImportError as e:
            raise SpecError(f"the {request.format} importer is not available in this installation ({e})") from None
        samples = import_sailor(path) if request.format == "sailor" else import_cephalo(path)
    added = store.append(samples)
    curves = 0
    if request.format == "sailor" and (path / "network_coeffs_all_homo.json").is_file():
        from ..profile.comm import import_sailor_comm, write_comm_curves
        curves = write_comm_curves(store.path, import_sailor_comm(path))  # Sailor's network curves
    return ImportResult(store=store.path, path=path, format=request.format, read=len(samples), added=added,
                        link_curves=curves)


@dataclass(frozen=True, kw_only=True)
class ExportRequest:
    """Write every sample of the store (chosen as in :class:`StoreRequest`) to ``csv``."""

    csv: str | Path
    site: Site | str | Path | None = None
    store: str | Path | None = None


@dataclass(frozen=True, kw_only=True)
class ExportResult:
    store: Path
    csv: str | Path
    rows: int

    def to_json(self) -> dict[str, Any]:
        return {"store": str(self.store), "csv": self.csv, "rows": self.rows}


def export_samples(request: ExportRequest) -> ExportResult:
    """The store's samples in the CSV interchange format of :mod:`memx_hpc.profile.csvio`
    (SpecError when the store does not exist)."""
    from ..profile.csvio import write_csv
    from ..profile.store import ProfileStore

    store = ProfileStore(profile_store_path(request.store, _site(request.site)))
    if not store.exists():
        raise SpecError("profile store does not exist (yet)", file=str(store.path))
    return ExportResult(store=store.path, csv=request.csv, rows=write_csv(store.samples(), request.csv))


# --------------------------------------------------------------------------- profile


@dataclass(frozen=True, kw_only=True)
class ProfileRequest:
    """Measure the minimal-set points the store lacks for ``job`` on ``site``'s partitions
    (``partitions``: only these). ``dry_run``: choose the points, submit nothing;
    ``max_retries``: resubmissions of a failed task or point; ``iters``/``warmup``: timed and
    warm-up iterations per point (None: the runner's defaults); ``points_per_task``: most
    points one array task measures (None: the campaign's default); ``links``: also measure the
    communication curves (Slurm only); ``reference``: as
    :attr:`memx_hpc.planner.PlanRequest.reference`. ``progress``: the campaign's progress
    bar on stderr; ``store_progress``: say on stderr when the store is started from the
    reference profiles."""

    site: Site | str | Path
    job: Any
    store: str | Path | None = None
    partitions: Sequence[str] | None = None
    dry_run: bool = False
    max_retries: int = 2
    iters: int | None = None
    warmup: int | None = None
    points_per_task: int | None = None
    links: bool = False
    reference: bool | None = None
    progress: bool = True
    store_progress: bool = True


@dataclass(frozen=True, kw_only=True)
class ProfileResult:
    """The campaign's report; ``links``: the link campaign's (None when not run);
    ``links_skipped``: why the links were not measured although asked for (None otherwise)."""

    store: Path
    report: "ProfileReport"
    links: "CommReport | None"
    links_skipped: str | None

    @property
    def links_failed(self) -> bool:
        return bool(self.links and self.links.failures)

    @property
    def failed(self) -> bool:
        """Whether a point, task or link job failed (a dry run fails nothing)."""
        return bool(self.report.failed or self.links_failed) and not self.report.dry_run

    def to_json(self) -> dict[str, Any]:
        links = self.links
        return {"store": str(self.store), **self.report.to_json(),
                **({"links": {"curves": links.written, "jobs": [dataclasses.asdict(j) for j in links.jobs],
                              "failures": links.failures, "task_seconds": links.task_seconds}} if links else {})}


def profile_site(request: ProfileRequest, *, note: Callable[[str], None] = _ignore) -> ProfileResult:
    """Start the store when it does not exist yet (not for a dry run; each note it brings is
    passed to ``note`` at once), then run the campaign (and the link campaign when asked and
    Slurm schedules)."""
    from ..profile.campaign import profile
    from ..profile.runner import RunSettings
    from ..profile.store import ProfileStore
    from ..model.assemble import start_store

    site = _site(request.site)
    job = request.job if not isinstance(request.job, (str, Path)) else load_job(request.job)
    store_path = profile_store_path(request.store, site)
    if not request.dry_run:
        notes: list[str] = []
        start_store(site, store_path, notes, reference=request.reference, progress=request.store_progress)
        for n in notes:
            note(n)
    store = ProfileStore(store_path)
    kw = {}
    if request.iters is not None:
        kw["iters"] = request.iters
    if request.warmup is not None:
        kw["warmup"] = request.warmup
    report = profile(site, job, store, partitions=request.partitions, dry_run=request.dry_run,
                     progress=request.progress, max_retries=request.max_retries, settings=RunSettings(**kw),
                     **({"points_per_task": request.points_per_task} if request.points_per_task else {}))
    links, skipped = None, None
    if request.links and not report.dry_run:
        if report.scheduler != "slurm":
            skipped = "the comm jobs need Slurm: a hetjob per pair of partitions"
        else:
            from ..profile.link_campaign import profile_comm
            links = profile_comm(site, store.path, site.resolve(site.work_dir) / "comm")
    return ProfileResult(store=store.path, report=report, links=links, links_skipped=skipped)
