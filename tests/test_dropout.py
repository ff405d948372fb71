"""Dropout (bertjax.models.dropout): exactly the configured rate, unbiased, deterministic."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models.dropout import Dropout, keep_mask
from tests.helpers import effective_rate


@pytest.mark.parametrize("rate", [0.1, 0.25, 0.5, 0.0123])
@pytest.mark.parametrize("shape", [(64, 128, 1024), (32, 4, 128, 127)])
def test_keep_rate_and_scaling(rate, shape):
  x = jnp.ones(shape)
  y = Dropout(rate).apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(3)})
  kept = np.asarray(y != 0)
  n = kept.size
  assert abs(effective_rate(rate) - rate) < 2.0 ** -32
  # Binomial: the kept fraction within 5 standard deviations of 1 - rate. At 8.4M elements that is
  # +-5e-4 for rate 0.1, which the earlier byte-resolution masks (0.1016) fell outside.
  assert abs(kept.mean() - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / n), kept.mean()
  np.testing.assert_allclose(np.asarray(y)[kept], 1 / (1 - rate), rtol=1e-6)
  assert abs(float(y.mean()) - 1.0) < 5 * np.sqrt(rate / (1 - rate) / n)  # unbiased
  # Neighbouring elements are independent.
  flat = kept.reshape(-1, shape[-1])
  agree = (flat[:, :-1] == flat[:, 1:]).mean()
  assert abs(agree - (rate * rate + (1 - rate) ** 2)) < 0.01


def test_byte_resolution_rate_would_be_caught():
  """The kept-fraction check above separates 0.1 from 0.1016 at its size."""
  n, rate, byte_rate = 64 * 128 * 1024, 0.1, 26 / 256
  assert abs((1 - byte_rate) - (1 - rate)) > 5 * np.sqrt(rate * (1 - rate) / n) * 2


def test_deterministic_and_same_key_same_mask():
  x = jax.random.normal(jax.random.key(0), (8, 16, 32))
  assert Dropout(0.1).apply({}, x, deterministic=True) is x
  a = Dropout(0.1).apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
  b = Dropout(0.1).apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
  c = Dropout(0.1).apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(2)})
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  assert np.array_equal(Dropout(0.0).apply({}, x, deterministic=False), x)


def test_mask_shape_and_gradient():
  m = keep_mask(jax.random.key(0), (3, 5, 7), 0.3)
  assert m.shape == (3, 5, 7) and m.dtype == jnp.bool_
  x = jnp.ones((4, 64))
  g = jax.grad(lambda x: Dropout(0.3).apply({}, x, deterministic=False,
                                             rngs={"dropout": jax.random.key(5)}).sum())(x)
  y = Dropout(0.3).apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(5)})
  np.testing.assert_allclose(g, y)  # d(sum(x * mask / keep))/dx = mask / keep


@pytest.mark.parametrize("n", [8, 13, 127])
def test_packed_masks_round_trip(n):
  from bertjax.models.dropout import pack_bits, unpack_bits
  keep = jax.random.bernoulli(jax.random.key(n), 0.7, (3, 5, n))
  packed = pack_bits(keep)
  assert packed.shape == (3, 5, -(-n // 8)) and packed.dtype == jnp.uint8
  np.testing.assert_array_equal(unpack_bits(packed, n), keep)


def test_gradient_is_the_forward_mask_in_bf16_and_under_jit():
  x = jax.random.normal(jax.random.key(0), (4, 8, 33), jnp.bfloat16)
  f = jax.jit(lambda x: Dropout(0.2).apply({}, x, deterministic=False,
                                          rngs={"dropout": jax.random.key(9)}))
  y, vjp = jax.vjp(f, x)
  (g,) = vjp(jnp.ones_like(y))
  np.testing.assert_array_equal(np.asarray(g) != 0, np.asarray(y) != 0)
  np.testing.assert_allclose(np.asarray(g, np.float32)[np.asarray(g) != 0], 1.25, rtol=1e-2)
