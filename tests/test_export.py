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
import tokenizers as hf_tokenizers
import torch
import transformers as T

import bertjax
from bertjax import convert, sharding, train
from bertjax.data import tokenizers
from bertjax.errors import UserError
from bertjax.models.pretraining import PretrainingModel
from bertjax.registry import get_objective

from helpers import REPO, TINY, load_config, run_module

TOL = 1e-4
SMALL = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=37, max_position_embeddings=40)
QUIET = dict(log=lambda *_: None)


def to_hf(*args) -> tuple[int, list[str], list[str]]:
  proc = run_module("-m", "bertjax.convert", "to-hf", *map(str, args))
  return proc.returncode, proc.stdout.splitlines(), proc.stderr.strip().splitlines()


def hf_logits(model, ids, mask, types, field="logits"):
  with torch.no_grad():
    out = model(input_ids=torch.tensor(np.asarray(ids, np.int64)),
                attention_mask=torch.tensor(np.asarray(mask, np.int64)),
                token_type_ids=torch.tensor(np.asarray(types, np.int64)))
  return getattr(out, field).numpy()


def hf_load(cls, path):
  """transformers' `cls` from `path`, checking that every weight came from the export (none
  initialized fresh, none ignored)."""
  model, info = cls.from_pretrained(path, output_loading_info=True)
  assert info["missing_keys"] == [] and info["unexpected_keys"] == [], info
  return model.eval()


def max_diff(a, b) -> float:
  return float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))


# ----------------------------------------------------------------------------- pretraining


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> pathlib.Path:
  """configs/quickstart.py:runlocal with a tiny model: 4 steps, checkpoints at 2 and 4."""
  workdir = tmp_path_factory.mktemp("qs") / "run"
  config = load_config("configs/quickstart.py:runlocal", **{**TINY, "total_steps": 4,
                                                           "checkpoint_every": 2, "eval_every": 0})
  train.train_and_evaluate(config, workdir)
  return workdir


def _sample_ids(workdir: pathlib.Path):
  tok = tokenizers.load_tokenizer(workdir / "tokenizer")
  texts = [("The game began in 1998 .", "It was released in Japan ."), ("A second, longer line of "
           "text about the history of the river valley .", "Short one .")]
  rows = [[tok.cls_id, *tok.encode(a), tok.sep_id, *tok.encode(b), tok.sep_id] for a, b in texts]
  seq = max(map(len, rows))
  ids = np.full((len(rows), seq), tok.pad_id, np.int32)
  mask, types = np.zeros_like(ids), np.zeros_like(ids)
  for i, (r, (a, _)) in enumerate(zip(rows, texts)):
    ids[i, :len(r)], mask[i, :len(r)] = r, 1
    types[i, len(tok.encode(a)) + 2:len(r)] = 1
  return tok, texts, ids, mask, types


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
  tok, texts, ids, mask, types = _sample_ids(quickstart)
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


def own_prediction(config, workdir: pathlib.Path, params):
  """The run's own prediction pass (TaskObjective.predict) over its first dev set."""
  objective = get_objective(config)
  objective.build_inputs(config, workdir)
  objective.make_model(objective.model_config(config))
  mesh = sharding.make_mesh(config.mesh_shape)
  context = train.EvalContext(mesh=mesh, rules=sharding.rules_from_config(config),
                              workdir=workdir, step=0, total_steps=1, eval_step=None,
                              batches=None)
  eval_set = objective.eval_sets[0]
  return eval_set, objective.predict(params, context, eval_set)


def glue_run(tmp_path_factory, data_dir, task: str, **settings):
  folder = {"rte": "RTE", "stsb": "STS-B"}[task]
  root = tmp_path_factory.mktemp(task) / "glue"
  (root / folder).mkdir(parents=True)
  for name in ("train.tsv", "dev.tsv"):
    (root / folder / name).symlink_to(data_dir / "glue" / folder / name)
  config = load_config(f"configs/glue.py:task={task},runlocal",
                       **{**TINY, "data_dir": str(root), "max_train_examples": 64,
                          "total_steps": 4, "batch_size": 16, "eval_batch_size": 32,
                          "max_seq_length": 64, "eval_every": 4, **settings})
  workdir = root.parent / "run"
  train.train_and_evaluate(config, workdir)
  return config, workdir


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


# ----------------------------------------------------------------------------- other architectures

