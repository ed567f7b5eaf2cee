"""Typed, frozen specifications that cross the borders of the system.

Every spec checks itself when it is built (``__post_init__``): values outside their
physical range, path-like names and unknown choices raise
:class:`~memx_hpc.errors.SpecError` naming the field, what was found and what is
allowed. So a YAML or JSON file, ``dataclasses.replace()`` and a profile store all
get the same checks. The readers only map documents to keyword arguments; they prefix
the field path (``partitions[1].gpus_per_node``) and the file name.

The modules, each importing only those before it:

* ``modes``: the closed sets (``Literal`` types and their tuples);
* ``checks``: the value checks and ranges; ``yamlio``: bounded YAML/JSON reading;
* ``gpu``: GpuType; ``model``: ModelSpec, LayerShape, the MoE field table;
* ``catalog``: the built-in GPU types and model presets; ``hfconfig``: a Hugging Face
  ``config.json`` read into ModelSpec keyword arguments;
* ``site``: Site, Partition, Link; ``recompute``: Recompute; ``job``: TrainJob and its
  sections; ``plan``: Plan, GeneralPlan; ``samples``: ProfilePoint, LayerSample, Provenance;
* ``readers``: site, job and model files to specs.

Everything the rest of the package imports is re-exported here; the catalog and the
Hugging Face reader are imported from their modules (``memx_hpc.spec.catalog``,
``memx_hpc.spec.hfconfig``).
"""

from __future__ import annotations

from .modes import (ACTIVATIONS, ATTENTIONS, Activation, Attention, BYTES_PER_ELEMENT, COMM_BACKENDS,
                    CONTAINER_RUNTIMES, CommBackend, ContainerRuntime, FORM_FACTORS, FP8_FORMATS, FP8_RECIPES,
                    FormFactor, Fp8Format, Fp8Recipe, LINK_CURVE_CLUSTERS, LR_DECAY_STYLES, LinkCurveCluster,
                    LrDecayStyle, MOE_LOAD_BALANCING, MOE_SCORE_FUNCTIONS, MoeLoadBalancing, MoeScoreFunction,
                    NORMALIZATIONS, Normalization, OPTIMIZERS, Optimizer, POSITION_EMBEDDINGS, PRECISIONS,
                    PROJECT_ENTRY_EXPERT_BIAS_WHY, PROJECT_ENTRY_TOKENIZERS, PositionEmbedding, Precision,
                    RECOMPUTE_MODES, ROPE_SCALINGS,
                    RecomputeMode, RopeScaling, SAMPLE_KINDS, SAMPLE_ORIGINS, SCHEDULERS, STAND_IN_VENDORS,
                    SampleKind, SampleOrigin, Scheduler, StandInVendor, TOKENIZER_TYPES, TRANSFORMER_IMPLS,
                    TokenizerType, TransformerImpl, VENDORS, Vendor)
from .checks import (MAX_DEVICE_MEMORY_GIB, MAX_GBPS, MAX_GLOBAL_BATCH, MAX_GPUS_PER_NODE, MAX_HEADS, MAX_HIDDEN,
                     MAX_LAYERS, MAX_MICRO_BATCH_CHOICES, MAX_NAME_CHARS, MAX_NODES, MAX_PARTITIONS, MAX_SEQ_LENGTH,
                     MAX_TFLOPS, MAX_TIME_LIMIT_MIN, MAX_TRAIN_ITERS, MAX_VOCAB, MAX_WEIGHT, MIN_DEVICE_MEMORY_GIB,
                     MIN_RATE, MIN_USABLE_FRACTION, SAFE_NAME_RULE, _SAFE_NAME, _build, _suggest, _wrap_file)
from .yamlio import (DeprecatedField, MAX_DEPTH, MAX_DOCUMENT_BYTES, MAX_EXPANDED_NODES, MAX_NUMBER_DIGITS,
                     NotARegularFile, RENAMED_RATE_FIELDS, _Reader, load_json, load_yaml, open_regular_file,
                     parse_json, parse_yaml, read_regular_file)
from .gpu import GpuType, check_gpu_names, fp8_gemm_takes_non_tn_layouts, parse_compute_capability
from .site import FABRICS, GENERIC_INTER_NODE_GBPS, MAX_NICS_PER_NODE, Fabric, Link, Partition, Site
from .model import (DENSE_SHAPE_FIELDS, LayerShape, MAX_EXPERTS, MODEL_EXTENSION_FIELDS, MODEL_FIELD_KEYS, MOE_FIELDS,
                    ModelSpec, MoeField, model_from_fields, moe_pattern)
from .job import Checkpointing, LRSchedule, TrainData, TrainJob, max_virtual_stages
from .recompute import Recompute, full_layers
from .plan import (PERFORMANCE_OPTIONS, GeneralPlan, GeneralStage, Plan, Replica, Stage, check_plan_for_job,
                   check_plan_for_model, chunk_split, job_for_plan)
