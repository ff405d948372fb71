"""Writes that fail (a full disk, a quota, a size limit) never destroy a run's record.

Every file bertjax writes into a workdir or an output folder goes through one writer
(`paths.replace_bytes`: a temporary file beside it, flushed, renamed), so a failed write leaves
the old file or none, never a part. The record of a run (config.json, changes.jsonl) is written
once its first step is trained, and a config.json beside no checkpoint binds nothing. The
workdir and output arguments are checked before anything is written.
"""

import errno
import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np

import pytest

from bertjax import convert
from bertjax.core import errors, paths
from bertjax.core.errors import UserError
from bertjax.runtime import checkpoints
from bertjax.trainer import train

from test_train import tiny_config

REPO = pathlib.Path(__file__).resolve().parent.parent
SAMPLE = REPO / "bertjax/data/samples/wikitext2_test.raw"


def disk_full(path):
  return OSError(errno.ENOSPC, "No space left on device", str(path))


# ---------------------------------------------------------------------------------------------
# The writer.


def test_a_failed_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
  target = tmp_path / "config.json"
  paths.replace_text(target, '{"old": 1}')

  def no_space(fd):  # the disk fills while the new file is flushed
    raise disk_full(os.readlink(f"/proc/self/fd/{fd}"))

  monkeypatch.setattr(os, "fsync", no_space)
  with pytest.raises(errors.DiskFull) as e:
    paths.replace_text(target, json.dumps({"new": "x" * 3000}))
  message = str(e.value)
  assert "\n" not in message and f"cannot write {target}" in message
  assert "no space is left on the device (2.9 KiB being written)" in message
  assert "free space there" in message
  assert json.loads(target.read_text()) == {"old": 1}
  assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]  # no temporary left


def test_a_size_limit_is_one_line_and_the_old_file_stays(tmp_path):
  """A real failing write: the file-size limit (EFBIG) in a child process."""
  target = tmp_path / "summary.json"
  target.write_text('{"step": 4}')
  code = ("import sys; from bertjax.core import paths, errors\n"
          "errors.run_cli(lambda: paths.replace_text(paths.as_path(sys.argv[1]), 'x' * 100000))")
  r = subprocess.run(_size_limited(4096, [sys.executable, "-c", code, str(target)]), cwd=REPO,
                     capture_output=True, text=True, timeout=120,
                     env=dict(os.environ, PYTHONPATH=str(REPO)))
  assert r.returncode == errors.EXIT_USER_ERROR, r.stderr
  assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
  assert f"cannot write {target}: the file is larger than the file-size limit" in r.stderr
  assert target.read_text() == '{"step": 4}'
  assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


@pytest.mark.parametrize("worded", [False, True])
def test_a_disk_error_inside_a_library_is_one_line(capsys, worded):
  """A library's own writer (orbax, ArrayRecord) meeting a full disk, as an OSError or only in
  words (tensorstore): one line naming the file."""
  def save():
    if worded:
      raise ValueError('RESOURCE_EXHAUSTED: Error writing "/runs/a/checkpoints/4/state": '
                       'No space left on device [OS error 28]')
    try:
      raise disk_full("/runs/a/checkpoints/4/state")
    except OSError as e:
      raise RuntimeError("save failed") from e

  with pytest.raises(SystemExit) as e:
    errors.run_cli(save)
  assert e.value.code == errors.EXIT_USER_ERROR
  err = capsys.readouterr().err
  assert err.startswith("error: cannot write /runs/a/checkpoints/4/state: no space is left")
  assert err.count("\n") == 1


def _size_limited(nbytes: int, argv: list[str]) -> list[str]:
  """`argv` run under a file-size limit of `nbytes` (a write past it fails with EFBIG)."""
  code = ("import os, resource, signal, sys\n"
          "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not a killed process\n"
          "n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))\n"
          "os.execv(sys.argv[2], sys.argv[2:])")
  return [sys.executable, "-c", code, str(nbytes), *argv]


