"""Building blocks of the encoder and its heads: Dense, LayerNorm, activations.

Where the fastest formulation differs by device (a 2-D product, a written-out LayerNorm backward
pass) each takes a flag that `bertjax.models.kernels` sets; the values are the same either way.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import kernels
from bertjax.models.config import ModelConfig

Array = jax.Array


def exact_gelu(x: Array) -> Array:
  """x * Phi(x) through erf, as PyTorch computes it; `jax.nn.gelu(approximate=False)` goes
  through erfc, which XLA:CPU expands into about twice the work."""
  return 0.5 * x * (1.0 + jax.lax.erf(x * jnp.asarray(0.7071067811865476, x.dtype)))


def activation(name: str) -> Callable[[Array], Array]:
  if name == "gelu":
    return exact_gelu
  if name in ("gelu_new", "gelu_fast", "gelu_pytorch_tanh"):
    return lambda x: jax.nn.gelu(x, approximate=True)
  if name in ("silu", "swish"):
    return jax.nn.silu
  return {"relu": jax.nn.relu, "tanh": jnp.tanh}[name]


def dense_init(std: float = 0.02):
  return nn.initializers.normal(stddev=std)


class Dense(nn.Module):
  """A dense layer over `num_in` trailing input axes into `features` (an int or a shape).

  Unlike `nn.DenseGeneral`, the kernel is created in its final multi-axis shape, so its logical
  axis names (`names`: input axes then output axes) apply at initialization too. `flat`: compute
  it as one 2-D matrix product (`Kernels.flat_dense`); the values are the same.
  """
  features: int | tuple[int, ...]
  names: tuple[str | None, ...]
  num_in: int = 1
  dtype: Any = jnp.float32
  flat: bool = True

  @nn.compact
  def __call__(self, x):
    out = (self.features,) if isinstance(self.features, int) else tuple(self.features)
    in_shape = x.shape[-self.num_in:]
    kernel = self.param("kernel", nn.with_logical_partitioning(dense_init(), self.names),
                        in_shape + out, jnp.float32)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                           self.names[self.num_in:]),
                      out, jnp.float32)
    x, kernel = x.astype(self.dtype), kernel.astype(self.dtype)
    if not self.flat:
      y = jax.lax.dot_general(x, kernel, ((tuple(range(x.ndim - self.num_in, x.ndim)),
                                           tuple(range(self.num_in))), ((), ())))
      return y + bias.astype(self.dtype)
    # One 2-D product [rows, in] @ [in, out], the reshapes being free (row-major, contiguous):
    # the CPU choice (bertjax.models.kernels).
    lead = x.shape[:x.ndim - self.num_in]
    rows = x.reshape(math.prod(lead), math.prod(in_shape))
    y = rows @ kernel.reshape(math.prod(in_shape), math.prod(out))
    return y.reshape(lead + out) + bias.astype(self.dtype)


def make_dense(features, names, name, cfg: ModelConfig, axis=-1):
  num_in = len(axis) if isinstance(axis, tuple) else 1
  return Dense(features, tuple(names), num_in=num_in, dtype=cfg.compute_dtype,
               flat=kernels.for_model(cfg).flat_dense, name=name)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def layer_norm(x: Array, scale: Array, bias: Array, epsilon: float) -> Array:
  """LayerNorm over the last axis, statistics in at least float32, the variance in two passes
  (as PyTorch). The one-pass E[x^2] - E[x]^2 was up to 3% faster on bert-mini, but moved ELECTRA's
  5-step losses on a 2x2x2 mesh by 2e-5 relative to one device, where two passes agree to 1e-7.

  Its backward pass is written out: it keeps only `x` and the per-row mean and inverse deviation,
  and recomputes the normalized rows. Left to autodiff, XLA:CPU also keeps the inverse deviation
  and the scale broadcast to the full activation shape: on bert-base (batch 8, seq 128) the
  compiled step's temporary memory drops from 1146 to 1077 MB with this.
  """
  return _layer_norm_fwd(x, scale, bias, epsilon)[0]


def _layer_norm_fwd(x, scale, bias, epsilon):
  x32 = x.astype(jnp.promote_types(x.dtype, jnp.float32))
  mean = jnp.mean(x32, axis=-1, keepdims=True)
  centered = x32 - mean
  rstd = jax.lax.rsqrt(jnp.mean(jnp.square(centered), axis=-1, keepdims=True) + epsilon)
  y = (centered * rstd * scale + bias).astype(x.dtype)
  return y, (x, mean, rstd, scale)


def _layer_norm_bwd(epsilon, residuals, g):
  del epsilon
  x, mean, rstd, scale = residuals
  xhat = (x.astype(mean.dtype) - mean) * rstd
  g32 = g.astype(mean.dtype)
  rows = tuple(range(g.ndim - 1))
  gs = g32 * scale
  dx = rstd * (gs - jnp.mean(gs, axis=-1, keepdims=True)
               - xhat * jnp.mean(gs * xhat, axis=-1, keepdims=True))
  return dx.astype(x.dtype), jnp.sum(g32 * xhat, axis=rows), jnp.sum(g32, axis=rows)


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


def layer_norm_autodiff(x: Array, scale: Array, bias: Array, epsilon: float) -> Array:
  """The same LayerNorm, its backward pass left to autodiff (the ordinary formulation)."""
  return _layer_norm_fwd(x, scale, bias, epsilon)[0]


class LayerNorm(nn.Module):
  """LayerNorm with `scale` and `bias` parameters (the layout of `nn.LayerNorm`)."""
  epsilon: float
  dtype: Any = jnp.float32
  axis_name: str = "embed"
  written_backward: bool = True  # `Kernels.layer_norm_vjp`; the values are the same

  @nn.compact
  def __call__(self, x):
    size = x.shape[-1]
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                             (self.axis_name,)), (size,), jnp.float32)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                           (self.axis_name,)), (size,), jnp.float32)
    norm = layer_norm if self.written_backward else layer_norm_autodiff
    return norm(x.astype(self.dtype), scale, bias, self.epsilon)


def make_layer_norm(cfg: ModelConfig, name: str, axis_name: str = "embed"):
  return LayerNorm(cfg.layer_norm_eps, cfg.compute_dtype, axis_name,
                   kernels.for_model(cfg).layer_norm_vjp, name=name)
