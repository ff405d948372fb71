"""A run's evaluations on their cadences: which evaluators run at a step, their rows merged."""

from __future__ import annotations

import dataclasses
from typing import Any

from bertjax.evaluators import entry_options, evaluator_class
from bertjax.evaluators.base import Evaluator
from bertjax.evaluators.context import EvalContext


@dataclasses.dataclass(frozen=True)
class Scheduled:
  evaluator: Evaluator
  every: int       # steps between its runs (0: never)
  prefix: str      # what its metric names start with


class Evaluations:
  """The evaluators of a run with their cadences. A step's row holds the metrics of every
  evaluator whose `every` divides it, each name behind its evaluator's prefix; the last step,
  where no evaluation ran at it, is evaluated by every evaluator (`at_end`)."""

  def __init__(self, scheduled: list[Scheduled]):
    self.scheduled = scheduled

  @classmethod
  def of(cls, config, objective, context: EvalContext, eval_every: int) -> "Evaluations":
    """`config.evals`' evaluators, or, without that list, the objective's own
    (`objective.evaluator`) every `eval_every` steps with its metric names as they are."""
    entries = list(config.get("evals", None) or ())
    if not entries:
      own = evaluator_class(objective.evaluator)(config, context)
      return cls([Scheduled(own, int(eval_every), "")])
    scheduled = []
    for entry in entries:
      options = entry_options(entry)
      kind = evaluator_class(entry["name"])
      prefix = entry.get("prefix", None)
      scheduled.append(Scheduled(kind(config, context, **options), int(entry["every"]),
                                 kind.default_prefix(options) if prefix is None else prefix))
    return cls(scheduled)

  def due(self, step: int) -> bool:
    """Whether an evaluator runs at `step` (1-based) by its cadence."""
    return any(s.every and step % s.every == 0 for s in self.scheduled)

  def at_end(self, step: int, last_eval_step: int | None) -> bool:
    """Whether the last step, `step`, is still to be evaluated: by every evaluator that has a
    cadence, where none ran at it."""
    return last_eval_step != step and any(s.every for s in self.scheduled)

  def run(self, params, step: int, at_end: bool = False) -> dict[str, Any]:
    """The metrics of the evaluators due at `step` (all with a cadence, `at_end`), merged."""
    metrics: dict[str, Any] = {}
    for s in self.scheduled:
      if s.every and (at_end or step % s.every == 0):
        metrics.update((s.prefix + name, value) for name, value in s.evaluator.run(params, step))
    return metrics

