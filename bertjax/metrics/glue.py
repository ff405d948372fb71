"""GLUE: task table, official tsv reader, metrics as GLUE reports them, leaderboard files.

Task names follow tensorflow_datasets (`cola`, `sst2`, `mrpc`, `stsb`, `qqp`, `mnli`,
`mnli_matched`, `mnli_mismatched`, `qnli`, `rte`, `wnli`, `ax`). A task's `labels` are the label
strings exactly as the official tsv (and the leaderboard submission) spells them, in tfds order, so
that label index i means the same class as tfds' `label == i`; `label_names` are tfds' readable
names for the same classes.

Metrics are computed in numpy here (not with scikit-learn/scipy) so the package stays free of
those dependencies; the tests compare them against scikit-learn and scipy. Values are fractions
in [0, 1] (or correlations in [-1, 1]); the GLUE leaderboard shows them multiplied by 100.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import os
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from bertjax.core import paths
from bertjax.core.errors import fail, read_text

SPLITS = ("train", "dev", "test")
# tfds calls the dev split "validation"; accept both spellings.
_SPLIT_ALIASES = {"validation": "dev", "valid": "dev"}


@dataclasses.dataclass(frozen=True)
class Columns:
  """Where the fields of one split's official tsv live (0-based column indices)."""
  num_columns: int
  sentence1: int
  sentence2: int | None
  label: int | None
  header: bool


@dataclasses.dataclass(frozen=True)
class GlueTask:
  """One GLUE task: labels, metrics, file layout and leaderboard file name."""
  name: str
  labels: tuple[str, ...]  # tsv spelling, tfds order; () for the regression task
  label_names: tuple[str, ...]
  is_regression: bool
  metrics: tuple[str, ...]  # names of the keys `glue_metrics` returns, main metric first
  columns: Mapping[str, Columns]  # split -> layout; a split absent here has no official file
  files: Mapping[str, str]  # split -> file name inside the task's GLUE folder
  leaderboard_file: str | None  # None: not submitted as one file (mnli: see mnli_(mis)matched)
  glue_dir: str  # folder name inside glue_data/

  @property
  def num_labels(self) -> int:
    return 1 if self.is_regression else len(self.labels)


def _cols(n: int, s1: int, s2: int | None, label: int | None, header: bool = True) -> Columns:
  return Columns(num_columns=n, sentence1=s1, sentence2=s2, label=label, header=header)


_DEFAULT_FILES = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}
_BINARY = ("0", "1")
_NLI2 = ("entailment", "not_entailment")
_NLI3 = ("entailment", "neutral", "contradiction")
_PAIR4 = {"train": _cols(4, 1, 2, 3), "dev": _cols(4, 1, 2, 3), "test": _cols(3, 1, 2, None)}
# MNLI's official files: train has 12 columns (label1, gold_label), dev has 16 (label1..label5,
# gold_label), test has 10; the sentences are columns 8 and 9 and the gold label is the last one.
_MNLI = {"train": _cols(12, 8, 9, 11), "dev": _cols(16, 8, 9, 15), "test": _cols(10, 8, 9, None)}

