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

:class:`MetricsLog` writes the same numbers as TensorBoard scalars (``--tensorboard-dir``),
under Megatron-LM's tag names (``training_log``: ``lm loss``, ``learning-rate``, ``grad-norm``,
``batch-size``, ``iteration-time``, ``throughput``, ``mem-*-bytes``), so one TensorBoard view
reads a run of either entry; and to Weights & Biases where ``wandb`` is installed.
No torch import at module level (``--help`` stays instant).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Iterable

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
                   grad_norm: float | None, timestamp: str, throughput_tflops: float | None = None) -> str:
    """One ``training_log`` line, in Megatron-LM's layout."""
    s = f" [{timestamp}]"
    s += " iteration {:8d}/{:8d} |".format(iteration, train_iters)
    s += " consumed samples: {:12d} |".format(consumed_samples)
    s += " elapsed time per iteration (ms): {:.1f} |".format(elapsed_ms)
    if throughput_tflops is not None:
        s += f" throughput per GPU (TFLOP/s/GPU): {throughput_tflops:.1f} |"
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


# --------------------------------------------------------------------------- FLOPs, TensorBoard


def training_flops(args: Any, *, batch_size: int, padded_vocab_size: int) -> float:
    """Floating-point operations of one training iteration of ``batch_size`` sequences: Megatron-LM's
    ``num_floating_point_operations`` (megatron/training/training.py, core_r0.16.0) for the
    models this entry builds (multi-head, grouped-query or multi-latent attention, dense or
    all-MoE layers): every GEMM three times (forward, weight and data gradients), 2 FLOPs per
    multiply-add, the causal half of the attention scores, and the logit layer."""
    h, s, layers = args.hidden_size, args.seq_length, args.num_layers
    ffn = args.ffn_hidden_size or 4 * h
    fb, fma = 3, 2
    ffn_factor = 3 if args.swiglu else 2
    attn = fb * fma * _attention_terms(args)
    if getattr(args, "num_experts", None):
        moe_ffn = args.moe_ffn_hidden_size or ffn
        shared = args.moe_shared_expert_intermediate_size or 0
        mlp = (moe_ffn * args.moe_router_topk + shared) * ffn_factor * layers
    else:
        mlp = ffn * ffn_factor * layers
    return float(batch_size * s * (fb * fma * h * mlp + attn * layers + fb * fma * h * padded_vocab_size))


def _attention_terms(args: Any) -> float:
    """One layer's attention multiply-adds per token, as Megatron-LM counts them: projections, the
    causal half of the scores and of the weighted values. Multi-latent attention: the query's
    low-rank pair (or its direct projection), the K/V latent and its up-projection, the shared
    RoPE key, the output projection (the ``+ 1`` terms are Megatron-LM's, for the latent norms)."""
    h, s, heads = args.hidden_size, args.seq_length, args.num_attention_heads
    if getattr(args, "multi_latent_attention", False):
        qk, pos, v = args.qk_head_dim, args.qk_pos_emb_head_dim, args.v_head_dim
        q_term = h * heads * (qk + pos) if args.q_lora_rank is None else \
            args.q_lora_rank * (h + heads * (qk + pos) + 1)
        return (q_term + args.kv_lora_rank * (h + heads * (qk + v) + 1) + h * pos + heads * v * h
                + s * heads * (qk + pos) / 2 + s * heads * v / 2)
    groups = args.num_query_groups or heads
    kv = args.kv_channels or h // heads
    q, k = kv * heads, kv * groups
    return h * (q + 2 * k) + q * s / 2 * 2 + q * h


class MetricsLog:
    """The run's scalars for TensorBoard (and Weights & Biases), written by one rank -- the last,
    as Megatron-LM's ``get_tensorboard_writer`` does -- every ``--tensorboard-log-interval``
    iterations. :meth:`open` returns None where nothing is asked for (or on other ranks)."""

    def __init__(self, *, writer: Any, wandb_run: Any, interval: int, memory: bool, timers: bool,
                 throughput: bool) -> None:
        self._writer, self._wandb = writer, wandb_run
        self.interval, self._memory, self._timers, self._throughput = interval, memory, timers, throughput

    @classmethod
    def open(cls, args: Any, *, rank: int, world: int, start_iteration: int,
             say: Callable[[str], None]) -> "MetricsLog | None":
        """The writer of rank ``world - 1``. A resumed run passes the iteration it starts after:
        TensorBoard then drops what an earlier segment logged past that checkpoint
        (``purge_step``), so the curves show each iteration once."""
        if rank != world - 1 or not (args.tensorboard_dir or args.wandb_project):
            return None
        writer = None
        if args.tensorboard_dir:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:  # tensorboard is a dependency of the training extra
                say(f"TensorBoard is not installed ({e}): --tensorboard-dir {args.tensorboard_dir} ignored")
            else:
                writer = SummaryWriter(log_dir=args.tensorboard_dir, max_queue=1000,
                                       purge_step=start_iteration + 1 if start_iteration else None)
                say(f"TensorBoard events in {args.tensorboard_dir}")
        run = None
        if args.wandb_project:
            try:
                import wandb  # noqa: PLC0415 - optional
            except ImportError:
                say(f"wandb is not installed: --wandb-project {args.wandb_project} ignored (pip install wandb)")
            else:
                run = wandb.init(project=args.wandb_project, name=args.wandb_exp_name,
                                 dir=args.wandb_save_dir or args.tensorboard_dir, resume="allow")
        if writer is None and run is None:
            return None
        return cls(writer=writer, wandb_run=run, interval=max(1, args.tensorboard_log_interval),
                   memory=args.log_memory_to_tensorboard, timers=args.log_timers_to_tensorboard,
                   throughput=args.log_throughput)

    def _scalar(self, tag: str, value: float, step: int) -> None:
        if self._writer is not None:
            self._writer.add_scalar(tag, value, step)
        if self._wandb is not None and " vs " not in tag:
            self._wandb.log({tag: value}, step=step)

    def iteration(self, iteration: int, *, consumed_samples: int, lm_loss: float | None, learning_rate: float,
                  grad_norm: float | None, batch_size: int, iteration_s: float, throughput_tflops: float | None,
                  memory_bytes: dict[str, int] | None) -> None:
        """One training iteration's scalars (Megatron-LM's tags; ``memory_bytes`` keys: reserved,
        allocated, max-allocated)."""
        if iteration % self.interval:
            return
        self._scalar("learning-rate", learning_rate, iteration)
        self._scalar("learning-rate vs samples", learning_rate, consumed_samples)
        self._scalar("batch-size", batch_size, iteration)
        if lm_loss is not None:
            self._scalar("lm loss", lm_loss, iteration)
            self._scalar("lm loss vs samples", lm_loss, consumed_samples)
        if grad_norm is not None:
            self._scalar("grad-norm", grad_norm, iteration)
        if self._timers:
            self._scalar("iteration-time", iteration_s, iteration)
            if self._throughput and throughput_tflops is not None:
                self._scalar("throughput", throughput_tflops, iteration)
        if self._memory and memory_bytes:
            for key, v in memory_bytes.items():
                self._scalar(f"mem-{key}-bytes", v, iteration)
        if self._writer is not None:
            self._writer.flush()

    def validation(self, iteration: int, *, lm_loss: float, consumed_samples: int) -> None:
        self._scalar("lm loss validation", lm_loss, iteration)
        self._scalar("lm loss validation vs samples", lm_loss, consumed_samples)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._wandb is not None:
            self._wandb.finish()
