"""Adding an objective touches one new file and one registry line: a label-smoothed MLM objective
written into a copy of the package trains through launch.py like the shipped ones."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from helpers import package_with

REPO = pathlib.Path(__file__).resolve().parent.parent

NEW_OBJECTIVE = '''"""MLM with label smoothing: a test objective, added as a new objective is."""

import jax
import jax.numpy as jnp
import optax

from bertjax.objective import Objective


class SmoothedMlm(Objective):
  name = "smoothed_mlm"
  data_kind = "full"          # the instances the pipeline builds: nsp | sop | full | single

  def loss(self, model, params, batch, rng, denominators, deterministic):
    logits = self.apply(model, params, batch, rng, deterministic)["mlm_logits"]
    targets = optax.smooth_labels(jax.nn.one_hot(batch["masked_ids"], logits.shape[-1]), 0.1)
    w = batch["masked_weights"].astype(jnp.float32)
    loss_sum = jnp.sum(optax.softmax_cross_entropy(logits, targets) * w)
    return loss_sum / denominators["mlm"], {"smoothed_mlm_loss": (loss_sum, jnp.sum(w))}
'''
# The same objective took 30 lines at 1cb9496, before objectives became stateless: it had to
# name its masking and prediction rows, build its model and write its denominators.
LINES_BEFORE = 30


def test_architecture_shows_this_objective():
  shown = (REPO / "ARCHITECTURE.md").read_text()
  block = "\n".join(line[2:] for line in shown[shown.index("  class SmoothedMlm("):].splitlines())
  source = NEW_OBJECTIVE[NEW_OBJECTIVE.index("class SmoothedMlm("):].rstrip()
  assert block.startswith(source + "\n")


def test_the_new_objective_is_shorter_than_before():
  assert len(NEW_OBJECTIVE.strip().splitlines()) < LINES_BEFORE


@pytest.mark.slow
def test_a_new_objective_is_one_file_and_one_registry_line(tmp_path):
  root = package_with(tmp_path / "repo", "objectives/smoothed_mlm.py", NEW_OBJECTIVE, "mlm",
                      '"smoothed_mlm": "bertjax.objectives.smoothed_mlm:SmoothedMlm",')

  workdir = tmp_path / "run"
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(root))
  r = subprocess.run(
      [sys.executable, "launch.py", "--config", "configs/quickstart.py", "--workdir", str(workdir),
       "--config.objective=smoothed_mlm", "--config.data.synthetic=True",
       "--config.total_steps=4", "--config.log_every=2", "--config.batch_size=4",
       "--config.max_seq_length=32", "--config.max_predictions_per_seq=5",
       "--config.tensorboard=False", "--config.async_checkpointing=False"],
      cwd=root, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  from bertjax.runtime import metric_writers  # pylint: disable=import-outside-toplevel
  rows = metric_writers.read_metrics(workdir)
  train = [row for row in rows if row.get("split") == "train"]
  assert train and all("smoothed_mlm_loss" in row for row in train)
  assert json.loads((workdir / "config.json").read_text())["objective"] == "smoothed_mlm"
