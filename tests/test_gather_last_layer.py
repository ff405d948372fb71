"""model.gather_last_layer: the last layer computed only at the rows the pretraining heads read
gives the same outputs and the same gradients as the full layer followed by a gather."""

import jax
import jax.numpy as jnp
import numpy as np

import pytest

from bertjax.models import kernels
from bertjax.models.config import ModelConfig
from bertjax.models.electra import ElectraPretrainingModel
from bertjax.models.encoder import Encoder, TransformerLayer
from bertjax.models.pretraining import PretrainingModel
from bertjax.objectives.span_sbo import SpanBertModel

BATCH, SEQ, P, VOCAB = 3, 16, 4, 50


def config(**kw) -> ModelConfig:
  base = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=64, max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
              attention_probs_dropout_prob=0.0)
  return ModelConfig(**{**base, **kw})


def inputs(seed: int = 0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, VOCAB, (BATCH, SEQ)).astype(np.int32)
  mask = np.ones((BATCH, SEQ), np.int32)
  mask[1, 11:] = 0  # one padded row
  ids[mask == 0] = 0
  types = np.zeros((BATCH, SEQ), np.int32)
  types[:, SEQ // 2:] = 1
  # Unsorted, with a repeat and an unused slot at 0, as the masking pipeline can produce.
  positions = np.stack([rng.choice(np.arange(1, 11), P, replace=False) for _ in range(BATCH)])
  positions[0, -1] = 0
  positions[2, 1] = positions[2, 0]
  return ids, mask, types, positions.astype(np.int32)


def apply_both(model_cls, cfg: ModelConfig, *args, **kw):
  """(outputs, gradient of a scalar of them) with the gather on and off, same parameters."""
  on, off = model_cls(cfg.replace(gather_last_layer=True)), model_cls(cfg.replace(gather_last_layer=False))
  params = on.init(jax.random.key(0), *args, **kw)["params"]

  def scalar(model, p):
    out = model.apply({"params": p}, *args, **kw)
    leaves = [v for k, v in out.items() if k.endswith("logits")]
    return sum(jnp.sum(jnp.sin(v)) for v in leaves), out

  results = []
  for model in (on, off):
    (_, out), grads = jax.value_and_grad(lambda p: scalar(model, p), has_aux=True)(params)
    results.append((out, grads))
  return results


def assert_trees_close(a, b, what):
  flat_a, flat_b = jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b)
  assert len(flat_a) == len(flat_b), what
  for (path, x), y in zip(flat_a, flat_b):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=2e-6,
                               err_msg=f"{what} {jax.tree_util.keystr(path)}")


@pytest.mark.parametrize("kw", [{}, {"pre_layer_norm": True}, {"remat": True},
                                {"num_hidden_groups": 1, "architecture": "albert",
                                 "embedding_size": 16},
                                # the GPU set: 5 gathered rows padded to 8 with [CLS] rows
                                {"kernels": "gpu"}])
@pytest.mark.slow
def test_pretraining_model_same_outputs_and_gradients(kw):
  ids, mask, types, positions = inputs()
  (out_on, g_on), (out_off, g_off) = apply_both(PretrainingModel, config(**kw), ids, mask, types,
                                                 positions)
  assert out_on["mlm_logits"].shape == (BATCH, P, VOCAB)
  for key in ("mlm_logits", "pair_logits"):
    np.testing.assert_allclose(out_on[key], out_off[key], rtol=2e-5, atol=2e-6, err_msg=key)
  np.testing.assert_allclose(out_on["output"].last_hidden_state, out_off["output"].last_hidden_state,
                             rtol=2e-5, atol=2e-6)
  assert_trees_close(g_on, g_off, "gradient")


def test_gathered_rows_are_padded_to_the_kernel_sets_multiple():
  from bertjax.models.encoder import last_layer_rows
  rows = lambda kernel_set, n, seq: last_layer_rows(
      config(kernels=kernel_set), n, seq, kernels.for_platform(kernel_set).row_multiple)
  assert rows("cpu", 20, 128) == 21
  assert rows("gpu", 20, 128) == 24  # cuDNN: even; 8 for tensor cores
  assert rows("gpu", 20, 24) is None  # nothing saved


