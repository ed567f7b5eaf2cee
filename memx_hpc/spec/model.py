"""The model: :class:`ModelSpec` (a GPT-style decoder as megatron-core builds it: dense,
mixture of experts, multi-latent attention), :class:`LayerShape` (what one layer's cost
depends on), the MoE field table and the reading of a model's fields from a mapping.

Presets and Hugging Face configs are resolved by :func:`memx_hpc.spec.readers.model_from_mapping`,
which hands the fields to :func:`model_from_fields` here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Literal, Mapping

from ..errors import SpecError
from .checks import MAX_HEADS, MAX_HIDDEN, MAX_LAYERS, MAX_SEQ_LENGTH, MAX_VOCAB, _build, _choice, _real, _short, _text, _whole
from .modes import (ACTIVATIONS, MOE_LOAD_BALANCING, MOE_SCORE_FUNCTIONS, NORMALIZATIONS, POSITION_EMBEDDINGS,
                    ROPE_SCALINGS, Activation, MoeLoadBalancing, MoeScoreFunction, Normalization, PositionEmbedding,
                    RopeScaling)
from .yamlio import _Reader

def _check_shape(obj: Any) -> None:
    """The ranges of the shape fields a ModelSpec and a LayerShape share."""
    _whole(obj.hidden_size, "hidden_size", 1, MAX_HIDDEN)
    _whole(obj.num_attention_heads, "num_attention_heads", 1, MAX_HEADS)
    _whole(obj.num_query_groups, "num_query_groups", 1, MAX_HEADS)
    _whole(obj.ffn_hidden_size, "ffn_hidden_size", 1, 4 * MAX_HIDDEN)
    _whole(obj.vocab_size, "vocab_size", 1, MAX_VOCAB)
    _whole(obj.seq_length, "seq_length", 1, MAX_SEQ_LENGTH)
    _choice(obj.activation, "activation", ACTIVATIONS)


MAX_EXPERTS = 4096


@dataclass(frozen=True)
class MoeField:
    """One mixture-of-experts field of :class:`ModelSpec`: its name (Megatron-LM's argument
    ``dest``, so ``--`` + the name with dashes is its flag), how a model mapping gives it
    (the :class:`~memx_hpc.spec.yamlio._Reader` method; ``freq`` is ``moe_layer_freq``'s own
    form), its closed set of values where it has one, and whether the project's
    megatron-core entry (memx_hpc/train/args.py) takes it. Its default is the ModelSpec's."""

    name: str
    kind: Literal["int", "str", "bool", "freq"]
    choices: tuple[str, ...] = ()
    project_entry: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def default(self) -> Any:
        return _MODEL_DEFAULTS[self.name]


#: The one table of the MoE fields: the model reader, the plan fingerprint
#: (MODEL_EXTENSION_FIELDS) and the training entry's command line read it.
MOE_FIELDS: tuple[MoeField, ...] = (
    MoeField("num_experts", "int", project_entry=True),
    MoeField("moe_router_topk", "int", project_entry=True),
    MoeField("moe_ffn_hidden_size", "int", project_entry=True),
    MoeField("moe_shared_expert_intermediate_size", "int", project_entry=True),
    MoeField("moe_layer_freq", "freq", project_entry=True),
    MoeField("moe_router_load_balancing_type", "str", MOE_LOAD_BALANCING, project_entry=True),
    MoeField("moe_router_score_function", "str", MOE_SCORE_FUNCTIONS, project_entry=True),
    MoeField("moe_router_num_groups", "int"),
    MoeField("moe_router_group_topk", "int"),
    MoeField("moe_router_enable_expert_bias", "bool"),
    MoeField("moe_shared_expert_gate", "bool"),
)

#: How a model mapping's extension fields beyond the MoE block are read (the _Reader method).
_ATTENTION_KINDS = {
    "head_dim": "int", "add_qkv_bias": "bool", "qk_layernorm": "bool", "rotary_base": "int", "rope_scaling": "str",
    "rope_scaling_factor": "float", "multi_latent_attention": "bool", "q_lora_rank": "int", "kv_lora_rank": "int",
    "qk_head_dim": "int", "qk_pos_emb_head_dim": "int", "v_head_dim": "int",
}

