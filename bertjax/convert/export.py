"""to-hf: any bertjax model folder -> a Hugging Face folder transformers loads, telling the truth.

What is written: the encoder, the heads that were trained (a fine-tuned model's task head as
the matching *ForSequenceClassification / *ForTokenClassification / *ForQuestionAnswering class),
label names in config.json when known, and the tokenizer as transformers' files. What is left
out, and said so: parts never trained (heads `from-hf` initialized fresh, a pooler no loss read),
unless named in `include`, and parts no transformers class holds (SpanBERT's boundary head).
A model whose head computes something no transformers class computes fails with one line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Callable, Iterable

from safetensors.numpy import save

from bertjax.convert.hf_configs import (HEAD_ORDER, HF_CLASSES, POOLER_CLASSES, TASK_CLASSES,
                                        model_config_to_hf_config)
from bertjax.convert.hf_tokenizer import load_for_export, write_hf_tokenizer
from bertjax.convert.names import (encoder_entries, head_entries, params_to_hf,
                                   roberta_classifier_dense, task_head_entries)
from bertjax.convert.sources import Source, read_source
from bertjax.convert.workdirs import Converted, check_target, staging_dir
from bertjax.core import paths
from bertjax.core.errors import fail
from bertjax.data import tokenizers

PathLike = str | os.PathLike
NEVER_TRAINED = "never trained (initialized fresh by from-hf)"


@dataclasses.dataclass
class Plan:
  """One Hugging Face folder to write: its class, config and tensors, and what it holds."""
  cls: str
  config: dict[str, Any]
  tensors: dict[str, Any]
  heads: tuple[str, ...]
  left_out: dict[str, str]
  notes: list[str]


def _untrained_reason(source: Source | None) -> str:
  if source is None or source.kind == "converted":
    return NEVER_TRAINED
  return f"never trained (no loss of objective {source.objective} reads it)"


def _pretraining_plan(c: Converted, source: Source | None, include: set[str]) -> Plan:
  cfg, left_out, notes = c.config, {}, []
  untrained = set(source.untrained) if source else set()
  heads = []
  for h in HEAD_ORDER:
    if h not in c.heads:
      continue
    if h in untrained and h not in include:
      left_out[h] = _untrained_reason(source)
    else:
      heads.append(h)
  heads = tuple(heads)
  while (cfg.architecture, heads) not in HF_CLASSES:
    left_out[heads[-1]] = f"no Hugging Face {cfg.architecture} class holds it with the others"
    heads = heads[:-1]
  if "mlm" in heads:
    head_act = cfg.mlm_head_act or cfg.hidden_act
    hf_act = "gelu" if cfg.architecture in ("roberta", "electra") else cfg.hidden_act
    if head_act != hf_act:
      fail(f"the MLM head uses {head_act!r} but Hugging Face {cfg.architecture} hard-codes "
           f"{hf_act!r}; this model cannot be exported with its MLM head")
  cls = HF_CLASSES[(cfg.architecture, heads)]
  entries = [e for e in encoder_entries(cfg) if e.part != "pooler"]
  entries += _pooler(c, cls, untrained, include, left_out, notes, source)
  entries += [e for h in heads for e in head_entries(cfg, h)]
  tensors = params_to_hf(c.params, cfg, heads, entries)
  return Plan(cls, model_config_to_hf_config(cfg, [cls]), tensors, heads, left_out, notes)


def _pooler(c: Converted, cls: str, untrained: set[str], include: set[str],
            left_out: dict[str, str], notes: list[str], source: Source | None) -> list:
  """The pooler's entries when `cls` has a pooler and it was trained (or included)."""
  cfg = c.config
  if cls not in POOLER_CLASSES:
    return []
  if not cfg.use_pooler:
    notes.append(f"this model has no pooler; transformers initializes {cls}'s pooler fresh")
    return []
  if "pooler" in untrained and "pooler" not in include:
    left_out["pooler"] = (_untrained_reason(source)
                          + f"; transformers initializes {cls}'s pooler fresh")
    return []
  return [e for e in encoder_entries(cfg) if e.part == "pooler"]


def _task_plan(source: Source) -> Plan:
  c, task = source.converted, source.task
  cfg = c.config
  cls = TASK_CLASSES.get((cfg.architecture, task.kind))
  if task.features != "standard":
    fail(f"no transformers class holds a feature-based head (head.features={task.features!r}: "
         "it reads several layers); run it with bertjax.load(W).logits, or export the features "
         "with python -m bertjax.tools.embed")
  if task.kind == "sequence" and (cls is None or not cfg.use_pooler) and (
      cfg.architecture != "modernbert"):
    ours = "pooler (dense + tanh) + linear" if cfg.use_pooler else "a linear layer on [CLS]"
    theirs = ("a dense + GELU + linear head" if cfg.architecture == "electra"
              else "a pooler (dense + tanh) + linear")
    fail(f"no transformers class matches this {cfg.architecture} sequence classifier (bertjax: "
         f"{ours}; transformers: {theirs}); run it with bertjax.load(W).logits instead")
  entries = [e for e in encoder_entries(cfg) if e.part != "pooler"]
  if task.kind == "sequence" and cfg.architecture != "modernbert":  # its own head: no pooler
    entries += (roberta_classifier_dense(cfg) if cfg.architecture == "roberta"
                else [e for e in encoder_entries(cfg) if e.part == "pooler"])
  entries += task_head_entries(cfg, task.kind, task.num_labels)
  tensors = params_to_hf(c.params, cfg, (task.kind,), entries)
  config = model_config_to_hf_config(cfg, [cls])
  if task.labels and task.kind != "qa":
    config["id2label"] = {str(i): name for i, name in enumerate(task.labels)}
    config["label2id"] = {name: i for i, name in enumerate(task.labels)}
  elif task.kind != "qa":
    config["id2label"] = {str(i): f"LABEL_{i}" for i in range(task.num_labels)}
    config["label2id"] = {f"LABEL_{i}": i for i in range(task.num_labels)}
  if task.kind == "sequence":
    config["problem_type"] = ("regression" if task.regression
                              else "single_label_classification")
  if task.task:
    config["finetuning_task"] = task.task
  return Plan(cls, config, tensors, (task.name,), {}, [])


