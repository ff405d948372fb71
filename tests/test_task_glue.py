"""GLUE fine-tuning through the one trainer: real data end to end, init_from a converted HF
checkpoint, tfds input, pair encoding, layer-wise learning rates and bad input."""

import json
import logging
import pathlib

import flax.linen as nn
import jax
import numpy as np

import pytest

from bertjax.config import config_lib
from bertjax.core.errors import UserError
from bertjax.data import tokenizers
from bertjax.metrics import glue as glue_eval
from bertjax.models import classifiers
from bertjax.objective import Schedule
from bertjax.registry import get_objective
from bertjax.runtime import checkpoints, optim
from bertjax.runtime.metric_writers import read_metrics
from bertjax.tasks import base, glue as glue_task
from bertjax.trainer import train

from helpers import REPO, TINY, load_config, run_module


def glue_config(variant: str, **overrides):
  return load_config(f"configs/glue.py:{variant}", **{**TINY, **overrides})


def glue_copy(tmp_path, data_dir, folder: str, test_rows: int = 0) -> pathlib.Path:
  """A GLUE root in tmp_path linking one task's real train/dev files, plus a test.tsv in the
  official test layout built from a few dev rows (GLUE's test labels are not public)."""
  root = tmp_path / "glue"
  (root / folder).mkdir(parents=True)
  for name in ("train.tsv", "dev.tsv"):
    (root / folder / name).symlink_to(data_dir / "glue" / folder / name)
  if test_rows:
    task = {"SST-2": "sst2", "RTE": "rte"}[folder]
    rows = glue_eval.read_glue_tsv(data_dir / "glue" / folder / "dev.tsv", task, "dev")
    header = "index\tsentence" if task == "sst2" else "index\tsentence1\tsentence2"
    lines = [header] + [f"{r['idx']}\t{r['sentence1']}" + (f"\t{r['sentence2']}" if
                                                           r["sentence2"] is not None else "")
                        for r in rows[:test_rows]]
    (root / folder / "test.tsv").write_text("\n".join(lines) + "\n")
  return root


def spm_tokenizer(tmp_path, texts, vocab=1000) -> pathlib.Path:
  out = tmp_path / "tok"
  tokenizers.train_sentencepiece(texts, out, vocab_size=vocab, num_threads=1)
  return out


@pytest.mark.slow
def test_sst2_end_to_end(tmp_path, data_dir):
  """Random-init tiny model on 512 SST-2 sentences: loss falls, every dev sentence (872, not a
  multiple of the batch of 16) gets one prediction, test predictions are written in the
  leaderboard format, and `python -m bertjax.tools.evaluate` scores the dev file as the run did."""
  root = glue_copy(tmp_path, data_dir, "SST-2", test_rows=37)
  train_rows = glue_eval.read_glue_tsv(root / "SST-2/train.tsv", "sst2", "train")
  tok = spm_tokenizer(tmp_path, [r["sentence1"] for r in train_rows[:4000]])
  workdir = tmp_path / "run"
  config = glue_config("task=sst2,runlocal", data_dir=str(root), **{"data.tokenizer": str(tok)},
                       **{"model.vocab_size": 1000, "max_train_examples": 512, "num_epochs": 6.0,
                          "batch_size": 16, "eval_batch_size": 16, "log_every": 8,
                          "learning_rate": 1e-3})
  summary = train.train_and_evaluate(config, workdir)
  assert summary["step"] == 6 * 512 // 16  # total_steps derived from num_epochs at run time
  # The derivation is recorded in the run's config.json; the caller's config is not rewritten.
  recorded = json.loads((workdir / "config.json").read_text())
  assert (recorded["total_steps"], recorded["eval_every"]) == (192, 32)
  assert (config.total_steps, config.eval_every) == (0, 0)
  rows = read_metrics(workdir)
  losses = [r["loss"] for r in rows if r["split"] == "train"]
  assert losses[0] > 0.6 and losses[-1] < 0.5 * losses[0], losses
  evals = [r for r in rows if r["split"] == "eval"]
  assert [r["step"] for r in evals] == [32, 64, 96, 128, 160, 192]  # once per epoch
  assert all(r["examples"] == 872 for r in evals)
  last = evals[-1]
  assert last["accuracy"] > 0.55  # well above the 0.51 majority class: it learned something

  final = workdir / "predictions" / "step_192"
  idx, preds = glue_eval.read_predictions_tsv(final / "dev" / "SST-2.tsv", "sst2")
  assert idx.tolist() == list(range(872))
  gold = [r["label"] for r in glue_eval.read_glue_tsv(root / "SST-2/dev.tsv", "sst2", "dev")]
  assert np.mean(preds == np.asarray(gold)) == pytest.approx(last["accuracy"], abs=1e-12)
  proc = run_module("-m", "bertjax.tools.evaluate", "glue", "--data", str(root / "SST-2/dev.tsv"),
                    "--predictions", str(final / "dev" / "SST-2.tsv"))
  assert proc.returncode == 0, proc.stderr
  scored = json.loads(proc.stdout.strip().splitlines()[-1])
  assert scored["num_examples"] == 872
  assert scored["accuracy"] == pytest.approx(last["accuracy"], abs=1e-12)
  assert json.loads((final / "metrics.json").read_text())["accuracy"] == last["accuracy"]

  # Test predictions: only at the end, one per test row, in the leaderboard file format.
  test_idx, test_preds = glue_eval.read_predictions_tsv(final / "test" / "SST-2.tsv", "sst2")
  assert test_idx.tolist() == list(range(37)) and set(test_preds.tolist()) <= {0, 1}
  assert not (workdir / "predictions" / "step_32" / "test").exists()
  # The test rows are the first dev rows: the same model must predict them the same way.
  np.testing.assert_array_equal(test_preds, preds[:37])

  best = json.loads((workdir / "best" / "best.json").read_text())
  assert best["metric"] == "score" and best["value"] == max(r["score"] for r in evals)


