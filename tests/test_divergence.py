"""Non-finite losses and gradients: found, never checkpointed, and a run resumes past them."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import inputs
from bertjax.core.errors import Diverged, UserError
from bertjax.registry import get_objective
from bertjax.runtime import checkpoints, divergence, metric_writers, optim, sharding
from bertjax.trainer import train

from test_train import run_launch, tiny_config

POISON = 7  # a batch whose first token is this id gets a NaN loss from the poisoned objective


def _poisoned(config):
  """The config's objective, with a NaN loss on batches marked by POISON."""
  class Poisoned(type(get_objective(config))):

    def loss(self, model, params, batch, rng, denominators, deterministic):
      value, metrics = super().loss(model, params, batch, rng, denominators, deterministic)
      return value * jnp.where(batch["input_ids"][0, 0] == POISON, jnp.nan, 1.0), metrics

  return Poisoned()


def _step_and_state(skip: bool):
  config = tiny_config(**{"optimizer.warmup_steps": 0})
  objective = _poisoned(config)
  model = objective.make_model(config, train.model_config_from(config))
  optimizer = optim.make_optimizer(config)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  state, _, _ = train.create_train_state(objective, model, optimizer, config, mesh,
                                         objective.init_batch(config, 1, 16, 4), rules=sharding.rules_from_config(config))
  step = jax.jit(train.make_train_step(objective, model, optimizer, 1, skip_nonfinite=skip))
  batch = jax.tree.map(jnp.asarray, next(inputs.SyntheticBatches(config, 200, 0, 8)))
  return step, state, batch, {**batch, "input_ids": batch["input_ids"].at[0, 0].set(POISON)}


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def test_skip_policy_keeps_the_state_of_a_nonfinite_step():
  step, state, good, bad = _step_and_state(skip=True)
  before = _leaves((state.params, state.opt_state))
  skipped, metrics = step(state, bad)
  assert int(skipped.step) == 1  # the step counter (data, dropout streams) still advances
  for a, b in zip(before, _leaves((skipped.params, skipped.opt_state))):
    np.testing.assert_array_equal(a, b)
  assert float(metrics["nonfinite"][0]) == 1.0
  assert float(metrics["loss"][1]) == 0.0  # the skipped step counts for nothing in the window
  updated, metrics = step(skipped, good)
  assert float(metrics["nonfinite"][0]) == 0.0 and math.isfinite(float(metrics["loss"][0]))
  moved = max(float(np.max(np.abs(a - b))) for a, b in zip(before, _leaves(
      (updated.params, updated.opt_state))))
  assert moved > 0


def test_stop_policy_applies_the_step_and_flags_it():
  step, state, _, bad = _step_and_state(skip=False)
  new, metrics = step(state, bad)
  assert float(metrics["nonfinite"][0]) == 1.0
  assert not all(np.isfinite(x).all() for x in _leaves(new.params))


def _flags(*values):
  return [{"nonfinite": (jnp.asarray(v, jnp.float32), jnp.ones(()))} for v in values]


def test_watch_names_the_first_nonfinite_step():
  watch = divergence.Watch("stop", start_step=10, learning_rate=1e-3, dtype="float32")
  for i, m in enumerate(_flags(0, 0, 1, 1), start=11):
    watch.add(m, jnp.asarray(i))
  with pytest.raises(Diverged, match="at step 13") as e:
    watch.check()
  assert "\n" not in str(e.value) and "learning rate (0.001" in str(e.value)
  assert e.value.exit_code == 3


def test_watch_from_the_first_step_points_at_the_inputs():
  watch = divergence.Watch("stop", start_step=0, learning_rate=1e-3, dtype="bfloat16")
  watch.add(_flags(1)[0], jnp.asarray(1))
  with pytest.raises(Diverged, match="max_position_embeddings"):
    watch.check()


def test_watch_skip_stops_only_when_a_whole_window_was_skipped():
  watch = divergence.Watch("skip", start_step=0, learning_rate=1e-3, dtype="float32")
  for i, m in enumerate(_flags(1, 0, 1), start=1):
    watch.add(m, jnp.asarray(i))
  watch.check()  # two of three skipped: goes on
  for i, m in enumerate(_flags(1, 1), start=4):
    watch.add(m, jnp.asarray(i))
  with pytest.raises(Diverged, match="all 2 steps"):
    watch.check()


def test_nonfinite_parameters_are_never_checkpointed():
  watch = divergence.Watch("skip", start_step=0, learning_rate=1e-3, dtype="float32")
  watch.check_checkpoint(5, {"w": jnp.ones((3,)), "i": jnp.arange(3)})
  with pytest.raises(Diverged, match="at step 6: the parameters are not finite"):
    watch.check_checkpoint(6, {"w": jnp.asarray([1.0, jnp.inf, 0.0]), "i": jnp.arange(3)})


def test_unknown_policy_is_one_line():
  with pytest.raises(UserError, match="nonfinite_policy='ignore'"):
    divergence.check_policy("ignore")


def _rows(workdir):
  return metric_writers.read_metrics(workdir)


@pytest.mark.slow
def test_a_run_that_diverges_midway_keeps_its_last_finite_checkpoint(tmp_path):
  """The red team's case: a resumed run with an absurd learning rate. It stops with exit 3 and
  one line naming the step; the step-4 checkpoint survives rotation (keep 1), no later one is
  written, the earlier metric rows stay; a rerun with a sane rate resumes from step 4."""
  workdir = tmp_path / "w"
  common = ["--config", "configs/quickstart.py:runlocal", "--workdir", str(workdir),
            "--config.data.synthetic=True", "--config.keep_checkpoints=1",
            "--config.checkpoint_every=2", "--config.log_every=1", "--config.eval_every=0",
            "--config.tensorboard=False", "--config.optimizer.warmup_steps=0"]
  first = run_launch(*common, "--config.total_steps=4")
  assert first.returncode == 0, first.stderr[-2000:]
  rows = _rows(workdir)
  good = jax.device_get(checkpoints.restore_params(workdir))

  diverged = run_launch(*common, "--config.total_steps=8", "--config.learning_rate=1e30",
                        "--config.allow_changed_settings=True")
  assert diverged.returncode == 3, diverged.stderr[-2000:]
  assert "Traceback" not in diverged.stderr
  errors = [l for l in diverged.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "the run diverged at step" in errors[0], diverged.stderr[-2000:]
  assert "learning rate (1e+30" in errors[0] and "allow_changed_settings" in errors[0]
  assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()) == [4]
  for a, b in zip(jax.tree.leaves(good), jax.tree.leaves(checkpoints.restore_params(workdir))):
    np.testing.assert_array_equal(a, b)
  assert _rows(workdir)[:len(rows)] == rows

  resumed = run_launch(*common, "--config.total_steps=8", "--config.learning_rate=1e-3",
                       "--config.allow_changed_settings=True")
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  after = [r for r in _rows(workdir)[len(rows):] if r["step"] > 4 and r["split"] == "train"]
  assert [r["step"] for r in after][-4:] == [5, 6, 7, 8]
  assert all(math.isfinite(r["loss"]) for r in after[-4:])
  assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()) == [8]
