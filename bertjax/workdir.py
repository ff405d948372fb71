"""One workdir, one run: the lock a running process holds.

- WORKDIR/lock (JSON: pid, hostname, started) is created atomically by the run that trains in the
  workdir and removed when it ends. A second run is refused while the holder lives; a lock whose
  process is gone (killed, on this host) is taken over with a warning. On another host nothing can
  be checked: the run is refused, and the message says to delete the file if that run is gone.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import pathlib
import socket
import time
from typing import Iterator

import jax

from bertjax.errors import fail

LOCK = "lock"

_held: set[str] = set()  # the locks this process holds (a pid of ours in a lock may be a past run's)


# ---------------------------------------------------------------------------------------------
# The lock.


@contextlib.contextmanager
def locked(workdir: pathlib.Path) -> Iterator[None]:
  """Holds WORKDIR/lock for the duration (process 0 of a multi-host run only)."""
  if jax.process_index() != 0:
    yield
    return
  path = pathlib.Path(workdir) / LOCK
  mine = _acquire(path)
  try:
    yield
  finally:
    _release(path, mine)


def _acquire(path: pathlib.Path) -> str:
  mine = json.dumps({"pid": os.getpid(), "hostname": socket.gethostname(),
                     "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")})
  for _ in range(10):
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      text = _read_lock(path)
      if text is not None and _refuse_unless_stale(path, text):
        _take_over(path, text)
      continue
    with os.fdopen(fd, "w") as f:
      f.write(mine)
    _held.add(str(path.absolute()))
    return mine
  fail(f"could not take {path}: other runs keep taking it; start one run per --workdir")


def _release(path: pathlib.Path, mine: str) -> None:
  _held.discard(str(path.absolute()))
  with contextlib.suppress(FileNotFoundError):
    if path.read_text() == mine:  # never another run's lock
      path.unlink()


def _read_lock(path: pathlib.Path) -> str | None:
  """The lock's text (None: it is gone). A lock just created may not be written yet: wait."""
  for _ in range(20):
    try:
      text = path.read_text()
    except FileNotFoundError:
      return None
    with contextlib.suppress(ValueError):
      holder = json.loads(text)
      if isinstance(holder, dict) and isinstance(holder.get("pid"), int):
        return text
    time.sleep(0.05)
  fail(f"{path} is not a lock this program wrote; delete it if no run uses {path.parent}")


def _refuse_unless_stale(path: pathlib.Path, text: str) -> bool:
  """True when the lock's process is gone (this host); else a one-line refusal."""
  holder = json.loads(text)
  pid, host, since = holder.get("pid"), holder.get("hostname"), holder.get("started")
  in_use = f"{path.parent} is in use by pid {pid} on {host} since {since} ({path})"
  if host != socket.gethostname():
    fail(f"{in_use}; it cannot be checked from {socket.gethostname()}: wait for it, use another "
         f"--workdir, or delete {path} if that run is gone")
  if _alive(int(pid), since, str(path.absolute())):
    fail(f"{in_use}; wait for it or use another --workdir")
  return True


def _alive(pid: int, since: str, path: str) -> bool:
  if pid == os.getpid():  # a run of this process, or a past process that had our pid (containers)
    return path in _held
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process: alive
    pass
  return not _gone_or_reused(pid, since)


def _gone_or_reused(pid: int, since: str) -> bool:
  """Linux: the process is a zombie (dead, not yet reaped), or started after the lock was taken
  (its pid was reused). False where /proc cannot tell."""
  try:
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    boot = next(float(l.split()[1]) for l in pathlib.Path("/proc/stat").read_text().splitlines()
                if l.startswith("btime "))
    started = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    locked_at = datetime.datetime.fromisoformat(since).timestamp()
  except (OSError, ValueError, IndexError, StopIteration, TypeError):
    return False
  # The lock is taken after its process starts; 3 s covers btime's whole seconds and rounding.
  return fields[0] == "Z" or started > locked_at + 3


def _take_over(path: pathlib.Path, text: str) -> None:
  """Moves a stale lock aside (one atomic rename, so of two runs taking over, one wins)."""
  aside = path.with_name(f"{LOCK}.stale.{os.getpid()}")
  try:
    os.rename(path, aside)
  except FileNotFoundError:
    return  # another run moved it first
  if aside.read_text() != text:  # a live lock, taken since we read the stale one: put it back
    with contextlib.suppress(FileExistsError):
      os.link(aside, path)
    aside.unlink()
    return
  aside.unlink()
  holder = json.loads(text)
  logging.warning("took over the stale lock %s: pid %s on %s (since %s) is gone", path,
                  holder.get("pid"), holder.get("hostname"), holder.get("started"))