GLUE_TASKS: dict[str, GlueTask] = {
    t.name: t for t in [
        GlueTask("cola", _BINARY, ("unacceptable", "acceptable"), False, ("mcc",),
                 # CoLA train/dev: no header; source, label, original mark, sentence.
                 {"train": _cols(4, 3, None, 1, header=False),
                  "dev": _cols(4, 3, None, 1, header=False),
                  "test": _cols(2, 1, None, None)},
                 _DEFAULT_FILES, "CoLA.tsv", "CoLA"),
        GlueTask("sst2", _BINARY, ("negative", "positive"), False, ("accuracy",),
                 {"train": _cols(2, 0, None, 1), "dev": _cols(2, 0, None, 1),
                  "test": _cols(2, 1, None, None)},
                 _DEFAULT_FILES, "SST-2.tsv", "SST-2"),
        GlueTask("mrpc", _BINARY, ("not_equivalent", "equivalent"), False, ("f1", "accuracy"),
                 # Quality, #1 ID, #2 ID, #1 String, #2 String (test: index instead of Quality).
                 {"train": _cols(5, 3, 4, 0), "dev": _cols(5, 3, 4, 0),
                  "test": _cols(5, 3, 4, None)},
                 _DEFAULT_FILES, "MRPC.tsv", "MRPC"),
        GlueTask("stsb", (), (), True, ("pearson", "spearman"),
                 # index genre filename year old_index source1 source2 sentence1 sentence2 score
                 {"train": _cols(10, 7, 8, 9), "dev": _cols(10, 7, 8, 9),
                  "test": _cols(9, 7, 8, None)},
                 _DEFAULT_FILES, "STS-B.tsv", "STS-B"),
        GlueTask("qqp", _BINARY, ("not_duplicate", "duplicate"), False, ("f1", "accuracy"),
                 # id qid1 qid2 question1 question2 is_duplicate; test: id question1 question2
                 {"train": _cols(6, 3, 4, 5), "dev": _cols(6, 3, 4, 5),
                  "test": _cols(3, 1, 2, None)},
                 _DEFAULT_FILES, "QQP.tsv", "QQP"),
        GlueTask("mnli", _NLI3, _NLI3, False, ("accuracy",), _MNLI,
                 {"train": "train.tsv", "dev": "dev_matched.tsv", "test": "test_matched.tsv"},
                 None, "MNLI"),
        GlueTask("mnli_matched", _NLI3, _NLI3, False, ("accuracy",), _MNLI,
                 {"train": "train.tsv", "dev": "dev_matched.tsv", "test": "test_matched.tsv"},
                 "MNLI-m.tsv", "MNLI"),
        GlueTask("mnli_mismatched", _NLI3, _NLI3, False, ("accuracy",), _MNLI,
                 {"train": "train.tsv", "dev": "dev_mismatched.tsv",
                  "test": "test_mismatched.tsv"},
                 "MNLI-mm.tsv", "MNLI"),
        GlueTask("qnli", _NLI2, _NLI2, False, ("accuracy",), _PAIR4, _DEFAULT_FILES,
                 "QNLI.tsv", "QNLI"),
        GlueTask("rte", _NLI2, _NLI2, False, ("accuracy",), _PAIR4, _DEFAULT_FILES,
                 "RTE.tsv", "RTE"),
        GlueTask("wnli", _BINARY, ("not_entailment", "entailment"), False, ("accuracy",),
                 _PAIR4, _DEFAULT_FILES, "WNLI.tsv", "WNLI"),
        # The diagnostic set: test only, scored by GLUE with the (multi-class) Matthews
        # correlation R3 of predictions from an MNLI model.
        GlueTask("ax", _NLI3, _NLI3, False, ("mcc",), {"test": _cols(3, 1, 2, None)},
                 {"test": "diagnostic.tsv"}, "AX.tsv", "diagnostic"),
    ]
}

LEADERBOARD_FILES: dict[str, str] = {
    name: t.leaderboard_file for name, t in GLUE_TASKS.items() if t.leaderboard_file
}

# The tasks a paper's "GLUE score" averages over (WNLI is left out, as BERT and its successors
# do, and AX is a diagnostic, not a task); "mnli" stands for the mean of matched and mismatched.
AVERAGE_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte")


def get_task(name: str) -> GlueTask:
  """Looks a task up by its tfds name (case-insensitive; `sst-2`/`sts-b` spellings accepted)."""
  key = name.strip().lower().replace("-", "")
  key = {"mnlim": "mnli_matched", "mnlimm": "mnli_mismatched"}.get(key, key)
  if key not in GLUE_TASKS:
    fail(f"unknown GLUE task {name!r}; use one of {', '.join(GLUE_TASKS)}")
  return GLUE_TASKS[key]


def task_from_leaderboard_file(path: str | os.PathLike) -> GlueTask | None:
  """The task a leaderboard file name (e.g. `MNLI-mm.tsv`) stands for, or None."""
  base = os.path.basename(os.fspath(path))
  for name, file in LEADERBOARD_FILES.items():
    if base == file:
      return GLUE_TASKS[name]
  return None


def _split(split: str) -> str:
  split = _SPLIT_ALIASES.get(split, split)
  if split not in SPLITS:
    fail(f"unknown GLUE split {split!r}; use one of {', '.join(SPLITS)}")
  return split


def _parse_label(cell: str, t, label_index: dict, where: str, what: str, number_hint: str,
                 label_hint: str):
  """A gold or predicted cell -> a float score (regression) or a label index; bad cells fail
  with `where` (file:line) and `what` (score, label or prediction) in the message."""
  raw = cell.strip()
  if t.is_regression:
    try:
      value = float(raw)
    except ValueError:
      value = math.nan
    if not math.isfinite(value):
      fail(f"{where}: {what} {raw!r} is not a finite number{number_hint}")
    return value
  if raw not in label_index:
    fail(f"{where}: {what} {raw!r} is not a {t.name} label ({', '.join(t.labels)}){label_hint}")
  return label_index[raw]


