"""``memx-hpc data prepare``: a text corpus to Megatron's indexed dataset with a local tokenizer."""

from __future__ import annotations

import argparse

from .common import add_json, emit_json

HELP = "prepare training data: a JSONL or text corpus -> Megatron's .bin/.idx with a local tokenizer"

DESCRIPTION = """\
Turn a corpus into Megatron's indexed dataset (.bin/.idx, megatron-core's
IndexedDatasetBuilder), as Megatron-LM's tools/preprocess_data.py does: one document
per line of a .jsonl file (its "text" key) or per other text file, tokenised with the
tokenizer you name, end-of-document appended. Every plan trains on the result, under
Megatron-LM's pretrain_gpt.py and the project's cross-vendor entry alike.

The tokenizer comes from local files (nothing is downloaded):
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR_OR_tokenizer.json
  --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json --merge-file merges.txt
  --tokenizer-type GPTSentencePieceTokenizer|Llama2Tokenizer --tokenizer-model spm.model

It prints the data: section to put into the job file. The dataset is written under a
temporary name and moved into place when complete, so a failed or interrupted run
leaves an existing dataset as it was; replacing one needs --overwrite. A document (a
JSON line or a text file) holds at most 8 MiB of text.

examples:
  memx-hpc data prepare --input corpus.jsonl --output-prefix data/corpus \\
      --tokenizer-type HuggingFaceTokenizer --tokenizer-model tokenizer/
  memx-hpc data prepare --input texts/ --output-prefix data/books \\
      --tokenizer-type GPT2BPETokenizer --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("data", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    ds = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    q = ds.add_parser("prepare", help="tokenise a corpus into .bin/.idx", description=DESCRIPTION,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    q.add_argument("--input", action="append", required=True, metavar="PATH",
                   help=".jsonl/.json (one JSON object per line), text files, or folders of them (repeat)")
    q.add_argument("--output-prefix", required=True, metavar="PREFIX",
                   help="writes PREFIX_text_document.bin and .idx")
    q.add_argument("--tokenizer-type", required=True, metavar="TYPE",
                   help="HuggingFaceTokenizer, GPT2BPETokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer")
    q.add_argument("--tokenizer-model", metavar="PATH", help="tokenizer.json or its folder; a SentencePiece .model")
    q.add_argument("--vocab-file", metavar="PATH", help="GPT-2 BPE vocab.json")
    q.add_argument("--merge-file", metavar="PATH", help="GPT-2 BPE merges.txt")
    q.add_argument("--json-key", default="text", help="the key of a JSON line that holds the text (default: text)")
    q.add_argument("--overwrite", action="store_true",
                   help="replace the dataset already at PREFIX_text_document (kept whole until the new one is "
                        "complete)")
    q.add_argument("--no-append-eod", action="store_true", help="do not end each document with the EOD token")
    add_json(q)
    return p


def run(args: argparse.Namespace) -> int:
    from ..errors import SpecError
    from ..planner import DataRequest, prepare_data

    if args.data_command != "prepare":
        raise SpecError("name a data subcommand", field="data", allowed="prepare")
    out = prepare_data(DataRequest(inputs=args.input, output_prefix=args.output_prefix,
                                   tokenizer_type=args.tokenizer_type, tokenizer_model=args.tokenizer_model,
                                   vocab_file=args.vocab_file, merge_file=args.merge_file, json_key=args.json_key,
                                   append_eod=not args.no_append_eod, overwrite=args.overwrite))
    tokenizer = {"type": args.tokenizer_type}
    for key, value in (("model", args.tokenizer_model), ("vocab_file", args.vocab_file),
                       ("merge_file", args.merge_file)):
        if value:
            tokenizer[key] = value
    if args.json:
        emit_json({"prefix": out.prefix, "documents": out.num_documents, "tokens": out.num_tokens,
                   "vocab_size": out.vocab_size, "dtype": out.dtype, "data": {"paths": [out.prefix],
                                                                             "tokenizer": tokenizer}})
        return 0
    print(f"wrote {out.prefix}.bin and .idx: {out.num_documents} documents, {out.num_tokens} tokens "
          f"({out.dtype}, vocabulary {out.vocab_size})")
    print("in the job file:")
    print("data:")
    print(f"  paths: [{out.prefix}]")
    print("  tokenizer:")
    for key, value in tokenizer.items():
        print(f"    {key}: {value}")
    print("  split: 98,2,0")
    return 0
