"""Every objective and task steps in bfloat16 with the GPU kernel set under cuDNN's rules.

tests/cudnn_rules.py installs a double of the fused kernel that raises jax's errors for the calls
the real kernel refuses (odd lengths in training among them) and computes with XLA otherwise. On
an H100, training with attention dropout 0 crashed on the gathered last layer's 21 queries
("Unsupported sequence length Q 21, KV 128") and ELECTRA's runlocal on its 11; the twins below
show the double raises exactly that on the unpadded code, and the rest show every step now runs
with the fused kernel chosen, in training and evaluation.
"""

import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import inputs
from bertjax.models import attention, kernels, modernbert
from bertjax.models.attention import (AttentionMask, attention_mask_for, explicit_attention,
                                      fused_attention, pad_odd_lengths)
from bertjax.models.config import ModelConfig
from bertjax.models.encoder import Encoder
from bertjax.registry import get_objective
from bertjax.runtime import metric_writers, sharding
from bertjax.trainer import train
from tests.cudnn_rules import check_primal, cudnn_rules, make_double, Calls
from tests.helpers import TINY as TASK_TINY, load_config

GPU_BF16 = {"model.dtype": "bfloat16", "model.kernels": "gpu",
            "model.attention_probs_dropout_prob": 0.0}
SMALL = {"model.hidden_size": 32, "model.intermediate_size": 64, "model.num_attention_heads": 2,
         "model.num_hidden_layers": 2, "batch_size": 4, "data.synthetic": True}


def steps(spec: str, **settings):
  """One train step and one eval step of `spec`'s objective on synthetic batches; the loss."""
  config = load_config(spec, **{**SMALL, **GPU_BF16, **settings})
  objective = get_objective(config)
  cfg = objective.model_config(config)
  mesh = sharding.make_mesh(config.mesh_shape)
  run, state = train.setup(config, objective, cfg, mesh, rules=sharding.rules_from_config(config))
  batch = next(inputs.SyntheticBatches(config, cfg.vocab_size, 0, config.batch_size))
  with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.rules):
    state, metrics = run.train_step(state, batch)
    sums = run.eval_step(state.params, batch)
  total, count = metrics["loss"]
  assert np.isfinite(float(total / count))
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(sums))
  return float(total / count)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
  """A one-step MLM training workdir on synthetic batches: distillation's teacher."""
  workdir = tmp_path_factory.mktemp("teacher") / "run"
  config = load_config("configs/quickstart.py", objective="mlm", total_steps=1, eval_every=1,
                       checkpoint_every=1, tensorboard=False, async_checkpointing=False,
                       **{k: v for k, v in SMALL.items()})
  train.train_and_evaluate(config, workdir)
  return workdir


OBJECTIVES = [("configs/quickstart.py", "mlm_nsp", {}),
              ("configs/roberta.py:runlocal", "mlm", {}),
              ("configs/albert.py:runlocal", "mlm_sop", {}),
              ("configs/spanbert.py:runlocal", "span_sbo", {}),
              ("configs/electra.py:runlocal", "rtd", {}),
              ("configs/distill.py:runlocal", "distill", {}),
              # an odd length: every layer's queries and keys, not only the gathered layer's
              ("configs/quickstart.py", "mlm_nsp", {"max_seq_length": 33}),
              # the shape: 20 predictions + [CLS] gathered at seq 128
              ("configs/quickstart.py", "mlm_nsp", {"max_seq_length": 128,
                                                    "max_predictions_per_seq": 20})]


@pytest.mark.slow
@pytest.mark.parametrize("spec,objective,settings", OBJECTIVES,
                         ids=[f"{o}-{i}" for i, (_, o, _) in enumerate(OBJECTIVES)])
def test_every_objective_steps_under_cudnn_rules(monkeypatch, request, spec, objective, settings):
  if objective == "distill":
    settings = {**settings, "distill.teacher": str(request.getfixturevalue("teacher"))}
  with cudnn_rules(monkeypatch) as calls:
    steps(spec, **settings)
  assert load_config(spec).objective == objective
  assert calls.trained, "the fused kernel was never chosen in training"
  assert all(q % 2 == 0 and k % 2 == 0 for q, k in calls.trained), calls.trained
  assert len(calls.fused) > len(calls.trained)  # the eval step took it too


@pytest.mark.slow
def test_electra_runlocal_as_published_steps_under_cudnn_rules(monkeypatch):
  """ELECTRA's runlocal with its own shapes (seq 64, the generator's gathered layer) and its own
  dropout: the fused kernel serves the eval step, the explicit path training."""
  with cudnn_rules(monkeypatch) as calls:
    steps("configs/electra.py:runlocal", **{"model.dtype": "bfloat16", "batch_size": 4})
  assert calls.fused


