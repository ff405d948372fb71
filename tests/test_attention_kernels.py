"""Attention kernels behind one interface (bertjax.models.attention_kernel): each declares the mask
forms it reads, the platforms it lowers for and when it applies; `attention.KERNELS` lists them;
a kernel set names the one it uses. Adding one is a module and one entry in the list."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.core.errors import UserError
from bertjax.models import attention, kernels, splash
from bertjax.models.attention_kernel import AttentionKernel
from bertjax.models.config import ModelConfig
from bertjax.models.encoder import Encoder
from bertjax.models.modernbert import ModernBertEncoder
from tests import attention_kernel_example as example

TINY = dict(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=32, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)


def test_every_kernel_set_names_a_listed_kernel_and_each_declares_itself():
  for setting in kernels.KERNEL_SETTINGS[1:]:
    assert kernels.for_platform(setting).attention in attention.KERNELS, setting
  for name, kernel in attention.KERNELS.items():
    assert kernel.name == name and set(kernel.platforms) <= {"cpu", "gpu", "tpu"}
  assert attention.KERNELS["splash"] is splash.KERNEL and splash.KERNEL.windowed
  assert attention.KERNELS["cudnn"].reads == ("lengths",)
  with pytest.raises(ValueError, match="unknown mask forms"):
    AttentionKernel("bad", reads=("bias",), platforms=("cpu",), applies=lambda *a: True,
                    run=lambda *a: None)


def test_an_unknown_kernel_is_refused_in_one_line():
  with pytest.raises(UserError, match=r"unknown model.kernel_overrides.attention='flash3'; use one "
                                      r"of xla, cudnn, splash"):
    ModelConfig(kernel_overrides=(("attention", "flash3"),))


def _ids():
  rng = np.random.default_rng(0)
  mask = np.ones((2, 12), np.int32)
  mask[1, 8:] = 0
  ids = np.where(mask > 0, rng.integers(5, 60, (2, 12)), 0).astype(np.int32)
  return jnp.asarray(ids), jnp.asarray(mask)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_a_new_kernel_is_one_module_and_one_entry(monkeypatch, family):
  """The example kernel registered (its one entry) and named by the set: BERT's encoder and
  ModernBERT's global layers reach it through `choose`/`attend`, and give what XLA's kernel gives."""
  monkeypatch.setitem(attention.KERNELS, example.KERNEL.name, example.KERNEL)
  ids, mask = _ids()
  outputs = {}
  for name in ("xla", example.KERNEL.name):
    if family == "bert":
      cfg = ModelConfig(**TINY, kernels="cpu", kernel_overrides=(("attention", name),))
      model = Encoder(cfg)
      call = lambda p: model.apply({"params": p}, ids, mask, jnp.zeros_like(ids)).last_hidden_state
    else:
      cfg = ModelConfig(**TINY, architecture="modernbert", kernels="cpu", local_attention=4,
                        global_attn_every_n_layers=2, kernel_overrides=(("attention", name),))
      model = ModernBertEncoder(cfg)
      call = lambda p: model.apply({"params": p}, ids, mask).last_hidden_state
    params = model.init(jax.random.key(0), ids)["params"]
    example.CALLS.clear()
    outputs[name] = call(params)
    global_layers = 2 if family == "bert" else 1
    assert len(example.CALLS) == (global_layers if name != "xla" else 0), example.CALLS
    assert all(window is None for _, window in example.CALLS)  # not windowed: no local layer
  np.testing.assert_allclose(outputs["xla"], outputs[example.KERNEL.name], rtol=1e-5, atol=1e-5)


def test_choose_falls_back_to_xla_where_the_kernel_does_not_apply():
  gpu = kernels.GPU
  assert attention.choose(gpu, 64, jnp.bfloat16, cudnn=True) is attention.KERNELS["cudnn"]
  assert attention.choose(gpu, 64, jnp.float32, cudnn=True) is attention.XLA
  assert attention.choose(gpu, 64, jnp.bfloat16, cudnn=False) is attention.XLA
  tpu = dataclasses.replace(kernels.TPU)
  assert attention.choose(tpu, 64, jnp.float32, q_len=16, k_len=16).name == "splash"
  assert attention.choose(tpu, 64, jnp.float32, q_len=16, k_len=16, tokens=False) is attention.XLA
