"""The Pallas kernels behind `bertjax.models.flash_attention`, and the dropout hash they share
with its plain-JAX mask.

Each kernel works on one (batch row, head) and one block of queries (forward, dq) or keys (dk/dv),
looping over the other side's blocks; probabilities are never stored: the forward pass keeps the
row's log-sum-exp and the backward passes recompute them. With a window (`Plan.window`: query i
sees key j only when |i - j| <= window, ModernBERT's local layers), the loop runs over the blocks
that meet the block's window only (`block_range`: a bound in the window, not the sequence), and
skips a block whose segment ids cannot equal any of the other side's (`Plan.skip_disjoint`);
both rules are symmetric, so the backward kernels visit the forward pass's block pairs. The ops
are the ones Triton lowers (block specs, 2-D `jnp.dot` on blocks of at least 16, uint32
arithmetic); their GPU lowering and speed are unmeasured, and on the CPU they run in Pallas
interpret mode.

Dropout is counter-based: element (b, h, i, j) is kept when a 32-bit hash of the seed and its
coordinates is >= `bertjax.models.dropout.threshold(rate)`, so every kernel regenerates the same
mask from the same seed, whatever its block sizes, and nothing of the mask is stored.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
import numpy as np

Array = jax.Array

MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)  # finite: fully masked rows stay finite
_GOLDEN = 0x9E3779B9
_ROW, _COL = 0x85EBCA6B, 0xC2B2AE35


def mix32(x: Array) -> Array:
  """MurmurHash3's 32-bit finalizer on <uint32>[...]: a bijection whose every output bit depends
  on every input bit."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(_ROW)
  x = x ^ (x >> 13)
  x = x * jnp.uint32(_COL)
  return x ^ (x >> 16)


def head_keys(seed: Array, batch: int, heads: int) -> Array:
  """<uint32>[batch, heads]: each (row, head)'s 32-bit key from the <uint32>[2] seed words."""
  index = jnp.arange(batch * heads, dtype=jnp.uint32).reshape(batch, heads)
  return mix32(seed[0] ^ mix32(seed[1] + index * jnp.uint32(_GOLDEN)))


def row_words(key: Array, i: Array) -> Array:
  """The query side of the hash: key and query index (uint32, broadcasting)."""
  return mix32(key ^ (i * jnp.uint32(_GOLDEN)))


def col_words(key: Array, j: Array) -> Array:
  """The key side of the hash (another function than the rows', so (i, j) and (j, i) differ)."""
  return mix32((key + jnp.uint32(_GOLDEN)) ^ (j * jnp.uint32(_ROW)))


def keep_from_words(rows: Array, cols: Array, threshold: int) -> Array:
  """<bool>: kept where the mixed row and column words reach the threshold."""
  return mix32(rows ^ cols) >= jnp.uint32(threshold)


@dataclasses.dataclass(frozen=True)
class Plan:
  """What the kernels are built with: softmax scale, drop rate and its 32-bit threshold, block
  sizes, and whether Pallas interprets them (CPU). window: None, or query i sees key j only when
  |i - j| <= window (self-attention, both sides at the same positions). skip_disjoint: a block
  pair whose segment-id ranges do not overlap is not computed (no query of one sees a key of the
  other); off, every pair in range is."""
  scale: float
  rate: float
  threshold: int
  block_q: int
  block_k: int
  interpret: bool
  window: int | None = None
  skip_disjoint: bool = False


def block_range(index, size: int, other: int, count: int, window: int | None):
  """(first, end) of the other side's blocks (of `other` rows, `count` of them) that block `index`
  of this side (of `size` rows) meets within `window`: every block when there is none. Symmetric:
  block t is in block i's range exactly when i is in t's, so the dk/dv kernel visits the pairs the
  forward and dq kernels visit. At most (size + 2 * window - 1) // other + 2 blocks."""
  if window is None:
    return 0, count
  first = jnp.maximum(index * size - window, 0) // other
  end = jnp.minimum((index + 1) * size - 1 + window, count * other - 1) // other + 1
  return first, end


