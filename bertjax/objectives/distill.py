"""Knowledge distillation: a smaller student learns from a frozen teacher checkpoint.

Two objectives share the machinery here:

- `distill` (pretraining; DistilBERT, Sanh et al. 2019, and TinyBERT's general distillation, Jiao
  et al. 2020): the student does masked language modelling on the corpus while matching the
  teacher's MLM distribution at the masked positions, its hidden states and attention scores.
- `distill_glue` (task distillation): a teacher fine-tuned on a GLUE task (a workdir trained with
  configs/glue.py) gives soft targets for a student fine-tuned on the same task. Data, schedule,
  evaluation and prediction files are `GlueTask`'s, used by composition.

The teacher (`config.distill.teacher`: a training workdir or a converted HF folder) is loaded once
with `checkpoints.load_model_config` / `checkpoints.restore_params`, placed on the mesh with the
student's logical sharding rules, and held by the objective. The loss closes over it and runs its
forward pass (deterministic) inside the same jitted train step, behind `jax.lax.stop_gradient`.
Its params are never part of the `TrainState`: no optimizer moments, no checkpoint bytes.

Losses, each weighted by `config.distill.*_weight` (a weight of 0 skips the term and its work):
  soft       T^2 * CE(softmax(teacher / T), softmax(student / T)) at the masked positions (task:
             per example; a regression task uses the squared error to the teacher's prediction)
  hard       the student's own loss on the true labels (MLM; the task's labels)
  cosine     1 - cos(student, teacher) of the last hidden states, averaged over real tokens
  hidden     TinyBERT: sum over `layer_map` pairs (i, j) of the MSE between the student's layer-i
             output through a learned projection W_h (params["distill_proj"], student width ->
             teacher width) and the teacher's layer-j output, averaged over real tokens and units
  attention  TinyBERT: sum over `layer_map` pairs of the MSE between the layers' pre-softmax
             attention scores, averaged over real (query, key) pairs and heads
Every sum is divided by a whole-batch denominator, so gradient accumulation stays exact.
Metrics: each term (soft_ce, plus soft_kl = soft_ce minus the teacher's entropy, which reaches 0
when the student matches; mlm_loss / task_loss; cosine_loss; hidden_mse; attention_mse), the
student's and the teacher's accuracy on the true labels, and `agreement` (same argmax).

The teacher's arrays reach the jitted step as sharded arguments, not compiled-in constants: the
objective turns on JAX's `jax_use_simplified_jaxpr_constants` when it loads the teacher.

`config.distill.student_init`: "teacher_layers" copies the teacher's embeddings, head and an evenly
spread subset of its layers into the student (DistilBERT: teacher layers 0, 2, 4, ... into student
layers 0, 1, 2, ...; shapes must match), "scratch" starts from random weights.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
from typing import Any, Mapping

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax import checkpoints, sharding
from bertjax.errors import fail
from bertjax.models.config import ModelConfig
from bertjax.models.encoder import Encoder
from bertjax.models.layers import dense_init
from bertjax.models.heads import ClassificationHead, MLMHead, gather_positions
from bertjax.objective import Objective
from bertjax.tasks import base as task_base
from bertjax.tasks import glue as glue_task

_log = logging.getLogger(__name__)

STUDENT_INITS = ("teacher_layers", "scratch")
# Objectives whose workdirs keep the architecture of their init_from rather than config.model.
_TASK_OBJECTIVES = ("glue", "squad", "ner", "distill_glue")
# ModelConfig fields that decide parameter shapes: teacher_layers init needs them equal.
_SHAPE_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size",
                 "max_position_embeddings", "type_vocab_size", "embed_size", "use_pooler",
                 "pre_layer_norm", "architecture")


# ---------------------------------------------------------------------------------------------
# Settings.


@dataclasses.dataclass(frozen=True)
class Settings:
  """`config.distill` in checked form. layer_map: (student layer, teacher layer) pairs, 0-based."""
  teacher: str
  student_init: str
  temperature: float
  soft_weight: float
  hard_weight: float
  cosine_weight: float
  hidden_weight: float
  attention_weight: float
  layer_map_text: str
  init_layers_text: str
  layer_map: tuple[tuple[int, int], ...] = ()

  @classmethod
  def from_config(cls, config) -> "Settings":
    if "distill" not in config:
      fail(f"objective {config.objective} needs the config.distill settings; start from "
           "configs/distill.py")
    d = config.distill
    s = cls(teacher=str(d.teacher), student_init=str(d.student_init),
            temperature=float(d.temperature), soft_weight=float(d.soft_weight),
            hard_weight=float(d.hard_weight), cosine_weight=float(d.cosine_weight),
            hidden_weight=float(d.hidden_weight), attention_weight=float(d.attention_weight),
            layer_map_text=str(d.layer_map), init_layers_text=str(d.init_layers))
    if s.student_init not in STUDENT_INITS:
      fail(f"distill.student_init={s.student_init!r} is not one of {', '.join(STUDENT_INITS)}")
    if not s.temperature > 0:
      fail(f"distill.temperature={s.temperature} must be positive (DistilBERT uses 2.0)")
    weights = {k: getattr(s, k) for k in ("soft_weight", "hard_weight", "cosine_weight",
                                          "hidden_weight", "attention_weight")}
    negative = [k for k, v in weights.items() if v < 0]
    if negative:
      fail(f"distill.{negative[0]}={weights[negative[0]]} is negative; loss weights must be >= 0")
    if not any(weights.values()):
      fail("every distill.*_weight is 0, so there is nothing to train; set e.g. "
           "--config.distill.soft_weight=1.0")
    if (s.hidden_weight or s.attention_weight) and not s.layer_map_text.strip():
      fail("distill.hidden_weight / attention_weight need distill.layer_map (e.g. 'uniform' or "
           "'0:1,1:3,2:5': student layer : teacher layer); set --config.distill.layer_map")
    return s

  @property
  def uses_hidden(self) -> bool:
    return bool(self.cosine_weight or self.hidden_weight)

  @property
  def uses_attention(self) -> bool:
    return bool(self.attention_weight)


def parse_layer_map(text: str, student_layers: int,
                    teacher_layers: int) -> tuple[tuple[int, int], ...]:
  """'0:1,1:3' | 'uniform' | '' -> ((student layer, teacher layer), ...), 0-based, checked.

  'uniform' is TinyBERT's mapping: student layer i <-> teacher layer (i + 1) * T // S - 1, so the
  last layers meet (3 of 6: 0:1, 1:3, 2:5).
  """
  text = text.strip()
  if not text:
    return ()
  if text == "uniform":
    return tuple((i, (i + 1) * teacher_layers // student_layers - 1)
                 for i in range(student_layers))
  pairs = []
  for item in text.split(","):
    left, sep, right = (p.strip() for p in item.partition(":"))
    try:
      if not sep:
        raise ValueError(item)
      s, t = int(left), int(right)
    except ValueError:
      fail(f"distill.layer_map item {item.strip()!r} is not STUDENT:TEACHER layer numbers; write "
           "e.g. --config.distill.layer_map='0:1,1:3,2:5' or 'uniform'")
    if not 0 <= s < student_layers:
      fail(f"distill.layer_map {item.strip()!r} names student layer {s}, but the student has "
           f"{student_layers} layers (0..{student_layers - 1}); fix --config.distill.layer_map")
    if not 0 <= t < teacher_layers:
      fail(f"distill.layer_map {item.strip()!r} names teacher layer {t}, but the teacher has "
           f"{teacher_layers} layers (0..{teacher_layers - 1}); fix --config.distill.layer_map")
    pairs.append((s, t))
  return tuple(pairs)


def init_layer_sources(text: str, student_groups: int, teacher_groups: int) -> tuple[int, ...]:
  """Which teacher layer (group) each student layer starts from: `distill.init_layers` ('0,2,4')
  or, empty, every (T/S)-th one from the bottom (DistilBERT's 12 -> 6: 0, 2, 4, 6, 8, 10)."""
  if not text.strip():
    if student_groups > teacher_groups:
      fail(f"student_init=teacher_layers needs at most the teacher's {teacher_groups} layers, the "
           f"student has {student_groups}; lower model.num_hidden_layers or use "
           "--config.distill.student_init=scratch")
    return tuple(i * teacher_groups // student_groups for i in range(student_groups))
  try:
    layers = tuple(int(x) for x in text.split(","))
  except ValueError:
    fail(f"distill.init_layers={text!r} is not a comma-separated list of teacher layers")
  if len(layers) != student_groups:
    fail(f"distill.init_layers={text!r} names {len(layers)} teacher layers for a student of "
         f"{student_groups}; give one per student layer")
  bad = [t for t in layers if not 0 <= t < teacher_groups]
  if bad:
    fail(f"distill.init_layers names teacher layer {bad[0]}, but the teacher has {teacher_groups} "
         f"layers (0..{teacher_groups - 1}); fix --config.distill.init_layers")
  return layers


# ---------------------------------------------------------------------------------------------
# Models.


class Projection(nn.Module):
  """TinyBERT's W_h: <float>[..., student hidden] -> <float>[..., features] (the teacher's width).

  Identity-initialized when the widths match, so a student copied from the teacher starts with
  the teacher's own hidden states on both sides of the loss.
  """
  features: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    if d == self.features:
      init = lambda key, shape, dtype=jnp.float32: jnp.eye(shape[0], shape[1], dtype=dtype)
    else:
      init = dense_init()
    kernel = self.param("kernel", nn.with_logical_partitioning(init, ("embed", "embed_out")),
                        (d, self.features), jnp.float32)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                           ("embed_out",)),
                      (self.features,), jnp.float32)
    return x.astype(self.dtype) @ kernel.astype(self.dtype) + bias.astype(self.dtype)


