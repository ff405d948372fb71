"""`load_tokenizer`: the kind of a tokenizer folder from its files, and the tokenizer."""

from __future__ import annotations

import json
import logging
import os
import pathlib

import sentencepiece as spm

from bertjax.core import errors
from bertjax.data.tokenizers.base import (BERT_SPECIALS, BPE_MERGES, BPE_VOCAB, CONFIG_FILE, KINDS,
                                          SPM_FILE, TOKENIZER_JSON, Tokenizer, WORDPIECE_VOCAB)
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
  for source in (config, _read_json(directory / "special_tokens_map.json")):
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

  spm.model -> sentencepiece; vocab.json + merges.txt -> byte-level BPE; vocab.txt -> WordPiece;
  tokenizer.json alone (ModernBERT's folders) -> its whole `tokenizers` pipeline, with the
  special tokens its tokenizer_config.json or special_tokens_map.json names.
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
    elif (directory / TOKENIZER_JSON).exists():
      kind = "json"
    else:
      errors.fail(f"no tokenizer files in {directory}; expected spm.model, vocab.txt, "
                  "vocab.json + merges.txt or tokenizer.json")
  if kind not in KINDS:
    errors.fail(f"{directory / CONFIG_FILE} names unknown kind {kind!r}; use one of {KINDS}")
  needed = {"sentencepiece": [SPM_FILE], "wordpiece": [WORDPIECE_VOCAB],
            "bpe": [BPE_VOCAB, BPE_MERGES], "json": [TOKENIZER_JSON]}[kind]
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