@pytest.mark.slow
def test_twin_without_padding_crashes_as_on_the_h100(monkeypatch):
  """Without the padding (row_multiple 1: the gathered layer keeps its 21 rows, and no odd length
  padded), the double raises jax's error for the issue's shape: it catches the defect on a CPU."""
  monkeypatch.setitem(kernels._BY_PLATFORM, "gpu", dataclasses.replace(kernels.GPU,
                                                                       row_multiple=1))
  monkeypatch.setattr(attention, "pad_odd_lengths", lambda q, k, v, mask, multiple: (q, k, v,
                                                                                    mask))
  with cudnn_rules(monkeypatch):
    with pytest.raises(NotImplementedError, match="Unsupported sequence length Q 21, KV 128"):
      steps("configs/quickstart.py", max_seq_length=128, max_predictions_per_seq=20)


@pytest.mark.slow
def test_twin_odd_sequence_without_padding_crashes(monkeypatch):
  monkeypatch.setattr(attention, "pad_odd_lengths", lambda q, k, v, mask, multiple: (q, k, v,
                                                                                    mask))
  with cudnn_rules(monkeypatch):
    with pytest.raises(NotImplementedError, match="Unsupported sequence length Q 33, KV 33"):
      steps("configs/quickstart.py", max_seq_length=33)


# ModernBERT: 4 layers, global every 2nd (layers 0 and 2), a window of 8 (4 each side).
MODERNBERT = {"objective": "mlm", "model.architecture": "modernbert",
              "model.num_hidden_layers": 4, "model.global_attn_every_n_layers": 2,
              "model.local_attention": 8, "model.attention_dropout": 0.0}


@pytest.mark.slow
@pytest.mark.parametrize("seq", [64, 33])
def test_modernbert_global_layers_take_the_fused_kernel(monkeypatch, seq):
  """A ModernBERT bf16 train step with the GPU kernel set: its 2 global layers go to the fused
  kernel under its rules (even lengths in training: 33 is padded), its 2 local layers do not
  (cuDNN refuses ModernBERT's symmetric window, a right window without a causal mask) and take
  the band-by-band path instead."""
  banded = []
  real_banded = modernbert.banded_attention
  monkeypatch.setattr(modernbert, "banded_attention",
                      lambda *a, **kw: banded.append(a[0].shape) or real_banded(*a, **kw))
  with cudnn_rules(monkeypatch) as calls:
    steps("configs/quickstart.py", max_seq_length=seq, **MODERNBERT)
    q = jnp.zeros((2, seq, 2, 16), jnp.bfloat16)
    with pytest.raises(ValueError, match="right window: 4"):  # the window, were it sent there
      jax.nn.dot_product_attention(q, q, q, local_window_size=(4, 4), implementation="cudnn")
  assert len(calls.trained) == 2, calls.trained  # the global layers, once each
  assert all(q == k >= seq and q % 2 == 0 for q, k in calls.trained), calls.trained
  assert len(calls.fused) > len(calls.trained)  # the eval step took it too
  assert banded and len(banded) % 2 == 0 and {s[1] for s in banded} == {seq}


# --------------------------------------------------------------------------- the double itself


def bf16(*shape, seed=0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.bfloat16)


def test_double_enforces_the_primal_rules():
  q = bf16(2, 8, 2, 16)
  ok = lambda **kw: check_primal(**{**dict(query=q, key=q, value=q, mask=None,
                                           query_seq_lengths=None, key_value_seq_lengths=None,
                                           local_window_size=None, is_causal=False,
                                           max_head_dim=128), **kw})
  assert ok() == "none"
  assert ok(key_value_seq_lengths=jnp.full((2,), 8, jnp.int32)) == "lengths"
  with pytest.raises(NotImplementedError, match="fp16/bf16"):
    ok(query=q.astype(jnp.float32), key=q.astype(jnp.float32), value=q.astype(jnp.float32))
  q12 = bf16(2, 8, 2, 12)
  with pytest.raises(NotImplementedError, match="head dim"):
    ok(query=q12, key=q12, value=q12)
  with pytest.raises(ValueError, match="Bias must have same seq length"):
    ok(mask=jnp.ones((2, 1, 1, 8), bool))  # a key mask, not [.., q, k]
  assert ok(mask=jnp.ones((2, 1, 8, 8), bool)) == "bias"
  with pytest.raises(ValueError, match="right window"):
    ok(local_window_size=(2, 2))
  with pytest.raises(ValueError, match="kv_seqlen"):
    ok(key_value_seq_lengths=jnp.full((2,), 8, jnp.int64 if jax.config.x64_enabled
                                      else jnp.int16))


