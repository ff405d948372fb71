"""Several processes, one run: joining JAX's distributed runtime, and agreeing through it.

`initialize` joins the processes (jax.distributed.initialize) with stated timeouts, each read
from the environment:
  BERTJAX_JOIN_TIMEOUT_S (300): how long a process waits for all of them to join; a process
    started alone ends after it with one line (exit 2), not a hang. A SIGTERM while it waits
    ends it at once (one line, exit 75), and process 0 refuses a coordinator's port in use before
    the join (one line, exit 2).
  BERTJAX_HEARTBEAT_TIMEOUT_S (60): a process silent for this long is lost (killed, its host
    gone); every other process ends with one line naming it (exit `EXIT_PROCESS_LOST`) instead of
    waiting in a collective (`watching_the_others`, while a run trains). The next launch resumes
    from the last complete checkpoint.
  BERTJAX_WAIT_TIMEOUT_S (3600): how long the others wait for process 0 to build what is built
    once (a tokenizer, a prepared corpus, a task's features: `built_by_process_0`).
A process that fails alone once they have joined (a user error or a bug raised on it only: a file
only it reads, its disk, its own input pipeline) ends at once with its one line and tells the
others through the coordinator's store; each of them ends within seconds with one line naming it
and its line, and the same exit status (`run_main`), instead of waiting in their next collective
while it waits at JAX's shutdown barrier.
Every process then compares its resolved config and the digest of each of bertjax's source files
with the others' (`check_same_config`) through the coordinator's key-value store, so one run has
one config and one code: a host left on another commit is refused, naming the files that differ.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import select
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, Iterator, Mapping

import jax
from jax._src import distributed as jax_distributed  # its client: the coordinator's store

from bertjax.core import ports
from bertjax.core.errors import (EXIT_INTERRUPTED, EXIT_PREEMPTED, EXIT_USER_ERROR, DiskFull,
                                 UserError, disk_error_of, disk_full, fail)

EXIT_PROCESS_LOST = 69  # sysexits' EX_UNAVAILABLE: another process of the run is gone
_TIMEOUTS = {"join": ("BERTJAX_JOIN_TIMEOUT_S", 300), "heartbeat": ("BERTJAX_HEARTBEAT_TIMEOUT_S", 60),
             "wait": ("BERTJAX_WAIT_TIMEOUT_S", 3600)}
_SHOWN = 6  # differing keys named in a refusal


def timeout_s(which: str, environ: Mapping[str, str] | None = None) -> int:
  """One of the stated timeouts (module docstring), in seconds."""
  environ = os.environ if environ is None else environ
  var, default = _TIMEOUTS[which]
  text = environ.get(var, "")
  if not text:
    return default
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    fail(f"{var}={text!r} must be a whole number of seconds >= 1")
  return value


def jax_distributed_kwargs(environ: dict[str, str] | None = None) -> dict[str, Any]:
  """jax.distributed.initialize() arguments from the variables `--hosts` and
  bertjax.tools.multihost set (empty on Cloud TPU, where JAX discovers every setting itself). JAX
  reads JAX_COORDINATOR_ADDRESS on its own, but not the process count and id."""
  environ = os.environ if environ is None else environ
  kwargs: dict[str, Any] = {}
  if environ.get("JAX_COORDINATOR_ADDRESS"):
    kwargs["coordinator_address"] = environ["JAX_COORDINATOR_ADDRESS"]
  for var, key in (("JAX_NUM_PROCESSES", "num_processes"), ("JAX_PROCESS_ID", "process_id")):
    if environ.get(var):
      try:
        kwargs[key] = int(environ[var])
      except ValueError:
        fail(f"{var}={environ[var]!r} must be an integer")
  return kwargs


def requested_processes(environ: Mapping[str, str] | None = None) -> int:
  """JAX_NUM_PROCESSES (1 when unset): how many processes the environment says the run has."""
  return int(jax_distributed_kwargs(dict(os.environ if environ is None else environ)).get(
      "num_processes", 1))


_AT_ONCE: list[Callable[[], None]] = []  # run before os._exit (`at_once_exit`)


def at_once_exit(hook: Callable[[], None]) -> None:
  """Runs `hook()` (once registered, at every such end) just before this process ends at once
  through os._exit, which skips context managers, `finally` blocks and atexit: what must not
  outlive the process (the workdir lock its process 0 holds: bertjax/runtime/workdir.py). A hook
  runs on the thread that ends the process while the main thread may be anywhere; it must be
  quick, and what it raises is ignored."""
  if hook not in _AT_ONCE:
    _AT_ONCE.append(hook)


def _exit(status: int) -> None:
  for hook in list(_AT_ONCE):
    with contextlib.suppress(Exception):
      hook()
  os._exit(status)  # pylint: disable=protected-access  # the main thread may be in a collective


def _say_and_exit(line: str, status: int) -> None:
  print(line, file=sys.stderr, flush=True)
  _exit(status)


def initialize() -> None:
  """jax.distributed.initialize with the stated timeouts (module docstring). A process alone past
  the join timeout ends with one line (exit 2); so does process 0 where the coordinator's port is
  taken (bertjax/core/ports.py), before it binds it. A SIGTERM (Ctrl-C) while the process waits
  for the others ends it at once with one line, exit 75 (130): JAX's join, in C++, holds the
  Python handler back until it returns (`_joining`). JAX's own limits are set beyond ours: its
  reactions (a C++ abort with a stack trace) come only if ours did not."""
  kwargs = jax_distributed_kwargs()
  join, heartbeat = timeout_s("join"), timeout_s("heartbeat")
  address = kwargs.get("coordinator_address", "")
  if address.startswith("127.0.0.1:"):  # one machine: the coordinator listens there only
    os.environ.setdefault("JAX_COORDINATOR_BIND_ADDRESS", address)
  if address and kwargs.get("process_id") == 0:
    ports.check_coordinator_port(address, os.environ.get("JAX_COORDINATOR_BIND_ADDRESS"))
  n = kwargs.get("num_processes")
  last = n - 1 if isinstance(n, int) else "N-1"
  who = f"process {kwargs.get('process_id', '?')} of {n or '?'}"
  alone = (f"error: {who} waited {join} s (BERTJAX_JOIN_TIMEOUT_S) for the others at "
           f"{address or 'the coordinator'}; start the same command on every host "
           f"(JAX_PROCESS_ID 0 to {last})")
  stopped = (f"while {who} waited for the others to join at {address or 'the coordinator'} "
             "(nothing was written); run the same command again to go on")
  with _joining(join, alone, stopped):
    jax.distributed.initialize(**kwargs, initialization_timeout=join + 60,
                               heartbeat_timeout_seconds=2 * heartbeat + 30,
                               shutdown_timeout_seconds=2 * heartbeat + 30)
  _FAILURES.start()


# What a signal while joining ends the process with: its line's head and the exit status
# (bertjax/core/errors.py: preempted 75, interrupted 130).
_WHILE_JOINING = {signal.SIGTERM: ("preempted: SIGTERM", EXIT_PREEMPTED),
                  signal.SIGINT: ("interrupted: Ctrl-C", EXIT_INTERRUPTED)}


@contextlib.contextmanager
def _joining(join: int, alone: str, stopped: str) -> Iterator[None]:
  """While the body (the join) runs: a thread ends the process with `alone` (exit 2) after `join`
  seconds, or with a SIGTERM's or Ctrl-C's line (`_WHILE_JOINING` + `stopped`) as soon as one
  comes. The signal reaches it through Python's wakeup fd, which the C-level handler writes at
  once, while the Python handler waits for the main thread to leave JAX's C++ call; a signal left
  to its default action meanwhile gets a handler that does nothing, so that it is this line and
  not a kill. Off the main thread only the timeout is watched."""
  joined = threading.Event()
  read, write = os.pipe()
  os.set_blocking(write, False)
  try:
    previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    defaults = {s: signal.signal(s, lambda *_: None) for s in _WHILE_JOINING
                if signal.getsignal(s) == signal.SIG_DFL}
  except ValueError:  # not the main thread
    previous_fd, defaults = None, {}

  def watch():
    deadline = time.monotonic() + join
    try:
      while not joined.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
          _say_and_exit(alone, EXIT_USER_ERROR)
        ready, _, _ = select.select([read] if previous_fd is not None else [], [], [],
                                    min(left, 0.2))
        for signum in os.read(read, 64) if ready else b"":
          if signum in _WHILE_JOINING and not joined.is_set():
            head, status = _WHILE_JOINING[signal.Signals(signum)]
            _say_and_exit(f"{head} {stopped}", status)
    finally:
      os.close(read)
  threading.Thread(target=watch, daemon=True, name="bertjax-join").start()
  try:
    yield
  finally:
    joined.set()
    if previous_fd is not None:
      signal.set_wakeup_fd(previous_fd)
      for s, handler in defaults.items():
        signal.signal(s, handler)
    os.close(write)


class _Reader:
  """A daemon thread of a joined process that reads the coordinator's store each second
  (`_run`, until `stopped`): started and stopped by the run, nothing in a run of one process."""
  name = "bertjax-reader"

  def __init__(self):
    self.stopped = threading.Event()
    self.thread: threading.Thread | None = None

  def start(self) -> None:
    if self.thread is not None or not active():
      return
    self.stopped.clear()
    self.thread = threading.Thread(target=self._run, daemon=True, name=self.name)
    self.thread.start()

  def stop(self) -> bool:
    """Stops the thread; whether one was running."""
    if self.thread is None:
      return False
    self.stopped.set()
    self.thread.join(timeout=5)
    self.thread = None
    return True

  def _run(self) -> None:
    raise NotImplementedError


class _Watch(_Reader):
  """Every process bumps a counter of its own in the coordinator's store each second; one whose
  counter stands still for BERTJAX_HEARTBEAT_TIMEOUT_S is lost, and this process ends with one
  line naming it. A process that ended its run says so ("done") and is not watched."""
  name = "bertjax-watch"

  def stop(self) -> bool:
    if not super().stop():
      return False
    with contextlib.suppress(Exception):
      _client().key_value_set(f"bertjax/alive/{jax.process_index()}", "done", True)
    return True

  def _run(self) -> None:
    client, me, n = _client(), jax.process_index(), jax.process_count()
    limit, count = timeout_s("heartbeat"), 0
    # A process not heard from yet gets twice the limit: it may still be compiling its step.
    seen = {p: (None, time.monotonic() + limit) for p in range(n) if p != me}
    while not self.stopped.wait(1.0):
      count += 1
      now = time.monotonic()
      try:
        client.key_value_set(f"bertjax/alive/{me}", str(count), True)
        values = {p: client.key_value_try_get(f"bertjax/alive/{p}") for p in seen}
      except Exception:  # pylint: disable=broad-except  # not there yet, or the coordinator gone
        values = {}
        for p in seen:
          with contextlib.suppress(Exception):
            values[p] = client.key_value_try_get(f"bertjax/alive/{p}")
      for p, value in values.items():
        if value != seen[p][0]:
          seen[p] = (value, now)
      lost = [p for p, (value, at) in seen.items() if value != "done" and now - at > limit]
      if lost and not self.stopped.is_set():
        if not values and me != 0:
          lost = [0]  # nothing could be read: the coordinator's process
        who = ", ".join(map(str, lost))
        _say_and_exit(f"error: process {who} of the run stopped responding for {limit} s "
                      "(BERTJAX_HEARTBEAT_TIMEOUT_S): it was killed or its host is gone; process "
                      f"{me} stops too; start the same command on every host again to resume "
                      "from the last complete checkpoint", EXIT_PROCESS_LOST)


_WATCH = _Watch()


@contextlib.contextmanager
def watching_the_others() -> Iterator[None]:
  """While a run trains: another process lost ends this one with one line (`_Watch`) instead of
  a wait in a collective. Nothing in a run of one process."""
  _WATCH.start()
  try:
    yield
  finally:
    _WATCH.stop()


# ---------------------------------------------------------------------------------------------
# One process failing alone ends every process. Measured on a 2-core CPU machine (2026-11-28, two
# processes of the quickstart, process 1 under `ulimit -f` failing its step-20 save): without this,
# process 1 printed its line, then waited 151 s at JAX's shutdown barrier (2 x
# BERTJAX_HEARTBEAT_TIMEOUT_S + 30) while process 0 waited in the save's barrier; then both
# aborted (exit 134) with C++ stack traces. With it, process 1 ended 0.4 s after its line and
# process 0 1.4 s after it, both with exit 2 and one line.

FAILED_KEY = "bertjax/failed"  # {"process", "line", "status"} of the first process to fail alone
_LEFT_KEY = "bertjax/left/"    # + a process id: that process is ending now
_POLL_S = 1.0                  # how often every process reads FAILED_KEY
_LAST_OUT_S = 10               # process 0 (the store's host) waits this long for the others to end
_ENDING = threading.Lock()     # one way out per process: its own failure, or another's


class _Failures(_Reader):
  """From the join on, a thread of every process reads FAILED_KEY each second; another process's
  failure there ends this one (`_end`) with one line naming it."""
  name = "bertjax-failures"

  def _run(self) -> None:
    client, me = _client(), jax.process_index()
    while not self.stopped.wait(_POLL_S):
      failed = _failure_of_another(client, me)
      if failed is not None and not self.stopped.is_set():
        _end(*failed)


_FAILURES = _Failures()


def _failure_of_another(client, me: int) -> tuple[str, int] | None:
  """(this process's line, its exit status) where another process failed alone; else None (also
  where the store cannot be read: a lost process is `_Watch`'s business)."""
  try:
    failed = json.loads(client.key_value_try_get(FAILED_KEY))
  except Exception:  # pylint: disable=broad-except  # not there (NOT_FOUND), or the store gone
    return None
  if failed["process"] == me:
    return None
  said = failed["line"].removeprefix("error: ")
  return (f"error: process {failed['process']} failed: {said}; the run stopped on every process: "
          "fix that and run the same command to resume", int(failed["status"]))


def _end(line: str, status: int) -> None:
  """Ends this process now: its line on stderr, then os._exit (JAX's shutdown barrier would wait
  for processes that are in a collective or gone), after the hooks of `at_once_exit`. Process 0
  hosts the store: it ends last, once every other process has said it is ending (or after
  _LAST_OUT_S), so that none of them loses the store before reading what ended the run. Called
  from two threads, it ends the process once."""
  if not _ENDING.acquire(blocking=False):
    while True:  # the other thread is ending this process
      time.sleep(60)
  with contextlib.suppress(Exception):
    sys.stdout.flush()
  print(line, file=sys.stderr, flush=True)
  # The last word: what the other threads (the main one goes on meanwhile) and the libraries
  # beneath would print from now on goes nowhere.
  with contextlib.suppress(OSError), open(os.devnull, "wb") as devnull:
    for fd in (1, 2):
      os.dup2(devnull.fileno(), fd)
  client, me, n = _client(), jax.process_index(), jax.process_count()
  with contextlib.suppress(Exception):
    client.key_value_set(f"{_LEFT_KEY}{me}", "1", True)
  if me == 0:
    deadline = time.monotonic() + _LAST_OUT_S
    for other in range(1, n):
      left_ms = int((deadline - time.monotonic()) * 1000)
      if left_ms <= 0:
        break
      with contextlib.suppress(Exception):  # DEADLINE_EXCEEDED: it is stuck; end all the same
        client.blocking_key_value_get(f"{_LEFT_KEY}{other}", left_ms)
    time.sleep(1)  # from its word to its os._exit: a moment
  _exit(status)


def _failure_line(error: BaseException) -> tuple[str, int, bool]:
  """(the one line, the exit status, whether it is a bug) of what `main` raised, as
  bertjax.core.errors.run_cli would say it."""
  if not isinstance(error, UserError):
    full = disk_error_of(error) if isinstance(error, Exception) else None
    if full is None:
      first = (str(error).strip().splitlines() or [""])[0][:300]
      return (f"error: a bug: {type(error).__name__}: {first} (the traceback is in the log of "
              f"process {jax.process_index()}); please report it", 1, True)
    try:
      disk_full(full.filename, full)
    except DiskFull as e:
      error = e
  return f"{error.label}: {error}", error.exit_code, False


def run_main(main: Callable[[], Any]) -> Any:
  """`main()` of a command that may join several processes (`initialize`). Where it has and
  `main` fails on this process (a `UserError`, or a bug), this process ends at once, telling the
  others: its one line (a bug's traceback before it), its exit status, no wait at JAX's shutdown
  barrier; every other process then ends too (`_Failures`). A failure that follows another
  process's (its collective broken) ends this one as the others end. A preemption (SIGTERM, which
  stops every process at one step), a Ctrl-C and sys.exit pass through, as does everything where
  no processes were joined."""
  try:
    return main()
  except Exception as e:  # pylint: disable=broad-except  # a UserError or a bug, on this process
    if jax_distributed.global_state.client is None or not active():
      raise
    client, me = _client(), jax.process_index()
    failed = _failure_of_another(client, me)
    if failed is not None:
      _end(*failed)
    line, status, bug = _failure_line(e)
    try:
      client.key_value_set(FAILED_KEY, json.dumps({"process": me, "line": line,
                                                   "status": status}))
    except Exception:  # pylint: disable=broad-except  # another process failed first
      _end(*(_failure_of_another(client, me) or (line, status)))
    if bug:
      traceback.print_exc()
    _end(line, status)
    raise  # not reached: _end ends the process
  finally:
    _FAILURES.stop()


def _client():
  return jax_distributed.global_state.client


def active() -> bool:
  """Whether this process is one of several joined by the distributed runtime."""
  return jax.process_count() > 1 and _client() is not None


# Keys of the coordinator's store are per run: a launcher's coordinator lives as long as its
# processes, so names need no more than a counter of what was agreed on.
_agreed = {"n": 0}


def _key(name: str) -> str:
  _agreed["n"] += 1
  return f"bertjax/{_agreed['n']}/{name}"


@contextlib.contextmanager
def built_by_process_0(what: str) -> Iterator[bool]:
  """`with built_by_process_0("the inputs") as build:` process 0 runs the body (`build` True)
  and then lets the others go on; they wait for it (BERTJAX_WAIT_TIMEOUT_S) before running the
  body themselves (`build` False: what process 0 built is read, not built again). Process 0's
  one-line failure ends the others with the same line; a process 0 too slow ends them with one
  line naming it. One process alone: runs the body."""
  if not active():
    yield True
    return
  key, client = _key("built"), _client()
  if jax.process_index() == 0:
    try:
      yield True
    except UserError as e:
      client.key_value_set(key, f"error: {e}")
      raise
    except BaseException:
      client.key_value_set(key, "error: process 0 failed building it (see its log)")
      raise
    client.key_value_set(key, "ok")
    return
  wait = timeout_s("wait")
  try:
    said = client.blocking_key_value_get(key, wait * 1000)
  except Exception as e:  # pylint: disable=broad-except  # the runtime's timeout
    if "DEADLINE_EXCEEDED" not in str(e):
      raise
    fail(f"process {jax.process_index()} waited {wait} s (BERTJAX_WAIT_TIMEOUT_S) for process 0 to "
         f"build {what}; process 0 is slow or stuck: see its log, or raise the timeout")
  if said != "ok":
    fail(f"process 0 could not build {what}: {said.removeprefix('error: ')}")
  yield False


def flat_config(config: Any) -> dict[str, str]:
  """A config (ConfigDict or dict) as {dotted key: JSON text of its value}."""
  fields = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  out: dict[str, str] = {}

  def walk(prefix, value):
    if isinstance(value, Mapping):
      for k, v in value.items():
        walk(f"{prefix}{k}.", v)
    else:
      out[prefix[:-1]] = json.dumps(value, sort_keys=True, default=str)
  walk("", fields)
  return out


def config_difference(mine: Mapping[str, str], theirs: Mapping[str, str]) -> list[str]:
  """The keys whose values differ (or that one side lacks), sorted."""
  return sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))


