"""Output heads placed on the encoder: pretraining (MLM, NSP/SOP, RTD, SBO) and fine-tuning.

The MLM head runs only on gathered masked positions (`gather_positions`), never on every
position of every row: with a 30k vocabulary that projection dominates a small model's step.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import kernels
from bertjax.models.config import ModelConfig
from bertjax.models.dropout import dropout_layer
from bertjax.models.embeddings import embed_layer
from bertjax.models.encoder import gather_positions
from bertjax.models.layers import make_dense, make_layer_norm, activation


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


class MLMHead(nn.Module):
  """Dense + activation + LayerNorm, then the decoder tied to the word embeddings, plus a bias.

  Call with hidden states <float>[..., hidden] and the encoder (for its tied embedding table);
  returns float32 logits <float32>[..., vocab].
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, x, encoder):
    cfg = self.config
    x = make_dense(cfg.embed_size, ("embed", "embed_in"), "transform", cfg)(x)
    x = activation(cfg.mlm_head_act or cfg.hidden_act, kernels.for_model(cfg).erf_gelu)(x)
    x = make_layer_norm(cfg, "layer_norm", "embed_in")(x)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",)),
                      (cfg.vocab_size,), jnp.float32)
    return add_vocab_bias(encoder.attend(x).astype(jnp.float32), bias,
                          kernels.for_model(cfg).bias_product)


class PairHead(nn.Module):
  """NSP (BERT) or SOP (ALBERT): two logits from the pooled [CLS] output.

  No dropout on the pooled output, as BERT's and ALBERT's pretraining code and transformers'
  BertForPreTraining (fine-tuning's ClassificationHead does drop out, as BERT's run_classifier).
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, pooled):
    return make_dense(2, ("embed", None), "classifier", self.config)(pooled).astype(jnp.float32)


class DiscriminatorHead(nn.Module):
  """ELECTRA's replaced-token detector: one logit per position."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    act = activation(cfg.hidden_act, kernels.for_model(cfg).erf_gelu)
    x = act(make_dense(cfg.hidden_size, ("embed", "embed_out"), "dense", cfg)(x))
    return make_dense(1, ("embed", None), "prediction", cfg)(x)[..., 0].astype(jnp.float32)


class ClassificationHead(nn.Module):
  """Sequence classification/regression on the pooled [CLS] output (BERT's fine-tuning head)."""
  config: ModelConfig
  num_labels: int

  @nn.compact
  def __call__(self, pooled, deterministic: bool = True):
    drop = dropout_layer(self.config.hidden_dropout_prob, kernels.dropout_for_model(self.config))
    pooled = drop(pooled, deterministic=deterministic)
    classifier = make_dense(self.num_labels, ("embed", None), "classifier", self.config)
    return classifier(pooled).astype(jnp.float32)


class TokenHead(nn.Module):
  """Per-token logits: tagging (num_labels tags) or extractive QA (2: start and end)."""
  config: ModelConfig
  num_labels: int

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    drop = dropout_layer(self.config.hidden_dropout_prob, kernels.dropout_for_model(self.config))
    x = drop(x, deterministic=deterministic)
    classifier = make_dense(self.num_labels, ("embed", None), "classifier", self.config)
    return classifier(x).astype(jnp.float32)


class SpanBoundaryHead(nn.Module):
  """SpanBERT's span boundary objective: each masked token predicted from its span's boundary.

  For a masked token x_i of the span x_s..x_e, the input is the encodings of the two tokens just
  outside the span, x_{s-1} and x_{e+1}, and a relative position embedding p_{i-s+1}; a 2-layer
  MLP (each layer GeLU then LayerNorm, as the paper) maps them to a vector that the decoder tied to
  the word embeddings turns into vocabulary logits, plus a bias.

  Call with hidden <float>[batch, seq, hidden], span_left / span_right <int32>[batch, p] (the
  boundary positions), span_offset <int32>[batch, p] (i - s, 0-based) and the encoder (for its
  tied embedding table); returns <float32>[batch, p, vocab]. Offsets past `max_span_length` share
  its last embedding, so longer spans of many sub-word pieces never index out of the table.
  """
  config: ModelConfig
  max_span_length: int = 32

  @nn.compact
  def __call__(self, hidden, span_left, span_right, span_offset, encoder):
    cfg = self.config
    choices = kernels.for_model(cfg)
    left = gather_positions(hidden, span_left, choices.float32_gather)
    right = gather_positions(hidden, span_right, choices.float32_gather)
    offset = jnp.clip(span_offset, 0, self.max_span_length - 1)
    position = embed_layer(cfg, self.max_span_length, cfg.hidden_size, (None, "embed"),
                           name="position_embeddings")(offset)
    x = jnp.concatenate([left, right, position.astype(left.dtype)], axis=-1)
    act = activation("gelu", choices.erf_gelu)
    x = make_dense(cfg.hidden_size, (None, "embed"), "dense_0", cfg)(x)
    x = make_layer_norm(cfg, "layer_norm_0")(act(x))
    # The second layer ends in the embedding size, so the tied decoder applies to ALBERT-style
    # factorized embeddings too (SpanBERT's own sizes have embed_size == hidden_size).
    x = make_dense(cfg.embed_size, ("embed", "embed_in"), "dense_1", cfg)(x)
    x = make_layer_norm(cfg, "layer_norm_1", "embed_in")(act(x))
    bias_init = nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",))
    bias = self.param("bias", bias_init, (cfg.vocab_size,), jnp.float32)
    return add_vocab_bias(encoder.attend(x).astype(jnp.float32), bias, choices.bias_product)
