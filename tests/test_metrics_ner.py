"""CoNLL-2003 reader, entity-level metrics against seqeval, predictions file round trip."""

import warnings

import numpy as np
import pytest
from seqeval import metrics as seqeval_metrics

from bertjax.core.errors import UserError
from bertjax.metrics import ner

TYPES = ("PER", "LOC", "ORG", "MISC")


def _seqeval(gold, pred):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # undefined precision for a type never predicted
    report = seqeval_metrics.classification_report(gold, pred, output_dict=True, digits=10)
    return {
        "precision": seqeval_metrics.precision_score(gold, pred),
        "recall": seqeval_metrics.recall_score(gold, pred),
        "f1": seqeval_metrics.f1_score(gold, pred),
        "report": report,
    }


def _assert_matches_seqeval(gold, pred):
  ours = ner.ner_metrics(gold, pred)
  ref = _seqeval(gold, pred)
  for k in ("precision", "recall", "f1"):
    assert ours[k] == pytest.approx(ref[k], abs=1e-12), k
  types = {k for k in ref["report"] if not k.endswith(" avg")}
  assert set(ours["per_type"]) == types
  for t in types:
    for k in ("precision", "recall", "f1"):
      assert ours["per_type"][t][k] == pytest.approx(ref["report"][t][k.replace("f1", "f1-score")],
                                                     abs=1e-12), (t, k)
    assert ours["per_type"][t]["support"] == ref["report"][t]["support"]
  return ours


def _perturb(tags_per_sentence, rng, rate=0.15):
  """Typical tagger mistakes: wrong type, B<->I, dropped or spurious entities, stray I- tags."""
  out = []
  for tags in tags_per_sentence:
    new = list(tags)
    for k, tag in enumerate(tags):
      if rng.random() > rate:
        continue
      r = rng.integers(4)
      if r == 0 and tag != "O":
        new[k] = tag[:2] + TYPES[rng.integers(4)]
      elif r == 1 and tag != "O":
        new[k] = ("I-" if tag[0] == "B" else "B-") + tag[2:]
      elif r == 2:
        new[k] = "O"
      else:
        new[k] = ("I-", "B-")[rng.integers(2)] + TYPES[rng.integers(4)]
    out.append(new)
  return out


@pytest.fixture
def valid(data_dir):
  return ner.read_conll(data_dir / "conll2003" / "valid.txt")


def test_reader_on_real_valid(valid):
  # PROVENANCE.md: 3250 sentences, 51362 tokens (plus 216 -DOCSTART- lines, skipped).
  assert len(valid) == 3250
  assert sum(len(s.tokens) for s in valid) == 51362
  assert all(len(s.tokens) == len(s.tags) == len(s.pos) == len(s.chunk) for s in valid)
  assert not any(tok == ner.DOCSTART for s in valid for tok in s.tokens)
  assert {t[2:] for s in valid for t in s.tags if t != "O"} == set(TYPES)
  # IOB2: no entity starts with I-.
  assert all(t == "O" or not t.startswith("I-") or s.tags[k - 1][2:] == t[2:]
             for s in valid for k, t in enumerate(s.tags) if k > 0)
  assert all(not s.tags[0].startswith("I-") for s in valid)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_real_valid_perturbed_matches_seqeval_iob2_and_iob1(valid, seed):
  gold = [s.tags for s in valid]
  pred = _perturb(gold, np.random.default_rng(seed))
  ours = _assert_matches_seqeval(gold, pred)
  assert 0.5 < ours["f1"] < 0.95
  # The same sentences in IOB1: same entities, same scores, still equal to seqeval.
  gold1 = [ner.iob2_to_iob1(t) for t in gold]
  pred1 = [ner.iob2_to_iob1(ner.to_iob2(t)) for t in pred]
  assert gold1 != gold  # the conversion did change tags
  assert [ner.get_entities(g) for g in gold1] == [ner.get_entities(g) for g in gold]
  ours1 = _assert_matches_seqeval(gold1, pred1)
  assert ours1["f1"] == pytest.approx(ours["f1"])
  # Mixed schemes (IOB1 gold, IOB2 predictions) score the same entities too.
  _assert_matches_seqeval(gold1, pred)


def test_perfect_predictions(valid):
  gold = [s.tags for s in valid[:300]]
  m = ner.ner_metrics(gold, gold)
  assert m["precision"] == m["recall"] == m["f1"] == 1.0
  assert m["num_gold"] == m["num_correct"] > 0


