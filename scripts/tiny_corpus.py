"""A tiny corpus and a byte-level BPE tokenizer trained on it, for trying 'memx-hpc data
prepare' and a real training run on this machine (docs/training.md).

    .venv/bin/python scripts/tiny_corpus.py memx-local

writes memx-local/corpus.jsonl and memx-local/tokenizer/ (tokenizer.json and
tokenizer_config.json, the folder Hugging Face's AutoTokenizer and memx-hpc both read).
Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TEXTS = ["The quick brown fox jumps over the lazy dog.", "A stitch in time saves nine!",
         "Pipeline stages on two vendors' GPUs, talking over UCC.", "It's 12 o'clock; we'll train 3.5 models."]


def main(out: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    root = Path(out)
    (root / "tokenizer").mkdir(parents=True, exist_ok=True)
    with (root / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for i in range(400):
            f.write(json.dumps({"text": f"{TEXTS[i % len(TEXTS)]} Document {i}."}) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS * 20, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(root / "tokenizer" / "tokenizer.json"))
    (root / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}))
    print(f"wrote {root / 'corpus.jsonl'} and {root / 'tokenizer'}/")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", default="memx-local",
                        help="folder for corpus.jsonl and tokenizer/ (default: memx-local)")
    main(parser.parse_args().out)
