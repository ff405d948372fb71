"""A frozen encoder (bertjax/runtime/freezing.py): frozen parameters stay bit for bit, the compiled
step computes no gradient and keeps no optimizer state for them, the top k layers train alone; its
settings are checked in one line each."""

import ast
import json
import os
import shutil
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

import pytest

import bertjax
from bertjax.config import config_checks
from bertjax.convert.export import convert_to_hf
from bertjax.core.errors import UserError
from bertjax.registry import get_objective
from bertjax.runtime import sharding, workdir as workdir_lib
from bertjax.runtime.run_record import summarize
from bertjax.trainer import train

from helpers import REPO, TINY, load_config

SEQ, BATCH, VOCAB = 16, 8, 100


def task_config(spec="configs/glue.py:task=sst2,runlocal", **overrides):
  settings = {**TINY, "model.vocab_size": VOCAB, "max_seq_length": SEQ, "batch_size": BATCH,
              "total_steps": 20, "optimizer.warmup_steps": 0, "learning_rate": 1e-2}
  return load_config(spec, **{**settings, **overrides})


def glue_batch(seed=0, tagging=False):
  """Rows whose label is whether token 7 occurs: learnable from the tokens."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(8, VOCAB, (BATCH, SEQ)).astype(np.int32)
  mask = np.ones((BATCH, SEQ), np.int32)
  mask[:, SEQ // 2:] = 0
  ids[::2, 3] = 7
  batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids),
           "weight": np.ones((BATCH,), np.float32)}
  if tagging:
    batch["labels"] = (ids == 7).astype(np.int32) + (ids % 3 == 0)
    batch["label_weights"] = mask.astype(np.float32)
  else:
    batch["label"] = (ids == 7).any(1).astype(np.int32)
  return {k: jnp.asarray(v) for k, v in batch.items()}


def build(config, mesh_shape=(1, 1, 1)):
  objective = get_objective(config)
  model_cfg = objective.model_config(config)
  mesh = sharding.make_mesh(mesh_shape, jax.devices()[:int(np.prod(mesh_shape))])
  config_checks.check_run(config, objective, model_cfg, mesh)
  s, state = train.setup(config, objective, model_cfg, mesh, rules=sharding.rules_from_config(config))
  return s, state


def run_steps(s, state, batch, steps):
  losses = []
  with jax.set_mesh(s.mesh):
    for _ in range(steps):
      state, metrics = s.train_step(state, batch)
      losses.append(summarize(metrics)["loss"])
  return state, losses


def flat(tree):
  return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
          for path, v in jax.tree_util.tree_flatten_with_path(jax.device_get(tree))[0]}


def changed(before, after):
  """Names of the parameters whose bits changed."""
  return {k for k in before if not np.array_equal(before[k], after[k])}


def test_frozen_encoder_is_bitwise_unchanged_and_head_trains():
  s, state = build(task_config(**{"freeze.encoder": True}))
  before = flat(state.params)
  state, losses = run_steps(s, state, glue_batch(), 5)
  moved = changed(before, flat(state.params))
  assert moved == {k for k in before if k.startswith("classifier/")}, moved
  assert losses[-1] < losses[0]


def test_frozen_step_computes_no_encoder_gradient_nor_state():
  """XLA's own count: the frozen step does only the forward pass through the encoder, and its
  optimizer state covers the head alone."""
  flops, opt_leaves, opt_bytes = {}, {}, {}
  batch = glue_batch()
  settings = {False: {}, True: {"freeze.encoder": True},
              "top1": {"freeze.encoder": True, "freeze.train_top_layers": 1}}
  for frozen, overrides in settings.items():
    s, state = build(task_config(**overrides))
    with jax.set_mesh(s.mesh):
      cost = s.train_step.lower(state, batch).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops[frozen] = cost["flops"]
    leaves = jax.tree.leaves(state.opt_state)
    opt_leaves[frozen] = len(leaves)
    opt_bytes[frozen] = sum(x.nbytes for x in leaves)
  # Forward alone is about a third of forward + backward.
  assert flops[True] < 0.5 * flops[False], flops
  # The top layer's backward (one of two layers) costs something, still less than the full step.
  assert flops[True] < flops["top1"] < 0.8 * flops[False], flops
  assert opt_leaves[True] < opt_leaves["top1"] < opt_leaves[False], opt_leaves
  assert opt_leaves[True] < opt_leaves[False] / 5, opt_leaves
  # Adam's two moments of the classifier (33 x 2 floats each) and the count / learning rate.
  assert opt_bytes[True] < 1000 < opt_bytes[False], opt_bytes


def test_top_layers_train_alone():
  config = task_config(**{"freeze.encoder": True, "freeze.train_top_layers": 1,
                          "model.num_hidden_layers": 3})
  s, state = build(config)
  before = flat(state.params)
  state, _ = run_steps(s, state, glue_batch(), 3)
  moved = changed(before, flat(state.params))
  tops = {k.split("/")[1] if k.startswith("encoder/") else k.split("/")[0] for k in moved}
  assert tops == {"layer_2", "pooler", "classifier"}, tops
  # Every parameter of those parts moved (nothing is trained by accident of a zero gradient).
  expected = {k for k in before if k.startswith(("encoder/layer_2/", "encoder/pooler/",
                                                 "classifier/"))}
  assert moved == expected


def test_embeddings_can_train_under_a_frozen_encoder():
  s, state = build(task_config(**{"freeze.encoder": True, "freeze.train_embeddings": True}))
  before = flat(state.params)
  state, _ = run_steps(s, state, glue_batch(), 2)
  tops = {k.split("/")[1] if k.startswith("encoder/") else k.split("/")[0]
          for k in changed(before, flat(state.params))}
  assert tops == {"embeddings", "classifier"}, tops


def test_frozen_with_accumulation_matches_one_batch():
  results = []
  for accum in (1, 4):
    s, state = build(task_config(**{"freeze.encoder": True, "freeze.train_top_layers": 1,
                                    "grad_accum_steps": accum}))
    before = flat(state.params)
    state, losses = run_steps(s, state, glue_batch(), 2)
    results.append((flat(state.params), losses))
  (p1, l1), (p4, l4) = results
  np.testing.assert_allclose(l1, l4, rtol=1e-5)
  for k in p1:
    np.testing.assert_allclose(p1[k], p4[k], rtol=1e-5, atol=1e-6, err_msg=k)
  assert changed(before, p4) and not any(k.startswith("encoder/layer_0") for k in changed(before, p4))


def test_frozen_scanned_encoder():
  s, state = build(task_config(**{"freeze.encoder": True, "model.scan_layers": True}))
  before = flat(state.params)
  state, _ = run_steps(s, state, glue_batch(), 2)
  assert {k.split("/")[0] for k in changed(before, flat(state.params))} == {"classifier"}


@pytest.mark.parametrize("overrides, needle", [
    ({"freeze.train_top_layers": -1}, "freeze.train_top_layers=-1 must be >= 0"),
    ({"freeze.train_top_layers": 1}, "applies only with freeze.encoder=True"),
    ({"freeze.train_embeddings": True}, "freeze.train_embeddings=True applies only with"),
    ({"freeze.encoder": True, "freeze.train_top_layers": 3}, "exceeds the model's 2 layers"),
    ({"freeze.encoder": True, "freeze.train_top_layers": 1, "model.scan_layers": True},
     "model.scan_layers=True stacks them"),
    ({"head.features": "mean"}, "head.features='mean' must be one of standard, last"),
    ({"head.pooling": "max"}, "head.pooling='max' must be one of cls, mean"),
    ({"head.features": "concat", "head.layers": (-4, 1)}, "holds -4, outside the 3 hidden"),
    ({"head.features": "scalar_mix", "head.layers": (2, -1)}, "names a hidden state twice"),
])
def test_bad_settings_are_one_line(overrides, needle):
  config = task_config(**overrides)
  objective = get_objective(config)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  with pytest.raises(UserError) as e:
    config_checks.check_settings(config)
    config_checks.check_run(config, objective, objective.model_config(config), mesh)
  assert needle in str(e.value) and "fix:" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("features", ["concat", "scalar_mix"])
def test_refused_head_layers_suggest_a_value_that_passes(features):
  """head.layers' default (the last four) is refused on the 2-layer model, which has 3 hidden
  states; the fix the line gives is accepted, not the default again (issue 52)."""
  config = task_config(**{"head.features": features})
  objective = get_objective(config)
  with pytest.raises(UserError) as e:
    config_checks.check_freeze(config, objective, objective.model_config(config))
  fix = str(e.value).split("fix: --config.head.layers=")[1]
  assert fix == "'(-3, -2, -1)'", str(e.value)
  suggested = ast.literal_eval(fix.strip("'"))
  config = task_config(**{"head.features": features, "head.layers": suggested})
  config_checks.check_freeze(config, objective, objective.model_config(config))


def test_albert_shared_layers_refuse_top_layers():
  config = task_config(**{"freeze.encoder": True, "freeze.train_top_layers": 1,
                          "model.architecture": "albert", "model.num_hidden_groups": 1})
  objective = get_objective(config)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  with pytest.raises(UserError, match="share 1 parameter group"):
    config_checks.check_run(config, objective, objective.model_config(config), mesh)


@pytest.mark.slow
def test_frozen_run_end_to_end_resumes_exactly(tmp_path, data_dir):
  """A GLUE run (SST-2 sample, concat features) with a frozen encoder: its checkpoints hold
  every parameter, the encoder the same at every step, and a run resumed from the middle ends
  bit for bit where the uninterrupted one did (the optimizer state is the head's alone)."""
  workdir = tmp_path / "run"
  config = load_config("configs/glue.py:task=sst2,runlocal", **{
      **TINY, "data_dir": str(data_dir / "glue"), "max_train_examples": 64, "batch_size": 16,
      "total_steps": 6, "checkpoint_every": 3, "keep_checkpoints": 3, "eval_every": 6,
      "eval_batch_size": 64, "freeze.encoder": True, "head.features": "concat",
      "head.layers": (-2, -1), "model.hidden_dropout_prob": 0.1})
  summary = train.train_and_evaluate(config, workdir)
  assert summary["step"] == 6 and summary["last_eval"]["accuracy"] > 0
  steps = {s: flat(ocp_params(workdir, s)) for s in (3, 6)}
  moved = changed(steps[3], steps[6])
  assert moved == {k for k in steps[3] if k.startswith("classifier/")}, moved
  shutil.rmtree(workdir / "checkpoints" / "6")
  train.train_and_evaluate(config, workdir)
  resumed = flat(ocp_params(workdir, 6))
  assert not changed(steps[6], resumed)
  # bertjax.load reads the feature-based head; no transformers class holds it, so to-hf refuses.
  loaded = bertjax.load(workdir)
  assert (loaded.task.features, loaded.task.layers) == ("concat", (-2, -1))
  batch = glue_batch()
  params = jax.tree.map(jnp.asarray, ocp_params(workdir, 6))
  want = get_objective(config).make_model(config, get_objective(config).model_config(config)).apply(
      {"params": params}, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
  got = loaded.logits(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  with pytest.raises(UserError, match="feature-based head"):
    convert_to_hf(workdir, tmp_path / "hf", log=lambda _: None)
  assert not (tmp_path / "hf").exists()


def ocp_params(workdir, step):
  state = ocp.StandardCheckpointer().restore((workdir / "checkpoints" / str(step) / "state").absolute())
  return state["params"]


@pytest.mark.slow
def test_frozen_on_a_mesh_matches_one_device():
  """On a (data 2, fsdp 2, tensor 2) mesh: the same losses and trained parameters as on one
  device, and the optimizer state (of the trainable parameters only) sharded like them."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8")
  proc = subprocess.run([sys.executable, str(REPO / "tests/frozen_mesh_run.py")], env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  mesh, single = result["mesh"], result["single"]
  np.testing.assert_allclose(mesh["losses"], single["losses"], rtol=1e-5)
  assert mesh["moved"] == single["moved"] == mesh["mu_keys"]
  assert all(k.startswith(("classifier/", "encoder/layer_1/", "encoder/pooler/"))
             for k in mesh["moved"])
  assert mesh["mu_specs_match"] and mesh["sharded_mu"] > 0


def test_objectives_without_task_heads_refuse_freeze_and_features():
  """Distillation (and any objective that is not a fine-tuning task) builds its own models."""
  for overrides, needle in (({"freeze.encoder": True}, "freeze.encoder=True applies to fine-tuning"),
                            ({"head.features": "last"}, "head.features='last' applies to")):
    config = task_config(**overrides, objective="distill_glue")
    model_cfg = get_objective(task_config()).model_config(config)
    with pytest.raises(UserError, match=needle):
      config_checks.check_freeze(config, types.SimpleNamespace(), model_cfg)


def test_layerwise_decay_over_the_trainable_layers():
  """Layer-wise learning rates apply to the trainable tree: the top layer at full rate, the head
  too; nothing else moves."""
  config = task_config(**{"freeze.encoder": True, "freeze.train_top_layers": 2,
                          "model.num_hidden_layers": 3, "optimizer.layerwise_lr_decay": 0.5})
  s, state = build(config)
  before = flat(state.params)
  state, _ = run_steps(s, state, glue_batch(), 1)
  moved = changed(before, flat(state.params))
  assert {k.split("/")[1] for k in moved if k.startswith("encoder/")} == {"layer_1", "layer_2",
                                                                          "pooler"}


def test_runs_recorded_before_freeze_existed_resume():
  """A workdir whose config.json predates freeze.*, head.* and optimizer.keep_pruned resumes with them at their inert
  defaults, and only there."""
  config = task_config()
  recorded = workdir_lib.flatten(workdir_lib.as_recorded(config.to_dict()))
  for key in ("freeze.encoder", "freeze.train_top_layers", "freeze.train_embeddings",
              "head.features", "head.layers", "head.pooling", "optimizer.keep_pruned", "data.generated",
              "data.generated_families", "data.generated_tokens"):
    assert workdir_lib.allowed(key, workdir_lib._ABSENT, recorded[key]) is None, key
  assert workdir_lib.allowed("optimizer.keep_pruned", workdir_lib._ABSENT, True) is not None
  assert workdir_lib.allowed("freeze.encoder", workdir_lib._ABSENT, True) is not None
  assert workdir_lib.allowed("head.features", "standard", "concat") is not None
