"""A recipe's train step lowered for a TPU pod on a machine without one.

  python -m bertjax.tools.tpu_lowering --config configs/bert.py:runlocal --mesh 4,2,2

builds the run's TPU-set train step (`model.kernels=tpu`: splash attention, the TPU layers) over
an abstract mesh of the given shape (a v4-32 has 16 devices; `jax.sharding.AbstractMesh`, no
devices needed) with the config's sharding rules, and lowers it with
`jax.export.export(..., platforms=["tpu"])`. The Pallas kernels lower to their Mosaic custom
calls (not interpreted), so a block shape, layout or sharding that the TPU lowering refuses fails
here, on the CPU.

What this proves: the step traces and lowers for TPU under that mesh and those shardings (shapes,
partition specs, the kernels' lowering rules). What it does not: Mosaic's own compilation on the
chip (its tiling and VMEM limits), memory fit, speed, or numerics on a TPU; those need one.
"""

from __future__ import annotations

import math
import re
import sys
from typing import Sequence

import flax.linen as nn
import jax
from ml_collections import config_flags
from jax.sharding import AbstractMesh, AxisType

from bertjax.config import config_checks
from bertjax.core.errors import run_cli
from bertjax.models import kernels
from bertjax.objective import Schedule
from bertjax.registry import get_objective
from bertjax.runtime import sharding
from bertjax.tools import targets
from bertjax.trainer import steps

V4_32 = (4, 2, 2)  # 16 devices: data, fsdp, tensor


def abstract_mesh(shape: Sequence[int]) -> AbstractMesh:
  return AbstractMesh(tuple(shape), sharding.MESH_AXES,
                      axis_types=(AxisType.Auto,) * len(sharding.MESH_AXES))


def export_train_step(config, mesh_shape: Sequence[int] = V4_32) -> jax.export.Exported:
  """`config`'s train step under `model.kernels=tpu`, built by the run's one setup
  (bertjax/trainer/steps.py) over an abstract mesh of `mesh_shape` and exported for TPU (module
  docstring). Raises what the lowering raises."""
  with config.unlocked():
    config.model.kernels = "tpu"
  objective = get_objective(config)
  mesh = abstract_mesh(mesh_shape)
  rules = sharding.rules_from_config(config)
  schedule = Schedule(total_steps=max(int(config.total_steps), 1), eval_every=0)
  s = steps.build(config, objective, objective.model_config(config), mesh, schedule,
                  int(config.get("grad_accum_steps", 1)), rules)
  batch = steps.batch_specs(config, objective, mesh)
  with (kernels.lowering_for("tpu"), jax.sharding.use_abstract_mesh(mesh),
        nn.logical_axis_rules(rules)):
    return jax.export.export(s.train_step, platforms=["tpu"])(s.abstract_state, batch)


def custom_calls(exported: jax.export.Exported) -> list[str]:
  """The custom call targets in the lowered module (the Pallas kernels: tpu_custom_call)."""
  return sorted(set(re.findall(r"custom_call @(\w+)", exported.mlir_module())))


PROG = "python -m bertjax.tools.tpu_lowering"


def main(argv: Sequence[str] | None = None):
  fv, config, shape = targets.step_command(
      sys.argv[1:] if argv is None else argv, prog=PROG, doc=__doc__,
      mesh_default=",".join(map(str, V4_32)),
      mesh_help="data,fsdp,tensor sizes of the abstract mesh (default: a v4-32's 16)")
  config_checks.check_settings(config)  # the settings the optimizer and model trust
  exported = export_train_step(config, shape)
  print(f"{config_flags.get_config_filename(fv['config'])}: the TPU-set train step lowers for TPU "
        f"over a {math.prod(shape)}-device mesh {shape}; custom calls: "
        f"{', '.join(custom_calls(exported)) or 'none'}")


if __name__ == "__main__":
  run_cli(main)
