"""Running megatron-core 0.16.1 training on a CPU-only PyTorch build, and measuring its memory.

megatron-core assumes CUDA in a handful of places on the dense GPT training path
(see ``../shared/notes/ml-stack.md``): ``torch.cuda.current_device()`` as the
device of new buffers (p2p receive buffers, the global scratch buffer, RoPE),
literal ``device="cuda"`` tensors (the schedules' token counter, gradient
clipping, the optimizer's scale tensors, the DDP warm-up tensor), and the CUDA
RNG state that activation recomputation saves and restores. On a CPU build each
of these fails with "Torch not compiled with CUDA enabled".

:func:`use_cpu` redirects exactly those to the CPU, in this process only. It is
called once by the trainer's ``main`` (the trainer runs as its own process under
``srun``), never at import time, and returns an :class:`CpuPatches` that can undo
it (tests). Nothing else of megatron-core is changed: the model, the 1F1B
schedule, the p2p exchange, DDP and the optimizer are megatron-core's own code.

:class:`TensorMemoryTracker` stands in for ``torch.cuda.max_memory_allocated`` on
the CPU: it counts the bytes of every live tensor storage created while it is
active (one count per storage, views are free) and keeps the peak.
"""

from __future__ import annotations

import importlib
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# Modules that create tensors with a literal ``device="cuda"`` on the training path
# of a dense GPT in megatron-core 0.16.1 (found by running it on a CPU build).
_LITERAL_CUDA_MODULES = (
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.distributed.distributed_data_parallel",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.optimizer.optimizer",
    "megatron.core.utils",
)

_FACTORIES = ("zeros", "ones", "empty", "full", "tensor", "arange", "randn", "rand", "randint")


def _cpu_device(device: Any) -> Any:
    """Maps a CUDA device spec (``"cuda"``, ``"cuda:0"``, an index, a cuda device) to the CPU."""
    if device is None:
        return None
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cpu")
    if isinstance(device, str) and device.startswith("cuda"):
        return torch.device("cpu")
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    return device


