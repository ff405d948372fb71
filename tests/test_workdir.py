"""One workdir, one run: the lock, and what a resumed run may change (bertjax/runtime/workdir.py).

A refused or failed run must leave the workdir exactly as it was: every file's bytes and mtime
are compared before and after.
"""

import json
import logging
import os
import pathlib
import shutil
import socket
import subprocess
import sys

import pytest

from bertjax.core.errors import UserError
from bertjax.runtime import workdir as workdir_lib
from bertjax.trainer import train

from helpers import TINY, load_config
from test_train import run_launch, tiny_config

HOST = socket.gethostname()


def write_lock(workdir: pathlib.Path, pid: int, host: str = HOST,
               started: str = "2030-01-01T00:00:00+00:00") -> str:
  text = json.dumps({"pid": pid, "hostname": host, "started": started})
  (workdir / "lock").write_text(text)
  return text


def take(workdir: pathlib.Path) -> dict:
  """Takes and releases the lock; returns what it held."""
  with workdir_lib.locked(workdir):
    return json.loads((workdir / "lock").read_text())


def dead_pid() -> int:
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()
  return proc.pid


@pytest.fixture
def sleeper():
  proc = subprocess.Popen(["sleep", "60"])
  yield proc
  proc.kill()
  proc.wait()


# ---------------------------------------------------------------------------------------------
# The lock.


def test_lock_is_held_while_running_and_released_after(tmp_path):
  with workdir_lib.locked(tmp_path):
    held = json.loads((tmp_path / "lock").read_text())
    assert held["pid"] == os.getpid() and held["hostname"] == HOST and held["started"]
    with pytest.raises(UserError) as e:  # the same process, a second time: in use
      take(tmp_path)
    assert f"in use by pid {os.getpid()} on {HOST}" in str(e.value)
  assert not (tmp_path / "lock").exists()
  with pytest.raises(RuntimeError):
    with workdir_lib.locked(tmp_path):
      raise RuntimeError("a crash inside the run")
  assert not (tmp_path / "lock").exists()  # released on errors too


def test_live_holder_is_refused_and_its_lock_kept(tmp_path, sleeper):
  text = write_lock(tmp_path, sleeper.pid)
  with pytest.raises(UserError) as e:
    take(tmp_path)
  assert str(e.value) == (f"{tmp_path} is in use by pid {sleeper.pid} on {HOST} since "
                          f"2030-01-01T00:00:00+00:00 ({tmp_path / 'lock'}); wait for it or use "
                          "another --workdir")
  assert (tmp_path / "lock").read_text() == text


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path, caplog):
  pid = dead_pid()
  write_lock(tmp_path, pid)
  with caplog.at_level(logging.WARNING):
    held = take(tmp_path)
  assert held["pid"] == os.getpid()
  assert f"took over the stale lock {tmp_path / 'lock'}: pid {pid} on {HOST}" in caplog.text
  assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing left behind


def test_lock_of_another_host_is_refused_with_how_to_free_it(tmp_path):
  text = write_lock(tmp_path, dead_pid(), host="elsewhere-host")
  with pytest.raises(UserError) as e:
    take(tmp_path)
  message = str(e.value)
  assert "in use by pid" in message and "on elsewhere-host" in message
  assert f"delete {tmp_path / 'lock'} if that run is gone" in message
  assert (tmp_path / "lock").read_text() == text


def test_our_pid_in_a_lock_we_do_not_hold_is_a_past_process(tmp_path):
  """A restarted container often gives the new run the old run's pid."""
  write_lock(tmp_path, os.getpid())
  assert take(tmp_path)["started"] != "2030-01-01T00:00:00+00:00"


