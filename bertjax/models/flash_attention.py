"""Flash attention with attention dropout in one Pallas kernel, forward and backward.

`flash_attention(q, k, v, ...)` computes dropout(softmax(q.k / sqrt(d))) v over <T>[batch, seq,
heads, head_dim] operands, the values `bertjax.models.attention.explicit_attention` computes when
given the same keep mask, without materializing the [batch, heads, q, k] scores. The mask is a
counter-based hash of the seed and (batch row, head, query, key) (`flash_kernels`), so the
backward kernels regenerate it (tests/test_flash_attention.py builds it in plain JAX). The seed
comes from the layer's 'dropout' RNG (`dropout_seed`): the mask follows the step's key and the
layer, like every other dropout mask, and a resumed run draws the same ones.

Chosen per model by `model.attention_dropout_kernel` (bertjax.models.kernels): the GPU set's
default (measured faster on an H200), the explicit path elsewhere. With `window`, the same kernels
compute ModernBERT's local layers (query i sees key j when |i - j| <= window) visiting only the
key blocks around each query block, and skip block pairs whose segment ids cannot meet: the
GPU set's `pallas_local_window` field (off: device speed unmeasured).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from bertjax.models import dropout as dropout_lib
from bertjax.models import flash_kernels as fk

Array = jax.Array
# The kernels are written for Triton (2-D dots on blocks, uint32 arithmetic); jax 0.10 lowers a
# pallas_call without compiler parameters for NVIDIA GPUs through Mosaic GPU instead, which
# refuses them (tests/test_kernel_lowering.py), so Triton is named.
TRITON = pltriton.CompilerParams(num_warps=4, num_stages=2)

MIN_BLOCK = 16  # the smallest operand side Triton's dot takes


def dropout_seed(rng: Array) -> Array:
  """<uint32>[2]: the kernel's seed words from a JAX key (raw or typed)."""
  return jax.random.bits(rng, (2,), jnp.uint32)


def _block(requested: int, length: int) -> int:
  if requested < MIN_BLOCK or requested & (requested - 1):
    raise ValueError(f"block size {requested} must be a power of two >= {MIN_BLOCK}")
  return max(MIN_BLOCK, min(requested, pl.next_power_of_2(length)))


def _pad_to(x: Array, axis: int, size: int, value=0) -> Array:
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, size - x.shape[axis])
  return jnp.pad(x, widths, constant_values=value)


def _segments(batch: int, q_len: int, k_len: int, kv_lengths, segment_ids):
  """(<int32>[batch, q_len], <int32>[batch, k_len]): query i sees key j where they are equal.
  Keys at or past `kv_lengths` get -1, which no query has."""
  if segment_ids is None:
    q_seg = jnp.zeros((batch, q_len), jnp.int32)
    kv_seg = jnp.zeros((batch, k_len), jnp.int32)
  elif isinstance(segment_ids, (tuple, list)):
    q_seg, kv_seg = (jnp.asarray(s, jnp.int32) for s in segment_ids)
  else:
    q_seg = kv_seg = jnp.asarray(segment_ids, jnp.int32)
  if q_seg.shape != (batch, q_len) or kv_seg.shape != (batch, k_len):
    raise ValueError(f"segment ids of shapes {q_seg.shape}, {kv_seg.shape}; expected "
                     f"{(batch, q_len)} and {(batch, k_len)}")
  if kv_lengths is not None:
    real = jnp.arange(k_len)[None, :] < jnp.asarray(kv_lengths, jnp.int32)[:, None]
    kv_seg = jnp.where(real, kv_seg, -1)
  return q_seg, kv_seg