def _wordpiece_checkpoint(tmp_path, data_dir) -> pathlib.Path:
  """A tiny random transformers BertForPreTraining with a WordPiece vocab built from RTE text,
  converted with `python -m bertjax.convert from-hf`."""
  import collections
  import re

  import transformers
  rows = glue_eval.read_glue_tsv(data_dir / "glue/RTE/train.tsv", "rte", "train")
  words = collections.Counter(w for r in rows for s in (r["sentence1"], r["sentence2"])
                              for w in re.findall(r"\w+|[^\w\s]", s.lower()))
  chars = sorted({c for w in words for c in w})
  vocab = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + [f"##{c}" for c in chars]
           + [w for w, _ in words.most_common(700) if w not in chars])
  hf = tmp_path / "hf"
  cfg = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=2, intermediate_size=64,
                                max_position_embeddings=128)
  transformers.BertForPreTraining(cfg).save_pretrained(hf)
  (hf / "vocab.txt").write_text("\n".join(vocab) + "\n")
  (hf / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
  out = tmp_path / "converted"
  proc = run_module("-m", "bertjax.convert", "from-hf", "--model-dir", str(hf), "--workdir",
                    str(out))
  assert proc.returncode == 0, proc.stderr
  return out


@pytest.mark.slow
def test_init_from_converted_hf_checkpoint(tmp_path, data_dir, capsys, caplog):
  """The encoder comes from the checkpoint (architecture, weights, WordPiece tokenizer), the
  classifier starts fresh, and the run says so. A zero learning rate leaves the restored encoder
  bit for bit what the checkpoint holds."""
  converted = _wordpiece_checkpoint(tmp_path, data_dir)
  root = glue_copy(tmp_path, data_dir, "RTE")
  workdir = tmp_path / "run"
  config = glue_config("task=rte,runlocal", data_dir=str(root), init_from=str(converted),
                       total_steps=3, learning_rate=0.0, max_train_examples=64, batch_size=16,
                       eval_batch_size=16, eval_every=3, log_every=1,
                       **{"model.hidden_dropout_prob": 0.2})
  cfg = get_objective(config).model_config(config)
  assert cfg.hidden_size == 32 and cfg.num_hidden_layers == 2  # from the checkpoint, not config
  assert cfg.hidden_dropout_prob == 0.2  # the run's dropout setting
  with caplog.at_level(logging.INFO):  # the line is logged where logging is set up, else printed
    summary = train.train_and_evaluate(config, workdir)
  out = capsys.readouterr().out
  said = out.splitlines() + [r.getMessage() for r in caplog.records]
  report = [l for l in said if l.startswith("init_from")]
  assert len(report) == 1, said
  assert "(encoder)" in report[0] and "initialized fresh 2 (classifier)" in report[0], report
  assert summary["last_eval"]["examples"] == 277  # 17 batches of 16 and one of 5

  source = checkpoints.restore_params(converted)
  final = checkpoints.restore_params(workdir)
  assert set(final) == {"encoder", "classifier"}
  flat = lambda t: jax.tree_util.tree_flatten_with_path(t)[0]
  src = dict(flat(source["encoder"]))
  got = flat(final["encoder"])
  assert len(got) == len(src)
  for path, value in got:
    np.testing.assert_array_equal(np.asarray(value), np.asarray(src[path]), err_msg=str(path))
  kernel = np.asarray(final["classifier"]["classifier"]["kernel"])
  assert kernel.shape == (32, 2) and np.std(kernel) > 0.005  # initialized, not copied zeros
  assert (workdir / "tokenizer" / "vocab.txt").is_file()  # the checkpoint's WordPiece vocab


def test_pair_encoding_truncates_the_longer_sentence(tmp_path, data_dir):
  rows = glue_eval.read_glue_tsv(data_dir / "glue/RTE/dev.tsv", "rte", "dev")[:40]
  tok = tokenizers.load_tokenizer(
      spm_tokenizer(tmp_path, [s for r in rows for s in (r["sentence1"], r["sentence2"])], 600))
  seq = 48
  arrays, truncated = glue_task.encode_rows(tok, rows, seq, regression=False)
  assert truncated > 0
  for i, r in enumerate(rows):
    a, b = tok.encode(r["sentence1"]), tok.encode(r["sentence2"])
    # BERT's rule, spelled out differently: drop from the longer one until the pair fits.
    while len(a) + len(b) > seq - 3:
      if len(a) > len(b):
        a = a[:-1]
      else:
        b = b[:-1]
    expect = [tok.cls_id, *a, tok.sep_id, *b, tok.sep_id]
    n = len(expect)
    assert arrays["input_ids"][i, :n].tolist() == expect
    assert (arrays["input_ids"][i, n:] == tok.pad_id).all()
    assert arrays["attention_mask"][i].tolist() == [1] * n + [0] * (seq - n)
    assert arrays["token_type_ids"][i].tolist() == ([0] * (len(a) + 2) + [1] * (len(b) + 1)
                                                    + [0] * (seq - n))
    assert arrays["label"][i] == r["label"]


def _records(rows, fields, test=False):
  """tfds-like records (bytes for text, -1 labels on test) of rows read from the tsv."""
  f1, f2 = fields
  out = []
  for r in rows:
    rec = {"idx": np.int32(r["idx"]), "label": np.int64(-1 if test else r["label"]),
           f1: r["sentence1"].encode("utf-8")}
    if f2:
      rec[f2] = r["sentence2"]
    out.append(rec)
  return out


def test_tfds_source_matches_local_files(tmp_path, data_dir):
  tfds = pytest.importorskip("tensorflow_datasets")
  root = glue_copy(tmp_path, data_dir, "RTE", test_rows=9)
  train_rows = glue_eval.read_glue_tsv(root / "RTE/train.tsv", "rte", "train")[:50]
  dev_rows = glue_eval.read_glue_tsv(root / "RTE/dev.tsv", "rte", "dev")[:30]
  tok = spm_tokenizer(tmp_path, [s for r in train_rows for s in (r["sentence1"],
                                                                  r["sentence2"])], 600)
  overrides = {"data.tokenizer": str(tok), "max_train_examples": 50, "max_seq_length": 64}
  local_config = glue_config("task=rte,runlocal", data_dir=str(root), **overrides)
  local = get_objective(local_config).build_inputs(local_config, tmp_path / "a")
  splits = {"train": _records(train_rows, ("sentence1", "sentence2")),
            "validation": _records(glue_eval.read_glue_tsv(root / "RTE/dev.tsv", "rte", "dev"),
                                   ("sentence1", "sentence2")),
            "test": _records(dev_rows[:9], ("sentence1", "sentence2"), test=True)}
  seen = []

  def as_data_source(builder, split, **kwargs):
    del kwargs
    seen.append((builder.name, builder.builder_config.name, split))
    return splits[split]

  with tfds.testing.mock_data(as_data_source_fn=as_data_source):
    remote_config = glue_config("task=rte,runlocal", data_dir="", **overrides)
    remote = get_objective(remote_config).build_inputs(remote_config, tmp_path / "b")
  assert ("glue", "rte", "validation") in seen and ("glue", "rte", "test") in seen
  for a, b in zip(local.eval_sets + local.test_sets, remote.eval_sets + remote.test_sets):
    for k in a.arrays:
      np.testing.assert_array_equal(a.arrays[k], b.arrays[k])
    assert a.meta["idx"] == b.meta["idx"]
  np.testing.assert_array_equal(local.eval_sets[0].meta["labels"],
                                remote.eval_sets[0].meta["labels"])
  for k in local.train.arrays:
    np.testing.assert_array_equal(local.train.arrays[k], remote.train.arrays[k])
  assert len(remote.test_sets) == 1 and remote.test_sets[0].num_rows == 9

  # MNLI: two dev sets and three test sets (matched, mismatched, the AX diagnostic).
  mnli = {s: _records(dev_rows[:12], ("premise", "hypothesis"), test=s.startswith("test"))
          for s in ("train", "validation_matched", "validation_mismatched", "test_matched",
                    "test_mismatched", "test")}
  for recs in mnli.values():
    for r in recs:
      r["label"] = np.int64(min(int(r["label"]), 2))
  with tfds.testing.mock_data(as_data_source_fn=lambda b, split, **kw: mnli[split]):
    mnli_config = glue_config("task=mnli,runlocal", data_dir="", **overrides)
    m = get_objective(mnli_config).build_inputs(mnli_config, tmp_path / "d")
  assert [s.meta["spec"].task for s in m.eval_sets] == ["mnli_matched", "mnli_mismatched"]
  assert [s.meta["spec"].task for s in m.test_sets] == ["mnli_matched", "mnli_mismatched", "ax"]

  bad = {**splits, "train": [dict(r, label=np.int64(5)) for r in splits["train"]]}
  with tfds.testing.mock_data(as_data_source_fn=lambda b, split, **kw: bad[split]):
    bad_config = glue_config("task=rte,runlocal", data_dir="", **overrides)
    obj = get_objective(bad_config)
    with pytest.raises(UserError, match=r"record 0: label 5 is not a rte label index \(0..1\)"):
      obj.build_inputs(bad_config, tmp_path / "e")


def test_layerwise_lr_scales_for_a_task_model():
  """decay**(L + 1 - depth): embeddings deepest, layer i at depth i + 1, pooler and head 1."""
  config = glue_config("task=stsb,runlocal", **{"optimizer.layerwise_lr_decay": 0.5,
                                                "optimizer.name": "sgd",
                                                "optimizer.grad_clip_norm": 0.0,
                                                "optimizer.warmup_steps": 0,
                                                "optimizer.decay": "constant",
                                                "learning_rate": 1.0})
  objective = get_objective(config)
  model = objective.make_model(config, objective.model_config(config))
  batch = objective.init_batch(config, 1, 16, 0)
  abstract = jax.eval_shape(
      lambda: nn.meta.unbox(objective.init_params(model, jax.random.key(0), batch)))
  params = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), abstract)
  scales = optim.layerwise_lr_scale(params, 2, 0.5)
  flat = {"/".join(str(getattr(k, "key", k)) for k in path): v
          for path, v in jax.tree_util.tree_flatten_with_path(scales)[0]}
  assert flat["encoder/embeddings/word_embeddings/embedding"] == 0.125
  assert flat["encoder/layer_0/attention/query/kernel"] == 0.25
  assert flat["encoder/layer_1/output/kernel"] == 0.5
  assert flat["encoder/pooler/kernel"] == 1.0
  assert flat["classifier/classifier/kernel"] == 1.0
  # With params, the optimizer applies them: SGD's update is -lr * scale * gradient.
  ones = jax.tree.map(np.ones_like, params)
  opt = optim.make_optimizer(config, params=params, num_layers=2)
  updates, _ = opt.update(ones, opt.init(ones), ones)
  for path, u in jax.tree_util.tree_flatten_with_path(updates)[0]:
    key = "/".join(str(getattr(k, "key", k)) for k in path)
    np.testing.assert_allclose(np.asarray(u), -flat[key], err_msg=key)


