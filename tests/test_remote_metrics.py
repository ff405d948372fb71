"""Metric rows on a gs:// workdir: one object per logging event (metrics.jsonl.d/), read back in
order by `metric_writers.read_metrics`, so a run uploads each row once instead of rewriting
metrics.jsonl whole at every event. The bucket is the fake of tests/fake_gcs.py."""

import json

import pytest

from bertjax.core import paths
from bertjax.runtime import metric_writers
from bertjax.tools import report

RUN = "gs://bucket/runs/metrics"


def _metric_bytes(fake_gcs, run: str) -> int:
  """Bytes uploaded to the run's metric files (metrics.jsonl and metrics.jsonl.d/...)."""
  return sum(n for path, n in fake_gcs.uploaded.items() if path.startswith(f"{run}/metrics.jsonl"))


def _log(writer, steps, eval_every=0):
  """Train rows at `steps` (an eval row after each multiple of `eval_every`)."""
  for step in steps:
    writer.write(step, "train", {"loss": 10.0 / step, "learning_rate": 1e-4,
                                 "tokens_per_s": 1234.5 + step})
    if eval_every and step % eval_every == 0:
      writer.write(step, "eval", {"loss": 5.0 / step, "accuracy": step / 1000})


def _bytes_of(rows) -> int:
  return sum(len(json.dumps(r)) + 1 for r in rows)


def test_a_thousand_rows_upload_each_row_once_and_read_back_in_order(fake_gcs):
  """1,000 logging events on the bucket upload under 3x the rows' bytes; the former whole-file
  rewrite (paths.append_text at each event) uploads over 50x, already for 200 rows: the measure
  can fail."""
  writer = metric_writers.MetricWriter(RUN, 1000, enabled=True, tensorboard=False)
  _log(writer, range(1, 1001))
  writer.close()
  rows = metric_writers.read_metrics(RUN)
  assert [(r["step"], r["split"]) for r in rows] == [(s, "train") for s in range(1, 1001)]
  assert rows[41] == {"step": 42, "split": "train", "loss": 10.0 / 42, "learning_rate": 1e-4,
                      "tokens_per_s": 1234.5 + 42}
  final = _bytes_of(rows)
  assert _metric_bytes(fake_gcs, RUN) < 3 * final
  assert not (fake_gcs / "bucket/runs/metrics/metrics.jsonl").exists()
  objects = sorted(p.name for p in (fake_gcs / "bucket/runs/metrics/metrics.jsonl.d").iterdir())
  assert objects[:2] == ["00000000.jsonl", "00000001.jsonl"] and len(objects) == 1000

  # The twin, on the first 200 rows (its cost grows as rows^2: 1,000 would take seconds).
  old = "gs://bucket/runs/old"
  paths.as_path(old).mkdir(parents=True)
  for r in rows[:200]:
    paths.append_text(paths.as_path(old) / "metrics.jsonl", json.dumps(r) + "\n")
  assert _metric_bytes(fake_gcs, old) > 50 * _bytes_of(rows[:200])
  assert metric_writers.read_metrics(old) == rows[:200]  # the former layout is still read


def _interrupted_and_resumed(workdir, uploaded=None) -> tuple[list[dict], int]:
  """Rows of a run logged to step 10, interrupted, resumed from its step-6 checkpoint (rows 7-10
  dropped) and logged to step 12; the rows the resume returned are checked against the record.
  Also the bytes `uploaded` (a bucket's counter) while resuming."""
  writer = metric_writers.MetricWriter(workdir, 12, enabled=True, tensorboard=False)
  _log(writer, range(1, 11), eval_every=3)
  writer.close()
  writer = metric_writers.MetricWriter(workdir, 12, enabled=True, tensorboard=False)
  before = sum((uploaded or {}).values())
  history = writer.resume_at(6)
  resume_bytes = sum((uploaded or {}).values()) - before
  assert [(r["step"], r["split"]) for r in history] == [
      (1, "train"), (2, "train"), (3, "train"), (3, "eval"), (4, "train"), (5, "train"),
      (6, "train"), (6, "eval")]
  _log(writer, range(7, 13), eval_every=3)
  writer.close()
  return metric_writers.read_metrics(workdir), resume_bytes


