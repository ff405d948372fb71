"""Model sizes as data: each preset is a dict of `ModelConfig` fields.

Shapes follow the released checkpoints (Google's BERT miniatures for tiny...medium, the
RoBERTa, ALBERT v2, ELECTRA, SpanBERT and ModernBERT releases), so a converted checkpoint and a
preset agree.
"""

from __future__ import annotations

from bertjax.core.errors import fail
from bertjax.models.config import ModelConfig


def _bert(layers, hidden, heads, **kw):
  return {"architecture": "bert", "num_hidden_layers": layers, "hidden_size": hidden,
          "num_attention_heads": heads, "intermediate_size": 4 * hidden, **kw}


_ROBERTA = dict(architecture="roberta", vocab_size=50265, max_position_embeddings=514,
                type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5, mlm_head_act="gelu")
_ALBERT = dict(architecture="albert", vocab_size=30000, embedding_size=128, num_hidden_groups=1,
               hidden_act="gelu_new", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
_ELECTRA = dict(architecture="electra", use_pooler=False)
_GENERATOR = dict(architecture="electra", use_pooler=False, mlm_head_act="gelu")


def _modernbert(layers, hidden, heads, intermediate, **kw):
  """ModernBERT: answerdotai's config.json values (the ModernBertConfig defaults they keep) plus
  the BERT-family fields it has no use for switched off."""
  return {"architecture": "modernbert", "num_hidden_layers": layers, "hidden_size": hidden,
          "num_attention_heads": heads, "intermediate_size": intermediate, "vocab_size": 50368,
          "max_position_embeddings": 8192, "pad_token_id": 50283, "type_vocab_size": 1,
          "use_pooler": False, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
          "global_rope_theta": 160000.0, "local_rope_theta": 10000.0, "local_attention": 128,
          "global_attn_every_n_layers": 3, **kw}

PRESETS: dict[str, dict] = {
    "bert-tiny": _bert(2, 128, 2),
    "bert-mini": _bert(4, 256, 4),
    "bert-small": _bert(4, 512, 8),
    "bert-medium": _bert(8, 512, 8),
    "bert-base": _bert(12, 768, 12),
    "bert-large": _bert(24, 1024, 16),
    "roberta-base": _bert(12, 768, 12, **_ROBERTA),
    "roberta-large": _bert(24, 1024, 16, **_ROBERTA),
    "albert-base": _bert(12, 768, 12, **_ALBERT),
    "albert-large": _bert(24, 1024, 16, **_ALBERT),
    "albert-xlarge": _bert(24, 2048, 16, **_ALBERT),
    "albert-xxlarge": _bert(12, 4096, 64, **_ALBERT),
    "electra-small": _bert(12, 256, 4, embedding_size=128, **_ELECTRA),
    "electra-small-generator": _bert(12, 256, 4, embedding_size=128, **_GENERATOR),
    "electra-base": _bert(12, 768, 12, **_ELECTRA),
    "electra-base-generator": _bert(12, 256, 4, embedding_size=768, **_GENERATOR),
    "electra-large": _bert(24, 1024, 16, **_ELECTRA),
    "electra-large-generator": _bert(24, 256, 4, embedding_size=1024, **_GENERATOR),
    "spanbert-base": _bert(12, 768, 12, vocab_size=28996),
    "spanbert-large": _bert(24, 1024, 16, vocab_size=28996),
    "modernbert-base": _modernbert(22, 768, 12, 1152),
    "modernbert-large": _modernbert(28, 1024, 16, 2624),
    # For tests and runlocal: both layer kinds (layer 0 global, 1 and 2 local), a window that
    # 64-token rows exceed.
    "modernbert-tiny": _modernbert(3, 128, 2, 192, max_position_embeddings=512,
                                   local_attention=16),
}


def preset(name: str, **overrides) -> ModelConfig:
  if name not in PRESETS:
    fail(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}")
  return ModelConfig.from_dict({**PRESETS[name], **overrides})
