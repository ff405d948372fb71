"""The residual block's tail in one Pallas kernel: LayerNorm(residual + dropout(x + bias)).

BERT's post-LN layers end both halves (attention and feed-forward) with: the projection's output,
dropout, the residual add and LayerNorm. XLA runs that as several passes over [tokens, hidden],
with a dropout mask drawn by its own random-number kernel and kept (in some form) for the backward
pass. Here one kernel reads x, the residual and the parameters once per row and writes the
normalized row and two numbers (the row's mean and inverse deviation); the keep mask is a hash of
the seed and the element's (row, column) coordinates, the counter-based hash of the attention
kernel (`flash_kernels`), so the backward kernel regenerates it and nothing mask-sized is drawn
or stored. The backward kernel recomputes the row from x and the residual and returns the
gradient of the row sum and its normalized form; the parameter gradients (column sums over rows)
are left to XLA.

Rows are processed one per program with the hidden size padded up to a power of two inside the
kernel (masked loads: Triton's blocks are powers of two; BERT's 768 is not). The kernels are
written for Triton (`compiler_params`), run in Pallas interpret mode on a CPU (tests), and their
GPU speed is unmeasured: the `fused_residual` field of the kernel sets is off everywhere until a
device run shows it faster (`--config.model.kernel_overrides.fused_residual=True` for an ablation row).
The projection's bias is an input: bertjax's post-LN layers run the attention's output projection
and the feed-forward's output projection without their bias add (`Dense(add_bias=False)`, the
same `kernel` and `bias` parameters as every other set) and hand that `bias` to this kernel, so
bias, dropout, residual add and LayerNorm are one pass. Its gradient: with h = residual +
dropout(x + bias) and dh the gradient reaching h (the LayerNorm backward), x and bias enter h
only through x + bias, so d(bias) = sum over rows of d(x) = sum over rows of keep * dh / (1 - rate)
(dh itself without dropout): the column sum of the backward kernel's dx, left to XLA with the
LayerNorm parameters' sums.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from bertjax.models import dropout as dropout_lib
from bertjax.models import flash_kernels as fk

Array = jax.Array
TRITON = pltriton.CompilerParams(num_warps=4, num_stages=1)


def _key(seed: Array) -> Array:
  """The 32-bit key of a <uint32>[2] seed (a scalar)."""
  return fk.mix32(seed[0] ^ fk.mix32(seed[1] + jnp.uint32(0x3C6EF372)))


def _keep(key: Array, row: Array, cols: Array, threshold: int) -> Array:
  return fk.keep_from_words(fk.row_words(key, row), fk.col_words(key, cols), threshold)


def _row_sum(x_ref, r_ref, b_ref, seed_ref, row_ref, cols, real, rate):
  """The row's residual + dropout(x + bias) in float32, zero past the hidden size."""
  x = pltriton.load(x_ref.at[cols], mask=real, other=0).astype(jnp.float32)
  r = pltriton.load(r_ref.at[cols], mask=real, other=0).astype(jnp.float32)
  b = pltriton.load(b_ref.at[cols], mask=real, other=0).astype(jnp.float32)
  y = x + b
  keep = None
  if rate > 0.0:
    key = seed_ref[...]  # the seed's 32-bit key, `_key`, computed outside the kernel
    row = row_ref[...].astype(jnp.uint32)
    keep = _keep(key, row, cols.astype(jnp.uint32), dropout_lib.threshold(rate))
    y = jnp.where(keep, y * (1.0 / (1.0 - rate)), 0.0)
  return jnp.where(real, r + y, 0.0), keep


def _forward_kernel(x_ref, r_ref, b_ref, s_ref, lb_ref, seed_ref, row_ref, y_ref, mean_ref,
                    rstd_ref, *, hidden, padded, rate, eps):
  cols = jnp.arange(padded, dtype=jnp.int32)
  real = cols < hidden
  h, _ = _row_sum(x_ref, r_ref, b_ref, seed_ref, row_ref, cols, real, rate)
  mean = jnp.sum(h) / hidden
  centered = jnp.where(real, h - mean, 0.0)
  rstd = jax.lax.rsqrt(jnp.sum(centered * centered) / hidden + eps)
  scale = pltriton.load(s_ref.at[cols], mask=real, other=0).astype(jnp.float32)
  shift = pltriton.load(lb_ref.at[cols], mask=real, other=0).astype(jnp.float32)
  pltriton.store(y_ref.at[cols], (centered * rstd * scale + shift).astype(y_ref.dtype), mask=real)
  mean_ref[...] = mean
  rstd_ref[...] = rstd


