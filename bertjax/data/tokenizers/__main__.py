"""python -m bertjax.data.tokenizers train ...: train a sentencepiece vocabulary."""

from __future__ import annotations

import logging
import sys
from typing import Sequence

from absl import flags

from bertjax.core import command_line, errors, paths
from bertjax.data import sources
from bertjax.data.tokenizers.base import TOKENIZER_FILES
from bertjax.data.tokenizers.spm_tokenizer import train_sentencepiece

_log = logging.getLogger("bertjax.data.tokenizers")  # not __name__: that is __main__ under -m

PROG = "python -m bertjax.data.tokenizers"


def _train_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_multi_string("input", None, "file or glob of text files; repeat for more",
                            flag_values=fv)
  flags.DEFINE_enum("format", "bert", sources.FORMATS,
                    "layout of the input files (see bertjax.data.sources)", flag_values=fv)
  flags.DEFINE_string("output", None, "the folder the tokenizer is written in", flag_values=fv)
  flags.DEFINE_integer("vocab_size", None, "pieces in the vocabulary", flag_values=fv)
  flags.DEFINE_enum("model_type", "unigram", ("unigram", "bpe"), "sentencepiece's algorithm",
                    flag_values=fv)
  flags.DEFINE_bool("lowercase", False, "case-fold the text", flag_values=fv)
  flags.DEFINE_integer("max_sentences", 5_000_000, "sample at most this many sentences",
                       flag_values=fv)


def main(argv: Sequence[str] | None = None) -> None:
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] != "train":
    if argv and argv[0] in command_line.HELP_FLAGS:
      print(f"usage: {PROG} train --input=... --output=... --vocab_size=N [--flag=value ...]\n\n"
            "Train a sentencepiece tokenizer.\n\ncommands:\n"
            "  train: train a sentencepiece vocabulary on text files")
      raise SystemExit(0)
    given = f" (not {argv[0]!r})" if argv else ""
    errors.fail(f"give the command train{given}; see {PROG} --help")
  fv, _ = command_line.parse(argv[1:], _train_flags, prog=f"{PROG} train",
                             doc="Train a sentencepiece vocabulary on text files.",
                             required=["input", "output", "vocab_size"])
  logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
  logging.getLogger("bertjax").setLevel(logging.INFO)  # ours, not every library's
  paths.check_output_folder(fv.output, "--output")
  source = sources.TextFileSource(fv.input, format=fv.format)
  # A tokenizer there (a run's workdir/tokenizer: its corpus was made with it) is not replaced.
  held = [n for n in TOKENIZER_FILES if (paths.as_path(fv.output) / n).exists()]
  if held:
    errors.fail(f"--output {fv.output} already holds a tokenizer ({', '.join(held)}), which "
                "this would replace; nothing was written: choose a new folder")
  tokenizer = train_sentencepiece(sources.iter_sentences(source), None,
                                  vocab_size=fv.vocab_size, model_type=fv.model_type,
                                  lowercase=fv.lowercase, max_sentences=fv.max_sentences)
  tokenizer.save(fv.output)
  _log.info("wrote %s to %s", tokenizer, fv.output)


if __name__ == "__main__":
  errors.run_cli(main)
