"""The Pallas flash kernel with ModernBERT's symmetric window (`flash_attention(..., window=)`),
in interpret mode, and ModernBERT's local layers through it (`Kernels.pallas_local_window`).

- Output and gradients are the explicit path's under `window_mask` with the same segment ids and
  padding, float32 and bf16, dropout included, where the row is not a multiple of the window and
  the windows of the first and last query blocks cross the row's ends.
- Each block of queries visits O(window) key blocks, not O(seq) (`block_range`), the backward
  kernels visit the forward pass's block pairs, and blocks outside that range, or of segments
  that cannot meet, are never read: NaN there leaves the results finite (twins without the
  window, or with a segment straddling a block, read them and turn NaN).
- The ModernBERT encoder with the field on runs its local layers (only those) in the kernel and
  gives the XLA path's outputs and gradients at the real tokens, padded and packed rows alike;
  attention dropout is drawn in the kernel from the layer's key.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models import flash_kernels as fk
from bertjax.models import kernels
from bertjax.models import modernbert
from bertjax.models.attention import explicit_attention
from bertjax.models.flash_attention import dropout_seed, flash_attention
from bertjax.models.modernbert import ModernBertEncoder, window_mask
from bertjax.models.presets import preset
from tests.test_flash_attention import dropout_keep_mask

B, H, D = 2, 2, 16
SEED = dropout_seed(jax.random.key(3))


def qkv(seq: int, dtype=jnp.float32, seed: int = 0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return tuple(jax.random.normal(key, (B, seq, H, D)).astype(dtype) for key in keys)


def row_ids(seq: int, kind: str):
  """(query ids, key ids) as the ModernBERT encoder hands them to a local layer. "padded": row 0
  full, row 1 real for 60% of its length (every query 1, real keys 1, padding keys 0); "packed":
  row 0 two examples then padding, row 1 three examples (ids 1, 2, 3; padding: query 0, key -1)."""
  if kind == "padded":
    real = np.arange(seq)[None, :] < np.array([[seq], [int(0.6 * seq)]])
    return jnp.ones((B, seq), jnp.int32), jnp.asarray(real, jnp.int32)
  seg = np.zeros((B, seq), np.int32)
  a, b = seq // 3, (4 * seq) // 5
  seg[0, :a], seg[0, a:b] = 1, 2
  seg[1, :seq // 4], seg[1, seq // 4:seq // 2], seg[1, seq // 2:] = 1, 2, 3
  return jnp.asarray(seg), jnp.asarray(np.where(seg > 0, seg, -1))


def reference(q, k, v, ids, half: int, rate: float = 0.0):
  """The explicit path under ModernBERT's `window_mask` (local_attention = 2 * half), dropping
  with the kernel's keep mask at `rate`; and <bool>[batch, seq], the queries that see a key."""
  q_ids, kv_ids = ids
  mask = window_mask((q_ids[:, :, None] == kv_ids[:, None, :])[:, None], 2 * half)
  drop = lambda p: p
  if rate > 0.0:
    keep = dropout_keep_mask(SEED, B, H, q.shape[1], k.shape[1], rate)
    drop = lambda p: jnp.where(keep, p / (1.0 - rate), 0.0).astype(p.dtype)
  return explicit_attention(q, k, v, mask, drop)[0], jnp.any(mask[:, 0], axis=-1)


def kernel(ids, half: int, block_q: int = 16, block_k: int = 16, rate: float = 0.0):
  return lambda q, k, v: flash_attention(q, k, v, segment_ids=ids, window=half, interpret=True,
                                         block_q=block_q, block_k=block_k, dropout_rate=rate,
                                         seed=SEED)


def output_and_grads(fn, rows):
  """(q, k, v) -> fn's output and the gradients of a scalar of the rows that see a key (`rows`),
  jitted."""
  weight = rows.astype(jnp.float32)[:, :, None, None]

  def scalar(q, k, v):
    out = fn(q, k, v)
    return jnp.sum(jnp.sin(out.astype(jnp.float32)) * weight), out
  grad = jax.jit(jax.value_and_grad(scalar, argnums=(0, 1, 2), has_aux=True))
  return lambda q, k, v: (lambda result: (result[0][1], result[1]))(grad(q, k, v))


def value_and_grads(fn, q, k, v, rows):
  return output_and_grads(fn, rows)(q, k, v)


def max_error(got, want, rows):
  """The largest |got - want| over the output at `rows` and the three gradients."""
  rows = np.asarray(rows)
  out = np.abs(np.asarray(got[0], np.float32) - np.asarray(want[0], np.float32))[rows].max()
  return max([float(out)] + [float(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))
                                   .max()) for a, b in zip(got[1], want[1])])


