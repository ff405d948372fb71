"""ModernBERT (`model.architecture="modernbert"`) against transformers' ModernBertModel and
ModernBertForMaskedLM at random init, float32, on the CPU.

Three layers with global_attn_every_n_layers=3 (layer 0 global, layers 1 and 2 local), a window
of 8 (4 tokens each side) and rows of 33 tokens (odd, longer than the window): one row unpadded,
two padded. Every weight, bias and LayerNorm scale is drawn at random, so a mis-mapped tensor
cannot hide behind zero or one init. The weights cross through bertjax.convert.names'
ModernBERT mapping, and so do the PyTorch gradients the JAX ones are compared with.
"""

from __future__ import annotations

import collections
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as T

import bertjax
from bertjax import convert
from bertjax.config import config_lib
from bertjax.convert.hf_configs import modernbert_hf_config, modernbert_model_config
from bertjax.convert.names import hf_to_params, params_to_hf
from bertjax.core.errors import UserError
from bertjax.models.attention import explicit_attention, make_attention_mask
from bertjax.models.config import ModelConfig
from bertjax.models.modernbert import ModernBertEncoder, banded_attention, window_mask
from bertjax.models.presets import PRESETS, preset
from bertjax.models.pretraining import PretrainingModel
from bertjax.runtime import checkpoints, freezing, metric_writers
from bertjax.trainer import train

REPO = pathlib.Path(__file__).resolve().parent.parent
TOL = 1e-4
TINY = dict(vocab_size=60, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
            intermediate_size=40, max_position_embeddings=64, pad_token_id=0,
            global_attn_every_n_layers=3, local_attention=8, reference_compile=False)
BIASES = dict(attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True)
BATCH, SEQ = 3, 33
LENGTHS = (33, 20, 7)  # unpadded, padded past the window, padded within it


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
  """Random values everywhere: transformers' init leaves biases 0 and LayerNorm scales 1."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):  # LayerNorm scales near 1
        p.copy_(0.5 + torch.rand(p.shape, generator=gen))
      else:
        p.copy_(0.2 * torch.randn(p.shape, generator=gen))
  return model.eval()


def inputs(seed: int = 1):
  rs = np.random.RandomState(seed)
  mask = (np.arange(SEQ)[None, :] < np.array(LENGTHS)[:, None]).astype(np.int64)
  ids = np.where(mask == 1, rs.randint(3, TINY["vocab_size"], (BATCH, SEQ)), 0)
  return ids, mask


def hf_config(implementation: str = "eager", **kw) -> T.ModernBertConfig:
  return T.ModernBertConfig(**{**TINY, **kw}, attn_implementation=implementation)


def converted(hf: torch.nn.Module, cfg: ModelConfig, heads: tuple[str, ...]):
  state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
  params, missing, ignored = hf_to_params(state, cfg, heads)
  assert missing == [] and ignored == []
  return params


def close(ours, theirs, mask, what: str):
  """Max abs difference at the real tokens (padding rows are nobody's output)."""
  ours = np.asarray(ours)
  theirs = theirs.detach().numpy() if torch.is_tensor(theirs) else theirs
  assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
  diff = float(np.max(np.abs(ours - theirs)[mask.astype(bool)]))
  assert diff < TOL, f"{what}: max abs diff {diff}"


@pytest.fixture(scope="module", params=[{}, BIASES], ids=["no_bias", "biases"])
def mlm_pair(request):
  hf = randomize(T.ModernBertForMaskedLM(hf_config(**request.param)))
  cfg = modernbert_model_config(hf.config.to_dict())
  return hf, cfg, converted(hf, cfg, ("mlm",))


def test_config_names_cross_field_for_field():
  hf = hf_config(**BIASES, global_rope_theta=5e4, local_rope_theta=123.0)
  cfg = modernbert_model_config(hf.to_dict())
  assert (cfg.architecture, cfg.local_attention, cfg.global_rope_theta, cfg.local_rope_theta,
          cfg.attention_bias, cfg.norm_bias) == ("modernbert", 8, 5e4, 123.0, True, True)
  assert [cfg.is_global_layer(i) for i in range(3)] == [True, False, False]
  back = modernbert_hf_config(cfg)
  assert all(back[k] == getattr(hf, k) for k in back if k != "model_type")


@pytest.mark.slow
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_model_hidden_states_match_transformers(implementation):
  hf = randomize(T.ModernBertModel(hf_config(implementation)), seed=2)
  cfg = modernbert_model_config(hf.config.to_dict())
  params = converted(hf, cfg, ())["encoder"]
  ids, mask = inputs()
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
             output_hidden_states=True)
  out = ModernBertEncoder(cfg).apply({"params": params}, ids, mask, output_hidden_states=True)
  rows = mask[..., None] * np.ones((1, 1, cfg.hidden_size))
  close(out.last_hidden_state, ref.last_hidden_state, rows, "last_hidden_state")
  # transformers' last entry is before the final norm; ours (as Encoder's pre-LN) after it.
  for i in range(cfg.num_hidden_layers):
    close(out.hidden_states[i], ref.hidden_states[i], rows, f"hidden_states[{i}]")


