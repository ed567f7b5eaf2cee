"""Store append cost: does one append cost the same at the 10,000th sample as at the first?

Appends N samples (default 10,000) one call each to a fresh HDF5 profile store, the way a
profiling campaign adds one finished task at a time, under the writer lock every time,
and prints the time of the first and the last 1,000 appends and their ratio. A store
that rewrote the whole file per append (schema 2) grew quadratically: the ratio was
the number of thousands appended. The samples are synthetic (one layer shape, distinct
micro-batch sizes), since only their count matters here; each append is checked for
being new (the duplicate check reads row digests, not rows).

Appends go through one ``ProfileStore`` object (a long-running profiler: duplicate
digests stay in memory); ``--fresh`` adds a run with a new object per append (a new
process per task: the digests of that GPU type are read from the file each time).
Most of an append is HDF5 call overhead per column and two fsyncs (lock file, store).

Run from the repository root:  .venv/bin/python benchmarks/store_append.py [--samples N] [--window K] [--fresh]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memx_hpc.tables import table  # noqa: E402
from memx_hpc.profile.store import ProfileStore  # noqa: E402
from memx_hpc.spec import LayerSample, LayerShape, ProfilePoint, Provenance  # noqa: E402

SHAPE = LayerShape(hidden_size=1024, num_attention_heads=16, num_query_groups=16, ffn_hidden_size=4096,
                   seq_length=1024, vocab_size=50304)


def sample(i: int) -> LayerSample:
    point = ProfilePoint(gpu_type="A100-80", kind="layer", shape=SHAPE, micro_batch_size=i + 1)
    return LayerSample(point=point, forward_ms=1.0 + i * 1e-3, backward_ms=2.0 + i * 1e-3, activation_bytes=1000 + i,
                       peak_allocated_bytes=2**30 + i, origin="measured", source=f"bench:{i}",
                       provenance=Provenance.of({"host": "bench", "task": i}))


def run(n: int, window: int, *, fresh: bool) -> tuple[list[float], list[float], int]:
    """Wall and CPU seconds of each append, and the file's size at the end."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "store.h5"
        st = ProfileStore(path)
        wall, cpu = [], []
        for i in range(n):
            s = sample(i)
            t0, c0 = time.perf_counter(), time.process_time()
            added = (ProfileStore(path) if fresh else st).append([s])
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            if added != 1:
                raise SystemExit(f"append {i} added {added} samples, expected 1")
        if len(ProfileStore(path).samples()) != n:
            raise SystemExit("the store does not hold every sample")
        return wall, cpu, path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=10_000)
    ap.add_argument("--window", type=int, default=1_000)
    ap.add_argument("--fresh", action="store_true", help="also time a new ProfileStore object per append")
    args = ap.parse_args()
    n, k = args.samples, min(args.window, args.samples)
    rows = []
    for fresh in (False, True) if args.fresh else (False,):
        wall, cpu, size = run(n, k, fresh=fresh)
        for what, t in (("wall", wall), ("cpu", cpu)):
            first, last = sum(t[:k]), sum(t[-k:])
            rows.append(["new object per append" if fresh else "one store object", what, n, f"{first:.2f}",
                         f"{last:.2f}", f"{1e3 * first / k:.2f}", f"{1e3 * last / k:.2f}", f"{last / first:.2f}x",
                         f"{size / 2**20:.1f}"])
    table(rows, ["mode", "clock", "samples", f"first {k} s", f"last {k} s", "ms/append first", "ms/append last",
                 "last/first", "file MiB"])
    print("\none append() call per sample under the writer lock; flat cost means last/first near 1.\n"
          "wall includes two fsyncs per append and waits for a shared disk and CPU; cpu is this process's time")


if __name__ == "__main__":
    main()