EDGE_CASES = [
    # I- starting an entity (after O and at the sentence start).
    (["I-PER", "I-PER", "O", "I-LOC"], ["B-PER", "I-PER", "O", "B-LOC"]),
    # IOB1: B- splits two adjacent entities of one type.
    (["I-PER", "I-PER", "B-PER", "O"], ["B-PER", "I-PER", "I-PER", "O"]),
    # A change of type inside an entity ends it and starts another.
    (["B-PER", "I-LOC", "I-LOC", "O"], ["B-PER", "I-PER", "I-LOC", "O"]),
    # B- after I- of the same type; single-token entities; entity at the sentence end.
    (["B-ORG", "B-ORG", "I-ORG", "B-MISC"], ["B-ORG", "I-ORG", "I-ORG", "I-MISC"]),
    # IOBES.
    (["S-PER", "B-LOC", "E-LOC", "E-LOC"], ["S-PER", "B-LOC", "I-LOC", "E-LOC"]),
    # No entities predicted at all; no gold entities at all.
    (["B-PER", "O"], ["O", "O"]),
    (["O", "O"], ["I-MISC", "O"]),
]


@pytest.mark.parametrize("gold,pred", EDGE_CASES)
def test_edge_cases_match_seqeval(gold, pred):
  _assert_matches_seqeval([gold, pred], [pred, gold])
  assert ner.get_entities(gold) == [(t, a, b) for t, a, b in seqeval_metrics.sequence_labeling
                                    .get_entities(gold)]


def test_edge_case_entities_by_hand():
  assert ner.get_entities(["I-PER", "I-PER", "O", "I-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]
  assert ner.get_entities(["I-PER", "B-PER", "I-PER"]) == [("PER", 0, 0), ("PER", 1, 2)]
  assert ner.get_entities(["B-PER", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 1)]
  assert ner.iob2_to_iob1(["B-PER", "I-PER", "B-PER", "B-LOC", "O", "B-LOC"]) == [
      "I-PER", "I-PER", "B-PER", "I-LOC", "O", "I-LOC"]
  # Entities never cross sentences: "I-PER" opening sentence 2 does not extend sentence 1's.
  m = ner.ner_metrics([["B-PER"], ["I-PER"]], [["B-PER"], ["I-PER"]])
  assert m["num_gold"] == 2 and m["f1"] == 1.0


def _write_conll(path, sentences, docstart=True):
  lines = ["-DOCSTART- -X- -X- O", ""] if docstart else []
  for tokens, tags in sentences:
    lines += [f"{tok} NNP B-NP {tag}" for tok, tag in zip(tokens, tags)] + [""]
  path.write_text("\n".join(lines) + "\n")


def test_reader_iob1_input_and_errors(tmp_path):
  path = tmp_path / "iob1.txt"
  _write_conll(path, [(["EU", "rejects", "German", "call"], ["I-ORG", "O", "I-MISC", "O"]),
                      (["Peter", "Blackburn", "Smith"], ["I-PER", "I-PER", "B-PER"])])
  sents = ner.read_conll(path)
  assert [s.tokens for s in sents] == [["EU", "rejects", "German", "call"],
                                       ["Peter", "Blackburn", "Smith"]]
  assert sents[1].line == 8
  assert ner.get_entities(sents[1].tags) == [("PER", 0, 1), ("PER", 2, 2)]
  path.write_text("EU NNP B-NP B-ORG\nrejects VBZ O\n")
  with pytest.raises(UserError, match=r"iob1.txt:2: 3 columns"):
    ner.read_conll(path)
  path.write_text("EU NNP B-NP X-ORG\n")
  with pytest.raises(UserError, match=r"iob1.txt:1: tag 'X-ORG'"):
    ner.read_conll(path)


def test_predictions_round_trip_and_alignment(tmp_path, valid):
  gold = valid[:50]
  pred_tags = _perturb([s.tags for s in gold], np.random.default_rng(3))
  path = tmp_path / "pred.txt"
  ner.write_ner_predictions(path, [s.tokens for s in gold], pred_tags)
  back = ner.read_ner_predictions(path)
  assert ner.align_predictions(gold, back) == pred_tags
  # A dropped token in sentence 7 is named by its sentence number.
  short = [list(t) for t in pred_tags]
  tokens = [list(s.tokens) for s in gold]
  tokens[6].pop()
  short[6].pop()
  ner.write_ner_predictions(path, tokens, short)
  with pytest.raises(UserError, match=r"sentence 7 .* has \d+ gold tokens but \d+ predicted"):
    ner.align_predictions(gold, ner.read_ner_predictions(path))
  ner.write_ner_predictions(path, [s.tokens for s in gold[:49]], pred_tags[:49])
  with pytest.raises(UserError, match="49 predicted sentences for 50 gold"):
    ner.align_predictions(gold, ner.read_ner_predictions(path))
  with pytest.raises(UserError, match="sentence 2: 1 tokens but 2 tags"):
    ner.write_ner_predictions(path, [["a"], ["b"]], [["O"], ["O", "O"]])
