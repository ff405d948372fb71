"""`launch.py --config ... --workdir DIR --dry_run`: one run's start, short of its first step, and
nothing written.

It does what a run does before it trains, in the same order and with the same functions: every
check of the settings on this machine's devices (`run_plan.plan`), the inputs built (a
tokenizer trained, a corpus prepared or a task's features read, in a scratch folder removed at
the end, not in the workdir), the model, optimizer and sharded state set up, and the train step
compiled for the first batch and checked against the device's memory
(`train.check_step_memory`). A resumed run's settings are not compared with its config.json
here: the run itself does that before anything is written.
"""

from __future__ import annotations

import tempfile

import jax

from bertjax.core import paths
from bertjax.runtime import sharding
from bertjax.trainer import run_plan, train


def dry_run(config, workdir) -> str:
  """Checks a run of `config` in `workdir` as far as its first step, writing nothing there;
  returns the line that says what was checked (a failed check is its one-line error)."""
  paths.check_output_folder(workdir)
  plan = run_plan.plan(config, paths.as_path(workdir))
  with tempfile.TemporaryDirectory(prefix="bertjax-dry-run-") as scratch:
    data = plan.objective.build_inputs(config, paths.as_path(scratch),
                                       eval_batch_size=plan.eval_batch_size)
    plan = run_plan.with_inputs(plan, data)
    s, state = train.setup(config, plan.objective, plan.model_cfg, plan.mesh, plan.schedule,
                           plan.grad_accum_steps, rules=plan.rules)
    memory = train.check_step_memory(s, state, sharding.shard_batch(next(data.train), s.mesh))
  devices = jax.devices()
  return (f"dry run: settings checked, inputs built ({plan.schedule.total_steps} steps of "
          f"{config.batch_size} rows) and the train step compiled on {len(devices)} "
          f"{devices[0].platform} device(s) ({memory}); nothing written to {workdir}")
