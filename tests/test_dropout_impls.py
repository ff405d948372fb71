"""The dropout implementations behind `model.dropout_impl` (bertjax.models.dropout): each drops at
the configured rate, scales the rest, differentiates with its own mask and keeps for the backward
pass what it says; the setting is declared, refused when unknown, resumed when absent and reaches
the model of a bf16 train step."""

import functools
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import inputs
from bertjax.config import config_checks, config_lib
from bertjax.core.errors import UserError
from bertjax.models import kernels
from bertjax.models.config import ModelConfig
from bertjax.models.dropout import Dropout, IMPLEMENTATIONS, dropout, threshold
from bertjax.runtime import workdir as workdir_lib
from tests.helpers import REPO, effective_rate
from tests.test_accelerator_paths import step_setup

SHAPE = (1024, 2, 1023)  # 2.1M elements; an odd last axis (16-bit draws pair up its halves)
N = int(np.prod(SHAPE))


def apply(impl, x, rate, seed):
  return Dropout(rate, impl).apply({}, x, deterministic=False,
                                   rngs={"dropout": jax.random.key(seed)})


@functools.lru_cache(maxsize=None)
def dropped_fraction(impl: str, rate: float) -> float:
  count = jax.jit(lambda x: jnp.sum(apply(impl, x, rate, 0) == 0))(jnp.ones(SHAPE))
  return int(count) / N


def binomial_sd(rate: float, n: int = N) -> float:
  return float(np.sqrt(rate * (1 - rate) / n))


def test_implementations_are_every_form_with_every_generator():
  assert len(IMPLEMENTATIONS) == len(set(IMPLEMENTATIONS)) == 12
  assert {i.partition("+")[0] for i in IMPLEMENTATIONS} == {"packed32", "mask32", "bits16",
                                                            "recompute16"}
  assert {i.partition("+")[2] for i in IMPLEMENTATIONS} == {"", "rbg", "unsafe_rbg"}


@pytest.mark.parametrize("rate", [0.1, 0.5])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_drop_rate_is_the_configured_rate(impl, rate):
  assert abs(dropped_fraction(impl, rate) - rate) < 4 * binomial_sd(rate)


def test_sixteen_bit_thresholds_are_within_2_to_the_minus_17():
  rates = np.linspace(0, 1 - 2 ** -16, 5001).tolist() + [0.1, 1 / 3, 0.0123]
  assert max(abs(effective_rate(r, 16) - r) for r in rates) <= 2 ** -17
  assert abs(effective_rate(0.1, 16) - 0.1) > 2 ** -20  # 16-bit, not 32-bit, resolution
  assert threshold(0.1, 16) == 6554 and threshold(0.1) == 429496730


def test_implementations_agree_on_the_rate():
  """Each against packed32 within 4 standard deviations of a difference of two samples; the
  check would separate a byte-resolution mask's rate (26/256 for 0.1) from 0.1."""
  rate, sd = 0.1, binomial_sd(0.1) * np.sqrt(2)
  base = dropped_fraction("packed32", rate)
  for impl in IMPLEMENTATIONS:
    assert abs(dropped_fraction(impl, rate) - base) < 4 * sd, impl
  assert 26 / 256 - 0.1 > 4 * sd


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_masks_follow_the_key_and_kept_values_are_scaled(impl):
  x = jax.random.normal(jax.random.key(0), (4, 16, 33)) + 5.0  # nowhere zero
  a, b, c = apply(impl, x, 0.3, 1), apply(impl, x, 0.3, 1), apply(impl, x, 0.3, 2)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(np.asarray(a) == 0, np.asarray(c) == 0)
  kept = np.asarray(a) != 0
  assert 0 < kept.mean() < 1
  np.testing.assert_allclose(np.asarray(a)[kept], np.asarray(x)[kept] / 0.7, rtol=1e-6)
  assert Dropout(0.3, impl).apply({}, x, deterministic=True) is x


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_gradient_is_the_forward_mask_scaled(impl, dtype):
  """d<g, dropout(x)>/dx = g * keep / (1 - rate) with the mask the forward pass drew, under jit
  (where recompute16 draws it a second time)."""
  x = (jax.random.uniform(jax.random.key(0), (4, 8, 37)) + 1.0).astype(dtype)  # nowhere zero
  g = jax.random.normal(jax.random.key(1), x.shape, dtype)
  rate = 0.25
  y, vjp = jax.vjp(jax.jit(lambda x: apply(impl, x, rate, 7)), x)
  (grad,) = vjp(g)
  keep = (y != 0).astype(dtype)  # the forward's own mask
  want = jax.grad(lambda x: jnp.vdot(x * keep / jnp.asarray(1 - rate, dtype), g))(x)
  np.testing.assert_allclose(np.asarray(grad, np.float32), np.asarray(want, np.float32),
                             rtol=1e-6 if dtype == jnp.float32 else 1e-2)


