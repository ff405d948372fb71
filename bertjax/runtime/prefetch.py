"""Batches put on the devices ahead of the train step that reads them.

`DevicePrefetch` keeps `size` batches already transferred (sharded over the mesh) in a queue: while
step k runs, batch k + 1 waits on the devices and batch k + 2 is built on the host and sent, so
the step never waits for a host-to-device copy. Checkpoints stay exact: each queued batch carries
the input iterator's state right after it was read, and `get_state()` returns the state after the
last batch handed to a step, never after the ones still queued.
"""

from __future__ import annotations

import collections
import copy
from typing import Any, Callable


class DevicePrefetch:
  """Iterates (host batch, device batch) pairs from `iterator`, with `size` more batches already
  sent when one is handed out (0: each batch is read and sent when asked for)."""

  def __init__(self, iterator, put: Callable[[Any], Any], size: int = 2):
    self._iterator = iterator
    self._put = put
    self._size = max(size, 0)
    self._queue: collections.deque = collections.deque()
    self._state = copy.deepcopy(iterator.get_state())
    self._done = False

  def _fill(self, count: int) -> None:
    while not self._done and len(self._queue) < count:
      try:
        batch = next(self._iterator)
      except StopIteration:
        self._done = True
        return
      self._queue.append((batch, self._put(batch), copy.deepcopy(self._iterator.get_state())))

  def __iter__(self):
    return self

  def __next__(self):
    self._fill(1)
    if not self._queue:
      raise StopIteration
    host, device, self._state = self._queue.popleft()
    self._fill(self._size)  # the next batches start their transfer before this step is dispatched
    return host, device

  def get_state(self) -> dict:
    """The input state after the last batch returned (what a checkpoint at this step needs)."""
    return copy.deepcopy(self._state)
