"""Preemption and crash safety: SIGKILL + restart is exact, SIGTERM saves, damaged checkpoints are skipped."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent

# Big enough that a step takes a noticeable fraction of a second on a CPU, so the test can act
# between checkpoints; small enough to compile quickly.
ARGS = ["--config.model.vocab_size=512", "--config.model.hidden_size=128",
        "--config.model.intermediate_size=512", "--config.model.num_attention_heads=2",
        "--config.model.num_hidden_layers=2", "--config.max_seq_length=128",
        "--config.max_predictions_per_seq=20", "--config.batch_size=32", "--config.total_steps=20",
        "--config.checkpoint_every=10", "--config.log_every=1", "--config.eval_every=0",
        "--config.tensorboard=False", "--config.model.hidden_dropout_prob=0.1",
        "--config.model.attention_probs_dropout_prob=0.1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """A small prepared corpus (the real pipeline, so its iterator state is part of the resume)."""
  from bertjax.data import prepare, sources, tokenizers
  out = tmp_path_factory.mktemp("corpus")
  sample = REPO / "bertjax/data/samples/wikitext2_test.raw"
  docs = sources.read_documents([str(sample)], "wikitext")
  tok = tokenizers.train_sentencepiece(sources.iter_sentences(docs), None, vocab_size=512)
  prepare.prepare_corpus(docs, tok, out / "prepared", num_shards=2, num_workers=1)
  return out / "prepared"


def _start(workdir, corpus, *extra):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.Popen(
      [sys.executable, "launch.py", "--config", "configs/quickstart.py", "--workdir", str(workdir),
       f"--config.data_dir={corpus}", *ARGS, *extra],
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: pathlib.Path, proc, timeout=300):
  start = time.time()
  while not path.exists():
    if proc.poll() is not None:
      raise AssertionError(f"run ended before {path} appeared: {proc.stderr.read()[-2000:]}")
    if time.time() - start > timeout:
      proc.kill()
      raise AssertionError(f"{path} did not appear")
    time.sleep(0.02)


def _params(workdir):
  from bertjax.runtime import checkpoints
  import jax
  return jax.tree.leaves(checkpoints.restore_params(workdir))


def _train_rows(workdir):
  from bertjax.runtime import metric_writers
  rows = metric_writers.read_metrics(workdir)
  return {r["step"]: r for r in rows if r["split"] == "train"}


@pytest.mark.slow
def test_sigkill_then_restart_is_exact(tmp_path, corpus):
  """One run holds a workdir: a second one started beside it is refused. After kill -9, the
  next run takes the dead run's lock over and ends bit for bit where an uninterrupted run ends."""
  reference = _start(tmp_path / "reference", corpus)
  out, err = reference.communicate(timeout=600)
  assert reference.returncode == 0, err[-2000:]
  assert not (tmp_path / "reference/lock").exists()  # released at the end

  run = _start(tmp_path / "killed", corpus)
  lock = tmp_path / "killed/lock"
  _wait_for(lock, run)
  run.send_signal(signal.SIGSTOP)  # held still (and its lock held) while a second run tries
  try:
    second = _start(tmp_path / "killed", corpus)
    _, err = second.communicate(timeout=600)
  finally:
    run.send_signal(signal.SIGCONT)
  assert second.returncode == 2 and "Traceback" not in err, err[-2000:]
  since = json.loads(lock.read_text())["started"]
  assert [l for l in err.splitlines() if l.startswith("error:")] == [
      f"error: {tmp_path / 'killed'} is in use by pid {run.pid} on {socket.gethostname()} since "
      f"{since} ({lock}); wait for it or use another --workdir"]
  _wait_for(tmp_path / "killed/checkpoints/10", run)
  run.send_signal(signal.SIGKILL)
  run.wait()
  assert json.loads(lock.read_text())["pid"] == run.pid  # the dead run's lock is left behind
  steps = sorted(int(p.name) for p in (tmp_path / "killed/checkpoints").iterdir() if p.name.isdigit())
  assert 20 not in steps and 10 in steps
  restarted = _start(tmp_path / "killed", corpus)
  out, err = restarted.communicate(timeout=600)
  assert restarted.returncode == 0, err[-2000:]
  assert f"took over the stale lock {lock}: pid {run.pid}" in err
  assert "resumed from the checkpoint at step 10" in err
  assert not lock.exists()
  for a, b in zip(_params(tmp_path / "reference"), _params(tmp_path / "killed")):
    np.testing.assert_array_equal(a, b)
  ref_rows, rows = _train_rows(tmp_path / "reference"), _train_rows(tmp_path / "killed")
  for step in range(11, 21):
    assert rows[step]["loss"] == ref_rows[step]["loss"]
    assert rows[step]["mlm_accuracy"] == ref_rows[step]["mlm_accuracy"]