def _backward_kernel(x_ref, r_ref, b_ref, s_ref, seed_ref, row_ref, mean_ref, rstd_ref, g_ref,
                     dx_ref, dr_ref, xhat_ref, *, hidden, padded, rate):
  cols = jnp.arange(padded, dtype=jnp.int32)
  real = cols < hidden
  h, keep = _row_sum(x_ref, r_ref, b_ref, seed_ref, row_ref, cols, real, rate)
  xhat = jnp.where(real, (h - mean_ref[...]) * rstd_ref[...], 0.0)
  scale = pltriton.load(s_ref.at[cols], mask=real, other=0).astype(jnp.float32)
  g = pltriton.load(g_ref.at[cols], mask=real, other=0).astype(jnp.float32)
  gs = g * scale
  dh = rstd_ref[...] * (gs - jnp.sum(gs) / hidden - xhat * (jnp.sum(gs * xhat) / hidden))
  dh = jnp.where(real, dh, 0.0)
  dx = dh if keep is None else jnp.where(keep, dh * (1.0 / (1.0 - rate)), 0.0)
  pltriton.store(dr_ref.at[cols], dh.astype(dr_ref.dtype), mask=real)
  pltriton.store(dx_ref.at[cols], dx.astype(dx_ref.dtype), mask=real)
  pltriton.store(xhat_ref.at[cols], xhat, mask=real)


def _call(kernel, out_shape, interpret, name):
  """One row per program: the pallas_call over a row, mapped over the rows (vmap adds the grid
  axis), the parameters and the seed shared."""
  return pl.pallas_call(kernel, out_shape=out_shape, interpret=interpret,
                        compiler_params=None if interpret else TRITON, name=name)


def _forward(x, residual, bias, scale, shift, seed, plan):
  rows, hidden = x.shape
  padded, rate, eps, interpret = plan
  kernel = functools.partial(_forward_kernel, hidden=hidden, padded=padded, rate=rate, eps=eps)
  call = _call(kernel, [jax.ShapeDtypeStruct((hidden,), residual.dtype),
                        jax.ShapeDtypeStruct((), jnp.float32),
                        jax.ShapeDtypeStruct((), jnp.float32)], interpret,
               "fused_residual_forward")
  index = jnp.arange(rows, dtype=jnp.int32)
  return jax.vmap(call, in_axes=(0, 0, None, None, None, None, 0))(
      x, residual, bias, scale, shift, seed, index)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _fused(x, residual, bias, scale, shift, seed, plan):
  return _forward(x, residual, bias, scale, shift, seed, plan)[0]


def _fused_fwd(x, residual, bias, scale, shift, seed, plan):
  y, mean, rstd = _forward(x, residual, bias, scale, shift, seed, plan)
  return y, (x, residual, bias, scale, shift, seed, mean, rstd)


def _fused_bwd(plan, saved, g):
  x, residual, bias, scale, shift, seed, mean, rstd = saved
  rows, hidden = x.shape
  padded, rate, _, interpret = plan
  kernel = functools.partial(_backward_kernel, hidden=hidden, padded=padded, rate=rate)
  call = _call(kernel, [jax.ShapeDtypeStruct((hidden,), x.dtype),
                        jax.ShapeDtypeStruct((hidden,), residual.dtype),
                        jax.ShapeDtypeStruct((hidden,), jnp.float32)], interpret,
               "fused_residual_backward")
  index = jnp.arange(rows, dtype=jnp.int32)
  dx, dres, xhat = jax.vmap(call, in_axes=(0, 0, None, None, None, 0, 0, 0, 0))(
      x, residual, bias, scale, seed, index, mean, rstd, g)
  g32 = g.astype(jnp.float32)
  # d(bias): x + bias is one term, so its gradient is dx's, summed over the rows (module doc).
  dbias = jnp.sum(dx.astype(jnp.float32), axis=0).astype(bias.dtype)
  return (dx, dres, dbias, jnp.sum(g32 * xhat, axis=0).astype(scale.dtype),
          jnp.sum(g32, axis=0).astype(shift.dtype), None)


_fused.defvjp(_fused_fwd, _fused_bwd)


def fused_residual_norm(x: Array, residual: Array, bias: Array, scale: Array, shift: Array, *,
                        rate: float, seed: Array, eps: float, interpret: bool = False) -> Array:
  """LayerNorm(residual + dropout(x + bias)) over the last axis of <T>[..., hidden] operands,
  statistics in float32, the output in the residual's dtype; dropout at `rate` (0: none) with the
  keep mask hashed from the seed and each element's (row, column), rows flattened, kept values
  scaled by 1 / (1 - rate). `bias`, `scale`, `shift`: <float32>[hidden]. `seed`: <uint32>[2]
  (`flash_attention.dropout_seed` of the layer's key)."""
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"dropout rate {rate} must be in [0, 1)")
  hidden = x.shape[-1]
  lead = residual.shape[:-1]
  plan = (pl.next_power_of_2(hidden), float(rate), float(eps), bool(interpret))
  y = _fused(x.reshape(-1, hidden), residual.reshape(-1, hidden), bias, scale, shift,
             _key(seed.astype(jnp.uint32)), plan)
  return y.reshape(*lead, hidden)
