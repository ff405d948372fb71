"""Evaluators beside the trainer, as big_vision's: each is built from its `config.evals` entry
with the trainer's jitted functions (`EvalContext`) and yields `(name, value)` pairs from
`run(params, step)`.

`config.evals` lists a run's evaluations, each a dict with `name` (a key of `REGISTERED`),
`every` (steps between its runs), an optional `prefix` for its metric names and the
evaluator's own options, e.g. a pretraining run that also probes RTE every 1000 steps:

  c.evals = [dict(name="metric_sums", every=500),
             dict(name="glue_probe", every=1000, task="rte")]  # rows probe_rte/accuracy, ...

`schedule.Evaluations` runs them on their cadences. Without `config.evals` a run evaluates as its
objective says (`Objective.evaluator`: the metric sums of a pretraining objective, a task's own
dev scoring) every `eval_every` steps.
"""

from __future__ import annotations

import importlib

from bertjax.core.errors import fail

# config.evals' names -> "module:class" (imported when a run asks for one). The settings checks
# refuse any other name (bertjax/config/config_checks.py: EVALUATORS, kept equal to these keys by
# tests/test_evaluators.py).
REGISTERED: dict[str, str] = {
    "metric_sums": "bertjax.evaluators.metric_sums:MetricSums",
    "glue": "bertjax.evaluators.glue:GlueEvaluator",
    "squad": "bertjax.evaluators.squad:SquadEvaluator",
    "ner": "bertjax.evaluators.ner:TaggingEvaluator",
    "glue_probe": "bertjax.evaluators.probe:GlueProbe",
}


def evaluator_class(name: str):
  """The evaluator class registered as `name` (a `bertjax.evaluators.base.Evaluator`)."""
  if name not in REGISTERED:
    fail(f"unknown evaluator {name!r}; valid evaluators: {', '.join(REGISTERED)}")
  module, attr = REGISTERED[name].split(":")
  return getattr(importlib.import_module(module), attr)


ENTRY_FIELDS = ("name", "every", "prefix")  # an entry's fields that are not its evaluator's


def entry_options(entry) -> dict:
  """A `config.evals` entry's options for its evaluator (the fields besides ENTRY_FIELDS)."""
  entry = entry.to_dict() if hasattr(entry, "to_dict") else dict(entry)
  return {k: v for k, v in entry.items() if k not in ENTRY_FIELDS}


def check_entries(config, objective) -> None:
  """What each evaluator of `config.evals` refuses (`Evaluator.check`: its options, an
  evaluator of another objective's data), before a run creates or writes anything. The entries'
  names and cadences are the settings checks' (bertjax/config/config_checks.py `check_evals`)."""
  for i, entry in enumerate(config.get("evals", None) or ()):
    evaluator_class(entry["name"]).check(config, objective, entry_options(entry), f"evals[{i}]")
