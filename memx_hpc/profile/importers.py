"""Importers for published real GPU measurements, so a site can start from what others measured.

* Sailor (ETH Zurich, MIT licence): ``profiles/<model>/<gpu>/profile.json`` +
  ``llm_info.json`` — per-layer forward/backward/optimizer seconds for each
  micro-batch and TP degree, and per-layer activation bytes measured on GPU.
* Cephalo (MIT licence): ``model_latencies.json`` — per-layer forward/backward ms of
  one transformer layer (TP = 1) for each batch size, on 12 GPU types.

Every sample is ``origin="imported"``, names its file in ``source`` and keeps the
details of the mapping in ``provenance`` (JSON). GPU names are mapped onto the catalog
through its aliases (``GH-96`` -> ``GH200``, ``a100x40`` -> ``A100-40``); a name the
catalog (or the site) does not know is a SpecError naming the file.

Model shapes are not all written in the data files; where they are not, they are
taken from the projects' own model definitions, cited per entry below, and checked
against the parameter counts the files do carry.
"""

from __future__ import annotations

import functools
import json
import logging
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..datapaths import SOURCES
from ..errors import SpecError
from ..spec import MAX_DOCUMENT_BYTES, LayerSample, LayerShape, ProfilePoint, Provenance, read_regular_file

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ImportedModel:
    """A model shape as the measuring project ran it, with where the numbers come from."""

    shape: LayerShape
    attention: str  # sdpa (fused, no s^2 kept) | core (unfused)
    precision: str
    num_layers: int
    note: str


def _shape(h: int, a: int, f: int, s: int, v: int, *, g: int | None = None, act: str = "gelu") -> LayerShape:
    return LayerShape(hidden_size=h, num_attention_heads=a, num_query_groups=g or a, ffn_hidden_size=f,
                      seq_length=s, vocab_size=v, activation=act)


# Sailor's models as its profiles ran them (Megatron-DeepSpeed, fp16, unfused attention with
# fused softmax). Shapes from sailor/training_configs/*.json where present; the vocabulary,
# FFN width and biases are what the parameter counts in llm_info.json imply (checked in
# tests/unit/test_importers.py): every model uses GPT-2's 50257-token vocabulary padded to
# 50304; Sailor's "LLAMA-3-8" is a 4096-wide, 32-head MHA SwiGLU model with f = 16384 and
# linear biases, run at sequence 8192 (llm_info.json: a layer's output is 8192 x 4096 floats).
SAILOR_MODELS: dict[str, tuple[LayerShape, int, str]] = {
    "OPT-350": (_shape(1024, 16, 4096, 2048, 50257), 24, "training_configs/training_config_opt_350.json"),
    "GPT-Neo-2.7": (_shape(2560, 32, 10240, 2048, 50257), 32,
                    "training_configs/training_config_gpt_neo27.json (vocab per llm_info.json: 50304 padded)"),
    "OPT-30": (_shape(7168, 56, 28672, 2048, 50257), 48, "Zhang et al. 2022, OPT-30B, Table 1; llm_info.json"),
    "LLAMA-3-8": (_shape(4096, 32, 16384, 8192, 50257, act="swiglu"), 32, "llm_info.json parameter counts"),
}
SAILOR_PRECISION = "fp16"
SAILOR_ATTENTION = "core"


def _resolve(gpu: str, where: Any, file: Path) -> str:
    """Canonical GPU type name for a name found in a data file."""
    from ..spec.catalog import catalog
    try:
        g = where.gpu(gpu) if where is not None and hasattr(where, "gpu") else (where or catalog()).get(gpu)
    except SpecError as e:
        raise SpecError(f"GPU name {gpu!r} is not in the catalog or the site; add it (or an alias) "
                        f"under gpu_types", file=str(file), found=gpu, allowed=e.allowed) from None
    return g.name


def _load_json(path: Path) -> Any:
    try:
        data = read_regular_file(path, MAX_DOCUMENT_BYTES)
        if len(data) > MAX_DOCUMENT_BYTES:
            raise SpecError("file too large", file=str(path), allowed=f"at most {MAX_DOCUMENT_BYTES:,} bytes")
        return json.loads(data.decode("utf-8"))
    except FileNotFoundError:
        raise SpecError("file not found", file=str(path)) from None
    except RecursionError:
        raise SpecError("nested too deeply", file=str(path)) from None
    except (OSError, ValueError) as e:
        raise SpecError(f"cannot read JSON: {e}", file=str(path)) from None