@pytest.mark.skipif(not pathlib.Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_reused_pid_and_zombie_are_stale(tmp_path, sleeper):
  # The live process started after the lock was taken: the lock's pid was reused.
  write_lock(tmp_path, sleeper.pid, started="2000-01-01T00:00:00+00:00")
  assert take(tmp_path)["pid"] == os.getpid()
  # Killed but not yet reaped: os.kill(pid, 0) still succeeds.
  zombie = subprocess.Popen(["sleep", "60"])
  zombie.kill()
  try:
    write_lock(tmp_path, zombie.pid, started="2000-01-01T00:00:00+00:00")
    assert take(tmp_path)["pid"] == os.getpid()
  finally:
    zombie.wait()


@pytest.mark.parametrize("content", ["", "not json", "[1, 2]", '{"pid": "x"}'])
def test_unreadable_lock_is_refused_in_one_line(tmp_path, content):
  (tmp_path / "lock").write_text(content)
  with pytest.raises(UserError, match="is not a lock this program wrote; delete it if no run uses"):
    take(tmp_path)
  assert (tmp_path / "lock").read_text() == content


# ---------------------------------------------------------------------------------------------
# Settings of a resumed run.


@pytest.mark.parametrize("key, old, new, ok", [
    ("log_every", 1, 5, True), ("checkpoint_every", 10, 3, True), ("eval_every", 5, 7, True),
    ("eval_every", 0, 7, False), ("eval_every", 5, 0, False), ("mesh_shape", [-1, 1, 1], [1, 2, 1], True),
    ("grad_accum_steps", 1, 4, True), ("model.remat", False, True, True),
    ("total_steps", 100, 200, True), ("total_steps", 100, 50, False),
    ("learning_rate", 1e-4, 1e-3, False), ("num_epochs", 3.0, 4.0, False),
    ("model.hidden_dropout_prob", 0.1, 0.0, False), ("best_metric", "f1", "accuracy", False),
    ("seed", 0, 1, False), ("model.dtype", "float32", "bfloat16", False),
])
def test_which_changes_a_resumed_run_may_make(key, old, new, ok):
  assert (workdir_lib.allowed(key, old, new) is None) == ok


def record(workdir, **changes):
  config = {"learning_rate": 1e-4, "total_steps": 10, "log_every": 1,
            "model": {"hidden_size": 8, "hidden_dropout_prob": 0.1}, "mesh_shape": (-1, 1, 1)}
  (workdir / "config.json").write_text(json.dumps(config))
  return {**config, **changes}


def test_settings_refusal_lists_changed_keys_old_and_new(tmp_path):
  new = record(tmp_path, learning_rate=1e-3, total_steps=5, log_every=7)
  with pytest.raises(UserError) as e:
    workdir_lib.Settings(tmp_path, allow_changes=False).check(new)
  message = str(e.value)
  assert "\n" not in message
  assert message.startswith(f"{tmp_path} holds a run trained with other settings: "
                            "learning_rate 0.0001 -> 0.001; total_steps 10 -> 5 (total_steps may "
                            "only grow); resume with the settings in")
  assert "log_every" not in message  # cadence: not a refusal
  assert "--config.allow_changed_settings=True" in message
  # Keys left to a later check are skipped; the override itself is never compared.
  settings = workdir_lib.Settings(tmp_path, allow_changes=False)
  settings.check({**record(tmp_path, total_steps=5), "allow_changed_settings": True},
                 pending=("total_steps",))
  assert settings.changed == {}


def test_long_refusals_are_cut(tmp_path):
  new = record(tmp_path)
  new["model"] = {f"k{i:02d}": [i] * 30 for i in range(20)}
  with pytest.raises(UserError) as e:
    workdir_lib.Settings(tmp_path, allow_changes=False).check(new)
  message = str(e.value)
  # 22 changed keys: hidden_dropout_prob, hidden_size (gone), k00..k19 (new): 6 shown in full.
  # What makes it another run comes first (model.hidden_size), then the rest in order.
  assert message.split(": ", 1)[1].startswith(
      "model.hidden_size 8 -> (absent); model.hidden_dropout_prob 0.1 -> (absent); model.k00")
  assert "; and 16 more: model.k04, model.k05" in message and "model.k13, ...; resume" in message
  assert "model.k00 (absent) -> [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, ...; model.k01" in message
  assert len(message) < 1200


def test_what_makes_another_run_comes_first_with_its_fix(tmp_path):
  """Issue 41: a workdir of another config listed its changed keys alphabetically (the decisive
  objective hidden in "and 5 more") and offered only allow_changed_settings; it names the
  decisive keys first and the fix, a new workdir with init_from (seen failing on dd89774)."""
  new = record(tmp_path, objective="glue", batch_size=64, learning_rate=1e-3, max_seq_length=64,
               masking={"rate": 0.2}, data={"eval_documents": 4}, eval_batches=3)
  (tmp_path / "config.json").write_text(json.dumps({**json.loads(
      (tmp_path / "config.json").read_text()), "objective": "mlm"}))
  with pytest.raises(UserError) as e:
    workdir_lib.Settings(tmp_path, allow_changes=False).check(new)
  message = str(e.value)
  assert message.startswith(f"{tmp_path} holds a run trained with other settings: objective "
                            '"mlm" -> "glue"; '), message
  assert message.endswith(f"as objective makes this another run, to train from its weights, use "
                          f"a new --workdir with --config.init_from={tmp_path}"), message
  assert "allow_changed_settings" not in message
  # Settings of the same run: resume as recorded, a new workdir, or change them anyway.
  with pytest.raises(UserError) as e:
    workdir_lib.Settings(tmp_path, allow_changes=False).check(
        {**new, "objective": "mlm", "batch_size": 8})
  assert (f"; to train from its weights, use a new --workdir with --config.init_from={tmp_path}; "
          "or add --config.allow_changed_settings=True to change them") in str(e.value)


def test_allowed_changes_are_recorded(tmp_path, caplog):
  new = record(tmp_path, learning_rate=1e-3, total_steps=20)
  settings = workdir_lib.Settings(tmp_path, allow_changes=True)
  settings.check(new)
  assert not (tmp_path / "changes.jsonl").exists()  # nothing written by a check
  with caplog.at_level(logging.WARNING):
    settings.record(step=7)
  entry = json.loads((tmp_path / "changes.jsonl").read_text())
  assert entry["step"] == 7 and entry["time"]
  assert entry["changed"] == {"learning_rate": [1e-4, 1e-3], "total_steps": [10, 20]}
  assert entry["forced"] == ["learning_rate"]
  assert "the learning-rate schedule now runs to step 20" in caplog.text


# ---------------------------------------------------------------------------------------------
# Runs: a refused or failed resume changes nothing.

RUN = {"total_steps": 4, "checkpoint_every": 2, "log_every": 1, "eval_every": 2,
       "model.hidden_dropout_prob": 0.1}
# tiny_config's settings, for the same config through launch.py.
TINY_ARGS = ["--config.data.synthetic=True", "--config.model.vocab_size=200",
             "--config.model.hidden_size=32", "--config.model.intermediate_size=64",
             "--config.model.num_attention_heads=2", "--config.model.num_hidden_layers=2",
             "--config.max_seq_length=16", "--config.max_predictions_per_seq=4",
             "--config.tensorboard=False", "--config.async_checkpointing=False"]


def snapshot(workdir: pathlib.Path) -> dict:
  """Every file and folder under `workdir`: bytes and mtime."""
  return {str(p.relative_to(workdir)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
          for p in sorted(workdir.rglob("*"))}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """A tiny pretraining run, finished at step 4 with checkpoints at 2 and 4."""
  workdir = tmp_path_factory.mktemp("finished") / "run"
  train.train_and_evaluate(tiny_config(**RUN), workdir)
  return workdir


@pytest.fixture
def resumable(finished, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(finished, workdir)  # copy2: mtimes kept
  return workdir


def launch(workdir, **changes):
  args = [f"--config.{k}={v}" for k, v in {**RUN, **changes}.items()]
  return run_launch("--config", "configs/quickstart.py:runlocal", "--workdir", str(workdir),
                    *TINY_ARGS, *args)


def assert_refused(r, needle):
  assert r.returncode == 2, r.stderr[-2000:]
  assert "Traceback" not in r.stderr
  errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and needle in errors[0], r.stderr[-2000:]
  return errors[0]


@pytest.mark.slow
@pytest.mark.parametrize("changes, needle", [
    ({"learning_rate": 0.01}, "learning_rate 0.001 -> 0.01"),
    ({"model.hidden_dropout_prob": 0.0}, "model.hidden_dropout_prob 0.1 -> 0.0"),
    ({"total_steps": 3}, "total_steps 4 -> 3 (total_steps may only grow)"),
    ({"eval_every": 0, "total_steps": 8}, "eval_every 2 -> 0 (evaluation cannot be switched"),
    # Past the settings check (asked for), failing later: still nothing written.
    ({"allow_changed_settings": True, "best_mode": "maximum"}, "best_mode='maximum' must be"),
    ({"allow_changed_settings": True, "model.hidden_size": 64}, "holds a different model"),
    # Found from the checkpoint's metadata (adamw's mu/nu, sgd's none), not from orbax's words.
    ({"allow_changed_settings": True, "optimizer.name": "sgd"},
     "holds a different model or optimizer than this config (opt_state/"),
])
def test_refused_or_failed_resume_changes_nothing(resumable, changes, needle):
  before = snapshot(resumable)
  assert {"config.json", "metrics.jsonl", "checkpoints/2", "checkpoints/4"} <= set(before)
  error = assert_refused(launch(resumable, **changes), needle)
  if "allow_changed_settings" not in changes:
    assert "--config.allow_changed_settings=True" in error
  assert snapshot(resumable) == before  # config.json, metrics rows, checkpoints: all as they were


@pytest.mark.slow
def test_longer_run_and_cadence_may_change_and_are_recorded(resumable, caplog):
  metrics = (resumable / "metrics.jsonl").read_bytes()
  with caplog.at_level(logging.INFO):
    summary = train.train_and_evaluate(tiny_config(**{**RUN, "total_steps": 6, "log_every": 2}),
                                       resumable)
  assert summary["step"] == 6
  assert "resumed from the checkpoint at step 4" in caplog.text
  assert "total_steps 4 -> 6: the learning-rate schedule now runs to step 6" in caplog.text
  entry = json.loads((resumable / "changes.jsonl").read_text())
  assert entry["step"] == 4
  assert entry["changed"] == {"log_every": [1, 2], "total_steps": [4, 6]} and entry["forced"] == []
  assert json.loads((resumable / "config.json").read_text())["total_steps"] == 6
  assert (resumable / "metrics.jsonl").read_bytes().startswith(metrics)  # rows appended only


@pytest.mark.slow
def test_forced_change_is_recorded_and_not_the_override(resumable):
  train.train_and_evaluate(tiny_config(**{**RUN, "total_steps": 5, "learning_rate": 0.01,
                                          "allow_changed_settings": True}), resumable)
  entry = json.loads((resumable / "changes.jsonl").read_text())
  assert entry["changed"] == {"learning_rate": [0.001, 0.01], "total_steps": [4, 5]}
  assert entry["forced"] == ["learning_rate"]
  recorded = json.loads((resumable / "config.json").read_text())
  assert recorded["learning_rate"] == 0.01 and "allow_changed_settings" not in recorded
  # The new settings are now the record: the same command resumes without asking.
  train.train_and_evaluate(tiny_config(**{**RUN, "total_steps": 5, "learning_rate": 0.01}),
                           resumable)
  assert len((resumable / "changes.jsonl").read_text().splitlines()) == 1


def conll(path: pathlib.Path, sentences: int, seed: int) -> None:
  words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
           "juliet", "kilo", "lima", "mike", "november", "oscar", "papa"]
  tags = ["O", "B-PER", "I-PER", "B-LOC", "O", "B-ORG", "O", "B-MISC"]
  lines = ["-DOCSTART- -X- -X- O", ""]
  for s in range(sentences):
    for w in range(5):
      i = (s * 7 + w * 3 + seed) % len(words)
      lines.append(f"{words[i]} NN I-NP {tags[i % len(tags)]}")
    lines.append("")
  path.write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_more_epochs_on_a_finetuning_workdir_is_refused(tmp_path):
  """The red team's rerun with more epochs restarted the learning-rate decay (5.7e-7 -> 8.3e-6)."""
  conll(tmp_path / "train.txt", 40, 0)
  conll(tmp_path / "dev.txt", 8, 1)
  settings = {**TINY, "data_dir": str(tmp_path), "train_file": "train.txt", "dev_file": "dev.txt",
              "test_file": "none", "max_train_examples": 0, "batch_size": 8, "max_seq_length": 16,
              "log_every": 1, "num_epochs": 1.0, "data.vocab_size": 40, "model.vocab_size": 40}
  workdir = tmp_path / "run"
  summary = train.train_and_evaluate(load_config("configs/ner.py:runlocal", **settings), workdir)
  recorded = json.loads((workdir / "config.json").read_text())
  assert recorded["num_epochs"] == 1.0 and recorded["total_steps"] == summary["step"] > 1
  before = snapshot(workdir)
  args = [f"--config.{k}={v!r}" if isinstance(v, str) else f"--config.{k}={v}"
          for k, v in {**settings, "num_epochs": 2.0}.items()]
  r = run_launch("--config", "configs/ner.py:runlocal", "--workdir", str(workdir), *args)
  assert_refused(r, "num_epochs 1.0 -> 2.0 (it sets total_steps and the learning-rate schedule; "
                    "to train longer, raise total_steps)")
  assert snapshot(workdir) == before
  # Training longer, said as the issue allows: an extension of total_steps.
  steps = recorded["total_steps"]
  train.train_and_evaluate(load_config("configs/ner.py:runlocal",
                                       **{**settings, "total_steps": steps + 2}), workdir)
  entry = json.loads((workdir / "changes.jsonl").read_text())
  assert entry["step"] == steps and entry["changed"] == {"total_steps": [steps, steps + 2]}
