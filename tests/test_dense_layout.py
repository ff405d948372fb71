"""`Dense` computes its product as one 2-D matrix multiply, so XLA neither transposes activations,
gradients nor multi-axis kernels around it (on a CPU those copies cost 8-10% of the bert-base
train step, PERFORMANCE.md), and the result is the multi-axis contraction it stands for."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models.layers import Dense

CASES = [  # (input shape, num_in, features): feed-forward, attention's query/key/value, its output
    ((4, 16, 24), 1, 40),
    ((4, 16, 24), 1, (3, 8)),
    ((4, 16, 3, 8), 2, 24),
]


def _module(num_in, features):
  num_out = 1 if isinstance(features, int) else len(features)
  return Dense(features, ("embed",) * (num_in + num_out), num_in=num_in)


@pytest.mark.parametrize("shape,num_in,features", CASES)
def test_dense_is_the_multi_axis_contraction(shape, num_in, features):
  module = _module(num_in, features)
  x = jax.random.normal(jax.random.key(0), shape)
  params = jax.tree.map(lambda p: p + 0.1, module.init(jax.random.key(1), x))
  kernel, bias = params["params"]["kernel"].value, params["params"]["bias"].value
  expected = jnp.tensordot(x, kernel, axes=num_in) + bias
  np.testing.assert_allclose(module.apply(params, x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,num_in,features", CASES)
def test_dense_forward_and_backward_compile_without_copies(shape, num_in, features):
  module = _module(num_in, features)
  x = jnp.ones(shape)
  params = module.init(jax.random.key(0), x)

  def loss(params, x):  # elementwise work on both sides, as in a layer
    return jnp.sum(jnp.sin(module.apply(params, jnp.tanh(x))))

  hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x).compile().as_text()
  copies = re.findall(r"= \S+ (?:copy|transpose)\(", hlo) + re.findall(
      r"%(?:copy|transpose)\w*fusion[.\d]* = ", hlo)
  assert copies == [], f"XLA moved data around the product: {copies}"
