"""Feature-based heads (bertjax/models/features.py): a head over several layers' hidden states,
concatenated or scalar-mixed, computes what it says and trains over a frozen encoder."""

import jax
import jax.numpy as jnp
import numpy as np

import pytest

from bertjax.models import classifiers, features
from bertjax.models.encoder import Encoder
from bertjax.registry import get_objective

from test_frozen import build, flat, glue_batch, run_steps, task_config

LAYERS4 = {"model.num_hidden_layers": 4}


def encoder_states(model, params, batch):
  out = Encoder(model.config).apply({"params": params["encoder"]}, batch["input_ids"],
                                    batch["attention_mask"], batch["token_type_ids"],
                                    output_hidden_states=True)
  return out.hidden_states


def test_concat_mean_pooled_head_is_what_it_says():
  """Logits = Dense(mean over real tokens of the last four layers side by side)."""
  _, state = build(task_config(**LAYERS4, **{"head.features": "concat",
                                             "head.pooling": "mean"}))
  params = jax.device_get(state.params)
  kernel = params["classifier"]["classifier"]["kernel"]
  assert kernel.shape == (4 * 32, 2)
  batch = glue_batch()
  model = classifiers.SequenceClassifier(_model_cfg(), num_labels=2, features="concat",
                                         layers=(-4, -3, -2, -1), pooling="mean")
  logits = model.apply({"params": params}, batch["input_ids"], batch["attention_mask"],
                       batch["token_type_ids"])
  states = encoder_states(model, params, batch)
  x = np.concatenate([np.asarray(h) for h in states[1:]], -1)
  m = np.asarray(batch["attention_mask"], np.float32)[..., None]
  pooled = (x * m).sum(1) / m.sum(1)
  expected = pooled @ kernel + params["classifier"]["classifier"]["bias"]
  np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)


def _model_cfg():
  """The task's model config, as the trainer builds it."""
  config = task_config(**LAYERS4)
  return get_objective(config).model_config(config)


def test_scalar_mix_starts_as_the_mean_and_learns_its_weights():
  states = [jnp.full((1, 2, 3), float(i)) for i in range(4)]
  mix = features.ScalarMix()
  params = mix.init(jax.random.key(0), states)
  np.testing.assert_allclose(mix.apply(params, states), np.full((1, 2, 3), 1.5))
  # A softmax over the weights times gamma: weight 0 and 1 for the third state.
  params = {"params": {"weights": jnp.array([-1e9, -1e9, 0.0, -1e9]), "gamma": jnp.array(2.0)}}
  np.testing.assert_allclose(mix.apply(params, states), np.full((1, 2, 3), 4.0))


@pytest.mark.parametrize("spec, overrides", [
    ("configs/glue.py:task=sst2,runlocal", {"head.features": "concat"}),
    ("configs/glue.py:task=sst2,runlocal", {"head.features": "scalar_mix", "head.pooling": "mean"}),
    ("configs/ner.py:runlocal", {"head.features": "scalar_mix", "head.layers": (0, 2, 4)}),
    ("configs/ner.py:runlocal", {"head.features": "last"}),
])
def test_feature_head_trains_over_a_frozen_encoder(spec, overrides):
  config = task_config(spec, **LAYERS4, **{"freeze.encoder": True, **overrides})
  s, state = build(config)
  before = flat(state.params)
  state, losses = run_steps(s, state, glue_batch(tagging="ner" in spec), 40)
  after = flat(state.params)
  assert losses[-1] < 0.75 * losses[0], losses
  moved = {k for k in before if not np.array_equal(before[k], after[k])}
  assert moved and not any(k.startswith("encoder/") for k in moved), moved
  if overrides["head.features"] == "scalar_mix":
    assert "scalar_mix/weights" in moved and "scalar_mix/gamma" in moved


def test_pool_mean_ignores_padding():
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 5, 3)), jnp.float32)
  mask = jnp.asarray([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
  garbage = x.at[0, 3:].set(1e6)
  pooled = features.pool(garbage, mask, "mean")
  np.testing.assert_allclose(pooled[0], np.asarray(x[0, :3]).mean(0), rtol=1e-6)
  np.testing.assert_allclose(pooled[1], np.asarray(x[1]).mean(0), rtol=1e-6)
  np.testing.assert_array_equal(features.pool(x, mask, "cls"), x[:, 0])
