"""Dropout at exactly the configured rate, from one 32-bit draw per element.

An element is kept when its 32-bit random word is >= round(rate * 2**32): the drop probability is
the configured rate to within 2**-33, closer than float32 holds the rate itself (float32(0.1) is
0.1 + 1.5e-9). Kept values are scaled by 1 / (1 - rate). Comparing integers skips the
bits -> float conversion `jax.random.bernoulli` makes. Like Flax's, the mask is a pure function of
the 'dropout' RNG stream, so it is the same on any mesh.

(An earlier version drew 8 bits per element, four elements per draw, which was faster on a CPU
but applied 0.1016 for a rate of 0.1; PERFORMANCE.md has the CPU cost of exactness.)
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

WORD = 2 ** 32


def threshold(rate: float) -> int:
  """The smallest kept 32-bit word for a drop probability `rate` in [0, 1)."""
  return min(round(rate * WORD), WORD - 1)


def effective_rate(rate: float) -> float:
  """The drop probability applied for a configured `rate`: threshold / 2**32."""
  return threshold(rate) / WORD


def keep_mask(rng: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
  """<bool>[*shape]: True where an element is kept, each with probability 1 - rate."""
  words = jax.random.bits(rng, shape, jnp.uint32)
  return words >= jnp.uint32(threshold(rate))


class Dropout(nn.Module):
  """Drop-in for `flax.linen.Dropout(rate)(x, deterministic)`."""
  rate: float

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    if deterministic or self.rate == 0.0:
      return x
    if self.rate >= 1.0:
      return jnp.zeros_like(x)
    keep = keep_mask(self.make_rng("dropout"), x.shape, self.rate)
    return jnp.where(keep, x * jnp.asarray(1.0 / (1.0 - self.rate), x.dtype), jnp.zeros((), x.dtype))
