"""Workdirs on a remote filesystem (gs://): the whole run goes through etils.epath.

No bucket is reachable from the tests, so gs:// is served by a fake: fsspec's DirFileSystem over
a local folder, registered as fsspec's `gs`/`gcs` protocol (the one epath asks for gs:// when
TensorFlow is absent), refusing to append as an object store does. Everything bertjax and orbax
write through epath goes to it, and orbax takes its GCS code paths (commit_success.txt instead of
a rename, its GCS deleter). Two things are redirected, as they bypass fsspec and need Google's
servers: tensorstore's array bytes (orbax's `gs://` -> its `gcs` kvstore driver; here the `file`
driver on the same folder) and orbax's hierarchical-namespace query (google-cloud-storage; here
"no"). gcsfs and tensorstore's GCS client themselves are not exercised.
"""

import datetime
import importlib
import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np

import pytest

from bertjax.config import config_checks, config_lib
from bertjax.core import paths
from bertjax.core.errors import UserError
from bertjax.data import sources, tokenizers
from bertjax.runtime import checkpoints, metric_writers, workdir as workdir_lib
from bertjax.trainer import train

REPO = pathlib.Path(__file__).resolve().parent.parent
RUN = "gs://bucket/runs/remote"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
  """One tokenizer for the local and the remote run, so their corpora are the same."""
  out = tmp_path_factory.mktemp("tok") / "tokenizer"
  docs = sources.read_documents([str(REPO / "bertjax/data/samples/wikitext2_test.raw")], "wikitext")
  tokenizers.train_sentencepiece(sources.iter_sentences(docs), None, vocab_size=512).save(out)
  return out


def _config(tokenizer, **overrides):
  config = config_lib.load_config_file(str(REPO / "configs/quickstart.py") + ":runlocal")
  settings = {"data.tokenizer": str(tokenizer), "data.vocab_size": 512, "model.vocab_size": 512,
              "model.hidden_size": 32, "model.intermediate_size": 64,
              "model.num_attention_heads": 2, "model.num_hidden_layers": 2,
              "model.hidden_dropout_prob": 0.1, "model.attention_probs_dropout_prob": 0.1,
              "max_seq_length": 32, "max_predictions_per_seq": 5, "total_steps": 6,
              "checkpoint_every": 3, "eval_every": 3, "log_every": 1, "async_checkpointing": False,
              "tensorboard": True, "best_metric": "loss", "best_mode": "min"}
  settings.update(overrides)
  config_lib.apply_overrides(config, [f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                                      for k, v in settings.items()])
  return config


def _dead_pid() -> int:
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()
  return proc.pid


