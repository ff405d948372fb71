"""What orbax's error paths would print on the user's terminal, kept off it.

Written for orbax-checkpoint 0.12.8 with tensorstore 0.1.86 (requirements.txt); each part says
what it works around, so it can go when orbax no longer needs it:

1. Closed event loops. orbax runs each save and restore through `asyncio_utils.run_sync`, which
   closes its event loop as soon as the coroutine ends. When one TensorStore write or read fails
   (a full disk, a damaged file), `asyncio.gather` ends at once while the other operations are
   still in flight; each of them, finishing later, calls `loop.call_soon_threadsafe` on the closed
   loop and TensorStore prints that `RuntimeError: Event loop is closed` traceback straight to
   stderr (a few to a few hundred of them, some after the one-line error). orbax offers no
   setting for its loop, so `draining_event_loops` swaps asyncio's event loop policy (the public
   way to choose the loops `asyncio.new_event_loop` makes) for one whose loops cancel and await
   their unfinished tasks before they close, as `asyncio.run` does, read the errors of the
   tasks `gather` left behind (else "Task exception was never retrieved", one per task), and
   drop the wake-ups that TensorStore's operations of those cancelled tasks still send after
   the close.
2. Background tracebacks. A failed save is logged by orbax's writing threads with the whole
   traceback (`logging.error(..., exc_info=True)`: hundreds of lines of orbax and TensorStore
   frames) before the caller sees the error. `hold_disk_error_logs` holds those of a full disk
   back; the checkpointer writes them (`held`) with its own traceback to
   WORKDIR/checkpoint-errors.log and reports the error in one line naming that file.
3. A failed asynchronous save, on one process of several. orbax's background thread keeps the
   error (`_AsyncManager._thread_func`), its finalize thread takes it and then waits in a barrier
   for the other processes (`MultihostSynchronizedValue.set`), which wait in another barrier for
   this one (`async_write_complete`): no caller is told, and every process waits until
   `AsyncOptions.timeout_secs` (20 minutes). The one report that comes out at once is orbax's log
   record of the error (`logging.error(..., exc_info=True)` in that thread); `_Hold` keeps its
   error for `failed_in_background`, which the checkpointer reads after each step and while it
   waits for a save.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import traceback

from bertjax.core import errors, paths

ORBAX_VERSION = "0.12.8"  # the version these were written for and tested with
ERROR_LOG = "checkpoint-errors.log"  # in the workdir: orbax's tracebacks of a failed save


class _DrainingLoop(asyncio.SelectorEventLoop):
  """An event loop that, when closed, first cancels and awaits the tasks still running on it (as
  `asyncio.run` does). Tasks are tracked by a task factory rather than `asyncio.all_tasks`
  (orbax avoids the latter across threads), and forgotten once done."""

  def __init__(self):
    super().__init__()
    self._tasks = set()

    def factory(loop, coro, **kwargs):
      task = asyncio.Task(coro, loop=loop, **kwargs)
      self._tasks.add(task)
      task.add_done_callback(self._done)
      return task

    self.set_task_factory(factory)

  def _done(self, task: asyncio.Task) -> None:
    """Forgets a finished task, reading its error: orbax's `gather` raises the first error and
    leaves its siblings' (the same full disk or damaged file, met by the other reads and
    writes) unread, which asyncio would print as "Task exception was never retrieved", one
    traceback each, when they are collected."""
    self._tasks.discard(task)
    if not task.cancelled():
      task.exception()

  def call_soon_threadsafe(self, callback, *args, context=None):
    """As asyncio's, except that once the loop is closed the call is dropped: a TensorStore
    operation of a task cancelled at `close` finishes later and wakes the loop from its own
    thread; asyncio raises "Event loop is closed", which TensorStore prints (a traceback after
    the one-line error of a full disk: 9e59c5e's CI, test_full_disk.py). Nothing waits on it."""
    try:
      return super().call_soon_threadsafe(callback, *args, context=context)
    except RuntimeError:
      if not self.is_closed():
        raise
      return None

  def close(self) -> None:
    pending = [t for t in self._tasks if not t.done()]
    if pending and not self.is_running() and not self.is_closed():
      for task in pending:
        task.cancel()
      self.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    for task in list(self._tasks):  # done in the loop's last turn: their callbacks never ran
      if task.done():
        self._done(task)
    super().close()


class _DrainingPolicy(asyncio.DefaultEventLoopPolicy):
  def new_event_loop(self) -> asyncio.AbstractEventLoop:
    return _DrainingLoop()


_policy_lock = threading.Lock()


@contextlib.contextmanager
def draining_event_loops():
  """Within it, event loops made by `asyncio.new_event_loop` (in any thread: orbax's background
  commit makes its own) finish their tasks on close. The previous policy is put back after."""
  with _policy_lock:
    previous = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(_DrainingPolicy())
  try:
    yield
  finally:
    with _policy_lock:
      asyncio.set_event_loop_policy(previous)


class SaveInFlight:
  """`draining_event_loops` held from a save's start (`start`) until it is finished (`end`): an
  asynchronous save's loops close in orbax's background threads after `save` has returned. Also
  keeps orbax's full-disk tracebacks off the terminal (`hold_disk_error_logs`)."""

  def __init__(self):
    self._stack = contextlib.ExitStack()
    self._on = False
    hold_disk_error_logs()

  def start(self) -> None:
    if not self._on:
      self._stack.enter_context(draining_event_loops())
      self._on = True

  def end(self) -> None:
    """No save in flight: asyncio's own event loop policy is back."""
    self._stack.close()
    self._on = False

  def abandon(self) -> None:
    """A save failed: orbax's other writing threads may still be failing, so their loops keep
    draining until the process ends (it is about to, with the error) rather than print on the
    terminal."""
    self._stack.pop_all()
    self._on = False


class _Hold(logging.Filter):
  """On the `absl` logger (orbax logs through absl): an orbax error record whose exception is a
  full disk (or a quota, or a file-size limit) is held back, formatted, until the checkpointer
  that meets the error writes it to its log file (`held`): the disk is full when orbax logs it,
  and has room again once the partial checkpoint is removed."""

  def __init__(self):
    super().__init__()
    self.records: list[str] = []
    self.failed: list[BaseException] = []  # errors of asynchronous saves' background threads

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno < logging.WARNING:
      return True
    message = record.getMessage()
    error = record.exc_info[1] if record.exc_info else None
    if (error is not None and record.funcName == "_thread_func"
        and record.pathname.endswith("async_checkpointer.py")):
      self.failed.append(error)
    if errors.disk_error_of(error or ValueError(message)) is None:
      return True
    if len(self.records) < _HELD:
      self.records.append(f"{message}\n" + ("".join(traceback.format_exception(*record.exc_info))
                                            if error is not None else ""))
    return False


_HELD = 100  # records held at most (one failed save logs one per writing thread)
_hold = _Hold()


def hold_disk_error_logs() -> None:
  """Keeps orbax's tracebacks of a full disk off the terminal until `held` takes them."""
  logger = logging.getLogger("absl")
  if _hold not in logger.filters:
    logger.addFilter(_hold)


def failed_in_background() -> BaseException | None:
  """The first error of an asynchronous save's background thread (in this process) since
  `forget_failed`; None where none failed."""
  return _hold.failed[0] if _hold.failed else None


def forget_failed() -> None:
  """A new save starts: the errors of earlier ones are forgotten."""
  _hold.failed.clear()


def held() -> str:
  """The orbax error records held back since the last call, as text (then forgotten)."""
  records, _hold.records = _hold.records, []
  return "".join(records)


def log_failed_save(target: paths.Path, what: str, error: BaseException) -> bool:
  """Appends to `target` that `what` failed: the records `held` back, then `error`'s traceback;
  False when it could not be written."""
  return append(target, f"{what} failed:\n" + held() + "".join(traceback.format_exception(error)))


def append(target: paths.Path, text: str) -> bool:
  """Appends `text` to `target`; False when it could not (the disk being full, say)."""
  try:
    paths.append_text(target, text if text.endswith("\n") else text + "\n")
  except Exception:  # pylint: disable=broad-except  # a log that cannot be written is not an error
    return False
  return True
