"""GLUE reader, metrics and leaderboard files, checked against independent references.

Metrics are compared with scikit-learn and scipy on random predictions and on the labels of the
real dev files; the reader is compared with Hugging Face's (deprecated but independent) GLUE
processors, on the real files and on small synthetic files in the official MNLI/QQP layouts.
"""

import math
import pathlib
import warnings

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics

from bertjax.core.errors import UserError
from bertjax.metrics import glue

# (tfds task, GLUE folder, HF processor name) for the dev files in ../shared/data/glue.
REAL_DEV = [("cola", "CoLA", "cola"), ("sst2", "SST-2", "sst-2"), ("mrpc", "MRPC", "mrpc"),
            ("stsb", "STS-B", "sts-b"), ("qnli", "QNLI", "qnli"), ("rte", "RTE", "rte"),
            ("wnli", "WNLI", "wnli")]


def _hf_examples(processor: str, folder: pathlib.Path, split: str = "dev"):
  from transformers.data.processors.glue import glue_processors
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    p = glue_processors[processor]()
    if split == "train":
      return p.get_train_examples(str(folder))
    return p.get_dev_examples(str(folder))


@pytest.mark.parametrize("task,folder,hf", REAL_DEV)
def test_reader_matches_hf_processor_on_real_dev(data_dir, task, folder, hf):
  rows = glue.read_glue_tsv(data_dir / "glue" / folder / "dev.tsv", task, "dev")
  ref = _hf_examples(hf, data_dir / "glue" / folder)
  assert len(rows) == len(ref)
  t = glue.get_task(task)
  for row, ex in zip(rows, ref):
    assert row["sentence1"] == ex.text_a
    assert row["sentence2"] == ex.text_b
    if t.is_regression:
      assert row["label"] == float(ex.label)
    else:
      assert t.labels[row["label"]] == ex.label
  assert [r["idx"] for r in rows] == list(range(len(rows)))


def test_reader_train_files_counts_match_hf(data_dir):
  for task, folder, hf in [("cola", "CoLA", "cola"), ("stsb", "STS-B", "sts-b"),
                           ("mrpc", "MRPC", "mrpc")]:
    rows = glue.read_glue_tsv(data_dir / "glue" / folder / "train.tsv", task, "train")
    ref = _hf_examples(hf, data_dir / "glue" / folder, "train")
    assert len(rows) == len(ref)
    assert [r["sentence2"] for r in rows] == [e.text_b for e in ref]


def _write(path: pathlib.Path, lines: list[list[str]]) -> pathlib.Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join("\t".join(r) + "\n" for r in lines), encoding="utf-8")
  return path


