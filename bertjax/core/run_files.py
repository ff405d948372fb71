"""Tolerant readers of the files a run writes for itself: metric rows, best.json, summary.json,
config.json, sweep.json.

These files are read back while they may be torn (a kill -9 mid-write, a sweep still running, a
disk that filled up) or damaged by hand. Their readers never raise: a row that is not one JSON
object with an integer `step`, a string `split` and numbers (or null) elsewhere is skipped, and a
JSON file that is not what it should be reads as absent; each skip is one warning naming the file
and the line, never silent. A missing file is no warning: it is the state before it is written.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any

from etils import epath

_log = logging.getLogger("bertjax.core.run_files")
_warned: set[str] = set()  # a file read twice (report and sweep both read summary.json): once


def _warn(message: str) -> None:
  if message not in _warned:
    _warned.add(message)
    _log.warning("%s", message)


def row_problem(row: Any) -> str | None:
  """Why `row` is not a metric row (None when it is one)."""
  if not isinstance(row, dict):
    return f"a JSON {type(row).__name__}, not an object"
  step = row.get("step")
  if isinstance(step, bool) or not isinstance(step, int) or step < 0:
    return f"step {step!r} is not a whole number >= 0"
  if not isinstance(row.get("split"), str):
    return f"split {row.get('split')!r} is not a string"
  for key, value in row.items():
    if key in ("step", "split") or value is None:
      continue
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      return f"{key} {_short(value)} is not a number"  # NaN is one: a diverged run's loss
  return None


def _short(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= 40 else text[:37] + "..."


def parse_rows(data: bytes, where: str | os.PathLike) -> list[tuple[str, dict]]:
  """(line, row) for each line of `data` holding a metric row, in order. Blank lines are
  skipped; any other line that is not a row (torn, not UTF-8, not JSON, a bad type) is skipped
  with one warning `WHERE:LINE: ...`."""
  out = []
  for number, raw in enumerate(data.split(b"\n"), start=1):
    raw = raw.rstrip(b"\r")
    if not raw.strip():
      continue
    try:
      line = raw.decode("utf-8")
      row = json.loads(line)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError, JSONDecodeError: ValueErrors
      problem = "not UTF-8" if isinstance(e, UnicodeDecodeError) else "not JSON (torn?)"
      _skip(where, number, problem)
      continue
    problem = row_problem(row)
    if problem:
      _skip(where, number, problem)
      continue
    out.append((line, row))
  return out


def _skip(where: str | os.PathLike, number: int, problem: str) -> None:
  _warn(f"{os.fspath(where)}:{number}: skipped a malformed row: {problem}")


def read_bytes(path: epath.Path) -> bytes | None:
  """The bytes of `path`, or None when it is absent or unreadable (a warning then)."""
  try:
    return path.read_bytes()
  except FileNotFoundError:
    return None
  except OSError as e:
    _warn(f"{path}: skipped: cannot read it ({e.strerror or type(e).__name__})")
    return None


def read_json(path: epath.Path) -> dict | None:
  """The JSON object in `path`, or None when the file is absent, or is unreadable, not UTF-8,
  not JSON or not an object (one warning naming it then)."""
  data = read_bytes(path)
  if data is None:
    return None
  try:
    value = json.loads(data.decode("utf-8-sig"))
  except (ValueError, RecursionError) as e:
    line = f":{e.lineno}" if isinstance(e, json.JSONDecodeError) else ""
    _warn(f"{path}{line}: skipped: not JSON "
          f"({'not UTF-8' if isinstance(e, UnicodeDecodeError) else 'torn or damaged'})")
    return None
  if not isinstance(value, dict):
    _warn(f"{path}: skipped: a JSON {type(value).__name__}, not an object")
    return None
  return value


def read_number(path: epath.Path, key: str) -> float | int | None:
  """The number `key` of the JSON object in `path` (best.json's value), or None when the file is
  absent, or damaged or lacks a finite number there (one warning then)."""
  record = read_json(path)
  if record is None:
    return None
  value = record.get(key)
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    _warn(f"{path}: skipped: its {key} {_short(value)} is not a finite number")
    return None
  return value


def lower_is_better(metric: str) -> bool:
  """Whether the metric rows' `metric` is best at its lowest: a loss, a perplexity, a KL."""
  return "loss" in metric or "perplexity" in metric or metric.endswith("_kl")
