"""The layers the encoder and its heads are built from, chosen once per model (`Layers`).

A model resolves its kernel set (`bertjax.models.kernels.for_model`) once, when it is built
(`layers_for`), into a `Layers`: the Dense, LayerNorm, dropout and embedding constructors and the
functions to use, each the stock `flax.linen` layer or function or, where the set says so, the
hand-written form here (a 2-D product, a written-out LayerNorm backward pass, GELU through erf,
a float32 lookup, the fused residual tail); the values are the same to rounding. The model hands
it down to its modules (`Layered`), which read as stock Flax with those layers injected.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen import fp8_ops

from bertjax.models import fp8, kernels
from bertjax.models.config import ModelConfig
from bertjax.models.dropout import STOCK as STOCK_DROPOUT, Dropout
from bertjax.models.flash_attention import dropout_seed
from bertjax.models.fused_residual import fused_residual_norm

Array = jax.Array


def exact_gelu(x: Array) -> Array:
  """x * Phi(x) through erf, as PyTorch computes it; `jax.nn.gelu(approximate=False)` goes
  through erfc, which XLA:CPU expands into about twice the work."""
  return 0.5 * x * (1.0 + jax.lax.erf(x * jnp.asarray(0.7071067811865476, x.dtype)))


def activation(name: str, erf_gelu: bool = True) -> Callable[[Array], Array]:
  """The activation `name` (Hugging Face's names); "gelu" through erf with `erf_gelu`
  (`Kernels.erf_gelu`), else `nn.gelu(approximate=False)`."""
  if name == "gelu":
    return exact_gelu if erf_gelu else functools.partial(nn.gelu, approximate=False)
  if name in ("gelu_new", "gelu_fast", "gelu_pytorch_tanh"):
    return lambda x: jax.nn.gelu(x, approximate=True)
  if name in ("silu", "swish"):
    return jax.nn.silu
  return {"relu": jax.nn.relu, "tanh": jnp.tanh}[name]


def rematerialized(layer_cls: type[nn.Module], cfg: ModelConfig,
                   static_argnums: tuple[int, ...]) -> type[nn.Module]:
  """`layer_cls`, wrapped in `nn.remat` with `cfg.remat_policy` ("full": nothing saved, "dots":
  the matmul outputs saved) when `cfg.remat` is on; `static_argnums` are the call's Python
  arguments (counted with the module as 0)."""
  if not cfg.remat:
    return layer_cls
  policy = {"full": None,
            "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}[cfg.remat_policy]
  return nn.remat(layer_cls, static_argnums=static_argnums, policy=policy)


def dense_init(std: float = 0.02):
  return nn.initializers.normal(stddev=std)


class Dense(nn.Module):
  """A dense layer over `num_in` trailing input axes into `features` (an int or a shape).

  Computed as one 2-D matrix product over reshaped operands (`Kernels.flat_dense`, XLA:CPU's
  choice); the values are those of `nn.Dense` / `nn.Einsum` with the same parameters. The kernel
  is created in its final multi-axis shape, so its logical axis names (`names`: input axes then
  output axes) apply at initialization too.
  """
  features: int | tuple[int, ...]
  names: tuple[str | None, ...]
  num_in: int = 1
  dtype: Any = jnp.float32
  add_bias: bool = True  # False: x @ kernel only, its `bias` added by the caller (`ResidualNorm`)
  # > 0 (`model.fp8`): the product through flax's FP8 dot_general with delayed scaling over this
  # many steps of amax history, when the scale state is given (bertjax/models/fp8.py); else in
  # `dtype`.
  fp8_amax_history: int = 0

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
    # One 2-D product [rows, in] @ [in, out], the reshapes being free (row-major, contiguous).
    lead = x.shape[:x.ndim - self.num_in]
    rows = x.reshape(math.prod(lead), math.prod(in_shape))
    matrix = kernel.reshape(math.prod(in_shape), math.prod(out))
    if self.fp8_amax_history and (self.is_initializing() or self.has_variable(fp8.SCALES, fp8.OP)):
      y = fp8_ops.Fp8DirectDotGeneralOp(amax_history_length=self.fp8_amax_history,
                                        name=fp8.OP)(rows, matrix, (((1,), (0,)), ((), ())))
    else:  # without the scale state (evaluation, readers): in the compute dtype
      y = rows @ matrix
    y = y.reshape(lead + out)
    return y + bias.astype(self.dtype) if self.add_bias else y


def flat_dense(features, names, name, axis=-1, in_shape=None, *, dtype, add_bias=True,
               fp8_amax_history=0):
  """`Dense` (`Kernels.flat_dense`): a dense layer into `features` (an int or a shape) over the
  `axis` input axes, kernel and bias named by the logical `names` (input axes then output axes).
  `in_shape` is what `stock_dense` needs; the parameters are the same. `add_bias` False: the
  bias is created but left to the caller to add (`ResidualNorm` adds it inside its kernel)."""
  del in_shape
  num_in = len(axis) if isinstance(axis, tuple) else 1
  return Dense(features, tuple(names), num_in=num_in, dtype=dtype, add_bias=add_bias,
               fp8_amax_history=fp8_amax_history, name=name)


def stock_dense(features, names, name, axis=-1, in_shape=None, *, dtype, add_bias=True):
  """`nn.Dense`, or `nn.Einsum` over `in_shape` (the sizes of the input axes) where either side
  has several axes; the arguments and parameters of `flat_dense`. `add_bias` False (the fused
  residual tail's projections): `flat_dense`'s form, which can leave its bias unadded."""
  if not add_bias:
    return flat_dense(features, names, name, axis, dtype=dtype, add_bias=False)
  names = tuple(names)
  num_in = len(axis) if isinstance(axis, tuple) else 1
  kernel_init = nn.with_logical_partitioning(dense_init(), names)
  bias_init = nn.with_logical_partitioning(nn.initializers.zeros_init(), names[num_in:])
  if num_in == 1 and isinstance(features, int):
    return nn.Dense(features, dtype=dtype, param_dtype=jnp.float32,
                    kernel_init=kernel_init, bias_init=bias_init, name=name)
  # Not nn.DenseGeneral: it draws its kernel flat and reshapes it, and the flat draw's sharding
  # constraint (under a mesh) does not fit the multi-axis names.
  out = (features,) if isinstance(features, int) else tuple(features)
  ins, outs = "ijkl"[:num_in], "uvwx"[:len(out)]
  return nn.Einsum(tuple(in_shape) + out, f"...{ins},{ins}{outs}->...{outs}",
                   dtype=dtype, param_dtype=jnp.float32, kernel_init=kernel_init,
                   bias_init=bias_init, name=name)


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


class LayerNorm(nn.Module):
  """`layer_norm` with `scale` and `bias` parameters (the layout of `nn.LayerNorm`); without
  `use_bias` (ModernBERT's norms) only `scale`, the bias a constant 0."""
  epsilon: float
  dtype: Any = jnp.float32
  axis_name: str = "embed"
  use_bias: bool = True

  @nn.compact
  def __call__(self, x):
    size = x.shape[-1]
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                             (self.axis_name,)), (size,), jnp.float32)
    if self.use_bias:
      bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                             (self.axis_name,)), (size,),
                        jnp.float32)
    else:
      bias = jnp.zeros((size,), jnp.float32)
    return layer_norm(x.astype(self.dtype), scale, bias, self.epsilon)


