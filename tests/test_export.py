"""Export (`python -m bertjax.convert to-hf`) and `bertjax.load` of trained workdirs.

Tiny runs train on the shipped sample and the real data in ../shared/data for a few steps; each
export is loaded with transformers (model and AutoTokenizer) and must compute what bertjax
computes: MLM logits of a pretraining run, and the logits of the fine-tuning runs' own
prediction pass (GLUE classification and STS-B regression, SQuAD, CoNLL NER).
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest
import torch
import transformers as T

import bertjax
from bertjax import convert
from bertjax.core.errors import UserError
from bertjax.models.pretraining import PretrainingModel
from bertjax.trainer import train

from export_helpers import (QUIET, SMALL, TOL, glue_run, hf_load, hf_logits, max_diff,
                            own_prediction, sample_ids, to_hf)
from helpers import REPO, TINY, load_config


# ----------------------------------------------------------------------------- pretraining


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> pathlib.Path:
  """configs/quickstart.py:runlocal with a tiny model: 4 steps, checkpoints at 2 and 4."""
  workdir = tmp_path_factory.mktemp("qs") / "run"
  config = load_config("configs/quickstart.py:runlocal", **{**TINY, "total_steps": 4,
                                                           "checkpoint_every": 2, "eval_every": 0})
  train.train_and_evaluate(config, workdir)
  return workdir


@pytest.mark.slow
def test_quickstart_export_matches_bertjax(quickstart, tmp_path):
  out = tmp_path / "hf"
  code, stdout, stderr = to_hf("--workdir", quickstart, "--output", out)
  assert code == 0, stderr
  assert f"exported the pretraining folder at step 4 {quickstart}" in stdout[0]
  assert any(l.startswith("wrote BertForPreTraining to") and "heads: mlm, pair" in l
             for l in stdout), stdout
  assert "tokenizer files: spiece.model, tokenizer_config.json, special_tokens_map.json" in stdout
  hf = hf_load(T.BertForPreTraining, out)
  tok, texts, ids, mask, types = sample_ids(quickstart)
  m = bertjax.load(quickstart)
  assert isinstance(m.head_model, PretrainingModel) and m.heads == ("mlm", "pair")
  assert m.untrained == () and m.task is None and m.source.step == 4
  positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  ours = m.head_model.apply({"params": m.head_params}, ids, mask, types, positions,
                            deterministic=True)
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor(ids, dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long),
                token_type_ids=torch.tensor(types, dtype=torch.long))
  real = mask.astype(bool)
  assert max_diff(np.asarray(ours["mlm_logits"])[real], theirs.prediction_logits.numpy()[real]) < TOL
  assert max_diff(ours["pair_logits"], theirs.seq_relationship_logits.numpy()) < TOL
  # The tokenizer: transformers gives the ids bertjax's pipelines build, specials included.
  hf_tok = T.AutoTokenizer.from_pretrained(out)
  for i, (a, b) in enumerate(texts):
    enc = hf_tok(a, b)
    n = int(mask[i].sum())
    assert enc["input_ids"] == ids[i, :n].tolist()
    assert enc["token_type_ids"] == types[i, :n].tolist()
  # --step picks an earlier checkpoint: other weights.
  code, stdout, _ = to_hf("--workdir", quickstart, "--output", tmp_path / "step2", "--step", "2")
  assert code == 0 and "at step 2" in stdout[0]
  early = hf_load(T.BertForPreTraining, tmp_path / "step2")
  assert not torch.equal(early.cls.predictions.bias, hf.cls.predictions.bias)


@pytest.mark.slow
def test_readme_export_section_runs(quickstart, tmp_path):
  """The README's "Export and load a trained model" commands, on a quickstart-like run."""
  section = (REPO / "README.md").read_text().split("## Export and load a trained model")[1]
  bash = section.split("```bash\n")[1].split("```")[0].strip().splitlines()
  assert bash[0].startswith("python launch.py --config configs/quickstart.py --workdir runs/quickstart")
  command = bash[1].split()
  assert command[:4] == ["python", "-m", "bertjax.convert", "to-hf"]
  hf_dir = tmp_path / "quickstart_hf"
  args = [a.replace("runs/quickstart_hf", str(hf_dir)).replace("runs/quickstart", str(quickstart))
          for a in command[4:]]
  code, _, stderr = to_hf(*args)
  assert code == 0, stderr
  code = section.split("```python\n")[1].split("```")[0]
  code = code.replace("runs/quickstart_hf", str(hf_dir)).replace("runs/quickstart", str(quickstart))
  exec(compile(code, "README.md", "exec"), {})  # pylint: disable=exec-used


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--step", "3"], "--step 3: "),
    (["--step", "last"], "--step 'last' must be a checkpoint step"),
    (["--output-is-not-empty"], "is not empty"),
    (["--unknown-workdir"], "is not a bertjax model folder"),
    (["--include-untrained-heads", "mlm"], "--include-untrained-heads mlm: "),
])
def test_failed_export_is_one_line_and_writes_nothing(quickstart, tmp_path, args, message):
  out = tmp_path / "out"
  workdir = quickstart
  if args == ["--output-is-not-empty"]:
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    args = []
  elif args == ["--unknown-workdir"]:
    workdir, args = tmp_path / "elsewhere", []
    workdir.mkdir()
  code, stdout, stderr = to_hf("--workdir", workdir, "--output", out, *args)
  assert code == 2 and len(stderr) == 1 and stderr[0].startswith("error: "), stderr
  assert message in stderr[0], stderr
  assert not stdout
  if out.exists():
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
      p.name for p in (out, workdir) if p.exists() and p.parent == tmp_path)  # no staging left


