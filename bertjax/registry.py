"""Every objective and fine-tuning task the trainer can run, by `config.objective`.

A new objective is one module (in `bertjax/objectives/` or `bertjax/tasks/`, with a subclass of
`bertjax.objective.Objective` whose `name` is its key here) plus its line in `REGISTERED`. Modules
are imported when their objective is asked for, so a run loads only its own.
"""

from __future__ import annotations

import importlib

from bertjax.core.errors import fail
from bertjax.objective import Objective

REGISTERED: dict[str, str] = {
    "mlm_nsp": "bertjax.objectives.mlm_nsp:MlmNsp",
    "mlm": "bertjax.objectives.mlm_nsp:Mlm",
    "mlm_sop": "bertjax.objectives.mlm_nsp:MlmSop",
    "span_sbo": "bertjax.objectives.span_sbo:SpanSbo",
    "rtd": "bertjax.objectives.rtd:Rtd",
    "distill": "bertjax.objectives.distill:Distill",
    "distill_glue": "bertjax.objectives.distill:DistillGlue",
    "glue": "bertjax.tasks.glue:GlueTask",
    "squad": "bertjax.tasks.squad:SquadTask",
    "ner": "bertjax.tasks.ner:TaggingTask",
}


def objective_class(name: str) -> type[Objective]:
  """The class registered as `name`."""
  if name not in REGISTERED:
    fail(f"unknown objective {name!r}; valid objectives: {', '.join(REGISTERED)}")
  module, attr = REGISTERED[name].split(":")
  return getattr(importlib.import_module(module), attr)


def get_objective(config) -> Objective:
  """The objective `config.objective` names, after its checks of the config alone."""
  objective = objective_class(config.objective)()
  objective.check(config)
  return objective