@pytest.mark.slow
def test_sigterm_saves_current_step_and_exits_cleanly(tmp_path, corpus):
  run = _start(tmp_path, corpus, "--config.total_steps=1000", "--config.checkpoint_every=500")
  # Wait until training is under way, then deliver the preemption notice.
  start = time.time()
  while not (tmp_path / "metrics.jsonl").exists() or len(_train_rows(tmp_path)) < 3:
    assert run.poll() is None and time.time() - start < 300
    time.sleep(0.02)
  run.send_signal(signal.SIGTERM)
  out, err = run.communicate(timeout=300)
  assert run.returncode == 75, err[-2000:]  # preempted, checkpoint saved: safe to requeue
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert f"run {summary['status']} at step {summary['step']}" in out  # the end table
  assert summary["status"].startswith("preempted")
  step = summary["step"]
  assert 3 <= step < 1000
  assert (tmp_path / "checkpoints" / str(step)).is_dir()
  from bertjax.runtime import checkpoints
  params = checkpoints.restore_params(tmp_path)
  assert params["encoder"]["embeddings"]["word_embeddings"]["embedding"].shape == (512, 128)


@pytest.mark.slow
def test_truncated_latest_checkpoint_falls_back(tmp_path, corpus):
  run = _start(tmp_path, corpus)
  _, err = run.communicate(timeout=600)
  assert run.returncode == 0, err[-2000:]
  # Damage every data file of the newest checkpoint, as a disk-full or a half-copied folder would.
  damaged = 0
  for f in (tmp_path / "checkpoints/20/state").rglob("*"):
    if f.is_file() and f.stat().st_size > 0 and f.parent.name == "d":
      f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])
      damaged += 1
  assert damaged
  run = _start(tmp_path, corpus, "--config.total_steps=25")
  _, err = run.communicate(timeout=600)
  assert run.returncode == 0, err[-2000:]
  assert "checkpoint at step 20 is unreadable" in err
  assert "resumed from the checkpoint at step 10" in err
  assert (tmp_path / "checkpoints/25").is_dir()


def _rows(workdir):
  """The rows logged so far (a line being written is skipped)."""
  from bertjax.runtime import metric_writers
  return metric_writers.read_metrics(workdir)


@pytest.mark.slow
def test_two_sigterms_then_the_end_keep_the_whole_runs_record(tmp_path, corpus):
  """Stopped by SIGTERM twice and resumed each time (saying where), the run finishes with one
  metrics.jsonl row per (step, split), the first process's rows as it wrote them, and a
  summary.json whose first train metrics are step 1 of the first process and whose last are the
  final step's."""
  extra = ["--config.total_steps=30", "--config.checkpoint_every=1000", "--config.eval_every=6"]
  stopped, first_process_rows = [], None
  for k in range(3):
    run = _start(tmp_path, corpus, *extra)
    if k < 2:
      target = (stopped[-1] if stopped else 0) + 3  # this process is training: stop it
      start = time.time()
      while max([r["step"] for r in _rows(tmp_path) if r["split"] == "train"] or [0]) < target:
        assert run.poll() is None and time.time() - start < 300, run.stderr.read()[-2000:]
        time.sleep(0.02)
      run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=600)
    assert run.returncode == (75 if k < 2 else 0), err[-2000:]
    if k:
      assert f"resumed from the checkpoint at step {stopped[-1]} in" in err
    summary = json.loads((tmp_path / "summary.json").read_text())
    if k == 0:
      first_process_rows = _rows(tmp_path)
    if k < 2:
      assert summary["status"].startswith("preempted") and summary["step"] < 30
      stopped.append(summary["step"])
  assert stopped[0] < stopped[1] < 30

  rows = _rows(tmp_path)
  keys = [(r["step"], r["split"]) for r in rows]
  assert len(keys) == len(set(keys))
  train_rows = [r for r in rows if r["split"] == "train"]
  assert [r["step"] for r in train_rows] == list(range(1, 31))  # log_every=1
  assert [r["step"] for r in rows if r["split"] == "eval"] == [6, 12, 18, 24, 30]
  assert rows[:len(first_process_rows)] == first_process_rows
  values = lambda r: {k: v for k, v in r.items() if k not in ("step", "split")}
  assert summary["status"] == "finished" and summary["step"] == 30
  assert summary["first_train"] == values(first_process_rows[0]) and summary["first_train_step"] == 1
  assert summary["last_train"] == values(train_rows[-1]) and summary["last_train_step"] == 30
  assert summary["last_eval"] == values(rows[-1]) and summary["last_eval_step"] == 30
  assert "first train (step 1)" in out and "last train (step 30)" in out  # the end table