class _Stop(Exception):
  pass


def test_trainer_passes_params_to_the_optimizer(monkeypatch, tmp_path, data_dir):
  """Layer-wise decay needs the parameter tree; the trainer must hand it to make_optimizer."""
  seen = {}

  def spy(config, params=None, num_layers=None, **kwargs):  # kwargs: the kernel set's choices
    seen["params"] = params
    raise _Stop

  monkeypatch.setattr(optim, "make_optimizer", spy)
  root = glue_copy(tmp_path, data_dir, "RTE")
  rows = glue_eval.read_glue_tsv(root / "RTE/train.tsv", "rte", "train")[:200]
  tok = spm_tokenizer(tmp_path, [r["sentence1"] for r in rows], 500)
  config = glue_config("task=rte,runlocal", data_dir=str(root), max_train_examples=16,
                       **{"data.tokenizer": str(tok), "optimizer.layerwise_lr_decay": 0.8})
  with pytest.raises(_Stop):
    train.train_and_evaluate(config, tmp_path / "run")
  assert seen["params"] is not None


def _launch(*args):
  proc = run_module("launch.py", *args, timeout=120)
  return proc


@pytest.mark.parametrize("row, needle", [
    ("7\tonly two columns\n", "train.tsv:3: 2 tab-separated columns, expected 4"),
    ("7\tA man sleeps.\tA man is awake.\tmaybe\n", "train.tsv:3: label 'maybe' is not a rte label"),
])
@pytest.mark.slow
def test_bad_rows_are_one_line_exit_2(tmp_path, data_dir, row, needle):
  root = tmp_path / "glue"
  (root / "RTE").mkdir(parents=True)
  good = (data_dir / "glue/RTE/train.tsv").read_text().splitlines(keepends=True)
  (root / "RTE/train.tsv").write_text(good[0] + good[1] + row + "".join(good[2:20]))
  (root / "RTE/dev.tsv").symlink_to(data_dir / "glue/RTE/dev.tsv")
  proc = _launch("--config", "configs/glue.py:task=rte,runlocal", "--workdir",
                 str(tmp_path / "w"), f"--config.data_dir={root}")
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and needle in errors[0], proc.stderr[-2000:]