# (seq, half, block_q, block_k, rows): 100 and 72 are not multiples of the window (2 * half + 1
# keys, wider than a block); the first and last query blocks' windows cross the row's start and
# end. Each case costs a compile of the interpreted kernels (about 8 s on a 2-core CPU).
CASES = [(100, 20, 16, 16, "padded"), (72, 12, 32, 16, "packed")]


@pytest.mark.parametrize("seq,half,block_q,block_k,kind", CASES)
def test_float32_forward_and_gradients_are_the_window_masks(seq, half, block_q, block_k, kind):
  q, k, v = qkv(seq)
  ids = row_ids(seq, kind)
  want, rows = reference(q, k, v, ids, half)
  assert not np.asarray(rows).all() or kind == "padded"  # some queries see no key when packed
  got = value_and_grads(kernel(ids, half, block_q, block_k), q, k, v, rows)
  assert got[0].shape == q.shape and np.isfinite(np.asarray(got[0])).all()
  assert max_error(got, value_and_grads(lambda q, k, v: reference(q, k, v, ids, half)[0],
                                        q, k, v, rows), rows) < 2e-5


@pytest.mark.parametrize("seq,half,block_q,block_k,kind", CASES[1:])
def test_bf16_forward_and_gradients_are_the_window_masks(seq, half, block_q, block_k, kind):
  """bf16 operands: the kernel's error against the float32 explicit path (on the same bf16
  values) is no larger than the bf16 explicit path's own, to a small slack."""
  q, k, v = qkv(seq, jnp.bfloat16, seed=1)
  ids = row_ids(seq, kind)
  rows = reference(q, k, v, ids, half)[1]
  f32 = lambda q, k, v: reference(*(x.astype(jnp.float32) for x in (q, k, v)), ids, half)[0]
  exact = value_and_grads(f32, q, k, v, rows)
  got = value_and_grads(kernel(ids, half, block_q, block_k), q, k, v, rows)
  assert got[0].dtype == jnp.bfloat16
  explicit = value_and_grads(lambda q, k, v: reference(q, k, v, ids, half)[0], q, k, v, rows)
  assert max_error(got, exact, rows) <= 1.5 * max_error(explicit, exact, rows) + 1e-2


def test_dropout_inside_the_window_is_the_explicit_paths_with_the_same_mask():
  seq, half = 72, 12
  q, k, v = qkv(seq, seed=2)
  ids = row_ids(seq, "packed")
  want, rows = reference(q, k, v, ids, half, rate=0.2)
  got = value_and_grads(kernel(ids, half, rate=0.2), q, k, v, rows)
  assert max_error(got, value_and_grads(
      lambda q, k, v: reference(q, k, v, ids, half, rate=0.2)[0], q, k, v, rows), rows) < 2e-5
  # The twin: without dropout the output is another one, so the mask was applied.
  assert np.abs(np.asarray(got[0]) - np.asarray(reference(q, k, v, ids, half)[0]))[
      np.asarray(rows)].max() > 0.1


# ------------------------------------------------------------------------ what the loops visit