def flash_attention(q: Array, k: Array, v: Array, *, kv_lengths: Array | None = None,
                    segment_ids=None, dropout_rate: float = 0.0, seed: Array | None = None,
                    interpret: bool = False, block_q: int = 64, block_k: int = 64,
                    window: int | None = None) -> Array:
  """<T>[batch, q_len, heads, head_dim] (q; k and v [batch, k_len, heads, head_dim]) -> the
  attention output <T>[batch, q_len, heads, head_dim].

  kv_lengths: <int32>[batch], each row's real keys (the rest are padding); segment_ids:
  <int>[batch, seq] non-negative ids (q_len == k_len), or a pair (query ids [batch, q_len], key
  ids [batch, k_len]): a query sees only keys of its own id. window: query i sees key j only when
  |i - j| <= window (q_len == k_len; ModernBERT's local layers take local_attention // 2): each
  block of queries visits the key blocks that meet its window only, and blocks whose segment ids
  cannot meet are skipped. Queries that see no key get some finite output (0 where every block
  around them is skipped). dropout_rate in [0, 1) with seed <uint32>[2] (`dropout_seed`):
  probabilities are dropped after the softmax with the counter-based mask of `seed` and the kept
  ones scaled by 1 / (1 - rate). interpret: run the kernels in Pallas interpret mode (on the
  CPU). Lengths are padded to the block sizes (powers of two >= 16, shrunk for short sequences)
  and the head size to a power of two >= 16; the padding is masked and sliced off.
  """
  batch, q_len, heads, head_dim = q.shape
  k_len = k.shape[1]
  if k.shape != (batch, k_len, heads, head_dim) or v.shape != k.shape:
    raise ValueError(f"q, k, v of shapes {q.shape}, {k.shape}, {v.shape}: expected [batch, "
                     "seq, heads, head_dim] with the same batch, heads and head_dim")
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f"dropout_rate={dropout_rate} must be in [0, 1)")
  if dropout_rate > 0.0 and seed is None:
    raise ValueError("dropout_rate > 0 needs a seed (dropout_seed(rng))")
  if window is not None and (window < 0 or q_len != k_len):
    raise ValueError(f"window={window} needs window >= 0 and queries at the keys' positions "
                     f"(q_len {q_len} == k_len {k_len})")
  q_seg, kv_seg = _segments(batch, q_len, k_len, kv_lengths, segment_ids)
  bq, bk = _block(block_q, q_len), _block(block_k, k_len)
  q_pad, k_pad = -(-q_len // bq) * bq, -(-k_len // bk) * bk
  dim = max(MIN_BLOCK, pl.next_power_of_2(head_dim))
  q = _pad_to(_pad_to(q, 1, q_pad), 3, dim)
  k, v = (_pad_to(_pad_to(x, 1, k_pad), 3, dim) for x in (k, v))
  q_seg = _pad_to(q_seg, 1, q_pad)
  kv_seg = _pad_to(kv_seg, 1, k_pad, value=-1)
  if dropout_rate > 0.0:
    keys = fk.head_keys(jnp.asarray(seed, jnp.uint32).reshape(2), batch, heads)[..., None]
  else:
    keys = jnp.zeros((batch, heads, 1), jnp.uint32)
  plan = fk.Plan(scale=1.0 / math.sqrt(head_dim), rate=float(dropout_rate),
                 threshold=dropout_lib.threshold(dropout_rate), block_q=bq, block_k=bk,
                 interpret=interpret, window=window, skip_disjoint=window is not None)
  out = _attention(q, k, v, q_seg, kv_seg, keys, plan)
  return out[:, :q_len, :, :head_dim]


# ---------------------------------------------------------------------------------------------
# The custom VJP over the padded operands.


def _specs(q_len: int, k_len: int, dim: int, block: int, by_keys: bool):
  """Block specs of (q, k, v, do, lse, delta, q segments, kv segments, head keys) on a grid
  (batch, heads, blocks of queries, or of keys when `by_keys`): the blocked side in blocks of
  `block`, the other side whole."""
  def rows(length, blocked):
    if blocked:
      return (pl.BlockSpec((None, block, None, dim), lambda b, h, i: (b, i, h, 0)),
              pl.BlockSpec((None, None, block), lambda b, h, i: (b, h, i)),
              pl.BlockSpec((None, block), lambda b, h, i: (b, i)))
    return (pl.BlockSpec((None, length, None, dim), lambda b, h, i: (b, 0, h, 0)),
            pl.BlockSpec((None, None, length), lambda b, h, i: (b, h, 0)),
            pl.BlockSpec((None, length), lambda b, h, i: (b, 0)))
  q_spec, stat_spec, q_seg_spec = rows(q_len, not by_keys)
  k_spec, _, kv_seg_spec = rows(k_len, by_keys)
  key_spec = pl.BlockSpec((None, None, 1), lambda b, h, i: (b, h, 0))
  return (q_spec, k_spec, k_spec, q_spec, stat_spec, stat_spec, q_seg_spec, kv_seg_spec,
          key_spec)


def _name(plan: fk.Plan, part: str) -> str:
  """The kernel's name in the lowered program and a profile: flash_window_* with a window."""
  return f"flash_{'dropout' if plan.window is None else 'window'}_{part}"


def _forward(q, k, v, q_seg, kv_seg, keys, plan: fk.Plan):
  batch, q_len, heads, dim = q.shape
  q_spec, k_spec, v_spec, _, stat_spec, _, q_seg_spec, kv_seg_spec, key_spec = _specs(
      q_len, k.shape[1], dim, plan.block_q, by_keys=False)
  return pl.pallas_call(
      functools.partial(fk.forward_kernel, plan=plan),
      grid=(batch, heads, q_len // plan.block_q),
      in_specs=[q_spec, k_spec, v_spec, q_seg_spec, kv_seg_spec, key_spec],
      out_specs=[q_spec, stat_spec],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((batch, heads, q_len), jnp.float32)],
      interpret=plan.interpret, compiler_params=TRITON, name=_name(plan, "forward"),
  )(q, k, v, q_seg, kv_seg, keys)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _attention(q, k, v, q_seg, kv_seg, keys, plan: fk.Plan):
  return _forward(q, k, v, q_seg, kv_seg, keys, plan)[0]


def _attention_fwd(q, k, v, q_seg, kv_seg, keys, plan):
  out, lse = _forward(q, k, v, q_seg, kv_seg, keys, plan)
  return out, (q, k, v, q_seg, kv_seg, keys, out, lse)


def _attention_bwd(plan, residuals, d_out):
  q, k, v, q_seg, kv_seg, keys, out, lse = residuals
  batch, q_len, heads, dim = q.shape
  k_len = k.shape[1]
  delta = jnp.einsum("bqhd,bqhd->bhq", out.astype(jnp.float32), d_out.astype(jnp.float32))
  operands = (q, k, v, d_out.astype(q.dtype), lse, delta, q_seg, kv_seg, keys)
  dq = pl.pallas_call(
      functools.partial(fk.dq_kernel, plan=plan),
      grid=(batch, heads, q_len // plan.block_q),
      in_specs=list(_specs(q_len, k_len, dim, plan.block_q, by_keys=False)),
      out_specs=_specs(q_len, k_len, dim, plan.block_q, by_keys=False)[0],
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      interpret=plan.interpret, compiler_params=TRITON, name=_name(plan, "dq"),
  )(*operands)
  kv_specs = _specs(q_len, k_len, dim, plan.block_k, by_keys=True)
  dk, dv = pl.pallas_call(
      functools.partial(fk.dkv_kernel, plan=plan),
      grid=(batch, heads, k_len // plan.block_k),
      in_specs=list(kv_specs),
      out_specs=[kv_specs[1], kv_specs[2]],
      out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
      interpret=plan.interpret, compiler_params=TRITON, name=_name(plan, "dkv"),
  )(*operands)
  return dq, dk, dv, None, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)
