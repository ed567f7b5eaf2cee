"""Checkpoints in megatron-core's distributed format (``torch_dist``), laid out as
Megatron-LM's ``save_checkpoint`` lays them out (megatron/training/checkpointing.py,
core_r0.16.0), so that

* a run resumes where it stopped (model, optimizer, learning-rate scheduler, RNG and the
  data position, which is the iteration: :func:`memx_hpc.train.pretrain_gpt._dataset_batches`);
* a checkpoint written under one plan loads under another TP/PP/DP: every tensor is a
  ``ShardedTensor`` with its global shape and offset (megatron-core's ``sharded_state_dict``
  of GPTModel and of the optimizer), and ``dist_checkpointing.load`` reshards;
* stock Megatron-LM reads it: ``SAVE/latest_checkpointed_iteration.txt``,
  ``SAVE/iter_0000010/`` with megatron-core's files, and the same top-level keys
  (``args``, ``checkpoint_version`` 3.0, ``iteration``, ``model``, ``optimizer``,
  ``opt_param_scheduler``, ``rng_state``, ``num_floating_point_operations_so_far``).

The RNG state is sharded by (PP, TP) rank as Megatron-LM shards it; a checkpoint loaded
under another TP/PP starts its RNG from the seed instead (Megatron-LM's ``--no-load-rng``).

A checkpoint keeps loading after the entry renames a tensor: :data:`OLDER_LAYER_KEYS` lists the
names earlier releases wrote; :func:`load` reads a checkpoint under them where it holds those
and not the current ones, and the next save writes the current names.
"""

from __future__ import annotations

import os
import random
from argparse import Namespace
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from ..errors import SystemFailure

__all__ = ["TRACKER", "checkpoint_dir", "read_tracker", "CheckpointInfo", "read_info", "save", "load"]

TRACKER = "latest_checkpointed_iteration.txt"
# Layer key prefixes an earlier release of the entry wrote where the current one writes another
# (current -> older). Before 63f1fad the entry used megatron-core's local spec map, which names
# the MLP norm of every layer, MoE included, ``mlp.linear_fc1.layer_norm_``; an MoE layer now
# keeps ``pre_mlp_layernorm.`` as Transformer Engine's MoE layer does
# (pretrain_gpt.te_checkpoint_keys), and a user's checkpoint of the earlier names must still resume.
OLDER_LAYER_KEYS = {"pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_"}
# Megatron-LM writes the iteration as decimal digits (or "release"); 20 digits hold any
# int64, and a little room is left for surrounding whitespace
_TRACKER_MAX_BYTES = 32


def checkpoint_dir(base: str, iteration: int) -> str:
    """Megatron-LM's ``get_checkpoint_name`` for a distributed checkpoint."""
    return os.path.join(base, f"iter_{iteration:07d}")


def read_tracker(base: str) -> int | None:
    """The iteration ``base`` last saved, or None when it holds no checkpoint."""
    path = os.path.join(base, TRACKER)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            raw = f.read(_TRACKER_MAX_BYTES + 1)  # never more: the file is one number
    except OSError as e:
        raise SystemFailure(f"{path}: cannot read the checkpoint tracker: {e.strerror or e}") from None
    text = raw.decode("ascii", errors="replace").strip()
    if text == "release":
        return 0
    if len(raw) > _TRACKER_MAX_BYTES or not text.isdigit():
        shown = text[:40] + ("..." if len(text) > 40 else "")
        raise SystemFailure(f"{path}: the checkpoint tracker holds no iteration number (found {shown!r}"
                            f"{', and it is over ' + str(_TRACKER_MAX_BYTES) + ' bytes' if len(raw) > _TRACKER_MAX_BYTES else ''}); "
                            "it is damaged or not Megatron-LM's")
    return int(text)


@dataclass(frozen=True, kw_only=True)
class CheckpointInfo:
    """What a checkpoint says about the run that wrote it (its ``args`` and ``iteration``)."""

    path: str
    iteration: int
    args: Namespace


def read_info(base: str) -> CheckpointInfo:
    """The latest checkpoint of ``base``: iteration and the writer's arguments (no process
    group needed: megatron-core's common state is one file)."""
    import warnings

    it = read_tracker(base)
    if it is None:
        raise FileNotFoundError(os.path.join(base, TRACKER))
    with warnings.catch_warnings():  # megatron-core's notices about Apex / Transformer Engine on a login node
        warnings.simplefilter("ignore")
        from megatron.core import dist_checkpointing
    path = checkpoint_dir(base, it)
    common = dist_checkpointing.load_common_state_dict(path)
    return CheckpointInfo(path=path, iteration=int(common.get("iteration", it)), args=common["args"])


