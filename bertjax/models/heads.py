"""Output heads placed on the encoder: pretraining (MLM, NSP/SOP, RTD, SBO) and fine-tuning.

The MLM head runs only on gathered masked positions (`gather_positions`), never on every
position of every row: with a 30k vocabulary that projection dominates a small model's step.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from bertjax.models.config import ModelConfig
from bertjax.models.layers import Layered, Layers


class MLMHead(Layered):
  """Dense + activation + LayerNorm, then the decoder tied to the word embeddings, plus a bias.

  Call with hidden states <float>[..., hidden] and the encoder (for its tied embedding table);
  returns float32 logits <float32>[..., vocab].
  """
  config: ModelConfig
  layers: Layers | None = None

  @nn.compact
  def __call__(self, x, encoder):
    cfg, L = self.config, self.layers
    x = L.dense(cfg.embed_size, ("embed", "embed_in"), "transform")(x)
    x = L.activation(cfg.mlm_head_act or cfg.hidden_act)(x)
    x = L.norm("layer_norm", "embed_in")(x)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",)),
                      (cfg.vocab_size,), jnp.float32)
    return L.vocab_bias(encoder.attend(x).astype(jnp.float32), bias)


class PairHead(Layered):
  """NSP (BERT) or SOP (ALBERT): two logits from the pooled [CLS] output.

  No dropout on the pooled output, as BERT's and ALBERT's pretraining code and transformers'
  BertForPreTraining (fine-tuning's ClassificationHead does drop out, as BERT's run_classifier).
  """
  config: ModelConfig
  layers: Layers | None = None

  @nn.compact
  def __call__(self, pooled):
    return self.layers.dense(2, ("embed", None), "classifier")(pooled).astype(jnp.float32)


class DiscriminatorHead(Layered):
  """ELECTRA's replaced-token detector: one logit per position."""
  config: ModelConfig
  layers: Layers | None = None

  @nn.compact
  def __call__(self, x):
    cfg, L = self.config, self.layers
    x = L.activation(cfg.hidden_act)(L.dense(cfg.hidden_size, ("embed", "embed_out"), "dense")(x))
    return L.dense(1, ("embed", None), "prediction")(x)[..., 0].astype(jnp.float32)


class ClassificationHead(Layered):
  """Sequence classification/regression on the pooled [CLS] output (BERT's fine-tuning head)."""
  config: ModelConfig
  num_labels: int
  layers: Layers | None = None

  @nn.compact
  def __call__(self, pooled, deterministic: bool = True):
    L = self.layers
    pooled = L.dropout(self.config.hidden_dropout_prob)(pooled, deterministic=deterministic)
    return L.dense(self.num_labels, ("embed", None), "classifier")(pooled).astype(jnp.float32)


class TokenHead(Layered):
  """Per-token logits: tagging (num_labels tags) or extractive QA (2: start and end)."""
  config: ModelConfig
  num_labels: int
  layers: Layers | None = None

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    L = self.layers
    x = L.dropout(self.config.hidden_dropout_prob)(x, deterministic=deterministic)
    return L.dense(self.num_labels, ("embed", None), "classifier")(x).astype(jnp.float32)


class SpanBoundaryHead(Layered):
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
  layers: Layers | None = None

  @nn.compact
  def __call__(self, hidden, span_left, span_right, span_offset, encoder):
    cfg, L = self.config, self.layers
    left, right = L.gather(hidden, span_left), L.gather(hidden, span_right)
    offset = jnp.clip(span_offset, 0, self.max_span_length - 1)
    position = L.embed(self.max_span_length, cfg.hidden_size, (None, "embed"),
                       name="position_embeddings")(offset)
    x = jnp.concatenate([left, right, position.astype(left.dtype)], axis=-1)
    act = L.activation("gelu")
    x = L.dense(cfg.hidden_size, (None, "embed"), "dense_0")(x)
    x = L.norm("layer_norm_0")(act(x))
    # The second layer ends in the embedding size, so the tied decoder applies to ALBERT-style
    # factorized embeddings too (SpanBERT's own sizes have embed_size == hidden_size).
    x = L.dense(cfg.embed_size, ("embed", "embed_in"), "dense_1")(x)
    x = L.norm("layer_norm_1", "embed_in")(act(x))
    bias_init = nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",))
    bias = self.param("bias", bias_init, (cfg.vocab_size,), jnp.float32)
    return L.vocab_bias(encoder.attend(x).astype(jnp.float32), bias)
