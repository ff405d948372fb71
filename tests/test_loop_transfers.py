"""The train loop reads nothing from the devices between logging, evaluation and checkpoint steps.

Every other step runs under `train_and_evaluate`'s `quiet_step`, here a guard that raises on a read of a
device value. jax's own `transfer_guard_device_to_host("disallow")` is part of it, but XLA:CPU
does not enforce it (a CPU array is host memory already), so on a CPU the guard also trips at
jax.Array's conversions to host values (`_value`, which float(), int(), bool(), str() and
formatting go through; `__array__`, `item`, `tolist`; `copy_to_host_async`, which
`jax.device_get` starts with), at numpy's array constructors given a jax.Array (on a CPU they
read it through the buffer protocol, past jax's Python code) and at `jax.block_until_ready`. The
twins show that a read slipped into those steps does raise.
"""

import contextlib
import json
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.runtime import divergence
from bertjax.trainer import train

from test_train import tiny_config


class DeviceRead(Exception):
  pass


# Set in the thread running a guarded step only (checkpoint threads may read as they please).
_GUARDED = threading.local()


def _trip(what: str) -> None:
  if getattr(_GUARDED, "on", False):
    raise DeviceRead(f"{what} in a step that must not read the devices")


@pytest.fixture
def guard(monkeypatch):
  """`guard()`: a context in which any read of a device value raises `DeviceRead`; the steps
  the loop guards are counted in `guard.steps`."""
  array_type = type(jnp.zeros(()))
  value = array_type._value

  def value_read(self):
    _trip("a device value read (_value)")
    return value.fget(self)

  def tripping(name, fn, arrays_only=False):
    def wrapped(*args, **kwargs):
      if not arrays_only or any(type(a) is array_type for a in args):
        _trip(name)
      return fn(*args, **kwargs)
    return wrapped

  monkeypatch.setattr(array_type, "_value", property(value_read))
  for name in ("__array__", "item", "tolist", "copy_to_host_async", "block_until_ready"):
    monkeypatch.setattr(array_type, name, tripping(name, getattr(array_type, name)))
  for name in ("asarray", "array", "asanyarray"):
    monkeypatch.setattr(np, name, tripping(f"np.{name}", getattr(np, name), arrays_only=True))
  monkeypatch.setattr(jax, "block_until_ready",
                      tripping("jax.block_until_ready", jax.block_until_ready))

  @contextlib.contextmanager
  def guarded():
    guarded.steps += 1
    with jax.transfer_guard_device_to_host("disallow"):
      _GUARDED.on = True
      try:
        yield
      finally:
        _GUARDED.on = False
  guarded.steps = 0
  return guarded


def test_the_guard_catches_every_kind_of_read(guard):
  x = jnp.arange(3.0) * 2
  reads = {"float": lambda: float(x[0]), "int": lambda: int(x[1]), "bool": lambda: bool(x[2] > 1),
           "np.asarray": lambda: np.asarray(x), "np.array": lambda: np.array(x),
           "device_get": lambda: jax.device_get(x), "item": lambda: x[0].item(),
           "tolist": lambda: x.tolist(), "format": lambda: f"{x[0]:.3f}",
           "block_until_ready": lambda: jax.block_until_ready(x)}
  for what, read in reads.items():
    y = x[0]  # work on the devices is fine under the guard
    with guard():
      z = y + 1
      with pytest.raises(Exception) as e:
        read()
    assert e.type in (DeviceRead, jax.errors.JaxRuntimeError), what
  assert float(z) == 1.0 and np.asarray(x).tolist() == [0.0, 2.0, 4.0]  # outside: allowed


def _config():
  """Logging every 5 steps, an evaluation at 7, checkpoints at 10 and 12 (the end): 12 steps,
  of which 1 (the first), 5, 7, 10 and 12 read the devices."""
  return tiny_config(total_steps=12, log_every=5, eval_every=7, checkpoint_every=10,
                     progress_every_s=0.0, **{"data.eval_batches": 1})


@pytest.mark.slow
def test_steps_between_logging_eval_and_checkpoints_read_nothing(tmp_path, guard, monkeypatch):
  summary = train.train_and_evaluate(_config(), tmp_path, quiet_step=guard)
  assert summary["step"] == 12 and summary["status"] == "finished"
  assert guard.steps == 12 - 5  # 2, 3, 4, 6, 8, 9, 11
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if r["split"] == "train"] == [5, 10, 12]
  assert [r["step"] for r in rows if r["split"] == "eval"] == [7, 12]
  assert all(r["tokens_per_s"] > 0 for r in rows if r["split"] == "train")


@pytest.mark.slow
def test_a_loss_read_at_every_step_is_caught(tmp_path, guard, monkeypatch):
  """The twin: `float(loss)` at every step (here through the non-finite watch's per-step hook)
  fails at the first step that must not read the devices, step 2."""
  add = divergence.Watch.add
  seen = []

  def add_and_read(self, metrics, step):
    seen.append(float(metrics["loss"][0]))
    add(self, metrics, step)

  monkeypatch.setattr(divergence.Watch, "add", add_and_read)
  with pytest.raises((DeviceRead, jax.errors.JaxRuntimeError)) as e:
    train.train_and_evaluate(_config(), tmp_path, quiet_step=guard)
  assert len(seen) == 1 and guard.steps == 1, (seen, guard.steps)
  assert "must not read the devices" in str(e.value) or "Disallowed" in str(e.value)
