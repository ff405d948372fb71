"""What an objective's `evaluate` is handed: the trainer's jitted functions, model and inputs.

As big_vision's evaluators are given the trainer's predict function, an objective's evaluation
receives an `EvalContext` built by the trainer (or by the pruning tool) for one evaluation: the
jitted metric step over the eval batches (the default evaluation, `metric_sums`), the jitted
per-row `predict_step` a fine-tuning task decodes, the model and the prepared `Inputs`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import numpy as np

from bertjax.core import paths
from bertjax.runtime import sharding
from bertjax.runtime.progress import EVERY_S, Progress, real_clock_compile_seconds
from bertjax.runtime.run_record import add_metrics, summarize
from bertjax.trainer import run_plan


@dataclasses.dataclass
class EvalContext:
  """What an objective's `evaluate` may use: the mesh, the jitted metric and predict steps, the
  eval batches and the prepared inputs."""
  mesh: Any
  rules: Any
  workdir: paths.Path
  step: int
  total_steps: int
  eval_step: Callable      # (params, sharded batch) -> (numerator, denominator) metric sums
  batches: Callable        # () -> iterable of host (numpy) batches
  num_batches: int | None = None   # how many `batches` yields, when known
  predict_step: Callable | None = None  # jitted (params, sharded batch) -> per-row outputs
  eval_batch_size: int = 0          # rows per batch of a task's own evaluation sets
  data: Any = None                  # the run's prepared inputs (bertjax.inputs.Inputs)
  progress_every_s: float = EVERY_S
  clock: Callable[[], float] = time.monotonic

  def shard(self, batch):
    return sharding.shard_batch(batch, self.mesh)

  def progress(self, what: str, total: int | None, unit: str = "batch") -> Progress:
    """Progress lines of an evaluation pass (bertjax/runtime/progress.py); process 0 prints them."""
    return Progress(what, total, unit=unit, every_s=self.progress_every_s, clock=self.clock,
                    enabled=jax.process_index() == 0,
                    excluded=real_clock_compile_seconds(self.clock))

  def predict(self, params, batch) -> dict[str, np.ndarray]:
    """`predict_step` on one host batch, gathered back to host numpy arrays."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      out = self.predict_step(params, self.shard(batch))
    return {k: to_host(v) for k, v in out.items()}

  def metric_sums(self, params) -> dict[str, float] | None:
    """The default evaluation: metric sums over the eval batches, divided at the end."""
    sums = None
    lines = self.progress(f"eval at step {self.step}:", self.num_batches)

    def finished_so_far():  # a progress line times the batches done, not those dispatched
      jax.block_until_ready(sums)

    for i, batch in enumerate(self.batches()):
      with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
        sums = add_metrics(sums, self.eval_step(params, self.shard(batch)))
      lines.update(i + 1, finished_so_far)
    return summarize(sums) if sums is not None else None


def to_host(x: jax.Array) -> np.ndarray:
  """A (possibly sharded across processes) array as one host numpy array."""
  if jax.process_count() > 1:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


def make_eval_step(objective, model) -> Callable:
  """(params, batch) -> the objective's deterministic loss and metric sums on the batch."""
  def eval_step(params, batch):
    denominators = objective.denominators(batch)
    loss, metrics = objective.loss(model, params, batch, jax.random.key(0), denominators,
                                   deterministic=True)
    return {**metrics, "loss": (loss, jnp.ones_like(loss))}
  return eval_step


def standalone(config, objective, model_cfg, data, workdir: paths.Path, mesh,
               step: int = 0, total_steps: int = 1) -> EvalContext:
  """An evaluation outside a training run (pruning, scoring saved parameters again): the
  objective's model and its jitted metric and predict steps on `mesh`."""
  model = objective.make_model(config, model_cfg)
  size = run_plan.eval_batch_size(config, mesh)
  return EvalContext(mesh=mesh, rules=sharding.rules_from_config(config), workdir=workdir,
                     step=step, total_steps=total_steps,
                     eval_step=jax.jit(make_eval_step(objective, model)),
                     batches=data.eval_batches, num_batches=data.num_eval_batches,
                     predict_step=jax.jit(functools.partial(objective.predictions, model)),
                     eval_batch_size=size, data=data)
