"""Write benchmarks/data/public_runs.csv from the public documents it cites (see README.md here).

Sources (each read from a git checkout at the commit named below, so the file can be rebuilt):

* Megatron-LM's functional-test golden values (github.com/NVIDIA/Megatron-LM, BSD-3-Clause):
  tests/functional_tests/test_cases/{gpt,moe}/<case>/golden_values_dev_<platform>.json hold
  per-step ``iteration-time`` (s) and ``mem-max-allocated-bytes`` recorded by NVIDIA's CI
  on DGX A100 / DGX H100 (1 node x 8 GPUs) and DGX GB200 (2 nodes x 4; ``_1node``: 1 x 4),
  for the arguments in the case's model_config.yaml. The GPU counts come from the recipes
  (tests/test_utils/recipes/<platform>/*.yaml: spec nodes/gpus).
* Megatron-Bridge's performance summary (github.com/NVIDIA-NeMo/Megatron-Bridge, Apache-2.0;
  rendered at docs.nvidia.com/nemo/megatron-bridge/latest/performance-summary.html and
  performance-summary-archive.html): docs/performance-summary.md and
  docs/performance-summary-archive.md, pre-training tables per container release.
* NeMo's 24.07 performance summary (github.com/NVIDIA/NeMo, Apache-2.0):
  docs/source/performance/performance_summary.md, pre-training table (DGX-H100, FP8).

Usage:
  python benchmarks/data/extract_public_runs.py --megatron-lm GITDIR --megatron-bridge GITDIR \
      --nemo GITDIR [--out benchmarks/data/public_runs.csv]
where each GITDIR is a clone (bare or not) holding the commits in COMMITS.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import subprocess
import sys
import zlib
from pathlib import Path

import yaml

COMMITS = {
    "megatron-lm": "d98e8a64ddf34856e74b24714e3bedb2f5a39553",
    "megatron-bridge": "067f987df03b8355b03192d88d70f1709fedf51a",
    "nemo": "2fca28a010fde08a76a8f4bcce82debeae15545e",
}

#: The locked test split (decided before any prediction was made; never edit to improve a
#: number). Whole models, so that no choice can learn a test model's shape from its other runs:
#: * vendor tables (Megatron-Bridge, NeMo): the families in VENDOR_TEST_FAMILIES are test --
#:   Llama-3-70B (the 70B-class dense model: VP on H100, CP 2 in NeMo 24.07, FSDP rows on
#:   GB200/GB300, and the Bridge study's peak-memory rows) and Qwen3-30B-A3B (the MoE model
#:   with a preset: EP 8-16, with VP on H100); every other family is dev;
#: * Megatron-LM CI: a case is test when crc32(family) % CI_TEST_MODULUS == 0, ``family``
#:   the case name without a ``_1node`` suffix, so every platform of one case is in one half.
VENDOR_TEST_FAMILIES = frozenset({"llama3-70b", "llama3-70b-sft", "qwen3-30b-a3b"})
CI_TEST_MODULUS = 5


def split_of(family: str, *, ci: bool) -> str:
    if ci:
        return "test" if zlib.crc32(family.encode()) % CI_TEST_MODULUS == 0 else "dev"
    return "test" if family in VENDOR_TEST_FAMILIES else "dev"


COLUMNS = [
    "id", "source", "source_url", "table", "licence", "measured", "family", "split",
    "model_preset", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
    "num_query_groups", "kv_channels", "vocab_size", "seq_length", "swiglu", "rmsnorm", "rope",
    "untied_embeddings", "multi_latent_attention", "num_experts", "moe_router_topk",
    "moe_ffn_hidden_size", "moe_shared_expert_size", "moe_layer_freq",
    "system", "gpu_type", "gpus", "gpus_per_node", "tp", "pp", "vp", "cp", "ep", "etp",
    "sequence_parallel", "micro_batch_size", "global_batch_size", "precision", "recompute",
    "distributed_optimizer", "fsdp", "attention_backend", "other_flags",
    "iteration_ms", "peak_mem_bytes", "tokens_per_s_per_gpu", "model_tflops_per_gpu",
]


def _git(gitdir: Path, *args: str) -> str:
    proc = subprocess.run(["git", "--git-dir", str(gitdir), *args], capture_output=True, text=True)
    if proc.returncode:
        print(f"error: {gitdir}: git {' '.join(args)} failed: {proc.stderr.strip()[:300]}", file=sys.stderr)
        raise SystemExit(2)
    return proc.stdout


def git_show(gitdir: Path, commit: str, path: str) -> str:
    return _git(gitdir, "show", f"{commit}:{path}")


def git_ls(gitdir: Path, commit: str, path: str) -> list[str]:
    return _git(gitdir, "ls-tree", "-r", "--name-only", commit, path).split()


# --------------------------------------------------------------------------- Megatron-LM CI

CI_PLATFORMS = {"dgx_h100": ("DGX-H100", "H100-SXM", "h100"), "dgx_a100": ("DGX-A100", "A100-80", "h100"),
                "dgx_gb200": ("DGX-GB200", "GB200", "gb200")}
# flags that change what a run does beyond its parallel shape, kept in other_flags
CI_NOTED = ("--use-megatron-fsdp", "--fp8-format", "--overlap-moe-expert-parallel-comm", "--moe-grouped-gemm",
            "--cuda-graph-impl", "--external-cuda-graph", "--deterministic-mode", "--mtp-num-layers",
            "--fine-grained-activation-offloading", "--optimizer", "--moe-token-dispatcher-type",
            "--overlap-grad-reduce", "--overlap-param-gather", "--num-distributed-optimizer-instances",
            "--moe-router-load-balancing-type", "--delay-wgrad-compute", "--use-torch-fsdp2", "--hybrid-override-pattern",
            "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
            "--pipeline-model-parallel-layout", "--account-for-embedding-in-pipeline-split",
            "--account-for-loss-in-pipeline-split", "--recompute-modules", "--cpu-offloading")


def _recipes(gitdir: Path, commit: str) -> dict[tuple[str, str], tuple[int, int]]:
    """(test_case, platform) -> (nodes, gpus per node), from the CI recipes."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for path in git_ls(gitdir, commit, "tests/test_utils/recipes"):
        if not path.endswith(".yaml") or path.split("/")[-2] not in ("h100", "gb200"):
            continue
        doc = yaml.safe_load(git_show(gitdir, commit, path)) or {}
        spec = doc.get("spec") or {}
        if not isinstance(spec, dict) or "nodes" not in spec:
            continue
        for prod in doc.get("products") or []:
            for case in prod.get("test_case") or []:
                for sub in prod.get("products") or []:
                    if "dev" not in (sub.get("environment") or []):
                        continue
                    for plat in sub.get("platforms") or [spec.get("platforms")]:
                        out[(case, plat)] = (int(sub.get("nodes", spec["nodes"])), int(sub.get("gpus", spec["gpus"])))
    return out


