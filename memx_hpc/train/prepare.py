"""A text corpus to Megatron's indexed dataset (``.bin``/``.idx``), as Megatron-LM's
``tools/preprocess_data.py`` writes it: one document per JSON line (its ``text`` key) or
per text file, encoded with a local tokenizer (:mod:`memx_hpc.train.tokenizer`),
end-of-document appended, written with megatron-core's ``IndexedDatasetBuilder`` in the
smallest integer type that holds the vocabulary. The result, ``PREFIX_text_document``,
is what a job file's ``data.paths`` names.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from ..errors import SpecError, SystemFailure
from .tokenizer import LocalTokenizer

__all__ = ["PreparedData", "prepare", "documents"]


@dataclass(frozen=True, kw_only=True)
class PreparedData:
    """What was written: the dataset prefix (for ``data.paths``), documents and tokens."""

    prefix: str
    num_documents: int
    num_tokens: int
    vocab_size: int
    dtype: str


def documents(inputs: Sequence[str], *, json_key: str = "text") -> Iterator[tuple[str, str]]:
    """``(where, text)`` of every document: each line of a ``.jsonl``/``.json`` file (its
    ``json_key``), each other file whole; a folder is read file by file in name order."""
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            files += sorted(q for q in p.rglob("*") if q.is_file())
        elif p.is_file():
            files.append(p)
        else:
            raise SystemFailure(f"{item}: no such file or folder")
    if not files:
        raise SpecError("no input files", field="input", found=list(inputs))
    for f in files:
        try:
            if f.suffix in (".jsonl", ".json"):
                with f.open(encoding="utf-8") as fh:
                    for n, line in enumerate(fh, 1):
                        if not line.strip():
                            continue
                        try:
                            doc = json.loads(line)
                        except json.JSONDecodeError as e:
                            raise SpecError(f"not a JSON line: {e.msg}", file=str(f), field=f"line {n}") from None
                        if not isinstance(doc, dict) or not isinstance(doc.get(json_key), str):
                            raise SpecError(f"expected an object with a string '{json_key}'", file=str(f),
                                            field=f"line {n}", found=str(line)[:60])
                        yield f"{f}:{n}", doc[json_key]
            else:
                yield str(f), f.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise SpecError(f"not UTF-8 text ({e.reason})", file=str(f)) from None
        except OSError as e:
            raise SystemFailure(f"{f}: cannot read: {e.strerror or e}") from None


def prepare(inputs: Sequence[str], output_prefix: str, tokenizer: LocalTokenizer, *, json_key: str = "text",
            append_eod: bool = True) -> PreparedData:
    """Encode every document of ``inputs`` and write ``{output_prefix}_text_document.bin/.idx``."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    prefix = f"{output_prefix}_{json_key}_document"
    folder = os.path.dirname(os.path.abspath(prefix))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise SystemFailure(f"{folder}: cannot create the output folder: {e.strerror or e}") from None
    dtype = DType.optimal_dtype(tokenizer.vocab_size)
    n_docs = n_tokens = 0
    try:
        builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
        for _, text in documents(inputs, json_key=json_key):
            ids = tokenizer.encode(text)
            if append_eod:
                ids = [*ids, tokenizer.eod]
            if not ids:
                continue
            if max(ids) >= tokenizer.vocab_size:
                raise SpecError(f"token id {max(ids)} is outside the tokenizer's vocabulary of {tokenizer.vocab_size}")
            builder.add_document(np.asarray(ids, dtype=np.int64), [len(ids)])
            n_docs += 1
            n_tokens += len(ids)
        if n_docs == 0:
            raise SpecError("the corpus holds no text", field="input", found=list(inputs))
        builder.finalize(f"{prefix}.idx")
    except OSError as e:
        raise SystemFailure(f"{prefix}: cannot write the dataset: {e.strerror or e}") from None
    return PreparedData(prefix=prefix, num_documents=n_docs, num_tokens=n_tokens, vocab_size=tokenizer.vocab_size,
                        dtype=np.dtype(dtype).name)
