"""What a run prints while it works and when it ends: progress lines with an ETA, an end table.

A `Progress` follows one pass of known length (the training steps, the batches of an
evaluation) and prints a plain line at most every `every_s` seconds of work, whatever
`log_every` is, e.g.

  train step 120/1000 12% loss 3.21 | 4.1 steps/s | ETA 3m35s
  eval dev (step 300) batch 30/120 25% | 2.0 batches/s | ETA 45s

Plain lines (never rewritten in place) read the same on a terminal and in a cluster job's log
file. The rate counts from the first update, so compilation is not in it, nor is a later one's
(a new batch shape, the first evaluation: `compile_seconds`); a first update that took longer
than `every_s` (compilation) says so. Training's rate is wall time, evaluations and
checkpoints included, so its ETA is the wall time left. Training's line shows the loss of the
last logged row (none before the first) and counts the steps queued, a few ahead of the devices:
reading the current loss would make the devices wait at every line. The clock is injectable:
tests drive a pass with a fake one instead of waiting.

`end_table` turns a run's summary (summary.json) into the few lines printed at its end.
"""

from __future__ import annotations

import math
import pathlib
import sys
import time
from typing import Any, Callable, Mapping, TextIO

from jax import monitoring

from bertjax.core import run_files

EVERY_S = 10.0  # the default seconds of work between progress lines (config.progress_every_s)

# JAX's compilation stages (jax.monitoring events): their time is not the pace of the pass.
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
_compiled_s = [0.0]
_listening: list[bool] = []


def compile_seconds() -> float:
  """Seconds this process has spent compiling since the first call (on the real clock)."""
  if not _listening:
    def add(event: str, seconds: float, **kwargs) -> None:
      del kwargs
      if event in COMPILE_EVENTS:
        _compiled_s[0] += seconds
    monitoring.register_event_duration_secs_listener(add)
    _listening.append(True)
  return _compiled_s[0]


def real_clock_compile_seconds(clock: Callable[[], float]) -> Callable[[], float] | None:
  """`compile_seconds` for a pass timed on the real clock; an injected clock (a test's) times
  nothing real, so none is taken from it."""
  return compile_seconds if clock is time.monotonic else None


def fmt_duration(seconds: float) -> str:
  """45s, 3m35s, 2h05m."""
  s = max(0, int(round(seconds)))
  if s < 60:
    return f"{s}s"
  if s < 3600:
    return f"{s // 60}m{s % 60:02d}s"
  return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
  """Progress lines of one pass over `total` units (None: length unknown, no % or ETA)."""

  def __init__(self, what: str, total: int | None, *, unit: str = "step",
               every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic,
               stream: TextIO | None = None, enabled: bool = True,
               excluded: Callable[[], float] | None = None):
    self.what, self.total, self.unit = what, total, unit
    # Seconds so far not to count in the rate (`compile_seconds`: a new batch shape's or the
    # first evaluation's compilation after the first step), so an ETA is the pace of the work.
    self.excluded = excluded or (lambda: 0.0)
    self.every_s, self.clock, self.enabled = float(every_s), clock, enabled
    self.stream = stream
    self.lines: list[str] = []      # every line printed (what tests and callers read back)
    self._created = clock()
    self._last_line = self._created
    self._first: tuple[int, float, float] | None = None  # (done, time, excluded) at the first

  def rate(self, done: int, now: float) -> float | None:
    """Units per second since the first update (compilation since then not counted), None
    before a second one."""
    if self._first is None or done <= self._first[0]:
      return None
    elapsed = now - self._first[1] - (self.excluded() - self._first[2])
    return (done - self._first[0]) / elapsed if elapsed > 0 else None

  def update(self, done: int, fields: Callable[[], Mapping[str, float] | None] | None = None
             ) -> None:
    """`done` units are finished. `fields`, called only when a line is due, gives values to
    show (e.g. {"loss": 3.21}) and may wait for the device first: the line's rate is timed after
    it, so work still queued on the device does not count as done."""
    now = self.clock()
    first = self._first is None
    if first:
      self._first = (done, now, self.excluded())
    finished = self.total is not None and done >= self.total
    due = now - self._last_line >= self.every_s
    if not self.enabled or not (due or (finished and not first and self.lines)):
      return
    values = dict((fields() if fields else None) or {})
    now = self.clock() if not first else now
    self._last_line = now
    self._print(self.line(done, now, values, first))

  def line(self, done: int, now: float, fields: Mapping[str, float], first: bool = False) -> str:
    """`train step 120/1000 12% loss 3.21 | 4.1 steps/s | ETA 3m35s`."""
    head = f"{self.what} {self.unit} {done}"
    if self.total:
      head += f"/{self.total} {100 * done // self.total}%"
    head += "".join(f" {k} {_number(v)}" for k, v in fields.items())
    parts = [head]
    rate = self.rate(done, now)
    if rate is not None:
      plural = self.unit + ("es" if self.unit.endswith("ch") else "s")
      parts.append(f"{rate:.3g} {plural}/s" if rate >= 1 else f"{1 / rate:.3g} s/{self.unit}")
      if self.total:
        parts.append(f"ETA {fmt_duration(max(0, self.total - done) / rate)}")
    elif first:
      parts.append(f"{fmt_duration(now - self._created)} to the first {self.unit} "
                   "(compilation included)")
    return " | ".join(parts)

  def say(self, text: str) -> None:
    """A line of this pass that is not a count, e.g. what it starts with: `<what> <text>`."""
    if self.enabled:
      self._print(f"{self.what} {text}")

  def _print(self, line: str) -> None:
    self.lines.append(line)
    print(line, file=self.stream or sys.stderr, flush=True)