def test_bad_variant_and_task(tmp_path):
  with pytest.raises(UserError, match="task='rtee' is not one of"):
    config_lib.load_config_file(str(REPO / "configs/glue.py") + ":task=rtee")
  with pytest.raises(UserError, match="unknown variant 'fast' for configs/glue.py"):
    config_lib.load_config_file(str(REPO / "configs/glue.py") + ":fast")
  config = glue_config("task=rte", task="mnli_matched")
  with pytest.raises(UserError, match="unknown GLUE task 'mnli_matched'"):
    get_objective(config)
  config = glue_config("task=rte", data_dir=str(tmp_path))
  with pytest.raises(UserError, match=r"GLUE rte train file not found .*set --config.data_dir"):
    get_objective(config).build_inputs(config, tmp_path / "w")
  # No local files and no built tfds dataset: how to build it, never a download.
  config = glue_config("task=rte", data_dir="", tfds_data_dir=str(tmp_path / "tfds"))
  with pytest.raises(UserError, match=r"tfds glue/rte is not built .*tfds build glue/rte"):
    get_objective(config).build_inputs(config, tmp_path / "w")


def test_feature_iterator_resumes_exactly():
  arrays = {"x": np.arange(10)}
  it = base.FeatureIterator(arrays, batch_size=4, seed=3)
  batches = [next(it)["x"] for _ in range(6)]  # 24 rows: 2.4 epochs
  # Each epoch is a permutation: every row once per 10 positions.
  stream = np.concatenate(batches)
  assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:20]) == list(range(10))
  assert not np.array_equal(stream[:10], stream[10:20])  # reshuffled per epoch
  again = base.FeatureIterator(arrays, batch_size=4, seed=3)
  again.set_state(json.loads(json.dumps(base.FeatureIterator(arrays, 4, 3).get_state())))
  for _ in range(3):
    next(again)
  state = again.get_state()
  resumed = base.FeatureIterator(arrays, batch_size=4, seed=3)
  resumed.set_state(state)
  np.testing.assert_array_equal(np.concatenate([next(resumed)["x"] for _ in range(3)]),
                                stream[12:])
  with pytest.raises(UserError, match="trained on 10 training rows"):
    base.FeatureIterator({"x": np.arange(11)}, 4, 3).set_state(state)
  # Two processes split every global batch between them.
  halves = [base.FeatureIterator(arrays, 4, 3, process_index=p, process_count=2)
            for p in range(2)]
  np.testing.assert_array_equal(np.concatenate([next(h)["x"] for h in halves]), batches[0])


