"""Training parity with Hugging Face: the same start, the same batches, the same loss curve.

Forward parity (tests/test_hf_parity.py) says nothing about gradients, the optimizer, clipping or
the schedule. Here one randomly initialized transformers `BertForPreTraining` is converted to our
parameters; both are trained for 30 steps on identical real batches from the quickstart pipeline
(WikiText-2 sample, sentencepiece, dynamic masking, NSP): ours with the real jitted train step
and optimizer, theirs with torch AdamW (weight decay off biases and LayerNorm), global-norm
clipping and the same warmup-then-linear-decay schedule. Every step's loss must agree.

It is also the reference for the quickstart's learning curve: what our model learns in the first
steps on this corpus is what transformers' implementation learns.
"""

import os
import subprocess
import sys

import numpy as np

import pytest

from bertjax import convert
from bertjax.registry import get_objective
from bertjax.runtime import xla_defaults
from bertjax.tools import hf_reference
from tests.helpers import REPO, bertjax_losses, load_config

STEPS, WARMUP = 30, 5


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  config = load_config("configs/quickstart.py", total_steps=STEPS, batch_size=8,
                       max_seq_length=64, max_predictions_per_seq=10, learning_rate=2e-3,
                       **{"optimizer.warmup_steps": WARMUP, "optimizer.weight_decay": 0.01,
                          "eval_every": 0})
  objective = get_objective(config)
  data = objective.build_inputs(config, tmp_path_factory.mktemp("qs"))
  batches = [next(data.train) for _ in range(STEPS)]
  return config, objective, batches


@pytest.mark.slow
def test_pretraining_losses_match_transformers(setup):
  config, objective, batches = setup
  if (os.environ.get("BERTJAX_XLA_DEFAULTS") == "1"  # the run below: the oneDNN flags on,
      and xla_defaults.version_of_jaxlib() in xla_defaults.CHECKED_JAXLIB):  # where checked
    assert "--xla_cpu_use_onednn=true" in os.environ.get("XLA_FLAGS", "")
  cfg = objective.model_config(config)
  hf = hf_reference.build_model(cfg, seed=0)
  state_dict = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
  converted, missing, _ = convert.hf_to_params(state_dict, cfg, ("mlm", "pair"))
  assert not missing

  # Ours: the trainer's own state, optimizer and jitted step, starting from HF's weights.
  ours = bertjax_losses(objective, config, cfg, converted, batches)

  # Theirs: the usual PyTorch loop with the same hyperparameters.
  theirs = [r["loss"] for r in hf_reference.train(hf, batches, config)]

  ours, theirs = np.array(ours), np.array(theirs)
  np.testing.assert_allclose(ours, theirs, rtol=2e-5, atol=0)
  # Not a flat curve that trivially agrees: both learned over these steps.
  assert ours[-5:].mean() < ours[0] - 0.5, ours


@pytest.mark.slow
def test_same_losses_with_the_opt_in_onednn_matmuls():
  """The suite runs without bertjax's opt-in oneDNN flags (BERTJAX_XLA_DEFAULTS=1): the parity
  above must hold with them too."""
  env = dict(os.environ, BERTJAX_XLA_DEFAULTS="1", JAX_PLATFORMS="cpu")
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                      f"{__file__}::test_pretraining_losses_match_transformers"],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
  assert "1 passed" in r.stdout