class DistillModel(nn.Module):
  """The encoder with an MLM head (`head="mlm"`) or a classifier on the pooled output
  (`head="classifier"`), returning what distillation compares.

  Param names are those of `PretrainingModel` ({"encoder", "mlm"}) and `SequenceClassifier`
  ({"encoder", "classifier"}), plus "distill_proj" when `proj_layers` is set: a distilled student
  loads anywhere those models do (init_from, fine-tuning, conversion).

  Call: input_ids, attention_mask, token_type_ids <int32>[batch, seq]; masked_positions
  <int32>[batch, p] (mlm). Returns {"logits": <float32>[batch, p, vocab] (mlm) or
  <float32>[batch, num_labels], "hidden_states": (embeddings, layer 0, ...) <float>[batch, seq,
  hidden] or None, "attentions": per layer <float>[batch, heads, seq, seq] or None, "projected":
  {hidden_states index: <float>[batch, seq, proj_size]} for `proj_layers`}.
  """
  config: ModelConfig
  head: str = "mlm"
  num_labels: int = 0
  proj_layers: tuple[int, ...] = ()   # indices into hidden_states to pass through distill_proj
  proj_size: int = 0

  def setup(self):
    self.encoder = Encoder(self.config)
    if self.head == "mlm":
      self.mlm = MLMHead(self.config)
    else:
      self.classifier = ClassificationHead(self.config, self.num_labels)
    if self.proj_layers:
      self.distill_proj = Projection(self.proj_size, dtype=self.config.compute_dtype)

  def __call__(self, input_ids, attention_mask, token_type_ids, masked_positions=None, *,
               deterministic: bool = True, output_hidden_states: bool = False,
               output_attentions: bool = False):
    out = self.encoder(input_ids, attention_mask, token_type_ids, deterministic=deterministic,
                       output_hidden_states=output_hidden_states or bool(self.proj_layers),
                       output_attentions=output_attentions)
    if self.head == "mlm":
      logits = self.mlm(gather_positions(out.last_hidden_state, masked_positions), self.encoder)
    else:
      pooled = out.pooler_output if out.pooler_output is not None else out.last_hidden_state[:, 0]
      logits = self.classifier(pooled, deterministic)
    projected = {i: self.distill_proj(out.hidden_states[i]) for i in self.proj_layers}
    return {"logits": logits, "hidden_states": out.hidden_states, "attentions": out.attentions,
            "projected": projected}


