"""A model's architecture found by its name: `bertjax.models.<model.architecture>`.

Each architecture's module exposes its encoder and heads under the same names: `Encoder`,
`MLMHead`, `PairHead` (NSP/SOP; refused where the architecture has none), `SequenceHead` and
`TokenHead` (fine-tuning), and `pool(cfg, encoder_output, attention_mask)` (a sequence task's
input). Each is built as `Encoder(cfg, ..., layers=...)`: the models holding them hand down the
`Layers` they resolved once (bertjax.models.layers). A new architecture is one module of that
name (and its entry in `models.config.ARCHITECTURES`).
"""

from __future__ import annotations

import importlib
import types

import flax.linen as nn

from bertjax.models.config import ModelConfig


def architecture(cfg: ModelConfig) -> types.ModuleType:
  """The module of `cfg.architecture` (imported when first asked for)."""
  return importlib.import_module(f"bertjax.models.{cfg.architecture}")


def encoder_for(cfg: ModelConfig, **kwargs) -> nn.Module:
  """The encoder module of `cfg.architecture`."""
  return architecture(cfg).Encoder(cfg, **kwargs)


def mlm_head_for(cfg: ModelConfig, **kwargs) -> nn.Module:
  """The MLM head of `cfg.architecture`."""
  return architecture(cfg).MLMHead(cfg, **kwargs)
