"""One workdir, one run: the lock (bertjax/workdir.py)."""

import json
import logging
import os
import pathlib
import socket
import subprocess
import sys

import pytest

from bertjax import workdir as workdir_lib
from bertjax.errors import UserError


HOST = socket.gethostname()


def write_lock(workdir: pathlib.Path, pid: int, host: str = HOST,
               started: str = "2030-01-01T00:00:00+00:00") -> str:
  text = json.dumps({"pid": pid, "hostname": host, "started": started})
  (workdir / "lock").write_text(text)
  return text


def take(workdir: pathlib.Path) -> dict:
  """Takes and releases the lock; returns what it held."""
  with workdir_lib.locked(workdir):
    return json.loads((workdir / "lock").read_text())


def dead_pid() -> int:
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()
  return proc.pid


@pytest.fixture
def sleeper():
  proc = subprocess.Popen(["sleep", "60"])
  yield proc
  proc.kill()
  proc.wait()


# ---------------------------------------------------------------------------------------------
# The lock.


def test_lock_is_held_while_running_and_released_after(tmp_path):
  with workdir_lib.locked(tmp_path):
    held = json.loads((tmp_path / "lock").read_text())
    assert held["pid"] == os.getpid() and held["hostname"] == HOST and held["started"]
    with pytest.raises(UserError) as e:  # the same process, a second time: in use
      take(tmp_path)
    assert f"in use by pid {os.getpid()} on {HOST}" in str(e.value)
  assert not (tmp_path / "lock").exists()
  with pytest.raises(RuntimeError):
    with workdir_lib.locked(tmp_path):
      raise RuntimeError("a crash inside the run")
  assert not (tmp_path / "lock").exists()  # released on errors too


def test_live_holder_is_refused_and_its_lock_kept(tmp_path, sleeper):
  text = write_lock(tmp_path, sleeper.pid)
  with pytest.raises(UserError) as e:
    take(tmp_path)
  assert str(e.value) == (f"{tmp_path} is in use by pid {sleeper.pid} on {HOST} since "
                          f"2030-01-01T00:00:00+00:00 ({tmp_path / 'lock'}); wait for it or use "
                          "another --workdir")
  assert (tmp_path / "lock").read_text() == text


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path, caplog):
  pid = dead_pid()
  write_lock(tmp_path, pid)
  with caplog.at_level(logging.WARNING):
    held = take(tmp_path)
  assert held["pid"] == os.getpid()
  assert f"took over the stale lock {tmp_path / 'lock'}: pid {pid} on {HOST}" in caplog.text
  assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing left behind


def test_lock_of_another_host_is_refused_with_how_to_free_it(tmp_path):
  text = write_lock(tmp_path, dead_pid(), host="elsewhere-host")
  with pytest.raises(UserError) as e:
    take(tmp_path)
  message = str(e.value)
  assert "in use by pid" in message and "on elsewhere-host" in message
  assert f"delete {tmp_path / 'lock'} if that run is gone" in message
  assert (tmp_path / "lock").read_text() == text


def test_our_pid_in_a_lock_we_do_not_hold_is_a_past_process(tmp_path):
  """A restarted container often gives the new run the old run's pid."""
  write_lock(tmp_path, os.getpid())
  assert take(tmp_path)["started"] != "2030-01-01T00:00:00+00:00"


@pytest.mark.skipif(not pathlib.Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_reused_pid_and_zombie_are_stale(tmp_path, sleeper):
  # The live process started after the lock was taken: the lock's pid was reused.
  write_lock(tmp_path, sleeper.pid, started="2000-01-01T00:00:00+00:00")
  assert take(tmp_path)["pid"] == os.getpid()
  # Killed but not yet reaped: os.kill(pid, 0) still succeeds.
  zombie = subprocess.Popen(["sleep", "60"])
  zombie.kill()
  try:
    write_lock(tmp_path, zombie.pid, started="2000-01-01T00:00:00+00:00")
    assert take(tmp_path)["pid"] == os.getpid()
  finally:
    zombie.wait()


@pytest.mark.parametrize("content", ["", "not json", "[1, 2]", '{"pid": "x"}'])
def test_unreadable_lock_is_refused_in_one_line(tmp_path, content):
  (tmp_path / "lock").write_text(content)
  with pytest.raises(UserError, match="is not a lock this program wrote; delete it if no run uses"):
    take(tmp_path)
  assert (tmp_path / "lock").read_text() == content