ARCHS = {  # config, the class its export is, a model with its heads' outputs to compare
    "roberta": ("configs/roberta.py:runlocal", "RobertaForMaskedLM"),
    "albert": ("configs/albert.py:runlocal", "AlbertForPreTraining"),
    "electra": ("configs/electra.py:size=small,runlocal", "ElectraForPreTraining"),
}


@pytest.fixture(scope="module")
def arch_runs(tmp_path_factory):
  """A 2-step pretraining workdir of each architecture (its runlocal config, tiny sizes)."""
  runs = {}

  def get(arch: str) -> pathlib.Path:
    if arch not in runs:
      extra = {} if arch == "roberta" else {"model.embedding_size": 16}
      config = load_config(ARCHS[arch][0], **{**TINY, **extra, "total_steps": 2,
                                              "eval_every": 0, "checkpoint_every": 2,
                                              "batch_size": 8})
      runs[arch] = tmp_path_factory.mktemp(arch) / "run"
      train.train_and_evaluate(config, runs[arch])
    return runs[arch]
  return get


def _pretraining_outputs(m, ids, mask, types):
  """bertjax's head outputs at every position: MLM logits (+ pair), or ELECTRA's RTD logits."""
  if "rtd" in m.heads:
    return {"logits": m.head_model.apply({"params": m.head_params}, ids, mask, types,
                                         deterministic=True)["rtd_logits"]}
  positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  out = m.head_model.apply({"params": m.head_params}, ids, mask, types, positions,
                           deterministic=True)
  return {"logits": out["mlm_logits"], **({"sop": out["pair_logits"]} if "pair_logits" in out
                                          else {})}


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCHS))
def test_architecture_round_trip(arch_runs, tmp_path, arch):
  """Training workdir -> to-hf -> transformers (same outputs) -> from-hf -> bertjax (same)."""
  workdir = arch_runs(arch)
  lines = []
  convert.convert_to_hf(workdir, tmp_path / "hf", log=lines.append)
  folder = tmp_path / "hf" / ("discriminator" if arch == "electra" else "")
  written = json.loads((folder / "config.json").read_text())
  assert written["architectures"] == [ARCHS[arch][1]] and written["model_type"] == arch
  hf = hf_load(getattr(T, ARCHS[arch][1]), folder)
  m = bertjax.load(workdir)
  _, _, ids, mask, types = _sample_ids(workdir)
  types = types * (m.config.type_vocab_size > 1)
  ours = _pretraining_outputs(m, ids, mask, types)
  field = "prediction_logits" if arch == "albert" else "logits"
  real = mask.astype(bool)
  assert max_diff(np.asarray(ours["logits"])[real], hf_logits(hf, ids, mask, types, field)[real]) < TOL
  if arch == "albert":
    assert max_diff(ours["sop"], hf_logits(hf, ids, mask, types, "sop_logits")) < TOL
  if arch == "roberta":  # MLM only: the pooler was never trained, and RobertaForMaskedLM has none
    assert m.untrained == ("pooler",)
  # ... and back into bertjax: the same outputs again.
  convert.convert_from_hf(folder, tmp_path / "back", **QUIET)
  again = _pretraining_outputs(bertjax.load(tmp_path / "back"), ids, mask, types)
  assert max_diff(np.asarray(again["logits"])[real], np.asarray(ours["logits"])[real]) < TOL
  if arch == "electra":  # the generator, with a copy of the shared embeddings
    gen = hf_load(T.ElectraForMaskedLM, tmp_path / "hf" / "generator")
    g = m.source.converted.generator
    positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    out = convert.build_model(g.config, ("mlm",)).apply({"params": g.params}, ids, mask, types,
                                                         positions, deterministic=True)
    assert max_diff(np.asarray(out["mlm_logits"])[real], hf_logits(gen, ids, mask, types)[real]) < TOL
    assert any(l.startswith("wrote ElectraForMaskedLM") for l in lines), lines


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCHS))
def test_sequence_classifier_of_each_architecture(arch_runs, tmp_path_factory, data_dir, arch):
  """GLUE fine-tuned from each architecture: RoBERTa's classifier maps onto
  RobertaClassificationHead (our pooler is its dense layer), ALBERT's onto its classifier; no
  transformers class matches ELECTRA's (its head has a GELU layer ours lacks): one line."""
  config, workdir = glue_run(tmp_path_factory, data_dir, "rte", init_from=str(arch_runs(arch)),
                             total_steps=2, eval_every=2)
  out = workdir.parent / "hf"
  code, stdout, stderr = to_hf("--workdir", workdir, "--output", out)
  if arch == "electra":
    assert code == 2 and len(stderr) == 1, stderr
    assert "no transformers class matches this electra sequence classifier" in stderr[0]
    assert "dense + GELU + linear" in stderr[0] and "bertjax.load" in stderr[0]
    assert not out.exists()
    return
  assert code == 0, stderr
  m = bertjax.load(workdir)
  eval_set, ours = own_prediction(config, workdir, m.head_params)
  a = {k: v[:32] for k, v in eval_set.arrays.items()}
  hf = hf_load(T.AutoModelForSequenceClassification, out)
  assert type(hf).__name__ == {"roberta": "RobertaForSequenceClassification",
                               "albert": "AlbertForSequenceClassification"}[arch]
  types = a["token_type_ids"] * (m.config.type_vocab_size > 1)
  theirs = hf_logits(hf, a["input_ids"], a["attention_mask"], types)
  assert max_diff(theirs, ours["logits"][:32]) < TOL


