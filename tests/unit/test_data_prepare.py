"""``memx-hpc data prepare``: a corpus to Megatron's .bin/.idx with tokenizers built here
from a tiny corpus (nothing downloaded), read back by megatron-core's IndexedDataset; the
GPT-2 BPE ids match Megatron-LM's own GPT-2 tokenizer on the same files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from memx_hpc.cli.main import main
from memx_hpc.datapaths import shared_data
from memx_hpc.errors import SpecError
from memx_hpc.train.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["The quick brown fox jumps over the lazy dog.", "A stitch in time saves nine!",
         "Pipeline stages on two vendors' GPUs, talking over UCC.", "It's 12 o'clock; we'll train 3.5 models."]


def corpus(tmp: Path, n: int = 40) -> Path:
    path = tmp / "corpus.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"text": f"{TEXTS[i % len(TEXTS)]} Document {i}."}) + "\n")
    return path


def hf_tokenizer(tmp: Path, vocab_size: int = 300) -> Path:
    """A byte-level BPE tokenizer trained on the test texts, saved as a Hugging Face folder."""
    import tokenizers  # the data extra (scripts/install.sh installs it)
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS * 20, trainer)
    folder = tmp / "hf-tokenizer"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                              "eos_token": "<|endoftext|>"}))
    return folder


def gpt2_files(tmp: Path) -> tuple[Path, Path]:
    """GPT-2 style vocab.json + merges.txt of the same trained BPE."""
    folder = hf_tokenizer(tmp)
    model = json.loads((folder / "tokenizer.json").read_text())["model"]
    vocab = tmp / "vocab.json"
    vocab.write_text(json.dumps(model["vocab"]))
    merges = tmp / "merges.txt"
    lines = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    merges.write_text("#version: 0.2\n" + "\n".join(lines) + "\n")
    return vocab, merges


def test_prepare_with_a_local_hugging_face_tokenizer(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    tok_dir = hf_tokenizer(tmp_path)
    src = corpus(tmp_path)
    rc = main(["data", "prepare", "--input", str(src), "--output-prefix", str(tmp_path / "out" / "corpus"),
               "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tok_dir), "--json"])
    assert rc == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    prefix = tmp_path / "out" / "corpus_text_document"
    assert out["prefix"] == str(prefix) and out["documents"] == 40
    assert out["data"]["tokenizer"] == {"type": "HuggingFaceTokenizer", "model": str(tok_dir)}
    ds = IndexedDataset(str(prefix))
    tok = load_tokenizer("HuggingFaceTokenizer", model=str(tok_dir))
    assert len(ds) == 40 and sum(len(ds[i]) for i in range(len(ds))) == out["tokens"]
    first = list(ds[0])
    assert first[-1] == tok.eod and first[:-1] == tok.encode(json.loads(src.read_text().splitlines()[0])["text"])
    assert max(int(ds[i].max()) for i in range(len(ds))) < tok.vocab_size


def test_gpt2_bpe_ids_match_megatron_lms_tokenizer(tmp_path: Path, needs) -> None:
    mlm = (shared_data(required=False) or ROOT.parent / "shared" / "data") / "megatron-lm"
    needs((mlm / "megatron" / "training" / "tokenizer" / "gpt2_tokenization.py").is_file(),
          f"Megatron-LM's source is not at {mlm}", "it is the shared data folder's megatron-lm/")
    vocab, merges = gpt2_files(tmp_path)
    ours = load_tokenizer("GPT2BPETokenizer", vocab_file=str(vocab), merge_file=str(merges))
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "mlm_gpt2_tokenization", mlm / "megatron" / "training" / "tokenizer" / "gpt2_tokenization.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    theirs = mod.GPT2Tokenizer(str(vocab), str(merges), errors="replace", special_tokens=[], max_len=None)
    for text in TEXTS + ["  two  spaces\nand a newline", "ünïcödé ☃"]:
        assert ours.encode(text) == theirs.encode(text), text
    assert ours.eod == theirs.encoder["<|endoftext|>"] and ours.vocab_size == len(theirs.encoder)


def test_sentencepiece_tokenizers(tmp_path: Path) -> None:
    import sentencepiece as spm
    text = tmp_path / "sp.txt"
    text.write_text("\n".join(TEXTS * 30))
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "sp"), vocab_size=60,
                                   model_type="bpe", bos_id=1, eos_id=2, unk_id=0, pad_id=3)
    model = str(tmp_path / "sp.model")
    gpt = load_tokenizer("GPTSentencePieceTokenizer", model=model)
    llama = load_tokenizer("Llama2Tokenizer", model=model)
    assert gpt.vocab_size == llama.vocab_size == 60 and gpt.eod == llama.eod == 2
    assert llama.encode("fox") == [1, *gpt.encode("fox")]  # Llama2Tokenizer puts BOS first


def test_missing_or_remote_tokenizers_are_user_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SpecError) as e:
        load_tokenizer("HuggingFaceTokenizer", model="meta-llama/Llama-2-7b-hf")  # a hub name: not fetched
    assert e.value.field == "tokenizer.model" and "nothing is downloaded" in str(e.value)
    with pytest.raises(SpecError) as e:
        load_tokenizer("TikTokenizer", model=str(tmp_path))
    assert e.value.field == "tokenizer.type"
    rc = main(["data", "prepare", "--input", str(tmp_path / "none.jsonl"), "--output-prefix", str(tmp_path / "x"),
               "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(tmp_path / "v.json"),
               "--merge-file", str(tmp_path / "m.txt")])
    assert rc == 1 and "tokenizer.vocab_file" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"txt": 1}\n')
    rc = main(["data", "prepare", "--input", str(bad), "--output-prefix", str(tmp_path / "x"),
               "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(hf_tokenizer(tmp_path))])
    err = capsys.readouterr().err
    assert rc == 1 and "line 2" in err and "bad.jsonl" in err


# --------------------------------------------------------------------------- nothing a user owns is lost


def _prepare(tmp: Path, tok: Path, src: Path, *extra: str) -> int:
    return main(["data", "prepare", "--input", str(src), "--output-prefix", str(tmp / "out" / "corpus"),
                 "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tok), *extra])


def _dataset(tmp: Path) -> dict[str, bytes]:
    out = tmp / "out"
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.suffix in (".bin", ".idx")}


def test_a_failure_mid_way_leaves_the_existing_dataset_whole(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    tok = hf_tokenizer(tmp_path)
    assert _prepare(tmp_path, tok, corpus(tmp_path)) == 0
    before = _dataset(tmp_path)
    assert set(before) == {"corpus_text_document.bin", "corpus_text_document.idx"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(30)) + "not json\n")
    capsys.readouterr()
    assert _prepare(tmp_path, tok, bad, "--overwrite") == 1
    assert "line 31" in capsys.readouterr().err
    assert _dataset(tmp_path) == before  # no temporary left, the old pair untouched


def test_an_existing_dataset_is_replaced_only_with_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    tok = hf_tokenizer(tmp_path)
    assert _prepare(tmp_path, tok, corpus(tmp_path, n=40)) == 0
    before = _dataset(tmp_path)
    capsys.readouterr()
    assert _prepare(tmp_path, tok, corpus(tmp_path, n=7)) == 1
    err = capsys.readouterr().err
    assert "--overwrite" in err and "corpus_text_document" in err and "Traceback" not in err
    assert _dataset(tmp_path) == before
    assert _prepare(tmp_path, tok, corpus(tmp_path, n=7), "--overwrite") == 0
    assert len(IndexedDataset(str(tmp_path / "out" / "corpus_text_document"))) == 7  # replaced whole
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "corpus_text_document.bin", "corpus_text_document.idx", "corpus_text_document.lock"]


def test_a_second_prepare_into_one_prefix_is_refused_at_once(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    import fcntl
    import os

    tok = hf_tokenizer(tmp_path)
    (tmp_path / "out").mkdir()
    lock = tmp_path / "out" / "corpus_text_document.lock"
    with lock.open("w") as held:  # another prepare holds the prefix
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        capsys.readouterr()
        assert _prepare(tmp_path, tok, corpus(tmp_path), "--overwrite") == 2
    err = capsys.readouterr().err
    assert str(lock) in err and "another data prepare" in err
    assert not any(p.suffix in (".bin", ".idx") for p in (tmp_path / "out").iterdir())
    # a temporary of a killed prepare (kill -9) is no dataset, and the next prepare removes it
    stale = tmp_path / "out" / f".corpus_text_document.tmp-{os.getpid() + 99999}.bin"
    stale.write_bytes(b"half")
    assert _prepare(tmp_path, tok, corpus(tmp_path)) == 0
    assert not stale.exists()


def test_a_document_over_the_limit_is_named_without_reading_it_whole(tmp_path: Path, monkeypatch,
                                                                    capsys: pytest.CaptureFixture) -> None:
    from memx_hpc.train import prepare

    monkeypatch.setattr(prepare, "MAX_DOCUMENT_BYTES", 64)
    tok = hf_tokenizer(tmp_path)
    src = tmp_path / "long.jsonl"
    src.write_text(json.dumps({"text": "short"}) + "\n" + json.dumps({"text": "x" * 200}) + "\n")
    assert _prepare(tmp_path, tok, src) == 1
    err = capsys.readouterr().err
    assert "long.jsonl: line 2" in err and "64 bytes" in err
    text = tmp_path / "book.txt"
    text.write_text("y" * 100)
    assert _prepare(tmp_path, tok, text) == 1
    assert "book.txt" in capsys.readouterr().err
    assert not (tmp_path / "out" / "corpus_text_document.bin").exists()


def test_blank_text_files_are_no_documents(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    tok = hf_tokenizer(tmp_path)
    (tmp_path / "empty.txt").write_text("")
    assert _prepare(tmp_path, tok, tmp_path / "empty.txt") == 1
    assert "holds no text" in capsys.readouterr().err


def test_import_prints_no_megatron_warnings(tmp_path: Path) -> None:
    import os
    import subprocess

    tok = hf_tokenizer(tmp_path)
    src = corpus(tmp_path)
    r = subprocess.run([sys.executable, "-m", "memx_hpc", "data", "prepare", "--input", str(src), "--output-prefix",
                        str(tmp_path / "o" / "c"), "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                        str(tok)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert "Transformer Engine" not in r.stderr and "UserWarning" not in r.stderr
