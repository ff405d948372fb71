"""A workdir's tokenizer as the files `transformers.AutoTokenizer.from_pretrained` reads.

  wordpiece      vocab.txt + tokenizer.json + tokenizer_config.json (BertTokenizer)
  bpe            vocab.json + merges.txt + tokenizer.json + tokenizer_config.json (RobertaTokenizer)
  json           tokenizer.json + tokenizer_config.json (PreTrainedTokenizerFast: ModernBERT's)
  sentencepiece  spiece.model + tokenizer_config.json (AlbertTokenizer; transformers builds its
                 fast tokenizer from the model when loading, which needs sentencepiece and
                 protobuf installed where it loads)

Each adds the special tokens as bertjax's pipelines place them: [CLS] A [SEP] (B [SEP]), with
token types 0 then 1 (RoBERTa: <s> A </s></s> B </s>). A tokenizer folder holding a Hugging Face
checkpoint's own files (copied by `from-hf`, no "kind" in its tokenizer_config.json) is copied
as it is. For ModernBERT (`model_type`), whose models take no token types, the tokenizer's
outputs are input_ids and attention_mask only, so `model(**tokenizer(text))` runs.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from tokenizers import processors

from bertjax.convert.hf_configs import TOKENIZER_FILES
from bertjax.core import paths
from bertjax.core.errors import fail
from bertjax.data import tokenizers


def is_bertjax_tokenizer(src: pathlib.Path) -> bool:
  """Whether `src` was written by `Tokenizer.save` (its config names the kind)."""
  path = src / tokenizers.CONFIG_FILE
  if not path.is_file():
    return (src / tokenizers.SPM_FILE).is_file()
  try:
    return "kind" in json.loads(path.read_text(encoding="utf-8"))
  except ValueError:
    fail(f"{path} is not valid JSON; fix or delete it")


def copy_files(src: pathlib.Path, dst: pathlib.Path) -> list[str]:
  """Copies the Hugging Face tokenizer files found in `src`; returns their names."""
  copied = []
  for name in TOKENIZER_FILES:
    if (src / name).is_file():
      dst.mkdir(parents=True, exist_ok=True)
      paths.copy_file(src / name, dst / name)
      copied.append(name)
  return copied


def _specials(tok: tokenizers.Tokenizer) -> dict[str, str]:
  ids = {"unk_token": tok.unk_id, "sep_token": tok.sep_id, "pad_token": tok.pad_id,
         "cls_token": tok.cls_id, "mask_token": tok.mask_id}
  return {k: tok.id_to_token(i) for k, i in ids.items()}


def write_hf_tokenizer(src: pathlib.Path, out: pathlib.Path, max_length: int,
                       model_type: str = "") -> list[str]:
  """Writes the tokenizer of folder `src` into `out` for transformers; returns the file names."""
  if not is_bertjax_tokenizer(src):
    return copy_files(src, out)
  tok = tokenizers.load_tokenizer(src)
  specials = _specials(tok)
  config: dict[str, Any] = {"model_max_length": max_length, **specials,
                            "clean_up_tokenization_spaces": False}
  if model_type == "modernbert":
    config["model_input_names"] = ["input_ids", "attention_mask"]
  out.mkdir(parents=True, exist_ok=True)
  if tok.kind == "sentencepiece":
    paths.copy_file(src / tokenizers.SPM_FILE, out / "spiece.model")
    # Lower-casing, if any, is inside the model's own normalizer; it keeps accents.
    config.update(tokenizer_class="AlbertTokenizer", do_lower_case=False, keep_accents=True,
                  remove_space=True, bos_token=specials["cls_token"],
                  eos_token=specials["sep_token"])
    files = ["spiece.model"]
  else:
    backend = tok.backend()
    cls, sep = specials["cls_token"], specials["sep_token"]
    if tok.kind in ("wordpiece", "json"):
      backend.post_processor = processors.TemplateProcessing(
          single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
          special_tokens=[(cls, tok.cls_id), (sep, tok.sep_id)])
    if tok.kind == "json":
      files = []
      config.update(tokenizer_class="PreTrainedTokenizerFast")
    elif tok.kind == "wordpiece":
      tok.save(out)  # vocab.txt
      files = [tokenizers.WORDPIECE_VOCAB]
      config.update(tokenizer_class="BertTokenizer", do_lower_case=tok.lowercase,
                    strip_accents=tok.strip_accents, tokenize_chinese_chars=True)
    else:
      add_prefix_space = tok.add_prefix_space
      backend.post_processor = processors.RobertaProcessing(
          sep=(sep, tok.sep_id), cls=(cls, tok.cls_id), add_prefix_space=add_prefix_space)
      tok.save(out)  # vocab.json, merges.txt
      files = [tokenizers.BPE_VOCAB, tokenizers.BPE_MERGES]
      config.update(tokenizer_class="RobertaTokenizer", add_prefix_space=add_prefix_space,
                    bos_token=cls, eos_token=sep, trim_offsets=True)
    backend.save(str(out / "tokenizer.json"))
    files.append("tokenizer.json")
  # Replaces the bertjax tokenizer_config.json `tok.save` wrote with transformers' own.
  paths.replace_text(out / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
  paths.replace_text(out / "special_tokens_map.json", json.dumps(specials, indent=2) + "\n")
  return files + ["tokenizer_config.json", "special_tokens_map.json"]
