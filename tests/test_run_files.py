"""The readers of a run's own files (bertjax/core/run_files.py) skip a torn or malformed row, or a
damaged JSON file, with one warning naming the file and line, and never raise: `report`, resume
(MetricWriter.resume_at) and the best-checkpoint keeper read through them."""

import json
import logging
import math
import pathlib
import tempfile

from hypothesis import HealthCheck, given, settings, strategies as st
import pytest

from bertjax import sweep
from bertjax.core import run_files
from bertjax.runtime import checkpoints, metric_writers
from bertjax.tools import report

ROWS = [{"step": 1, "split": "train", "loss": 3.0, "tokens_per_s": 100.0},
        {"step": 2, "split": "train", "loss": 2.5, "tokens_per_s": 110.0},
        {"step": 2, "split": "eval", "loss": 2.7, "accuracy": 0.4}]


def _lines(rows) -> str:
  return "".join(json.dumps(r) + "\n" for r in rows)


def _warnings(caplog) -> list[str]:
  return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_report_names_a_torn_last_line_and_reads_the_rest(tmp_path, caplog):
  """What kill -9 (or a sweep still running) leaves: the last line cut mid-row. The report reads
  the other rows and says which line it skipped (it was skipped without a word before)."""
  point = tmp_path / "seed=0"
  point.mkdir()
  (point / "metrics.jsonl").write_text(_lines(ROWS) + '{"step": 3, "split": "tra')
  with caplog.at_level(logging.WARNING):
    result = report.write_report(tmp_path)
  (p,) = result["points"]
  assert p.train_steps == [1, 2] and p.final == {"loss": 2.7, "accuracy": 0.4}
  assert [m for m in _warnings(caplog) if "metrics.jsonl:4: skipped" in m], _warnings(caplog)


@pytest.mark.parametrize("bad, why", [
    ('{"step": "x", "split": "train", "loss": 2.0}', "step 'x'"),
    ('{"step": 5, "split": "train", "loss": "high"}', "loss 'high'"),
    ('{"step": 5, "split": ["train"]}', "split ['train']"),
    ('[1, 2]', "a JSON list"),
    (b'\xff\xfe\x00garbage', "not UTF-8")])
def test_report_skips_a_malformed_middle_row(tmp_path, caplog, bad, why):
  """A non-numeric step (or loss, or binary noise) raised a traceback (int('x'), float('high'),
  UnicodeDecodeError); now the row is skipped and named."""
  point = tmp_path / "seed=0"
  point.mkdir()
  bad = bad if isinstance(bad, bytes) else bad.encode()
  (point / "metrics.jsonl").write_bytes(_lines(ROWS[:1]).encode() + bad + b"\n"
                                        + _lines(ROWS[1:]).encode())
  with caplog.at_level(logging.WARNING):
    (p,) = report.load_points(tmp_path)
  assert p.train_steps == [1, 2] and p.train_loss == [3.0, 2.5]
  assert [m for m in _warnings(caplog) if "metrics.jsonl:2: skipped" in m and why in m]


def test_report_reads_damaged_summary_config_and_sweep_json(tmp_path, caplog):
  """A summary.json that is a list, a config.json cut short, a sweep.json entry of a bad type:
  each is named and read as absent, never a traceback."""
  for name in ("a", "b"):
    (tmp_path / name).mkdir()
    (tmp_path / name / "metrics.jsonl").write_text(_lines(ROWS))
  (tmp_path / "a" / "summary.json").write_text("[1, 2]")
  (tmp_path / "a" / "config.json").write_text('{"objective": "ml')
  (tmp_path / "sweep.json").write_text(json.dumps({"points": [
      {"name": "a", "overrides": {}, "total_steps": 2}, {"name": "b", "total_steps": "many"}]}))
  with caplog.at_level(logging.WARNING):
    points = report.load_points(tmp_path)
  assert [p.name for p in points] == ["a"] and points[0].status == "pending"
  text = "\n".join(_warnings(caplog))
  assert "a/summary.json: skipped: a JSON list" in text
  assert "a/config.json:1: skipped: not JSON" in text
  assert "sweep.json: skipped point 1: its total_steps 'many' is damaged" in text


def test_the_sweep_reads_a_damaged_point_as_unfinished(tmp_path, caplog):
  """A re-run sweep asks each point whether it finished: a config.json whose total_steps is not
  a number raised ValueError (int('x')); a torn summary.json is now named, not silent."""
  (tmp_path / "summary.json").write_text(json.dumps({"status": "finished", "step": 5}))
  (tmp_path / "config.json").write_text(json.dumps({"total_steps": "x"}))
  assert not sweep.is_finished(tmp_path, 0)
  (tmp_path / "config.json").write_text(json.dumps({"total_steps": 5}))
  assert sweep.is_finished(tmp_path, 0)
  (tmp_path / "summary.json").write_text('{"status": "finished", "st')
  with caplog.at_level(logging.WARNING):
    assert not sweep.is_finished(tmp_path, 5)
  assert [m for m in _warnings(caplog) if "summary.json:1: skipped: not JSON" in m]


