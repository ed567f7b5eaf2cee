"""A text corpus to Megatron's indexed dataset (``.bin``/``.idx``), as Megatron-LM's
``tools/preprocess_data.py`` writes it: one document per JSON line (its ``text`` key) or
per text file, encoded with a local tokenizer (:mod:`memx_hpc.train.tokenizer`),
end-of-document appended, written with megatron-core's ``IndexedDatasetBuilder`` in the
smallest integer type that holds the vocabulary. The result, ``PREFIX_text_document``,
is what a job file's ``data.paths`` names.

Nothing a user owns is lost: the dataset is written under a temporary name beside the
target and renamed into place only once complete, under a lock that keeps a second
prepare out of the same prefix; an existing dataset is replaced only with ``overwrite``;
an output inside an input folder (which would read its own output back) is refused; and
every read of the corpus is bounded (:data:`MAX_DOCUMENT_BYTES`).
"""

from __future__ import annotations

import errno
import fcntl
import glob
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from ..errors import SpecError, SystemFailure
from .tokenizer import LocalTokenizer

__all__ = ["PreparedData", "prepare", "documents", "MAX_DOCUMENT_BYTES"]

#: The most text one document may hold (one JSON line, or one text file). The tokenizers
#: here take ~200 bytes of memory per byte of a document (a 20 MB line took 4.3 GiB), so
#: 8 MiB keeps one prepare under ~2 GiB; the longest books are a few MB. Longer text is a
#: SpecError naming the file and line, found after reading at most this much of it.
MAX_DOCUMENT_BYTES = 8 * 2**20


@dataclass(frozen=True, kw_only=True)
class PreparedData:
    """What was written: the dataset prefix (for ``data.paths``), documents and tokens."""

    prefix: str
    num_documents: int
    num_tokens: int
    vocab_size: int
    dtype: str


def _read_line(fh, f: Path, n: int) -> bytes | None:
    """Line ``n`` of ``fh`` (binary), at most :data:`MAX_DOCUMENT_BYTES` of text; None at the end."""
    line = fh.readline(MAX_DOCUMENT_BYTES + 1)
    if not line:
        return None
    if len(line) > MAX_DOCUMENT_BYTES and not line.endswith(b"\n"):
        raise SpecError(f"a line longer than {_mib(MAX_DOCUMENT_BYTES)} (the most one document may hold: "
                        "tokenising takes ~200 bytes of memory per byte of text); split the document",
                        file=str(f), field=f"line {n}")
    return line


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n:,} bytes"


def documents(inputs: Sequence[str], *, json_key: str = "text") -> Iterator[tuple[str, str]]:
    """``(where, text)`` of every document: each line of a ``.jsonl``/``.json`` file (its
    ``json_key``), each other file whole; a folder is read file by file in name order. Blank
    lines and blank files are no documents. A document over :data:`MAX_DOCUMENT_BYTES` is a
    SpecError naming the file (and line), read no further than the limit."""
    for f in _input_files(inputs):
        n = 0
        try:
            with f.open("rb") as fh:
                if f.suffix in (".jsonl", ".json"):
                    while (raw := _read_line(fh, f, n + 1)) is not None:
                        n += 1
                        line = raw.decode("utf-8")
                        if not line.strip():
                            continue
                        try:
                            doc = json.loads(line)
                        except json.JSONDecodeError as e:
                            raise SpecError(f"not a JSON line: {e.msg}", file=str(f), field=f"line {n}") from None
                        if not isinstance(doc, dict) or not isinstance(doc.get(json_key), str):
                            raise SpecError(f"expected an object with a string '{json_key}'", file=str(f),
                                            field=f"line {n}", found=line[:60])
                        yield f"{f}:{n}", doc[json_key]
                else:
                    raw = fh.read(MAX_DOCUMENT_BYTES + 1)
                    if len(raw) > MAX_DOCUMENT_BYTES:
                        raise SpecError(f"a text file is one document, and this one is over "
                                        f"{_mib(MAX_DOCUMENT_BYTES)} (tokenising takes ~200 bytes of memory per "
                                        "byte of text); split it into several files or JSON lines", file=str(f))
                    text = raw.decode("utf-8")
                    if text.strip():  # a blank file is no document, as a blank JSON line is none
                        yield str(f), text
        except UnicodeDecodeError as e:
            raise SpecError(f"not UTF-8 text ({e.reason})", file=str(f), field=f"line {n}" if n else None) from None
        except OSError as e:
            raise SystemFailure(f"{f}: cannot read: {e.strerror or e}") from None


def _input_files(inputs: Sequence[str]) -> list[Path]:
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
    return files


