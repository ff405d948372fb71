"""What an accelerator's train step relies on, checked on the CPU (bertjax.models.kernels).

- A bfloat16 train step scatters nothing in bfloat16: embedding lookups read the float32 tables
  (token types through a one-hot product, default positions as a slice) and half-precision rows
  are gathered from a float32 view, so every gradient scatter-add runs in float32.
- 20 bfloat16 steps follow the float32 loss curve.
- Every attention path (fused by key lengths, by a boolean mask, by a packed per-query mask, with
  gathered queries, the explicit path for output_attentions) gives the explicit path's outputs and
  gradients; the GPU choices (run here with XLA's implementation) give the CPU choices' results.
  The TPU set's splash kernel: tests/test_splash_attention.py.
"""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import pytest

from bertjax import inputs
from bertjax.config import config_lib
from bertjax.core.errors import UserError
from bertjax.models import kernels
from bertjax.models.attention import (AttentionMask, attention_implementation, attention_mask_for,
                                      explicit_attention, fused_attention, make_attention_mask)
from bertjax.models.config import ModelConfig
from bertjax.models.encoder import Encoder
from bertjax.registry import get_objective
from bertjax.runtime import sharding, workdir
from bertjax.trainer import train
from tests.helpers import load_config

TINY = {"model.hidden_size": 32, "model.intermediate_size": 64, "model.num_attention_heads": 4,
        "model.num_hidden_layers": 2, "max_seq_length": 32, "max_predictions_per_seq": 5,
        "batch_size": 8, "data.synthetic": True}


def scatter_types(hlo: str) -> list[str]:
  """The operand and result types of every scatter in a StableHLO module's text."""
  lines, found = hlo.splitlines(), []
  for i, line in enumerate(lines):
    if "stablehlo.scatter" not in line:
      continue
    for j in range(i, len(lines)):  # the signature closes the op's region
      m = re.search(r"\}\) : \((.*)\) -> (.*)$", lines[j])
      if m:
        found.append(m.group(0))
        break
  return found


def bf16_scatters(hlo: str) -> list[str]:
  return [t for t in scatter_types(hlo) if "bf16" in t]


def step_setup(spec: str, **settings):
  config = load_config(spec, **{**TINY, **settings})
  objective = get_objective(config)
  cfg = objective.model_config(config)
  mesh = sharding.make_mesh(config.mesh_shape)
  run, state = train.setup(config, objective, cfg, mesh, rules=sharding.rules_from_config(config))  # the trainer's own step
  return config, cfg, state, run


def lowered_step_text(spec: str, **settings) -> str:
  config, cfg, state, run = step_setup(spec, **settings)
  batch = next(inputs.SyntheticBatches(config, cfg.vocab_size, 0, config.batch_size))
  with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.rules):
    return run.train_step.lower(state, batch).as_text()


def test_scatter_check_sees_a_bf16_embedding_gradient():
  """The check below can fail: a lookup on a table cast to bf16 (what nn.Embed(dtype=bf16) does)
  scatters its gradient in bf16."""
  table = jnp.ones((50, 8), jnp.float32)
  ids = jnp.arange(12).reshape(3, 4)
  cast_first = jax.grad(lambda t: jnp.sum(jnp.take(t.astype(jnp.bfloat16), ids, axis=0)))
  assert bf16_scatters(jax.jit(cast_first).lower(table).as_text())


@pytest.mark.parametrize("spec,kernel_set", [
    ("configs/quickstart.py", "cpu"), ("configs/quickstart.py", "gpu"),
    ("configs/albert.py:runlocal", "cpu"), ("configs/spanbert.py:runlocal", "gpu"),
    ("configs/electra.py:runlocal", "cpu"), ("configs/roberta.py:runlocal", "gpu"),
    pytest.param("configs/quickstart.py", "tpu", marks=pytest.mark.slow)])  # splash, interpreted