# ---------------------------------------------------------------------------------------------
# Loss terms (pure functions of the two models' outputs).


def soft_cross_entropy(student_logits, teacher_logits, temperature: float):
  """Per-position T^2 * CE(softmax(teacher / T), softmax(student / T)) and T^2 * KL(teacher ||
  student), both <float32>[...]. The KL (CE minus the teacher's entropy) has the same gradient
  and reaches 0 when the student matches, so it is the readable metric."""
  t = jnp.asarray(temperature, jnp.float32)
  teacher_log_probs = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / t, axis=-1)
  targets = jnp.exp(teacher_log_probs)
  log_probs = jax.nn.log_softmax(student_logits.astype(jnp.float32) / t, axis=-1)
  # T^2 keeps the soft term's gradient scale independent of T (Hinton et al., 2015).
  ce = -jnp.sum(targets * log_probs, axis=-1) * t * t
  kl = jnp.sum(targets * (teacher_log_probs - log_probs), axis=-1) * t * t
  return ce, kl


def cosine_distance(a, b, eps: float = 1e-8):
  """1 - cos(a, b) along the last axis: <float32>[...]."""
  a, b = a.astype(jnp.float32), b.astype(jnp.float32)
  dot = jnp.sum(a * b, -1)
  norms = jnp.sqrt(jnp.sum(a * a, -1)) * jnp.sqrt(jnp.sum(b * b, -1))
  return 1.0 - dot / jnp.maximum(norms, eps)


