"""SIGTERM (a preemption notice) at any point of a run: the work under way finishes or is dropped.

A run holds one `Preemption` from its start to its end. Work that leaves nothing half-written
when it is cut short (checking settings, preparing a corpus or a tokenizer into a staging folder,
compiling, restoring, the evaluation passes after the last step) runs inside `abandoning`: a
SIGTERM there raises `Preempted` at once, whose one line says where the run stopped and how to go
on (exit 75 through `errors.run_cli`). Everything else (training steps, checkpoint and best/
saves, metric rows) is deferred: a SIGTERM only sets `requested`, which the training loop reads
after each step (`stop_at`) to save a checkpoint and stop.

Ctrl-C (SIGINT) is handled the same way, ending with exit 130 (`Interrupted`) instead of 75; a
second Ctrl-C stops at once (KeyboardInterrupt: the steps since the last checkpoint are lost).

In a run of several processes SIGTERM is JAX's (its preemption notifier, installed by
jax.distributed.initialize): one process receiving it stops every process at the same step, each
saving its part of one checkpoint (`stop_at`); before the loop it is not acted on until then.
Ctrl-C stays this handler's there, passed on to JAX's notifier at the next step.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Iterator

import jax
import jaxlib
from jax.experimental import multihost_utils

from bertjax.core.errors import Interrupted, Preempted

GO_ON = "run the same command again to go on"
# What each handled signal is called in the lines a stopped run prints.
NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}


# Where JAX's own Python code lies: a signal whose handler finds the innermost frame there came
# while JAX ran (`inside_jax`).
_JAX_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (jax, jaxlib))
_AGAIN_S = 0.05  # how soon a signal put off is sent again (`again_soon`)


def inside_jax(frame) -> bool:
  """Whether a signal handler called with `frame` runs inside JAX's code: in an XLA compilation
  or a wait for the device, both of which jaxlib lets signals interrupt. An error raised there
  ends the wait but not the work: XLA's threads go on compiling with what the unwinding frees,
  and the process crashed with SIGSEGV after its one line (9e59c5e: a SIGTERM while the trainer
  or the benchmark compiled, tests/test_sigterm_points.py). Such a handler puts the signal off
  (`again_soon`) rather than raise."""
  return frame is not None and frame.f_code.co_filename.startswith(_JAX_DIRS)


def again_soon(signum: int, still_wanted=lambda: True) -> None:
  """Sends `signum` to this process again shortly, from a thread, if `still_wanted()` then: the
  handler that put it off runs again, outside JAX's code once the compilation or the wait has
  ended."""
  def send():
    if still_wanted():
      os.kill(os.getpid(), signum)
  timer = threading.Timer(_AGAIN_S, send)
  timer.daemon = True
  timer.start()


class Preemption:
  """The SIGTERM and SIGINT handler of one run, installed by `with Preemption() as preemption:`."""

  def __init__(self, *, last: bool = False):
    """`last`: the process's outermost handler (launch.py's), left when the run has ended. Leaving
    it ignores SIGTERM from then on instead of restoring the handler before: the process ends with
    the run's own status and line. Restored, a Python handler would take a SIGTERM during the exit
    (JAX's shutdown, a launcher stopping the other processes once one has ended) for one of a run
    that never started, and Python's finalization resets it to the default action, which kills."""
    self._last = last
    self.requested = False
    self.signal = signal.SIGTERM  # the first one received
    self.where = "starting"
    self._abandon = False
    self._raised = False  # one Preempted at most: the clean-up it unwinds runs undisturbed
    self._previous = None
    self._runtime_sigterm = False
    self._passed_on = False
    self._put_off = None  # the signal sent again by `again_soon`, which is not a second one
    self._installed = False

  def __enter__(self) -> "Preemption":
    # Several processes joined by JAX's distributed runtime: its preemption notifier holds SIGTERM
    # and tells every process, which stop together at `stop_at`'s sync point.
    self._runtime_sigterm = jax.distributed.is_initialized()
    handled = [signal.SIGINT] if self._runtime_sigterm else list(NAMES)
    try:
      self._previous = {s: signal.signal(s, self._handle) for s in handled}
      self._installed = True
    except ValueError:  # not the main thread: preemption handling is the caller's business
      self._previous = None
    return self

  def __exit__(self, *exc):
    self._installed = False
    for s, previous in (self._previous or {}).items():
      signal.signal(s, previous)
    if self._last and self._previous is not None:
      signal.signal(signal.SIGTERM, signal.SIG_IGN)

  @property
  def name(self) -> str:
    """The received signal as the lines name it: SIGTERM or Ctrl-C."""
    return NAMES[self.signal]

  def stop_at(self, step: int) -> bool:
    """Whether the training loop saves `step` and stops (it asks after every step). One process:
    when a SIGTERM came. Several: at the step JAX's preemption sync point names, the same in
    every process, once any of them received SIGTERM (`jax.experimental.multihost_utils.
    reached_preemption_sync_point`; a request this process's own handler took is passed on to
    it)."""
    if not getattr(self, "_runtime_sigterm", False):
      return self.requested
    if self.requested and not self._passed_on:
      self._passed_on = True
      os.kill(os.getpid(), signal.SIGTERM)  # to JAX's notifier, which tells the others
    if multihost_utils.reached_preemption_sync_point(step):
      self.requested = True
      return True
    return False

  def _handle(self, signum, frame):
    again, self._put_off = signum == self._put_off, None
    if again and (self._raised or not self._abandon):
      return  # acted on meanwhile (`abandoning`), or nothing is to be dropped any more
    if (signum == signal.SIGINT and self.requested and self.signal == signal.SIGINT
        and not again):
      raise KeyboardInterrupt  # the second Ctrl-C: at once
    if not self.requested:
      self.signal = signum
    self.requested = True
    if self._abandon:
      if inside_jax(frame):  # raised inside an XLA compilation, it crashed the process
        self._put_off = signum
        again_soon(signum, lambda: self._wants(signum))
        return
      self._stop()
    elif signum == signal.SIGINT:
      print("Ctrl-C: finishing the step under way and saving a checkpoint (Ctrl-C again stops "
            "at once, losing the steps since the last checkpoint)", file=sys.stderr, flush=True)

  def _wants(self, signum: int) -> bool:
    """Whether the signal put off is still to be sent again (read by `again_soon`'s thread):
    the handler is still this one's and has not raised meanwhile."""
    return self._installed and not self._raised and self._put_off == signum

  def _stop(self):
    if not self._raised:
      self._raised = True
      error = Interrupted if self.signal == signal.SIGINT else Preempted
      raise error(f"{self.name} while {self.where}; {GO_ON}")

  @contextlib.contextmanager
  def abandoning(self, where: str) -> Iterator[None]:
    """Runs work that a SIGTERM drops at once (raising `Preempted`, its line naming `where`);
    one that came before, while deferred, drops it before it starts."""
    before, self.where, self._abandon = self._abandon, where, True
    try:
      if self.requested:
        self._stop()
      yield
      if self._put_off is not None:  # put off inside JAX's code, not yet sent again: now
        self._stop()
    finally:
      self._abandon = before
