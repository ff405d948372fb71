"""The run plan: what a training run is, decided once before its first step.

`plan` is the trainer's one entry into the settings checks (bertjax/config/config_checks.py). It
runs them in the trainer's order and returns a frozen `RunPlan`: the checked config (the caller's
own object, never copied or changed), the objective, the mesh and its logical rules, the model
actually trained, gradient accumulation, the evaluation batch size, the prepared inputs and the
schedule. Code that needs the run's length or evaluation cadence reads `plan.schedule`, not the
config (a fine-tuning task derives them from its training rows while `config.total_steps` stays 0).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, ContextManager

import flax.linen as nn
import ml_collections

from bertjax.config import config_checks
from bertjax.core import paths
from bertjax.models.config import ModelConfig
from bertjax.objective import Schedule
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
  data: Any                          # the prepared inputs (bertjax.inputs.Inputs)
  schedule: Schedule                 # total_steps and eval_every of this run


def accumulation_steps(config, mesh) -> int:
  """`grad_accum_steps`, refused (bertjax/config/config_checks.py) where the batch does not split
  into that many micro-batches over the data-parallel devices and the processes."""
  return config_checks.accumulation_steps(config, mesh)


def eval_batch_size(config, mesh) -> int:
  """Rows per evaluation batch: `eval_batch_size`, or the training micro-batch; refused where it
  does not split over the data-parallel devices and the processes."""
  size = int(config.get("eval_batch_size", 0) or config.batch_size // config.grad_accum_steps)
  config_checks.check_eval_batch_size(size, mesh)
  return size


def param_shardings(abstract_boxed, mesh, rules):
  """The NamedSharding of every parameter of the boxed tree `abstract_boxed` under `rules`,
  refused (`check_param_shardings`) where a dimension does not divide over its mesh axes."""
  shardings = sharding.logical_shardings(abstract_boxed, mesh, rules)
  config_checks.check_param_shardings(nn.meta.unbox(abstract_boxed), shardings)
  return shardings


def plan(config, workdir: paths.Path, objective_of: Callable[[Any], Any],
         prepare: Callable[[Any, ModelConfig], Any],
         checking: ContextManager = contextlib.nullcontext()) -> RunPlan:
  """Checks `config` for a run in `workdir` and returns its plan, in two phases.

  Phase 1, under `checking` (before anything is created, prepared or written): the config alone
  and the paths (`check_settings`); then the objective (`objective_of(config)`) and init_from's
  model against the run's (`check_init_from_model`), the mesh and the model trained; the batch,
  accumulation, mesh and positions against them (`check_run`); what the objective asks of the
  data (`check_objective`).
  Then `prepare(objective, model_cfg)` prepares the inputs (the trainer makes and holds the
  workdir first, and checks a resumed run's settings).
  Phase 2, which needs the prepared inputs: the objective's schedule and the data against the
  model and init_from (`check_data`).
  """
  with checking:
    config_checks.check_settings(config, workdir)
    objective = objective_of(config)
    config_checks.check_init_from_model(config, objective)
    mesh = sharding.make_mesh(config.mesh_shape)
    sharding.check_process_rows(mesh)  # several processes: each feeds its block of the batch
    model_cfg = objective.model_config(config)  # trained: fine-tuning takes init_from's
    accum = config_checks.check_run(config, objective, model_cfg, mesh, workdir)
    config_checks.check_objective(config, objective)
    # A set eval_batch_size was refused above where it does not split; the default (the
    # micro-batch) splits as the batch does.
    eval_size = int(config.get("eval_batch_size", 0) or config.batch_size // accum)
  data = prepare(objective, model_cfg)
  schedule = objective.schedule(config, data)
  config_checks.check_data(config, objective, model_cfg, data, workdir)
  return RunPlan(config=config, workdir=workdir, objective=objective, mesh=mesh,
                 rules=sharding.rules_from_config(config), model_cfg=model_cfg,
                 grad_accum_steps=accum, eval_batch_size=eval_size, data=data, schedule=schedule)