def distill_denominators(attention_mask, weights) -> dict[str, jax.Array]:
  """Whole-batch counts: soft-target positions (`weights`: masked positions or rows), real
  tokens, and real (query, key) pairs."""
  real = attention_mask.astype(jnp.float32)
  per_row = jnp.sum(real, axis=-1)
  return {"soft": jnp.maximum(jnp.sum(weights.astype(jnp.float32)), 1.0),
          "tokens": jnp.maximum(jnp.sum(real), 1.0),
          "pairs": jnp.maximum(jnp.sum(per_row * per_row), 1.0)}


def distillation_terms(student: Mapping[str, Any], teacher: Mapping[str, Any], labels,
                       weights, attention_mask, denominators: Mapping[str, jax.Array],
                       settings: Settings, *, hard_prefix: str = "mlm",
                       regression: bool = False) -> tuple[jax.Array, dict]:
  """The weighted distillation loss and its metrics from both models' outputs.

  student / teacher: DistillModel outputs. logits <float32>[*lead, classes] where lead is
  [batch, p] (MLM at masked positions) or [batch] (one prediction per example). labels
  <int32>[*lead] (float32 for regression); weights <float32>[*lead] (0: padding);
  attention_mask <int32>[batch, seq]. denominators: `distill_denominators` of the whole batch.
  Returns (loss, {name: (numerator, denominator)}).
  """
  s = settings
  w = weights.astype(jnp.float32)
  s_logits, t_logits = student["logits"], teacher["logits"]
  metrics: dict[str, tuple[jax.Array, jax.Array]] = {}
  n = jnp.sum(w)
  loss = jnp.zeros((), jnp.float32)

  # The student's own loss on the true labels; its metrics are reported even at weight 0.
  if regression:
    hard = jnp.sum(jnp.square(s_logits[..., 0] - labels.astype(jnp.float32)) * w)
    metrics[f"{hard_prefix}_mse"] = (hard, n)
  else:
    ce = optax.softmax_cross_entropy_with_integer_labels(s_logits, labels.astype(jnp.int32))
    hard = jnp.sum(ce * w)
    s_pred, t_pred = jnp.argmax(s_logits, -1), jnp.argmax(t_logits, -1)
    metrics[f"{hard_prefix}_loss"] = (hard, n)
    accuracy = "accuracy" if hard_prefix == "task" else f"{hard_prefix}_accuracy"
    metrics[accuracy] = (jnp.sum((s_pred == labels) * w), n)
    metrics[f"teacher_{accuracy}"] = (jnp.sum((t_pred == labels) * w), n)
    metrics["agreement"] = (jnp.sum((s_pred == t_pred) * w), n)
  if s.hard_weight:
    loss += s.hard_weight * hard / denominators["soft"]

  if s.soft_weight:
    if regression:
      soft = jnp.sum(jnp.square(s_logits[..., 0] - t_logits[..., 0].astype(jnp.float32)) * w)
      metrics["soft_mse"] = (soft, n)
    else:
      ce, kl = soft_cross_entropy(s_logits, t_logits, s.temperature)
      soft = jnp.sum(ce * w)
      metrics["soft_ce"] = (soft, n)
      metrics["soft_kl"] = (jnp.sum(kl * w), n)
    loss += s.soft_weight * soft / denominators["soft"]

  real = attention_mask.astype(jnp.float32)
  tokens = jnp.sum(real)
  if s.cosine_weight:
    s_last, t_last = student["hidden_states"][-1], teacher["hidden_states"][-1]
    if s_last.shape[-1] != t_last.shape[-1]:  # different widths: compare through W_h
      s_last = student["projected"][len(student["hidden_states"]) - 1]
    cos = jnp.sum(cosine_distance(s_last, t_last) * real)
    metrics["cosine_loss"] = (cos, tokens)
    loss += s.cosine_weight * cos / denominators["tokens"]

  if s.hidden_weight:
    width = teacher["hidden_states"][-1].shape[-1]
    total = jnp.zeros((), jnp.float32)
    for i, j in s.layer_map:
      diff = (student["projected"][i + 1].astype(jnp.float32)
              - teacher["hidden_states"][j + 1].astype(jnp.float32))
      total += jnp.sum(jnp.sum(jnp.square(diff), -1) * real)
    metrics["hidden_mse"] = (total, tokens * width)
    loss += s.hidden_weight * total / (denominators["tokens"] * width)

  if s.attention_weight:
    pairs = real[:, None, :, None] * real[:, None, None, :]   # [batch, 1, q, k]
    heads = teacher["attentions"][0].shape[1]
    total = jnp.zeros((), jnp.float32)
    for i, j in s.layer_map:
      diff = (student["attentions"][i].astype(jnp.float32)
              - teacher["attentions"][j].astype(jnp.float32))
      total += jnp.sum(jnp.square(diff) * pairs)
    metrics["attention_mse"] = (total, jnp.sum(pairs) * heads)
    loss += s.attention_weight * total / (denominators["pairs"] * heads)
  return loss, metrics


