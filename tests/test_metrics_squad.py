"""SQuAD v1.1 / v2.0 metrics: hand-checked cases, the real dev files, and a reference port.

The reference for perturbed predictions is `transformers.data.metrics.squad_metrics`, a port of
the official evaluate-v2.0.py; v1.1-only edge cases are checked by hand.
"""

import json
import types

import numpy as np
import pytest

from bertjax.core.errors import UserError
from bertjax.metrics import squad


def _example(qid, answers, impossible=False):
  return {"id": qid, "question": "q?", "context": "c", "is_impossible": impossible,
          "answers": [{"text": a, "answer_start": 0} for a in answers]}


def test_normalize_answer():
  assert squad.normalize_answer("The  Quick, brown fox!") == "quick brown fox"
  assert squad.normalize_answer("an apple a day") == "apple day"
  # Articles only as whole words; punctuation removed before articles are looked for.
  assert squad.normalize_answer("Theater-goers") == "theatergoers"
  assert squad.normalize_answer("a-the") == "athe"
  assert squad.normalize_answer("  A.  ") == ""


def test_exact_and_f1_by_hand():
  assert squad.exact_match("The Eiffel Tower.", "eiffel tower") == 1
  assert squad.exact_match("Eiffel Tower", "the tower") == 0
  # gold {cat, sat}, prediction {cat, sat, on}: P = 2/3, R = 1, F1 = 0.8.
  assert squad.f1_v2("the cat sat", "a cat sat on") == pytest.approx(0.8)
  # Repeated tokens count with multiplicity: gold {a1:1} -> "x x y" vs "x y": P=1, R=2/3.
  assert squad.f1_v2("x x y", "x y") == pytest.approx(0.8)
  assert squad.f1_v2("Denver Broncos", "") == 0.0
  # Both empty after normalization: v2.0 says they agree (1), v1.1's F1 says no overlap (0).
  assert squad.f1_v2("the", "a") == 1.0
  assert squad.f1_v1("the", "a") == 0.0


