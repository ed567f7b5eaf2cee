"""Activation recomputation (:class:`Recompute`), the one type from profile point to
rendered flags, and the per-group setting the search assigns (:class:`Recompute.Level`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from .checks import MAX_LAYERS, _real, _short, _suggest, _whole
from .modes import RECOMPUTE_MODES, RecomputeMode


@dataclass(frozen=True, kw_only=True)
class Recompute:
    """Activation recomputation, the one type from profile point to rendered flags.

    ``mode`` is one of :data:`RECOMPUTE_MODES`; it is what a layer's profile point, sample and
    cost-model query key on (a single layer is recomputed wholly, selectively or not at all).
    A stage's setting adds ``num_layers``: ``full`` on that many of its layers (None: all),
    written ``full:K`` (:meth:`label`). The search assigns one :class:`Recompute.Level` per
    partition group, which gives each of the group's stages its ``Recompute``.
    :meth:`check_mode` is the one check of a mode string."""

    mode: RecomputeMode = "none"
    num_layers: int | None = None

    def __post_init__(self) -> None:
        Recompute.check_mode(self.mode)
        if self.mode != "full" and self.num_layers is not None:
            raise SpecError("num_layers applies to full recompute only", field="recompute", found=self.num_layers)
        _whole(self.num_layers, "recompute.num_layers", 0, MAX_LAYERS, optional=True)

    @staticmethod
    def check_mode(mode: Any, field: str = "recompute", allowed: tuple[str, ...] = RECOMPUTE_MODES) -> str:
        """``mode`` when it is one of ``allowed`` (a subset of :data:`RECOMPUTE_MODES`), else
        SpecError naming ``field``."""
        if mode not in allowed:
            raise SpecError("unknown recompute mode" + (_suggest(mode, allowed) if isinstance(mode, str) else ""),
                            field=field, found=_short(mode), allowed=", ".join(allowed))
        return mode

    @classmethod
    def of_layers(cls, base: str, full: int, num_layers: int) -> "Recompute":
        """A stage of ``num_layers`` that recomputes ``full`` of them fully and runs the others
        under ``base`` (Megatron-LM takes one mode per stage: ``base`` applies only when
        ``full`` is 0)."""
        if full == 0:
            return cls(mode=base)
        return cls(mode="full", num_layers=None if full == num_layers else full)

    def split(self, num_layers: int, field: str = "recompute") -> tuple[str, int]:
        """(mode of the layers not fully recomputed, number fully recomputed) in a stage of
        ``num_layers``; SpecError naming ``field`` when more are asked than the stage has."""
        if self.mode != "full":
            return self.mode, 0
        k = num_layers if self.num_layers is None else self.num_layers
        if k > num_layers:
            raise SpecError(f"full recompute of {k} layers in a stage of {num_layers}", field=field,
                            found=self.label())
        return "none", k

    def label(self) -> str:
        if self.mode == "full" and self.num_layers is not None:
            return f"full:{self.num_layers}"
        return self.mode

    @classmethod
    def parse(cls, text: Any, field: str = "recompute") -> "Recompute":
        """The setting a :meth:`label` wrote (None: no recompute); SpecError naming ``field``."""
        if text is None:
            return cls()
        if not isinstance(text, str):
            raise SpecError("expected none, selective, full or full:K", field=field, found=_short(text))
        mode, _, k = text.partition(":")
        try:
            return cls(mode=mode, num_layers=int(k) if k else None)
        except (SpecError, ValueError):
            raise SpecError("expected none, selective, full or full:K", field=field, found=_short(text)) from None

    @dataclass(frozen=True, kw_only=True)
    class Level:
        """A partition group's recompute setting as the search assigns it: ``base`` mode for the
        layers not fully recomputed, and the fraction of the group's largest stage under full
        recompute. :meth:`for_stage` gives the :class:`Recompute` of each of its stages.

        Megatron takes one ``--recompute-num-layers k`` per hetjob component (a partition
        group's stages share a command line), and a stage with ``n < k`` layers recomputes all
        n (the block method checkpoints layers ``0..k-1`` of each stage). So k is set per
        group, ``k = ceil(n_max * full_fraction)`` with ``n_max`` the group's largest stage,
        and a stage recomputes ``min(k, n)`` layers: what the rendered job runs.
        """

        base: RecomputeMode = "none"
        full_fraction: float = 0.0

        def __post_init__(self) -> None:
            Recompute.check_mode(self.base, "recompute level base", ("none", "selective"))
            _real(self.full_fraction, "full_fraction", 0.0, 1.0)

        def for_stage(self, num_layers: int, group_max_layers: int | None = None) -> "Recompute":
            k = min(num_layers, full_layers(group_max_layers or num_layers, self.full_fraction))
            return Recompute.of_layers(self.base, k, num_layers)

        def label(self) -> str:
            if self.full_fraction == 0:
                return self.base
            return "full" if self.full_fraction == 1 else f"full:{self.full_fraction:g}"


def full_layers(num_layers: int, fraction: float) -> int:
    """k = ceil(n * fraction). The small epsilon keeps exact products (4 x 0.5) from rounding
    up through binary fractions (1/3 x 3 = 1.0000000000000002)."""
    return int(math.ceil(num_layers * fraction - 1e-9))