# ---------------------------------------------------------------------------------------------
# The teacher.


def _teacher_model_fields(path: pathlib.Path, depth: int = 0) -> dict:
  """The ModelConfig fields of a teacher folder. A fine-tuning workdir records the experiment's
  `model` block but trains the architecture of its own init_from, so follow that chain."""
  if (path / "model.json").is_file() or depth > 8:
    return checkpoints.load_model_config(path)
  experiment = json.loads((path / "config.json").read_text())
  source = experiment.get("init_from") or ""
  if experiment.get("objective") in _TASK_OBJECTIVES and source:
    source_path = pathlib.Path(source).expanduser()
    if (source_path / "model.json").is_file() or (source_path / "config.json").is_file():
      return _teacher_model_fields(source_path, depth + 1)
  return dict(experiment["model"])


def _flat(tree) -> dict[str, Any]:
  return flax.traverse_util.flatten_dict(tree, sep="/")


class Teacher:
  """A frozen model from a checkpoint folder: its config, module and (sharded) params.

  `params` is a tree of device arrays, laid out on the mesh by the same logical rules as the
  student's; the loss closes over it, so it lives outside the train state.
  """

  def __init__(self, path: str, head: str, dtype: str, num_labels: int = 0, kernels: str = "auto"):
    self.path = pathlib.Path(path).expanduser()
    self.head = head
    self.num_labels = num_labels
    where = f"distill.teacher={path}"
    if not path:
      fail("distill.teacher is empty; set --config.distill.teacher to a training workdir or a "
           "converted checkpoint folder (python -m bertjax.convert from-hf)")
    if not self.path.is_dir():
      fail(f"{where} does not exist; point --config.distill.teacher at a training workdir or a "
           "converted checkpoint folder")
    has_params = (self.path / "params").is_dir() or (self.path / "checkpoints").is_dir()
    has_config = (self.path / "model.json").is_file() or (self.path / "config.json").is_file()
    if not (has_params and has_config):
      fail(f"{where} holds no {'checkpoint' if not has_params else 'model.json/config.json'}; "
           "point it at a finished training workdir or a converted checkpoint folder")
    try:
      fields = _teacher_model_fields(self.path)
    except (json.JSONDecodeError, KeyError, TypeError) as e:
      fail(f"{where}: cannot read its model config ({type(e).__name__}: {e}); is it a bertjax "
           "workdir?")
    # The teacher only predicts: no dropout or recomputation; the student's compute dtype and
    # kernel set.
    fields.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, remat=False,
                  dtype=dtype, kernels=kernels)
    self.config = ModelConfig.from_dict(fields)
    self.model = DistillModel(self.config, head=head, num_labels=num_labels)
    self.params = None

  @property
  def tokenizer_dir(self) -> pathlib.Path | None:
    folder = self.path / "tokenizer"
    return folder if folder.is_dir() else None

  def load(self, mesh, rules, init_inputs: Mapping[str, Any]) -> None:
    """Restores the params, checks them against the teacher's config and places them."""
    if self.params is not None:
      return
    where = f"distill.teacher={self.path}"
    restored = checkpoints.restore_params(self.path)
    wanted = ("encoder", self.head)
    missing = [k for k in wanted if k not in restored]
    if missing:
      kind = ("an MLM head (pretrain the teacher with objective mlm/mlm_nsp, or convert a BERT "
              "or RoBERTa checkpoint)" if self.head == "mlm" else
              "a classifier (fine-tune it with configs/glue.py first)")
      fail(f"{where} has no {'/'.join(missing)} params (it holds {', '.join(sorted(restored))}); "
           f"this distillation needs a teacher with {kind}")
    restored = {k: restored[k] for k in wanted}
    abstract = jax.eval_shape(lambda r: self.model.init(r, **init_inputs)["params"],
                              jax.random.key(0))
    shapes = {k: tuple(v.shape) for k, v in _flat(nn.meta.unbox(abstract)).items()}
    got = {k: tuple(np.shape(v)) for k, v in _flat(restored).items()}
    for key, shape in shapes.items():
      if got.get(key) != shape:
        fail(f"{where}: its params do not fit its model config ({key}: "
             f"{got.get(key, 'missing')} in the checkpoint, {shape} from the config); point at "
             "the workdir the checkpoint was trained in")
    shardings = sharding.logical_shardings(abstract, mesh, rules)

    def place(value, target):
      value = np.asarray(value, np.float32)
      return jax.make_array_from_callback(value.shape, target, lambda idx: value[idx])

    self.params = jax.tree.map(place, restored, shardings)
    n = sum(int(np.prod(s)) for s in shapes.values())
    # The loss closes over the teacher. JAX's default compiles closed-over arrays into the
    # executable as replicated constants; its newer mode passes them as sharded arguments, which
    # is what a large teacher needs (results are identical).
    jax.config.update("jax_use_simplified_jaxpr_constants", True)
    task_base.announce(f"distill: teacher {self.path} ({self.config.num_hidden_layers} layers, "
                       f"hidden {self.config.hidden_size}, {n:,} params), frozen")

  def __call__(self, inputs: Mapping[str, Any], hidden: bool, attentions: bool) -> dict:
    """The teacher's outputs on a batch: deterministic, no gradient."""
    params = jax.lax.stop_gradient(self.params)
    out = self.model.apply({"params": params}, **inputs, deterministic=True,
                           output_hidden_states=hidden, output_attentions=attentions)
    return jax.lax.stop_gradient(out)


