"""The faults of a run's start and of its launcher (bertjax/tools/multihost.py,
bertjax/runtime/distributed.py), each with real processes on this machine: bad input refused
before anything starts, the launcher killed with -9, the coordinator's port already taken, a
SIGTERM to a process still waiting for the others. Each says what it ends with (one line per
process, the exit status) and how soon; every process is ended in a `finally`.

Cost on a shared 2-core machine (2026-12-06): 13 to 34 s in all, with its load; the launcher's
cases under a second each (no JAX), kill -9 of the launcher 4 to 8 s (two stand-ins importing the
workdir lock's module), the two launch.py cases 3 to 11 s each (launch.py importing JAX and
reaching the join).
"""

import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from bertjax.core import ports
from bertjax.core.errors import UserError
from bertjax.tools import multihost

REPO = pathlib.Path(__file__).resolve().parent.parent
QUICK = ["launch.py", "--config", "configs/quickstart.py:runlocal", "--config.distributed=True"]


class Lines:
  """The launcher's output, kept line by line (`multihost.Processes`' `out`)."""

  def __init__(self):
    self.lines: list[str] = []

  def write(self, text: str) -> None:
    self.lines.extend(text.splitlines())

  def flush(self) -> None:
    pass


def alive(pid: int) -> bool:
  """Whether `pid` runs (a zombie, ended but not yet reaped by its parent, does not)."""
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except FileNotFoundError:
    return False


