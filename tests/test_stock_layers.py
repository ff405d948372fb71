"""With every `Kernels` field off (`model.kernels=stock`) the model is stock Flax: its module tree
holds `flax.linen` layers and bertjax's composite modules only, with the parameters (names, shapes,
logical axes, initial values) of the CPU set, whose hand-written forms compute the same values."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax.config import config_lib
from bertjax.models import dropout, kernels, layers
from bertjax.models.classifiers import SequenceClassifier, TokenClassifier
from bertjax.models.config import ModelConfig
from bertjax.models.electra import ElectraDiscriminator
from bertjax.models.encoder import Encoder
from bertjax.models.heads import SpanBoundaryHead
from bertjax.models.pretraining import PretrainingModel
from bertjax.runtime import optim

SIZES = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.1,
             attention_probs_dropout_prob=0.1)
COMPOSITES = {"PretrainingModel", "ElectraDiscriminator", "SequenceClassifier", "TokenClassifier", "Encoder",
              "Embeddings", "TransformerLayer", "SelfAttention", "MLMHead", "PairHead",
              "DiscriminatorHead", "ClassificationHead", "TokenHead", "SpanBoundaryHead", "SpanModel"}
HAND_WRITTEN = {layers.Dense, layers.LayerNorm, layers.Embed, dropout.Dropout}


def batch(seed=1):
  ids = jax.random.randint(jax.random.key(seed), (2, 16), 1, 64)
  mask = jnp.ones_like(ids).at[1, 12:].set(0)
  types = jnp.zeros_like(ids).at[:, 8:].set(1)
  return ids, mask, types, jnp.array([[1, 2, 3], [4, 5, 6]])


class SpanModel(nn.Module):
  """The encoder under SpanBERT's head, which reads the encoder's tied table."""
  config: ModelConfig

  @nn.compact
  def __call__(self, ids, mask, types, pos, deterministic: bool = True):
    encoder = Encoder(self.config, name="encoder")
    hidden = encoder(ids, mask, types, deterministic=deterministic).last_hidden_state
    return SpanBoundaryHead(self.config, 8, name="sbo")(hidden, pos - 1, pos + 1, pos - pos,
                                                         encoder)


def modules_called(model, init_args, apply_args, **apply_kw):
  """(classes of every module called in init and in a training apply, traced abstractly; the
  initialized tree's shapes)."""
  seen = set()

  def record(next_fun, args, kwargs, context):
    seen.add(type(context.module))
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):
    variables = jax.eval_shape(lambda: model.init(jax.random.key(0), *init_args))
    jax.eval_shape(lambda v: model.apply(v, *apply_args, deterministic=False,
                                         rngs={"dropout": jax.random.key(3)}, **apply_kw),
                   variables)
  return seen, variables


def models(cfg):
  ids, mask, types, pos = batch()
  return [(PretrainingModel(cfg), (ids, mask, types, pos)),
          (ElectraDiscriminator(cfg), (ids, mask, types)),
          (SequenceClassifier(cfg, 3), (ids, mask, types)),
          (TokenClassifier(cfg, 3), (ids, mask, types)),
          (SpanModel(cfg), (ids, mask, types, pos))]


@pytest.mark.parametrize("index", range(5))
def test_stock_set_builds_the_model_from_flax_linen_layers(index):
  model, args = models(ModelConfig(**SIZES, kernels="stock"))[index]
  seen, _ = modules_called(model, args, args)
  stray = {c.__qualname__ for c in seen
           if not c.__module__.startswith("flax.linen") and c.__name__ not in COMPOSITES}
  assert not stray, f"modules neither flax.linen nor bertjax composites: {stray}"
  assert not seen & HAND_WRITTEN
  if index == 0:  # the walk sees every kind of layer the encoder has
    assert {nn.Dense, nn.Einsum, nn.LayerNorm, nn.Embed, nn.Dropout} <= seen


def test_the_walk_finds_the_cpu_sets_hand_written_layers():
  """The same walk under the CPU set: bertjax's own Dense, LayerNorm, Embed and Dropout."""
  model, args = models(ModelConfig(**SIZES, kernels="cpu"))[0]
  seen, _ = modules_called(model, args, args)
  assert HAND_WRITTEN <= seen


@pytest.mark.parametrize("arch", ["bert", "albert"])
def test_stock_parameters_are_the_cpu_sets(arch):
  """Names, shapes, logical axes and initial values: a checkpoint of one loads in the other."""
  trees = []
  for name in ("cpu", "stock"):
    cfg = ModelConfig(**SIZES, architecture=arch, embedding_size=16 if arch == "albert" else None,
                      kernels=name)
    model, args = models(cfg)[0]
    trees.append(model.init(jax.random.key(0), *args))
  cpu, stock = trees
  assert nn.get_partition_spec(stock) == nn.get_partition_spec(cpu)
  assert jax.tree.structure(nn.meta.unbox(stock)) == jax.tree.structure(nn.meta.unbox(cpu))
  for a, b in zip(jax.tree.leaves(nn.meta.unbox(cpu)), jax.tree.leaves(nn.meta.unbox(stock))):
    assert a.dtype == b.dtype and np.array_equal(a, b)