def check_tokenizers(tokenizer, teacher: Teacher) -> None:
  """Fails unless the data's tokenizer is the teacher's: the two models must share the vocabulary
  the soft targets range over, id for id."""
  if tokenizer is None or teacher.tokenizer_dir is None:
    return
  from bertjax.data import tokenizers  # pylint: disable=g-import-not-at-top
  theirs = tokenizers.load_tokenizer(teacher.tokenizer_dir)
  n = tokenizer.vocab_size
  if theirs.vocab_size != n or any(theirs.id_to_token(i) != tokenizer.id_to_token(i)
                                   for i in range(n)):
    fail(f"the data is tokenized with a different vocabulary than the teacher's "
         f"({teacher.tokenizer_dir}); prepare the corpus with --config.data.tokenizer="
         f"{teacher.tokenizer_dir} (or leave data_dir and data.tokenizer empty to use it)")


# ---------------------------------------------------------------------------------------------
# The objectives.


class _Distillation:
  """What both objectives share: settings, the teacher, the student model and its init."""
  head = "mlm"

  def _setup(self, config, num_labels: int = 0) -> None:
    self.settings = Settings.from_config(config)
    self.teacher = Teacher(self.settings.teacher, self.head, config.model.dtype, num_labels,
                           config.model.kernels)
    self.student_config: ModelConfig | None = None
    self.init_sources: tuple[int, ...] = ()

  def _check_student(self, student: ModelConfig) -> None:
    """Student against teacher: vocabulary, layer_map, heads, and shapes for teacher_layers."""
    t = self.teacher.config
    where = f"distill.teacher={self.settings.teacher}"
    if student.vocab_size != t.vocab_size:
      fail(f"{where} has vocab_size {t.vocab_size} but the student's model.vocab_size is "
           f"{student.vocab_size}; student and teacher must share one vocabulary: set "
           f"--config.model.vocab_size={t.vocab_size} and use the teacher's tokenizer")
    layer_map = parse_layer_map(self.settings.layer_map_text, student.num_hidden_layers,
                                t.num_hidden_layers)
    self.settings = dataclasses.replace(self.settings, layer_map=layer_map)
    if self.settings.attention_weight and student.num_attention_heads != t.num_attention_heads:
      fail(f"distill.attention_weight compares attention scores head by head, but the student has "
           f"{student.num_attention_heads} heads and the teacher {t.num_attention_heads}; match "
           "model.num_attention_heads or set --config.distill.attention_weight=0")
    if self.settings.student_init == "teacher_layers":
      for name in _SHAPE_FIELDS:
        mine, theirs = getattr(student, name), getattr(t, name)
        if mine != theirs:
          fail(f"student_init=teacher_layers copies the teacher's weights, but model.{name}="
               f"{mine} differs from the teacher's {theirs}; match it or set "
               "--config.distill.student_init=scratch")
      self.init_sources = init_layer_sources(self.settings.init_layers_text, student.num_groups,
                                             t.num_groups)
    self.student_config = student

  def _proj_layers(self, student: ModelConfig) -> tuple[int, ...]:
    """hidden_states indices the student projects to the teacher's width (W_h)."""
    layers = set()
    if self.settings.hidden_weight:
      layers |= {i + 1 for i, _ in self.settings.layer_map}
    if self.settings.cosine_weight and student.hidden_size != self.teacher.config.hidden_size:
      layers.add(student.num_hidden_layers)
    return tuple(sorted(layers))

  def _student_model(self, student: ModelConfig, num_labels: int = 0) -> DistillModel:
    proj = self._proj_layers(student)
    if self.settings.student_init == "teacher_layers":
      task_base.announce(
          f"distill: student layers 0..{student.num_groups - 1} start from teacher layers "
          f"{list(self.init_sources)}, embeddings and {self.head} head copied"
          + (", distill_proj fresh" if proj else ""))
    return DistillModel(student, head=self.head, num_labels=num_labels, proj_layers=proj,
                        proj_size=self.teacher.config.hidden_size)

  def _load_teacher(self, config) -> None:
    if self.teacher.params is None:
      mesh = sharding.make_mesh(config.mesh_shape)
      self.teacher.load(mesh, sharding.rules_from_config(config),
                        self._teacher_init_inputs(config))

  def _teacher_init_inputs(self, config) -> dict[str, Any]:
    batch = self.init_batch(1, config.max_seq_length, config.max_predictions_per_seq)
    return self.model_inputs(batch)

  def _copy_teacher(self, boxed):
    """The student's params with embeddings, head and the chosen layers taken from the teacher."""
    teacher = _flat(self.teacher.params)
    out = {}
    for key, leaf in _flat(boxed).items():
      parts = key.split("/")
      if parts[0] == "distill_proj":
        out[key] = leaf
        continue
      if len(parts) > 1 and parts[0] == "encoder" and parts[1].startswith("layer_"):
        parts[1] = f"layer_{self.init_sources[int(parts[1][len('layer_'):])]}"
      source = teacher.get("/".join(parts))
      value = leaf.value if isinstance(leaf, nn.LogicallyPartitioned) else leaf
      if source is None or tuple(source.shape) != tuple(value.shape):
        fail(f"student_init=teacher_layers: the teacher has no {'/'.join(parts)} of shape "
             f"{tuple(value.shape)}; set --config.distill.student_init=scratch")
      new = source.astype(value.dtype)
      out[key] = leaf.replace_boxed(new) if isinstance(leaf, nn.LogicallyPartitioned) else new
    return flax.traverse_util.unflatten_dict(out, sep="/")

  def _init(self, model, rng, batch):
    boxed = model.init(rng, **self.model_inputs(batch))["params"]
    if self.settings.student_init == "teacher_layers":
      self._load_teacher(self.config)
      boxed = self._copy_teacher(boxed)
    return boxed

  def _forward(self, model, params, batch, rng, deterministic):
    """(student outputs, teacher outputs) on a batch; the teacher is traced into the caller."""
    self._load_teacher(self.config)
    s = self.settings
    inputs = self.model_inputs(batch)
    student = model.apply({"params": params}, **inputs, deterministic=deterministic,
                          output_hidden_states=s.uses_hidden,
                          output_attentions=s.uses_attention, rngs={"dropout": rng})
    teacher = self.teacher(inputs, s.uses_hidden, s.uses_attention)
    return student, teacher

  def _prepare_tokenizer(self, config, allowed: bool) -> None:
    """Uses the teacher's tokenizer unless the config names one (or data that has its own)."""
    if allowed and not config.data.tokenizer and self.teacher.tokenizer_dir is not None:
      config.data.tokenizer = str(self.teacher.tokenizer_dir)
      task_base.announce(f"distill: tokenizing with the teacher's tokenizer "
                         f"{self.teacher.tokenizer_dir}")