def test_mlm_logits_match_transformers(mlm_pair):
  hf, cfg, params = mlm_pair
  ids, mask = inputs()
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
  every = np.broadcast_to(np.arange(SEQ), (BATCH, SEQ))
  out = PretrainingModel(cfg, pair_head=False).apply({"params": params}, ids, mask, None, every)
  close(out["mlm_logits"], ref, mask[..., None] * np.ones((1, 1, cfg.vocab_size)), "mlm logits")


@pytest.mark.slow
def test_mlm_loss_gradients_match_transformers(mlm_pair):
  hf, cfg, params = mlm_pair
  ids, mask = inputs()
  positions = np.array([[0, 5, 17, 32], [1, 9, 14, 19], [0, 2, 4, 6]])  # real tokens only
  labels = np.take_along_axis(np.random.RandomState(3).randint(0, cfg.vocab_size, ids.shape),
                              positions, axis=1)
  hf_labels = np.full(ids.shape, -100)
  np.put_along_axis(hf_labels, positions, labels, axis=1)
  hf.zero_grad()
  hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
     labels=torch.tensor(hf_labels)).loss.backward()
  theirs = {k: p.grad.numpy() for k, p in hf.named_parameters()}
  theirs, _, _ = hf_to_params(theirs, cfg, ("mlm",))
  model = PretrainingModel(cfg, pair_head=False)

  def loss(p):
    logits = model.apply({"params": p}, ids, mask, None, positions)["mlm_logits"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], -1))
  ours = jax.grad(loss)(jax.tree.map(jnp.asarray, params))
  flat_theirs = dict(jax.tree_util.tree_leaves_with_path(theirs))
  for path, g in jax.tree_util.tree_leaves_with_path(ours):
    ref = flat_theirs[path]
    rel = float(np.max(np.abs(np.asarray(g) - ref)) / max(np.max(np.abs(ref)), 1e-12))
    assert rel < TOL, f"gradient of {jax.tree_util.keystr(path)}: relative diff {rel}"


def test_weights_cross_back_unchanged(mlm_pair):
  hf, cfg, params = mlm_pair
  back = params_to_hf(params, cfg, ("mlm",))
  state = hf.state_dict()
  assert set(back) == set(state) - {"decoder.weight"}  # tied to the token table
  assert all(np.array_equal(back[k], state[k].numpy()) for k in back)


def test_packed_rows_match_their_examples_run_apart():
  """Two examples in one row (segment ids 1 and 2, then padding): positions restart at the second
  and neither sees the other, in global and local layers alike."""
  cfg = preset("modernbert-tiny").replace(vocab_size=60, hidden_size=32, intermediate_size=40,
                                          num_attention_heads=4, local_attention=8)
  model = ModernBertEncoder(cfg)
  ids = np.random.RandomState(0).randint(1, 60, (1, 30))
  segments = np.array([[1] * 13 + [2] * 11 + [0] * 6])
  params = jax.jit(model.init)(jax.random.key(0), ids)["params"]
  run = jax.jit(lambda ids, segments=None: model.apply(
      {"params": params}, ids, segment_ids=segments).last_hidden_state[0])
  packed = run(ids, segments)
  for start, stop in ((0, 13), (13, 24)):
    alone = run(ids[:, start:stop])
    np.testing.assert_allclose(packed[start:stop], alone, atol=TOL)


