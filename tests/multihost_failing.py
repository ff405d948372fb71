"""A stand-in command for tests/test_multihost.py: the processes join as launch.py joins them and
pass a collective together; then process N fails alone with a one-line error while every other
process waits in the next collective, which it never joins.

With WORKDIR, all of it runs holding WORKDIR/lock, as a run's process 0 holds it, and every other
process is busy in a long step (its main thread asleep for BUSY_S) before that collective: only
the word of the failure in the coordinator's store ends it, its main thread never leaving the
lock's `with` (on the CPU a collective whose peer is gone raises, and that unwinds it).

  multihost_failing.py N [WORKDIR]
"""

import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=wrong-import-position
import jax
from jax.experimental import multihost_utils

from bertjax.core.errors import fail, run_cli
from bertjax.runtime import distributed, workdir
# pylint: enable=wrong-import-position

BUSY_S = 300


def main():
  distributed.initialize()
  held = len(sys.argv) > 2
  with workdir.locked(sys.argv[2]) if held else contextlib.nullcontext():
    multihost_utils.sync_global_devices("joined")
    print("passed the first collective", flush=True)
    if held and jax.process_index() == 0:
      print(f"holding the lock: {os.path.exists(os.path.join(sys.argv[2], workdir.LOCK))}",
            flush=True)
    if jax.process_index() == int(sys.argv[1]):
      fail(f"the input of process {jax.process_index()} is bad; give it a good one")
    if held:
      time.sleep(BUSY_S)
    multihost_utils.sync_global_devices("after the failure")
    print("passed the second collective", flush=True)


if __name__ == "__main__":
  run_cli(lambda: distributed.run_main(main))
