"""Runs a script (launch.py) with tests/cudnn_rules.py's double of cuDNN's fused attention
installed, so that a whole run on the CPU with the GPU kernel set meets cuDNN's rules:

  PYTHONPATH=. python tests/with_cudnn_rules.py launch.py --config ... --workdir ...

At exit it prints one line, `cudnn double: N fused calls traced, M in training`, to stderr.
"""

import atexit
import runpy
import sys

from tests import cudnn_rules

if __name__ == "__main__":
  calls = cudnn_rules.install()
  atexit.register(lambda: print(f"cudnn double: {len(calls.fused)} fused calls traced, "
                                f"{len(calls.trained)} in training", file=sys.stderr))
  sys.argv = sys.argv[1:]
  runpy.run_path(sys.argv[0], run_name="__main__")
