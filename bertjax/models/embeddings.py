"""Word, position and token-type embeddings, the tables from the model's `Layers` (`nn.Embed`, or,
where the platform's kernels ask for it, `layers.Embed` reading the float32 tables)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models.config import ModelConfig
from bertjax.models.layers import Layered, Layers

Array = jax.Array


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


def first_rows(embed: nn.Module, n: int) -> Array:
  """Rows 0..n-1 of an `Embed` or `nn.Embed` as <dtype>[1, n, features]: the default positions,
  with no gather at all (the gradient a reduction over the batch, not a scatter)."""
  return embed.embedding[None, :n].astype(embed.dtype)


class Embeddings(Layered):
  """Word + position + token-type embeddings, LayerNorm and dropout, all of size embed_size."""
  config: ModelConfig
  layers: Layers | None = None

  def setup(self):
    cfg, L = self.config, self.layers
    self.word_embeddings = L.embed(cfg.vocab_size, cfg.embed_size, ("vocab", "embed"))
    self.position_embeddings = L.embed(cfg.max_position_embeddings, cfg.embed_size, (None, "embed"))
    self.token_type_embeddings = L.embed(cfg.type_vocab_size, cfg.embed_size, (None, "embed"),
                                         small=True)
    self.layer_norm = L.norm("layer_norm")
    self.dropout = L.dropout(cfg.hidden_dropout_prob)

  def __call__(self, input_ids, token_type_ids, position_ids, deterministic: bool):
    """position_ids None: 0..seq-1 in every row."""
    if position_ids is None:
      positions = first_rows(self.position_embeddings, input_ids.shape[-1])
    else:
      positions = self.position_embeddings(position_ids)
    x = self.word_embeddings(input_ids) + positions + self.token_type_embeddings(token_type_ids)
    x = self.layer_norm(x)
    return self.dropout(x, deterministic=deterministic)

  def attend(self, x: Array) -> Array:
    """Logits over the vocabulary from <float>[..., embed_size], tied to the word embeddings."""
    return self.word_embeddings.attend(x)
