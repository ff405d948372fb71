"""SIGTERM at each point of a run, sent by the run itself at that point (a patched function calls
`os.kill(os.getpid(), SIGTERM)` and goes on): importing the libraries, loading the config,
starting (tokenizer training, corpus preparation, compiling, restoring), the final checkpoint
save, the evaluation after the last step, a best/ save and a fine-tuning task's prediction pass.
Each ends with exit 75 and one line through `launch.main` under `errors.run_cli`, leaves nothing
half-written, and the same command run again ends where an uninterrupted run ends."""

import json
import os
import pathlib
import random
import signal
import subprocess
import sys

import jax
import numpy as np

import pytest

import launch
from bertjax.core import command_line, digests, errors
from bertjax.data import prepare, tokenizers
from bertjax.evaluators.context import EvalContext
from bertjax.evaluators.metric_sums import MetricSums
from bertjax.runtime import checkpoints, metric_writers, run_record
from bertjax.trainer import train

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from helpers import TINY  # pylint: disable=wrong-import-position
from test_train import tiny_config  # pylint: disable=wrong-import-position

# test_train.tiny_config's settings, as a command line gives them.
TINY_ARGS = {"data.synthetic": True, "model.vocab_size": 200, "model.hidden_size": 32,
             "model.intermediate_size": 64, "model.num_attention_heads": 2,
             "model.num_hidden_layers": 2, "max_seq_length": 16, "max_predictions_per_seq": 4,
             "tensorboard": False, "async_checkpointing": False}
# 5 steps, evaluated every 2: the evaluation of step 5 comes after the loop.
KW = {"total_steps": 5, "eval_every": 2, "checkpoint_every": 2, "log_every": 1,
      "model.hidden_dropout_prob": 0.1}


@pytest.fixture(autouse=True)
def sigterm_without_a_handler_fails(monkeypatch):
  """Where the run installs no handler, SIGTERM would kill this pytest process (the default
  action): raise instead, so the test fails naming it. launch.py's logging set-up is left out."""
  def default(signum, frame):
    raise RuntimeError("SIGTERM met no handler of the run: the process would have been killed")
  previous = signal.signal(signal.SIGTERM, default)
  monkeypatch.setattr(launch, "configure_logging", lambda: None)
  yield
  signal.signal(signal.SIGTERM, previous)


def _term_in(mp, owner, name, when=lambda *args: True, after=False, signum=signal.SIGTERM):
  """`owner.name` sends SIGTERM (or `signum`) to this process once (the first call where
  `when(*args)`), before its work or `after` it, and otherwise does what it did. Returns the
  calls that sent."""
  original = getattr(owner, name)
  sent = []

  def wrapped(*args, **kwargs):
    now = not sent and when(*args)
    if now and not after:
      sent.append(args)
      os.kill(os.getpid(), signum)
    out = original(*args, **kwargs)
    if now and after:
      sent.append(args)
      os.kill(os.getpid(), signum)
    return out

  mp.setattr(owner, name, wrapped)
  return sent


def _launch(capsys, workdir, settings, config="configs/quickstart.py:runlocal"):
  """launch.main under errors.run_cli: (exit status, stderr's lines). Progress lines are there
  too; the ending lines (errors.run_cli's, a traceback's, launch.py's after a SIGTERM) are
  `_ending`."""
  argv = ["--config", str(REPO / config), "--workdir", str(workdir),
          *[f"--config.{k}={v}" for k, v in settings.items()]]
  capsys.readouterr()
  code = 0
  try:
    errors.run_cli(lambda: launch.main(argv))
  except SystemExit as e:
    code = e.code
  err = capsys.readouterr().err
  return code, [line for line in err.splitlines() if line.strip()]


def _params(workdir, step):
  return jax.tree.leaves(checkpoints.restore_checkpoint_params(workdir, step)[1])


def _assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _rerun_ends_as(capsys, workdir, reference) -> None:
  """The same command again finishes, with the uninterrupted run's evaluations and step 5's
  parameters."""
  code, lines = _launch(capsys, workdir, {**TINY_ARGS, **KW})
  _finished(code, lines)
  assert _evals(workdir) == _evals(reference)
  _assert_same(_params(reference, 5), _params(workdir, 5))


def _evals(workdir):
  return {r["step"]: r for r in metric_writers.read_metrics(workdir) if r["split"] == "eval"}


def _ending(lines):
  return [line for line in lines if line.startswith(("preempted", "error", "Traceback"))]


