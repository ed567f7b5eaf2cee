"""Tokenizers from local files, as Megatron-LM's ``build_tokenizer`` defines them.

What ``memx-hpc data prepare`` encodes a corpus with and what the project's entry
(:mod:`memx_hpc.train.pretrain_gpt`) sizes its vocabulary and end-of-document token
from. Each kind follows the class of Megatron-LM core_r0.16.0
(``megatron/training/tokenizer/tokenizer.py``) in its vocabulary size, end-of-document id
and how a text becomes ids, so data prepared here trains the same under Megatron-LM's
``pretrain_gpt.py`` (single-vendor plans) and the project's entry (cross-vendor plans):

* ``HuggingFaceTokenizer``: a ``tokenizer.json`` file, or a folder holding one (with its
  ``tokenizer_config.json``, which names the end-of-sequence token; Megatron-LM opens the
  folder with ``transformers.AutoTokenizer``). Read with the ``tokenizers`` package.
  Ids: ``encode(text)`` with the tokenizer's own special tokens (``tokenizer(text).input_ids``).
* ``GPT2BPETokenizer``: GPT-2's ``vocab.json`` + ``merges.txt`` (byte-level BPE, GPT-2's
  pre-tokenising pattern); end of document ``<|endoftext|>``.
* ``GPTSentencePieceTokenizer`` / ``Llama2Tokenizer``: a SentencePiece ``.model``; end of
  document is its EOS id; Llama2Tokenizer puts BOS before every document.
* ``NullTokenizer``: pre-tokenised data; ``vocab_size`` ids plus one end-of-document id.

Nothing is downloaded: a name that is not a local file is an error naming the field.
Megatron-LM's ``SentencePieceTokenizer`` (extra special tokens appended to the vocabulary)
and ``TikTokenizer`` are not built here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import SpecError

__all__ = ["LocalTokenizer", "load_tokenizer", "BUILT_HERE"]

BUILT_HERE = ("NullTokenizer", "HuggingFaceTokenizer", "GPT2BPETokenizer", "GPTSentencePieceTokenizer",
              "Llama2Tokenizer")
# end-of-sequence names tried, in order, when a bare tokenizer.json comes without its config
_EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[SEP]")


@dataclass(frozen=True, kw_only=True)
class LocalTokenizer:
    """What training and data preparation need of a tokenizer (Megatron-LM's attribute names)."""

    kind: str
    vocab_size: int  # Megatron-LM's tokenizer.vocab_size, before padding
    eod: int
    pad: int
    encode: Callable[[str], list[int]]

    @property
    def unique_identifiers(self) -> dict[str, Any]:
        # what megatron-core's GPTDataset puts into its cache key
        return {"class": self.kind, "vocab_size": self.vocab_size, "eod": self.eod}


#: The largest tokenizer file read (the largest published tokenizer.json files are ~20 MB)
MAX_TOKENIZER_FILE_BYTES = 256 * 2**20


def _read_text(path: str, field: str, what: str) -> str:
    """The UTF-8 text of a tokenizer file, read no further than :data:`MAX_TOKENIZER_FILE_BYTES`;
    SpecError naming the file otherwise."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TOKENIZER_FILE_BYTES + 1)
    except OSError as e:
        raise SpecError(f"cannot read {what}: {e.strerror or e}", field=field, found=path) from None
    if len(raw) > MAX_TOKENIZER_FILE_BYTES:
        raise SpecError(f"{what} is over {MAX_TOKENIZER_FILE_BYTES // 2**20} MiB: not a tokenizer file", field=field,
                        found=path)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"{what} is not UTF-8 text ({e.reason} at byte {e.start})", field=field,
                        found=path) from None


def _read_json_object(path: str, field: str, what: str) -> dict:
    """A tokenizer JSON file that must hold an object; SpecError naming the file otherwise."""
    text = _read_text(path, field, what)
    try:
        data = json.loads(text)
    except ValueError as e:
        raise SpecError(f"{what} is not JSON ({e})", field=field, found=path) from None
    if not isinstance(data, dict):
        raise SpecError(f"{what} should hold a JSON object, not a {type(data).__name__}", field=field, found=path)
    return data


def _need(value: str | None, field: str, what: str) -> str:
    if not value:
        raise SpecError(f"this tokenizer needs {what}", field=field)
    if not os.path.exists(value):
        raise SpecError(f"{what} is not a local file or folder (nothing is downloaded)", field=field, found=value)
    return value


def _import(name: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise SpecError(f"the Python package '{name}' is missing: pip install '{extra}'") from None


def load_tokenizer(kind: str, *, model: str | None = None, vocab_file: str | None = None,
                   merge_file: str | None = None, vocab_size: int | None = None) -> LocalTokenizer:
    """The tokenizer of ``kind`` from local files (Megatron-LM's ``--tokenizer-model``,
    ``--vocab-file``, ``--merge-file``; ``--vocab-size`` for the NullTokenizer)."""
    if kind == "NullTokenizer":
        if vocab_size is None:
            raise SpecError("the NullTokenizer needs the vocabulary size", field="vocab_size")
        return LocalTokenizer(kind=kind, vocab_size=vocab_size + 1, eod=vocab_size, pad=-1,
                              encode=lambda text: [int(x) for x in text.split()])
    if kind == "HuggingFaceTokenizer":
        return _huggingface(_need(model, "tokenizer.model", "a tokenizer.json file or a folder with one"))
    if kind == "GPT2BPETokenizer":
        return _gpt2(_need(vocab_file, "tokenizer.vocab_file", "GPT-2's vocab.json"),
                     _need(merge_file, "tokenizer.merge_file", "GPT-2's merges.txt"))
    if kind in ("GPTSentencePieceTokenizer", "Llama2Tokenizer"):
        return _sentencepiece(kind, _need(model, "tokenizer.model", "a SentencePiece .model file"))
    raise SpecError("this tokenizer is not built from local files here", field="tokenizer.type", found=kind,
                    allowed=", ".join(BUILT_HERE))


def _huggingface(path: str) -> LocalTokenizer:
    tokenizers = _import("tokenizers", "memx-hpc[data]")
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise SpecError("the folder holds no tokenizer.json", field="tokenizer.model", found=path)
    _read_json_object(file, "tokenizer.model", "the Hugging Face tokenizer.json")
    try:
        tok = tokenizers.Tokenizer.from_file(file)
    except Exception as e:  # noqa: BLE001 - the library's parse error, named with the file
        raise SpecError(f"not a Hugging Face tokenizer.json: {e}", field="tokenizer.model", found=file) from None
    vocab = tok.get_vocab(with_added_tokens=True)
    eos = None
    config = os.path.join(folder, "tokenizer_config.json")
    if os.path.isfile(config):
        c = _read_json_object(config, "tokenizer.model", "tokenizer_config.json")
        e = c.get("eos_token")
        eos = e.get("content") if isinstance(e, dict) else e
    if eos is None:
        eos = next((n for n in _EOS_NAMES if n in vocab), None)
    if eos is None or eos not in vocab:
        raise SpecError("the tokenizer has no end-of-sequence token (name it as eos_token in tokenizer_config.json "
                        "beside tokenizer.json)", field="tokenizer.model", found=path)
    pad = vocab.get("<pad>", vocab.get("[PAD]", -1))
    return LocalTokenizer(kind="HuggingFaceTokenizer", vocab_size=len(vocab), eod=vocab[eos], pad=pad,
                          encode=lambda text: tok.encode(text).ids)


def _gpt2(vocab_file: str, merge_file: str) -> LocalTokenizer:
    tokenizers = _import("tokenizers", "memx-hpc[data]")
    from tokenizers import decoders, models, pre_tokenizers

    encoder = _read_json_object(vocab_file, "tokenizer.vocab_file", "GPT-2's vocab.json")
    if not all(isinstance(v, int) for v in encoder.values()):
        raise SpecError("GPT-2's vocab.json should map each token to its id (a whole number)",
                        field="tokenizer.vocab_file", found=vocab_file)
    for n, line in enumerate(_read_text(merge_file, "tokenizer.merge_file", "GPT-2's merges.txt").splitlines(), 1):
        if line.strip() and not line.startswith("#version") and len(line.split()) != 2:
            raise SpecError(f"line {n} of GPT-2's merges.txt is not two tokens ({line[:60]!r})",
                            field="tokenizer.merge_file", found=merge_file)
    try:
        bpe = models.BPE.from_file(vocab_file, merge_file)
    except Exception as e:  # noqa: BLE001 - both files read as JSON and pairs above: the merges name unknown tokens
        raise SpecError(f"GPT-2's merges.txt does not fit vocab.json {vocab_file}: {e}", field="tokenizer.merge_file",
                        found=merge_file) from None
    tok = tokenizers.Tokenizer(bpe)
    # GPT-2's byte-to-unicode map and pre-tokenising regex (gpt2_tokenization.py's pattern)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    if "<|endoftext|>" not in encoder:
        raise SpecError("GPT-2's vocabulary has no <|endoftext|> token", field="tokenizer.vocab_file",
                        found=vocab_file)
    return LocalTokenizer(kind="GPT2BPETokenizer", vocab_size=len(encoder), eod=encoder["<|endoftext|>"], pad=-1,
                          encode=lambda text: tok.encode(text, add_special_tokens=False).ids)


def _sentencepiece(kind: str, model_file: str) -> LocalTokenizer:
    spm = _import("sentencepiece", "memx-hpc[data]")
    try:
        sp = spm.SentencePieceProcessor(model_file=model_file)
    except Exception as e:  # noqa: BLE001
        raise SpecError(f"not a SentencePiece model: {e}", field="tokenizer.model", found=model_file) from None
    eos, bos = sp.eos_id(), sp.bos_id()
    if eos < 0:
        raise SpecError("the SentencePiece model has no EOS id", field="tokenizer.model", found=model_file)
    if kind == "Llama2Tokenizer":
        def encode(text: str) -> list[int]:
            return [bos, *sp.encode(text)]
    else:
        def encode(text: str) -> list[int]:
            return list(sp.encode_as_ids(text))
    return LocalTokenizer(kind=kind, vocab_size=sp.vocab_size(), eod=eos, pad=sp.pad_id(), encode=encode)
