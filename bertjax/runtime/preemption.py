"""SIGTERM (a preemption notice) at any point of a run: the work under way finishes or is dropped.

A run holds one `Preemption` from its start to its end. Work that leaves nothing half-written
when it is cut short (checking settings, preparing a corpus or a tokenizer into a staging folder,
compiling, restoring, the evaluation passes after the last step) runs inside `abandoning`: a
SIGTERM there raises `Preempted` at once, whose one line says where the run stopped and how to go
on (exit 75 through `errors.run_cli`). Everything else (training steps, checkpoint and best/
saves, metric rows) is deferred: a SIGTERM only sets `requested`, which the training loop reads
after each step to save a checkpoint and stop.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator

from bertjax.core.errors import Preempted

GO_ON = "run the same command again to go on"


class Preemption:
  """The SIGTERM handler of one run, installed by `with Preemption() as preemption:`."""

  def __init__(self):
    self.requested = False
    self.where = "starting"
    self._abandon = False
    self._raised = False  # one Preempted at most: the clean-up it unwinds runs undisturbed
    self._previous = None

  def __enter__(self) -> "Preemption":
    try:
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # not the main thread: preemption handling is the caller's business
      self._previous = None
    return self

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True
    if self._abandon:
      self._stop()

  def _stop(self):
    if not self._raised:
      self._raised = True
      raise Preempted(f"SIGTERM while {self.where}; {GO_ON}")

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
