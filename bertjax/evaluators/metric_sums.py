"""The pretraining objectives' evaluation: the objective's loss and metric sums over the eval
batches, summed before dividing (the trainer's jitted `eval_step`)."""

from __future__ import annotations

import flax.linen as nn
import jax

from bertjax.evaluators.base import Evaluator
from bertjax.runtime.run_record import add_metrics, summarize


class MetricSums(Evaluator):
  name = "metric_sums"

  def run(self, params, step):
    c = self.context
    sums = None
    lines = c.progress(f"eval at step {step}:", c.num_batches)

    def finished_so_far():  # a progress line times the batches done, not those dispatched
      jax.block_until_ready(sums)

    for i, batch in enumerate(c.batches()):
      with jax.set_mesh(c.mesh), nn.logical_axis_rules(c.rules):
        sums = add_metrics(sums, c.eval_step(params, c.shard(batch)))
      lines.update(i + 1, finished_so_far)
    if sums is not None:
      yield from summarize(sums).items()
