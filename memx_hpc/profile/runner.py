"""What one profiling task measures, on the node Slurm allocated (one GPU type, a few points).

Each point is warmed up, then timed over several iterations (median kept):

* ``layer``: one megatron-core ``TransformerLayer`` of the job's shape from
  ``get_gpt_layer_local_spec()`` (SDPA core attention when the job says ``sdpa``), at the
  point's TP degree and recompute mode. Forward and backward milliseconds (CUDA events
  on GPUs - ROCm exposes the same ``torch.cuda`` API - wall clock on CPU); the bytes
  kept for backward (``saved_tensors_hooks``: each storage once, parameters and the
  attention mask skipped, the layer input counted, only tensors the graph really keeps);
  the peak bytes of one forward+backward (``max_memory_allocated`` on GPUs,
  ``MemTracker`` on CPU); and the footprint the driver reports for the process
  (allocator reserved peak, runtime context and communication buffers: NVML per process
  when ``pynvml`` is installed, else the device's used memory, which is this process's
  under an exclusive Slurm allocation; on CPU the growth of the process's peak RSS).
* ``embedding`` / ``head``: megatron-core's ``LanguageModelEmbedding`` / the final norm,
  the ``ColumnParallelLinear`` output layer and ``vocab_parallel_cross_entropy``.
* ``optimizer``: one Adam step over one layer's parameter shard (fp32 main parameters,
  as Megatron keeps them); ``update_ms``, the parameter count in the provenance.
* ``allreduce`` / ``p2p``: ``torch.distributed`` all-reduce over the task's ranks, and a
  ping-pong between two ranks (one-way time = round trip / 2): NCCL/RCCL on GPUs, gloo
  on CPU. Multi-device points run as multi-task Slurm jobs (one rank per task).

Out of memory is a result, not a crash: a torch OOM, a MemTracker prediction under
``FakeTensorMode`` above the GPU type's memory (checked before anything is allocated), or
a measured peak above it, gives a sample with ``infeasible=True``. On GPUs whose memory
exceeds the type's, the caching allocator is capped to it
(``set_per_process_memory_fraction``).

For ``cpu`` device types (``measured_at_profile_time``) the task also measures matmul
TFLOP/s (fp32, bf16) and copy GB/s, returned as device figures.

Every sample's provenance (JSON) records host, device name, vendor, driver/runtime,
torch and megatron-core versions, time, and the run's settings.

Testing hook: ``MEMX_PROFILE_FAIL`` makes tasks raise on purpose, so that the retry and
report paths are exercised against a real scheduler: a comma list of ``task`` (the whole
task raises before measuring) or a sample kind (that point raises), each optionally
``:N`` (fail only the first N attempts, counted in the folder ``MEMX_PROFILE_FAIL_STATE``).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import platform
import socket
import statistics
import tempfile
import time
import traceback
import uuid
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import SpecError, SystemFailure
from ..spec import BYTES_PER_ELEMENT, TRANSFORMER_IMPLS, LayerSample, ProfilePoint, Provenance

__all__ = ["RunSettings", "ProfileTask", "PointFailure", "TaskResult", "run_task", "world_size_of",
           "InjectedFailure", "ENV_FAIL", "ENV_FAIL_STATE"]

ENV_FAIL = "MEMX_PROFILE_FAIL"
ENV_FAIL_STATE = "MEMX_PROFILE_FAIL_STATE"


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """How each point is run (recorded in every sample's provenance)."""

    warmup: int = 2
    iters: int = 5
    seed: int = 1234
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1  # unfused attention only; SDPA runs without (ml-stack.md)
    collective_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.iters < 1:
            raise SpecError("warm-up must be >= 0 and timed iterations >= 1", field="iters",
                            found=(self.warmup, self.iters))


@dataclass(frozen=True, kw_only=True)
class ProfileTask:
    """One Slurm task's work: points of one GPU type that need ``world_size`` ranks."""

    gpu_type: str
    vendor: str
    memory_cap_bytes: int  # the GPU type's memory: above it a point is infeasible
    points: tuple[ProfilePoint, ...]
    world_size: int = 1
    nodes: int = 1
    settings: RunSettings = field(default_factory=RunSettings)
    rendezvous_dir: str = ""  # a folder every rank sees (the submitit folder); "" = temp
    measure_device: bool = False  # cpu types: measure TFLOP/s and GB/s
    label: str = ""  # partition name, for provenance
    # the transformer layer the partition's training runs (render's --transformer-impl):
    # "transformer_engine" profiles Transformer Engine's layer spec, which needs a GPU and TE
    transformer_impl: str = "local"

    def __post_init__(self) -> None:
        if self.transformer_impl not in TRANSFORMER_IMPLS:
            raise SpecError("not an allowed value", field="transformer_impl", found=self.transformer_impl,
                            allowed=", ".join(TRANSFORMER_IMPLS))


@dataclass(frozen=True, kw_only=True)
class PointFailure:
    """A point that raised something other than out-of-memory; the reason is kept."""

    point: ProfilePoint
    reason: str


@dataclass(frozen=True, kw_only=True)
class TaskResult:
    samples: tuple[LayerSample, ...] = ()
    failures: tuple[PointFailure, ...] = ()
    device_figures: dict | None = None
    host: str = ""
    rank: int = 0
    wall_s: float = 0.0


class InjectedFailure(RuntimeError):
    """Raised on purpose by the ``MEMX_PROFILE_FAIL`` testing hook."""


def world_size_of(point: ProfilePoint) -> int:
    """Ranks a point needs: TP for layers and their parts (an MoE layer at EP > 1: TP x EP,
    its expert TP being TP's), the group for collectives."""
    if point.kind in ("allreduce", "alltoall"):
        return point.group_size
    if point.kind == "p2p":
        return 2
    if point.kind == "layer" and point.ep > 1:
        return point.tp * point.ep
    return point.tp


# --------------------------------------------------------------------------- the failure hook


def _maybe_fail(what: str, job: str) -> None:
    """The ``MEMX_PROFILE_FAIL`` hook. Every rank of a job decides alike (a failure on one
    rank only would leave the others waiting in a collective): a job claims one of the N
    slots with an atomic link named after the slot, holding its job id."""
    spec = os.environ.get(ENV_FAIL, "").strip()
    if not spec:
        return
    for token in spec.split(","):
        name, _, times = token.strip().partition(":")
        if name != what:
            continue
        state = os.environ.get(ENV_FAIL_STATE)
        if times and state:
            if not _claim_failure_slot(Path(state), name, int(times), job):
                continue
        raise InjectedFailure(f"injected failure ({ENV_FAIL}={spec!r}) in {what}")


def _claim_failure_slot(d: Path, name: str, slots: int, job: str) -> bool:
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".tmp-{uuid.uuid4().hex}"
    tmp.write_text(job)
    try:
        for k in range(slots):
            slot = d / f"{name}-{k}"
            try:
                os.link(tmp, slot)  # atomic, and the slot is never seen empty
                return True
            except FileExistsError:
                with contextlib.suppress(OSError):
                    if slot.read_text() == job:  # another rank of this job claimed it
                        return True
        return False
    finally:
        tmp.unlink()


# --------------------------------------------------------------------------- environment


def _rank_world() -> tuple[int, int, str]:
    """(rank, world size, job id): from submitit's job environment (Slurm or local
    executor), else from Slurm's task variables (a plain ``srun``), else a lone process."""
    with contextlib.suppress(Exception):
        import submitit

        env = submitit.JobEnvironment()
        return int(env.global_rank), int(env.num_tasks), str(env.job_id)
    if "SLURM_PROCID" in os.environ and "SLURM_NTASKS" in os.environ and "SLURM_JOB_ID" in os.environ:
        return int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"]), os.environ["SLURM_JOB_ID"]
    return 0, 1, f"local-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _threads_per_task() -> int:
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    if cpus and cpus.isdigit():
        return max(1, int(cpus))
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    tasks = int(os.environ.get("SLURM_NTASKS_PER_NODE", os.environ.get("SLURM_TASKS_PER_NODE", "1").split("(")[0])
                or 1)
    return max(1, n // max(tasks, 1))


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _versions() -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version()}
    try:
        from importlib.metadata import version

        out["megatron_core"] = version("megatron-core")
    except Exception:  # noqa: BLE001 - provenance is best effort
        out["megatron_core"] = None
    if torch.cuda.is_available():
        out["runtime"] = f"hip {torch.version.hip}" if torch.version.hip else f"cuda {torch.version.cuda}"
        with contextlib.suppress(Exception):
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            out["driver"] = pynvml.nvmlSystemGetDriverVersion()
    else:
        out["runtime"] = "cpu"
    return out


def _device_info() -> dict[str, Any]:
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return {"device": props.name, "vendor": "amd" if torch.version.hip else "nvidia",
                "device_memory_bytes": int(props.total_memory)}
    return {"device": _cpu_name(), "vendor": "cpu", "threads": torch.get_num_threads()}


def _rss_bytes(field_name: str) -> int:
    """VmRSS / VmHWM of this process from /proc (bytes); 0 where unavailable."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


# --------------------------------------------------------------------------- timing


class _Clock:
    """Times a callable: CUDA events on GPUs (also ROCm), the wall clock on CPU."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.cuda = torch.cuda.is_available()

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def fwd_bwd(self, fwd: Callable[[], Any], bwd: Callable[[Any], None]) -> tuple[float, float]:
        if self.cuda:
            e0, e1, e2 = (self.torch.cuda.Event(enable_timing=True) for _ in range(3))
            self.sync()
            e0.record()
            out = fwd()
            e1.record()
            bwd(out)
            e2.record()
            self.sync()
            return e0.elapsed_time(e1), e1.elapsed_time(e2)
        t0 = time.perf_counter()
        out = fwd()
        t1 = time.perf_counter()
        bwd(out)
        t2 = time.perf_counter()
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3

    def once(self, fn: Callable[[], Any]) -> float:
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        return (time.perf_counter() - t0) * 1e3


def _is_oom(e: BaseException) -> bool:
    import torch

    if isinstance(e, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    text = str(e).lower()
    return "out of memory" in text or "can't allocate memory" in text or "defaultcpuallocator" in text


# --------------------------------------------------------------------------- the task


class _Ctx:
    """State of one running task (process group, current TP, clock)."""

    def __init__(self, task: ProfileTask, rank: int, world: int) -> None:
        import torch

        self.task, self.rank, self.world = task, rank, world
        self.torch = torch
        self.clock = _Clock()
        self.tp: int | None = None
        self.ep = 1
        self.device = None
        self.common: dict[str, Any] = {}

    def set_tp(self, tp: int, ep: int = 1) -> None:
        from megatron.core import parallel_state

        from .. import megatron_cpu as mc

        if self.tp == tp and self.ep == ep:
            return
        if self.tp is not None:
            parallel_state.destroy_model_parallel()
        mc.init_model_parallel(tp=tp, ep=ep, seed=self.task.settings.seed)
        self.tp, self.ep = tp, ep

    def max_over_ranks(self, values: list[float]) -> list[float]:
        """The slowest rank's figures (a TP layer is as slow as its slowest shard)."""
        import torch.distributed as dist

        if self.world == 1:
            return values
        t = self.torch.tensor(values, dtype=self.torch.float64)
        if self.clock.cuda:
            t = t.cuda()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [float(x) for x in t.cpu()]


def run_task(task: ProfileTask) -> TaskResult:
    """Measure every point of ``task`` on this node; called by submitit in each Slurm task.

    Returns the samples on rank 0 (other ranks return an empty result). A point that
    raises is reported in ``failures`` with its reason and the others still run; a task
    that cannot start (process group, injected task failure) raises.
    """
    t_start = time.perf_counter()
    warnings.filterwarnings("ignore", message=".*Transformer Engine.*")
    warnings.filterwarnings("ignore", message=".*Apex.*")
    warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\..*")
    warnings.filterwarnings("ignore", message="Module is None", category=UserWarning)
    rank, world, job = _rank_world()
    if world != task.world_size:
        raise SystemFailure(f"task for {task.gpu_type} needs {task.world_size} ranks but runs with {world}")
    _maybe_fail("task", job)

    import torch

    from .. import megatron_cpu as mc

    if not torch.cuda.is_available():
        torch.set_num_threads(_threads_per_task())
    rdzv_dir = task.rendezvous_dir or tempfile.gettempdir()
    store_file = Path(rdzv_dir) / f".rdzv-{job}"
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        local = int(os.environ.get("SLURM_LOCALID", os.environ.get("SUBMITIT_LOCAL_LOCALID", 0)))
        torch.cuda.set_device(local % max(torch.cuda.device_count(), 1))
    dist.init_process_group(backend=backend, init_method=f"file://{store_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=task.settings.collective_timeout_s))
    ctx = _Ctx(task, rank, world)
    # a task with several ranks: a point that raises on one rank only would leave the
    # others in a collective; such errors end the task (and it is retried)
    samples: list[LayerSample] = []
    failures: list[PointFailure] = []
    figures = None
    try:
        if torch.cuda.is_available():
            total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            if task.memory_cap_bytes < total:
                torch.cuda.set_per_process_memory_fraction(task.memory_cap_bytes / total)
        ctx.common = {
            "host": socket.gethostname(), **_device_info(), **_versions(), "backend": backend,
            "world_size": world, "nodes": task.nodes, "job_id": job, "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurm_array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"), "partition": task.label,
            "settings": {"warmup": task.settings.warmup, "iters": task.settings.iters,
                         "seed": task.settings.seed, "hidden_dropout": task.settings.hidden_dropout,
                         "memory_cap_bytes": task.memory_cap_bytes},
            "transformer_impl": _transformer_impl(task),
        }
        with mc.cpu_workarounds():
            for point in task.points:
                try:
                    _maybe_fail(point.kind, job)
                    s = _measure(ctx, point)
                except InjectedFailure as e:
                    failures.append(PointFailure(point=point, reason=f"{type(e).__name__}: {e}"))
                    continue
                except Exception as e:  # noqa: BLE001 - one point's failure is reported, the rest run
                    _free(ctx)
                    if not _is_oom(e):
                        tb = traceback.format_exception_only(type(e), e)[-1].strip()
                        failures.append(PointFailure(point=point, reason=tb[:500]))
                        continue
                    s = _sample(ctx, point, infeasible=True, note=f"out of memory: {str(e)[:200]}")
                samples.append(s)
            if task.measure_device and rank == 0 and not torch.cuda.is_available():
                figures = measure_cpu_figures(memory_gib=task.memory_cap_bytes / 2**30)
    finally:
        mc.teardown()
        with contextlib.suppress(OSError):
            store_file.unlink()
    if rank != 0:
        return TaskResult(host=socket.gethostname(), rank=rank, wall_s=time.perf_counter() - t_start)
    return TaskResult(samples=tuple(samples), failures=tuple(failures), device_figures=figures,
                      host=socket.gethostname(), rank=rank, wall_s=time.perf_counter() - t_start)


def _free(ctx: _Ctx) -> None:
    """Return a finished point's memory (and, on GPUs, the allocator's cache)."""
    gc.collect()
    if ctx.clock.cuda:
        ctx.torch.cuda.empty_cache()


def _sample(ctx: _Ctx, point: ProfilePoint, *, infeasible: bool = False, note: str = "",
            extra: dict | None = None, **values: Any) -> LayerSample:
    prov = {**ctx.common, "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **(extra or {})}
    if note:
        prov["note"] = note
    job = ctx.common.get("slurm_job_id")
    source = f"slurm:{job}" if job else f"local:{ctx.common.get('host')}:{os.getpid()}"
    return LayerSample(point=point, infeasible=infeasible, origin="measured", source=source,
                       provenance=Provenance.of(prov), **values)


def _measure(ctx: _Ctx, point: ProfilePoint) -> LayerSample | None:
    need = world_size_of(point)
    if need != ctx.world:
        raise SystemFailure(f"point needs {need} ranks, task has {ctx.world}")
    if point.kind in ("layer", "embedding", "head"):
        return _measure_module(ctx, point)
    if point.kind == "optimizer":
        return _measure_optimizer(ctx, point)
    if point.kind == "allreduce":
        return _measure_allreduce(ctx, point)
    if point.kind == "p2p":
        return _measure_p2p(ctx, point)
    if point.kind == "alltoall":
        return _measure_alltoall(ctx, point)
    raise SpecError("unknown sample kind", field="kind", found=point.kind)


# --------------------------------------------------------------------------- modules


def _build(ctx: _Ctx, point: ProfilePoint) -> tuple[Any, Callable[[], Any], Any, list[Any]]:
    """(module, forward() -> output, the tensor to free from the activation count, excluded storages)."""
    import torch

    from .. import megatron_cpu as mc

    sh = point.shape
    if sh.multi_latent_attention and point.kind == "layer":
        raise SpecError("multi-latent attention layers are not profiled yet (the roofline prices them)",
                        field="multi_latent_attention", found=True)
    moe = {}
    if point.kind == "layer" and sh.is_moe:
        # megatron-core's MoE layer (router, the experts as SequentialMLP, shared experts, the
        # all-to-all dispatcher), biases off as in Megatron's MoE recipes
        moe = dict(num_experts=sh.num_experts, moe_router_topk=sh.moe_router_topk,
                   moe_ffn_hidden_size=sh.moe_ffn_hidden_size,
                   moe_shared_expert_intermediate_size=sh.moe_shared_expert_intermediate_size, ep=point.ep,
                   add_bias_linear=False)
    s = mc.LayerSettings(hidden_size=sh.hidden_size, num_attention_heads=sh.num_attention_heads,
                         num_query_groups=sh.num_query_groups, ffn_hidden_size=sh.ffn_hidden_size,
                         activation=sh.activation, tp=point.tp, precision=point.precision,
                         attention=point.attention, recompute=point.recompute if point.kind == "layer" else "none",
                         hidden_dropout=ctx.task.settings.hidden_dropout,
                         attention_dropout=ctx.task.settings.attention_dropout, kv_channels=sh.head_dim, **moe)
    dev = mc.device_of()
    dtype = mc.dtype_of(point.precision)
    seq, b, h = sh.seq_length, point.micro_batch_size, sh.hidden_size
    gen = torch.Generator(device="cpu").manual_seed(ctx.task.settings.seed)
    if point.kind == "layer":
        layer = _build_layer(s, ctx.common.get("transformer_impl", "local"))
        x = torch.randn(seq, b, h, generator=gen, dtype=torch.float32).to(dev, dtype).requires_grad_(True)
        mask = mc.causal_mask(seq, dev)
        return layer, (lambda: mc.layer_forward(layer, x, mask, recompute=point.recompute)), x, [mask]
    cfg = mc.layer_config(s)
    from ..params import padded_vocab_size

    vocab = padded_vocab_size(sh.vocab_size, point.tp)  # the rows the trainer allocates
    if point.kind == "embedding":
        from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding

        emb = LanguageModelEmbedding(config=cfg, vocab_size=vocab, max_sequence_length=seq,
                                     position_embedding_type="learned_absolute")
        emb = emb.to(dev)
        ids = torch.randint(0, sh.vocab_size, (b, seq), generator=gen).to(dev)
        pos = torch.arange(seq, device=dev).unsqueeze(0).expand(b, -1)
        return emb, (lambda: emb(ids, pos)), None, [ids, pos]
    from megatron.core import tensor_parallel
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.final_layernorm = WrappedTorchNorm(config=cfg, hidden_size=h, eps=cfg.layernorm_epsilon)
            self.output_layer = tensor_parallel.ColumnParallelLinear(
                h, vocab, config=cfg, init_method=cfg.init_method, bias=False, gather_output=False,
                skip_bias_add=False)

        def forward(self, x: Any, labels: Any) -> Any:
            logits, _ = self.output_layer(self.final_layernorm(x))
            return tensor_parallel.vocab_parallel_cross_entropy(logits.float(), labels).mean()

    head = Head().to(dev)
    x = torch.randn(seq, b, h, generator=gen, dtype=torch.float32).to(dev, dtype).requires_grad_(True)
    labels = torch.randint(0, sh.vocab_size, (seq, b), generator=gen).to(dev)
    return head, (lambda: head(x, labels)), x, [labels]


def _transformer_impl(task: ProfileTask) -> str:
    """The layer implementation this task measures: the partition's. Transformer Engine
    needs a GPU and an importable ``transformer_engine``; without them the task fails
    instead of measuring another layer than the one that will train."""
    if task.transformer_impl == "local":
        return "local"
    import torch

    if not torch.cuda.is_available():
        raise SystemFailure(f"partition {task.label or task.gpu_type} trains with transformer_engine, which "
                            f"needs a GPU; none is visible (set transformer_impl: local for it)")
    try:
        import transformer_engine  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means TE cannot run here
        raise SystemFailure(f"partition {task.label or task.gpu_type} trains with transformer_engine, which does "
                            f"not import here ({type(e).__name__}: {e}); install it or set "
                            f"transformer_impl: local") from None
    return "transformer_engine"


def _build_layer(s: Any, impl: str) -> Any:
    """One transformer layer from megatron-core's local spec, or Transformer Engine's
    (``get_gpt_layer_with_transformer_engine_spec``, Megatron-LM's default on GPUs)."""
    from .. import megatron_cpu as mc

    if impl == "local":
        return mc.build_layer(s)
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.transformer.spec_utils import build_module

    spec = get_gpt_layer_with_transformer_engine_spec()
    return build_module(spec, config=mc.layer_config(s), layer_number=1).to(mc.device_of())


def _gpu_memory() -> dict[str, int]:
    """Allocator peak, reserved peak and what the driver reports, since the last reset."""
    import torch

    torch.cuda.synchronize()
    return {"peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
            "device_footprint_bytes": _gpu_process_footprint()}


def _saved_bytes(ctx: _Ctx, module: Any, fwd: Callable[[], Any], excluded: list[Any]) -> tuple[int, Any]:
    """Bytes the autograd graph keeps after one forward: each storage once, parameters and
    constant inputs (masks, ids) skipped. A weak reference to every packed tensor tells
    which ones the graph really holds (pack hooks also fire for nodes that are dropped)."""
    import torch

    refs: list[weakref.ref] = []

    def pack(t: Any) -> Any:
        refs.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fwd()
    gc.collect()
    skip = {p.untyped_storage().data_ptr() for p in module.parameters()}
    skip |= {t.untyped_storage().data_ptr() for t in excluded}
    seen: dict[int, int] = {}
    for r in refs:
        t = r()
        if t is None:
            continue
        st = t.untyped_storage()
        if st.data_ptr() in skip or st.nbytes() == 0:
            continue
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values()), out


def _fake_peak(ctx: _Ctx, point: ProfilePoint) -> int | None:
    """Peak bytes of one forward+backward predicted by MemTracker under FakeTensorMode
    (nothing allocated); None where the fake run is not possible (e.g. TP collectives)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    if ctx.world > 1 or ctx.clock.cuda:
        return None
    from .. import megatron_cpu as mc

    try:
        with mc.isolated_scratch_buffer(), FakeTensorMode(allow_non_fake_inputs=True):
            module, fwd, _x, _ex = _build(ctx, point)
            mt = MemTracker()
            mt.track_external(module)
            with mt:
                out = fwd()
                out.backward(torch.ones_like(out))
            snap = mt.get_tracker_snapshot("peak")
        return int(max(v.get("Total", 0) for v in snap.values()))
    except Exception:  # noqa: BLE001 - only a pre-check; the real run decides
        return None


def _measure_module(ctx: _Ctx, point: ProfilePoint) -> LayerSample:
    import torch

    ctx.set_tp(point.tp, point.ep if point.kind == "layer" else 1)
    cap = ctx.task.memory_cap_bytes
    cpu = not ctx.clock.cuda
    predicted = _fake_peak(ctx, point) if cpu else None
    if predicted is not None and predicted > cap:
        return _sample(ctx, point, infeasible=True, peak_allocated_bytes=predicted,
                       note=f"MemTracker under FakeTensorMode predicts {predicted} B > cap {cap} B; not run",
                       extra={"peak_source": "MemTracker/FakeTensorMode"})
    if cpu:
        _reset_peak_rss()
    else:
        torch.cuda.reset_peak_memory_stats()
    module, fwd, x, excluded = _build(ctx, point)
    grads: dict[str, Any] = {}

    def bwd(out: Any) -> None:
        if out.dim() == 0:
            out.backward()
        else:
            g = grads.get("g")
            if g is None or g.shape != out.shape:
                g = grads["g"] = torch.ones_like(out)
            out.backward(g)

    for _ in range(ctx.task.settings.warmup):
        bwd(fwd())
    times = [ctx.clock.fwd_bwd(fwd, bwd) for _ in range(ctx.task.settings.iters)]
    fwd_ms = statistics.median(t[0] for t in times)
    bwd_ms = statistics.median(t[1] for t in times)
    # The layer input is counted when the graph keeps it (the first norm's input): in a
    # model it is the previous layer's output, which this layer's backward needs.
    act, out = _saved_bytes(ctx, module, fwd, excluded)
    bwd(out)
    del out
    if cpu:
        from torch.distributed._tools.mem_tracker import MemTracker

        mt = MemTracker()
        mt.track_external(module)
        with mt:
            bwd(fwd())
        peak = int(max(v.get("Total", 0) for v in mt.get_tracker_snapshot("peak").values()))
        reserved = peak  # no caching allocator on CPU
        # What "the device reports for the process" means on a CPU: the process's peak
        # resident memory, runtime and libraries included -- the analogue of the CUDA
        # context and communication buffers that nvidia-smi counts on a GPU.
        footprint = _rss_bytes("VmHWM")
    else:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        bwd(fwd())
        torch.cuda.synchronize()
        m = _gpu_memory()
        peak, reserved, footprint = m["peak_allocated_bytes"], m["peak_reserved_bytes"], m["device_footprint_bytes"]
    fwd_ms, bwd_ms = ctx.max_over_ranks([fwd_ms, bwd_ms])
    infeasible = peak > cap
    note = f"measured peak {peak} B > cap {cap} B" if infeasible else ""
    extra = {"peak_source": "MemTracker" if cpu else "max_memory_allocated",
             "footprint_source": "process peak RSS (VmHWM)" if cpu else _FOOTPRINT_SOURCE,
             "forward_ms_all": [round(t[0], 4) for t in times], "backward_ms_all": [round(t[1], 4) for t in times],
             "params": sum(p.numel() for p in module.parameters())}
    if predicted is not None:
        extra["predicted_peak_bytes"] = predicted
    del module, x
    _free(ctx)
    return _sample(ctx, point, infeasible=infeasible, note=note, extra=extra, forward_ms=fwd_ms, backward_ms=bwd_ms,
                   activation_bytes=int(act), peak_allocated_bytes=peak, peak_reserved_bytes=reserved,
                   device_footprint_bytes=int(footprint))


_FOOTPRINT_SOURCE = "NVML/amdsmi per-process used memory, else device total - free (exclusive allocation)"


def _memory_sources(memory: dict[str, int]) -> dict[str, str]:
    return {"peak_source": "max_memory_allocated", "footprint_source": _FOOTPRINT_SOURCE} if memory else {}


def _gpu_process_footprint() -> int:
    """What the driver reports for this process: NVML (NVIDIA) or amdsmi (AMD) per process
    when available, else the device's used memory (the process's own under an exclusive
    allocation)."""
    import torch

    pid = os.getpid()
    with contextlib.suppress(Exception):
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        idx = torch.cuda.current_device()
        handle = pynvml.nvmlDeviceGetHandleByIndex(idx)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if p.pid == pid and p.usedGpuMemory:
                return int(p.usedGpuMemory)
    with contextlib.suppress(Exception):
        import amdsmi  # type: ignore[import-not-found]

        amdsmi.amdsmi_init()
        for handle in amdsmi.amdsmi_get_processor_handles():
            for proc in amdsmi.amdsmi_get_gpu_process_list(handle):
                info = proc if isinstance(proc, dict) else amdsmi.amdsmi_get_gpu_process_info(handle, proc)
                if info.get("pid") == pid:
                    used = info.get("memory_usage", {}).get("vram_mem") or info.get("mem")
                    if used:
                        return int(used)
    free, total = torch.cuda.mem_get_info()
    return int(total - free)


# --------------------------------------------------------------------------- optimizer and collectives


def _measure_optimizer(ctx: _Ctx, point: ProfilePoint) -> LayerSample:
    import torch

    from .. import megatron_cpu as mc

    ctx.set_tp(point.tp)
    if ctx.clock.cuda:
        torch.cuda.reset_peak_memory_stats()
    sh = point.shape
    s = mc.LayerSettings(hidden_size=sh.hidden_size, num_attention_heads=sh.num_attention_heads,
                         num_query_groups=sh.num_query_groups, ffn_hidden_size=sh.ffn_hidden_size,
                         activation=sh.activation, tp=point.tp, precision="fp32", attention=point.attention)
    layer = mc.build_layer(s)  # Megatron's optimizer steps fp32 main parameters
    params = [p for p in layer.parameters()]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    kw = {"fused": True} if ctx.clock.cuda else {"foreach": True}
    opt = torch.optim.Adam(params, lr=1e-4, **kw)
    for _ in range(ctx.task.settings.warmup):
        opt.step()
    times = [ctx.clock.once(opt.step) for _ in range(ctx.task.settings.iters)]
    (ms,) = ctx.max_over_ranks([statistics.median(times)])
    n = sum(p.numel() for p in params)
    memory = _gpu_memory() if ctx.clock.cuda else {}
    del opt, layer, params
    _free(ctx)
    return _sample(ctx, point, update_ms=ms, extra={"params": n, "optimizer": "Adam",
                                                   "update_ms_per_param": ms / max(n, 1),
                                                   "update_ms_all": [round(t, 4) for t in times],
                                                   **_memory_sources(memory)}, **memory)


def _time_collective(ctx: _Ctx, once) -> tuple[float, list[float], dict]:
    """Warm-up calls, a barrier, then ``iters`` timed calls of ``once``: the median call's ms
    on the slowest rank, every call's ms on this rank, and the device memory afterwards."""
    import torch.distributed as dist

    for _ in range(ctx.task.settings.warmup):
        once()
    dist.barrier()
    times = [ctx.clock.once(once) for _ in range(ctx.task.settings.iters)]
    (ms,) = ctx.max_over_ranks([statistics.median(times)])
    return ms, times, (_gpu_memory() if ctx.clock.cuda else {})


def _measure_allreduce(ctx: _Ctx, point: ProfilePoint) -> LayerSample:
    import torch
    import torch.distributed as dist

    from .. import megatron_cpu as mc

    dtype = mc.dtype_of(point.precision)
    if dtype == torch.bfloat16 and not ctx.clock.cuda:
        dtype = torch.float16  # gloo reduces no bf16; same bytes on the wire
    n = max(1, point.message_bytes // BYTES_PER_ELEMENT[point.precision])
    if ctx.clock.cuda:
        torch.cuda.reset_peak_memory_stats()
    t = torch.ones(n, dtype=dtype, device=mc.device_of())

    ms, times, memory = _time_collective(ctx, lambda: dist.all_reduce(t))
    del t
    return _sample(ctx, point, forward_ms=ms, extra={"elements": n, "dtype": str(dtype),
                                                    "ms_all": [round(x, 4) for x in times],
                                                    **_memory_sources(memory)}, **memory)


def _measure_alltoall(ctx: _Ctx, point: ProfilePoint) -> LayerSample:
    """An MoE layer's token dispatch over an EP group: ``all_to_all_single`` in which every
    rank sends ``message_bytes`` in all, an equal share to each other rank (balanced routing;
    its own share stays), the median call's ms on the slowest rank."""
    import torch
    import torch.distributed as dist

    from .. import megatron_cpu as mc

    dtype = mc.dtype_of(point.precision)
    if dtype == torch.bfloat16 and not ctx.clock.cuda:
        dtype = torch.float16  # as for the all-reduce: the same bytes on the wire
    g = point.group_size
    per_peer = max(1, point.message_bytes // BYTES_PER_ELEMENT[point.precision] // max(g - 1, 1))
    n = per_peer * g
    if ctx.clock.cuda:
        torch.cuda.reset_peak_memory_stats()
    src = torch.ones(n, dtype=dtype, device=mc.device_of())
    dst = torch.empty_like(src)

    ms, times, memory = _time_collective(ctx, lambda: dist.all_to_all_single(dst, src))
    del src, dst
    return _sample(ctx, point, forward_ms=ms, extra={"elements_per_peer": per_peer, "dtype": str(dtype),
                                                    "ms_all": [round(x, 4) for x in times],
                                                    **_memory_sources(memory)}, **memory)


def _measure_p2p(ctx: _Ctx, point: ProfilePoint) -> LayerSample:
    import torch
    import torch.distributed as dist

    from .. import megatron_cpu as mc

    dtype = mc.dtype_of(point.precision)
    n = max(1, point.message_bytes // BYTES_PER_ELEMENT[point.precision])
    if ctx.clock.cuda:
        torch.cuda.reset_peak_memory_stats()
    t = torch.ones(n, dtype=dtype, device=mc.device_of())

    def ping_pong() -> None:
        if ctx.rank == 0:
            dist.send(t, 1)
            dist.recv(t, 1)
        else:
            dist.recv(t, 0)
            dist.send(t, 0)

    for _ in range(ctx.task.settings.warmup):
        ping_pong()
    dist.barrier()
    times = [ctx.clock.once(ping_pong) / 2 for _ in range(ctx.task.settings.iters)]
    (ms,) = ctx.max_over_ranks([statistics.median(times)])
    memory = _gpu_memory() if ctx.clock.cuda else {}
    hosts = [None] * ctx.world
    dist.all_gather_object(hosts, socket.gethostname())
    return _sample(ctx, point, forward_ms=ms, extra={"elements": n, "hosts": hosts,
                                                    "one_way_ms_all": [round(x, 4) for x in times],
                                                    **_memory_sources(memory)}, **memory)


# --------------------------------------------------------------------------- device figures


def measure_cpu_figures(*, memory_gib: float, matmul_n: int = 1024, copy_mib: int = 128, reps: int = 3) -> dict:
    """Measured figures of a CPU device type: dense matmul TFLOP/s (fp32, bf16; best of
    ``reps``, 2n³ FLOPs each) and copy bandwidth in GB/s (bytes read + written / time)."""
    import torch

    def tflops(dtype: Any, n: int) -> float:
        a = torch.randn(n, n).to(dtype)
        b = torch.randn(n, n).to(dtype)
        a @ b
        best = min(_wall(lambda: a @ b) for _ in range(reps))
        return 2 * n ** 3 / best / 1e12

    src = torch.ones(copy_mib * 2**20 // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(_wall(lambda: dst.copy_(src)) for _ in range(reps))
    return {"peak_tflops_fp32": tflops(torch.float32, matmul_n),
            "peak_tflops_bf16": tflops(torch.bfloat16, max(256, matmul_n // 2)),
            "hbm_gbps": 2 * src.numel() * 4 / best / 1e9,
            "memory_gib": float(memory_gib)}


def _wall(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
