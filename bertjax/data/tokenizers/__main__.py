"""python -m bertjax.data.tokenizers train ...: train a sentencepiece vocabulary."""

from __future__ import annotations

import argparse
import logging
from typing import Sequence

from bertjax.core import errors, paths
from bertjax.core.errors import ArgumentParser
from bertjax.data import sources
from bertjax.data.tokenizers.spm_tokenizer import train_sentencepiece

_log = logging.getLogger("bertjax.data.tokenizers")  # not __name__: that is __main__ under -m


def _parser() -> argparse.ArgumentParser:
  parser = ArgumentParser(prog="python -m bertjax.data.tokenizers",
                          description="Train a sentencepiece tokenizer.")
  sub = parser.add_subparsers(dest="command", required=True)
  train = sub.add_parser("train", help="train a sentencepiece vocabulary on text files")
  train.add_argument("--input", action="append", required=True,
                     help="file or glob of text files; repeat for more")
  train.add_argument("--format", default="bert", choices=sources.FORMATS,
                     help="layout of the input files (see bertjax.data.sources)")
  train.add_argument("--output", required=True, help="folder to write the tokenizer to")
  train.add_argument("--vocab_size", type=int, required=True)
  train.add_argument("--model_type", default="unigram", choices=("unigram", "bpe"))
  train.add_argument("--lowercase", action="store_true", help="case-fold the text")
  train.add_argument("--max_sentences", type=int, default=5_000_000,
                     help="sample at most this many sentences")
  return parser


def main(argv: Sequence[str] | None = None) -> None:
  args = _parser().parse_args(argv)
  logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
  logging.getLogger("bertjax").setLevel(logging.INFO)  # ours, not every library's
  paths.check_output_folder(args.output, "--output")
  source = sources.TextFileSource(args.input, format=args.format)
  tokenizer = train_sentencepiece(sources.iter_sentences(source), args.output,
                                  vocab_size=args.vocab_size, model_type=args.model_type,
                                  lowercase=args.lowercase, max_sentences=args.max_sentences)
  _log.info("wrote %s to %s", tokenizer, args.output)


if __name__ == "__main__":
  errors.run_cli(main)