def _checked(fn: Any) -> Any:
    """Every way a published data file can be malformed (a missing key, text where a number
    belongs, a negative time the sample refuses) becomes a SpecError naming the file."""
    @functools.wraps(fn)
    def run(source: str | Path, *args: Any, **kw: Any) -> Any:
        try:
            return fn(source, *args, **kw)
        except SpecError as e:
            raise e.with_file(str(source)) from None
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, statistics.StatisticsError) as e:
            raise SpecError(f"unexpected content ({type(e).__name__}: {str(e)[:120]})", file=str(source)) from None
    return run


@_checked
def import_sailor(folder: str | Path, *, gpus: Any = None, skipped: list[str] | None = None) -> list[LayerSample]:
    """Samples from a Sailor data folder holding ``profiles/`` and ``llm_info.json``.

    ``profile.json`` is ``{mbs: {tp: {layer_id: [fwd_s, bwd_s, update_s]}}}``; layer 0 is
    the embedding, the last id the head (output layer and loss), the ids between are
    transformer layers. Per (model, GPU, mbs, tp) this gives one ``embedding``, one
    ``head`` and one ``layer`` sample: the transformer layers of one profile are the same
    layer timed in place, so they are summarised by their median (not imported N times,
    which would weight one point N-fold). Seconds become milliseconds.

    Activation bytes come from ``llm_info.json`` (``act_mem_bytes``, the allocated-memory
    growth over one layer's forward, measured at micro-batch 1), times the micro-batch
    as Sailor's own planner scales them; 0 (unknown) where llm_info has no entry for that TP,
    and for the embedding and head, whose modules differ between Sailor's models.

    A profile whose layer count does not match its model (Sailor ships
    ``GPT-Neo-2.7/GH-96`` as a copy of the OPT-350 profile) is skipped with a warning;
    the reasons are appended to ``skipped`` when given. ``gpus``: a Site or Catalog used
    to resolve GPU names (default: the built-in catalog).
    """
    root = Path(folder)
    prof_root = root / "profiles"
    if not prof_root.is_dir():
        raise SpecError("a Sailor data folder holds profiles/<model>/<gpu>/profile.json", file=str(root),
                        found="no profiles/ folder")
    llm_info = _load_json(root / "llm_info.json")
    files = sorted(prof_root.glob("*/*/profile.json"))
    if not files:
        raise SpecError("no profiles/<model>/<gpu>/profile.json files", file=str(prof_root))
    out: list[LayerSample] = []
    for f in files:
        model, gpu_name = f.parent.parent.name, f.parent.name
        rel = f.relative_to(root).as_posix()
        if model not in SAILOR_MODELS:
            raise SpecError("unknown Sailor model; its shape is not known", file=str(f), found=model,
                            allowed=", ".join(SAILOR_MODELS))
        shape, num_layers, shape_src = SAILOR_MODELS[model]
        gpu = _resolve(gpu_name, gpus, f)
        data = _load_json(f)
        mem = llm_info.get(model, {})
        # Sailor's layer ids: embedding, the transformer layers, (a final norm for
        # LLAMA-3-8), the head. Fewer ids than the model has layers: a foreign file.
        fewest = min(len(layers) for by_tp in data.values() for layers in by_tp.values())
        if fewest < num_layers + 2:
            msg = (f"{rel}: {fewest} layer ids, but {model} has {num_layers} layers + embedding + head; "
                   f"skipped (not this model's profile)")
            log.warning(msg)
            if skipped is not None:
                skipped.append(msg)
            continue
        for mbs_key, by_tp in sorted(data.items(), key=lambda kv: int(kv[0])):
            for tp_key, layers in sorted(by_tp.items(), key=lambda kv: int(kv[0])):
                ids = sorted(layers, key=int)
                mbs, tp = int(mbs_key), int(tp_key)
                tp_mem = mem.get(tp_key, {})
                groups = {"embedding": [ids[0]], "layer": ids[1:1 + num_layers], "head": [ids[-1]]}
                for kind, members in groups.items():
                    rows = [layers[i] for i in members]
                    fwd, bwd, upd = (statistics.median(float(r[j]) for r in rows) for j in range(3))
                    mem_id = members[0]
                    # Only transformer layers: Sailor's embedding and head modules differ between
                    # its models (GPT-Neo-2.7's last module holds no logits, OPT-350's does), so
                    # their bytes do not measure one thing.
                    act = int(tp_mem[mem_id]["act_mem_bytes"]) * mbs if (kind == "layer" and mem_id in tp_mem) else 0
                    prov = {"dataset": SOURCES["sailor"], "file": rel, "model": model, "gpu_name": gpu_name,
                            "layer_ids": [int(members[0]), int(members[-1])], "summary": "median" if len(rows) > 1 else "one",
                            "shape_source": shape_src, "precision_assumed": "fp16 (Megatron-DeepSpeed)",
                            "activation_bytes": ("llm_info.json act_mem_bytes (micro-batch 1) x mbs" if act
                                                 else "unknown"),
                            "update_measured": upd > 0}
                    out.append(LayerSample(
                        point=ProfilePoint(gpu_type=gpu, kind=kind, shape=shape, tp=tp, micro_batch_size=mbs,
                                           recompute="none", precision=SAILOR_PRECISION, attention=SAILOR_ATTENTION),
                        forward_ms=fwd * 1e3, backward_ms=bwd * 1e3, update_ms=upd * 1e3, activation_bytes=act,
                        origin="imported", source=f"sailor:{rel}", provenance=Provenance.of(prov)))
    return out


