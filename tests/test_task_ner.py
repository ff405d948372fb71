"""CoNLL-2003 tagging through the one trainer: first-sub-token labels, long sentences, NER end to
end with scored predictions, POS, tfds input and bad input."""

import json
import os
import pathlib

import numpy as np

import pytest

from bertjax.core.errors import UserError
from bertjax.data import tokenizers
from bertjax.metrics import ner as ner_eval
from bertjax.registry import get_objective
from bertjax.runtime.metric_writers import read_metrics
from bertjax.runtime.run_record import summarize
from bertjax.tasks import ner
from bertjax.trainer import train

from helpers import REPO, TINY, conll_part, load_config, run_module


def ner_config(variant: str, **overrides):
  return load_config(f"configs/ner.py:{variant}", **{**TINY, **overrides})


@pytest.fixture(scope="module")
def spm_dir(tmp_path_factory):
  """A sentencepiece tokenizer trained on the CoNLL-2003 test sentences."""
  data = pathlib.Path(os.environ.get("BERTJAX_DATA", REPO.parent / "shared" / "data"))
  if not data.is_dir():  # as the data_dir fixture, which a module-scoped fixture cannot use
    pytest.skip(f"shared data not found at {data}; set BERTJAX_DATA to its folder")
  sentences = ner_eval.read_conll(data / "conll2003/test.txt")
  out = tmp_path_factory.mktemp("spm")
  tokenizers.train_sentencepiece((" ".join(s.tokens) for s in sentences), out, vocab_size=2000,
                                 num_threads=1)
  return out


def test_first_subtoken_labels_and_long_sentences(spm_dir, data_dir):
  tok = tokenizers.load_tokenizer(spm_dir)
  sentences = [(s.tokens, s.tags) for s in ner_eval.read_conll(data_dir / "conll2003/valid.txt")]
  sentences = sentences[:200] + [(["Zyxwvutsrqponmlkjihgfedcba" * 3, "x"], ["B-MISC", "O"])]
  seq = 24
  arrays, owner, word = ner.tag_features(tok, sentences, ner.NER_LABELS, seq)
  assert arrays["input_ids"].shape[1] == seq
  assert len(set(owner.tolist())) == len(sentences) and len(owner) > len(sentences)  # split rows
  for si, (words, tags) in enumerate(sentences):
    rows = np.flatnonzero(owner == si)
    got = [(r, p) for r in rows for p in np.flatnonzero(word[r] >= 0)]
    # Every word labelled exactly once, in order, at its first sub-token, with its own label.
    assert [word[r, p] for r, p in got] == list(range(len(words)))
    for (r, p), wi in zip(got, range(len(words))):
      pieces = tok.encode(words[wi]) or [tok.unk_id]
      assert arrays["input_ids"][r, p] == pieces[0]
      assert arrays["labels"][r, p] == ner.NER_LABELS.index(tags[wi])
      assert arrays["label_weights"][r, p] == 1.0
    for r in rows:
      n = int(arrays["attention_mask"][r].sum())
      assert arrays["input_ids"][r, 0] == tok.cls_id and arrays["input_ids"][r, n - 1] == tok.sep_id
      # Only first sub-tokens carry weight.
      assert arrays["label_weights"][r].sum() == (word[r] >= 0).sum()
  assert len(tok.encode(sentences[-1][0][0])) > seq - 2  # the overlong word was cut, not lost


