"""Fine-tuning models: the encoder with a sequence-level or a per-token head (bertjax.tasks).

Both read the encoder's usual output (`features="standard"`) or a feature-based input
(`bertjax.models.features`): the last layer, several layers' hidden states concatenated, or
their learned scalar mix.
"""

from __future__ import annotations

import flax.linen as nn

from bertjax.models import features as feats
from bertjax.models.config import ModelConfig
from bertjax.models.heads import ClassificationHead, TokenHead
from bertjax.models.modernbert import ModernBertTaskHead, encoder_for, pool_for_sequence


class _FeatureReader(nn.Module):
  """Shared fields: the labels, what the head reads (`features`, `layers`) and how sequence
  tasks pool. `num_labels` comes right after `config`, so `SequenceClassifier(config, 3)` reads
  as it always did."""
  config: ModelConfig
  num_labels: int = 2
  features: str = "standard"
  layers: tuple[int, ...] = (-4, -3, -2, -1)
  pooling: str = "cls"

  def encode(self, input_ids, attention_mask, token_type_ids, deterministic):
    # The name "encoder" is what lets `init_from` restore a pretrained encoder into this model.
    wide = self.features in ("concat", "scalar_mix")
    return encoder_for(self.config, name="encoder")(input_ids, attention_mask, token_type_ids,
                                                deterministic=deterministic,
                                                output_hidden_states=wide)

  def token_features(self, out):
    mix = feats.ScalarMix(name="scalar_mix") if self.features == "scalar_mix" else None
    return feats.head_features(out, self.features, self.layers, self.config.num_hidden_layers, mix)


class SequenceClassifier(_FeatureReader):
  """Encoder + classification (or regression) head on the pooled [CLS] output, or on `pooling`
  of the chosen features.

  Call: input_ids, attention_mask, token_type_ids <int32>[batch, seq] -> logits
  <float32>[batch, num_labels]. Encoders without a pooler (ELECTRA) feed the [CLS] hidden state;
  ModernBERT pools as its `classifier_pooling` says and takes its own head (`ModernBertTaskHead`).
  """

  @nn.compact
  def __call__(self, input_ids, attention_mask, token_type_ids, deterministic: bool = True):
    out = self.encode(input_ids, attention_mask, token_type_ids, deterministic)
    if self.config.architecture == "modernbert":
      x = out.last_hidden_state if self.features == "standard" else self.token_features(out)
      pooled = (pool_for_sequence(self.config, x, attention_mask) if self.features == "standard"
                else feats.pool(x, attention_mask, self.pooling))
      return ModernBertTaskHead(self.config, self.num_labels, name="classifier")(pooled,
                                                                               deterministic)
    if self.features == "standard":
      pooled = out.pooler_output if out.pooler_output is not None else out.last_hidden_state[:, 0]
    else:
      pooled = feats.pool(self.token_features(out), attention_mask, self.pooling)
    return ClassificationHead(self.config, self.num_labels, name="classifier")(pooled,
                                                                             deterministic)


class TokenClassifier(_FeatureReader):
  """Encoder + per-token head: tags (NER/POS) or start/end logits (extractive QA, 2 labels).

  Call: input_ids, attention_mask, token_type_ids <int32>[batch, seq] -> logits
  <float32>[batch, seq, num_labels]. ModernBERT takes its own head (`ModernBertTaskHead`).
  """
  head_name: str = "classifier"

  @nn.compact
  def __call__(self, input_ids, attention_mask, token_type_ids, deterministic: bool = True):
    out = self.encode(input_ids, attention_mask, token_type_ids, deterministic)
    x = out.last_hidden_state if self.features == "standard" else self.token_features(out)
    if self.config.architecture == "modernbert":
      return ModernBertTaskHead(self.config, self.num_labels, name=self.head_name)(x, deterministic)
    return TokenHead(self.config, self.num_labels, name=self.head_name)(x, deterministic)
