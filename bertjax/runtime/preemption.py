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
from typing import Iterator

import jax
from jax.experimental import multihost_utils

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
    self._runtime_sigterm = False
    self._passed_on = False

  def __enter__(self) -> "Preemption":
    # Several processes joined by JAX's distributed runtime: its preemption notifier holds SIGTERM
    # and tells every process, which stop together at `stop_at`'s sync point.
    self._runtime_sigterm = jax.distributed.is_initialized()
    handled = [signal.SIGINT] if self._runtime_sigterm else list(NAMES)
    try:
      self._previous = {s: signal.signal(s, self._handle) for s in handled}
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
