"""Where metrics go: the rows of metrics, TensorBoard event files, and a console line per row.

Only process 0 writes. Each logging event is one row: a JSON object with at least `step` and
`split`. Where the rows are kept depends on the workdir:
- local: WORKDIR/metrics.jsonl, one line per row, appended in place;
- remote (gs://...; bertjax/core/paths.py): an object cannot be appended to, and rewriting one whole
  file at each event would upload O(rows^2) bytes over a run, so each event is one object,
  WORKDIR/metrics.jsonl.d/<8-digit sequence number>.jsonl, numbered from 0 in the order written.
  A run uploads each row once; reading it back is one small read per event, made in parallel.
`read_metrics` reads either layout (metrics.jsonl first, then metrics.jsonl.d's objects by
number; a local folder copied from a bucket reads as it did there) and is the one reader of
metrics. TensorBoard's event files, which tensorboardX writes to local files, are written in a
local folder on a remote workdir and copied to WORKDIR/tensorboard at each event; there a new
event file is started every TB_EVENTS_PER_FILE events, so each copy stays small.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import math
import pathlib
import sys
import tempfile
from typing import Any

import jax

from bertjax.core import paths, run_files

# The metrics a logged row's console line shows next to the loss, when present. Distillation's
# soft_kl, KL(teacher || student), comes first: its loss holds the teacher's entropy and barely
# moves (bertjax/objectives/distill.py).
SHOWN = ("soft_kl", "mlm_accuracy", "nsp_accuracy", "sop_accuracy", "rtd_accuracy", "accuracy",
         "score", "f1", "exact_match", "agreement")


def shown_keys(metrics: dict[str, Any]) -> list[str]:
  """The keys of a row's line: loss, then SHOWN, each also behind an evaluator's prefix
  (`probe_rte/accuracy`: a run whose only evaluation is a probe has no bare key to show)."""
  return [k for base in ("loss", *SHOWN) for k, v in metrics.items()
          if (k == base or k.endswith("/" + base)) and isinstance(v, (int, float))
          and not isinstance(v, bool)]


METRICS = "metrics.jsonl"  # the rows of a local workdir
METRICS_DIR = "metrics.jsonl.d"  # those of a remote one: one object per logging event
_DIGITS = 8  # an object's sequence number, zero-padded so that names sort in order
# On a remote workdir, the logging events per TensorBoard event file: a file is uploaded whole at
# each event, so a run uploads about TB_EVENTS_PER_FILE / 2 times its event files' size.
TB_EVENTS_PER_FILE = 50


class MetricWriter:

  def __init__(self, workdir: str | pathlib.Path, total_steps: int, *, enabled: bool | None = None,
               tensorboard: bool = True):
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self.total_steps = total_steps
    self.workdir = paths.as_path(workdir)
    self.path = self.workdir / METRICS
    # One object per event on a bucket, or where a bucket's run was copied to (its rows go on).
    self._objects = paths.is_remote(self.workdir) or (self.workdir / METRICS_DIR).exists()
    self._next = None  # the next object's sequence number, found at the first write
    self._tb = None
    self._tb_remote, self._tb_local = None, None
    self._tb_logdir, self._tb_events, self._tb_files = None, 0, 0
    if self.enabled and tensorboard:
      self._tb_logdir = self.workdir / "tensorboard"
      if paths.is_remote(self._tb_logdir):
        self._tb_remote = self._tb_logdir
        self._tb_local = tempfile.TemporaryDirectory(prefix="bertjax-tb-")
        self._tb_logdir = self._tb_local.name
      self._open_tensorboard()

  def resume_at(self, step: int) -> list[dict]:
    """The rows of the run so far, up to `step`, where a resumed run goes on. Rows past it were
    logged before an interruption and are about to be logged again: they leave the record (and a
    line torn by a kill mid-write with them), so the rows never hold a step twice. Only the files
    holding such rows are rewritten: on a bucket, the last few objects (deleted when emptied)."""
    rows = []
    for path in _sources(self.workdir):
      data = run_files.read_bytes(path) or b""
      parsed = run_files.parse_rows(data, path)  # a malformed row is skipped with a warning
      kept = [(line, row) for line, row in parsed if row["step"] <= step]
      rows.extend(row for _, row in kept)
      lines = sum(1 for line in data.split(b"\n") if line.strip())
      if not self.enabled or len(kept) == lines:  # rewritten only when a row goes
        continue
      if len(parsed) < lines:
        logging.warning("%s: rewritten without its %d malformed row(s) (warned above)", path,
                        lines - len(parsed))
      if kept or path.name == METRICS:
        paths.replace_text(path, "".join(line + "\n" for line, _ in kept))
      else:
        path.unlink()
    self._next = None  # numbers freed by deleted objects are used again
    return rows

  def write(self, step: int, split: str, metrics: dict[str, float]) -> None:
    if not self.enabled:
      return
    record = {"step": int(step), "split": split}
    record.update({k: _clean(v) for k, v in metrics.items()})
    line = json.dumps(record) + "\n"
    if self._objects:
      if self._next is None:
        self._next = _next_number(self.workdir)
        (self.workdir / METRICS_DIR).mkdir(parents=True, exist_ok=True)
      # A single write: the object holds the whole row or is absent, never a torn line.
      paths.replace_text(self.workdir / METRICS_DIR / f"{self._next:0{_DIGITS}d}.jsonl", line)
      self._next += 1
    else:
      paths.append_text(self.path, line)
    if self._tb is not None:
      for k, v in metrics.items():
        if isinstance(v, (int, float)) and math.isfinite(v):
          self._tb.add_scalar(f"{split}/{k}", v, step)
      self._tb.flush()
      self._copy_tensorboard()
      self._tb_events += 1
      if self._tb_remote is not None and self._tb_events % TB_EVENTS_PER_FILE == 0:
        # Each copy uploads the growing event file whole: a new file bounds what each copies.
        self._tb.close()  # flush() may leave the last event queued: copied once closed
        self._copy_tensorboard()
        for path in pathlib.Path(self._tb_local.name).iterdir():  # uploaded complete: not again
          path.unlink()
        self._open_tensorboard()
    self.print_row(step, split, metrics)

  def print_row(self, step: int, split: str, metrics: dict[str, float]) -> None:
    """One plain line per logged row, e.g. `train step 50/1000: loss 3.2100 mlm_accuracy 0.412 |
    12,345 tok/s` (the ETA is on the progress lines, bertjax/runtime/progress.py)."""
    parts = [f"{split} step {step}/{self.total_steps}:"]
    for k in shown_keys(metrics):
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

  def _open_tensorboard(self) -> None:
    # Imported only when used: on a 2-core Intel Xeon (2026-11-28) it took a process holding jax
    # from 157 MB to 353 MB resident, which a run without TensorBoard does not pay.
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    suffix = f".{self._tb_files:06d}" if self._tb_remote is not None else ""
    self._tb = SummaryWriter(str(self._tb_logdir), filename_suffix=suffix)
    self._tb_files += 1

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
  """Every row of the run in `workdir` (local or remote), in the order logged. A line torn by a
  kill mid-write (the last one of a local metrics.jsonl), or any other malformed line, is skipped
  with a warning naming the file and line (bertjax/core/run_files.py)."""
  sources = _sources(paths.as_path(workdir))
  if len(sources) > 1 and paths.is_remote(workdir):  # one small read per object: in parallel
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
      datas = list(pool.map(run_files.read_bytes, sources))
  else:
    datas = [run_files.read_bytes(p) for p in sources]
  return [row for path, data in zip(sources, datas)
          for _, row in run_files.parse_rows(data or b"", path)]


def _sources(workdir: paths.Path) -> list[paths.Path]:
  """The files holding the rows, in order: metrics.jsonl, then metrics.jsonl.d's objects by
  number (either may be absent)."""
  out = [workdir / METRICS] if (workdir / METRICS).is_file() else []
  return out + [p for _, p in sorted(_numbered(workdir).items())]


def _numbered(workdir: paths.Path) -> dict[int, paths.Path]:
  """metrics.jsonl.d's objects by sequence number (other names there are ignored)."""
  folder = workdir / METRICS_DIR
  if not folder.is_dir():
    return {}
  return {int(p.stem): p for p in folder.iterdir()
          if p.suffix == ".jsonl" and p.stem.isdigit()}


def _next_number(workdir: paths.Path) -> int:
  return max(_numbered(workdir), default=-1) + 1
