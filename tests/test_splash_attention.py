"""The TPU set's splash attention (bertjax.models.splash), run on the CPU in Pallas's TPU interpret
mode against the explicit path: outputs at real tokens and gradients, for right-padded rows,
packed rows and a length that is not a multiple of the kernel's 128-row tile; the encoder under
`model.kernels=tpu` against the CPU set. Its speed on a TPU is unmeasured.
"""

import os
import subprocess
import sys
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import pytest

from bertjax.models import kernels, splash
from bertjax.models.attention import (attention_implementation, attention_mask_for,
                                      explicit_attention, make_attention_mask)
from bertjax.models.config import ModelConfig
from bertjax.models.encoder import Encoder
from bertjax.registry import get_objective
from bertjax.runtime import sharding
from tests.helpers import REPO, load_config

B, H, D = 2, 2, 16


def qkv(seq, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return tuple(jax.random.normal(k, (B, seq, H, D)) for k in keys)


def rows_case(kind):
  """(attention_mask, segment_ids or None), <int32>[B, seq]."""
  if kind == "right_padded":
    seq, lengths = 128, (128, 70)
  elif kind == "odd_length":  # padded to 128 inside the kernel call
    seq, lengths = 77, (77, 45)
  else:
    seg = np.zeros((B, 128), np.int32)  # several examples per row, then padding
    seg[0, :40], seg[0, 40:41], seg[0, 41:100] = 1, 2, 3
    seg[1, :64], seg[1, 64:128] = 1, 2
    return (seg > 0).astype(np.int32), seg
  return (np.arange(seq)[None, :] < np.array(lengths)[:, None]).astype(np.int32), None


def splash_fn(mask, seg):
  return lambda q, k, v: splash.splash_attention(q, k, v, segment_ids=seg, attention_mask=mask,
                                                 interpret=True)


def explicit_fn(mask, seg):
  keys = make_attention_mask(jnp.asarray(mask), None if seg is None else jnp.asarray(seg))
  return lambda q, k, v: explicit_attention(q, k, v, keys, lambda p: p)[0]


def value_and_grads(fn, q, k, v, mask):
  """fn's output and the gradients (dq, dk, dv) of a loss over the real query rows."""
  rows = jnp.asarray(mask, jnp.float32)[:, :, None, None]

  def loss(q, k, v):
    out = fn(q, k, v)
    return jnp.sum(jnp.sin(out) * rows), out
  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return np.asarray(out), [np.asarray(g) for g in grads]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["right_padded", "packed", "odd_length"])
def test_splash_gives_the_explicit_outputs_and_gradients(kind):
  mask, seg = rows_case(kind)
  q, k, v = qkv(mask.shape[1], seed=len(kind))
  out, grads = value_and_grads(splash_fn(mask, seg), q, k, v, mask)
  want, want_grads = value_and_grads(explicit_fn(mask, seg), q, k, v, mask)
  real = mask.astype(bool)
  assert np.isfinite(out).all()  # padding queries too: nothing non-finite reaches a gradient
  np.testing.assert_allclose(out[real], want[real], rtol=1e-5, atol=1e-5)
  for name, got, ref in zip("qkv", grads, want_grads):
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5, err_msg=f"d{name}")
  if seg is None:  # unpacked: padding queries see the real keys on both paths
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["packed", "right_padded"])
def test_the_comparison_sees_a_missing_mask(kind):
  """The twin of the check above: splash without the segment ids (packed rows attending across
  their examples) or without the padding mask (real queries seeing padding keys) differs from the
  explicit path at real tokens."""
  mask, seg = rows_case(kind)
  q, k, v = qkv(128, seed=3)
  real = mask.astype(bool)
  want = np.asarray(explicit_fn(mask, seg)(q, k, v))[real]
  wrong = splash_fn(mask, None) if kind == "packed" else splash_fn(None, None)
  got = np.asarray(jax.jit(wrong)(q, k, v))[real]
  assert np.max(np.abs(got - want)) > 1e-2


def test_block_sizes_divide_the_padded_sequence():
  assert [splash.padded_length(n) for n in (1, 77, 128, 129, 512)] == [128, 128, 128, 256, 512]
  assert [splash.block_size(n) for n in (128, 256, 384, 512, 768, 1024)] == [128, 256, 128, 512,
                                                                               256, 512]


def test_tpu_set_takes_splash_except_for_gathered_queries():
  tpu, tpu_xla = kernels.for_platform("tpu"), kernels.for_platform("tpu-xla")
  for dtype in (jnp.float32, jnp.bfloat16):
    assert attention_implementation(tpu, 64, dtype, q_len=128, k_len=128) == "splash"
  assert attention_implementation(tpu, 64, jnp.float32, q_len=21, k_len=128) == "xla"
  assert attention_implementation(tpu, 64, jnp.float32, q_len=128, k_len=128,
                                  splash_mask=False) == "xla"
  assert attention_implementation(tpu_xla, 64, jnp.float32, q_len=128, k_len=128) == "xla"
  mask = jnp.ones((2, 8), jnp.int32)
  assert attention_mask_for(tpu, mask).tokens is not None
  assert attention_mask_for(tpu_xla, mask).tokens is None


