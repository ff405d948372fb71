"""CoNLL-2003 token tagging: named entities (`task=ner`) or part-of-speech tags (`task=pos`).

Each word is tokenized on its own; its first sub-token carries the word's label and the rest are
ignored (label weight 0), as BERT tags CoNLL. A sentence longer than the window is split at word
boundaries into several rows, so every word of every sentence gets exactly one prediction; a
single word with more sub-tokens than fit keeps its first ones.

NER is scored at the entity level (precision, recall, F1; `bertjax.metrics.ner`, conlleval
semantics), POS by token accuracy, by its evaluator, bertjax/evaluators/ner.py, which also
writes the prediction files.

Data: `config.data_dir` with CoNLL-2003 files (`token POS chunk NER` columns; names from
train_file, dev_file, test_file), or the tfds `conll2003` dataset when data_dir is empty.
"""

from __future__ import annotations

import logging
from typing import Sequence

import jax.numpy as jnp
import numpy as np
import optax

from bertjax.core.errors import UserError, fail
from bertjax.metrics import ner as ner_eval
from bertjax.models import classifiers
from bertjax.tasks import base

_log = logging.getLogger(__name__)

# Label sets in tfds' ClassLabel order, so tfds label ids index them directly.
NER_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
POS_LABELS = ('"', "''", "#", "$", "(", ")", ",", ".", ":", "``", "CC", "CD", "DT", "EX", "FW",
              "IN", "JJ", "JJR", "JJS", "LS", "MD", "NN", "NNP", "NNPS", "NNS", "NN|SYM", "PDT",
              "POS", "PRP", "PRP$", "RB", "RBR", "RBS", "RP", "SYM", "TO", "UH", "VB", "VBD",
              "VBG", "VBN", "VBP", "VBZ", "WDT", "WP", "WP$", "WRB")
LABELS = {"ner": NER_LABELS, "pos": POS_LABELS}
TFDS_FIELD = {"ner": "ner", "pos": "pos"}
DEFAULT_FILES = {"train": "train.txt", "dev": "valid.txt", "test": "test.txt"}
TFDS_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


def read_sentences(config, task: str, split: str,
                   required: bool = True) -> tuple[list[tuple[list[str], list[str]]], str] | None:
  """[(words, labels)] of one split and where it came from; None for an absent optional split.

  A label outside the task's label set, a malformed line (bytes that are not UTF-8 included)
  or a required file without sentences raises `UserError` naming the file (and line).
  """
  labels = LABELS[task]
  known = set(labels)
  if not required and config.get(f"{split}_file") == "none":
    return None
  local = bool(config.data_dir or config.get(f"{split}_file"))
  if local:
    path = base.resolve_file(config, config.get(f"{split}_file", ""), DEFAULT_FILES[split])
    if not path.is_file():
      if required:
        fail(f"CoNLL-2003 {split} file not found: {path}; set --config.data_dir (and "
             f"--config.{split}_file) to CoNLL-2003 files (token POS chunk NER) "
             f"({base.data_folder_hint()})")
      return None
    out = []
    for s in ner_eval.read_conll(path):
      tags = s.tags if task == "ner" else s.pos
      for k, tag in enumerate(tags):
        if tag not in known:
          fail(f"{path}:{s.line + k}: {task.upper()} tag {tag!r} is not a CoNLL-2003 {task} "
               f"label ({', '.join(labels[:9])}{', ...' if len(labels) > 9 else ''}); fix the "
               "line")
      out.append((list(s.tokens), list(tags)))
    if not out and required:
      fail(f"{path} has no sentences; a CoNLL-2003 {split} file has `token POS chunk NER` lines "
           "with a blank line after each sentence")
    return out, str(path)
  try:
    source = base.open_tfds("conll2003", TFDS_SPLITS[split], config.get("tfds_data_dir", ""))
  except UserError:
    if required:
      raise
    return None
  out = []
  for i in range(len(source)):
    ex = source[i]
    words = [base.text(w) for w in np.asarray(ex["tokens"]).tolist()]
    ids = [int(x) for x in np.asarray(ex[TFDS_FIELD[task]]).tolist()]
    if len(ids) != len(words) or any(not 0 <= x < len(labels) for x in ids):
      fail(f"tfds conll2003 {TFDS_SPLITS[split]} record {i}: {len(words)} tokens with labels "
           f"{ids[:5]}...; labels must be one per token in 0..{len(labels) - 1}")
    out.append((words, [labels[x] for x in ids]))
  return out, f"tfds conll2003 {TFDS_SPLITS[split]}"


def word_pieces(tokenizer, sentences: Sequence[Sequence[str]]) -> list[list[list[int]]]:
  """Sub-token ids of every word, tokenized word by word (never empty: [UNK] stands in)."""
  words = [w for s in sentences for w in s]
  # Byte-level BPE spells a word start as a leading space (RoBERTa tags with add_prefix_space).
  prefix = " " if tokenizer.kind == "bpe" else ""
  flat = tokenizer.encode_batch([prefix + w for w in words]) if words else []
  out, k = [], 0
  for s in sentences:
    out.append([p or [tokenizer.unk_id] for p in flat[k:k + len(s)]])
    k += len(s)
  return out


