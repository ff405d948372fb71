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
  """Copies the tokenizer files found in `src` (tokenizers.TOKENIZER_FILES); returns their
  names."""
  copied = []
  for name in TOKENIZER_FILES:
    if (src / name).is_file():
      dst.mkdir(parents=True, exist_ok=True)
      paths.copy_file(src / name, dst / name)
      copied.append(name)
  return copied


def missing_vocabulary(src: pathlib.Path) -> str | None:
  """Why a Hugging Face folder's tokenizer files are incomplete (settings files without the
  vocabulary they describe), None when they are complete or absent."""
  present = [n for n in TOKENIZER_FILES if (src / n).is_file()]
  if not present or tokenizers.kind_files(src) is not None:
    return None
  try:
    cls = json.loads((src / tokenizers.CONFIG_FILE).read_text(encoding="utf-8")).get(
        "tokenizer_class", "")
  except (OSError, ValueError, AttributeError):
    cls = ""
  # The fast classes read tokenizer.json; the others name their vocabulary in KIND_FILES.
  wanted = (tokenizers.TOKENIZER_JSON if cls in ("", "PreTrainedTokenizerFast")
            or cls.endswith("Fast") else tokenizers.expected_files())
  return (f"{src} has {', '.join(present)} but no {wanted}"
          + (f" ({tokenizers.CONFIG_FILE} names {cls})" if cls else ""))


def check_import(src: pathlib.Path) -> str | None:
  """A Hugging Face folder's tokenizer files, checked before `from-hf` copies them: damaged
  ones fail (one line); incomplete ones are not copied and the returned warning says so."""
  missing = missing_vocabulary(src)
  if missing:
    return (f"warning: {missing}, so the converted folder gets no tokenizer: copy the missing "
            "file into the model folder and convert again, or give --config.data.tokenizer "
            "when training from it")
  if tokenizers.kind_files(src) is not None:
    tokenizers.load_checked(src, again="download or save the model folder again")
  return None


def load_for_export(src: pathlib.Path) -> tokenizers.Tokenizer:
  """The tokenizer of a model folder's tokenizer/, every file checked: `to-hf` never writes a
  tokenizer transformers cannot load."""
  missing = missing_vocabulary(src)
  if missing:
    fail(f"{missing}: transformers could not load the exported tokenizer; copy the file there "
         f"or delete {src} to export the model alone")
  return tokenizers.load_checked(
      src, again=f"copy {src} again from where it was written (the run, or the Hugging Face "
                 "folder it was converted from)")


def _specials(tok: tokenizers.Tokenizer) -> dict[str, str]:
  ids = {"unk_token": tok.unk_id, "sep_token": tok.sep_id, "pad_token": tok.pad_id,
         "cls_token": tok.cls_id, "mask_token": tok.mask_id}
  return {k: tok.id_to_token(i) for k, i in ids.items()}


def write_hf_tokenizer(src: pathlib.Path, out: pathlib.Path, max_length: int,
                       model_type: str = "", tok: tokenizers.Tokenizer | None = None) -> list[str]:
  """Writes the tokenizer of folder `src` (`tok`, loaded from it) into `out` for transformers;
  returns the file names."""
  if not is_bertjax_tokenizer(src):
    return copy_files(src, out)
  tok = tok or tokenizers.load_tokenizer(src)
  specials = _specials(tok)
  config: dict[str, Any] = {"model_max_length": max_length, **specials,
                            "clean_up_tokenization_spaces": False}
  if model_type == "modernbert":
    config["model_input_names"] = ["input_ids", "attention_mask"]
  out.mkdir(parents=True, exist_ok=True)
  if tok.kind == "sentencepiece":
    paths.copy_file(src / tokenizers.SPM_FILE, out / tokenizers.HF_SPM_FILE)
    # Lower-casing, if any, is inside the model's own normalizer; it keeps accents.
    config.update(tokenizer_class="AlbertTokenizer", do_lower_case=False, keep_accents=True,
                  remove_space=True, bos_token=specials["cls_token"],
                  eos_token=specials["sep_token"])
    files = [tokenizers.HF_SPM_FILE]
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
