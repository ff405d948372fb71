"""Feature-based heads: what a task head reads from the encoder besides its usual input.

BERT's feature-based experiments feed a head the hidden states of several layers (the best:
the last four concatenated); ELMo learns a softmax-normalised weighted sum of them times a
scale ("scalar mix"). `head_features` builds either from an `EncoderOutput`; `pool` turns
per-token features into one vector per row ([CLS] or the mean over real tokens).
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

FEATURES = ("standard", "last", "concat", "scalar_mix")
POOLINGS = ("cls", "mean")


def resolve_layers(layers: Sequence[int], num_layers: int) -> tuple[int, ...]:
  """Hidden-state indices (0: embeddings, 1..num_layers: layer outputs, negative: from the top)
  as non-negative indices into `EncoderOutput.hidden_states`."""
  return tuple(i if i >= 0 else num_layers + 1 + i for i in layers)


def top_layers(num_layers: int, count: int = 4) -> tuple[int, ...]:
  """The top `count` hidden states (BERT's best feature-based choice, the last four), or every
  one a shallower model has: what a refused `head.layers` is told to use instead."""
  return tuple(range(-min(count, num_layers + 1), 0))


def layers_error(layers: Sequence[int], num_layers: int) -> str:
  """'' when `layers` are usable hidden-state indices, else what is wrong."""
  if not layers:
    return "names no hidden state"
  bad = [i for i in layers if not -(num_layers + 1) <= i <= num_layers]
  if bad:
    return (f"holds {bad[0]}, outside the {num_layers + 1} hidden states (0 embeddings, 1..{num_layers} "
            f"layers, -1..-{num_layers + 1} from the top)")
  if len(set(resolve_layers(layers, num_layers))) != len(layers):
    return "names a hidden state twice"
  return ""


class ScalarMix(nn.Module):
  """ELMo's scalar mix: gamma * sum_j softmax(w)_j h_j over equally shaped states; w starts at 0
  (an even mean), gamma at 1."""

  @nn.compact
  def __call__(self, states: Sequence[jax.Array]) -> jax.Array:
    weights = self.param("weights", nn.with_logical_partitioning(nn.initializers.zeros_init(), (None,)),
                         (len(states),), jnp.float32)
    gamma = self.param("gamma", nn.with_logical_partitioning(nn.initializers.ones_init(), ()),
                       (), jnp.float32)
    probs = jax.nn.softmax(weights)
    mixed = sum(p * s.astype(jnp.float32) for p, s in zip(probs, states))
    return (gamma * mixed).astype(states[0].dtype)


def head_features(out, features: str, layers: Sequence[int], num_layers: int,
                  mix: nn.Module | None = None) -> jax.Array:
  """<float>[batch, seq, d] per-token features of an `EncoderOutput` (called with
  `output_hidden_states` for concat and scalar_mix): d is hidden, or hidden * len(layers) for
  concat. `mix`: the `ScalarMix` for scalar_mix."""
  if features == "last":
    return out.last_hidden_state
  states = [out.hidden_states[i] for i in resolve_layers(layers, num_layers)]
  if features == "concat":
    return jnp.concatenate(states, axis=-1)
  return mix(states)


def pool(x: jax.Array, attention_mask: jax.Array, how: str) -> jax.Array:
  """<float>[batch, seq, d], <int>[batch, seq] -> <float>[batch, d]: the [CLS] row ('cls') or
  the mean over the rows whose mask is set ('mean'; padding has no effect)."""
  if how == "cls":
    return x[:, 0]
  mask = attention_mask.astype(jnp.float32)[..., None]
  total = jnp.sum(x.astype(jnp.float32) * mask, axis=1)
  return (total / jnp.maximum(jnp.sum(mask, axis=1), 1.0)).astype(x.dtype)
