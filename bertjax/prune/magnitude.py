"""Unstructured magnitude pruning: the smallest weights of the encoder layers' kernels set to zero.

Which tensors: `bertjax.runtime.optim.prunable` (every Dense kernel inside the encoder's layers; not
embeddings, the embedding projection, the pooler, task heads, LayerNorm or biases). `scope`
"global" ranks all those weights together (one threshold), "layer" prunes each tensor to the
target on its own. Fine-tuning afterwards with `--config.optimizer.keep_pruned=True` keeps the
zeros exactly (bertjax.runtime.optim.keep_pruned_zeros).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from bertjax.core.errors import fail
from bertjax.runtime.optim import prunable

SCOPES = ("global", "layer")


def _prune_tensor(x: np.ndarray, count: int) -> np.ndarray:
  """`x` with its `count` smallest-magnitude weights zeroed (exactly `count`: ties by position)."""
  flat = np.asarray(x).reshape(-1).copy()
  if count > 0:
    flat[np.argsort(np.abs(flat), kind="stable")[:count]] = 0
  return flat.reshape(np.shape(x))


def magnitude_prune(params, sparsity: float, scope: str = "global") -> Any:
  """`params` with round(sparsity * n) of the prunable weights zeroed, n counted globally or per
  tensor (`scope`); weights already zero count as pruned (they are the smallest)."""
  if not 0.0 <= sparsity < 1.0:
    fail(f"sparsity={sparsity} must be in [0, 1)")
  if scope not in SCOPES:
    fail(f"unknown sparsity scope {scope!r}; use one of {', '.join(SCOPES)}")
  selected = prunable(params)
  leaves, treedef = jax.tree_util.tree_flatten(params)
  chosen = jax.tree_util.tree_leaves(selected)
  if not any(chosen):
    fail("these parameters have no encoder layer kernels to prune")
  host = [np.asarray(x) for x in leaves]
  if scope == "layer":
    out = [_prune_tensor(x, int(round(sparsity * x.size))) if c else x for x, c in zip(host, chosen)]
    return jax.tree_util.tree_unflatten(treedef, out)
  pool = np.concatenate([x.reshape(-1) for x, c in zip(host, chosen) if c])
  order = np.argsort(np.abs(pool), kind="stable")[:int(round(sparsity * pool.size))]
  mask = np.ones(pool.size, bool)
  mask[order] = False
  out, start = [], 0
  for x, c in zip(host, chosen):
    if c:
      out.append(np.where(mask[start:start + x.size].reshape(x.shape), x, 0).astype(x.dtype))
      start += x.size
    else:
      out.append(x)
  return jax.tree_util.tree_unflatten(treedef, out)


def sparsity_of(params) -> float:
  """The fraction of the prunable weights that are exactly zero."""
  chosen = jax.tree_util.tree_leaves(prunable(params))
  leaves = [np.asarray(x) for x, c in zip(jax.tree_util.tree_leaves(params), chosen) if c]
  total = sum(x.size for x in leaves)
  return float(sum(int(np.sum(x == 0)) for x in leaves) / total) if total else 0.0