@pytest.mark.slow
def test_tpu_set_splash_window_matches_the_xla_path():
  """model.kernels=tpu: global and local layers through splash (its LocalMask for the window), run
  in Pallas's interpret mode here, against the CPU set's XLA path, at the real tokens."""
  cfg = preset("modernbert-tiny").replace(vocab_size=60, hidden_size=32, intermediate_size=40,
                                          num_attention_heads=4, local_attention=8)
  ids, mask = inputs()
  params = jax.jit(ModernBertEncoder(cfg).init)(jax.random.key(0), ids)["params"]
  run = lambda c: jax.jit(lambda ids, mask: ModernBertEncoder(c).apply(
      {"params": params}, ids, mask).last_hidden_state)(ids, mask)
  rows = mask[..., None] * np.ones((1, 1, cfg.hidden_size))
  close(run(cfg.replace(kernels="tpu")), np.asarray(run(cfg.replace(kernels="cpu"))), rows,
        "splash vs xla")


def test_from_hf_and_to_hf_round_trip(tmp_path, mlm_pair):
  """A ModernBertForMaskedLM folder -> bertjax workdir -> a folder transformers loads with the
  same tensors; bertjax.from_hf gives the ModernBERT encoder."""
  hf = mlm_pair[0]
  hf.save_pretrained(tmp_path / "hf")
  convert.convert_from_hf(tmp_path / "hf", tmp_path / "work", log=lambda *_: None)
  convert.convert_to_hf(tmp_path / "work", tmp_path / "back", log=lambda *_: None)
  back = T.ModernBertForMaskedLM.from_pretrained(tmp_path / "back")
  want, got = hf.state_dict(), back.state_dict()
  assert set(want) == set(got)
  assert all(torch.equal(want[k], got[k]) for k in want)
  model, params, cfg = bertjax.from_hf(tmp_path / "hf")
  assert isinstance(model, ModernBertEncoder) and cfg.architecture == "modernbert"


@pytest.mark.parametrize("half", [4, 5, 16])
def test_banded_attention_matches_the_full_window_mask(half):
  """Band by band against `explicit_attention` with `window_mask`, at every query that sees a
  key: right-padded rows, then packed rows (two examples and padding)."""
  keys = jax.random.split(jax.random.key(0), 3)
  q, k, v = (jax.random.normal(key, (2, 33, 2, 8)) for key in keys)
  real = jnp.asarray(np.arange(33)[None] < np.array([[33], [20]]))
  keys = window_mask(make_attention_mask(real), 2 * half)
  got = banded_attention(q, k, v, jnp.ones((2, 33), jnp.int32), real.astype(jnp.int32), half)
  want = explicit_attention(q, k, v, keys, lambda p: p)[0]
  np.testing.assert_allclose(np.asarray(got)[np.asarray(real)], np.asarray(want)[np.asarray(real)],
                             atol=1e-5)
  seg = np.zeros((2, 33), np.int32)
  seg[0, :13], seg[0, 13:30], seg[1, :20], seg[1, 20:] = 1, 2, 1, 2
  keys = window_mask(make_attention_mask(jnp.asarray(seg > 0), jnp.asarray(seg)), 2 * half)
  got = banded_attention(q, k, v, jnp.asarray(seg), jnp.asarray(np.where(seg > 0, seg, -1)), half)
  want = explicit_attention(q, k, v, keys, lambda p: p)[0]
  np.testing.assert_allclose(np.asarray(got)[seg > 0], np.asarray(want)[seg > 0], atol=1e-5)


def _boolean_square_ops(jaxpr, seq: int, found: collections.Counter) -> collections.Counter:
  """Primitive name -> how many equations (nested ones included) make a <bool>[..., seq, seq]."""
  for eqn in jaxpr.eqns:
    if any(v.aval.shape[-2:] == (seq, seq) and v.aval.dtype == jnp.bool_ for v in eqn.outvars):
      found[eqn.primitive.name] += 1
    for param in eqn.params.values():
      inner = getattr(param, "jaxpr", None)
      if inner is not None:
        _boolean_square_ops(getattr(inner, "jaxpr", inner), seq, found)
  return found


@pytest.mark.parametrize("layers", [3, 6])
def test_window_mask_is_built_once_per_forward_pass(layers):
  """However many local layers, one comparison makes the [q, k] window; the layers share it."""
  cfg = preset("modernbert-tiny").replace(vocab_size=60, hidden_size=32, intermediate_size=40,
                                          num_attention_heads=4, local_attention=8,
                                          num_hidden_layers=layers)
  model, ids = ModernBertEncoder(cfg), jnp.ones((2, 40), jnp.int32)
  params = jax.eval_shape(model.init, jax.random.key(0), ids)["params"]
  jaxpr = jax.make_jaxpr(lambda p, ids, mask: model.apply({"params": p}, ids, mask))(
      params, ids, jnp.ones_like(ids))
  assert _boolean_square_ops(jaxpr.jaxpr, 40, collections.Counter())["le"] == 1


