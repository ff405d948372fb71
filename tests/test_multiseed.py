"""Several seeds in one command: one run per seed, and the summary over them."""

import json
import os
import pathlib
import subprocess
import sys

import ml_collections
import numpy as np

import pytest

from bertjax.core.errors import UserError
from bertjax.data import tokenizers
from bertjax.metrics import glue as glue_eval
from bertjax.tools import multiseed

REPO = pathlib.Path(__file__).resolve().parent.parent


def test_summary_statistics():
  runs = {"1": {"accuracy": 0.5, "loss": 0.7, "f1": float("nan")},
          "2": {"accuracy": 0.75, "loss": 0.6},
          "3": {"accuracy": 0.6, "loss": 0.9, "f1": 0.4, "note": "text"}}
  s = multiseed.summarize(runs)
  acc = np.array([0.5, 0.75, 0.6])
  assert s["accuracy"] == {"median": float(np.median(acc)), "mean": float(acc.mean()),
                           "min": 0.5, "max": 0.75, "std": float(np.std(acc, ddof=1)), "n": 3}
  assert s["f1"]["n"] == 1 and s["f1"]["median"] == 0.4 and s["f1"]["std"] == 0.0  # NaN left out
  assert "note" not in s


def test_seed_list():
  config = ml_collections.ConfigDict({"seeds": (3, 1, 2)})
  assert multiseed.seed_list(config) == [3, 1, 2]
  assert multiseed.seed_list(ml_collections.ConfigDict({"seeds": ()})) == []
  with pytest.raises(UserError, match="seed 1 appears twice"):
    multiseed.seed_list(ml_collections.ConfigDict({"seeds": (1, 2, 1)}))
  with pytest.raises(UserError, match="must hold integers"):
    multiseed.seed_list(ml_collections.ConfigDict({"seeds": (1, "x")}))


def _launch(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "launch.py", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_two_seeds_through_launch(tmp_path, data_dir):
  root = tmp_path / "glue" / "RTE"
  root.mkdir(parents=True)
  for name in ("train.tsv", "dev.tsv"):
    (root / name).symlink_to(data_dir / "glue" / "RTE" / name)
  rows = glue_eval.read_glue_tsv(root / "train.tsv", "rte", "train")[:400]
  tokenizers.train_sentencepiece((s for r in rows for s in (r["sentence1"], r["sentence2"])),
                                 tmp_path / "tok", vocab_size=800, num_threads=1)
  workdir = tmp_path / "sweep"
  proc = _launch("--config", "configs/glue.py:task=rte,runlocal", "--workdir", str(workdir),
                 f"--config.data_dir={tmp_path / 'glue'}",
                 f"--config.data.tokenizer={tmp_path / 'tok'}",
                 "--config.model.vocab_size=800", "--config.model.hidden_size=32",
                 "--config.model.intermediate_size=64", "--config.max_train_examples=64",
                 "--config.total_steps=6", "--config.batch_size=16", "--config.eval_batch_size=16",
                 "--config.max_seq_length=48", "--config.seeds=(4,7)",
                 "--config.model.hidden_dropout_prob=0.1")
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.loads((workdir / "seeds_summary.json").read_text())
  assert summary["seeds"] == [4, 7] and sorted(summary["runs"]) == ["4", "7"]
  losses = []
  for seed in (4, 7):
    run = workdir / f"seed_{seed}"
    config = json.loads((run / "config.json").read_text())
    assert config["seed"] == seed and config["seeds"] == []
    assert config["total_steps"] == 6
    last = json.loads((run / "summary.json").read_text())["last_eval"]
    assert summary["runs"][str(seed)] == last and last["examples"] == 277
    losses.append(last["loss"])
  assert losses[0] != losses[1]  # the seeds really differ (head init, data order, dropout)
  for metric in ("accuracy", "loss", "score"):
    values = np.array([summary["runs"][s][metric] for s in ("4", "7")])
    stats = summary["summary"][metric]
    assert stats["median"] == pytest.approx(np.median(values))
    assert stats["min"] == values.min() and stats["max"] == values.max()
    assert stats["std"] == pytest.approx(np.std(values, ddof=1))
  assert not (workdir / "checkpoints").exists()  # nothing trained outside the seed folders

  bad = _launch("--config", "configs/glue.py:task=rte,runlocal", "--workdir",
                str(tmp_path / "bad"), "--config.seeds=(1,1)")
  assert bad.returncode == 2 and "Traceback" not in bad.stderr
  assert [l for l in bad.stderr.splitlines() if l.startswith("error:")] == [
      "error: seed 1 appears twice in seeds=(1, 1); give each seed once"]
