"""A training data set prepared for the job file (``memx-hpc data prepare``): a
:class:`DataRequest` in, :class:`memx_hpc.train.prepare.PreparedData` out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from ..train.prepare import PreparedData

__all__ = ["DataRequest", "prepare_data"]


@dataclass(frozen=True, kw_only=True)
class DataRequest:
    """Encode the documents of ``inputs`` (JSON lines, the text under ``json_key``) with the
    local tokenizer of ``tokenizer_type`` (its model, vocabulary and merge files as
    Megatron-LM names them) into the indexed data set ``{output_prefix}_{json_key}_document``;
    ``append_eod``: end each document with the EOD token; ``overwrite``: replace a data set
    already there."""

    inputs: Sequence[str]
    output_prefix: str
    tokenizer_type: str
    tokenizer_model: str | None = None
    vocab_file: str | None = None
    merge_file: str | None = None
    json_key: str = "text"
    append_eod: bool = True
    overwrite: bool = False


def prepare_data(request: DataRequest) -> "PreparedData":
    """Load the tokenizer and write the data set (see :func:`memx_hpc.train.prepare.prepare`)."""
    # the tokenizers and the indexed-dataset writer load here, not when the planner is imported
    from ..train.prepare import prepare
    from ..train.tokenizer import load_tokenizer

    tok = load_tokenizer(request.tokenizer_type, model=request.tokenizer_model, vocab_file=request.vocab_file,
                         merge_file=request.merge_file)
    return prepare(request.inputs, request.output_prefix, tok, json_key=request.json_key,
                   append_eod=request.append_eod, overwrite=request.overwrite)
