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
import jax.numpy as jnp
import numpy as np
from absl import flags
from ml_collections import config_flags
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec as P

from bertjax.config import config_checks, config_lib
from bertjax.core import command_line
from bertjax.core.errors import fail, run_cli
from bertjax.models import kernels, splash
from bertjax.registry import get_objective
from bertjax.runtime import freezing, optim, sharding
from bertjax.tasks import base as task_base
from bertjax.trainer import run_plan, train
from bertjax import inputs

V4_32 = (4, 2, 2)  # 16 devices: data, fsdp, tensor


def abstract_mesh(shape: Sequence[int]) -> AbstractMesh:
  return AbstractMesh(tuple(shape), sharding.MESH_AXES,
                      axis_types=(AxisType.Auto,) * len(sharding.MESH_AXES))


def _batch_shapes(config, objective) -> dict[str, jax.ShapeDtypeStruct]:
  """The global train batch's shapes: a fine-tuning task's features (its init batch holds them
  all), or the synthetic pretraining batch (every field a pretraining objective reads), with
  packed rows' segment ids where the recipe packs."""
  if isinstance(objective, task_base.TaskObjective):
    batch = jax.eval_shape(lambda: objective.init_batch(
        config, config.batch_size, config.max_seq_length, config.max_predictions_per_seq))
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
  one = inputs.SyntheticBatches(config, config.model.vocab_size, 0, config.batch_size)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in next(one).items()}
  if config.data.get("pack"):
    batch["segment_ids"] = jax.ShapeDtypeStruct(batch["input_ids"].shape, np.int32)
  return batch


def export_train_step(config, mesh_shape: Sequence[int] = V4_32) -> jax.export.Exported:
  """`config`'s train step under `model.kernels=tpu`, exported for TPU over an abstract mesh of
  `mesh_shape` (module docstring). Raises what the lowering raises."""
  with config.unlocked():
    config.model.kernels = "tpu"
  objective = get_objective(config)
  model_cfg = objective.model_config(config)
  mesh = abstract_mesh(mesh_shape)
  rules = sharding.rules_from_config(config)
  accum = int(config.get("grad_accum_steps", 1))
  model = objective.make_model(config, model_cfg)
  init_batch = objective.init_batch(config, 1, config.max_seq_length,
                                    config.max_predictions_per_seq)
  abstract_boxed = train.abstract_params_of(objective, model, init_batch)
  params = nn.meta.unbox(abstract_boxed)
  partition = freezing.Partition.of(params, freezing.FreezeSpec.from_config(config),
                                    model_cfg.num_hidden_layers)
  optimizer = optim.make_optimizer(config, params=partition.trainable(params),
                                   num_layers=model_cfg.num_hidden_layers,
                                   scalar_clipping=kernels.for_model(model_cfg).scalar_clipping,
                                   total_steps=max(int(config.total_steps), 1))
  param_shardings = run_plan.param_shardings(abstract_boxed, mesh, rules)
  abstract_opt = jax.eval_shape(optimizer.init, partition.trainable(params))
  repl = NamedSharding(mesh, P())
  opt_shardings = optim.state_shardings(config, optimizer, abstract_opt,
                                        partition.trainable(param_shardings), repl)
  state_shardings = train.TrainState(step=repl, params=param_shardings, opt_state=opt_shardings,
                                     rng=repl)
  state = train.TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params,
                           opt_state=abstract_opt,
                           rng=jax.ShapeDtypeStruct((2,), jnp.uint32))
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), state,
                       state_shardings)
  batch_sharding = NamedSharding(mesh, P(sharding.BATCH_AXES))
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding)
           for k, v in _batch_shapes(config, objective).items()}
  step = jax.jit(train.make_train_step(objective, model, optimizer, accum, partition=partition),
                 in_shardings=(state_shardings, batch_sharding),
                 out_shardings=(state_shardings, repl), donate_argnums=(0,))
  with (kernels.lowering_for("tpu"), jax.sharding.use_abstract_mesh(mesh),
        nn.logical_axis_rules(rules)):
    return jax.export.export(step, platforms=["tpu"])(state, batch)


def custom_calls(exported: jax.export.Exported) -> list[str]:
  """The custom call targets in the lowered module (the Pallas kernels: tpu_custom_call)."""
  return sorted(set(re.findall(r"custom_call @(\w+)", exported.mlir_module())))


PROG = "python -m bertjax.tools.tpu_lowering"


def main(argv: Sequence[str] | None = None):
  argv = list(sys.argv[1:] if argv is None else argv)
  overrides = [a for a in argv if a.startswith("--config.")]  # typed by config_lib, as launch.py
  argv = [a for a in argv if not a.startswith("--config.")]

  def define(fv: flags.FlagValues) -> None:
    command_line.define_config_file(fv, [PROG, *argv], "configs/<exp>.py[:variant]; then "
                                    "--config.key=value sets one of its settings",
                                    config_lib.load_config_file)
    flags.DEFINE_string("mesh", ",".join(map(str, V4_32)), "data,fsdp,tensor sizes of the "
                        "abstract mesh (default: a v4-32's 16)", flag_values=fv)

  fv, _ = command_line.parse(argv, define, prog=PROG, doc=__doc__, required=["config"])
  try:
    shape = tuple(int(x) for x in fv.mesh.split(","))
  except ValueError:
    shape = ()
  if len(shape) != 3 or min(shape) < 1:
    fail(f"--mesh={fv.mesh!r} takes three sizes data,fsdp,tensor, e.g. 4,2,2")
  config = fv.config
  config_lib.apply_overrides(config, overrides)
  config_checks.check_settings(config)  # the settings the optimizer and model trust
  exported = export_train_step(config, shape)
  print(f"{config_flags.get_config_filename(fv['config'])}: the TPU-set train step lowers for TPU "
        f"over a {math.prod(shape)}-device mesh {shape}; custom calls: "
        f"{', '.join(custom_calls(exported)) or 'none'}")


if __name__ == "__main__":
  run_cli(main)
