"""Structured pruning of an encoder's parameters: attention heads and whole layers removed.

The result is a smaller model, not a masked one: the query/key/value kernels and biases and the
attention output kernel of a layer lose the removed heads' slices, and `ModelConfig.pruned_heads`
records which heads (by their original numbers, as Hugging Face's `pruned_heads`) each layer lost.
Head masks (Michel et al. 2019's xi_h) are added to a parameter tree for importance scores and for
checking a pruned model against the masked unpruned one.

Every function takes the parameters of an Encoder, or of a model holding one under "encoder"
(a classifier), and returns the same kind of tree. Unrolled layers only (not scan_layers).
ModernBERT (bertjax.models.modernbert) loses the heads' slices of its fused `Wqkv` (kernel
[hidden, 3, heads, head_dim]) and of `Wo`; its layers are not removed (see `remove_layers`).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from bertjax.core.errors import fail
from bertjax.models.config import ModelConfig

Params = dict[str, Any]
_QKV = ("query", "key", "value")


def _split(params: Mapping[str, Any]) -> tuple[Params, Params | None]:
  """(encoder params, the whole tree or None when `params` is the encoder's own)."""
  if "encoder" in params:
    return dict(params["encoder"]), dict(params)
  if "embeddings" in params or "layer_0" in params:
    return dict(params), None
  if "layers" in params:
    fail("pruning works on unrolled layers; convert or train with model.scan_layers=False")
  fail("these parameters hold no encoder (no 'encoder' or 'embeddings'); pass a model's params")


def _join(encoder: Params, whole: Params | None) -> Params:
  return encoder if whole is None else {**whole, "encoder": encoder}


def _check_layout(enc: Params, cfg: ModelConfig) -> None:
  if "layers" in enc or cfg.scan_layers:
    fail("pruning works on unrolled layers; convert or train with model.scan_layers=False")
  if cfg.num_groups != cfg.num_hidden_layers:
    fail("pruning needs one parameter set per layer; ALBERT's shared layers cannot be pruned")


def _attention_key(cfg: ModelConfig) -> str:
  """The name of a layer's attention subtree."""
  return "attn" if cfg.architecture == "modernbert" else "attention"


def _bert_heads(att: Params, positions: np.ndarray) -> Params:
  """A BERT-family attention tree keeping the heads at `positions` (query/key/value, output)."""
  for proj in _QKV:
    att[proj] = {"kernel": np.asarray(att[proj]["kernel"])[:, positions],
                 "bias": np.asarray(att[proj]["bias"])[positions]}
  att["output"] = {**att["output"], "kernel": np.asarray(att["output"]["kernel"])[positions]}
  return att


def _modernbert_heads(att: Params, positions: np.ndarray) -> Params:
  """A ModernBERT attention tree keeping the heads at `positions`: Wqkv's kernel [hidden, 3,
  heads, head_dim] (and bias [3, heads, head_dim], when it has one) and Wo's kernel [heads,
  head_dim, hidden]; Wo's bias is per output unit and stays."""
  qkv = {"kernel": np.asarray(att["Wqkv"]["kernel"])[:, :, positions]}
  if "bias" in att["Wqkv"]:
    qkv["bias"] = np.asarray(att["Wqkv"]["bias"])[:, positions]
  att["Wqkv"] = qkv
  att["Wo"] = {**att["Wo"], "kernel": np.asarray(att["Wo"]["kernel"])[positions]}
  return att


def prune_heads(params: Mapping[str, Any], cfg: ModelConfig,
                remove: Mapping[int, Iterable[int]]) -> tuple[Params, ModelConfig]:
  """Removes heads: `remove` maps a layer to the original numbers of the heads it loses.

  Returns (params, config) of the smaller model. A head already removed, or every remaining
  head of a layer, is a UserError (remove the layer instead).
  """
  enc, whole = _split(params)
  _check_layout(enc, cfg)
  pruned = [set(cfg.pruned_heads[i]) if cfg.pruned_heads else set()
            for i in range(cfg.num_hidden_layers)]
  for layer, heads in remove.items():
    heads = set(int(h) for h in heads)
    if not heads:
      continue
    if not 0 <= layer < cfg.num_hidden_layers:
      fail(f"layer {layer} does not exist (the model has {cfg.num_hidden_layers})")
    kept = cfg.kept_heads(layer)
    if not heads <= set(kept):
      fail(f"layer {layer} has no head(s) {sorted(heads - set(kept))} left to remove")
    if len(heads) == len(kept):
      fail(f"removing heads {sorted(heads)} leaves layer {layer} without heads; remove the layer")
    positions = np.asarray([p for p, h in enumerate(kept) if h not in heads])
    name, key = f"layer_{layer}", _attention_key(cfg)
    slice_heads = _modernbert_heads if cfg.architecture == "modernbert" else _bert_heads
    enc[name] = {**enc[name], key: slice_heads(dict(enc[name][key]), positions)}
    pruned[layer] |= heads
  new_cfg = cfg.replace(pruned_heads=tuple(tuple(sorted(p)) for p in pruned))
  return _join(enc, whole), new_cfg


def remove_layers(params: Mapping[str, Any], cfg: ModelConfig,
                  layers: Iterable[int]) -> tuple[Params, ModelConfig]:
  """Removes whole layers (attention and feed-forward); the rest are renumbered in order."""
  enc, whole = _split(params)
  _check_layout(enc, cfg)
  if cfg.architecture == "modernbert":
    fail("ModernBERT's layers attend globally or locally by their index, so removing one would "
         "change what the others compute; prune its heads only (--target-layers=1)")
  drop = sorted(set(int(i) for i in layers))
  if any(not 0 <= i < cfg.num_hidden_layers for i in drop):
    fail(f"layers {drop} are not all in 0..{cfg.num_hidden_layers - 1}")
  keep = [i for i in range(cfg.num_hidden_layers) if i not in drop]
  if not keep:
    fail("removing every layer leaves no encoder; keep at least one layer")
  layer_trees = {f"layer_{i}": enc.pop(f"layer_{i}") for i in range(cfg.num_hidden_layers)}
  for new, old in enumerate(keep):
    enc[f"layer_{new}"] = layer_trees[f"layer_{old}"]
  pruned = tuple(cfg.pruned_heads[i] for i in keep) if cfg.pruned_heads else ()
  new_cfg = cfg.replace(num_hidden_layers=len(keep), pruned_heads=pruned)
  return _join(enc, whole), new_cfg


def with_head_masks(params: Mapping[str, Any], cfg: ModelConfig,
                    masks: Sequence[Any]) -> Params:
  """`params` with a `head_mask` <float>[heads of layer i] in each layer's attention (masks[i]):
  the attention multiplies each head's output by it (1 keeps a head, 0 silences it)."""
  enc, whole = _split(params)
  _check_layout(enc, cfg)
  if len(masks) != cfg.num_hidden_layers:
    fail(f"{len(masks)} head masks for {cfg.num_hidden_layers} layers")
  enc = dict(enc)
  for i, mask in enumerate(masks):
    if tuple(np.shape(mask)) != (cfg.layer_heads(i),):
      fail(f"the head mask of layer {i} has shape {np.shape(mask)}, the layer has "
           f"{cfg.layer_heads(i)} heads")
    name, key = f"layer_{i}", _attention_key(cfg)
    enc[name] = {**enc[name], key: {**enc[name][key], "head_mask": mask}}
  return _join(enc, whole)


def count_heads(cfg: ModelConfig) -> int:
  """Attention heads the model has, over all its layers."""
  return sum(cfg.layer_heads(i) for i in range(cfg.num_hidden_layers))
