"""Tokenizers of released checkpoints read from their vocabulary files with the `tokenizers`
library: BERT's WordPiece (vocab.txt), RoBERTa's byte-level BPE (vocab.json + merges.txt) and a
whole `tokenizers` pipeline in one tokenizer.json (ModernBERT's byte-level BPE)."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Sequence

import tokenizers as hf_tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers

from bertjax.core import errors, paths
from bertjax.data.tokenizers.base import (BERT_SPECIALS, BPE_MERGES, BPE_VOCAB,
                                          BYTE_LEVEL_WORD_STARTS, ROBERTA_SPECIALS, TOKENIZER_JSON,
                                          Tokenizer, WORDPIECE_VOCAB, trim_span)


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
    # BPE includes the leading space in a 'Ġ' token's span, which trim_span removes.
    encoding = self._tok.encode(text, add_special_tokens=False)
    return list(encoding.ids), [trim_span(text, a, b) for a, b in encoding.offsets]

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  def id_to_token(self, token_id: int) -> str:
    return self._tok.id_to_token(int(token_id))

  def token_to_id(self, token: str) -> int | None:
    return self._tok.token_to_id(token)

  def backend(self) -> hf_tokenizers.Tokenizer:
    """A copy of the `tokenizers.Tokenizer` behind this one (for writing tokenizer.json)."""
    return hf_tokenizers.Tokenizer.from_str(self._tok.to_str())


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
      paths.copy_file(self._vocab_file, target)

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
    return token.startswith(BYTE_LEVEL_WORD_STARTS)

  def _save_files(self, directory: pathlib.Path) -> None:
    for src, name in ((self._vocab_file, BPE_VOCAB), (self._merges_file, BPE_MERGES)):
      if (directory / name).resolve() != src.resolve():
        paths.copy_file(src, directory / name)

  def _config(self) -> dict:
    return {"add_prefix_space": self.add_prefix_space}


class JsonTokenizer(_HFTokenizer):
  """A `tokenizers` pipeline saved whole in a tokenizer.json (normalizer, pre-tokenizer, model,
  added tokens), as ModernBERT ships its byte-level BPE with [CLS]/[SEP]/[MASK]/[PAD]. Its own
  post-processor is not used: `encode` adds no special tokens.

  specials: {"pad", "unk", "cls", "sep", "mask"} -> token (by default BERT's [PAD] ... when the
  vocabulary has [CLS], else RoBERTa's <pad> ...).
  """

  kind = "json"

  def __init__(self, path: str | os.PathLike, specials: dict[str, str] | None = None):
    self._path = pathlib.Path(path)
    self.lowercase = False  # any lower-casing is the file's own normalizer's
    try:
      tok = hf_tokenizers.Tokenizer.from_file(str(self._path))
    except Exception as e:  # the Rust reader raises a plain Exception on unreadable files
      errors.fail(f"cannot read {self._path} ({e}); pass a tokenizer.json saved by the "
                  "`tokenizers` library or transformers")
    tok.no_truncation()
    tok.no_padding()
    self._tok = tok
    if not specials:
      specials = BERT_SPECIALS if tok.token_to_id("[CLS]") is not None else ROBERTA_SPECIALS
    unknown = sorted(set(specials) - set(BERT_SPECIALS))
    if unknown or len(specials) != len(BERT_SPECIALS):
      errors.fail(f"the special tokens of {self._path} must name each of "
                  f"{', '.join(BERT_SPECIALS)}; got {', '.join(sorted(specials))}")
    self.specials = dict(specials)
    self._set_special_ids(self.specials, str(self._path))
    self._wordpiece = json.loads(tok.to_str()).get("model", {}).get("type") == "WordPiece"

  def _is_word_start(self, token: str) -> bool:
    if self._wordpiece:
      return not token.startswith("##")
    return token.startswith(BYTE_LEVEL_WORD_STARTS + ("▁",))

  def _save_files(self, directory: pathlib.Path) -> None:
    target = directory / TOKENIZER_JSON
    if not target.exists() or target.resolve() != self._path.resolve():
      paths.copy_file(self._path, target)

  def _config(self) -> dict:
    return {"specials": self.specials}
