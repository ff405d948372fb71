"""The best parameters of a run, kept by orbax's CheckpointManager (`best_fn`, `best_mode`,
`max_to_keep=1`) in WORKDIR/best/STEP/params, with best/best.json beside for the readers."""

import json
import sys

import numpy as np
import orbax.checkpoint as ocp
import pytest

from bertjax.core import digests, paths
from bertjax.core.errors import UserError
from bertjax.runtime import checkpoints


def _params(value: float) -> dict:
  return {"encoder": {"w": np.full((2, 3), value, np.float32)}, "head": {"b": np.arange(3.0)}}


def _kept(workdir) -> list[str]:
  return sorted(p.name for p in (workdir / "best").iterdir())


@pytest.mark.parametrize("mode, values, best_step", [
    ("max", {2: 0.5, 4: 0.4, 6: 0.7, 8: 0.7}, 6),
    ("min", {2: 3.0, 4: 2.0, 6: 2.5, 8: 1.0}, 8),
])
def test_one_best_step_is_kept_by_orbax(tmp_path, mode, values, best_step):
  keeper = checkpoints.BestKeeper(tmp_path, "score", mode)
  for step, value in values.items():
    keeper.update(step, {"score": value, "loss": 1.0}, _params(step))
  # The step orbax kept, no other (a worse or equal evaluation is not written at all).
  assert _kept(tmp_path) == [str(best_step), "best.json"]
  kept = json.loads((tmp_path / "best/best.json").read_text())
  assert (kept["step"], kept["metric"], kept["value"]) == (best_step, "score", values[best_step])
  folder = checkpoints.best_params(tmp_path / "best")
  assert folder == paths.as_path(tmp_path / "best" / str(best_step) / "params")
  assert digests.verify(folder)  # every reader checks it
  restored = checkpoints.restore_params(tmp_path / "best")
  np.testing.assert_array_equal(restored["encoder"]["w"], _params(best_step)["encoder"]["w"])
  # orbax's own record of the kept step's metrics: a restarted run compares with it.
  manager = ocp.CheckpointManager(paths.absolute(tmp_path / "best"), item_names=("params",))
  assert manager.metrics(best_step)["score"] == values[best_step]
  manager.close()
  assert checkpoints.BestKeeper(tmp_path, "score", mode).value == values[best_step]


def test_a_restarted_keeper_reads_the_value_from_the_kept_step(tmp_path):
  """best.json lost (a copy without it): the kept step's metrics still say what to beat."""
  checkpoints.BestKeeper(tmp_path, "score", "max").update(2, {"score": 0.5}, _params(2))
  (tmp_path / "best/best.json").unlink()
  keeper = checkpoints.BestKeeper(tmp_path, "score", "max")
  assert keeper.value == 0.5
  keeper.update(4, {"score": 0.4}, _params(4))
  assert _kept(tmp_path) == ["2"]


def test_a_best_folder_of_the_earlier_layout_is_still_read(tmp_path):
  """best/params beside best.json (written before CheckpointManager kept it): read as before,
  and replaced by the first better evaluation."""
  best = tmp_path / "best"
  writer = ocp.StandardCheckpointer()
  writer.save(paths.absolute(best / "params"), _params(1))
  writer.wait_until_finished()
  digests.write(paths.as_path(best / "params"))
  (best / "best.json").write_text(json.dumps({"step": 1, "metric": "score", "value": 0.5,
                                              "metrics": {"score": 0.5}}))
  assert checkpoints.best_params(best) == paths.as_path(best / "params")
  np.testing.assert_array_equal(checkpoints.restore_params(best)["encoder"]["w"],
                                _params(1)["encoder"]["w"])
  keeper = checkpoints.BestKeeper(tmp_path, "score", "max")
  assert keeper.value == 0.5
  keeper.update(3, {"score": 0.6}, _params(3))
  assert _kept(tmp_path) == ["3", "best.json"]


def test_a_damaged_kept_step_is_refused_naming_its_folder(tmp_path):
  checkpoints.BestKeeper(tmp_path, "score", "max").update(2, {"score": 0.5}, _params(2))
  folder = tmp_path / "best/2/params"
  target = max((f for f in folder.rglob("*") if f.is_file() and f.name != digests.DIGEST),
               key=lambda f: f.stat().st_size)
  data = bytearray(target.read_bytes())
  data[len(data) // 2] ^= 0x7F
  target.write_bytes(bytes(data))
  with pytest.raises(UserError, match=f"{folder} is damaged: .*point at the run {tmp_path}"):
    checkpoints.restore_params(tmp_path / "best")


_TWO_PROCESS_KEEPER = """
import sys
import jax
import numpy as np
from bertjax.runtime import checkpoints, distributed
distributed.initialize()
keeper = checkpoints.BestKeeper(sys.argv[1], "score", "max")
mesh = jax.make_mesh((jax.device_count(),), ("data",))
sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
for step, value in ((2, 0.5), (4, 0.4), (6, 0.7)):
  # One array over both processes' devices, a row each: gathered whole, then saved once.
  whole = np.arange(6.0, dtype=np.float32).reshape(2, 3) + step
  w = jax.make_array_from_callback((2, 3), sharding, lambda index, whole=whole: whole[index])
  keeper.update(step, {"score": value}, {"w": w})
print("kept", keeper.value, flush=True)
"""


@pytest.mark.slow
def test_two_processes_keep_one_best_step(tmp_path):
  """Every process of a run calls `update` with parameters sharded over both processes' devices;
  they are gathered whole, orbax's manager saves them once and keeps one step."""
  from test_multihost import launch  # pylint: disable=import-outside-toplevel
  code, lines = launch([sys.executable, "-c", _TWO_PROCESS_KEEPER, str(tmp_path)], processes=2,
                       devices=1, timeout=240)
  assert code == 0, "\n".join(lines[-30:])
  assert sorted(l for l in lines if "kept" in l) == ["[p0] kept 0.7", "[p1] kept 0.7"]
  assert _kept(tmp_path) == ["6", "best.json"]
  np.testing.assert_array_equal(checkpoints.restore_params(tmp_path / "best")["w"],
                                np.arange(6.0, dtype=np.float32).reshape(2, 3) + 6)
