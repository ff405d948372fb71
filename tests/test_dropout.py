"""Byte-resolution dropout (bertjax.models.dropout): right rate, unbiased, deterministic."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models.dropout import Dropout, effective_rate, keep_mask


@pytest.mark.parametrize("rate", [0.1, 0.25, 0.5])
@pytest.mark.parametrize("shape", [(64, 128, 256), (32, 4, 128, 127)])  # last axis not /4 too
def test_keep_rate_and_scaling(rate, shape):
  x = jnp.ones(shape)
  y = Dropout(rate).apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(3)})
  kept = np.asarray(y != 0)
  n = kept.size
  p = effective_rate(rate)
  assert abs(p - rate) <= 0.5 / 256
  # Binomial: within 5 standard deviations of the expected kept fraction.
  assert abs(kept.mean() - (1 - p)) < 5 * np.sqrt(p * (1 - p) / n), kept.mean()
  np.testing.assert_allclose(np.asarray(y)[kept], 1 / (1 - p), rtol=1e-6)
  assert abs(float(y.mean()) - 1.0) < 5 * np.sqrt(p / (1 - p) / n)  # unbiased in expectation
  # Masks do not repeat along the packed axis: neighbouring elements are independent.
  flat = kept.reshape(-1, shape[-1])
  agree = (flat[:, :-1] == flat[:, 1:]).mean()
  assert abs(agree - (p * p + (1 - p) ** 2)) < 0.01


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
