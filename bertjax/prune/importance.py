"""Head importance scores (Michel et al. 2019, "Are Sixteen Heads Really Better than One?").

Each head's output is multiplied by a mask xi_h = 1 (bertjax.models.pruning.with_head_masks);
a head's importance is the expected absolute gradient of the loss with respect to its xi_h,
|dL/dxi_h|, accumulated over batches (as their code does: the loss is each batch's mean, the
absolute value taken per batch), then divided by the number of batches. Scores are then
normalized per layer by their l2 norm, as in their code, so that layers are ranked together.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.core.errors import fail
from bertjax.models.config import ModelConfig
from bertjax.models.pruning import with_head_masks


def mask_gradients(loss_fn: Callable[[Any, Any], jax.Array], params, cfg: ModelConfig,
                   batch) -> list[jax.Array]:
  """dL/dxi per layer (<float32>[heads of layer i]) of `loss_fn(params, batch)` at xi = 1."""
  ones = [jnp.ones((cfg.layer_heads(i),), jnp.float32) for i in range(cfg.num_hidden_layers)]
  grads = jax.grad(lambda m: loss_fn(with_head_masks(params, cfg, m), batch))(ones)
  return list(grads)


def raw_importance(loss_fn: Callable[[Any, Any], jax.Array], params, cfg: ModelConfig,
                   batches: Iterable[Any]) -> np.ndarray:
  """<float64>[layers, num_attention_heads]: the mean over batches of |dL/dxi_h|, by the heads'
  original numbers; NaN where a head was already pruned."""
  step = jax.jit(lambda p, b: [jnp.abs(g) for g in mask_gradients(loss_fn, p, cfg, b)])
  total, n = None, 0
  for batch in batches:
    grads = step(params, batch)
    total = grads if total is None else [t + g for t, g in zip(total, grads)]
    n += 1
  if not n:
    fail("no evaluation batches to score heads on; check the task's dev set")
  out = np.full((cfg.num_hidden_layers, cfg.num_attention_heads), np.nan)
  for i, g in enumerate(total):
    out[i, list(cfg.kept_heads(i))] = np.asarray(g, np.float64) / n
  return out


def normalize_per_layer(scores: np.ndarray) -> np.ndarray:
  """Each layer's scores divided by their l2 norm (pruned heads, NaN, left out), as Michel et
  al.'s code does before ranking heads across layers."""
  norms = np.sqrt(np.nansum(np.square(scores), axis=-1, keepdims=True))
  return scores / (norms + 1e-20)


def head_importance(loss_fn: Callable[[Any, Any], jax.Array], params, cfg: ModelConfig,
                    batches: Iterable[Any]) -> np.ndarray:
  """Normalized importance <float64>[layers, num_attention_heads] (NaN: pruned heads)."""
  return normalize_per_layer(raw_importance(loss_fn, params, cfg, batches))
