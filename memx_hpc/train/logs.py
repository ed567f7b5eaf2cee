"""Megatron-LM's training log lines: written by the trainer here, read back from any run.

The formats are Megatron-LM's (``megatron/training/training.py``: ``training_log`` and
``megatron/training/utils.py``: ``report_memory``, core_r0.16.0), so the same parser reads
a log of Megatron-LM's ``pretrain_gpt.py`` on a GPU cluster and of
``memx_hpc.train.pretrain_gpt`` on this machine::

     [2025-01-01 10:00:00] iteration        2/       5 | consumed samples:           16 | elapsed time per iteration (ms): 812.3 | learning rate: 1.000000E-04 | global batch size:     8 | lm loss: 6.943302E+00 | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |
    [Rank 1] (after 5 iterations) memory (MB) | allocated: 101.2 | max allocated: 180.5 | reserved: 412.0 | max reserved: 430.7

On the CPU, "allocated" is the bytes of live tensor storages and "reserved" the process's
resident set (there is no caching allocator); a GPU run reports ``torch.cuda`` figures.

The trainer also writes one line per rank that says where it ran (``[Rank r] layout | ...``);
Megatron-LM does not print it, and the parser does not need it for times and memory.
No torch import here.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Iterable

MB = 1024.0 * 1024.0

_ITER = re.compile(
    r"iteration\s+(?P<it>\d+)/\s*(?P<total>\d+)\s*\|.*?"
    r"elapsed time per iteration \(ms\):\s*(?P<ms>[0-9.]+(?:[eE][-+]?\d+)?)"
    r"(?:.*?lm loss:\s*(?P<loss>[-+0-9.eEnaif]+))?")
_MEM = re.compile(
    r"\[Rank (?P<rank>\d+)\] \(after (?P<it>\d+) iterations\) memory \(MB\) \| "
    r"allocated: (?P<a>[0-9.eE+-]+) \| max allocated: (?P<ma>[0-9.eE+-]+) \| "
    r"reserved: (?P<r>[0-9.eE+-]+) \| max reserved: (?P<mr>[0-9.eE+-]+)")
_LAYOUT = re.compile(r"\[Rank (?P<rank>\d+)\] layout \| (?P<rest>.*)$")


def iteration_line(*, iteration: int, train_iters: int, consumed_samples: int, elapsed_ms: float,
                   learning_rate: float, global_batch_size: int, lm_loss: float | None,
                   grad_norm: float | None, timestamp: str) -> str:
    """One ``training_log`` line, in Megatron-LM's layout."""
    s = f" [{timestamp}]"
    s += " iteration {:8d}/{:8d} |".format(iteration, train_iters)
    s += " consumed samples: {:12d} |".format(consumed_samples)
    s += " elapsed time per iteration (ms): {:.1f} |".format(elapsed_ms)
    s += f" learning rate: {learning_rate:.6E} |"
    s += " global batch size: {:5d} |".format(global_batch_size)
    if lm_loss is not None:
        s += " lm loss: {:.6E} |".format(lm_loss)
    s += " loss scale: {:.1f} |".format(1.0)
    if grad_norm is not None:
        s += " grad norm: {:.3f} |".format(grad_norm)
    s += " number of skipped iterations: {:3d} |".format(0)
    s += " number of nan iterations: {:3d} |".format(0)
    return s


def memory_line(*, rank: int, iteration: int, allocated_bytes: int, max_allocated_bytes: int,
                reserved_bytes: int, max_reserved_bytes: int) -> str:
    """One ``report_memory`` line, in Megatron-LM's layout (MB = 2**20 bytes)."""
    s = f"(after {iteration} iterations) memory (MB)"
    s += " | allocated: {}".format(allocated_bytes / MB)
    s += " | max allocated: {}".format(max_allocated_bytes / MB)
    s += " | reserved: {}".format(reserved_bytes / MB)
    s += " | max reserved: {}".format(max_reserved_bytes / MB)
    return f"[Rank {rank}] {s}"


def layout_line(*, rank: int, fields: dict[str, object]) -> str:
    """Where a rank ran: ``[Rank r] layout | key: value | ...`` (values without '|')."""
    return f"[Rank {rank}] layout | " + " | ".join(f"{k}: {v}" for k, v in fields.items())


@dataclass(frozen=True, kw_only=True)
class IterationRecord:
    iteration: int
    train_iters: int
    elapsed_ms: float
    lm_loss: float | None


@dataclass(frozen=True, kw_only=True)
class MemoryRecord:
    rank: int
    iteration: int
    allocated_mb: float
    max_allocated_mb: float
    reserved_mb: float
    max_reserved_mb: float


@dataclass(frozen=True, kw_only=True)
class RunLog:
    """What a training log says: iterations, per-rank memory, per-rank placement."""

    iterations: tuple[IterationRecord, ...]
    memory: tuple[MemoryRecord, ...]
    layouts: tuple[dict[str, str], ...]

    @property
    def iterations_done(self) -> int:
        return max((r.iteration for r in self.iterations), default=0)

    def iteration_ms(self, *, skip_first: int = 1) -> float | None:
        """Median time per iteration, leaving out the first ``skip_first`` (warm-up) when
        enough remain. Median, because one slow iteration (a page fault storm, a
        scheduler hiccup) should not move a measurement of the steady state."""
        recs = sorted(self.iterations, key=lambda r: r.iteration)
        if not recs:
            return None
        steady = [r.elapsed_ms for r in recs if r.iteration > skip_first] or [r.elapsed_ms for r in recs]
        return float(statistics.median(steady))

    def peak_memory_mb(self) -> dict[int, float]:
        """Per rank, the largest ``max allocated`` it reported (MB)."""
        out: dict[int, float] = {}
        for m in self.memory:
            out[m.rank] = max(out.get(m.rank, 0.0), m.max_allocated_mb)
        return out

    def peak_reserved_mb(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for m in self.memory:
            out[m.rank] = max(out.get(m.rank, 0.0), m.max_reserved_mb)
        return out


def parse_log(lines: Iterable[str] | str) -> RunLog:
    """Read Megatron-LM style training output (a string or lines; other lines are skipped)."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    its: dict[int, IterationRecord] = {}
    mem: list[MemoryRecord] = []
    layouts: list[dict[str, str]] = []
    for line in lines:
        m = _ITER.search(line)
        if m:
            loss = m.group("loss")
            try:
                lossv = float(loss) if loss is not None else None
            except ValueError:
                lossv = None
            rec = IterationRecord(iteration=int(m.group("it")), train_iters=int(m.group("total")),
                                  elapsed_ms=float(m.group("ms")), lm_loss=lossv)
            its[rec.iteration] = rec
            continue
        m = _MEM.search(line)
        if m:
            mem.append(MemoryRecord(rank=int(m.group("rank")), iteration=int(m.group("it")),
                                    allocated_mb=float(m.group("a")), max_allocated_mb=float(m.group("ma")),
                                    reserved_mb=float(m.group("r")), max_reserved_mb=float(m.group("mr"))))
            continue
        m = _LAYOUT.search(line)
        if m:
            d = {"rank": m.group("rank")}
            for part in m.group("rest").split(" | "):
                k, sep, v = part.partition(": ")
                if sep:
                    d[k.strip()] = v.strip()
            layouts.append(d)
    return RunLog(iterations=tuple(its[k] for k in sorted(its)), memory=tuple(mem), layouts=tuple(layouts))
