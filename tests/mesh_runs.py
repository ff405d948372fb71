"""Runs a few short trainings on given meshes and prints their losses as JSON (used by test_mesh.py).

Run in a fresh process so XLA_FLAGS can fake the device count before JAX starts:
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/mesh_runs.py OUT.json \
      mlm_nsp:8,1,1 mlm_nsp:2,4,1
"""

import json
import pathlib
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bertjax.config import config_lib  # pylint: disable=wrong-import-position
from bertjax.runtime import metric_writers  # pylint: disable=wrong-import-position
from bertjax.trainer import train  # pylint: disable=wrong-import-position


def run(objective: str, mesh: tuple[int, ...], workdir: str) -> list[float]:
  config = config_lib.load_config_file(str(REPO / "configs/quickstart.py") + ":runlocal")
  config_lib.apply_overrides(config, [
      "data.synthetic=True", "model.vocab_size=128", "model.hidden_size=32",
      "model.intermediate_size=64", "model.num_attention_heads=4", "model.num_hidden_layers=2",
      "max_seq_length=16", "max_predictions_per_seq=4", "batch_size=16", "total_steps=5",
      "log_every=1", "eval_every=0", "checkpoint_every=100", "tensorboard=False",
      "async_checkpointing=False", f"objective='{objective}'", f"mesh_shape={mesh}",
      "model.hidden_dropout_prob=0.1"])
  train.train_and_evaluate(config, workdir)
  rows = metric_writers.read_metrics(pathlib.Path(workdir))
  return [r["loss"] for r in rows if r["split"] == "train"]


def main():
  out, specs = sys.argv[1], sys.argv[2:]
  results = {}
  for spec in specs:
    objective, mesh = spec.split(":")
    with tempfile.TemporaryDirectory() as d:
      results[spec] = run(objective, tuple(int(x) for x in mesh.split(",")), d)
  pathlib.Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
  main()
