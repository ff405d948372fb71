"""model.scan_layers: one scanned layer body computes what the unrolled stack computes."""

import jax
import jax.numpy as jnp
import numpy as np

import pytest

from bertjax.core.errors import UserError
from bertjax.models.encoder import Encoder, init_params
from bertjax.models.presets import preset
from bertjax.trainer import train

from test_train import tiny_config


@pytest.mark.slow
def test_scanned_encoder_matches_unrolled():
  cfg = preset("bert-tiny", num_hidden_layers=3, vocab_size=100)
  scfg = cfg.replace(scan_layers=True)
  params = init_params(Encoder(cfg), cfg, jax.random.key(0))
  scanned = init_params(Encoder(scfg), scfg, jax.random.key(0))
  assert scanned["layers"]["layer"]["intermediate"]["kernel"].shape == (3, 128, 512)
  assert not any(k.startswith("layer_") for k in scanned)
  # The same weights, stacked along a leading layer axis.
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[params[f"layer_{i}"] for i in range(3)])
  restacked = {k: v for k, v in params.items() if not k.startswith("layer_")}
  restacked["layers"] = {"layer": stacked}
  ids = jax.random.randint(jax.random.key(1), (2, 10), 5, 100)
  mask = jnp.ones((2, 10), jnp.int32).at[1, 7:].set(0)
  a = Encoder(cfg).apply({"params": params}, ids, mask, output_hidden_states=True)
  b = Encoder(scfg).apply({"params": restacked}, ids, mask, output_hidden_states=True)
  np.testing.assert_allclose(a.last_hidden_state, b.last_hidden_state, atol=1e-6)
  np.testing.assert_allclose(a.pooler_output, b.pooler_output, atol=1e-6)
  assert len(b.hidden_states) == 4
  for x, y in zip(a.hidden_states, b.hidden_states):
    np.testing.assert_allclose(x, y, atol=1e-6)


def test_scan_is_refused_with_albert_sharing():
  with pytest.raises(UserError, match="scan_layers"):
    preset("albert-base", num_hidden_groups=1, scan_layers=True)


@pytest.mark.slow
def test_trainer_runs_scanned_layers_with_dropout_and_remat(tmp_path):
  config = tiny_config(total_steps=4, eval_every=0, log_every=1, **{
      "model.scan_layers": True, "model.remat": True, "model.hidden_dropout_prob": 0.1,
      "optimizer.warmup_steps": 0})
  summary = train.train_and_evaluate(config, tmp_path)
  assert summary["step"] == 4
  first, last = summary["first_train"]["loss"], summary["last_train"]["loss"]
  assert np.isfinite(first) and np.isfinite(last) and last != first
