"""The planner's composition against public measured Megatron runs with VP, CP and EP.

Every row of benchmarks/data/public_runs.csv (sources, licences and what each measured:
benchmarks/data/README.md) is predicted as the Megatron plan it ran -- a ``Plan`` with its
TP, DP, PP stages, virtual stages, CP, EP and ETP -- with the search's own composition
(``memx_hpc.model.compose.predict_plan``) and the planner's own cost model
(``memx_hpc.planner.load_cost_model``: the predictor fitted on the reference profiles
the planner starts a store from, the datasheet transfer for GPU types without profiles),
beside the datasheet roofline (``AnalyticCostModel``). Nothing is fitted to these runs.

Printed, for dev and test separately and per dimension (VP, CP, EP, dense: a row with VP
and CP counts in both): time MAPE and signed bias; where the source publishes peak memory,
memory MAPE and bias, and how many of the predicted runs (each of which ran) the composition
calls over the GPU's capacity (a stage's predicted device peak above what a process can
allocate: a false out-of-memory call), and apart from them how many it puts over the
planner's limit (capacity less the site's safety margin, a policy: those the planner
does not recommend either, a run at 97 % of its GPU among them; its report names the fastest
of them and the margin that would admit it, memx_hpc.search.report.margin_aside_words). Memory compares allocator peaks: the measured
``torch.cuda.max_memory_allocated`` (Megatron-LM CI: the logging rank, i.e. the last
pipeline stage) against the composition's peak of that stage without the device terms
(its state plus held activations, as benchmarks/end_to_end.py).

A row the planner cannot state yet (a precision it does not know, Megatron-FSDP, a model
without a spec, a GPU type outside the catalog, a Plan field that does not exist yet, ...)
is counted and listed as "not expressible yet: <reason>", never guessed; it is predicted
automatically once the planner can state it.

Locked test split: the ``split`` column, set by the rule in
benchmarks/data/extract_public_runs.py (vendor tables: Llama-3-70B and Qwen3-30B-A3B are
test; Megatron-LM CI: crc32(case) % 5 == 0), committed before this file produced a number.
Only dev rows may inform a design choice.

What the Megatron-Bridge recipes set beyond the row's columns is carried where it is read
(BRIDGE_RECIPE_COMMITS): bf16 gradient reduction (BF16_GRAD_REDUCE_FAMILIES), FP8 weights
under the FP8 presets (FP8_PARAM_RECIPES) and no hidden dropout (DROPOUT_FREE_FAMILIES; the
NeMo 24.07 launcher's configs: NEMO_DROPOUT_FREE_FAMILIES); for the NeMo 24.07 rows, the bf16
gradient buffer their run scripts ask for (NEMO_BF16_GRAD_SYNC_RUNS).

Assumptions the rows do not state (printed with the results): FP8 rows run bf16 weights
with FP8 matmuls in Transformer Engine's hybrid format under the row's recipe; Adam; the distributed
optimizer on for the vendor tables (their recipes) and as the CI arguments say; sequence
parallel wherever TP > 1 for the vendor tables; no activation recompute unless the row
names one; Megatron's even split of layers over pipeline stages and model chunks, with the
embedding and the loss counted as layers where the CI arguments or the family's recipe say so
(ACCOUNTED_SPLIT_FAMILIES; a stage's short chunk is priced as any of its chunks; a run
that splits otherwise without saying how is not expressible); between nodes 50 GB/s per GPU (one 400 Gb/s NIC per GPU in DGX H100/B200/
B300/GB200/GB300; 25 GB/s for DGX A100's 200 Gb/s), except inside a GB200/GB300 NVL72
rack, where every GPU reaches the others over NVLink: a run of at most 72 GPUs is one domain,
a larger one states NVLink domains of 64 GPUs (``nvlink_domain_gpus``: the 16-node segments NVIDIA
recommends for large jobs, NVL72_SEGMENT_GPUS) joined by the fabric.

Run from the repository root:  .venv/bin/python benchmarks/public_runs.py [--help]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import re
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memx_hpc.errors import SpecError  # noqa: E402
from memx_hpc.tables import table  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "public_runs.csv"
GiB = 2**30
DIMENSIONS = ("VP", "CP", "EP", "dense")
#: GPT-2's BPE vocabulary (the CI runs' --vocab-file), before Megatron pads it
GPT2_VOCAB = 50257
NVL72 = ("GB200", "GB300")
#: GPUs in one NVL72 rack's NVLink domain (18 compute trays of 4; the GB200 / GB300 NVL72 datasheets)
NVL72_GPUS = 72
#: the NVLink domain a run of more than one rack sees: NVIDIA recommends Slurm's block
#: scheduling with --segment=16 (16 nodes of 4 GPUs inside one NVL72 rack) for large jobs of
#: 128+ GPUs such as MoE training (NVIDIA Technical Blog, "Unlock Exascale Performance on NVIDIA
#: GB200 NVL72 with Slurm Topology-Aware Job Scheduling"), so each 64-GPU segment shares NVLink and
#: segments meet over the fabric; the published GB200/GB300 runs use 64, 128 and 256 GPUs
NVL72_SEGMENT_GPUS = 64
#: CI flags that change what a step does in ways the planner has no term for
UNSUPPORTED_FLAGS = {
    "mtp-num-layers": "multi-token prediction layers",
    "hybrid-override-pattern": "hybrid Mamba layers",
    "fine-grained-activation-offloading": "activation offloading to the host",
    "optimizer=muon": "the Muon optimizer",
    "optimizer=dist_muon": "the Muon optimizer",
    "pipeline-model-parallel-layout": "an explicit pipeline layout",
    "cpu-offloading": "offloading to the host",
}
#: vendor-table families whose recipe counts the embedding and the loss as layers of the
#: pipeline split (Megatron's --account-for-embedding/loss-in-pipeline-split): Megatron-Bridge
#: src/megatron/bridge/recipes/llama/llama3.py, llama31_405b_pretrain_config sets both;
#: src/megatron/bridge/recipes/qwen/qwen3_moe.py, qwen3_235b_a22b_pretrain_config sets both
#: ("Uses account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split")
ACCOUNTED_SPLIT_FAMILIES = ("llama3.1-405b", "qwen3-235b-a22b")
#: Megatron-Bridge families whose performance presets set the expert TP to 1 whatever the
#: attention's TP (scripts/performance/configs/qwen/qwen3_workload_base_configs.py:
#: BASE_QWEN3_235B_A22B_CONFIG and BASE_QWEN3_30B_A3B_CONFIG, expert_tensor_parallel_size=1); the
#: tables give no ETP column
EXPERT_TP1_FAMILIES = ("qwen3-30b-a3b", "qwen3-235b-a22b")
#: Megatron-Bridge (github.com/NVIDIA-NeMo/Megatron-Bridge) commits whose recipes the vendor
#: rows' settings below are read from: b7b4e11 (scripts/performance/configs, the per-family
#: performance scripts before c8327cf removed them) and 067f987 (src/megatron/bridge/perf_recipes)
BRIDGE_RECIPE_COMMITS = ("b7b4e11b054e73fa3cfc52e5df14cd6b4d50e02e", "067f987df03b8355b03192d88d70f1709fedf51a")
#: performance-summary families whose recipe reduces gradients in bf16 (grad_reduce_in_fp32 =
#: False on the mixed-precision and DDP configs): b7b4e11 scripts/performance/configs/llama/
#: llama3_llm_pretrain.py and llama31_llm_pretrain.py (set_llama*_common_configs),
#: qwen/qwen3_llm_pretrain.py; 067f987 src/megatron/bridge/perf_recipes/_common.py
#: (_benchmark_common and _perf_precision)
BF16_GRAD_REDUCE_FAMILIES = ("llama3-8b", "llama3-70b", "llama3.1-405b", "qwen3-30b-a3b", "qwen3-235b-a22b")
#: FP8 recipes whose Megatron-Bridge mixed-precision preset keeps the weights in FP8
#: (fp8_param_gather = True): src/megatron/bridge/training/mixed_precision.py at both commits,
#: bf16_with_fp8_delayed_scaling_mixed, bf16_with_fp8_current_scaling_mixed (tensorwise),
#: bf16_with_mxfp8_mixed -- the presets the performance scripts' get_precision_config /
#: _perf_precision return, and the FP8 current-scaling preset of the memory-tuning study
FP8_PARAM_RECIPES = ("delayed", "tensorwise", "mxfp8")
#: families whose Megatron-Bridge model bridge trains without hidden dropout (hidden_dropout
#: = 0.0 at 067f987: src/megatron/bridge/models/llama/llama_bridge.py
#: hf_config_to_model_config_kwargs, qwen/qwen3_bridge.py and qwen/qwen3_moe_bridge.py), for
#: every Bridge row (the performance tables and the studies)
DROPOUT_FREE_FAMILIES = ("llama3-8b", "llama3-70b", "llama3-70b-sft", "llama3.1-405b", "qwen3-30b-a3b",
                         "qwen3-235b-a22b")
#: NeMo 24.07 families trained without hidden dropout: hidden_dropout 0.0 in
#: github.com/NVIDIA/NeMo-Framework-Launcher at tag 24.07 (8325688),
#: launcher_scripts/conf/training/{llama/llama2_7b,llama2_13b,llama2_70b,llama3_8b,llama3_70b,
#: nemotron/nemotron_8b,nemotron_22b,nemotron_340b}.yaml (gpt3/*.yaml keep 0.1)
NEMO_DROPOUT_FREE_FAMILIES = ("llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "nemotron-8b",
                              "nemotron-22b", "nemotron-340b")

#: NeMo 24.07 runs (family, GPUs) whose published H100 run script reduces gradients in bf16:
#: github.com/NVIDIA/NeMo-Framework-Launcher at tag 24.07 (8325688), examples/training/gpt/h100/
#: {5b_fp8_8node,175b_fp8_16node}.sh and llama/h100/{llama2_7b,llama2_70b,llama3_8b,llama3_70b}_fp8.sh
#: pass +training.model.optim.grad_sync_dtype=bf16 to the distributed_fused_adam optimizer (Apex's
#: DistributedFusedAdam, whose contiguous gradient buffer then holds bf16: 2 bytes a parameter, not
#: fp32's 4). Only the runs whose node count and global batch a script states are carried: every
#: GPT/Llama script there sets it, but GPT-3 20B, Llama-2 13B and GPT-3 175B on 512 GPUs ran at
#: sizes no script states (and the 175B script says vp 12 where the table says 6)
NEMO_BF16_GRAD_SYNC_RUNS = frozenset({("gpt3-5b", 64), ("gpt3-175b", 128), ("llama2-7b", 8), ("llama2-70b", 64),
                                      ("llama3-8b", 8), ("llama3-70b", 64)})

#: rows whose runs set PyTorch's expandable segments (PYTORCH_CUDA_ALLOC_CONF=
#: expandable_segments:True): the Megatron-Bridge performance scripts' and skills' runs; carried
#: as the partition's env, from which the composition takes the allocator's slope
#: (memx_hpc.model.memory.EXPANDABLE_SEGMENTS_A)
EXPANDABLE_SEGMENTS_SOURCES = ("bridge-",)
ALLOC_ENV = (("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),)
#: Megatron-LM CI cases whose model_config.yaml sets --microbatch-group-size-per-virtual-
#: pipeline-stage, which the extractor does not keep in other_flags (tests/functional_tests/
#: test_cases/gpt/gpt3_mcore_te_tp1_pp4_vp1_tunable_overlap/model_config.yaml: 5)
CI_VP_GROUP = {"gpt3_mcore_te_tp1_pp4_vp1_tunable_overlap": 5}


class NotExpressible(Exception):
    """The planner cannot state this run yet; the message says why."""


def load_rows(path: Path = DATA) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))


def _int(v: str, default: int | None = None) -> int | None:
    return default if v in ("", None) else int(float(v))


def dimensions(row: dict) -> list[str]:
    d = []
    if (_int(row["vp"], 1) or 1) > 1:
        d.append("VP")
    if (_int(row["cp"], 1) or 1) > 1:
        d.append("CP")
    if (_int(row["ep"], 1) or 1) > 1:
        d.append("EP")
    return d or ["dense"]


def _precision(p: str) -> dict:
    """The job fields for a row's precision: bf16/fp16/fp32 as they are; ``fp8-<recipe>``
    (Transformer Engine's recipe: delayed, tensorwise = current scaling, mxfp8, blockwise)
    as bf16 weights with FP8 matmuls in the hybrid format (the NeMo/Bridge recipes' and
    Megatron-LM's default), where the planner's TrainJob has FP8 fields."""
    from memx_hpc.spec import PRECISIONS, TrainJob
    base = p.strip().lower()
    if base in PRECISIONS:
        return {"precision": base}
    fields = {f.name for f in dataclasses.fields(TrainJob)}
    if base.startswith("fp8-"):
        if "fp8" not in fields:
            raise NotExpressible("FP8 is not a precision the planner knows (TrainJob has no fp8 field)")
        recipe = base[4:]
        if "fp8_recipe" not in fields and recipe != "delayed":
            raise NotExpressible(f"FP8 recipe {recipe} (TrainJob has no fp8_recipe field)")
        return {"precision": "bf16", "fp8": "hybrid", **({"fp8_recipe": recipe} if "fp8_recipe" in fields else {})}
    raise NotExpressible(f"precision {base} is not one the planner knows ({', '.join(PRECISIONS)}, FP8 recipes)")


def _moe_freq(text: str, num_layers: int):
    """Megatron's --moe-layer-freq: an int, or a list expression like ([0]*1+[1]*3)*2."""
    if text in ("", None):
        return 1
    if re.fullmatch(r"\d+", text):
        return int(text)
    if not re.fullmatch(r"[\[\]\d\s\*\+\(\),]+", text):
        raise NotExpressible(f"moe_layer_freq {text!r} is not a pattern this benchmark reads")
    pattern = eval(text, {"__builtins__": {}}, {})  # digits, brackets, * and + only (checked above)
    if len(pattern) != num_layers:
        raise NotExpressible(f"moe_layer_freq gives {len(pattern)} layers, the model has {num_layers}")
    return tuple(int(x) for x in pattern)


def model_of(row: dict):
    from memx_hpc.spec.catalog import preset
    from memx_hpc.spec import ModelSpec
    seq = _int(row["seq_length"])
    if row["model_preset"]:
        return dataclasses.replace(preset(row["model_preset"]), seq_length=seq)
    if not row["num_layers"]:
        raise NotExpressible(f"no model spec for {row['family']} (no preset, shape not published in the row)")
    if row["multi_latent_attention"] == "True":
        raise NotExpressible("multi-latent attention ranks are not recorded in the row")
    L, h, a = int(row["num_layers"]), int(row["hidden_size"]), int(row["num_attention_heads"])
    vocab = GPT2_VOCAB if row["vocab_size"] == "gpt2-bpe" else _int(row["vocab_size"])
    if vocab is None:
        raise NotExpressible(f"vocabulary of tokenizer {row['vocab_size']!r} unknown")
    kw = dict(name=row["family"][:60], num_layers=L, hidden_size=h, num_attention_heads=a,
              num_query_groups=int(row["num_query_groups"]), ffn_hidden_size=int(row["ffn_hidden_size"]),
              vocab_size=vocab, seq_length=seq, activation="swiglu" if row["swiglu"] == "True" else "gelu",
              tied_embeddings=row["untied_embeddings"] != "True",
              position_embedding="rope" if row["rope"] == "True" else "learned",
              normalization="rmsnorm" if row["rmsnorm"] == "True" else "layernorm")
    if int(row["kv_channels"]) != h // a:
        kw["head_dim"] = int(row["kv_channels"])
    if row["num_experts"]:
        fields = {f.name for f in dataclasses.fields(ModelSpec)}
        if "num_experts" not in fields:
            raise NotExpressible("ModelSpec has no MoE fields")
        kw.update(num_experts=int(row["num_experts"]), moe_router_topk=int(row["moe_router_topk"]),
                  moe_layer_freq=_moe_freq(row["moe_layer_freq"], L))
        if row["moe_ffn_hidden_size"]:
            kw["moe_ffn_hidden_size"] = int(row["moe_ffn_hidden_size"])
        if row["moe_shared_expert_size"]:
            kw["moe_shared_expert_intermediate_size"] = int(row["moe_shared_expert_size"])
    try:
        return ModelSpec(**kw)
    except (SpecError, TypeError) as e:
        raise NotExpressible(f"model spec refused: {e}") from None


def _admitting_margin(d: dict) -> float:
    """The largest safety margin under which a row's fullest GPU fits, as the planner's report
    words it (memx_hpc.search.report.admitting_margin)."""
    from memx_hpc.search.report import admitting_margin
    return admitting_margin(d["pred_device"] / d["pred_capacity"])


def _recompute(text: str):
    from memx_hpc.spec import Recompute
    if text in ("", "none"):
        return Recompute()
    if text.startswith("full"):
        return Recompute(mode="full")
    if text.startswith("selective"):
        mods = text.split(":", 1)[1] if ":" in text else "core_attn"
        if mods not in ("core_attn", "[core_attn]", "['core_attn']"):
            raise NotExpressible(f"selective recompute of {mods} (the planner's selective is core attention)")
        return Recompute(mode="selective")
    raise NotExpressible(f"recompute {text!r}")


def _even(total: int, parts: int) -> list[int]:
    """Layers per stage, evenly; a remainder (only between the given first and last stages)
    goes to the middle stages."""
    base, rem = divmod(total, parts)
    out = [base] * parts
    order = sorted(range(parts), key=lambda i: (abs(i - (parts - 1) / 2), i))
    for i in order[:rem]:
        out[i] += 1
    return out


def _accounted(row: dict) -> tuple[bool, bool]:
    """Whether the run counts the embedding / the loss as a layer of the pipeline split: the
    CI arguments say so; a vendor table's recipe, by family (ACCOUNTED_SPLIT_FAMILIES)."""
    if row["family"] in ACCOUNTED_SPLIT_FAMILIES and not row["id"].startswith("mlm-ci/"):
        return True, True
    flags = row["other_flags"]
    return ("account-for-embedding-in-pipeline-split=True" in flags,
            "account-for-loss-in-pipeline-split=True" in flags)


def _accounted_layers(total: int, pp: int, vp: int, embedding: bool, loss: bool) -> list[int]:
    """Layers per stage when the embedding and/or the loss count as a layer of the split
    (megatron-core transformer_block.get_num_layers_to_build): ``total + embedding + loss``
    split evenly over the ``pp x vp`` model chunks, then the first chunk of the first stage
    holds one layer fewer (the embedding) and the last chunk of the last stage one fewer
    (the loss)."""
    counted = total + int(embedding) + int(loss)
    if counted % (pp * vp):
        raise NotExpressible(f"{total} layers with the embedding/loss counted do not split evenly over "
                             f"{pp} x {vp} model chunks")
    out = [counted // pp] * pp
    out[0] -= int(embedding)
    out[-1] -= int(loss)
    return out


def _stage_layers(row: dict, total: int, pp: int) -> list[int]:
    """Megatron's split: --decoder-first/last-pipeline-num-layers where given, the rest even."""
    first = re.search(r"decoder-first-pipeline-num-layers=(\d+)", row["other_flags"])
    last = re.search(r"decoder-last-pipeline-num-layers=(\d+)", row["other_flags"])
    head = [int(first.group(1))] if first else []
    tail = [int(last.group(1))] if last else []
    middle = pp - len(head) - len(tail)
    rest = total - sum(head) - sum(tail)
    if middle < 0 or (middle == 0 and rest) or (middle and rest < middle):
        raise NotExpressible(f"first/last stage layer counts do not fit {total} layers on {pp} stages")
    return head + (_even(rest, middle) if middle else []) + tail


def recipe_settings(row: dict) -> dict:
    """TrainJob fields a Megatron-Bridge row's recipe sets beyond the row's columns, only
    where the recipe is read (BRIDGE_RECIPE_COMMITS): the performance summary's bf16
    gradient reduction (BF16_GRAD_REDUCE_FAMILIES; the NeMo 24.07 rows' run scripts:
    NEMO_BF16_GRAD_SYNC_RUNS) and, for the Bridge tables and the
    memory-tuning study, FP8 weights under the FP8 presets (FP8_PARAM_RECIPES). Other rows:
    none (Megatron-LM's defaults, or the CI arguments)."""
    from memx_hpc.spec import TrainJob
    fields = {f.name for f in dataclasses.fields(TrainJob)}
    out: dict = {}
    rid, prec = row["id"], row["precision"].strip().lower()
    table = rid.startswith("bridge-performance-summary")
    nemo = rid.startswith("nemo-24.07/") and (row["family"], int(row["gpus"])) in NEMO_BF16_GRAD_SYNC_RUNS
    if ((table and row["family"] in BF16_GRAD_REDUCE_FAMILIES) or nemo) and "grad_reduce_in_fp32" in fields:
        out["grad_reduce_in_fp32"] = False
    if ((table or rid.startswith("bridge-skill/memory-tuning/")) and prec.startswith("fp8-")
            and prec[4:] in FP8_PARAM_RECIPES and "fp8_param_gather" in fields):
        out["fp8_param_gather"] = True
    return out


def build(row: dict):
    """(plan, site, job) for a row, or NotExpressible naming what the planner lacks."""
    from memx_hpc.spec import Partition, Plan, Site, Stage, job_for_model
    for flag, what in UNSUPPORTED_FLAGS.items():
        if flag in row["other_flags"]:
            raise NotExpressible(f"{what} ({flag.split('=')[0]})")
    if _int(row["fsdp"], 0):
        raise NotExpressible("Megatron-FSDP is not in the planner's space")
    precision = _precision(row["precision"])
    model = model_of(row)
    from memx_hpc.spec import ModelSpec
    dropout_free = ((row["id"].startswith("bridge-") and row["family"] in DROPOUT_FREE_FAMILIES)
                    or (row["id"].startswith("nemo-24.07/") and row["family"] in NEMO_DROPOUT_FREE_FAMILIES))
    if dropout_free and "hidden_dropout" in {f.name for f in dataclasses.fields(ModelSpec)}:
        model = dataclasses.replace(model, hidden_dropout=0.0)
    gpus, gpn = int(row["gpus"]), int(row["gpus_per_node"])
    tp, pp, cp = int(row["tp"]), int(row["pp"]), _int(row["cp"], 1)
    vp, ep = _int(row["vp"], 1) or 1, _int(row["ep"], 1) or 1
    etp = _int(row["etp"], None)
    if etp is None and row["id"].startswith("bridge-") and row["family"] in EXPERT_TP1_FAMILIES:
        etp = 1
    if gpus % (tp * pp * cp):
        raise NotExpressible(f"{gpus} GPUs are not a multiple of tp x pp x cp = {tp * pp * cp}")
    dp = gpus // (tp * pp * cp)
    fields = {f.name for f in dataclasses.fields(Plan)}
    kw = {}
    group = re.search(r"microbatch-group-size-per-virtual-pipeline-stage=(\d+)", row["other_flags"])
    group = int(group.group(1)) if group else (CI_VP_GROUP.get(row["family"]) if row["id"].startswith("mlm-ci/")
                                               else None)
    if group is not None:
        if "microbatch_group_size_per_vp_stage" not in fields:
            raise NotExpressible("Plan has no field microbatch_group_size_per_vp_stage")
        kw["microbatch_group_size_per_vp_stage"] = group
    for name, value, need in (("virtual_stages", vp, vp > 1), ("cp", cp, cp > 1), ("ep", ep, ep > 1),
                              ("etp", etp, etp is not None and etp != tp)):
        if need and name not in fields:
            raise NotExpressible(f"Plan has no field {name}")
        if name in fields and (need or name != "etp"):
            kw[name] = value
    vendor = not row["id"].startswith("mlm-ci/")
    sp = tp > 1 if vendor else row["sequence_parallel"] == "True"
    rec = _recompute(row["recompute"])
    uneven = "decoder-first-pipeline-num-layers" in row["other_flags"] or "decoder-last" in row["other_flags"]
    embedding, loss = _accounted(row)
    if (embedding or loss) and not uneven:
        layers = _accounted_layers(model.num_layers, pp, vp, embedding, loss)
    else:
        layers = _stage_layers(row, model.num_layers, pp)
    if model.num_layers % (pp * vp) and not uneven and not (embedding or loss):
        # Megatron splits layers evenly over pp x vp chunks or is told how not to
        why = (": the recipe counts the embedding and the loss as layers of the split"
               if (model.num_layers + 2) % (pp * vp) == 0 else ": the recipe's uneven split is not recorded")
        raise NotExpressible(f"{model.num_layers} layers do not split evenly over {pp} x {vp} model chunks{why}")
    gpu = row["gpu_type"]
    if gpu in NVL72 and gpus <= 72:
        inter = None  # one NVLink domain: the GPU's own link figure
    else:
        inter = 25.0 if gpu.startswith("A100") else 50.0
    nodes = math.ceil(gpus / gpn)
    env = ALLOC_ENV if row["id"].startswith(EXPANDABLE_SEGMENTS_SOURCES) else ()
    # a run over several NVL72 racks: NVLink inside each 16-node segment of a rack, the fabric between
    domain = {"nvlink_domain_gpus": NVL72_SEGMENT_GPUS} if gpu in NVL72 and gpus > NVL72_GPUS else {}
    part = Partition(name="p", gpu_type=gpu, nodes=nodes, gpus_per_node=gpn, env=env,
                     **({"inter_node_gbps": inter} if inter is not None else {}), **domain)
    site = Site(name=f"public-{gpu.lower()}", partitions=(part,))
    try:
        g = site.gpu(gpu)
    except SpecError:
        raise NotExpressible(f"GPU type {gpu} is not in the catalog") from None
    if inter is None:
        site = Site(name=site.name, partitions=(dataclasses.replace(part, inter_node_gbps=float(g.link_gbps)),))
    attention = "core" if row["attention_backend"] == "unfused" else "sdpa"
    dist_opt = True if vendor else row["distributed_optimizer"] == "True"
    precision.update(recipe_settings(row))
    try:
        job = job_for_model(model, int(row["global_batch_size"]), attention=attention, optimizer="adam",
                            distributed_optimizer=dist_opt, **precision)
        plan = Plan(tp=tp, dp=dp, micro_batch_size=int(row["micro_batch_size"]),
                    global_batch_size=int(row["global_batch_size"]),
                    stages=tuple(Stage(partition="p", num_layers=n, recompute=rec) for n in layers),
                    sequence_parallel=sp, **kw)
    except SpecError as e:
        raise NotExpressible(f"plan refused: {e}") from None
    return plan, site, job


# --------------------------------------------------------------------------- prediction


def cost_model(store: Path, analytic: bool):
    """The planner's cost model for a site holding every GPU type of the rows (one fit)."""
    from memx_hpc.model.api import AnalyticCostModel
    from memx_hpc.planner import load_cost_model
    from memx_hpc.spec.catalog import preset
    from memx_hpc.spec import Partition, Site, job_for_model
    types = ("A100-80", "H100-SXM", "B200", "B300", "GB200", "GB300")
    site = Site(name="public-runs", partitions=tuple(Partition(name=f"p{i}", gpu_type=t, nodes=1, gpus_per_node=8)
                                                      for i, t in enumerate(types)))
    if analytic:
        return AnalyticCostModel(site), ["--analytic: the datasheet roofline only"]
    notes: list[str] = []
    job = job_for_model(preset("Llama-3-8B"), 128)
    model = load_cost_model(site, job, store, analytic=False, notes=notes, calibrate=False, progress=True,
                            reference=True)
    return model, notes


def decompose(plan, site, job, cm, pred) -> dict:
    """The largest stage's predicted peak by term (bytes unless named): weights, gradient
    buffer, optimizer shards (fp32 main parameters and moments), FP8 weights beyond the 16-bit
    ones, held activations with the in-flight micro-batch units (and chunks) the schedule keeps,
    the last stage's head and logits (analytic), the prior ``S + a x (A - S) + b`` and the capacity check
    (the composition's safety margin; the band the recommended plan adds)."""
    from memx_hpc.model import analytic
    from memx_hpc.model.compose import (fp8_state_bytes, in_flight_heads, in_flight_units, memory_scale_of,
                                        shape_of, logits_transient_bytes)
    from memx_hpc.model.schedule import in_flight_chunks
    from memx_hpc.params import expert_params
    from memx_hpc.search.objective import table_band
    a0 = memory_scale_of(cm, site)
    st = max(pred.stages, key=lambda x: x.state_bytes + x.activation_bytes)
    i, n, tp, pp, v = st.stage, st.num_layers, plan.tp, plan.pp, plan.virtual_stages
    first, last = i == 0, i == pp - 1
    m = pred.num_microbatches
    g = plan.microbatch_group_size_per_vp_stage if v > 1 else None
    params = analytic.stage_params(job.model, n, first=first, last=last, tp=tp, pp=pp, ep=plan.ep, etp=plan.etp)
    et = tp if plan.etp is None else plan.etp
    start = analytic.stage_first_layer(job.model, n, first=first, last=last)
    experts = expert_params(job.model, start, n, ep=plan.ep, etp=et) if job.model.is_moe and n else 0
    kw = dict(precision=job.precision, optimizer=job.optimizer, distributed_optimizer=job.distributed_optimizer,
              grad_reduce_in_fp32=job.grad_reduce_in_fp32)
    parts = analytic.state_parts(params - experts, dp=plan.dp * plan.cp, **kw)
    if experts:
        for k, val in analytic.state_parts(experts, dp=max(1, tp * plan.cp * plan.dp // (et * plan.ep)), **kw).items():
            parts[k] += val
    base = analytic.stage_params(job.model, 0, first=first, last=last, tp=tp, pp=pp, ep=plan.ep, etp=plan.etp)
    fp8 = float(fp8_state_bytes(job, params - base, gpu=site.gpu(st.gpu_type)))
    sp = plan.sequence_parallel and tp > 1
    head = 0.0
    if last:
        head = (float(in_flight_heads(pp, i, m, v, group=g)) * analytic.head_activation_bytes(
            shape_of(job), micro_batch_size=plan.micro_batch_size, tp=tp, precision=job.precision,
            sequence_parallel=sp) + logits_transient_bytes(job, tp, plan.micro_batch_size)) / plan.cp
    scale = a0(st.gpu_type)
    alloc = st.state_bytes + st.activation_bytes
    band = table_band(st.gpu_type, cm.basis(st.gpu_type)).fraction if hasattr(cm, "basis") else float("nan")
    return dict(stage=i, layers=n, params=params, weights=parts["weights"], grads=parts["grads"],
                optimizer=parts["optimizer"], fp8=fp8, state=st.state_bytes, activations=st.activation_bytes,
                head=head, units=float(in_flight_units(pp, i, m, v, group=g)),
                chunks=in_flight_chunks(i, pp, m, v, g) if v > 1 else None, m=m, a=scale, b=st.overhead_bytes,
                alloc=alloc, device=st.peak_bytes, capacity=st.capacity_bytes,
                limit=st.capacity_bytes * (1 - site.memory_safety_margin), band=band)


def predict_row(row: dict, model) -> dict:
    from memx_hpc.model.api import AnalyticCostModel
    from memx_hpc.model.compose import memory_scale_of, predict_plan
    plan, site, job = build(row)
    out = {}
    if dataclasses.is_dataclass(model) and any(f.name == "memory_scale" for f in dataclasses.fields(model)) \
            and not getattr(model, "calibrated", False):
        # an uncalibrated model's slope is the prior of the site it prices: the row's (its
        # allocator settings), not the one the cost model was assembled for
        model = dataclasses.replace(model, memory_scale=memory_scale_of(None, site))
    for key, cm in (("pred", model), ("roof", AnalyticCostModel(site))):
        try:
            p = predict_plan(plan, site, job, cm)
        except SpecError as e:
            raise NotExpressible(f"the composition refused it: {e}") from None
        alloc = [st.state_bytes + st.activation_bytes for st in p.stages]
        last = [st.state_bytes + st.activation_bytes for st in p.stages
                if st.stage == max(s.stage for s in p.stages)]
        out[key + "_ms"] = p.iteration_ms
        # CI: the logging (last) rank's peak; other sources: the largest stage's
        out[key + "_mem"] = max(last) if row["id"].startswith("mlm-ci/") else max(alloc)
        out[key + "_feasible"] = p.feasible
        # the device itself over: a stage's predicted peak (S + a x (A - S) + b) above what a process can
        # allocate, not only above the planner's limit (capacity less the site's safety margin)
        out[key + "_over_capacity"] = any(st.peak_bytes > st.capacity_bytes for st in p.stages)
        worst = max(p.stages, key=lambda st: st.peak_bytes / st.capacity_bytes)
        out[key + "_device"], out[key + "_capacity"] = worst.peak_bytes, worst.capacity_bytes
        if key == "pred":
            out["terms"] = decompose(plan, site, job, cm, p)
    return out


def _ape(pred: float, real: float) -> float:
    return 100.0 * abs(pred - real) / real


def _bias(pred: float, real: float) -> float:
    return 100.0 * (pred - real) / real


def _mean(v) -> str:
    return f"{sum(v) / len(v):.1f}" if v else "-"


def run(rows: list[dict], model, *, show_rows: bool = False, out=print) -> dict:
    done, refused = [], []
    for r in rows:
        try:
            res = predict_row(r, model)
        except NotExpressible as e:
            refused.append((r, str(e)))
            continue
        res.update(row=r, real_ms=float(r["iteration_ms"]) if r["iteration_ms"] else None,
                   real_mem=float(r["peak_mem_bytes"]) if r["peak_mem_bytes"] else None)
        done.append(res)
    if show_rows and done:
        tab = []
        for d in done:
            r = d["row"]
            tab.append([r["id"][:70], r["split"], "+".join(dimensions(r)), r["gpu_type"], r["gpus"],
                        f"{r['tp']}/{r['pp']}/{r['vp'] or 1}/{r['cp']}/{r['ep']}",
                        f"{d['real_ms']:.1f}" if d["real_ms"] else "-", f"{d['pred_ms']:.1f}", f"{d['roof_ms']:.1f}",
                        f"{d['real_mem'] / GiB:.2f}" if d["real_mem"] else "-", f"{d['pred_mem'] / GiB:.2f}",
                        f"{d['pred_device'] / GiB:.1f}", f"{d['pred_capacity'] / GiB:.1f}",
                        "over capacity" if d["pred_over_capacity"] else "" if d["pred_feasible"] else
                        f"over the limit (margin {_admitting_margin(d):g} admits)"])
        table(tab, ["row", "split", "dims", "gpu", "gpus", "tp/pp/vp/cp/ep", "real ms", "pred ms", "roofline ms",
                    "real GiB", "pred GiB", "device GiB", "capacity GiB", "note"])
    summary: dict = {}
    tab = []
    for split in ("dev", "test"):
        for dim in DIMENSIONS:
            sel = [d for d in done if d["row"]["split"] == split and dim in dimensions(d["row"])]
            t = [d for d in sel if d["real_ms"]]
            m = [d for d in sel if d["real_mem"]]
            s = dict(n_time=len(t), time_mape=[_ape(d["pred_ms"], d["real_ms"]) for d in t],
                     time_bias=[_bias(d["pred_ms"], d["real_ms"]) for d in t],
                     roof_time_mape=[_ape(d["roof_ms"], d["real_ms"]) for d in t],
                     n_mem=len(m), mem_mape=[_ape(d["pred_mem"], d["real_mem"]) for d in m],
                     mem_bias=[_bias(d["pred_mem"], d["real_mem"]) for d in m],
                     roof_mem_mape=[_ape(d["roof_mem"], d["real_mem"]) for d in m])
            summary[(split, dim)] = {k: (sum(v) / len(v) if v else float("nan")) if isinstance(v, list) else v
                                     for k, v in s.items()}
            n_all = sum(1 for r in rows if r["split"] == split and dim in dimensions(r))
            # every row ran, so a prediction over the GPU's capacity is a memory error too; a
            # refusal by the safety margin alone is the planner's policy, counted apart
            over = sum(1 for d in sel if d["pred_over_capacity"])
            limited = sum(1 for d in sel if not d["pred_feasible"])
            summary[(split, dim)]["said_over_capacity"] = over
            summary[(split, dim)]["over_capacity_share"] = over / len(sel) if sel else float("nan")
            summary[(split, dim)]["over_limit"] = limited
            share = f"{over}/{len(sel)} ({100.0 * over / len(sel):.0f} %)" if sel else "-"
            tab.append([split, dim, n_all, len(t), share, limited, _mean(s["time_mape"]), _mean(s["time_bias"]),
                        _mean(s["roof_time_mape"]), len(m), _mean(s["mem_mape"]), _mean(s["mem_bias"]),
                        _mean(s["roof_mem_mape"])])
    fam = []
    for split in ("dev", "test"):
        for family in sorted({d["row"]["family"] for d in done if d["row"]["split"] == split}):
            sel = [d for d in done if d["row"]["split"] == split and d["row"]["family"] == family]
            over = sum(1 for d in sel if d["pred_over_capacity"])
            limited = sum(1 for d in sel if not d["pred_feasible"])
            summary[(split, "family", family)] = {"said_over_capacity": over, "over_limit": limited,
                                                  "predicted": len(sel)}
            fam.append([split, family[:40], len(sel), f"{over} ({100.0 * over / len(sel):.0f} %)",
                        f"{limited} ({100.0 * limited / len(sel):.0f} %)"])
        sel = [d for d in done if d["row"]["split"] == split]
        over = sum(1 for d in sel if d["pred_over_capacity"])
        limited = sum(1 for d in sel if not d["pred_feasible"])
        summary[(split, "all")] = {"said_over_capacity": over, "predicted": len(sel),
                                   "over_capacity_share": over / len(sel) if sel else float("nan"),
                                   "over_limit": limited,
                                   "over_limit_share": limited / len(sel) if sel else float("nan")}
        fam.append([split, "(all families)", len(sel), f"{over} ({100.0 * over / len(sel):.0f} %)" if sel else "-",
                    f"{limited} ({100.0 * limited / len(sel):.0f} %)" if sel else "-"])
    out("\nran, predicted over capacity, by split and family (each row ran: a false out-of-memory call; "
        "'over the limit' also counts peaks inside the site's safety margin, which the planner sets aside too and "
        "names with the margin that would admit them):")
    table(fam, ["split", "family", "predicted", "said over capacity", "over the limit (capacity less margin)"])
    out(f"\npredicted {len(done)} of {len(rows)} rows; {len(refused)} not expressible yet")
    table(tab, ["split", "dimension", "rows", "timed", "ran, predicted over capacity", "over the limit", "time MAPE %",
                "time bias %", "roofline time MAPE %",
                "with memory", "memory MAPE %", "memory bias %", "roofline memory MAPE %"])
    src = []
    for split in ("dev", "test"):
        for source in sorted({r["source"] for r in rows}):
            sel = [d for d in done if d["row"]["split"] == split and d["row"]["source"] == source]
            t = [d for d in sel if d["real_ms"]]
            m = [d for d in sel if d["real_mem"]]
            n_all = sum(1 for r in rows if r["split"] == split and r["source"] == source)
            src.append([split, source, n_all, len(t), _mean([_ape(d["pred_ms"], d["real_ms"]) for d in t]),
                        _mean([_ape(d["roof_ms"], d["real_ms"]) for d in t]), len(m),
                        _mean([_ape(d["pred_mem"], d["real_mem"]) for d in m])])
    dev = [d for d in done if d["row"]["split"] == "dev" and "terms" in d]
    if dev:
        out("\ndev rows: the largest stage's predicted peak by term (GiB; allocator peak A = state + held "
            "activations; device = S + a x (A - S) + b, the allocator's slack on the activations alone, checked against capacity x (1 - margin); the recommended plan "
            "also widens it by the band):")
        seen, dtab = set(), []
        for d in dev:
            r, x = d["row"], d["terms"]
            key = (r["family"], r["gpu_type"], r["gpus"], r["tp"], r["pp"], r["vp"], r["cp"], r["ep"], r["precision"],
                   r["global_batch_size"])
            if key in seen:
                continue
            seen.add(key)
            g = lambda v: f"{v / GiB:.1f}"  # noqa: E731
            units = f"{x['units']:.2f}" + (f" ({x['chunks']} ch)" if x["chunks"] else "")
            dtab.append([r["family"][:16], r["precision"][:14], r["gpu_type"],
                         f"{r['tp']}/{r['pp']}/{r['vp'] or 1}/{r['cp']}/{r['ep']}", f"{x['stage']}:{x['layers']}",
                         g(x["weights"]), g(x["grads"]), g(x["optimizer"]), g(x["fp8"]), g(x["activations"]),
                         f"{units} of {x['m']}", g(x["head"]), f"{x['a']:.2f}", g(x["b"]), g(x["alloc"]),
                         g(x["device"]), g(x["limit"]), f"{100 * x['band']:.1f}",
                         "" if x["device"] <= x["limit"] else "over"])
        table(dtab, ["family", "precision", "gpu", "tp/pp/vp/cp/ep", "stage:layers", "weights", "grads",
                     "optimizer", "fp8 extra", "activations", "in-flight units", "head+logits", "a", "b",
                     "alloc A", "device", "limit", "band %", "note"])
    out("\nby source:")
    table(src, ["split", "source", "rows", "timed", "time MAPE %", "roofline time MAPE %", "with memory",
                "memory MAPE %"])
    by_reason: dict[str, list[dict]] = defaultdict(list)
    for r, why in refused:
        by_reason[re.sub(r"\d+", "N", why) if why.startswith(("plan refused", "model spec refused")) else why].append(r)
    if refused:
        out("\nnot expressible yet (count: reason -- families):")
        for why, rs in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
            fam = Counter(r["family"] for r in rs)
            out(f"  {len(rs):4d}: {why} -- " + ", ".join(f"{f} ({n})" for f, n in sorted(fam.items())))
    summary["predicted"], summary["refused"] = len(done), len(refused)
    summary["reasons"] = {k: len(v) for k, v in by_reason.items()}
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="Score the planner's composition on public measured Megatron runs (VP, CP, EP, dense): "
                    "time and memory MAPE per dimension, dev and test apart, beside the datasheet roofline.",
        epilog="Example: .venv/bin/python benchmarks/public_runs.py --source mlm-ci --rows")
    ap.add_argument("--data", type=Path, default=DATA, help=f"the runs (default {DATA.relative_to(ROOT)})")
    ap.add_argument("--source", default="", help="only rows whose id starts with this (mlm-ci, bridge, nemo)")
    ap.add_argument("--split", choices=("dev", "test"), help="only this half")
    ap.add_argument("--limit", type=int, default=0, help="at most this many rows (0: all)")
    ap.add_argument("--rows", action="store_true", help="print every predicted row")
    ap.add_argument("--analytic", action="store_true", help="the roofline as the planner's model too (no fit; fast)")
    ap.add_argument("--store", type=Path, default=Path(tempfile.gettempdir()) / "memx-public-runs" / "store.h5",
                    help="profile store the planner starts from its reference profiles (kept, so the fit is reused)")
    args = ap.parse_args(argv)
    if args.limit < 0:
        print("error: --limit: expected a whole number >= 0", file=sys.stderr)
        return 1
    try:
        rows = load_rows(args.data)
    except OSError as e:
        print(f"error: cannot read {args.data}: {e.strerror}", file=sys.stderr)
        return 2
    rows = [r for r in rows if r["id"].startswith(args.source) and (not args.split or r["split"] == args.split)]
    if args.limit:
        rows = rows[:args.limit]
    if not rows:
        print("error: --source/--split: no row matches", file=sys.stderr)
        return 1
    try:
        args.store.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"error: cannot create {args.store.parent}: {e.strerror}", file=sys.stderr)
        return 2
    model, notes = cost_model(args.store, args.analytic)
    print(f"{len(rows)} rows from {args.data} (locked split: the 'split' column; rule in benchmarks/data/README.md)")
    for n in notes:
        print(f"  note: {n if len(n) <= 240 else n[:237] + '...'}")
    print("assumptions: Adam; distributed optimizer on (vendor tables) or as the CI arguments say; sequence parallel "
          "where TP > 1 (vendor tables); no recompute unless the row names one; layers split evenly over stages and "
          "chunks (the embedding and the loss counted as layers where the CI arguments or the recipe say so: "
          "Llama-3.1-405B); "
          "50 GB/s per GPU between nodes (A100: 25), NVLink inside a GB200/GB300 NVL72 rack; FP8 rows: bf16 weights, "
          "hybrid format, the row's recipe; Megatron-Bridge rows: what their recipes set (bf16 gradient reduction, "
          "FP8 weights, no hidden dropout); NeMo 24.07 Llama/Nemotron rows: no hidden dropout; NeMo 24.07 rows: bf16 gradient buffer "
          "(grad_sync_dtype=bf16 in the launcher's run scripts) (sources in the script)")
    run(rows, model, show_rows=args.rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
