"""Where the shared real measurements live (Sailor, Cephalo, vTrain; MIT licence).

The data sits beside the repository as ``../shared/data/`` (relative to the repository
root) and is read-only. ``MEMX_SHARED_DATA`` overrides the location (CI, installed wheels).
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import SpecError

ENV_VAR = "MEMX_SHARED_DATA"

#: Source named wherever the data is used (licences in ``licenses/`` of the data folder).
SOURCES = {
    "sailor": "Sailor (ETH Zurich), MIT licence",
    "cephalo": "Cephalo, MIT licence",
    "vtrain": "vTrain (KAIST), MIT licence",
}


def _candidates() -> list[Path]:
    out = []
    env = os.environ.get(ENV_VAR)
    if env:
        out.append(Path(env).expanduser())
    repo_root = Path(__file__).resolve().parents[1]  # memx_hpc/.. = the repository root
    out.append(repo_root / ".." / "shared" / "data")
    return out


def shared_data(required: bool = True) -> Path | None:
    """The shared data folder: ``$MEMX_SHARED_DATA`` if set, else ``<repo>/../shared/data``.

    Raises a SpecError naming both places when it is missing and ``required``.
    """
    cands = _candidates()
    for c in cands:
        if (c / "README.md").is_file() or (c / "sailor").is_dir() or (c / "cephalo").is_dir():
            return c.resolve()
    if required:
        raise SpecError("the shared measurement data was not found", found=", ".join(str(c) for c in cands),
                        allowed=f"set {ENV_VAR} to the folder holding sailor/ and cephalo/")
    return None


def sailor_dir() -> Path:
    """``<shared>/sailor``: ``profiles/``, ``llm_info.json``, ``training_configs/``, ``validation_dev/``."""
    return shared_data() / "sailor"


def cephalo_latencies() -> Path:
    """``<shared>/cephalo/model_latencies.json``."""
    return shared_data() / "cephalo" / "model_latencies.json"
