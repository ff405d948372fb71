"""RoBERTa: BERT's encoder with positions numbered after the padding id and a single token
type (`ModelConfig.position_offset`): the BERT family's architecture module
(bertjax.models.bert), found by its name (bertjax.models.architectures)."""

from bertjax.models.bert import Encoder, MLMHead, PairHead, SequenceHead, TokenHead, pool

__all__ = ["Encoder", "MLMHead", "PairHead", "SequenceHead", "TokenHead", "pool"]
