"""optimizer.fused_update (bertjax/runtime/optim.py `grouped_update`): the optimizer over one flat
buffer per parameter group equals the per-tensor optimizer step for step (AdamW with its
weight-decay mask, layer-wise learning-rate decay, clipping that acts, the warmup-and-decay
schedule, keep_pruned); what cannot be grouped exactly is refused in one line; the compiled train
step has fewer operations; a run with it resumes exactly and a workdir trained without it is
refused by the existing checks."""

import collections
import re
import shutil
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax.config import config_checks
from bertjax.core.errors import UserError
from bertjax.registry import get_objective
from bertjax.runtime import checkpoints, optim, sharding
from bertjax.trainer import train
from tests.test_train import tiny_config

STEPS = 6


def tiny_params(config):
  objective = get_objective(config)
  model = objective.make_model(config, train.model_config_from(config))
  batch = objective.init_batch(config, 1, config.max_seq_length, config.max_predictions_per_seq)
  return nn.meta.unbox(jax.jit(lambda r: objective.init_params(model, r, batch))(jax.random.key(0)))


def run_updates(config, params, fused: bool):
  """STEPS updates of the optimizer on fixed large random gradients (global norm ~ 300, so
  clipping at 1.0 acts every step); the params after each step and the final state."""
  config.optimizer.fused_update = fused
  opt = optim.make_optimizer(config, params=params, num_layers=2)
  state = opt.init(params)
  update = jax.jit(opt.update)
  rng = np.random.RandomState(0)
  seen = []
  for _ in range(STEPS):
    grads = jax.tree.map(lambda x: jnp.asarray(3 * rng.randn(*x.shape), jnp.float32), params)
    updates, state = update(grads, state, params)
    params = optax.apply_updates(params, updates)
    seen.append(params)
  return seen, state


@pytest.mark.parametrize("name, layerwise, keep_pruned", [
    ("adamw", 0.8, False), ("adamw", 1.0, True), ("sgd", 0.5, False)])
def test_fused_update_equals_the_per_tensor_update(name, layerwise, keep_pruned):
  config = tiny_config(**{"optimizer.name": name, "optimizer.weight_decay": 0.1,
                          "optimizer.layerwise_lr_decay": layerwise,
                          "optimizer.keep_pruned": keep_pruned, "optimizer.warmup_steps": 2,
                          "optimizer.grad_clip_norm": 1.0, "total_steps": STEPS,
                          "learning_rate": 0.01})
  params = tiny_params(config)
  if keep_pruned:  # half of each encoder kernel pruned
    params = jax.tree.map(lambda p, s: jnp.where(jnp.arange(p.size).reshape(p.shape) % 2 == 0,
                                                 0.0, p) if s else p,
                          params, optim.prunable(params))
  per_tensor, state_a = run_updates(config, params, fused=False)
  fused, state_b = run_updates(config, params, fused=True)
  for step, (a, b) in enumerate(zip(per_tensor, fused)):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
      np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-6, atol=2e-7,
                                 err_msg=f"step {step + 1}")
  moved = max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(per_tensor[-1]),
                                                              jax.tree.leaves(params)))
  assert moved > 1e-4  # the updates are not trivially zero
  # The state holds one buffer per group, not one per tensor: decayed or not (sgd: no state),
  # and per layer-wise power (embeddings 3, layers 2 and 1, heads 0).
  groups = {g.name for g in optim.parameter_groups(
      params, num_layers=2 if layerwise != 1.0 else None, pruned=keep_pruned)}
  if name == "adamw":
    mu = state_b.inner_state[1][0].mu
    assert sorted(mu) == sorted(groups) and len(groups) == (8 if layerwise != 1.0 else 3)
    assert sum(v.size for v in mu.values()) == sum(p.size for p in jax.tree.leaves(params))
    assert len(jax.tree.leaves(state_b)) < len(jax.tree.leaves(state_a)) / 4
  if keep_pruned:
    assert float(optim.held_sparsity(state_b)) == pytest.approx(
        float(optim.held_sparsity(state_a)))
    pruned = jax.tree.map(lambda p, s: bool(s) and bool(np.all(np.asarray(p).ravel()[::2] == 0)),
                          fused[-1], optim.prunable(params))
    assert any(jax.tree.leaves(pruned))


def test_groups_are_named_by_dtype_decay_and_layer():
  config = tiny_config()
  params = tiny_params(config)
  params["encoder"]["pooler"]["bias"] = params["encoder"]["pooler"]["bias"].astype(jnp.bfloat16)
  groups = optim.parameter_groups(params, num_layers=2)
  names = {"/".join(str(getattr(k, "key", k)) for k in path): g.name for (path, _), g in zip(
      jax.tree_util.tree_flatten_with_path(params)[0], groups)}
  assert names["encoder/layer_0/attention/query/kernel"] == "float32_decay_lr_power_2"
  assert names["encoder/layer_1/output_layer_norm/scale"] == "float32_no_decay_lr_power_1"
  assert names["encoder/embeddings/word_embeddings/embedding"] == "float32_decay_lr_power_3"
  assert names["encoder/pooler/bias"] == "bfloat16_no_decay_lr_power_0"


def fake_mesh(shape):
  return types.SimpleNamespace(shape=collections.OrderedDict(zip(sharding.MESH_AXES, shape)))


