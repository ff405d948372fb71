"""The fused residual kernel (bertjax/models/fused_residual.py) in Pallas interpret mode: it is
LayerNorm(residual + dropout(x + bias)) computed the explicit way under the same keep mask,
outputs and all five gradients, in float32 and bfloat16, for hidden sizes that are and are not
powers of two (the kernel pads its rows inside) and with rows of padding; the bias gradient is
the kept row sum the module derives; its mask drops at the configured rate; and a model built with
it (`fused_residual` in the kernel set) has the same parameters, hands each output projection's
bias to the kernel instead of adding it in the Dense and, without dropout, has the same outputs
and gradients as the explicit layers."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models import flash_kernels as fk
from bertjax.models import fused_residual as fr
from bertjax.models import kernels
from bertjax.models.config import ModelConfig
from bertjax.models.encoder import Encoder
from bertjax.models.dropout import threshold
from bertjax.models.layers import layer_norm


def keep_mask(seed, rows: int, hidden: int, rate: float):
  """<bool>[rows, hidden]: the kernels' keep mask in plain JAX: the seed's 32-bit key, hashed
  with each element's (row, column) by the attention kernel's counter-based hash."""
  seed = jnp.asarray(seed, jnp.uint32)
  key = fk.mix32(seed[0] ^ fk.mix32(seed[1] + jnp.uint32(0x3C6EF372)))
  r = jnp.arange(rows, dtype=jnp.uint32)[:, None]
  c = jnp.arange(hidden, dtype=jnp.uint32)[None, :]
  return fk.keep_from_words(fk.row_words(key, r), fk.col_words(key, c), threshold(rate))

EPS = 1e-12


def operands(hidden, dtype, lead=(3, 7), seed=0):
  k = jax.random.split(jax.random.key(seed), 5)
  x = jax.random.normal(k[0], (*lead, hidden), jnp.float32).astype(dtype)
  residual = jax.random.normal(k[1], (*lead, hidden), jnp.float32).astype(dtype)
  bias = 0.1 * jax.random.normal(k[2], (hidden,))
  scale = 1.0 + 0.1 * jax.random.normal(k[3], (hidden,))
  shift = 0.1 * jax.random.normal(k[4], (hidden,))
  return x, residual, bias, scale, shift


def explicit(rate, keep):
  """The explicit path: dropout in the operands' dtype, the add, then LayerNorm (float32 stats)."""
  def f(x, residual, bias, scale, shift):
    y = (x.astype(jnp.float32) + bias).astype(x.dtype)
    if rate > 0:
      y = jnp.where(keep, y / (1 - rate), 0).astype(x.dtype)
    return layer_norm((residual + y).astype(residual.dtype), scale, shift, EPS)
  return f


def results(f, args):
  def scalar(*a):
    out = f(*a)
    return jnp.sum(jnp.sin(out.astype(jnp.float32))), out
  (_, out), grads = jax.jit(jax.value_and_grad(scalar, argnums=(0, 1, 2, 3, 4), has_aux=True))(
      *args)
  return [np.asarray(v, np.float32) for v in (out, *grads)]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("hidden", [48, 64, 96])
@pytest.mark.parametrize("rate", [0.0, 0.25])
def test_kernel_equals_the_explicit_path_under_the_same_mask(dtype, hidden, rate):
  args = operands(hidden, dtype)
  seed = jnp.array([3, 1234], jnp.uint32)
  keep = keep_mask(seed, 21, hidden, rate).reshape(3, 7, hidden)
  fused = lambda *a: fr.fused_residual_norm(*a, rate=rate, seed=seed, eps=EPS, interpret=True)
  got, want = results(fused, args), results(explicit(rate, keep), args)
  tol = dict(rtol=1e-5, atol=2e-5) if dtype == jnp.float32 else dict(rtol=5e-2, atol=6e-2)
  for name, g, w in zip(("out", "dx", "dresidual", "dbias", "dscale", "dshift"), got, want):
    if dtype == jnp.bfloat16 and name in ("dbias", "dscale", "dshift"):  # sums over 21 rows
      np.testing.assert_allclose(g, w, rtol=5e-2, atol=0.3, err_msg=name)
    else:
      np.testing.assert_allclose(g, w, err_msg=name, **tol)
  assert got[0].shape == (3, 7, hidden)


