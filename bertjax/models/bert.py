"""The BERT family's architecture: `model.architecture="bert"` (and "roberta", "albert" and
"electra", the same encoder with other settings: bertjax.models.roberta, .albert, .electra).

`bertjax.models.architectures` finds the encoder and heads of an architecture in the module of
its name; this one's are the family's `Encoder` (bertjax.models.encoder) and heads
(bertjax.models.heads).
"""

from __future__ import annotations

import jax

from bertjax.models.config import ModelConfig
from bertjax.models.encoder import Encoder, EncoderOutput
from bertjax.models.heads import ClassificationHead as SequenceHead
from bertjax.models.heads import MLMHead, PairHead, TokenHead

__all__ = ["Encoder", "MLMHead", "PairHead", "SequenceHead", "TokenHead", "pool"]


def pool(cfg: ModelConfig, out: EncoderOutput, attention_mask: jax.Array) -> jax.Array:
  """A sequence task's input from the encoder's output: the pooled [CLS] output, or, for
  encoders without a pooler (ELECTRA), the [CLS] hidden state."""
  del cfg, attention_mask
  return out.pooler_output if out.pooler_output is not None else out.last_hidden_state[:, 0]
