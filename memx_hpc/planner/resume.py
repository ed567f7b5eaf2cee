"""Continuing a run from its checkpoint under another plan (``plan --resume``, ``render --resume``).

The checkpoint's model must be the job's: a resumed run keeps the model's shape, while TP,
PP, DP and partitions may change (megatron-core's ``torch_dist`` checkpoints reshard).
:func:`resume_job` reads the arguments Megatron saved with the checkpoint (``args`` in its
common state, ``common.pt``) and compares them with the job before anything is rendered.
"""

from __future__ import annotations

import dataclasses
from argparse import Namespace

from ..errors import SpecError, SystemFailure
from ..params import VOCAB_DIVISIBLE_BY, padded_vocab_size
from ..shellsafe import check_path
from ..spec import Checkpointing, TrainJob

__all__ = ["resume_job", "model_differences"]


def _read(checkpoint: str):
    """What the checkpoint says about the run that wrote it (its ``args`` and iteration)."""
    try:
        # torch and megatron-core: imported only when a checkpoint is read
        from ..train.checkpoint import read_info

        return read_info(checkpoint)
    except ImportError as e:
        raise SystemFailure(f"reading the checkpoint {checkpoint} needs torch and megatron-core ({e}): "
                            f"pip install 'memx-hpc[profile]'") from None
    except FileNotFoundError:
        raise SpecError("not a checkpoint folder: it has no latest_checkpointed_iteration.txt", field="--resume",
                        found=checkpoint) from None
    except Exception as e:  # noqa: BLE001 - a damaged or foreign checkpoint: name it, exit 1
        raise SpecError(f"cannot read the checkpoint: {type(e).__name__}: {e}", field="--resume",
                        found=checkpoint) from None


def model_differences(job: TrainJob, args: Namespace) -> list[tuple[str, object, object]]:
    """``(argument, the job's value, the checkpoint's)`` for each model argument Megatron saved
    with the checkpoint that the job would launch differently. An argument the checkpoint
    does not carry is not compared."""
    m = job.model
    theirs = vars(args)
    gqa = bool(theirs.get("group_query_attention", False))
    ours: dict[str, object] = {
        "num_layers": m.num_layers, "hidden_size": m.hidden_size, "ffn_hidden_size": m.ffn_hidden_size,
        "num_attention_heads": m.num_attention_heads, "seq_length": m.seq_length,
        "swiglu": m.activation == "swiglu", "num_experts": m.num_experts,
    }
    # multi-latent attention: whether, and its ranks and head sizes (Megatron-LM's names)
    ours["multi_latent_attention"] = m.multi_latent_attention
    if m.multi_latent_attention:
        ours.update(q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank, qk_head_dim=m.qk_head_dim,
                    qk_pos_emb_head_dim=m.qk_pos_emb_head_dim, v_head_dim=m.v_head_dim)
    if m.num_experts is not None:
        ours["moe_router_topk"] = m.moe_router_topk
        if m.moe_ffn_hidden_size is not None:
            ours["moe_ffn_hidden_size"] = m.moe_ffn_hidden_size
    out = [(k, v, theirs[k]) for k, v in ours.items() if k in theirs and theirs[k] != v]
    # without --group-query-attention Megatron gives every head its own key/value group
    groups = theirs.get("num_query_groups") if gqa else theirs.get("num_attention_heads")
    if groups is not None and groups != m.num_query_groups:
        out.append(("num_query_groups", m.num_query_groups, groups))
    if theirs.get("tokenizer_type", "NullTokenizer") == "NullTokenizer":
        # the scripts launch NullTokenizer with --vocab-size V; Megatron pads it per TP
        if theirs.get("vocab_size") is not None and theirs["vocab_size"] != m.vocab_size:
            out.append(("vocab_size", m.vocab_size, theirs["vocab_size"]))
        elif theirs.get("padded_vocab_size") is not None:
            tp = int(theirs.get("tensor_model_parallel_size") or 1)
            div = int(theirs.get("make_vocab_size_divisible_by") or VOCAB_DIVISIBLE_BY)
            padded = padded_vocab_size(m.vocab_size, tp, div)
            if padded != theirs["padded_vocab_size"]:
                out.append(("padded_vocab_size", padded, theirs["padded_vocab_size"]))
    return out


def resume_job(job: TrainJob, checkpoint: str) -> tuple[TrainJob, str]:
    """``job`` continued from the megatron-core distributed checkpoint folder ``checkpoint``
    (what a run's ``--save`` wrote): the checkpoint's model must be the job's (a resumed run
    keeps the model's shape; TP, PP, DP and partitions may change, the checkpoint reshards),
    the script loads it (``--load``) and keeps saving (the job's save folder, else the same
    one). Returns the job and a note: the iteration it resumes at and the plan that wrote it.
    SpecError naming ``--resume``, the checkpoint and every differing model argument when
    the models differ; SpecError naming ``--resume`` for a folder that is not a plain path
    (the script loads it on the cluster's nodes), before the checkpoint is read: ``plan
    --resume`` and ``render --resume`` refuse it alike."""
    check_path(checkpoint, "--resume")
    info = _read(checkpoint)
    a = info.args
    differ = model_differences(job, a)
    if differ:
        said = "; ".join(f"{k} {theirs} (the job's model: {ours})" for k, ours, theirs in differ)
        raise SpecError(f"the checkpoint's model is not the job's ({job.source_file or job.name}): it has {said}; a "
                        f"resumed run keeps the model's shape", field="--resume", found=checkpoint,
                        allowed="a checkpoint of this job's model")
    if job.train_iters is not None and job.train_iters <= info.iteration:
        raise SpecError(f"the checkpoint is at iteration {info.iteration} already: raise train_iters to go on",
                        field="train_iters", file=job.source_file, found=job.train_iters)
    ck = job.checkpoint
    job = dataclasses.replace(job, checkpoint=Checkpointing(
        save_dir=ck.save_dir if ck is not None and ck.save_dir else checkpoint, load_dir=checkpoint,
        save_interval=ck.save_interval if ck is not None else None))
    shape = "/".join(str(getattr(a, k, "?")) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                                        "data_parallel_size"))
    note = (f"resumes from {info.path}: iteration {info.iteration}, written with tp/pp/dp {shape} and global batch "
            f"{getattr(a, 'global_batch_size', '?')}; the plans keep the model's shape and may use other partitions "
            f"and TP/PP/DP (the checkpoint reshards); render with --resume {checkpoint} (or checkpoint.load in the "
            f"job file) to load it")
    if getattr(a, "global_batch_size", job.global_batch_size) != job.global_batch_size:
        note += (f"; the job's global batch {job.global_batch_size} differs, so iteration i no longer reads the "
                 f"samples it would have")
    return job, note
