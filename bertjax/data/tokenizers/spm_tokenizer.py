"""SentencePiece tokenizers: loading spm.model and training one on a corpus."""

from __future__ import annotations

import logging
import os
import pathlib
import re
import threading
from typing import Iterable, Iterator, Sequence

import sentencepiece as spm

from bertjax.core import errors, paths
from bertjax.data.tokenizers.base import (SPM_FILE, SPM_SPECIALS, Tokenizer, byte_to_char_index,
                                          trim_span)

# sentencepiece's messages for a vocabulary size the corpus cannot fill or needs more than.
_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")
# sentencepiece's default: longer sentences (in UTF-8 bytes) are left out of its training.
MAX_SENTENCE_BYTES = 4192


class SentencePieceTokenizer(Tokenizer):
  """A sentencepiece model (unigram or BPE) whose ids 0..4 are [PAD] [UNK] [CLS] [SEP] [MASK]
  (a transformers model's may name other pieces: `specials`, {"pad", "unk", "cls", "sep",
  "mask"} -> piece, as its tokenizer_config.json does)."""

  kind = "sentencepiece"

  def __init__(self, model_proto: bytes, lowercase: bool = False,
               specials: dict[str, str] | None = None):
    self._proto = model_proto
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self.lowercase = lowercase
    default = dict(zip(("pad", "unk", "cls", "sep", "mask"), SPM_SPECIALS))
    self.specials = {**default, **(specials or {})}
    ids = {}
    for name, piece in self.specials.items():
      i = self._sp.piece_to_id(piece)
      # piece_to_id answers unk_id for unknown pieces, so check the piece really is there.
      if self._sp.id_to_piece(i) != piece:
        errors.fail(f"sentencepiece model has no {piece} piece; train it with "
                    "`python -m bertjax.data.tokenizers train` so ids 0..4 are the specials")
      ids[name] = i
    self.pad_id, self.unk_id = ids["pad"], ids["unk"]
    self.cls_id, self.sep_id, self.mask_id = ids["cls"], ids["sep"], ids["mask"]

  def folds_case(self) -> bool:
    """Whether the model's own normalizer lower-cases (trained with `lowercase`)."""
    return self._sp.normalize("A") == self._sp.normalize("a")

  def __getstate__(self) -> dict:
    # The processor is a C++ object; rebuild it from the serialized model instead of pickling it.
    return {"proto": self._proto, "lowercase": self.lowercase, "specials": self.specials}

  def __setstate__(self, state: dict) -> None:
    self.__init__(state["proto"], state["lowercase"], state.get("specials"))

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text, out_type=int)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return self._sp.encode(list(texts), out_type=int)

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    # The proto's pieces carry begin/end as UTF-8 byte offsets into the original input
    # (sentencepiece tracks them through its normalizer); map them to character offsets.
    proto = self._sp.encode(text, return_type="proto")
    byte_to_char = byte_to_char_index(text)
    ids, offsets = [], []
    for piece in proto.pieces:
      ids.append(int(piece.id))
      offsets.append(trim_span(text, byte_to_char[piece.begin], byte_to_char[piece.end]))
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
    paths.replace_bytes(directory / SPM_FILE, self._proto)

  def _config(self) -> dict:
    default = dict(zip(("pad", "unk", "cls", "sep", "mask"), SPM_SPECIALS))
    return {} if self.specials == default else {"specials": self.specials}


