"""An asynchronous checkpoint save failing on one process of a two-process run.

orbax writes an asynchronous save in background threads; the save's error stays there while both
processes wait in orbax's barriers. bertjax/runtime/checkpoints.py reads it on the training
loop's next step (or while waiting for the save) and raises it, so that the run ends on every
process as a synchronous save's failure does (tests/test_multihost.py,
test_a_process_failing_alone_mid_run_ends_both_with_one_line).
"""

import shutil

import pytest

from tests.test_multihost import (QUICK, assert_ended_by, assert_intact,
                                  each_ends_after_an_error, on_process_1, train)

ASYNC = ["--config.mesh_shape=(-1,1,1)", "--config.async_checkpointing=True",
         "--config.checkpoint_every=5"]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
  """The quickstart runlocal on 2 processes, saved asynchronously every 5 steps: checkpoints 10,
  15 and 20 kept."""
  workdir = tmp_path_factory.mktemp("async") / "whole"
  train(workdir, 2, None, *ASYNC)
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["10", "15", "20"]
  return workdir


@pytest.mark.slow
@pytest.mark.parametrize("failing", [15, 20], ids=["mid_run", "last_step"])
def test_an_asynchronous_save_failing_on_one_process_ends_both_with_one_line(whole, tmp_path,
                                                                              failing):
  """`whole` resumed from the checkpoint before step `failing`, process 1 alone under a file-size
  limit (`ulimit -f`) below its checkpoint files: its asynchronous save of step `failing` fails
  in orbax's background thread, while training goes on (step 15: the loop reads the error on its
  next step) or the run closes its checkpointer (step 20, the last: it reads the error while
  waiting for the save). Both processes end within FAILED_ALONE_S of the first error line, exit
  2, one line each (process 0's naming process 1 and its line); the checkpoints before
  `failing` and the metrics up to them stay, and no partial checkpoint is left. (Seen failing on
  the original code, both cases: no error line came at all, both processes waiting in orbax's
  barriers, and the test failed at its RUN_S bound with both still running.)"""
  workdir = tmp_path / "run"
  shutil.copytree(whole, workdir)
  for step in (15, 20):
    if step >= failing:
      shutil.rmtree(workdir / "checkpoints" / str(step))
  # Process 1 writes about half of each checkpoint's 11 MiB, in files of 0.7-3.3 MB; nothing
  # else it writes comes near 256 KiB (tests/test_multihost.py).
  command = [*on_process_1(file_size_limit=256 * 1024), *QUICK, "--workdir", str(workdir),
             "--config.distributed=True", *ASYNC]
  statuses, out = each_ends_after_an_error(command, env={"BERTJAX_HEARTBEAT_TIMEOUT_S": "60"})
  assert_ended_by(statuses, out, 1, "file-size limit (ulimit -f)")
  own = [l for l in out.lines if l.startswith("[p1] error:")]
  assert f"the checkpoint of step {failing} " in own[0], own
  assert_intact(workdir, whole, [s for s in (10, 15) if s < failing])
