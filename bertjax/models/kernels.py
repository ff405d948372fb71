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


# Why each field is set so on a CPU, with the measurements: PERFORMANCE.md, "Why the kernel sets".
CPU = Kernels(platform="cpu", flat_dense=True, layer_norm_vjp=True, remat_activation=True,
              attention="xla", attention_lengths=False, one_hot_rows=2, dropout="packed32",
              erf_gelu=True, float32_lookup=True, float32_gather=True, bias_product=True,
              scalar_clipping=True, attention_dropout="explicit")

# Why each field is set so on a GPU, with the measurements: PERFORMANCE.md, "Why the kernel sets".
GPU = Kernels(platform="gpu", flat_dense=True, layer_norm_vjp=True, remat_activation=False,
              attention="cudnn", attention_lengths=True, one_hot_rows=16, dropout="packed32+rbg",
              erf_gelu=True, float32_lookup=True, float32_gather=True, bias_product=True,
              scalar_clipping=True, attention_dropout="pallas", row_multiple=8)

# TPU: unmeasured; why each field is set so: PERFORMANCE.md, "Why the kernel sets".
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
