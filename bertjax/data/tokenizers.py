"""Tokenizers for BERT-family encoders behind one small interface.

Three kinds, each stored as a folder of its native files plus a small `tokenizer_config.json`:
  sentencepiece  spm.model                 trained here (unigram or BPE) with ids 0..4 reserved for
                                           [PAD] [UNK] [CLS] [SEP] [MASK]
  wordpiece      vocab.txt                 BERT checkpoints (cased or uncased)
  bpe            vocab.json + merges.txt   RoBERTa's byte-level BPE

`load_tokenizer(dir)` detects the kind from the files, so a prepared corpus or a checkpoint
folder carries everything needed to reproduce its token ids. `encode` never adds special tokens:
the pretraining and fine-tuning pipelines place [CLS]/[SEP] themselves.

Command line (train a sentencepiece vocabulary):
  python -m bertjax.data.tokenizers train --input 'corpus/*.txt' --output tok/ \
      --vocab_size 32000 --model_type unigram [--lowercase]
"""

from __future__ import annotations

import abc
import argparse
import json
import logging
import os
import pathlib
import re
import shutil
from typing import Iterable, Iterator, Sequence

import numpy as np
import sentencepiece as spm
import tokenizers as hf_tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers

from bertjax import errors
from bertjax.data import sources

_log = logging.getLogger("bertjax.data.tokenizers")  # not __name__: that is __main__ under -m

CONFIG_FILE = "tokenizer_config.json"
SPM_FILE = "spm.model"
WORDPIECE_VOCAB = "vocab.txt"
BPE_VOCAB = "vocab.json"
BPE_MERGES = "merges.txt"

KINDS = ("sentencepiece", "wordpiece", "bpe")

# The reserved sentencepiece ids, in order: trained models put these at ids 0..4.
SPM_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
BERT_SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
ROBERTA_SPECIALS = {"pad": "<pad>", "unk": "<unk>", "cls": "<s>", "sep": "</s>", "mask": "<mask>"}

# Byte-level BPE spells a leading space as 'Ġ'; a leading newline, tab or carriage return as
# 'Ċ', 'ĉ', 'č'. Any of them means the token starts a new word.
_BYTE_LEVEL_WORD_STARTS = ("Ġ", "Ċ", "ĉ", "č")