def test_bf16_train_step_scatters_nothing_in_bf16(spec, kernel_set):
  hlo = lowered_step_text(spec, **{"model.dtype": "bfloat16", "model.kernels": kernel_set})
  assert scatter_types(hlo), "expected the word-embedding gradient's float32 scatter"
  assert bf16_scatters(hlo) == []
  assert "bf16" in hlo  # the step does compute in bf16


@pytest.mark.slow
def test_bf16_steps_track_the_float32_loss_curve():
  """20 steps on 4 repeated batches (the loss falls, so the curves have a shape to follow):
  bf16 compute with float32 parameters, optimizer state and loss stays within 1% of float32 at
  every step (measured: 0.2% at most, loss 8.99 -> 6.31)."""
  losses = {}
  for dtype in ("float32", "bfloat16"):
    config, cfg, state, run = step_setup(
        "configs/quickstart.py", **{"model.dtype": dtype, "learning_rate": 5e-3,
                                    "optimizer.warmup_steps": 0})
    source = inputs.SyntheticBatches(config, cfg.vocab_size, 0, config.batch_size)
    batches = [next(source) for _ in range(4)]
    curve = []
    with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.rules):
      for k in range(20):
        state, metrics = run.train_step(state, batches[k % 4])
        total, count = metrics["loss"]
        curve.append(float(total / count))
    assert all(jax.tree.leaves(jax.tree.map(lambda p: p.dtype == jnp.float32, state.params)))
    losses[dtype] = np.array(curve)
  f32, bf16 = losses["float32"], losses["bfloat16"]
  assert f32[-1] < 0.8 * f32[0], f32  # learning, so there is a curve to track
  rel = np.abs(bf16 - f32) / f32
  assert rel.max() < 0.01, rel


# --------------------------------------------------------------------------- attention paths

B, S, H, D = 3, 16, 4, 8


def qkv(seed=0, q_len=S):
  keys = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(keys[0], (B, q_len, H, D)), jax.random.normal(keys[1], (B, S, H, D)),
          jax.random.normal(keys[2], (B, S, H, D)))


def right_padded(lengths=(16, 11, 5)):
  return (np.arange(S)[None, :] < np.array(lengths)[:, None]).astype(np.int32)


def packed_segments():
  seg = np.zeros((B, S), np.int32)
  seg[0, :7], seg[0, 7:13] = 1, 2
  seg[1, :16] = 1
  seg[2, :3], seg[2, 3:9], seg[2, 9:12] = 1, 2, 3
  return seg


def explicit(q, k, v, keys):
  return explicit_attention(q, k, v, keys, lambda p: p)[0]


def value_and_grads(fn, q, k, v, rows=None):
  """fn's output and the gradient of a scalar of it (at `rows` only, when given)."""
  def scalar(q, k, v):
    out = fn(q, k, v)
    out = out if rows is None else out * rows[:, :, None, None]
    return jnp.sum(jnp.sin(out)), out
  (_, out), grads = jax.value_and_grad(scalar, argnums=(0, 1, 2), has_aux=True)(q, k, v)
  return out, grads


def assert_same(a, b, rows=None):
  (out_a, g_a), (out_b, g_b) = a, b
  if rows is not None:
    out_a, out_b = out_a * rows[:, :, None, None], out_b * rows[:, :, None, None]
  np.testing.assert_allclose(out_a, out_b, rtol=1e-5, atol=1e-5)
  for x, y in zip(g_a, g_b):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def test_key_lengths_give_the_masked_results():
  q, k, v = qkv(1)
  mask = right_padded()
  keys = make_attention_mask(jnp.asarray(mask))
  lengths = attention_mask_for(kernels.GPU, jnp.asarray(mask))
  assert lengths.lengths.tolist() == [16, 11, 5] and bool(lengths.right_padded)
  ref = value_and_grads(lambda q, k, v: explicit(q, k, v, keys), q, k, v)
  for deterministic in (True, False):  # inference checks the padding, training trusts it
    assert_same(value_and_grads(
        lambda q, k, v: fused_attention(q, k, v, lengths, "xla", deterministic), q, k, v), ref)
  assert_same(value_and_grads(lambda q, k, v: fused_attention(q, k, v, AttentionMask(keys), "xla"),
                              q, k, v), ref)
  # Padding keys are unseen on every path: changing them moves nothing.
  v2 = v.at[2, 8:].set(7.0)
  np.testing.assert_allclose(fused_attention(q, k, v2, lengths, "xla"),
                             fused_attention(q, k, v, lengths, "xla"), rtol=1e-6, atol=1e-6)