def _preempted(code, lines, *words):
  """Exit 75 with one line, stderr's last: where the run stopped and how to go on."""
  assert code == errors.EXIT_PREEMPTED, lines[-20:]
  assert _ending(lines) == lines[-1:] and lines[-1].startswith("preempted: SIGTERM "), lines[-20:]
  assert "run the same command again to go on" in lines[-1]
  for w in words:
    assert w in lines[-1], lines[-1]


def _finished(code, lines):
  assert code == 0 and _ending(lines) == [], lines[-20:]


def test_sigterm_while_loading_the_config(tmp_path, capsys):
  """Before anything is read or written: exit 75, one line, an untouched output folder."""
  with pytest.MonkeyPatch.context() as mp:
    _term_in(mp, command_line.OneLineConfigErrors, "parse")  # config_flags' loading of --config
    code, lines = _launch(capsys, tmp_path / "run", {**TINY_ARGS, **KW})
  _preempted(code, lines, "while loading the config")
  assert not (tmp_path / "run").exists()


# launch.py run as a command, sending SIGTERM to itself as it begins to import JAX.
WHILE_IMPORTING = """
import builtins, os, runpy, signal, sys
real_import = builtins.__import__
def sigterm_at_jax(name, *args, **kwargs):
  if name == "jax" and not sys.modules.get("jax"):
    os.kill(os.getpid(), signal.SIGTERM)
  return real_import(name, *args, **kwargs)
builtins.__import__ = sigterm_at_jax
sys.argv = ["launch.py", "--config", "configs/quickstart.py:runlocal", "--workdir", sys.argv[1]]
runpy.run_path("launch.py", run_name="__main__")
"""


def test_sigterm_while_launch_imports_its_libraries(tmp_path):
  """Before main installs the run's handler (importing JAX takes seconds): exit 75, one line,
  nothing written."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  run = subprocess.run([sys.executable, "-c", WHILE_IMPORTING, str(tmp_path / "run")], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=300)
  assert run.returncode == errors.EXIT_PREEMPTED, run.stderr[-2000:]
  assert run.stderr.strip().splitlines() == [
      "preempted: SIGTERM while loading the libraries (nothing was written); run the same "
      "command again to go on"]
  assert not (tmp_path / "run").exists()


# launch.py run as a command, a SIGTERM coming as the process exits: the last exit hook (registered
# first), after JAX's shutdown, sends it, as a launcher stopping the others once one process has
# ended does.
AS_IT_EXITS = """
import atexit, os, runpy, signal, sys, time
def sigterm_while_exiting():
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(0.5)  # a Python handler runs here, the default action kills here
  print("exit hook done", file=sys.stderr, flush=True)
atexit.register(sigterm_while_exiting)
sys.argv = ["launch.py", "--config", "configs/quickstart.py:runlocal", *sys.argv[1:]]
runpy.run_path("launch.py", run_name="__main__")
"""


def test_sigterm_as_the_process_exits_keeps_the_runs_status(tmp_path):
  """A run that has ended is not changed by a SIGTERM while its process exits: its own status,
  nothing more printed. (The handler restored at the end had been the one for a run that never
  started: "while loading the libraries", exit 75 after a finished run. Python's finalization then
  resets such a handler to the default action, which kills: in a run of two processes, the one a
  launcher stopped once the other had ended was seen ending by signal 15 instead of 75.)"""
  args = [f"--config.{k}={v}" for k, v in {**TINY_ARGS, "total_steps": 2}.items()]
  command = [sys.executable, "-c", AS_IT_EXITS, "--workdir", str(tmp_path / "run"), *args]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  lines = run.stderr.strip().splitlines()
  assert lines[-1] == "exit hook done", lines[-20:]
  assert run.returncode == 0 and _ending(lines) == [], lines[-20:]
  assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "finished"


# launch.py as its process runs it, sent SIGTERM while XLA compiles the model's initialization
# (`jit_init`, seconds on a CPU): 0.05 s into that compilation, from a thread; SIGNAL names the
# signal.
WHILE_COMPILING = """
import os, runpy, signal, sys, threading
from jax._src import compiler
original, sent = compiler.backend_compile_and_load, threading.Event()
def send():
  os.kill(os.getpid(), int(os.environ["SIGNAL"]))
  sent.set()
def compiling(backend, module, *args, **kwargs):
  if "jit_init" not in str(module.operation.attributes["sym_name"]):
    return original(backend, module, *args, **kwargs)
  threading.Timer(0.05, send).start()
  try:
    return original(backend, module, *args, **kwargs)
  finally:
    print("signal sent while compiling" if sent.is_set() else "compiled before the signal",
          file=sys.stderr, flush=True)
