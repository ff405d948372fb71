"""The BERT-family Transformer encoder in Flax Linen.

One module covers BERT, RoBERTa (position offset after padding), ALBERT (factorized embeddings,
cross-layer sharing) and ELECTRA (embedding projection), post-LN as published or pre-LN.
Weights carry logical axis names only (`vocab`, `embed`, `heads`, `kv`, `mlp`); the mapping of
those names to a device mesh lives in the experiment config (see `bertjax.runtime.sharding`).
Activations are constrained with `act_batch`, `act_len`, `act_embed`, ... names.
"""

from __future__ import annotations

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.core.errors import fail
from bertjax.models import kernels
from bertjax.models.attention import (AttentionMask, attend, attention_mask_for, choose,
                                      explicit_attention, flash_dropout_attention, flash_segments,
                                      round_up)
from bertjax.models.config import ModelConfig
from bertjax.models.embeddings import Embeddings, position_ids_for
from bertjax.models.layers import Layered, Layers, rematerialized

Array = jax.Array


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


class SelfAttention(Layered):
  """Multi-head self-attention. Returns <float>[batch, seq, hidden], or with `output_attentions`
  (hidden, <float>[batch, heads, q, k] pre-softmax scores before masking).

  `num_heads`: this layer's heads (a pruned layer has fewer; None: config.num_attention_heads),
  each of config.head_dim. A `head_mask` <float>[heads] parameter, when the caller's params hold
  one (bertjax.models.pruning.with_head_masks; never created by init), multiplies each head's
  output before the output projection: Michel et al.'s xi_h.
  """
  config: ModelConfig
  num_heads: int | None = None
  layers: Layers | None = None

  @nn.compact
  def __call__(self, x, mask: AttentionMask, deterministic: bool, output_attentions: bool = False,
               keys=None):
    """`keys`: the states keys and values are computed from, when the queries `x` are only some
    of the positions (see `TransformerLayer`); None: `x` itself."""
    cfg, L = self.config, self.layers
    keys = x if keys is None else keys
    heads = (self.num_heads or cfg.num_attention_heads, cfg.head_dim)
    project = lambda name, y: L.projection(heads, ("embed", "heads", "kv"), name,
                                           in_shape=y.shape[-1:])(y)
    q, k, v = project("query", x), project("key", keys), project("value", keys)
    rate = cfg.attention_probs_dropout_prob
    raw_scores = None
    if (deterministic or rate == 0.0) and not output_attentions:
      # No dropout inside the fused kernels (cuDNN's takes only a fixed seed; splash has none),
      # so they serve inference and training without attention dropout; the kernel set picks which.
      kernel = choose(L.kernels, cfg.head_dim, q.dtype, q_len=q.shape[1], k_len=k.shape[1],
                      tokens=mask.tokens is not None)
      out = attend(kernel, q, k, v, mask, deterministic, L.kernels.row_multiple)
    elif (not output_attentions and rate < 1.0
          and kernels.attention_dropout_path(L.attention_dropout) == "pallas"
          and (segments := flash_segments(mask, q.shape[1])) is not None):
      # Softmax and dropout inside the flash kernel; its mask is hashed from this layer's key.
      out = flash_dropout_attention(q, k, v, segments, rate, self.make_rng("dropout"))
    else:
      drop = lambda p: L.dropout(rate)(p, deterministic=deterministic)
      out, raw_scores = explicit_attention(q, k, v, mask.keys, drop)
    if self.has_variable("params", "head_mask"):
      out = out * self.get_variable("params", "head_mask").astype(out.dtype)[:, None]
    # A fused residual tail after it adds the output projection's bias inside its kernel.
    out = L.projection(cfg.hidden_size, ("heads", "kv", "embed"), "output", axis=(-2, -1),
                       in_shape=out.shape[-2:], add_bias=L.residual is None)(out)
    return (out, raw_scores) if output_attentions else out


def last_layer_rows(cfg: ModelConfig, num_outputs: int, seq_len: int,
                    row_multiple: int) -> int | None:
  """Rows the last layer computes when asked for `num_outputs` positions: those and [CLS], padded
  with more [CLS] rows up to the kernel set's `row_multiple` (cuDNN refuses an odd query length in
  training), or None (every row: gathering is off, layers are scanned, or it would not save
  anything)."""
  rows = round_up(num_outputs + 1, row_multiple)
  if not cfg.gather_last_layer or cfg.scan_layers or rows >= seq_len:
    return None
  return rows


