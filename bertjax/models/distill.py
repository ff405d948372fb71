"""The student model of distillation: the encoder with an MLM or classification head and TinyBERT's
projection of its hidden states to the teacher's width (bertjax.objectives.distill)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from bertjax.models.architectures import architecture
from bertjax.models.config import ModelConfig
from bertjax.models.layers import Layered, Layers, dense_init


class Projection(nn.Module):
  """TinyBERT's W_h: <float>[..., student hidden] -> <float>[..., features] (the teacher's width).

  Identity-initialized when the widths match, so a student copied from the teacher starts with
  the teacher's own hidden states on both sides of the loss.
  """
  features: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    if d == self.features:
      init = lambda key, shape, dtype=jnp.float32: jnp.eye(shape[0], shape[1], dtype=dtype)
    else:
      init = dense_init()
    kernel = self.param("kernel", nn.with_logical_partitioning(init, ("embed", "embed_out")),
                        (d, self.features), jnp.float32)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                           ("embed_out",)),
                      (self.features,), jnp.float32)
    return x.astype(self.dtype) @ kernel.astype(self.dtype) + bias.astype(self.dtype)


class DistillModel(Layered):
  """The encoder with an MLM head (`head="mlm"`) or a classifier on the pooled output
  (`head="classifier"`), returning what distillation compares.

  Param names are those of `PretrainingModel` ({"encoder", "mlm"}) and `SequenceClassifier`
  ({"encoder", "classifier"}), plus "distill_proj" when `proj_layers` is set: a distilled student
  loads anywhere those models do (init_from, fine-tuning, conversion).

  Call: input_ids, attention_mask, token_type_ids <int32>[batch, seq]; masked_positions
  <int32>[batch, p] (mlm). Returns {"logits": <float32>[batch, p, vocab] (mlm) or
  <float32>[batch, num_labels], "hidden_states": (embeddings, layer 0, ...) <float>[batch, seq,
  hidden] or None, "attentions": per layer <float>[batch, heads, seq, seq] or None, "projected":
  {hidden_states index: <float>[batch, seq, proj_size]} for `proj_layers`}.
  """
  config: ModelConfig
  head: str = "mlm"
  num_labels: int = 0
  proj_layers: tuple[int, ...] = ()   # indices into hidden_states to pass through distill_proj
  proj_size: int = 0
  layers: Layers | None = None

  def setup(self):
    arch, cfg, L = architecture(self.config), self.config, self.layers
    self.encoder = arch.Encoder(cfg, layers=L)
    if self.head == "mlm":
      self.mlm = arch.MLMHead(cfg, layers=L)
    else:  # the architecture's own head, as SequenceClassifier's
      self.classifier = arch.SequenceHead(cfg, self.num_labels, layers=L)
    if self.proj_layers:
      self.distill_proj = Projection(self.proj_size, dtype=self.config.compute_dtype)

  def __call__(self, input_ids, attention_mask, token_type_ids, masked_positions=None, *,
               deterministic: bool = True, output_hidden_states: bool = False,
               output_attentions: bool = False):
    out = self.encoder(input_ids, attention_mask, token_type_ids, deterministic=deterministic,
                       output_hidden_states=output_hidden_states or bool(self.proj_layers),
                       output_attentions=output_attentions)
    if self.head == "mlm":
      logits = self.mlm(self.layers.gather(out.last_hidden_state, masked_positions), self.encoder)
    else:
      pooled = architecture(self.config).pool(self.config, out, attention_mask)
      logits = self.classifier(pooled, deterministic)
    projected = {i: self.distill_proj(out.hidden_states[i]) for i in self.proj_layers}
    return {"logits": logits, "hidden_states": out.hidden_states, "attentions": out.attentions,
            "projected": projected}