def _number(v: Any) -> str:
  if isinstance(v, bool) or not isinstance(v, (int, float)):
    return str(v)
  if isinstance(v, float) and not math.isfinite(v):
    return str(v)
  if abs(v) >= 1000:
    return f"{v:,.0f}"
  return f"{v:.4g}"


# Counters and bookkeeping a row carries next to its metrics: not worth a line of the end table.
_NOT_SHOWN = {"nonfinite", "examples", "sentences", "total", "num_gold", "num_predicted",
              "num_correct", "steps_per_s"}


def _shown(key: str, value: Any) -> bool:
  return (key not in _NOT_SHOWN and not key.endswith("_examples") and isinstance(value, (int, float))
          and not isinstance(value, bool))


def end_table(summary: Mapping[str, Any], summary_path: str | pathlib.Path | None = None) -> str:
  """The lines printed when a run ends: one row per metric, with the whole run's first and last
  logged train metrics, the last evaluation and the best (where another) as columns; where the
  checkpoint and the best evaluation's parameters are."""
  columns = [(f"first train (step {summary.get('first_train_step', '?')})",
              summary.get("first_train")),
             (f"last train (step {summary.get('last_train_step', '?')})", summary.get("last_train")),
             (f"last eval (step {summary.get('last_eval_step', '?')})", summary.get("last_eval"))]
  best_step = summary.get("best_eval_step")
  if best_step is not None and best_step != summary.get("last_eval_step"):
    columns.append((f"best eval (step {best_step})", summary.get("best_eval")))
  columns = [(title, values) for title, values in columns if values]
  keys: list[str] = []
  for _, values in columns:
    keys += [k for k, v in values.items() if _shown(k, v) and k not in keys]
  # loss first, then distillation's soft_kl (what falls there: bertjax/objectives/distill.py),
  # the rest as logged.
  keys.sort(key=lambda k: (k != "loss", k != "soft_kl"))
  lines = [f"run {summary.get('status', '?')} at step {summary.get('step', '?')}: "
           f"{summary.get('workdir', '')}"]
  if columns:
    width = max([6, *map(len, keys)])
    widths = [max(len(title), 10) for title, _ in columns]
    lines.append("  ".join([" " * width, *(t.rjust(w) for (t, _), w in zip(columns, widths))]))
    for k in keys:
      cells = [(_number(values[k]) if k in values and values[k] is not None else "-").rjust(w)
               for (_, values), w in zip(columns, widths)]
      lines.append("  ".join([k.ljust(width), *cells]))
  else:
    lines.append("no metrics logged")
  if summary.get("reading"):  # whether the objective's telling metrics moved as they should
    lines.append(str(summary["reading"]))
  metric, best = summary.get("best_metric"), summary.get("best_eval") or {}
  if best_step is not None and metric in best:
    # best_mode is "max" unless set: a loss is kept at its lowest only with best_mode=min.
    flags = f"--config.best_metric={metric}" + (
        " --config.best_mode=min" if run_files.lower_is_better(metric) else "")
    where = summary["best"] if summary.get("best") else f"not kept ({flags} keeps it in best/)"
    lines.append(f"best: {metric} {_number(best[metric])} at step {best_step}: {where}")
  lines.append(f"checkpoint: {summary.get('checkpoint') or 'none'}")
  if summary_path is not None:
    lines.append(f"summary: {summary_path} (every row: metrics.jsonl)")
  return "\n".join(lines)
