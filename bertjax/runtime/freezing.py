"""A frozen encoder: which parameters a fine-tuning run trains, and the split that keeps the rest
out of the backward pass and the optimizer.

`config.freeze.encoder` trains only the task head (every top-level subtree but `encoder`), plus
the top `freeze.train_top_layers` encoder layers (and what sits above them: the final LayerNorm
of pre-LN models and the pooler) and, with `freeze.train_embeddings`, the embeddings. The train
step differentiates the loss with respect to the trainable tree only, the frozen one entering as
a constant (`jax.lax.stop_gradient`): no gradient, no optimizer state and no update is computed
for a frozen parameter, and the backward pass stops at the lowest trainable layer. The train
state still holds every parameter, so checkpoints, resume, evaluation and export are unchanged.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import flax
import jax

from bertjax.core.errors import fail

ENCODER = "encoder"
_LAYER = re.compile(r"layer_(\d+)")
_EMBEDDINGS = ("embeddings", "embedding_projection")
_ABOVE_LAYERS = ("final_layer_norm", "final_norm", "pooler")  # final_norm: ModernBERT


@dataclasses.dataclass(frozen=True)
class FreezeSpec:
  """What stays trainable under a frozen encoder (`encoder=False`: everything)."""
  encoder: bool = False
  train_top_layers: int = 0
  train_embeddings: bool = False

  @classmethod
  def from_config(cls, config) -> "FreezeSpec":
    f = config.get("freeze")
    if f is None:
      return cls()
    return cls(bool(f.encoder), int(f.train_top_layers), bool(f.train_embeddings))


def _trainable_in_encoder(names: tuple[str, ...], spec: FreezeSpec, num_layers: int) -> bool:
  """Whether the encoder parameter at `names` (below `encoder/`) is trained."""
  top = names[0]
  if top in _EMBEDDINGS:
    return spec.train_embeddings
  if top in _ABOVE_LAYERS:
    return spec.train_top_layers > 0
  match = _LAYER.fullmatch(top)
  if match:
    return int(match.group(1)) >= num_layers - spec.train_top_layers
  if top == "layers":  # a scanned stack: one array per weight for all layers (config_checks)
    return spec.train_top_layers >= num_layers
  fail(f"freeze.encoder does not know where encoder parameter {'/'.join(names)} sits; "
       "fix: --config.freeze.encoder=False")


def trainable_mask(params, spec: FreezeSpec, num_layers: int) -> Any:
  """A tree of bools like `params`: True where the parameter is trained."""
  if not spec.encoder:
    return jax.tree.map(lambda _: True, params)
  if ENCODER not in params or len(params) < 2:
    fail(f"freeze.encoder needs a model of an encoder and a task head; this one has "
         f"{', '.join(params) or 'no parameters'}; fix: --config.freeze.encoder=False")
  flat = flax.traverse_util.flatten_dict(params)
  mask = {k: k[0] != ENCODER or _trainable_in_encoder(k[1:], spec, num_layers) for k in flat}
  return flax.traverse_util.unflatten_dict(mask)


@dataclasses.dataclass(frozen=True)
class Partition:
  """Splits a parameter tree (or any tree of its structure: shardings, shapes) into trainable
  and frozen nested dicts by path, and merges them back."""
  trainable_paths: frozenset
  frozen_any: bool = True

  @classmethod
  def of(cls, params, spec: FreezeSpec, num_layers: int) -> "Partition":
    flat = flax.traverse_util.flatten_dict(trainable_mask(params, spec, num_layers))
    return cls(frozenset(k for k, keep in flat.items() if keep), not all(flat.values()))

  def split(self, tree) -> tuple[Any, dict]:
    if not self.frozen_any:  # nothing frozen: the tree as it is (empty subtrees kept)
      return tree, {}
    flat = flax.traverse_util.flatten_dict(tree)
    trainable = {k: v for k, v in flat.items() if k in self.trainable_paths}
    frozen = {k: v for k, v in flat.items() if k not in self.trainable_paths}
    unflat = flax.traverse_util.unflatten_dict
    return unflat(trainable), unflat(frozen)

  def trainable(self, tree) -> Any:
    return self.split(tree)[0]

  def merge(self, trainable, frozen) -> Any:
    """One tree again; the frozen part as a constant of differentiation."""
    if not self.frozen_any:
      return trainable
    flat = flax.traverse_util.flatten_dict(trainable)
    flat.update(flax.traverse_util.flatten_dict(jax.lax.stop_gradient(frozen)))
    return flax.traverse_util.unflatten_dict(flat)

  def describe(self, params) -> str:
    """'trains N of M parameters (...)' for the run's log."""
    trainable, frozen = self.split(params)
    count = lambda t: sum(int(x.size) for x in jax.tree.leaves(t))
    tops = sorted({"/".join(k[:2]) if k[0] == ENCODER else k[0] for k in self.trainable_paths})
    return (f"freeze.encoder: training {count(trainable):,} of {count(trainable) + count(frozen):,} "
            f"parameters ({', '.join(tops)}); the rest is frozen")