@pytest.mark.slow
def test_splash_under_a_mesh_gives_the_explicit_outputs():
  """Under a mesh (the trainer's), the kernel runs inside a shard_map: XLA cannot partition a
  Pallas TPU kernel."""
  mask, seg = rows_case("packed")
  q, k, v = qkv(128, seed=4)
  real = mask.astype(bool)
  with jax.set_mesh(sharding.make_mesh((-1, 1, 1))), nn.logical_axis_rules(sharding.DEFAULT_RULES):
    fn = jax.jit(splash_fn(mask, seg))
    assert "shard_map" in str(jax.make_jaxpr(fn)(q, k, v))
    got = np.asarray(fn(q, k, v))
  np.testing.assert_allclose(got[real], np.asarray(explicit_fn(mask, seg)(q, k, v))[real],
                             rtol=1e-5, atol=1e-5)


SHARDED = textwrap.dedent("""
    import flax.linen as nn, jax, jax.numpy as jnp, numpy as np
    from bertjax.runtime import sharding
    from tests.test_splash_attention import explicit_fn, qkv, rows_case, splash_fn, value_and_grads
    assert len(jax.devices()) == 4
    mask, seg = rows_case("packed")
    q, k, v = qkv(128, seed=5)
    want, want_grads = value_and_grads(explicit_fn(mask, seg), q, k, v, mask)
    with jax.set_mesh(sharding.make_mesh((2, 1, 2))), nn.logical_axis_rules(sharding.DEFAULT_RULES):
      hlo = jax.jit(splash_fn(mask, seg)).lower(q, k, v).as_text()
      out, grads = value_and_grads(splash_fn(mask, seg), q, k, v, mask)
    # Each device runs the kernel on its batch row and head: [1, seq, 1, head_dim].
    assert 'manual_axes={"data", "fsdp", "tensor"}' in hlo and "tensor<1x128x1x16xf32>" in hlo
    real = mask.astype(bool)
    np.testing.assert_allclose(out[real], want[real], rtol=1e-5, atol=1e-5)
    for got, ref in zip(grads, want_grads):
      np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    """)


@pytest.mark.slow
def test_splash_sharded_over_batch_and_heads_gives_the_explicit_results():
  """On 4 fake devices, a (data 2, tensor 2) mesh: the kernel runs on each device's batch rows and
  heads (the trainer's logical rules), with the explicit path's outputs and gradients."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO),
             XLA_FLAGS="--xla_force_host_platform_device_count=4")
  r = subprocess.run([sys.executable, "-c", SHARDED], cwd=REPO, env=env, capture_output=True,
                     text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]


def encoder_inputs(packed, seq=32):
  rng = np.random.default_rng(0)
  seg = np.zeros((B, seq), np.int32)
  if packed:
    seg[0, :10], seg[0, 10:25] = 1, 2
    seg[1, :7], seg[1, 7:9], seg[1, 9:30] = 1, 2, 3
  else:
    seg[0, :], seg[1, :19] = 1, 1
  mask = (seg > 0).astype(np.int32)
  ids = np.where(mask > 0, rng.integers(5, 500, (B, seq)), 0).astype(np.int32)
  return ids, mask, (seg if packed else None)


@pytest.mark.slow
@pytest.mark.parametrize("packed", [False, True])
def test_encoder_on_the_tpu_set_gives_the_cpu_sets_results(packed):
  """The quickstart model, tiny, under `model.kernels=tpu` (splash, interpreted) and `cpu`: the
  same outputs at real tokens and the same parameter gradients, in a training pass (quickstart
  has no attention dropout, so training takes the fused path too)."""
  config = load_config("configs/quickstart.py", **{
      "model.hidden_size": 32, "model.intermediate_size": 64, "model.num_attention_heads": 2,
      "model.num_hidden_layers": 1, "max_seq_length": 32})
  cfg = get_objective(config).model_config(config)
  assert cfg.attention_probs_dropout_prob == 0.0
  ids, mask, seg = encoder_inputs(packed)
  rows = jnp.asarray(mask, jnp.float32)[:, :, None]
  results = {}
  for kernel_set in ("cpu", "tpu"):
    model = Encoder(cfg.replace(kernels=kernel_set))
    params = model.init(jax.random.key(0), ids)["params"]

    def loss(p):
      out = model.apply({"params": p}, ids, mask, segment_ids=seg, deterministic=False,
                        rngs={"dropout": jax.random.key(1)}).last_hidden_state
      return jnp.sum(jnp.sin(out) * rows), out
    results[kernel_set] = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  (_, out_cpu), grads_cpu = results["cpu"]
  (_, out_tpu), grads_tpu = results["tpu"]
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out_tpu)[real], np.asarray(out_cpu)[real], rtol=2e-5,
                             atol=2e-5)
  for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(grads_tpu),
                               jax.tree_util.tree_leaves(grads_cpu)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5,
                               err_msg=jax.tree_util.keystr(path))
