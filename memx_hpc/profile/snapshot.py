"""``<store>.snapshot``: the parsed profile store, pickled, so a warm command skips HDF5.

Decoding the HDF5 store and building its :class:`~memx_hpc.spec.LayerSample` objects was
about half a second of every warm ``plan`` on the cross-vendor example (3,674 samples);
unpickling them takes a tenth of that. The snapshot is a cache, never a source: it holds
the SHA-256 of the store file it was built from and of the sources that define what it
holds (this module, the store's row codecs, the sample and record types), and it is used
only when both match the store and the code of the moment. Anything else -- a store
appended to since, another version of the package, a truncated or garbled file, a file
that does not unpickle -- is a miss: the store is read as before and the snapshot rebuilt.
It is written whole to a temporary file beside it and moved over it (``os.replace``), so a
reader sees the old snapshot or the new one, never part of one; a store folder that
cannot be written to just goes without.

A pickle runs code when loaded, so only a snapshot that belongs to the user running the
command and that neither the group nor others can write is read (the same trust as the
store beside it, which that user wrote).
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import stat
import tempfile
from pathlib import Path
from typing import Any

#: Bumped when the payload's layout changes in a way the source digest would not show.
FORMAT = "memx-store-snapshot 1"


def snapshot_path(store: Path) -> Path:
    """Where the snapshot of ``store`` lives: beside it, ``<store>.snapshot``."""
    return Path(str(store) + ".snapshot")


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    """SHA-256 of the sources whose classes and codecs the pickled payload holds."""
    from .. import records, spec

    here = Path(__file__).parent  # the store's modules by path: store imports this module
    h = hashlib.sha256(FORMAT.encode())
    files = [Path(__file__), here / "store.py", here / "store_format.py", Path(records.__file__)]
    files += sorted(Path(spec.__file__).parent.glob("*.py"))
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def store_digest(store: Path) -> str:
    """SHA-256 of the store file's bytes (about 20 ms for 16 MB)."""
    with open(store, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _trusted(path: Path) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    return (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def load(store: Path, digest: str) -> Any | None:
    """The payload saved for the store whose bytes hash to ``digest``, or None (a miss)."""
    path = snapshot_path(store)
    if not _trusted(path):
        return None
    try:
        with open(path, "rb") as fh:
            head = pickle.load(fh)
            if head != (FORMAT, _code_digest(), digest):
                return None
            return pickle.load(fh)
    except Exception:  # noqa: BLE001 - a damaged snapshot of any kind is a miss, rebuilt by the caller
        return None


def save(store: Path, digest: str, payload: Any) -> bool:
    """Write ``payload`` as the snapshot of the store whose bytes hash to ``digest``, whole
    and atomically; False (and nothing left behind) where it cannot be written."""
    path = snapshot_path(store)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            pickle.dump((FORMAT, _code_digest(), digest), fh, protocol=pickle.HIGHEST_PROTOCOL)
            pickle.dump(payload, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, path)
        return True
    except Exception:  # noqa: BLE001 - a cache that cannot be written is no error (read-only folder, full disk)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
