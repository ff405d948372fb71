"""Encoder + pretraining heads: MLM on gathered positions, and NSP/SOP on the pooled output."""

from __future__ import annotations

import flax.linen as nn

from bertjax.models.config import ModelConfig
from bertjax.models.heads import PairHead
from bertjax.models.modernbert import encoder_for, mlm_head_for, refuse_pair_head


class PretrainingModel(nn.Module):
  """BERT (MLM + NSP), ALBERT (MLM + SOP), RoBERTa/SpanBERT/ModernBERT (MLM only).

  Returns a dict: `mlm_logits` <float32>[batch, predictions, vocab] at `masked_positions`,
  `pair_logits` <float32>[batch, 2] when `pair_head`, and the encoder's `output` (whose
  `last_hidden_state` holds only the masked positions when they are given: see
  `Encoder.__call__`'s `output_positions`).
  """
  config: ModelConfig
  pair_head: bool = True

  def setup(self):
    self.encoder = encoder_for(self.config)
    self.mlm = mlm_head_for(self.config)
    if self.pair_head:
      refuse_pair_head(self.config)
      self.pair = PairHead(self.config)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, masked_positions=None, *,
               segment_ids=None, deterministic: bool = True):
    out = self.encoder(input_ids, attention_mask, token_type_ids, segment_ids=segment_ids,
                       output_positions=masked_positions, deterministic=deterministic)
    result = {"output": out}
    if masked_positions is not None:
      result["mlm_logits"] = self.mlm(out.last_hidden_state, self.encoder)
    if self.pair_head:
      result["pair_logits"] = self.pair(out.pooler_output)
    return result
