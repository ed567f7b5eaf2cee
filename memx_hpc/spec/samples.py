"""Profiling: what to measure (:class:`ProfilePoint`), what was measured, imported or
augmented there (:class:`LayerSample`) and where it came from (:class:`Provenance`)."""

from __future__ import annotations

import json
import numbers
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ..errors import SpecError
from .checks import MAX_GLOBAL_BATCH, MAX_GPUS_PER_NODE, MAX_NODES, _choice, _real, _safe_name, _short, _whole
from .model import MAX_EXPERTS, LayerShape
from .modes import (ATTENTIONS, PRECISIONS, SAMPLE_KINDS, SAMPLE_ORIGINS, TRANSFORMER_IMPLS, Attention, Precision,
                    RecomputeMode, SampleKind, SampleOrigin)
from .recompute import Recompute

MAX_SAMPLE_MS = 1e9          # 11.6 days for one call: beyond that a unit is wrong
MAX_SAMPLE_BYTES = 2**62     # 4 EiB per device (fits int64)


@dataclass(frozen=True, kw_only=True)
class ProfilePoint:
    """What to measure: one kind of operation on one GPU type at one setting."""

    gpu_type: str
    kind: SampleKind
    shape: LayerShape
    tp: int = 1
    micro_batch_size: int = 1
    recompute: RecomputeMode = "none"  # a Recompute.mode (a layer is recomputed wholly or not)
    precision: Precision = "bf16"
    attention: Attention = "sdpa"
    # collectives: group size and message size; p2p: 2 ranks, inter_node says where;
    # alltoall: an MoE layer's token dispatch (and combine) over an expert-parallel group
    # of group_size ranks, message_bytes what each rank sends
    group_size: int = 1
    message_bytes: int = 0
    inter_node: bool = False
    #: an MoE layer measured with its experts spread over ``ep`` ranks (1: all on one)
    ep: int = 1

    def __post_init__(self) -> None:
        _safe_name(self.gpu_type, "gpu_type")
        _choice(self.kind, "kind", SAMPLE_KINDS)
        if not isinstance(self.shape, LayerShape):
            raise SpecError("expected a layer shape", field="shape", found=_short(self.shape))
        _whole(self.tp, "tp", 1, 1 << 16)
        _whole(self.micro_batch_size, "micro_batch_size", 1, MAX_GLOBAL_BATCH)
        Recompute.check_mode(self.recompute)
        _choice(self.precision, "precision", PRECISIONS)
        _choice(self.attention, "attention", ATTENTIONS)
        _whole(self.group_size, "group_size", 1, MAX_NODES * MAX_GPUS_PER_NODE)
        _whole(self.message_bytes, "message_bytes", 0, MAX_SAMPLE_BYTES)
        if not isinstance(self.inter_node, (bool, numbers.Integral)):
            raise SpecError("expected true or false", field="inter_node", found=_short(self.inter_node))
        _whole(self.ep, "ep", 1, MAX_EXPERTS)
        if self.ep > 1 and not (self.kind == "layer" and self.shape.is_moe):
            raise SpecError("expert parallelism applies to an MoE layer", field="ep", found=self.ep, allowed="1")
        if self.ep > 1 and self.shape.num_experts % self.ep:
            raise SpecError(f"EP must divide the layer's {self.shape.num_experts} experts", field="ep", found=self.ep)


