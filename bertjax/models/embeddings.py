"""Word, position and token-type embeddings: `nn.Embed`, or, where the platform's kernels ask for
it (`Kernels.float32_lookup`, `Kernels.one_hot_rows`), `Embed` reading the float32 tables."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import kernels
from bertjax.models.config import ModelConfig
from bertjax.models.dropout import dropout_layer
from bertjax.models.layers import make_layer_norm, dense_init

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


def embed_layer(cfg: ModelConfig, num_embeddings: int, features: int,
                names: tuple[str | None, str | None], one_hot_rows: int = 0,
                name: str | None = None) -> nn.Module:
  """`Embed` where the kernels ask for the float32 lookup or (`one_hot_rows`, a table of at most
  that many rows) the one-hot product; else `nn.Embed`. The same `embedding` parameter."""
  if kernels.for_model(cfg).float32_lookup or num_embeddings <= one_hot_rows:
    return Embed(num_embeddings, features, names, cfg.compute_dtype, one_hot_rows, name=name)
  return nn.Embed(num_embeddings, features, dtype=cfg.compute_dtype, param_dtype=jnp.float32,
                  embedding_init=nn.with_logical_partitioning(dense_init(), names), name=name)


def first_rows(embed: nn.Module, n: int) -> Array:
  """Rows 0..n-1 of an `Embed` or `nn.Embed` as <dtype>[1, n, features]: the default positions,
  with no gather at all (the gradient a reduction over the batch, not a scatter)."""
  return embed.embedding[None, :n].astype(embed.dtype)


class Embeddings(nn.Module):
  """Word + position + token-type embeddings, LayerNorm and dropout, all of size embed_size."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    one_hot = kernels.for_model(cfg).one_hot_rows
    embed = lambda n, names, **kw: embed_layer(cfg, n, cfg.embed_size, names, **kw)
    self.word_embeddings = embed(cfg.vocab_size, ("vocab", "embed"))
    self.position_embeddings = embed(cfg.max_position_embeddings, (None, "embed"))
    self.token_type_embeddings = embed(cfg.type_vocab_size, (None, "embed"), one_hot_rows=one_hot)
    self.layer_norm = make_layer_norm(cfg, "layer_norm")
    self.dropout = dropout_layer(cfg.hidden_dropout_prob, kernels.dropout_for_model(cfg))

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