def vjp_layer_norm(name, axis_name="embed", *, epsilon, dtype, use_bias=True):
  """`LayerNorm` (`Kernels.layer_norm_vjp`), `scale` and `bias` named by the logical
  `axis_name`."""
  return LayerNorm(epsilon, dtype, axis_name, use_bias=use_bias, name=name)


def stock_layer_norm(name, axis_name="embed", *, epsilon, dtype, use_bias=True):
  """`nn.LayerNorm` (its variance in two passes, as `layer_norm`), with the parameters of
  `vjp_layer_norm`."""
  names = (axis_name,)
  return nn.LayerNorm(epsilon, dtype=dtype, param_dtype=jnp.float32, use_bias=use_bias,
                      use_fast_variance=False,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), names),
                      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), names),
                      name=name)


def lookup(table: Array, ids: Array, dtype, one_hot_rows: int = 0) -> Array:
  """Rows of a float32 `table` at `ids`, cast to `dtype` after the lookup.

  Looking up the float32 table keeps the gradient's scatter-add in float32: a bfloat16 one rounds
  every addition and, on GPUs, is about 20x slower under contention (openxla/xla#26371). Tables of
  at most `one_hot_rows` rows (token types) are read as a one-hot product, whose gradient is a
  matrix product instead of every token added into a few rows.
  """
  rows = table.shape[0]
  if rows == 1:  # RoBERTa's single token type: every id reads it (as nn.Embed does)
    return jnp.broadcast_to(table[0], ids.shape + table.shape[1:]).astype(dtype)
  if rows <= one_hot_rows:
    one_hot = jax.nn.one_hot(ids, rows, dtype=table.dtype)
    out = jnp.einsum("...r,re->...e", one_hot, table, precision=jax.lax.Precision.HIGHEST)
  else:
    out = jnp.take(table, ids, axis=0)
  return out.astype(dtype)


