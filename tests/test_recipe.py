"""ModernBERT's training-recipe settings: StableAdamW, the warmup-stable-decay schedule, batch-size
warmup and the masking-rate schedule, each checked against a direct computation."""
# Packing ("a packed row computes each instance as it does alone") is tested in test_packing.py.

import math
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax.core.errors import UserError
from bertjax.data import batch_warmup, masking, pipeline
from bertjax.registry import get_objective
from bertjax.runtime import checkpoints, metric_writers, optim
from bertjax.trainer import train
from configs.common import base_config
from test_train import tiny_config


def recipe_config(**optimizer):
  c = base_config()
  c.total_steps, c.learning_rate = 20, 8e-4
  c.optimizer.name, c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = "stableadamw", 0.9, 0.98, 1e-6
  c.optimizer.weight_decay, c.optimizer.fully_decoupled_weight_decay = 1e-5, True
  c.optimizer.grad_clip_norm = 0.0
  c.optimizer.warmup_steps, c.optimizer.decay = 4, "wsd"
  c.optimizer.wsd_decay_fraction = 0.25
  for key, value in optimizer.items():
    c.optimizer[key] = value
  return c


def debias(beta, t):
  """optimi's debiased beta: Adam's bias correction folded into the moving averages."""
  return (beta**t - beta) / (beta**t - 1)


def optimi_stableadamw(params, grads, lrs, *, b1, b2, eps, wd, max_lr, decayed):
  """optimi's StableAdamW step (decouple_lr=True) written out in float64 numpy, per tensor."""
  params = {k: v.astype(np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in params.items()}
  v = {k: np.zeros_like(v) for k, v in params.items()}
  clipped = []
  for t, (g_t, lr) in enumerate(zip(grads, lrs), start=1):
    for k in params:
      g = g_t[k].astype(np.float64)
      b1_hat, b2_hat = debias(b1, t), debias(b2, t)
      m[k] = b1_hat * m[k] + (1 - b1_hat) * g
      v[k] = b2_hat * v[k] + (1 - b2_hat) * g * g
      rms = math.sqrt(np.mean(g * g / np.maximum(v[k], eps * eps)))
      clipped.append(rms > 1)
      eta = lr / max(1.0, rms)
      if decayed[k]:
        params[k] = params[k] * (1 - (eta / max_lr) * wd)
      params[k] = params[k] - eta * m[k] / (np.sqrt(v[k]) + eps)
  return params, clipped


def test_stableadamw_equals_a_direct_implementation_of_its_update_over_20_steps():
  config = recipe_config()
  rng = np.random.default_rng(0)
  params = {"dense": {"kernel": rng.normal(size=(4, 3)).astype(np.float32),
                      "bias": rng.normal(size=(3,)).astype(np.float32)},
            "layer_norm": {"scale": rng.normal(size=(3,)).astype(np.float32)}}
  flat = lambda tree: {"/".join(getattr(p, "key", str(p)) for p in path): np.asarray(x)
                       for path, x in jax.tree_util.tree_leaves_with_path(tree)}
  grads = []
  for t in range(20):
    g = jax.tree.map(lambda p: rng.normal(size=p.shape).astype(np.float32), params)
    if t in (8, 14):  # a gradient spike: the update clipping must act on these steps
      g = jax.tree.map(lambda x: 30.0 * x, g)
    grads.append(g)
  schedule = optim.make_schedule(config)
  lrs = [float(schedule(t)) for t in range(20)]
  want, clipped = optimi_stableadamw(
      flat(params), [flat(g) for g in grads], lrs, b1=0.9, b2=0.98, eps=1e-6, wd=1e-5,
      max_lr=8e-4, decayed={"dense/kernel": True, "dense/bias": False, "layer_norm/scale": False})
  assert any(clipped) and not all(clipped)  # both branches of max(1, RMS) are exercised

  optimizer = optim.make_optimizer(config)
  state = optimizer.init(params)

  @jax.jit
  def step(p, s, g):
    updates, s = optimizer.update(g, s, p)
    return optax.apply_updates(p, updates), s

  got = params
  for g in grads:
    got, state = step(got, state, g)
  for key, value in flat(got).items():
    np.testing.assert_allclose(value, want[key], rtol=2e-5, atol=1e-7, err_msg=key)
  moved = flat(got)["dense/kernel"] - flat(params)["dense/kernel"]
  assert np.max(np.abs(moved)) > 1e-3  # the steps did something measurable


def test_stableadamw_decays_kernels_by_the_scheduled_share_of_weight_decay_only():
  """With zero gradients the only change is the decay: kernels by (lr_t / peak) * wd per step
  (fully decoupled), or lr_t * wd without it; biases and norms not at all."""
  params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones((2,))}}
  zeros = jax.tree.map(jnp.zeros_like, params)
  for fully, per_step in ((True, 0.1), (False, 8e-4 * 0.1)):
    config = recipe_config(weight_decay=0.1, fully_decoupled_weight_decay=fully,
                           warmup_steps=0, wsd_decay_fraction=0.0)  # lr_t = the peak, 8e-4
    optimizer = optim.make_optimizer(config)
    updates, _ = optimizer.update(zeros, optimizer.init(params), params)
    np.testing.assert_allclose(updates["dense"]["kernel"], -per_step, rtol=1e-6)
    np.testing.assert_array_equal(updates["dense"]["bias"], 0.0)


