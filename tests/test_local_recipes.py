"""The local recipes show what they are for: ELECTRA's `runlocal` discriminator passes always
answering "original" within its steps, its metrics never read 0/0, and distillation headlines the
quantity that falls (soft_kl, KL(teacher || student)) rather than a loss holding the teacher's
entropy."""

from __future__ import annotations

import math

import jax.numpy as jnp
import pytest

from bertjax import registry
from bertjax.core import run_files
from bertjax.objectives.rtd import rtd_terms
from bertjax.runtime import metric_writers, progress
from bertjax.runtime.run_record import summarize
from bertjax.trainer import train
from tests.helpers import load_config

# ---------------------------------------------------------------------------------------------
# ELECTRA


def test_rtd_precision_is_zero_not_nan_when_nothing_is_predicted_replaced():
  labels = jnp.array([[1, 0, 0, 0]])
  mask = jnp.ones((1, 4), jnp.int32)
  _, none = rtd_terms(jnp.full((1, 4), -3.0), labels, mask, jnp.float32(4))
  m = summarize(none)
  assert m["rtd_precision"] == 0.0 and m["rtd_recall"] == 0.0
  assert m["rtd_accuracy"] == m["rtd_baseline_accuracy"] == 0.75
  # Summed with a batch that predicts two tokens, one of them right: exactly 1/2.
  _, some = rtd_terms(jnp.array([[3.0, 3.0, -3.0, -3.0]]), labels, mask, jnp.float32(4))
  both = summarize({k: (none[k][0] + some[k][0], none[k][1] + some[k][1]) for k in none})
  assert both["rtd_precision"] == 0.5


@pytest.mark.slow
def test_electra_runlocal_discriminator_passes_always_original(tmp_path):
  """configs/electra.py:runlocal as shipped (WikiText-2 sample, 200 steps): at the end the
  discriminator finds replaced tokens and beats the accuracy of always answering "original" by
  a margin of many standard errors (~4k eval tokens: one standard error is under 0.01)."""
  config = load_config("configs/electra.py:runlocal", tensorboard=False,
                       async_checkpointing=False, checkpoint_every=200)
  last = train.train_and_evaluate(config, tmp_path)["last_eval"]
  print({k: round(v, 4) for k, v in last.items() if k.startswith(("rtd", "mlm"))})
  assert last["rtd_recall"] > 0.2 and last["rtd_precision"] > 0.5
  assert last["rtd_accuracy"] > last["rtd_baseline_accuracy"] + 0.05


# ---------------------------------------------------------------------------------------------
# Distillation


def test_distillation_headlines_the_kl_not_the_loss(tmp_path, capsys):
  """The run's main metric, its console lines and its end table lead with soft_kl, the part of
  the soft loss that falls; a report ranks it lower-is-better."""
  config = load_config("configs/distill.py:runlocal")
  distill = registry.objective_class(config.objective)
  assert distill.main_metric(config) == "soft_kl"
  assert distill.main_metric({"objective": "distill", "distill": {"soft_weight": 0.0}}) == "loss"
  assert run_files.lower_is_better("soft_kl")
  row = {"loss": 172.9, "soft_ce": 33.4, "soft_kl": 0.81, "mlm_accuracy": 0.3, "agreement": 0.9}
  metric_writers.MetricWriter(tmp_path, 200, enabled=True, tensorboard=False).print_row(
      200, "train", row)
  line = capsys.readouterr().err.strip()
  assert line == ("train step 200/200: loss 172.9000 soft_kl 0.8100 mlm_accuracy 0.3000 "
                  "agreement 0.9000")
  table = progress.end_table({"status": "finished", "step": 200, "first_train_step": 20,
                              "first_train": row, "last_train_step": 200, "last_train": row})
  assert [l.split()[0] for l in table.splitlines()[2:5]] == ["loss", "soft_kl", "soft_ce"]
