"""Running megatron-core 0.16 layers on a CPU (gloo), with numbers that mean what GPU numbers mean.

megatron-core hard-codes CUDA in a handful of places on the dense GPT path (see
``../shared/notes/ml-stack.md``). Each workaround here redirects one of them to the CPU
and changes nothing on a GPU:

* the global scratch buffer of the unfused attention (``parallel_state``'s
  ``GlobalMemoryBuffer`` allocates on ``torch.cuda.current_device()``);
* the RNG state save/restore of activation recomputation (``_get_cuda_rng_state`` /
  ``_set_cuda_rng_state``) and the RNG tracker (the inference tracker, which forks
  nothing, as ``model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True)``);
* the default causal mask (built on CUDA): callers pass :func:`causal_mask`;
* ``torch.compile`` of the fused bias-activation / bias-dropout-add functions: run eagerly
  (the same autograd Functions, so the same saved tensors, without compiling per shape);
* dropout: ``F.dropout`` on CPU keeps its mask in the activation dtype, CUDA keeps one
  byte per element; ``torch.native_dropout`` keeps a bool mask on both, so the saved
  activation bytes are the same as on a GPU;
* the MoE layer: the router moves its weight to, and builds its aux-loss tensors on,
  ``torch.cuda.current_device()`` (here: the CPU), and the all-to-all token dispatcher
  builds a CUDA stream for its device-to-host copies of the split sizes (here: none; the
  sizes are on the CPU already and become the lists ``all_to_all_single`` takes); without
  Transformer Engine, ``moe_utils`` leaves the name ``te_general_gemm`` undefined, which
  the router's GEMM reads (None here: torch's matmul).

``attention="sdpa"`` swaps the local spec's unfused ``DotProductAttention`` for
:func:`sdpa_core_attention_class` (``torch.nn.functional.scaled_dot_product_attention``
without dropout, causal), which keeps what a flash/fused kernel keeps: Q, K, V, the
output and the fp32 log-sum-exp - never the s x s matrices. On CPU, SDPA with dropout
falls back to a path that stores them, hence no attention dropout there.

Nothing is patched at import time; :func:`cpu_workarounds` patches on entry and
restores on exit. torch and megatron-core are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from .errors import SpecError

if TYPE_CHECKING:
    import torch

__all__ = ["LayerSettings", "cpu_workarounds", "init_distributed", "init_model_parallel", "teardown",
           "layer_config", "build_layer", "causal_mask", "sdpa_core_attention_class", "layer_forward",
           "device_of", "dtype_of", "isolated_scratch_buffer"]

_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def device_of() -> "torch.device":
    """The device this process profiles on: its CUDA/ROCm device when one is visible, else the CPU."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def dtype_of(precision: str) -> "torch.dtype":
    import torch

    if precision not in _DTYPES:
        raise SpecError("unknown precision", field="precision", found=precision, allowed=", ".join(_DTYPES))
    return getattr(torch, _DTYPES[precision])


# --------------------------------------------------------------------------- patches


def _native_dropout_like_cuda(orig: Any) -> Any:
    import torch

    def dropout(input, p=0.5, training=True, inplace=False):  # noqa: A002 - torch's signature
        if training and p > 0 and input.device.type == "cpu":
            out, _mask = torch.native_dropout(input, p, True)
            if inplace:  # keep the in-place contract (callers use the return value too)
                with torch.no_grad():
                    input.copy_(out)
            return out
        return orig(input, p, training, inplace)

    return dropout


