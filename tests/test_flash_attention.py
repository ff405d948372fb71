"""The Pallas flash attention with dropout (bertjax.models.flash_attention), in interpret mode.

- Its output and gradients are the explicit path's (`explicit_attention`) given the same keep
  mask (`dropout_keep_mask`): without and with dropout, with key padding, with packed segments,
  at odd lengths and over several blocks; the mask read out of the kernel is that mask.
- The hash drops at the configured rate, and its masks differ across seeds, heads and layers.
- In the encoder (`model.attention_dropout_kernel="pallas"`), training goes through the kernel,
  its loss and gradients are those of the explicit path fed the kernel's mask, the mask follows
  the dropout key, and the parameters are the explicit path's.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import inputs
from bertjax.core.errors import UserError
from bertjax.models import attention, kernels
from bertjax.models.attention import explicit_attention
from bertjax.models.config import ModelConfig
from bertjax.models.encoder import Encoder
from bertjax.models import flash_kernels as fk
from bertjax.models.dropout import threshold
from bertjax.models.flash_attention import dropout_seed, flash_attention
from bertjax.registry import get_objective
from bertjax.runtime import sharding, workdir
from bertjax.trainer import train
from tests.helpers import attention_dropout_for, load_config


def dropout_keep_mask(seed, batch: int, heads: int, q_len: int, k_len: int, rate: float):
  """<bool>[batch, heads, q_len, k_len]: the flash kernel's keep mask for `seed` (<uint32>[2]),
  in plain JAX (the hash of bertjax.models.flash_kernels)."""
  keys = fk.head_keys(jnp.asarray(seed, jnp.uint32), batch, heads)[:, :, None, None]
  rows = fk.row_words(keys, jnp.arange(q_len, dtype=jnp.uint32)[:, None])
  cols = fk.col_words(keys, jnp.arange(k_len, dtype=jnp.uint32)[None, :])
  return fk.keep_from_words(rows, cols, threshold(rate))

B, H = 2, 2
SEED = dropout_seed(jax.random.key(7))


def qkv(q_len, k_len, dim, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(keys[0], (B, q_len, H, dim)),
          jax.random.normal(keys[1], (B, k_len, H, dim)),
          jax.random.normal(keys[2], (B, k_len, H, dim)))


@functools.partial(jax.jit, static_argnames=("dropout_rate",))
def flash(q, k, v, *, seed=SEED, kv_lengths=None, segment_ids=None, dropout_rate=0.0):
  """`flash_attention` interpreted, in blocks of 16, jitted (eager interpretation is slower)."""
  return flash_attention(q, k, v, kv_lengths=kv_lengths, segment_ids=segment_ids,
                         dropout_rate=dropout_rate, seed=seed, interpret=True, block_q=16,
                         block_k=16)


def visible(q_seg, kv_seg):
  """<bool>[batch, 1, q, k]: the kernel's rule, a query sees keys of its own segment id."""
  return (q_seg[:, :, None] == kv_seg[:, None, :])[:, None]


def reference(q, k, v, *, segment_ids=None, kv_lengths=None, dropout_rate=0.0, seed=None,
              **unused):
  """`flash_attention`'s values from the explicit path, dropping with `dropout_keep_mask`."""
  del unused
  batch, q_len, heads, _ = q.shape
  k_len = k.shape[1]
  if segment_ids is None:
    q_seg, kv_seg = jnp.zeros((batch, q_len), jnp.int32), jnp.zeros((batch, k_len), jnp.int32)
  else:
    q_seg, kv_seg = segment_ids if isinstance(segment_ids, tuple) else (segment_ids,) * 2
  if kv_lengths is not None:
    kv_seg = jnp.where(jnp.arange(k_len)[None, :] < kv_lengths[:, None], kv_seg, -1)
  drop = lambda p: p
  if dropout_rate > 0.0:
    keep = dropout_keep_mask(seed, batch, heads, q_len, k_len, dropout_rate)
    drop = lambda p: jnp.where(keep, p / (1.0 - dropout_rate), 0.0)
  return explicit_attention(q, k, v, visible(q_seg, kv_seg), drop)[0]