def tag_features(tokenizer, sentences: Sequence[tuple[Sequence[str], Sequence[str]]],
                 labels: Sequence[str], max_seq_length: int
                 ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
  """Rows of `[CLS] pieces [SEP]` with labels on first sub-tokens.

  Returns (arrays {input_ids, attention_mask, token_type_ids, labels, label_weights}
  <[rows, seq]>, owner <int>[rows] (the sentence of each row), word <int>[rows, seq] (the word
  index each labelled position stands for, -1 elsewhere)).
  """
  index = {t: i for i, t in enumerate(labels)}
  pieces = word_pieces(tokenizer, [w for w, _ in sentences])
  budget = max_seq_length - 2
  rows, owner, word_pos = [], [], []

  def flush(sentence, tokens, tags, words):
    ids = [tokenizer.cls_id, *tokens, tokenizer.sep_id]
    rows.append({"input_ids": base.pad_row(ids, max_seq_length, tokenizer.pad_id),
                 "attention_mask": base.pad_row([1] * len(ids), max_seq_length, 0),
                 "token_type_ids": [0] * max_seq_length,
                 "labels": base.pad_row([0, *tags], max_seq_length, 0),
                 "label_weights": base.pad_row([0.0, *[float(w >= 0) for w in words]],
                                               max_seq_length, 0.0)})
    owner.append(sentence)
    word_pos.append(base.pad_row([-1, *words], max_seq_length, -1))

  for si, ((words, tags), word_ids) in enumerate(zip(sentences, pieces)):
    tokens, row_tags, row_words = [], [], []
    for wi, p in enumerate(word_ids):
      p = p[:budget]
      if tokens and len(tokens) + len(p) > budget:
        flush(si, tokens, row_tags, row_words)
        tokens, row_tags, row_words = [], [], []
      tokens += p
      row_tags += [index[tags[wi]]] + [0] * (len(p) - 1)
      row_words += [wi] + [-1] * (len(p) - 1)
    if tokens or not words:
      flush(si, tokens, row_tags, row_words)
  dtypes = {"input_ids": np.int32, "attention_mask": np.int32, "token_type_ids": np.int32,
            "labels": np.int32, "label_weights": np.float32}
  return (base.stack(rows, list(dtypes), dtypes), np.asarray(owner, np.int64),
          np.asarray(word_pos, np.int64).reshape(len(rows), max_seq_length))


class TaggingTask(base.TaskObjective):
  """NER or POS tagging on CoNLL-2003 (`config.task`: ner | pos)."""
  name = "ner"
  evaluator = "ner"

  @classmethod
  def main_metric(cls, settings) -> str:
    """Entity F1 for NER, token accuracy for POS, over the whole dev set."""
    return "f1" if settings.get("task", "ner") == "ner" else "accuracy"

  def check(self, config) -> None:
    task_of(config)

  def prepare(self, config, workdir):
    task = task_of(config)
    everything, train_from = read_sentences(config, task, "train")
    train = everything[:config.max_train_examples or None]
    tok = self.load_tokenizer(config, workdir, lambda: (" ".join(w) for w, _ in everything))
    if task == "ner" and tok.lowercase:
      # Capitals are the strongest entity cue: an uncased model loses them (configs/ner.py).
      _log.warning("ner: the tokenizer lower-cases its input (%s); NER needs a cased one: "
                   "fine-tune a cased checkpoint (e.g. bert-base-cased)",
                   config.data.tokenizer or config.init_from or "trained with --lowercase")
    arrays, _, _ = tag_features(tok, train, LABELS[task], config.max_seq_length)
    base.announce(f"{task} train ({train_from}): {len(train)} sentences -> "
                  f"{base.num_rows(arrays)} rows")
    dev = eval_set(config, tok, "dev", read_sentences(config, task, "dev"))
    test = read_sentences(config, task, "test", required=False)
    test_sets = [eval_set(config, tok, "test", test)] if test is not None and test[0] else []
    return base.Prepared(train=arrays, eval_sets=[dev], tokenizer=tok, test_sets=test_sets)

  def make_model(self, config, model_config):
    return classifiers.TokenClassifier(model_config, num_labels=len(LABELS[task_of(config)]),
                                       **base.head_options(config))

  def feature_spec(self, config, seq_len):
    return {"labels": ((seq_len,), jnp.int32), "label_weights": ((seq_len,), jnp.float32)}

  def denominators(self, batch):
    """The labelled positions of the whole batch's real rows."""
    w = batch["label_weights"].astype(jnp.float32) * batch["weight"][:, None]
    return {"loss": jnp.maximum(jnp.sum(w), 1.0)}

  def predict(self, model, params, batch, rng, deterministic):
    logits = model.apply({"params": params}, **self.model_inputs(batch),
                         deterministic=deterministic, rngs={"dropout": rng})
    w = batch["label_weights"].astype(jnp.float32) * batch["weight"][:, None]
    labels = batch["labels"].astype(jnp.int32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels) * w
    predicted = jnp.argmax(logits, -1).astype(jnp.int32)
    correct = (predicted == labels).astype(jnp.float32) * w
    return {"loss": jnp.sum(ce, -1), "predicted": predicted,
            "correct": jnp.sum(correct, -1), "labelled": jnp.sum(w, -1),
            "metrics": {"accuracy": (jnp.sum(correct), jnp.sum(w))}}


def task_of(config) -> str:
  """`config.task` (ner | pos), refused in one line when it is neither."""
  task = config.get("task", "ner")
  if task not in LABELS:
    fail(f"unknown tagging task {task!r}; set --config.task to ner or pos")
  return task


def eval_set(config, tokenizer, split: str, data) -> base.EvalSet:
  """The dev or test sentences as feature rows, with what decoding their tags needs."""
  sentences, source = data
  task = task_of(config)
  arrays, owner, word = tag_features(tokenizer, sentences, LABELS[task], config.max_seq_length)
  base.announce(f"{task} {split} ({source}): {len(sentences)} sentences -> "
                f"{base.num_rows(arrays)} rows")
  return base.EvalSet(name=split, arrays=arrays,
                      meta={"sentences": sentences, "owner": owner, "word": word,
                            "source": source, "task": task, "labels": LABELS[task]})
