"""Pruning (bertjax.prune, bertjax.models.pruning): heads and layers removed, magnitude pruning.

A pruned model equals the unpruned one with those heads masked; it round-trips through orbax
and through Hugging Face export (transformers prunes by `pruned_heads` on load); head
importance scores equal finite differences of the loss; magnitude-pruned weights stay exactly
zero through fine-tuning with weight decay.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as T

import bertjax
from bertjax import convert
from bertjax.errors import UserError
from bertjax.models import pruning
from bertjax.models.classifiers import SequenceClassifier
from bertjax.models.config import ModelConfig
from bertjax.models.encoder import Encoder, init_params
from bertjax.prune import folders, importance, magnitude, select

CFG = ModelConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                  intermediate_size=40, max_position_embeddings=32, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
REMOVE = {0: [1, 3], 2: [0]}


def random_params(model, cfg, seed=0):
  """Every parameter drawn at random (init leaves biases 0 and scales 1, which hides mistakes)."""
  params = init_params(model, cfg, jax.random.key(seed))
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  return jax.tree_util.tree_unflatten(
      tree, [0.3 * jax.random.normal(k, x.shape) + (x if x.ndim == 1 else 0)
             for k, x in zip(keys, leaves)])


def inputs(seed=2, batch=3, seq=10):
  rs = np.random.RandomState(seed)
  ids = rs.randint(1, CFG.vocab_size, (batch, seq))
  mask = np.ones((batch, seq), np.int32)
  mask[1, 7:] = 0
  types = np.zeros_like(ids)
  types[:, 5:] = 1
  return jnp.asarray(ids * mask), jnp.asarray(mask), jnp.asarray(types * mask)


def masks_without(cfg, remove):
  return [jnp.asarray([0.0 if h in remove.get(i, ()) else 1.0 for h in cfg.kept_heads(i)])
          for i in range(cfg.num_hidden_layers)]


def test_pruned_heads_equal_masked_heads():
  params = random_params(Encoder(CFG), CFG)
  ids, mask, types = inputs()
  masked = Encoder(CFG).apply({"params": pruning.with_head_masks(params, CFG, masks_without(CFG, REMOVE))},
                              ids, mask, types)
  small, cfg = pruning.prune_heads(params, CFG, REMOVE)
  assert cfg.pruned_heads == ((1, 3), (), (0,))
  assert [cfg.layer_heads(i) for i in range(3)] == [2, 4, 3]
  assert small["layer_0"]["attention"]["query"]["kernel"].shape == (32, 2, 8)
  assert small["layer_0"]["attention"]["output"]["kernel"].shape == (2, 8, 32)
  assert small["layer_2"]["attention"]["value"]["bias"].shape == (3, 8)
  out = Encoder(cfg).apply({"params": small}, ids, mask, types)
  full = Encoder(CFG).apply({"params": params}, ids, mask, types)
  np.testing.assert_allclose(out.last_hidden_state, masked.last_hidden_state, atol=1e-5)
  np.testing.assert_allclose(out.pooler_output, masked.pooler_output, atol=1e-5)
  assert np.max(np.abs(out.last_hidden_state - full.last_hidden_state)) > 1e-2  # pruning did act
  # Pruning twice (original numbers) equals pruning once with the union.
  twice, cfg2 = pruning.prune_heads(*pruning.prune_heads(params, CFG, {0: [1]}), {0: [3], 2: [0]})
  assert cfg2 == cfg
  np.testing.assert_allclose(Encoder(cfg2).apply({"params": twice}, ids, mask, types).last_hidden_state,
                             out.last_hidden_state, atol=1e-6)


def test_removed_layer_equals_skipped_layer():
  params = random_params(Encoder(CFG), CFG)
  small, cfg = pruning.remove_layers(params, CFG, [1])
  assert cfg.num_hidden_layers == 2 and set(k for k in small if k.startswith("layer_")) == {"layer_0", "layer_1"}
  ids, mask, types = inputs()
  out = Encoder(cfg).apply({"params": small}, ids, mask, types)
  # The same computation by hand: layers 0 and 2 of the original.
  two = CFG.replace(num_hidden_layers=2)
  by_hand = {**params, "layer_1": params["layer_2"]}
  del by_hand["layer_2"]
  np.testing.assert_allclose(out.last_hidden_state,
                             Encoder(two).apply({"params": by_hand}, ids, mask, types).last_hidden_state,
                             atol=1e-6)


def test_pruning_refuses_emptying_a_layer_and_bad_configs():
  params = random_params(Encoder(CFG), CFG)
  with pytest.raises(UserError, match="without heads; remove the layer"):
    pruning.prune_heads(params, CFG, {1: [0, 1, 2, 3]})
  with pytest.raises(UserError, match="no head"):
    pruning.prune_heads(*pruning.prune_heads(params, CFG, {0: [1]}), {0: [1]})
  with pytest.raises(UserError, match="scan_layers"):
    CFG.replace(scan_layers=True, pruned_heads=((1,), (), ()))
  uniform = CFG.replace(scan_layers=True, pruned_heads=((1,), (2,), (0,)))
  assert uniform.layer_heads(2) == 3
  with pytest.raises(UserError, match="one .*list per layer"):
    CFG.replace(pruned_heads=((1,),))
  with pytest.raises(UserError, match="ALBERT"):
    CFG.replace(architecture="albert", num_hidden_groups=1, pruned_heads=((1,), (), ()))


def test_head_selection_is_global_and_keeps_a_head_per_layer():
  scores = np.array([[0.1, 0.2, 0.9, 0.8], [0.05, 0.04, 0.03, 0.02], [0.7, 0.6, 0.5, 0.4]])
  chosen = select.heads_to_remove(scores, CFG, 5)
  assert chosen == {1: [3, 2, 1], 0: [0, 1]}  # layer 1 keeps its best head (0)
  assert select.layers_to_remove(scores, CFG, 1) == [1]
