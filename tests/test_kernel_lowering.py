"""The Pallas kernels lower for CUDA on this CPU-only machine, as a GPU would compile them.

`jax.export.export(jax.jit(f), platforms=["cuda"])` runs JAX's own lowering for NVIDIA GPUs without
one: each `pallas_call` becomes Triton IR inside a `__gpu$xla.gpu.triton` custom call, and a kernel
that Pallas's Triton lowering refuses (a block whose size is not a power of two, an unsupported
operation) fails here rather than in a device window. What this does not prove: that Triton's own
compiler (run by XLA on the device) accepts the IR, or anything of its speed. cuDNN's attention is
not lowered here (its lowering looks for the library; tests/cudnn_rules.py stands in for its rules),
so the GPU set's dropout-free attention takes XLA's path inside `kernels.lowering_for("cuda")`.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import inputs
from bertjax.models import flash_attention as fa
from bertjax.models import fused_residual as fr
from bertjax.models import kernels
from bertjax.models.config import ModelConfig
from tests.helpers import attention_dropout_for
from tests.test_accelerator_paths import step_setup

import flax.linen as nn

TRITON = "__gpu$xla.gpu.triton"
CHECKS = [jax.export.DisabledSafetyCheck.custom_call(TRITON)]
B, S, H, D = 2, 128, 2, 64


def export_cuda(fn, *args) -> str:
  """The StableHLO module of `fn` lowered for CUDA (Triton's custom calls allowed)."""
  return jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=CHECKS)(
      *args).mlir_module()


def operands(seq=S, dtype=jnp.bfloat16):
  x = jax.ShapeDtypeStruct((B, seq, H, D), dtype)
  return x, x, x, jax.ShapeDtypeStruct((2,), jnp.uint32)


