"""A stand-in command for tests/test_multihost.py, started on every process by the launcher.

  multihost_probe.py N            prints `probe <process id> of <count>` and exits N (no JAX)
  multihost_probe.py --differ ... runs the rest (python ...) as given, process 1 adding
                                  --config.learning_rate=0.5: processes with different settings
"""

import os
import sys

if __name__ == "__main__":
  if sys.argv[1] == "--differ":
    command = [sys.executable, *sys.argv[2:]]
    if os.environ["JAX_PROCESS_ID"] == "1":
      command.append("--config.learning_rate=0.5")
    os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.execv(sys.executable, command)
  print(f"probe {os.environ['JAX_PROCESS_ID']} of {os.environ['JAX_NUM_PROCESSES']}", flush=True)
  sys.exit(int(sys.argv[1]))