class Tokenizer(abc.ABC):
  """Text <-> token ids. `encode` adds no special tokens.

  Attributes:
    kind: one of KINDS.
    lowercase: whether text is lower-cased before tokenization.
    pad_id, unk_id, cls_id, sep_id, mask_id: the special token ids (for RoBERTa: <pad>, <unk>,
      <s>, </s>, <mask>).
  """

  kind: str
  lowercase: bool
  pad_id: int
  unk_id: int
  cls_id: int
  sep_id: int
  mask_id: int

  @abc.abstractmethod
  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without special tokens."""

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """`encode` over many texts; backends override this with a faster batched call."""
    return [self.encode(t) for t in texts]

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of `text` (as `encode`) and each token's `[start, end)` character span in it.

    Spans index the original `text` (before lower-casing or other normalization) and exclude
    surrounding whitespace, so `text[start:end]` is the token's own surface; a token that only
    stands for whitespace (sentencepiece's lone '▁') gets an empty span at its position.
    Extractive QA uses these to map an answer span back to the exact context substring.
    """
    raise NotImplementedError(f"{type(self).__name__} does not give character offsets")

  @abc.abstractmethod
  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """Text of `ids`; special tokens are dropped unless `skip_special_tokens` is False."""

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """Number of ids; every id is in [0, vocab_size)."""

  @abc.abstractmethod
  def id_to_token(self, token_id: int) -> str:
    """The vocabulary entry (piece) of `token_id`."""

  @abc.abstractmethod
  def token_to_id(self, token: str) -> int | None:
    """The id of vocabulary entry `token`, or None when it is not in the vocabulary."""

  @abc.abstractmethod
  def _is_word_start(self, token: str) -> bool:
    """Whether vocabulary entry `token` begins a word (specials are handled by the caller)."""

  @abc.abstractmethod
  def _save_files(self, directory: pathlib.Path) -> None:
    """Writes the backend's native files into `directory`."""

  @abc.abstractmethod
  def _config(self) -> dict:
    """The kind-specific part of tokenizer_config.json."""

  @property
  def special_ids(self) -> tuple[int, ...]:
    """The distinct special token ids, sorted."""
    return tuple(sorted({self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id}))

  def word_start_mask(self) -> np.ndarray:
    """`bool[vocab_size]`: True where a token begins a word, for whole-word masking.

    WordPiece: not '##'-prefixed; sentencepiece: '▁'-prefixed; byte-level BPE: 'Ġ'-prefixed (or
    another spelled-out whitespace byte). Special tokens are True (so an [UNK] inside a word
    splits it, which only matters for sentencepiece). Punctuation glued to a word
    (sentencepiece ',' after '▁word') therefore counts as part of that word. The first token of a
    sentence may lack the prefix (byte-level BPE without a prefix space), so callers should also
    treat the token after a special token as a word start.
    """
    mask = np.fromiter(
        (self._is_word_start(self.id_to_token(i)) for i in range(self.vocab_size)),
        dtype=bool, count=self.vocab_size)
    mask[list(self.special_ids)] = True
    return mask

  def save(self, directory: str | os.PathLike) -> None:
    """Writes the tokenizer into `directory` (created if needed), loadable by `load_tokenizer`."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    self._save_files(directory)
    config = {"kind": self.kind, "do_lower_case": self.lowercase, **self._config()}
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")

  def __repr__(self) -> str:
    return (f"{type(self).__name__}(kind={self.kind!r}, vocab_size={self.vocab_size}, "
            f"lowercase={self.lowercase})")


def _byte_to_char(text: str) -> list[int]:
  """For each UTF-8 byte offset 0..len(bytes) of `text`, the index of the character it falls in.

  Offsets inside a multi-byte character map to that character; len(bytes) maps to len(text).
  """
  out = []
  for i, ch in enumerate(text):
    out.extend([i] * len(ch.encode("utf-8")))
  out.append(len(text))
  return out


def _trim_span(text: str, start: int, end: int) -> tuple[int, int]:
  """[start, end) without leading/trailing whitespace; an all-space span becomes empty at end."""
  while start < end and text[start].isspace():
    start += 1
  while end > start and text[end - 1].isspace():
    end -= 1
  return start, end


class SentencePieceTokenizer(Tokenizer):
  """A sentencepiece model (unigram or BPE) whose ids 0..4 are [PAD] [UNK] [CLS] [SEP] [MASK]."""

  kind = "sentencepiece"

  def __init__(self, model_proto: bytes, lowercase: bool = False):
    self._proto = model_proto
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self.lowercase = lowercase
    ids = {}
    for name, piece in zip(("pad", "unk", "cls", "sep", "mask"), SPM_SPECIALS):
      i = self._sp.piece_to_id(piece)
      # piece_to_id answers unk_id for unknown pieces, so check the piece really is there.
      if self._sp.id_to_piece(i) != piece:
        errors.fail(f"sentencepiece model has no {piece} piece; train it with "
                    "`python -m bertjax.data.tokenizers train` so ids 0..4 are the specials")
      ids[name] = i
    self.pad_id, self.unk_id = ids["pad"], ids["unk"]
    self.cls_id, self.sep_id, self.mask_id = ids["cls"], ids["sep"], ids["mask"]

  def __getstate__(self) -> dict:
    # The processor is a C++ object; rebuild it from the serialized model instead of pickling it.
    return {"proto": self._proto, "lowercase": self.lowercase}

  def __setstate__(self, state: dict) -> None:
    self.__init__(state["proto"], state["lowercase"])

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text, out_type=int)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return self._sp.encode(list(texts), out_type=int)

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    # The proto's pieces carry begin/end as UTF-8 byte offsets into the original input
    # (sentencepiece tracks them through its normalizer); map them to character offsets.
    proto = self._sp.encode(text, return_type="proto")
    byte_to_char = _byte_to_char(text)
    ids, offsets = [], []
    for piece in proto.pieces:
      ids.append(int(piece.id))
      offsets.append(_trim_span(text, byte_to_char[piece.begin], byte_to_char[piece.end]))
    return ids, offsets

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    ids = [int(i) for i in ids]
    # sentencepiece decodes control symbols to nothing; to show them, decode the runs between
    # them and splice the special tokens' text back in.
    specials = set(self.special_ids) - {self.unk_id}
    if skip_special_tokens:
      return self._sp.decode([i for i in ids if i not in specials])
    parts, run = [], []
    for i in ids:
      if i in specials:
        if run:
          parts.append(self._sp.decode(run))
          run = []
        parts.append(self._sp.id_to_piece(i))
      else:
        run.append(i)
    if run:
      parts.append(self._sp.decode(run))
    return " ".join(parts)

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def id_to_token(self, token_id: int) -> str:
    return self._sp.id_to_piece(int(token_id))

  def token_to_id(self, token: str) -> int | None:
    i = self._sp.piece_to_id(token)
    return i if self._sp.id_to_piece(i) == token else None

  def _is_word_start(self, token: str) -> bool:
    return token.startswith("▁")

  def _save_files(self, directory: pathlib.Path) -> None:
    (directory / SPM_FILE).write_bytes(self._proto)

  def _config(self) -> dict:
    return {}


class _HFTokenizer(Tokenizer):
  """Shared code for the kinds backed by a `tokenizers.Tokenizer`."""

  _tok: hf_tokenizers.Tokenizer

  def _set_special_ids(self, names: dict[str, str], where: str) -> None:
    for name, token in names.items():
      i = self._tok.token_to_id(token)
      if i is None:
        errors.fail(f"{where} has no {token} token; use the vocabulary of a BERT-family "
                    "checkpoint that includes its special tokens")
      setattr(self, f"{name}_id", i)

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    # `tokenizers` aligns through its normalizer, so offsets are characters of `text`; byte-level
    # BPE includes the leading space in a 'Ġ' token's span, which _trim_span removes.
    encoding = self._tok.encode(text, add_special_tokens=False)
    return list(encoding.ids), [_trim_span(text, a, b) for a, b in encoding.offsets]

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  def id_to_token(self, token_id: int) -> str:
    return self._tok.id_to_token(int(token_id))

  def token_to_id(self, token: str) -> int | None:
    return self._tok.token_to_id(token)


class WordPieceTokenizer(_HFTokenizer):
  """BERT's WordPiece from a vocab.txt, matching `transformers.BertTokenizer`.

  Uncased models lower-case and strip accents; cased models do neither (as BERT's own code).
  """

  kind = "wordpiece"

  def __init__(self, vocab_file: str | os.PathLike, lowercase: bool = True,
               strip_accents: bool | None = None):
    self._vocab_file = pathlib.Path(vocab_file)
    self.lowercase = lowercase
    # None means "follow lowercase", as in BERT and transformers.
    self.strip_accents = strip_accents
    try:
      model = models.WordPiece.from_file(str(self._vocab_file), unk_token="[UNK]",
                                         max_input_chars_per_word=100)
    except Exception as e:  # the Rust reader raises a plain Exception on unreadable files
      errors.fail(f"cannot read WordPiece vocabulary {self._vocab_file} ({e}); "
                  "pass a vocab.txt with one token per line")
    tok = hf_tokenizers.Tokenizer(model)
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=strip_accents,
        lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    self._tok = tok
    self._set_special_ids(BERT_SPECIALS, str(self._vocab_file))
    # Registered as special so that e.g. "[MASK]" in text maps to its id, as in transformers.
    tok.add_special_tokens([hf_tokenizers.AddedToken(t, normalized=False)
                            for t in BERT_SPECIALS.values()])

  def _is_word_start(self, token: str) -> bool:
    return not token.startswith("##")

  def _save_files(self, directory: pathlib.Path) -> None:
    target = directory / WORDPIECE_VOCAB
    if target.resolve() != self._vocab_file.resolve():
      shutil.copyfile(self._vocab_file, target)

  def _config(self) -> dict:
    return {"strip_accents": self.strip_accents}


class ByteLevelBPETokenizer(_HFTokenizer):
  """RoBERTa's byte-level BPE from vocab.json + merges.txt, matching `RobertaTokenizer`."""

  kind = "bpe"

  def __init__(self, vocab_file: str | os.PathLike, merges_file: str | os.PathLike,
               add_prefix_space: bool = False):
    self._vocab_file = pathlib.Path(vocab_file)
    self._merges_file = pathlib.Path(merges_file)
    self.lowercase = False
    self.add_prefix_space = add_prefix_space
    try:
      model = models.BPE.from_file(str(self._vocab_file), str(self._merges_file))
    except Exception as e:  # the Rust reader raises a plain Exception on unreadable files
      errors.fail(f"cannot read byte-level BPE files {self._vocab_file} / {self._merges_file} "
                  f"({e}); pass RoBERTa's vocab.json and merges.txt")
    tok = hf_tokenizers.Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tok.decoder = decoders.ByteLevel()
    self._tok = tok
    self._set_special_ids(ROBERTA_SPECIALS, str(self._vocab_file))
    # As RobertaTokenizer: specials in text map to their ids, and <mask> takes the space before it.
    tok.add_special_tokens([
        hf_tokenizers.AddedToken(t, lstrip=(name == "mask"), rstrip=False, normalized=False)
        for name, t in ROBERTA_SPECIALS.items()])

  def _is_word_start(self, token: str) -> bool:
    return token.startswith(_BYTE_LEVEL_WORD_STARTS)

  def _save_files(self, directory: pathlib.Path) -> None:
    for src, name in ((self._vocab_file, BPE_VOCAB), (self._merges_file, BPE_MERGES)):
      if (directory / name).resolve() != src.resolve():
        shutil.copyfile(src, directory / name)

  def _config(self) -> dict:
    return {"add_prefix_space": self.add_prefix_space}


def _read_config(directory: pathlib.Path) -> dict:
  path = directory / CONFIG_FILE
  if not path.exists():
    return {}
  try:
    config = json.loads(path.read_text(encoding="utf-8"))
  except (ValueError, UnicodeDecodeError) as e:
    errors.fail(f"{path} is not valid JSON ({e}); fix or delete it")
  if not isinstance(config, dict):
    errors.fail(f"{path} must hold a JSON object; fix or delete it")
  return config


def _vocab_has_upper(vocab_file: pathlib.Path) -> bool:
  """Whether a vocab.txt has upper-case tokens other than [SPECIAL] ones (i.e. is cased)."""
  with open(vocab_file, encoding="utf-8", errors="replace") as f:
    for line in f:
      token = line.rstrip("\n")
      if not (token.startswith("[") and token.endswith("]")) and token != token.lower():
        return True
  return False


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
  """Loads the tokenizer stored in `directory`, detecting its kind from the files.

  spm.model -> sentencepiece; vocab.json + merges.txt -> byte-level BPE; vocab.txt -> WordPiece.
  tokenizer_config.json (written by `Tokenizer.save`, or a transformers one) may name the kind and
  gives `do_lower_case`; without it a WordPiece vocabulary is taken as uncased unless it holds
  upper-case tokens.
  """
  directory = pathlib.Path(directory)
  if not directory.is_dir():
    errors.fail(f"tokenizer folder {directory} does not exist; pass a folder holding spm.model, "
                "vocab.txt or vocab.json + merges.txt")
  config = _read_config(directory)
  kind = config.get("kind")
  if kind is None:
    if (directory / SPM_FILE).exists():
      kind = "sentencepiece"
    elif (directory / BPE_VOCAB).exists() and (directory / BPE_MERGES).exists():
      kind = "bpe"
    elif (directory / WORDPIECE_VOCAB).exists():
      kind = "wordpiece"
    else:
      errors.fail(f"no tokenizer files in {directory}; expected spm.model, vocab.txt or "
                  "vocab.json + merges.txt")
  if kind not in KINDS:
    errors.fail(f"{directory / CONFIG_FILE} names unknown kind {kind!r}; use one of {KINDS}")
  needed = {"sentencepiece": [SPM_FILE], "wordpiece": [WORDPIECE_VOCAB],
            "bpe": [BPE_VOCAB, BPE_MERGES]}[kind]
  for name in needed:
    if not (directory / name).exists():
      errors.fail(f"{directory} is a {kind} tokenizer but lacks {name}; copy the file there")

  if kind == "sentencepiece":
    proto = (directory / SPM_FILE).read_bytes()
    try:
      spm.SentencePieceProcessor(model_proto=proto)
    except RuntimeError as e:
      errors.fail(f"{directory / SPM_FILE} is not a sentencepiece model ({e}); re-train it")
    return SentencePieceTokenizer(proto, lowercase=bool(config.get("do_lower_case", False)))
  if kind == "bpe":
    return ByteLevelBPETokenizer(directory / BPE_VOCAB, directory / BPE_MERGES,
                                 add_prefix_space=bool(config.get("add_prefix_space", False)))
  vocab = directory / WORDPIECE_VOCAB
  if "do_lower_case" in config:
    lowercase = bool(config["do_lower_case"])
  else:
    lowercase = not _vocab_has_upper(vocab)
    _log.info("%s has no do_lower_case setting; taking the vocabulary as %s", directory,
                 "uncased" if lowercase else "cased")
  return WordPieceTokenizer(vocab, lowercase=lowercase, strip_accents=config.get("strip_accents"))


_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


def train_sentencepiece(sentences: Iterable[str], output_dir: str | os.PathLike | None,
                        vocab_size: int, model_type: str = "unigram", lowercase: bool = False,
                        character_coverage: float = 0.9995, max_sentences: int = 5_000_000,
                        seed: int = 0, num_threads: int | None = None) -> SentencePieceTokenizer:
  """Trains a sentencepiece model on `sentences` with [PAD] [UNK] [CLS] [SEP] [MASK] as ids 0..4.

  At most `max_sentences` sentences are sampled (uniformly) so huge corpora fit in memory.
  `lowercase` uses sentencepiece's case-folding normalizer, stored in the model itself. Saves to
  `output_dir` when given.
  """
  if model_type not in ("unigram", "bpe"):
    errors.fail(f"unknown sentencepiece model type {model_type!r}; use unigram or bpe")
  if vocab_size <= len(SPM_SPECIALS):
    errors.fail(f"--vocab_size {vocab_size} is too small; use at least a few hundred")
  counter = _SentenceCounter(sentences)
  writer = _BytesWriter()
  # A fixed seed makes the sentence sampling, hence the vocabulary, reproducible.
  spm.set_random_generator_seed(seed)
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(counter), model_writer=writer, vocab_size=vocab_size,
        model_type=model_type, character_coverage=character_coverage,
        input_sentence_size=max_sentences, shuffle_input_sentence=True,
        normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
        pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, pad_piece=SPM_SPECIALS[0],
        unk_piece=SPM_SPECIALS[1], control_symbols=list(SPM_SPECIALS[2:]),
        num_threads=num_threads or os.cpu_count() or 1, minloglevel=2)
  except RuntimeError as e:
    message = str(e)
    if m := _TOO_HIGH.search(message):
      errors.fail(f"--vocab_size {m.group(1)} is larger than this corpus supports; use a smaller "
                  f"--vocab_size (at most {m.group(2)}) or more text")
    if m := _TOO_LOW.search(message):
      errors.fail(f"--vocab_size {m.group(1)} cannot hold the corpus's {m.group(2)} required "
                  "characters and specials; use a larger --vocab_size")
    if counter.count == 0:
      errors.fail("no sentences to train the tokenizer on; check the --input files")
    errors.fail(f"sentencepiece training failed: {message.splitlines()[0]}")
  if counter.count == 0:
    errors.fail("no sentences to train the tokenizer on; check the --input files")
  tokenizer = SentencePieceTokenizer(writer.getvalue(), lowercase=lowercase)
  if output_dir is not None:
    tokenizer.save(output_dir)
  return tokenizer