def with_gradient(forward):
  """(forward, its gradient with respect to q, k and v): `forward(q, k, v, extra)` a kernel's
  forward pass, the gradient running its backward kernels too."""
  def gradient(q, k, v, extra):
    loss = lambda q, k, v: jnp.sum(forward(q, k, v, extra).astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
  return forward, gradient


def kernel_fns():
  """The flash kernel's forward pass alone, and its forward and backward (three pallas_calls:
  forward, dq, dk/dv), each a new function so that no cached trace is reused."""
  return with_gradient(lambda q, k, v, seed: fa.flash_attention(
      q, k, v, dropout_rate=0.1, seed=seed, interpret=False))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("seq", [128, 72])  # 72: padded up to the kernel's blocks
def test_flash_kernels_lower_to_triton(dtype, seq):
  forward, gradient = kernel_fns()
  assert export_cuda(forward, *operands(seq, dtype)).count(TRITON) == 1
  text = export_cuda(gradient, *operands(seq, dtype))
  assert text.count(TRITON) == 3
  for name in ("flash_dropout_forward", "flash_dropout_dq", "flash_dropout_dkv"):
    assert f'name = "{name}"' in text


def test_twin_with_a_block_triton_refuses_fails_here(monkeypatch):
  """A block of 24 rows (bertjax's own guard bypassed): Pallas's Triton lowering refuses it on
  this CPU, as the device would."""
  monkeypatch.setattr(fa, "_block", lambda requested, length: 24)
  forward, _ = kernel_fns()
  with pytest.raises(ValueError, match="power of 2"):
    export_cuda(forward, *operands())


def test_twin_without_triton_named_fails_here(monkeypatch):
  """Without Triton named, jax 0.10 lowers a pallas_call for NVIDIA GPUs through Mosaic GPU,
  which refuses this kernel: the reason flash_attention names Triton."""
  if not jax.config.jax_pallas_use_mosaic_gpu:
    pytest.skip("this jax lowers GPU pallas_calls through Triton by default")
  monkeypatch.setattr(fa, "TRITON", None)
  forward, _ = kernel_fns()
  with pytest.raises(Exception):
    export_cuda(forward, *operands())


def window_fns(window: int = 64):
  """The windowed kernel (ModernBERT's local layers: segment ids, a window each side), forward
  alone and with its backward pass."""
  return with_gradient(lambda q, k, v, ids: fa.flash_attention(
      q, k, v, segment_ids=(ids, ids), window=window, interpret=False))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("seq", [256, 200])  # 200: padded up to the kernel's blocks
def test_window_kernels_lower_to_triton(dtype, seq):
  """Its loops' bounds come from the block's position (a loop Triton takes as scf.for with
  run-time bounds) and its segment skip is a branch inside them: both lower."""
  forward, gradient = window_fns()
  q, k, v, _ = operands(seq, dtype)
  ids = jax.ShapeDtypeStruct((B, seq), jnp.int32)
  text = export_cuda(forward, q, k, v, ids)
  assert text.count(TRITON) == 1 and 'name = "flash_window_forward"' in text
  text = export_cuda(gradient, q, k, v, ids)
  assert text.count(TRITON) == 3
  for name in ("flash_window_forward", "flash_window_dq", "flash_window_dkv"):
    assert f'name = "{name}"' in text


def triton_loops(monkeypatch, capsys, fn, *args) -> list[tuple[str, str, bool]]:
  """(first, end, branch inside) of the outermost loop of each Triton module `fn` lowers to,
  read from the modules Pallas prints with debug=True: SSA names, constants named %c..."""
  real = fa.pl.pallas_call
  monkeypatch.setattr(fa.pl, "pallas_call", lambda *a, **kw: real(*a, **{**kw, "debug": True}))
  capsys.readouterr()
  export_cuda(fn, *args)
  modules = capsys.readouterr().out.split("The Triton module")[1:]
  loops = []
  for module in modules:
    found = re.search(r"scf\.for %\w+ = (%\w+) to (%\w+)", module)
    loops.append((found.group(1), found.group(2), "scf.if" in module[found.end():]))
  return loops


def test_window_kernels_loop_bounds_come_from_the_block(monkeypatch, capsys):
  """In the Triton IR, the forward, dq and dk/dv kernels' loops run between bounds computed from
  the program's block (`flash_kernels.block_range`), not over the whole row, with the segment skip
  a branch inside; the unwindowed kernels' loops start at the constant 0 with no branch."""
  q, k, v, _ = operands(256)
  ids = jax.ShapeDtypeStruct((B, 256), jnp.int32)
  loops = triton_loops(monkeypatch, capsys, window_fns()[1], q, k, v, ids)
  assert len(loops) == 3
  assert all(not first.startswith("%c") and not end.startswith("%c") and branch
             for first, end, branch in loops)
  plain = lambda q, k, v, ids: jax.grad(lambda q: jnp.sum(fa.flash_attention(
      q, k, v, segment_ids=(ids, ids), interpret=False).astype(jnp.float32)))(q)
  loops = triton_loops(monkeypatch, capsys, plain, q, k, v, ids)
  assert len(loops) == 3 and all(first.startswith("%c0") and not branch
                                 for first, _, branch in loops)


def test_window_twin_with_a_block_triton_refuses_fails_here(monkeypatch):
  """The windowed kernel with blocks of 24 rows: refused on this CPU, as the device would."""
  monkeypatch.setattr(fa, "_block", lambda requested, length: 24)
  forward, _ = window_fns()
  q, k, v, _ = operands()
  with pytest.raises(ValueError, match="power of 2"):
    export_cuda(forward, q, k, v, jax.ShapeDtypeStruct((B, S), jnp.int32))


@pytest.mark.parametrize("hidden,dtype", [(768, jnp.bfloat16), (1024, jnp.float32)])
def test_fused_residual_kernels_lower_to_triton(hidden, dtype):
  """The residual block's kernel, forward alone and with its backward pass (768: padded to 1024
  inside the kernel, as Triton's power-of-two blocks need)."""
  x = jax.ShapeDtypeStruct((4, 16, hidden), dtype)
  v = jax.ShapeDtypeStruct((hidden,), jnp.float32)
  seed = jax.ShapeDtypeStruct((2,), jnp.uint32)

  def forward(x, r, b, s, sh, seed):
    return fr.fused_residual_norm(x, r, b, s, sh, rate=0.1, seed=seed, eps=1e-12)

  def gradient(x, r, b, s, sh, seed):
    loss = lambda *a: jnp.sum(forward(*a, seed).astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 1, 2, 3, 4))(x, r, b, s, sh)
  text = export_cuda(forward, x, x, v, v, v, seed)
  assert text.count(TRITON) == 1 and 'name = "fused_residual_forward"' in text
  text = export_cuda(gradient, x, x, v, v, v, seed)
  assert text.count(TRITON) == 2 and 'name = "fused_residual_backward"' in text


