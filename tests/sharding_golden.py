"""Prints (or checks) the partition spec of every bert-base parameter on a (2, 2, 2) mesh.

Run in a fresh process with 8 fake devices (test_sharding_golden.py does):
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/sharding_golden.py OUT.json
Regenerate the golden file after a deliberate layout change:
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/sharding_golden.py \
      tests/golden/sharding_bert_base_2x2x2.json
"""

import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import flax  # pylint: disable=wrong-import-position

from bertjax.config import config_lib  # pylint: disable=wrong-import-position
from bertjax.registry import get_objective  # pylint: disable=wrong-import-position
from bertjax.runtime import sharding  # pylint: disable=wrong-import-position
from bertjax.trainer import train  # pylint: disable=wrong-import-position


def specs() -> dict[str, list]:
  config = config_lib.load_config_file(str(REPO / "configs/quickstart.py"))
  from configs.common import model_config  # pylint: disable=g-import-not-at-top
  with config.unlocked():
    config.model = model_config("bert-base")
  config.mesh_shape = (2, 2, 2)
  objective = get_objective(config)
  model = objective.make_model(config, train.model_config_from(config))
  mesh = sharding.make_mesh(config.mesh_shape)
  _, shardings = train.param_shardings_for(objective, model, mesh,
                                           objective.init_batch(config, 1, 128, 20), rules=sharding.rules_from_config(config))
  flat = flax.traverse_util.flatten_dict(shardings, sep="/")
  return {k: [list(a) if isinstance(a, tuple) else a for a in v.spec] for k, v in sorted(flat.items())}


if __name__ == "__main__":
  pathlib.Path(sys.argv[1]).write_text(json.dumps(specs(), indent=1) + "\n")
