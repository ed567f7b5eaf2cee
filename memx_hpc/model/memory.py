"""Device memory as users see it: ``footprint = S + a · (A - S) + b`` per GPU type.

What ``nvidia-smi`` / ``amd-smi`` (and Slurm's OOM killer) see of a training process is
not the bytes its tensors hold. Of the allocator peak ``A`` (what its tensors hold at the
peak), two parts behave differently in the caching allocator, and two terms come on top:

* the state ``S`` -- weights, Megatron's contiguous gradient buffer (``param_and_grad_buffer``,
  one flat tensor per dtype and bucket group), the distributed optimizer's fp32 main
  parameters and Adam moments (flat shards of that buffer) and FP8 weight copies -- is
  allocated once, at start-up, in a few large exact-size blocks that live for the whole run:
  nothing is freed around them, so the caching allocator reserves them with no more than
  its rounding (2 MiB above 1 MiB), and they count at their size;
* the activations ``A - S`` (the held micro-batches and the transients) are many
  short-lived blocks of different sizes, allocated and freed every micro-batch: PyTorch's
  caching allocator keeps freed blocks reserved for reuse, rounds requests up (blocks of
  512 B below 1 MiB, of 2 MiB above, segments of 20 MiB for large requests: PyTorch "CUDA
  semantics, memory management" and ``c10/cuda/CUDACachingAllocator.cpp``) and fragments
  over many iterations of differently sized activations, so what it reserves for them
  exceeds what they hold by a share (typically 5-20 % in Megatron runs; the
  ``expandable_segments`` setting narrows it). That is the slope ``a`` (1.0 on the CPU,
  whose footprint is the process's peak RSS with no caching layer).
* a fixed part: the CUDA/HIP context and loaded kernels (CUDA 12 with lazy module
  loading: ~0.3-0.6 GiB on A100/H100; HIP's is larger, ~1 GiB, since its code objects
  load eagerly), cuBLAS/hipBLAS workspaces (torch's default ``CUBLAS_WORKSPACE_CONFIG``
  ``:4096:8``: 32 MiB per stream), and the communicators' buffers: NCCL allocates
  ``NCCL_BUFFSIZE`` (4 MiB) per channel per peer for each of the Simple protocol's
  send and receive (NCCL environment variables docs), with 8-32 channels on NVLink
  systems, so ~64-256 MiB per communicator and a Megatron rank holds several (TP, DP,
  PP, embedding, the default group). That is ``b`` (prior 4.0 GiB NVIDIA, 2.0 GiB AMD,
  1.5 GiB Intel, 0.25 GiB CPU: the sum of these with 4-6 communicators).

The NVIDIA prior (a 1.14, b 4.0 GiB) is the posterior of this regression, from the former
prior (1.10, 1.5 GiB), on the dev split of Sailor's published GH200 runs (8 runs on 2, 4,
16 and 64 nodes: benchmarks/end_to_end.py's SAILOR_TEST_NODES hold 8 and 32 out). The
former prior left every dev run 1.8-2.9 GiB short whatever its allocator peak (a constant
the communicators of a multi-node Megatron rank and the context account for: 32 NCCL
channels x 2 ring peers x 4 MiB Simple buffers x 2 directions is 0.5 GiB per
communicator before the LL/LL128 buffers). With the fitted prior dev MAPE is 2.4 % (bias
-0.3 %) and on the 4 held-out runs 8.6 % (one run, N8_D2, reports less than its allocator
peak: +32.0 %). Fitted the same way with the slope on the whole allocator peak
(``a·A + b``, the form before the state was taken out of it) the posterior was (1.14,
3.4 GiB), with dev MAPE 2.7 % (bias -0.3 %), held-out 8.4 %; without the prior, least
squares leaves less residual with the slope on the activations alone (2.14 vs 2.32 GiB²).
Sailor's runs are activation-dominated (state 2-7 GiB of 9-33 GiB), so they barely tell
the forms apart; where they differ is a large state -- a 175B-parameter stage holds ~47 GiB
of it -- which ``a·A`` would inflate by 14 % (~6.5 GiB) for fragmentation it does not have.
``memx_hpc/data/memory_error.yaml`` takes its bands from those held-out runs.

Both terms are learned per GPU type from ``verify`` runs (end-to-end records: measured
footprint ``F`` per rank against the allocator peak ``A`` and state ``S`` the cost model
predicts for its stage) as the posterior mean of a Bayesian linear regression (Gaussian
prior on ``(a, b)``, Gaussian noise whose standard deviation is :data:`NOISE_FRACTION`
of the footprint, the run-to-run spread of measured device peaks): ::

    (a, b) = argmin  sum_r (F_r - S_r - a (A_r - S_r) - b)^2 / (s F_r)^2
                     + (a - a0)^2 / ta^2 + (b - b0)^2 / tb^2

weighted by Tukey's biweight so that a run disturbed by something else on the node does
not move the line. With few runs, or runs whose activations barely differ (``a`` and
``b`` are then not separable), the answer stays near the prior; with many runs of different sizes it is the
data's line. A constant alone (``a = 1``) fitted on large plans overshoots small ones: on
Sailor's GH200 runs the device reports ~14 % more than the activations plus ~4 GiB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..errors import SpecError
from ..spec import Site

__all__ = ["MemoryPrior", "DeviceMemoryModel", "device_peak", "PRIORS", "NOISE_FRACTION", "EXPANDABLE_SEGMENTS_A", "prior_for",
           "expandable_segments", "memory_scale_of", "fit_device_memory"]

GiB = 2**30
#: Run-to-run spread of measured device peaks (relative standard deviation). Sailor's
#: GH200 runs and repeated ``verify`` runs here vary by a few percent.
NOISE_FRACTION = 0.04


@dataclass(frozen=True, kw_only=True)
class MemoryPrior:
    """Prior mean and standard deviation of the slope ``a`` and offset ``b`` (bytes)."""

    a: float
    b_bytes: float
    sd_a: float
    sd_b_bytes: float
    source: str


#: Per vendor (see the module docstring for where each figure comes from). ``b`` is
#: :data:`memx_hpc.model.api.DEFAULT_OVERHEAD_GIB`, the overhead uncalibrated models report.
PRIORS: dict[str, MemoryPrior] = {
    "nvidia": MemoryPrior(a=1.14, b_bytes=4.0 * GiB, sd_a=0.10, sd_b_bytes=1.0 * GiB,
                          source="caching-allocator reserve ~14 % of activations; CUDA context + cuBLAS workspaces + NCCL buffers "
                                 "(posterior on Sailor's dev GH200 runs)"),
    "amd": MemoryPrior(a=1.10, b_bytes=2.0 * GiB, sd_a=0.10, sd_b_bytes=1.0 * GiB,
                       source="caching-allocator reserve ~10 %; HIP context (eager code objects) + RCCL buffers"),
    "intel": MemoryPrior(a=1.10, b_bytes=1.5 * GiB, sd_a=0.10, sd_b_bytes=1.0 * GiB,
                         source="allocator reserve ~10 %; Level Zero context + oneCCL buffers"),
    "cpu": MemoryPrior(a=1.0, b_bytes=0.25 * GiB, sd_a=0.10, sd_b_bytes=0.25 * GiB,
                       source="peak RSS: interpreter, libraries and gloo buffers; no caching allocator"),
}


#: The slope under PyTorch's ``expandable_segments`` (``PYTORCH_CUDA_ALLOC_CONF=
#: expandable_segments:True``, which Megatron-LM's CI cases and the Megatron-Bridge / NeMo
#: performance recipes set). The caching allocator then keeps one segment per stream that
#: grows by mapping 2 MiB pages at its end (``c10/cuda/CUDACachingAllocator.cpp``,
#: ``ExpandableSegment``) instead of carving fixed 2 / 20 MiB-rounded segments, so what the
#: NVIDIA prior's 14 % stands for -- segments that fit no later request, kept reserved beside
#: the ones that do -- mostly goes: a request larger than any free hole extends the segment
#: by its own size. What is left is rounding to the 2 MiB page and holes between live blocks
#: inside the segment (the allocator still splits and caches blocks): 4 % of the activations, with a standard
#: deviation (5 %) that still covers the non-expandable reserve at two deviations. The fixed
#: part ``b`` (context, workspaces, communicators' buffers) does not depend on the setting.
EXPANDABLE_SEGMENTS_A = {"nvidia": 1.04}
#: where the setting is read: an environment variable of the partition's jobs (site file
#: ``env``), as torch reads it (also spelled PYTORCH_ALLOC_CONF, and PYTORCH_HIP_ALLOC_CONF on ROCm)
ALLOC_CONF_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")


def prior_for(vendor: str, *, expandable_segments: bool = False) -> MemoryPrior:
    """The prior of ``vendor``'s devices; with ``expandable_segments`` the slope of an
    allocator that grows one segment per stream (:data:`EXPANDABLE_SEGMENTS_A`), on the
    vendors whose allocator has the option."""
    if vendor not in PRIORS:
        raise SpecError("unknown vendor", field="vendor", found=vendor, allowed=", ".join(PRIORS))
    p = PRIORS[vendor]
    if expandable_segments and vendor in EXPANDABLE_SEGMENTS_A:
        return MemoryPrior(a=EXPANDABLE_SEGMENTS_A[vendor], b_bytes=p.b_bytes, sd_a=0.05, sd_b_bytes=p.sd_b_bytes,
                           source=p.source.replace("caching-allocator reserve ~", "caching-allocator reserve (not ~")
                           .replace(" % of activations;", " % of activations: expandable segments, ~4 %);", 1))
    return p


def expandable_segments(env: Sequence[tuple[str, str]]) -> bool:
    """Whether an environment (``(name, value)`` pairs, e.g. a partition's ``env``) turns on
    the caching allocator's expandable segments: torch's ``key:value`` list, comma
    separated, ``expandable_segments:True`` (c10 ``CUDAAllocatorConfig::parseArgs``)."""
    for name, value in env:
        if name not in ALLOC_CONF_VARIABLES:
            continue
        for item in str(value).split(","):
            key, _, val = item.partition(":")
            if key.strip() == "expandable_segments":
                return val.strip() == "True"
    return False


def memory_scale_of(cost_model, site: Site) -> Callable[[str], float]:
    """``gpu_type -> a`` of the device-memory model: the cost model's (a calibration fitted
    it on end-to-end runs), else the prior of the GPU's vendor (:data:`PRIORS`), with
    expandable segments where every partition of that GPU type sets them in its ``env``
    (:func:`expandable_segments`)."""
    f = getattr(cost_model, "memory_scale", None)
    if callable(f):
        return f

    def prior(gpu_type: str) -> float:
        parts = [p for p in site.partitions if p.gpu_type == gpu_type]
        grown = bool(parts) and all(expandable_segments(p.env) for p in parts)
        return prior_for(site.gpu(gpu_type).vendor, expandable_segments=grown).a

    return prior


def device_peak(allocator_peak_bytes, state_bytes, a, b_bytes):
    """What the device reports for an allocator peak ``A`` of which ``state_bytes`` (``S``)
    is the state allocated once at start-up: ``S + a·(A - S) + b`` (the module docstring).
    Floats and numpy arrays alike."""
    return state_bytes + a * (allocator_peak_bytes - state_bytes) + b_bytes


@dataclass(frozen=True, kw_only=True)
class DeviceMemoryModel:
    """``footprint = S + a · (allocator_peak - S) + b`` for one GPU type (``S`` the state)."""

    a: float
    b_bytes: float
    runs: int = 0  # measurements it was fitted on (0: the prior)
    source: str = "prior"

    def footprint(self, allocator_peak_bytes: float, state_bytes: float = 0.0) -> float:
        return float(device_peak(float(allocator_peak_bytes), float(state_bytes), self.a, self.b_bytes))

    def overhead_at(self, allocator_peak_bytes: float, state_bytes: float = 0.0) -> float:
        """Bytes beyond the allocator peak at this peak (``(a - 1) · (A - S) + b``)."""
        return self.footprint(allocator_peak_bytes, state_bytes) - float(allocator_peak_bytes)

    @classmethod
    def from_prior(cls, prior: MemoryPrior) -> "DeviceMemoryModel":
        return cls(a=prior.a, b_bytes=prior.b_bytes, runs=0, source=f"prior: {prior.source}")


#: Physical bounds: the device never reports less than the allocator holds on GPUs, and
#: a slope beyond 2 would be a leak, not an allocator.
A_BOUNDS = (0.9, 2.0)


def fit_device_memory(allocator_peaks: Sequence[float], footprints: Sequence[float], prior: MemoryPrior, *,
                      state_bytes: Sequence[float] | None = None, noise_fraction: float = NOISE_FRACTION,
                      prior_weight: float = 1.0) -> DeviceMemoryModel:
    """Posterior mean of ``(a, b)`` given measured ``footprints`` at predicted ``allocator_peaks``
    of which ``state_bytes`` are the state (one per run; None: no state, the slope on the
    whole peak; the module docstring has the objective). No pairs: the prior.
    ``prior_weight`` scales the prior's precision (0: least squares alone, with a vanishing
    prior only to keep one run, or runs of one size, solvable)."""
    A = np.asarray(allocator_peaks, dtype=np.float64)
    F = np.asarray(footprints, dtype=np.float64)
    S = np.zeros_like(A) if state_bytes is None else np.asarray(state_bytes, dtype=np.float64)
    if A.shape != F.shape or S.shape != A.shape:
        raise SpecError("one allocator peak and state per footprint", field="allocator_peaks",
                        found=(A.size, F.size, S.size))
    keep = np.isfinite(A) & np.isfinite(F) & np.isfinite(S) & (F > 0) & (A >= 0) & (S >= 0) & (S <= A)
    A, F, S = A[keep], F[keep], S[keep]
    if A.size == 0:
        return DeviceMemoryModel.from_prior(prior)
    # the slope multiplies the activations (A - S) and the state counts at its size: the
    # regression of F - S on A - S. Work in GiB so the normal equations are well conditioned
    a_, f_ = (A - S) / GiB, (F - S) / GiB
    sd = noise_fraction * F / GiB
    X = np.stack([a_, np.ones_like(a_)], axis=1)
    P = max(float(prior_weight), 1e-9) * np.diag([1.0 / prior.sd_a ** 2, 1.0 / (prior.sd_b_bytes / GiB) ** 2])
    theta0 = np.array([prior.a, prior.b_bytes / GiB])

    def solve(w: np.ndarray) -> tuple[float, float]:
        lhs = X.T @ (w[:, None] * X) + P
        rhs = X.T @ (w * f_) + P @ theta0
        a, b = np.linalg.solve(lhs, rhs)
        if not A_BOUNDS[0] <= a <= A_BOUNDS[1]:  # refit b with a held at the bound
            a = float(np.clip(a, *A_BOUNDS))
            b = (np.sum(w * (f_ - a * a_)) + P[1, 1] * theta0[1]) / (np.sum(w) + P[1, 1])
        return float(a), float(b)

    # A run disturbed by something else on the node (another process, a leak) must not move
    # the line: Tukey's biweight (c = 4.685 noise deviations of the footprint) by iteratively
    # reweighted least squares, started from the prior's slope and the median offset, which an
    # outlier cannot move. A run further than ~19 % (c x 4 %) from the line gets no weight.
    a, b = prior.a, float(np.median(f_ - prior.a * a_))
    for _ in range(30):
        r = (f_ - a * a_ - b) / sd
        u = np.clip(np.abs(r) / 4.685, 0.0, 1.0)
        w = (1 - u ** 2) ** 2 / sd ** 2
        if not np.any(w > 0):
            break
        a_new, b_new = solve(w)
        done = abs(a_new - a) < 1e-12 and abs(b_new - b) < 1e-12
        a, b = a_new, b_new
        if done:
            break
    b = max(float(b), 0.0)
    return DeviceMemoryModel(a=float(a), b_bytes=b * GiB, runs=int(A.size),
                             source=f"fitted on {A.size} run(s), prior state + {prior.a:.2f} x activations + "
                                    f"{prior.b_bytes / GiB:.2f} GiB")