compiler.backend_compile_and_load = compiling
sys.argv = ["launch.py", "--config", "configs/quickstart.py:runlocal", *sys.argv[1:]]
runpy.run_path("launch.py", run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_xla_compiles_stops_the_run_with_its_line(tmp_path, signum):
  """jaxlib checks for signals while XLA compiles, so the run's handler ran inside the
  compilation, and the `Preempted` it raised ended the wait but not the compilation: XLA's
  threads went on with what the unwinding freed, and the process crashed (9e59c5e: exit -11
  after the run's line, 8 times in 8 here). The handler now puts the signal off until JAX's
  code has returned (preemption.inside_jax): exit 75, the one line last, no checkpoint. Ctrl-C
  likewise (exit 130), its signal sent again not taken for a second Ctrl-C."""
  args = [f"--config.{k}={v}" for k, v in {**TINY_ARGS, "total_steps": 2}.items()]
  command = [sys.executable, "-c", WHILE_COMPILING, "--workdir", str(tmp_path / "run"), *args]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO),
             JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"),  # empty: the step is compiled
             SIGNAL=str(int(signum)))
  run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  lines = run.stderr.strip().splitlines()
  assert "signal sent while compiling" in lines, lines[-20:]
  if signum == signal.SIGTERM:
    _preempted(run.returncode, lines, "while starting")
  else:
    assert run.returncode == errors.EXIT_INTERRUPTED, lines[-20:]
    assert _ending(lines) == [] and lines[-1].startswith("interrupted: Ctrl-C while starting"), (
        lines[-20:])
  assert not (tmp_path / "run" / "checkpoints").exists() or not any(
      (tmp_path / "run" / "checkpoints").iterdir())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The uninterrupted run the stopped ones are compared with."""
  workdir = tmp_path_factory.mktemp("reference")
  train.train_and_evaluate(tiny_config(**KW), workdir)
  return workdir


@pytest.mark.slow
@pytest.mark.parametrize("point", ["setup", "restore"])
def test_sigterm_while_starting(tmp_path, capsys, reference, point):
  """Compiling and initializing the model, or restoring the latest checkpoint of a run stopped
  at step 2: exit 75, one line, no checkpoint added or set aside, the lock released; run again,
  the run ends with the uninterrupted run's parameters."""
  workdir = tmp_path / "run"
  if point == "restore":  # stopped in step 2's save: a checkpoint at step 2
    with pytest.MonkeyPatch.context() as mp:
      _term_in(mp, checkpoints.Checkpointer, "save", when=lambda self, step, *a: step == 2)
      assert _launch(capsys, workdir, {**TINY_ARGS, **KW})[0] == errors.EXIT_PREEMPTED
  # restore: inside the loop over checkpoints that sets a damaged one aside and tries the next
  owner, name = {"setup": (train, "setup"), "restore": (digests, "verify")}[point]
  with pytest.MonkeyPatch.context() as mp:
    sent = _term_in(mp, owner, name)
    code, lines = _launch(capsys, workdir, {**TINY_ARGS, **KW})
  assert sent
  _preempted(code, lines, "while starting")
  steps = checkpoints.Checkpointer(workdir / "checkpoints").all_steps()
  assert steps == ([2] if point == "restore" else [])
  assert not list(workdir.glob("checkpoints/damaged-*"))
  assert not (workdir / "lock").exists()
  code, lines = _launch(capsys, workdir, {**TINY_ARGS, **KW})
  _finished(code, lines)
  _assert_same(_params(reference, 5), _params(workdir, 5))


@pytest.mark.slow
@pytest.mark.parametrize("point", ["tokenizer", "corpus"])
def test_sigterm_while_preparing_the_corpus(tmp_path, capsys, point):
  """Raw text is given: SIGTERM once the tokenizer is trained (nothing written yet), or once the
  corpus is written into its staging folder (not yet moved into place). Exit 75, one line, and
  neither a corpus, a tokenizer nor a staging folder is left; run again, the run starts afresh
  and finishes."""
  text = tmp_path / "corpus.txt"
  lines = (REPO / "bertjax/data/samples/wikitext2_test.raw").read_text().splitlines()[:400]
  text.write_text("\n".join(lines) + "\n")
  settings = {**TINY_ARGS, **KW, "data.synthetic": False, "data.corpus": str(text),
              "data.format": "wikitext", "data.vocab_size": 200, "total_steps": 2, "eval_every": 0}
  owner, name = {"tokenizer": (tokenizers, "train_sentencepiece"),
                 "corpus": (prepare, "_prepare_into")}[point]
  workdir = tmp_path / "run"
  with pytest.MonkeyPatch.context() as mp:
    sent = _term_in(mp, owner, name, after=True)
    code, out = _launch(capsys, workdir, settings)
  assert sent
  _preempted(code, out, "while starting")
  assert sorted(p.name for p in workdir.iterdir()) == []  # no prepared/, tokenizer/, lock
  code, out = _launch(capsys, workdir, settings)
  _finished(code, out)
  assert (workdir / "prepared" / "meta.json").is_file()
  assert checkpoints.Checkpointer(workdir / "checkpoints").all_steps() == [2]