def test_prediction_files_are_written_whole(tmp_path, monkeypatch):
  """GLUE's leaderboard file and CoNLL's predictions: a failed rewrite keeps the previous one."""
  from bertjax.metrics import glue, ner
  tsv, conll = tmp_path / "RTE.tsv", tmp_path / "ner.txt"
  glue.write_predictions_tsv(tsv, np.array([0, 1]), "rte")
  ner.write_ner_predictions(conll, [["EU", "rejects"]], [["B-ORG", "O"]])
  before = tsv.read_text(), conll.read_text()

  def no_space(fd):
    raise disk_full(os.readlink(f"/proc/self/fd/{fd}"))

  monkeypatch.setattr(os, "fsync", no_space)
  with pytest.raises(errors.DiskFull, match="RTE.tsv"):
    glue.write_predictions_tsv(tsv, np.array([1, 1, 0]), "rte")
  with pytest.raises(errors.DiskFull, match="ner.txt"):
    ner.write_ner_predictions(conll, [["Peter"]], [["B-PER"]])
  assert (tsv.read_text(), conll.read_text()) == before
  assert sorted(p.name for p in tmp_path.iterdir()) == ["RTE.tsv", "ner.txt"]


# ---------------------------------------------------------------------------------------------
# Defect 3: the workdir argument is checked before anything is written.


@pytest.mark.parametrize("folder, needle", [
    ("", "--workdir is empty (an unset shell variable?)"),
    ("  ", "--workdir is empty"),
    ("/", "is the filesystem root"),
    ("~", "is your home folder"),
    (str(REPO), "is this repository's folder"),
    (str(REPO / "bertjax"), "inside this repository's bertjax/ folder"),
    (str(REPO / "configs" / "runs" / "x"), "inside this repository's configs/ folder"),
    ("gs://", "names no bucket or folder"),
])
def test_workdirs_that_cannot_be_meant_are_refused(folder, needle):
  with pytest.raises(UserError, match=needle.replace("(", r"\(").replace(")", r"\)").replace(
      "?", r"\?")):
    paths.check_output_folder(folder)


def test_a_runs_folder_inside_the_repository_is_accepted():
  paths.check_output_folder(str(REPO / "runs" / "my_run"))  # the README's own examples