def test_frozen_encoder_trains_the_top_layer_and_final_norm():
  cfg = preset("modernbert-tiny").replace(vocab_size=60, hidden_size=32, intermediate_size=40)
  params = jax.eval_shape(ModernBertEncoder(cfg).init, jax.random.key(0),
                          jnp.ones((1, 4), jnp.int32))["params"]
  spec = freezing.FreezeSpec(encoder=True, train_top_layers=1)
  mask = freezing.trainable_mask({"encoder": params, "classifier": {}}, spec, 3)["encoder"]
  assert mask["final_norm"]["scale"] and mask["layer_2"]["attn"]["Wqkv"]["kernel"]
  assert not mask["layer_1"]["mlp"]["Wo"]["kernel"]
  assert not mask["embeddings"]["tok_embeddings"]["embedding"]


def test_local_window_is_symmetric_and_keeps_padding():
  keys = jnp.asarray([[1, 1, 1, 1, 1, 0]], bool)[:, None, None, :]
  got = np.asarray(window_mask(keys, 4))[0, 0]
  assert got[2].tolist() == [True, True, True, True, True, False]
  assert got[0].tolist() == [True, True, True, False, False, False]
  assert got[5].tolist() == [False, False, False, True, True, False]


def test_presets_have_the_published_shapes():
  base, large = preset("modernbert-base"), preset("modernbert-large")
  assert (base.num_hidden_layers, base.hidden_size, base.intermediate_size,
          base.num_attention_heads) == (22, 768, 1152, 12)
  assert (large.num_hidden_layers, large.hidden_size, large.intermediate_size,
          large.num_attention_heads) == (28, 1024, 2624, 16)
  for name in ("modernbert-base", "modernbert-large"):
    cfg = preset(name)
    assert (cfg.vocab_size, cfg.local_attention, cfg.global_rope_theta, cfg.local_rope_theta,
            cfg.max_position_embeddings) == (50368, 128, 160000.0, 10000.0, 8192)
  assert all(PRESETS[n]["architecture"] == "modernbert" for n in PRESETS if "modernbert" in n)


def test_nsp_and_bert_only_settings_refused():
  cfg = preset("modernbert-tiny")
  with pytest.raises(UserError, match="NSP/SOP"):
    PretrainingModel(cfg, pair_head=True).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
  with pytest.raises(UserError, match="scan_layers"):
    cfg.replace(scan_layers=True)
  with pytest.raises(UserError, match="local_attention"):
    cfg.replace(local_attention=1)


@pytest.mark.slow
def test_trains_with_the_mlm_objective(tmp_path):
  """The trainer end to end on synthetic rows: model.architecture=modernbert, objective mlm,
  every dropout on (the explicit attention path, local mask included) and remat."""
  config = config_lib.load_config_file(str(REPO / "configs/quickstart.py") + ":runlocal")
  overrides = {"data.synthetic": True, "objective": "'mlm'", "model.architecture": "'modernbert'",
               "model.vocab_size": 200, "model.hidden_size": 32, "model.intermediate_size": 48,
               "model.num_attention_heads": 2, "model.num_hidden_layers": 3,
               "model.local_attention": 8, "model.attention_dropout": 0.1,
               "model.mlp_dropout": 0.1, "model.embedding_dropout": 0.1, "model.remat": True,
               "max_seq_length": 24, "max_predictions_per_seq": 4, "total_steps": 4,
               "eval_every": 4, "log_every": 2, "tensorboard": False,
               "async_checkpointing": False}
  config_lib.apply_overrides(config, [f"{k}={v}" for k, v in overrides.items()])
  summary = train.train_and_evaluate(config, tmp_path)
  assert summary["step"] == 4
  rows = metric_writers.read_metrics(tmp_path)
  assert [r["step"] for r in rows if r["split"] == "train"] == [2, 4]
  assert all(np.isfinite(r["loss"]) for r in rows)
  params = checkpoints.restore_params(tmp_path)
  assert params["encoder"]["layer_1"]["attn"]["Wqkv"]["kernel"].shape == (32, 3, 2, 16)
