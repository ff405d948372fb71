"""ModernBERT (Warner et al., 2024) in stock Flax Linen layers: `model.architecture="modernbert"`.

What differs from the BERT family's encoder (bertjax.models.encoder) lives here; the attention
kernels, the mask forms and the output record are shared. Token embeddings with a LayerNorm and
no position table; rotary position embeddings (rotate-half form) with one base for the global
layers (`global_rope_theta`) and another for the local ones (`local_rope_theta`); pre-LayerNorm
blocks (layer 0 has no attention norm: the embeddings' norm precedes it) and a final norm; a
fused q/k/v projection; a GeGLU feed-forward; biases only where the config asks for them.
Layer i attends to every position when i % global_attn_every_n_layers == 0, else to the
`local_attention // 2` positions on either side. The parameter names follow transformers'
`ModernBertModel` (`Wqkv`, `Wo`, `Wi`, `attn_norm`, `mlp_norm`, `final_norm`), so a converted
checkpoint maps name for name (bertjax.convert.names.modernbert_entries).

`bertjax.models.architectures` finds this module by the architecture's name: `Encoder`,
`MLMHead`, `PairHead` (refused), `SequenceHead`, `TokenHead` and `pool` below.

Its settings are ModernBertConfig's names in `ModelConfig`; of the BERT family's own, it reads
the sizes, `pad_token_id`, `dtype`, `remat`/`remat_policy` and `kernels` (which attention the
global layers and, on TPUs, the local ones take), and leaves `hidden_act`, `layer_norm_eps`,
`hidden_dropout_prob`, `attention_probs_dropout_prob`, `type_vocab_size`, `use_pooler`,
`mlm_head_act`, `dropout_impl` and `gather_last_layer` unread (ModelConfig refuses the BERT-only
`num_hidden_groups` and `scan_layers`). `pruned_heads` removes heads from `Wqkv` and `Wo`
(bertjax.models.pruning); `embedding_size` gives a narrower token table and a projection.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.core.errors import fail
from bertjax.models import kernels
from bertjax.models.attention import (AttentionMask, attend, attention_mask_for, choose,
                                      explicit_attention)
from bertjax.models.config import ModelConfig
from bertjax.models.embeddings import position_ids_for
from bertjax.models.encoder import EncoderOutput
from bertjax.models.flash_attention import dropout_seed, flash_attention
from bertjax.models.layers import (Layered, Layers, activation, add_vocab_bias, gather_positions,
                                   rematerialized)

Array = jax.Array


def truncated_init(cfg: ModelConfig, std: float | None = None):
  """transformers' ModernBERT init: normal(0, std) truncated at initializer_cutoff_factor stds
  (std: initializer_range unless given)."""
  std = cfg.initializer_range if std is None else std
  cut = cfg.initializer_cutoff_factor

  def init(key, shape, dtype=jnp.float32):
    return std * jax.random.truncated_normal(key, -cut, cut, shape, dtype)
  return init


def out_std(cfg: ModelConfig) -> float:
  """The init std of the layers writing into the residual stream (attention and GeGLU `Wo`)."""
  return cfg.initializer_range / math.sqrt(2.0 * cfg.num_hidden_layers)


def _dense(cfg: ModelConfig, features: int, names, name: str, use_bias: bool, std=None):
  return nn.Dense(features, use_bias=use_bias, dtype=cfg.compute_dtype, param_dtype=jnp.float32,
                  kernel_init=nn.with_logical_partitioning(truncated_init(cfg, std), names),
                  bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                         names[-1:]), name=name)


def _einsum(cfg: ModelConfig, equation: str, shape, names, name: str, use_bias: bool,
            std=None, bias_names=None):
  """A projection with a multi-axis kernel (q/k/v by head, GeGLU's two halves). nn.Einsum creates
  the kernel in that shape, so its logical names hold at init (nn.DenseGeneral initializes a
  flattened kernel, which a sharding constraint of the full rank refuses under a mesh)."""
  return nn.Einsum(shape, equation, use_bias=use_bias, dtype=cfg.compute_dtype,
                   param_dtype=jnp.float32,
                   kernel_init=nn.with_logical_partitioning(truncated_init(cfg, std), names),
                   bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                          bias_names), name=name)


def _norm(cfg: ModelConfig, layers: Layers, name: str) -> nn.Module:
  """The set's LayerNorm with ModernBERT's epsilon and optional bias; two-pass variance, as
  PyTorch computes it. With `Kernels.layer_norm_vjp` (BERT's written-out backward pass): on a
  2-core CPU the 22-layer modernbert-base step (seq 512, batch 2) took 6.6 s with it and 15.7 s
  with `nn.LayerNorm`, whose autodiff'd residual gradient XLA:CPU recomputed inside every layer's
  weight-gradient copies, a cost growing with the square of the depth (PERFORMANCE.md)."""
  return layers.norm(name, epsilon=cfg.norm_eps, use_bias=cfg.norm_bias)


def rope_tables(positions: Array, head_dim: int, theta: float, dtype) -> tuple[Array, Array]:
  """(cos, sin) <dtype>[batch, seq, head_dim] of the rotary embedding at <int>[batch, seq]
  `positions`, computed in float32 (each frequency twice: the rotate-half layout)."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  freqs = positions.astype(jnp.float32)[..., None] * inv_freq
  angles = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
  """<T>[batch, seq, heads, head_dim] rotated: x * cos + rotate_half(x) * sin."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]


def window_mask(keys: Array, window: int) -> Array:
  """<bool>[batch, 1, q, k]: `keys` (<bool>[batch, 1, 1 or q, k], padding and packed rows) and
  |i - j| <= window // 2, ModernBERT's symmetric local window. Built once per forward pass and
  read by every local layer."""
  n = keys.shape[-1]
  distance = jnp.abs(jnp.arange(n)[:, None] - jnp.arange(n)[None, :])
  return keys & (distance <= window // 2)[None, None]


def banded_attention(q: Array, k: Array, v: Array, q_ids: Array, kv_ids: Array,
                     half: int) -> Array:
  """softmax(q.k / sqrt(d)) v where query i sees key j when |i - j| <= half and q_ids[i] ==
  kv_ids[j], computed band by band: the rows in chunks of `half`, each chunk's queries against
  the keys of its own chunk and its two neighbours. Scores are <float>[batch, heads, seq, 3 *
  half], not [.., seq, seq]; the window is one static [half, 3 * half] mask for every chunk.

  q, k, v: <T>[batch, seq, heads, head_dim]; q_ids, kv_ids: <int32>[batch, seq] (unpacked rows:
  every query 1, real keys 1, padding 0; packed: the segment ids, -1 at padding keys). At each
  query that sees some key, what `explicit_attention` gives with `window_mask`'s mask; a query
  that sees none (padding far from any real token) averages its band's values instead of the
  row's.
  """
  batch, seq, heads, head_dim = q.shape
  c = half
  n = -(-seq // c)
  pad = n * c - seq
  along = lambda x, lo, hi, value=0: jnp.pad(x, ((0, 0), (lo, hi)) + ((0, 0),) * (x.ndim - 2),
                                             constant_values=value)

  def band(x, value=0):  # [batch, seq, ...] -> [batch, n, 3c, ...]: chunks i-1, i, i+1
    chunks = along(x, c, c + pad, value).reshape((batch, n + 2, c) + x.shape[2:])
    return jnp.concatenate([chunks[:, :n], chunks[:, 1:n + 1], chunks[:, 2:]], axis=2)
  queries = along(q, 0, pad).reshape(batch, n, c, heads, head_dim)
  scores = jnp.einsum("bnqhd,bnkhd->bhnqk", queries, band(k)) / jnp.sqrt(head_dim).astype(q.dtype)
  # Query a of chunk i sits at i*c + a, band key j at (i-1)*c + j: their distance is |a + c - j|.
  near = np.abs(np.arange(c)[:, None] + c - np.arange(3 * c)[None, :]) <= half
  q_chunks = along(q_ids, 0, pad, -3).reshape(batch, n, c)
  same = q_chunks[:, :, :, None] == band(kv_ids, -2)[:, :, None, :]  # outside the row: -2
  scores = jnp.where(near & same[:, None], scores, jnp.finfo(scores.dtype).min)
  probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype)
  out = jnp.einsum("bhnqk,bnkhd->bnqhd", probs, band(v))
  return out.reshape(batch, n * c, heads, head_dim)[:, :seq]


def local_flash_attention(q: Array, k: Array, v: Array, mask: AttentionMask, half: int,
                          rate: float, make_rng) -> Array:
  """A local layer's attention in the Pallas flash kernel with its window (`Kernels.
  pallas_local_window`): query i sees key j when |i - j| <= half and their ids are equal (the
  mask's segment ids; unpacked rows: every query 1, real keys 1, padding 0), visiting only the key
  blocks around each query block. Dropout at `rate` > 0 is drawn in the kernel from the layer's
  'dropout' key (`make_rng`). Interpreted off GPUs. q, k, v: <T>[batch, seq, heads, head_dim]."""
  q_ids = mask.q_segments if mask.q_segments is not None else jnp.ones_like(mask.kv_segments)
  seed = dropout_seed(make_rng("dropout")) if rate > 0.0 else None
  return flash_attention(q, k, v, segment_ids=(q_ids, mask.kv_segments), dropout_rate=rate,
                         seed=seed, window=half, interpret=kernels.triton_interpreted())


class ModernBertAttention(Layered):
  """Fused q/k/v projection, rotary embedding, attention, output projection.

  `local`: a sliding-window layer. With `Kernels.pallas_local_window` (off in every set) its
  window runs in the Pallas flash kernel (`local_flash_attention`). On TPUs (the splash kernel
  set) it is splash's own LocalMask; elsewhere it goes through XLA, jax's cuDNN path taking only
  a left window unless causal while ModernBERT's window is symmetric: band by band
  (`banded_attention`) when rows are longer than its three chunks (fewer score entries: seq x 3 *
  (local_attention // 2) instead of seq x seq; its speed on a device is unmeasured), else with
  the full window mask (`window_mask`, built once per forward pass and shared by the local
  layers). Global layers take the platform's fused kernel (cuDNN, splash or XLA), as BERT's
  layers do.
  """
  config: ModelConfig
  local: bool
  num_heads: int | None = None
  layers: Layers | None = None

  @nn.compact
  def __call__(self, x, mask: AttentionMask, cos, sin, deterministic: bool,
               output_attentions: bool = False):
    """<float>[batch, seq, hidden] -> the same (and the pre-softmax scores <float>[batch, heads,
    q, k] with `output_attentions`). `num_heads`: this layer's heads (fewer when pruned; None:
    num_attention_heads), each of head_dim. A `head_mask` <float>[heads] in the caller's params
    (bertjax.models.pruning.with_head_masks) multiplies each head's output before `Wo`."""
    cfg, L = self.config, self.layers
    heads, hidden = (self.num_heads or cfg.num_attention_heads, cfg.head_dim), cfg.hidden_size
    qkv = _einsum(cfg, "bse,ethd->bsthd", (hidden, 3) + heads, ("embed", None, "heads", "kv"),
                  "Wqkv", cfg.attention_bias, bias_names=(None, "heads", "kv"))(x)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    rate, scores = cfg.attention_dropout, None
    if self.local and L.kernels.pallas_local_window and not output_attentions:
      out = local_flash_attention(q, k, v, mask, cfg.local_attention // 2,
                                  0.0 if deterministic else rate, self.make_rng)
    elif (deterministic or rate == 0.0) and not output_attentions:
      kernel = choose(L.kernels, cfg.head_dim, q.dtype, q_len=q.shape[1], k_len=k.shape[1],
                      tokens=mask.tokens is not None)
      if self.local and kernel.windowed:  # the kernel's own window (splash's LocalMask)
        out = attend(kernel, q, k, v, mask, deterministic, L.kernels.row_multiple,
                     window=cfg.local_attention // 2)
      elif self.local and 3 * (cfg.local_attention // 2) < q.shape[1]:  # fewer scores by band
        q_ids = mask.q_segments if mask.q_segments is not None else jnp.ones_like(mask.kv_segments)
        out = banded_attention(q, k, v, q_ids, mask.kv_segments, cfg.local_attention // 2)
      elif self.local:  # one select on the shared mask (dot_product_attention adds ops on it)
        out = explicit_attention(q, k, v, mask.keys, lambda p: p)[0]
      else:
        out = attend(kernel, q, k, v, mask, deterministic, L.kernels.row_multiple)
    else:
      drop = lambda p: nn.Dropout(rate)(p, deterministic=deterministic)
      out, scores = explicit_attention(q, k, v, mask.keys, drop)
    if self.has_variable("params", "head_mask"):
      out = out * self.get_variable("params", "head_mask").astype(out.dtype)[:, None]
    out = _einsum(cfg, "bshd,hde->bse", heads + (hidden,), ("heads", "kv", "embed"), "Wo",
                  cfg.attention_bias, out_std(cfg), bias_names=("embed",))(out)
    out = nn.Dropout(rate)(out, deterministic=deterministic)
    return (out, scores) if output_attentions else out


class ModernBertMLP(nn.Module):
  """GeGLU: Wi projects to 2 x intermediate (input, gate); act(input) * gate; Wo projects back."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x, deterministic: bool):
    cfg = self.config
    h = _einsum(cfg, "bse,etm->bstm", (cfg.hidden_size, 2, cfg.intermediate_size),
                ("embed", None, "mlp"), "Wi", cfg.mlp_bias, bias_names=(None, "mlp"))(x)
    h = activation(cfg.hidden_activation)(h[:, :, 0]) * h[:, :, 1]
    h = nn.with_logical_constraint(h, ("act_batch", "act_len", "act_mlp"))
    h = nn.Dropout(cfg.mlp_dropout)(h, deterministic=deterministic)
    return _dense(cfg, cfg.hidden_size, ("mlp", "embed"), "Wo", cfg.mlp_bias, out_std(cfg))(h)


class ModernBertLayer(Layered):
  """Pre-LN block: x + attn(attn_norm(x)), then x + mlp(mlp_norm(x)). Layer 0 has no attn_norm
  (its input is already normalized by the embeddings' norm), as in transformers."""
  config: ModelConfig
  layer_id: int
  layers: Layers | None = None

  @nn.compact
  def __call__(self, x, mask: AttentionMask, cos, sin, deterministic: bool,
               output_attentions: bool = False):
    cfg, L = self.config, self.layers
    local = not cfg.is_global_layer(self.layer_id)
    h = x if self.layer_id == 0 else _norm(cfg, L, "attn_norm")(x)
    out = ModernBertAttention(cfg, local, cfg.layer_heads(self.layer_id), L, name="attn")(
        h, mask, cos, sin, deterministic, output_attentions)
    out, scores = out if output_attentions else (out, None)
    x = nn.with_logical_constraint(x + out, ("act_batch", "act_len", "act_embed"))
    x = x + ModernBertMLP(cfg, name="mlp")(_norm(cfg, L, "mlp_norm")(x), deterministic)
    x = nn.with_logical_constraint(x, ("act_batch", "act_len", "act_embed"))
    return (x, scores) if output_attentions else x


class ModernBertEmbeddings(Layered):
  """Token embeddings, LayerNorm, dropout; no position or token-type table. The table is
  `embed_size` wide (the hidden size unless `embedding_size` is set: ELECTRA's generator reads
  its discriminator's table)."""
  config: ModelConfig
  layers: Layers | None = None

  def setup(self):
    cfg = self.config
    # Looked up on the float32 table and cast afterwards: the gradient's scatter-add stays in
    # float32 (see bertjax.models.layers.lookup).
    self.tok_embeddings = nn.Embed(
        cfg.vocab_size, cfg.embed_size, dtype=jnp.float32, param_dtype=jnp.float32,
        embedding_init=nn.with_logical_partitioning(truncated_init(cfg), ("vocab", "embed")))
    self.norm = _norm(cfg, self.layers, "norm")
    self.drop = nn.Dropout(cfg.embedding_dropout)

  def __call__(self, input_ids, deterministic: bool):
    x = self.tok_embeddings(input_ids).astype(self.config.compute_dtype)
    return self.drop(self.norm(x), deterministic=deterministic)

  def attend(self, x: Array) -> Array:
    """x @ table.T in the compute dtype: the tied decoder's logits."""
    dtype = self.config.compute_dtype
    return x.astype(dtype) @ self.tok_embeddings.embedding.astype(dtype).T


class ModernBertEncoder(Layered):
  """Embeddings, the layer stack and the final norm. Called as `Encoder` is (token_type_ids are
  accepted and ignored: ModernBERT has none); returns an `EncoderOutput` without a pooled output.
  `hidden_states` (when asked for): the embeddings' output, then each layer's, the last after
  the final norm (as `Encoder` with pre-LN; transformers' last entry is before it).

  `shared_embeddings`, when given, is a `ModernBertEmbeddings` owned by another model (ELECTRA's
  generator reads the discriminator's), as for `Encoder`; with `embedding_size` set, an
  `embedding_projection` maps the table's width onto this encoder's hidden size."""
  config: ModelConfig
  shared_embeddings: nn.Module | None = None
  layers: Layers | None = None

  def setup(self):
    cfg, L = self.config, self.layers
    self.embeddings = (self.shared_embeddings if self.shared_embeddings is not None
                       else ModernBertEmbeddings(cfg, L))
    if cfg.embed_size != cfg.hidden_size:
      self.embedding_projection = _dense(cfg, cfg.hidden_size, ("embed_in", "embed"),
                                         "embedding_projection", True)
    layer_cls = rematerialized(ModernBertLayer, cfg, static_argnums=(5, 6))
    self.stack = [layer_cls(cfg, i, L, name=f"layer_{i}") for i in range(cfg.num_hidden_layers)]
    self.final_norm = _norm(cfg, L, "final_norm")

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, segment_ids=None,
               position_ids=None, output_positions=None, deterministic: bool = True,
               output_hidden_states: bool = False,
               output_attentions: bool = False) -> EncoderOutput:
    """input_ids, attention_mask <int32>[batch, seq]; segment_ids (packed rows, 0 = padding) and
    position_ids optional (positions restart in each packed example). `output_positions`
    <int32>[batch, p]: `last_hidden_state` holds only those rows."""
    del token_type_ids
    cfg = self.config
    input_ids = jnp.asarray(input_ids)
    if attention_mask is None:
      attention_mask = (segment_ids > 0) if segment_ids is not None else jnp.ones_like(input_ids)
    if position_ids is None:
      position_ids = position_ids_for(cfg, input_ids, segment_ids)
    x = self.embeddings(input_ids, deterministic)
    if cfg.embed_size != cfg.hidden_size:
      x = self.embedding_projection(x)
    x = nn.with_logical_constraint(x, ("act_batch", "act_len", "act_embed"))
    global_mask = attention_mask_for(self.layers.kernels, attention_mask, segment_ids)
    # The global mask's other forms (tokens and segment ids) stay: splash reads them. The full
    # window mask serves short rows and the explicit path (dropout, scores); longer rows take
    # `banded_attention`, which reads the key ids (unpacked rows: 1 at real tokens, 0 padding).
    local_mask = global_mask.replace(keys=window_mask(global_mask.keys, cfg.local_attention))
    if local_mask.kv_segments is None:
      local_mask = local_mask.replace(kv_segments=jnp.asarray(attention_mask).astype(jnp.int32))
    dtype = cfg.compute_dtype
    rope = {False: rope_tables(position_ids, cfg.head_dim, cfg.global_rope_theta, dtype),
            True: rope_tables(position_ids, cfg.head_dim, cfg.local_rope_theta, dtype)}
    states, attentions = [x], []
    for i, layer in enumerate(self.stack):
      local = not cfg.is_global_layer(i)
      # Flags positional: remat marks them static by position.
      out = layer(x, local_mask if local else global_mask, *rope[local], deterministic,
                  output_attentions)
      if output_attentions:
        out, scores = out
        attentions.append(scores)
      x = out
      states.append(x)
    x = self.final_norm(x)
    states[-1] = x
    if output_positions is not None:
      x = gather_positions(x, output_positions)
    return EncoderOutput(last_hidden_state=x,
                         hidden_states=tuple(states) if output_hidden_states else None,
                         attentions=tuple(attentions) if output_attentions else None)

  def attend(self, x: Array) -> Array:
    return self.embeddings.attend(x)


class ModernBertMLMHead(Layered):
  """transformers' ModernBertPredictionHead (dense, classifier_activation, norm) and the decoder
  tied to the token embeddings, with its own bias when `decoder_bias`. Returns float32 logits
  <float32>[..., vocab]."""
  config: ModelConfig
  layers: Layers | None = None

  @nn.compact
  def __call__(self, x, encoder):
    cfg = self.config
    # Ends in the table's width (the hidden size unless `embedding_size` is set).
    x = _dense(cfg, cfg.embed_size, ("embed", "embed_out"), "dense", cfg.classifier_bias,
               out_std(cfg))(x)
    x = _norm(cfg, self.layers, "norm")(activation(cfg.classifier_activation)(x))
    logits = encoder.attend(x).astype(jnp.float32)
    if not cfg.decoder_bias:
      return logits
    init = nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",))
    bias = self.param("bias", init, (cfg.vocab_size,), jnp.float32)
    return add_vocab_bias(logits, bias)


class ModernBertTaskHead(Layered):
  """The fine-tuning head of transformers' ModernBertFor{SequenceClassification,
  TokenClassification,QuestionAnswering}: ModernBertPredictionHead (`dense`, classifier_activation,
  `norm`), dropout `classifier_dropout`, then the `classifier` dense with a bias. Sequence tasks
  pool before it (`pool_for_sequence`); token tasks and QA apply it at every position.

  Call: <float>[..., hidden] -> <float32>[..., num_labels].
  """
  config: ModelConfig
  num_labels: int
  layers: Layers | None = None

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    cfg = self.config
    x = _dense(cfg, cfg.hidden_size, ("embed", "embed_out"), "dense", cfg.classifier_bias,
               out_std(cfg))(x)
    x = _norm(cfg, self.layers, "norm")(activation(cfg.classifier_activation)(x))
    x = nn.Dropout(cfg.classifier_dropout)(x, deterministic=deterministic)
    return _dense(cfg, self.num_labels, ("embed", None), "classifier", True,
                  cfg.hidden_size ** -0.5)(x).astype(jnp.float32)


def pool_for_sequence(cfg: ModelConfig, hidden: Array, attention_mask: Array) -> Array:
  """<float>[batch, seq, hidden] -> [batch, hidden] as `classifier_pooling` says: "cls" the first
  position, "mean" the mean over the positions `attention_mask` keeps."""
  if cfg.classifier_pooling == "cls":
    return hidden[:, 0]
  mask = jnp.asarray(attention_mask).astype(hidden.dtype)[..., None]
  return (hidden * mask).sum(axis=1) / mask.sum(axis=1)


def refuse_pair_head(cfg: ModelConfig) -> None:
  """NSP and SOP read token types and a pooled [CLS]; ModernBERT has neither."""
  if cfg.architecture == "modernbert":
    fail("ModernBERT has no token types nor pooler, so no NSP/SOP head; use --config.objective=mlm")


def pool(cfg: ModelConfig, out: EncoderOutput, attention_mask: Array) -> Array:
  """A sequence task's input from the encoder's output: `pool_for_sequence`."""
  return pool_for_sequence(cfg, out.last_hidden_state, attention_mask)


def PairHead(config: ModelConfig, layers: Layers | None = None):  # pylint: disable=invalid-name
  """ModernBERT's NSP/SOP head: none, refused (`refuse_pair_head`)."""
  del layers
  refuse_pair_head(config)


# The architecture's encoder and heads, as bertjax.models.architectures finds them.
Encoder = ModernBertEncoder
MLMHead = ModernBertMLMHead
SequenceHead = TokenHead = ModernBertTaskHead
