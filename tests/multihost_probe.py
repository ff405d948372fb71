"""A stand-in command for tests/test_multihost.py, started on every process by the launcher.

  multihost_probe.py N            prints `probe <process id> of <count>` and exits N (no JAX)
  multihost_probe.py --differ ... runs the rest (python ...) as given, process 1 adding
                                  --config.learning_rate=0.5: processes with different settings
  multihost_probe.py --code COPY ...  runs the rest (python ...) as given, process 1 in the folder
                                  COPY (a copy of the repository with other code), the others here
  multihost_probe.py --hold DIR   a run's stand-in that waits: process 0 holds DIR's workdir lock
                                  as a run's does; each prints `waiting <pid>`, and on SIGTERM
                                  prints 200 lines, writes DIR/ended.<id> and exits 75
"""

import contextlib
import os
import signal
import sys
import time


def hold(workdir):
  """`--hold`: what the launcher's end must end (a run's processes, one holding the lock)."""
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from bertjax.runtime import workdir as workdir_lib  # pylint: disable=import-outside-toplevel
  me = os.environ["JAX_PROCESS_ID"]

  def stop(signum, frame):
    del signum, frame
    time.sleep(0.5)  # the launcher's end (all of its threads, its files) is over before it prints
    for i in range(200):  # more than a pipe whose reader is gone would take without its end held
      print(f"stopping {i}", flush=True)
    with open(os.path.join(workdir, f"ended.{me}"), "w", encoding="utf-8") as f:
      f.write("75")
    sys.exit(75)
  signal.signal(signal.SIGTERM, stop)
  with workdir_lib.locked(workdir) if me == "0" else contextlib.nullcontext():
    print(f"waiting {os.getpid()}", flush=True)
    time.sleep(300)
  sys.exit(0)


if __name__ == "__main__":
  if sys.argv[1] == "--hold":
    hold(sys.argv[2])
  elif sys.argv[1] == "--differ":
    command = [sys.executable, *sys.argv[2:]]
    if os.environ["JAX_PROCESS_ID"] == "1":
      command.append("--config.learning_rate=0.5")
    os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.execv(sys.executable, command)
  elif sys.argv[1] == "--code":
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.chdir(sys.argv[2] if os.environ["JAX_PROCESS_ID"] == "1" else here)
    os.execv(sys.executable, [sys.executable, *sys.argv[3:]])
  print(f"probe {os.environ['JAX_PROCESS_ID']} of {os.environ['JAX_NUM_PROCESSES']}", flush=True)
  sys.exit(int(sys.argv[1]))
