"""GLUE fine-tuning: the nine tasks as BERT fine-tunes them, through the one trainer.

Each example becomes `[CLS] A [SEP]` (single-sentence tasks: cola, sst2) or `[CLS] A [SEP] B
[SEP]` with token types 0 then 1, the longer sentence losing tokens first when the pair does not
fit (BERT's `_truncate_seq_pair`). A classification head on the pooled [CLS] output gives the
logits; stsb is a regression with one output and a squared-error loss. MNLI evaluates on both
dev sets (matched and mismatched) and its model also predicts the diagnostic set (AX).

Data: `config.data_dir` names the GLUE download (glue_data/ with one folder per task, or one
task's folder) in the official tsv formats (read by `bertjax.metrics.glue`); empty, the tfds
`glue/<task>` dataset built under `config.tfds_data_dir`.

Its evaluator, bertjax/evaluators/glue.py, scores the dev sets and writes the prediction files.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax

from bertjax.core import paths
from bertjax.core.errors import UserError, fail
from bertjax.metrics import glue
from bertjax.models import classifiers
from bertjax.tasks import base

TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")

# tfds field names of the two texts per task (None: single sentence).
TFDS_FIELDS = {
    "cola": ("sentence", None), "sst2": ("sentence", None),
    "mrpc": ("sentence1", "sentence2"), "stsb": ("sentence1", "sentence2"),
    "qqp": ("question1", "question2"), "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"), "rte": ("sentence1", "sentence2"),
    "wnli": ("sentence1", "sentence2"), "ax": ("premise", "hypothesis"),
}


@dataclasses.dataclass(frozen=True)
class Split:
  """One evaluated split: `task` is the `evaluation.glue` task whose files, labels and metrics
  apply (mnli_matched, ...); `key` prefixes its metric names when a task has several."""
  key: str
  task: str
  tfds_name: str
  tfds_split: str


def dev_splits(task: str) -> list[Split]:
  if task == "mnli":
    return [Split("matched", "mnli_matched", "glue/mnli", "validation_matched"),
            Split("mismatched", "mnli_mismatched", "glue/mnli", "validation_mismatched")]
  return [Split("", task, f"glue/{task}", "validation")]


def test_splits(task: str) -> list[Split]:
  if task == "mnli":
    return [Split("matched", "mnli_matched", "glue/mnli", "test_matched"),
            Split("mismatched", "mnli_mismatched", "glue/mnli", "test_mismatched"),
            Split("ax", "ax", "glue/ax", "test")]
  return [Split("", task, f"glue/{task}", "test")]


def local_file(data_dir: str, task: str, split: str) -> tuple[paths.Path | None, list[str]]:
  """The official tsv of `task`'s `split` under data_dir (GLUE root, the task's folder, or a
  sibling folder such as diagnostic/ next to MNLI/; local or gs://...); (None, tried paths) when
  absent."""
  t = glue.get_task(task)
  root = paths.as_path(data_dir).expanduser()
  name = t.files[split]
  candidates = [root / t.glue_dir / name, root / name, root.parent / t.glue_dir / name]
  for path in candidates:
    if path.is_file():
      return path, []
  return None, [str(c) for c in candidates[:2]]


def read_rows(config, spec: Split, split: str, required: bool) -> list[dict[str, Any]] | None:
  """Rows {idx, sentence1, sentence2, label} of one split, or None if an optional one is absent."""
  if config.data_dir:
    path, tried = local_file(config.data_dir, spec.task, split)
    if path is None:
      if required:
        fail(f"GLUE {spec.task} {split} file not found (tried {' and '.join(tried)}); set "
             f"--config.data_dir to glue_data/ or glue_data/{glue.get_task(spec.task).glue_dir}/ "
             f"({base.data_folder_hint()})")
      base.announce(f"glue {spec.task}: no {split} file ({tried[0]}); no {split} predictions")
      return None
    return glue.read_glue_tsv(path, spec.task, split)
  tfds_split = "train" if split == "train" else spec.tfds_split
  if not required:
    try:
      return _tfds_rows(config, spec, tfds_split, split)
    except UserError as e:
      base.announce(f"no test predictions for {spec.task}: {e}")
      return None
  return _tfds_rows(config, spec, tfds_split, split)


def _tfds_rows(config, spec: Split, tfds_split: str, split: str) -> list[dict[str, Any]]:
  t = glue.get_task(spec.task)
  source = base.open_tfds(spec.tfds_name, tfds_split, config.get("tfds_data_dir", ""))
  f1, f2 = TFDS_FIELDS[spec.tfds_name.split("/")[1]]
  rows = []
  for i in range(len(source)):
    ex = source[i]
    where = f"tfds {spec.tfds_name} {tfds_split} record {i}"
    raw = np.asarray(ex["label"]).item()
    if t.is_regression:
      label = float(raw)
      if not math.isfinite(label):
        fail(f"{where}: score {raw!r} is not a finite number; rebuild the dataset")
    elif int(raw) == -1:  # tfds marks the unlabelled test split with -1
      label = None
    else:
      label = int(raw)
      if not 0 <= label < t.num_labels:
        fail(f"{where}: label {label} is not a {t.name} label index (0..{t.num_labels - 1}); "
             "rebuild the dataset or check --config.task")
    if label is None and split != "test":
      fail(f"{where} has no label; train and dev splits must be labelled")
    rows.append({"idx": int(np.asarray(ex["idx"]).item()) if "idx" in ex else i,
                 "sentence1": base.text(ex[f1]),
                 "sentence2": base.text(ex[f2]) if f2 else None, "label": label})
  return rows


def encode_rows(tokenizer, rows: list[dict[str, Any]], max_seq_length: int,
                regression: bool) -> tuple[dict[str, np.ndarray], int]:
  """Rows -> {input_ids, attention_mask, token_type_ids <int32>[n, seq], label [n]}, and the
  number of examples that had to be truncated."""
  n, seq = len(rows), max_seq_length
  first = tokenizer.encode_batch([r["sentence1"] for r in rows])
  pair = n > 0 and rows[0]["sentence2"] is not None
  second = tokenizer.encode_batch([r["sentence2"] for r in rows]) if pair else None
  ids = np.full((n, seq), tokenizer.pad_id, np.int32)
  types = np.zeros((n, seq), np.int32)
  mask = np.zeros((n, seq), np.int32)
  truncated = 0
  for i in range(n):
    a = first[i]
    b = second[i] if pair else []
    budget = seq - (3 if pair else 2)
    if len(a) + len(b) > budget:
      truncated += 1
      la, lb = len(a), len(b)
      # BERT's _truncate_seq_pair: one token at a time from the longer sequence.
      while la + lb > budget:
        if la > lb:
          la -= 1
        else:
          lb -= 1
      a, b = a[:la], b[:lb]
    tokens = [tokenizer.cls_id, *a, tokenizer.sep_id]
    if pair:
      tokens += [*b, tokenizer.sep_id]
    ids[i, :len(tokens)] = tokens
    mask[i, :len(tokens)] = 1
    types[i, len(a) + 2:len(tokens)] = 1
  labels = [r["label"] if r["label"] is not None else 0 for r in rows]
  label = np.asarray(labels, np.float32 if regression else np.int32)
  arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "label": label}
  return arrays, truncated


class GlueTask(base.TaskObjective):
  """Sequence classification (regression for stsb) on one GLUE task (`config.task`)."""
  name = "glue"
  evaluator = "glue"

  @classmethod
  def main_metric(cls, settings) -> str:
    """The GLUE score: the mean of the task's metrics over the whole dev set."""
    del settings
    return "score"

  def check(self, config) -> None:
    task_of(config)

  # -- data --------------------------------------------------------------------------------------

  def prepare(self, config, workdir):
    chosen = task_of(config)
    task, regression = chosen.name, chosen.is_regression
    all_rows = read_rows(config, Split("", task, f"glue/{task}", "train"), "train", True)
    train_rows = all_rows[:config.max_train_examples or None]
    # A tokenizer trained here sees all the training text, not only the rows kept for training.
    tok = self.load_tokenizer(
        config, workdir,
        lambda: (s for r in all_rows for s in (r["sentence1"], r["sentence2"]) if s))
    train, truncated = encode_rows(tok, train_rows, config.max_seq_length, regression)
    base.announce(f"glue {task}: {len(train_rows)} training examples ({truncated} truncated to "
                  f"max_seq_length {config.max_seq_length})")
    eval_sets = [eval_set(config, tok, spec, "dev", read_rows(config, spec, "dev", True))
                 for spec in dev_splits(task)]
    test_sets = [eval_set(config, tok, spec, "test", rows) for spec in test_splits(task)
                 if (rows := read_rows(config, spec, "test", False))]
    return base.Prepared(train=train, eval_sets=eval_sets, tokenizer=tok, test_sets=test_sets)

  # -- model and loss ------------------------------------------------------------------------------

  def make_model(self, config, model_config):
    return classifiers.SequenceClassifier(model_config, num_labels=task_of(config).num_labels,
                                          **base.head_options(config))

  def feature_spec(self, config, seq_len):
    return {"label": ((), jnp.float32 if task_of(config).is_regression else jnp.int32)}

  def predict(self, model, params, batch, rng, deterministic):
    logits = model.apply({"params": params}, **self.model_inputs(batch),
                         deterministic=deterministic, rngs={"dropout": rng})
    w = batch["weight"].astype(jnp.float32)
    out = {"logits": logits}
    if "label" not in batch:  # prediction only (dev/test rows carry their labels on the host)
      out["loss"] = jnp.zeros_like(w)
      out["metrics"] = {}
      return out
    if model.num_labels == 1:  # regression (stsb)
      per_row = jnp.square(logits[:, 0] - batch["label"].astype(jnp.float32)) * w
      out["metrics"] = {"mse": (jnp.sum(per_row), jnp.sum(w))}
    else:
      labels = batch["label"].astype(jnp.int32)
      per_row = optax.softmax_cross_entropy_with_integer_labels(logits, labels) * w
      correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32) * w
      out["metrics"] = {"accuracy": (jnp.sum(correct), jnp.sum(w))}
    out["loss"] = per_row
    return out


def task_of(config) -> glue.GlueTask:
  """`config.task`'s GLUE task, refused in one line when it is not one."""
  task = config.get("task", "")
  if task not in TASKS:
    fail(f"unknown GLUE task {task!r}; set --config.task to one of {', '.join(TASKS)}")
  return glue.get_task(task)


def eval_set(config, tokenizer, spec: Split, split: str, rows) -> base.EvalSet:
  """One dev or test split, encoded; its labels stay on the host as the file gives them."""
  regression = glue.get_task(spec.task).is_regression
  arrays, truncated = encode_rows(tokenizer, rows, config.max_seq_length, regression)
  del arrays["label"]  # scored on the host, from the file's own values (not float32 copies)
  labels = np.asarray([r["label"] if r["label"] is not None else 0 for r in rows],
                      np.float64 if regression else np.int64)
  base.announce(f"glue {spec.task} {split}: {len(rows)} examples ({truncated} truncated)")
  return base.EvalSet(name=f"{spec.task} {split}", arrays=arrays,
                      meta={"spec": spec, "labels": labels, "idx": [r["idx"] for r in rows]})