def visited(seq: int, half: int | None, block: int) -> list[int]:
  """Key blocks each block of queries visits (the kernels' `block_range`)."""
  n = -(-seq // block)
  return [int(end - first) for first, end in
          (fk.block_range(i, block, block, n, half) for i in range(n))]


def test_key_blocks_visited_grow_with_the_window_not_the_sequence():
  """ModernBERT-base's window (64 each side) in blocks of 64: 3 key blocks per query block at
  every length (2 at the row's ends), where the unwindowed kernel visits all of them."""
  for seq in (1024, 8192, 65536):
    counts = visited(seq, 64, 64)
    assert max(counts) == 3 and counts[0] == counts[-1] == 2
    assert sum(counts) == 3 * len(counts) - 2
    assert set(visited(seq, None, 64)) == {seq // 64}
  for half, block in ((20, 16), (100, 32), (7, 64)):  # the documented bound
    assert max(visited(4096, half, block)) <= (block + 2 * half - 1) // block + 2


@pytest.mark.parametrize("seq,half,block_q,block_k", [(100, 20, 16, 16), (72, 12, 32, 16),
                                                      (50, 30, 16, 32), (64, 0, 16, 16)])
def test_block_ranges_hold_every_visible_pair_and_agree_both_ways(seq, half, block_q, block_k):
  """Every (query, key) within the window lies in a visited block pair, and the dk/dv kernel's
  ranges (by key block) give the pairs the forward and dq kernels' ranges (by query block) give."""
  n_q, n_k = -(-seq // block_q), -(-seq // block_k)
  by_query = {(i, t) for i in range(n_q)
              for t in range(*map(int, fk.block_range(i, block_q, block_k, n_k, half)))}
  by_key = {(i, t) for t in range(n_k)
            for i in range(*map(int, fk.block_range(t, block_k, block_q, n_q, half)))}
  assert by_query == by_key
  needed = {(i // block_q, j // block_k) for i in range(seq) for j in range(seq)
            if abs(i - j) <= half}
  assert needed <= by_query
  assert len(by_query) < n_q * n_k or 2 * half >= seq


def test_blocks_outside_the_window_are_never_read():
  """q, k and v are NaN from position 128 on (seq 256, window 16 each side, blocks of 16). A
  block the kernels read spreads NaN through its products (0 * NaN), so the results whose block
  ranges stop short of 128 stay finite, and equal the clean run's: the forward output of queries
  before 112, dq there, and dk and dv of keys before 96. The twin without the window reads every
  block: all NaN."""
  seq, half = 256, 16
  q, k, v = qkv(seq, seed=4)
  ids = (jnp.ones((B, seq), jnp.int32),) * 2
  poison = lambda x: x.at[:, 128:].set(jnp.nan)
  rows = jnp.arange(seq)[None, :] < 112
  rows = jnp.broadcast_to(rows, (B, seq))

  def run(window):
    return output_and_grads(lambda q, k, v: flash_attention(
        q, k, v, segment_ids=ids, window=window, interpret=True, block_q=16, block_k=16), rows)
  windowed = run(half)  # one compile for both calls
  out, (dq, dk, dv) = windowed(*map(poison, (q, k, v)))
  clean, (cdq, cdk, cdv) = windowed(q, k, v)
  np.testing.assert_allclose(np.asarray(out[:, :112]), np.asarray(clean[:, :112]), atol=1e-6)
  np.testing.assert_allclose(np.asarray(dq[:, :112]), np.asarray(cdq[:, :112]), atol=1e-6)
  for got, want in ((dk, cdk), (dv, cdv)):
    np.testing.assert_allclose(np.asarray(got[:, :96]), np.asarray(want[:, :96]), atol=1e-6)
  assert np.isnan(np.asarray(out[:, 112:128])).all()  # their range reaches the NaN block
  out, (dq, dk, dv) = run(None)(*map(poison, (q, k, v)))
  assert all(np.isnan(np.asarray(x[:, :96])).all() for x in (out, dq, dk, dv))


def test_blocks_of_segments_that_cannot_meet_are_never_read():
  """A window as long as the row (64, blocks of 16): v is NaN at 32..63. Row ids 1 then 2 at 32
  (the block boundary): no query block of id 1 reads a block of id 2, so queries 0..31 stay
  finite; a padded row (queries 1, keys 1 then 0 from 32) skips the padding key blocks for every
  query. The twin, ids 1 until 40: query block 16..31 meets key block 32..47 (ids 1 and 2) and
  reads it. Packed padding queries whose blocks all are skipped get 0."""
  seq = 64
  q, k, v = qkv(seq, seed=5)
  v = v.at[:, 32:].set(jnp.nan)
  run = jax.jit(lambda q_ids, kv_ids: kernel((q_ids, kv_ids), seq)(q, k, v))  # one compile

  def out(q_ids, kv_ids):
    return np.asarray(run(*(jnp.asarray(np.broadcast_to(x, (B, seq)), jnp.int32)
                            for x in (q_ids, kv_ids))))
  two = np.array([1] * 32 + [2] * 32)
  assert np.isfinite(out(two, two)[:, :32]).all()
  padded = out(np.ones(seq), np.array([1] * 32 + [0] * 32))
  assert np.isfinite(padded).all()
  straddling = np.array([1] * 40 + [2] * 24)
  assert np.isnan(out(straddling, straddling)[:, 16:32]).all()
  padding = np.array([1] * 32 + [0] * 32)
  got = out(padding, np.where(padding > 0, padding, -1))
  assert np.isfinite(got[:, :32]).all() and (got[:, 32:] == 0).all()


def test_a_window_needs_self_attention():
  q, k, v = qkv(32)
  with pytest.raises(ValueError, match="q_len 16 == k_len 32"):
    flash_attention(q[:, :16], k, v, window=4, interpret=True)
  with pytest.raises(ValueError, match="window=-1"):
    flash_attention(q, k, v, window=-1, interpret=True)


# ------------------------------------------------------------------------ ModernBERT's local layers

SEQ = 72  # 2 blocks of 64 (the kernel's own block size), not a multiple of the window
WINDOW = 16  # local_attention: 8 keys each side


def tiny(**kw):
  """Two layers: layer 0 global, layer 1 local (one interpreted kernel to compile)."""
  return preset("modernbert-tiny").replace(vocab_size=60, hidden_size=32, intermediate_size=40,
                                           num_attention_heads=2, local_attention=WINDOW,
                                           num_hidden_layers=2, **kw)


def with_kernel(cfg):
  return cfg.replace(kernel_overrides=(("pallas_local_window", True),))


def encoder_inputs(kind: str):
  """Token ids, attention mask and segment ids (None unless packed) of two rows."""
  rs = np.random.RandomState(0)
  if kind == "padded":
    mask = (np.arange(SEQ)[None, :] < np.array([[SEQ], [30]])).astype(np.int32)
    segments = None
  else:
    segments = np.zeros((2, SEQ), np.int32)
    segments[0, :25], segments[0, 25:60] = 1, 2
    segments[1, :40], segments[1, 40:] = 1, 2
    mask = (segments > 0).astype(np.int32)
  ids = np.where(mask == 1, rs.randint(3, 60, (2, SEQ)), 0)
  return jnp.asarray(ids), jnp.asarray(mask), None if segments is None else jnp.asarray(segments)


def pallas_calls(jaxpr) -> int:
  found = 0
  for eqn in jaxpr.eqns:
    found += eqn.primitive.name == "pallas_call"
    for param in eqn.params.values():
      inner = getattr(param, "jaxpr", None)
      if inner is not None:
        found += pallas_calls(getattr(inner, "jaxpr", inner))
  return found


@pytest.mark.parametrize("kind,gradients", [("padded", False), ("packed", True)])
def test_modernbert_local_layers_in_the_kernel_are_the_xla_paths(kind, gradients):
  """With `pallas_local_window` the local layer (layer 1) is the forward pass's one pallas_call
  (the global layer 0 keeps its path), and the hidden states at the real tokens (and, packed, the
  parameters' gradients: one compile of the interpreted backward kernels) equal the CPU set's
  (band by band through XLA)."""
  ids, mask, segments = encoder_inputs(kind)
  cfg = tiny()
  params = jax.jit(ModernBertEncoder(cfg).init)(jax.random.key(0), ids)["params"]
  real = np.asarray(mask, bool)

  def run(c):
    def loss(p):
      hidden = ModernBertEncoder(c).apply({"params": p}, ids, mask,
                                          segment_ids=segments).last_hidden_state
      return jnp.sum(jnp.sin(hidden) * mask[:, :, None]), hidden
    calls = pallas_calls(jax.make_jaxpr(loss)(params).jaxpr)
    if not gradients:
      return np.asarray(jax.jit(loss)(params)[1]), None, calls
    (_, hidden), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return np.asarray(hidden), grads, calls
  got, got_grads, calls = run(with_kernel(cfg))
  want, want_grads, none = run(cfg)
  assert (calls, none) == (1, 0)
  np.testing.assert_allclose(got[real], want[real], atol=2e-5)
  for a, b in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-5)
  assert not gradients or len(jax.tree.leaves(got_grads)) > 10


def test_modernbert_attention_dropout_is_drawn_in_the_kernel(monkeypatch):
  """Training with attention dropout and the field on: each local layer's kernel drops with the
  mask hashed from its 'dropout' key. The encoder's output equals the one where the kernel is
  replaced by the explicit path under `window_mask` and that hashed mask, and it follows the
  dropout key."""
  ids, mask, segments = encoder_inputs("packed")
  cfg = with_kernel(tiny(attention_dropout=0.2))
  model = ModernBertEncoder(cfg)
  params = jax.jit(model.init)(jax.random.key(0), ids)["params"]

  def forward():  # a new function each time: traced anew after the monkeypatch below
    return jax.jit(lambda p, key: model.apply({"params": p}, ids, mask, segment_ids=segments,
                                              deterministic=False,
                                              rngs={"dropout": key}).last_hidden_state)

  def explicit(q, k, v, *, segment_ids, dropout_rate, seed, window, **unused):
    del unused
    q_ids, kv_ids = segment_ids
    keys = window_mask((q_ids[:, :, None] == kv_ids[:, None, :])[:, None], 2 * window)
    keep = dropout_keep_mask(seed, q.shape[0], q.shape[2], q.shape[1], k.shape[1],
                             dropout_rate)
    drop = lambda p: jnp.where(keep, p / (1.0 - dropout_rate), 0.0)
    return explicit_attention(q, k, v, keys, drop)[0]
  run = forward()
  got, other = (np.asarray(run(params, jax.random.key(seed))) for seed in (1, 2))
  monkeypatch.setattr(modernbert, "flash_attention", explicit)
  want = np.asarray(forward()(params, jax.random.key(1)))
  real = np.asarray(mask, bool)
  np.testing.assert_allclose(got[real], want[real], atol=2e-5)
  assert np.abs(got - other)[real].max() > 1e-3


def test_the_field_is_off_in_every_set():
  for name in ("cpu", "gpu", "tpu", "tpu-xla", "stock"):
    assert not kernels.for_platform(name).pallas_local_window
  assert kernels.for_model(with_kernel(tiny())).pallas_local_window
