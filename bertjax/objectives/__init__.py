"""Pretraining objectives, selected by `config.objective`."""

from __future__ import annotations

from bertjax.errors import fail
from bertjax.objectives.base import Objective
from bertjax.objectives.mlm_nsp import Mlm, MlmNsp, MlmSop

OBJECTIVES: dict[str, type[Objective]] = {cls.name: cls for cls in (MlmNsp, Mlm, MlmSop)}


def get_objective(config) -> Objective:
  name = config.objective
  if name not in OBJECTIVES:
    fail(f"unknown objective {name!r}; valid objectives: {', '.join(OBJECTIVES)}")
  return OBJECTIVES[name](config)
