"""Optimizer and learning-rate schedule, assembled from optax pieces.

LAMB (the large-batch recipe of "Large Batch Optimization for Deep Learning"), AdamW and
StableAdamW (AdamW with Adafactor's update clipping per tensor, ModernBERT's optimizer), all with
weight decay kept off LayerNorm parameters and biases; linear warmup, then linear or polynomial
decay, or warmup-stable-decay (a plateau, then a short linear or 1-sqrt decay); global-norm
clipping; optional layer-wise learning-rate decay (ELECTRA's fine-tuning recipe). The learning
rate is injected as a hyperparameter so it can be logged.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from bertjax.core.errors import fail

OPTIMIZERS = ("adamw", "lamb", "adam", "sgd", "stableadamw")
DECAYS = ("linear", "polynomial", "constant", "wsd")
WSD_SHAPES = ("1-sqrt", "linear")  # the decay of a warmup-stable-decay schedule


def make_schedule(config: ml_collections.ConfigDict,
                  total_steps: int | None = None) -> optax.Schedule:
  """Linear warmup to `learning_rate`, then linear ('linear') or polynomial decay to `end`, or
  ('wsd') the peak held until the last `wsd_decay_fraction` of the steps, which decay to `end`.
  `total_steps`: the run's (its plan's schedule, bertjax/trainer/run_plan.py), else
  config.total_steps."""
  o = config.optimizer
  total = max(int(config.total_steps if total_steps is None else total_steps), 1)
  warmup = int(o.warmup_steps if o.warmup_steps >= 0 else round(o.warmup_fraction * total))
  warmup = min(warmup, total)
  peak = config.learning_rate
  end = peak * o.end_learning_rate_factor
  power = 1.0 if o.decay == "linear" else o.decay_power
  if o.decay == "wsd":
    return _warmup_stable_decay(o, total, warmup, peak, end)
  if o.decay == "constant":
    decay = optax.constant_schedule(peak)
  else:
    decay = optax.polynomial_schedule(peak, end, power, max(total - warmup, 1))
  if warmup == 0:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def _warmup_stable_decay(o, total: int, warmup: int, peak: float, end: float) -> optax.Schedule:
  """ModernBERT's trapezoidal schedule ("warmup-stable-decay"): linear warmup, the peak, then
  over the last `decay` steps lr = end + (peak - end) * (1 - f(x)), x the fraction of the decay
  done, f(x) = sqrt(x) ('1-sqrt', Hägele et al. 2024, as ModernBERT's decay) or x ('linear')."""
  shape = o.get("wsd_decay_shape", "1-sqrt")
  decay = min(int(round(o.get("wsd_decay_fraction", 0.1) * total)), total - warmup)
  stable = total - warmup - decay

  def decaying(count):
    x = jnp.clip(count / max(decay, 1), 0.0, 1.0)
    return end + (peak - end) * (1.0 - (jnp.sqrt(x) if shape == "1-sqrt" else x))

  parts = [optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(peak), decaying]
  bounds = [warmup, warmup + stable]
  keep = [i for i, n in enumerate((warmup, stable, decay)) if n > 0 or i == 1]
  return optax.join_schedules([parts[i] for i in keep],
                              [bounds[i - 1] for i in keep[1:]])


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


def _lr_decay_power(path, num_layers: int) -> int:
  """k of a parameter's layer-wise factor decay**k: num_layers + 1 - depth, at least 0."""
  names = [getattr(p, "key", str(p)) for p in path]
  if "embeddings" in names or "embedding_projection" in names:
    depth = 0
  else:
    layer = next((int(m.group(1)) for n in names if (m := re.fullmatch(r"layer_(\d+)", n))), None)
    depth = layer + 1 if layer is not None else num_layers + 1
  return max(num_layers + 1 - depth, 0)


def layerwise_lr_scale(params, num_layers: int, decay: float):
  """Multiplier per parameter: decay**(num_layers - depth); embeddings deepest, heads 1."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: decay ** _lr_decay_power(path, num_layers), params)


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
  bert-base). A multiply by a scalar is fused into each consumer instead. A choice of the kernel
  sets (`bertjax.models.kernels`, `scalar_clipping`), which the trainer passes to
  `make_optimizer`.
  """
  def update(updates, state, params=None):
    del params
    scale = jnp.minimum(1.0, max_norm / optax.tree.norm(updates))
    return jax.tree.map(lambda g: (g * scale).astype(g.dtype), updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def clip_updates_per_tensor(inner: optax.GradientTransformation, b2: float,
                            eps: float) -> optax.GradientTransformation:
  """StableAdamW's update clipping (Wortsman et al. 2023, "Stable and low-precision training for
  large-scale vision-language models"): each tensor's update from `inner` is divided by
  max(1, RMS), RMS = sqrt(mean(g_t**2 / max(v_hat_t, eps**2))), Adafactor's clipping as a
  per-tensor learning-rate factor. `inner` is a chain whose first link is `optax.scale_by_adam`
  (with this `b2`): v_hat_t is its second moment after the update, bias-corrected. Whatever
  `inner` adds after Adam (weight decay) is scaled by the same factor, as optimi's StableAdamW
  scales the decay by the clipped learning rate."""
  def update(updates, state, params=None):
    grads = updates
    updates, state = inner.update(updates, state, params)
    adam = state[0]
    correction = 1.0 - b2 ** adam.count.astype(jnp.float32)

    def clipped(u, g, nu):
      g = g.astype(jnp.float32)
      v_hat = nu.astype(jnp.float32) / correction
      rms = jnp.sqrt(jnp.mean(g * g / jnp.maximum(v_hat, eps * eps)))
      return (u / jnp.maximum(1.0, rms)).astype(u.dtype)

    return jax.tree.map(clipped, updates, grads, adam.nu), state

  return optax.GradientTransformation(inner.init, update)


def stable_adamw(learning_rate, b1: float, b2: float, eps: float, weight_decay: float,
                 mask=None) -> optax.GradientTransformation:
  """StableAdamW as optax pieces: Adam's scaling, decoupled weight decay on the `mask`ed tensors,
  the per-tensor update clipping over both, then the learning rate. Each step is
  theta -= lr_t / max(1, RMS) * (m_hat / (sqrt(v_hat) + eps) + weight_decay * theta), optimi's
  StableAdamW (with optimizer.fully_decoupled_weight_decay, weight_decay arrives here already
  divided by the peak learning rate: optimi's decouple_lr=True, ModernBERT's
  decoupled_stableadamw)."""
  inner = optax.chain(optax.scale_by_adam(b1, b2, eps),
                      optax.add_decayed_weights(weight_decay, mask))
  return optax.chain(clip_updates_per_tensor(inner, b2, eps),
                     optax.scale_by_learning_rate(learning_rate))


def decay_coefficient(config: ml_collections.ConfigDict) -> float:
  """The weight decay passed to the optimizer: `weight_decay`, or with
  `fully_decoupled_weight_decay` weight_decay / learning_rate (the peak), so that each step
  decays by (lr_t / peak) * weight_decay, following the schedule but not the peak's size
  (Loshchilov & Hutter's decoupling; optimi's decouple_lr)."""
  o = config.optimizer
  if not o.get("fully_decoupled_weight_decay", False):
    return o.weight_decay
  return o.weight_decay / config.learning_rate if config.learning_rate > 0 else 0.0


# What `optimizer.fused_update` can run over grouped buffers exactly: their updates are
# elementwise given the group's weight decay and learning-rate factor. LAMB's trust ratio and
# StableAdamW's update clipping are norms per parameter tensor, which a buffer of many tensors
# does not have.
FUSED_OPTIMIZERS = ("adamw", "adam", "sgd")


class Group(NamedTuple):
  """What the update of a parameter depends on beyond its values: one flat buffer per distinct
  group (`grouped_update`)."""
  dtype: str
  decay: bool          # weight decay applies (`decay_mask`)
  lr_power: int | None  # layer-wise learning-rate factor decay**lr_power (None: no such factor)
  pruned: bool         # selected by optimizer.keep_pruned (`prunable`)

  @property
  def name(self) -> str:
    """The buffer's key in the optimizer state (and the checkpoint): letters, digits, '_'."""
    name = f"{self.dtype}_{'decay' if self.decay else 'no_decay'}"
    if self.lr_power is not None:
      name += f"_lr_power_{self.lr_power}"
    return name + ("_pruned" if self.pruned else "")


def parameter_groups(tree, num_layers: int | None = None, pruned: bool = False) -> list[Group]:
  """The `Group` of each leaf of `tree` (a parameter, gradient or update tree), in leaf order:
  its dtype, whether it is decayed, its layer-wise power (with `num_layers`; None: no layer-wise
  decay) and, with `pruned`, whether keep_pruned selects it."""
  decays = jax.tree.leaves(decay_mask(tree))
  selected = jax.tree.leaves(prunable(tree)) if pruned else None
  groups = []
  for i, (path, leaf) in enumerate(jax.tree_util.tree_flatten_with_path(tree)[0]):
    groups.append(Group(jnp.dtype(leaf.dtype).name, bool(decays[i]),
                        None if num_layers is None else _lr_decay_power(path, num_layers),
                        bool(selected[i]) if pruned else False))
  return groups


def grouped_update(make_inner: Callable[[dict[str, Group]], optax.GradientTransformation],
                   groups_of: Callable[[Any], list[Group]]) -> optax.GradientTransformation:
  """`make_inner(groups)` run over a few flat buffers instead of the parameter tree: the leaves of
  each `Group` (`groups_of(tree)`, one per leaf) raveled and concatenated into one vector, a dict
  {group name: vector}, the updates split back into the tree's shapes. The inner transformation
  sees that dict as its parameters, so its state holds one buffer per group, and XLA runs its
  elementwise chain (moments, decay, learning rate) once per group rather than once per tensor.

  optax.flatten is this with a single group; here the groups keep what the update differs on
  (weight decay, a layer-wise factor, dtype) a per-group constant, so masks and factors stay
  optax's own (`make_inner` reads them from the group names), and global-norm clipping, inside
  `make_inner`, spans all groups (optax.multi_transform over optax.flatten per label would leave
  the clipping outside, per tensor). The cost: the gathered gradients and parameters are one
  flat copy each (bert-mini on a CPU: XLA's temporary memory 268 -> 311 MiB)."""
  def layout(tree):
    leaves, treedef = jax.tree.flatten(tree)
    members: dict[str, list[int]] = {}
    named: dict[str, Group] = {}
    for i, g in enumerate(groups_of(tree)):
      members.setdefault(g.name, []).append(i)
      named[g.name] = g
    return leaves, treedef, members, named

  def gather(leaves, members):
    return {n: jnp.concatenate([jnp.ravel(leaves[i]) for i in idx]) if len(idx) > 1
            else jnp.ravel(leaves[idx[0]]) for n, idx in members.items()}

  def init(params):
    leaves, _, members, named = layout(params)
    return make_inner(named).init(gather(leaves, members))

  def update(updates, state, params=None):
    leaves, treedef, members, named = layout(updates)
    flat_params = None if params is None else gather(jax.tree.leaves(params), members)
    flat, state = make_inner(named).update(gather(leaves, members), state, flat_params)
    out = [None] * len(leaves)
    for n, idx in members.items():
      sizes = [math.prod(jnp.shape(leaves[i])) for i in idx]
      parts = jnp.split(flat[n], list(itertools.accumulate(sizes))[:-1])
      for i, part in zip(idx, parts):
        out[i] = part.reshape(jnp.shape(leaves[i]))
    return jax.tree.unflatten(treedef, out), state

  return optax.GradientTransformation(init, update)


def make_optimizer(config: ml_collections.ConfigDict, params=None,
                   num_layers: int | None = None, scalar_clipping: bool = True,
                   total_steps: int | None = None) -> optax.GradientTransformation:
  """The optimizer of `config.optimizer` on the learning-rate schedule (to `total_steps`, else
  config.total_steps). `scalar_clipping`: clip by `clip_by_global_norm` (the model's kernel
  set's `scalar_clipping`), else by `optax.clip_by_global_norm`. With `optimizer.fused_update`
  the same chain runs over one flat buffer per `Group` (`grouped_update`); its state then holds
  those buffers instead of trees shaped like the parameters."""
  o = config.optimizer  # its name, decay and shape: checked with the settings (config_checks)
  schedule = make_schedule(config, total_steps)
  wd = decay_coefficient(config)
  fused = o.get("fused_update", False)
  layerwise = o.get("layerwise_lr_decay", 1.0) != 1.0 and params is not None
  keep_pruned = o.get("keep_pruned", False)
  if fused and o.name not in FUSED_OPTIMIZERS:  # config_checks.check_fused_update says so first
    raise ValueError(f"optimizer.fused_update cannot group optimizer.name={o.name!r}")

  def chain(learning_rate, mask, lr_scales, selected):
    """The chain over a tree: `mask` marks the decayed leaves, `lr_scales` (or None) holds each
    leaf's layer-wise factor, `selected` (or None) keep_pruned's leaves."""
    if o.name == "lamb":
      opt = optax.lamb(learning_rate, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=wd, mask=mask)
    elif o.name == "adamw":
      opt = optax.adamw(learning_rate, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=wd, mask=mask)
    elif o.name == "stableadamw":
      opt = stable_adamw(learning_rate, o.b1, o.b2, o.eps, wd, mask=mask)
    elif o.name == "adam":
      opt = optax.adam(learning_rate, b1=o.b1, b2=o.b2, eps=o.eps)
    elif o.name == "sgd":
      opt = optax.sgd(learning_rate)
    clip = clip_by_global_norm if scalar_clipping else optax.clip_by_global_norm
    parts = [clip(o.grad_clip_norm)] if o.grad_clip_norm > 0 else []
    parts.append(opt)
    if lr_scales is not None:
      parts.append(_scale_by_tree(lr_scales))
    if selected is not None:
      parts.append(keep_pruned_zeros(selected))
    return optax.chain(*parts)

  @optax.inject_hyperparams
  def build(learning_rate):
    if keep_pruned and params is None:
      fail("optimizer.keep_pruned needs the parameter tree to build its mask")
    if not fused:
      return chain(learning_rate, decay_mask,
                   layerwise_lr_scale(params, num_layers, o.layerwise_lr_decay) if layerwise
                   else None,
                   prunable(params) if keep_pruned else None)

    def over_groups(groups: dict[str, Group]):
      return chain(learning_rate, {n: g.decay for n, g in groups.items()},
                   {n: o.layerwise_lr_decay ** g.lr_power for n, g in groups.items()}
                   if layerwise else None,
                   {n: g.pruned for n, g in groups.items()} if keep_pruned else None)

    return grouped_update(over_groups, functools.partial(
        parameter_groups, num_layers=num_layers if layerwise else None, pruned=keep_pruned))

  return build(learning_rate=schedule)


def state_shardings(config: ml_collections.ConfigDict, optimizer, abstract_opt, param_shardings,
                    replicated):
  """The optimizer state's shardings: each tree shaped like the parameters sharded as they are,
  the rest `replicated`; with `optimizer.fused_update` (refused on a mesh that shards
  parameters: config_checks.check_fused_update) its flat buffers are replicated too."""
  if config.optimizer.get("fused_update", False):
    return jax.tree.map(lambda _: replicated, abstract_opt)
  return optax.tree_map_params(optimizer, lambda _, s: s, abstract_opt, param_shardings,
                               transform_non_params=lambda _: replicated)


def current_learning_rate(opt_state) -> jax.Array:
  return opt_state.hyperparams["learning_rate"]
