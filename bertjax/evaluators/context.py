"""What an evaluator is built with: the trainer's jitted functions, the mesh and the run's inputs.

As big_vision's evaluators are given the trainer's predict function, an evaluator receives an
`EvalContext` built once per run by the trainer (or by the pruning tool, `standalone` in
bertjax/trainer/eval_context.py): the jitted metric step over the eval batches, the jitted
per-row `predict_step`, the prepared `Inputs` and where prediction files go.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import flax.linen as nn
import jax
from jax.experimental import multihost_utils
import numpy as np

from bertjax.core import paths
from bertjax.runtime import sharding
from bertjax.runtime.progress import EVERY_S, Progress, real_clock_compile_seconds
from bertjax.tasks.base import EvalSet, num_rows, padded_batches


@dataclasses.dataclass
class EvalContext:
  """The mesh, the jitted metric and predict steps, the eval batches and the prepared inputs."""
  mesh: Any
  rules: Any
  workdir: paths.Path
  total_steps: int
  eval_step: Callable      # (params, sharded batch) -> (numerator, denominator) metric sums
  batches: Callable        # () -> iterable of host (numpy) batches
  num_batches: int | None = None   # how many `batches` yields, when known
  predict_step: Callable | None = None  # jitted (params, sharded batch) -> per-row outputs
  eval_batch_size: int = 0          # rows per batch of a task's own evaluation sets
  data: Any = None                  # the run's prepared inputs (bertjax.inputs.Inputs)
  model_config: Any = None          # the encoder's ModelConfig (a probe runs the encoder alone)
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

  def predict_rows(self, params, eval_set: EvalSet, step: int) -> dict[str, np.ndarray]:
    """The predict step's outputs for every row of `eval_set`, in row order (padding rows
    removed)."""
    size = self.eval_batch_size
    chunks: list[dict[str, np.ndarray]] = []
    lines = self.progress(f"eval {eval_set.name} at step {step}:", -(-eval_set.num_rows // size))
    for batch, valid in padded_batches(eval_set.arrays, size, jax.process_index(),
                                       jax.process_count()):
      out = self.predict(params, batch)  # on the host: the line times finished work
      chunks.append({k: v[valid] for k, v in out.items()})
      lines.update(len(chunks))
    result = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
    if num_rows(result) != eval_set.num_rows:  # a bug, not a user error: never drop rows
      raise RuntimeError(f"{eval_set.name}: {num_rows(result)} predictions for "
                         f"{eval_set.num_rows} rows")
    return result

  def output_dir(self, step: int) -> paths.Path:
    """WORKDIR/predictions/step_<N>: an evaluation's prediction files and metrics.json."""
    path = paths.as_path(self.workdir) / "predictions" / f"step_{step}"
    if jax.process_index() == 0:
      path.mkdir(parents=True, exist_ok=True)
    return path

  def is_final(self, step: int) -> bool:
    return step >= self.total_steps


def to_host(x: jax.Array) -> np.ndarray:
  """A (possibly sharded across processes) array as one host numpy array."""
  if jax.process_count() > 1:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))
