"""ELECTRA in one place: the discriminator, the generator, and the two joined for pretraining.

  masked input ──► generator (narrow encoder + MLM head) ──► sample at masked positions
               ──► corrupted input ──► discriminator (encoder + RTD head) ──► a logit per token

The discriminator is the encoder plus a per-token binary head (params {"encoder", "rtd"}); the
generator is a (usually narrower) encoder with the MLM head tied to its word embeddings and no
pair head (params {"encoder", "mlm"}), which is exactly `PretrainingModel(pair_head=False)`.
Their parameter names match Hugging Face's ElectraForPreTraining / ElectraForMaskedLM through
`bertjax.convert`.

In pretraining (`ElectraPretrainingModel`) both networks read ONE `Embeddings` module (token,
position and token-type tables and their LayerNorm), owned by the discriminator's encoder; the
generator's `embedding_projection` maps its embed_size onto its own hidden size. Both networks
are of the config's architecture (`encoder_for`): with model.architecture=modernbert they are
ModernBERT encoders sharing its token table (`ModernBertEmbeddings`), the generator narrowed by
the same fractions. Sampling uses
the "sample" rng stream on stop-gradient logits: no gradient flows from the discriminator into
the generator, as in the paper. Parameters: {"encoder", "rtd"} exactly as `ElectraDiscriminator`
(so the discriminator's encoder fine-tunes like any other), plus {"generator": {"encoder",
"mlm"}} whose encoder has no `embeddings` subtree.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.core.errors import fail
from bertjax.models.architectures import encoder_for, mlm_head_for
# The architecture "electra" is the BERT family's: bertjax.models.architectures finds these here.
from bertjax.models.bert import (Encoder, MLMHead, PairHead, SequenceHead,  # noqa: F401
                                 TokenHead, pool)  # noqa: F401
from bertjax.models.config import ModelConfig
from bertjax.models.heads import DiscriminatorHead
from bertjax.models.layers import Layered, Layers


class ElectraDiscriminator(Layered):
  """Encoder + replaced-token detection head.

  Returns a dict: `rtd_logits` <float32>[batch, seq] (one logit per token: replaced or not) and
  the encoder's `output`.
  """
  config: ModelConfig
  layers: Layers | None = None

  def setup(self):
    self.encoder = encoder_for(self.config, layers=self.layers)
    self.rtd = DiscriminatorHead(self.config, self.layers)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, segment_ids=None,
               deterministic: bool = True):
    out = self.encoder(input_ids, attention_mask, token_type_ids, segment_ids=segment_ids,
                       deterministic=deterministic)
    return {"output": out, "rtd_logits": self.rtd(out.last_hidden_state)}


def generator_config(disc: ModelConfig, hidden_fraction: float,
                     layer_fraction: float = 1.0) -> ModelConfig:
  """The generator's `ModelConfig`: the discriminator's, narrowed to `hidden_fraction`.

  The head count and the feed-forward size scale with the hidden size, keeping the
  discriminator's head size where it divides (ELECTRA: hidden // 64 heads and a 4 x hidden
  feed-forward, for its 64-wide heads). Its embeddings are the discriminator's, so its
  embedding_size is the discriminator's embed_size.
  """
  if not 0.0 < hidden_fraction <= 1.0 or not 0.0 < layer_fraction <= 1.0:
    fail(f"electra.generator_hidden_fraction={hidden_fraction} and generator_layer_fraction="
         f"{layer_fraction} must be in (0, 1]; ELECTRA uses 1/4 (small, large) or 1/3 (base) and 1")
  hidden = max(1, round(disc.hidden_size * hidden_fraction))
  heads = max(1, hidden // disc.head_dim)
  while hidden % heads:
    heads -= 1
  layers = max(1, round(disc.num_hidden_layers * layer_fraction))
  groups = disc.num_hidden_groups
  if groups is not None and layers % groups:
    fail(f"the generator's {layers} layers are not divisible by model.num_hidden_groups={groups}; "
         "choose electra.generator_layer_fraction so they are")
  return disc.replace(
      hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=layers,
      intermediate_size=max(1, round(disc.intermediate_size * hidden / disc.hidden_size)),
      embedding_size=disc.embed_size, use_pooler=False)


class ElectraGeneratorTower(nn.Module):
  """The generator over shared embeddings: an Encoder without its own tables plus the MLM head
  tied to the shared word embeddings. Returns <float32>[batch, predictions, vocab] logits.
  `layers`: the discriminator's (the generator's config differs from it in sizes only)."""
  config: ModelConfig
  embeddings: nn.Module
  layers: Layers

  def setup(self):
    self.encoder = encoder_for(self.config, shared_embeddings=self.embeddings, layers=self.layers)
    self.mlm = mlm_head_for(self.config, layers=self.layers)

  def __call__(self, input_ids, attention_mask, token_type_ids, masked_positions,
               deterministic: bool):
    out = self.encoder(input_ids, attention_mask, token_type_ids,
                       output_positions=masked_positions, deterministic=deterministic)
    return self.mlm(out.last_hidden_state, self.encoder)


def sample_categorical(rng: jax.Array, logits: jax.Array) -> jax.Array:
  """One token per row of <float32>[..., vocab] logits, drawn from their softmax: <int32>[...].

  Inverse-CDF sampling needs one uniform per row where Gumbel-max needs one per vocabulary entry;
  with a 30k vocabulary that random-number generation would otherwise cost more than the
  generator itself.
  """
  cdf = jnp.cumsum(jax.nn.softmax(logits.astype(jnp.float32), axis=-1), axis=-1)
  # u in (0, total]: never 0, which would pick a leading zero-probability token, and scaled by
  # the last entry, so rounding in the sum can never leave u above every entry.
  u = (1.0 - jax.random.uniform(rng, cdf.shape[:-1] + (1,), jnp.float32)) * cdf[..., -1:]
  index = jnp.sum((cdf < u).astype(jnp.int32), axis=-1)
  return jnp.minimum(index, logits.shape[-1] - 1)


def replace_at(ids: jax.Array, positions: jax.Array, values: jax.Array,
               weights: jax.Array) -> jax.Array:
  """`ids` <int32>[batch, seq] with `values` <int32>[batch, p] written at `positions` where
  `weights` > 0; unused slots (position 0, weight 0) write back the token already there."""
  ids, positions = jnp.asarray(ids), jnp.asarray(positions)
  current = jnp.take_along_axis(ids, positions, axis=1)
  values = jnp.where(weights > 0, values, current).astype(ids.dtype)
  rows = jnp.arange(ids.shape[0])[:, None]
  return ids.at[rows, positions].set(values)


class ElectraPretrainingModel(Layered):
  """Generator + discriminator with shared embeddings (see the module docstring).

  Call with the masked batch: input_ids, attention_mask, token_type_ids <int32>[batch, seq];
  masked_positions, masked_ids <int32>[batch, p] and masked_weights <float32>[batch, p]. Needs
  the "sample" rng (and "dropout" when not deterministic). Returns a dict:
    mlm_logits      <float32>[batch, p, vocab]  the generator's predictions
    sampled_ids     <int32>[batch, p]           tokens drawn from them
    corrupted_ids   <int32>[batch, seq]         the discriminator's input
    rtd_labels      <int32>[batch, seq]         1 where corrupted differs from the original
    rtd_logits      <float32>[batch, seq]       the discriminator's "replaced" logits
  """
  config: ModelConfig
  generator_config: ModelConfig
  # The discriminator loss's weight against the generator's (ELECTRA: 50): no parameter depends
  # on it; the objective's loss reads it here (config.electra.disc_weight).
  disc_weight: float = 50.0
  layers: Layers | None = None

  def setup(self):
    self.encoder = encoder_for(self.config, layers=self.layers)
    self.rtd = DiscriminatorHead(self.config, self.layers)
    self.generator = ElectraGeneratorTower(self.generator_config, self.encoder.embeddings,
                                           self.layers)

  def __call__(self, input_ids, attention_mask, token_type_ids, masked_positions, masked_ids,
               masked_weights, *, deterministic: bool = True):
    mlm_logits = self.generator(input_ids, attention_mask, token_type_ids, masked_positions,
                                deterministic)
    sampled = sample_categorical(self.make_rng("sample"), jax.lax.stop_gradient(mlm_logits))
    original = replace_at(input_ids, masked_positions, masked_ids, masked_weights)
    corrupted = replace_at(input_ids, masked_positions, sampled, masked_weights)
    # A sample equal to the original token is no replacement: the discriminator must call it
    # original, or it would be asked to detect what cannot be seen.
    labels = ((corrupted != original) & (attention_mask > 0)).astype(jnp.int32)
    out = self.encoder(corrupted, attention_mask, token_type_ids, deterministic=deterministic)
    return {"mlm_logits": mlm_logits, "sampled_ids": sampled, "corrupted_ids": corrupted,
            "rtd_labels": labels, "rtd_logits": self.rtd(out.last_hidden_state),
            "output": out}