def test_mnli_and_qqp_official_layouts_match_hf(tmp_path):
  rng = np.random.default_rng(0)
  mnli_dev_header = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
                     "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
                     "sentence2", "label1", "label2", "label3", "label4", "label5", "gold_label"]
  mnli_train_header = mnli_dev_header[:11] + ["gold_label"]
  labels = ["entailment", "neutral", "contradiction"]
  dev_rows, train_rows = [mnli_dev_header], [mnli_train_header]
  for k in range(7):
    s1, s2 = f"premise {k} \"quoted", f"hypothesis {k}"
    gold = labels[rng.integers(3)]
    votes = [labels[rng.integers(3)] for _ in range(5)]
    common = [str(k), "p", "q", "fiction", "( x )", "( y )", "(S x)", "(S y)", s1, s2]
    dev_rows.append(common + votes + [gold])
    train_rows.append(common + [votes[0], gold])
  mnli = tmp_path / "MNLI"
  _write(mnli / "dev_matched.tsv", dev_rows)
  _write(mnli / "dev_mismatched.tsv", dev_rows)
  _write(mnli / "train.tsv", train_rows)
  qqp_rows = [["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]]
  for k in range(6):
    qqp_rows.append([str(k), str(2 * k), str(2 * k + 1), f"q{k}?", f"other {k}?",
                     str(rng.integers(2))])
  qqp = tmp_path / "QQP"
  _write(qqp / "dev.tsv", qqp_rows)
  for task, folder, file, hf, split in [
      ("mnli_matched", mnli, "dev_matched.tsv", "mnli", "dev"),
      ("mnli", mnli, "train.tsv", "mnli", "train"),
      ("qqp", qqp, "dev.tsv", "qqp", "dev")]:
    rows = glue.read_glue_tsv(folder / file, task, split)
    ref = _hf_examples(hf, folder, split)
    t = glue.get_task(task)
    assert [(r["sentence1"], r["sentence2"], t.labels[r["label"]]) for r in rows] == [
        (e.text_a, e.text_b, e.label) for e in ref]


def test_reader_reports_malformed_rows_and_bad_labels(tmp_path):
  good = ["index", "sentence1", "sentence2", "label"]
  path = _write(tmp_path / "rte.tsv", [good, ["0", "a", "b", "entailment"],
                                       ["1", "a", "not_entailment"]])
  with pytest.raises(UserError, match=r"rte.tsv:3: 3 tab-separated columns, expected 4"):
    glue.read_glue_tsv(path, "rte", "dev")
  path = _write(tmp_path / "rte2.tsv", [good, ["0", "a", "b", "entailment"],
                                        ["1", "a", "b", "contradiction"]])
  with pytest.raises(UserError, match=r"rte2.tsv:3: label 'contradiction' is not a rte label"):
    glue.read_glue_tsv(path, "rte", "dev")
  # A CoLA dev file has no header: a header row shows up as a bad label on line 1.
  path = _write(tmp_path / "cola.tsv", [["source", "label", "mark", "sentence"]])
  with pytest.raises(UserError, match=r"cola.tsv:1: label 'label'"):
    glue.read_glue_tsv(path, "cola", "dev")
  path = _write(tmp_path / "stsb.tsv", [["h"] * 10, ["x"] * 10])
  with pytest.raises(UserError, match=r"stsb.tsv:2: score 'x' is not a finite number"):
    glue.read_glue_tsv(path, "stsb", "dev")
  with pytest.raises(UserError, match="no official train file"):
    glue.read_glue_tsv(path, "ax", "train")
  with pytest.raises(UserError, match="unknown GLUE task"):
    glue.get_task("squad")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_classification_metrics_match_sklearn_on_random(seed):
  rng = np.random.default_rng(seed)
  n = int(rng.integers(5, 300))
  labels = rng.integers(0, 2, n)
  # Predictions correlated with the labels, so the metrics are not all near 0.
  preds = np.where(rng.random(n) < 0.7, labels, rng.integers(0, 2, n))
  for task in ("mrpc", "qqp"):
    m = glue.glue_metrics(task, preds, labels)
    assert m["f1"] == pytest.approx(sklearn.metrics.f1_score(labels, preds), abs=1e-12)
    assert m["accuracy"] == pytest.approx(sklearn.metrics.accuracy_score(labels, preds))
  m = glue.glue_metrics("cola", preds, labels)
  assert m["mcc"] == pytest.approx(sklearn.metrics.matthews_corrcoef(labels, preds), abs=1e-12)
  labels3 = rng.integers(0, 3, n)
  preds3 = np.where(rng.random(n) < 0.5, labels3, rng.integers(0, 3, n))
  for task in ("mnli_matched", "mnli_mismatched", "mnli"):
    m = glue.glue_metrics(task, preds3, labels3)
    assert m == {"accuracy": pytest.approx(sklearn.metrics.accuracy_score(labels3, preds3))}
  # AX uses the multi-class Matthews correlation (R3).
  m = glue.glue_metrics("ax", preds3, labels3)
  assert m["mcc"] == pytest.approx(sklearn.metrics.matthews_corrcoef(labels3, preds3),
                                   abs=1e-12)


def test_degenerate_classification_metrics_match_sklearn():
  labels = np.array([0, 0, 1, 1, 0])
  for preds in (np.zeros(5, int), np.ones(5, int), labels, 1 - labels):
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      ref_f1 = sklearn.metrics.f1_score(labels, preds, zero_division=0)
      ref_mcc = sklearn.metrics.matthews_corrcoef(labels, preds)
    assert glue.binary_f1(preds, labels) == pytest.approx(ref_f1)
    assert glue.matthews_corrcoef(preds, labels) == pytest.approx(ref_mcc)
  # No positives anywhere: F1 is 0 (sklearn's zero_division default), not NaN.
  assert glue.binary_f1(np.zeros(4, int), np.zeros(4, int)) == 0.0


@pytest.mark.parametrize("seed", [0, 1])
def test_correlations_match_scipy_with_ties(seed):
  rng = np.random.default_rng(seed)
  n = 200
  gold = np.round(rng.uniform(0, 5, n), 1)  # rounded: many ties, as in STS-B
  preds = np.round(gold + rng.normal(0, 1.5, n), 0)
  m = glue.glue_metrics("stsb", preds, gold)
  assert m["pearson"] == pytest.approx(scipy.stats.pearsonr(preds, gold)[0], abs=1e-12)
  assert m["spearman"] == pytest.approx(scipy.stats.spearmanr(preds, gold)[0], abs=1e-12)
  np.testing.assert_allclose(glue.rankdata(preds), scipy.stats.rankdata(preds))
  # Constant predictions: undefined, NaN like scipy.
  assert math.isnan(glue.glue_metrics("stsb", np.ones(n), gold)["pearson"])


@pytest.mark.parametrize("task,folder,hf", REAL_DEV)
def test_metrics_on_real_dev_labels_match_references(data_dir, task, folder, hf):
  rows = glue.read_glue_tsv(data_dir / "glue" / folder / "dev.tsv", task, "dev")
  labels = np.array([r["label"] for r in rows])
  rng = np.random.default_rng(len(rows))
  t = glue.get_task(task)
  if t.is_regression:
    preds = np.clip(labels + rng.normal(0, 1.0, len(labels)), 0, 5)
    m = glue.glue_metrics(task, preds, labels)
    assert m["pearson"] == pytest.approx(scipy.stats.pearsonr(preds, labels)[0], abs=1e-10)
    assert m["spearman"] == pytest.approx(scipy.stats.spearmanr(preds, labels)[0], abs=1e-10)
    return
  preds = np.where(rng.random(len(labels)) < 0.75, labels,
                   rng.integers(0, len(t.labels), len(labels)))
  m = glue.glue_metrics(task, preds, labels)
  assert m["accuracy" if "accuracy" in m else "mcc"] == pytest.approx(
      sklearn.metrics.accuracy_score(labels, preds) if "accuracy" in m
      else sklearn.metrics.matthews_corrcoef(labels, preds), abs=1e-12)
  if "f1" in m:
    assert m["f1"] == pytest.approx(sklearn.metrics.f1_score(labels, preds), abs=1e-12)
  # Perfect predictions score 1 on every GLUE classification metric.
  assert all(v == pytest.approx(1.0) for v in glue.glue_metrics(task, labels, labels).values())


def test_predictions_accept_label_strings_and_scores():
  labels = np.array([0, 1, 2, 1])
  logits = np.eye(3)[[0, 1, 1, 1]] + 0.1
  by_scores = glue.glue_metrics("mnli_matched", logits, labels)
  by_strings = glue.glue_metrics(
      "mnli_matched", ["entailment", "neutral", "neutral", "neutral"], labels)
  assert by_scores == by_strings == {"accuracy": 0.75}
  with pytest.raises(UserError, match="not a label"):
    glue.glue_metrics("rte", ["yes", "no"], [0, 1])
  with pytest.raises(UserError, match="3 predictions for 4 gold labels"):
    glue.glue_metrics("rte", [0, 1, 1], [0, 1, 1, 0])


def test_leaderboard_tsv_round_trip(tmp_path):
  rng = np.random.default_rng(3)
  preds = rng.integers(0, 3, 50)
  path = tmp_path / glue.LEADERBOARD_FILES["mnli_mismatched"]
  glue.write_predictions_tsv(path, preds, "mnli_mismatched")
  lines = path.read_text().splitlines()
  assert lines[0] == "index\tprediction"
  assert lines[1] == f"0\t{glue.GLUE_TASKS['mnli'].labels[preds[0]]}"
  index, back = glue.read_predictions_tsv(path, "mnli_mismatched")
  np.testing.assert_array_equal(index, np.arange(50))
  np.testing.assert_array_equal(back, preds)
  scores = rng.uniform(0, 5, 20).astype(np.float32)
  glue.write_predictions_tsv(tmp_path / "STS-B.tsv", scores, "stsb")
  _, back = glue.read_predictions_tsv(tmp_path / "STS-B.tsv", "stsb")
  np.testing.assert_array_equal(back.astype(np.float32), scores)
  glue.write_predictions_tsv(tmp_path / "CoLA.tsv", [1, 0], "cola")
  assert (tmp_path / "CoLA.tsv").read_text() == "index\tprediction\n0\t1\n1\t0\n"


def test_leaderboard_reader_errors(tmp_path):
  bad = tmp_path / "RTE.tsv"
  bad.write_text("index\tprediction\n0\tentailment\n0\tnot_entailment\n")
  with pytest.raises(UserError, match=r"RTE.tsv:3: index 0 already given on line 2"):
    glue.read_predictions_tsv(bad, "rte")
  bad.write_text("id\tlabel\n0\tentailment\n")
  with pytest.raises(UserError, match=r"RTE.tsv:1: header must be"):
    glue.read_predictions_tsv(bad, "rte")
  bad.write_text("index\tprediction\n0\tentailment\textra\n")
  with pytest.raises(UserError, match=r"RTE.tsv:2: 3 columns"):
    glue.read_predictions_tsv(bad, "rte")


def test_leaderboard_file_names():
  assert set(glue.LEADERBOARD_FILES.values()) == {
      "CoLA.tsv", "SST-2.tsv", "MRPC.tsv", "STS-B.tsv", "QQP.tsv", "MNLI-m.tsv", "MNLI-mm.tsv",
      "QNLI.tsv", "RTE.tsv", "WNLI.tsv", "AX.tsv"}
  assert glue.task_from_leaderboard_file("/x/MNLI-mm.tsv").name == "mnli_mismatched"
  assert glue.task_from_leaderboard_file("/x/dev.tsv") is None


def test_glue_average_follows_paper_convention():
  rng = np.random.default_rng(5)
  results = {
      "cola": {"mcc": rng.random()},
      "sst2": {"accuracy": rng.random()},
      "mrpc": {"f1": rng.random(), "accuracy": rng.random()},
      "stsb": {"pearson": rng.random(), "spearman": rng.random()},
      "qqp": {"f1": rng.random(), "accuracy": rng.random()},
      "mnli_matched": {"accuracy": rng.random()},
      "mnli_mismatched": {"accuracy": rng.random()},
      "qnli": {"accuracy": rng.random()},
      "rte": {"accuracy": rng.random()},
  }
  avg = glue.glue_average(results)
  # WNLI and AX do not count, whatever their values.
  assert glue.glue_average({**results, "wnli": {"accuracy": 0.0}, "ax": {"mcc": -1.0}}) == avg
  # Eight tasks: replacing MNLI m and mm by their mean as "mnli" changes nothing.
  merged = {k: v for k, v in results.items() if not k.startswith("mnli_")}
  mnli = (results["mnli_matched"]["accuracy"] + results["mnli_mismatched"]["accuracy"]) / 2
  assert glue.glue_average({**merged, "mnli": {"accuracy": mnli}}) == pytest.approx(avg)
  # Raising MRPC's F1 by d raises its task score by d/2 and the average by d/16.
  bumped = {**results, "mrpc": {**results["mrpc"], "f1": results["mrpc"]["f1"] + 0.16}}
  assert glue.glue_average(bumped) - avg == pytest.approx(0.01)
  with pytest.raises(UserError, match="no GLUE task to average"):
    glue.glue_average({"wnli": {"accuracy": 1.0}})
  with pytest.raises(UserError, match="mrpc results lack f1"):
    glue.glue_average({"mrpc": {"accuracy": 1.0}})