class TransformerLayer(Layered):
  """Self-attention + feed-forward, each with a residual and LayerNorm (post-LN or pre-LN).
  `num_heads`: this layer's attention heads (None: config.num_attention_heads)."""
  config: ModelConfig
  num_heads: int | None = None
  layers: Layers | None = None

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
    cfg, L = self.config, self.layers
    if not isinstance(mask, AttentionMask):  # a boolean [batch, 1, q or 1, k] mask
      mask = AttentionMask(jnp.asarray(mask))
    keys = None
    if query_positions is not None:
      if output_attentions:
        fail("output_attentions needs every query position; call the layer without query_positions")
      keys = x
      x = L.gather(x, query_positions)
      if mask.keys.shape[2] > 1:  # per-query masks (packed rows): keep the chosen queries' rows
        rows = query_positions[:, None, :, None].astype(jnp.int32)
        mask = mask.replace(keys=jnp.take_along_axis(mask.keys, rows, axis=2))
        if mask.q_segments is not None:
          mask = mask.replace(q_segments=jnp.take_along_axis(
              mask.q_segments, query_positions.astype(jnp.int32), axis=1))
    act_names = ("act_batch", "act_len", "act_embed")
    drop = lambda y: L.dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)
    attention = SelfAttention(cfg, self.num_heads, L, name="attention")
    fused = L.residual is not None  # post-LN's residual, dropout, add and LayerNorm in one kernel
    norm = L.residual or L.norm
    attn_ln, out_ln = norm(name="attention_layer_norm"), norm(name="output_layer_norm")
    intermediate = L.projection(cfg.intermediate_size, ("embed", "mlp"), "intermediate")
    output = L.projection(cfg.hidden_size, ("mlp", "embed"), "output", add_bias=not fused)
    act = L.mlp_activation(cfg.hidden_act)
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
        x = x + drop(attend(L.gather(normed_keys, query_positions), normed_keys))
      x = nn.with_logical_constraint(x, act_names)
      h = nn.with_logical_constraint(act(intermediate(out_ln(x))), ("act_batch", "act_len", "act_mlp"))
      x = x + drop(output(h))
    elif fused:  # the projection's bias, dropout, residual add and LayerNorm in one kernel each
      bias = lambda dense_params: nn.meta.unbox(dense_params["bias"])  # boxed in init
      y = attend(x, keys)
      x = attn_ln(x, y, deterministic, bias(attention.variables["params"]["output"]))
      x = nn.with_logical_constraint(x, act_names)
      h = nn.with_logical_constraint(act(intermediate(x)), ("act_batch", "act_len", "act_mlp"))
      y = output(h)
      x = out_ln(x, y, deterministic, bias(output.variables["params"]))
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
  layers: Layers

  @nn.compact
  def __call__(self, x, mask, deterministic: bool):
    # Every scanned layer has the same head count (ModelConfig refuses pruned_heads otherwise).
    x = self.layer_cls(self.config, self.config.layer_heads(0), self.layers, name="layer")(
        x, mask, deterministic, False)
    return x, x


class Encoder(Layered):
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
  layers: Layers | None = None

  def setup(self):
    cfg, L = self.config, self.layers
    if cfg.architecture == "modernbert":
      fail("this model is built from the BERT family's encoder, which ModernBERT is not; "
           "train ModernBERT with --config.objective=mlm (bertjax.models.modernbert)")
    if self.shared_embeddings is not None:
      self.embeddings = self.shared_embeddings
    else:
      self.embeddings = Embeddings(cfg, L)
    if has_embedding_projection(cfg):
      self.embedding_projection = L.dense(cfg.hidden_size, ("embed_in", "embed"),
                                          "embedding_projection")
    layer_cls = rematerialized(TransformerLayer, cfg, static_argnums=(3, 4))
    if cfg.scan_layers:
      self.scanned = nn.scan(
          _ScanBody, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
          in_axes=(nn.broadcast, nn.broadcast), length=cfg.num_hidden_layers,
          metadata_params={nn.PARTITION_NAME: "layers"})(cfg, layer_cls, L, name="layers")
    else:
      self.stack = [layer_cls(cfg, cfg.layer_heads(g) if cfg.pruned_heads else None, L,
                              name=f"layer_{g}") for g in range(cfg.num_groups)]
    if cfg.pre_layer_norm:
      self.final_layer_norm = L.norm("final_layer_norm")
    if cfg.use_pooler:
      self.pooler = L.dense(cfg.hidden_size, ("embed", "embed_out"), "pooler")

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
    # A guard on the caller's arrays (the embed tool, direct Python use), not on the run's
    # settings: a run's max_seq_length was checked against the positions by its plan.
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
    mask = attention_mask_for(self.layers.kernels, attention_mask, segment_ids)
    # The last layer at [CLS] and the output positions only. Not under scan (one body for every
    # layer), nor when every layer's full states or scores are asked for.
    last_positions = None
    rows = (None if output_positions is None or output_hidden_states or output_attentions
            else last_layer_rows(cfg, output_positions.shape[1], input_ids.shape[1],
                                 self.layers.kernels.row_multiple))
    if rows is not None:  # [CLS], the output positions, [CLS] again up to `rows`
      output_positions = jnp.asarray(output_positions, jnp.int32)
      cls = jnp.zeros_like(output_positions[:, :1])
      last_positions = jnp.concatenate(
          [cls, output_positions] + [cls] * (rows - 1 - output_positions.shape[1]), axis=1)
    states, attentions = [x], []
    if cfg.scan_layers:
      if output_attentions:
        fail("output_attentions is not available with model.scan_layers; turn scanning off")
      x, stacked = self.scanned(x, mask, deterministic)
      states += [stacked[i] for i in range(cfg.num_hidden_layers)]
    for i in range(0 if cfg.scan_layers else cfg.num_hidden_layers):
      layer = self.stack[i * cfg.num_groups // cfg.num_hidden_layers]
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
      x = x[:, 1:1 + output_positions.shape[1]]
    elif output_positions is not None:
      x = self.layers.gather(x, output_positions)
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