def value_and_grads(fn, q, k, v, rows):
  """fn's output and the gradient of a scalar of its real rows (`rows` <float>[batch, q])."""
  def scalar(q, k, v):
    out = fn(q, k, v) * rows[:, :, None, None]
    return jnp.sum(jnp.sin(out)), out
  (_, out), grads = jax.jit(jax.value_and_grad(scalar, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return out, grads


def assert_same(a, b, atol=1e-5):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=atol)


def packed(seq):
  """Segment ids of two packed rows: [1 x 7, 2 x 9, padding] and [1 x 5, 2 x 3, 3 x rest]."""
  seg = np.zeros((B, seq), np.int32)
  seg[0, :7], seg[0, 7:16] = 1, 2
  seg[1, :5], seg[1, 5:8], seg[1, 8:] = 1, 2, 3
  return jnp.asarray(seg)


# --------------------------------------------------------------------------- the kernel


@pytest.mark.parametrize("seq,dim,rate", [(8, 8, 0.0), (8, 8, 0.2), (19, 16, 0.3)])
def test_forward_is_the_explicit_path_with_the_same_mask(seq, dim, rate):
  q, k, v = qkv(seq, seq, dim)
  kw = dict(dropout_rate=rate, seed=SEED)
  got = flash(q, k, v, **kw)
  assert got.shape == q.shape
  assert_same(got, reference(q, k, v, **kw))


def test_key_padding_and_packed_segments_forward():
  q, k, v = qkv(19, 19, 8, seed=1)
  lengths = jnp.asarray([16, 19])
  seg = packed(19)
  kw = dict(kv_lengths=lengths, segment_ids=seg, dropout_rate=0.25, seed=SEED)
  got = flash(q, k, v, **kw)
  rows = (seg > 0)[:, :, None, None]  # row 0's padding queries see no key: any finite output
  assert np.isfinite(np.asarray(got)).all()
  assert_same(jnp.where(rows, got, 0), jnp.where(rows, reference(q, k, v, **kw), 0))
  # Padding keys are unseen: changing them moves nothing.
  moved = flash(q, k, v.at[0, 16:].set(9.0), **kw)
  assert_same(jnp.where(rows, moved, 0), jnp.where(rows, got, 0))


@pytest.mark.parametrize("rate", [pytest.param(0.0, marks=pytest.mark.slow), 0.3])
def test_gradients_are_the_explicit_paths(rate):
  """dq, dk, dv over two query and two key blocks (length 21), packed rows and key padding."""
  q, k, v = qkv(21, 21, 8, seed=2)
  seg = packed(21)
  kw = dict(kv_lengths=jnp.asarray([16, 21]), segment_ids=seg, dropout_rate=rate, seed=SEED)
  rows = (seg > 0).astype(jnp.float32)
  got = value_and_grads(lambda q, k, v: flash_attention(q, k, v, interpret=True, block_q=16,
                                                        block_k=16, **kw), q, k, v, rows)
  assert_same(got, value_and_grads(lambda q, k, v: reference(q, k, v, **kw), q, k, v, rows))


def test_the_comparison_can_fail():
  """Another seed, or a mask shifted by one key, gives another output: the checks above would
  see a kernel that drew its mask otherwise."""
  q, k, v = qkv(16, 16, 8, seed=3)
  got = flash(q, k, v, seed=SEED, dropout_rate=0.3)
  other = flash(q, k, v, seed=dropout_seed(jax.random.key(8)), dropout_rate=0.3)
  ref = reference(q, k, v, dropout_rate=0.3, seed=SEED)
  assert np.abs(np.asarray(other - ref)).max() > 0.1
  keep = jnp.roll(dropout_keep_mask(SEED, B, H, 16, 16, 0.3), 1, axis=-1)
  shifted = explicit_attention(q, k, v, jnp.ones((B, 1, 1, 16), bool),
                               lambda p: jnp.where(keep, p / 0.7, 0.0))[0]
  assert np.abs(np.asarray(got - shifted)).max() > 0.1


def test_the_kernels_mask_is_dropout_keep_mask():
  """Read the mask out of the kernel: with q = 0 every key weighs 1 / k_len, and with v the
  identity over keys, output[b, i, h, j] = keep[b, h, i, j] / ((1 - rate) * k_len)."""
  seq, rate = 16, 0.4
  q = jnp.zeros((B, seq, H, seq))
  v = jnp.broadcast_to(jnp.eye(seq)[None, :, None, :], (B, seq, H, seq))
  out = flash(q, q, v, dropout_rate=rate, seed=SEED)
  read = np.asarray(jnp.transpose(out, (0, 2, 1, 3))) * (1 - rate) * seq
  keep = np.asarray(dropout_keep_mask(SEED, B, H, seq, seq, rate))
  np.testing.assert_allclose(read, keep.astype(np.float32), atol=1e-5)
  assert 0 < keep.mean() < 1


# --------------------------------------------------------------------------- the hash


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_drop_rate_within_four_binomial_deviations(rate):
  keep = np.asarray(dropout_keep_mask(SEED, 4, 4, 128, 128, rate))
  n = keep.size
  dropped = n - keep.sum()
  assert abs(dropped - rate * n) < 4 * np.sqrt(n * rate * (1 - rate)), dropped / n
  # Neighbours are independent: a kept element's right and lower neighbours keep at 1 - rate.
  for pair in (keep[..., :-1] & keep[..., 1:], keep[..., :-1, :] & keep[..., 1:, :]):
    expected = (1 - rate) ** 2
    assert abs(pair.mean() - expected) < 4 * np.sqrt(expected * (1 - expected) / pair.size)


def test_masks_differ_across_seeds_heads_and_layers():
  """Two independent masks at rate r agree on r^2 + (1 - r)^2 of the elements."""
  rate, expected = 0.5, 0.5
  mask = lambda seed: np.asarray(dropout_keep_mask(seed, 2, 4, 64, 64, rate))
  base = mask(SEED)
  # Two layers of one step: make_rng gives each its own key.
  layer_keys = [dropout_seed(jax.random.fold_in(jax.random.key(7), i)) for i in range(2)]
  for other in (mask(dropout_seed(jax.random.key(8))), mask(layer_keys[0]), mask(layer_keys[1]),
                np.roll(base, 1, axis=1),              # another head
                np.swapaxes(base, -1, -2)):            # (i, j) against (j, i)
    assert abs((other == base).mean() - expected) < 0.02
  np.testing.assert_array_equal(mask(SEED), base)  # a pure function of the seed


def test_bad_arguments_fail():
  q, k, v = qkv(8, 8, 8)
  with pytest.raises(ValueError, match="seed"):
    flash_attention(q, k, v, dropout_rate=0.1, interpret=True)
  with pytest.raises(ValueError, match="dropout_rate"):
    flash_attention(q, k, v, dropout_rate=1.0, seed=SEED, interpret=True)
  with pytest.raises(ValueError, match="power of two"):
    flash_attention(q, k, v, interpret=True, block_q=24)


# --------------------------------------------------------------------------- the encoder

SEQ = 12
MODEL = ModelConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=SEQ, hidden_dropout_prob=0.1,
                    attention_probs_dropout_prob=0.2)


