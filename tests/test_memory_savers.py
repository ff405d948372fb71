"""The pieces written out to lower the train step's peak memory compute what the library versions
compute: the LayerNorm's hand-written backward pass and the multiply-form gradient clipping."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.test_util import check_grads

from bertjax.models.layers import LayerNorm, layer_norm
from bertjax.runtime.optim import clip_by_global_norm


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_layer_norm_matches_flax_values_and_gradients(dtype):
  x = (jax.random.normal(jax.random.key(0), (3, 5, 48)) * 3 + 1).astype(dtype)
  ours, ref = LayerNorm(1e-12, dtype), nn.LayerNorm(epsilon=1e-12, dtype=dtype)
  params = ref.init(jax.random.key(1), x)
  params = jax.tree.map(lambda p: p + jax.random.normal(jax.random.key(2), p.shape), params)
  # Same parameter layout, so checkpoints and the Hugging Face converter see no change.
  assert (jax.tree.structure(nn.meta.unbox(ours.init(jax.random.key(1), x)))
          == jax.tree.structure(params))
  cot = jax.random.normal(jax.random.key(3), x.shape).astype(dtype)

  def loss(module, p, x):
    return jnp.sum(module.apply(p, x).astype(jnp.float32) * cot.astype(jnp.float32))

  tol = 1e-5 if dtype == jnp.float32 else 3e-2
  np.testing.assert_allclose(np.asarray(ours.apply(params, x), np.float32),
                             np.asarray(ref.apply(params, x), np.float32), rtol=tol, atol=tol)
  g_ours = jax.grad(loss, argnums=(1, 2))(ours, params, x)
  g_ref = jax.grad(loss, argnums=(1, 2))(ref, params, x)
  for a, b in zip(jax.tree.leaves(g_ours), jax.tree.leaves(g_ref)):
    assert a.dtype == b.dtype
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                               rtol=tol, atol=tol * 10)


def test_layer_norm_gradient_is_the_derivative():
  """Finite differences, in float64, of the function itself (not only agreement with flax)."""
  with jax.enable_x64(True):
    x = jax.random.normal(jax.random.key(4), (4, 16), jnp.float64) * 2
    scale = jax.random.normal(jax.random.key(5), (16,), jnp.float64)
    bias = jax.random.normal(jax.random.key(6), (16,), jnp.float64)
    check_grads(lambda x, s, b: layer_norm(x, s, b, 1e-5), (x, scale, bias), order=1,
                modes=("rev",), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("norm_scale", [1e-3, 1.0, 50.0])
def test_clip_matches_optax(norm_scale):
  grads = {"a": jax.random.normal(jax.random.key(7), (30, 4)) * norm_scale,
           "b": jax.random.normal(jax.random.key(8), (7,)) * norm_scale}
  ours, _ = clip_by_global_norm(1.0).update(grads, optax.EmptyState())
  ref, _ = optax.clip_by_global_norm(1.0).update(grads, optax.EmptyState())
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
  norm = float(optax.tree.norm(ours))
  assert norm == pytest.approx(min(1.0, float(optax.tree.norm(grads))), rel=1e-5)


def test_clip_leaves_zero_gradients_finite():
  grads = {"a": jnp.zeros((3,))}
  out, _ = clip_by_global_norm(1.0).update(grads, optax.EmptyState())
  assert np.all(np.asarray(out["a"]) == 0.0)