@pytest.mark.slow
def test_ner_end_to_end(tmp_path, data_dir, spm_dir):
  """Train on CoNLL test.txt sentences, evaluate on 301 valid.txt sentences: loss falls, every
  word gets a tag, and `python -m bertjax.tools.evaluate ner` scores the file as the run did."""
  conll = data_dir / "conll2003"
  dev = conll_part(conll / "valid.txt", tmp_path / "dev.txt", 0, 301)
  test = conll_part(conll / "valid.txt", tmp_path / "test.txt", 301, 120)
  workdir = tmp_path / "run"
  config = ner_config("runlocal", data_dir=str(tmp_path), train_file=str(conll / "test.txt"),
                      dev_file="dev.txt", test_file="test.txt", max_train_examples=800,
                      num_epochs=4.0, batch_size=32, eval_batch_size=32, log_every=10,
                      max_seq_length=48, eval_every=50,
                      **{"data.tokenizer": str(spm_dir), "model.vocab_size": 2000})
  summary = train.train_and_evaluate(config, workdir)
  rows = read_metrics(workdir)
  losses = [r["loss"] for r in rows if r["split"] == "train"]
  assert losses[-1] < 0.4 * losses[0], losses
  evals = [r for r in rows if r["split"] == "eval"]
  last = evals[-1]
  assert last["step"] == summary["step"] and last["sentences"] == 301
  assert last["f1"] > 0.05 and last["accuracy"] > 0.8

  final = workdir / "predictions" / f"step_{summary['step']}"
  gold = ner_eval.read_conll(dev)
  predicted = ner_eval.read_ner_predictions(final / "dev_predictions.txt")
  assert [p.tokens for p in predicted] == [g.tokens for g in gold]  # every word, in order
  proc = run_module("-m", "bertjax.tools.evaluate", "ner", "--data", str(dev), "--predictions",
                    str(final / "dev_predictions.txt"))
  assert proc.returncode == 0, proc.stderr
  scored = json.loads(proc.stdout.strip().splitlines()[-1])
  for key in ("f1", "precision", "recall"):
    assert scored[key] == pytest.approx(last[key], abs=1e-12), key
  assert scored["num_gold"] == last["num_gold"]
  # The final evaluation also tags and scores the test file.
  test_gold = ner_eval.read_conll(test)
  test_pred = ner_eval.read_ner_predictions(final / "test_predictions.txt")
  expect = ner_eval.ner_metrics([s.tags for s in test_gold],
                                ner_eval.align_predictions(test_gold, test_pred))
  assert last["test_f1"] == pytest.approx(expect["f1"], abs=1e-12)
  assert not (workdir / "predictions" / "step_50" / "test_predictions.txt").exists()


@pytest.mark.slow
def test_pos_tagging(tmp_path, data_dir, spm_dir):
  conll = data_dir / "conll2003"
  dev = conll_part(conll / "valid.txt", tmp_path / "dev.txt", 0, 75)
  config = ner_config("task=pos,runlocal", data_dir=str(tmp_path),
                      train_file=str(conll / "test.txt"), dev_file="dev.txt", test_file="",
                      max_train_examples=300, total_steps=30, eval_every=30, batch_size=32,
                      eval_batch_size=16, max_seq_length=48,
                      **{"data.tokenizer": str(spm_dir), "model.vocab_size": 2000})
  assert config.best_metric == "accuracy"
  summary = train.train_and_evaluate(config, tmp_path / "run")
  last = summary["last_eval"]
  assert "f1" not in last and last["sentences"] == 75
  lines = [l.split() for l in (tmp_path / "run" / "predictions" / "step_30" /
                               "dev_predictions.txt").read_text().splitlines() if l.strip()]
  gold = ner_eval.read_conll(dev)
  tags = [t for _, t in lines]
  assert len(tags) == sum(len(s.tokens) for s in gold) and set(tags) <= set(ner.POS_LABELS)
  gold_pos = [p for s in gold for p in s.pos]
  assert last["accuracy"] == pytest.approx(np.mean(np.asarray(tags) == np.asarray(gold_pos)),
                                           abs=1e-12)
  assert last["accuracy"] > 0.2  # 45 classes: well above chance after 30 steps


