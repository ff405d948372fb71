"""SQuAD v1.1 / v2.0 evaluation, computing exactly what the official evaluate scripts compute.

v1.1 (evaluate-v1.1.py): EM and F1 as the max over all gold answers, averaged over every question.
v2.0 (evaluate-v2.0.py): gold answers that normalize to the empty string are dropped, an
unanswerable question's only gold answer is "", F1 is 1 when both prediction and gold are empty;
scores are split into HasAns_/NoAns_, a question whose null odds exceed `na_prob_thresh` counts
as predicted unanswerable, and with null odds given, best_exact/best_f1 sweep the no-answer
threshold. The two scripts differ on edge cases (an empty prediction, a gold answer like "the"),
so the version matters and a file of the other version is reported, not silently scored.

Scores are percentages (0..100), as the official scripts print them.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import string
from typing import Any, Mapping, Sequence

from bertjax.errors import fail

VERSIONS = ("1.1", "2.0")
_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
  """Lower case, drop punctuation, drop the articles a/an/the, collapse whitespace."""
  s = s.lower()
  s = "".join(ch for ch in s if ch not in _PUNCTUATION)
  s = _ARTICLES.sub(" ", s)
  return " ".join(s.split())


def _tokens(s: str) -> list[str]:
  return normalize_answer(s).split() if s else []


def exact_match(gold: str, prediction: str) -> int:
  return int(normalize_answer(gold) == normalize_answer(prediction))


def f1_v1(gold: str, prediction: str) -> float:
  """evaluate-v1.1's token F1: 0 whenever nothing overlaps, even if both are empty."""
  gold_toks = _tokens(gold)
  pred_toks = _tokens(prediction)
  num_same = sum((collections.Counter(gold_toks) & collections.Counter(pred_toks)).values())
  if num_same == 0:
    return 0.0
  precision = num_same / len(pred_toks)
  recall = num_same / len(gold_toks)
  return 2 * precision * recall / (precision + recall)


def f1_v2(gold: str, prediction: str) -> float:
  """evaluate-v2.0's token F1: if either side is empty, 1 when both are, else 0."""
  gold_toks = _tokens(gold)
  pred_toks = _tokens(prediction)
  if not gold_toks or not pred_toks:
    return float(gold_toks == pred_toks)
  return f1_v1(gold, prediction)


def normalize_version(version: str | float | None) -> str | None:
  """'1.1' or '2.0' from spellings like 2, 'v2.0', 1.1 (None stays None)."""
  if version is None:
    return None
  v = str(version).strip().lower().lstrip("v")
  v = {"1": "1.1", "2": "2.0", "2.0": "2.0", "1.1": "1.1"}.get(v, v)
  if v not in VERSIONS:
    fail(f"unknown SQuAD version {version!r}; use 1.1 or 2.0")
  return v


def detect_version(dataset: Mapping[str, Any]) -> str:
  """'2.0' if the json says version v2.0 or any question has `is_impossible`, else '1.1'."""
  if str(dataset.get("version", "")).lstrip("v").startswith("2"):
    return "2.0"
  for article in dataset.get("data", []):
    for paragraph in article.get("paragraphs", []):
      for qa in paragraph.get("qas", []):
        if "is_impossible" in qa:
          return "2.0"
  return "1.1"


