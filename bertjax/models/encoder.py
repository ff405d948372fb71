"""The BERT-family Transformer encoder in Flax Linen.

One module covers BERT, RoBERTa (position offset after padding), ALBERT (factorized embeddings,
cross-layer sharing) and ELECTRA (embedding projection), post-LN as published or pre-LN.
Weights carry logical axis names only (`vocab`, `embed`, `heads`, `kv`, `mlp`); the mapping of
those names to a device mesh lives in the experiment config (see `bertjax.sharding`).
Activations are constrained with `act_batch`, `act_len`, `act_embed`, ... names.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.errors import fail
from bertjax.models import kernels
from bertjax.models.config import ModelConfig
from bertjax.models.dropout import Dropout

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


def _dense(features, names, name, cfg: ModelConfig, axis=-1):
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


def _layer_norm(cfg: ModelConfig, name: str, axis_name: str = "embed"):
  return LayerNorm(cfg.layer_norm_eps, cfg.compute_dtype, axis_name,
                   kernels.for_model(cfg).layer_norm_vjp, name=name)


def has_embedding_projection(cfg: ModelConfig) -> bool:
  """Whether embeddings pass through `embedding_projection` before the first layer.

  ALBERT always has this projection (Hugging Face's embedding_hidden_mapping_in exists even when
  embedding_size == hidden_size); BERT/RoBERTa/ELECTRA only when the sizes differ.
  """
  return cfg.embed_size != cfg.hidden_size or cfg.architecture == "albert"


@flax.struct.dataclass
class EncoderOutput:
  """last_hidden_state: <float>[batch, seq, hidden] (<float>[batch, p, hidden] when the encoder
  was called with `output_positions`); pooler_output: <float>[batch, hidden] or None;
  hidden_states: the embedding output and each layer's output (when asked for), else None;
  attentions: each layer's pre-softmax attention scores <float>[batch, heads, q, k], the scaled
  q.k before any masking (when asked for: `output_attentions`), else None."""
  last_hidden_state: Array
  pooler_output: Array | None = None
  hidden_states: tuple[Array, ...] | None = None
  attentions: tuple[Array, ...] | None = None


@flax.struct.dataclass
class AttentionMask:
  """Which keys each query sees. keys: <bool>[batch, 1, 1 or q, k]; lengths: <int32>[batch], each
  row's real tokens (what the fused cuDNN kernel takes), or None; right_padded: <bool>[], whether
  every row is ones then zeros, so that the lengths say the same as `keys`."""
  keys: Array
  lengths: Array | None = None
  right_padded: Array | None = None


def make_attention_mask(attention_mask: Array, segment_ids: Array | None = None) -> Array:
  """<bool>[batch, 1, q, k]: keys that are real tokens, and of the query's own example when packed.

  Queries at padding positions still see the real keys (as Hugging Face does), so their hidden
  states stay finite and comparable.
  """
  keys = attention_mask.astype(bool)[:, None, None, :]
  if segment_ids is None:
    return keys
  same = segment_ids[:, :, None] == segment_ids[:, None, :]
  return keys & same[:, None, :, :]


def attention_mask_for(cfg: ModelConfig, attention_mask: Array,
                       segment_ids: Array | None = None) -> AttentionMask:
  """The mask in the forms the platform's attention reads: key lengths as well (GPU), for rows
  without segments."""
  keys = make_attention_mask(attention_mask, segment_ids)
  if segment_ids is not None or not kernels.for_model(cfg).attention_lengths:
    return AttentionMask(keys)
  real = attention_mask.astype(bool)
  lengths = jnp.sum(real.astype(jnp.int32), axis=-1)
  prefix = jnp.arange(real.shape[-1])[None, :] < lengths[:, None]
  return AttentionMask(keys, lengths, jnp.all(prefix == real))


def fused_attention(q: Array, k: Array, v: Array, mask: AttentionMask, implementation: str,
                    deterministic: bool = True) -> Array:
  """softmax(q.k / sqrt(d)) v through `jax.nn.dot_product_attention`.

  With key lengths (cuDNN's padding mask; a [batch, 1, 1, k] boolean mask makes cuDNN refuse),
  else with the boolean mask ([batch, 1, q, k] for packed rows, which cuDNN takes as a bias).
  Lengths stand for the mask only on right-padded rows: in inference (`deterministic`) a mask of
  another shape (left padding, holes) is detected and takes XLA's attention with the mask; in
  training the rows come from bertjax's input builders, which all pad on the right.
  """
  if mask.lengths is None:
    return jax.nn.dot_product_attention(q, k, v, mask=mask.keys, implementation=implementation)
  by_lengths = lambda q, k, v: jax.nn.dot_product_attention(
      q, k, v, key_value_seq_lengths=mask.lengths, implementation=implementation)
  if not deterministic:
    return by_lengths(q, k, v)
  by_mask = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask.keys,
                                                         implementation="xla")
  return jax.lax.cond(mask.right_padded, by_lengths, by_mask, q, k, v)


def explicit_attention(q: Array, k: Array, v: Array, keys: Array, dropout: Callable[[Array], Array]
                       ) -> tuple[Array, Array]:
  """(output, pre-softmax scores before masking): the path that applies attention dropout and
  hands the scores out (TinyBERT's attention transfer reads them)."""
  raw_scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  scores = jnp.where(keys, raw_scores, jnp.finfo(raw_scores.dtype).min)
  probs = dropout(jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype))
  return jnp.einsum("bhqk,bkhd->bqhd", probs, v), raw_scores


def cudnn_available(backend: str | None = None) -> bool:
  """cuDNN's flash attention runs here: an NVIDIA GPU of compute capability 8.0 or newer."""
  if (backend or jax.default_backend()) not in ("gpu", "cuda"):
    return False
  if backend is not None:  # asked about a backend other than the one running (tests)
    return True
  capability = getattr(jax.devices()[0], "compute_capability", None)
  try:
    return capability is not None and float(capability) >= 8.0
  except (TypeError, ValueError):
    return False


def attention_implementation(cfg: ModelConfig, head_dim: int, dtype, backend: str | None = None,
                             per_query_mask: bool = False, q_len: int = 2, k_len: int = 2) -> str:
  """The fused implementation for this model: cuDNN where the platform's kernels ask for it and
  it applies (an NVIDIA GPU of compute capability >= 8.0, half precision, head size a multiple of
  8 up to 128; a per-query mask, which cuDNN takes as a bias, needs even query and key lengths
  in training), else XLA's."""
  impl = kernels.for_model(cfg).attention
  if impl == "cudnn" and (not cudnn_available(backend) or head_dim % 8 or head_dim > 128
                          or jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16)
                          or (per_query_mask and (q_len % 2 or k_len % 2))):
    return "xla"
  return impl