def encoder_loss(cfg, ids, mask, segments):
  """The jitted (params, dropout key) -> (loss at the real rows, its gradient) of a
  training-mode encoder pass, and the encoder's initial parameters."""
  model = Encoder(cfg)
  params = model.init(jax.random.key(0), ids)["params"]
  rows = jnp.asarray(mask, jnp.float32)[:, :, None]

  def loss(p, rng):
    out = model.apply({"params": p}, ids, mask, segment_ids=segments, deterministic=False,
                      rngs={"dropout": rng})
    return jnp.sum(jnp.sin(out.last_hidden_state) * rows)
  return jax.jit(jax.value_and_grad(loss)), params


def encoder_inputs(packed_rows: bool):
  rng = np.random.default_rng(0)
  mask = (np.arange(SEQ)[None, :] < np.array([[12], [9]])).astype(np.int32)
  segments = None
  if packed_rows:
    segments = np.where(mask > 0, 1 + (np.arange(SEQ)[None, :] >= 5), 0).astype(np.int32)
  ids = np.where(mask > 0, rng.integers(5, 60, (B, SEQ)), 0).astype(np.int32)
  return jnp.asarray(ids), jnp.asarray(mask), segments


@pytest.mark.slow
@pytest.mark.parametrize("packed_rows", [False, True])
def test_encoder_with_the_kernel_is_the_explicit_path_with_its_mask(monkeypatch, packed_rows):
  """The encoder through the kernel, against the same encoder whose attention is the explicit
  path fed the kernel's mask (the same seed words, segment ids, heads): same loss and gradients.
  Another dropout key moves the loss; the parameters are those of the explicit path."""
  ids, mask, segments = encoder_inputs(packed_rows)
  cfg = MODEL.replace(attention_dropout_kernel="pallas")
  calls = []
  real = attention.flash_attention
  monkeypatch.setattr(attention, "flash_attention",
                      lambda *a, **kw: calls.append(kw["interpret"]) or real(*a, **kw))
  step, params = encoder_loss(cfg, ids, mask, segments)
  loss, grads = step(params, jax.random.key(5))
  assert calls == [True]  # interpreted on this CPU
  other, _ = step(params, jax.random.key(6))
  assert abs(float(other) - float(loss)) > 1e-4
  monkeypatch.setattr(attention, "flash_attention", reference)
  ref_step, _ = encoder_loss(cfg, ids, mask, segments)
  ref_loss, ref_grads = ref_step(params, jax.random.key(5))
  np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
  assert_same(grads, ref_grads, atol=2e-5)
  explicit_params = Encoder(MODEL).init(jax.random.key(0), ids)["params"]
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, explicit_params)


