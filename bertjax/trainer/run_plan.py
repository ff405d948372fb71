"""The run plan: what a training run is, decided once before its first step.

`plan(config, workdir, devices)` is a pure function of the config and the devices: it checks every
setting (bertjax/config/config_checks.py, the one validator) and derives, once, what the rest of
the run reads: the objective, the mesh and its logical rules, the model actually trained,
gradient accumulation and the evaluation batch size. It creates, prepares and writes nothing.

A run's length and evaluation cadence may need its inputs (a fine-tuning task counts its
training rows), so they are a second pure step: `with_inputs(plan, data)` checks the prepared
inputs against the model and returns the plan with them and their `schedule`. Code that needs
the run's length or evaluation cadence reads `plan.schedule`, not the config (a task's
`config.total_steps` stays 0). The config handed in is the caller's own object, never copied or
changed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import flax.linen as nn
import ml_collections

from bertjax.config import config_checks, settings
from bertjax import evaluators
from bertjax.core import paths
from bertjax.models.config import ModelConfig
from bertjax.objective import Schedule
from bertjax.registry import objective_class
from bertjax.runtime import sharding


@dataclasses.dataclass(frozen=True)
class RunPlan:
  """A run's checked settings and everything derived from them (see the module docstring)."""
  config: ml_collections.ConfigDict  # the caller's config, as checked (not a copy)
  workdir: paths.Path
  objective: Any
  mesh: Any
  rules: Any                         # logical axis rules (bertjax/runtime/sharding.py)
  model_cfg: ModelConfig             # the model trained: fine-tuning takes init_from's
  grad_accum_steps: int
  eval_batch_size: int               # rows per evaluation batch
  data: Any = None                   # the prepared inputs (bertjax.inputs.Inputs): with_inputs
  schedule: Schedule | None = None   # total_steps and eval_every of this run: with_inputs


def accumulation_steps(config, mesh) -> int:
  """`grad_accum_steps`, refused (bertjax/config/config_checks.py) where the batch does not split
  into that many micro-batches over the data-parallel devices and the processes."""
  return config_checks.accumulation_steps(config, mesh)


def eval_batch_size(config, mesh) -> int:
  """Rows per evaluation batch (`settings.eval_batch_size`), refused where they do not split over
  the data-parallel devices and the processes: an evaluation outside a run's plan."""
  size = settings.eval_batch_size(config)
  config_checks.check_eval_batch_size(size, mesh)
  return size


def param_shardings(abstract_boxed, mesh, rules):
  """The NamedSharding of every parameter of the boxed tree `abstract_boxed` under `rules`,
  refused (`check_param_shardings`) where a dimension does not divide over its mesh axes."""
  shardings = sharding.logical_shardings(abstract_boxed, mesh, rules)
  config_checks.check_param_shardings(nn.meta.unbox(abstract_boxed), shardings)
  return shardings


def plan(config, workdir: paths.Path, devices: Sequence[Any] | None = None) -> RunPlan:
  """Checks `config` for a run in `workdir` on `devices` (default: every device) and returns its
  plan, before anything is created, prepared or written: the validator
  (bertjax/config/config_checks.py `check`), entered once, checks the config, the paths, the
  objective, init_from's model, the mesh, the batch, accumulation, positions and what the
  objective asks of its data, and hands back what it checked them against; then each evaluator
  of `config.evals` refuses what it cannot run (its options, another objective's dev sets)."""
  objective = objective_class(config.objective)()  # its own check(config) runs in the validator
  checked = config_checks.check(config, workdir, objective, devices)
  evaluators.check_entries(config, objective)  # each evaluator's own refusals (config.evals)
  return RunPlan(config=config, workdir=workdir, objective=objective, mesh=checked.mesh,
                 rules=checked.rules, model_cfg=checked.model_cfg,
                 grad_accum_steps=checked.grad_accum_steps,
                 eval_batch_size=checked.eval_batch_size)


def with_inputs(run: RunPlan, data) -> RunPlan:
  """`run` with its prepared inputs `data` and its schedule (a task's from its training rows),
  the inputs checked against the model and init_from (`check_data`)."""
  schedule = run.objective.schedule(run.config, data)
  config_checks.check_data(run.config, run.objective, run.model_cfg, data, run.workdir)
  return dataclasses.replace(run, data=data, schedule=schedule)
