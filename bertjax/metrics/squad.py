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

from bertjax.core import paths
from bertjax.core.errors import fail, read_text

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


def _children(obj: Any, key: str) -> list:
  """obj[key] if obj is a dict holding a list there, else [] (for a lenient first look)."""
  value = obj.get(key) if isinstance(obj, dict) else None
  return value if isinstance(value, list) else []


def detect_version(dataset: Mapping[str, Any]) -> str:
  """'2.0' if the json says version v2.0 or any question has `is_impossible`, else '1.1'."""
  if str(dataset.get("version", "")).lstrip("v").startswith("2"):
    return "2.0"
  for article in _children(dataset, "data"):
    for paragraph in _children(article, "paragraphs"):
      for qa in _children(paragraph, "qas"):
        if isinstance(qa, dict) and "is_impossible" in qa:
          return "2.0"
  return "1.1"


def _load_json(path: str, what: str, fix: str) -> Any:
  """The json value in `path`, or one line naming the file, the line and the problem."""
  text = read_text(path, what)
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    fail(f"{path}:{e.lineno}: not valid json ({e.msg} at column {e.colno}); {fix}")
  except RecursionError:
    fail(f"{path}: json nested too deeply to read; {fix}")


def read_squad(path: str | os.PathLike,
               version: str | None = None) -> tuple[str, list[dict[str, Any]]]:
  """Reads an official SQuAD json file.

  Returns `(version, examples)`: version '1.1' or '2.0' as detected from the file, examples one
  dict per question: id, question, context, answers [{text, answer_start}], is_impossible. If
  `version` is given and the file is of the other version, raises `UserError` saying so; so it
  does for a field missing or of the wrong type, a repeated id, or a v1.1 question without
  answers, naming the file and the question.
  """
  path = os.fspath(path)
  expected = normalize_version(version)
  if not paths.as_path(path).is_file():  # local or remote (gs://...)
    fail(f"SQuAD file not found: {path}; pass the official dev json")
  dataset = _load_json(path, "SQuAD json", "pass the official SQuAD json")
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
  for i, article in enumerate(dataset["data"]):
    at = f"data[{i}]"
    for j, paragraph in enumerate(_field(path, at, article, "paragraphs", list)):
      where = f"{at}.paragraphs[{j}]"
      context = _field(path, where, paragraph, "context", str)
      for k, qa in enumerate(_field(path, where, paragraph, "qas", list)):
        example = _question(path, f"{where}.qas[{k}]", qa, context, found)
        if example["id"] in seen:
          fail(f"{path}: question id {example['id']!r} appears twice; ids must be unique")
        seen.add(example["id"])
        examples.append(example)
  return found, examples


_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer"}


def _field(path: str, where: str, obj: Any, key: str, kind: type) -> Any:
  """obj[key], checked to be of `kind`; else one line naming the file and the record."""
  if not isinstance(obj, dict):
    fail(f"{path}: {where} is a json {type(obj).__name__}, not an object; pass an official "
         "SQuAD json")
  if key not in obj:
    fail(f"{path}: {where} has no {key!r} field; pass an official SQuAD json")
  value = obj[key]
  if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
    fail(f"{path}: {where}.{key} is {type(value).__name__} {_short(value)}, not "
         f"{_TYPE_NAMES[kind]}; pass an official SQuAD json")
  return value


def _short(value: Any) -> str:
  text = json.dumps(value)
  return text if len(text) <= 40 else text[:37] + "..."


def _question(path: str, where: str, qa: Any, context: str, version: str) -> dict[str, Any]:
  """One question of the file as an example dict, its fields checked."""
  qid = _field(path, where, qa, "id", str)
  where = f"{where} (id {qid!r})"
  question = _field(path, where, qa, "question", str)
  impossible = qa.get("is_impossible", False)
  if not isinstance(impossible, bool):
    fail(f"{path}: {where}.is_impossible is {_short(impossible)}, not true or false; pass an "
         "official SQuAD json")
  answers = []
  if "answers" in qa:
    for n, a in enumerate(_field(path, where, qa, "answers", list)):
      text = _field(path, f"{where}.answers[{n}]", a, "text", str)
      start = _field(path, f"{where}.answers[{n}]", a, "answer_start", int)
      answers.append({"text": text, "answer_start": start})
  if version == "1.1" and not answers:
    fail(f"{path}: question {where} has no answers, and every SQuAD v1.1 question needs one; "
         "add its answers (or, if the file is SQuAD v2.0, mark unanswerable questions "
         "is_impossible: true and set version v2.0)")
  return {"id": qid, "question": question, "context": context, "answers": answers,
          "is_impossible": impossible}


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
    impossible = [ex["id"] for ex in dataset_examples if ex.get("is_impossible")]
    if impossible:
      fail(f"gold data has {len(impossible)} unanswerable questions (e.g. {impossible[0]}): "
           "it is SQuAD v2.0; score it with version 2.0")
    unanswered = [ex["id"] for ex in dataset_examples if not ex["answers"]]
    if unanswered:
      fail(f"gold data has {len(unanswered)} questions without answers (e.g. "
           f"{unanswered[0]}), and every SQuAD v1.1 question needs one; add their answers")
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
      if isinstance(v, bool) or not isinstance(v, (int, float)) or (
          isinstance(v, float) and math.isnan(v)):
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
  if not paths.as_path(path).is_file():  # local or remote (gs://...)
    fail(f"{what} file not found: {path}")
  fix = f"{what} are a json object {{question id: value}}"
  obj = _load_json(path, f"{what} file", fix)
  if not isinstance(obj, dict):
    fail(f"{path} holds a json {type(obj).__name__}; {fix}")
  return obj


def check_prediction_file(path: str | os.PathLike, values: Mapping[str, Any],
                          examples: Sequence[Mapping[str, Any]], what: str = "predictions",
                          numbers: bool = False) -> None:
  """Checks a `read_squad_predictions` result against the gold questions: one value per question
  id, no id the gold data lacks, each value text (or, `numbers`, a number that is not NaN)."""
  path = os.fspath(path)
  gold = {ex["id"] for ex in examples}
  extra = [k for k in values if k not in gold]
  if extra:
    first = ", ".join(map(repr, extra[:3])) + (", ..." if len(extra) > 3 else "")
    fail(f"{path} has {len(extra)} question ids not in the gold file (first: {first}); is it "
         f"the {what} for another dataset or version?")
  _check_predictions(examples, values, what=f"{path}: {what}")
  for ex in examples:
    v = values[ex["id"]]
    if numbers:
      ok = (isinstance(v, (int, float)) and not isinstance(v, bool)
            and not (isinstance(v, float) and math.isnan(v)))
    else:
      ok = isinstance(v, str)
    if not ok:
      fail(f"{path}: the {what} for {ex['id']!r} is {_short(v)}, not "
           f"{'a number' if numbers else 'text'}; give one per question id")