class Embed(nn.Module):
  """An embedding table (the parameter layout of `nn.Embed`) read through `lookup`: the float32
  table, cast after the lookup, small tables as a one-hot product (`Kernels.float32_lookup`,
  `Kernels.one_hot_rows`)."""
  num_embeddings: int
  features: int
  names: tuple[str | None, str | None]
  dtype: Any = jnp.float32
  one_hot_rows: int = 0

  def setup(self):
    init = nn.with_logical_partitioning(dense_init(), self.names)
    self.embedding = self.param("embedding", init, (self.num_embeddings, self.features), jnp.float32)

  def __call__(self, ids: Array) -> Array:
    return lookup(self.embedding, ids, self.dtype, self.one_hot_rows)

  def attend(self, x: Array) -> Array:
    """x @ table.T in `dtype`: logits over the table's rows (the tied MLM decoder)."""
    return x.astype(self.dtype) @ self.embedding.astype(self.dtype).T


def embed(num_embeddings: int, features: int, names: tuple[str | None, str | None],
          small: bool = False, name: str | None = None, *, dtype, float32: bool,
          one_hot_rows: int) -> nn.Module:
  """`Embed` where the set asks for the float32 lookup (`float32`) or, for a `small` table (token
  types) of at most `one_hot_rows` rows, the one-hot product; else `nn.Embed`. The same
  `embedding` parameter."""
  one_hot_rows = one_hot_rows if small else 0
  if float32 or num_embeddings <= one_hot_rows:
    return Embed(num_embeddings, features, names, dtype, one_hot_rows, name=name)
  return nn.Embed(num_embeddings, features, dtype=dtype, param_dtype=jnp.float32,
                  embedding_init=nn.with_logical_partitioning(dense_init(), names), name=name)


def gather_positions(x: Array, positions: Array, float32: bool = True) -> Array:
  """<T>[batch, seq, ...], <int32>[batch, p] -> <T>[batch, p, ...]: the rows at `positions`.
  `float32`: half precision gathered from a float32 view (`Kernels.float32_gather`)."""
  index = positions.astype(jnp.int32).reshape(positions.shape + (1,) * (x.ndim - 2))
  if float32 and jnp.dtype(x.dtype).itemsize < 4:
    # Half precision: gathered from a float32 view, so the gradient's scatter-add (rows repeat:
    # unused prediction slots all point at position 0) runs in float32, not bfloat16.
    return jnp.take_along_axis(x.astype(jnp.float32), index, axis=1).astype(x.dtype)
  return jnp.take_along_axis(x, index, axis=1)


def add_vocab_bias(logits: jax.Array, bias: jax.Array, product: bool = True) -> jax.Array:
  """logits + bias; with `product` (`Kernels.bias_product`) the bias broadcast as an outer
  product with ones.

  Same values; the difference is the backward pass: the bias gradient becomes a matrix-vector
  product instead of a column reduction over [rows, vocab], which XLA:CPU ran ~5x slower (about
  15 ms of a 530 ms bert-mini step, PERFORMANCE.md).
  """
  if not product:
    return logits + bias.astype(logits.dtype)
  ones = jnp.ones(logits.shape[:-1], logits.dtype)
  return logits + jnp.einsum("...,v->...v", ones, bias.astype(logits.dtype))


class ResidualNorm(nn.Module):
  """LayerNorm(residual + dropout(y + y_bias)) through the fused Pallas kernel
  (`Kernels.fused_residual`), with the parameters of the set's LayerNorm (`scale`, `bias`): the
  same tree. Called as `norm(residual, y, deterministic, y_bias)`: `y` the projection's output
  without its bias (`dense(..., add_bias=False)`), `y_bias` that projection's `bias` parameter,
  added inside the kernel (and its gradient, the column sum of the gradient reaching y, summed
  there too); None: `y` has its bias already."""
  rate: float
  epsilon: float
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, residual, y, deterministic: bool, y_bias=None):
    size = residual.shape[-1]
    names = ("embed",)
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(), names),
                       (size,), jnp.float32)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(), names),
                      (size,), jnp.float32)
    rate = 0.0 if deterministic else self.rate
    seed = (dropout_seed(self.make_rng("dropout")) if rate > 0.0
            else jnp.zeros((2,), jnp.uint32))
    if y_bias is None:  # the Dense before it added its own
      y_bias = jnp.zeros((size,), jnp.float32)
    return fused_residual_norm(y, residual.astype(self.dtype), y_bias, scale, bias,
                               rate=rate, seed=seed, eps=self.epsilon,
                               interpret=kernels.triton_interpreted())


class _Bound(functools.partial):
  """A `functools.partial` equal to another of the same function and arguments, so that a model
  holding a `Layers` is equal to (and hashes as) one built from the same config."""

  def __eq__(self, other):
    return (isinstance(other, _Bound) and self.func == other.func and self.args == other.args
            and self.keywords == other.keywords)

  def __hash__(self):
    return hash((self.func, self.args, tuple(sorted(self.keywords.items()))))