def _metadata(dp_group: Any) -> dict[str, Any]:
    # Megatron-LM's _build_sharded_state_dict_metadata for a non-distributed optimizer
    return {"singleton_local_shards": False, "chained_optim_avoid_prefix": True, "dp_cp_group": dp_group}


def _rng_state(torch: Any, *, pp_rank: int, pp: int, tp_rank: int, tp: int, dp_rank: int) -> Any:
    import numpy as np
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    state = {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
             "torch_rng_state": torch.get_rng_state(),
             "cuda_rng_state": torch.cuda.get_rng_state() if torch.cuda.is_available() else torch.get_rng_state(),
             "rng_tracker_states": get_cuda_rng_tracker().get_states()}
    return ShardedObject("rng_state", [state], (pp, tp), (pp_rank, tp_rank), replica_id=dp_rank)


def model_keys(chunks: int) -> list[str]:
    """Megatron-LM's keys of the model chunks (generate_state_dict): ``model`` for one,
    ``model0``, ``model1``, ... under the interleaved schedule."""
    return ["model"] if chunks == 1 else [f"model{i}" for i in range(chunks)]


def _chunks(model: Any) -> list[Any]:
    return list(model) if isinstance(model, (list, tuple)) else [model]


def _state_dict(*, model: Any, optimizer: Any, scheduler: Any, iteration: int, args: Namespace, dp_group: Any,
                rng: Any, is_loading: bool) -> dict[str, Any]:
    meta = _metadata(dp_group)
    chunks = _chunks(model)
    sd: dict[str, Any] = {"args": args, "checkpoint_version": 3.0, "iteration": iteration}
    for key, chunk in zip(model_keys(len(chunks)), chunks):
        sd[key] = chunk.sharded_state_dict(metadata=meta)
    sd["optimizer"] = optimizer.sharded_state_dict(sd, is_loading=is_loading, metadata=meta)
    sd["opt_param_scheduler"] = scheduler.state_dict()
    if rng is not None:
        sd["rng_state"] = rng
    sd["num_floating_point_operations_so_far"] = 0
    return sd


def save(base: str, *, iteration: int, model: Any, optimizer: Any, scheduler: Any, args: Namespace,
         dp_group: Any, ranks: dict[str, int], torch: Any) -> str:
    """Write iteration ``iteration`` under ``base`` (every rank calls it); rank 0 then names
    it in the tracker file, as Megatron-LM does, only once every rank has written."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy

    path = checkpoint_dir(base, iteration)
    if torch.distributed.get_rank() == 0:
        os.makedirs(path, exist_ok=True)
    torch.distributed.barrier()
    rng = _rng_state(torch, **ranks)
    sd = _state_dict(model=model, optimizer=optimizer, scheduler=scheduler, iteration=iteration, args=args,
                     dp_group=dp_group, rng=rng, is_loading=False)
    meta = {k: v for k, v in _metadata(dp_group).items() if k != "dp_cp_group"}
    dist_checkpointing.save(sd, path, get_default_save_sharded_strategy("torch_dist"), content_metadata=meta)
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        tmp = os.path.join(base, TRACKER + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(str(iteration))
        os.replace(tmp, os.path.join(base, TRACKER))
    torch.distributed.barrier()
    return path


def _tensor_keys(chunks: list[Any], meta: dict[str, Any]) -> set[str]:
    """The checkpoint keys of the model chunks' tensors (factories left out: what they store is
    theirs to name)."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    return {v.key for c in chunks for v in nested_values(c.sharded_state_dict(metadata=meta))
            if isinstance(v, ShardedTensor)}


def _older_keys(key: str) -> dict[str, str]:
    """The older names of checkpoint key ``key`` (:data:`OLDER_LAYER_KEYS`), keyed by the current prefix."""
    return {new: key.replace(f".{new}", f".{old}", 1) for new, old in OLDER_LAYER_KEYS.items() if f".{new}" in key}


