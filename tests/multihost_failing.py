"""A stand-in command for tests/test_multihost.py: the processes join as launch.py joins them and
pass a collective together; then process N fails alone with a one-line error while every other
process waits in the next collective, which it never joins.

  multihost_failing.py N
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=wrong-import-position
import jax
from jax.experimental import multihost_utils

from bertjax.core.errors import fail, run_cli
from bertjax.runtime import distributed
# pylint: enable=wrong-import-position


def main():
  distributed.initialize()
  multihost_utils.sync_global_devices("joined")
  print("passed the first collective", flush=True)
  if jax.process_index() == int(sys.argv[1]):
    fail(f"the input of process {jax.process_index()} is bad; give it a good one")
  multihost_utils.sync_global_devices("after the failure")
  print("passed the second collective", flush=True)


if __name__ == "__main__":
  run_cli(lambda: distributed.run_main(main))