def test_packed_segments_give_the_explicit_results():
  q, k, v = qkv(2)
  seg = packed_segments()
  keys = make_attention_mask(jnp.asarray(seg > 0), jnp.asarray(seg))
  rows = jnp.asarray(seg > 0, jnp.float32)  # padding queries see nothing: compare real rows
  ref = value_and_grads(lambda q, k, v: explicit(q, k, v, keys), q, k, v, rows)
  got = value_and_grads(lambda q, k, v: fused_attention(q, k, v, AttentionMask(keys), "xla"),
                        q, k, v, rows)
  assert_same(got, ref, rows)


def test_gathered_queries_give_the_explicit_results():
  q, k, v = qkv(3, q_len=5)
  mask = right_padded()
  keys = make_attention_mask(jnp.asarray(mask))
  lengths = attention_mask_for(kernels.GPU, jnp.asarray(mask))
  ref = value_and_grads(lambda q, k, v: explicit(q, k, v, keys), q, k, v)
  assert_same(value_and_grads(lambda q, k, v: fused_attention(q, k, v, lengths, "xla", False),
                              q, k, v), ref)


def test_implementation_follows_platform_dtype_and_head_size():
  gpu = kernels.GPU
  pick = lambda cfg, head, dtype, cudnn=True: attention_implementation(cfg, head, dtype, cudnn)
  assert pick(gpu, 64, jnp.bfloat16) == "cudnn"
  assert pick(gpu, 64, jnp.float16) == "cudnn"
  assert pick(gpu, 64, jnp.float32) == "xla"    # cuDNN takes half precision
  assert pick(gpu, 12, jnp.bfloat16) == "xla"   # head size not a multiple of 8
  assert pick(gpu, 64, jnp.bfloat16, False) == "xla"  # the GPU set where cuDNN does not run
  assert attention_implementation(gpu, 64, jnp.bfloat16) == "xla"  # here: a CPU
  assert pick(kernels.CPU, 64, jnp.bfloat16) == "xla"
  assert pick(kernels.TPU, 64, jnp.bfloat16) == "splash"  # any dtype
  assert pick(kernels.TPU, 64, jnp.float32) == "splash"
  assert pick(kernels.TPU_XLA, 64, jnp.bfloat16) == "xla"
  assert kernels.for_model(ModelConfig()) == kernels.for_platform(jax.default_backend())
  assert kernels.for_platform("cuda") == kernels.GPU


def encoder_results(cfg, ids, mask, types, segment_ids=None, deterministic=True, **kw):
  model = Encoder(cfg)
  params = model.init(jax.random.key(0), ids)["params"]
  rows = jnp.asarray(mask, jnp.float32)[:, :, None]

  def scalar(p):
    out = model.apply({"params": p}, ids, mask, types, segment_ids=segment_ids,
                      deterministic=deterministic, rngs={"dropout": jax.random.key(5)}, **kw)
    return jnp.sum(jnp.sin(out.last_hidden_state) * rows), out
  (_, out), grads = jax.value_and_grad(scalar, has_aux=True)(params)
  return out, grads