def read_squad(path: str | os.PathLike,
               version: str | None = None) -> tuple[str, list[dict[str, Any]]]:
  """Reads an official SQuAD json file.

  Returns `(version, examples)`: version '1.1' or '2.0' as detected from the file, examples one
  dict per question: id, question, context, answers [{text, answer_start}], is_impossible. If
  `version` is given and the file is of the other version, raises `UserError` saying so.
  """
  path = os.fspath(path)
  expected = normalize_version(version)
  if not os.path.isfile(path):
    fail(f"SQuAD file not found: {path}; pass the official dev json")
  try:
    with open(path, encoding="utf-8") as f:
      dataset = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    fail(f"{path} is not valid json ({e}); pass the official SQuAD json")
  if not isinstance(dataset, dict) or not isinstance(dataset.get("data"), list):
    fail(f"{path} has no top-level 'data' list; pass an official SQuAD json, not predictions")
  found = detect_version(dataset)
  if expected is not None and found != expected:
    why = ("it has unanswerable questions (is_impossible / version v2.0)" if found == "2.0"
           else "it has no is_impossible fields and says version "
           f"{dataset.get('version', '(none)')!r}")
    fail(f"{path} is SQuAD v{found}, not v{expected}: {why}; pass a v{expected} file "
         f"or ask for version {found}")
  examples = []
  seen = set()
  try:
    for article in dataset["data"]:
      for paragraph in article["paragraphs"]:
        context = paragraph["context"]
        for qa in paragraph["qas"]:
          qid = qa["id"]
          if qid in seen:
            fail(f"{path}: question id {qid!r} appears twice; ids must be unique")
          seen.add(qid)
          answers = [{"text": a["text"], "answer_start": int(a["answer_start"])}
                     for a in qa.get("answers", [])]
          examples.append({
              "id": qid,
              "question": qa["question"],
              "context": context,
              "answers": answers,
              "is_impossible": bool(qa.get("is_impossible", False)),
          })
  except (KeyError, TypeError) as e:
    fail(f"{path}: malformed SQuAD structure (missing or bad field {e}); "
         "pass an official SQuAD json")
  return found, examples


def _check_predictions(examples: Sequence[Mapping[str, Any]], predictions: Mapping[str, Any],
                       what: str = "predictions") -> None:
  missing = [ex["id"] for ex in examples if ex["id"] not in predictions]
  if missing:
    first = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
    fail(f"{what} lack {len(missing)} of {len(examples)} question ids (first: {first}); "
         f"give one entry per question of the gold file")


def squad_metrics(dataset_examples: Sequence[Mapping[str, Any]],
                  predictions: Mapping[str, str],
                  null_odds: Mapping[str, float] | None = None,
                  version: str = "2.0",
                  na_prob_thresh: float = 1.0) -> dict[str, float]:
  """The official SQuAD metrics of `predictions` (question id -> answer text).

  Args:
    dataset_examples: examples as `read_squad` returns them.
    predictions: answer text per question id; "" means "no answer" (v2.0). Every question must
      have one; ids not in the gold data are ignored (as the official scripts do).
    null_odds: v2.0 only: per question id, how strongly the model prefers "no answer" (BERT's
      null_score - best_non_null_score). Keys in the file's order matter for ties in the threshold
      sweep, as in the official script.
    version: '1.1' or '2.0'.
    na_prob_thresh: v2.0: a question with null odds above this counts as predicted unanswerable
      (the official script's --na-prob-thresh, default 1.0).

  Returns:
    v1.1: exact_match, f1, total. v2.0: exact, f1, total, HasAns_exact/f1/total and
    NoAns_exact/f1/total where present, and with null odds best_exact, best_exact_thresh,
    best_f1, best_f1_thresh.
  """
  version = normalize_version(version)
  if not dataset_examples:
    fail("no SQuAD questions to score; pass a non-empty gold file")
  _check_predictions(dataset_examples, predictions)
  for ex in dataset_examples:
    if not isinstance(predictions[ex["id"]], str):
      fail(f"prediction for {ex['id']!r} is {type(predictions[ex['id']]).__name__}, not text; "
           "predictions map question id -> answer string")
  if version == "1.1":
    impossible = [ex["id"] for ex in dataset_examples
                  if ex.get("is_impossible") or not ex["answers"]]
    if impossible:
      fail(f"gold data has {len(impossible)} unanswerable questions (e.g. {impossible[0]}): "
           "it is SQuAD v2.0; score it with version 2.0")
    if null_odds is not None:
      fail("null odds only apply to SQuAD v2.0; drop them or score with version 2.0")
    return _metrics_v1(dataset_examples, predictions)
  return _metrics_v2(dataset_examples, predictions, null_odds, na_prob_thresh)