#: ModelSpec fields beyond the dense GPT shape: a plan's job fingerprint leaves them out
#: while they hold their defaults, so a dense model's fingerprint is what it was before
#: they existed (memx_hpc.planfile.job_fingerprint).
MODEL_EXTENSION_FIELDS = tuple(_ATTENTION_KINDS) + tuple(f.name for f in MOE_FIELDS) + ("hidden_dropout",)

# How a model mapping's extension fields are read (the _Reader method; moe_layer_freq is its own).
_EXTENSION_KINDS = {**_ATTENTION_KINDS, **{f.name: f.kind for f in MOE_FIELDS if f.kind != "freq"},
                    "hidden_dropout": "float"}


def moe_pattern(freq: "int | tuple[int, ...]", num_layers: int) -> tuple[bool, ...]:
    """Which layers are MoE, as Megatron-LM reads ``--moe-layer-freq``: an integer N makes
    layer i an expert layer when ``i % N == 0``; a list of 0/1 names every layer
    (megatron/training/arguments.py ``moe_freq_type``; training.py ``num_floating_point_operations``)."""
    if isinstance(freq, tuple):
        return tuple(bool(x) for x in freq)
    return tuple(i % freq == 0 for i in range(num_layers))


def _check_freq(freq: Any, num_layers: Any) -> None:
    if isinstance(freq, tuple):
        if not all(x in (0, 1) and not isinstance(x, bool) for x in freq):
            raise SpecError("a layer pattern holds 1 (MoE layer) and 0 (dense layer)", field="moe_layer_freq",
                            found=_short(freq), allowed="an integer N >= 1 or a list of 0/1, one per layer")
        if len(freq) != num_layers:
            raise SpecError(f"a pattern of {len(freq)} layers for a model of {num_layers}", field="moe_layer_freq",
                            found=_short(freq), allowed=f"{num_layers} entries")
        if not any(freq):
            raise SpecError("no MoE layer in the pattern", field="moe_layer_freq", found=_short(freq))
        return
    _whole(freq, "moe_layer_freq", 1, MAX_LAYERS)


