"""The accelerator tier: what the CPU suite checks with XLA's stand-ins, run on a GPU or a TPU.

  python -m pytest -q -p no:xdist -m accelerator tests/test_accelerator_tier.py

Every test but the first two is marked `accelerator` and skips, with the reason, unless JAX sees a
GPU or TPU; the CPU suite (JAX_PLATFORMS=cpu, tests/conftest.py) collects and skips them. On the
device:
- every pretraining objective and every task (GLUE, SQuAD, NER runlocal) trains a few bfloat16
  steps through launch.py with the platform's kernel set, its losses finite;
- the fused attention paths (cuDNN on GPUs) give the explicit path's outputs and gradients;
- the compiled bfloat16 train step (XLA's optimized HLO) adds nothing in bfloat16 by scatter;
- the benchmark's ablation runs one short variant on the device.
"""

import json
import math
import os
import pathlib
import re
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import pytest

from bertjax import inputs
from bertjax.models.attention import (AttentionMask, attention_implementation, attention_mask_for,
                                      explicit_attention, fused_attention, make_attention_mask)
from bertjax.models.config import ModelConfig
from bertjax.runtime import metric_writers
from tests.test_accelerator_paths import step_setup

REPO = pathlib.Path(__file__).resolve().parent.parent
DEVICE = pytest.mark.accelerator


@pytest.fixture(scope="module")
def platform() -> str:
  """"gpu" or "tpu", the backend JAX runs on; anything else skips the test."""
  backend = jax.default_backend()
  if backend not in ("gpu", "tpu"):
    pytest.skip(f"needs a GPU or TPU; JAX runs on {backend} (JAX_PLATFORMS="
                f"{os.environ.get('JAX_PLATFORMS', '')!r}): run `pytest -m accelerator` on a "
                "device host")
  return backend


def bf16_scatter_adds(hlo: str) -> list[str]:
  """Scatters in an HLO module's text that add in bfloat16: their result is bfloat16, or their
  update computation rounds its sum through bfloat16 (how XLA's float normalization rewrites a
  bfloat16 scatter-add to a float32 one that still accumulates in bfloat16)."""
  bodies, name = {}, None
  for line in hlo.splitlines():
    header = re.match(r"\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->.*\{\s*$", line)
    if header:
      name = header.group(1)
      bodies[name] = ""
    elif name:
      bodies[name] += line + "\n"
  found = []
  for line in hlo.splitlines():
    m = re.search(r"=\s*(.*?)\s+scatter\(.*to_apply=%?([\w.\-]+)", line)
    body = bodies.get(m.group(2), "") if m else ""
    if m and re.search(r"\badd\(", body) and ("bf16" in m.group(1) or "bf16" in body):
      found.append(line.strip())
  return found


def test_scatter_check_sees_a_bf16_scatter_add_in_compiled_hlo():
  """The check the device test relies on can fail: an embedding lookup on a table cast to bf16
  scatters its gradient in bf16, in the compiled module too (here XLA:CPU's); float32 does not."""
  ids = jnp.arange(12).reshape(3, 4)
  table = jnp.ones((50, 8), jnp.float32)
  grad = lambda dtype: jax.jit(jax.grad(
      lambda t, i: jnp.sum(jnp.sin(jnp.take(t.astype(dtype), i, axis=0)))))
  hlo = {d: grad(d).lower(table, ids).compile().as_text() for d in (jnp.bfloat16, jnp.float32)}
  assert "scatter(" in hlo[jnp.float32] and not bf16_scatter_adds(hlo[jnp.float32])
  assert bf16_scatter_adds(hlo[jnp.bfloat16])


def test_the_suite_stays_on_the_cpu_unless_a_device_is_asked_for():
  from tests.conftest import device_requested
  assert device_requested("", {}) is None and device_requested("not accelerator", {}) is None
  assert device_requested("slow", {}) is None
  assert device_requested("accelerator", {}) == "auto"
  assert device_requested("accelerator and slow", {}) == "auto"
  assert device_requested("", {"BERTJAX_TEST_PLATFORM": "tpu"}) == "tpu"
  assert device_requested("accelerator", {"BERTJAX_TEST_PLATFORM": "cpu"}) is None