def train_sentencepiece(sentences: Iterable[str], output_dir: str | os.PathLike | None,
                        vocab_size: int, model_type: str = "unigram", lowercase: bool = False,
                        character_coverage: float = 0.9995, max_sentences: int = 5_000_000,
                        seed: int = 0, num_threads: int | None = None,
                        flag: str = "--vocab_size") -> SentencePieceTokenizer:
  """Trains a sentencepiece model on `sentences` with [PAD] [UNK] [CLS] [SEP] [MASK] as ids 0..4.

  At most `max_sentences` sentences are sampled (uniformly) so huge corpora fit in memory.
  `lowercase` uses sentencepiece's case-folding normalizer, stored in the model itself. Saves to
  `output_dir` when given. `flag` is the setting the caller's user gives `vocab_size` with, named
  in the errors (the training config's is --config.data.vocab_size).
  """
  if model_type not in ("unigram", "bpe"):
    errors.fail(f"unknown sentencepiece model type {model_type!r}; use unigram or bpe")
  if vocab_size <= len(SPM_SPECIALS):
    errors.fail(f"{flag} {vocab_size} is too small; use at least a few hundred")
  counter = _SentenceCounter(sentences)
  writer = _BytesWriter()
  # A fixed seed makes the sentence sampling, hence the vocabulary, reproducible.
  spm.set_random_generator_seed(seed)
  try:
    _beside_the_main_thread(lambda: spm.SentencePieceTrainer.train(
        sentence_iterator=iter(counter), model_writer=writer, vocab_size=vocab_size,
        model_type=model_type, character_coverage=character_coverage,
        input_sentence_size=max_sentences, shuffle_input_sentence=True,
        normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
        pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, pad_piece=SPM_SPECIALS[0],
        unk_piece=SPM_SPECIALS[1], control_symbols=list(SPM_SPECIALS[2:]),
        num_threads=num_threads or os.cpu_count() or 1, minloglevel=2,
        max_sentence_length=MAX_SENTENCE_BYTES))
  except RuntimeError as e:
    if counter.error is not None:  # a SIGTERM, Ctrl-C or an unreadable corpus while it read
      raise counter.error from None
    if counter.too_long:  # what it trained on was too little: the long ones are the cause
      errors.fail(counter.too_long_problem() + "; split the text into lines (one sentence or "
                  "paragraph each, --format bert or doc_per_line) before training a tokenizer")
    message = str(e)
    if m := _TOO_HIGH.search(message):
      errors.fail(f"{flag} {m.group(1)} is larger than this corpus supports; use a smaller "
                  f"{flag} (at most {m.group(2)}) or more text")
    if m := _TOO_LOW.search(message):
      errors.fail(f"{flag} {m.group(1)} cannot hold the corpus's {m.group(2)} required "
                  f"characters and specials; use a larger {flag}")
    if counter.count == 0:
      errors.fail("no sentences to train the tokenizer on; check the --input files")
    errors.fail(f"sentencepiece training failed: {message.splitlines()[0]}")
  if counter.count == 0:
    errors.fail("no sentences to train the tokenizer on; check the --input files")
  if counter.too_long:
    logging.warning("%s; the tokenizer was trained on the others", counter.too_long_problem())
  tokenizer = SentencePieceTokenizer(writer.getvalue(), lowercase=lowercase)
  if output_dir is not None:
    tokenizer.save(output_dir)
  return tokenizer


def _beside_the_main_thread(work) -> None:
  """Runs `work` in a thread of its own while the main thread waits for it in short joins, and
  raises what it raised. sentencepiece trains in C++ (without the GIL): called from the main
  thread, the process's signal handlers would wait for it to finish (a SIGTERM held for the whole
  training); waiting in joins, they run at once, and a preemption ends the process while the
  training thread (a daemon) is dropped with it."""
  raised = []

  def run():
    try:
      work()
    except BaseException as e:  # pylint: disable=broad-except  # handed to the caller's thread
      raised.append(e)
  thread = threading.Thread(target=run, name="sentencepiece-training", daemon=True)
  thread.start()
  while thread.is_alive():
    thread.join(0.1)
  if raised:
    raise raised[0]


class _SentenceCounter:
  """Iterates non-empty sentences, counting them (sentencepiece rejects empty ones)."""

  def __init__(self, sentences: Iterable[str]):
    self._sentences = sentences
    self.count = 0
    self.error: BaseException | None = None  # raised while reading the sentences
    self.too_long = 0    # sentences sentencepiece leaves out (over MAX_SENTENCE_BYTES)
    self.longest = 0     # bytes

  def __iter__(self) -> Iterator[str]:
    try:
      for s in self._sentences:
        s = s.strip()
        if s:
          self.count += 1
          if len(s) * 4 > MAX_SENTENCE_BYTES:  # at most 4 UTF-8 bytes a character
            size = len(s.encode("utf-8"))
            self.longest = max(self.longest, size)
            self.too_long += size > MAX_SENTENCE_BYTES
          yield s
    except BaseException as e:  # pylint: disable=broad-except
      # sentencepiece turns an error raised while it reads into its own RuntimeError ("INTERNAL:
      # Preempted" for a SIGTERM, exit 75): kept to be raised as it was.
      self.error = e
      raise


  def too_long_problem(self) -> str:
    every = self.too_long == self.count
    share = ("every sentence of the corpus is" if every else
             f"{self.too_long:,} of the {self.count:,} sentences of the corpus "
             f"{'is' if self.too_long == 1 else 'are'}")
    return (f"{share} longer than {MAX_SENTENCE_BYTES} bytes (the longest: {self.longest:,} "
            "bytes), which sentencepiece does not train on: a line that long has no line breaks "
            "or sentence ends to split at")


class _BytesWriter:
  """The `model_writer` sentencepiece writes the serialized model to."""

  def __init__(self):
    self._chunks: list[bytes] = []

  def write(self, data: bytes) -> None:
    self._chunks.append(data)

  def getvalue(self) -> bytes:
    return b"".join(self._chunks)
