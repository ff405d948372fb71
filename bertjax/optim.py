"""Optimizer and learning-rate schedule, assembled from optax pieces.

LAMB (the large-batch recipe of "Large Batch Optimization for Deep Learning") and AdamW, both
with weight decay kept off LayerNorm parameters and biases; linear warmup, then linear or
polynomial decay; global-norm clipping; optional layer-wise learning-rate decay (ELECTRA's
fine-tuning recipe). The learning rate is injected as a hyperparameter so it can be logged.
"""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from bertjax.errors import fail

OPTIMIZERS = ("adamw", "lamb", "adam", "sgd")
DECAYS = ("linear", "polynomial", "constant")


def make_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warmup to `learning_rate`, then linear ('linear') or polynomial decay to `end`."""
  o = config.optimizer
  total = max(int(config.total_steps), 1)
  warmup = int(o.warmup_steps if o.warmup_steps >= 0 else round(o.warmup_fraction * total))
  warmup = min(warmup, total)
  peak = config.learning_rate
  end = peak * o.end_learning_rate_factor
  power = 1.0 if o.decay == "linear" else o.decay_power
  if o.decay not in DECAYS:
    fail(f"unknown optimizer.decay={o.decay!r}; use linear, polynomial or constant")
  if o.decay == "constant":
    decay = optax.constant_schedule(peak)
  else:
    decay = optax.polynomial_schedule(peak, end, power, max(total - warmup, 1))
  if warmup == 0:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def decay_mask(params):
  """True where weight decay applies: kernels and embeddings, not LayerNorm or biases."""
  def keep(path, _):
    names = [getattr(p, "key", str(p)) for p in path]
    return not (names[-1] in ("bias", "scale") or any("layer_norm" in n for n in names))
  return jax.tree_util.tree_map_with_path(keep, params)


def prunable(params):
  """True for the tensors magnitude pruning acts on: the kernels of the encoder's layers (the
  attention's query, key, value and output, the feed-forward's intermediate and output); not
  embeddings, the embedding projection, the pooler, task heads, LayerNorm or biases."""
  def keep(path, _):
    names = [getattr(p, "key", str(p)) for p in path]
    return names[-1] == "kernel" and any(re.fullmatch(r"layer_\d+|layers", n) for n in names)
  return jax.tree_util.tree_map_with_path(keep, params)


class KeepZerosState(NamedTuple):
  count: jax.Array  # <int32>[]: updates so far
  live: Any         # <bool> tree like the params: False where a pruned weight must stay zero
  size: jax.Array   # <int32>[]: weights in the selected tensors


def held_sparsity(opt_state) -> jax.Array | None:
  """The fraction of the selected weights `keep_pruned_zeros` holds at zero (None: no such
  link in this optimizer), read from its state after an update."""
  found = [s for s in jax.tree_util.tree_leaves(opt_state, is_leaf=lambda x: isinstance(
      x, KeepZerosState)) if isinstance(s, KeepZerosState)]
  if not found:
    return None
  s = found[0]
  dead = sum(jnp.sum(~m) for m in jax.tree.leaves(s.live))
  return dead.astype(jnp.float32) / jnp.maximum(s.size, 1).astype(jnp.float32)


def keep_pruned_zeros(selected) -> optax.GradientTransformation:
  """Holds pruned weights at exactly zero: the last link of the chain multiplies every update by
  a fixed mask, taken at the first update from the weights then (zero: pruned) in the tensors
  `selected` marks (a bool tree like the params, e.g. `prunable`). Weight decay, momentum and
  Adam's moments act before it, so whatever they hold, a masked weight gets a zero update. The
  mask lives in the optimizer state: a resumed run keeps it."""
  def init(params):
    size = sum(math.prod(jnp.shape(p)) for p, s in zip(jax.tree.leaves(params),
                                                       jax.tree.leaves(selected)) if s)
    return KeepZerosState(jnp.zeros((), jnp.int32),
                          jax.tree.map(lambda p: jnp.ones(jnp.shape(p), bool), params),
                          jnp.asarray(size, jnp.int32))

  def update(updates, state, params=None):
    if params is None:
      raise ValueError("keep_pruned_zeros needs the params in update()")
    first = state.count == 0
    live = jax.tree.map(lambda s, p, m: jnp.where(first, p != 0, m) if s else m,
                        selected, params, state.live)
    updates = jax.tree.map(lambda u, m: jnp.where(m, u, jnp.zeros_like(u)), updates, live)
    return updates, KeepZerosState(state.count + 1, live, state.size)

  return optax.GradientTransformation(init, update)


def layerwise_lr_scale(params, num_layers: int, decay: float):
  """Multiplier per parameter: decay**(num_layers - depth); embeddings deepest, heads 1."""
  def scale(path, _):
    names = [getattr(p, "key", str(p)) for p in path]
    if "embeddings" in names or "embedding_projection" in names:
      depth = 0
    else:
      layer = next((int(m.group(1)) for n in names if (m := re.fullmatch(r"layer_(\d+)", n))), None)
      depth = layer + 1 if layer is not None else num_layers + 1
    return decay ** max(num_layers + 1 - depth, 0)
  return jax.tree_util.tree_map_with_path(scale, params)


def _scale_by_tree(scales) -> optax.GradientTransformation:
  def init(params):
    del params
    return optax.EmptyState()

  def update(updates, state, params=None):
    del params
    return jax.tree.map(lambda u, s: u * s, updates, scales), state

  return optax.GradientTransformation(init, update)


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """Scales all gradients by min(1, max_norm / global norm): `optax.clip_by_global_norm` (to
  rounding), as one multiply by a scalar.

  optax divides each gradient by the norm and selects between that and the original. XLA keeps
  a divide with two consumers (Adam's two moments) as its own buffer, so every clipped gradient
  was materialized next to the raw one: the optimizer phase then set the step's peak (+420 MB on
  bert-base). A multiply by a scalar is fused into each consumer instead.
  """
  def update(updates, state, params=None):
    del params
    scale = jnp.minimum(1.0, max_norm / optax.tree.norm(updates))
    return jax.tree.map(lambda g: (g * scale).astype(g.dtype), updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(config: ml_collections.ConfigDict, params=None,
                   num_layers: int | None = None) -> optax.GradientTransformation:
  o = config.optimizer
  if o.name not in OPTIMIZERS:
    fail(f"unknown optimizer.name={o.name!r}; use one of {', '.join(OPTIMIZERS)}")
  schedule = make_schedule(config)

  @optax.inject_hyperparams
  def build(learning_rate):
    if o.name == "lamb":
      opt = optax.lamb(learning_rate, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay,
                       mask=decay_mask)
    elif o.name == "adamw":
      opt = optax.adamw(learning_rate, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay,
                        mask=decay_mask)
    elif o.name == "adam":
      opt = optax.adam(learning_rate, b1=o.b1, b2=o.b2, eps=o.eps)
    else:
      opt = optax.sgd(learning_rate)
    parts = [clip_by_global_norm(o.grad_clip_norm)] if o.grad_clip_norm > 0 else []
    parts.append(opt)
    if o.get("layerwise_lr_decay", 1.0) != 1.0 and params is not None:
      parts.append(_scale_by_tree(layerwise_lr_scale(params, num_layers, o.layerwise_lr_decay)))
    if o.get("keep_pruned", False):
      if params is None:
        fail("optimizer.keep_pruned needs the parameter tree to build its mask")
      parts.append(keep_pruned_zeros(prunable(params)))
    return optax.chain(*parts)

  return build(learning_rate=schedule)


def current_learning_rate(opt_state) -> jax.Array:
  return opt_state.hyperparams["learning_rate"]