def encoder_inputs():
  rng = np.random.default_rng(0)
  mask = right_padded()
  ids = np.where(mask > 0, rng.integers(5, 60, (B, S)), 0).astype(np.int32)
  types = np.zeros((B, S), np.int32)
  types[:, S // 2:] = 1
  return ids, mask, types


def tree_close(a, b, rtol=2e-5, atol=2e-6):
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol,
                               err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow
@pytest.mark.parametrize("arch,packed,other", [
    ("bert", False, "gpu"), ("bert", True, "gpu"), ("roberta", False, "gpu"),
    ("roberta", True, "gpu"), ("bert", False, "tpu")])
def test_accelerator_choices_give_the_cpu_choices_results(arch, packed, other):
  """The GPU set (no activation remat, key lengths, one-hot token types), run here with XLA's
  attention, and the TPU set (also Dense as a dot_general over the kernel's axes and LayerNorm by
  autodiff) against the CPU set: same outputs, same gradients. With attention dropout on,
  training takes the explicit path on both; both draw the masks the same way (the sets' own
  dropout choices, the GPU set's Pallas attention-dropout kernel among them, draw different masks
  at the same rate: tests/test_flash_attention.py compares that kernel under the same mask)."""
  ids, mask, types = encoder_inputs()
  seg = None
  if packed:
    seg = packed_segments()
    mask = (seg > 0).astype(np.int32)
    ids = np.where(mask > 0, ids + 1, 0).astype(np.int32)
  base = ModelConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=S + 2, architecture=arch,
                     pad_token_id=1 if arch == "roberta" else 0, hidden_dropout_prob=0.1,
                     attention_probs_dropout_prob=0.1, dropout_impl="packed32",
                     attention_dropout_kernel="explicit")
  for deterministic in (True, False):
    cpu = encoder_results(base.replace(kernels="cpu"), ids, mask, types, seg, deterministic)
    acc = encoder_results(base.replace(kernels=other), ids, mask, types, seg, deterministic)
    rows = np.asarray(mask, bool)
    np.testing.assert_allclose(np.asarray(cpu[0].last_hidden_state)[rows],
                               np.asarray(acc[0].last_hidden_state)[rows], rtol=2e-5, atol=2e-5)
    tree_close(cpu[1], acc[1], rtol=1e-4, atol=1e-5)


def test_output_attentions_takes_the_explicit_path_with_the_same_outputs():
  ids, mask, types = encoder_inputs()
  cfg = ModelConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=S, kernels="gpu")
  plain = encoder_results(cfg, ids, mask, types)
  scored = encoder_results(cfg, ids, mask, types, output_attentions=True)
  assert len(scored[0].attentions) == 2 and scored[0].attentions[0].shape == (B, H, S, S)
  rows = np.asarray(mask, bool)
  np.testing.assert_allclose(np.asarray(plain[0].last_hidden_state)[rows],
                             np.asarray(scored[0].last_hidden_state)[rows], rtol=2e-5, atol=2e-5)
  tree_close(plain[1], scored[1], rtol=1e-4, atol=1e-5)


def test_too_long_sequences_fail_with_one_line():
  cfg = ModelConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=8)
  with pytest.raises(UserError, match="exceed the model.s 8 positions"):
    Encoder(cfg).init(jax.random.key(0), jnp.zeros((1, 16), jnp.int32))


@pytest.mark.parametrize("kind", ["left", "hole"])
def test_key_lengths_fall_back_on_masks_that_are_not_right_padded(kind):
  """Inference through the lengths path detects a left-padded row or a row with a hole and takes
  the mask instead: the explicit path's outputs."""
  q, k, v = qkv(4)
  mask = right_padded()
  if kind == "left":
    mask[2] = mask[2][::-1]
  else:
    mask[0, 4] = 0
  am = attention_mask_for(kernels.GPU, jnp.asarray(mask))
  assert am.lengths is not None and not bool(am.right_padded)
  want = explicit(q, k, v, am.keys)
  np.testing.assert_allclose(fused_attention(q, k, v, am, "xla", deterministic=True), want,
                             rtol=1e-5, atol=1e-5)
  # What lengths alone would give differs: the fallback is doing the work.
  lengths_only = fused_attention(q, k, v, am, "xla", deterministic=False)
  assert np.max(np.abs(np.asarray(lengths_only) - np.asarray(want))) > 1e-3
  right = attention_mask_for(kernels.GPU, jnp.asarray(right_padded()))
  assert bool(right.right_padded)