def read_glue_tsv(path: str | os.PathLike, task: str, split: str) -> list[dict[str, Any]]:
  """Reads one official GLUE tsv file.

  Returns one dict per data row: `idx` (the row's position among data rows, as tfds numbers
  them), `sentence1`, `sentence2` (None for single-sentence tasks), `label` (an int index into
  the task's `labels`, a float for stsb, None for test files). Quoting is off (csv.QUOTE_NONE)
  because MRPC, QNLI and STS-B contain unbalanced double quotes. A row with the wrong number of
  columns, or a label outside the task's label set, raises `UserError` naming file and line.
  """
  t = get_task(task)
  split = _split(split)
  if split not in t.columns:
    fail(f"GLUE task {t.name} has no official {split} file; use split "
         f"{' or '.join(t.columns)}")
  cols = t.columns[split]
  path = os.fspath(path)
  if not paths.as_path(path).is_file():  # local or remote (gs://...)
    fail(f"GLUE file not found: {path}; pass the {t.name} {split} tsv "
         f"({t.glue_dir}/{t.files[split]})")
  label_index = {s: i for i, s in enumerate(t.labels)}
  rows = []
  for line, row in _tsv_rows(path, f"GLUE {t.name} {split} file"):
    if cols.header and line == 1:
      if len(row) != cols.num_columns:
        fail(f"{path}:1: header has {len(row)} columns, a GLUE {t.name} {split} file has "
             f"{cols.num_columns}; check the --task and the file")
      continue
    if not row:  # a blank line carries no example
      continue
    if len(row) != cols.num_columns:
      fail(f"{path}:{line}: {len(row)} tab-separated columns, expected {cols.num_columns} for "
           f"GLUE {t.name} {split}; fix the row (or check the task and split)")
    label = None
    if cols.label is not None:
      label = _parse_label(row[cols.label], t, label_index, f"{path}:{line}",
                           "score" if t.is_regression else "label", "; fix the row",
                           "; fix the row (or check the task)")
    rows.append({
        "idx": len(rows),
        "sentence1": row[cols.sentence1],
        "sentence2": None if cols.sentence2 is None else row[cols.sentence2],
        "label": label,
    })
  if not rows and split != "test":
    fail(f"{path}: no GLUE {t.name} {split} examples (the file is empty or holds only a "
         f"header); use the official {t.glue_dir}/{t.files[split]} with its rows")
  return rows


def _tsv_rows(path: str, what: str) -> Iterator[tuple[int, list[str]]]:
  """(line number, cells) of each line of a tab-separated UTF-8 file, quoting off; bytes that are
  not UTF-8, or a line csv cannot split, fail naming the file and line."""
  # read_text drops a leading byte-order mark: the official MRPC files start with one.
  text = read_text(path, what)
  reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
  while True:
    try:
      row = next(reader)
    except StopIteration:
      return
    except csv.Error as e:
      fail(f"{path}:{reader.line_num}: cannot split the line into columns ({e}); fix the line")
    yield reader.line_num, row


# ---------------------------------------------------------------------------------------------
# Metrics.


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
  """Fraction of `predictions <int>[n]` equal to `labels <int>[n]`."""
  return float(np.mean(np.asarray(predictions) == np.asarray(labels)))


def binary_f1(predictions: np.ndarray, labels: np.ndarray, positive: int = 1) -> float:
  """F1 of the positive class (as GLUE reports for MRPC and QQP); 0 when undefined."""
  p = np.asarray(predictions) == positive
  g = np.asarray(labels) == positive
  tp = int(np.sum(p & g))
  denom = int(np.sum(p)) + int(np.sum(g))  # 2tp + fp + fn
  return 2.0 * tp / denom if denom else 0.0


def matthews_corrcoef(predictions: np.ndarray, labels: np.ndarray) -> float:
  """Matthews correlation, the multi-class form (Gorodkin's R_K) that reduces to MCC for 2.

  0 when undefined (all predictions, or all labels, one class), as scikit-learn does.
  """
  predictions = np.asarray(predictions).astype(np.int64)
  labels = np.asarray(labels).astype(np.int64)
  k = int(max(predictions.max(initial=0), labels.max(initial=0))) + 1
  confusion = np.zeros((k, k), np.float64)
  np.add.at(confusion, (labels, predictions), 1.0)
  t = confusion.sum(axis=1)  # true count per class
  p = confusion.sum(axis=0)  # predicted count per class
  c = np.trace(confusion)
  s = confusion.sum()
  cov_ytyp = c * s - t @ p
  cov_ypyp = s * s - p @ p
  cov_ytyt = s * s - t @ t
  if cov_ypyp * cov_ytyt == 0:
    return 0.0
  return float(cov_ytyp / math.sqrt(cov_ytyt * cov_ypyp))


