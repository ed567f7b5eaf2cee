"""The closed sets of the specs: one ``Literal`` type per mode, and the tuple of its values.

The dataclasses annotate their fields with the ``Literal`` types; the validators check
against the tuples, which are derived from them (``typing.get_args``), so each set is
written once.
"""

from __future__ import annotations

from typing import Literal, get_args

Vendor = Literal["nvidia", "amd", "intel", "cpu"]
VENDORS: tuple[Vendor, ...] = get_args(Vendor)
#: vendors a CPU partition may stand in for in a cross-vendor rehearsal
StandInVendor = Literal["nvidia", "amd", "intel"]
STAND_IN_VENDORS: tuple[StandInVendor, ...] = get_args(StandInVendor)

Precision = Literal["bf16", "fp16", "fp32"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
BYTES_PER_ELEMENT: dict[Precision, int] = {"bf16": 2, "fp16": 2, "fp32": 4}
#: FP8 matmuls through Transformer Engine (Megatron-LM's ``--fp8-format``): ``hybrid`` (e4m3
#: forward, e5m2 gradients) or ``e4m3`` throughout; the job's ``precision`` stays the master
#: and parameter dtype. "" (``fp8: none`` in a job file): no FP8.
Fp8Format = Literal["hybrid", "e4m3"]
FP8_FORMATS: tuple[Fp8Format, ...] = get_args(Fp8Format)
#: Megatron-LM's ``--fp8-recipe`` (core_v0.16): scaling of the FP8 tensors. ``mxfp8`` runs on
#: Blackwell only (Transformer Engine refuses it elsewhere at start-up).
Fp8Recipe = Literal["delayed", "tensorwise", "mxfp8", "blockwise"]
FP8_RECIPES: tuple[Fp8Recipe, ...] = get_args(Fp8Recipe)

Activation = Literal["gelu", "swiglu"]
ACTIVATIONS: tuple[Activation, ...] = get_args(Activation)
PositionEmbedding = Literal["learned", "rope"]
POSITION_EMBEDDINGS: tuple[PositionEmbedding, ...] = get_args(PositionEmbedding)
Normalization = Literal["layernorm", "rmsnorm"]
NORMALIZATIONS: tuple[Normalization, ...] = get_args(Normalization)
#: RoPE frequency scalings a Hugging Face config may name and Megatron-LM runs
#: (``--use-rope-scaling`` for Llama 3.1's, YaRN under multi-latent attention).
RopeScaling = Literal["none", "llama3", "yarn"]
ROPE_SCALINGS: tuple[RopeScaling, ...] = get_args(RopeScaling)
#: Megatron-LM's ``--moe-router-load-balancing-type`` choices (megatron/training/arguments.py).
MoeLoadBalancing = Literal["aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"]
MOE_LOAD_BALANCING: tuple[MoeLoadBalancing, ...] = get_args(MoeLoadBalancing)
#: Megatron-LM's ``--moe-router-score-function`` choices.
MoeScoreFunction = Literal["softmax", "sigmoid"]
MOE_SCORE_FUNCTIONS: tuple[MoeScoreFunction, ...] = get_args(MoeScoreFunction)

RecomputeMode = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[RecomputeMode, ...] = get_args(RecomputeMode)
#: sdpa (flash/fused: no s^2 matrix kept) | core (unfused)
Attention = Literal["sdpa", "core"]
ATTENTIONS: tuple[Attention, ...] = get_args(Attention)
Optimizer = Literal["adam", "sgd"]
OPTIMIZERS: tuple[Optimizer, ...] = get_args(Optimizer)
TransformerImpl = Literal["local", "transformer_engine"]
TRANSFORMER_IMPLS: tuple[TransformerImpl, ...] = get_args(TransformerImpl)

Scheduler = Literal["auto", "slurm", "local"]
SCHEDULERS: tuple[Scheduler, ...] = get_args(Scheduler)
CommBackend = Literal["nccl", "ucc"]
COMM_BACKENDS: tuple[CommBackend, ...] = get_args(CommBackend)
#: How a partition's ``container`` image is started: pyxis (``srun --container-image``) or
#: apptainer (``apptainer exec IMAGE python``); one per site (memx_hpc/slurm/request.py).
ContainerRuntime = Literal["pyxis", "apptainer"]
CONTAINER_RUNTIMES: tuple[ContainerRuntime, ...] = get_args(ContainerRuntime)
#: Clusters whose published network curves the package can import (:mod:`memx_hpc.profile.comm`):
#: a partition naming one in ``link_curves_from`` says its nodes are that cluster's, so the
#: curves measured there stand for its links. Another cluster's fabric is not this site's:
#: without the field imported curves are never used.
LinkCurveCluster = Literal["sailor"]
LINK_CURVE_CLUSTERS: tuple[LinkCurveCluster, ...] = get_args(LinkCurveCluster)
#: How a part is built into a node (:attr:`GpuType.form_factor`).
FormFactor = Literal["module", "card"]
FORM_FACTORS: tuple[FormFactor, ...] = get_args(FormFactor)

TokenizerType = Literal["NullTokenizer", "GPT2BPETokenizer", "HuggingFaceTokenizer", "SentencePieceTokenizer",
                        "GPTSentencePieceTokenizer", "Llama2Tokenizer", "TikTokenizer"]
TOKENIZER_TYPES: tuple[TokenizerType, ...] = get_args(TokenizerType)
#: what the project's megatron-core entry (cross-vendor plans) builds from local files
#: (memx_hpc/train/tokenizer.py); Megatron-LM's pretrain_gpt.py builds every TOKENIZER_TYPES entry
PROJECT_ENTRY_TOKENIZERS: tuple[TokenizerType, ...] = ("NullTokenizer", "GPT2BPETokenizer", "HuggingFaceTokenizer",
                                                       "GPTSentencePieceTokenizer", "Llama2Tokenizer")
#: why the project's entry refuses experts with linear biases (its --num-experts check and the
#: planner's refusal of model.add_bias_linear say the same)
PROJECT_ENTRY_EXPERT_BIAS_WHY = ("megatron-core 0.16.1's local experts (SequentialMLP, which the project's entry "
                                 "builds) add the expert bias in place to the tensor-parallel reduce's output "
                                 "(MLP.forward), which autograd refuses")
LrDecayStyle = Literal["constant", "linear", "cosine", "inverse-square-root", "WSD"]
LR_DECAY_STYLES: tuple[LrDecayStyle, ...] = get_args(LrDecayStyle)

SampleKind = Literal["layer", "embedding", "head", "optimizer", "allreduce", "p2p", "alltoall"]
SAMPLE_KINDS: tuple[SampleKind, ...] = get_args(SampleKind)
SampleOrigin = Literal["measured", "imported", "augmented"]
SAMPLE_ORIGINS: tuple[SampleOrigin, ...] = get_args(SampleOrigin)
