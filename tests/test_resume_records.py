"""What a resume trusts (issue 41, defects 14, 18 and 19's config.json): a checkpoint without its
digest where the run's others have one is damage; a config.json deleted beside checkpoints is
stood in for by the settings each checkpoint saves (or, for checkpoints without them, the resume
says so and changes.jsonl records it); a config.json that is not a JSON object is one line."""

import json
import logging
import pathlib
import shutil

import pytest

import bertjax
from bertjax.core import digests, paths
from bertjax.core.errors import UserError
from bertjax.runtime import checkpoints
from bertjax.trainer import train
from tests.test_checkpoint_integrity import _flip_array_bytes
from tests.test_train import tiny_config

KW = {"checkpoint_every": 2, "eval_every": 0, "log_every": 1, "total_steps": 4}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A tiny pretraining run with checkpoints at steps 2 and 4 (each with its digest)."""
  workdir = tmp_path_factory.mktemp("trained") / "run"
  train.train_and_evaluate(tiny_config(**KW), workdir)
  return workdir


@pytest.fixture
def run(trained, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(trained, workdir)
  return workdir


def _snapshot(folder: pathlib.Path) -> dict[str, bytes]:
  return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
          if p.is_file()}


def _messages(caplog, needle):
  return [r.getMessage() for r in caplog.records if needle in r.getMessage()]


# ---------------------------------------------------------------------------------------------
# Defect 14: a missing digest where the run's other checkpoints carry one.


def test_a_deleted_digest_with_changed_bytes_is_damage_to_every_reader(run, caplog):
  """The newest checkpoint's digest.json deleted and a byte of its arrays changed. dd89774 read
  it "unchecked" (a warning) and loaded and trained on the changed parameters (seen failing
  there). Now: `bertjax.load` takes step 2 with one line naming the missing digest, `--step 4`
  is refused in one line, and the resume moves step 4 aside and goes on from step 2."""
  (run / "checkpoints/4" / digests.DIGEST).unlink()
  _flip_array_bytes(run / "checkpoints/4")
  caplog.set_level(logging.WARNING)
  assert bertjax.load(run).source.step == 2
  lines = _messages(caplog, "checkpoint at step 4 is unreadable")
  assert len(lines) == 1 and "its digest.json is missing (the run's other checkpoint 2 has " \
      "one)" in lines[0], lines
  assert not _messages(caplog, "read unchecked")
  with pytest.raises(UserError) as e:
    bertjax.load(run, step=4)
  assert "\n" not in str(e.value) and str(e.value).startswith(
      f"--step 4: the checkpoint at {run / 'checkpoints/4'} is damaged (its digest.json is "
      "missing")
  assert "readable steps: 2" in str(e.value)

  caplog.clear()
  summary = train.train_and_evaluate(tiny_config(**{**KW, "total_steps": 6}), run)
  assert summary["step"] == 6
  lines = _messages(caplog, "step 4 is unreadable")
  assert len(lines) == 1 and "digest.json is missing" in lines[0] and "used step 2" in lines[0]
  assert [p.name.split("-")[1] for p in (run / "checkpoints").glob("damaged-*")] == ["4"]


def test_checkpoints_that_all_lack_a_digest_are_read_unchecked(run, caplog):
  """What stays as it was: a run saved before digests (none has one) loads its newest step, with
  one warning."""
  for step in (2, 4):
    (run / "checkpoints" / str(step) / digests.DIGEST).unlink()
  caplog.set_level(logging.WARNING)
  assert bertjax.load(run).source.step == 4
  assert len(_messages(caplog, "its arrays are read unchecked")) == 1


# ---------------------------------------------------------------------------------------------
# Defect 18: config.json deleted beside checkpoints.


def test_a_deleted_config_json_is_stood_in_for_by_the_checkpoints_settings(run, caplog):
  """config.json deleted, then a resume with a learning rate 500 times higher. dd89774 accepted
  it without a word or a changes.jsonl line (seen failing there). Now the settings saved with the
  newest checkpoint are compared: the change is refused in one line naming them, and the workdir
  is left as it was; the same command with the trained settings resumes and writes config.json
  back."""
  (run / "config.json").unlink()
  before = _snapshot(run)
  caplog.set_level(logging.WARNING)
  lr = tiny_config().learning_rate
  with pytest.raises(UserError) as e:
    train.train_and_evaluate(tiny_config(**{**KW, "total_steps": 6, "learning_rate": lr * 500}),
                             run)
  message = str(e.value)
  assert "\n" not in message
  assert f"learning_rate {json.dumps(lr)} -> {json.dumps(lr * 500)}" in message, message
  assert "resume with the settings saved with the checkpoint at step 4 (its config.json is gone)" \
      in message
  assert _messages(caplog, "config.json is missing: this run's settings are compared with those "
                           "saved with the checkpoint at step 4")
  assert _snapshot(run) == before

  summary = train.train_and_evaluate(tiny_config(**{**KW, "total_steps": 6}), run)
  assert summary["step"] == 6
  assert json.loads((run / "config.json").read_text())["learning_rate"] == lr
  changes = [json.loads(l) for l in (run / "changes.jsonl").read_text().splitlines()]
  assert [c["changed"] for c in changes] == [{"total_steps": [4, 6]}]


def test_without_saved_settings_the_resume_says_it_compared_nothing(run, caplog):
  """Checkpoints of a bertjax that saved no settings with them (their `config` item removed, the
  digests rewritten) and config.json deleted: the resume with a changed learning rate goes on,
  but says in one line that nothing could be compared, and changes.jsonl records it."""
  for step in (2, 4):
    shutil.rmtree(run / "checkpoints" / str(step) / "config", ignore_errors=True)
    digests.write(paths.as_path(run / "checkpoints" / str(step)))
  (run / "config.json").unlink()
  caplog.set_level(logging.WARNING)
  lr = tiny_config().learning_rate
  summary = train.train_and_evaluate(
      tiny_config(**{**KW, "total_steps": 6, "learning_rate": lr * 500}), run)
  assert summary["step"] == 6
  lines = _messages(caplog, "config.json is missing and the checkpoints hold no copy")
  assert len(lines) == 1 and "unchecked" in lines[0], lines
  changes = [json.loads(l) for l in (run / "changes.jsonl").read_text().splitlines()]
  assert len(changes) == 1 and changes[0]["step"] == 4 and changes[0]["changed"] == {}
  assert "could not be compared" in changes[0]["unchecked"]


def test_each_checkpoint_saves_the_settings_config_json_records(trained):
  step, record = checkpoints.saved_record(trained / "checkpoints")
  assert step == 4
  assert record == json.loads((trained / "config.json").read_text())


# ---------------------------------------------------------------------------------------------
# Defect 19 (part): a config.json that is not a JSON object.


@pytest.mark.parametrize("text", ["[1, 2]", '"config"', "null"])
def test_a_config_json_that_is_not_an_object_is_one_line(run, text):
  """dd89774: `TypeError: pop expected at most 1 argument` (a traceback) for a list (seen
  failing there)."""
  (run / "config.json").write_text(text)
  before = _snapshot(run)
  with pytest.raises(UserError) as e:
    train.train_and_evaluate(tiny_config(**{**KW, "total_steps": 6}), run)
  kind = {"[": "list", '"': "string", "n": "null"}[text[0]]
  assert str(e.value) == (
      f"{run / 'config.json'} is not a run record (a JSON {kind}, not an object); restore it, "
      "move it away (the settings saved with the checkpoints are then compared), or use another "
      "--workdir")
  assert _snapshot(run) == before
