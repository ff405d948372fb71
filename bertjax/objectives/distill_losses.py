"""Distillation loss terms: pure functions of the student's and the teacher's outputs
(bertjax.objectives.distill describes each)."""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import optax

from bertjax.objectives.distill_settings import Settings


def soft_cross_entropy(student_logits, teacher_logits, temperature: float):
  """Per-position T^2 * CE(softmax(teacher / T), softmax(student / T)) and T^2 * KL(teacher ||
  student), both <float32>[...]. The KL (CE minus the teacher's entropy) has the same gradient
  and reaches 0 when the student matches, so it is the readable metric."""
  t = jnp.asarray(temperature, jnp.float32)
  teacher_log_probs = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / t, axis=-1)
  targets = jnp.exp(teacher_log_probs)
  log_probs = jax.nn.log_softmax(student_logits.astype(jnp.float32) / t, axis=-1)
  # T^2 keeps the soft term's gradient scale independent of T (Hinton et al., 2015).
  ce = -jnp.sum(targets * log_probs, axis=-1) * t * t
  kl = jnp.sum(targets * (teacher_log_probs - log_probs), axis=-1) * t * t
  return ce, kl


def cosine_distance(a, b, eps: float = 1e-8):
  """1 - cos(a, b) along the last axis: <float32>[...]."""
  a, b = a.astype(jnp.float32), b.astype(jnp.float32)
  dot = jnp.sum(a * b, -1)
  norms = jnp.sqrt(jnp.sum(a * a, -1)) * jnp.sqrt(jnp.sum(b * b, -1))
  return 1.0 - dot / jnp.maximum(norms, eps)


def distill_denominators(attention_mask, weights) -> dict[str, jax.Array]:
  """Whole-batch counts: soft-target positions (`weights`: masked positions or rows), real
  tokens, and real (query, key) pairs."""
  real = attention_mask.astype(jnp.float32)
  per_row = jnp.sum(real, axis=-1)
  return {"soft": jnp.maximum(jnp.sum(weights.astype(jnp.float32)), 1.0),
          "tokens": jnp.maximum(jnp.sum(real), 1.0),
          "pairs": jnp.maximum(jnp.sum(per_row * per_row), 1.0)}


def distillation_terms(student: Mapping[str, Any], teacher: Mapping[str, Any], labels,
                       weights, attention_mask, denominators: Mapping[str, jax.Array],
                       settings: Settings, *, hard_prefix: str = "mlm",
                       regression: bool = False) -> tuple[jax.Array, dict]:
  """The weighted distillation loss and its metrics from both models' outputs.

  student / teacher: DistillModel outputs. logits <float32>[*lead, classes] where lead is
  [batch, p] (MLM at masked positions) or [batch] (one prediction per example). labels
  <int32>[*lead] (float32 for regression); weights <float32>[*lead] (0: padding);
  attention_mask <int32>[batch, seq]. denominators: `distill_denominators` of the whole batch.
  Returns (loss, {name: (numerator, denominator)}).
  """
  s = settings
  w = weights.astype(jnp.float32)
  s_logits, t_logits = student["logits"], teacher["logits"]
  metrics: dict[str, tuple[jax.Array, jax.Array]] = {}
  n = jnp.sum(w)
  loss = jnp.zeros((), jnp.float32)

  # The student's own loss on the true labels; its metrics are reported even at weight 0.
  if regression:
    hard = jnp.sum(jnp.square(s_logits[..., 0] - labels.astype(jnp.float32)) * w)
    metrics[f"{hard_prefix}_mse"] = (hard, n)
  else:
    ce = optax.softmax_cross_entropy_with_integer_labels(s_logits, labels.astype(jnp.int32))
    hard = jnp.sum(ce * w)
    s_pred, t_pred = jnp.argmax(s_logits, -1), jnp.argmax(t_logits, -1)
    metrics[f"{hard_prefix}_loss"] = (hard, n)
    accuracy = "accuracy" if hard_prefix == "task" else f"{hard_prefix}_accuracy"
    metrics[accuracy] = (jnp.sum((s_pred == labels) * w), n)
    metrics[f"teacher_{accuracy}"] = (jnp.sum((t_pred == labels) * w), n)
    metrics["agreement"] = (jnp.sum((s_pred == t_pred) * w), n)
  if s.hard_weight:
    loss += s.hard_weight * hard / denominators["soft"]

  if s.soft_weight:
    if regression:
      soft = jnp.sum(jnp.square(s_logits[..., 0] - t_logits[..., 0].astype(jnp.float32)) * w)
      metrics["soft_mse"] = (soft, n)
    else:
      ce, kl = soft_cross_entropy(s_logits, t_logits, s.temperature)
      soft = jnp.sum(ce * w)
      metrics["soft_ce"] = (soft, n)
      metrics["soft_kl"] = (jnp.sum(kl * w), n)
    loss += s.soft_weight * soft / denominators["soft"]

  real = attention_mask.astype(jnp.float32)
  tokens = jnp.sum(real)
  if s.cosine_weight:
    s_last, t_last = student["hidden_states"][-1], teacher["hidden_states"][-1]
    if s_last.shape[-1] != t_last.shape[-1]:  # different widths: compare through W_h
      s_last = student["projected"][len(student["hidden_states"]) - 1]
    cos = jnp.sum(cosine_distance(s_last, t_last) * real)
    metrics["cosine_loss"] = (cos, tokens)
    loss += s.cosine_weight * cos / denominators["tokens"]

  if s.hidden_weight:
    width = teacher["hidden_states"][-1].shape[-1]
    total = jnp.zeros((), jnp.float32)
    for i, j in s.layer_map:
      diff = (student["projected"][i + 1].astype(jnp.float32)
              - teacher["hidden_states"][j + 1].astype(jnp.float32))
      total += jnp.sum(jnp.sum(jnp.square(diff), -1) * real)
    metrics["hidden_mse"] = (total, tokens * width)
    loss += s.hidden_weight * total / (denominators["tokens"] * width)

  if s.attention_weight:
    pairs = real[:, None, :, None] * real[:, None, None, :]   # [batch, 1, q, k]
    heads = teacher["attentions"][0].shape[1]
    total = jnp.zeros((), jnp.float32)
    for i, j in s.layer_map:
      diff = (student["attentions"][i].astype(jnp.float32)
              - teacher["attentions"][j].astype(jnp.float32))
      total += jnp.sum(jnp.square(diff) * pairs)
    metrics["attention_mse"] = (total, jnp.sum(pairs) * heads)
    loss += s.attention_weight * total / (denominators["pairs"] * heads)
  return loss, metrics
