"""SpanBERT's objective: masked language modelling of whole-word spans plus the span boundary
objective (SBO), on single contiguous segments without next sentence prediction.

The pipeline's 'span' masking (geometric span lengths, p=0.2 clipped at 10 words, until 15% of the
tokens are masked; see `bertjax.data.masking`) also yields, for every masked position, the
positions of its span's two boundary tokens and its offset inside the span; the SBO head predicts
the token from those alone. loss = MLM + SBO, both averaged over the batch's masked tokens.
The head's position embedding is its own table of offsets inside the span (SpanBERT's relative
p_{i-s+1}), not the encoder's, so it serves ModernBERT (rotary positions, no table) unchanged.
"""

from __future__ import annotations

import jax.numpy as jnp

from bertjax.core.errors import fail
from bertjax.data.masking import Masking
from bertjax.models.heads import SpanBoundaryHead
from bertjax.models.pretraining import PretrainingModel
from bertjax.objective import Objective, learns, masked_lm_terms

SPAN_KEYS = ("span_left", "span_right", "span_offset")


class SpanBertModel(PretrainingModel):
  """Encoder + MLM head + span boundary head (params {"encoder", "mlm", "sbo"}).

  Returns a dict: `mlm_logits` and `sbo_logits` <float32>[batch, predictions, vocab] at
  `masked_positions`, and the encoder's `output`.
  """
  pair_head: bool = False

  def setup(self):
    super().setup()
    self.sbo = SpanBoundaryHead(self.config, layers=self.layers)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, masked_positions=None,
               span_left=None, span_right=None, span_offset=None, *, segment_ids=None,
               deterministic: bool = True):
    if span_left is None or masked_positions is None:
      return super().__call__(input_ids, attention_mask, token_type_ids, masked_positions,
                              segment_ids=segment_ids, deterministic=deterministic)
    # One gather for both heads: the encoder returns the masked positions, then the left and the
    # right boundaries, so its last layer computes only those rows (model.gather_last_layer).
    p = masked_positions.shape[1]
    positions = jnp.concatenate([masked_positions, span_left, span_right], axis=1)
    out = self.encoder(input_ids, attention_mask, token_type_ids, segment_ids=segment_ids,
                       output_positions=positions, deterministic=deterministic)
    states = out.last_hidden_state
    rows = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), masked_positions.shape)
    return {"output": out.replace(last_hidden_state=states[:, :p]),
            "mlm_logits": self.mlm(states[:, :p], self.encoder),
            "sbo_logits": self.sbo(states, rows + p, rows + 2 * p, span_offset, self.encoder)}


class SpanSbo(Objective):
  name = "span_sbo"
  data_kind = "single"
  masking_strategy = "span"
  output_rows_per_prediction = 3  # the masked token and its span's two boundaries

  def masking(self, config) -> Masking:
    masking = super().masking(config)
    if masking.strategy != "span":
      fail(f"objective span_sbo needs span masking (the SBO head reads each span's boundaries), "
           f"not masking.strategy={masking.strategy!r}; set --config.masking.strategy=span or "
           f"leave it empty")
    return masking

  def make_model(self, config, model_config):
    del config
    return SpanBertModel(model_config)

  def init_batch(self, config, batch_size, seq_len, num_predictions):
    batch = super().init_batch(config, batch_size, seq_len, num_predictions)
    for key in SPAN_KEYS:
      batch[key] = jnp.zeros((batch_size, num_predictions), jnp.int32)
    return batch

  def model_inputs(self, batch):
    return {**super().model_inputs(batch), **{k: batch[k] for k in SPAN_KEYS}}

  def reading(self, config, summary) -> str:
    """Whether each head learns, the boundary head's by its own loss (sbo_loss). Equal
    accuracies early on are both heads predicting the same most frequent tokens, not one metric
    read twice (tests/test_objectives.py: test_sbo_accuracy_is_the_boundary_heads_own)."""
    line = (f"span_sbo: {learns(summary, 'mlm_loss', 'the MLM head')}; "
            f"{learns(summary, 'sbo_loss', 'the boundary head')}")
    last = summary.get("last_train") or {}
    if "sbo_accuracy" in last and last.get("sbo_accuracy") == last.get("mlm_accuracy"):
      line += (f"; sbo_accuracy equals mlm_accuracy ({float(last['sbo_accuracy']):.4g}): both "
               "heads still predict the same most frequent tokens")
    return line

  def loss(self, model, params, batch, rng, denominators, deterministic):
    out = self.apply(model, params, batch, rng, deterministic)
    mlm_loss, metrics = masked_lm_terms(out["mlm_logits"], batch["masked_ids"],
                                        batch["masked_weights"], denominators["mlm"])
    sbo_loss, sbo_metrics = masked_lm_terms(out["sbo_logits"], batch["masked_ids"],
                                            batch["masked_weights"], denominators["mlm"],
                                            prefix="sbo")
    return mlm_loss + sbo_loss, {**metrics, **sbo_metrics}
