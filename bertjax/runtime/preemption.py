"""SIGTERM (a preemption notice) at any point of a run: the work under way finishes or is dropped.

A run holds one `Preemption` from its start to its end. Work that leaves nothing half-written
when it is cut short (checking settings, preparing a corpus or a tokenizer into a staging folder,
compiling, restoring, the evaluation passes after the last step) runs inside `abandoning`: a
SIGTERM there raises `Preempted` at once, whose one line says where the run stopped and how to go
on (exit 75 through `errors.run_cli`). Everything else (training steps, checkpoint and best/
saves, metric rows) is deferred: a SIGTERM only sets `requested`, which the training loop reads
after each step to save a checkpoint and stop.

Ctrl-C (SIGINT) is handled the same way, ending with exit 130 (`Interrupted`) instead of 75; a
second Ctrl-C stops at once (KeyboardInterrupt: the steps since the last checkpoint are lost).
"""

from __future__ import annotations

import contextlib
import signal
import sys
from typing import Iterator

from bertjax.core.errors import Interrupted, Preempted

GO_ON = "run the same command again to go on"
# What each handled signal is called in the lines a stopped run prints.
NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}


class Preemption:
  """The SIGTERM and SIGINT handler of one run, installed by `with Preemption() as preemption:`."""

  def __init__(self):
    self.requested = False
    self.signal = signal.SIGTERM  # the first one received
    self.where = "starting"
    self._abandon = False
    self._raised = False  # one Preempted at most: the clean-up it unwinds runs undisturbed
    self._previous = None

  def __enter__(self) -> "Preemption":
    try:
      self._previous = {s: signal.signal(s, self._handle) for s in NAMES}
    except ValueError:  # not the main thread: preemption handling is the caller's business
      self._previous = None
    return self

  def __exit__(self, *exc):
    for s, previous in (self._previous or {}).items():
      signal.signal(s, previous)

  @property
  def name(self) -> str:
    """The received signal as the lines name it: SIGTERM or Ctrl-C."""
    return NAMES[self.signal]

  def _handle(self, signum, frame):
    del frame
    if signum == signal.SIGINT and self.requested and self.signal == signal.SIGINT:
      raise KeyboardInterrupt  # the second Ctrl-C: at once
    if not self.requested:
      self.signal = signum
    self.requested = True
    if self._abandon:
      self._stop()
    elif signum == signal.SIGINT:
      print("Ctrl-C: finishing the step under way and saving a checkpoint (Ctrl-C again stops "
            "at once, losing the steps since the last checkpoint)", file=sys.stderr, flush=True)

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
    finally:
      self._abandon = before