def test_a_twin_with_another_mask_differs():
  """The comparison above can fail: the same kernel against the explicit path under another
  seed's mask."""
  args = operands(64, jnp.float32)
  seed, other = jnp.array([3, 1234], jnp.uint32), jnp.array([4, 1234], jnp.uint32)
  fused = lambda *a: fr.fused_residual_norm(*a, rate=0.25, seed=seed, eps=EPS, interpret=True)
  keep = keep_mask(other, 21, 64, 0.25).reshape(3, 7, 64)
  assert not np.allclose(results(fused, args)[0], results(explicit(0.25, keep), args)[0],
                         atol=1e-3)


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_the_mask_drops_at_the_rate_within_sampling_error(rate):
  keep = np.asarray(keep_mask(jnp.array([9, 77], jnp.uint32), 256, 768, rate))
  n = keep.size
  dropped = 1 - keep.mean()
  assert abs(dropped - rate) < 4 * np.sqrt(rate * (1 - rate) / n)
  # Rows and columns are not the same stream, and another seed is another mask.
  assert not np.array_equal(keep[:64, :64], keep[:64, :64].T)
  other = np.asarray(keep_mask(jnp.array([10, 77], jnp.uint32), 256, 768, rate))
  assert 0.5 < (other == keep).mean() < 1.0


def small_cfg(**kw):
  return ModelConfig(vocab_size=64, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=32, kernels="cpu", **kw)


def encoder_run(cfg, deterministic):
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 60, (2, 16)).astype(np.int32)
  mask = np.ones((2, 16), np.int32)
  mask[1, 11:] = 0
  types = np.zeros((2, 16), np.int32)
  model = Encoder(cfg)
  params = model.init(jax.random.key(0), ids, mask, types)["params"]

  def scalar(p):
    out = model.apply({"params": p}, ids, mask, types, deterministic=deterministic,
                      rngs={"dropout": jax.random.key(5)})
    return jnp.sum(jnp.sin(out.last_hidden_state) * mask[..., None]), out.last_hidden_state
  (_, out), grads = jax.jit(jax.value_and_grad(scalar, has_aux=True))(params)
  return params, out, grads