@pytest.mark.parametrize("shape", ["1-sqrt", "linear"])
def test_wsd_schedule_warms_up_holds_the_peak_then_decays(shape):
  config = recipe_config(warmup_steps=10, wsd_decay_fraction=0.2, wsd_decay_shape=shape,
                         end_learning_rate_factor=0.1)
  config.total_steps, config.learning_rate = 100, 1.0
  lr = lambda step: float(optim.make_schedule(config)(step))
  # Warmup: linear from 0 to the peak over 10 steps.
  assert lr(0) == 0.0
  assert lr(5) == pytest.approx(0.5)
  # Plateau: the peak from the end of warmup until the decay's 20 steps begin at step 80.
  for step in (10, 40, 79, 80):
    assert lr(step) == pytest.approx(1.0)
  # Decay: end + (peak - end) * (1 - f(x)), x the share of the 20 decay steps done.
  f = math.sqrt if shape == "1-sqrt" else (lambda x: x)
  for step in (85, 90, 99, 100):
    x = (step - 80) / 20
    assert lr(step) == pytest.approx(0.1 + 0.9 * (1 - f(x)), rel=1e-6)
  assert lr(90) == pytest.approx(0.1 + 0.9 * (1 - math.sqrt(0.5)) if shape == "1-sqrt" else 0.55)
  assert lr(150) == pytest.approx(0.1)  # past the end: the end value


def test_wsd_schedule_without_warmup_or_decay_is_the_peak():
  config = recipe_config(warmup_steps=0, wsd_decay_fraction=0.0)
  config.learning_rate = 3e-4
  assert all(float(optim.make_schedule(config)(s)) == pytest.approx(3e-4) for s in (0, 7, 19))


def test_batch_warmup_grows_in_whole_micro_batches_as_the_tokens_come():
  # accum 4 from 1, 10 tokens per micro-batch, 100 warmup tokens: k = 1 + 3 * seen // 100.
  counts = batch_warmup.micro_batches_per_step(4, 1, 10, 100)
  seen, want = 0, []
  while (k := 1 + 3 * seen // 100) < 4:
    want.append(k)
    seen += 10 * k
  assert counts == want and counts[0] == 1 and counts[-1] == 3
  assert counts == sorted(counts) and set(counts) == {1, 2, 3}
  assert batch_warmup.micro_batches_per_step(4, 2, 10, 100)[0] == 2
  assert batch_warmup.micro_batches_per_step(4, 1, 10, 0) == []  # off: every step is full


class _Numbered:
  """Micro-batches of 2 rows numbered 0, 1, 2, ... with a resumable position."""

  def __init__(self):
    self.i = 0

  def __next__(self):
    self.i += 1
    return {"row": np.array([2 * self.i - 2, 2 * self.i - 1])}

  def get_state(self):
    return {"i": self.i}

  def set_state(self, state):
    self.i = state["i"]


def test_growing_batches_join_consecutive_micro_batches_and_resume_exactly():
  counts = [1, 1, 2, 3]
  it = batch_warmup.GrowingBatches(_Numbered(), counts, 4)
  batches = [next(it)["row"] for _ in range(6)]
  assert [len(b) for b in batches] == [2, 2, 4, 6, 8, 8]
  np.testing.assert_array_equal(np.concatenate(batches), np.arange(sum(map(len, batches))))
  again = batch_warmup.GrowingBatches(_Numbered(), counts, 4)
  for _ in range(3):
    next(again)
  state = again.get_state()
  resumed = batch_warmup.GrowingBatches(_Numbered(), counts, 4)
  resumed.set_state(state)
  for want in batches[3:]:
    np.testing.assert_array_equal(next(resumed)["row"], want)


@pytest.mark.slow
def test_a_run_with_batch_warmup_trains_smaller_steps_first_and_resumes_exactly(tmp_path):
  """Three steps of one micro-batch (4 rows), then both (8 rows); the run resumed from the
  step-2 checkpoint, mid-warmup, ends where the uninterrupted run ended."""
  kw = {"batch_size": 8, "grad_accum_steps": 2, "batch_warmup_tokens": 3 * 4 * 16,
        "checkpoint_every": 2, "eval_every": 0, "log_every": 1, "total_steps": 4}
  config = tiny_config(**kw)
  data = get_objective(config).build_inputs(config, tmp_path / "data")
  assert batch_warmup.micro_batches_per_step(2, 1, 4 * 16, 3 * 4 * 16) == [1, 1, 1]
  assert [len(next(data.train)["input_ids"]) for _ in range(5)] == [4, 4, 4, 8, 8]
  work = tmp_path / "work"
  train.train_and_evaluate(tiny_config(**kw), work)
  full = jax.device_get(checkpoints.restore_params(work))
  shutil.rmtree(work / "checkpoints" / "4")
  assert train.train_and_evaluate(tiny_config(**kw), work)["step"] == 4
  for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(checkpoints.restore_params(work))):
    np.testing.assert_array_equal(a, b)
  assert [r["step"] for r in metric_writers.read_metrics(work)] == [1, 2, 3, 4]


