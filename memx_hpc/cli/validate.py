"""``memx-hpc validate``: load a site (and a job), print what was understood or the errors."""

from __future__ import annotations

import argparse

from .common import add_json, emit_json, table

HELP = "check a site file (and a job file) and print what was understood"
DESCRIPTION = """\
Load and check a site file and, optionally, a job file. Prints the partitions,
their GPU types with the datasheet figures used, GPU totals, and the model's
shape; or one error that names the file, the field, what was found and what is
allowed (exit code 1).

examples:
  memx-hpc validate --site site_configs/local.yaml --job jobs/tiny-gpt.yaml
  memx-hpc validate --site site_configs/example-cross-vendor.yaml --json
  memx-hpc validate --list-gpus
  memx-hpc validate --list-models
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("validate", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--site", metavar="SITE.yaml", help="site file to check")
    p.add_argument("--job", metavar="JOB.yaml", help="job file to check")
    p.add_argument("--list-gpus", action="store_true", help="list the built-in GPU catalog")
    p.add_argument("--list-models", action="store_true", help="list the model presets")
    add_json(p)
    return p


def site_summary(site) -> dict:
    parts = []
    for pt in site.partitions:
        g = site.gpu(pt.gpu_type)
        parts.append({"name": pt.name, "gpu_type": g.name, "vendor": g.vendor, "nodes": pt.nodes,
                      "gpus_per_node": pt.gpus_per_node, "gpus": pt.total_gpus, "memory_gib": g.memory_gib,
                      "peak_tflops_bf16": g.peak_tflops_bf16, "intra_node_gbps": site.intra_gbps(pt.name),
                      "inter_node_gbps": site.link_gbps(pt.name, pt.name), "gres_type": pt.gres_type})
    vendors = sorted({p["vendor"] for p in parts})
    return {"site": site.name, "file": site.source_file, "scheduler": site.scheduler,
            "partitions": parts, "total_gpus": site.total_gpus, "vendors": vendors,
            "total_memory_gib": round(sum(p["gpus"] * p["memory_gib"] for p in parts), 2),
            "pipeline_comm_backend": site.pipeline_comm_backend, "store": str(site.store),
            "memory_safety_margin": site.memory_safety_margin}


def _job_dict(job) -> dict:
    from ..planner import CP_MIN_TOKENS, DEFAULT_VIRTUAL_STAGES
    m = job.model
    d = {"job": job.name, "file": job.source_file, "model": m.name, "num_layers": m.num_layers,
         "hidden_size": m.hidden_size, "num_attention_heads": m.num_attention_heads,
         "num_query_groups": m.num_query_groups, "ffn_hidden_size": m.ffn_hidden_size,
         "vocab_size": m.vocab_size, "seq_length": m.seq_length, "activation": m.activation,
         "global_batch_size": job.global_batch_size, "precision": job.precision,
         "distributed_optimizer": job.distributed_optimizer,
         "micro_batch_sizes": list(job.micro_batch_sizes) or "divisors of the global batch up to 16",
         "recompute_modes": list(job.recompute_modes),
         # the degree lists the search takes (empty: its own candidates, memx_hpc/search/space.py)
         "virtual_stages": list(job.virtual_stages) or f"searched {list(DEFAULT_VIRTUAL_STAGES)}",
         "context_parallel_sizes": list(job.context_parallel_sizes) or (
             f"searched: 1 and powers of two leaving >= {CP_MIN_TOKENS} tokens per rank"),
         "distributed_optimizer_searched": job.distributed_optimizer_searched,
         "attention": job.attention, "fp8": job.fp8 or None, "fp8_recipe": job.fp8_recipe if job.fp8 else None,
         "grad_reduce_in_fp32": job.grad_reduce_in_fp32, "fp8_param_gather": job.fp8_param_gather}
    if m.is_moe:
        d.update(expert_parallel_sizes=list(job.expert_parallel_sizes) or "searched: divisors of the experts",
                 expert_tensor_parallel_sizes=list(job.expert_tensor_parallel_sizes) or "searched")
        d.update(num_experts=m.num_experts, moe_router_topk=m.moe_router_topk,
                 moe_ffn_hidden_size=m.expert_ffn_hidden_size, moe_layers=sum(m.moe_layers),
                 moe_shared_expert_intermediate_size=m.moe_shared_expert_intermediate_size)
    if m.multi_latent_attention:
        d.update(multi_latent_attention=True, kv_lora_rank=m.kv_lora_rank, q_lora_rank=m.q_lora_rank)
    from ..params import model_params
    # as Megatron-LM allocates them (padded vocabulary); active: what one token runs
    d["parameters"] = model_params(m)
    d["active_parameters"] = model_params(m, active=True)
    return d


def run(args: argparse.Namespace) -> int:
    from ..errors import SpecError
    from ..spec import load_job, load_site

    if args.list_gpus or args.list_models:
        return _lists(args)
    if not args.site and not args.job:
        raise SpecError("nothing to check: give --site and/or --job (or --list-gpus / --list-models)")
    out: dict = {}
    if args.site:
        out["site"] = site_summary(load_site(args.site))
    if args.job:
        out["job"] = _job_dict(load_job(args.job))
    if args.json:
        emit_json({"ok": True, **out})
        return 0
    if "site" in out:
        s = out["site"]
        print(f"site {s['site']} ({s['file']}): {len(s['partitions'])} partitions, {s['total_gpus']} GPUs, "
              f"{s['total_memory_gib']:.1f} GiB in all, vendors: {', '.join(s['vendors'])}")
        table([(p["name"], p["gpu_type"], p["vendor"], p["nodes"], p["gpus_per_node"], p["gpus"],
                p["memory_gib"], p["peak_tflops_bf16"], p["intra_node_gbps"], p["inter_node_gbps"])
               for p in s["partitions"]],
              ["partition", "gpu", "vendor", "nodes", "gpus/node", "gpus", "mem GiB", "bf16 TFLOP/s",
               "intra GB/s", "inter GB/s"])
        print(f"scheduler: {s['scheduler']}; pipeline comm backend: {s['pipeline_comm_backend']}; "
              f"store: {s['store']}")
    if "job" in out:
        j = out["job"]
        params = f", {j['parameters'] / 1e9:.2f} B parameters"
        if "num_experts" in j:
            params += (f" ({j['active_parameters'] / 1e9:.2f} B active): {j['moe_layers']} MoE layers of "
                       f"{j['num_experts']} experts, top-{j['moe_router_topk']}, expert ffn {j['moe_ffn_hidden_size']}")
        if "multi_latent_attention" in j:
            params += f", multi-latent attention (KV rank {j['kv_lora_rank']})"
        print(f"job {j['job']}: model {j['model']} ({j['num_layers']} layers, hidden {j['hidden_size']}, "
              f"{j['num_attention_heads']} heads / {j['num_query_groups']} query groups, ffn {j['ffn_hidden_size']}, "
              f"{j['activation']}, vocab {j['vocab_size']}, seq {j['seq_length']}{params}); "
              f"global batch {j['global_batch_size']}, {j['precision']}, micro-batches {j['micro_batch_sizes']}")
        dist = "searched (on and off)" if j["distributed_optimizer_searched"] else (
            "on" if j["distributed_optimizer"] else "off")
        extra = [f"virtual stages {j['virtual_stages']}", f"context parallel {j['context_parallel_sizes']}"]
        if j["attention"] == "core":
            extra[-1] = "context parallel 1 (core attention)"
        if "expert_parallel_sizes" in j:
            extra += [f"expert parallel {j['expert_parallel_sizes']}",
                      f"expert tensor parallel {j['expert_tensor_parallel_sizes']}"]
        extra += [f"recompute {j['recompute_modes']}", f"distributed optimizer {dist}", f"attention {j['attention']}",
                  f"fp8 {j['fp8']} ({j['fp8_recipe']})" if j["fp8"] else "fp8 off",
                  "gradients reduced in " + ("fp32" if j["grad_reduce_in_fp32"] else j["precision"])]
        if j["fp8_param_gather"]:
            extra.append("FP8 weights gathered (--fp8-param-gather)")
        print("  search: " + "; ".join(extra))
    print("ok")
    return 0


def _lists(args: argparse.Namespace) -> int:
    from ..spec.catalog import catalog, model_presets
    if args.list_gpus:
        rows = [(g.name, g.vendor, g.memory_gib, g.peak_tflops_bf16, g.peak_tflops_fp8 or "-", g.peak_tflops_fp32,
                 g.hbm_gbps, g.link_gbps, g.tdp_w or "-", g.form_factor or "-", ",".join(g.aliases)) for g in catalog()]
        if args.json:
            emit_json([{"name": g.name, "vendor": g.vendor, "memory_gib": g.memory_gib,
                        "peak_tflops_bf16": g.peak_tflops_bf16, "peak_tflops_fp32": g.peak_tflops_fp32,
                        "hbm_gbps": g.hbm_gbps, "link_gbps": g.link_gbps, "aliases": list(g.aliases),
                        "peak_tflops_fp8": g.peak_tflops_fp8, "tdp_w": g.tdp_w, "form_factor": g.form_factor,
                        "compute_capability": (None if g.compute_capability is None
                                               else "%d.%d" % g.compute_capability),
                        "source": g.source} for g in catalog()])
        else:
            table(rows, ["gpu", "vendor", "mem GiB", "bf16 TFLOP/s", "fp8 TFLOP/s", "fp32 TFLOP/s", "HBM GB/s",
                         "link GB/s", "power W", "form", "aliases"])
    if args.list_models:
        ms = model_presets()
        if args.json:
            emit_json({k: vars(v) for k, v in ms.items()})
        else:
            table([(m.name, m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups,
                    m.ffn_hidden_size, m.vocab_size, m.seq_length, m.activation,
                    f"{m.num_experts} top-{m.moe_router_topk}" if m.is_moe else "-") for m in ms.values()],
                  ["preset", "layers", "hidden", "heads", "groups", "ffn", "vocab", "seq", "act", "experts"])
    return 0