def test_resume_on_the_bucket_drops_rows_past_the_checkpoint_as_a_local_run_does(tmp_path,
                                                                                  fake_gcs):
  """Each (step, split) once, the same rows as the same run in a local metrics.jsonl; only the
  objects holding rows past the checkpoint were touched by the resume."""
  (tmp_path / "local").mkdir()
  local, _ = _interrupted_and_resumed(tmp_path / "local")
  assert (tmp_path / "local/metrics.jsonl").is_file()
  assert not (tmp_path / "local/metrics.jsonl.d").exists()
  remote, resume_bytes = _interrupted_and_resumed(RUN, fake_gcs.uploaded)
  keys = [(r["step"], r["split"]) for r in remote]
  assert len(keys) == len(set(keys)) == 12 + 4
  assert keys == sorted(keys, key=lambda k: (k[0], k[1] == "eval"))
  assert remote == local
  # The 5 objects past step 6 (4 train rows, the step-9 eval) were deleted, none rewritten; the
  # 8 rows logged after the resume took the numbers from 8 on.
  assert resume_bytes == 0
  folder = fake_gcs / "bucket/runs/metrics/metrics.jsonl.d"
  assert sorted(int(p.stem) for p in folder.iterdir()) == list(range(16))
  assert json.loads((folder / "00000008.jsonl").read_text())["step"] == 7


def test_a_bucket_run_copied_to_a_local_folder_reads_and_resumes_there(tmp_path, fake_gcs):
  """Copied down (gsutil cp -r), a bucket run's rows read the same, and a run resumed there goes
  on in its metrics.jsonl.d, so the order holds."""
  writer = metric_writers.MetricWriter(RUN, 8, enabled=True, tensorboard=False)
  _log(writer, range(1, 6))
  copy = tmp_path / "copy"
  for path in (fake_gcs / "bucket/runs/metrics").rglob("*.jsonl"):
    (copy / path.parent.name).mkdir(parents=True, exist_ok=True)
    (copy / path.parent.name / path.name).write_bytes(path.read_bytes())
  assert metric_writers.read_metrics(copy) == metric_writers.read_metrics(RUN)
  writer = metric_writers.MetricWriter(copy, 8, enabled=True, tensorboard=False)
  assert len(writer.resume_at(3)) == 3
  _log(writer, range(4, 9))
  assert [r["step"] for r in metric_writers.read_metrics(copy)] == list(range(1, 9))
  assert not (copy / "metrics.jsonl").exists()


def test_the_report_reads_a_bucket_runs_rows_as_a_local_ones(tmp_path, fake_gcs):
  """report.load_point on the same rows in a local folder and in the bucket gives the same
  figures (a full training run on gs:// is compared with a local one in test_remote_workdir)."""
  (tmp_path / "local").mkdir()
  for workdir in (tmp_path / "local", RUN):
    writer = metric_writers.MetricWriter(workdir, 9, enabled=True, tensorboard=False)
    _log(writer, range(1, 10), eval_every=3)
  local = report.load_point(tmp_path, {"name": "local", "overrides": {}})
  remote = report.load_point(paths.as_path("gs://bucket/runs"), {"name": "metrics",
                                                                 "overrides": {}})
  assert (fake_gcs / "bucket/runs/metrics/metrics.jsonl.d").is_dir()
  assert local.final == remote.final and local.best == remote.best
  assert local.final == {"loss": 5.0 / 9, "accuracy": 9 / 1000}
  assert remote.train_loss == local.train_loss and len(remote.train_loss) == 9


def _scalars(folder) -> list[tuple[str, int, float]]:
  """(tag, step, value) of every scalar in the event files under `folder`, in file name order
  (TensorBoard's): each file is TFRecords of Event protos (length, crc, data, crc)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
  out = []
  for path in sorted(folder.glob("events.out.tfevents.*")):
    data, at = path.read_bytes(), 0
    while at < len(data):
      n = int.from_bytes(data[at:at + 8], "little")
      event = event_pb2.Event.FromString(data[at + 12:at + 12 + n])
      at += 12 + n + 4
      out += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
  return out


def test_tensorboard_on_the_bucket_starts_new_event_files_so_each_copy_stays_small(fake_gcs):
  """150 events: the event files copied at each event are uploaded under 40x their final size
  (one growing file copied whole each time: about 75x) and hold every scalar once, in order."""
  writer = metric_writers.MetricWriter(RUN, 150, enabled=True, tensorboard=True)
  _log(writer, range(1, 151))
  writer.close()
  folder = fake_gcs / "bucket/runs/metrics/tensorboard"
  final = sum(p.stat().st_size for p in folder.iterdir())
  uploaded = sum(n for p, n in fake_gcs.uploaded.items() if p.startswith(f"{RUN}/tensorboard/"))
  assert final < uploaded < 40 * final, uploaded / final
  assert len(list(folder.iterdir())) == 150 // metric_writers.TB_EVENTS_PER_FILE + 1
  losses = [(step, value) for tag, step, value in _scalars(folder) if tag == "train/loss"]
  assert [step for step, _ in losses] == list(range(1, 151))
  assert losses[41][1] == pytest.approx(10.0 / 42)