def _arg(a: dict, key: str, default=None):
    v = a.get(key, default)
    return default if v is None else v


def ci_rows(gitdir: Path) -> list[dict]:
    commit = COMMITS["megatron-lm"]
    recipes = _recipes(gitdir, commit)
    rows = []
    for path in git_ls(gitdir, commit, "tests/functional_tests/test_cases"):
        m = re.fullmatch(r"tests/functional_tests/test_cases/(gpt|moe)/([^/]+)/golden_values_dev_(dgx_h100|dgx_a100|dgx_gb200)\.json",
                         path)
        if not m:
            continue
        suite, case, plat = m.groups()
        if (case, plat) not in recipes:
            continue  # not run on that platform by the current recipes: no GPU count to trust
        cfg = yaml.safe_load(git_show(gitdir, commit, f"tests/functional_tests/test_cases/{suite}/{case}/model_config.yaml"))
        if (cfg.get("TEST_TYPE") or "regular") != "regular":
            continue  # checkpoint-resume cases time two phases
        a = cfg.get("MODEL_ARGS") or {}
        if "--seq-length" not in a or "--num-layers" not in a:
            continue
        gold = json.loads(git_show(gitdir, commit, path))
        it = (gold.get("iteration-time") or {}).get("values") or {}
        steps = sorted((int(k), float(v)) for k, v in it.items() if v is not None and str(v) != "nan")
        steady = [v for k, v in steps if k >= 3]  # step 1 is not timed, step 2 holds the warm-up
        if len(steady) < 5:
            continue
        mem = (gold.get("mem-max-allocated-bytes") or {}).get("values") or {}
        memv = [float(v) for v in mem.values() if v is not None and str(v) != "nan"]
        nodes, gpn = recipes[(case, plat)]
        system, gpu, _ = CI_PLATFORMS[plat]
        vp = None
        if "--num-virtual-stages-per-pipeline-rank" in a:
            vp = int(a["--num-virtual-stages-per-pipeline-rank"])
        elif "--num-layers-per-virtual-pipeline-stage" in a:
            pp = int(_arg(a, "--pipeline-model-parallel-size", 1))
            vp = int(a["--num-layers"]) // (pp * int(a["--num-layers-per-virtual-pipeline-stage"]))
        rec = "none"
        if a.get("--recompute-granularity") == "full":
            rec = f"full:{a.get('--recompute-method', 'uniform')}:{a.get('--recompute-num-layers', '')}"
        elif a.get("--recompute-granularity") == "selective":
            rec = "selective:" + str(a.get("--recompute-modules", "core_attn"))
        prec = (f"fp8-{a.get('--fp8-recipe', 'delayed')}" if a.get("--fp8-format")
                else ("bf16" if a.get("--bf16") else ("fp16" if a.get("--fp16") else "fp32")))
        family = re.sub(r"_1node$", "", case)
        flags = ";".join(f"{k[2:]}={a[k]}" for k in CI_NOTED if k in a and a[k] not in (False, None))
        ep = int(_arg(a, "--expert-model-parallel-size", 1))
        rows.append(dict(
            id=f"mlm-ci/{suite}/{case}/{plat}", source="Megatron-LM functional-test golden values",
            source_url=f"https://github.com/NVIDIA/Megatron-LM/blob/{commit}/{path}",
            table=f"tests/functional_tests/test_cases/{suite}/{case} (model_config.yaml + golden_values_dev_{plat}.json)",
            licence="BSD-3-Clause (NVIDIA/Megatron-LM LICENSE)",
            measured="median iteration-time over steps 3-end (s->ms); max over steps of mem-max-allocated-bytes "
                     "(torch.cuda.max_memory_allocated of the logging rank, the last rank)",
            family=family, split=split_of(family, ci=True), model_preset="",
            num_layers=int(a["--num-layers"]), hidden_size=int(a["--hidden-size"]),
            ffn_hidden_size=int(_arg(a, "--ffn-hidden-size", 4 * int(a["--hidden-size"]))),
            num_attention_heads=int(a["--num-attention-heads"]),
            num_query_groups=int(a["--num-query-groups"]) if a.get("--group-query-attention") else int(a["--num-attention-heads"]),
            kv_channels=int(_arg(a, "--kv-channels", int(a["--hidden-size"]) // int(a["--num-attention-heads"]))),
            vocab_size=(int(a["--vocab-size"]) if a.get("--vocab-size") else
                        "gpt2-bpe" if "--vocab-file" in a else str(a.get("--tokenizer-type", ""))),
            seq_length=int(a["--seq-length"]), swiglu=bool(a.get("--swiglu")),
            rmsnorm=a.get("--normalization") == "RMSNorm", rope=a.get("--position-embedding-type") == "rope",
            untied_embeddings=bool(a.get("--untie-embeddings-and-output-weights")),
            multi_latent_attention=bool(a.get("--multi-latent-attention")),
            num_experts=int(a["--num-experts"]) if a.get("--num-experts") else "",
            moe_router_topk=int(_arg(a, "--moe-router-topk", 2)) if a.get("--num-experts") else "",
            moe_ffn_hidden_size=_arg(a, "--moe-ffn-hidden-size", "") if a.get("--num-experts") else "",
            moe_shared_expert_size=_arg(a, "--moe-shared-expert-intermediate-size", ""),
            moe_layer_freq=str(_arg(a, "--moe-layer-freq", "")) if a.get("--num-experts") else "",
            system=system, gpu_type=gpu, gpus=nodes * gpn, gpus_per_node=gpn,
            tp=int(_arg(a, "--tensor-model-parallel-size", 1)), pp=int(_arg(a, "--pipeline-model-parallel-size", 1)),
            vp=vp or "", cp=int(_arg(a, "--context-parallel-size", 1)), ep=ep,
            etp=int(_arg(a, "--expert-tensor-parallel-size", _arg(a, "--tensor-model-parallel-size", 1))) if a.get("--num-experts") else "",
            sequence_parallel=bool(a.get("--sequence-parallel")),
            micro_batch_size=int(a["--micro-batch-size"]), global_batch_size=int(a["--global-batch-size"]),
            precision=prec, recompute=rec, distributed_optimizer=bool(a.get("--use-distributed-optimizer")),
            fsdp=1 if (a.get("--use-megatron-fsdp") or a.get("--use-torch-fsdp2")) else 0,
            attention_backend=str(_arg(a, "--attention-backend", "auto")), other_flags=flags,
            iteration_ms=round(statistics.median(steady) * 1e3, 3),
            peak_mem_bytes=int(max(memv)) if memv else "", tokens_per_s_per_gpu="", model_tflops_per_gpu=""))
    return rows


# --------------------------------------------------------------------------- vendor tables

SYSTEMS = {"DGX-H100": ("H100-SXM", 8), "DGX-B200": ("B200", 8), "DGX-B300": ("B300", 8), "DGX-GB200": ("GB200", 4),
           "DGX-GB300": ("GB300", 4)}
#: the project's preset for a table's model name (none: not expressible until a spec exists)
PRESETS = {"LLAMA3_8B": "Llama-3-8B", "LLAMA3-8B": "Llama-3-8B", "LLAMA3_70B": "Llama-3-70B", "LLAMA3-70B": "Llama-3-70B",
           "LLAMA3.1_405B": "Llama-3.1-405B", "LLAMA2-7B": "Llama-2-7B", "LLAMA2-13B": "Llama-2-13B",
           "LLAMA2-70B": "Llama-2-70B", "GPT3-175B": "GPT-3-175B", "Qwen3_30B_a3B": "Qwen3-30B-A3B",
           "Qwen3_235B_a22B": "Qwen3-235B-A22B"}


#: the tables' precision labels as Transformer Engine's FP8 recipes (Megatron-LM --fp8-recipe):
#: FP8 / FP8-CS current scaling = tensorwise (the Bridge recipes are named ..._fp8cs_config),
#: FP8-MX / MXFP8 = mxfp8; NVFP4 and BF16 as they are
VENDOR_PRECISION = {"fp8": "fp8-tensorwise", "fp8-cs": "fp8-tensorwise", "fp8-mx": "fp8-mxfp8",
                    "mxfp8": "fp8-mxfp8", "nvfp4": "nvfp4", "bf16": "bf16"}


def _family(model: str) -> str:
    base = re.sub(r"\s*\(.*?\)\s*", "", model).strip()
    return base.lower().replace("_", "-").replace(" ", "-")


def _cells(line: str) -> list[str]:
    line = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line)  # a markdown link keeps its text
    return [c.strip().strip("*").strip() for c in line.strip().strip("|").split("|")]


def _variants(row: dict[str, str]) -> list[dict[str, str]]:
    """A cell 'a (b)' gives a second configuration: b where a cell has parentheses, the plain value elsewhere."""
    if not any("(" in v for v in row.values()):
        return [row]
    first = {k: re.sub(r"\s*\(.*?\)", "", v).strip() for k, v in row.items()}
    second = {}
    for k, v in row.items():
        m = re.search(r"\((.*?)\)", v)
        second[k] = m.group(1).strip() if m else v.strip()
    if second.get("Model") and "(" in row.get("Model", ""):
        second["Model"] = first["Model"]  # '(w/o MTP)' and similar name the model, not a second run
    return [first, second] if second != first else [first]


def _num(v: str) -> int | None:
    v = re.sub(r"\[\^[^\]]*\]", "", v).replace(",", "").strip()  # footnote marks
    return None if v in ("", "n/a", "-") else int(float(v))


def table_rows(text: str, *, source: str, url: str, doc: str, licence: str, default_system: str | None = None,
               default_precision: str | None = None, default_release: str | None = None) -> list[dict]:
    rows = []
    release, model, system, section = default_release, None, default_system, ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        ln = lines[i]
        if m := re.match(r"^## (\S+) NeMo Container", ln):
            release = m.group(1)
        elif ln.startswith("### "):
            section = ln[4:].strip()
        elif m := re.match(r"^#### Model: (.+)", ln):
            model, system = m.group(1).strip(), None
        elif m := re.match(r"^#### System: (.+)", ln):
            system, model = m.group(1).strip(), None
        elif ln.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-\s|:]+\|$", lines[i + 1].strip()):
            header = _cells(ln)
            i += 2
            idx = 0
            while i < len(lines) and lines[i].startswith("|"):
                idx += 1
                raw = dict(zip(header, _cells(lines[i])))
                i += 1
                if not section.lower().startswith("pre"):
                    continue
                for vi, r in enumerate(_variants(raw)):
                    mdl = r.get("Model", model)
                    sysname = r.get("System", system)
                    if sysname not in SYSTEMS or mdl is None:
                        continue
                    gpu, gpn = SYSTEMS[sysname]
                    gpus, gbs = _num(r["#-GPUs"]), _num(r["GBS"])
                    seq = _num(r.get("Sequence Length") or r.get("Sequence Length ") or "")
                    tok = _num(r["Tokens / sec / GPU"])
                    label = r.get("Precision") or ""
                    if label:
                        prec = VENDOR_PRECISION.get(label.lower(), label.lower())
                    elif default_precision == "by-variant":
                        # 25.09: no precision column; its footnote: the numbers in parentheses
                        # use other quantisation granularities (Blackwell 32x32 = MXFP8; H100
                        # 128x128 weights / 1x128 activations = blockwise), the others FP8-CS
                        prec = ("fp8-tensorwise" if vi == 0 else
                                "fp8-blockwise" if sysname == "DGX-H100" else "fp8-mxfp8")
                    else:
                        prec = default_precision or ""
                    fam = _family(mdl)
                    key = re.sub(r"\s*\(.*?\)", "", mdl).strip().replace(" ", "_")
                    tp, pp = _num(r["TP"]), _num(r["PP"])
                    fsdp = _num(r.get("FSDP", "0") or "0") or 0
                    rows.append(dict(
                        id=f"{doc}/{release}/{sysname}/{key}/{prec or 'na'}/r{idx}v{vi}", source=source,
                        source_url=url, table=f"{release} container, {section}, {'Model: ' + model if model else 'System: ' + system}",
                        licence=licence,
                        measured="step time = GBS x sequence length / (tokens/s/GPU x #GPUs), from the published "
                                 "tokens/s/GPU (their definition); no memory published",
                        family=fam, split=split_of(fam, ci=False), model_preset=PRESETS.get(key, ""), seq_length=seq,
                        system=sysname, gpu_type=gpu, gpus=gpus, gpus_per_node=gpn, tp=tp, pp=pp,
                        vp=_num(r.get("VP", "")) or "", cp=_num(r.get("CP", "1")) or 1, ep=_num(r.get("EP", "")) or 1,
                        micro_batch_size=_num(r["MBS"]), global_batch_size=gbs, precision=prec, fsdp=fsdp,
                        other_flags=";".join(x for x in (
                            ("model note: " + re.search(r"\((.*?)\)", raw.get("Model", "")).group(1)
                             if "(" in raw.get("Model", "") else ""),
                            f"table precision: {raw.get('Precision') or 'none given'}") if x),
                        iteration_ms=round(gbs * seq / (tok * gpus) * 1e3, 3), peak_mem_bytes="",
                        tokens_per_s_per_gpu=tok, model_tflops_per_gpu=_num(r["Model TFLOP / sec / GPU"])))
            continue
        i += 1
    return rows