from .samples import LayerSample, MAX_SAMPLE_BYTES, MAX_SAMPLE_MS, ProfilePoint, Provenance, transformer_impls
from .readers import (DEGREE_KEYS, JOB_KEYS, MODEL_KEYS, PARTITION_KEYS, SITE_KEYS, find_relative_to_site,
                      job_for_model, job_from_mapping, load_job, load_site, model_from_mapping, site_from_mapping)

__all__ = [
    'ACTIVATIONS', 'ATTENTIONS', 'Activation', 'Attention', 'BYTES_PER_ELEMENT', 'COMM_BACKENDS',
    'CONTAINER_RUNTIMES', 'CommBackend', 'ContainerRuntime', 'FORM_FACTORS', 'FP8_FORMATS', 'FP8_RECIPES',
    'FormFactor', 'Fp8Format', 'Fp8Recipe', 'LINK_CURVE_CLUSTERS', 'LR_DECAY_STYLES', 'LinkCurveCluster',
    'LrDecayStyle', 'MOE_LOAD_BALANCING', 'MOE_SCORE_FUNCTIONS', 'MoeLoadBalancing', 'MoeScoreFunction',
    'NORMALIZATIONS', 'Normalization', 'OPTIMIZERS', 'Optimizer', 'POSITION_EMBEDDINGS', 'PRECISIONS',
    'PROJECT_ENTRY_EXPERT_BIAS_WHY',
    'PROJECT_ENTRY_TOKENIZERS', 'PositionEmbedding', 'Precision', 'RECOMPUTE_MODES', 'ROPE_SCALINGS', 'RecomputeMode',
    'RopeScaling', 'SAMPLE_KINDS', 'SAMPLE_ORIGINS', 'SCHEDULERS', 'STAND_IN_VENDORS', 'SampleKind', 'SampleOrigin',
    'Scheduler', 'StandInVendor', 'TOKENIZER_TYPES', 'TRANSFORMER_IMPLS', 'TokenizerType', 'TransformerImpl',
    'VENDORS', 'Vendor', 'MAX_DEVICE_MEMORY_GIB', 'MAX_GBPS', 'MAX_GLOBAL_BATCH', 'MAX_GPUS_PER_NODE', 'MAX_HEADS',
    'MAX_HIDDEN', 'MAX_LAYERS', 'MAX_MICRO_BATCH_CHOICES', 'MAX_NAME_CHARS', 'MAX_NODES', 'MAX_PARTITIONS',
    'MAX_SEQ_LENGTH', 'MAX_TFLOPS', 'MAX_TIME_LIMIT_MIN', 'MAX_TRAIN_ITERS', 'MAX_VOCAB', 'MAX_WEIGHT',
    'MIN_DEVICE_MEMORY_GIB', 'MIN_RATE', 'MIN_USABLE_FRACTION', 'SAFE_NAME_RULE',
    'DeprecatedField', 'MAX_DEPTH', 'MAX_DOCUMENT_BYTES', 'MAX_EXPANDED_NODES', 'MAX_NUMBER_DIGITS',
    'NotARegularFile', 'RENAMED_RATE_FIELDS', 'load_json', 'load_yaml', 'open_regular_file', 'parse_json',
    'parse_yaml', 'read_regular_file', 'GpuType', 'check_gpu_names', 'fp8_gemm_takes_non_tn_layouts', 'parse_compute_capability', 'FABRICS', 'GENERIC_INTER_NODE_GBPS', 'Link',
    'Partition', 'Site', 'DENSE_SHAPE_FIELDS', 'LayerShape', 'MAX_EXPERTS', 'MODEL_EXTENSION_FIELDS',
    'MODEL_FIELD_KEYS', 'MOE_FIELDS', 'ModelSpec', 'MoeField', 'model_from_fields', 'moe_pattern', 'Checkpointing',
    'LRSchedule', 'TrainData', 'TrainJob', 'max_virtual_stages', 'Recompute', 'full_layers', 'GeneralPlan',
    'GeneralStage', 'Plan', 'Replica', 'Stage', 'check_plan_for_model', 'chunk_split', 'job_for_plan', 'LayerSample',
    'MAX_SAMPLE_BYTES', 'MAX_SAMPLE_MS', 'ProfilePoint', 'Provenance', 'transformer_impls', 'DEGREE_KEYS', 'JOB_KEYS',
    'MODEL_KEYS', 'PARTITION_KEYS', 'SITE_KEYS', 'find_relative_to_site', 'job_for_model', 'job_from_mapping',
    'load_job', 'load_site', 'model_from_mapping', 'site_from_mapping', 'PERFORMANCE_OPTIONS', 'check_plan_for_job',
    'Fabric', 'MAX_NICS_PER_NODE',
]