# ----------------------------------------------------------------------------- untrained heads


def test_bare_encoder_exports_no_random_head(tmp_path):
  torch.manual_seed(0)
  src = tmp_path / "bare"
  T.BertModel(T.BertConfig(**SMALL)).save_pretrained(src)
  convert.convert_from_hf(src, tmp_path / "work", **QUIET)
  lines = []
  convert.convert_to_hf(tmp_path / "work", tmp_path / "plain", log=lines.append)
  written = json.loads((tmp_path / "plain" / "config.json").read_text())
  assert written["architectures"] == ["BertModel"]
  assert any(l.startswith("wrote BertModel") and "heads: none" in l for l in lines), lines
  for head in ("mlm", "pair"):
    assert any(l.startswith(f"left out {head}: never trained") and
               f"--include-untrained-heads {head}" in l for l in lines), lines
  back = hf_load(T.AutoModel, tmp_path / "plain")
  original = T.BertModel.from_pretrained(src)
  for k, v in original.state_dict().items():
    assert torch.equal(v, back.state_dict()[k]), k

  lines = []
  convert.convert_to_hf(tmp_path / "work", tmp_path / "flagged", include=["mlm", "pair"],
                        log=lines.append)
  written = json.loads((tmp_path / "flagged" / "config.json").read_text())
  assert written["architectures"] == ["BertForPreTraining"]
  assert any("heads: mlm, pair" in l for l in lines) and not any("left out" in l for l in lines)
  fresh = convert.load_workdir(tmp_path / "work").params["mlm"]["bias"]
  hf = hf_load(T.BertForPreTraining, tmp_path / "flagged")
  np.testing.assert_array_equal(hf.cls.predictions.bias.detach().numpy(), fresh)
  lines = []
  convert.convert_to_hf(tmp_path / "work", tmp_path / "mlm_only", include=["mlm"],
                        log=lines.append)
  assert json.loads((tmp_path / "mlm_only" / "config.json").read_text())["architectures"] == [
      "BertForMaskedLM"]
  assert any(l.startswith("left out pair: never trained") for l in lines)
  with pytest.raises(UserError, match="no untrained part of that name"):
    convert.convert_to_hf(tmp_path / "work", tmp_path / "bad", include=["rtd"], **QUIET)
  with pytest.raises(UserError, match="--step applies to training workdirs"):
    convert.convert_to_hf(tmp_path / "work", tmp_path / "bad", step=3, **QUIET)
  assert not (tmp_path / "bad").exists()