def test_one_row_token_type_table_serves_every_id():
  """RoBERTa's type_vocab_size=1: ids of 1 (GLUE pairs set them) read row 0, as nn.Embed does."""
  ids, mask, types = encoder_inputs()
  cfg = ModelConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=S + 2, architecture="roberta",
                    pad_token_id=1, type_vocab_size=1)
  model = Encoder(cfg)
  params = model.init(jax.random.key(0), ids)["params"]
  a = model.apply({"params": params}, ids, mask, types).last_hidden_state
  b = model.apply({"params": params}, ids, mask, np.zeros_like(types)).last_hidden_state
  np.testing.assert_array_equal(a, b)


def test_cudnn_takes_odd_lengths_and_per_query_masks():
  """Odd lengths are padded for cuDNN (tests/test_cudnn_rules.py), so the choice no longer
  depends on them."""
  gpu = kernels.GPU
  assert attention_implementation(gpu, 64, jnp.bfloat16, True) == "cudnn"
  assert kernels.GPU.row_multiple == 8 and kernels.CPU.row_multiple == 1


def test_kernel_overrides_change_one_field_and_bad_ones_are_one_line():
  """model.kernel_overrides: the ablation's handle on one choice of a set, a setting per field."""
  config = load_config("configs/quickstart.py", **{
      "model.kernels": "gpu", "model.kernel_overrides.flat_dense": False,
      "model.kernel_overrides.layer_norm_vjp": False, "model.kernel_overrides.row_multiple": 2,
      "model.kernel_overrides.dropout": "packed32"})
  cfg = ModelConfig.from_dict(config.model.to_dict())
  got = kernels.for_model(cfg)
  assert (got.flat_dense, got.layer_norm_vjp, got.row_multiple, got.dropout) == (
      False, False, 2, "packed32")
  assert got.attention == kernels.GPU.attention  # the rest of the set as it was
  assert cfg.to_dict()["kernel_overrides"] == {"dropout": "packed32", "flat_dense": False,
                                               "layer_norm_vjp": False, "row_multiple": 2}
  assert kernels.for_model(ModelConfig(kernels="gpu")) == kernels.GPU
  assert ModelConfig().to_dict()["kernel_overrides"] == ""  # none: as records always held it
  # A placement setting, field by field: a resumed run may change them as model.kernels.
  for old, new in (("(absent)", True), (False, True), (True, "(absent)")):
    assert workdir.allowed("model.kernel_overrides.fused_residual", old, new) is None
  for bad, needle in [(("flat", True), "not a field"), (("flat_dense", "yes"), "True or False"),
                      (("row_multiple", "two"), "takes int")]:
    with pytest.raises(UserError, match=needle):
      ModelConfig(kernel_overrides=(bad,))
  # The former string, in a config or on the command line: one line naming the fields' form.
  with pytest.raises(UserError, match=r"no longer read; .*--config\.model\.kernel_overrides\."
                                      r"flat_dense=False$"):
    ModelConfig(kernel_overrides="flat_dense=False,row_multiple=2")
  for text in ("fused_residual=True", "'fused_residual=True'"):
    with pytest.raises(UserError, match=r"group of settings .*e\.g\. "
                                        r"--config\.model\.kernel_overrides\.\w+=VALUE$"):
      config_lib.apply_overrides(load_config("configs/quickstart.py"),
                                 [f"--config.model.kernel_overrides={text}"])