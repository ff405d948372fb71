"""ALBERT: BERT's encoder with factorized embeddings and cross-layer sharing
(`model.embedding_size`, `model.num_hidden_groups`): the BERT family's architecture module
(bertjax.models.bert), found by its name (bertjax.models.architectures)."""

from bertjax.models.bert import Encoder, MLMHead, PairHead, SequenceHead, TokenHead, pool

__all__ = ["Encoder", "MLMHead", "PairHead", "SequenceHead", "TokenHead", "pool"]
