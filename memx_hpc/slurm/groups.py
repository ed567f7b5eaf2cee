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

Megatron's rank order is ``tp-cp-ep-dp-pp``: TP fastest, then context parallel, then DP,
then the pipeline stage (megatron-core ``parallel_state``: the decoder's ``RankGenerator``
over tp, cp, dp, pp; the experts' over expert TP, EP and expert DP, pp, with
``etp · ep · edp = tp · cp · dp``). The groups listed are the ones megatron-core
communicates over: in a dense GPT ``tp``, ``dp``, ``pp``, ``mp`` (tp x pp), ``embd`` (first
and last stage of each pipeline), ``pos_embd`` (first stage) and ``default`` (the world);
with context parallel also ``cp`` (ring attention's K/V exchange) and ``dp_cp`` (the
gradients, reduced over DP and CP together); with expert parallel ``ep`` (the token
all-to-all), ``etp`` (expert TP, when > 1) and ``edp`` (the experts' gradients). All of
them are hot: a group of them that spans vendors gets the cross-vendor backend
(:data:`HOT_CROSS_VENDOR_OPS` says which collectives it must carry), and a plan whose group
needs a collective that backend lacks is not searched (:func:`cross_vendor_unsupported`).

:func:`group_backends` is what the rendered script's ranks compute (from the per-rank
vendors the script exports) and what ``render`` records, so the two cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..placement import GROUP_KINDS, group_kinds as kinds, group_ranks

__all__ = ["GroupBackend", "group_backends", "VENDOR_BACKEND", "CROSS_VENDOR_DEFAULT", "KINDS", "kinds",
           "HOT_CROSS_VENDOR_OPS", "BACKEND_OPS", "cross_vendor_unsupported", "encode_rank_vendors",
           "decode_rank_vendors", "crosses_vendors", "format_map"]

#: torch.distributed backend of a group inside one vendor.
VENDOR_BACKEND = {"nvidia": "nccl", "amd": "nccl", "cpu": "gloo", "intel": "xccl"}
#: The world group of a cross-vendor job: CPU tensors over gloo, GPU tensors over UCC.
CROSS_VENDOR_DEFAULT = "cpu:gloo,cuda:ucc"
#: The kinds of groups of a dense job without context parallel, in the order every rank
#: creates them; :func:`kinds` adds the context- and expert-parallel ones (their ranks:
#: :func:`memx_hpc.placement.group_ranks`).
KINDS = GROUP_KINDS
#: What each hot group carries (torch.distributed collectives), for the cross-vendor check.
HOT_CROSS_VENDOR_OPS = {"tp": ("all_reduce", "all_gather", "reduce_scatter"), "dp": ("all_reduce", "reduce_scatter",
                                                                                   "all_gather"),
                        "pp": ("send", "recv"), "embd": ("all_reduce",), "pos_embd": ("all_reduce",),
                        "cp": ("send", "recv", "all_gather"), "dp_cp": ("all_reduce", "reduce_scatter", "all_gather"),
                        "ep": ("all_to_all",), "etp": ("all_reduce", "all_gather", "reduce_scatter"),
                        "edp": ("all_reduce", "reduce_scatter", "all_gather")}
#: Collectives torch's process groups of each cross-vendor backend implement
#: (torch/csrc/distributed/c10d/ProcessGroupUCC.cpp and ProcessGroupGloo.cpp: gloo has no
#: reduce_scatter of GPU tensors; both have all_to_all).
BACKEND_OPS = {"ucc": frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "recv",
                                 "broadcast"}),
               "gloo": frozenset({"all_reduce", "all_gather", "all_to_all", "send", "recv", "broadcast"})}


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


def _groups(kind: str, tp: int, dp: int, pp: int, cp: int = 1, ep: int = 1,
            etp: int | None = None) -> list[tuple[int, ...]]:
    return group_ranks(kind, tp=tp, dp=dp, pp=pp, cp=cp, ep=ep, etp=etp)


def group_backends(rank_vendors: Sequence[str], *, tp: int, dp: int, pp: int, cp: int = 1, ep: int = 1,
                   etp: int | None = None, cross_vendor_backend: str = "ucc") -> tuple[GroupBackend, ...]:
    """Every group of a ``tp x cp x dp x pp`` job (with ``ep`` / ``etp`` for its experts) whose
    rank ``r`` runs on a GPU of vendor ``rank_vendors[r]``, with the backend the rule gives it.
    Pure; same order on every rank."""
    if len(rank_vendors) != tp * cp * dp * pp:
        raise ValueError(f"{len(rank_vendors)} rank vendors for a world of tp*cp*dp*pp = {tp * cp * dp * pp}")
    unknown = sorted(set(rank_vendors) - set(VENDOR_BACKEND))
    if unknown:
        raise ValueError(f"unknown vendor(s) {unknown}; known: {', '.join(VENDOR_BACKEND)}")
    out = []
    # expert groups only where there are experts to place (ep > 1 or an expert TP named)
    experts = ep > 1 or (etp is not None and etp > 1)
    for kind in kinds(cp=cp, ep=ep, etp=(tp if etp is None else etp) if experts else 1):
        for ranks in _groups(kind, tp, dp, pp, cp, ep, etp):
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


def cross_vendor_unsupported(groups: Sequence[GroupBackend]) -> list[str]:
    """Why a plan cannot run: each cross-vendor group whose backend lacks a collective the
    group carries (empty: every group has what it needs). The search leaves such plans out."""
    out = []
    for g in groups:
        if not g.cross_vendor or g.kind not in HOT_CROSS_VENDOR_OPS:
            continue
        have = BACKEND_OPS.get(g.backend.split(",")[-1].split(":")[-1])
        if have is None:
            out.append(f"{g.kind} group {list(g.ranks)} spans {'/'.join(g.vendors)} on {g.backend}, "
                       f"which is not a backend both vendors have")
            continue
        missing = [op for op in HOT_CROSS_VENDOR_OPS[g.kind] if op not in have]
        if missing:
            out.append(f"{g.kind} group {list(g.ranks)} spans {'/'.join(g.vendors)}: {g.backend} has no "
                       f"{', '.join(missing)}")
    return out


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
    for kind in dict.fromkeys(g.kind for g in groups):
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
