"""Fine-tuning models: the encoder with a sequence-level or a per-token head (bertjax.tasks).

Both read the encoder's usual output (`features="standard"`) or a feature-based input
(`bertjax.models.features`): the last layer, several layers' hidden states concatenated, or
their learned scalar mix.
"""

from __future__ import annotations

import flax.linen as nn

from bertjax.models import features as feats
from bertjax.models.architectures import architecture
from bertjax.models.config import ModelConfig
from bertjax.models.layers import Layered, Layers


class _FeatureReader(Layered):
  """Shared fields: the labels, what the head reads (`features`, `layers`: hidden-state indices)
  and how sequence tasks pool. `num_labels` comes right after `config`, so
  `SequenceClassifier(config, 3)` reads as it always did. `kernel_layers`: the `Layers` the
  model is built from (resolved from `config` at construction when not given)."""
  config: ModelConfig
  num_labels: int = 2
  features: str = "standard"
  layers: tuple[int, ...] = (-4, -3, -2, -1)
  pooling: str = "cls"
  kernel_layers: Layers | None = None
  layers_field = "kernel_layers"

  def encode(self, input_ids, attention_mask, token_type_ids, deterministic):
    # The name "encoder" is what lets `init_from` restore a pretrained encoder into this model.
    wide = self.features in ("concat", "scalar_mix")
    encoder = architecture(self.config).Encoder(self.config, layers=self.kernel_layers,
                                                name="encoder")
    return encoder(input_ids, attention_mask, token_type_ids, deterministic=deterministic,
                   output_hidden_states=wide)

  def token_features(self, out):
    mix = feats.ScalarMix(name="scalar_mix") if self.features == "scalar_mix" else None
    return feats.head_features(out, self.features, self.layers, self.config.num_hidden_layers, mix)


class SequenceClassifier(_FeatureReader):
  """Encoder + classification (or regression) head on the pooled [CLS] output, or on `pooling`
  of the chosen features.

  Call: input_ids, attention_mask, token_type_ids <int32>[batch, seq] -> logits
  <float32>[batch, num_labels]. The standard input is the architecture's `pool`: the pooled [CLS]
  output, or the [CLS] hidden state for encoders without a pooler (ELECTRA); ModernBERT pools as
  its `classifier_pooling` says. The head is the architecture's `SequenceHead`.
  """

  @nn.compact
  def __call__(self, input_ids, attention_mask, token_type_ids, deterministic: bool = True):
    arch = architecture(self.config)
    out = self.encode(input_ids, attention_mask, token_type_ids, deterministic)
    if self.features == "standard":
      pooled = arch.pool(self.config, out, attention_mask)
    else:
      pooled = feats.pool(self.token_features(out), attention_mask, self.pooling)
    head = arch.SequenceHead(self.config, self.num_labels, layers=self.kernel_layers,
                             name="classifier")
    return head(pooled, deterministic)


class TokenClassifier(_FeatureReader):
  """Encoder + per-token head: tags (NER/POS) or start/end logits (extractive QA, 2 labels).

  Call: input_ids, attention_mask, token_type_ids <int32>[batch, seq] -> logits
  <float32>[batch, seq, num_labels]. The head is the architecture's `TokenHead`.
  """
  head_name: str = "classifier"

  @nn.compact
  def __call__(self, input_ids, attention_mask, token_type_ids, deterministic: bool = True):
    out = self.encode(input_ids, attention_mask, token_type_ids, deterministic)
    x = out.last_hidden_state if self.features == "standard" else self.token_features(out)
    head = architecture(self.config).TokenHead(self.config, self.num_labels,
                                               layers=self.kernel_layers, name=self.head_name)
    return head(x, deterministic)