# ----------------------------------------------------------------------------- fine-tuning


@pytest.mark.slow
@pytest.mark.parametrize("task", ["rte", "stsb"])
def test_glue_export_matches_prediction_pass(tmp_path_factory, data_dir, task):
  config, workdir = glue_run(tmp_path_factory, data_dir, task)
  out = workdir.parent / "hf"
  code, stdout, stderr = to_hf("--workdir", workdir, "--output", out)
  assert code == 0, stderr
  written = json.loads((out / "config.json").read_text())
  assert written["architectures"] == ["BertForSequenceClassification"]
  if task == "rte":
    assert written["id2label"] == {"0": "entailment", "1": "not_entailment"}
    assert written["problem_type"] == "single_label_classification"
  else:
    assert written["problem_type"] == "regression" and len(written["id2label"]) == 1
  assert any("heads: classifier" in l for l in stdout), stdout
  m = bertjax.load(workdir)
  eval_set, ours = own_prediction(config, workdir, m.head_params)
  a = eval_set.arrays
  hf = hf_load(T.AutoModelForSequenceClassification, out)
  assert type(hf).__name__ == "BertForSequenceClassification" and hf.num_labels == (
      1 if task == "stsb" else 2)
  theirs = hf_logits(hf, a["input_ids"], a["attention_mask"], a["token_type_ids"])
  assert max_diff(theirs, ours["logits"]) < TOL
  # bertjax.load's head gives the run's predictions too, as does the best/ folder it kept.
  assert max_diff(m.logits(a["input_ids"], a["attention_mask"], a["token_type_ids"]),
                  ours["logits"]) < TOL
  assert m.task.kind == "sequence" and m.task.regression == (task == "stsb")
  best = bertjax.load(workdir / "best")
  assert best.source.kind == "best" and best.source.step == 4
  assert max_diff(best.logits(a["input_ids"][:8], a["attention_mask"][:8],
                              a["token_type_ids"][:8]), ours["logits"][:8]) < TOL
  leaderboard = {"rte": "RTE.tsv", "stsb": "STS-B.tsv"}[task]
  lines = (workdir / "predictions" / "step_4" / "dev" / leaderboard).read_text().splitlines()[1:]
  written_preds = [l.split("\t")[1] for l in lines]
  if task == "rte":
    assert written_preds == [m.task.labels[i] for i in ours["logits"].argmax(-1)]
  else:
    np.testing.assert_allclose([float(p) for p in written_preds], ours["logits"][:, 0],
                               atol=1e-3)
  # The sentencepiece tokenizer loads in transformers and encodes the pairs as the run did.
  tok = T.AutoTokenizer.from_pretrained(out)
  rows = [l.split("\t") for l in (workdir.parent / "glue" / {"rte": "RTE", "stsb": "STS-B"}[task]
                                  / "dev.tsv").read_text().splitlines()[1:21]]
  cols = (1, 2) if task == "rte" else (7, 8)
  for i, r in enumerate(rows):
    n = int(a["attention_mask"][i].sum())
    if n < config.max_seq_length:  # not truncated
      assert tok(r[cols[0]], r[cols[1]])["input_ids"] == a["input_ids"][i, :n].tolist()


