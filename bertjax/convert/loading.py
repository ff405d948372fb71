"""`bertjax.load`: any model folder as runnable Flax modules, the encoder and its head."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.convert.models import build_model
from bertjax.convert.sources import Source, TaskHead, read_source
from bertjax.core.errors import fail
from bertjax.models.classifiers import SequenceClassifier, TokenClassifier
from bertjax.models.config import ModelConfig
from bertjax.models.architectures import encoder_for


@dataclasses.dataclass
class Loaded:
  """A model folder loaded for use.

  model, params, config: the `Encoder`, its parameters and `ModelConfig` (unpacking a `Loaded`
    gives these three, as `bertjax.load` always returned).
  head_model, head_params: the whole model with its head (a fine-tuned `SequenceClassifier` /
    `TokenClassifier`, or the pretraining model: `PretrainingModel`, `ElectraDiscriminator`;
    the bare `Encoder` when there is no head) and its full parameter tree.
  task: the fine-tuning head (kind, num_labels, label names), None for pretrained models.
  heads: the pretraining heads in head_params (mlm, pair, rtd).
  untrained: parts never trained (see `bertjax.convert.sources.Source`).
  source: everything read (step, kind, tokenizer folder).
  """
  model: nn.Module  # an `Encoder` (ModernBERT: a `ModernBertEncoder`)
  params: Any
  config: ModelConfig
  head_model: nn.Module
  head_params: Any
  task: TaskHead | None
  heads: tuple[str, ...]
  untrained: tuple[str, ...]
  source: Source

  def __iter__(self) -> Iterator[Any]:
    return iter((self.model, self.params, self.config))

  def logits(self, input_ids, attention_mask, token_type_ids):
    """The task head's logits, deterministic: <float32>[batch, num_labels] (sequence) or
    [batch, seq, num_labels] (token; QA: [..., 0] start and [..., 1] end logits)."""
    if self.task is None:
      fail(f"{self.source.path} has no task head (pretraining heads: "
           f"{', '.join(self.heads) or 'none'}); fine-tune it, or call head_model.apply")
    return self.head_model.apply({"params": self.head_params}, jnp.asarray(input_ids),
                                 jnp.asarray(attention_mask), jnp.asarray(token_type_ids),
                                 deterministic=True)


def _head_model(cfg: ModelConfig, task: TaskHead | None, heads: tuple[str, ...]) -> nn.Module:
  if task is None:
    return build_model(cfg, heads)
  reads = {"features": task.features, "layers": task.layers, "pooling": task.pooling}
  if task.kind == "sequence":
    return SequenceClassifier(cfg, task.num_labels, **reads)
  return TokenClassifier(cfg, task.num_labels, head_name=task.name, **reads)


def load(path: str | os.PathLike, step: int | None = None) -> Loaded:
  """Loads a converted folder, a pretraining or fine-tuning workdir, or a best/ folder."""
  source = read_source(path, step)
  c = source.converted
  params = jax.tree.map(jnp.asarray, c.params)
  return Loaded(encoder_for(c.config), params["encoder"], c.config,
                _head_model(c.config, source.task, c.heads), params, source.task, c.heads,
                source.untrained, source)