def test_tfds_source_matches_local_files(tmp_path, data_dir, spm_dir):
  tfds = pytest.importorskip("tensorflow_datasets")
  conll = data_dir / "conll2003"
  train_file = conll_part(conll / "test.txt", tmp_path / "train.txt", 0, 60)
  dev_file = conll_part(conll / "valid.txt", tmp_path / "valid.txt", 0, 40)
  overrides = {"data.tokenizer": str(spm_dir), "max_seq_length": 32}
  local_config = ner_config("runlocal", data_dir=str(tmp_path), train_file="train.txt",
                            dev_file="valid.txt", test_file="", **overrides)
  local = get_objective(local_config).build_inputs(local_config, tmp_path / "a")

  def records(path):
    return [{"tokens": np.asarray(s.tokens), "pos": np.asarray([ner.POS_LABELS.index(p)
                                                                for p in s.pos]),
             "chunks": np.zeros(len(s.tokens), np.int64),
             "ner": np.asarray([ner.NER_LABELS.index(t) for t in s.tags])}
            for s in ner_eval.read_conll(path)]

  splits = {"train": records(train_file), "validation": records(dev_file), "test": []}
  with tfds.testing.mock_data(as_data_source_fn=lambda b, split, **kw: splits[split]):
    remote_config = ner_config("runlocal", data_dir="", train_file="", dev_file="",
                               test_file="", **overrides)
    remote = get_objective(remote_config).build_inputs(remote_config, tmp_path / "b")
  for k, v in local.train.arrays.items():
    np.testing.assert_array_equal(v, remote.train.arrays[k])
  for k, v in local.eval_sets[0].arrays.items():
    np.testing.assert_array_equal(v, remote.eval_sets[0].arrays[k])
  assert remote.test_sets == ()  # an empty test split: no test predictions

  bad = {**splits, "train": [dict(r, ner=np.full(len(r["tokens"]), 9)) for r in splits["train"]]}
  with tfds.testing.mock_data(as_data_source_fn=lambda b, split, **kw: bad[split]):
    bad_config = ner_config("runlocal", data_dir="", train_file="", dev_file="",
                            test_file="", **overrides)
    obj = get_objective(bad_config)
    with pytest.raises(UserError, match="record 0: .* labels must be one per token in 0..8"):
      obj.build_inputs(bad_config, tmp_path / "c")


@pytest.mark.parametrize("edit, needle", [
    (lambda cols: cols[:3] + ["B-FOO"], "NER tag 'B-FOO' is not a CoNLL-2003 ner label"),
    (lambda cols: cols[:2], "2 columns, a CoNLL-2003 (token POS chunk NER) line has 4"),
])
def test_bad_lines_are_one_line_exit_2(tmp_path, data_dir, edit, needle):
  path = conll_part(data_dir / "conll2003/valid.txt", tmp_path / "train.txt", 0, 30)
  lines = path.read_text().splitlines()
  target = 7  # a token line of the first sentence (line 1 is -DOCSTART-, line 2 blank)
  assert lines[target - 1].strip()
  lines[target - 1] = " ".join(edit(lines[target - 1].split()))
  path.write_text("\n".join(lines) + "\n")
  proc = run_module("launch.py", "--config", "configs/ner.py:runlocal", "--workdir",
                    str(tmp_path / "w"), f"--config.data_dir={tmp_path}",
                    "--config.train_file=train.txt", timeout=120)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and f"train.txt:{target}:" in errors[0] and needle in errors[0], errors


@pytest.mark.slow
def test_gradient_accumulation_matches_big_batch(spm_dir, data_dir):
  """Rows hold different numbers of labelled words; the whole-batch denominator keeps four
  accumulated micro-batches exactly equal to one big batch."""
  import jax
  import jax.numpy as jnp
  from bertjax.runtime import optim, sharding
  config = ner_config("runlocal", batch_size=8, max_seq_length=32,
                      **{"optimizer.warmup_steps": 0, "model.vocab_size": 2000})
  tok = tokenizers.load_tokenizer(spm_dir)
  sentences = [(s.tokens, s.tags) for s in ner_eval.read_conll(data_dir / "conll2003/valid.txt")]
  arrays, _, _ = ner.tag_features(tok, sentences[:8], ner.NER_LABELS, 32)
  batch = {k: jnp.asarray(v[:8]) for k, v in arrays.items()}
  batch["weight"] = jnp.ones((8,), jnp.float32)
  counts = np.asarray(batch["label_weights"]).sum(1)
  assert len(set(counts.tolist())) > 2  # uneven: per-micro-batch normalizing would differ
  objective = get_objective(config)
  model = objective.make_model(config, objective.model_config(config))
  optimizer = optim.make_optimizer(config)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  state, _, _ = train.create_train_state(objective, model, optimizer, config, mesh,
                                         objective.init_batch(config, 1, 32, 0), rules=sharding.rules_from_config(config))
  results = []
  for accum in (1, 4):
    step = jax.jit(train.make_train_step(objective, model, optimizer, accum))
    new_state, metrics = step(state, batch)
    results.append((new_state, summarize(metrics)))
  (s1, m1), (s4, m4) = results
  assert m1["loss"] == pytest.approx(m4["loss"], rel=1e-5)
  assert m1["accuracy"] == pytest.approx(m4["accuracy"], abs=1e-6)
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s4.params)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in
              zip(jax.tree.leaves(s1.params), jax.tree.leaves(state.params)))
  assert moved > 1e-4
