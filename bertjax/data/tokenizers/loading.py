"""`load_tokenizer`: the kind of a tokenizer folder from its files, and the tokenizer."""

from __future__ import annotations

import json
import logging
import os
import pathlib

import sentencepiece as spm
import tokenizers as hf_tokenizers

from bertjax.core import errors
from bertjax.data.tokenizers.base import (BERT_SPECIALS, BPE_MERGES, BPE_VOCAB, CONFIG_FILE, KINDS,
                                          KIND_FILES, SETTINGS_FILES, SPECIAL_TOKENS_MAP,
                                          TOKENIZER_JSON, Tokenizer, WORDPIECE_VOCAB,
                                          expected_files, kind_files)
from bertjax.data.tokenizers.spm_tokenizer import SentencePieceTokenizer
from bertjax.data.tokenizers.vocab_tokenizers import (ByteLevelBPETokenizer, JsonTokenizer,
                                                      WordPieceTokenizer)

_log = logging.getLogger("bertjax.data.tokenizers")  # not __name__: that is __main__ under -m


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


def _hf_specials(directory: pathlib.Path, config: dict) -> dict[str, str] | None:
  """The special tokens a transformers folder names (tokenizer_config.json, else
  special_tokens_map.json: "cls_token": "[CLS]" or {"content": "[CLS]", ...}); None if it names
  not all five."""
  for source in (config, _read_json(directory / SPECIAL_TOKENS_MAP)):
    found = {}
    for name in BERT_SPECIALS:
      value = source.get(f"{name}_token")
      value = value.get("content") if isinstance(value, dict) else value
      if isinstance(value, str):
        found[name] = value
    if len(found) == len(BERT_SPECIALS):
      return found
  return None


def _read_json(path: pathlib.Path) -> dict:
  try:
    value = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
  except (ValueError, UnicodeDecodeError) as e:
    errors.fail(f"{path} is not valid JSON ({e}); fix or delete it")
  return value if isinstance(value, dict) else {}


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
  """Loads the tokenizer stored in `directory`, detecting its kind from the files.

  The files are base.KIND_FILES' (ours and transformers' names): spm.model or spiece.model ->
  sentencepiece; vocab.json + merges.txt -> byte-level BPE; vocab.txt -> WordPiece;
  tokenizer.json alone (ModernBERT's folders) -> its whole `tokenizers` pipeline. A transformers
  folder's special tokens are those its tokenizer_config.json or special_tokens_map.json names.
  tokenizer_config.json (written by `Tokenizer.save`, or a transformers one) may name the kind and
  gives `do_lower_case`; without it a WordPiece vocabulary is taken as uncased unless it holds
  upper-case tokens.
  """
  directory = pathlib.Path(directory)
  if not directory.is_dir():
    errors.fail(f"tokenizer folder {directory} does not exist; pass a folder holding "
                f"{expected_files()}")
  config = _read_config(directory)
  kind = config.get("kind")
  if kind is not None and kind not in KINDS:
    errors.fail(f"{directory / CONFIG_FILE} names unknown kind {kind!r}; use one of {KINDS}")
  found = kind_files(directory, kind)
  if found is None and kind is not None:
    errors.fail(f"{directory} is a {kind} tokenizer but lacks {expected_files(kind)}; copy the "
                "file there")
  if found is None:
    errors.fail(f"no tokenizer files in {directory}; expected {expected_files()}")
  kind, files = found

  if kind == "sentencepiece":
    proto = files[0].read_bytes()
    try:
      spm.SentencePieceProcessor(model_proto=proto)
    except RuntimeError as e:
      errors.fail(f"{files[0]} is not a sentencepiece model ({e}); re-train it")
    specials = config.get("specials") or _hf_specials(directory, config)
    tok = SentencePieceTokenizer(proto, specials=specials)
    # Lower-casing is the model's own normalizer's when bertjax trained it (transformers'
    # tokenizer_config.json then says do_lower_case=False: nothing to do before it).
    tok.lowercase = bool(config.get("do_lower_case", False)) or tok.folds_case()
    return tok
  if kind == "json":
    return JsonTokenizer(directory / TOKENIZER_JSON, config.get("specials") or _hf_specials(
        directory, config))
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


def load_checked(directory: str | os.PathLike, again: str = "copy it again") -> Tokenizer:
  """`load_tokenizer`, after reading every tokenizer file the folder holds (base.TOKENIZER_FILES),
  not only the ones it loads from: transformers reads a tokenizer.json before a vocab.txt beside
  it, so a truncated one there is refused too. `again`: the fix named for a damaged file."""
  directory = pathlib.Path(directory)

  def damaged(path: pathlib.Path, e: BaseException) -> None:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    errors.fail(f"cannot read {path} ({first}); it is damaged or truncated: {again}")

  for name in SETTINGS_FILES + (TOKENIZER_JSON,):
    path = directory / name
    if not path.is_file():
      continue
    try:
      if name == TOKENIZER_JSON:
        hf_tokenizers.Tokenizer.from_file(str(path))
      else:
        json.loads(path.read_text(encoding="utf-8"))
    except Exception as e:  # pylint: disable=broad-except  (the Rust reader's plain Exception)
      damaged(path, e)
  for names in KIND_FILES["sentencepiece"]:
    path = directory / names[0]
    if path.is_file():
      try:
        spm.SentencePieceProcessor(model_proto=path.read_bytes())
      except RuntimeError as e:
        damaged(path, e)
  return load_tokenizer(directory)