@pytest.mark.slow
def test_model_with_the_fused_kernel_has_the_same_parameters_and_results():
  plain = small_cfg(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  fused = plain.replace(kernel_overrides=(("fused_residual", True),))
  assert kernels.for_model(fused).fused_residual and not kernels.for_model(plain).fused_residual
  p1, out1, g1 = encoder_run(plain, deterministic=False)
  p2, out2, g2 = encoder_run(fused, deterministic=False)
  assert jax.tree.structure(p1) == jax.tree.structure(p2)
  assert all(a.shape == b.shape for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)))
  np.testing.assert_allclose(np.asarray(out1), np.asarray(out2), rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
  # With dropout: training draws the kernel's masks (finite, and not the explicit stream);
  # evaluation has none, so it matches the explicit layers.
  dropping = dataclasses.replace(fused, hidden_dropout_prob=0.1)
  _, train_out, train_grads = encoder_run(dropping, deterministic=False)
  assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(train_grads))
  assert not np.allclose(np.asarray(train_out), np.asarray(out2), atol=1e-3)
  _, eval_out, _ = encoder_run(dropping, deterministic=True)
  _, eval_plain, _ = encoder_run(dataclasses.replace(plain, hidden_dropout_prob=0.1), True)
  np.testing.assert_allclose(np.asarray(eval_out), np.asarray(eval_plain), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_padded_rows_and_the_bias_gradient_as_derived(dtype):
  """Rows of padding (the loss ignores them, as the masked losses do): the kernel still equals the
  explicit path, outputs and all five gradients; the bias gradient is what the module derives,
  sum over rows of keep * dh / (1 - rate) with dh the gradient reaching the residual sum (the
  residual's own gradient), so padded rows add nothing to it."""
  rate, hidden = 0.25, 48
  args = operands(hidden, dtype)
  real = np.ones((3, 7), np.float32)
  real[1, 4:] = 0.0
  real[2, 2:] = 0.0
  seed = jnp.array([7, 99], jnp.uint32)
  keep = keep_mask(seed, 21, hidden, rate).reshape(3, 7, hidden)

  def weighted(f):
    return lambda *a: f(*a) * jnp.asarray(real, dtype)[..., None]

  fused = lambda *a: fr.fused_residual_norm(*a, rate=rate, seed=seed, eps=EPS, interpret=True)
  got, want = results(weighted(fused), args), results(weighted(explicit(rate, keep)), args)
  tol = dict(rtol=1e-5, atol=2e-5) if dtype == jnp.float32 else dict(rtol=5e-2, atol=6e-2)
  for name, g, w in zip(("out", "dx", "dresidual", "dbias", "dscale", "dshift"), got, want):
    if dtype == jnp.bfloat16 and name in ("dbias", "dscale", "dshift"):
      np.testing.assert_allclose(g, w, rtol=5e-2, atol=0.3, err_msg=name)
    else:
      np.testing.assert_allclose(g, w, err_msg=name, **tol)
  out, dx, dres, dbias = got[:4]
  pad = real == 0
  assert np.all(out[pad] == 0) and np.all(dx[pad] == 0) and np.all(dres[pad] == 0)
  derived = np.where(np.asarray(keep), dres / (1 - rate), 0.0)[real == 1].sum(axis=0)
  np.testing.assert_allclose(dbias, derived, **(dict(rtol=1e-5, atol=1e-5) if dtype == jnp.float32
                                                else dict(rtol=2e-2, atol=5e-2)))
  assert np.abs(dbias).max() > 0.1


def perturbed_biases(params, seed=3):
  """Every bias (and LayerNorm shift) drawn at 0.1 scale, instead of init's zeros."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(treedef, [
      0.1 * jax.random.normal(k, x.shape, x.dtype) if path[-1].key == "bias" else x
      for k, (path, x) in zip(keys, leaves)])


@pytest.mark.slow
def test_the_layers_add_the_projection_bias_inside_the_kernel(monkeypatch):
  """The attention's and the feed-forward's output projections run without their bias add and
  hand their `bias` parameter to the kernel (the original layers passed zeros and added it in
  the Dense); with every bias non-zero the model still equals the explicit layers, outputs and
  gradients (the projections' bias gradients included), with padding in the batch."""
  from bertjax.models import layers
  plain = small_cfg(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  fused = plain.replace(kernel_overrides=(("fused_residual", True),))
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 60, (2, 16)).astype(np.int32)
  mask = np.ones((2, 16), np.int32)
  mask[1, 11:] = 0
  types = np.zeros((2, 16), np.int32)
  params = perturbed_biases(nn.meta.unbox(
      Encoder(plain).init(jax.random.key(0), ids, mask, types)["params"]))
  handed = []
  inner = layers.fused_residual_norm
  monkeypatch.setattr(layers, "fused_residual_norm",
                      lambda x, r, bias, *a, **k: handed.append(bias) or inner(x, r, bias, *a, **k))
  Encoder(fused).apply({"params": params}, ids, mask, types, deterministic=True)
  expected = [params[f"layer_{i}"][m]["output"]["bias"] if m == "attention"
              else params[f"layer_{i}"]["output"]["bias"]
              for i in range(2) for m in ("attention", "output")]
  assert len(handed) == 4
  for got, want in zip(handed, expected):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  monkeypatch.setattr(layers, "fused_residual_norm", inner)

  def run(cfg):
    model = Encoder(cfg)

    def scalar(p):
      out = model.apply({"params": p}, ids, mask, types, deterministic=True)
      return jnp.sum(jnp.sin(out.last_hidden_state) * mask[..., None]), out.last_hidden_state
    return jax.jit(jax.value_and_grad(scalar, has_aux=True))(params)

  (_, out1), g1 = run(plain)
  (_, out2), g2 = run(fused)
  np.testing.assert_allclose(np.asarray(out2), np.asarray(out1), rtol=1e-5, atol=1e-5)
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(g1)[0], jax.tree.leaves(g2)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5,
                               err_msg=jax.tree_util.keystr(path))
  assert np.abs(np.asarray(g2["layer_1"]["output"]["bias"])).max() > 1e-3