@dataclass(frozen=True)
class Provenance:
    """Where a sample was made, beyond its ``source`` and ``origin``: host, device, driver,
    versions, settings and time of a measurement; dataset, file and mapping of an import;
    the neighbours of an augmented point. One JSON object; ``text`` is its serialised form,
    kept as written (the store's and the CSV's ``provenance`` column hold it and a row's
    digest covers it). The fields the planner reads are typed properties; the object is
    read from ``text`` once, when one is first asked for."""

    text: str = "{}"

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise SpecError("expected JSON text", field="provenance", found=_short(self.text))

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> "Provenance":
        """The provenance of ``values`` (sorted keys; values JSON cannot hold are written as text)."""
        return cls(json.dumps(dict(values), sort_keys=True, default=str))

    @classmethod
    def parse(cls, text: Any, field: str = "provenance") -> "Provenance":
        """``text`` when it is a JSON object, else SpecError naming ``field``."""
        if not isinstance(text, str):
            raise SpecError("provenance must be JSON text", field=field, found=_short(text))
        try:
            ok = isinstance(json.loads(text), dict)
        except (ValueError, RecursionError):
            ok = False
        if not ok:
            raise SpecError("provenance must be JSON text", field=field, found=text[:60])
        return cls(text)

    def as_dict(self) -> dict[str, Any]:
        """The object (an empty one where ``text`` is not a JSON object: rows from before the check)."""
        got = self.__dict__.get("_fields")
        if got is None:
            try:
                got = json.loads(self.text or "{}")
            except (ValueError, RecursionError):
                got = {}
            if not isinstance(got, dict):
                got = {}
            object.__setattr__(self, "_fields", got)
        return dict(got)

    def _get(self, key: str) -> Any:
        self.as_dict()
        return self.__dict__["_fields"].get(key)

    @property
    def transformer_impl(self) -> str | None:
        """The transformer layer a measurement ran (``local`` | ``transformer_engine``), if recorded."""
        v = self._get("transformer_impl")
        return v if isinstance(v, str) else None

    @property
    def extrapolated(self) -> bool:
        """Whether an augmented point lies outside the measured ones."""
        return self._get("extrapolated") is True

    @property
    def model(self) -> str:
        """The model an imported sample was measured in ("" when not recorded)."""
        v = self._get("model")
        return v if isinstance(v, str) else ""

    @property
    def note(self) -> str | None:
        v = self._get("note")
        return v if isinstance(v, str) else None


@dataclass(frozen=True, kw_only=True)
class LayerSample:
    """What was measured (or imported, or augmented) at one ProfilePoint.

    Times are per call in milliseconds; bytes are per device. ``device_footprint_bytes``
    is what the driver reports for the process (allocator reserved peak plus runtime
    context and communication buffers); 0 when unknown. ``update_ms`` is the optimizer
    step for this layer's parameter shard. Times and bytes are never negative.
    """

    point: ProfilePoint
    forward_ms: float = 0.0
    backward_ms: float = 0.0
    update_ms: float = 0.0
    activation_bytes: int = 0
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    device_footprint_bytes: int = 0
    infeasible: bool = False
    origin: SampleOrigin = "measured"
    source: str = ""  # where it came from: host/job id, or the imported file
    provenance: Provenance = field(default_factory=Provenance)
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.point, ProfilePoint):
            raise SpecError("expected a profile point", field="point", found=_short(self.point))
        for name in ("forward_ms", "backward_ms", "update_ms"):
            _real(getattr(self, name), name, 0.0, MAX_SAMPLE_MS)
        for name in ("activation_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "device_footprint_bytes"):
            _whole(getattr(self, name), name, 0, MAX_SAMPLE_BYTES)
        _choice(self.origin, "origin", SAMPLE_ORIGINS)
        if not isinstance(self.provenance, Provenance):
            raise SpecError("expected a provenance", field="provenance", found=_short(self.provenance))
        _real(self.weight, "weight", 0.0, 1e6)

    @property
    def transformer_impl(self) -> str:
        """The transformer layer that was measured (``local`` | ``transformer_engine``), from the
        provenance; measured samples from before the field was recorded are megatron-core's
        local spec (the only one profiled then); other samples that do not say: ``unknown``."""
        impl = self.provenance.transformer_impl
        if impl in TRANSFORMER_IMPLS:
            return impl
        return "local" if self.origin == "measured" else "unknown"


def transformer_impls(samples: Iterable[LayerSample]) -> dict[str, str]:
    """The one transformer implementation measured per GPU type (layer samples; ``unknown``
    ones do not count). A GPU type measured with two is refused: predicting from both would
    mix what runs with what does not."""
    seen: dict[str, set[str]] = {}
    for s in samples:
        if s.point.kind == "layer":
            seen.setdefault(s.point.gpu_type, set()).add(s.transformer_impl)
    out = {}
    for gpu, impls in sorted(seen.items()):
        known = sorted(impls - {"unknown"})
        if len(known) > 1:
            raise SpecError(f"layer samples of {gpu} were measured with {' and '.join(known)} layers; a predictor "
                            f"fitted on both would mix them: keep the samples of the implementation the "
                            f"partition trains with (its transformer_impl)", field="transformer_impl",
                            found=known, allowed="one implementation per GPU type")
        out[gpu] = known[0] if known else "unknown"
    return out