class Distill(_Distillation, Objective):
  """DistilBERT / TinyBERT general distillation: MLM on full segments, no NSP."""
  name = "distill"
  data_kind = "full"
  masking = "token"
  head = "mlm"

  def __init__(self, config):
    super().__init__(config)
    self._setup(config)
    # Everything checkable without data is checked here, before any corpus is prepared.
    self._check_student(ModelConfig.from_dict(config.model.to_dict()))

  def build_inputs(self, config, workdir):
    self._prepare_tokenizer(config, allowed=not config.data_dir and not config.data.synthetic)
    data = super().build_inputs(config, workdir)
    check_tokenizers(data.tokenizer, self.teacher)
    return data

  def make_model(self, model_config):
    self._check_student(model_config)
    self._load_teacher(self.config)
    return self._student_model(model_config)

  def init_params(self, model, rng, batch):
    return self._init(model, rng, batch)

  def denominators(self, batch):
    return distill_denominators(batch["attention_mask"], batch["masked_weights"])

  def loss(self, model, params, batch, rng, denominators, deterministic):
    student, teacher = self._forward(model, params, batch, rng, deterministic)
    return distillation_terms(student, teacher, batch["masked_ids"], batch["masked_weights"],
                              batch["attention_mask"], denominators, self.settings,
                              hard_prefix="mlm")