class _CudaOnCpu:
    """What ``torch.cuda`` looks like to the redirected modules: a CPU device, no-op syncs."""

    def current_device(self) -> torch.device:
        return torch.device("cpu")

    def synchronize(self, *args: Any, **kwargs: Any) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def is_available(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class _TorchOnCpu(types.ModuleType):
    """A stand-in for the ``torch`` module inside one megatron module: factories with a
    CUDA device make CPU tensors; everything else is the real ``torch``."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = _CudaOnCpu()
        for name in _FACTORIES:
            setattr(self, name, self._wrap(getattr(torch, name)))

    @staticmethod
    def _wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def factory(*args: Any, **kwargs: Any) -> Any:
            if "device" in kwargs:
                kwargs["device"] = _cpu_device(kwargs["device"])
            kwargs.pop("pin_memory", None)  # pinned memory needs CUDA
            return fn(*args, **kwargs)

        factory.__name__ = getattr(fn, "__name__", "factory")
        return factory

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def _tensor_stays_on_cpu(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return self


def _cpu_rng_state(device: Any = "cuda", clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
    # Recompute saves the "CUDA" RNG state before a checkpointed forward and restores it
    # before re-running it, so that dropout masks match; on the CPU the CPU generator is
    # the one dropout draws from.
    state = torch.get_rng_state()
    return state.clone() if clone else state


def _set_cpu_rng_state(new_state: torch.Tensor, device: int = -1, graph_safe: bool = False) -> None:
    torch.set_rng_state(new_state)


def _clip_grad_by_total_norm_fp32(parameters: Any, max_norm: float, total_norm: float,
                                  use_decoupled_grad: bool = False) -> None:
    """megatron-core's ``clip_grad_by_total_norm_fp32`` (optimizer/clip_grads.py) without its
    assertion that gradients are ``torch.cuda.FloatTensor``: the same coefficient
    ``max_norm / (total_norm + 1e-6)``, applied in place when below 1."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    attr = "decoupled_grad" if use_decoupled_grad else "grad"
    grads = [getattr(p, attr).detach() for p in parameters if getattr(p, attr, None) is not None]
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0:
        torch._foreach_mul_(grads, clip_coeff)


@dataclass
class CpuPatches:
    """What :func:`use_cpu` changed, so that :meth:`undo` can put it back."""

    saved: list[tuple[Any, str, Any]] = field(default_factory=list)

    def set(self, owner: Any, name: str, value: Any) -> None:
        self.saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def undo(self) -> None:
        for owner, name, old in reversed(self.saved):
            setattr(owner, name, old)
        self.saved.clear()


def use_cpu() -> CpuPatches:
    """Redirects megatron-core's CUDA-only calls on the GPT training path to the CPU.

    Only for processes where ``torch.cuda.is_available()`` is False; call it before
    building the model. Returns the patches (``.undo()`` reverts them).
    """
    if torch.cuda.is_available():
        raise RuntimeError("use_cpu() is for CPU-only processes; CUDA is available here")
    patches = CpuPatches()
    cuda = _CudaOnCpu()
    # ``torch.cuda.current_device()`` is the device of new buffers in ~40 places
    # (p2p receive buffers, RoPE, the global memory buffer, TP gathers): one global
    # redirect covers them all in this process. The trainer never uses CUDA.
    patches.set(torch.cuda, "current_device", cuda.current_device)
    patches.set(torch.cuda, "synchronize", cuda.synchronize)
    patches.set(torch.cuda, "empty_cache", cuda.empty_cache)
    # ``weight.data.cuda()`` moves the shared embedding/output weight before the
    # first/last-stage all-reduce (LanguageModule.setup_embeddings_and_output_layer);
    # on a CPU-only process "to the accelerator" means "stay here".
    patches.set(torch.Tensor, "cuda", _tensor_stays_on_cpu)
    proxy = _TorchOnCpu()
    for name in _LITERAL_CUDA_MODULES:
        mod = importlib.import_module(name)
        patches.set(mod, "torch", proxy)
    random = importlib.import_module("megatron.core.tensor_parallel.random")
    patches.set(random, "_get_cuda_rng_state", _cpu_rng_state)
    patches.set(random, "_set_cuda_rng_state", _set_cpu_rng_state)
    optimizer = importlib.import_module("megatron.core.optimizer.optimizer")
    patches.set(optimizer, "clip_grad_by_total_norm_fp32", _clip_grad_by_total_norm_fp32)
    return patches


class TensorMemoryTracker(TorchDispatchMode):
    """Live and peak bytes of CPU tensor storages created while the mode is active.

    The CPU equivalent of ``torch.cuda.memory_allocated`` / ``max_memory_allocated``:
    every tensor an operator returns is attributed to its storage once (views,
    in-place results and aliases cost nothing) and released when the storage is
    freed (a weakref finaliser). Storages made before the mode was entered are not
    counted, so enter it before building the model.
    """

    def __init__(self) -> None:
        super().__init__()
        self.allocated_bytes = 0
        self.max_allocated_bytes = 0
        self._live: dict[int, int] = {}

    def _release(self, key: int) -> None:
        self.allocated_bytes -= self._live.pop(key, 0)

    def _count(self, t: torch.Tensor) -> None:
        if t.device.type != "cpu" or t.is_meta:
            return
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse and other storage-less tensors
            return
        key = storage._cdata
        if key in self._live:
            return
        nbytes = storage.nbytes()
        self._live[key] = nbytes
        self.allocated_bytes += nbytes
        if self.allocated_bytes > self.max_allocated_bytes:
            self.max_allocated_bytes = self.allocated_bytes
        weakref.finalize(storage, self._release, key)

    def reset_peak(self) -> None:
        self.max_allocated_bytes = self.allocated_bytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 (torch's signature)
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._count(t)
        return out


def rss_bytes() -> tuple[int, int]:
    """(current, peak) resident set size of this process in bytes, from /proc and getrusage."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    current = 0
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            import os

            current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        current = peak
    # ru_maxrss is sampled by the kernel at its own moments; the peak is never below now.
    return current, max(peak, current)
