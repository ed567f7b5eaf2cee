"""The hash-signature prediction cache.

A signature is the SHA-256 of the cost model's identity and the canonical features of
one query (GPU type, kind, layer shape, TP, micro-batch, recompute, precision,
attention, sequence parallelism), serialised as sorted-key JSON — never Python's
``hash()``, which changes between processes. Many plans share the same stage
features, so the search asks the cost model once per signature.

The persistent file is SQLite (``site.cache``, next to the profile store by default).
Several processes may use it at once: WAL journaling lets readers run beside a
writer, a busy timeout makes writers wait instead of failing, and every write is one
transaction of ``INSERT OR REPLACE`` (the same signature always maps to the same
value, so concurrent writers cannot disagree). Rows carry the identity they were
computed with; opening the cache with a different identity deletes the others — a
new predictor invalidates what the old one said. A row that does not hold two finite
numbers >= 0 (a damaged or hand-edited file) is a miss: predicted again and replaced.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ..errors import SystemFailure
from ..model.api import LayerQuery, code_fingerprint

SCHEMA = 1


def canonical_features(q: LayerQuery) -> dict:
    """The features that decide a query's answer, as plain JSON-able values."""
    d = asdict(q)
    d["shape"] = dict(sorted(d["shape"].items()))
    return d


def signature(identity: str, q: LayerQuery) -> str:
    """SHA-256 hex of the cost model's identity and the query's canonical features."""
    payload = json.dumps({"identity": identity, "query": canonical_features(q)}, sort_keys=True,
                         separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


@dataclass
class CacheStats:
    """Counters of one search: unique signatures asked, found (memory or file), predicted;
    ``lookups``: stage look-ups the composition served from the signature table."""

    unique: int = 0
    hits: int = 0
    file_hits: int = 0
    predicted: int = 0
    lookups: int = 0
    invalidated: int = 0
    damaged: int = 0  # rows of the file that were not two finite numbers >= 0 (predicted again)
    path: str | None = None

    @property
    def hit_rate(self) -> float:
        """Share of look-ups answered without calling the cost model."""
        asked = max(self.lookups, self.unique)
        return 1.0 - self.predicted / asked if asked else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["hit_rate"] = self.hit_rate
        return d


def _value(t: object, a: object) -> tuple[float, float] | None:
    """A stored row's (time ms, activation bytes), or None when it is not two finite numbers >= 0
    (SQLite keeps whatever was written into a REAL column, text included)."""
    try:
        v = (float(t), float(a))  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return v if all(math.isfinite(x) and x >= 0 for x in v) else None


@dataclass
class PredictionCache:
    """Signature -> (time ms, activation bytes), in memory and optionally in a SQLite file.

    ``path`` None keeps it in memory only. The file is opened per operation (short
    transactions), so a cache object can be handed between processes.
    """

    identity: str
    path: Path | None = None
    timeout_s: float = 60.0
    stats: CacheStats = field(default_factory=CacheStats)
    _memory: dict[str, tuple[float, float]] = field(default_factory=dict, repr=False)
    _opened: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        # rows computed by another version of the prediction code are other rows
        self.identity = hashlib.sha256(f"{self.identity}:{code_fingerprint()}".encode()).hexdigest()

    def _connect(self) -> sqlite3.Connection:
        assert self.path is not None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            con = sqlite3.connect(str(self.path), timeout=self.timeout_s, isolation_level=None)
            con.execute(f"PRAGMA busy_timeout = {int(self.timeout_s * 1000)}")
            con.execute("PRAGMA journal_mode = WAL")
            con.execute("PRAGMA synchronous = NORMAL")
        except (sqlite3.Error, OSError) as e:
            raise SystemFailure(f"cannot open the prediction cache {self.path}: {e}") from None
        return con

    def open(self) -> "PredictionCache":
        """Create the file if needed and drop rows of other identities (counted as invalidated)."""
        self.stats.path = str(self.path) if self.path else None
        if self.path is None or self._opened:
            self._opened = True
            return self
        con = self._connect()
        try:
            con.execute("CREATE TABLE IF NOT EXISTS predictions (signature TEXT PRIMARY KEY, identity TEXT NOT NULL, "
                        "time_ms REAL NOT NULL, activation_bytes REAL NOT NULL, created REAL NOT NULL)")
            con.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            con.execute("BEGIN IMMEDIATE")
            cur = con.execute("DELETE FROM predictions WHERE identity != ?", (self.identity,))
            self.stats.invalidated += max(cur.rowcount, 0)
            con.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?), ('identity', ?)",
                        (str(SCHEMA), self.identity))
            con.execute("COMMIT")
        except sqlite3.Error as e:
            raise SystemFailure(f"prediction cache {self.path}: {e}") from None
        finally:
            con.close()
        self._opened = True
        return self

    def get_many(self, signatures: Sequence[str]) -> dict[str, tuple[float, float]]:
        """The known values among ``signatures`` (memory first, then the file)."""
        self.open()
        out = {s: self._memory[s] for s in signatures if s in self._memory}
        missing = [s for s in signatures if s not in out]
        if missing and self.path is not None:
            con = self._connect()
            try:
                for a in range(0, len(missing), 500):
                    part = missing[a:a + 500]
                    rows = con.execute(
                        f"SELECT signature, time_ms, activation_bytes FROM predictions WHERE identity = ? AND "
                        f"signature IN ({','.join('?' * len(part))})", (self.identity, *part)).fetchall()
                    for sig, t, a_ in rows:
                        v = _value(t, a_)
                        if v is None:
                            self.stats.damaged += 1
                            continue  # a miss: predicted again and replaced by put_many
                        out[sig] = v
                        self._memory[sig] = v
                        self.stats.file_hits += 1
            except sqlite3.Error as e:
                raise SystemFailure(f"prediction cache {self.path}: {e}") from None
            finally:
                con.close()
        return out

    def put_many(self, items: Mapping[str, tuple[float, float]] | Iterable[tuple[str, tuple[float, float]]]) -> None:
        """Remember values (one transaction for the file)."""
        self.open()
        pairs = list(items.items() if isinstance(items, Mapping) else items)
        for sig, v in pairs:
            self._memory[sig] = (float(v[0]), float(v[1]))
        if not pairs or self.path is None:
            return
        now = time.time()
        con = self._connect()
        try:
            con.execute("BEGIN IMMEDIATE")
            con.executemany("INSERT OR REPLACE INTO predictions VALUES (?, ?, ?, ?, ?)",
                            [(s, self.identity, float(v[0]), float(v[1]), now) for s, v in pairs])
            con.execute("COMMIT")
        except sqlite3.Error as e:
            raise SystemFailure(f"prediction cache {self.path}: {e}") from None
        finally:
            con.close()

    def __len__(self) -> int:
        self.open()
        if self.path is None:
            return len(self._memory)
        con = self._connect()
        try:
            return int(con.execute("SELECT COUNT(*) FROM predictions WHERE identity = ?",
                                   (self.identity,)).fetchone()[0])
        except sqlite3.Error as e:
            raise SystemFailure(f"prediction cache {self.path}: {e}") from None
        finally:
            con.close()


def predict_with_cache(cost_model, queries: Sequence[LayerQuery], cache: PredictionCache | None,
                       *, predict_share=None) -> dict[LayerQuery, tuple[float, float]]:
    """Answers for ``queries``: cached values, and the misses predicted in one batch.

    ``predict_share(missing_queries) -> values`` lets the caller distribute the misses
    (the MPI engine); by default the cost model predicts them here.
    """
    queries = list(dict.fromkeys(queries))
    identity = cost_model.identity
    sigs = [signature(identity, q) for q in queries]
    known = cache.get_many(sigs) if cache is not None else {}
    missing = [q for q, s in zip(queries, sigs) if s not in known]
    if missing:
        vals = predict_share(missing) if predict_share is not None else cost_model.predict(missing)
        new = {signature(identity, q): (float(v[0]), float(v[1])) for q, v in zip(missing, vals)}
        if cache is not None:
            cache.put_many(new)
        known.update(new)
    if cache is not None:
        cache.stats.unique += len(queries)
        cache.stats.hits += len(queries) - len(missing)
        cache.stats.predicted += len(missing)
    return {q: known[s] for q, s in zip(queries, sigs)}
