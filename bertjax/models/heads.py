"""Output heads placed on the encoder: pretraining (MLM, NSP/SOP, RTD) and fine-tuning.

The MLM head runs only on gathered masked positions (`gather_positions`), never on every
position of every row: with a 30k vocabulary that projection dominates a small model's step.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models.config import ModelConfig
from bertjax.models.encoder import _dense, _layer_norm, activation


def gather_positions(x: jax.Array, positions: jax.Array) -> jax.Array:
  """<float>[batch, seq, d], <int32>[batch, p] -> <float>[batch, p, d]."""
  return jnp.take_along_axis(x, positions[..., None].astype(jnp.int32), axis=1)


class MLMHead(nn.Module):
  """Dense + activation + LayerNorm, then the decoder tied to the word embeddings, plus a bias.

  Call with hidden states <float>[..., hidden] and the encoder (for its tied embedding table);
  returns float32 logits <float32>[..., vocab].
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, x, encoder):
    cfg = self.config
    x = _dense(cfg.embed_size, ("embed", "embed_in"), "transform", cfg)(x)
    x = activation(cfg.mlm_head_act or cfg.hidden_act)(x)
    x = _layer_norm(cfg, "layer_norm", "embed_in")(x)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",)),
                      (cfg.vocab_size,), jnp.float32)
    return encoder.attend(x).astype(jnp.float32) + bias


class PairHead(nn.Module):
  """NSP (BERT) or SOP (ALBERT): two logits from the pooled [CLS] output."""
  config: ModelConfig

  @nn.compact
  def __call__(self, pooled, deterministic: bool = True):
    pooled = nn.Dropout(self.config.hidden_dropout_prob)(pooled, deterministic=deterministic)
    return _dense(2, ("embed", None), "classifier", self.config)(pooled).astype(jnp.float32)


class DiscriminatorHead(nn.Module):
  """ELECTRA's replaced-token detector: one logit per position."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    x = activation(cfg.hidden_act)(_dense(cfg.hidden_size, ("embed", "embed_out"), "dense", cfg)(x))
    return _dense(1, ("embed", None), "prediction", cfg)(x)[..., 0].astype(jnp.float32)


class ClassificationHead(nn.Module):
  """Sequence classification/regression on the pooled [CLS] output (BERT's fine-tuning head)."""
  config: ModelConfig
  num_labels: int

  @nn.compact
  def __call__(self, pooled, deterministic: bool = True):
    pooled = nn.Dropout(self.config.hidden_dropout_prob)(pooled, deterministic=deterministic)
    return _dense(self.num_labels, ("embed", None), "classifier", self.config)(pooled).astype(jnp.float32)


class TokenHead(nn.Module):
  """Per-token logits: tagging (num_labels tags) or extractive QA (2: start and end)."""
  config: ModelConfig
  num_labels: int

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    x = nn.Dropout(self.config.hidden_dropout_prob)(x, deterministic=deterministic)
    return _dense(self.num_labels, ("embed", None), "classifier", self.config)(x).astype(jnp.float32)