def position_ids_for(cfg: ModelConfig, input_ids: Array, segment_ids: Array | None) -> Array:
  """Positions as each architecture numbers them; restarting per example in packed rows."""
  seq = input_ids.shape[-1]
  if segment_ids is not None:
    # Position within its own example: index minus the index where the segment started.
    idx = jnp.arange(seq)[None, :]
    starts = jnp.concatenate(
        [jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    start_idx = jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
    pos = idx - start_idx
    if cfg.position_offset:
      return jnp.where(segment_ids > 0, pos + cfg.position_offset, cfg.pad_token_id)
    return pos
  if cfg.position_offset:
    real = (input_ids != cfg.pad_token_id).astype(jnp.int32)
    return jnp.cumsum(real, axis=1) * real + cfg.pad_token_id
  return jnp.broadcast_to(jnp.arange(seq)[None, :], input_ids.shape)


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
  """An embedding table (the parameter layout of `nn.Embed`) read through `lookup`."""
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

  def first_rows(self, n: int) -> Array:
    """Rows 0..n-1 as <dtype>[1, n, features]: the default positions, with no gather at all."""
    return self.embedding[None, :n].astype(self.dtype)

  def attend(self, x: Array) -> Array:
    """x @ table.T in `dtype`: logits over the table's rows (the tied MLM decoder)."""
    return x.astype(self.dtype) @ self.embedding.astype(self.dtype).T


class Embeddings(nn.Module):
  """Word + position + token-type embeddings, LayerNorm and dropout, all of size embed_size."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    one_hot = kernels.for_model(cfg).one_hot_rows
    embed = lambda n, names, **kw: Embed(n, cfg.embed_size, names, cfg.compute_dtype, **kw)
    self.word_embeddings = embed(cfg.vocab_size, ("vocab", "embed"))
    self.position_embeddings = embed(cfg.max_position_embeddings, (None, "embed"))
    self.token_type_embeddings = embed(cfg.type_vocab_size, (None, "embed"), one_hot_rows=one_hot)
    self.layer_norm = _layer_norm(cfg, "layer_norm")
    self.dropout = Dropout(cfg.hidden_dropout_prob)

  def __call__(self, input_ids, token_type_ids, position_ids, deterministic: bool):
    """position_ids None: 0..seq-1 in every row."""
    if position_ids is None:
      positions = self.position_embeddings.first_rows(input_ids.shape[-1])
    else:
      positions = self.position_embeddings(position_ids)
    x = self.word_embeddings(input_ids) + positions + self.token_type_embeddings(token_type_ids)
    x = self.layer_norm(x)
    return self.dropout(x, deterministic=deterministic)

  def attend(self, x: Array) -> Array:
    """Logits over the vocabulary from <float>[..., embed_size], tied to the word embeddings."""
    return self.word_embeddings.attend(x)


class SelfAttention(nn.Module):
  """Multi-head self-attention. Returns <float>[batch, seq, hidden], or with `output_attentions`
  (hidden, <float>[batch, heads, q, k] pre-softmax scores before masking)."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x, mask: AttentionMask, deterministic: bool, output_attentions: bool = False,
               keys=None):
    """`keys`: the states keys and values are computed from, when the queries `x` are only some
    of the positions (see `TransformerLayer`); None: `x` itself."""
    cfg = self.config
    keys = x if keys is None else keys
    heads = (cfg.num_attention_heads, cfg.head_dim)
    q = _dense(heads, ("embed", "heads", "kv"), "query", cfg)(x)
    k = _dense(heads, ("embed", "heads", "kv"), "key", cfg)(keys)
    v = _dense(heads, ("embed", "heads", "kv"), "value", cfg)(keys)
    rate = cfg.attention_probs_dropout_prob
    raw_scores = None
    if (deterministic or rate == 0.0) and not output_attentions:
      # No dropout inside the fused kernels (cuDNN's takes only a fixed seed), so they serve
      # inference and training without attention dropout; bertjax.models.kernels picks which.
      impl = attention_implementation(cfg, cfg.head_dim, q.dtype,
                                      per_query_mask=mask.keys.shape[2] > 1, q_len=q.shape[1],
                                      k_len=k.shape[1])
      if impl != "cudnn":  # lengths are what cuDNN takes; XLA reads the mask
        mask = AttentionMask(mask.keys)
      out = fused_attention(q, k, v, mask, impl, deterministic)
    else:
      drop = lambda p: Dropout(rate)(p, deterministic=deterministic)
      out, raw_scores = explicit_attention(q, k, v, mask.keys, drop)
    out = _dense(cfg.hidden_size, ("heads", "kv", "embed"), "output", cfg, axis=(-2, -1))(out)
    return (out, raw_scores) if output_attentions else out


def gather_positions(x: Array, positions: Array) -> Array:
  """<T>[batch, seq, ...], <int32>[batch, p] -> <T>[batch, p, ...]: the rows at `positions`."""
  index = positions.astype(jnp.int32).reshape(positions.shape + (1,) * (x.ndim - 2))
  if jnp.dtype(x.dtype).itemsize < 4:
    # Half precision: gathered from a float32 view, so the gradient's scatter-add (rows repeat:
    # unused prediction slots all point at position 0) runs in float32, not bfloat16.
    return jnp.take_along_axis(x.astype(jnp.float32), index, axis=1).astype(x.dtype)
  return jnp.take_along_axis(x, index, axis=1)


def last_layer_rows(cfg: ModelConfig, num_outputs: int, seq_len: int) -> int | None:
  """Rows the last layer computes when asked for `num_outputs` positions: those and [CLS], or
  None (every row: gathering is off, layers are scanned, or it would not save anything)."""
  if not cfg.gather_last_layer or cfg.scan_layers or num_outputs + 1 >= seq_len:
    return None
  return num_outputs + 1


class TransformerLayer(nn.Module):
  """Self-attention + feed-forward, each with a residual and LayerNorm (post-LN or pre-LN)."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x, mask, deterministic: bool, output_attentions: bool = False,
               query_positions=None):
    """<float>[batch, seq, hidden] -> the same, or with `output_attentions` (that, the layer's
    pre-softmax attention scores <float>[batch, heads, q, k]).

    `query_positions` <int32>[batch, p]: compute the layer's output only at those positions,
    <float>[batch, p, hidden]. Keys and values still come from every position, so each row is
    exactly what the full layer gives there; the queries, attention output, feed-forward and
    LayerNorms run on p rows instead of seq.
    """
    cfg = self.config
    if not isinstance(mask, AttentionMask):  # a boolean [batch, 1, q or 1, k] mask
      mask = AttentionMask(jnp.asarray(mask))
    keys = None
    if query_positions is not None:
      if output_attentions:
        fail("output_attentions needs every query position; call the layer without query_positions")
      keys = x
      x = gather_positions(x, query_positions)
      if mask.keys.shape[2] > 1:  # per-query masks (packed rows): keep the chosen queries' rows
        rows = query_positions[:, None, :, None].astype(jnp.int32)
        mask = mask.replace(keys=jnp.take_along_axis(mask.keys, rows, axis=2))
    act_names = ("act_batch", "act_len", "act_embed")
    drop = lambda y: Dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)
    attention = SelfAttention(cfg, name="attention")
    attn_ln = _layer_norm(cfg, "attention_layer_norm")
    out_ln = _layer_norm(cfg, "output_layer_norm")
    intermediate = _dense(cfg.intermediate_size, ("embed", "mlp"), "intermediate", cfg)
    output = _dense(cfg.hidden_size, ("mlp", "embed"), "output", cfg)
    # Rematerialized where the platform's kernels say so: the backward pass recomputes the
    # activation's internals from its input (one [tokens, intermediate] buffer less per layer).
    act = activation(cfg.hidden_act)
    if kernels.for_model(cfg).remat_activation:
      act = jax.checkpoint(act)
    scores = None

    def attend(y, y_keys):
      nonlocal scores
      if not output_attentions:
        return attention(y, mask, deterministic, False, y_keys)
      y, scores = attention(y, mask, deterministic, True)
      return y

    if cfg.pre_layer_norm:
      if keys is None:
        x = x + drop(attend(attn_ln(x), None))
      else:  # the query rows' normalized states are rows of the keys' ones
        normed_keys = attn_ln(keys)
        x = x + drop(attend(gather_positions(normed_keys, query_positions), normed_keys))
      x = nn.with_logical_constraint(x, act_names)
      h = nn.with_logical_constraint(act(intermediate(out_ln(x))), ("act_batch", "act_len", "act_mlp"))
      x = x + drop(output(h))
    else:
      x = attn_ln(x + drop(attend(x, keys)))
      x = nn.with_logical_constraint(x, act_names)
      h = nn.with_logical_constraint(act(intermediate(x)), ("act_batch", "act_len", "act_mlp"))
      x = out_ln(x + drop(output(h)))
    x = nn.with_logical_constraint(x, act_names)
    return (x, scores) if output_attentions else x


class _ScanBody(nn.Module):
  """One layer as a scan step: carry the hidden states, also emit them (for hidden_states)."""
  config: ModelConfig
  layer_cls: Any

  @nn.compact
  def __call__(self, x, mask, deterministic: bool):
    x = self.layer_cls(self.config, name="layer")(x, mask, deterministic, False)
    return x, x


class Encoder(nn.Module):
  """The encoder stack with embeddings and (optionally) the pooler.

  Call: input_ids, attention_mask, token_type_ids: <int32>[batch, seq]; segment_ids (packed rows:
  tokens attend only within their own example, 0 = padding) and position_ids optional.
  Returns an `EncoderOutput`.

  `shared_embeddings`, when given, is an `Embeddings` module owned by another model (ELECTRA's
  generator reads the discriminator's); its parameters then stay with their owner and this
  encoder has no `embeddings` subtree. None (the default) creates this encoder's own.
  """
  config: ModelConfig
  shared_embeddings: nn.Module | None = None

  def setup(self):
    cfg = self.config
    if self.shared_embeddings is not None:
      self.embeddings = self.shared_embeddings
    else:
      self.embeddings = Embeddings(cfg)
    if has_embedding_projection(cfg):
      self.embedding_projection = _dense(cfg.hidden_size, ("embed_in", "embed"), "embedding_projection", cfg)
    layer_cls = TransformerLayer
    if cfg.remat:
      policy = {"full": None,
                "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}[cfg.remat_policy]
      layer_cls = nn.remat(TransformerLayer, static_argnums=(3, 4), policy=policy)
    if cfg.scan_layers:
      self.scanned = nn.scan(
          _ScanBody, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
          in_axes=(nn.broadcast, nn.broadcast), length=cfg.num_hidden_layers,
          metadata_params={nn.PARTITION_NAME: "layers"})(cfg, layer_cls, name="layers")
    else:
      self.layers = [layer_cls(cfg, name=f"layer_{g}") for g in range(cfg.num_groups)]
    if cfg.pre_layer_norm:
      self.final_layer_norm = _layer_norm(cfg, "final_layer_norm")
    if cfg.use_pooler:
      self.pooler = _dense(cfg.hidden_size, ("embed", "embed_out"), "pooler", cfg)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, segment_ids=None,
               position_ids=None, output_positions=None, deterministic: bool = True,
               output_hidden_states: bool = False,
               output_attentions: bool = False) -> EncoderOutput:
    """`output_positions` <int32>[batch, p]: `last_hidden_state` holds only those positions,
    <float>[batch, p, hidden] (what pretraining heads read). With `model.gather_last_layer` the
    last layer then computes only them and [CLS] (for the pooler); the values are the same."""
    cfg = self.config
    input_ids = jnp.asarray(input_ids)
    if attention_mask is None:
      attention_mask = (segment_ids > 0) if segment_ids is not None else jnp.ones_like(input_ids)
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    if input_ids.shape[-1] > cfg.max_position_embeddings - cfg.position_offset:
      fail(f"sequences of {input_ids.shape[-1]} tokens exceed the model's "
           f"{cfg.max_position_embeddings - cfg.position_offset} positions; lower "
           "--config.max_seq_length or raise --config.model.max_position_embeddings")
    if position_ids is None and (segment_ids is not None or cfg.position_offset):
      position_ids = position_ids_for(cfg, input_ids, segment_ids)
    # position_ids None: positions 0..seq-1 in every row, a slice of the table.
    x = self.embeddings(input_ids, token_type_ids, position_ids, deterministic)
    if has_embedding_projection(cfg):
      x = self.embedding_projection(x)
    x = nn.with_logical_constraint(x, ("act_batch", "act_len", "act_embed"))
    mask = attention_mask_for(cfg, attention_mask, segment_ids)
    # The last layer at [CLS] and the output positions only. Not under scan (one body for every
    # layer), nor when every layer's full states or scores are asked for.
    last_positions = None
    if (output_positions is not None and not output_hidden_states and not output_attentions
        and last_layer_rows(cfg, output_positions.shape[1], input_ids.shape[1]) is not None):
      output_positions = jnp.asarray(output_positions, jnp.int32)
      last_positions = jnp.concatenate([jnp.zeros_like(output_positions[:, :1]), output_positions],
                                       axis=1)
    states, attentions = [x], []
    if cfg.scan_layers:
      if output_attentions:
        fail("output_attentions is not available with model.scan_layers; turn scanning off")
      x, stacked = self.scanned(x, mask, deterministic)
      states += [stacked[i] for i in range(cfg.num_hidden_layers)]
    for i in range(0 if cfg.scan_layers else cfg.num_hidden_layers):
      layer = self.layers[i * cfg.num_groups // cfg.num_hidden_layers]
      # Flags positional: remat marks them static by position.
      if output_attentions:
        x, scores = layer(x, mask, deterministic, True)
        attentions.append(scores)
      elif last_positions is not None and i == cfg.num_hidden_layers - 1:
        x = layer(x, mask, deterministic, False, last_positions)
      else:
        x = layer(x, mask, deterministic, False)
      states.append(x)
    if cfg.pre_layer_norm:
      x = self.final_layer_norm(x)
      states[-1] = x
    pooled = jnp.tanh(self.pooler(x[:, 0])) if cfg.use_pooler else None
    if last_positions is not None:
      x = x[:, 1:]
    elif output_positions is not None:
      x = gather_positions(x, output_positions)
    return EncoderOutput(last_hidden_state=x, pooler_output=pooled,
                         hidden_states=tuple(states) if output_hidden_states else None,
                         attentions=tuple(attentions) if output_attentions else None)

  def attend(self, x: Array) -> Array:
    return self.embeddings.attend(x)


def init_params(model: nn.Module, config: ModelConfig, rng: jax.Array, seq_len: int = 8) -> Any:
  """Unboxed float32 parameters of `model` (an Encoder or a model holding one)."""
  ids = jnp.zeros((1, seq_len), jnp.int32)
  variables = model.init(rng, ids)
  return nn.meta.unbox(variables["params"])
