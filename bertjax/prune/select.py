"""Which heads and layers go: the least important ones by a global ranking, and how many per step."""

from __future__ import annotations

import numpy as np

from bertjax.models.config import ModelConfig


def heads_to_remove(scores: np.ndarray, cfg: ModelConfig, count: int) -> dict[int, list[int]]:
  """The `count` least important heads over all layers ({layer: original head numbers}), never
  the last head of a layer. `scores` <float>[layers, num_attention_heads], NaN for pruned heads."""
  left = {i: cfg.layer_heads(i) for i in range(cfg.num_hidden_layers)}
  present = [(float(scores[i, h]), i, h) for i in range(cfg.num_hidden_layers)
             for h in cfg.kept_heads(i)]
  chosen: dict[int, list[int]] = {}
  for _, i, h in sorted(present):
    if count <= 0:
      break
    if left[i] > 1:
      chosen.setdefault(i, []).append(h)
      left[i] -= 1
      count -= 1
  return chosen


def layers_to_remove(raw_scores: np.ndarray, cfg: ModelConfig, count: int) -> list[int]:
  """The `count` layers whose heads matter least: the smallest sum of raw (not normalized)
  |dL/dxi| over their heads, a proxy for the layer's attention; never every layer."""
  count = min(count, cfg.num_hidden_layers - 1)
  sums = np.nansum(raw_scores, axis=-1)
  return sorted(int(i) for i in np.argsort(sums, kind="stable")[:max(count, 0)])
