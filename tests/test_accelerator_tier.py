"""The accelerator tier: run on a GPU or TPU, and in the CPU suite with the CPU's stand-ins.

  python -m pytest -q -p no:xdist -m accelerator tests/test_accelerator_tier.py   # on a device
  python -m pytest -q tests/test_accelerator_tier.py                              # on a CPU

Code that only a device runs rots between device windows (the first device run of this tier failed
13 of 18 on code no CPU run had executed). So every test body here runs in the CPU suite too, with
the GPU kernel set and the CPU's stand-ins for the device kernels: tests/cudnn_rules.py's double
of cuDNN's fused attention (its rules enforced, XLA's arithmetic; installed in launch.py's process
by tests/with_cudnn_rules.py) and Pallas's interpret mode for the flash kernel. Only the
assertions that read a device artefact (the device named in a benchmark row) are device-only;
on a CPU the compiled-HLO check reads XLA:CPU's module. What the CPU cannot show: that the device
compilers accept the kernels (tests/test_kernel_lowering.py lowers them for CUDA) and any speed.

- every pretraining objective and every task (GLUE, SQuAD, NER runlocal) trains a few bfloat16
  steps through launch.py with the platform's kernel set, its losses finite;
- the fused attention paths (cuDNN on GPUs) give the explicit path's outputs and gradients;
- the compiled bfloat16 train step adds nothing in bfloat16 by scatter;
- the benchmark's ablation runs one short variant.
"""

import dataclasses
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
from bertjax.models import kernels
from bertjax.models.attention import (AttentionMask, attention_implementation, attention_mask_for,
                                      explicit_attention, fused_attention, make_attention_mask)
from bertjax.runtime import metric_writers
from tests.cudnn_rules import cudnn_rules
from tests.test_accelerator_paths import step_setup

REPO = pathlib.Path(__file__).resolve().parent.parent
DEVICE = pytest.mark.accelerator


@dataclasses.dataclass(frozen=True)
class Target:
  """Where the tier runs: `kernels` the set it trains with; `device` whether JAX runs on a GPU or
  TPU (False: the CPU with its stand-ins for the GPU set's kernels)."""
  kernels: str
  device: bool

  @property
  def cpu(self) -> bool:
    return not self.device


@pytest.fixture(scope="module")
def platform() -> Target:
  backend = jax.default_backend()
  if backend in ("gpu", "cuda", "rocm"):
    return Target("gpu", True)
  if backend == "tpu":
    return Target("tpu", True)
  return Target("gpu", False)


@pytest.fixture
def stand_ins(platform, monkeypatch):
  """On the CPU: cuDNN's double for the GPU set's fused attention (yields its `Calls`)."""
  if platform.device:
    yield None
    return
  with cudnn_rules(monkeypatch) as calls:
    yield calls


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
  """launch.py for a few bf16 steps with the platform's kernel set; the train rows of its
  metrics.jsonl. On a device JAX_PLATFORMS is left as it is (JAX picks the device); on the CPU the
  run goes through tests/with_cudnn_rules.py, and its fused calls are checked to have happened
  where the config can take them."""
  settings = ["model.dtype='bfloat16'", f"model.kernels='{platform.kernels}'", "log_every=1",
              "tensorboard=False", "async_checkpointing=False", *overrides]
  argv = ["launch.py", "--config", config, "--workdir", str(workdir),
          *(f"--config.{s}" for s in settings)]
  if platform.cpu:
    argv = ["tests/with_cudnn_rules.py", *argv]
  env = dict(os.environ, PYTHONPATH=str(REPO))
  r = subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True,
                     timeout=timeout)
  assert r.returncode == 0, r.stderr[-3000:]
  if platform.cpu:
    assert re.search(r"cudnn double: \d+ fused calls traced", r.stderr), r.stderr[-2000:]
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


@pytest.mark.slow
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


@pytest.mark.slow
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


def fused_matches_explicit(kernel_set: str, path: str, choose=attention_implementation):
  """bf16 inputs: the set's fused implementation (cuDNN on GPUs) by key lengths, by a packed
  per-query mask, and with gathered queries, against the explicit softmax(QK^T)V with the same
  mask, to bf16 rounding. `choose`: how the implementation is asked for (a twin passes a stale
  keyword). Returns the implementation taken."""
  cfg = kernels.for_platform(kernel_set)
  q_len = 22 if path == "gathered" else S
  impl = choose(cfg, D, jnp.bfloat16, q_len=q_len, k_len=S)
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
  return impl


@DEVICE
@pytest.mark.parametrize("path", ["lengths", "packed", "gathered"])
def test_fused_attention_matches_the_explicit_path(platform, stand_ins, path):
  impl = fused_matches_explicit(platform.kernels, path)
  if platform.kernels == "gpu":
    assert impl == "cudnn", "the GPU set's bf16 attention should take cuDNN"
  if stand_ins is not None:  # the CPU: the double saw the calls, in training too
    assert stand_ins.fused and stand_ins.trained


def test_twin_a_changed_signature_fails_on_the_cpu(monkeypatch):
  """The first device run failed on a keyword `attention_implementation` no longer had; run on the
  CPU, the same body fails the same way, so such a change can no longer wait for a device."""
  stale = lambda *a, **kw: attention_implementation(*a, per_query_mask=False, **kw)
  with cudnn_rules(monkeypatch):
    with pytest.raises(TypeError, match="per_query_mask"):
      fused_matches_explicit("gpu", "lengths", choose=stale)


# --------------------------------------------------------------------------- the compiled step


@pytest.mark.slow
@DEVICE
@pytest.mark.parametrize("spec", ["configs/quickstart.py", "configs/albert.py:runlocal",
                                  "configs/spanbert.py:runlocal", "configs/electra.py:runlocal",
                                  "configs/roberta.py:runlocal"])
def test_compiled_bf16_step_adds_nothing_in_bf16_by_scatter(platform, stand_ins, spec):
  """The compiled module of the platform's backend: the device's on a device, XLA:CPU's here."""
  config, cfg, state, run = step_setup(spec, **{"model.dtype": "bfloat16",
                                                "model.kernels": platform.kernels})
  batch = next(inputs.SyntheticBatches(config, cfg.vocab_size, 0, config.batch_size))
  with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.rules):
    hlo = run.train_step.lower(state, batch).compile().as_text()
  assert "scatter(" in hlo, "expected the word-embedding gradient's float32 scatter"
  assert bf16_scatter_adds(hlo) == []


# --------------------------------------------------------------------------- the benchmark


@pytest.mark.slow
@DEVICE
def test_ablation_runs_one_short_variant(platform, tmp_path):
  spec = tmp_path / "spec.json"
  spec.write_text(json.dumps({
      "base": {"preset": "bert-tiny", "batch_size": 8, "seq_len": 64, "dtype": "bfloat16",
               "steps": 3, "overrides": ["max_predictions_per_seq=10",
                                         f"model.kernels={platform.kernels}"],
               "references": []},
      "variants": [{"name": "tiny"}]}))
  out = tmp_path / "table.md"
  r = subprocess.run([sys.executable, "-m", "bertjax.tools.benchmark", "--ablate", str(spec),
                      "--output", str(out), "--timeout", "600"], cwd=REPO,
                     env=dict(os.environ), capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  (row,) = json.loads(out.with_suffix(".json").read_text())["rows"]
  assert row["status"] == "ok", row.get("error")
  assert row["tokens_per_s"] > 0 and row["peak_memory_bytes"] > 0
  if platform.device:  # a device artefact: the row was measured there
    assert row["device"] != "cpu"
