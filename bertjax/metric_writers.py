"""Where metrics go: metrics.jsonl, TensorBoard event files, and a console line per logged row.

Only process 0 writes. Each logging event is one JSON object with at least `step` and `split`.
The workdir may be remote (gs://...; bertjax/paths.py): metrics.jsonl is then rewritten whole at
each logging event (an object cannot be appended to), and TensorBoard's event files, which
tensorboardX writes to local files, are written in a local folder and copied to
WORKDIR/tensorboard at each flush.
"""

from __future__ import annotations

import json
import math
import pathlib
import sys
import tempfile

import jax

from bertjax import paths

# The metrics a logged row's console line shows next to the loss, when present.
SHOWN = ("mlm_accuracy", "nsp_accuracy", "sop_accuracy", "rtd_accuracy", "accuracy", "score", "f1",
         "exact_match")


class MetricWriter:

  def __init__(self, workdir: str | pathlib.Path, total_steps: int, *, enabled: bool | None = None,
               tensorboard: bool = True):
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self.total_steps = total_steps
    self.path = paths.as_path(workdir) / "metrics.jsonl"
    self._tb = None
    self._tb_remote, self._tb_local = None, None
    if self.enabled and tensorboard:
      # Imported only when used: 1.3 s and 190 MB a run without TensorBoard does not pay.
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      logdir = paths.as_path(workdir) / "tensorboard"
      if paths.is_remote(logdir):
        self._tb_remote, self._tb_local = logdir, tempfile.TemporaryDirectory(prefix="bertjax-tb-")
        logdir = self._tb_local.name
      self._tb = SummaryWriter(str(logdir))

  def resume_at(self, step: int) -> list[dict]:
    """The rows of the run so far, up to `step`, where a resumed run goes on. Rows past it were
    logged before an interruption and are about to be logged again: they leave the file (and a
    line torn by a kill mid-write with them), so metrics.jsonl never holds a step twice."""
    if not self.path.exists():
      return []
    kept_lines, rows = [], []
    lines = self.path.read_text(encoding="utf-8").splitlines()
    for line in lines:
      try:
        row = json.loads(line)
      except ValueError:
        continue
      if isinstance(row, dict) and int(row.get("step", 0)) <= step:
        kept_lines.append(line)
        rows.append(row)
    if self.enabled and len(kept_lines) < len(lines):  # rewritten only when a row goes
      paths.replace_text(self.path, "".join(l + "\n" for l in kept_lines))
    return rows

  def write(self, step: int, split: str, metrics: dict[str, float]) -> None:
    if not self.enabled:
      return
    record = {"step": int(step), "split": split}
    record.update({k: _clean(v) for k, v in metrics.items()})
    paths.append_text(self.path, json.dumps(record) + "\n")
    if self._tb is not None:
      for k, v in metrics.items():
        if isinstance(v, (int, float)) and math.isfinite(v):
          self._tb.add_scalar(f"{split}/{k}", v, step)
      self._tb.flush()
      self._copy_tensorboard()
    self.progress(step, split, metrics)

  def progress(self, step: int, split: str, metrics: dict[str, float]) -> None:
    """One plain line per logged row, e.g. `train step 50/1000: loss 3.2100 mlm_accuracy 0.412 |
    12,345 tok/s` (the ETA is on the progress lines, bertjax/progress.py)."""
    parts = [f"{split} step {step}/{self.total_steps}:"]
    if "loss" in metrics:
      parts.append(f"loss {metrics['loss']:.4f}")
    for k in SHOWN:
      if isinstance(metrics.get(k), (int, float)):
        parts.append(f"{k} {metrics[k]:.4f}")
    line = " ".join(parts)
    if "tokens_per_s" in metrics:
      line += f" | {metrics['tokens_per_s']:,.0f} tok/s"
    print(line, file=sys.stderr, flush=True)

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
      self._copy_tensorboard()
      if self._tb_local is not None:
        self._tb_local.cleanup()

  def _copy_tensorboard(self) -> None:
    if self._tb_remote is not None:
      paths.upload(pathlib.Path(self._tb_local.name), self._tb_remote)


def _clean(v):
  if hasattr(v, "item"):
    v = v.item()
  if isinstance(v, float) and not math.isfinite(v):
    return None
  return v


def read_metrics(workdir: str | pathlib.Path) -> list[dict]:
  path = paths.as_path(workdir) / "metrics.jsonl"
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
