"""The encoder's hyperparameters, as a frozen dataclass a Linen module can hold.

Experiment configs carry these fields in `config.model` (an ml_collections ConfigDict);
`ModelConfig.from_dict` turns that into this immutable, hashable form. Names follow Hugging
Face's config.json so converted checkpoints map field for field.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Mapping

import jax.numpy as jnp

from bertjax.core.errors import fail
from bertjax.core.ranges import AT_LEAST_1, NON_NEGATIVE, POSITIVE, PROBABILITY, Range
from bertjax.models.dropout import DROPOUT_SETTINGS
from bertjax.models.attention import KERNELS
from bertjax.models.kernels import ATTENTION_DROPOUT_SETTINGS, KERNEL_SETTINGS, parse_overrides

ARCHITECTURES = ("bert", "roberta", "albert", "electra", "modernbert")
ACTIVATIONS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh")
REMAT_POLICIES = ("full", "dots")
# What a ModernBERT setup leaves out of the BERT family's options (bertjax.models.modernbert).
# `embedding_size` (a narrower table and a projection: ELECTRA's generator) and `pruned_heads`
# apply to it too.
_MODERNBERT_REFUSES = {"num_hidden_groups": None, "scan_layers": False}
# ModernBERT's numeric settings, checked against their declared ranges with the architecture
# (bertjax.config.config_checks checks every declared range of a config before a run).
MODERNBERT_FIELDS = ("norm_eps", "global_rope_theta", "local_rope_theta",
                     "global_attn_every_n_layers", "local_attention", "initializer_range",
                     "initializer_cutoff_factor", "attention_dropout", "embedding_dropout",
                     "mlp_dropout", "classifier_dropout")
CLASSIFIER_POOLINGS = ("cls", "mean")
# Fields that still apply when the architecture comes from a checkpoint (a fine-tuning run's
# init_from): they change how the encoder is trained or computed, not which parameters it has.
# ModernBERT's task head reads `classifier_pooling` and `classifier_dropout` (no parameter
# depends on them): the run's choice, as transformers' config decides them at fine-tuning.
RUN_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout_impl", "dtype",
              "remat", "remat_policy", "kernels", "kernel_overrides", "attention_dropout_kernel",
              "classifier_pooling", "classifier_dropout", "fp8", "fp8_amax_history")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


_NO_EXAMPLE = object()


def setting(default: Any, check: Range | tuple, help_text: str, example: Any = _NO_EXAMPLE):
  """A ModelConfig field declared as a setting: its default, its check (a Range, or a tuple of
  the allowed values) and its help, in one place. bertjax/config/settings.py reads them
  (`model_settings`): the configs' defaults, the checks before a run, `--help`."""
  metadata = {"check": check, "help": help_text}
  if example is not _NO_EXAMPLE:
    metadata["example"] = example  # the value a range's error suggests (else the default)
  return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and behaviour of one BERT-family encoder.

  `embedding_size` differs from `hidden_size` for ALBERT (factorized embeddings) and small
  ELECTRA models; a projection then maps embeddings to the hidden size. `num_hidden_groups`
  is ALBERT's cross-layer sharing: layer i uses the parameters of group
  i * num_hidden_groups // num_hidden_layers (None: every layer has its own).
  """
  vocab_size: int = setting(30522, AT_LEAST_1, "the model's vocabulary")
  hidden_size: int = setting(768, AT_LEAST_1, "the hidden width")
  num_hidden_layers: int = setting(12, AT_LEAST_1, "encoder layers")
  num_attention_heads: int = setting(12, AT_LEAST_1, "attention heads")
  intermediate_size: int = setting(3072, AT_LEAST_1, "the feed-forward width")
  hidden_act: str = "gelu"
  hidden_dropout_prob: float = setting(0.1, PROBABILITY, "dropout probability")
  attention_probs_dropout_prob: float = setting(0.1, PROBABILITY, "dropout probability")
  max_position_embeddings: int = setting(512, AT_LEAST_1, "rows of the position table")
  type_vocab_size: int = setting(2, AT_LEAST_1, "token types")
  layer_norm_eps: float = setting(1e-12, POSITIVE, "LayerNorm's epsilon")
  pad_token_id: int = setting(0, NON_NEGATIVE, "the padding id")
  architecture: str = "bert"
  embedding_size: int | None = setting(None, Range(1, also=(None,)),
                                       "the embedding width; None: hidden_size", example=128)
  num_hidden_groups: int | None = setting(None, Range(1, also=(None,)),
                                          "ALBERT's layer groups; None: one per layer", example=1)
  pre_layer_norm: bool = False
  use_pooler: bool = True
  # Activation inside the MLM head's transform: BERT/ALBERT use hidden_act, RoBERTa and
  # ELECTRA's generator hard-code exact GELU.
  mlm_head_act: str | None = None
  dtype: str = "float32"
  remat: bool = False
  # What a rematerialized layer keeps for the backward pass: "full" nothing (recompute the whole
  # layer), "dots" the outputs of its weight products (recompute attention and elementwise work).
  remat_policy: str = "full"
  # One compiled layer body scanned over a stacked `layers` parameter tree (faster compiles for
  # deep models). Its checkpoint layout differs from the unrolled one; not for ALBERT sharing.
  scan_layers: bool = False
  # Pretraining heads read only the masked positions and [CLS]: the last layer then computes its
  # queries, attention output, feed-forward and LayerNorms at those rows only (keys and values
  # still at every position). Same values; about (1 - (p + 1) / seq) of that layer's work saved.
  # Not with scan_layers (one body for every layer).
  gather_last_layer: bool = True
  # Which device's implementation choices the encoder uses (bertjax.models.kernels): "auto" takes
  # the backend JAX runs on; "cpu" | "gpu" | "tpu" force one (to measure them elsewhere);
  # "tpu-xla": the TPU set with XLA's attention instead of the splash kernel; "stock": every
  # hand-written form off (nn.Dense, nn.LayerNorm, nn.Embed, nn.Dropout, optax's clipping).
  kernels: str = "auto"
  # Fields of that set changed, as (field, value) pairs: for ablations, e.g.
  # --config.model.kernel_overrides.flat_dense=False (in a config, `kernels.Overrides`: a field
  # each, None for the set's own); () keeps the set as it is.
  kernel_overrides: tuple[tuple[str, Any], ...] = ()
  # The path of training steps with attention dropout: "auto" the kernel set's ("pallas" in the
  # GPU set, measured faster on an H200; "explicit" in the others); "explicit" softmax then dropout
  # in XLA; "pallas" the fused flash kernel with counter-based dropout
  # (bertjax.models.flash_attention; on the CPU it runs in Pallas interpret mode, for tests). Its
  # masks are another stream than the explicit path's: a different run, not a different layout.
  # Parameters are the same.
  attention_dropout_kernel: str = setting(
      "auto", ATTENTION_DROPOUT_SETTINGS, "the attention-dropout path: auto | explicit | pallas")
  # How dropout draws and keeps its masks (bertjax.models.dropout): "auto" the kernel set's choice
  # (bertjax.models.kernels); "flax": nn.Dropout; else a form, "packed32" | "mask32" | "bits16" |
  # "recompute16", optionally with a generator suffix "+rbg" | "+unsafe_rbg". Same rate and
  # parameters; other masks (and so other training noise) than another choice draws.
  dropout_impl: str = setting("auto", DROPOUT_SETTINGS, "how dropout draws and keeps its masks")
  # FP8 products in the encoder layers' projections (query, key, value, attention output,
  # intermediate, output; not the embeddings, not the heads), with delayed scaling
  # (bertjax.models.fp8): float8 inputs and kernels scaled by the largest magnitude of the last
  # `fp8_amax_history` steps. Off by default: no device figure shows it faster yet. The same
  # parameters; the scale state lives in the train state.
  fp8: bool = False
  fp8_amax_history: int = 1024  # steps of amax history each scale is taken from
  # Structured pruning (bertjax.prune): per layer, the attention heads removed, by their original
  # numbering (Hugging Face's `pruned_heads`); () or an empty tuple for a layer: none. A layer
  # keeps num_attention_heads - len(pruned_heads[i]) heads of head_dim each.
  pruned_heads: tuple[tuple[int, ...], ...] = ()
  # ModernBERT (architecture "modernbert", bertjax.models.modernbert) only, named as transformers'
  # ModernBertConfig names them, defaults as it has them; the other architectures ignore them.
  hidden_activation: str = "gelu"  # in GeGLU's gate (hidden_act is BERT's)
  norm_eps: float = setting(1e-5, POSITIVE, "ModernBERT: every LayerNorm's epsilon")
  norm_bias: bool = False          # LayerNorms with a bias
  attention_bias: bool = False     # biases in the fused q/k/v projection and the attention output
  mlp_bias: bool = False           # biases in the GeGLU feed-forward
  decoder_bias: bool = True        # a bias on the MLM decoder (its weights are the token table)
  classifier_activation: str = "gelu"  # in the MLM and task heads' dense transform
  classifier_bias: bool = False    # a bias in the MLM and task heads' dense transform
  classifier_pooling: str = "cls"  # sequence tasks read [CLS] ("cls") or the masked mean ("mean")
  classifier_dropout: float = setting(
      0.0, PROBABILITY, "ModernBERT task heads: dropout after the dense transform")
  global_rope_theta: float = setting(160000.0, POSITIVE,
                                     "ModernBERT: rotary base of the global-attention layers")
  local_rope_theta: float = setting(10000.0, POSITIVE,
                                    "ModernBERT: rotary base of the local (sliding-window) layers")
  global_attn_every_n_layers: int = setting(
      3, AT_LEAST_1, "ModernBERT: layer i attends globally when i % n == 0, else locally")
  local_attention: int = setting(
      128, Range(2), "ModernBERT: window of the local layers, local_attention // 2 each side")
  attention_dropout: float = setting(
      0.0, PROBABILITY, "ModernBERT: dropout on attention probabilities and output")
  embedding_dropout: float = setting(0.0, PROBABILITY,
                                     "ModernBERT: dropout after the embedding LayerNorm")
  mlp_dropout: float = setting(0.0, PROBABILITY,
                               "ModernBERT: dropout inside GeGLU, before its output projection")
  initializer_range: float = setting(
      0.02, NON_NEGATIVE, "ModernBERT: std of the truncated-normal init (output layers: less)")
  initializer_cutoff_factor: float = setting(2.0, POSITIVE,
                                             "ModernBERT: init truncated at this many stds")

  def __post_init__(self):
    try:  # config.json holds lists; a frozen (hashable) config holds tuples
      pruned = tuple(tuple(sorted(int(h) for h in layer)) for layer in self.pruned_heads or ())
    except (TypeError, ValueError):
      fail(f"model.pruned_heads={self.pruned_heads!r} must be one list of head numbers per layer")
    object.__setattr__(self, "pruned_heads", pruned)
    if self.architecture not in ARCHITECTURES:
      fail(f"unknown model architecture {self.architecture!r}; use one of {', '.join(ARCHITECTURES)}")
    for name in ("hidden_act", "mlm_head_act", "hidden_activation", "classifier_activation"):
      act = getattr(self, name)
      if act is not None and act not in ACTIVATIONS:
        fail(f"unknown activation model.{name}={act!r}; use one of {', '.join(ACTIVATIONS)}")
    if self.num_attention_heads < 1 or self.hidden_size % self.num_attention_heads:
      fail(f"model.hidden_size={self.hidden_size} is not divisible by "
           f"model.num_attention_heads={self.num_attention_heads}; pick sizes that divide")
    if self.dtype not in DTYPES:
      fail(f"unknown model.dtype={self.dtype!r}; use one of {', '.join(DTYPES)}")
    if self.remat_policy not in REMAT_POLICIES:
      fail(f"unknown model.remat_policy={self.remat_policy!r}; use one of "
           f"{', '.join(REMAT_POLICIES)}")
    if self.kernels not in KERNEL_SETTINGS:
      fail(f"unknown model.kernels={self.kernels!r}; use one of {', '.join(KERNEL_SETTINGS)}")
    try:
      attention = parse_overrides(self.kernel_overrides).get("attention")
    except ValueError as e:
      fail(f"model.kernel_overrides={self.kernel_overrides!r}: {e}")
    if attention is not None:
      if attention not in KERNELS:
        fail(f"unknown model.kernel_overrides.attention={attention!r}; use one of "
             f"{', '.join(KERNELS)} (bertjax.models.attention.KERNELS)")
    if self.attention_dropout_kernel not in ATTENTION_DROPOUT_SETTINGS:
      fail(f"unknown model.attention_dropout_kernel={self.attention_dropout_kernel!r}; use one of "
           f"{', '.join(ATTENTION_DROPOUT_SETTINGS)}")
    if self.dropout_impl not in DROPOUT_SETTINGS:
      fail(f"unknown model.dropout_impl={self.dropout_impl!r}; use one of "
           f"{', '.join(DROPOUT_SETTINGS)}")
    if self.fp8_amax_history < 1:
      fail(f"model.fp8_amax_history={self.fp8_amax_history} must be at least 1; e.g. "
           "--config.model.fp8_amax_history=1024")
    if self.scan_layers and self.num_hidden_groups not in (None, self.num_hidden_layers):
      fail("model.scan_layers needs one parameter set per layer; turn it off for ALBERT sharing")
    self._check_pruned_heads()
    if self.architecture == "modernbert":
      self._check_modernbert()
    groups = self.num_groups
    if not 1 <= groups <= self.num_hidden_layers or self.num_hidden_layers % groups:
      fail(f"model.num_hidden_groups={groups} must divide model.num_hidden_layers="
           f"{self.num_hidden_layers}")

  def _check_pruned_heads(self) -> None:
    if not self.pruned_heads:
      return
    if len(self.pruned_heads) != self.num_hidden_layers:
      fail(f"model.pruned_heads lists {len(self.pruned_heads)} layers, the model has "
           f"{self.num_hidden_layers}; give one (possibly empty) list per layer")
    if self.num_groups != self.num_hidden_layers:
      fail("model.pruned_heads needs one parameter set per layer; ALBERT's shared layers cannot "
           "lose heads layer by layer")
    for i, layer in enumerate(self.pruned_heads):
      if len(set(layer)) != len(layer) or any(not 0 <= h < self.num_attention_heads for h in layer):
        fail(f"model.pruned_heads[{i}]={list(layer)} must name distinct heads in 0.."
             f"{self.num_attention_heads - 1}")
      if len(layer) == self.num_attention_heads:
        fail(f"model.pruned_heads[{i}] removes every head of layer {i}; remove the layer instead")
    if self.scan_layers and len({len(layer) for layer in self.pruned_heads}) > 1:
      fail("model.scan_layers needs the same head count in every layer, and model.pruned_heads "
           "differs by layer; set --config.model.scan_layers=False")

  def _check_modernbert(self) -> None:
    for name, off in _MODERNBERT_REFUSES.items():
      if getattr(self, name) != off:
        fail(f"model.{name} does not apply to architecture modernbert; set "
             f"--config.model.{name}={off!r}")
    for field in dataclasses.fields(self):  # its declared ranges (a config.json is not checked)
      check, value = field.metadata.get("check"), getattr(self, field.name)
      if field.name in MODERNBERT_FIELDS and not check.holds(value):
        fail(f"model.{field.name}={value} must be {check}; e.g. "
             f"--config.model.{field.name}={field.default}")
    if self.classifier_pooling not in CLASSIFIER_POOLINGS:
      fail(f"unknown model.classifier_pooling={self.classifier_pooling!r}; use one of "
           f"{', '.join(CLASSIFIER_POOLINGS)}")
    if self.head_dim % 2:
      fail(f"ModernBERT's rotary embedding needs an even head size; model.hidden_size="
           f"{self.hidden_size} / num_attention_heads={self.num_attention_heads} is "
           f"{self.head_dim}")

  def is_global_layer(self, layer: int) -> bool:
    """ModernBERT: whether layer `layer` attends to every position (else within the window)."""
    return layer % self.global_attn_every_n_layers == 0

  def layer_heads(self, layer: int) -> int:
    """How many attention heads layer `layer` has (fewer than num_attention_heads if pruned)."""
    return self.num_attention_heads - (len(self.pruned_heads[layer]) if self.pruned_heads else 0)

  def kept_heads(self, layer: int) -> tuple[int, ...]:
    """The original numbers of the heads layer `layer` keeps, in the order its weights hold them."""
    pruned = set(self.pruned_heads[layer]) if self.pruned_heads else set()
    return tuple(h for h in range(self.num_attention_heads) if h not in pruned)

  @property
  def embed_size(self) -> int:
    return self.embedding_size or self.hidden_size

  @property
  def num_groups(self) -> int:
    return self.num_hidden_groups or self.num_hidden_layers

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  @property
  def compute_dtype(self):
    return DTYPES[self.dtype]

  @property
  def position_offset(self) -> int:
    """RoBERTa numbers positions from pad_token_id + 1; padding takes position pad_token_id."""
    return self.pad_token_id + 1 if self.architecture == "roberta" else 0

  # Fields `to_dict` leaves out while `fp8` is off, with their defaults: the configs built from it
  # (configs/common.py) and the records of runs without FP8 stay as they were before these
  # existed; `--config.model.fp8=True` still sets them (bertjax.config.config_lib).
  OPTIONAL_FIELDS = {"fp8": False, "fp8_amax_history": 1024}

  def replace(self, **kwargs) -> "ModelConfig":
    return dataclasses.replace(self, **kwargs)

  def to_dict(self) -> dict[str, Any]:
    """The fields as JSON holds them: pruned_heads as lists, and only when some head is pruned
    (so unpruned models' records, and the runs that resume them, are as before); the kernel
    overrides as {field: value}, "" for none (as records written before they were fields); the
    FP8 fields only with `fp8` on (likewise)."""
    d = dataclasses.asdict(self)
    d["pruned_heads"] = [list(layer) for layer in self.pruned_heads]
    if not any(self.pruned_heads):
      del d["pruned_heads"]
    d["kernel_overrides"] = parse_overrides(self.kernel_overrides) or ""
    if not self.fp8:  # records (and configs) without FP8 read as before it was a field
      for name in self.OPTIONAL_FIELDS:
        del d[name]
    return d

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "ModelConfig":
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      fail(f"unknown model setting(s) {', '.join(unknown)}; valid ones: {', '.join(sorted(known))}")
    for f in dataclasses.fields(cls):
      if f.name in d:
        _check_kind(f.name, f.type, d[f.name])
    d = dict(d)
    if "kernel_overrides" in d:
      d["kernel_overrides"] = _override_pairs(d["kernel_overrides"])
    return cls(**d)


def _override_pairs(value: Any) -> Any:
  """`kernel_overrides` as a config or a record holds it ({field: value}, a `kernels.Overrides`
  with None for the fields not given, or "" for none) as the sorted (field, value) pairs of the
  fields given. Any other string is kept, for `parse_overrides` to refuse in one line."""
  if isinstance(value, str):
    return () if not value.strip() else value
  items = value.items() if hasattr(value, "items") else value
  return tuple(sorted((str(k), v) for k, v in items if v is not None))


# A field's annotation -> what its value must be (a bad type failed deep inside, e.g. "not all
# arguments converted during string formatting" for hidden_size "768").
_KINDS = {"int": ("an integer", numbers.Integral), "float": ("a number", numbers.Real),
          "str": ("a string", str), "bool": ("true or false", bool)}


def _check_kind(name: str, annotation: str, value: Any) -> None:
  base, optional = annotation.removesuffix(" | None"), annotation.endswith(" | None")
  if base not in _KINDS or (value is None and optional):
    return
  what, kind = _KINDS[base]
  if not isinstance(value, kind) or (isinstance(value, bool) and base != "bool"):
    fail(f"model.{name}={value!r} must be {what}{' or null' if optional else ''}")