def source_digests(package: pathlib.Path | None = None) -> dict[str, str]:
  """{path of each .py file under the bertjax package, relative to its parent: the SHA-256 of its
  bytes (16 hex digits)}: what tells two hosts' code apart."""
  package = package or pathlib.Path(__file__).resolve().parent.parent
  return {str(f.relative_to(package.parent)): hashlib.sha256(f.read_bytes()).hexdigest()[:16]
          for f in sorted(package.rglob("*.py"))}


def listed(names: list[str]) -> str:
  """The first few of `names`, and how many more."""
  return ", ".join(names[:_SHOWN]) + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN
                                      else "")


def check_same_config(config: Any) -> None:
  """Every process of the run publishes its config's digest and fields and its source files'
  digests; each compares them with its own and refuses, in one line naming the differing files or
  keys and the processes: a run whose processes run different code (a host left on another
  commit computes another step, and nothing else would notice), or were started with different
  settings (process 1 with another learning rate trains another model than the one config.json
  records)."""
  if not active():
    return
  client, me, n = _client(), jax.process_index(), jax.process_count()
  fields = flat_config(config)
  text = json.dumps(fields, sort_keys=True)
  digest = hashlib.sha256(text.encode()).hexdigest()
  code = source_digests()
  key = _key("config")
  client.key_value_set(f"{key}/{me}", json.dumps({"digest": digest, "fields": fields,
                                                   "code": code}))
  wait = timeout_s("join")
  differing: dict[int, list[str]] = {}
  for other in range(n):
    if other == me:
      continue
    try:
      theirs = json.loads(client.blocking_key_value_get(f"{key}/{other}", wait * 1000))
    except Exception as e:  # pylint: disable=broad-except  # the runtime's timeout
      if "DEADLINE_EXCEEDED" not in str(e):
        raise
      fail(f"process {me} waited {wait} s (BERTJAX_JOIN_TIMEOUT_S) for the settings of process "
           f"{other}; it is slow or stuck: see its log")
    files = config_difference(code, theirs.get("code", {}))
    if files:
      fail(f"process {me} and process {other} run different code ({listed(files)} differ); "
           "install the same bertjax (one commit) on every host and start again")
    if theirs["digest"] != digest:
      differing[other] = config_difference(fields, theirs["fields"])
  if differing:
    keys = sorted({k for ks in differing.values() for k in ks})
    shown = listed(keys)
    others = ", ".join(str(p) for p in sorted(differing))
    fail(f"process {me} and process {others} were started with different settings ({shown}); "
         "start every process with the same command and --config flags")

