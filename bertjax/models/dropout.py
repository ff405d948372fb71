"""Dropout that draws 8 bits per element instead of 32.

`flax.linen.Dropout` draws one 32-bit uniform per element (`jax.random.bernoulli`). With the
default threefry PRNG in partitionable mode every element costs one threefry block, XLA keeps two
32-bit words per element alive for the backward pass and recomputes the comparison in each
consumer fusion; on a CPU this made BERT's hidden dropout cost ~15% of a bert-mini train step
(PERFORMANCE.md). Here one 32-bit draw gives four elements their bytes, so a mask costs a
quarter of the random bits and a quarter of the memory traffic.

An element is kept when its byte is >= round(rate * 256): the rate actually applied is that
threshold / 256 (0.1016 for 0.1; `effective_rate` says which), and kept values are scaled by
1 / (1 - effective rate) so the expectation is unchanged. Like Flax's, the mask is a pure
function of the 'dropout' RNG stream, so it is the same on any mesh.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

LEVELS = 256  # distinct byte values


def effective_rate(rate: float) -> float:
  """The drop probability applied for a configured `rate` (a multiple of 1/256)."""
  return round(rate * LEVELS) / LEVELS


def keep_mask(rng: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
  """<bool>[*shape]: True where an element is kept, each with probability 1 - effective_rate."""
  # Packed along the last axis, so the leading (batch) axes shard like the activations do.
  *lead, n = shape
  words = jax.random.bits(rng, (*lead, -(-n // 4)), jnp.uint32)
  bytes_ = jax.lax.bitcast_convert_type(words, jnp.uint8).reshape(*lead, -1)[..., :n]
  return bytes_ >= jnp.uint8(round(rate * LEVELS))


class Dropout(nn.Module):
  """Drop-in for `flax.linen.Dropout(rate)(x, deterministic)` with byte-resolution masks."""
  rate: float

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    p = effective_rate(self.rate)
    if deterministic or p == 0.0:
      return x
    if p >= 1.0:
      return jnp.zeros_like(x)
    keep = keep_mask(self.make_rng("dropout"), x.shape, self.rate)
    return jnp.where(keep, x * jnp.asarray(1.0 / (1.0 - p), x.dtype), jnp.zeros((), x.dtype))
