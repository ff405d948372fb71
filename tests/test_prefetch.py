"""bertjax.runtime.prefetch.DevicePrefetch: batches sent ahead in order, and a checkpoint state that
names the last batch a step received, never the ones still queued."""

import pytest

from bertjax.runtime.prefetch import DevicePrefetch


class Counter:
  """Batches 0..n-1; its state is the index of the next batch."""

  def __init__(self, n):
    self.n, self.i = n, 0

  def __next__(self):
    if self.i >= self.n:
      raise StopIteration
    self.i += 1
    return {"x": self.i - 1}

  def get_state(self):
    return {"i": self.i}


@pytest.mark.parametrize("size", [0, 1, 2, 5])
def test_order_states_and_read_ahead(size):
  source, sent = Counter(6), []
  batches = DevicePrefetch(source, lambda b: sent.append(b["x"]) or ("device", b["x"]), size)
  assert batches.get_state() == {"i": 0}
  for k in range(6):
    host, device = next(batches)
    assert host == {"x": k} and device == ("device", k)
    # Resuming from this state must give batch k + 1 next, however far the source has run.
    assert batches.get_state() == {"i": k + 1}
    assert source.i == min(k + 1 + size, 6)
    assert sent == list(range(source.i))  # every batch read was sent once, in order
  with pytest.raises(StopIteration):
    next(batches)
  assert batches.get_state() == {"i": 6}


def test_state_is_a_copy():
  batches = DevicePrefetch(Counter(3), lambda b: b, 2)
  next(batches)
  state = batches.get_state()
  state["i"] = 99
  assert batches.get_state() == {"i": 1}