def test_empty_workdir_trains_nowhere(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(UserError, match="--workdir is empty"):
    train.train_and_evaluate(tiny_config(total_steps=2), "")
  a_file = tmp_path / "notes.txt"
  a_file.write_text("mine")
  with pytest.raises(UserError, match="is a file, not a folder"):
    train.train_and_evaluate(tiny_config(total_steps=2), str(a_file))
  assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("module, args", [
    ("bertjax.data.prepare", ["--input", str(SAMPLE), "--train_tokenizer", "100", "--output", ""]),
    ("bertjax.data.tokenizers", ["train", "--input", str(SAMPLE), "--vocab_size", "100",
                                 "--output", ""]),
    ("bertjax.convert", ["to-hf", "--workdir", "x", "--output", ""]),
    ("bertjax.prune", ["--workdir", "x", "--output", "", "--target-heads", "0.5"]),
])
def test_every_command_refuses_an_empty_output(module, args, tmp_path, monkeypatch):
  import importlib
  main = importlib.import_module(module + ".__main__" if module in (
      "bertjax.data.tokenizers", "bertjax.convert", "bertjax.prune") else module).main
  monkeypatch.chdir(tmp_path)
  with pytest.raises(UserError, match="--output is empty"):
    main(args)
  assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_launch_with_an_empty_workdir_exits_with_one_line(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  r = subprocess.run([sys.executable, str(REPO / "launch.py"), "--config",
                      str(REPO / "configs/quickstart.py:runlocal"), "--workdir", "",
                      "--config.data.synthetic=True"], cwd=tmp_path, env=env,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == errors.EXIT_USER_ERROR, r.stderr[-2000:]
  assert r.stderr.strip().splitlines()[-1].startswith("error: --workdir is empty")
  assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------
# Defect 7: a run failing before its first step blocks no fix.

RUN = {"total_steps": 4, "checkpoint_every": 2, "log_every": 1, "eval_every": 2}


def _fail_first_step(monkeypatch):
  """The first train step fails (as an out-of-memory compile would)."""
  real = train.setup

  def setup(*args, **kwargs):
    run, state = real(*args, **kwargs)

    def step(*a):
      raise RuntimeError("RESOURCE_EXHAUSTED: out of memory while compiling the step")
    run.train_step = step
    return run, state

  monkeypatch.setattr(train, "setup", setup)
  monkeypatch.setattr(train, "check_step_memory", lambda *a: "")  # it would compile `step`


@pytest.mark.slow
def test_a_run_failing_before_its_first_step_blocks_no_fix(tmp_path, monkeypatch):
  workdir = tmp_path / "run"
  with monkeypatch.context() as m:
    _fail_first_step(m)
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
      train.train_and_evaluate(tiny_config(**{**RUN, "batch_size": 16}), workdir)
  assert not (workdir / "config.json").exists()
  # The fix: a smaller batch. Nothing was trained, so nothing is refused.
  summary = train.train_and_evaluate(tiny_config(**{**RUN, "batch_size": 8}), workdir)
  assert summary["step"] == 4
  assert json.loads((workdir / "config.json").read_text())["batch_size"] == 8
  assert not (workdir / "changes.jsonl").exists()


@pytest.mark.slow
def test_a_record_beside_no_checkpoint_binds_nothing(tmp_path, caplog):
  """A run that trained a step but saved no checkpoint (killed): its config.json records nothing
  a run resumes."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps({"batch_size": 16, "learning_rate": 0.5}))
  summary = train.train_and_evaluate(tiny_config(**{**RUN, "total_steps": 2}), workdir)
  assert summary["step"] == 2
  assert "records a run that saved no checkpoint" in caplog.text
  assert json.loads((workdir / "config.json").read_text())["batch_size"] == 8


@pytest.mark.slow
def test_a_forced_change_failing_before_its_first_step_keeps_the_record(tmp_path, monkeypatch):
  workdir = tmp_path / "run"
  train.train_and_evaluate(tiny_config(**RUN), workdir)
  before = (workdir / "config.json").read_bytes()
  with monkeypatch.context() as m:
    _fail_first_step(m)
    with pytest.raises(RuntimeError):
      train.train_and_evaluate(tiny_config(**{**RUN, "total_steps": 6, "learning_rate": 0.01,
                                              "allow_changed_settings": True}), workdir)
  assert (workdir / "config.json").read_bytes() == before
  assert not (workdir / "changes.jsonl").exists()
  # The original command still resumes.
  assert train.train_and_evaluate(tiny_config(**{**RUN, "total_steps": 6}), workdir)["step"] == 6


# ---------------------------------------------------------------------------------------------
# Defect 1: a write failing on resume leaves a workdir that resumes and exports.


@pytest.mark.slow
def test_a_size_limit_on_resume_keeps_config_json(tmp_path):
  workdir = tmp_path / "run"
  train.train_and_evaluate(tiny_config(**RUN), workdir)
  record = (workdir / "config.json").read_bytes()
  args = [sys.executable, str(REPO / "launch.py"), "--config",
          str(REPO / "configs/quickstart.py:runlocal"), "--workdir", str(workdir),
          *[f"--config.{k}={v}" for k, v in {**RUN, "total_steps": 6}.items()],
          "--config.data.synthetic=True", "--config.model.vocab_size=200",
          "--config.model.hidden_size=32", "--config.model.intermediate_size=64",
          "--config.model.num_attention_heads=2", "--config.model.num_hidden_layers=2",
          "--config.max_seq_length=16", "--config.max_predictions_per_seq=4",
          "--config.tensorboard=False", "--config.async_checkpointing=False"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  r = subprocess.run(_size_limited(len(record) // 2, args), cwd=REPO, env=env,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode != 0
  assert "Traceback" not in r.stderr, r.stderr[-3000:]
  assert "error: cannot write" in r.stderr and "file-size limit" in r.stderr, r.stderr[-3000:]
  assert (workdir / "config.json").read_bytes() == record
  # It resumes (the settings check reads config.json) and exports.
  summary = train.train_and_evaluate(tiny_config(**{**RUN, "total_steps": 6}), workdir)
  assert summary["step"] == 6
  convert.convert_to_hf(workdir, tmp_path / "hf", log=lambda line: None)
  assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "bert"


# ---------------------------------------------------------------------------------------------
# Every write of a run fails in turn; the run resumes each time and ends where an uninterrupted
# run ends.

FAULT_RUN = {**RUN, "data.synthetic": False, "data.vocab_size": 120, "model.vocab_size": 120,
             "max_seq_length": 32, "max_predictions_per_seq": 5, "data.eval_documents": 4,
             "data.eval_batches": 1, "best_metric": "loss", "best_mode": "min"}


def _tmp_of(name: str):
  """Matches the temporary file `paths.replace_bytes` writes for a file called `name`."""
  return lambda path: path.name.startswith(f".{name}.") and path.name.endswith(".tmp")


# In the order a run meets them: (what, where it fails, the n-th such write). The first five
# fail before any checkpoint (a new run starts over); the checkpoint fails at step 4 (the next
# run resumes from step 2); summary.json at the very end (the next run only writes it).
FAULTS = [
    ("prepared corpus", _tmp_of("meta.json"), 1),
    ("tokenizer", lambda p: p.parent.name.startswith(".tokenizer.partial"), 1),
    ("config", _tmp_of("config.json"), 1),
    ("metrics", None, 1),
    ("best", _tmp_of("best.json"), 1),
    ("checkpoint", None, 2),
    ("summary", _tmp_of("summary.json"), 1),
]


def _inject(monkeypatch, what, matches, nth):
  """Makes the `nth` write of `what` fail with a full disk, part of it written."""
  seen = []
  if what == "metrics":  # appended: half a row lands, then the disk is full
    real = paths.append_text

    def append_text(path, text):
      if path.name == "metrics.jsonl" and len(seen) + 1 == nth:
        seen.append(path)
        with paths.disk_errors(path, len(text)):
          real(path, text[:len(text) // 2])
          raise disk_full(path)
      real(path, text)
    monkeypatch.setattr(paths, "append_text", append_text)
  elif what == "checkpoint":
    real_save = checkpoints.Checkpointer.save

    def save(self, step, *args, **kwargs):
      seen.append(step)
      if len(seen) == nth:
        raise disk_full(self.directory / str(step))
      return real_save(self, step, *args, **kwargs)
    monkeypatch.setattr(checkpoints.Checkpointer, "save", save)
  else:
    real_fsync = os.fsync

    def fsync(fd):  # the data is in the temporary file; the disk fills as it is flushed
      path = pathlib.Path(os.readlink(f"/proc/self/fd/{fd}"))
      if matches(path):
        seen.append(path)
        if len(seen) == nth:
          raise disk_full(path)
      real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
  return seen


def _run(config, workdir, capsys):
  """Runs as the command line does: (exit status, stderr)."""
  capsys.readouterr()
  try:
    errors.run_cli(lambda: train.train_and_evaluate(config, workdir))
    code = 0
  except SystemExit as e:
    code = e.code
  return code, capsys.readouterr().err


def _assert_whole(workdir: pathlib.Path):
  """Nothing half-written: no temporary file or folder, every JSON file whole."""
  leftovers = [p for p in workdir.rglob(".*") if p.name != ".bertjax-listing.json"]
  assert not leftovers, leftovers
  for name in ("config.json", "summary.json", "best/best.json", "prepared/meta.json",
               "tokenizer/tokenizer_config.json"):
    if (workdir / name).exists():
      json.loads((workdir / name).read_text())


@pytest.mark.slow
def test_each_write_failing_in_turn_then_resuming_ends_as_an_uninterrupted_run(
    tmp_path, monkeypatch, capsys):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("".join(SAMPLE.read_text().splitlines(keepends=True)[:1000]))
  config = lambda: tiny_config(**{**FAULT_RUN, "data.corpus": str(corpus)})
  expected = train.train_and_evaluate(config(), tmp_path / "uninterrupted")
  assert expected["step"] == 4
  workdir = tmp_path / "run"
  for what, matches, nth in FAULTS:
    with monkeypatch.context() as m:
      seen = _inject(m, what, matches, nth)
      code, err = _run(config(), workdir, capsys)
    assert len(seen) == nth, what
    assert code == errors.EXIT_USER_ERROR, (what, err[-2000:])
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, (what, err[-2000:])
    # The workdir's files and orbax's saves each say so in their own words, naming the path.
    assert "no space" in lines[0] and str(workdir) in lines[0], lines
    _assert_whole(workdir)
    if what == "checkpoint":  # the older checkpoint is kept: the next run resumes from it
      assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["2"]
  code, err = _run(config(), workdir, capsys)
  assert code == 0, err[-2000:]
  assert json.loads((workdir / "summary.json").read_text())["step"] == 4
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4]
  for a, b in zip(jax.tree.leaves(checkpoints.restore_params(tmp_path / "uninterrupted")),
                  jax.tree.leaves(checkpoints.restore_params(workdir)), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  convert.convert_to_hf(workdir, tmp_path / "hf", log=lambda line: None)  # and it exports
  assert (tmp_path / "hf" / "model.safetensors").is_file()
