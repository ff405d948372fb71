"""Every objective and fine-tuning task the trainer can run, by `config.objective`.

A new objective is one module (in `bertjax/objectives/` or `bertjax/tasks/`, subclassing
`bertjax.objective.Objective`) plus one line in `REGISTERED` below.
"""

from __future__ import annotations

from bertjax.errors import fail
from bertjax.objective import Objective
from bertjax.objectives.distill import Distill, DistillGlue
from bertjax.objectives.mlm_nsp import Mlm, MlmNsp, MlmSop
from bertjax.objectives.rtd import Rtd
from bertjax.objectives.span_sbo import SpanSbo
from bertjax.tasks.glue import GlueTask
from bertjax.tasks.ner import TaggingTask
from bertjax.tasks.squad import SquadTask

REGISTERED: tuple[type[Objective], ...] = (
    MlmNsp, Mlm, MlmSop, SpanSbo, Rtd, Distill, DistillGlue, GlueTask, SquadTask, TaggingTask)

OBJECTIVES: dict[str, type[Objective]] = {cls.name: cls for cls in REGISTERED}


def get_objective(config) -> Objective:
  name = config.objective
  if name not in OBJECTIVES:
    fail(f"unknown objective {name!r}; valid objectives: {', '.join(OBJECTIVES)}")
  return OBJECTIVES[name](config)
