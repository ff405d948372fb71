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

  def __init__(self, config, context: EvalContext, **options: Any):
    unknown = sorted(set(options) - set(self.options))
    if unknown:
      takes = ", ".join(self.options) or "none besides name, every and prefix"
      fail(f"evals entry {self.name!r} has no option {unknown[0]!r}; it takes {takes}")
    self.config, self.context = config, context

  @classmethod
  def default_prefix(cls, options: dict[str, Any]) -> str:
    """What its metric names start with unless the entry gives `prefix` ("": as they are)."""
    del options
    return ""

  def run(self, params, step: int) -> Iterator[tuple[str, Any]]:
    raise NotImplementedError