def test_v1_several_gold_answers_and_empty_prediction():
  examples = [_example("q1", ["Denver Broncos", "the Broncos", "Broncos"]),
              _example("q2", ["1990s", "the 1990s"]),
              _example("q3", ["Santa Clara, California"]),
              _example("q4", ["the"])]
  preds = {"q1": "broncos!", "q2": "the late 1990s", "q3": "", "q4": "",
           "extra": "ignored"}
  m = squad.squad_metrics(examples, preds, version="1.1")
  # q1: EM 1, F1 1. q2: EM 0, F1 max(2/3 for "late 1990s" vs "1990s") = 2/3. q3: 0, 0.
  # q4: gold "the" and "" normalize equal, so EM 1, but v1.1's F1 is 0.
  assert m["exact_match"] == pytest.approx(100 * 2 / 4)
  assert m["f1"] == pytest.approx(100 * (1 + 2 / 3) / 4)
  assert m["total"] == 4
  # The same under v2.0 rules: q4's gold normalizes to empty, so its gold is "" and F1 is 1.
  m2 = squad.squad_metrics(examples, preds, version="2.0")
  assert m2["exact"] == pytest.approx(100 * 2 / 4)
  assert m2["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1) / 4)


def test_v2_no_answer_and_thresholds_by_hand():
  examples = [_example("a", ["red car"]), _example("b", ["blue"]),
              _example("c", [], impossible=True), _example("d", [], impossible=True)]
  preds = {"a": "red car", "b": "green", "c": "", "d": "something"}
  m = squad.squad_metrics(examples, preds, version="2.0")
  assert m["exact"] == m["f1"] == pytest.approx(50.0)
  assert (m["HasAns_exact"], m["HasAns_total"]) == (pytest.approx(50.0), 2)
  assert (m["NoAns_exact"], m["NoAns_total"]) == (pytest.approx(50.0), 2)
  assert "best_exact" not in m
  # Null odds: abstain where odds > t. Sorted by odds: a(-2) b(0.5) d(1.5) c(3).
  # Start at 2 (abstain everywhere); +a (1) -> 3 best at -2; +b (0) -> 3; d answered "something"
  # -> 2; c answered "" -> 2. So best_exact = 3/4 at threshold -2.
  odds = {"a": -2.0, "b": 0.5, "c": 3.0, "d": 1.5}
  m = squad.squad_metrics(examples, preds, null_odds=odds, version="2.0")
  assert m["best_exact"] == pytest.approx(75.0)
  assert m["best_exact_thresh"] == -2.0
  # The official na_prob_thresh of 1.0 also applies: c and d (odds > 1) count as abstentions,
  # which is right for both (unanswerable): exact = (a 1 + b 0 + c 1 + d 1) / 4.
  assert m["exact"] == pytest.approx(75.0)
  assert m["NoAns_exact"] == pytest.approx(100.0)


def test_missing_predictions_are_reported_not_dropped():
  examples = [_example(f"q{k}", ["x"]) for k in range(6)]
  preds = {"q0": "x", "q2": "x"}
  with pytest.raises(UserError, match=r"lack 4 of 6 question ids \(first: q1, q3, q4, \.\.\.\)"):
    squad.squad_metrics(examples, preds, version="1.1")
  with pytest.raises(UserError, match="null odds lack 1 of 1"):
    squad.squad_metrics([_example("q", [])], {"q": ""}, null_odds={}, version="2.0")
  with pytest.raises(UserError, match="not text"):
    squad.squad_metrics([_example("q", ["x"])], {"q": 3}, version="2.0")
  with pytest.raises(UserError, match="it is SQuAD v2.0"):
    squad.squad_metrics([_example("q", [], impossible=True)], {"q": ""}, version="1.1")


def test_version_mismatch_is_detected(data_dir):
  v1 = data_dir / "squad" / "v1.1_dev_subset.json"
  v2 = data_dir / "squad" / "v2.0_dev_subset.json"
  assert squad.read_squad(v1)[0] == "1.1"
  assert squad.read_squad(v2)[0] == "2.0"
  with pytest.raises(UserError, match=r"is SQuAD v2.0, not v1.1: it has unanswerable"):
    squad.read_squad(v2, version="1.1")
  with pytest.raises(UserError, match=r"is SQuAD v1.1, not v2.0"):
    squad.read_squad(v1, version="v2.0")


def test_version_detection_from_fields(tmp_path):
  doc = {"data": [{"title": "t", "paragraphs": [{"context": "abc", "qas": [
      {"id": "1", "question": "?", "answers": [], "is_impossible": True}]}]}]}
  path = tmp_path / "unversioned.json"
  path.write_text(json.dumps(doc))
  version, examples = squad.read_squad(path)
  assert version == "2.0" and examples[0]["is_impossible"] and examples[0]["answers"] == []
  path.write_text(json.dumps({"1": "an answer"}))
  with pytest.raises(UserError, match="no top-level 'data' list"):
    squad.read_squad(path)


@pytest.mark.parametrize("file", ["v1.1_dev_subset.json", "v2.0_dev_subset.json",
                                  "dev-v1.1.json"])
def test_real_dev_first_gold_answer_scores_100(data_dir, file):
  path = data_dir / "squad" / file
  if not path.exists():
    pytest.skip(f"{path} not staged")
  version, examples = squad.read_squad(path)
  preds = {ex["id"]: ex["answers"][0]["text"] if ex["answers"] else "" for ex in examples}
  m = squad.squad_metrics(examples, preds, version=version)
  key = "exact_match" if version == "1.1" else "exact"
  assert m[key] == pytest.approx(100.0) and m["f1"] == pytest.approx(100.0)
  assert m["total"] == len(examples)
  if version == "2.0":
    assert m["NoAns_total"] == sum(ex["is_impossible"] for ex in examples) > 0
    assert m["HasAns_f1"] == m["NoAns_f1"] == pytest.approx(100.0)
  # Answers are real substrings of their context at answer_start.
  for ex in examples[:200]:
    for a in ex["answers"]:
      assert ex["context"][a["answer_start"]:].startswith(a["text"])


def _perturb(examples, rng):
  """Predictions of every kind: right, another gold, partial, padded, wrong, empty."""
  preds = {}
  for ex in examples:
    golds = [a["text"] for a in ex["answers"]] or [""]
    words = ex["context"].split()
    kind = rng.integers(6)
    g = golds[rng.integers(len(golds))]
    if kind == 0:
      p = g
    elif kind == 1:
      p = " ".join(g.split()[1:])
    elif kind == 2:
      k = rng.integers(len(words))
      p = "The " + g + " " + " ".join(words[k:k + 3])
    elif kind == 3:
      k = rng.integers(len(words))
      p = " ".join(words[k:k + rng.integers(1, 6)])
    elif kind == 4:
      p = ""
    else:
      p = g.upper() + "."
    preds[ex["id"]] = p
  return preds


def _reference(examples, preds, null_odds=None):
  from transformers.data.metrics import squad_metrics as ref
  hf_examples = [types.SimpleNamespace(qas_id=ex["id"], answers=ex["answers"])
                 for ex in examples]
  return ref.squad_evaluate(hf_examples, preds, null_odds)


@pytest.mark.parametrize("seed", [0, 1])
def test_v2_perturbed_matches_reference_port(data_dir, seed):
  version, examples = squad.read_squad(data_dir / "squad" / "v2.0_dev_subset.json")
  rng = np.random.default_rng(seed)
  preds = _perturb(examples, rng)
  # Rounded odds create ties, where the sweep's order (the odds file's order) matters.
  odds = {ex["id"]: float(np.round(rng.normal(0, 2), 1)) for ex in examples}
  odds = dict(sorted(odds.items(), key=lambda kv: rng.random()))
  ours = squad.squad_metrics(examples, preds, null_odds=odds, version=version)
  ref = _reference(examples, preds, odds)
  assert set(ours) == set(ref)
  for k in ref:
    assert ours[k] == pytest.approx(ref[k], abs=1e-9), k
  assert 0 < ours["f1"] < 100
  # The sweep starts from "abstain everywhere", which scores the unanswerable share.
  assert ours["best_f1"] >= 100 * ours["NoAns_total"] / ours["total"] - 1e-9
  # Without null odds: no threshold keys, and the plain scores still agree.
  ours = squad.squad_metrics(examples, preds, version=version)
  ref = _reference(examples, preds)
  for k in ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1"):
    assert ours[k] == pytest.approx(ref[k], abs=1e-9), k


def test_v1_perturbed_matches_reference_port(data_dir):
  version, examples = squad.read_squad(data_dir / "squad" / "v1.1_dev_subset.json")
  # v1.1 and v2.0 rules differ only for gold answers that normalize to empty; with none such,
  # the v2.0 port is a reference for v1.1 too.
  assert all(squad.normalize_answer(a["text"]) for ex in examples for a in ex["answers"])
  preds = _perturb(examples, np.random.default_rng(7))
  ours = squad.squad_metrics(examples, preds, version=version)
  ref = _reference(examples, preds)
  assert ours["exact_match"] == pytest.approx(ref["exact"], abs=1e-9)
  assert ours["f1"] == pytest.approx(ref["f1"], abs=1e-9)
  assert 20 < ours["f1"] < 90
