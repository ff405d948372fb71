"""ELECTRA's objective: replaced token detection with a jointly trained masked-LM generator.

The generator (`config.electra.generator_hidden_fraction` of the discriminator's width) learns MLM
on the masked positions; tokens sampled from it replace those positions; the discriminator labels
every real token original or replaced. loss = generator MLM + `config.electra.disc_weight` (50 in
the paper) x discriminator binary cross-entropy averaged over the batch's real tokens.

Masking follows ELECTRA (`masking.mask_tokens`, strategy token): 85% [MASK], 0% random and
15% unchanged, since the generator's samples already supply the corruption a random token would.
The input needs no extra fields: the original text is the input with `masked_ids` written back.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from bertjax.data.masking import Masking
from bertjax.models.electra import ElectraPretrainingModel, generator_config
from bertjax.objective import Objective, masked_lm_terms, moved

# ELECTRA's corruption of the selected tokens: ([MASK], random, unchanged).
ELECTRA_REPLACE_PROBS = (0.85, 0.0, 0.15)
# Precision's denominator when no token is predicted "replaced": precision reads 0 there (sums of
# several batches: 0 unless one predicts something, whose count this leaves unchanged in float32).
_NONE_PREDICTED = 1e-9


class Rtd(Objective):
  name = "rtd"
  data_kind = "full"
  masking_strategy = "token"

  def masking(self, config) -> Masking:
    return dataclasses.replace(super().masking(config), replace_probs=ELECTRA_REPLACE_PROBS)

  def make_model(self, config, model_config):
    e = config.electra
    return ElectraPretrainingModel(model_config, generator_config(
        model_config, e.generator_hidden_fraction, e.generator_layer_fraction),
        disc_weight=float(e.disc_weight))

  def init_params(self, model, rng, batch):
    return model.init({"params": rng, "sample": jax.random.fold_in(rng, 1)},
                      **self.model_inputs(batch))["params"]

  def model_inputs(self, batch):
    keys = ("input_ids", "attention_mask", "token_type_ids", "masked_positions", "masked_ids",
            "masked_weights")
    return {k: batch[k] for k in keys}

  def denominators(self, batch):
    return {**super().denominators(batch),
            "tokens": jnp.maximum(jnp.sum(batch["attention_mask"].astype(jnp.float32)), 1.0)}

  def about(self, config) -> str:
    return (f"rtd: loss = the generator's MLM loss + {float(config.electra.disc_weight):g} x the "
            "discriminator's loss (rtd_loss), so it can rise while the discriminator learns; "
            "what should fall is rtd_loss, and rtd_accuracy should rise above "
            "rtd_baseline_accuracy (always answering 'original')")

  def reading(self, config, summary) -> str:
    loss, fell = moved(summary, "rtd_loss", down=True)
    last = summary.get("last_train") or {}
    line = f"rtd: the discriminator's {loss}"
    if fell is not None:
      line += " (falling, as it should)" if fell else " (not falling: it is not learning)"
    if "rtd_accuracy" in last and "rtd_baseline_accuracy" in last:
      beats = last["rtd_accuracy"] > last["rtd_baseline_accuracy"]
      line += (f"; rtd_accuracy {last['rtd_accuracy']:.4g} "
               f"{'beats' if beats else 'does not beat yet'} always answering 'original' "
               f"({last['rtd_baseline_accuracy']:.4g})")
    return line

  def loss(self, model, params, batch, rng, denominators, deterministic):
    dropout_rng, sample_rng = jax.random.split(rng)
    out = model.apply({"params": params}, **self.model_inputs(batch), deterministic=deterministic,
                      rngs={"dropout": dropout_rng, "sample": sample_rng})
    gen_loss, metrics = masked_lm_terms(out["mlm_logits"], batch["masked_ids"],
                                        batch["masked_weights"], denominators["mlm"])
    disc_loss, disc_metrics = rtd_terms(out["rtd_logits"], out["rtd_labels"],
                                        batch["attention_mask"], denominators["tokens"])
    return gen_loss + model.disc_weight * disc_loss, {**metrics, **disc_metrics}


def rtd_terms(logits, labels, attention_mask, denominator) -> tuple[jax.Array, dict]:
  """Binary cross-entropy and detection metrics over real tokens.

  logits <float32>[batch, seq] ("replaced" logits), labels <int32>[batch, seq] (1 = replaced),
  attention_mask <int32>[batch, seq]. Metrics are (numerator, denominator) sums: rtd_accuracy,
  rtd_precision / rtd_recall of "replaced", and rtd_baseline_accuracy, the accuracy of always
  answering "original", which a useful discriminator must beat. With no token predicted
  "replaced", precision is 0 (nothing found), not 0/0: its denominator is at least
  `_NONE_PREDICTED`, too small to move it otherwise.
  """
  real = attention_mask.astype(jnp.float32)
  y = labels.astype(jnp.float32)
  loss_sum = jnp.sum(optax.sigmoid_binary_cross_entropy(logits, y) * real)
  predicted = (logits > 0).astype(jnp.float32) * real
  actual = y * real
  correct = jnp.sum(jnp.where(predicted == actual, real, 0.0))
  true_positive = jnp.sum(predicted * actual)
  n = jnp.sum(real)
  return loss_sum / denominator, {
      "rtd_loss": (loss_sum, n),
      "rtd_accuracy": (correct, n),
      "rtd_precision": (true_positive, jnp.maximum(jnp.sum(predicted), _NONE_PREDICTED)),
      "rtd_recall": (true_positive, jnp.sum(actual)),
      "rtd_baseline_accuracy": (n - jnp.sum(actual), n),
  }
