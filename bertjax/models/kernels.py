"""Device-specific implementation choices of the encoder and optimizer, all in this one module.

The model code (`encoder.py`, `heads.py`) is built from `flax.linen` layers (`nn.Dense`,
`nn.Einsum`, `nn.LayerNorm`, `nn.Embed`, `nn.Dropout`), with a hand-written form where a set asks
for one: each such form is a field of `Kernels`, and a field turned off gives the stock layer or
function. A model resolves its set once, when it is built (`for_model`, called by
`bertjax.models.layers.layers_for`), and hands the chosen layers down to its modules. Each choice
of a platform's set is either measured on the device it is made for (with the figure and where it
is recorded) or marked unmeasured. The GPU and TPU sets keep the forms the CPU measurements
brought in where nothing on the device says otherwise (unmeasured there); the TPU set's splash
attention, unmeasured, is the TPU counterpart of the GPU set's fused kernel.

`model.kernels` picks the set: "auto" (the default) takes the backend JAX runs on; "cpu",
"gpu" or "tpu" force one, so that, say, the CPU choices can be measured on a GPU with
`python -m bertjax.tools.benchmark ... --override model.kernels=cpu`; "tpu-xla" is the TPU set with
XLA's attention instead of the splash kernel (to compare the two on a TPU); "stock" turns every
field off: stock Flax and optax throughout (`STOCK`). Parameters and
checkpoints are the same under every set, and so are outputs and gradients to float rounding when
both draw dropout masks the same way (tests/test_accelerator_paths.py pins `model.dropout_impl`;
left at "auto", the sets draw different masks at the same rate; tests/test_splash_attention.py);
only speed and memory differ. One condition: the GPU set's attention reads key lengths, which
stand for the mask only when rows are right-padded; inference detects other masks and falls back,
training relies on bertjax's input builders (all pad right).
The attention-dropout kernel is the exception: the Pallas kernel draws its keep masks from a hash
of the layer's dropout key, another stream than the explicit path's (same distribution). The GPU
set takes it (measured faster, below); the others keep the explicit path, and
`model.attention_dropout_kernel` picks either anywhere. A run resumed under the same set draws the
same masks as an uninterrupted one; resumed under another set it goes on with that set's stream.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Mapping

import jax
import ml_collections

PLATFORMS = ("cpu", "gpu", "tpu")
KERNEL_SETTINGS = ("auto",) + PLATFORMS + ("tpu-xla", "stock")
ATTENTION_DROPOUT_KERNELS = ("explicit", "pallas")
ATTENTION_DROPOUT_SETTINGS = ("auto",) + ATTENTION_DROPOUT_KERNELS


@dataclasses.dataclass(frozen=True)
class Kernels:
  """How the encoder (and the optimizer's clipping) computes on one platform. Every field off (or
  0, "xla", "flax", "explicit", 1) is stock Flax and optax: `STOCK`.

  flat_dense: each Dense as one 2-D product [rows, in] @ [in, out] over reshaped operands
    (`layers.Dense`), instead of `nn.Dense` (one input and one output axis) or `nn.Einsum` (the
    attention's multi-axis kernels: `nn.DenseGeneral` would create them flat and reshape, which
    its logical axis names do not survive under a mesh).
  layer_norm_vjp: LayerNorm with its backward pass written out (keeps x, the row mean and the
    inverse deviation only, `layers.LayerNorm`), instead of `nn.LayerNorm` (two-pass variance)
    under autodiff.
  remat_activation: the feed-forward activation recomputed in the backward pass.
  attention: the fused attention for training steps without attention dropout and for inference:
    an `implementation` of `jax.nn.dot_product_attention` ("cudnn": the fused flash kernel,
    half precision only, float32 takes "xla"; "xla": the composed softmax(QK^T)V), or "splash"
    (JAX's Pallas splash kernel, `bertjax.models.splash`; any float dtype; queries gathered at
    some positions take "xla").
  attention_lengths: describe right-padded rows by their key lengths (what the cuDNN kernel
    takes; a [batch, 1, 1, seq] mask makes it refuse) rather than by a boolean mask.
  one_hot_rows: embedding tables of at most this many rows (token types) are looked up as a
    one-hot product, whose gradient is a small matrix product instead of a scatter-add of every
    token into a few rows (0: never).
  float32_lookup: embedding rows looked up on the float32 table and cast after the lookup
    (`layers.Embed`), so the gradient's scatter-add runs in float32; off: `nn.Embed`, which
    casts the table to the compute dtype first (with `one_hot_rows` 0).
  float32_gather: half-precision hidden states gathered at the masked positions from a float32
    view (`layers.gather_positions`), for the same reason; off: gathered in their own dtype.
  dropout: how dropout draws and keeps its masks: one of bertjax's forms
    (bertjax.models.dropout.IMPLEMENTATIONS) or "flax" (`nn.Dropout`, a boolean mask from
    `jax.random.bernoulli` that autodiff keeps); what `model.dropout_impl="auto"` uses.
  erf_gelu: the exact GELU as x * Phi(x) through erf (`layers.exact_gelu`, PyTorch's formula),
    instead of `nn.gelu(approximate=False)`, which goes through erfc.
  bias_product: the MLM decoder's vocabulary bias added as an outer product with ones
    (`layers.add_vocab_bias`), so its gradient is a matrix-vector product instead of a column
    sum; off: a broadcast add.
  scalar_clipping: global-norm clipping as one multiply by min(1, max_norm / norm)
    (`bertjax.runtime.optim.clip_by_global_norm`), instead of `optax.clip_by_global_norm`.
  attention_dropout: the path of training steps with attention dropout ("explicit": scores,
    softmax and dropout as separate XLA operations, `explicit_attention`; "pallas": the fused
    flash kernel with counter-based dropout, `bertjax.models.flash_attention`).
  row_multiple: the fused attention's query and key lengths, when odd, are padded up to a multiple
    of this (padded keys hidden from every real query, padded rows sliced off), and so are the
    gathered last layer's query rows (`model.gather_last_layer`): cuDNN's fused kernel has no
    backward pass for odd lengths. 1: nothing padded.
  fused_residual: a post-LN layer's two residual tails, LayerNorm(residual + dropout(y)), in one
    Pallas kernel each way (`bertjax.models.fused_residual`: its keep mask hashed from the
    layer's dropout key, another stream than `dropout`'s); off: dropout, add and LayerNorm as
    separate operations. Off in every set: its device speed is unmeasured.
  pallas_local_window: ModernBERT's local (sliding-window) layers through the Pallas flash kernel
    with its window (`bertjax.models.flash_attention`, `window`): each block of queries visits
    only the key blocks around it, block pairs of segments that cannot meet are skipped, and
    attention dropout, when training with it, is drawn in the kernel from the layer's key (another
    stream than `nn.Dropout`'s); off: the window band by band through XLA (`banded_attention`),
    the full window mask, or splash's LocalMask (TPU set). Interpreted off GPUs; for one device
    (XLA does not partition a Pallas call). Off in every set: its device speed is unmeasured.
  """
  platform: str
  flat_dense: bool
  layer_norm_vjp: bool
  remat_activation: bool
  attention: str
  attention_lengths: bool
  one_hot_rows: int
  dropout: str
  erf_gelu: bool
  float32_lookup: bool
  float32_gather: bool
  bias_product: bool
  scalar_clipping: bool
  attention_dropout: str = "explicit"
  row_multiple: int = 1
  fused_residual: bool = False
  pallas_local_window: bool = False


# CPU (XLA:CPU on 2-core x86 machines, bertjax.tools.benchmark; PERFORMANCE.md):
# - flat_dense: XLA:CPU hands its matmul kernels row-major 2-D operands only; a dot_general over
#   several axes made it write transposed copies of activations, gradients and 3-D kernels around
#   every attention projection. 2-core x86 (oneDNN on), 2026-11-23: bert-base batch 8 step
#   343 -> 382 tokens/s, XLA temp 1068 -> 962 MB.
# - layer_norm_vjp: 2-core x86, 2026-11-22: bert-base (batch 8, seq 128) step temp 1146 -> 1077 MB.
# - remat_activation: 2-core x86, 2026-11-22: bert-base step temp 1279 -> 1147 MB, speed within
#   noise.
# - attention "xla" with a boolean mask: the only implementation XLA:CPU has.
# - one_hot_rows: the 2-row token-type lookup as a one-hot product against the float32
#   scatter-add of its gradient: 2-core x86, 2026-11-23, bert-mini batch 16 6766-6939 against
#   6437-7017 tokens/s (medians 6872 vs 6454).
# - dropout "packed32": the bit-packed mask let each layer's random words die after the forward
#   pass, bert-base batch 8 temp 1231 -> 962 MB (bertjax/models/dropout.py). The other forms are
#   unmeasured on a CPU.
# - attention_dropout "explicit": the Pallas kernel runs only interpreted on a CPU (for tests).
# - erf_gelu: XLA:CPU expands erfc into about twice the work of erf; 2-core x86, 2026-11-22: with
#   the row-maximum top-1 and bias_product, bert-mini batch 16 3821 -> 3860-3960 tokens/s.
# - bias_product: the MLM bias gradient, a column sum over [320, 30522]: 2-core x86, 2026-11-22,
#   21 ms -> ~3 ms of a bert-mini batch 16 step.
# - scalar_clipping: optax's divide kept every clipped gradient as its own buffer, the step's peak
#   in the optimizer; 2-core x86, 2026-11-22: bert-base step temp 1077 -> 1068 MB with the peak
#   back in the backward pass.
# - float32_lookup, float32_gather: for half precision; the bf16 scatter-add they avoid is
#   unmeasured on a CPU (float32 runs, the CPU's default, read the same values either way).
CPU = Kernels(platform="cpu", flat_dense=True, layer_norm_vjp=True, remat_activation=True,
              attention="xla", attention_lengths=False, one_hot_rows=2, dropout="packed32",
              erf_gelu=True, float32_lookup=True, float32_gather=True, bias_product=True,
              scalar_clipping=True, attention_dropout="explicit")

# GPU (one H100 80GB, jax 0.11.2, commit 297e3fb, recorded in PERFORMANCE.md 2026-11-25: bf16
# bert-base, seq 128, batch 256, MLM+NSP, dropout 0.1; tokens/s) unless a line says otherwise:
# - attention: the fused cuDNN kernel with key lengths, attention forward+backward at
#   [32, 512, 16 heads] 0.61 ms against 2.2 ms composed by XLA.
# - one_hot_rows: the token-type gradient 89 ms as a bf16 scatter-add, 0.22 ms as a float32 one,
#   0.07 ms as a one-hot product.
# - flat_dense and layer_norm_vjp: the former GPU set (both off) 414.6k; with flat_dense 427.5k;
#   with layer_norm_vjp 440.8k. Each was measured alone; the two together are unmeasured.
# - dropout: the masks' words from XLA's RngBitGenerator instead of threefry, 414.6k -> 429.6k
#   (measured with JAX_DEFAULT_PRNG_IMPL=rbg, which makes every key rbg; "packed32+rbg" draws
#   only the masks so, from a key derived per layer: that form itself unmeasured). The other
#   forms (mask32, bits16, recompute16, +unsafe_rbg) are there to be measured, unmeasured so far;
#   an older version with byte-resolution masks ran 482k, so fewer random bits a mask may pay.
# - remat_activation stays off: unmeasured on a GPU. (The whole CPU set, remat included, ran
#   454.1k on the H100: the activation remat's share of that is unmeasured.)
# - attention_dropout "pallas": the flash kernel with counter-based dropout (Triton), bf16
#   bert-base seq 128 batch 256 MLM+NSP, dropout 0.1, one H200, jax 0.11.2, commit dd89774:
#   492,281 -> 549,204 tokens/s (+11.6%), peak 13,562 -> 11,362 MiB (one `--ablate` row each,
#   PERFORMANCE.md). Its CUDA lowering is checked on the CPU (tests/test_kernel_lowering.py).
#   One device only: under a mesh of several, "auto" keeps the explicit path
#   (`attention_dropout_path`), as XLA does not partition a Pallas call.
# - row_multiple 8: cuDNN refuses odd query or key lengths in training ("Unsupported sequence
#   length Q 21, KV 128" on the H100 for the gathered layer's 20 predictions + [CLS]); 8 rather
#   than 2 because tensor cores take rows in eights (unmeasured against 2).
# - float32_lookup: one H100, jax 0.11.2, commit 03ffe11: a profile put 115 of the bf16 step's
#   177 ms in bf16 scatter-adds of the embedding gradients; the lookups on the float32 tables gave
#   148k -> 482k (PERFORMANCE.md, quoted, not re-measured). float32_gather, the same scatter for
#   the masked rows: unmeasured.
# - erf_gelu, bias_product, scalar_clipping: kept from the CPU, unmeasured on a GPU.
# - pallas_local_window stays off: ModernBERT's local layers in the windowed flash kernel are
#   unmeasured on a GPU (an ablation row in experiments/ablations/modernbert-base-1024.py); their
#   CUDA lowering is checked on the CPU (tests/test_kernel_lowering.py).
GPU = Kernels(platform="gpu", flat_dense=True, layer_norm_vjp=True, remat_activation=False,
              attention="cudnn", attention_lengths=True, one_hot_rows=16, dropout="packed32+rbg",
              erf_gelu=True, float32_lookup=True, float32_gather=True, bias_product=True,
              scalar_clipping=True, attention_dropout="pallas", row_multiple=8)

# TPU: unmeasured; the ordinary formulation. Reshapes that merge the tiled minor dimensions can
# cost a relayout there, so Dense stays a dot_general over the kernel's axes. Small tables as
# one-hot products, as on GPUs: a gradient of every token added into a few rows is the operation
# the GPU measurement found slow; on a TPU, unmeasured. Attention through the splash kernel
# (padding and packed rows as its segment ids): unmeasured on a TPU, the TPU counterpart of the
# GPU set's fused kernel; off a TPU it runs in Pallas's
# interpret mode, a correctness check (tests/test_splash_attention.py). XLA's attention stays
# one setting away: `model.kernels=tpu-xla`. Attention dropout explicit: the Pallas flash kernel
# is untried on TPUs (it would run interpreted there). Dropout as on CPUs (threefry draws, packed
# masks): unmeasured. Float32 lookups and gathers, the erf GELU, the bias as a product and the
# scalar clipping kept from the CPU and GPU sets: unmeasured on a TPU.
TPU = Kernels(platform="tpu", flat_dense=False, layer_norm_vjp=False, remat_activation=False,
              attention="splash", attention_lengths=False, one_hot_rows=16, dropout="packed32",
              erf_gelu=True, float32_lookup=True, float32_gather=True, bias_product=True,
              scalar_clipping=True, attention_dropout="explicit")
TPU_XLA = dataclasses.replace(TPU, attention="xla")

# Stock Flax and optax, every field off: the reference the other sets are measured against, and
# the model as big_vision-style code would write it.
STOCK = Kernels(platform="stock", flat_dense=False, layer_norm_vjp=False, remat_activation=False,
                attention="xla", attention_lengths=False, one_hot_rows=0, dropout="flax",
                erf_gelu=False, float32_lookup=False, float32_gather=False, bias_product=False,
                scalar_clipping=False, attention_dropout="explicit")

_BY_PLATFORM = {"cpu": CPU, "gpu": GPU, "tpu": TPU, "tpu-xla": TPU_XLA, "stock": STOCK}


_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("bertjax_lowering_target",
                                                                   default=None)


def backend() -> str:
  """The platform the model is built for: JAX's backend, or the one `lowering_for` names."""
  return _TARGET.get() or jax.default_backend()


@contextlib.contextmanager
def lowering_for(platform: str):
  """Within the block, models are built for `platform` ("cuda", "rocm" or "tpu") rather than for
  the backend JAX runs on: `model.kernels="auto"` takes that platform's set and the Pallas kernels
  lower natively instead of in interpret mode, so that `jax.export.export(...,
  platforms=[platform])` on a CPU-only machine lowers what the device would compile (the Pallas
  kernels to Triton or Mosaic). cuDNN's attention stays off: its lowering looks for the library
  (tests/cudnn_rules.py stands in for its rules). Trace the function inside the block: a trace
  cached from outside it keeps its interpret-mode kernels."""
  token = _TARGET.set(platform)
  try:
    yield
  finally:
    _TARGET.reset(token)


def triton_interpreted() -> bool:
  """Whether the GPU Pallas kernels (Triton) run in interpret mode here: anywhere the model is
  not built for a GPU (the CPU, for tests)."""
  return backend() not in ("gpu", "cuda", "rocm")


def for_platform(platform: str) -> Kernels:
  """The choices for `platform` ("cpu", "gpu", "tpu", the "tpu-xla" variant, or "stock";
  "cuda" and "rocm" count as gpu)."""
  platform = {"cuda": "gpu", "rocm": "gpu"}.get(platform, platform)
  return _BY_PLATFORM.get(platform, CPU)


class Overrides(ml_collections.ConfigDict):
  """`config.model.kernel_overrides`: fields of `Kernels` changed in the chosen set, each None (the
  set's own) until given, e.g. `--config.model.kernel_overrides.fused_residual=True` (for
  ablations: one choice changed in a set). As data (`to_dict`: config.json, the resolved configs)
  it holds only the fields given, and "" while none is, which is how configs and run records
  written before the overrides were fields hold the setting."""

  def __init__(self, values: Mapping[str, Any] | None = None):
    super().__init__({name: values.get(name) if values else None for name in FIELDS})

  def to_dict(self, visit_map=None, preserve_field_references=False):
    given = {k: v for k, v in super().to_dict(visit_map, preserve_field_references).items()
             if v is not None}
    return given or ""


FIELDS = tuple(f.name for f in dataclasses.fields(Kernels) if f.name != "platform")
_TYPES = {f.name: f.type for f in dataclasses.fields(Kernels)}


def parse_overrides(value) -> dict:
  """The overrides a model config holds (a mapping of `Kernels` fields, its (field, value) pairs,
  or "" for none) as a dict of the fields given, each checked against its field's type. Raises
  ValueError naming what is wrong; the former "field=value,..." string is refused so, naming
  the fields' form."""
  if isinstance(value, str):
    if not value.strip():
      return {}
    first = value.split(",")[0].strip() or "fused_residual=True"
    raise ValueError(f"the 'field=value,...' string is no longer read; give each field as its "
                     f"own setting, e.g. --config.model.kernel_overrides.{first}")
  out = {}
  for name, given in (value.items() if isinstance(value, Mapping) else value):
    if given is None:
      continue
    if name not in FIELDS:
      raise ValueError(f"{name!r} is not a field of the kernel set; use one of {', '.join(FIELDS)}")
    kind = {"bool": bool, "int": int, "str": str}.get(_TYPES[name], _TYPES[name])
    if not isinstance(given, kind) or (kind is int and isinstance(given, bool)):
      raise ValueError(f"{name} takes {'True or False' if kind is bool else kind.__name__}, "
                       f"not {given!r}")
    out[name] = given
  return out


def for_model(cfg) -> Kernels:
  """The choices for a `ModelConfig`: its `kernels` setting, "auto" meaning JAX's backend, with
  its `kernel_overrides` (fields of the set changed). A model resolves it once, when it is built
  (`bertjax.models.layers.layers_for`)."""
  setting = getattr(cfg, "kernels", "auto")
  chosen = for_platform(backend() if setting == "auto" else setting)
  overrides = parse_overrides(getattr(cfg, "kernel_overrides", ""))
  return dataclasses.replace(chosen, **overrides) if overrides else chosen


def attention_dropout_setting(cfg, chosen: Kernels) -> str:
  """"explicit" or "pallas" as the model's `attention_dropout_kernel` says, "auto" meaning the
  set's (`chosen`) and written "auto:pallas" where that is the Pallas kernel: the path a trace
  under a mesh of several devices leaves for the explicit one (`attention_dropout_path`)."""
  setting = getattr(cfg, "attention_dropout_kernel", "auto")
  if setting != "auto":
    return setting
  return "auto:pallas" if chosen.attention_dropout == "pallas" else chosen.attention_dropout


def attention_dropout_path(setting: str) -> str:
  """The path a trace takes for `attention_dropout_setting`'s answer: "auto:pallas" is the
  explicit path under a mesh of several devices (a pallas_call is not partitioned by XLA, its
  operands would be gathered to every device, and the set's choice was measured on one device);
  `attention_dropout_kernel="pallas"` asks for the kernel anyway."""
  if setting != "auto:pallas":
    return setting
  return "explicit" if jax.sharding.get_abstract_mesh().size > 1 else "pallas"


def dropout_setting(cfg, chosen: Kernels) -> str:
  """The dropout implementation of a model: its `dropout_impl`, "auto" meaning the set's."""
  setting = getattr(cfg, "dropout_impl", "auto")
  return chosen.dropout if setting == "auto" else setting


def dropout_for_model(cfg) -> str:
  """The dropout implementation for a `ModelConfig`: its `dropout_impl`, "auto" meaning the
  kernel set's."""
  return dropout_setting(cfg, for_model(cfg))
