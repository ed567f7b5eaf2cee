"""The questions the composition asks the cost model: one :class:`~memx_hpc.model.api.LayerQuery`
per (GPU type, TP, micro-batch, sequence parallel) context and kind of layer.

The composition prices a stage from five answers per context (a layer under each recompute
mode, the embedding, the head: :func:`context_queries`); the search predicts them once per
context and the one-plan path asks the same queries (:func:`layer_query`), so both read the
same numbers.
"""

from __future__ import annotations

from ..spec import RECOMPUTE_MODES, LayerShape, TrainJob
from .api import LayerQuery

__all__ = ["MODE_NAMES", "MODE_NONE", "MODE_SELECTIVE", "MODE_FULL", "shape_of", "layer_query", "context_queries"]

# Codes of the per-layer recompute mode used by the vectorised cost composition: positions in
# the one vocabulary of modes (spec.RECOMPUTE_MODES), from profile points to rendered flags.
MODE_NAMES = RECOMPUTE_MODES
MODE_NONE, MODE_SELECTIVE, MODE_FULL = (MODE_NAMES.index(m) for m in ("none", "selective", "full"))


def shape_of(job: TrainJob) -> LayerShape:
    """The layer shape the cost model is asked about: the model's layer (an MoE model's MoE
    layer, whose router, routed experts and shared experts the cost model prices; a model
    whose first layers are dense, ``moe_layer_freq``, is priced as MoE layers throughout)."""
    return LayerShape.of(job.model, moe=job.model.is_moe)


def layer_query(job: TrainJob, gpu_type: str, *, kind: str, tp: int, micro_batch_size: int, recompute: str,
                sequence_parallel: bool) -> LayerQuery:
    """The query for one ``kind`` (layer | embedding | head) of ``job``'s model on ``gpu_type``:
    sequence parallel only where TP > 1, FP8 on the transformer layers only."""
    return LayerQuery(gpu_type=gpu_type, kind=kind, shape=shape_of(job), tp=tp, micro_batch_size=micro_batch_size,
                      recompute=recompute, precision=job.precision, attention=job.attention,
                      sequence_parallel=sequence_parallel and tp > 1, fp8=job.fp8 if kind == "layer" else "")


def context_queries(job: TrainJob, gpu_type: str, tp: int, mbs: int, sp: bool) -> list[LayerQuery]:
    """The five queries one (GPU type, TP, micro-batch) context needs: a layer under each
    recompute mode, the embedding and the head."""
    q = [layer_query(job, gpu_type, kind="layer", tp=tp, micro_batch_size=mbs, recompute=m, sequence_parallel=sp)
         for m in MODE_NAMES]
    q += [layer_query(job, gpu_type, kind=k, tp=tp, micro_batch_size=mbs, recompute="none", sequence_parallel=sp)
          for k in ("embedding", "head")]
    return q
