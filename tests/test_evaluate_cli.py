"""`python -m bertjax.tools.evaluate` on real files and on bad input (subprocesses)."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics

from bertjax.metrics import glue, ner, squad

REPO = pathlib.Path(__file__).resolve().parent.parent


def _run(*args):
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  return subprocess.run([sys.executable, "-m", "bertjax.tools.evaluate", *map(str, args)], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=120)


def _table(*args):
  """(the human-readable lines, the JSON line's object) of a successful evaluation."""
  proc = _run(*args)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.strip().splitlines()
  assert len(lines) >= 2  # human-readable lines first
  return lines[:-1], json.loads(lines[-1])


def _ok(*args):
  return _table(*args)[1]


def _bad(*args, match):
  proc = _run(*args)
  assert proc.returncode == 2, (proc.stdout, proc.stderr)
  assert "Traceback" not in proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1, proc.stderr
  assert lines[0].startswith("error: ") and match in lines[0], lines[0]
  return lines[0]


def test_glue_rte_and_stsb(data_dir, tmp_path):
  rte = data_dir / "glue" / "RTE" / "dev.tsv"
  labels = np.array([r["label"] for r in glue.read_glue_tsv(rte, "rte", "dev")])
  rng = np.random.default_rng(0)
  preds = np.where(rng.random(len(labels)) < 0.7, labels, 1 - labels)
  glue.write_predictions_tsv(tmp_path / "RTE.tsv", preds, "rte")
  lines, result = _table("glue", "--data", rte, "--predictions", tmp_path / "RTE.tsv")  # by name
  assert result["task"] == "rte" and result["num_examples"] == len(labels)
  # The table's scale is the JSON line's, and it says so (61c1c42 printed percent beside fractions).
  assert lines[0].endswith("scores as fractions (0-1), as in the JSON line and a run's rows")
  assert f"  accuracy   {result['accuracy']:8.4f}" in lines
  assert result["accuracy"] == pytest.approx(sklearn.metrics.accuracy_score(labels, preds))

  stsb = data_dir / "glue" / "STS-B" / "dev.tsv"
  gold = np.array([r["label"] for r in glue.read_glue_tsv(stsb, "stsb", "dev")])
  scores = np.clip(gold + rng.normal(0, 1, len(gold)), 0, 5)
  glue.write_predictions_tsv(tmp_path / "preds.tsv", scores, "stsb")
  result = _ok("glue", "--task", "stsb", "--data", stsb, "--predictions",
               tmp_path / "preds.tsv")
  assert result["pearson"] == pytest.approx(scipy.stats.pearsonr(scores, gold)[0], abs=1e-9)
  assert result["spearman"] == pytest.approx(scipy.stats.spearmanr(scores, gold)[0], abs=1e-9)


def test_squad_v2_with_null_odds(data_dir, tmp_path):
  gold = data_dir / "squad" / "v2.0_dev_subset.json"
  _, examples = squad.read_squad(gold)
  rng = np.random.default_rng(1)
  preds = {ex["id"]: (ex["answers"][0]["text"] if ex["answers"] and rng.random() < 0.8 else "")
           for ex in examples}
  odds = {ex["id"]: float(rng.normal()) for ex in examples}
  (tmp_path / "pred.json").write_text(json.dumps(preds))
  (tmp_path / "odds.json").write_text(json.dumps(odds))
  lines, result = _table("squad", "--data", gold, "--predictions", tmp_path / "pred.json",
                         "--null_odds", tmp_path / "odds.json")
  assert lines[0].endswith("exact and f1 scores in percent (0-100), as the official SQuAD script "
                           "and a run's rows give them")
  expected = squad.squad_metrics(examples, preds, null_odds=odds, version="2.0")
  assert result["version"] == "2.0"
  for k, v in expected.items():
    assert result[k] == pytest.approx(v), k


def test_ner_on_valid(data_dir, tmp_path):
  from seqeval.metrics import f1_score
  gold_path = data_dir / "conll2003" / "valid.txt"
  gold = ner.read_conll(gold_path)
  rng = np.random.default_rng(2)
  pred = [[t if rng.random() < 0.9 else "O" for t in s.tags] for s in gold]
  ner.write_ner_predictions(tmp_path / "pred.txt", [s.tokens for s in gold], pred)
  lines, result = _table("ner", "--data", gold_path, "--predictions", tmp_path / "pred.txt")
  assert result["f1"] == pytest.approx(f1_score([s.tags for s in gold], pred), abs=1e-12)
  assert lines[0].endswith("scores as fractions (0-1), as in the JSON line and a run's rows")
  assert lines[-1].split()[1:4] == [f"{result[k]:.4f}" for k in ("precision", "recall", "f1")]
  assert set(result["per_type"]) == {"PER", "LOC", "ORG", "MISC"}


@pytest.mark.slow
def test_bad_input_is_one_line_exit_2(data_dir, tmp_path):
  v1 = data_dir / "squad" / "v1.1_dev_subset.json"
  _, examples = squad.read_squad(v1)
  partial = {ex["id"]: "x" for ex in examples[5:]}
  (tmp_path / "partial.json").write_text(json.dumps(partial))
  line = _bad("squad", "--data", v1, "--predictions", tmp_path / "partial.json",
              match="lack 5 of")
  assert examples[0]["id"] in line
  _bad("squad", "--task", "squad_v2", "--data", v1, "--predictions", tmp_path / "partial.json",
       match="is SQuAD v1.1, not v2.0")

  rte = data_dir / "glue" / "RTE" / "dev.tsv"
  (tmp_path / "RTE.tsv").write_text("index\tprediction\n0\tentailment\n1\n")
  _bad("glue", "--data", rte, "--predictions", tmp_path / "RTE.tsv", match="RTE.tsv:3:")
  (tmp_path / "RTE.tsv").write_text("index\tprediction\n0\tentailment\n")
  _bad("glue", "--data", rte, "--predictions", tmp_path / "RTE.tsv",
       match="lacks predictions for 276 of 277")
  (tmp_path / "dev.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n"
                                    "1\ta b\tentailment\n")
  _bad("glue", "--task", "rte", "--data", tmp_path / "dev.tsv", "--predictions",
       tmp_path / "RTE.tsv", match="dev.tsv:3: 3 tab-separated columns")
  _bad("glue", "--data", tmp_path / "dev.tsv", "--predictions", tmp_path / "x.tsv",
       match="pass --task")

  conll = data_dir / "conll2003" / "valid.txt"
  gold = ner.read_conll(conll)
  tokens = [s.tokens for s in gold]
  tags = [s.tags for s in gold]
  tokens[2] = tokens[2][:-1]
  tags[2] = tags[2][:-1]
  ner.write_ner_predictions(tmp_path / "ner.txt", tokens, tags)
  _bad("ner", "--data", conll, "--predictions", tmp_path / "ner.txt", match="sentence 3 ")

  _bad("squad", "--data", v1, match="--predictions")  # argparse usage error, one line too
  _bad("glue", "--data", tmp_path / "missing.tsv", "--predictions", tmp_path / "RTE.tsv",
       match="not found")
