"""BERT's objective: masked language modelling plus next sentence prediction."""

from __future__ import annotations

import jax.numpy as jnp

from bertjax.objective import Objective, above_chance, classification_terms, learns, masked_lm_terms


class MlmNsp(Objective):
  name = "mlm_nsp"
  data_kind = "nsp"
  masking_strategy = "token"
  pair_head = True
  pair_name = "nsp"
  output_rows_per_prediction = 1

  def denominators(self, batch):
    return {**super().denominators(batch),
            "pair": jnp.asarray(batch["input_ids"].shape[0], jnp.float32)}

  def reading(self, config, summary) -> str:
    """Whether the MLM head learns and, with a sentence-pair head, whether it beats guessing (a
    tiny quickstart's stays at chance, README says)."""
    parts = [learns(summary, "mlm_loss", "the MLM head")]
    if self.pair_head:
      parts.append(above_chance(summary, f"{self.pair_name}_accuracy", 0.5))
    return f"{self.name}: " + "; ".join(parts)

  def loss(self, model, params, batch, rng, denominators, deterministic):
    out = self.apply(model, params, batch, rng, deterministic)
    loss, metrics = masked_lm_terms(out["mlm_logits"], batch["masked_ids"], batch["masked_weights"],
                                    denominators["mlm"])
    if self.pair_head:
      pair_loss, pair_metrics = classification_terms(
          out["pair_logits"], batch["next_sentence_label"], denominators["pair"], self.pair_name)
      loss, metrics = loss + pair_loss, {**metrics, **pair_metrics}
    return loss, metrics


class Mlm(MlmNsp):
  """RoBERTa: MLM only, full-length contiguous segments across document boundaries."""
  name = "mlm"
  data_kind = "full"
  pair_head = False


class MlmSop(MlmNsp):
  """ALBERT: MLM with n-gram masking plus sentence order prediction."""
  name = "mlm_sop"
  data_kind = "sop"
  masking_strategy = "ngram"
  pair_name = "sop"