@pytest.fixture(scope="module")
def squad_run(tmp_path_factory):
  data = pathlib.Path(os.environ.get("BERTJAX_DATA", REPO.parent / "shared" / "data"))
  if not data.is_dir():  # as the data_dir fixture, which a module-scoped fixture cannot use
    pytest.skip(f"shared data not found at {data}; set BERTJAX_DATA to its folder")
  src = json.loads((data / "squad" / "v1.1_dev_subset.json").read_text(encoding="utf-8"))
  root = tmp_path_factory.mktemp("squad")
  for name, titles in (("train.json", {"Super_Bowl_50"}), ("dev.json", {"Normans"})):
    part = dict(src, data=[a for a in src["data"] if a["title"] in titles])
    (root / name).write_text(json.dumps(part), encoding="utf-8")
  config = load_config("configs/squad.py:runlocal", **{
      **TINY, "data_dir": str(root), "train_file": "train.json", "dev_file": "dev.json",
      "max_seq_length": 96, "doc_stride": 48, "max_query_length": 24, "total_steps": 3,
      "eval_every": 3, "batch_size": 16, "eval_batch_size": 32, "data.vocab_size": 1500,
      "model.vocab_size": 1500})
  train.train_and_evaluate(config, root / "run")
  return config, root / "run"


@pytest.mark.slow
def test_squad_export_matches_prediction_pass(squad_run, data_dir, tmp_path):
  config, workdir = squad_run
  code, stdout, stderr = to_hf("--workdir", workdir, "--output", tmp_path / "hf")
  assert code == 0, stderr
  assert any(l.startswith("wrote BertForQuestionAnswering") for l in stdout), stdout
  m = bertjax.load(workdir)
  assert m.task.kind == "qa" and m.task.name == "qa_outputs"
  eval_set, ours = own_prediction(config, workdir, m.head_params)
  a = {k: v[:64] for k, v in eval_set.arrays.items()}
  hf = hf_load(T.AutoModelForQuestionAnswering, tmp_path / "hf")
  start = hf_logits(hf, a["input_ids"], a["attention_mask"], a["token_type_ids"], "start_logits")
  end = hf_logits(hf, a["input_ids"], a["attention_mask"], a["token_type_ids"], "end_logits")
  real = a["attention_mask"].astype(bool)  # ours are masked to -inf-like values at padding
  assert max_diff(start[real], ours["start_logits"][:64][real]) < TOL
  assert max_diff(end[real], ours["end_logits"][:64][real]) < TOL
  logits = np.asarray(m.logits(a["input_ids"], a["attention_mask"], a["token_type_ids"]))
  assert max_diff(logits[..., 0][real], ours["start_logits"][:64][real]) < TOL


@pytest.mark.slow
def test_conll_export_matches_prediction_pass(tmp_path, data_dir):
  conll = data_dir / "conll2003"
  lines = (conll / "valid.txt").read_text().split("\n\n")
  (tmp_path / "dev.txt").write_text("\n\n".join(lines[:60]) + "\n")
  config = load_config("configs/ner.py:runlocal", **{
      **TINY, "data_dir": str(tmp_path), "train_file": str(conll / "test.txt"),
      "dev_file": "dev.txt", "test_file": "", "max_train_examples": 128, "total_steps": 3,
      "eval_every": 3, "batch_size": 16, "eval_batch_size": 16, "max_seq_length": 48})
  workdir = tmp_path / "run"
  train.train_and_evaluate(config, workdir)
  code, stdout, stderr = to_hf("--workdir", workdir, "--output", tmp_path / "hf")
  assert code == 0, stderr
  written = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert written["architectures"] == ["BertForTokenClassification"]
  assert list(written["id2label"].values()) == ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC",
                                                "I-LOC", "B-MISC", "I-MISC"]
  m = bertjax.load(workdir)
  eval_set, ours = own_prediction(config, workdir, m.head_params)
  a = eval_set.arrays
  hf = hf_load(T.AutoModelForTokenClassification, tmp_path / "hf")
  theirs = hf_logits(hf, a["input_ids"], a["attention_mask"], a["token_type_ids"])
  logits = np.asarray(m.logits(a["input_ids"], a["attention_mask"], a["token_type_ids"]))
  assert max_diff(theirs, logits) < TOL
  real = a["attention_mask"].astype(bool)
  # The run's own prediction pass picks the tags both give.
  np.testing.assert_array_equal(theirs.argmax(-1)[real], ours["predicted"][real])
  np.testing.assert_array_equal(logits.argmax(-1)[real], ours["predicted"][real])
