"""ELECTRA's two networks: the replaced-token discriminator and the masked-LM generator.

The discriminator is the encoder plus a per-token binary head (params {"encoder", "rtd"}); the
generator is a (usually narrower) encoder with the MLM head tied to its word embeddings and no
pair head (params {"encoder", "mlm"}), which is exactly `PretrainingModel(pair_head=False)`.
Their parameter names match Hugging Face's ElectraForPreTraining / ElectraForMaskedLM through
`bertjax.convert`.
"""

from __future__ import annotations

import flax.linen as nn

from bertjax.models.config import ModelConfig
from bertjax.models.encoder import Encoder
from bertjax.models.heads import DiscriminatorHead
from bertjax.models.pretraining import PretrainingModel


class ElectraDiscriminator(nn.Module):
  """Encoder + replaced-token detection head.

  Returns a dict: `rtd_logits` <float32>[batch, seq] (one logit per token: replaced or not) and
  the encoder's `output`.
  """
  config: ModelConfig

  def setup(self):
    self.encoder = Encoder(self.config)
    self.rtd = DiscriminatorHead(self.config)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, segment_ids=None,
               deterministic: bool = True):
    out = self.encoder(input_ids, attention_mask, token_type_ids, segment_ids=segment_ids,
                       deterministic=deterministic)
    return {"output": out, "rtd_logits": self.rtd(out.last_hidden_state)}


class ElectraGenerator(PretrainingModel):
  """The generator: a `PretrainingModel` without the pair head (its MLM head is ELECTRA's
  generator_predictions + generator_lm_head, whose weight is tied to the word embeddings)."""
  pair_head: bool = False
