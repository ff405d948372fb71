"""The trainer's jitted functions an evaluator is built with (bertjax/evaluators/), and the
`EvalContext` of an evaluation outside a training run.

As big_vision's evaluators are given the trainer's predict function, the evaluators of a run
receive one `EvalContext` (bertjax/evaluators/context.py) holding the jitted metric step over the
eval batches (`make_eval_step`: the objective's deterministic loss and metric sums) and the
jitted per-row predict step (`make_predict_step`: the objective's `predict`).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from bertjax.core import paths
from bertjax.evaluators.context import EvalContext
from bertjax.runtime import sharding
from bertjax.trainer import run_plan


def make_eval_step(objective, model) -> Callable:
  """(params, batch) -> the objective's deterministic loss and metric sums on the batch."""
  def eval_step(params, batch):
    denominators = objective.denominators(batch)
    loss, metrics = objective.loss(model, params, batch, jax.random.key(0), denominators,
                                   deterministic=True)
    return {**metrics, "loss": (loss, jnp.ones_like(loss))}
  return eval_step


def make_predict_step(objective, model) -> Callable:
  """(params, batch) -> the objective's deterministic per-row outputs (its metric sums left out)."""
  def predict_step(params, batch):
    out = objective.predict(model, params, batch, jax.random.key(0), deterministic=True)
    return {k: v for k, v in out.items() if k != "metrics"}
  return predict_step


def standalone(config, objective, model_cfg, data, workdir: paths.Path, mesh,
               total_steps: int = 1) -> EvalContext:
  """An evaluation outside a training run (pruning, scoring saved parameters again): the
  objective's model and its jitted metric and predict steps on `mesh`."""
  model = objective.make_model(config, model_cfg)
  size = run_plan.eval_batch_size(config, mesh)
  return EvalContext(mesh=mesh, rules=sharding.rules_from_config(config), workdir=workdir,
                     total_steps=total_steps, eval_step=jax.jit(make_eval_step(objective, model)),
                     batches=data.eval_batches, num_batches=data.num_eval_batches,
                     predict_step=jax.jit(make_predict_step(objective, model)),
                     eval_batch_size=size, data=data, model_config=model_cfg)
