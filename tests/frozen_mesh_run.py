"""Trains a frozen-encoder GLUE model on a (2, 2, 2) mesh of 8 faked CPU devices and on one
device, and prints what test_frozen.py checks as JSON. Run in a fresh process so XLA_FLAGS can
fake the device count before JAX starts:
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/frozen_mesh_run.py
"""

import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import jax  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

from test_frozen import build, changed, flat, glue_batch, run_steps, task_config  # pylint: disable=wrong-import-position


def main():
  result = {}
  for name, mesh in (("mesh", (2, 2, 2)), ("single", (1, 1, 1))):
    config = task_config(**{"freeze.encoder": True, "freeze.train_top_layers": 1,
                            "mesh_shape": mesh})
    s, state = build(config, mesh)
    before = flat(state.params)
    # The optimizer state of each trainable parameter is laid out like the parameter.
    specs = {k: str(v.sharding.spec) for k, v in flat_arrays(state.params).items()}
    mu = flat_arrays(state.opt_state.inner_state[1][0].mu)
    state, losses = run_steps(s, state, glue_batch(), 3)
    result[name] = {
        "losses": losses, "moved": sorted(changed(before, flat(state.params))),
        "mu_specs_match": all(str(v.sharding.spec) == specs[k] for k, v in mu.items()),
        "mu_keys": sorted(mu), "sharded_mu": sum(len(v.sharding.device_set) > 1 and
                                                 str(v.sharding.spec) != "PartitionSpec()"
                                                 for v in mu.values())}
  print(json.dumps(result))


def flat_arrays(tree):
  return {"/".join(str(getattr(k, "key", k)) for k in path): v
          for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


if __name__ == "__main__":
  np.set_printoptions(precision=4)
  main()