# --------------------------------------------------------------------------- training runs


def launch(platform, workdir, config, *overrides, timeout=900):
  """launch.py on the device for a few bf16 steps; the train rows of its metrics.jsonl."""
  env = dict(os.environ, JAX_PLATFORMS=platform)
  settings = ["model.dtype='bfloat16'", f"model.kernels='{platform}'", "log_every=1",
              "tensorboard=False", "async_checkpointing=False", *overrides]
  r = subprocess.run([sys.executable, "launch.py", "--config", config, "--workdir", str(workdir),
                      *(f"--config.{s}" for s in settings)],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
  assert r.returncode == 0, r.stderr[-3000:]
  rows = metric_writers.read_metrics(workdir)
  return [x for x in rows if x.get("split") == "train"]


PRETRAIN = ("total_steps=3", "eval_every=0", "checkpoint_every=1000")


@pytest.fixture(scope="module")
def teacher(platform, tmp_path_factory):
  """configs/distill.py's quickstart teacher (4-layer MLM), trained for 2 steps on the device."""
  workdir = tmp_path_factory.mktemp("teacher")
  launch(platform, workdir, "configs/quickstart.py", "objective='mlm'",
         "model.num_hidden_layers=4", "total_steps=2", "eval_every=0", "checkpoint_every=1000")
  return workdir


@DEVICE
@pytest.mark.parametrize("config,objective", [
    ("configs/bert.py:runlocal", "mlm_nsp"), ("configs/roberta.py:runlocal", "mlm"),
    ("configs/albert.py:runlocal", "mlm_sop"), ("configs/spanbert.py:runlocal", "span_sbo"),
    ("configs/electra.py:runlocal", "rtd"), ("configs/distill.py:runlocal", "distill")])
def test_every_objective_trains_bf16_steps(platform, tmp_path, request, config, objective):
  extra = ([f"distill.teacher='{request.getfixturevalue('teacher')}'"]
           if objective == "distill" else [])
  rows = launch(platform, tmp_path / "run", config, *PRETRAIN, *extra)
  assert [r["step"] for r in rows] == [1, 2, 3]
  assert all(math.isfinite(r["loss"]) for r in rows), rows
  resolved = json.loads((tmp_path / "run" / "config.json").read_text())
  assert resolved["objective"] == objective


@DEVICE
@pytest.mark.parametrize("config", ["configs/glue.py:task=sst2,runlocal",
                                    "configs/squad.py:runlocal", "configs/ner.py:runlocal"])
def test_every_task_trains_bf16_steps(platform, data_dir, tmp_path, config):
  rows = launch(platform, tmp_path / "run", config, "max_train_examples=64", "num_epochs=1.0")
  assert rows and all(math.isfinite(r["loss"]) for r in rows), rows


# --------------------------------------------------------------------------- attention paths

B, S, H, D = 4, 128, 4, 64


def qkv(seed=0, q_len=S, dtype=jnp.bfloat16):
  keys = jax.random.split(jax.random.key(seed), 3)
  shape = lambda n: (B, n, H, D)
  return tuple(jax.random.normal(k, shape(n), dtype) for k, n in zip(keys, (q_len, S, S)))


def results(fn, q, k, v, rows):
  """fn's output at the real query rows and the gradients of a scalar of them, in float32."""
  def scalar(q, k, v):
    out = fn(q, k, v) * rows[:, :, None, None]
    return jnp.sum(jnp.sin(out.astype(jnp.float32))), out
  (_, out), grads = jax.jit(jax.value_and_grad(scalar, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return [np.asarray(x, np.float32) for x in (out, *grads)]


def packed_segments():
  """Three rows of packed sequences (segment ids, 0 for padding) and one unpacked row."""
  seg = np.zeros((B, S), np.int32)
  seg[0, :50], seg[0, 50:110] = 1, 2
  seg[1, :128] = 1
  seg[2, :30], seg[2, 30:64], seg[2, 64:100] = 1, 2, 3
  seg[3, :17] = 1
  return seg


@DEVICE
@pytest.mark.parametrize("path", ["lengths", "packed", "gathered"])
def test_fused_attention_matches_the_explicit_path_on_the_device(platform, path):
  """bf16 inputs: the platform's fused implementation (cuDNN on GPUs) by key lengths, by a packed
  per-query mask, and with gathered queries, against the explicit softmax(QK^T)V with the same
  mask, to bf16 rounding."""
  cfg = ModelConfig(kernels=platform)
  q_len = 22 if path == "gathered" else S
  impl = attention_implementation(cfg, D, jnp.bfloat16, per_query_mask=path == "packed",
                                  q_len=q_len, k_len=S)
  if platform == "gpu":
    assert impl == "cudnn", "the GPU set's bf16 attention should take cuDNN"
  seg = packed_segments()
  if path == "packed":
    keys = make_attention_mask(jnp.asarray(seg > 0), jnp.asarray(seg))
    am, rows = AttentionMask(keys), jnp.asarray(seg > 0, jnp.float32)
  else:
    mask = (np.arange(S)[None, :] < np.array([128, 100, 64, 17])[:, None]).astype(np.int32)
    keys = make_attention_mask(jnp.asarray(mask))
    am, rows = attention_mask_for(cfg, jnp.asarray(mask)), jnp.ones((B, q_len), jnp.float32)
  q, k, v = qkv(1, q_len=q_len)
  want = results(lambda q, k, v: explicit_attention(q, k, v, keys, lambda p: p)[0], q, k, v, rows)
  got = results(lambda q, k, v: fused_attention(q, k, v, am, impl, deterministic=False),
                q, k, v, rows)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=5e-2, atol=5e-2)


# --------------------------------------------------------------------------- the compiled step


@DEVICE
@pytest.mark.parametrize("spec", ["configs/quickstart.py", "configs/albert.py:runlocal",
                                  "configs/spanbert.py:runlocal", "configs/electra.py:runlocal",
                                  "configs/roberta.py:runlocal"])
def test_compiled_bf16_step_adds_nothing_in_bf16_by_scatter(platform, spec):
  config, cfg, state, run = step_setup(spec, **{"model.dtype": "bfloat16",
                                                "model.kernels": platform})
  batch = next(inputs.SyntheticBatches(config, cfg.vocab_size, 0, config.batch_size))
  with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.rules):
    hlo = run.train_step.lower(state, batch).compile().as_text()
  assert "scatter(" in hlo, "expected the word-embedding gradient's float32 scatter"
  assert bf16_scatter_adds(hlo) == []


# --------------------------------------------------------------------------- the benchmark


@DEVICE
def test_ablation_runs_one_short_variant_on_the_device(platform, tmp_path):
  spec = tmp_path / "spec.json"
  spec.write_text(json.dumps({
      "base": {"preset": "bert-tiny", "batch_size": 8, "seq_len": 64, "dtype": "bfloat16",
               "steps": 3, "overrides": ["max_predictions_per_seq=10"], "references": []},
      "variants": [{"name": "tiny"}]}))
  out = tmp_path / "table.md"
  r = subprocess.run([sys.executable, "-m", "bertjax.tools.benchmark", "--ablate", str(spec),
                      "--output", str(out), "--timeout", "600"], cwd=REPO,
                     env=dict(os.environ, JAX_PLATFORMS=platform), capture_output=True, text=True,
                     timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  (row,) = json.loads(out.with_suffix(".json").read_text())["rows"]
  assert row["status"] == "ok", row.get("error")
  assert row["tokens_per_s"] > 0 and row["device"] != "cpu" and row["peak_memory_bytes"] > 0