@pytest.mark.slow
def test_hand_written_forms_compute_the_stock_values():
  """The CPU set (every hand-written form on) against the stock set: outputs and gradients in
  float32, dropout off (the forms draw different masks)."""
  ids, mask, types, pos = batch()
  results = []
  for name in ("cpu", "stock"):
    cfg = ModelConfig(**SIZES, kernels=name)
    model = PretrainingModel(cfg)
    params = nn.meta.unbox(model.init(jax.random.key(0), ids, mask, types, pos))["params"]

    def loss(p):
      out = model.apply({"params": p}, ids, mask, types, pos)
      return jnp.sum(jnp.sin(out["mlm_logits"])) + jnp.sum(out["pair_logits"])
    results.append(jax.jit(jax.value_and_grad(loss))(params))
  for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1])):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_stock_set_turns_every_field_off():
  off = {"flat_dense": False, "layer_norm_vjp": False, "remat_activation": False,
         "attention": "xla", "attention_lengths": False, "one_hot_rows": 0,
         "dropout": dropout.STOCK, "erf_gelu": False, "float32_lookup": False,
         "float32_gather": False, "bias_product": False, "scalar_clipping": False,
         "attention_dropout": "explicit", "row_multiple": 1, "fused_residual": False,
         "pallas_local_window": False}
  fields = {f.name for f in dataclasses.fields(kernels.Kernels)} - {"platform"}
  assert set(off) == fields  # a new field gets its stock value here
  assert {k: getattr(kernels.STOCK, k) for k in off} == off
  assert kernels.for_model(ModelConfig(kernels="stock")) == kernels.STOCK
  for field in fields:  # each is named and explained in the class's docstring
    assert f"  {field}: " in kernels.Kernels.__doc__


def test_cpu_set_keeps_every_hand_written_form():
  """What the CPU ran before the stock layers came in, so its training is bitwise unchanged."""
  cpu = kernels.CPU
  assert cpu.flat_dense and cpu.layer_norm_vjp and cpu.remat_activation and cpu.erf_gelu
  assert cpu.float32_lookup and cpu.float32_gather and cpu.bias_product and cpu.scalar_clipping
  assert (cpu.one_hot_rows, cpu.dropout) == (2, "packed32")


def test_flax_dropout_is_a_setting():
  cfg = ModelConfig(**SIZES, kernels="cpu", dropout_impl="flax")
  assert kernels.dropout_for_model(cfg) == "flax"
  assert isinstance(layers.layers_for(cfg).dropout(0.1), nn.Dropout)
  model, args = models(cfg)[0]
  seen, _ = modules_called(model, args, args)
  assert nn.Dropout in seen and dropout.Dropout not in seen


def test_clipping_follows_the_setting(monkeypatch):
  """scalar_clipping off: optax's own clip_by_global_norm; on: the multiply form (same values)."""
  config = config_lib.load_config_file("configs/quickstart.py")
  config.optimizer.grad_clip_norm = 1.0
  grads = {"a": jnp.full((4, 3), 5.0), "b": jnp.full((3,), -2.0)}
  built, ups = [], []
  for fn in (optim.clip_by_global_norm, optax.clip_by_global_norm):
    spy = lambda norm, fn=fn: built.append(fn) or fn(norm)
    monkeypatch.setattr(optim if fn is optim.clip_by_global_norm else optax, fn.__name__, spy)
  for scalar in (True, False):
    opt = optim.make_optimizer(config, scalar_clipping=scalar)
    ups.append(opt.update(grads, opt.init(grads), grads)[0])
  assert built[0] is not built[-1] and built[-1].__module__.startswith("optax")
  for a, b in zip(jax.tree.leaves(ups[0]), jax.tree.leaves(ups[1])):
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_modernbert_norms_follow_the_layer_norm_setting():
  """ModernBERT's LayerNorms take BERT's written-out backward pass where the kernel set says so
  (the CPU's: its autodiff'd form cost 2.4x the 22-layer step there, PERFORMANCE.md) and are
  `nn.LayerNorm` in the stock set: the same parameters, values and gradients either way."""
  ids, mask, types, pos = batch()
  args = (ids, mask, types, pos)
  seen, trees, grads = [], [], []
  for name in ("cpu", "stock"):
    model = PretrainingModel(ModelConfig(**{**SIZES, "architecture": "modernbert",
                                            "kernels": name}), pair_head=False)
    seen.append(modules_called(model, args, args)[0])
    variables = model.init(jax.random.key(0), *args)
    trees.append(nn.meta.unbox(variables))
    loss = lambda v, m=model: jnp.sum(jnp.square(m.apply(v, *args)["mlm_logits"]))
    grads.append(jax.grad(loss)(variables))
  assert layers.LayerNorm in seen[0] and nn.LayerNorm not in seen[0]
  assert nn.LayerNorm in seen[1] and layers.LayerNorm not in seen[1]
  assert jax.tree.structure(trees[0]) == jax.tree.structure(trees[1])
  for a, b in zip(jax.tree.leaves(trees[0]), jax.tree.leaves(trees[1])):
    assert np.array_equal(a, b)
  for a, b in zip(*(jax.tree.leaves(nn.meta.unbox(g)) for g in grads)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
