"""The trainer end to end: entry point, workdir contents, accumulation, resume, bad input."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

import pytest

from bertjax import inputs
from bertjax.config import config_lib
from bertjax.registry import get_objective
from bertjax.runtime import metric_writers, optim, sharding
from bertjax.runtime.run_record import summarize
from bertjax.trainer import train

REPO = pathlib.Path(__file__).resolve().parent.parent


def tiny_config(**overrides):
  config = config_lib.load_config_file(str(REPO / "configs/quickstart.py") + ":runlocal")
  base = {"data.synthetic": True, "model.vocab_size": 200, "model.hidden_size": 32,
          "model.intermediate_size": 64, "model.num_attention_heads": 2,
          "model.num_hidden_layers": 2, "max_seq_length": 16, "max_predictions_per_seq": 4,
          "tensorboard": False, "async_checkpointing": False}
  base.update(overrides)
  config_lib.apply_overrides(config, [f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                                      for k, v in base.items()])
  return config


def run_launch(*args, cwd=REPO):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "launch.py", *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_launch_writes_workdir(tmp_path):
  r = run_launch("--config", "configs/quickstart.py:runlocal", "--workdir", str(tmp_path),
                 "--config.data.synthetic=True", "--config.total_steps=10", "--config.eval_every=5")
  assert r.returncode == 0, r.stderr[-2000:]
  config = json.loads((tmp_path / "config.json").read_text())
  assert config["total_steps"] == 10 and config["objective"] == "mlm_nsp"
  rows = metric_writers.read_metrics(tmp_path)
  train_rows = [r for r in rows if r["split"] == "train"]
  eval_rows = [r for r in rows if r["split"] == "eval"]
  assert [r["step"] for r in train_rows] == [5, 10]
  assert [r["step"] for r in eval_rows] == [5, 10]
  for key in ("loss", "mlm_accuracy", "nsp_accuracy", "learning_rate", "tokens_per_s"):
    assert key in train_rows[-1]
  assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
  assert (tmp_path / "checkpoints" / "10").is_dir()
  assert "summary:" in r.stdout


@pytest.mark.parametrize("args, needle", [
    (["--config.total_stepz=3"], "unknown config key 'total_stepz'"),
    (["--config.total_steps=abc"], "total_steps"),
    (["--config.objective=mlm_nsq"], "unknown objective 'mlm_nsq'"),
    (["--config.mesh_shape=(3, 1, 1)"], "mesh_shape"),
    (["--config.batch_size=7", "--config.grad_accum_steps=2"], "batch_size=7"),
    (["--config.log_every=0"], "log_every=0 must be >= 1"),
    (["--config.keep_checkpoints=-1"], "keep_checkpoints=-1 must be >= 1"),
    (["--config.init_from=/nonexistent/run"], "init_from=/nonexistent/run does not exist"),
])
def test_bad_config_is_one_line(tmp_path, args, needle):
  r = run_launch("--config", "configs/quickstart.py:runlocal", "--workdir", str(tmp_path / "w"),
                 "--config.data.synthetic=True", *args)
  assert r.returncode == 2
  assert "Traceback" not in r.stderr
  err = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert len(err) == 1 and needle in err[0], r.stderr[-2000:]
  assert not (tmp_path / "w").exists()  # refused before the workdir is made


def test_missing_config_file(tmp_path):
  r = run_launch("--config", "configs/nope.py", "--workdir", str(tmp_path))
  assert r.returncode == 2 and "configs/nope.py not found" in r.stderr
  assert "Traceback" not in r.stderr


def _params(workdir):
  from bertjax.runtime import checkpoints
  return checkpoints.restore_params(workdir)


@pytest.mark.slow
def test_resume_is_exact(tmp_path):
  """A run resumed from its step-3 checkpoint ends where the uninterrupted run ended.

  Deleting the step-6 checkpoint leaves exactly what a run killed between steps 3 and 6 leaves.
  Dropout is on, so resume must also reproduce the dropout masks and the data order.
  """
  import shutil
  kw = {"model.hidden_dropout_prob": 0.1, "model.attention_probs_dropout_prob": 0.1,
        "checkpoint_every": 3, "eval_every": 0, "log_every": 1, "total_steps": 6}
  train.train_and_evaluate(tiny_config(**kw), tmp_path)
  full = jax.device_get(_params(tmp_path))
  rows = metric_writers.read_metrics(tmp_path)
  shutil.rmtree(tmp_path / "checkpoints" / "6")
  summary = train.train_and_evaluate(tiny_config(**kw), tmp_path)
  assert summary["step"] == 6
  resumed = _params(tmp_path)
  for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(resumed)):
    np.testing.assert_array_equal(a, b)
  rows2 = metric_writers.read_metrics(tmp_path)
  # Rows 4-6 of the first run gave way to the resumed run's (one row per step), step for step
  # the same losses.
  assert [r["step"] for r in rows2] == [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
  for a, b in zip(rows, rows2):
    assert a["loss"] == b["loss"]


@pytest.mark.slow
def test_gradient_accumulation_matches_big_batch():
  config = tiny_config(batch_size=16, **{"optimizer.warmup_steps": 0})
  objective = get_objective(config)
  model = objective.make_model(config, train.model_config_from(config))
  optimizer = optim.make_optimizer(config)
  batch = next(inputs.SyntheticBatches(config, 200, 0, 16))
  # Unequal masked counts per row, so normalizing per micro-batch would be visibly wrong.
  batch["masked_weights"][::3, 2:] = 0.0
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  state, _, _ = train.create_train_state(objective, model, optimizer, config, mesh,
                                         objective.init_batch(config, 1, 16, 4), rules=sharding.rules_from_config(config))
  results = []
  for accum in (1, 4):
    step = jax.jit(train.make_train_step(objective, model, optimizer, accum))
    new_state, metrics = step(state, jax.tree.map(jnp.asarray, batch))
    results.append((new_state, summarize(metrics)))
  (s1, m1), (s4, m4) = results
  assert m1["loss"] == pytest.approx(m4["loss"], rel=1e-5)
  assert m1["mlm_accuracy"] == pytest.approx(m4["mlm_accuracy"], abs=1e-6)
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s4.params)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # And the update is not trivially zero.
  moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in
              zip(jax.tree.leaves(s1.params), jax.tree.leaves(state.params)))
  assert moved > 1e-4


@pytest.mark.slow
def test_workdir_of_another_model_is_refused(tmp_path):
  train.train_and_evaluate(tiny_config(total_steps=2, eval_every=0), tmp_path)
  before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
  recorded = (tmp_path / "config.json").read_bytes()
  args = ["--config", "configs/quickstart.py:runlocal", "--workdir", str(tmp_path),
          "--config.data.synthetic=True", "--config.model.hidden_size=64",
          "--config.model.vocab_size=200", "--config.total_steps=4"]
  r = run_launch(*args)  # other settings: refused before anything is built
  assert r.returncode == 2 and "Traceback" not in r.stderr
  assert "holds a run trained with other settings" in r.stderr and "model.hidden_size 32 -> 64" in r.stderr
  # Asked to go on anyway, the checkpoint itself still refuses another model.
  r = run_launch(*args, "--config.allow_changed_settings=True")
  assert r.returncode == 2 and "Traceback" not in r.stderr
  assert "different model" in r.stderr
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before
  assert (tmp_path / "config.json").read_bytes() == recorded
  assert not (tmp_path / "changes.jsonl").exists()


def test_setup_traces_the_model_init_twice_and_matches_its_abstract_state():
  """One trace for the shapes (shared by the optimizer and the shardings), one by the jitted
  init: the abstract state setup reports is the state it creates."""
  config = tiny_config()
  calls = []

  class Counting(type(get_objective(config))):

    def init_params(self, model, rng, batch):
      calls.append(1)
      return super().init_params(model, rng, batch)

  objective = Counting()
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  s, state = train.setup(config, objective, train.model_config_from(config), mesh,
                         rules=sharding.rules_from_config(config))
  assert len(calls) == 2
  shapes = lambda t: jax.tree.map(lambda x: (x.shape, x.dtype), t)
  assert shapes(s.abstract_state) == shapes(state)


@pytest.mark.slow
def test_resumed_runs_keep_one_row_per_step_and_the_whole_runs_record(tmp_path):
  """Resumed from step 3 (rows 4-6 were logged before the 'interruption'), then run again once
  finished: metrics.jsonl holds each step once, and summary.json reports the first and last
  metrics of the whole run, not of the last process."""
  import shutil
  kw = {"checkpoint_every": 3, "eval_every": 3, "log_every": 1, "total_steps": 6}
  train.train_and_evaluate(tiny_config(**kw), tmp_path)
  rows = metric_writers.read_metrics(tmp_path)
  shutil.rmtree(tmp_path / "checkpoints" / "6")
  (tmp_path / "metrics.jsonl").write_text((tmp_path / "metrics.jsonl").read_text() + '{"step": 7, "spl')
  for _ in range(2):  # resumed at step 3, then at the finished step 6
    summary = train.train_and_evaluate(tiny_config(**kw), tmp_path)
    again = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    keys = [(r["step"], r["split"]) for r in again]
    assert len(keys) == len(set(keys)) and keys == [(r["step"], r["split"]) for r in rows]
    for a, b in zip(again, rows):  # exact resume: the same losses step for step
      assert a["loss"] == b["loss"], (a, b)
    values = lambda r: {k: v for k, v in r.items() if k not in ("step", "split", "tokens_per_s",
                                                                "steps_per_s")}
    first = [r for r in again if r["split"] == "train"][0]
    assert first["step"] == 1 and values(summary["first_train"]) == values(first)
    assert values(summary["last_train"]) == values([r for r in again if r["split"] == "train"][-1])
    assert summary["last_eval"]["loss"] == [r for r in again if r["split"] == "eval"][-1]["loss"]
