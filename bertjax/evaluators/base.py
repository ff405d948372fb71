"""The evaluator contract: built from its `config.evals` entry with the trainer's functions,
`run(params, step)` yields `(name, value)` pairs, as big_vision's evaluators do."""

from __future__ import annotations

from typing import Any, Iterator

from bertjax.core.errors import fail
from bertjax.evaluators.context import EvalContext


class Evaluator:
  """`cls(config, context, **options)`: `config` is the run's, `context` the trainer's jitted
  functions and prepared inputs (`EvalContext`), `options` the entry's own fields (besides
  name, every and prefix). `run(params, step)` evaluates `params` as they are at `step`."""
  name = ""
  options: tuple[str, ...] = ()  # the entry fields this evaluator takes
  # Whether it scores the dev sets of the run's own task (GLUE, SQuAD, NER): only a run whose
  # objective evaluates that way (`Objective.evaluator`) has them.
  own_task = False

  def __init__(self, config, context: EvalContext, **options: Any):
    self.check_options(options)
    self.config, self.context = config, context

  @classmethod
  def check(cls, config, objective, options: dict[str, Any], where: str) -> None:
    """What this evaluator refuses in the `config.evals` entry `where` (e.g. "evals[1]") of a
    run of `objective`, before anything is created or written (bertjax/trainer/run_plan.py)."""
    del config
    cls.check_options(options)
    if cls.own_task and objective.evaluator != cls.name:
      fail(f"{where} names {cls.name!r}, which scores the dev sets of a {cls.name} fine-tuning "
           f"run, and this run trains {objective.name!r}, which has no {cls.name} dev sets; drop "
           "the entry (a pretraining run can probe GLUE with name=\"glue_probe\")")

  @classmethod
  def check_options(cls, options: dict[str, Any]) -> None:
    """The entry's own fields: each one this evaluator takes, with a value it accepts."""
    unknown = sorted(set(options) - set(cls.options))
    if unknown:
      takes = ", ".join(cls.options) or "none besides name, every and prefix"
      fail(f"evals entry {cls.name!r} has no option {unknown[0]!r}; it takes {takes}")

  @classmethod
  def default_prefix(cls, options: dict[str, Any]) -> str:
    """What its metric names start with unless the entry gives `prefix` ("": as they are)."""
    del options
    return ""

  def run(self, params, step: int) -> Iterator[tuple[str, Any]]:
    raise NotImplementedError
