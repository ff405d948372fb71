"""Several hosts on one machine: N local processes joined by JAX's distributed runtime.

  python -m bertjax.tools.multihost --processes 2 --devices-per-process 2 -- \\
      launch.py --config configs/quickstart.py:runlocal --workdir runs/mh --config.distributed=True

starts the command after `--` N times, as a pod runs it once per host: every process gets
JAX_COORDINATOR_ADDRESS (a free port on 127.0.0.1), JAX_NUM_PROCESSES and its JAX_PROCESS_ID;
on the CPU (the default, `--platform cpu`) also JAX_PLATFORMS=cpu, gloo for the cross-process
collectives (JAX_CPU_COLLECTIVES_IMPLEMENTATION) and K devices each
(XLA_FLAGS=--xla_force_host_platform_device_count=K). A command whose first word ends in .py
runs under this Python. Each line a process prints comes out prefixed `[pN] `.

The launcher ends when every process has ended, and exits with the status of the first process
that failed (0 when all finished); once one fails, the others get SIGTERM, then SIGKILL after
`--grace` seconds. A SIGTERM or Ctrl-C to the launcher goes on to every process as SIGTERM (a
preemption: each saves and exits 75); so does any other end of the launcher, kill -9 included,
through the kernel (Linux's parent-death signal): no process outlives it. The workdir's lock is
the training's (its process 0 holds it), released as that process ends. `--timeout S` ends them all the same way after S seconds
(exit 124 when it came to that). It never imports JAX.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from typing import Mapping, Sequence

from absl import flags

from bertjax.core import command_line as cli
from bertjax.core import ports
from bertjax.core.errors import fail, run_cli

EXIT_TIMEOUT = 124  # as coreutils' timeout
_DEVICE_COUNT = re.compile(r"--xla_force_host_platform_device_count=\S+")


def free_port(host: str = "127.0.0.1") -> int:
  """A port nothing listens on now (the OS picks it; another program could take it before the
  coordinator binds it, which is unlikely on a test machine)."""
  with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
    s.bind((host, 0))
    return s.getsockname()[1]


def process_env(base: Mapping[str, str], *, coordinator: str, num_processes: int,
                process_id: int, devices_per_process: int | None,
                platform: str | None = "cpu") -> dict[str, str]:
  """The environment of process `process_id`: `base` plus JAX's distributed settings."""
  env = dict(base)
  env.update(JAX_COORDINATOR_ADDRESS=coordinator, JAX_NUM_PROCESSES=str(num_processes),
             JAX_PROCESS_ID=str(process_id), PYTHONUNBUFFERED="1")
  if platform:
    env["JAX_PLATFORMS"] = platform
  if platform == "cpu":
    env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] = "gloo"
    if devices_per_process:
      flags = _DEVICE_COUNT.sub("", env.get("XLA_FLAGS", "")).split()
      env["XLA_FLAGS"] = " ".join(
          [*flags, f"--xla_force_host_platform_device_count={devices_per_process}"])
  return env


def command_line(command: Sequence[str]) -> list[str]:
  """A script (`x.py ...`) runs under this Python; anything else as given."""
  command = list(command)
  if command and command[0].endswith(".py"):
    return [sys.executable, *command]
  return command


class Processes:
  """The N children, their prefixed output, and how they end."""

  def __init__(self, command: Sequence[str], num_processes: int,
               devices_per_process: int | None, platform: str | None, port: int | None = None,
               grace: float = 30.0, out=None):
    self.command = command_line(command)
    self.num = num_processes
    self.grace = grace
    self.out = out or sys.stdout
    self.coordinator = f"127.0.0.1:{port or free_port()}"
    self._lock = threading.Lock()
    self.procs: list[subprocess.Popen] = []
    self._readers: list[threading.Thread] = []
    self.envs = [process_env(os.environ, coordinator=self.coordinator, num_processes=self.num,
                             process_id=i, devices_per_process=devices_per_process,
                             platform=platform)
                 for i in range(self.num)]

  def start(self) -> None:
    """Starts the processes, each told to stop by the kernel when this thread ends however it
    ends (kill -9 included: `owned`), and each holding the read end of its own output's pipe too:
    a process told to stop when the launcher is gone still prints its last lines (into the pipe's
    64 KiB) without a broken pipe failing it before it has saved. Call it from the thread that
    lives as long as the processes (the main one)."""
    for i, env in enumerate(self.envs):
      read, write = os.pipe()
      try:
        proc = subprocess.Popen(owned(self.command), env=env, stdout=write, stderr=write,
                                stdin=subprocess.DEVNULL, pass_fds=(read,),
                                start_new_session=True)  # a terminal's Ctrl-C reaches us only
      finally:
        os.close(write)
      self.procs.append(proc)
      reader = threading.Thread(target=self._copy, args=(i, os.fdopen(read, "rb")), daemon=True)
      reader.start()
      self._readers.append(reader)

  def _copy(self, i: int, stream) -> None:
    for raw in iter(stream.readline, b""):
      line = raw.decode("utf-8", "replace").rstrip("\n")
      self._write(f"[p{i}] {line}")
    stream.close()

  def _write(self, line: str) -> None:
    with self._lock:
      self.out.write(line + "\n")
      self.out.flush()

  def say(self, line: str) -> None:
    self._write(f"multihost: {line}")

  def signal_all(self, sig: int) -> None:
    for proc in self.procs:
      if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
          os.killpg(proc.pid, sig)

  def end_all(self) -> None:
    """SIGTERM to those still running, SIGKILL to any left after the grace period."""
    self.signal_all(signal.SIGTERM)
    deadline = time.monotonic() + self.grace
    while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
      time.sleep(0.1)
    self.signal_all(signal.SIGKILL)
    for proc in self.procs:
      proc.wait()

  def wait(self, timeout: float | None = None) -> int:
    """Waits for every process; the first failure ends the rest. Returns the launcher's status."""
    deadline = None if timeout is None else time.monotonic() + timeout
    first_failure = None
    while True:
      codes = [p.poll() for p in self.procs]
      for i, code in enumerate(codes):
        if code not in (None, 0) and first_failure is None:
          first_failure = _status(code)
          if any(c is None for c in codes):
            self.say(f"process {i} exited with status {first_failure}; stopping the others")
            self.end_all()
      if all(c is not None for c in codes):
        break
      if deadline is not None and time.monotonic() > deadline:
        self.say(f"still running after --timeout {timeout:g} s; stopping every process")
        self.end_all()
        first_failure = first_failure or EXIT_TIMEOUT
        break
      time.sleep(0.1)
    for reader in self._readers:
      reader.join(timeout=5)
    return first_failure or 0