def _span(start, size: int) -> Array:
  return (start + jnp.arange(size, dtype=jnp.int32)).astype(jnp.uint32)


def _scores(q, k, q_seg, kv_seg, plan: Plan, q_start, k_start):
  """Scaled q.k of one block pair, <float32>[bq, bk], with keys of another segment masked, and
  keys outside the window of a query (the blocks' first rows at q_start and k_start)."""
  s = jnp.dot(q, k.T, preferred_element_type=jnp.float32) * plan.scale
  seen = q_seg[:, None] == kv_seg[None, :]
  if plan.window is not None:
    i = q_start + jnp.arange(q.shape[0], dtype=jnp.int32)
    j = k_start + jnp.arange(k.shape[0], dtype=jnp.int32)
    seen = seen & (jnp.abs(i[:, None] - j[None, :]) <= plan.window)
  return jnp.where(seen, s, MASK_VALUE)


def _visit(step, plan: Plan, segments, other_segments):
  """`step(t, carry)` as a loop body that leaves the carry alone where block t's segment ids
  (`other_segments(t)`) cannot equal any of `segments` (with `plan.skip_disjoint`)."""
  if not plan.skip_disjoint:
    return step
  low, high = jnp.min(segments), jnp.max(segments)

  def body(t, carry):
    other = other_segments(t)
    meet = (jnp.max(other) >= low) & (jnp.min(other) <= high)
    return jax.lax.cond(meet, step, lambda t, carry: carry, t, carry)
  return body


def _dropped(p, keep, rate):
  """p with dropped entries zeroed and kept ones scaled by 1 / (1 - rate)."""
  return jnp.where(keep, p * (1.0 / (1.0 - rate)), 0.0)


def forward_kernel(q_ref, k_ref, v_ref, qseg_ref, kvseg_ref, key_ref, o_ref, lse_ref, *,
                   plan: Plan):
  """One block of queries against the key blocks in its range (`block_range`): online softmax,
  dropout after it. A query whose visited keys are all skipped gets 0."""
  block_q, block_k = q_ref.shape[0], plan.block_k
  q, q_seg = q_ref[...], qseg_ref[...]
  q_start = pl.program_id(2) * block_q
  if plan.rate > 0.0:
    rows = row_words(key_ref[...], _span(q_start, block_q))[:, None]

  def step(t, carry):
    o, m, l = carry
    ks = pl.ds(t * block_k, block_k)
    v = v_ref[ks, :]
    s = _scores(q, k_ref[ks, :], q_seg, kvseg_ref[ks], plan, q_start, t * block_k)
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    correction = jnp.exp(m - m_new)
    p = jnp.exp(s - m_new[:, None])
    l = correction * l + jnp.sum(p, axis=1)
    if plan.rate > 0.0:  # normalized by the undropped sum, as softmax-then-dropout is
      cols = col_words(key_ref[...], _span(t * block_k, block_k))[None, :]
      p = _dropped(p, keep_from_words(rows, cols, plan.threshold), plan.rate)
    o = correction[:, None] * o + jnp.dot(p.astype(v.dtype), v,
                                          preferred_element_type=jnp.float32)
    return o, m_new, l

  init = (jnp.zeros(q.shape, jnp.float32), jnp.full((block_q,), MASK_VALUE, jnp.float32),
          jnp.zeros((block_q,), jnp.float32))
  first, end = block_range(pl.program_id(2), block_q, block_k, k_ref.shape[0] // block_k,
                           plan.window)
  body = _visit(step, plan, q_seg, lambda t: kvseg_ref[pl.ds(t * block_k, block_k)])
  o, m, l = jax.lax.fori_loop(first, end, body, init)
  l = jnp.where(l == 0.0, 1.0, l)  # every block skipped: o is 0, the lse finite and unread
  o_ref[...] = (o / l[:, None]).astype(o_ref.dtype)
  lse_ref[...] = m + jnp.log(l)