def pearson(x: np.ndarray, y: np.ndarray) -> float:
  """Pearson correlation of `x, y <float>[n]`; NaN when either is constant (as scipy)."""
  x = np.asarray(x, np.float64)
  y = np.asarray(y, np.float64)
  xm = x - x.mean()
  ym = y - y.mean()
  denom = math.sqrt(float(xm @ xm) * float(ym @ ym))
  if denom == 0:
    return math.nan
  r = float(xm @ ym) / denom
  return max(-1.0, min(1.0, r))


def rankdata(x: np.ndarray) -> np.ndarray:
  """Ranks 1..n of `x <float>[n]`, ties given their average rank (scipy's default)."""
  x = np.asarray(x)
  order = np.argsort(x, kind="mergesort")
  sorted_x = x[order]
  # Start of each run of equal values in sorted order.
  new_run = np.concatenate([[True], sorted_x[1:] != sorted_x[:-1]])
  run_id = np.cumsum(new_run) - 1
  run_starts = np.flatnonzero(new_run)
  run_ends = np.concatenate([run_starts[1:], [len(x)]])
  avg_rank = (run_starts + run_ends + 1) / 2.0  # mean of ranks start+1 .. end
  ranks = np.empty(len(x), np.float64)
  ranks[order] = avg_rank[run_id]
  return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
  """Spearman rank correlation: Pearson of the average ranks."""
  return pearson(rankdata(x), rankdata(y))


def _as_predictions(t: GlueTask, predictions: Any, n: int) -> np.ndarray:
  preds = np.asarray(predictions)
  if t.is_regression:
    if preds.ndim == 2 and preds.shape[1] == 1:
      preds = preds[:, 0]
    return preds.astype(np.float64)
  if preds.ndim == 2:  # logits or probabilities <float>[n, num_labels]
    if preds.shape[1] != len(t.labels):
      fail(f"{t.name} predictions have {preds.shape[1]} scores per example, the task has "
           f"{len(t.labels)} labels; pass label indices or per-label scores")
    preds = preds.argmax(axis=-1)
  if preds.dtype.kind in "US":  # label strings
    index = {s: i for i, s in enumerate(t.labels)}
    bad = [s for s in preds.tolist() if s not in index]
    if bad:
      fail(f"{t.name} prediction {bad[0]!r} is not a label ({', '.join(t.labels)})")
    return np.asarray([index[s] for s in preds.tolist()], np.int64)
  if preds.dtype.kind == "f" and not np.all(preds == np.round(preds)):
    fail(f"{t.name} is a classification task: pass integer label indices, not scores")
  preds = preds.astype(np.int64)
  if n and (preds.min() < 0 or preds.max() >= len(t.labels)):
    fail(f"{t.name} prediction index outside 0..{len(t.labels) - 1}")
  return preds


def glue_metrics(task: str, predictions: Any, labels: Any) -> dict[str, float]:
  """The metrics GLUE reports for `task`.

  Args:
    task: tfds task name.
    predictions: label indices `<int>[n]` (or label strings, or scores `<float>[n, labels]`,
      argmaxed); `<float>[n]` for stsb.
    labels: gold label indices `<int>[n]` (`<float>[n]` for stsb).

  Returns:
    cola/ax: {mcc}; mrpc/qqp: {f1, accuracy}; stsb: {pearson, spearman}; otherwise {accuracy}.
  """
  t = get_task(task)
  labels = np.asarray(labels)
  n = len(labels)
  preds = _as_predictions(t, predictions, n)
  if preds.shape != (n,):
    fail(f"{t.name}: {len(preds)} predictions for {n} gold labels; give one per example")
  if n == 0:
    fail(f"{t.name}: no examples to score")
  if t.is_regression:
    labels = labels.astype(np.float64)
    return {"pearson": pearson(preds, labels), "spearman": spearman(preds, labels)}
  labels = labels.astype(np.int64)
  if "mcc" in t.metrics:
    return {"mcc": matthews_corrcoef(preds, labels)}
  if "f1" in t.metrics:
    return {"f1": binary_f1(preds, labels), "accuracy": accuracy(preds, labels)}
  return {"accuracy": accuracy(preds, labels)}