@dataclasses.dataclass(frozen=True)
class Layers:
  """What a model's modules are built from, chosen once from its kernel set (`layers_for`).

  dense(features, names, name, axis=-1, in_shape=None, add_bias=True): a Dense layer
    (`flat_dense` or `stock_dense`).
  projection: the same, for the encoder layers' query, key, value, attention-output,
    intermediate and output projections: `dense`, or with `model.fp8` the FP8 one
    (`flat_dense` with `fp8_amax_history`, the same parameters).
  norm(name, axis_name="embed", epsilon=..., use_bias=True): a LayerNorm (`vjp_layer_norm` or
    `stock_layer_norm`), epsilon the model's `layer_norm_eps` unless given.
  residual: post-LN's tail, LayerNorm(residual + dropout(y + bias)), as one module
    `residual(name=...)` called (residual, y, deterministic, bias) (`ResidualNorm`; y from a
    `dense(..., add_bias=False)`, bias that Dense's parameter), or None: dropout, add and `norm`.
  dropout(rate): a dropout module (`nn.Dropout` or bertjax's `Dropout` of the chosen form).
  embed(num_embeddings, features, names, small=False, name=None): an embedding table (`embed`).
  activation(name): the activation function (`activation`, GELU through erf or not).
  mlp_activation(name): the feed-forward's, rematerialized in the backward pass where the set
    says so (`Kernels.remat_activation`).
  gather(x, positions): rows at positions (`gather_positions`).
  vocab_bias(logits, bias): the MLM decoder's bias added (`add_vocab_bias`).
  kernels: the resolved set itself, for the attention's choices (`bertjax.models.attention`);
  attention_dropout: `kernels.attention_dropout_setting`'s answer.
  """
  kernels: kernels.Kernels
  attention_dropout: str
  dense: Callable[..., nn.Module]
  projection: Callable[..., nn.Module]
  norm: Callable[..., nn.Module]
  residual: Callable[..., nn.Module] | None
  dropout: Callable[[float], nn.Module]
  embed: Callable[..., nn.Module]
  activation: Callable[[str], Callable[[Array], Array]]
  mlp_activation: Callable[[str], Callable[[Array], Array]]
  gather: Callable[[Array, Array], Array]
  vocab_bias: Callable[[Array, Array], Array]


def _mlp_activation(name: str, erf_gelu: bool, remat: bool) -> Callable[[Array], Array]:
  act = activation(name, erf_gelu)
  # The backward pass recomputes the activation's internals from its input: one [tokens,
  # intermediate] buffer less per layer.
  return jax.checkpoint(act) if remat else act


def layers_for(cfg: ModelConfig) -> Layers:
  """The layers of a model of `cfg`: its kernel set resolved once (`kernels.for_model`, with
  `model.dropout_impl` and `model.attention_dropout_kernel`) into constructors and functions."""
  k = kernels.for_model(cfg)
  dtype = cfg.compute_dtype
  dropout = kernels.dropout_setting(cfg, k)
  dense = _Bound(flat_dense if k.flat_dense else stock_dense, dtype=dtype)
  return Layers(
      kernels=k, attention_dropout=kernels.attention_dropout_setting(cfg, k), dense=dense,
      projection=(_Bound(flat_dense, dtype=dtype, fp8_amax_history=cfg.fp8_amax_history)
                  if cfg.fp8 else dense),
      norm=_Bound(vjp_layer_norm if k.layer_norm_vjp else stock_layer_norm,
                  epsilon=cfg.layer_norm_eps, dtype=dtype),
      residual=(_Bound(ResidualNorm, cfg.hidden_dropout_prob, cfg.layer_norm_eps, dtype)
                if k.fused_residual and not cfg.pre_layer_norm else None),
      dropout=nn.Dropout if dropout == STOCK_DROPOUT else _Bound(Dropout, implementation=dropout),
      embed=_Bound(embed, dtype=dtype, float32=k.float32_lookup, one_hot_rows=k.one_hot_rows),
      activation=_Bound(activation, erf_gelu=k.erf_gelu),
      mlp_activation=_Bound(_mlp_activation, erf_gelu=k.erf_gelu, remat=k.remat_activation),
      gather=_Bound(gather_positions, float32=k.float32_gather),
      vocab_bias=_Bound(add_vocab_bias, product=k.bias_product))


class Layered(nn.Module):
  """A module built from a `Layers`: its `layers` field (`layers_field` names it), handed down by
  the model holding it, or, where it is built alone (the field None), resolved from its `config`
  once, at construction. The class declaring `config` declares that field last, defaulting to
  None."""
  layers_field = "layers"

  def __post_init__(self):
    if getattr(self, self.layers_field) is None:
      object.__setattr__(self, self.layers_field, layers_for(self.config))
    super().__post_init__()
