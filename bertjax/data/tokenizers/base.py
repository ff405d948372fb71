"""The tokenizer interface, the file names of a tokenizer folder and the special tokens."""

from __future__ import annotations

import abc
import hashlib
import json
import logging
import os
import pathlib
from typing import Sequence

import numpy as np

from bertjax.core import paths


_log = logging.getLogger("bertjax.data.tokenizers")  # not __name__: that is __main__ under -m


CONFIG_FILE = "tokenizer_config.json"
SPM_FILE = "spm.model"
WORDPIECE_VOCAB = "vocab.txt"
BPE_VOCAB = "vocab.json"
BPE_MERGES = "merges.txt"
TOKENIZER_JSON = "tokenizer.json"

KINDS = ("sentencepiece", "wordpiece", "bpe", "json")

# Every file a tokenizer folder may hold, ours and the names transformers writes for the kinds we
# read: the one table that loading (which kind a folder holds), `convert from-hf` (what it copies)
# and `convert to-hf` (what it writes) share. For each kind, the sets of files that make it, ours
# first; kinds in the order a folder is read when it holds several (a transformers BERT folder
# has vocab.txt and tokenizer.json: its WordPiece vocabulary is read).
HF_SPM_FILE = "spiece.model"  # AlbertTokenizer's name for a sentencepiece model
KIND_FILES: dict[str, tuple[tuple[str, ...], ...]] = {
    "sentencepiece": ((SPM_FILE,), (HF_SPM_FILE,), ("sentencepiece.bpe.model",)),
    "bpe": ((BPE_VOCAB, BPE_MERGES),),
    "wordpiece": ((WORDPIECE_VOCAB,),),
    "json": ((TOKENIZER_JSON,),),
}
# transformers' settings files beside them (ours is tokenizer_config.json with a "kind").
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
SETTINGS_FILES = (CONFIG_FILE, SPECIAL_TOKENS_MAP, "added_tokens.json")
TOKENIZER_FILES = tuple(dict.fromkeys(
    [name for sets in KIND_FILES.values() for names in sets for name in names]
    + list(SETTINGS_FILES)))


def kind_files(directory: str | os.PathLike, kind: str | None = None
               ) -> tuple[str, tuple[pathlib.Path, ...]] | None:
  """(kind, its files) of the first complete set of `kind`'s files (any kind: in KIND_FILES'
  order) in `directory`; None when there is none."""
  directory = pathlib.Path(directory)
  for k in ((kind,) if kind else KIND_FILES):
    for names in KIND_FILES[k]:
      if all((directory / n).is_file() for n in names):
        return k, tuple(directory / n for n in names)
  return None


def expected_files(kind: str | None = None) -> str:
  """The files `kind` (every kind: None) is read from, for messages."""
  sets = [" + ".join(names) for k in ((kind,) if kind else KIND_FILES) for names in KIND_FILES[k]]
  return ", ".join(sets[:-1]) + " or " + sets[-1] if len(sets) > 1 else sets[0]

# The reserved sentencepiece ids, in order: trained models put these at ids 0..4.
SPM_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
BERT_SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
ROBERTA_SPECIALS = {"pad": "<pad>", "unk": "<unk>", "cls": "<s>", "sep": "</s>", "mask": "<mask>"}

# Byte-level BPE spells a leading space as 'Ġ'; a leading newline, tab or carriage return as
# 'Ċ', 'ĉ', 'č'. Any of them means the token starts a new word.
BYTE_LEVEL_WORD_STARTS = ("Ġ", "Ċ", "ĉ", "č")


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

  def fingerprint(self) -> str:
    """A hash of what decides the ids a text gets: kind, casing, settings and every id's token.
    Equal fingerprints: the same vocabulary, id for id (a model trained on one fits the other)."""
    h = hashlib.sha256(json.dumps([self.kind, self.lowercase, self._config()], sort_keys=True,
                                  default=str).encode())
    for i in range(self.vocab_size):
      h.update(self.id_to_token(i).encode("utf-8", "surrogatepass") + b"\n")
    return h.hexdigest()

  def save(self, directory: str | os.PathLike) -> None:
    """Writes the tokenizer into `directory` (created if needed), loadable by `load_tokenizer`."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    self._save_files(directory)
    config = {"kind": self.kind, "do_lower_case": self.lowercase, **self._config()}
    paths.replace_text(directory / CONFIG_FILE, json.dumps(config, indent=2) + "\n")

  def __repr__(self) -> str:
    return (f"{type(self).__name__}(kind={self.kind!r}, vocab_size={self.vocab_size}, "
            f"lowercase={self.lowercase})")


def byte_to_char_index(text: str) -> list[int]:
  """For each UTF-8 byte offset 0..len(bytes) of `text`, the index of the character it falls in.

  Offsets inside a multi-byte character map to that character; len(bytes) maps to len(text).
  """
  out = []
  for i, ch in enumerate(text):
    out.extend([i] * len(ch.encode("utf-8")))
  out.append(len(text))
  return out


def trim_span(text: str, start: int, end: int) -> tuple[int, int]:
  """[start, end) without leading/trailing whitespace; an all-space span becomes empty at end."""
  while start < end and text[start].isspace():
    start += 1
  while end > start and text[end - 1].isspace():
    end -= 1
  return start, end
