"""A process ending at once through os._exit (bertjax/runtime/distributed.py: a lost process, a
failure of its own or of another process) first releases the workdir locks it holds
(bertjax/runtime/workdir.py), each only while its text is still ours: never another run's."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent

# Takes the lock of two workdirs, then another run's lock replaces the second one's (as a run
# that took it over would write it), then the process ends as `ending` ends it.
HOLDING = """
import pathlib, sys
from bertjax.runtime import distributed, workdir
ours, taken = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
held = [workdir.locked(ours), workdir.locked(taken)]  # kept: a context manager collected releases
for lock in held:
  lock.__enter__()
assert (ours / "lock").exists() and (taken / "lock").exists()
(taken / "lock").write_text(sys.argv[3])
print("holding both", flush=True)
"""


@pytest.mark.parametrize("ending", ["_say_and_exit", "_end"])
def test_ending_at_once_removes_our_lock_and_keeps_another_runs(tmp_path, ending):
  """`_say_and_exit` (a process lost, one alone past the join timeout) and `_end` (a process
  failing, or ended by another's failure). (On the original code our lock stayed.)"""
  ours, taken = tmp_path / "ours", tmp_path / "taken"
  ours.mkdir()
  taken.mkdir()
  theirs = json.dumps({"pid": os.getpid(), "hostname": socket.gethostname(),
                       "started": "2030-01-01T00:00:00+00:00"})
  code = HOLDING + f"distributed.{ending}('error: ending here', 2)\nprint('not reached')\n"
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  done = subprocess.run([sys.executable, "-c", code, str(ours), str(taken), theirs], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=120)
  assert done.returncode == 2, done.stderr[-2000:]
  assert done.stdout.splitlines() == ["holding both"], done.stdout
  assert done.stderr.strip().splitlines()[-1] == "error: ending here", done.stderr[-2000:]
  assert not (ours / "lock").exists()
  assert (taken / "lock").read_text() == theirs
  assert sorted(p.name for p in [*ours.iterdir(), *taken.iterdir()]) == ["lock"]