def _check_include(include: Iterable[str], source: Source) -> set[str]:
  names = {n.strip() for n in include if n.strip()}
  for name in sorted(names):
    if name not in source.untrained:
      fail(f"--include-untrained-heads {name}: {source.path} has no untrained part of that "
           f"name (untrained: {', '.join(source.untrained) or 'none'}); drop it from the list")
  return names


def plans(source: Source, include: Iterable[str] = ()) -> dict[str, Plan]:
  """Subfolder ("" for OUT itself) -> what to write there; fails before anything is written."""
  names = _check_include(include, source)
  c = source.converted
  # What no Hugging Face config can hold (a pruned ModernBERT, ...) fails in one line here,
  # before any tensor is laid out for a class it does not fit.
  for cfg in (c.config, c.generator.config if c.generator is not None else None):
    if cfg is not None:
      model_config_to_hf_config(cfg)
  if source.task is not None:
    return {"": _task_plan(source)}
  if c.generator is None:
    return {"": _pretraining_plan(c, source, names)}
  return {"discriminator": _pretraining_plan(c, source, names),
          "generator": _pretraining_plan(c.generator, None, set())}


def _write(plan: Plan, out: pathlib.Path) -> None:
  out.mkdir(parents=True, exist_ok=True)
  paths.replace_text(out / "config.json", json.dumps(plan.config, indent=2, sort_keys=True) + "\n")
  # Through paths.replace_bytes, as every file written: whole or not at all, and with the mode
  # open() gives (safetensors' own save_file leaves it private, 0600).
  paths.replace_bytes(out / "model.safetensors", save(plan.tensors, metadata={"format": "pt"}))


# The special-token ids a transformers config carries, by model type (its class's defaults name
# the published tokenizer's ids: ModernBERT's 50281..50283 lie outside a smaller vocabulary).
_TOKEN_ID_KEYS = {"modernbert": ("cls_token_id", "sep_token_id", "bos_token_id", "eos_token_id"),
                  "roberta": ("bos_token_id", "eos_token_id"),
                  "albert": ("bos_token_id", "eos_token_id")}


def _special_token_ids(config: dict[str, Any], tok: tokenizers.Tokenizer | None) -> None:
  """Sets config's special-token ids to the exported tokenizer's ([CLS]/<s> begins a sequence,
  [SEP]/</s> ends it); without a tokenizer, ids the class would default to a token outside the
  vocabulary are written as null."""
  keys = _TOKEN_ID_KEYS.get(config["model_type"], ())
  if tok is not None:
    ids = {"cls_token_id": tok.cls_id, "bos_token_id": tok.cls_id, "sep_token_id": tok.sep_id,
           "eos_token_id": tok.sep_id}
    config.update({k: ids[k] for k in keys})
    return
  defaults = {"cls_token_id": 50281, "bos_token_id": 50281, "sep_token_id": 50282,
              "eos_token_id": 50282} if config["model_type"] == "modernbert" else {}
  for k in keys:
    if config.get(k, defaults.get(k, -1)) >= config["vocab_size"]:
      config[k] = None


def _max_length(config: dict[str, Any]) -> int:
  # RoBERTa's positions start after the padding index: two fewer usable positions.
  offset = config["pad_token_id"] + 1 if config["model_type"] == "roberta" else 0
  return config["max_position_embeddings"] - offset


def convert_to_hf(workdir: PathLike, output: PathLike, step: int | None = None,
                  include: Iterable[str] = (), log: Callable[[str], Any] = print
                  ) -> dict[str, Plan]:
  """Model folder (see `sources.read_source`) -> Hugging Face folder(s) at `output` (either may be
  remote: gs://...).

  step: a training workdir's checkpoint (default: its newest complete one). include: untrained
  parts ("mlm", "pair", "rtd", "pooler") to write anyway. Prints what it wrote and left out.
  """
  out = check_target(output, "--output")
  source = read_source(workdir, step)
  tok = load_for_export(source.tokenizer) if source.tokenizer is not None else None
  todo = plans(source, include)
  for plan in todo.values():
    _special_token_ids(plan.config, tok)
  with staging_dir(out) as tmp:
    token_files = []
    for sub, plan in todo.items():
      _write(plan, tmp / sub)
      if tok is not None:
        token_files = write_hf_tokenizer(source.tokenizer, tmp / sub, _max_length(plan.config),
                                         plan.config["model_type"], tok)
        tokenizers.load_checked(tmp / sub)  # what was written reads back
  what = f"{source.kind} folder" + (f" at step {source.step}" if source.step is not None else "")
  log(f"exported the {what} {source.path}")
  for sub, plan in todo.items():
    where = out / sub if sub else out
    log(f"wrote {plan.cls} to {where} (heads: {', '.join(plan.heads) or 'none'}"
        + (f"; labels: {', '.join(plan.config['id2label'].values())}"
           if "id2label" in plan.config else "") + ")")
    for note in plan.notes:
      log(note)
    for part, reason in {**source.left_out, **plan.left_out}.items():
      log(f"left out {part}: {reason}" + (
          f" (--include-untrained-heads {part} writes it)" if "never trained" in reason else ""))
  log(f"tokenizer files: {', '.join(token_files) if token_files else 'none (no tokenizer/ found)'}")
  return todo
