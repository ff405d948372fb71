"""A model's layers are chosen once: its kernel set is resolved when the model is built
(`bertjax.models.layers.layers_for`, one call of `kernels.for_model`) and handed down to its
modules, which never consult the resolver themselves."""

import ast
import pathlib

import jax
import jax.numpy as jnp
import pytest

from bertjax.models import architectures, kernels, layers
from bertjax.models.classifiers import SequenceClassifier
from bertjax.models.config import ModelConfig
from bertjax.models.electra import ElectraPretrainingModel, generator_config
from bertjax.models.pretraining import PretrainingModel
from bertjax.objectives.span_sbo import SpanBertModel

MODELS = pathlib.Path(__file__).resolve().parent.parent / "bertjax" / "models"
SIZES = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=32)
B, S, P = 2, 16, 3


def batch():
  ids = (jnp.arange(B * S, dtype=jnp.int32).reshape(B, S) % 60) + 2
  return ids, jnp.ones((B, S), jnp.int32), jnp.zeros((B, S), jnp.int32)


def pretraining(cfg):
  ids, mask, types = batch()
  positions = jnp.tile(jnp.arange(1, P + 1, dtype=jnp.int32), (B, 1))
  return PretrainingModel(cfg, pair_head=cfg.architecture != "modernbert"), (
      ids, mask, types, positions)


def spanbert(cfg):
  ids, mask, types = batch()
  positions = jnp.tile(jnp.arange(2, P + 2, dtype=jnp.int32), (B, 1))
  return SpanBertModel(cfg), (ids, mask, types, positions, positions - 1, positions + 1,
                              jnp.zeros_like(positions))


def electra(cfg):
  ids, mask, types = batch()
  positions = jnp.tile(jnp.arange(1, P + 1, dtype=jnp.int32), (B, 1))
  return (ElectraPretrainingModel(cfg, generator_config(cfg, 0.5)),
          (ids, mask, types, positions, ids[:, 1:P + 1], jnp.ones((B, P), jnp.float32)))


def classifier(cfg):
  return SequenceClassifier(cfg, 3), batch()


BUILDS = [("bert", pretraining), ("modernbert", pretraining), ("bert", spanbert),
          ("electra", electra), ("roberta", classifier), ("modernbert", classifier)]


@pytest.mark.parametrize("architecture,build", BUILDS,
                         ids=[f"{a}-{b.__name__}" for a, b in BUILDS])
def test_a_model_build_resolves_the_kernel_set_once(monkeypatch, architecture, build):
  """Built, initialized and run once deterministically and once in training (dropout on): the
  resolver was asked once, at construction. (The modules asked it at every layer before.)"""
  calls = []
  resolve = kernels.for_model

  def counted(cfg):
    calls.append(cfg.architecture)
    return resolve(cfg)
  monkeypatch.setattr(kernels, "for_model", counted)
  extra = {"local_attention": 8} if architecture == "modernbert" else {}
  cfg = ModelConfig(**SIZES, architecture=architecture, kernels="cpu", hidden_dropout_prob=0.1,
                    attention_probs_dropout_prob=0.1, **extra)
  model, args = build(cfg)
  assert len(calls) == 1
  rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1), "sample": jax.random.key(2)}
  variables = model.init(rngs, *args)
  model.apply(variables, *args, deterministic=True, rngs=rngs)
  model.apply(variables, *args, deterministic=False, rngs=rngs)
  assert len(calls) == 1


def test_the_set_decides_the_layers_handed_down():
  """What `layers_for` hands down follows the set: the CPU set's hand-written forms, the stock
  set's Flax layers, and an override of one field (`model.kernel_overrides`)."""
  cpu = layers.layers_for(ModelConfig(**SIZES, kernels="cpu"))
  stock = layers.layers_for(ModelConfig(**SIZES, kernels="stock"))
  assert cpu.dense.func is layers.flat_dense and stock.dense.func is layers.stock_dense
  assert cpu.norm.func is layers.vjp_layer_norm and stock.norm.func is layers.stock_layer_norm
  assert stock.dropout(0.1).__class__.__name__ == "Dropout" and cpu.dropout.func.__module__ == (
      "bertjax.models.dropout")
  assert cpu.residual is None
  fused = layers.layers_for(ModelConfig(**SIZES, kernels="cpu",
                                        kernel_overrides=(("fused_residual", True),)))
  assert fused.residual.func is layers.ResidualNorm
  # Built twice from one config, a model is equal to itself (jit caches by it).
  assert layers.layers_for(ModelConfig(**SIZES)) == layers.layers_for(ModelConfig(**SIZES))
  assert PretrainingModel(ModelConfig(**SIZES)) == PretrainingModel(ModelConfig(**SIZES))


def _calls(tree: ast.AST, name: str):
  """Calls of `name` (as `name(...)` or `x.name(...)`) under `tree`."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Call):
      f = node.func
      if (isinstance(f, ast.Name) and f.id == name) or (isinstance(f, ast.Attribute)
                                                        and f.attr == name):
        yield node


def _functions(tree: ast.Module):
  """(qualified name, node) of every function and method of a module."""
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      yield node.name, node
    elif isinstance(node, ast.ClassDef):
      for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
          yield f"{node.name}.{item.name}", item


def test_no_module_under_models_calls_the_resolver():
  """The resolver (`kernels.for_model`) is called in bertjax/models by `layers.layers_for` only
  (besides kernels.py's own helpers for tools), and `layers_for` by `Layered.__post_init__` only:
  no Flax module's setup or call, nor any layer helper, asks which kernels to use."""
  resolver, builder = [], []
  for path in sorted(MODELS.glob("*.py")):
    tree = ast.parse(path.read_text())
    for name, fn in _functions(tree):
      where = f"{path.stem}.{name}"
      resolver += [where for _ in _calls(fn, "for_model")]
      builder += [where for _ in _calls(fn, "layers_for")]
  assert [w for w in resolver if not w.startswith("kernels.")] == ["layers.layers_for"]
  assert builder == ["layers.Layered.__post_init__"]


def test_the_architecture_is_found_by_its_modules_name():
  """`bertjax.models.<architecture>` holds each architecture's encoder and heads; BERT's models
  are built without importing ModernBERT's module."""
  for name in ("bert", "roberta", "albert", "electra", "modernbert"):
    module = architectures.architecture(ModelConfig(**SIZES, architecture=name))
    assert module.__name__ == f"bertjax.models.{name}"
    for attr in ("Encoder", "MLMHead", "PairHead", "SequenceHead", "TokenHead", "pool"):
      assert hasattr(module, attr), (name, attr)
  for path in ("pretraining", "classifiers", "distill", "electra", "bert", "architectures"):
    source = (MODELS / f"{path}.py").read_text()
    assert "modernbert" not in {n for node in ast.walk(ast.parse(source))
                                if isinstance(node, ast.ImportFrom) and node.module
                                for n in [node.module.rsplit(".", 1)[-1]]}, path