# --------------------------------------------------------------------------- memory rows (hand-entered)

BRIDGE_SKILL = "skills/nemo-mbridge-perf-memory-tuning/SKILL.md"
BRIDGE_RECOMPUTE = "skills/nemo-mbridge-perf-activation-recompute/SKILL.md"


def skill_rows() -> list[dict]:
    """Peak memory measured by Megatron-Bridge's own studies (entered by hand from the two pages)."""
    c = COMMITS["megatron-bridge"]
    out = []
    base = dict(source="Megatron-Bridge skill page (measured study)", licence="Apache-2.0 (NVIDIA-NeMo/Megatron-Bridge)",
                model_preset="Llama-3-70B", family="llama3-70b-sft", seq_length=4096, system="DGX-H100",
                gpu_type="H100-SXM", gpus=32, gpus_per_node=8, cp=1, ep=1, micro_batch_size=1, global_batch_size=32,
                precision="fp8-tensorwise", fsdp=0, other_flags="SFT (packed SQuAD); FP8 current scaling")
    for tp, pp, vp, tfl, mem in ((4, 4, 5, 704, 58.8), (4, 8, 5, 668.0, 53.2), (8, 4, 5, 508.7, 50.2)):
        out.append(dict(base, id=f"bridge-skill/memory-tuning/llama3-70b-sft/tp{tp}pp{pp}vp{vp}",
                        source_url=f"https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/{c}/{BRIDGE_SKILL}",
                        table="Measured Results: Strategy comparison: parallelism changes for memory reduction",
                        measured="Peak Mem (GB, decimal) as the study reports it; the TFLOP/s/GPU gives no exact step time",
                        tp=tp, pp=pp, vp=vp, iteration_ms="", peak_mem_bytes=int(mem * 1e9), model_tflops_per_gpu=tfl,
                        split=split_of("llama3-70b-sft", ci=False)))
    mbase = dict(source="Megatron-Bridge skill page (measured study)", licence="Apache-2.0 (NVIDIA-NeMo/Megatron-Bridge)",
                 model_preset="", family="moonlight-16b", seq_length=4096, system="DGX-H100", gpu_type="H100-SXM",
                 gpus=8, gpus_per_node=8, tp=2, pp=1, cp=1, ep=8, micro_batch_size=1, global_batch_size=4,
                 precision="bf16", fsdp=0, multi_latent_attention=True,
                 source_url=f"https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/{c}/{BRIDGE_RECOMPUTE}",
                 table="Matched H100 Evidence: Moonlight 16B",
                 measured="peak allocated (GB, decimal) after iteration 2; step time mean over iterations 11-20",
                 split=split_of("moonlight-16b", ci=False))
    for mods, mem, ms, tfl in (("none", 36.618, 457.18, 77.50), ("selective:core_attn", 36.614, 474.80, 74.44),
                               ("selective:moe_act", 35.941, 466.26, 75.50)):
        out.append(dict(mbase, id=f"bridge-skill/activation-recompute/moonlight-16b/{mods}", recompute=mods,
                        iteration_ms=ms, peak_mem_bytes=int(mem * 1e9), model_tflops_per_gpu=tfl,
                        other_flags="1 dense + 26 MLA+MoE layers; mock data"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megatron-lm", type=Path, required=True, help="git dir of NVIDIA/Megatron-LM")
    ap.add_argument("--megatron-bridge", type=Path, required=True, help="git dir of NVIDIA-NeMo/Megatron-Bridge")
    ap.add_argument("--nemo", type=Path, required=True, help="git dir of NVIDIA/NeMo")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("public_runs.csv"))
    args = ap.parse_args(argv)
    rows = ci_rows(args.megatron_lm)
    bc = COMMITS["megatron-bridge"]
    for doc, page in (("docs/performance-summary.md", "performance-summary.html"),
                      ("docs/performance-summary-archive.md", "performance-summary-archive.html")):
        rows += table_rows(git_show(args.megatron_bridge, bc, doc), source="Megatron-Bridge performance summary",
                           url=f"https://docs.nvidia.com/nemo/megatron-bridge/latest/{page} "
                               f"(github.com/NVIDIA-NeMo/Megatron-Bridge/blob/{bc}/{doc})",
                           doc="bridge-" + Path(doc).stem, licence="Apache-2.0 (NVIDIA-NeMo/Megatron-Bridge)",
                           default_precision="by-variant")
    nc = COMMITS["nemo"]
    nemo_doc = "docs/source/performance/performance_summary.md"
    rows += table_rows(git_show(args.nemo, nc, nemo_doc), source="NeMo 24.07 performance summary",
                       url=f"https://github.com/NVIDIA/NeMo/blob/{nc}/{nemo_doc}", doc="nemo-24.07",
                       licence="Apache-2.0 (NVIDIA/NeMo)", default_system="DGX-H100", default_precision="fp8-delayed",
                       default_release="24.07")
    rows += skill_rows()
    seen = set()
    for r in rows:
        if r["id"] in seen:
            raise SystemExit(f"duplicate row id {r['id']}")
        seen.add(r["id"])
    with args.out.open("w", newline="") as f:
        f.write("# Public measured Megatron runs; sources and the locked split rule: benchmarks/data/README.md.\n")
        f.write(f"# split (locked before any prediction): vendor tables: test = families {sorted(VENDOR_TEST_FAMILIES)}; "
                f"Megatron-LM CI: test = crc32(family) % {CI_TEST_MODULUS} == 0; every other row dev.\n")
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in COLUMNS})
    print(f"{len(rows)} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