def residuals(impl, x, seed=3):
  """What the backward pass of a jitted dropout keeps: the leaves of its VJP function."""
  _, vjp = jax.vjp(jax.jit(lambda x: dropout(x, jax.random.key(seed), 0.1, impl)), x)
  return jax.tree.leaves(vjp)


def mask_sized(leaves, x):
  """The kept arrays with at least one element per 8 of x's: a mask, packed or not."""
  return [r for r in leaves if r.size * 8 >= x.size]


@pytest.mark.parametrize("impl", ["recompute16", "recompute16+rbg", "recompute16+unsafe_rbg"])
def test_recompute16_keeps_only_the_key(impl):
  x = jnp.ones((8, 16, 64))
  kept = residuals(impl, x)
  assert mask_sized(kept, x) == []
  assert all(r.dtype == jnp.uint32 and r.size <= 4 for r in kept), kept
  # The key's words, whatever x is.
  for r, s in zip(kept, residuals(impl, 2 * x + 1)):
    np.testing.assert_array_equal(r, s)


def test_packed32_keeps_the_mask_a_bit_an_element():
  x = jnp.ones((8, 16, 64))
  masks = mask_sized(residuals("packed32", x), x)
  assert [(m.dtype, m.shape) for m in masks] == [(jnp.uint8, (8, 16, 8))]


def test_mask_check_fails_for_a_form_that_keeps_its_mask():
  """The twin of the recompute16 check: mask32 keeps a boolean array of x's shape, which the
  same check finds."""
  x = jnp.ones((8, 16, 64))
  masks = mask_sized(residuals("mask32", x), x)
  assert any(m.dtype == jnp.bool_ and m.shape == x.shape for m in masks)


@pytest.mark.parametrize("value", ["packed16", "rbg", "packed32+threefry", "PACKED32", ""])
def test_an_unknown_setting_is_refused_in_one_line(value):
  with pytest.raises(UserError) as e:
    ModelConfig(dropout_impl=value)
  message = str(e.value)
  assert f"model.dropout_impl={value!r}" in message and "recompute16+rbg" in message
  assert "\n" not in message
  with pytest.raises(UserError):
    Dropout(0.1, value).apply({}, jnp.ones((2, 8)), deterministic=False,
                              rngs={"dropout": jax.random.key(0)})
  config = config_lib.load_config_file(str(REPO / "configs" / "quickstart.py"))
  config_lib.apply_overrides(config, [f"model.dropout_impl={value!r}"])
  with pytest.raises(UserError, match="fix: --config.model.dropout_impl=auto"):
    config_checks.check_settings(config)


def test_auto_takes_the_kernel_sets_choice():
  assert kernels.CPU.dropout == "packed32" and kernels.TPU.dropout == "packed32"
  assert kernels.GPU.dropout == "packed32+rbg"
  for platform in kernels.PLATFORMS:
    assert kernels.for_platform(platform).dropout in IMPLEMENTATIONS
    cfg = ModelConfig(kernels=platform)
    assert kernels.dropout_for_model(cfg) == kernels.for_platform(platform).dropout
    assert kernels.dropout_for_model(cfg.replace(dropout_impl="bits16")) == "bits16"
  assert ModelConfig().dropout_impl == "auto"


def test_runs_recorded_without_the_setting_resume_at_auto(tmp_path):
  recorded = {"model": {"hidden_size": 32}, "seed": 0}
  (tmp_path / "config.json").write_text(json.dumps(recorded))
  settings = workdir_lib.Settings(tmp_path, allow_changes=False)
  settings.check({"model": {"hidden_size": 32, "dropout_impl": "auto"}, "seed": 0})
  with pytest.raises(UserError, match="model.dropout_impl"):
    settings.check({"model": {"hidden_size": 32, "dropout_impl": "mask32"}, "seed": 0})


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["packed32", "mask32+rbg", "bits16+unsafe_rbg",
                                  "recompute16+rbg"])
def test_a_bf16_train_step_runs_with_each_form(impl):
  config, cfg, state, run = step_setup("configs/quickstart.py", **{
      "model.dtype": "bfloat16", "model.dropout_impl": impl, "model.hidden_dropout_prob": 0.1,
      "model.attention_probs_dropout_prob": 0.1, "optimizer.warmup_steps": 0})
  assert kernels.dropout_for_model(cfg) == impl  # the setting reached the model's config
  batch = next(inputs.SyntheticBatches(config, cfg.vocab_size, 0, config.batch_size))
  before = jax.tree.map(np.asarray, state.params)
  with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.rules):
    # ... and the compiled step: XLA's RngBitGenerator draws the +rbg masks, threefry the others.
    assert ("rng_bit_generator" in run.train_step.lower(state, batch).as_text()) == ("+" in impl)
    state, metrics = run.train_step(state, batch)
  total, count = metrics["loss"]
  assert np.isfinite(float(total / count)) and float(count) > 0
  moved = jax.tree.leaves(jax.tree.map(lambda a, b: not np.array_equal(a, np.asarray(b)),
                                       before, state.params))
  assert any(moved)