@pytest.mark.slow
def test_gs_workdir_trains_resumes_and_matches_a_local_run(tmp_path, fake_gcs, tokenizer_dir,
                                                           monkeypatch, caplog):
  """Trained in gs://bucket/...: checkpoints, metrics, TensorBoard, config, changes, summary,
  prepared corpus, tokenizer and best/ all land in the bucket; killed after its step-3 checkpoint
  (the step-6 one removed, rows past step 3 and a dead run's lock left behind) and run again, it
  ends with the same rows, losses and parameters as the same run in a local folder."""
  local = tmp_path / "local"
  train.train_and_evaluate(_config(tokenizer_dir), local)
  monkeypatch.chdir(tmp_path)  # so a gs:// path mistaken for a local one would show up here

  train.train_and_evaluate(_config(tokenizer_dir), RUN)
  run = paths.as_path(RUN)
  bucket = fake_gcs / "bucket/runs/remote"
  assert sorted(p.name for p in (bucket / "checkpoints").iterdir()) == ["3", "6"]
  assert (bucket / "checkpoints/6/commit_success.txt").exists()  # orbax's GCS commit, not a rename
  for name in ("config.json", "summary.json", "metrics.jsonl.d/00000000.jsonl",
               "prepared/meta.json", "tokenizer/spm.model", "best/best.json"):
    assert (bucket / name).is_file(), name
  best = checkpoints.best_params(run / "best")  # best/STEP/params, the step orbax kept
  assert (bucket / "best" / best.parent.name / "params/_METADATA").is_file()
  assert list((bucket / "tensorboard").glob("events.out.tfevents.*"))
  assert not (bucket / "lock").exists()
  # What a run killed between its step-3 and step-6 checkpoints leaves behind.
  (run / "checkpoints" / "6").rmtree()
  assert not (bucket / "metrics.jsonl").exists()  # one object per logged row instead
  objects = len(list((bucket / "metrics.jsonl.d").iterdir()))
  (run / "lock").write_text(json.dumps({"pid": _dead_pid(), "hostname": socket.gethostname(),
                                        "started": "2026-01-01T00:00:00+00:00"}))
  caplog.clear()
  with caplog.at_level("INFO"):
    summary = train.train_and_evaluate(_config(tokenizer_dir, keep_checkpoints=2), RUN)
  assert f"took over the stale lock {RUN}/lock" in caplog.text
  assert f"resumed from the checkpoint at step 3 in {RUN}/checkpoints" in caplog.text

  assert summary["step"] == 6 and summary["workdir"] == RUN
  assert summary["checkpoint"] == f"{RUN}/checkpoints/6"
  assert not (tmp_path / "gs:").exists() and not (REPO / "gs:").exists()
  # The prepared corpus was read from a local copy of the bucket's.
  copies = list((tmp_path / "cache/bertjax-remote").glob("*/meta.json"))
  assert [c.read_bytes() for c in copies] == [(bucket / "prepared/meta.json").read_bytes()]
  assert not (bucket / "lock").exists()
  changes = [json.loads(l) for l in (bucket / "changes.jsonl").read_text().splitlines()]
  assert [(c["step"], c["changed"]) for c in changes] == [(3, {"keep_checkpoints": [3, 2]})]
  assert json.loads((bucket / "summary.json").read_text())["step"] == 6
  # The rows of steps 4-6 were deleted at the resume and logged again under the same numbers.
  assert len(list((bucket / "metrics.jsonl.d").iterdir())) == objects
  local_rows, remote_rows = (metric_writers.read_metrics(w) for w in (local, RUN))
  assert [(r["step"], r["split"]) for r in remote_rows] == [(r["step"], r["split"])
                                                          for r in local_rows]
  for a, b in zip(local_rows, remote_rows):
    assert a["loss"] == b["loss"], (a, b)
  for a, b in zip(jax.tree.leaves(checkpoints.restore_params(local)),
                  jax.tree.leaves(checkpoints.restore_params(RUN))):
    np.testing.assert_array_equal(a, b)
  best_local = json.loads((local / "best/best.json").read_text())
  assert json.loads((bucket / "best/best.json").read_text())["value"] == best_local["value"]


def test_gs_lock_is_refused_while_its_run_lives_and_taken_from_a_dead_one(fake_gcs):
  """The lock in a gs:// workdir: a live holder on this host or any holder on another host is
  refused with one line; a dead holder on this host is taken over; the lock goes at the end."""
  run = paths.as_path(RUN)
  run.mkdir(parents=True)
  lock = run / workdir_lib.LOCK
  sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    lock.write_text(json.dumps({"pid": sleeper.pid, "hostname": socket.gethostname(),
                                "started": datetime.datetime.now().astimezone().isoformat()}))
    with pytest.raises(UserError, match=f"is in use by pid {sleeper.pid} on "):
      with workdir_lib.locked(RUN):
        pass
  finally:
    sleeper.kill()
    sleeper.wait()
  lock.write_text(json.dumps({"pid": 1, "hostname": "elsewhere", "started": "x"}))
  with pytest.raises(UserError, match=f"cannot be checked from .* delete {lock} if that run"):
    with workdir_lib.locked(RUN):
      pass
  lock.write_text(json.dumps({"pid": sleeper.pid, "hostname": socket.gethostname(),
                              "started": "2026-01-01T00:00:00+00:00"}))
  with workdir_lib.locked(RUN):
    held = json.loads((fake_gcs / "bucket/runs/remote/lock").read_text())
    assert held["pid"] == os.getpid()
  assert not lock.exists()