@pytest.mark.parametrize("damage", ['{"step": 4, "val', '{"value": "x"}', "[]"])
def test_a_damaged_best_json_does_not_block_the_next_start(tmp_path, caplog, damage):
  """best/best.json cut short raised JSONDecodeError at every later start of the run; now it is
  named and holds no value, so the next evaluation replaces it."""
  (tmp_path / "best").mkdir()
  (tmp_path / "best" / "best.json").write_text(damage)
  with caplog.at_level(logging.WARNING):
    keeper = checkpoints.BestKeeper(tmp_path, "accuracy", "max")
  assert keeper.value is None
  assert [m for m in _warnings(caplog) if "best.json" in m and "skipped" in m]


def test_resume_names_the_damaged_row_it_drops(tmp_path, caplog):
  """A damaged row in the middle of metrics.jsonl was dropped at resume without a word; now the
  row and the rewrite are named, and the rows kept are the well-formed ones up to the step."""
  (tmp_path / "metrics.jsonl").write_text(
      _lines(ROWS[:1]) + '{"step": 1.5, "split": "train"}\n' + _lines(ROWS[1:])
      + _lines([{"step": 7, "split": "train", "loss": 1.0}]) + '{"st')
  writer = metric_writers.MetricWriter(tmp_path, 10, enabled=True, tensorboard=False)
  with caplog.at_level(logging.WARNING):
    rows = writer.resume_at(2)
  assert rows == ROWS
  assert (tmp_path / "metrics.jsonl").read_text() == _lines(ROWS)
  text = "\n".join(_warnings(caplog))
  assert "metrics.jsonl:2: skipped a malformed row: step 1.5" in text
  assert "metrics.jsonl:6: skipped a malformed row: not JSON" in text
  assert "rewritten without its 2 malformed row(s)" in text


# ---------------------------------------------------------------------------------------------
# Whatever the bytes: no traceback.

_NUMBER = st.one_of(st.integers(-5, 10**20), st.floats(allow_nan=True, allow_infinity=True))
_VALUE = st.recursive(st.none() | st.booleans() | _NUMBER | st.text(max_size=8),
                      lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)
_GOOD = st.fixed_dictionaries(
    {"step": st.integers(0, 10**6), "split": st.sampled_from(["train", "eval"])},
    optional={"loss": st.floats(0, 10), "tokens_per_s": st.floats(0, 1e6),
              "accuracy": st.none() | st.floats(0, 1)})
_BAD = st.dictionaries(st.sampled_from(["step", "split", "loss", "tokens_per_s"]), _VALUE)


def _line(kind: str, value, cut: int) -> bytes:
  if kind == "noise":
    return value
  text = json.dumps(value).encode()
  return text[:cut % max(len(text), 1)] if kind == "torn" else text


_LINE = st.one_of(
    st.tuples(st.just("good"), _GOOD, st.just(0)),
    st.tuples(st.just("torn"), _GOOD, st.integers(1, 200)),
    st.tuples(st.just("bad"), _BAD | _VALUE, st.just(0)),
    st.tuples(st.just("noise"), st.binary(max_size=30).filter(lambda b: b"\n" not in b),
              st.just(0)))


def _valid(value) -> bool:
  """A metric row, checked apart from run_files.row_problem."""
  return (isinstance(value, dict) and type(value.get("step")) is int and value["step"] >= 0
          and type(value.get("split")) is str
          and all(v is None or type(v) in (int, float) for k, v in value.items()
                  if k not in ("step", "split")))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(_LINE, max_size=12), tail=st.binary(max_size=6))
def test_any_metrics_file_reads_without_a_traceback(lines, tail):
  """Torn lines, values of every JSON type, binary noise: the reader keeps exactly the rows that
  are well formed, in order; report reads the point, and resume rewrites the file, all without
  raising."""
  data = b"\n".join(_line(*line) for line in lines) + b"\n" + tail.replace(b"\n", b"")
  expected = [v for kind, v, _ in lines if kind in ("good", "bad") and _valid(v)]
  with tempfile.TemporaryDirectory() as d:
    point = pathlib.Path(d) / "seed=0"
    point.mkdir()
    (point / "metrics.jsonl").write_bytes(data)
    rows = metric_writers.read_metrics(point)
    assert json.dumps(rows) == json.dumps(expected)  # NaN compares equal as text
    (p,) = report.load_points(d)
    assert len(p.train_steps) == len(p.train_loss)
    kept = metric_writers.MetricWriter(point, 10, enabled=True, tensorboard=False).resume_at(500)
    assert json.dumps(kept) == json.dumps([r for r in rows if r["step"] <= 500])
    assert json.dumps(metric_writers.read_metrics(point)) == json.dumps(kept)


@settings(max_examples=150, deadline=None)
@given(data=st.one_of(st.binary(max_size=40), _VALUE.map(lambda v: json.dumps(v).encode()),
                      st.builds(lambda v: json.dumps({"value": v}).encode(), _VALUE)))
def test_any_json_file_reads_as_an_object_or_absent(data):
  """summary.json, config.json, best.json: an object, or None (with a warning), never a raise;
  the best-checkpoint keeper starts with a finite number or none."""
  with tempfile.TemporaryDirectory() as d:
    path = pathlib.Path(d) / "best" / "best.json"
    path.parent.mkdir()
    path.write_bytes(data)
    value = run_files.read_json(path)
    assert value is None or isinstance(value, dict)
    keeper = checkpoints.BestKeeper(pathlib.Path(d), "accuracy", "max")
    assert keeper.value is None or math.isfinite(keeper.value)
