"""Encoder + pretraining heads: MLM on gathered positions, and NSP/SOP on the pooled output."""

from __future__ import annotations

import flax.linen as nn

from bertjax.models.architectures import architecture
from bertjax.models.config import ModelConfig
from bertjax.models.layers import Layered, Layers


class PretrainingModel(Layered):
  """BERT (MLM + NSP), ALBERT (MLM + SOP), RoBERTa/SpanBERT/ModernBERT (MLM only).

  Returns a dict: `mlm_logits` <float32>[batch, predictions, vocab] at `masked_positions`,
  `pair_logits` <float32>[batch, 2] when `pair_head`, and the encoder's `output` (whose
  `last_hidden_state` holds only the masked positions when they are given: see
  `Encoder.__call__`'s `output_positions`).
  """
  config: ModelConfig
  pair_head: bool = True
  layers: Layers | None = None

  def setup(self):
    arch, cfg, L = architecture(self.config), self.config, self.layers
    self.encoder = arch.Encoder(cfg, layers=L)
    self.mlm = arch.MLMHead(cfg, layers=L)
    if self.pair_head:
      self.pair = arch.PairHead(cfg, layers=L)

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