def test_output_positions_match_the_full_encoder_rows():
  ids, mask, types, positions = inputs(1)
  cfg = config()
  enc = Encoder(cfg)
  params = enc.init(jax.random.key(1), ids)["params"]
  full = enc.apply({"params": params}, ids, mask, types)
  part = enc.apply({"params": params}, ids, mask, types, output_positions=positions)
  want = np.take_along_axis(np.asarray(full.last_hidden_state), positions[..., None], axis=1)
  np.testing.assert_allclose(part.last_hidden_state, want, rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(part.pooler_output, full.pooler_output, rtol=2e-5, atol=2e-6)


def test_packed_rows_keep_each_querys_own_mask():
  """With segment ids the mask differs per query; the gathered rows must keep their own."""
  ids, _, types, positions = inputs(2)
  segments = np.ones((BATCH, SEQ), np.int32)
  segments[:, 6:] = 2
  segments[0, 13:] = 0
  cfg = config()
  enc = Encoder(cfg)
  params = enc.init(jax.random.key(2), ids)["params"]
  full = enc.apply({"params": params}, ids, None, types, segment_ids=segments)
  part = enc.apply({"params": params}, ids, None, types, segment_ids=segments,
                   output_positions=positions)
  want = np.take_along_axis(np.asarray(full.last_hidden_state), positions[..., None], axis=1)
  np.testing.assert_allclose(part.last_hidden_state, want, rtol=2e-5, atol=2e-6)


def test_layer_rows_equal_full_layer_rows_and_the_mask_matters():
  x = jax.random.normal(jax.random.key(3), (BATCH, SEQ, 32))
  mask = np.ones((BATCH, 1, 1, SEQ), bool)
  mask[..., 12:] = False
  layer = TransformerLayer(config())
  params = layer.init(jax.random.key(4), x, mask, True)
  _, _, _, positions = inputs(3)
  full = layer.apply(params, x, mask, True)
  rows = layer.apply(params, x, mask, True, False, positions)
  np.testing.assert_allclose(rows, np.take_along_axis(np.asarray(full), positions[..., None], 1),
                             rtol=2e-5, atol=2e-6)
  # Keys at masked-out positions must stay unseen: changing them leaves the rows unchanged,
  # changing a visible key does not.
  hidden = x.at[:, 14].set(5.0)
  np.testing.assert_allclose(layer.apply(params, hidden, mask, True, False, positions), rows,
                             rtol=2e-5, atol=2e-6)
  visible = x.at[:, 3].add(1.0)
  assert np.max(np.abs(layer.apply(params, visible, mask, True, False, positions) - rows)) > 1e-3


@pytest.mark.slow
def test_span_bert_model_same_outputs_and_gradients():
  ids, mask, types, positions = inputs(4)
  left = np.maximum(positions - 1, 0).astype(np.int32)
  right = np.minimum(positions + 1, SEQ - 1).astype(np.int32)
  offset = np.zeros_like(positions)
  (out_on, g_on), (out_off, g_off) = apply_both(SpanBertModel, config(), ids, mask, types, positions,
                                                 left, right, offset)
  for key in ("mlm_logits", "sbo_logits"):
    np.testing.assert_allclose(out_on[key], out_off[key], rtol=2e-5, atol=2e-6, err_msg=key)
  assert out_on["output"].last_hidden_state.shape == (BATCH, P, 32)
  assert_trees_close(g_on, g_off, "gradient")


@pytest.mark.slow
def test_electra_generator_same_outputs():
  ids, mask, types, positions = inputs(5)
  weights = np.ones(positions.shape, np.float32)
  masked_ids = np.take_along_axis(ids, positions, axis=1)
  outs = []
  for flag in (True, False):
    model = ElectraPretrainingModel(config(gather_last_layer=flag),
                                    config(hidden_size=16, intermediate_size=32,
                                           gather_last_layer=flag, embedding_size=32))
    rngs = {"params": jax.random.key(6), "sample": jax.random.key(7)}
    params = model.init(rngs, ids, mask, types, positions, masked_ids, weights)["params"]
    outs.append(model.apply({"params": params}, ids, mask, types, positions, masked_ids, weights,
                            rngs={"sample": jax.random.key(7)}))
  np.testing.assert_allclose(outs[0]["mlm_logits"], outs[1]["mlm_logits"], rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(outs[0]["rtd_logits"], outs[1]["rtd_logits"], rtol=2e-5, atol=2e-6)


def test_gathered_last_layer_does_less_work():
  """Compiled FLOPs drop by about the last layer's non-key/value work at the unused rows."""
  ids, mask, types, positions = inputs(6)
  flops = {}
  for flag in (True, False):
    model = PretrainingModel(config(gather_last_layer=flag, num_hidden_layers=1))
    params = model.init(jax.random.key(0), ids, mask, types, positions)["params"]
    fn = jax.jit(lambda p: model.apply({"params": p}, ids, mask, types, positions)["mlm_logits"])
    cost = fn.lower(params).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops[flag] = cost["flops"]
  # One layer of 16 rows: the full layer's q, output and feed-forward run on 5 rows (4 + [CLS]).
  h, i = 32, 64
  saved = (SEQ - P - 1) * 2 * (2 * h * h + 2 * h * i)
  assert flops[False] - flops[True] >= 0.8 * BATCH * saved, flops