@pytest.mark.slow
def test_sigterm_during_the_final_evaluation(tmp_path, capsys, reference):
  """The evaluation of step 5 runs after the loop (5 is not a multiple of eval_every): it is
  dropped, step 5's checkpoint is kept; run again, step 5 is evaluated as the uninterrupted run
  evaluated it, with its parameters."""
  workdir = tmp_path / "run"
  with pytest.MonkeyPatch.context() as mp:
    _term_in(mp, MetricSums, "run", when=lambda self, params, step: step == 5)
    code, lines = _launch(capsys, workdir, {**TINY_ARGS, **KW})
  _preempted(code, lines, "while evaluating step 5 after the last step")
  assert checkpoints.Checkpointer(workdir / "checkpoints").all_steps() == [2, 4, 5]
  assert sorted(_evals(workdir)) == [2, 4]
  _rerun_ends_as(capsys, workdir, reference)


@pytest.mark.slow
def test_sigterm_during_the_final_save(tmp_path, capsys, reference):
  """Step 5's checkpoint save finishes, the evaluation after the loop is left for the rerun:
  exit 75 with one line naming step 5; run again, the run ends as the uninterrupted one."""
  workdir = tmp_path / "run"
  with pytest.MonkeyPatch.context() as mp:
    _term_in(mp, checkpoints.Checkpointer, "save", when=lambda self, step, *a: step == 5)
    code, lines = _launch(capsys, workdir, {**TINY_ARGS, **KW})
  _preempted(code, lines, "at step 5", str(workdir / "checkpoints" / "5"))
  assert checkpoints.Checkpointer(workdir / "checkpoints").all_steps() == [2, 4, 5]
  assert sorted(_evals(workdir)) == [2, 4]  # no new work after the SIGTERM
  _rerun_ends_as(capsys, workdir, reference)


@pytest.mark.slow
def test_sigterm_in_fine_tuning_best_save_and_predictions(tmp_path, capsys, data_dir):
  """RTE fine-tuning keeping best/ (best_metric): SIGTERM during step 2's best/ save, which
  finishes whole before step 2 is saved; run again, SIGTERM during the prediction pass after the
  last step, which is dropped; run again, the run ends with the uninterrupted run's parameters
  and evaluations."""
  settings = {**TINY, "task": "rte", "data_dir": str(data_dir / "glue"), "data.vocab_size": 300,
              "model.vocab_size": 300, "max_seq_length": 32, "max_train_examples": 40,
              "batch_size": 8, "eval_batch_size": 64, "total_steps": 5, "eval_every": 2,
              "log_every": 1, "best_metric": "accuracy", "model.hidden_dropout_prob": 0.1,
              "checkpoint_every": 100}
  config = "configs/glue.py:task=rte,runlocal"
  code, _ = _launch(capsys, tmp_path / "reference", settings, config)
  assert code == 0
  workdir = tmp_path / "run"

  with pytest.MonkeyPatch.context() as mp:
    _term_in(mp, checkpoints.BestKeeper, "update", when=lambda self, step, *a: step == 2)
    code, lines = _launch(capsys, workdir, settings, config)
  _preempted(code, lines, "at step 2")
  assert sorted(p.name for p in workdir.glob("best*")) == ["best"]  # no best.tmp, no best.old
  assert '"step": 2' in (workdir / "best/best.json").read_text()
  assert checkpoints.Checkpointer(workdir / "checkpoints").all_steps() == [2]

  with pytest.MonkeyPatch.context() as mp:
    _term_in(mp, EvalContext, "predict_rows",
             when=lambda self, params, eval_set, step: step == 5)
    code, lines = _launch(capsys, workdir, settings, config)
  _preempted(code, lines, "while evaluating step 5 after the last step")
  assert sorted(_evals(workdir)) == [2, 4]

  code, lines = _launch(capsys, workdir, settings, config)
  _finished(code, lines)
  assert _evals(workdir) == _evals(tmp_path / "reference")
  _assert_same(_params(tmp_path / "reference", 5), _params(workdir, 5))


