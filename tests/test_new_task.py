"""Adding a fine-tuning task touches one new file and one registry line: a sentence-classification
task on a two-column tsv, written into a copy of the package, trains and evaluates through
launch.py like the shipped ones (its dev accuracy from the default evaluator, the metric sums of
its `predict` over the dev rows). ARCHITECTURE.md shows this very class as its example."""

import os
import pathlib
import random
import subprocess
import sys

import pytest

from bertjax.runtime import metric_writers
from helpers import package_with

REPO = pathlib.Path(__file__).resolve().parent.parent

NEW_TASK = '''"""Sentence classification from `text<TAB>label` files: a test task."""

import jax.numpy as jnp
import optax

from bertjax.models import classifiers
from bertjax.tasks import base
from bertjax.tasks.glue import encode_rows


def read_rows(config, split):
  lines = base.resolve_file(config, f"{split}.tsv", "").read_text().splitlines()
  return [{"sentence1": text, "sentence2": None, "label": int(label)}
          for text, label in (line.split("\\t") for line in lines)]


class Sentiment(base.TaskObjective):
  name = "sentiment"

  def prepare(self, config, workdir):
    rows = {split: read_rows(config, split) for split in ("train", "dev")}
    tok = self.load_tokenizer(config, workdir, lambda: (r["sentence1"] for r in rows["train"]))
    encode = lambda split: encode_rows(tok, rows[split], config.max_seq_length, False)[0]
    return base.Prepared(train=encode("train"), tokenizer=tok,
                         eval_sets=[base.EvalSet("dev", encode("dev"))])

  def make_model(self, config, model_config):
    return classifiers.SequenceClassifier(model_config, num_labels=2,
                                          **base.head_options(config))

  def feature_spec(self, config, seq_len):
    return {"label": ((), jnp.int32)}

  def predict(self, model, params, batch, rng, deterministic):
    logits = model.apply({"params": params}, **self.model_inputs(batch),
                         deterministic=deterministic, rngs={"dropout": rng})
    w = batch["weight"]
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]) * w
    correct = (logits.argmax(-1) == batch["label"]) * w
    return {"loss": ce, "logits": logits,
            "metrics": {"accuracy": (correct.sum(), w.sum())}}
'''


def _class_source(text: str) -> str:
  """From `class Sentiment` to the end of its last method."""
  start = text.index("class Sentiment(")
  return text[start:text.index('"metrics": {"accuracy": (correct.sum(), w.sum())}}', start)]


def test_architecture_shows_this_task():
  shown = (REPO / "ARCHITECTURE.md").read_text()
  # The document indents its code block by two spaces; the class is the same, line for line.
  block = "\n".join(line[2:] for line in shown[shown.index("  class Sentiment("):].splitlines())
  assert _class_source(block) == _class_source(NEW_TASK)


def _write_split(path: pathlib.Path, n: int, seed: int) -> None:
  """Rows whose label says whether the sentence opens with "good" or "bad": a learnable rule."""
  rng = random.Random(seed)
  words = ["the", "film", "was", "plot", "actors", "long", "music", "story", "and", "a"]
  lines = []
  for i in range(n):
    text = [rng.choice(words) for _ in range(6)]
    label = i % 2
    text.insert(0, "good" if label else "bad")
    lines.append(" ".join(text) + f"\t{label}")
  path.write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_a_new_task_is_one_file_and_one_registry_line(tmp_path):
  root = package_with(tmp_path / "repo", "tasks/sentiment.py", NEW_TASK, "glue",
                      '"sentiment": "bertjax.tasks.sentiment:Sentiment",')

  data = tmp_path / "data"
  data.mkdir()
  _write_split(data / "train.tsv", 256, seed=0)
  _write_split(data / "dev.tsv", 64, seed=1)
  workdir = tmp_path / "run"
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(root))
  r = subprocess.run(
      [sys.executable, "launch.py", "--config", "configs/glue.py:task=rte,runlocal",
       "--workdir", str(workdir), "--config.objective=sentiment", f"--config.data_dir={data}",
       "--config.data.tokenizer=", "--config.data.vocab_size=32", "--config.total_steps=300",
       "--config.eval_every=300", "--config.max_seq_length=16", "--config.batch_size=16",
       "--config.learning_rate=2e-3", "--config.best_metric=accuracy",
       "--config.tensorboard=False"],
      cwd=root, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  evals = [row for row in metric_writers.read_metrics(workdir) if row.get("split") == "eval"]
  assert evals and evals[-1]["step"] == 300
  assert evals[-1]["accuracy"] > 0.9, evals  # the word decides the label: the task is learnt