# Cephalo's models (benson-guo/cephalo, models/hub.py get_model_info and models/*_simple.py):
# name -> (hidden, heads, query groups, ffn, activation, attention). GPT: OpenAI-GPT blocks
# with unfused attention and many small heads, dropout 0; Llama: Hugging Face LlamaDecoderLayer,
# MHA (num_key_value_heads defaults to the heads), flash/SDPA attention except on P40 (eager);
# BERT: unfused attention. deepspeedbert_base is not in Cephalo's table: BERT-base
# (Devlin et al. 2019: 768, 12 heads, 3072). Mistral 7B: Jiang et al. 2023 (4096, 32 heads,
# 8 KV heads, 14336), SDPA. Vocabulary: Cephalo's default 49152 (per-layer times do not use it).
CEPHALO_MODELS: dict[str, tuple[int, int, int, int, str, str]] = {
    "deepspeedgpt_test": (512, 128, 128, 2048, "gelu", "core"),
    "deepspeedgpt_1.3b": (2048, 128, 128, 8192, "gelu", "core"),
    "deepspeedgpt_2.7b": (2560, 80, 80, 10240, "gelu", "core"),
    "deepspeedgpt_6.7b": (4096, 128, 128, 16384, "gelu", "core"),
    "deepspeedgpt_175b": (12288, 96, 96, 49152, "gelu", "core"),
    "deepspeedllama_tiny": (2048, 32, 32, 5632, "swiglu", "sdpa"),
    "deepspeedllama_3b": (3200, 32, 32, 8640, "swiglu", "sdpa"),
    "deepspeedllama_7b": (4096, 32, 32, 11008, "swiglu", "sdpa"),
    "deepspeedllama_13b": (5120, 40, 40, 13824, "swiglu", "sdpa"),
    "deepspeedllama_33b": (6656, 52, 52, 17920, "swiglu", "sdpa"),
    "deepspeedllama_65b": (8192, 64, 64, 22016, "swiglu", "sdpa"),
    "deepspeedllamav2_tiny": (2048, 32, 32, 5632, "swiglu", "sdpa"),
    "deepspeedllamav2_7b": (4096, 32, 32, 11008, "swiglu", "sdpa"),
    "deepspeedllamav2_13b": (5120, 40, 40, 13824, "swiglu", "sdpa"),
    "deepspeedbert_base": (768, 12, 12, 3072, "gelu", "core"),
    "deepspeedbert_large": (1024, 16, 16, 4096, "gelu", "core"),
    "deepspeedbert_xlarge": (1536, 24, 24, 6144, "gelu", "core"),
    "deepspeedmistral_7b": (4096, 32, 8, 14336, "swiglu", "sdpa"),
    "mistral_7b": (4096, 32, 8, 14336, "swiglu", "sdpa"),
}
#: Vision transformers: Cephalo's sequence key is not their token count (patches of a
#: 384-pixel image), so their points cannot be placed on a sequence axis; not imported.
CEPHALO_SKIPPED_PREFIXES = ("deepspeedvit", "vit")
CEPHALO_VOCAB = 49152
_CEPHALO_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


def cephalo_raw_points(entry: Any) -> tuple[list[float], list[float]] | None:
    """The measured per-batch-size lists of one ``model/gpu/seq/dtype`` entry, or None.

    Cephalo stores ``[[fwd slope, intercept], [bwd slope, intercept], [fwd ms at b=1..n],
    [bwd ms at b=1..n]]``; some entries carry only the fitted coefficients (two pairs, or
    two numbers) — those are fits, not measurements, and are not imported.
    """
    if (isinstance(entry, list) and len(entry) == 4 and all(isinstance(x, list) for x in entry)
            and len(entry[2]) == len(entry[3])):
        return [float(x) for x in entry[2]], [float(x) for x in entry[3]]
    return None