def _metrics_v1(examples: Sequence[Mapping[str, Any]],
                predictions: Mapping[str, str]) -> dict[str, float]:
  em = f1 = 0.0
  for ex in examples:
    golds = [a["text"] for a in ex["answers"]]
    pred = predictions[ex["id"]]
    em += max(exact_match(g, pred) for g in golds)
    f1 += max(f1_v1(g, pred) for g in golds)
  total = len(examples)
  return {"exact_match": 100.0 * em / total, "f1": 100.0 * f1 / total, "total": total}


def _metrics_v2(examples: Sequence[Mapping[str, Any]], predictions: Mapping[str, str],
                null_odds: Mapping[str, float] | None,
                na_prob_thresh: float) -> dict[str, float]:
  has_ans = {ex["id"]: bool(ex["answers"]) for ex in examples}
  exact_raw: dict[str, float] = {}
  f1_raw: dict[str, float] = {}
  for ex in examples:
    golds = [a["text"] for a in ex["answers"] if normalize_answer(a["text"])]
    if not golds:  # unanswerable: the only right answer is no answer
      golds = [""]
    pred = predictions[ex["id"]]
    exact_raw[ex["id"]] = max(exact_match(g, pred) for g in golds)
    f1_raw[ex["id"]] = max(f1_v2(g, pred) for g in golds)

  if null_odds is not None:
    _check_predictions(examples, null_odds, what="null odds")
    for qid in has_ans:
      v = null_odds[qid]
      if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        fail(f"null odds for {qid!r} is {v!r}, not a number; give one float per question")
    odds = null_odds
  else:
    odds = {qid: 0.0 for qid in predictions}

  def thresholded(raw: dict[str, float]) -> dict[str, float]:
    return {qid: float(not has_ans[qid]) if odds[qid] > na_prob_thresh else s
            for qid, s in raw.items()}

  exact = thresholded(exact_raw)
  f1 = thresholded(f1_raw)

  def summary(qids: Sequence[str]) -> dict[str, float]:
    return {"exact": 100.0 * sum(exact[q] for q in qids) / len(qids),
            "f1": 100.0 * sum(f1[q] for q in qids) / len(qids),
            "total": len(qids)}

  out = summary(list(exact))
  for prefix, want in (("HasAns", True), ("NoAns", False)):
    qids = [q for q, h in has_ans.items() if h == want]
    if qids:
      out.update({f"{prefix}_{k}": v for k, v in summary(qids).items()})
  if null_odds is not None:
    for name, raw in (("exact", exact_raw), ("f1", f1_raw)):
      best, thresh = _best_threshold(predictions, raw, null_odds, has_ans)
      out[f"best_{name}"] = best
      out[f"best_{name}_thresh"] = thresh
  return out


def _best_threshold(predictions: Mapping[str, str], scores: Mapping[str, float],
                    null_odds: Mapping[str, float],
                    has_ans: Mapping[str, bool]) -> tuple[float, float]:
  """The official sweep: answer only questions with null odds <= t, over t in the odds.

  Starts from "abstain everywhere" (score = number of unanswerable questions) and walks the
  questions in increasing null odds (stable, so ties keep `null_odds`' order, as the script's
  `sorted` does), adding each one's score if answerable, -1 if unanswerable but answered.
  """
  cur = best = sum(1 for h in has_ans.values() if not h)
  best_thresh = 0.0
  for qid in sorted(null_odds, key=lambda k: null_odds[k]):
    if qid not in scores:
      continue
    if has_ans[qid]:
      cur += scores[qid]
    elif predictions[qid]:
      cur -= 1
    if cur > best:
      best = cur
      best_thresh = null_odds[qid]
  return 100.0 * best / len(scores), best_thresh


def read_squad_predictions(path: str | os.PathLike, what: str = "predictions") -> dict[str, Any]:
  """Reads a `{question id: value}` json file (predictions or null odds)."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    fail(f"{what} file not found: {path}")
  try:
    with open(path, encoding="utf-8") as f:
      obj = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    fail(f"{path} is not valid json ({e}); {what} are a json object {{question id: value}}")
  if not isinstance(obj, dict):
    fail(f"{path} holds a json {type(obj).__name__}; {what} are a json object "
         "{question id: value}")
  return obj