@contextlib.contextmanager
def cpu_workarounds() -> Iterator[None]:
    """Patch the CUDA-only spots of megatron-core for the CPU while the block runs.

    A no-op when a GPU is visible. Call :func:`init_model_parallel` inside the block
    (it replaces the scratch buffer, which exists only after initialisation).
    """
    import torch

    if torch.cuda.is_available():
        yield
        return
    import torch.nn.functional as F
    from megatron.core.tensor_parallel import random as mrandom

    import torch._dynamo

    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher as A2A

    saved = {"dropout": F.dropout, "get": mrandom._get_cuda_rng_state, "set": mrandom._set_cuda_rng_state,
             "dynamo": torch._dynamo.config.disable, "current_device": torch.cuda.current_device,
             "a2a_stream": A2A.cuda_dtoh_stream, "a2a_dtoh": A2A._maybe_dtoh_and_synchronize}

    def get_state(device: Any = "cuda", clone: bool = False, graph_safe: bool = False) -> "torch.Tensor":
        return torch.get_rng_state()

    def set_state(new_state: "torch.Tensor", device: int = -1, graph_safe: bool = False) -> None:
        torch.set_rng_state(new_state)

    F.dropout = _native_dropout_like_cuda(saved["dropout"])
    mrandom._get_cuda_rng_state = get_state
    mrandom._set_cuda_rng_state = set_state
    # megatron-core's fused bias-activation and bias-dropout-add functions are wrapped in
    # torch.compile; eager runs keep their autograd Functions (and what they save) without
    # compiling per shape on the CPU
    torch._dynamo.config.disable = True
    torch.cuda.current_device = _cpu_current_device
    A2A.cuda_dtoh_stream = "cpu"  # set: the dispatcher builds no CUDA stream
    A2A._maybe_dtoh_and_synchronize = _cpu_dtoh_and_synchronize
    from megatron.core.transformer.moe import moe_utils
    te_missing = not hasattr(moe_utils, "te_general_gemm")
    if te_missing:
        moe_utils.te_general_gemm = None
    try:
        yield
    finally:
        torch._dynamo.config.disable = saved["dynamo"]
        torch.cuda.current_device = saved["current_device"]
        A2A.cuda_dtoh_stream = saved["a2a_stream"]
        A2A._maybe_dtoh_and_synchronize = saved["a2a_dtoh"]
        if te_missing:
            del moe_utils.te_general_gemm
        F.dropout = saved["dropout"]
        mrandom._get_cuda_rng_state = saved["get"]
        mrandom._set_cuda_rng_state = saved["set"]


def _cpu_current_device() -> str:
    """``torch.cuda.current_device()`` for megatron-core's MoE code on a CPU-only process."""
    return "cpu"


def _cpu_dtoh_and_synchronize(self: Any, point: str, tokens_per_expert: Any = None) -> Any:
    """``MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize`` on the CPU: the split sizes
    the all-to-all needs as numbers, without CUDA streams or events (nothing to copy)."""
    import torch

    if not self.drop_and_pad and point == self.cuda_dtoh_point:
        def numbers(t: Any) -> Any:
            return t.numpy() if torch.is_tensor(t) else t

        self.input_splits = numbers(self.input_splits)
        self.output_splits = numbers(self.output_splits)
        self.output_splits_tp = numbers(self.output_splits_tp)
    return tokens_per_expert


def _cpu_memory_buffer() -> Any:
    """megatron-core's GlobalMemoryBuffer, allocating on the CPU."""
    import torch
    from megatron.core.utils import GlobalMemoryBuffer

    class CpuGlobalMemoryBuffer(GlobalMemoryBuffer):
        def get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
            n = 1
            for d in tensor_shape:
                n *= d
            buf = self.buffer.get((name, dtype))
            if buf is None or buf.numel() < n:
                buf = self.buffer[(name, dtype)] = torch.empty(n, dtype=dtype, device="cpu", requires_grad=False)
            return buf[0:n].view(*tensor_shape)

    return CpuGlobalMemoryBuffer()


@contextlib.contextmanager
def isolated_scratch_buffer() -> Iterator[None]:
    """A fresh CPU scratch buffer for the block, the old one back after it.

    The unfused attention caches its scratch tensor across calls; a run under
    ``FakeTensorMode`` would otherwise leave a fake tensor there for the real runs.
    """
    from megatron.core import parallel_state

    saved = parallel_state._GLOBAL_MEMORY_BUFFER
    parallel_state._GLOBAL_MEMORY_BUFFER = _cpu_memory_buffer()
    try:
        yield
    finally:
        parallel_state._GLOBAL_MEMORY_BUFFER = saved


# --------------------------------------------------------------------------- process groups


def init_distributed(*, rank: int, world_size: int, master_addr: str, master_port: int,
                     backend: str | None = None, timeout_s: float = 300.0) -> str:
    """Join (or create) the default process group: nccl on GPUs (RCCL under ROCm), gloo on CPU."""
    import datetime

    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.get_backend()
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1))))
    dist.init_process_group(backend=backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    return backend


def init_model_parallel(*, tp: int, seed: int = 1234, ep: int = 1, etp: int | None = None) -> None:
    """Megatron's model-parallel groups with TP = ``tp`` (and, for MoE layers, expert-parallel
    ``ep`` and expert tensor-parallel ``etp``) over the default group, RNG seeded."""
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    world = dist.get_world_size()
    if world % tp:
        raise SpecError(f"world size {world} is not a multiple of the tensor-parallel degree", field="tp", found=tp)
    if world % (ep * (tp if etp is None else etp)):
        raise SpecError(f"world size {world} is not a multiple of expert TP x EP", field="ep", found=ep)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep,
                                             expert_tensor_parallel_size=etp)
    import torch

    if not torch.cuda.is_available():
        parallel_state._GLOBAL_MEMORY_BUFFER = _cpu_memory_buffer()
        # The inference tracker forks nothing (CPU RNG only); training semantics are kept
        # by the dropout calls themselves.
        tensor_parallel.model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True, force_reset_rng=True)
    else:
        tensor_parallel.model_parallel_cuda_manual_seed(seed, force_reset_rng=True)