class DistillGlue(_Distillation, Objective):
  """Task distillation on a GLUE task (`config.task`): GlueTask's data and evaluation, a
  fine-tuned teacher's predictions as soft targets."""
  name = "distill_glue"
  data_kind = "task"
  head = "classifier"

  def __init__(self, config):
    super().__init__(config)
    self.task = glue_task.GlueTask(config)
    self._setup(config, num_labels=self.task.task.num_labels)
    if not config.init_from:  # else the student's architecture is init_from's: checked later
      self._check_student(ModelConfig.from_dict(config.model.to_dict()))

  def build_inputs(self, config, workdir):
    self.config = config
    self._prepare_tokenizer(config, allowed=not config.init_from)
    data = self.task.build_inputs(config, workdir)
    check_tokenizers(data.tokenizer, self.teacher)
    return data

  def model_config(self, config):
    cfg = self.task.model_config(config)
    self._check_student(cfg)
    return cfg

  def make_model(self, model_config):
    self.task.make_model(model_config)  # the plain classifier GlueTask predicts with
    self._load_teacher(self.config)
    return self._student_model(model_config, self.task.task.num_labels)

  def init_batch(self, batch_size, seq_len, num_predictions):
    return self.task.init_batch(batch_size, seq_len, num_predictions)

  def model_inputs(self, batch):
    return self.task.model_inputs(batch)

  def init_params(self, model, rng, batch):
    return self._init(model, rng, batch)

  def denominators(self, batch):
    return distill_denominators(batch["attention_mask"], batch["weight"])

  def loss(self, model, params, batch, rng, denominators, deterministic):
    student, teacher = self._forward(model, params, batch, rng, deterministic)
    return distillation_terms(student, teacher, batch["label"], batch["weight"],
                              batch["attention_mask"], denominators, self.settings,
                              hard_prefix="task", regression=self.task.regression)

  def evaluate(self, params, context):
    # GlueTask's model ignores the student's extra distill_proj params.
    return self.task.evaluate(params, context)
