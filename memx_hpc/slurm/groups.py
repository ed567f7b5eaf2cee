"""Which communication backend every process group of a plan uses (torch-free, pure).

The rule (DESIGN.md §5): a group whose ranks all sit on GPUs of one vendor uses that
vendor's collective library (NCCL on NVIDIA, RCCL on AMD -- ROCm's torch registers it
under the name ``nccl`` -- gloo on CPUs); a group whose ranks span vendors uses a backend
both sides have: UCC (over UCX, whose ``cuda_copy``/``rocm_copy`` transports carry GPU
memory) where the traffic is large and frequent (pipeline sends, the tied-embedding
gradient all-reduce), gloo where the group is cold and its messages are small (the
model-parallel group's gradient-norm and found-inf scalars). The world group carries
barriers and CPU objects over gloo and, should any code fall back to it with a GPU tensor,
sends that over UCC (torch's per-device backend string ``cpu:gloo,cuda:ucc``).

Megatron's rank order is ``tp-cp-ep-dp-pp`` (cp = ep = 1 here): TP fastest, then DP, then
the pipeline stage. The groups listed are the ones megatron-core communicates over in a
dense GPT: ``tp``, ``dp``, ``pp``, ``mp`` (tp x pp), ``embd`` (first and last stage of
each pipeline), ``pos_embd`` (first stage) and ``default`` (the world).

:func:`group_backends` is what the rendered script's ranks compute (from the per-rank
vendors the script exports) and what ``render`` records, so the two cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["GroupBackend", "group_backends", "VENDOR_BACKEND", "CROSS_VENDOR_DEFAULT", "KINDS",
           "encode_rank_vendors", "decode_rank_vendors", "crosses_vendors", "format_map"]

#: torch.distributed backend of a group inside one vendor.
VENDOR_BACKEND = {"nvidia": "nccl", "amd": "nccl", "cpu": "gloo", "intel": "xccl"}
#: The world group of a cross-vendor job: CPU tensors over gloo, GPU tensors over UCC.
CROSS_VENDOR_DEFAULT = "cpu:gloo,cuda:ucc"
#: The kinds of groups, in the order every rank creates them.
KINDS = ("tp", "dp", "pp", "mp", "embd", "pos_embd", "default")
_COLD = {"mp": "gradient-norm and found-inf scalars, once per iteration",
         "default": "barriers and CPU objects; GPU tensors of fallbacks over ucc"}


@dataclass(frozen=True, kw_only=True)
class GroupBackend:
    """One process group: its kind, its global ranks, the vendors they sit on, its backend."""

    kind: str
    ranks: tuple[int, ...]
    vendors: tuple[str, ...]  # sorted, distinct
    backend: str  # a torch.distributed backend string
    reason: str

    @property
    def cross_vendor(self) -> bool:
        return len(self.vendors) > 1


def _groups(kind: str, tp: int, dp: int, pp: int) -> list[tuple[int, ...]]:
    def rank(t: int, d: int, s: int) -> int:
        return s * tp * dp + d * tp + t

    if kind == "tp":
        return [tuple(rank(t, d, s) for t in range(tp)) for s in range(pp) for d in range(dp)]
    if kind == "dp":
        return [tuple(rank(t, d, s) for d in range(dp)) for s in range(pp) for t in range(tp)]
    pipes = [tuple(rank(t, d, s) for s in range(pp)) for d in range(dp) for t in range(tp)]
    if kind == "pp":
        return pipes
    if kind == "mp":
        return [tuple(rank(t, d, s) for s in range(pp) for t in range(tp)) for d in range(dp)]
    if kind == "embd":
        return [(p[0], p[-1]) if len(p) > 1 else (p[0],) for p in pipes]
    if kind == "pos_embd":
        return [(p[0],) for p in pipes]
    if kind == "default":
        return [tuple(range(tp * dp * pp))]
    raise ValueError(f"unknown group kind {kind!r}; known: {', '.join(KINDS)}")


def group_backends(rank_vendors: Sequence[str], *, tp: int, dp: int, pp: int,
                   cross_vendor_backend: str = "ucc") -> tuple[GroupBackend, ...]:
    """Every group of a ``tp x dp x pp`` job whose rank ``r`` runs on a GPU of vendor
    ``rank_vendors[r]``, with the backend the rule gives it. Pure; same order on every rank."""
    if len(rank_vendors) != tp * dp * pp:
        raise ValueError(f"{len(rank_vendors)} rank vendors for a world of tp*dp*pp = {tp * dp * pp}")
    unknown = sorted(set(rank_vendors) - set(VENDOR_BACKEND))
    if unknown:
        raise ValueError(f"unknown vendor(s) {unknown}; known: {', '.join(VENDOR_BACKEND)}")
    out = []
    for kind in KINDS:
        for ranks in _groups(kind, tp, dp, pp):
            vendors = tuple(sorted({rank_vendors[r] for r in ranks}))
            if len(vendors) == 1:
                backend = VENDOR_BACKEND[vendors[0]]
                reason = f"inside one vendor ({vendors[0]})"
            elif kind == "default":
                backend, reason = CROSS_VENDOR_DEFAULT, "spans vendors, cold: " + _COLD[kind]
            elif kind in _COLD:
                backend, reason = "gloo", "spans vendors, cold: " + _COLD[kind]
            else:
                backend, reason = cross_vendor_backend, "spans vendors, hot: a backend both vendors have"
            out.append(GroupBackend(kind=kind, ranks=ranks, vendors=vendors, backend=backend, reason=reason))
    return tuple(out)


def crosses_vendors(rank_vendors: Sequence[str]) -> bool:
    return len(set(rank_vendors)) > 1


def encode_rank_vendors(rank_vendors: Sequence[str]) -> str:
    """``nvidia*8,amd*4,nvidia*4``: the vendors of ranks 0.. in runs (an environment value)."""
    runs: list[list] = []
    for v in rank_vendors:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return ",".join(f"{v}*{n}" for v, n in runs)


def decode_rank_vendors(text: str) -> tuple[str, ...]:
    out: list[str] = []
    for part in text.split(","):
        v, _, n = part.strip().partition("*")
        if v not in VENDOR_BACKEND or not n.isdigit() or int(n) < 1:
            raise ValueError(f"not a rank-vendor list ('nvidia*8,amd*4'): {text!r}")
        out += [v] * int(n)
    return tuple(out)


def format_map(groups: Sequence[GroupBackend], *, limit: int = 4) -> list[str]:
    """One line per kind: its backend(s) and a few of its groups (for logs and reports)."""
    lines = []
    for kind in KINDS:
        gs = [g for g in groups if g.kind == kind]
        by_backend: dict[tuple[str, str], list[GroupBackend]] = {}
        for g in gs:
            by_backend.setdefault((g.backend, g.reason), []).append(g)
        parts = []
        for (backend, _), bg in by_backend.items():
            shown = " ".join(str(list(g.ranks)) for g in bg[:limit]) + (" ..." if len(bg) > limit else "")
            parts.append(f"{backend} x{len(bg)} ({bg[0].reason}) {shown}")
        lines.append(f"{kind}: " + "; ".join(parts))
    return lines