@pytest.mark.slow
def test_trainer_step_runs_through_the_kernel(monkeypatch):
  """The trainer's own step with `model.attention_dropout_kernel=pallas` calls the kernel in
  every layer (the last one at the gathered rows) and its loss is finite."""
  calls = []
  real = attention.flash_attention
  monkeypatch.setattr(attention, "flash_attention",
                      lambda q, *a, **kw: calls.append(q.shape[1]) or real(q, *a, **kw))
  config = load_config("configs/quickstart.py", **{
      "model.hidden_size": 32, "model.intermediate_size": 64, "model.num_attention_heads": 2,
      "model.num_hidden_layers": 2, "max_seq_length": 16, "max_predictions_per_seq": 3,
      "batch_size": 4, "data.synthetic": True, "model.attention_probs_dropout_prob": 0.1,
      "model.attention_dropout_kernel": "pallas"})
  objective = get_objective(config)
  cfg = objective.model_config(config)
  assert cfg.attention_dropout_kernel == "pallas"
  run, state = train.setup(config, objective, cfg, sharding.make_mesh(config.mesh_shape),
                            rules=sharding.rules_from_config(config))
  batch = next(inputs.SyntheticBatches(config, cfg.vocab_size, 0, config.batch_size))
  with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.rules):
    _, metrics = run.train_step(state, batch)
  total, count = metrics["loss"]
  assert np.isfinite(float(total / count))
  assert calls == [16, 4]  # the last layer's queries: [CLS] and the 3 masked positions


def test_the_setting_is_validated_and_pallas_only_in_the_gpu_set():
  assert attention_dropout_for(ModelConfig()) == "explicit"  # on this CPU
  assert attention_dropout_for(ModelConfig(kernels="gpu")) == "pallas"
  for platform in ("cpu", "tpu", "tpu-xla", "stock"):
    assert kernels.for_platform(platform).attention_dropout == "explicit"
  assert kernels.for_platform("gpu").attention_dropout == "pallas"
  forced = ModelConfig(kernels="gpu", attention_dropout_kernel="explicit")
  assert attention_dropout_for(forced) == "explicit"
  # Under a mesh of several devices "auto" keeps the explicit path (a pallas_call is not
  # partitioned); one device, or the setting named, takes the kernel.
  axes = (jax.sharding.AxisType.Auto,)
  for devices, want in ((1, "pallas"), (8, "explicit")):
    mesh = jax.sharding.AbstractMesh((devices,), ("data",), axis_types=axes)
    with jax.sharding.use_abstract_mesh(mesh):
      assert attention_dropout_for(ModelConfig(kernels="gpu")) == want
      assert attention_dropout_for(ModelConfig(kernels="gpu",
                                                       attention_dropout_kernel="pallas")) == "pallas"
  assert attention_dropout_for(ModelConfig(attention_dropout_kernel="pallas")) == "pallas"
  with pytest.raises(UserError, match="attention_dropout_kernel"):
    ModelConfig(attention_dropout_kernel="triton")
  # A workdir recorded before the setting existed resumes at "auto", and only there.
  assert workdir.allowed("model.attention_dropout_kernel", "(absent)", "auto") is None
  assert workdir.allowed("model.attention_dropout_kernel", "(absent)", "pallas") is not None