def glue_task_score(task: str, metrics: Mapping[str, float]) -> float:
  """One number per task: its metric, or the mean of its two metrics (MRPC, QQP, STS-B)."""
  t = get_task(task)
  missing = [m for m in t.metrics if m not in metrics]
  if missing:
    fail(f"{t.name} results lack {', '.join(missing)}; pass the dict `glue_metrics` returns")
  return float(np.mean([metrics[m] for m in t.metrics]))


def glue_average(results: Mapping[str, Mapping[str, float]]) -> float:
  """The GLUE average as papers report it, over the tasks present in `results`.

  `results` maps task name -> `glue_metrics` dict. WNLI and AX are left out; MNLI counts once,
  as the mean of mnli_matched and mnli_mismatched (or `mnli` if given as such); a task with two
  metrics counts with their mean. Raises `UserError` if no counted task is present.
  """
  scores: dict[str, float] = {}
  mnli_parts = []
  for name, metrics in results.items():
    t = get_task(name)
    if t.name in ("wnli", "ax"):
      continue
    if t.name in ("mnli_matched", "mnli_mismatched"):
      mnli_parts.append(glue_task_score(t.name, metrics))
    else:
      scores[t.name] = glue_task_score(t.name, metrics)
  if mnli_parts:
    scores["mnli"] = float(np.mean(mnli_parts))
  if not scores:
    fail(f"no GLUE task to average; give results for some of {', '.join(AVERAGE_TASKS)}")
  return float(np.mean(list(scores.values())))


# ---------------------------------------------------------------------------------------------
# Leaderboard prediction files.


def write_predictions_tsv(path: str | os.PathLike, predictions: Any, task: str,
                          indices: Sequence[int] | None = None) -> None:
  """Writes a GLUE leaderboard file: header `index\\tprediction`, one row per example.

  Classification predictions (label indices `<int>[n]`, or scores `<float>[n, labels]`) are
  written as the task's label strings (`0`/`1`, `entailment`, ...); stsb writes floats. `indices`
  default to 0..n-1, the row order of the official test file.
  """
  t = get_task(task)
  preds = _as_predictions(t, predictions, len(np.asarray(predictions)))
  if indices is None:
    indices = range(len(preds))
  elif len(indices) != len(preds):
    fail(f"{len(indices)} indices for {len(preds)} predictions; give one index per prediction")
  lines = ["index\tprediction\n"]
  for i, p in zip(indices, preds.tolist()):
    # repr of a Python float round-trips exactly, so re-reading scores the same numbers.
    value = repr(float(p)) if t.is_regression else t.labels[p]
    lines.append(f"{int(i)}\t{value}\n")
  paths.replace_text(paths.as_path(path), "".join(lines))  # whole or not at all; local or gs://


def read_predictions_tsv(path: str | os.PathLike, task: str) -> tuple[np.ndarray, np.ndarray]:
  """Reads a leaderboard file written by `write_predictions_tsv` (or by hand).

  Returns `(index <int64>[n], predictions)`, predictions being label indices `<int64>[n]` or, for
  stsb, `<float64>[n]`. Raises `UserError` naming file and line for a bad header, a malformed
  row, an unknown label, or a repeated index.
  """
  t = get_task(task)
  path = os.fspath(path)
  if not paths.as_path(path).is_file():  # local or remote (gs://...)
    fail(f"predictions file not found: {path}; pass the leaderboard tsv you wrote")
  label_index = {s: i for i, s in enumerate(t.labels)}
  indices: list[int] = []
  preds: list[float] = []
  seen: dict[int, int] = {}
  for line, row in _tsv_rows(path, "predictions file"):
    if line == 1:
      if [c.strip().lower() for c in row] != ["index", "prediction"]:
        fail(f"{path}:1: header must be 'index<TAB>prediction', got {chr(9).join(row)!r}")
      continue
    if not row:
      continue
    if len(row) != 2:
      fail(f"{path}:{line}: {len(row)} columns, expected 2 (index<TAB>prediction)")
    try:
      idx = int(row[0])
    except ValueError:
      idx = None
    if idx is None or not 0 <= idx < 2**63:
      fail(f"{path}:{line}: index {row[0]!r} is not a row index (an integer from 0)")
    if idx in seen:
      fail(f"{path}:{line}: index {idx} already given on line {seen[idx]}; keep one row each")
    seen[idx] = line
    value = _parse_label(row[1], t, label_index, f"{path}:{line}", "prediction", "", "")
    indices.append(idx)
    preds.append(value)
  dtype = np.float64 if t.is_regression else np.int64
  return np.asarray(indices, np.int64), np.asarray(preds, dtype)