def test_double_refuses_odd_lengths_only_in_training():
  calls = Calls()
  double = make_double(calls)
  q, k = bf16(2, 7, 2, 16), bf16(2, 8, 2, 16, seed=1)
  lengths = jnp.asarray([8, 5], jnp.int32)
  f = lambda q: double(q, k, k, key_value_seq_lengths=lengths, implementation="cudnn")
  want = jax.nn.dot_product_attention(q, k, k, key_value_seq_lengths=lengths,
                                      implementation="xla")
  np.testing.assert_array_equal(np.asarray(f(q), np.float32), np.asarray(want, np.float32))
  with pytest.raises(NotImplementedError, match="Q 7, KV 8"):
    jax.grad(lambda q: jnp.sum(f(q).astype(jnp.float32)))(q)
  q8 = bf16(2, 8, 2, 16)
  g = jax.grad(lambda q: jnp.sum(f(q).astype(jnp.float32)))(q8)
  assert g.shape == q8.shape and calls.trained == [(8, 8)]


# ---------------------------------------------------------------------- padded = unpadded


B, H, D = 2, 2, 8


def qkv(q_len, k_len, seed=0):
  rng = np.random.default_rng(seed)
  return tuple(jnp.asarray(rng.normal(size=(B, n, H, D)), jnp.float32)
               for n in (q_len, k_len, k_len))


def explicit(q, k, v, keys):
  return explicit_attention(q, k, v, keys, lambda p: p)[0]


def grads_of(f, q, k, v, real_queries=None):
  """The value and gradients of a random projection of the output's real query rows (a query
  that sees no key, a padding position of a packed row, has no defined output)."""
  w = jnp.asarray(np.random.default_rng(9).normal(size=q.shape[:2] + (H, D)), jnp.float32)
  if real_queries is not None:
    w = w * jnp.asarray(real_queries, jnp.float32)[:, :, None, None]
  return jax.value_and_grad(lambda q, k, v: jnp.sum(f(q, k, v) * w), argnums=(0, 1, 2))(q, k, v)