# Each process starts as this, which asks Linux for a SIGTERM (a preemption: the process saves
# and exits 75) when its parent, the launcher's thread that started it, ends, kill -9 included
# (prctl(PR_SET_PDEATHSIG): option 1; kept across the exec) and then becomes the command. Not a
# `preexec_fn`: Python code between fork and exec, in a process that has imported JAX (the
# tests', a caller's), may deadlock, and JAX warns of it.
_OWNED = f"""
import ctypes, os, sys
ctypes.CDLL(None, use_errno=True).prctl(1, {int(signal.SIGTERM)}, 0, 0, 0)
if os.getppid() != int(sys.argv[1]):  # the launcher ended before the call: nothing to run
    os._exit(1)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as e:
    print(f"error: cannot run {{sys.argv[2]}} ({{e.strerror}}); give a program that exists",
          file=sys.stderr, flush=True)
    os._exit(127)
"""


def owned(command: Sequence[str]) -> list[str]:
  """`command`, started on Linux through `_OWNED` so that the kernel stops it when the launcher
  ends; elsewhere as it is (the launcher's own `end_all` is all there is)."""
  if not sys.platform.startswith("linux"):
    return list(command)
  return [sys.executable, "-c", _OWNED, str(os.getpid()), *command]


def check_program(program: str) -> None:
  """The command's first word names a script (x.py) or a program that can be started."""
  if program.endswith(".py"):
    if not os.path.isfile(program):
      fail(f"the command after -- runs {program}, which is not a file (from {os.getcwd()}); "
           "give the script's path, e.g. -- launch.py --config ...")
  elif shutil.which(program) is None:
    fail(f"the command after -- runs {program!r}, which is neither an executable file nor a "
         "program on PATH; give a program that exists, e.g. -- launch.py --config ...")


def _status(code: int) -> int:
  """A process's exit status as a shell reports it (128 + N for a signal N)."""
  return 128 - code if code < 0 else code


PROG = "python -m bertjax.tools.multihost"
USAGE = (f"{PROG} --processes N [--devices-per-process K] -- launch.py --config ... --workdir ... "
         "--config.distributed=True")


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_integer("processes", 2, "how many processes (hosts)", lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_integer("devices-per-process", None, "CPU devices each process fakes "
                       "(--xla_force_host_platform_device_count)", lower_bound=1, flag_values=fv)
  flags.DEFINE_string("platform", "cpu", "JAX_PLATFORMS of every process: cpu (default; gloo "
                      "collectives), or '' to leave it to JAX (one machine's GPUs: one process "
                      "per GPU is the caller's CUDA_VISIBLE_DEVICES business)", flag_values=fv)
  flags.DEFINE_integer("port", None, "the coordinator's port (default: a free one)",
                       lower_bound=1, upper_bound=65535, flag_values=fv)
  flags.DEFINE_float("timeout", None, "end every process after this many seconds (exit 124)",
                     flag_values=fv)
  flags.DEFINE_float("grace", 30.0, "seconds between SIGTERM and SIGKILL when stopping the "
                     "processes", flag_values=fv)


def parse_args(argv: Sequence[str]) -> types.SimpleNamespace:
  """The launcher's settings and `command`, the command line after `--`."""
  argv = list(argv)
  if "--" not in argv:
    if not set(cli.HELP_FLAGS) & set(argv):
      fail(f"give the command after --, e.g. -- launch.py --config configs/quickstart.py:"
           f"runlocal --workdir runs/mh --config.distributed=True; see {PROG} --help")
    argv.append("--")
  cut = argv.index("--")
  fv, _ = cli.parse(argv[:cut], define_flags, prog=PROG, usage=USAGE,
                    doc="Starts N local processes of one command joined by JAX's distributed "
                        "runtime (a pod's hosts on one machine).")
  command = argv[cut + 1:]
  if not command:
    fail(f"the command after -- is empty; see {PROG} --help")
  check_program(command[0])
  return types.SimpleNamespace(command=command, processes=fv.processes,
                               devices_per_process=fv["devices-per-process"].value,
                               platform=fv.platform, port=fv.port, timeout=fv.timeout,
                               grace=fv.grace)


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  if args.port:  # before any process starts: a port taken is refused in one line
    ports.check_coordinator_port(f"127.0.0.1:{args.port}")
  procs = Processes(args.command, args.processes, args.devices_per_process,
                    args.platform or None, args.port, args.grace)

  def forward(signum, frame):
    del frame
    procs.say(f"{signal.Signals(signum).name}: passing SIGTERM on to every process")
    procs.signal_all(signal.SIGTERM)

  previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    procs.start()
    return procs.wait(args.timeout)
  finally:
    procs.end_all()  # nothing outlives the launcher, whatever ended it
    for s, handler in previous.items():
      signal.signal(s, handler)


if __name__ == "__main__":
  run_cli(lambda: sys.exit(main()))