def processes_naming(text: str) -> list[int]:
  """The pids of the processes whose command line holds `text`."""
  found = []
  for entry in pathlib.Path("/proc").iterdir():
    with contextlib.suppress(OSError):
      if entry.name.isdigit() and text in (entry / "cmdline").read_text(errors="replace"):
        found.append(int(entry.name))
  return [p for p in found if alive(p)]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_kill_9_of_the_launcher_ends_its_processes_and_the_lock_is_released(tmp_path):
  """The launcher killed by SIGKILL (it can do nothing): the kernel tells each process, which ends
  as a preempted run does (exit 75 after its last lines, 200 of them into a pipe whose reader is
  gone) within seconds; process 0, the holder of the workdir's lock, releases it; nothing of the
  run is left. Before, both went on as orphans."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  launcher = subprocess.Popen(
      [sys.executable, "-m", "bertjax.tools.multihost", "--processes", "2", "--",
       "tests/multihost_probe.py", "--hold", str(workdir)], cwd=REPO, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True)
  try:
    pids = {}
    deadline = time.monotonic() + 120
    while len(pids) < 2 and time.monotonic() < deadline:
      line = launcher.stdout.readline()
      assert line, "the launcher ended before its processes waited"
      if found := re.fullmatch(r"\[p(\d)\] waiting (\d+)\n", line):
        pids[int(found.group(1))] = int(found.group(2))
    assert json.loads((workdir / "lock").read_text())["pid"] == pids[0]  # the training's lock
    launcher.kill()
    launcher.wait(timeout=10)
    deadline = time.monotonic() + 15
    while any(alive(p) for p in pids.values()) and time.monotonic() < deadline:
      time.sleep(0.1)
    assert not [p for p in pids.values() if alive(p)], "orphans of the launcher run on"
    assert sorted(f.name for f in workdir.iterdir()) == ["ended.0", "ended.1"]  # no lock left
    assert processes_naming(str(workdir)) == []
  finally:
    launcher.kill()
    for pid in processes_naming(str(workdir)):
      os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("args, said", [
    (["--port", "99999", "--", "launch.py"], "error: flag --port=99999: 99999 is not an integer "
                                             "in the range [1, 65535]"),
    (["--", "/nonexistent"], "error: the command after -- runs '/nonexistent', which is neither "
                             "an executable file nor a program on PATH"),
    (["--", "nowhere.py"], "error: the command after -- runs nowhere.py, which is not a file"),
], ids=["port", "program", "script"])
def test_launcher_refuses_bad_input_in_one_line(tmp_path, args, said):
  """Before starting anything: one line, exit 2 (--port 99999 was accepted; a missing program
  printed a traceback)."""
  done = subprocess.run([sys.executable, "-m", "bertjax.tools.multihost", *args], cwd=tmp_path,
                        capture_output=True, text=True, timeout=60,
                        env=dict(os.environ, PYTHONPATH=str(REPO)))
  assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
  assert done.stderr.splitlines() == [done.stderr.strip()] and said in done.stderr, done.stderr
  assert list(tmp_path.iterdir()) == []


@contextlib.contextmanager
def port_taken():
  """A port some other program listens on (a socket of this test's): the coordinator's."""
  with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s, s.getsockname()[1]


def test_launcher_refuses_a_port_in_use_before_starting_anything(tmp_path):
  with port_taken() as (_, port):
    done = subprocess.run([sys.executable, "-m", "bertjax.tools.multihost", "--port", str(port),
                           "--", sys.executable, "-c", "open('started', 'w')"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
  assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
  assert done.stderr.splitlines() == [
      f"error: the coordinator's port {port} (127.0.0.1:{port}) is in use (a run still going, or "
      "another program, listens there); end that program, or start every process with another "
      "free port (JAX_COORDINATOR_ADDRESS=host:port; bertjax.tools.multihost --port, or leave it "
      "out for a free one)"]
  assert list(tmp_path.iterdir()) == []


def test_a_pods_coordinator_port_is_checked_where_jax_binds_it():
  """Without JAX_COORDINATOR_BIND_ADDRESS (a pod: `host0:8476`) JAX binds every interface: a
  program listening on any of them holds the port, whatever name the address gives; a free port
  passes, as does an address that names none."""
  with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
    s.bind(("0.0.0.0", 0))
    s.listen()
    port = s.getsockname()[1]
    with pytest.raises(UserError, match=rf"^the coordinator's port {port} \(host0:{port}\) is in "
                                        "use"):
      ports.check_coordinator_port(f"host0:{port}")
  ports.check_coordinator_port(f"host0:{multihost.free_port()}")
  ports.check_coordinator_port("host0")


def own_lines(lines, process: int) -> list[str]:
  """What process `process` printed (stdout and stderr), without its prefix."""
  return [l.split(" ", 1)[1] if " " in l else "" for l in lines if l.startswith(f"[p{process}] ")]


@pytest.mark.slow
def test_the_coordinators_port_in_use_ends_both_processes_in_one_line_each(tmp_path):
  """Another program holds the port given: process 0 refuses it before joining (exit 2) and the
  launcher stops process 1, which was waiting for the others there: SIGTERM while joining, exit
  75. Before, process 0 printed gRPC's log line and a traceback, and process 1 waited out the
  join timeout (300 s)."""
  env = {"BERTJAX_JOIN_TIMEOUT_S": "120"}
  with port_taken() as (_, port):
    saved = dict(os.environ)
    os.environ.update(env)
    try:
      out = Lines()
      procs = multihost.Processes([*QUICK, "--workdir", str(tmp_path / "run")], 2, 2, "cpu",
                                  port=port, grace=10, out=out)
    finally:
      os.environ.clear()
      os.environ.update(saved)
    started = time.monotonic()
    procs.start()
    try:
      status = procs.wait(timeout=120)
    finally:
      procs.end_all()
  took = time.monotonic() - started
  assert status == 2, out.lines
  assert [p.returncode for p in procs.procs] == [2, 75]
  assert own_lines(out.lines, 0) == [
      f"error: the coordinator's port {port} (127.0.0.1:{port}) is in use (a run still going, or "
      "another program, listens there); end that program, or start every process with another "
      "free port (JAX_COORDINATOR_ADDRESS=host:port; bertjax.tools.multihost --port, or leave it "
      "out for a free one)"]
  assert own_lines(out.lines, 1) == [
      f"preempted: SIGTERM while process 1 of 2 waited for the others to join at 127.0.0.1:{port} "
      "(nothing was written); run the same command again to go on"]
  assert took < 60, took  # the launcher's SIGTERM, not the join timeout, ended process 1
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_sigterm_to_a_process_waiting_to_join_ends_it_at_once_with_75(tmp_path):
  """Process 1 of 2 of launch.py has reached the coordinator (this test's socket: its connection
  is accepted) and waits for the others; a SIGTERM ends it within seconds with one line, exit 75,
  nothing written. Before, it was held until the join timeout, then exited 2."""
  with port_taken() as (server, port):
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
               JAX_NUM_PROCESSES="2", JAX_PROCESS_ID="1", BERTJAX_JOIN_TIMEOUT_S="120",
               JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}")
    proc = subprocess.Popen([sys.executable, *QUICK, "--workdir", str(tmp_path / "run")],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
      server.settimeout(120)
      connection, _ = server.accept()  # it is in jax.distributed.initialize now
      with contextlib.closing(connection):
        sent = time.monotonic()
        proc.terminate()
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
      proc.kill()
  assert proc.returncode == 75, err[-3000:]
  assert out == "" and err.splitlines() == [
      f"preempted: SIGTERM while process 1 of 2 waited for the others to join at 127.0.0.1:{port} "
      "(nothing was written); run the same command again to go on"]
  assert took < 10, took
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_processes_running_different_code_are_refused_naming_the_files(tmp_path):
  """Process 1 runs from a copy of the repository whose encoder.py has one more line (a host left
  on another commit): every process refuses in one line naming the file, exit 2, nothing
  written. Before, the two trained together, each computing its own step."""
  copy = tmp_path / "copy"
  copy.mkdir()
  shutil.copytree(REPO / "bertjax", copy / "bertjax",
                  ignore=shutil.ignore_patterns("__pycache__"))
  shutil.copytree(REPO / "configs", copy / "configs")
  shutil.copy(REPO / "launch.py", copy / "launch.py")
  with open(copy / "bertjax/models/encoder.py", "a", encoding="utf-8") as f:
    f.write("# another commit\n")
  workdir = tmp_path / "run"
  out = Lines()
  sample = f"--config.data.corpus={REPO / 'bertjax/data/samples/wikitext2_test.raw'}"
  procs = multihost.Processes([str(REPO / "tests/multihost_probe.py"), "--code", str(copy),
                               *QUICK, sample, "--workdir", str(workdir)], 2, 2, "cpu", grace=10,
                              out=out)  # one corpus: the settings agree, only the code differs
  procs.start()
  try:
    status = procs.wait(timeout=180)
  finally:
    procs.end_all()
  assert status == 2, out.lines[-20:]
  said = "run different code (bertjax/models/encoder.py differ); install the same bertjax (one " \
         "commit) on every host"
  for me in (0, 1):  # its own finding, or the other's passed on (whichever comes first)
    lines = own_lines(out.lines, me)
    assert len(lines) == 1 and lines[0].startswith("error: process ") and said in lines[0], \
        out.lines
  assert not workdir.exists()