class _SentenceCounter:
  """Iterates non-empty sentences, counting them (sentencepiece rejects empty ones)."""

  def __init__(self, sentences: Iterable[str]):
    self._sentences = sentences
    self.count = 0

  def __iter__(self) -> Iterator[str]:
    for s in self._sentences:
      s = s.strip()
      if s:
        self.count += 1
        yield s


class _BytesWriter:
  """The `model_writer` sentencepiece writes the serialized model to."""

  def __init__(self):
    self._chunks: list[bytes] = []

  def write(self, data: bytes) -> None:
    self._chunks.append(data)

  def getvalue(self) -> bytes:
    return b"".join(self._chunks)


class ArgumentParser(argparse.ArgumentParser):
  """An ArgumentParser whose usage errors are one-line `UserError`s (exit status 2 via run_cli)."""

  def error(self, message: str):
    errors.fail(f"{message}; see {self.prog} --help")


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
  source = sources.TextFileSource(args.input, format=args.format)
  tokenizer = train_sentencepiece(sources.iter_sentences(source), args.output,
                                  vocab_size=args.vocab_size, model_type=args.model_type,
                                  lowercase=args.lowercase, max_sentences=args.max_sentences)
  _log.info("wrote %s to %s", tokenizer, args.output)


if __name__ == "__main__":
  errors.run_cli(main)
