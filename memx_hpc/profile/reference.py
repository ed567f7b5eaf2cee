"""The reference profiles shipped in the package (Sailor's and Cephalo's published
measurements, MIT licence; ``memx_hpc/data/reference/PROVENANCE.md``).

A store that does not exist yet starts from them, so a site nobody has profiled plans
from real layer times and network curves rather than datasheet figures alone. They are
imported as any published data is (``origin="imported"``, the file named in ``source``);
an existing store is never changed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

#: The site field that turns the reference data on or off for a site's new stores.
SITE_FIELD = "reference_data"


def reference_dir() -> Path:
    """``memx_hpc/data/reference`` as a folder on disk (holding ``sailor/`` and ``cephalo/``)."""
    return Path(str(resources.files("memx_hpc.data").joinpath("reference")))


@dataclass(frozen=True, kw_only=True)
class SeedReport:
    """What starting a new store from the reference data added."""

    store: Path
    samples: int
    link_curves: int
    skipped: tuple[str, ...]

    def describe(self) -> str:
        return (f"new profile store {self.store} started from the shipped reference profiles (Sailor, Cephalo; "
                f"MIT): {self.samples:,} imported samples, {self.link_curves} network curves")


def wanted(site: Any, override: bool | None = None) -> bool:
    """Whether a new store of ``site`` starts from the reference data: ``override`` when
    given (``--no-reference``), else the site's ``reference_data`` (default: yes unless
    every partition is a CPU, whose layer times are measured where they run)."""
    if override is not None:
        return bool(override)
    setting = getattr(site, "reference_data", None)
    if setting is not None:
        return bool(setting)
    return any(site.gpu(p.gpu_type).vendor != "cpu" for p in site.partitions)


def seed_store(store_path: str | os.PathLike, *, gpus: Any = None) -> SeedReport | None:
    """Create the store at ``store_path`` from the reference data when no file is there
    (None when one is: an existing store is left as it is). ``gpus``: a Site or Catalog
    that resolves the GPU names of the data (default: the built-in catalog)."""
    from .comm import import_sailor_comm, write_comm_curves
    from .importers import import_cephalo, import_sailor
    from .store import ProfileStore

    path = Path(store_path)
    if path.exists():
        return None
    root = reference_dir()
    skipped: list[str] = []
    samples = import_sailor(root / "sailor", gpus=gpus, skipped=skipped)
    samples += import_cephalo(root / "cephalo" / "model_latencies.json", gpus=gpus, skipped=skipped)
    store = ProfileStore(path, lock_timeout_s=60.0)
    added = store.append(samples)
    curves = write_comm_curves(path, import_sailor_comm(root / "sailor"))
    return SeedReport(store=path, samples=added, link_curves=curves, skipped=tuple(skipped))
