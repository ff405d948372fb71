"""Fine-tuning models: the encoder with a sequence-level or a per-token head (bertjax.tasks)."""

from __future__ import annotations

import flax.linen as nn

from bertjax.models.config import ModelConfig
from bertjax.models.encoder import Encoder
from bertjax.models.heads import ClassificationHead, TokenHead


class SequenceClassifier(nn.Module):
  """Encoder + classification (or regression) head on the pooled [CLS] output.

  Call: input_ids, attention_mask, token_type_ids <int32>[batch, seq] -> logits
  <float32>[batch, num_labels]. Encoders without a pooler (ELECTRA) feed the [CLS] hidden state.
  """
  config: ModelConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids, attention_mask, token_type_ids, deterministic: bool = True):
    # The name "encoder" is what lets `init_from` restore a pretrained encoder into this model.
    out = Encoder(self.config, name="encoder")(input_ids, attention_mask, token_type_ids,
                                               deterministic=deterministic)
    pooled = out.pooler_output if out.pooler_output is not None else out.last_hidden_state[:, 0]
    return ClassificationHead(self.config, self.num_labels, name="classifier")(pooled,
                                                                             deterministic)


class TokenClassifier(nn.Module):
  """Encoder + per-token head: tags (NER/POS) or start/end logits (extractive QA, 2 labels).

  Call: input_ids, attention_mask, token_type_ids <int32>[batch, seq] -> logits
  <float32>[batch, seq, num_labels].
  """
  config: ModelConfig
  num_labels: int
  head_name: str = "classifier"

  @nn.compact
  def __call__(self, input_ids, attention_mask, token_type_ids, deterministic: bool = True):
    out = Encoder(self.config, name="encoder")(input_ids, attention_mask, token_type_ids,
                                               deterministic=deterministic)
    return TokenHead(self.config, self.num_labels, name=self.head_name)(out.last_hidden_state,
                                                                        deterministic)
