"""Pretraining objectives, selected by `config.objective`."""

from __future__ import annotations

from bertjax.errors import fail
from bertjax.objectives.base import Objective
from bertjax.objectives.distill import Distill, DistillGlue
from bertjax.objectives.mlm_nsp import Mlm, MlmNsp, MlmSop
from bertjax.objectives.rtd import Rtd
from bertjax.objectives.span_sbo import SpanSbo
from bertjax.tasks.glue import GlueTask
from bertjax.tasks.ner import TaggingTask
from bertjax.tasks.squad import SquadTask

OBJECTIVES: dict[str, type[Objective]] = {
    cls.name: cls for cls in (MlmNsp, Mlm, MlmSop, SpanSbo, Rtd, GlueTask, SquadTask,
                              TaggingTask, Distill, DistillGlue)}


def get_objective(config) -> Objective:
  name = config.objective
  if name not in OBJECTIVES:
    fail(f"unknown objective {name!r}; valid objectives: {', '.join(OBJECTIVES)}")
  return OBJECTIVES[name](config)
