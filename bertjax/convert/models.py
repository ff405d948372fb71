"""The Flax models a converted tree belongs to, and fresh parameters for missing parts."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.core.errors import fail
from bertjax.models import heads as heads_lib
from bertjax.models import layers as layers_lib
from bertjax.models.config import ModelConfig
from bertjax.models.electra import ElectraDiscriminator
from bertjax.models.architectures import encoder_for, mlm_head_for
from bertjax.models.pretraining import PretrainingModel

Params = dict[str, Any]

# ----------------------------------------------------------------------------- models


def build_model(cfg: ModelConfig, heads: tuple[str, ...]):
  """The Linen module whose params are {"encoder", *heads}."""
  if not heads:
    return encoder_for(cfg)
  if "rtd" in heads:
    return ElectraDiscriminator(cfg)
  return PretrainingModel(cfg, pair_head="pair" in heads)


def _init_fn(cfg: ModelConfig, heads: tuple[str, ...]):
  """A function rng -> unboxed params of {"encoder", *heads} (encoder alone: the Encoder's)."""
  model = build_model(cfg, heads)
  ids = jnp.zeros((1, 2), jnp.int32)
  # PretrainingModel only creates its MLM head when asked for masked positions.
  kwargs = {"masked_positions": jnp.zeros((1, 1), jnp.int32)} if "mlm" in heads else {}

  def init(rng):
    params = nn.meta.unbox(model.init(rng, ids, **kwargs)["params"])
    return params if heads else {"encoder": params}
  return init


class _TiedEmbeddingStub:
  """Stands in for the encoder when initializing the MLM head alone (it only calls attend)."""

  def __init__(self, vocab_size: int):
    self.vocab_size = vocab_size

  def attend(self, x):
    return jnp.zeros(x.shape[:-1] + (self.vocab_size,), x.dtype)


def fresh_part(cfg: ModelConfig, part: str, seed: int) -> Params:
  """Fresh params of one head (or the pooler) from the model's own module and initializers.

  Initializing just that module, rather than the whole model, keeps it to a handful of small
  ops; `check_tree` later confirms the result fits the full model's tree.
  """
  x = jnp.zeros((1, 1, cfg.hidden_size), jnp.float32)
  if part == "pooler":
    # The same constructor call as Encoder.setup's pooler.
    dense = layers_lib.layers_for(cfg).dense
    module, args = dense(cfg.hidden_size, ("embed", "embed_out"), "pooler"), (x,)
  elif part == "mlm":
    module, args = mlm_head_for(cfg), (x, _TiedEmbeddingStub(cfg.vocab_size))
  elif part == "pair":
    module, args = heads_lib.PairHead(cfg), (x[:, 0],)
  elif part == "rtd":
    module, args = heads_lib.DiscriminatorHead(cfg), (x,)
  else:
    raise ValueError(f"unknown part {part!r}")
  variables = module.init(jax.random.key(seed), *args)
  return jax.device_get(nn.meta.unbox(variables["params"]))


def abstract_params(cfg: ModelConfig, heads: tuple[str, ...]) -> Params:
  """Shapes (jax.ShapeDtypeStruct) of the tree {"encoder", *heads}, without allocating it."""
  return jax.eval_shape(_init_fn(cfg, heads), jax.random.key(0))


def check_tree(params: Params, cfg: ModelConfig, heads: tuple[str, ...], where: str,
                record: str = "model.json") -> None:
  """Fails unless `params` has exactly the paths and shapes the model expects (the model that
  `record` describes: a converted folder's model.json, a run's or Hugging Face's config.json)."""
  want = {jax.tree_util.keystr(k): tuple(v.shape)
          for k, v in jax.tree_util.tree_leaves_with_path(abstract_params(cfg, heads))}
  got = {jax.tree_util.keystr(k): tuple(np.shape(v))
         for k, v in jax.tree_util.tree_leaves_with_path(params)}
  for name in sorted(set(want) | set(got)):
    if want.get(name) != got.get(name):
      fail(f"{where}: parameter {name} is {got.get(name, 'missing')}, the model expects "
           f"{want.get(name, 'no such parameter')}; the params do not match {record}")