def assert_same(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("q_len,k_len", [(21, 32), (7, 7), (9, 13), (8, 8)])
@pytest.mark.parametrize("packed", [False, True])
def test_padded_attention_equals_unpadded(q_len, k_len, packed):
  """Outputs and gradients of q, k and v through `pad_odd_lengths` (then sliced) equal the
  unpadded explicit path's, for key lengths and for per-query (packed) masks."""
  q, k, v = qkv(q_len, k_len)
  real = np.zeros((B, k_len), np.int32)
  real[0, :k_len] = 1
  real[1, :k_len - 3] = 1
  if packed:
    seg = np.where(real > 0, 1 + (np.arange(k_len) >= k_len // 2), 0)
    same = seg[:, :q_len, None] == seg[:, None, :]
    keys = jnp.asarray((same & (real[:, None, :] > 0))[:, None])
    mask = AttentionMask(keys)
  else:
    mask = attention_mask_for(kernels.GPU, jnp.asarray(real))
    keys = mask.keys

  def padded(q, k, v):
    pq, pk, pv, pmask = pad_odd_lengths(q, k, v, mask, 8)
    if q_len % 2 or k_len % 2:
      assert pq.shape[1] % 8 == 0 or q_len % 2 == 0
      assert pq.shape[1] % 2 == 0 and pk.shape[1] % 2 == 0
    else:
      assert pq is q and pk is k
    if pmask.lengths is not None:  # what cuDNN reads: the lengths; XLA here, with them
      out = jax.nn.dot_product_attention(pq, pk, pv, key_value_seq_lengths=pmask.lengths,
                                         implementation="xla")
    else:
      out = explicit(pq, pk, pv, pmask.keys)
    return out[:, :q_len]

  seen = np.asarray(jnp.any(keys, axis=(1, 3)))  # [B, q]: queries that see some key
  ref = grads_of(lambda q, k, v: explicit(q, k, v, keys), q, k, v, seen)
  assert_same(grads_of(padded, q, k, v, seen), ref)
  # and through fused_attention's own padding, as the model calls it (XLA in place of cuDNN)
  assert_same(grads_of(lambda q, k, v: fused_attention(q, k, v, mask, "xla", False, 8), q, k, v,
                       seen), ref)


def test_padding_hides_padded_keys_a_twin_that_does_not_differs():
  """The comparison above can fail: padding keys that every query sees changes the output."""
  q, k, v = qkv(7, 7)
  keys = jnp.ones((B, 1, 7, 7), bool)
  pq, pk, pv, pmask = pad_odd_lengths(q, k, v, AttentionMask(keys), 8)
  assert pk.shape[1] == 8 and not bool(jnp.any(pmask.keys[:, :, :7, 7:]))
  leaky = jnp.ones_like(pmask.keys)
  got = explicit(pq, pk, pv, leaky)[:, :7]
  assert np.max(np.abs(np.asarray(got) - np.asarray(explicit(q, k, v, keys)))) > 1e-3


@pytest.mark.parametrize("seq", [33, 32])
def test_packed_odd_rows_train_under_cudnn_rules(monkeypatch, seq):
  """Packed rows (segment ids: the mask goes to cuDNN as a per-query bias) at an odd and an even
  length: gradients under the double equal the CPU set's, in bfloat16."""
  rng = np.random.default_rng(0)
  seg = np.zeros((2, seq), np.int32)
  seg[0, :12], seg[0, 12:seq - 4] = 1, 2
  seg[1, :seq - 1] = 1
  ids = np.where(seg > 0, rng.integers(5, 60, (2, seq)), 0).astype(np.int32)
  base = ModelConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64, dtype="bfloat16",
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  rows = jnp.asarray(seg > 0, jnp.float32)[:, :, None]

  def grads(cfg):
    model = Encoder(cfg)
    params = model.init(jax.random.key(0), ids)["params"]
    loss = lambda p: jnp.sum(model.apply({"params": p}, ids, seg > 0, segment_ids=seg,
                                         deterministic=False).last_hidden_state
                             .astype(jnp.float32) * rows)
    return jax.grad(loss)(params)

  want = grads(base.replace(kernels="cpu"))
  with cudnn_rules(monkeypatch) as calls:
    got = grads(base.replace(kernels="gpu"))
  assert calls.trained and "bias" in {f for _, _, f in calls.fused}  # init traces lengths
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32),
                               rtol=0.05, atol=0.05)


# --------------------------------------------------------------------------- tasks end to end


def task_config(spec, tmp_path, **settings):
  config = load_config(spec, **{**TASK_TINY, **GPU_BF16, "total_steps": 2, "eval_every": 2,
                                "log_every": 1, "batch_size": 8, "eval_batch_size": 8,
                                "max_train_examples": 32, **settings})
  return config


def run_task(monkeypatch, config, workdir):
  with cudnn_rules(monkeypatch) as calls:
    train.train_and_evaluate(config, workdir)
  rows = metric_writers.read_metrics(workdir)
  assert [r for r in rows if r["split"] == "eval"], "no evaluation ran"
  assert all(np.isfinite(r["loss"]) for r in rows if r["split"] == "train")
  assert calls.trained and all(q % 2 == 0 and k % 2 == 0 for q, k in calls.trained)
  return calls


@pytest.mark.slow
def test_glue_trains_and_evaluates_under_cudnn_rules(monkeypatch, tmp_path, data_dir):
  config = task_config("configs/glue.py:task=rte,runlocal", tmp_path, max_seq_length=63,
                       data_dir=str(data_dir / "glue"))
  run_task(monkeypatch, config, tmp_path / "run")


@pytest.mark.slow
def test_ner_trains_and_evaluates_under_cudnn_rules(monkeypatch, tmp_path, data_dir):
  conll = data_dir / "conll2003"
  dev = tmp_path / "dev.txt"
  dev.write_text("\n\n".join(conll.joinpath("valid.txt").read_text().split("\n\n")[:40]) + "\n")
  config = task_config("configs/ner.py:runlocal", tmp_path, data_dir=str(tmp_path),
                       train_file=str(conll / "test.txt"), dev_file="dev.txt", test_file="",
                       max_seq_length=47)
  run_task(monkeypatch, config, tmp_path / "run")


@pytest.mark.slow
def test_squad_trains_and_evaluates_under_cudnn_rules(monkeypatch, tmp_path, data_dir):
  data = json.loads((data_dir / "squad" / "v1.1_dev_subset.json").read_text(encoding="utf-8"))
  data["data"] = data["data"][:1]
  (tmp_path / "train.json").write_text(json.dumps(data), encoding="utf-8")
  config = task_config("configs/squad.py:runlocal", tmp_path, data_dir=str(tmp_path),
                       train_file="train.json", dev_file="train.json", max_seq_length=95,
                       doc_stride=48, max_query_length=24,
                       **{"data.vocab_size": 1000, "model.vocab_size": 1000})
  run_task(monkeypatch, config, tmp_path / "run")