def _import_builder():
    """megatron-core's dataset writer, without the four UserWarnings its package prints on
    import where Transformer Engine and Apex are missing (they concern training kernels,
    not the dataset files written here)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed",
                                category=UserWarning)
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    return DType, IndexedDatasetBuilder


def _refuse_output_in_inputs(inputs: Sequence[str], folder: str) -> None:
    """An output folder inside an input folder would have its own dataset (and its
    temporary files) read back as documents by the next prepare: refused."""
    out = os.path.realpath(folder)
    for item in inputs:
        if not os.path.isdir(item):
            continue
        d = os.path.realpath(item)
        if out == d or out.startswith(d.rstrip(os.sep) + os.sep):
            raise SpecError(f"the output folder {folder} is inside the input folder {item}, whose files are all "
                            "read as documents; write the dataset elsewhere", field="--output-prefix",
                            found=item)


def _lock(prefix: str) -> int:
    """An exclusive lock on ``PREFIX.lock`` (fcntl.flock), taken without waiting: a second
    prepare into the same prefix fails at once (SystemFailure naming the lock) rather than
    writing beside the first. The lock file stays: removing it would let a third prepare
    lock a new file while the second still holds the old one."""
    path = f"{prefix}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise SystemFailure(f"{path}: cannot open the dataset's lock file: {e.strerror or e}") from None
    import stat

    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SystemFailure(f"{path}: the dataset's lock file is not a regular file")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise SystemFailure(f"{prefix}: another data prepare is writing this dataset (it holds {path}); "
                                "wait for it or choose another --output-prefix") from None
        raise SystemFailure(f"{path}: cannot lock the dataset: {e.strerror or e}") from None
    return fd


def _temp_prefix(prefix: str, pid: int | str) -> str:
    # a dot name in the target's folder (rename within one file system), which no
    # data.paths entry names: a temporary left by a killed prepare is never read as a dataset
    folder, base = os.path.split(prefix)
    return os.path.join(folder, f".{base}.tmp-{pid}")


def _remove(*paths: str) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
        except OSError:
            pass  # best effort: what is left is a dot file no dataset path names


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _commit(tmp: str, prefix: str) -> None:
    """Put the complete ``tmp`` pair in place of ``prefix``'s.

    Two renames are never atomic together, so the order is chosen so that no reader can
    pair a new ``.idx`` with an old ``.bin`` or the other way round: megatron-core takes a
    dataset to exist only when its ``.idx`` does (the index is read first and says where
    every document lies in the ``.bin``). So the old ``.idx`` goes first (the prefix then
    reads as no dataset), then the new ``.bin`` replaces the old one, and the new ``.idx``
    comes last, when the ``.bin`` it describes is already in place. A crash in between
    leaves a ``.bin`` with no ``.idx``: no dataset, never a mismatched one."""
    for ext in (".bin", ".idx"):
        _fsync(tmp + ext)
    _remove(prefix + ".idx")
    os.replace(tmp + ".bin", prefix + ".bin")
    os.replace(tmp + ".idx", prefix + ".idx")
    try:
        _fsync(os.path.dirname(os.path.abspath(prefix)))
    except OSError:
        pass  # some file systems refuse fsync on a folder; the renames are done either way


def prepare(inputs: Sequence[str], output_prefix: str, tokenizer: LocalTokenizer, *, json_key: str = "text",
            append_eod: bool = True, overwrite: bool = False) -> PreparedData:
    """Encode every document of ``inputs`` and write ``{output_prefix}_text_document.bin/.idx``.

    Written under a temporary name and renamed into place when complete (an existing dataset
    is untouched by any failure); an existing dataset is replaced only with ``overwrite``."""
    prefix = f"{output_prefix}_{json_key}_document"
    folder = os.path.dirname(os.path.abspath(prefix))
    _refuse_output_in_inputs(inputs, folder)
    _input_files(inputs)  # a missing input is named before anything is created
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise SystemFailure(f"{folder}: cannot create the output folder: {e.strerror or e}") from None
    lock = _lock(prefix)
    try:
        # every writer holds the lock, so any temporary of this prefix now is a killed one's
        stale = glob.glob(glob.escape(_temp_prefix(prefix, "")) + "*")
        _remove(*(p for p in stale if p.endswith((".bin", ".idx"))))
        if not overwrite and (os.path.lexists(prefix + ".bin") or os.path.lexists(prefix + ".idx")):
            raise SpecError("a dataset is already there; give --overwrite to replace it", field="--output-prefix",
                            found=prefix)
        tmp = _temp_prefix(prefix, os.getpid())
        try:
            n_docs, n_tokens, dtype = _write(inputs, tmp, tokenizer, json_key=json_key, append_eod=append_eod)
            _commit(tmp, prefix)
        except OSError as e:
            raise SystemFailure(f"{prefix}: cannot write the dataset: {e.strerror or e}") from None
        finally:
            _remove(tmp + ".bin", tmp + ".idx")
    finally:
        os.close(lock)
    return PreparedData(prefix=prefix, num_documents=n_docs, num_tokens=n_tokens, vocab_size=tokenizer.vocab_size,
                        dtype=dtype)


def _write(inputs: Sequence[str], tmp: str, tokenizer: LocalTokenizer, *, json_key: str,
           append_eod: bool) -> tuple[int, int, str]:
    """Tokenise ``inputs`` into ``tmp.bin/.idx``: documents, tokens and the token type's name."""
    import numpy as np

    DType, IndexedDatasetBuilder = _import_builder()
    dtype = DType.optimal_dtype(tokenizer.vocab_size)
    n_docs = n_tokens = 0
    builder = IndexedDatasetBuilder(f"{tmp}.bin", dtype=dtype)
    try:
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
        builder.finalize(f"{tmp}.idx")
    finally:
        builder.data_file.close()
    return n_docs, n_tokens, np.dtype(dtype).name