@pytest.mark.parametrize("overrides, mesh, needle", [
    ({"optimizer.name": "lamb"}, (1, 1, 1),
     "optimizer.fused_update=True cannot group optimizer.name='lamb': its trust ratio is "
     "computed per parameter tensor"),
    ({"optimizer.name": "stableadamw"}, (1, 1, 1), "its update clipping is computed per"),
    ({}, (1, 2, 1), "mesh_shape=(1, 2, 1) shards them over mesh axis fsdp (logical axes 'embed'):"),
    ({}, (2, 1, 2), "shards them over mesh axis tensor (logical axes 'vocab', 'heads', 'mlp'): the buffers"),
])
def test_what_cannot_be_grouped_is_refused_in_one_line(overrides, mesh, needle):
  config = tiny_config(**{"optimizer.fused_update": True, **overrides})
  with pytest.raises(UserError) as e:
    config_checks.check_fused_update(config, fake_mesh(mesh))
  message = str(e.value)
  assert needle in message and "fix: --config.optimizer.fused_update=False" in message
  assert "\n" not in message
  # Without the option, or with a mesh that splits only the batch, nothing is refused.
  config.optimizer.fused_update = False
  config_checks.check_fused_update(config, fake_mesh(mesh))
  if not overrides:
    config.optimizer.fused_update = True
    config_checks.check_fused_update(config, fake_mesh((mesh[0] * mesh[1] * mesh[2], 1, 1)))


def hlo_operations(text: str) -> int:
  """Operations the compiled step runs: the instructions of its entry computation (each a fusion,
  a product, a copy, ...; each one thunk on XLA:CPU, one or more kernels on a GPU), less the
  bookkeeping ones that run nothing (parameters, constants, tuples, bitcasts)."""
  body = text[text.index("\nENTRY "):]
  body = body[:body.index("\n}\n")]
  ops = re.findall(r"^\s+(?:ROOT )?%?[\w.\-]+ = \S+ ([\w\-]+)\(", body, re.M)
  return sum(1 for op in ops
             if op not in ("parameter", "constant", "tuple", "get-tuple-element", "bitcast"))


@pytest.mark.slow
def test_the_compiled_train_step_has_fewer_operations():
  """A tiny model (2 layers, 46 tensors). Measured 2026-11-28 on a 2-core AMD EPYC with
  `hlo_operations`: the quickstart runlocal model (hidden 128, 46 tensors) 546 operations per
  tensor, 459 fused; bert-mini (batch 16, seq 128, 78 tensors) 1,093 and 942."""
  counts = {}
  for fused in (False, True):
    config = tiny_config(**{"optimizer.fused_update": fused})
    objective = get_objective(config)
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    run, state = train.setup(config, objective, train.model_config_from(config), mesh,
                             rules=sharding.rules_from_config(config))
    batch = objective.init_batch(config, config.batch_size, config.max_seq_length,
                                 config.max_predictions_per_seq)
    with jax.set_mesh(mesh):
      counts[fused] = hlo_operations(run.train_step.lower(state, batch).compile().as_text())
  tensors = len(jax.tree.leaves(state.params))
  # The Adam chain ran once per tensor (several fusions each); now once per group, leaving about
  # one fusion per tensor (its slice of the update added to it).
  assert counts[True] < counts[False] - tensors, counts


@pytest.mark.slow
def test_a_fused_run_resumes_exactly_and_another_layout_is_refused(tmp_path):
  kw = {"optimizer.fused_update": True, "checkpoint_every": 2, "eval_every": 0, "log_every": 1,
        "total_steps": 4, "optimizer.layerwise_lr_decay": 0.8}
  train.train_and_evaluate(tiny_config(**kw), tmp_path / "a")
  full = jax.device_get(checkpoints.restore_params(tmp_path / "a"))
  shutil.rmtree(tmp_path / "a" / "checkpoints" / "4")
  assert train.train_and_evaluate(tiny_config(**kw), tmp_path / "a")["step"] == 4
  resumed = checkpoints.restore_params(tmp_path / "a")
  for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(resumed)):
    np.testing.assert_array_equal(a, b)
  # Switching the option on a workdir: the settings check refuses it; told to go on anyway, the
  # checkpoint's tree check refuses the other optimizer-state layout, each in one line.
  kw["optimizer.fused_update"] = False
  with pytest.raises(UserError, match="other settings: optimizer.fused_update true -> false;"):
    train.train_and_evaluate(tiny_config(**kw), tmp_path / "a")
  with pytest.raises(UserError) as e:
    train.train_and_evaluate(tiny_config(**kw, allow_changed_settings=True), tmp_path / "a")
  assert "holds a different model or optimizer than this config (opt_state/" in str(e.value)
  assert "use a new --workdir or the config it was trained with" in str(e.value)


def test_a_run_checks_it_before_anything_is_written(tmp_path):
  """The trainer's plan runs the check (config_checks.check_run): refused before the workdir."""
  config = tiny_config(**{"optimizer.fused_update": True, "optimizer.name": "lamb"})
  with pytest.raises(UserError, match="cannot group optimizer.name='lamb'"):
    train.train_and_evaluate(config, tmp_path / "w")
  assert not (tmp_path / "w").exists()