def test_lowering_for_picks_the_device_set_and_native_kernels():
  cfg = ModelConfig()
  assert kernels.for_model(cfg).platform == "cpu"
  with kernels.lowering_for("cuda"):
    assert kernels.backend() == "cuda" and kernels.for_model(cfg).platform == "gpu"
    assert attention_dropout_for(cfg) == "pallas"
  with kernels.lowering_for("tpu"):
    assert kernels.for_model(cfg).platform == "tpu"
  assert kernels.backend() == jax.default_backend()


def lowered_gpu_step(spec: str, **settings) -> tuple[str, int]:
  """The trainer's bf16 train step of `spec`, GPU set chosen by "auto", lowered for CUDA; and its
  (main) encoder's number of layers."""
  with kernels.lowering_for("cuda"):
    config, cfg, state, run = step_setup(spec, **{"model.dtype": "bfloat16", **settings})
    batch = next(inputs.SyntheticBatches(config, cfg.vocab_size, 0, config.batch_size))
    args = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), (state, batch))
    with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.rules):
      exported = jax.export.export(run.train_step, platforms=["cuda"],
                                   disabled_checks=CHECKS)(*args)
  return exported.mlir_module(), cfg.num_hidden_layers


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["configs/quickstart.py", "configs/electra.py:runlocal"])
def test_gpu_set_train_step_with_attention_dropout_lowers_for_cuda(spec):
  """Every layer's attention dropout runs in the flash kernel: three Triton calls per layer (the
  forward and the two backward kernels), the gathered last layer included."""
  text, layers = lowered_gpu_step(spec, **{"model.attention_probs_dropout_prob": 0.1})
  forwards = text.count('name = "flash_dropout_forward"')
  assert text.count(TRITON) == 3 * forwards
  if spec == "configs/quickstart.py":
    assert forwards == layers
  else:  # ELECTRA: the generator's layers too
    assert forwards > layers


@pytest.mark.slow
def test_gpu_set_step_with_the_fused_residual_kernel_lowers_for_cuda():
  """The ablation row `fused_residual=True`: two residual tails per layer, each one forward and
  one backward kernel, beside the attention kernel's three."""
  text, layers = lowered_gpu_step("configs/quickstart.py", **{
      "model.attention_probs_dropout_prob": 0.1, "model.hidden_dropout_prob": 0.1,
      "model.kernel_overrides.fused_residual": True})
  assert text.count('name = "fused_residual_forward"') == 2 * layers
  assert text.count('name = "fused_residual_backward"') == 2 * layers
  assert text.count(TRITON) == 3 * layers + 4 * layers


@pytest.mark.slow
@pytest.mark.parametrize("window", [True, False])
def test_gpu_set_modernbert_step_with_the_window_kernel_lowers_for_cuda(window):
  """ModernBERT (runlocal, 3 layers: layer 0 global, 1 and 2 local) with
  `pallas_local_window`: each local layer's attention is the windowed kernel, forward and backward
  (three Triton calls), and nothing else of Pallas; the twin without the field has none."""
  text, layers = lowered_gpu_step("configs/modernbert.py:runlocal", **{
      "model.num_hidden_layers": 3, "model.kernel_overrides.pallas_local_window": window})
  local = 2
  assert layers == 3
  assert text.count('name = "flash_window_forward"') == (local if window else 0)
  assert text.count('name = "flash_window_dkv"') == (local if window else 0)
  assert text.count(TRITON) == (3 * local if window else 0)


@pytest.mark.slow
def test_gpu_set_step_without_attention_dropout_has_no_pallas_kernel():
  """The twin: with attention dropout 0 the GPU set takes the fused (here XLA's) attention, and
  nothing of Triton is lowered, so the count above is the kernel's."""
  text, _ = lowered_gpu_step("configs/quickstart.py", **{"model.attention_probs_dropout_prob": 0.0})
  assert TRITON not in text