def teardown() -> None:
    """Destroy the model-parallel groups and the default process group."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    with contextlib.suppress(Exception):
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


# --------------------------------------------------------------------------- one layer


@dataclass(frozen=True, kw_only=True)
class LayerSettings:
    """What a profiled layer is built with (recorded in each sample's provenance)."""

    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    activation: str = "gelu"
    tp: int = 1
    precision: str = "bf16"
    attention: str = "sdpa"
    recompute: str = "none"
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1  # the unfused ("core") kernel only; SDPA runs without
    add_bias_linear: bool = True
    normalization: str = "LayerNorm"
    #: an MoE layer (``num_experts`` set): top-k, expert and shared-expert widths, and the
    #: expert-parallel degree it runs at (its ``num_experts / ep`` experts on this rank)
    kv_channels: int | None = None  # a head size other than hidden_size / heads
    num_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    ep: int = 1
    etp: int | None = None


def layer_config(s: LayerSettings) -> Any:
    """The ``TransformerConfig`` of one layer (CPU-safe options; GPU-only fusions off)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    dtype = dtype_of(s.precision)
    kw: dict[str, Any] = {}
    if s.recompute == "selective":
        kw.update(recompute_granularity="selective", recompute_modules=["core_attn"])
    # Full recompute of a lone layer is done by the caller (layer_forward), as
    # TransformerBlock's checkpointed forward does per layer.
    if s.activation == "swiglu":
        kw.update(activation_func=F.silu, gated_linear_unit=True)
    if s.kv_channels is not None:
        kw.update(kv_channels=s.kv_channels)
    if s.num_experts is not None:
        # the all-to-all dispatcher (Megatron-LM's choice for EP); the experts as a list of
        # MLPs (SequentialMLP: the local spec's without grouped GEMM); aux-loss balancing
        kw.update(num_moe_experts=s.num_experts, moe_router_topk=s.moe_router_topk,
                  moe_ffn_hidden_size=s.moe_ffn_hidden_size or s.ffn_hidden_size,
                  moe_shared_expert_intermediate_size=s.moe_shared_expert_intermediate_size,
                  moe_token_dispatcher_type="alltoall", moe_grouped_gemm=False,
                  moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-2,
                  expert_model_parallel_size=s.ep, expert_tensor_parallel_size=s.etp)
    return TransformerConfig(
        num_layers=1, hidden_size=s.hidden_size, num_attention_heads=s.num_attention_heads,
        num_query_groups=s.num_query_groups, ffn_hidden_size=s.ffn_hidden_size,
        tensor_model_parallel_size=s.tp, use_cpu_initialization=not torch.cuda.is_available(),
        params_dtype=dtype, bf16=s.precision == "bf16", fp16=s.precision == "fp16",
        hidden_dropout=s.hidden_dropout,
        attention_dropout=0.0 if s.attention == "sdpa" else s.attention_dropout,
        # Megatron-LM's defaults fuse bias+activation (gelu with biases, swiglu) and
        # bias+dropout+add; the fused functions save less than the unfused path (SwiGLU:
        # its 2f input only), so the CPU runs them too (eagerly, see cpu_workarounds).
        bias_dropout_fusion=True, masked_softmax_fusion=False,
        bias_activation_fusion=s.activation == "swiglu" or s.add_bias_linear,
        apply_rope_fusion=False, persist_layer_norm=False, gradient_accumulation_fusion=False,
        add_bias_linear=s.add_bias_linear, normalization=s.normalization, **kw)


def sdpa_core_attention_class() -> type:
    """A drop-in for megatron-core's ``DotProductAttention`` that calls torch SDPA (causal,
    no dropout) and returns its output as a view: what flash/fused attention keeps."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    class SdpaCoreAttention(DotProductAttention):
        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            # [s, b, n, d] -> [b, n, s, d] as strided views; SDPA returns its output in the
            # [s, b, n, d] memory order, so the final view shares storage (no extra copy kept).
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
            causal = (attn_mask_type or self.attn_mask_type) == AttnMaskType.causal or attention_mask is None
            mask = None if causal else ~attention_mask
            ctx = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=causal, scale=self.softmax_scale,
                enable_gqa=k.size(1) != q.size(1))
            out = ctx.permute(2, 0, 1, 3)
            return out.reshape(out.size(0), out.size(1), -1)

    del torch
    return SdpaCoreAttention