def test_masking_rate_schedule_is_piecewise_constant_in_the_step():
  schedule = ((3, 0.15), (6, 0.05))
  rates = [masking.rate_at(s, 0.3, schedule) for s in range(8)]
  assert rates == [0.3] * 3 + [0.15] * 3 + [0.05] * 2
  assert masking.rate_at(5, 0.3, ()) == 0.3
  for bad in (((2, 0.1), (1, 0.2)), ((1, 1.0),), ((-1, 0.1),), ((1, 0.1, 2),)):
    with pytest.raises(UserError, match="rate_schedule"):
      masking.check_rate_schedule(bad)


def test_masking_rate_schedule_masks_each_step_at_its_rate_and_resumes_exactly():
  from test_pipeline import SPECIAL, WORD_START, corpus
  make = lambda: pipeline.make_pretraining_iterator(
      corpus(), pipeline.Instances(kind="full", max_seq_length=48),
      masking.Masking(max_predictions=40, mask_rate=0.4, rate_schedule=((2, 0.1),)),
      batch_size=4, seed=0, special=SPECIAL, word_start_mask=WORD_START)
  it = make()
  batches = [next(it) for _ in range(4)]
  real = lambda b: np.sum(b["input_ids"] != SPECIAL.pad, axis=1)
  for step, batch in enumerate(batches):
    rate = 0.4 if step < 2 else 0.1
    want = np.maximum(1, np.round(real(batch) * rate))
    np.testing.assert_array_equal(batch["masked_weights"].sum(axis=1), want, err_msg=str(step))
  resumed = make()
  for _ in range(1):
    next(resumed)
  state = resumed.get_state()
  resumed = make()
  resumed.set_state(state)
  for want in batches[1:]:
    got = next(resumed)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_with_a_batch_warmup_a_micro_batch_is_masked_at_the_rate_of_its_step():
  # counts [1, 1, 2]: micro-batches 0, 1 are steps 0, 1; 2-3 step 2; then 4 per step (accum 4).
  steps = [batch_warmup.step_of_micro_batch(i, [1, 1, 2], 4) for i in range(12)]
  assert steps == [0, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4]


def test_a_config_masking_rate_schedule_follows_the_steps_of_a_batch_warmup(tmp_path):
  """Steps 0, 1 run one micro-batch of 4 rows, then two (counts [1, 1]); from step 3 the rate
  is 0.6: all of step 2's rows (micro-batches 2, 3) at 0.1, all of step 3's at 0.6."""
  config = tiny_config(**{"data.synthetic": False, "data.generated": "context", "objective": "mlm",
                          "max_predictions_per_seq": 12, "masking.rate": 0.1, "batch_size": 8,
                          "grad_accum_steps": 2, "batch_warmup_tokens": 2 * 4 * 16})
  config.masking.rate_schedule = ((3, 0.6),)
  data = get_objective(config).build_inputs(config, tmp_path)
  for step, rate in enumerate((0.1, 0.1, 0.1, 0.6, 0.6)):
    batch = next(data.train)
    real = np.sum(batch["input_ids"] != 0, axis=1)
    assert len(real) == (4 if step < 2 else 8)
    want = np.minimum(12, np.maximum(1, np.round(real * rate)))
    np.testing.assert_array_equal(batch["masked_weights"].sum(axis=1), want, err_msg=str(step))


def test_mlm_trains_on_packed_documents_with_data_kind_single(tmp_path):
  """ModernBERT's packing: mlm on 'single' instances (each [CLS] document [SEP]) packed into
  rows kept apart by segment ids (the encoder computing each as alone: test_packing.py)."""
  config = tiny_config(**{"data.synthetic": False, "data.generated": "context", "objective": "mlm",
                          "data.kind": "single", "data.pack": True, "max_seq_length": 64})
  objective = get_objective(config)
  batch = next(objective.build_inputs(config, tmp_path / "packed").train)
  assert batch["segment_ids"].max() > 1 and "segment_ids" in objective.model_inputs(batch)
  cls = batch["input_ids"] == 2  # every packed document opens with its own [CLS]
  starts = np.diff(batch["segment_ids"], axis=1, prepend=0) > 0
  np.testing.assert_array_equal(cls, starts & (batch["segment_ids"] > 0))
  nsp = tiny_config(**{"data.synthetic": False, "data.generated": "context", "data.kind": "single"})
  with pytest.raises(UserError, match="data.kind='single' does not suit objective 'mlm_nsp'"):
    get_objective(nsp).build_inputs(nsp, tmp_path / "nsp")