def _score_grads(q, k, v, do, lse, delta, q_seg, kv_seg, keep, plan: Plan, q_start, k_start):
  """(p after dropout, dS) of one block pair, from the saved log-sum-exp and delta = rowsum(dO*O).

  With P the softmax and Pd = P * keep / (1 - rate): dV = Pd^T dO; dP = (dO V^T) * keep / (1 -
  rate); dS = P * (dP - delta), since rowsum(dP * P) = rowsum(dO V^T * Pd) = rowsum(dO * O).
  """
  p = jnp.exp(_scores(q, k, q_seg, kv_seg, plan, q_start, k_start) - lse[:, None])
  dp = jnp.dot(do, v.T, preferred_element_type=jnp.float32)
  if keep is not None:
    return _dropped(p, keep, plan.rate), p * (_dropped(dp, keep, plan.rate) - delta[:, None])
  return p, p * (dp - delta[:, None])


def dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qseg_ref, kvseg_ref, key_ref,
              dq_ref, *, plan: Plan):
  """dQ of one block of queries, looping over the key blocks in its range."""
  block_q, block_k = q_ref.shape[0], plan.block_k
  q, do, lse, delta, q_seg = (q_ref[...], do_ref[...], lse_ref[...], delta_ref[...],
                              qseg_ref[...])
  q_start = pl.program_id(2) * block_q
  if plan.rate > 0.0:
    rows = row_words(key_ref[...], _span(q_start, block_q))[:, None]

  def step(t, dq):
    ks = pl.ds(t * block_k, block_k)
    k = k_ref[ks, :]
    keep = None
    if plan.rate > 0.0:
      cols = col_words(key_ref[...], _span(t * block_k, block_k))[None, :]
      keep = keep_from_words(rows, cols, plan.threshold)
    _, ds = _score_grads(q, k, v_ref[ks, :], do, lse, delta, q_seg, kvseg_ref[ks], keep, plan,
                         q_start, t * block_k)
    return dq + jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)

  first, end = block_range(pl.program_id(2), block_q, block_k, k_ref.shape[0] // block_k,
                           plan.window)
  body = _visit(step, plan, q_seg, lambda t: kvseg_ref[pl.ds(t * block_k, block_k)])
  dq = jax.lax.fori_loop(first, end, body, jnp.zeros(q.shape, jnp.float32))
  dq_ref[...] = (dq * plan.scale).astype(dq_ref.dtype)


def dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qseg_ref, kvseg_ref, key_ref,
               dk_ref, dv_ref, *, plan: Plan):
  """dK and dV of one block of keys, looping over the query blocks in its range."""
  block_q, block_k = plan.block_q, k_ref.shape[0]
  k, v, kv_seg = k_ref[...], v_ref[...], kvseg_ref[...]
  k_start = pl.program_id(2) * block_k
  if plan.rate > 0.0:
    cols = col_words(key_ref[...], _span(k_start, block_k))[None, :]

  def step(t, carry):
    dk, dv = carry
    qs = pl.ds(t * block_q, block_q)
    q, do = q_ref[qs, :], do_ref[qs, :]
    keep = None
    if plan.rate > 0.0:
      rows = row_words(key_ref[...], _span(t * block_q, block_q))[:, None]
      keep = keep_from_words(rows, cols, plan.threshold)
    pd, ds = _score_grads(q, k, v, do, lse_ref[qs], delta_ref[qs], qseg_ref[qs], kv_seg, keep,
                          plan, t * block_q, k_start)
    dv = dv + jnp.dot(pd.astype(do.dtype).T, do, preferred_element_type=jnp.float32)
    dk = dk + jnp.dot(ds.astype(q.dtype).T, q, preferred_element_type=jnp.float32)
    return dk, dv

  zeros = jnp.zeros(k.shape, jnp.float32)
  first, end = block_range(pl.program_id(2), block_k, block_q, q_ref.shape[0] // block_q,
                           plan.window)
  body = _visit(step, plan, kv_seg, lambda t: qseg_ref[pl.ds(t * block_q, block_q)])
  dk, dv = jax.lax.fori_loop(first, end, body, (zeros, zeros))
  dk_ref[...] = (dk * plan.scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)