def _older_naming(path: str, wanted: set[str], stored: set[str]) -> dict[str, str]:
    """The entries of :data:`OLDER_LAYER_KEYS` the checkpoint at ``path`` is written under, for
    the model keys ``wanted`` it lacks; a key it holds under no name stops the load here, by
    name, rather than inside megatron-core's loader."""
    older: dict[str, str] = {}
    for key in sorted(wanted - stored):
        found = {new: alt for new, alt in _older_keys(key).items() if alt in stored}
        if not found:
            alts = " nor ".join(_older_keys(key).values())
            n = len(wanted - stored) - 1
            more = f", nor {n} more of this model's tensors" if n else ""
            raise SystemFailure(f"{path}: the checkpoint holds no tensor {key}"
                                f"{' (nor the older ' + alts + ')' if alts else ''}{more}: "
                                "it was written for another model")
        older.update({new: OLDER_LAYER_KEYS[new] for new in found})
    return older


@contextmanager
def _layer_key_map(model: Any, extra: dict[str, str]) -> Iterator[None]:
    """Every transformer layer of ``model`` names its tensors with the prefixes ``extra`` added
    to its layer spec's ``sharded_state_dict_keys_map`` (which megatron-core's
    TransformerLayer.sharded_state_dict applies, the optimizer's keys following the model's);
    the maps are restored on exit, so later saves write the current names."""
    if not extra:
        yield
        return
    from megatron.core.transformer.transformer_layer import TransformerLayer

    configs = {id(m.submodules_config): m.submodules_config
               for c in _chunks(model) for m in c.modules() if isinstance(m, TransformerLayer)}
    saved = {i: c.sharded_state_dict_keys_map for i, c in configs.items()}
    try:
        for i, c in configs.items():
            c.sharded_state_dict_keys_map = {**extra, **saved[i]}  # a prefix the layer maps already stays
        yield
    finally:
        for i, c in configs.items():
            c.sharded_state_dict_keys_map = saved[i]


def load(base: str, *, model: Any, optimizer: Any, scheduler: Any, args: Namespace, dp_group: Any,
         ranks: dict[str, int], torch: Any) -> tuple[int, str] | None:
    """Load the latest checkpoint of ``base`` into model, optimizer and scheduler (resharded
    to this plan); returns ``(iteration, note)``, None when ``base`` holds none yet. A checkpoint
    an earlier release wrote loads under its names (:data:`OLDER_LAYER_KEYS`), which the note says."""
    from megatron.core import dist_checkpointing

    it = read_tracker(base)
    if it is None:
        return None
    path = checkpoint_dir(base, it)
    common = dist_checkpointing.load_common_state_dict(path)
    old = common.get("args")
    same_shape = old is not None and (getattr(old, "tensor_model_parallel_size", None),
                                      getattr(old, "pipeline_model_parallel_size", None)) == \
        (ranks["tp"], ranks["pp"])
    rng = _rng_state(torch, **ranks) if same_shape else None
    chunks = _chunks(model)
    wanted = _tensor_keys(chunks, _metadata(dp_group))
    older = _older_naming(path, wanted, set(dist_checkpointing.load_tensors_metadata(path)))
    with _layer_key_map(model, older):  # the sharded tensors keep the keys they are built with
        sd = _state_dict(model=model, optimizer=optimizer, scheduler=scheduler, iteration=it, args=args,
                         dp_group=dp_group, rng=rng, is_loading=True)
    sd.pop("args")
    loaded = dist_checkpointing.load(sd, path)
    for key, chunk in zip(model_keys(len(chunks)), chunks):
        chunk.load_state_dict(loaded[key])
    optimizer.load_state_dict(loaded["optimizer"])
    scheduler.load_state_dict(loaded["opt_param_scheduler"])
    note = "same TP/PP: RNG restored"
    if rng is not None and "rng_state" in loaded:
        st = loaded["rng_state"][0] if isinstance(loaded["rng_state"], list) else loaded["rng_state"]
        import numpy as np
        from megatron.core.tensor_parallel import get_cuda_rng_tracker

        random.setstate(st["random_rng_state"])
        np.random.set_state(st["np_rng_state"])
        torch.set_rng_state(st["torch_rng_state"])
        if torch.cuda.is_available():
            torch.cuda.set_rng_state(st["cuda_rng_state"])
        get_cuda_rng_tracker().set_states(st["rng_tracker_states"])
    else:
        note = (f"written under tp={getattr(old, 'tensor_model_parallel_size', '?')} "
                f"pp={getattr(old, 'pipeline_model_parallel_size', '?')}, resharded; RNG from the seed")
    if older:
        note += "; read under an earlier release's names " + ", ".join(
            f"{v}* for {k}*" for k, v in older.items()) + ", the next checkpoint writes the current ones"
    return int(loaded.get("iteration", it)), note