@pytest.mark.parametrize("task, folder", [("cola", "CoLA"), ("mrpc", "MRPC"), ("stsb", "STS-B"),
                                          ("wnli", "WNLI")])
def test_local_glue_tasks_build(tmp_path, data_dir, task, folder):
  """Each task's official files (header or not, 2 to 10 columns) become one row per example."""
  dev = glue_eval.read_glue_tsv(data_dir / "glue" / folder / "dev.tsv", task, "dev")
  tok = spm_tokenizer(tmp_path, [r["sentence1"] for r in dev], 400)
  config = glue_config(f"task={task},runlocal", data_dir=str(data_dir / "glue"),
                       max_train_examples=40, num_epochs=2.5, **{"data.tokenizer": str(tok)})
  objective = get_objective(config)
  before = config.to_json()
  inputs = objective.build_inputs(config, tmp_path / "w")
  # The schedule is derived from the rows, explicitly, without writing into the config.
  assert config.to_json() == before and inputs.num_train_rows == 40
  steps = -(-100 // config.batch_size)  # ceil(2.5 epochs x 40 rows / batch)
  assert objective.schedule(config, inputs) == Schedule(steps, min(-(-40 // config.batch_size), steps))
  [dev_set] = inputs.eval_sets
  assert dev_set.num_rows == len(dev) and inputs.test_sets == ()
  labels = dev_set.meta["labels"]
  assert labels.dtype == (np.float64 if task == "stsb" else np.int64)
  assert labels.tolist() == [r["label"] for r in dev]
  pair = task != "cola"
  assert (dev_set.arrays["token_type_ids"].max(axis=1) == 1).all() == pair
  batch = next(inputs.train)
  # Training batches stop at their longest row, rounded up to pad_to_multiple_of (32 by default).
  rows, length = batch["input_ids"].shape
  multiple = config.pad_to_multiple_of
  assert rows == config.batch_size and multiple == 32 and length <= config.max_seq_length
  assert length % multiple == 0 and batch["attention_mask"][:, length - multiple:].any()
  assert batch["weight"].tolist() == [1.0] * config.batch_size


@pytest.mark.slow
def test_stsb_regression_end_to_end(tmp_path, data_dir):
  root = glue_copy(tmp_path, data_dir, "STS-B")
  rows = glue_eval.read_glue_tsv(root / "STS-B/train.tsv", "stsb", "train")
  tok = spm_tokenizer(tmp_path, [s for r in rows[:2000] for s in (r["sentence1"],
                                                                    r["sentence2"])])
  workdir = tmp_path / "run"
  config = glue_config("task=stsb,runlocal", data_dir=str(root), total_steps=40, eval_every=40,
                       learning_rate=3e-3,
                       max_train_examples=320, batch_size=16, eval_batch_size=32, log_every=10,
                       **{"data.tokenizer": str(tok), "model.vocab_size": 1000})
  train.train_and_evaluate(config, workdir)
  rows = read_metrics(workdir)
  losses = [r["loss"] for r in rows if r["split"] == "train"]
  assert losses[-1] < 0.5 * losses[0], losses  # squared error falls from the ~8 of a zero guess
  last = [r for r in rows if r["split"] == "eval"][-1]
  assert last["examples"] == 1500 and last["score"] == pytest.approx(
      (last["pearson"] + last["spearman"]) / 2)
  final = workdir / "predictions" / "step_40" / "dev" / "STS-B.tsv"
  idx, preds = glue_eval.read_predictions_tsv(final, "stsb")
  assert idx.tolist() == list(range(1500)) and preds.dtype == np.float64
  proc = run_module("-m", "bertjax.tools.evaluate", "glue", "--data", str(root / "STS-B/dev.tsv"),
                    "--predictions", str(final))
  assert proc.returncode == 0, proc.stderr
  scored = json.loads(proc.stdout.strip().splitlines()[-1])
  assert scored["pearson"] == pytest.approx(last["pearson"], abs=1e-12)
  assert scored["spearman"] == pytest.approx(last["spearman"], abs=1e-12)


@pytest.mark.slow
def test_mnli_writes_matched_mismatched_and_ax(tmp_path, data_dir):
  """MNLI (tfds, mocked with RTE sentences): both dev sets scored, all three test files."""
  tfds = pytest.importorskip("tensorflow_datasets")
  rows = glue_eval.read_glue_tsv(data_dir / "glue/RTE/dev.tsv", "rte", "dev")
  tok = spm_tokenizer(tmp_path, [s for r in rows for s in (r["sentence1"], r["sentence2"])], 800)
  rng = np.random.default_rng(0)
  sizes = {"train": 48, "validation_matched": 21, "validation_mismatched": 19,
           "test_matched": 7, "test_mismatched": 6, "test": 5}
  splits = {}
  for name, n in sizes.items():
    recs = _records(rows[:n], ("premise", "hypothesis"), test=name.startswith("test"))
    if not name.startswith("test"):
      for r in recs:
        r["label"] = np.int64(rng.integers(0, 3))
    splits[name] = recs
  config = glue_config("task=mnli,runlocal", data_dir="", total_steps=2, eval_every=2,
                       batch_size=8, eval_batch_size=8, max_seq_length=48,
                       **{"data.tokenizer": str(tok), "model.vocab_size": 800})
  with tfds.testing.mock_data(as_data_source_fn=lambda b, split, **kw: splits[split]):
    summary = train.train_and_evaluate(config, tmp_path / "run")
  last = summary["last_eval"]
  assert last["matched_examples"] == 21 and last["mismatched_examples"] == 19
  assert last["score"] == pytest.approx((last["matched_accuracy"]
                                         + last["mismatched_accuracy"]) / 2)
  final = tmp_path / "run" / "predictions" / "step_2"
  for file, task, n in (("dev/MNLI-m.tsv", "mnli_matched", 21),
                        ("dev/MNLI-mm.tsv", "mnli_mismatched", 19),
                        ("test/MNLI-m.tsv", "mnli_matched", 7),
                        ("test/MNLI-mm.tsv", "mnli_mismatched", 6), ("test/AX.tsv", "ax", 5)):
    idx, preds = glue_eval.read_predictions_tsv(final / file, task)
    assert idx.tolist() == [r["idx"] for r in rows[:n]], file
  idx, preds = glue_eval.read_predictions_tsv(final / "dev/MNLI-mm.tsv", "mnli_mismatched")
  gold = [int(r["label"]) for r in splits["validation_mismatched"]]
  assert np.mean(preds == np.asarray(gold)) == pytest.approx(last["mismatched_accuracy"])


def test_encoder_without_pooler_classifies_from_cls():
  """ELECTRA has no pooler: the head reads the [CLS] hidden state."""
  from bertjax.models.config import ModelConfig
  cfg = ModelConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, architecture="electra", use_pooler=False)
  model = classifiers.SequenceClassifier(cfg, num_labels=3)
  ids = np.array([[2, 7, 8, 3, 0], [2, 9, 3, 0, 0]], np.int32)
  mask = (ids > 0).astype(np.int32)
  variables = model.init(jax.random.key(0), ids, mask, np.zeros_like(ids))
  assert "pooler" not in variables["params"]["encoder"]
  logits = model.apply(variables, ids, mask, np.zeros_like(ids))
  assert logits.shape == (2, 3) and np.isfinite(np.asarray(logits)).all()
  other = ids.copy()
  other[:, 1] = 5
  changed = model.apply(variables, other, mask, np.zeros_like(ids))
  assert not np.allclose(logits, changed)  # the [CLS] state depends on the other tokens