def test_gs_lock_is_released_by_the_hook_run_before_os_exit(fake_gcs):
  """A process ending at once (os._exit: bertjax/runtime/distributed.py) runs `release_held`
  first: a gs:// lock goes too, and one another run has taken over stays (tests/
  test_lock_released_at_exit.py shows the hook running before os._exit, on local workdirs)."""
  ours, taken = paths.as_path(RUN), paths.as_path(RUN + "-taken")
  ours.mkdir(parents=True)
  taken.mkdir(parents=True)
  held = [workdir_lib.locked(RUN), workdir_lib.locked(RUN + "-taken")]
  for lock in held:
    lock.__enter__()
  theirs = json.dumps({"pid": 1, "hostname": "elsewhere", "started": "2030-01-01T00:00:00+00:00"})
  try:
    assert json.loads((fake_gcs / "bucket/runs/remote/lock").read_text())["pid"] == os.getpid()
    (taken / workdir_lib.LOCK).write_text(theirs)
    workdir_lib.release_held()
    assert not (ours / workdir_lib.LOCK).exists()
    assert not (fake_gcs / "bucket/runs/remote/lock").exists()
    assert (taken / workdir_lib.LOCK).read_text() == theirs
  finally:
    for lock in held:
      lock.__exit__(None, None, None)
  assert (taken / workdir_lib.LOCK).read_text() == theirs  # the normal release keeps it too


def test_gs_workdir_without_its_libraries_is_one_line(tmp_path, monkeypatch):
  """Without the fake: gcsfs (fsspec's gs://) or google-cloud-storage (orbax's) missing."""
  config = _config("unused")
  monkeypatch.setattr(config_checks, "GCS_CLIENT", "no_such_module.storage")
  with pytest.raises(UserError, match="orbax needs google-cloud-storage for gs:// checkpoints"):
    train.train_and_evaluate(config, "gs://bucket/run")
  monkeypatch.setattr(config_checks, "GCS_CLIENT", "json")
  from etils.epath import backend as epath_backend  # pylint: disable=import-outside-toplevel
  registry = importlib.import_module("fsspec.registry")
  monkeypatch.delitem(registry._registry, "gcs", raising=False)  # pylint: disable=protected-access
  monkeypatch.setitem(registry.known_implementations, "gcs",
                      {"class": "no_such_module.GCSFileSystem", "err": "Please install gcsfs"})
  epath_backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access
  with pytest.raises(UserError, match=r"workdir gs://bucket/run cannot be reached \(Please install "
                                      r"gcsfs\); fix: install that package"):
    train.train_and_evaluate(config, "gs://bucket/run")
  epath_backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access


def test_bad_remote_workdirs_are_one_line(fake_gcs):
  (fake_gcs / "bucket").mkdir()
  (fake_gcs / "bucket/file").write_text("x")
  config = _config("unused")
  with pytest.raises(UserError, match="workdir gs://bucket/file is a file, not a folder"):
    train.train_and_evaluate(config, "gs://bucket/file")
  with pytest.raises(UserError, match="etils.epath reads no memory:// paths"):
    train.train_and_evaluate(config, "memory://run")


def test_paths_on_gs_append_upload_and_cached_local_copies(tmp_path, fake_gcs):
  """append_text on an object store; `writing` uploads a local folder; `reading` keeps its local
  copy while the bucket's files are unchanged and copies them again when one changes."""
  log = paths.as_path("gs://bucket/x/log.txt")
  log.parent.mkdir(parents=True)
  paths.append_text(log, "a\n")
  paths.append_text(log, "b\n")
  assert (fake_gcs / "bucket/x/log.txt").read_text() == "a\nb\n"
  with paths.writing(paths.as_path("gs://bucket/x/folder"), last=("meta.json",)) as local:
    (local / "sub").mkdir()
    (local / "sub/data.bin").write_bytes(b"123")
    (local / "meta.json").write_text("{}")
    assert not (fake_gcs / "bucket/x/folder").exists()  # uploaded only once complete
  assert (fake_gcs / "bucket/x/folder/sub/data.bin").read_bytes() == b"123"
  copy = paths.reading(paths.as_path("gs://bucket/x/folder"))
  assert copy.is_relative_to(tmp_path / "cache") and (copy / "sub/data.bin").read_bytes() == b"123"
  (copy / "marker").write_text("kept while unchanged")
  assert paths.reading(paths.as_path("gs://bucket/x/folder")) == copy and (copy / "marker").exists()
  (fake_gcs / "bucket/x/folder/sub/data.bin").write_bytes(b"12345")
  assert paths.reading(paths.as_path("gs://bucket/x/folder")) == copy
  assert (copy / "sub/data.bin").read_bytes() == b"12345" and not (copy / "marker").exists()
  local_dir = tmp_path / "plain"
  assert paths.reading(local_dir) == local_dir  # a local folder is read where it is