@pytest.mark.slow
def test_sigterm_during_the_final_evaluations_best_save(tmp_path, capsys, reference):
  """Pretraining keeping best/ by eval loss: SIGTERM while step 5's evaluation (after the loop)
  updates best/. Its writes finish whole (best/ with its best.json, no best.tmp or best.old, the
  eval row of step 5), then exit 75 with one line; run again, the run ends as the uninterrupted
  one, with nothing left to do."""
  workdir = tmp_path / "run"
  settings = {**TINY_ARGS, **KW, "best_metric": "loss", "best_mode": "min"}
  with pytest.MonkeyPatch.context() as mp:
    sent = _term_in(mp, checkpoints.BestKeeper, "update", when=lambda self, step, *a: step == 5)
    code, lines = _launch(capsys, workdir, settings)
  assert sent
  _preempted(code, lines, "at step 5")
  assert sorted(p.name for p in workdir.glob("best*")) == ["best"]
  assert (workdir / "best/best.json").is_file()
  assert sorted(_evals(workdir)) == [2, 4, 5]
  code, lines = _launch(capsys, workdir, settings)
  _finished(code, lines)
  assert _evals(workdir) == _evals(reference)
  _assert_same(_params(reference, 5), _params(workdir, 5))


@pytest.mark.slow
def test_ctrl_c_at_a_random_step(tmp_path, capsys, reference):
  """Ctrl-C (SIGINT) is handled as SIGTERM is: the step under way finishes and is saved,
  summary.json says so, exit 130 with one line naming the step and how to go on; the same
  command run again ends with the uninterrupted run's parameters and evaluations. On dd89774
  Ctrl-C exited 130 with `error: interrupted` and nothing saved."""
  step = random.randint(1, KW["total_steps"] - 1)
  workdir = tmp_path / "run"
  with pytest.MonkeyPatch.context() as mp:
    sent = _term_in(mp, run_record.RunRecord, "add", signum=signal.SIGINT,
                    when=lambda self, batch, metrics, at: int(at) == step)
    code, lines = _launch(capsys, workdir, {**TINY_ARGS, **KW})
  assert sent, f"step {step}"
  assert code == errors.EXIT_INTERRUPTED, (step, lines[-20:])
  assert lines[-1] == (f"interrupted: Ctrl-C at step {step}; checkpoint "
                       f"{workdir / 'checkpoints' / str(step)} saved; run the same command again "
                       "to go on"), (step, lines[-20:])
  assert not [line for line in lines if line.startswith(("error", "Traceback"))], lines
  assert step in checkpoints.Checkpointer(workdir / "checkpoints").all_steps()
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["step"] == step and summary["status"].startswith("interrupted"), summary
  _rerun_ends_as(capsys, workdir, reference)


@pytest.mark.slow
def test_sigterm_during_a_glue_evaluation_keeps_the_train_rows(tmp_path, capsys, data_dir):
  """RTE fine-tuning logging every 4 steps, evaluating every 2: SIGTERM during step 2's
  evaluation saves step 2 and stops; the resumed run's row at step 4 is the mean over steps 1-4
  (the checkpoint carries the logging window), so metrics.jsonl equals an uninterrupted run's.
  On dd89774 the row at step 4 averaged steps 3-4 only."""
  settings = {**TINY, "task": "rte", "data_dir": str(data_dir / "glue"), "data.vocab_size": 300,
              "model.vocab_size": 300, "max_seq_length": 32, "max_train_examples": 40,
              "batch_size": 8, "eval_batch_size": 64, "total_steps": 8, "eval_every": 2,
              "log_every": 4, "model.hidden_dropout_prob": 0.1, "checkpoint_every": 100}
  config = "configs/glue.py:task=rte,runlocal"
  assert _launch(capsys, tmp_path / "reference", settings, config)[0] == 0
  workdir = tmp_path / "run"
  with pytest.MonkeyPatch.context() as mp:
    sent = _term_in(mp, EvalContext, "predict_rows",
                    when=lambda self, params, eval_set, step: step == 2)
    code, lines = _launch(capsys, workdir, settings, config)
  assert sent
  _preempted(code, lines, "at step 2")
  assert checkpoints.Checkpointer(workdir / "checkpoints").all_steps() == [2]
  code, lines = _launch(capsys, workdir, settings, config)
  _finished(code, lines)

  timing = ("tokens_per_s", "steps_per_s")
  rows = lambda w: [{k: v for k, v in r.items() if k not in timing}
                    for r in metric_writers.read_metrics(w)]
  assert [r["step"] for r in rows(workdir) if r["split"] == "train"] == [4, 8]
  assert rows(workdir) == rows(tmp_path / "reference")
  _assert_same(_params(tmp_path / "reference", 8), _params(workdir, 8))