# ----------------------------------------------------------------------------- tokenizers

TEXTS = [("Hello world, the river's valley.", "Über café naïve Ünïcode [MASK] text"),
         ("tokenizers split words into pieces", "a second segment of text")]


def _wordpiece(folder: pathlib.Path) -> tokenizers.Tokenizer:
  words = sorted({w for a, b in TEXTS for w in (a + " " + b).lower().replace(",", " , ")
                  .replace(".", " . ").replace("'", " ' ").split()})
  chars = sorted({c for w in words for c in w})
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *[f"##{c}" for c in chars],
           *[w for w in words if len(w) > 1][::2]]
  folder.mkdir()
  (folder / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n", encoding="utf-8")
  return tokenizers.WordPieceTokenizer(folder / "vocab.txt", lowercase=True)


def _bpe(folder: pathlib.Path) -> tokenizers.Tokenizer:
  bpe = hf_tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator([t for pair in TEXTS for t in pair] * 5, vocab_size=300,
                          special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
  folder.mkdir()
  bpe.save_model(str(folder))
  return tokenizers.ByteLevelBPETokenizer(folder / "vocab.json", folder / "merges.txt")


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_tokenizer_files_load_in_transformers(tmp_path, kind):
  """A workdir's WordPiece or BPE tokenizer, written for transformers, gives bertjax's ids with
  the special tokens bertjax's pipelines place ([CLS] A [SEP] B [SEP]; <s> A </s></s> B </s>)."""
  ours = {"wordpiece": _wordpiece, "bpe": _bpe}[kind](tmp_path / "src")
  ours.save(tmp_path / "tok")
  files = convert.hf_tokenizer.write_hf_tokenizer(tmp_path / "tok", tmp_path / "hf", 128)
  assert "tokenizer.json" in files and "tokenizer_config.json" in files
  for fast in (True, False):
    tok = T.AutoTokenizer.from_pretrained(tmp_path / "hf", use_fast=fast)
    for a, b in TEXTS:
      ea, eb = ours.encode(a), ours.encode(b)
      if kind == "wordpiece":
        want = [ours.cls_id, *ea, ours.sep_id, *eb, ours.sep_id]
      else:
        want = [ours.cls_id, *ea, ours.sep_id, ours.sep_id, *eb, ours.sep_id]
      assert tok(a, b)["input_ids"] == want, (fast, a, b)
      if kind == "wordpiece":
        assert tok(a, b)["token_type_ids"] == [0] * (len(ea) + 2) + [1] * (len(eb) + 1)


@pytest.mark.slow
def test_spanbert_export_names_the_head_it_leaves_out(tmp_path):
  config = load_config("configs/spanbert.py:runlocal", **{**TINY, "total_steps": 2,
                                                          "eval_every": 0, "checkpoint_every": 2,
                                                          "batch_size": 8})
  train.train_and_evaluate(config, tmp_path / "run")
  lines = []
  convert.convert_to_hf(tmp_path / "run", tmp_path / "hf", log=lines.append)
  assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == [
      "BertForMaskedLM"]
  assert "left out sbo: no transformers class holds SpanBERT's span boundary head" in lines
  m = bertjax.load(tmp_path / "run")
  _, _, ids, mask, types = _sample_ids(tmp_path / "run")
  hf = hf_load(T.BertForMaskedLM, tmp_path / "hf")
  real = mask.astype(bool)
  ours = _pretraining_outputs(m, ids, mask, types)["logits"]
  assert max_diff(np.asarray(ours)[real], hf_logits(hf, ids, mask, types)[real]) < TOL