def mla_core_attention_class(base: type | None = None) -> type:
    """The core attention of megatron-core's ``MLASelfAttention`` on a process without
    Transformer Engine: ``base`` (megatron-core's ``DotProductAttention`` when None, or
    :func:`sdpa_core_attention_class`) taking the head sizes MLA builds it with.

    MLA builds its core attention with ``k_channels`` (qk_head_dim + qk_pos_emb_head_dim) and
    ``v_channels`` (v_head_dim), which only Transformer Engine's ``TEDotProductAttention``
    accepts; megatron-core's own sizes its output as ``kv_channels x heads``. This adapter
    takes both and sizes the output by the value heads: the scores and the softmax scale
    (MLA's, with YaRN's mscale) are the base class's."""
    if base is None:
        from megatron.core.transformer.dot_product_attention import DotProductAttention

        base = DotProductAttention

    class MlaCoreAttention(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, k_channels: int | None = None, v_channels: int | None = None,
                     **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if v_channels is not None:
                # [sq, b, np, v_head_dim] -> [sq, b, np * v_head_dim]: the value heads of this TP rank
                self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition

    MlaCoreAttention.__name__ = MlaCoreAttention.__qualname__ = f"Mla{base.__name__}"
    _mla_sees_no_te()
    return MlaCoreAttention


def _mla_sees_no_te() -> None:
    """Where Transformer Engine is not installed, tell megatron-core's MLA module so.

    megatron-core 0.16.1's ``extensions.transformer_engine`` imports without Transformer Engine
    (its classes then derive from a ``MagicMock``), so ``multi_latent_attention`` sets
    ``HAVE_TE = True`` and its constructor's ``isinstance(self.linear_proj, TELinear)`` fails
    ("isinstance() arg 2 must be a type"). Setting the flag to what is true is idempotent and
    changes nothing where Transformer Engine is there."""
    import importlib.util

    if importlib.util.find_spec("transformer_engine") is not None:
        return
    from megatron.core.transformer import multi_latent_attention

    multi_latent_attention.HAVE_TE = False


def build_layer(s: LayerSettings) -> Any:
    """One megatron-core ``TransformerLayer`` from ``get_gpt_layer_local_spec()`` on this
    process's device (TP groups must exist: :func:`init_model_parallel`)."""
    import copy

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module

    cfg = layer_config(s)
    if s.num_experts is not None:
        spec = get_gpt_layer_local_spec(num_experts=s.num_experts, moe_grouped_gemm=False,
                                        normalization=s.normalization)
    else:
        spec = get_gpt_layer_local_spec(normalization=s.normalization)
    if s.attention == "sdpa":
        spec = copy.deepcopy(spec)
        spec.submodules.self_attention.submodules.core_attention = sdpa_core_attention_class()
    layer = build_module(spec, config=cfg, layer_number=1)
    dev = device_of()
    if any(p.device != dev for p in layer.parameters()):  # torch norms are built on the CPU
        layer = layer.to(dev)
    return layer


def causal_mask(seq_length: int, device: Any) -> "torch.Tensor":
    """Megatron's mask convention (True = masked out), built explicitly on ``device``."""
    import torch

    return torch.triu(torch.ones(1, 1, seq_length, seq_length, dtype=torch.bool, device=device), diagonal=1)


def layer_forward(layer: Any, hidden: "torch.Tensor", mask: "torch.Tensor", *, recompute: str) -> "torch.Tensor":
    """The layer's output; with ``recompute='full'`` through megatron's own checkpoint
    function (TransformerBlock's ``_checkpointed_forward`` does the same per layer)."""
    if recompute == "full":
        from megatron.core import tensor_parallel

        def run(h: "torch.Tensor", m: "torch.Tensor") -> "torch.Tensor":
            return layer(h, attention_mask=m)[0]

        return tensor_parallel.checkpoint(run, False, hidden, mask)
    return layer(hidden, attention_mask=mask)[0]