@_checked
def import_cephalo(model_latencies_json: str | Path, *, gpus: Any = None,
                   skipped: list[str] | None = None) -> list[LayerSample]:
    """Samples from Cephalo's ``model_latencies.json``: ``{model: {gpu: {seq: {dtype: entry}}}}``.

    One ``layer`` sample (TP 1, no recompute) per measured batch size. ``model_stats.json``
    next to the file supplies each model's hidden size and parameters per layer, which
    are checked against the shape table (a mismatch is a SpecError). Entries without raw
    points and vision models are skipped (reasons appended to ``skipped``).
    """
    path = Path(model_latencies_json)
    data = _load_json(path)
    stats_path = path.parent / "model_stats.json"
    stats = _load_json(stats_path) if stats_path.is_file() else {}
    if not isinstance(data, dict):
        raise SpecError("expected {model: {gpu: {seq_len: {dtype: [...]}}}}", file=str(path), found=type(data).__name__)
    from ..params import layer_params
    from ..spec import ModelSpec

    def note(msg: str) -> None:
        log.info(msg)
        if skipped is not None:
            skipped.append(msg)

    out: list[LayerSample] = []
    for model in sorted(data):
        if model.startswith(CEPHALO_SKIPPED_PREFIXES):
            note(f"{model}: vision model, sequence length unknown; skipped")
            continue
        by_gpu = data[model]
        has_raw = any(cephalo_raw_points(e) for g in by_gpu.values() if isinstance(g, dict)
                      for s in g.values() if isinstance(s, dict) for e in s.values())
        if not has_raw:
            note(f"{model}: only fitted coefficients, no measured points; skipped")
            continue
        if model not in CEPHALO_MODELS:
            raise SpecError("Cephalo model with measured points but unknown shape", file=str(path), field=model,
                            allowed=", ".join(CEPHALO_MODELS))
        h, a, g, f, act, attention = CEPHALO_MODELS[model]
        if model in stats:
            st = stats[model]
            spec = ModelSpec(name=model, num_layers=1, hidden_size=h, num_attention_heads=a, num_query_groups=g,
                             ffn_hidden_size=f, vocab_size=CEPHALO_VOCAB, seq_length=512, activation=act,
                             normalization="rmsnorm" if act == "swiglu" else "layernorm",
                             add_bias_linear=act != "swiglu")
            if st.get("hidden_size") != h or st.get("parameters_per_layer") != layer_params(spec):
                raise SpecError("model shape disagrees with model_stats.json", file=str(stats_path), field=model,
                                found=(st.get("hidden_size"), st.get("parameters_per_layer")),
                                allowed=f"hidden {h}, {layer_params(spec)} parameters per layer")
        for gpu_name in sorted(by_gpu):
            for seq_key in sorted(by_gpu[gpu_name], key=int):
                for dtype, entry in sorted(by_gpu[gpu_name][seq_key].items()):
                    raw = cephalo_raw_points(entry)
                    if raw is None:
                        note(f"{model}/{gpu_name}/{seq_key}/{dtype}: fitted coefficients only; skipped")
                        continue
                    if dtype not in _CEPHALO_DTYPES:
                        raise SpecError("unknown dtype", file=str(path), field=f"{model}.{gpu_name}.{seq_key}",
                                        found=dtype, allowed=", ".join(_CEPHALO_DTYPES))
                    gpu = _resolve(gpu_name, gpus, path)
                    precision = _CEPHALO_DTYPES[dtype]
                    # Cephalo's Llama layers fall back to eager (unfused) attention on the P40
                    att = "core" if (gpu_name == "p40" and attention == "sdpa") else attention
                    shape = _shape(h, a, f, int(seq_key), CEPHALO_VOCAB, g=g, act=act)
                    prov = Provenance.of({"dataset": SOURCES["cephalo"], "file": path.name, "model": model,
                                          "gpu_name": gpu_name, "dtype": dtype,
                                          "shape_source": "Cephalo models/hub.py and models/*_simple.py"})
                    for i, (fwd, bwd) in enumerate(zip(*raw)):
                        out.append(LayerSample(
                            point=ProfilePoint(gpu_type=gpu, kind="layer", shape=shape, tp=1, micro_batch_size=i + 1,
                                               recompute="none", precision=precision, attention=att),
                            forward_ms=fwd, backward_ms=bwd, origin="imported",
                            source=f"cephalo:{path.name}:{model}/{gpu_name}/{seq_key}/{dtype}", provenance=prov))
    return out
