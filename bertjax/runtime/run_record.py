"""The train loop's record: metric sums of the logging window, its throughput, the run's first and
last logged rows and its last evaluation.

A step's metrics are added to the window's sums on the devices (`add_metrics`, one dispatch);
they are read back only at logging steps (`RunRecord.log`), where the loop waits for the devices
anyway, so the steps between never make the devices wait for the host.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.runtime import divergence
from bertjax.runtime.metric_writers import MetricWriter


def summarize(sums: dict[str, tuple[Any, Any]]) -> dict[str, float]:
  """(numerator, denominator) sums -> plain floats; host transfer happens here only."""
  host = jax.device_get(sums)
  return {k: float(n) / float(d) if float(d) else float("nan") for k, (n, d) in host.items()}


@jax.jit
def _summed(a, b):
  return jax.tree.map(jnp.add, a, b)


def add_metrics(a, b):
  """Metric sums plus one step's: a single dispatch (one computation queued, not one per leaf)."""
  return b if a is None else _summed(a, b)


@dataclasses.dataclass
class RunRecord:
  """The loop's record: metric sums of the current logging window and the run's first and last
  metrics."""
  sums: Any = None
  tokens: int = 0
  timed_steps: int = 0
  t_log: float = dataclasses.field(default_factory=time.time)
  compiling: bool = True
  first: dict | None = None
  last: dict | None = None
  first_step: int | None = None
  last_step: int | None = None
  last_eval: dict | None = None
  last_eval_step: int | None = None
  watch: divergence.Watch | None = None
  window_steps: int = 0  # steps added to the current window
  last_window: tuple[int, int] | None = None  # (first, last) step of the last logged row

  @classmethod
  def resumed(cls, history: list[dict], watch: divergence.Watch) -> "RunRecord":
    """The record of the run so far (metrics.jsonl up to the resumed step): its first and last
    train rows and its last evaluation carry over, so the summary spans every resume."""
    values = lambda row: {k: v for k, v in row.items() if k not in ("step", "split")}
    train_rows = [r for r in history if r.get("split") == "train"]
    eval_rows = [r for r in history if r.get("split") == "eval"]
    return cls(first=values(train_rows[0]) if train_rows else None,
               last=values(train_rows[-1]) if train_rows else None,
               first_step=train_rows[0]["step"] if train_rows else None,
               last_step=train_rows[-1]["step"] if train_rows else None,
               last_eval=values(eval_rows[-1]) if eval_rows else None,
               last_eval_step=eval_rows[-1]["step"] if eval_rows else None, watch=watch)

  def add(self, batch, metrics, step) -> None:
    """One step's metrics join the window's sums on the devices; nothing is read back."""
    self.sums = add_metrics(self.sums, metrics)
    self.window_steps += 1
    self.watch.add(metrics, step)
    if self.compiling:
      # Throughput windows start after the first step, so compilation is not counted in them:
      # the one wait outside logging, evaluation and checkpoint steps, once per process.
      jax.block_until_ready(metrics)
      self.compiling, self.t_log = False, time.time()
    else:
      self.tokens += int(np.sum(batch["attention_mask"])) * jax.process_count()  # host numpy
      self.timed_steps += 1

  def shown(self) -> dict[str, str] | None:
    """What a progress line shows: the last logged loss, the mean over that row's steps, which
    the line names (`loss 3.21 (mean of steps 101-125)`). The current window's would make the
    loop wait for the devices at every line."""
    if not self.last or "loss" not in self.last:
      return None
    loss = f"{self.last['loss']:.4g}"
    if self.last_window is None:
      return {"loss": loss}
    first, last = self.last_window
    return {"loss": f"{loss} (step {last})" if first == last
            else f"{loss} (mean of steps {first}-{last})"}

  def window(self) -> dict | None:
    """The current logging window's sums (steps trained since the last train row), as the
    checkpoint's JSON carries them, so a run resumed from a step between two logging steps logs
    the row over the same steps as an uninterrupted run; None when the window is empty."""
    if not self.window_steps or self.sums is None:
      return None
    host = jax.device_get(self.sums)
    return {"steps": self.window_steps,
            "sums": {k: [[np.asarray(x).dtype.name, np.asarray(x).tolist()] for x in pair]
                     for k, pair in host.items()}}

  def resume_window(self, window: dict | None) -> None:
    """Starts with a checkpoint's window (`window`) instead of an empty one."""
    if not window:
      return
    self.sums = {k: tuple(jnp.asarray(np.asarray(value, dtype)) for dtype, value in pair)
                 for k, pair in window["sums"].items()}
    self.window_steps = int(window["steps"])

  def log(self, writer: MetricWriter, step: int, metrics) -> None:
    # One read: the window's sums, and the last step's learning_rate and grad_norm (summed over
    # the window, they are reported as of this step).
    sums, latest = jax.device_get((self.sums, {k: metrics[k][0]
                                               for k in ("learning_rate", "grad_norm")}))
    logged = {**summarize(sums), **{k: float(v) for k, v in latest.items()}}
    # Timed with the host clock: the read above waited for the window's last step, and the
    # steps between logging steps never wait.
    elapsed = time.time() - self.t_log
    if self.timed_steps and elapsed > 0:
      logged["tokens_per_s"] = self.tokens / elapsed
      logged["steps_per_s"] = self.timed_steps / elapsed
    writer.write(step, "train", logged)
    if self.first is None:
      self.first, self.first_step = logged, step
    self.last, self.last_step = logged, step
    self.last_window = (step - self.window_steps + 1, step)
    self.sums, self.tokens, self.timed_steps, self.t_log = None, 0, 0, time.time()
    self.window_steps = 0