class _HeadsAndExperts:
    """What a model and a layer shape derive alike from their head and expert fields."""

    @property
    def kv_channels(self) -> int:
        """Head size of standard attention (Megatron's ``--kv-channels``: ``head_dim``, else
        ``hidden_size / heads``)."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        """Whether the MLP (of a layer; of some layers of a model) is the mixture of experts."""
        return self.num_experts is not None

    @property
    def expert_ffn_hidden_size(self) -> int:
        """Per-branch width of one routed expert (``ffn_hidden_size`` when not given)."""
        return self.moe_ffn_hidden_size if self.moe_ffn_hidden_size is not None else self.ffn_hidden_size


@dataclass(frozen=True, kw_only=True)
class ModelSpec(_HeadsAndExperts):
    """A GPT-style decoder as megatron-core builds it. ``ffn_hidden_size`` is the per-branch
    width (SwiGLU has two) of the dense MLP.

    Attention: grouped-query (``num_query_groups`` < heads), a head size that is not
    ``hidden_size / heads`` (``head_dim``, Megatron's ``--kv-channels``: Qwen3), biases on
    Q, K and V only (``add_qkv_bias``: Qwen2), per-head Q/K norms (``qk_layernorm``: Qwen3),
    or DeepSeek's multi-latent attention (``multi_latent_attention`` with its ranks and head
    sizes, Megatron's MLA arguments; ``q_lora_rank`` None: Q projected directly).

    Mixture of experts (``num_experts`` set): the MLP of the layers ``moe_layer_freq`` marks
    (Megatron's ``--moe-layer-freq``: every N-th layer from layer 0, or a 0/1 per layer) is
    ``num_experts`` experts of width ``moe_ffn_hidden_size`` (None: ``ffn_hidden_size``)
    of which each token takes ``moe_router_topk``, plus shared experts of total width
    ``moe_shared_expert_intermediate_size`` every token runs; the other layers keep the
    dense MLP of width ``ffn_hidden_size``.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    vocab_size: int
    seq_length: int
    activation: Activation = "gelu"
    tied_embeddings: bool = True
    position_embedding: PositionEmbedding = "learned"
    normalization: Normalization = "layernorm"
    add_bias_linear: bool = True
    head_dim: int | None = None
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    rotary_base: int = 10000
    rope_scaling: RopeScaling = "none"
    rope_scaling_factor: float = 1.0
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int = 512
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    num_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    moe_layer_freq: int | tuple[int, ...] = 1
    moe_router_load_balancing_type: MoeLoadBalancing = "aux_loss"
    moe_router_score_function: MoeScoreFunction = "softmax"
    moe_router_num_groups: int | None = None
    moe_router_group_topk: int | None = None
    moe_router_enable_expert_bias: bool = False
    moe_shared_expert_gate: bool = False
    #: Megatron-LM's ``--hidden-dropout`` (default 0.1): the dropout after attention, after the
    #: MLP and on the embedding output. At 0 no mask is kept (torch's dropout returns its input
    #: at p = 0: torch/_decomp/decompositions.py ``dropout``; megatron-core's bias-dropout-add
    #: calls it), so a layer saves ``2·s·b·h`` mask bytes fewer (Llama-family recipes run 0)
    hidden_dropout: float = 0.1

    def __post_init__(self) -> None:
        _text(self.name, "name")
        _whole(self.num_layers, "num_layers", 1, MAX_LAYERS)
        _check_shape(self)
        _choice(self.position_embedding, "position_embedding", POSITION_EMBEDDINGS)
        _choice(self.normalization, "normalization", NORMALIZATIONS)
        for name in ("tied_embeddings", "add_bias_linear", "add_qkv_bias", "qk_layernorm", "multi_latent_attention",
                     "moe_router_enable_expert_bias", "moe_shared_expert_gate"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError("expected true or false", field=name, found=_short(getattr(self, name)))
        if self.num_attention_heads % self.num_query_groups:
            raise SpecError(f"num_attention_heads {self.num_attention_heads} is not divisible by it",
                            field="num_query_groups", found=self.num_query_groups,
                            allowed="divisors of num_attention_heads")
        _whole(self.head_dim, "head_dim", 1, MAX_HIDDEN, optional=True)
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise SpecError(f"hidden_size {self.hidden_size} is not divisible by it (give head_dim for a head "
                            "size other than hidden_size / heads)", field="num_attention_heads",
                            found=self.num_attention_heads)
        _whole(self.rotary_base, "rotary_base", 1, 10**12)
        _choice(self.rope_scaling, "rope_scaling", ROPE_SCALINGS)
        _real(self.rope_scaling_factor, "rope_scaling_factor", 1.0, 1e6)
        _real(self.hidden_dropout, "hidden_dropout", 0.0, 0.99)
        if self.rope_scaling != "none" and self.position_embedding != "rope":
            raise SpecError("RoPE scaling needs position_embedding: rope", field="rope_scaling",
                            found=self.rope_scaling)
        self._check_mla()
        self._check_moe()

    def _check_mla(self) -> None:
        _whole(self.q_lora_rank, "q_lora_rank", 1, MAX_HIDDEN, optional=True)
        for name in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
            _whole(getattr(self, name), name, 1, MAX_HIDDEN)
        if not self.multi_latent_attention:
            if self.q_lora_rank is not None:
                raise SpecError("q_lora_rank applies to multi-latent attention only", field="q_lora_rank",
                                found=self.q_lora_rank, allowed="multi_latent_attention: true, or leave it out")
            return
        if self.num_query_groups != self.num_attention_heads:
            raise SpecError("multi-latent attention has one latent K/V for all heads, no query groups",
                            field="num_query_groups", found=self.num_query_groups,
                            allowed=f"num_attention_heads ({self.num_attention_heads})")
        if self.position_embedding != "rope":
            raise SpecError("multi-latent attention carries its position in a RoPE part of each head",
                            field="position_embedding", found=self.position_embedding, allowed="rope")
        if self.head_dim is not None:
            raise SpecError("multi-latent attention takes qk_head_dim, qk_pos_emb_head_dim and v_head_dim",
                            field="head_dim", found=self.head_dim)

    def _check_moe(self) -> None:
        _whole(self.num_experts, "num_experts", 1, MAX_EXPERTS, optional=True)
        _choice(self.moe_router_load_balancing_type, "moe_router_load_balancing_type", MOE_LOAD_BALANCING)
        _choice(self.moe_router_score_function, "moe_router_score_function", MOE_SCORE_FUNCTIONS)
        if self.num_experts is None:
            for name in ("moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_router_num_groups",
                         "moe_router_group_topk"):
                if getattr(self, name) is not None:
                    raise SpecError("applies to a mixture of experts only", field=name, found=getattr(self, name),
                                    allowed="num_experts set, or leave it out")
            if self.moe_shared_expert_gate:
                raise SpecError("applies to a mixture of experts only", field="moe_shared_expert_gate", found=True)
            if self.moe_layer_freq != 1:
                raise SpecError("applies to a mixture of experts only", field="moe_layer_freq",
                                found=_short(self.moe_layer_freq), allowed="num_experts set, or leave it out")
            return
        _whole(self.moe_router_topk, "moe_router_topk", 1, self.num_experts)
        _whole(self.moe_ffn_hidden_size, "moe_ffn_hidden_size", 1, 4 * MAX_HIDDEN, optional=True)
        _whole(self.moe_shared_expert_intermediate_size, "moe_shared_expert_intermediate_size", 1,
               64 * MAX_HIDDEN, optional=True)
        _check_freq(self.moe_layer_freq, self.num_layers)
        if (self.moe_router_num_groups is None) != (self.moe_router_group_topk is None):
            raise SpecError("group-limited routing takes both moe_router_num_groups and moe_router_group_topk",
                            field="moe_router_group_topk" if self.moe_router_group_topk is None
                            else "moe_router_num_groups", found=None)
        if self.moe_router_num_groups is not None:
            _whole(self.moe_router_num_groups, "moe_router_num_groups", 1, self.num_experts)
            if self.num_experts % self.moe_router_num_groups:
                raise SpecError(f"num_experts {self.num_experts} is not divisible by it",
                                field="moe_router_num_groups", found=self.moe_router_num_groups)
            _whole(self.moe_router_group_topk, "moe_router_group_topk", 1, self.moe_router_num_groups)
        if self.moe_shared_expert_intermediate_size is not None and self.add_bias_linear:
            raise SpecError("megatron-core's shared experts have no biases (SharedExpertMLP)", field="add_bias_linear",
                            found=True, allowed="false with moe_shared_expert_intermediate_size")
        if self.moe_shared_expert_gate and self.moe_shared_expert_intermediate_size is None:
            raise SpecError("a shared-expert gate needs shared experts", field="moe_shared_expert_gate", found=True,
                            allowed="moe_shared_expert_intermediate_size set, or leave it out")

    @property
    def moe_layers(self) -> tuple[bool, ...]:
        """Per layer, whether its MLP is the mixture of experts (all False for a dense model)."""
        if self.num_experts is None:
            return (False,) * self.num_layers
        return moe_pattern(self.moe_layer_freq, self.num_layers)

    def check(self, path: str = "model") -> None:
        """Checks run when the spec is built; kept so callers that re-check still can."""
        try:
            ModelSpec(**{f.name: getattr(self, f.name) for f in fields(self)})
        except SpecError as e:
            raise e.within(path) from None



_MODEL_DEFAULTS = {f.name: f.default for f in fields(ModelSpec)}


@dataclass(frozen=True, kw_only=True)
class LayerShape(_HeadsAndExperts):
    """The shape numbers one transformer layer's cost depends on.

    A dense layer with standard attention of ``hidden_size / heads`` wide heads needs only the
    first seven fields (what every stored sample before the others existed describes). The
    others, each at a value meaning "not this kind of layer" by default:

    * ``head_dim``: a head size other than ``hidden_size / heads`` (Megatron's ``--kv-channels``);
    * ``multi_latent_attention`` with ``q_lora_rank`` (None: Q projected directly),
      ``kv_lora_rank``, ``qk_head_dim``, ``qk_pos_emb_head_dim`` and ``v_head_dim``
      (DeepSeek's MLA, Megatron's MLA arguments);
    * ``num_experts`` set: the layer's MLP is the mixture of experts (``moe_router_topk``
      experts per token of per-branch width ``moe_ffn_hidden_size``, shared experts of
      total width ``moe_shared_expert_intermediate_size`` with an optional gate); a dense
      layer of an MoE model (``moe_layer_freq``) has ``num_experts`` None.
    """

    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    seq_length: int
    vocab_size: int
    activation: Activation = "gelu"
    head_dim: int | None = None
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_head_dim: int | None = None
    qk_pos_emb_head_dim: int | None = None
    v_head_dim: int | None = None
    num_experts: int | None = None
    moe_router_topk: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    moe_shared_expert_gate: bool = False

    def __post_init__(self) -> None:
        _check_shape(self)
        _whole(self.head_dim, "head_dim", 1, MAX_HIDDEN, optional=True)
        for name in ("multi_latent_attention", "moe_shared_expert_gate"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError("expected true or false", field=name, found=_short(getattr(self, name)))
        mla = ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
        _whole(self.q_lora_rank, "q_lora_rank", 1, MAX_HIDDEN, optional=True)
        for name in mla:
            _whole(getattr(self, name), name, 1, MAX_HIDDEN, optional=True)
        if self.multi_latent_attention:
            missing = [n for n in mla if getattr(self, n) is None]
            if missing:
                raise SpecError("multi-latent attention needs its ranks and head sizes", field=missing[0], found=None)
            if self.head_dim is not None:
                raise SpecError("multi-latent attention takes qk_head_dim, qk_pos_emb_head_dim and v_head_dim",
                                field="head_dim", found=self.head_dim)
        else:
            given = [n for n in ("q_lora_rank",) + mla if getattr(self, n) is not None]
            if given:
                raise SpecError("applies to multi-latent attention only", field=given[0],
                                found=getattr(self, given[0]), allowed="multi_latent_attention: true, or leave it out")
        moe = ("moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size")
        _whole(self.num_experts, "num_experts", 1, MAX_EXPERTS, optional=True)
        if self.num_experts is None:
            given = [n for n in moe if getattr(self, n) is not None] + (
                ["moe_shared_expert_gate"] if self.moe_shared_expert_gate else [])
            if given:
                raise SpecError("applies to a mixture-of-experts layer only", field=given[0],
                                found=getattr(self, given[0]), allowed="num_experts set, or leave it out")
            return
        if self.moe_router_topk is None or self.moe_ffn_hidden_size is None:
            raise SpecError("an MoE layer needs moe_router_topk and moe_ffn_hidden_size",
                            field="moe_router_topk" if self.moe_router_topk is None else "moe_ffn_hidden_size",
                            found=None)
        _whole(self.moe_router_topk, "moe_router_topk", 1, self.num_experts)
        _whole(self.moe_ffn_hidden_size, "moe_ffn_hidden_size", 1, 4 * MAX_HIDDEN)
        _whole(self.moe_shared_expert_intermediate_size, "moe_shared_expert_intermediate_size", 1,
               64 * MAX_HIDDEN, optional=True)
        if self.moe_shared_expert_gate and self.moe_shared_expert_intermediate_size is None:
            raise SpecError("a shared-expert gate needs shared experts", field="moe_shared_expert_gate", found=True)

    @property
    def extension(self) -> dict[str, Any]:
        """The fields beyond the dense shape that differ from their defaults (a dense layer
        with standard attention: empty)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in DENSE_SHAPE_FIELDS and getattr(self, f.name) != f.default}

    @staticmethod
    def of(model: ModelSpec, *, moe: bool | None = None) -> "LayerShape":
        """The layer shape of ``model``'s layers: ``moe`` True the mixture-of-experts layer,
        False the dense one, None the one kind all its layers are (a model whose layers are
        dense and MoE, ``moe_layer_freq``, has two shapes: :meth:`kinds_of` says which each
        layer is). A head size equal to ``hidden_size / heads`` is the default one."""
        kinds = set(model.moe_layers)
        if moe is None:
            if len(kinds) > 1:
                raise SpecError("the layers of this model differ (dense and MoE): ask for one kind",
                                field="model.moe_layer_freq", found=_short(model.moe_layer_freq))
            moe = kinds == {True}
        if moe and not model.is_moe:
            raise SpecError("a dense model has no MoE layer", field="model.num_experts", found=None)
        ext: dict[str, Any] = {}
        if model.head_dim is not None and model.head_dim * model.num_attention_heads != model.hidden_size:
            ext["head_dim"] = model.head_dim
        if model.multi_latent_attention:
            ext.update(multi_latent_attention=True, q_lora_rank=model.q_lora_rank, kv_lora_rank=model.kv_lora_rank,
                       qk_head_dim=model.qk_head_dim, qk_pos_emb_head_dim=model.qk_pos_emb_head_dim,
                       v_head_dim=model.v_head_dim)
        if moe:
            ext.update(num_experts=model.num_experts, moe_router_topk=model.moe_router_topk,
                       moe_ffn_hidden_size=model.expert_ffn_hidden_size,
                       moe_shared_expert_intermediate_size=model.moe_shared_expert_intermediate_size,
                       moe_shared_expert_gate=model.moe_shared_expert_gate)
        return LayerShape(hidden_size=model.hidden_size, num_attention_heads=model.num_attention_heads,
                          num_query_groups=model.num_query_groups, ffn_hidden_size=model.ffn_hidden_size,
                          seq_length=model.seq_length, vocab_size=model.vocab_size,
                          activation=model.activation, **ext)

    @staticmethod
    def kinds_of(model: ModelSpec) -> tuple[bool, ...]:
        """Per layer, whether :meth:`of` ``(model, moe=True)`` is its shape (the model's
        ``moe_layers``: all False for a dense model)."""
        return model.moe_layers


#: The fields of a LayerShape every stored sample has (the rest are :attr:`LayerShape.extension`).
DENSE_SHAPE_FIELDS = ("hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "seq_length",
                      "vocab_size", "activation")



# --------------------------------------------------------------------------- reading a model's fields

#: The keys of a model mapping besides ``preset`` and ``hf_config``.
MODEL_FIELD_KEYS = ("name", "num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
                    "ffn_hidden_size", "vocab_size", "seq_length", "activation", "tied_embeddings",
                    "position_embedding", "normalization", "add_bias_linear") + MODEL_EXTENSION_FIELDS


def _layer_freq(r: _Reader, base: Mapping[str, Any]) -> int | tuple[int, ...]:
    """``moe_layer_freq``: an integer N or a list of 0/1 (a tuple in the spec)."""
    if not r.has("moe_layer_freq"):
        r.used.add("moe_layer_freq")
        return base.get("moe_layer_freq", 1)
    v = r.raw("moe_layer_freq")
    if isinstance(v, list):
        return tuple(v)
    return r.int("moe_layer_freq")


def model_from_fields(r: _Reader, base: Mapping[str, Any] | None = None, *, path: str = "model") -> ModelSpec:
    """The model the fields of ``r`` describe over ``base`` (a preset's or a Hugging Face
    config's keyword arguments, which the fields override). The caller finishes ``r``."""
    base = base or {}

    def get(kind: str, name: str, **kw: Any) -> Any:
        default = base.get(name, kw.pop("default", ...))
        return getattr(r, kind)(name, default, **kw)

    hidden = get("int", "hidden_size")
    heads = get("int", "num_attention_heads")
    activation = get("str", "activation", default="gelu")
    # the default FFN width: 4h for GELU, Llama's 8h/3 rounded up to 256 for SwiGLU
    if isinstance(hidden, int) and 0 < hidden <= MAX_HIDDEN:
        default_ffn = 4 * hidden if activation != "swiglu" else int(256 * math.ceil((8 * hidden / 3) / 256))
    else:
        default_ffn = 1
    extension = {name: get(kind, name, default=_MODEL_DEFAULTS[name]) for name, kind in _EXTENSION_KINDS.items()}
    return _build(
        ModelSpec, path,
        name=get("str", "name", default=base.get("name", "custom")),
        num_layers=get("int", "num_layers"),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=get("int", "num_query_groups", default=heads),
        ffn_hidden_size=get("int", "ffn_hidden_size", default=default_ffn),
        vocab_size=get("int", "vocab_size"),
        seq_length=get("int", "seq_length"),
        activation=activation,
        tied_embeddings=get("bool", "tied_embeddings", default=True),
        position_embedding=get("str", "position_embedding", default="learned"),
        normalization=get("str", "normalization", default="layernorm"),
        add_bias_linear=get("bool", "add_bias_linear", default=True),
        moe_layer_freq=_layer_freq(r, base),
        **extension,
    )
