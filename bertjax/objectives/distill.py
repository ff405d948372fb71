"""Knowledge distillation: a smaller student learns from a frozen teacher checkpoint.

Two objectives share the machinery here:

- `distill` (pretraining; DistilBERT, Sanh et al. 2019, and TinyBERT's general distillation, Jiao
  et al. 2020): the student does masked language modelling on the corpus while matching the
  teacher's MLM distribution at the masked positions, its hidden states and attention scores.
- `distill_glue` (task distillation): a teacher fine-tuned on a GLUE task (a workdir trained with
  configs/glue.py) gives soft targets for a student fine-tuned on the same task. Data, schedule and
  forward pass are `GlueTask`'s, used by composition; its evaluator is GLUE's.

The teacher (`config.distill.teacher`: a training workdir or a converted HF folder) is loaded once
with `checkpoints.load_model_config` / `checkpoints.restore_params`, placed on the mesh with the
student's logical sharding rules, and held with the student in the `Distillation` that
`make_model` returns (the objective itself holds nothing). The loss closes over it and runs its
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
import logging
from typing import Any

import flax
import flax.linen as nn

from bertjax.core.errors import fail
from bertjax.models.config import ModelConfig
from bertjax.models.distill import DistillModel
from bertjax.objective import Objective, moved
from bertjax.objectives.distill_losses import distill_denominators, distillation_terms
from bertjax.objectives.distill_settings import (SHAPE_FIELDS, Settings, init_layer_sources,
                                                 parse_layer_map)
from bertjax.objectives.teacher import Teacher, check_tokenizers, flat_paths
from bertjax.runtime import sharding
from bertjax.tasks import base as task_base, glue as glue_task

_log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# What `make_model` returns.


@dataclasses.dataclass(frozen=True)
class Distillation:
  """The student module and its loaded teacher, with the settings checked against both: what
  `init_params`, `loss` and `predict` are handed back as their model."""
  student: DistillModel
  teacher: Teacher
  settings: Settings                   # with the layer_map resolved for this student
  init_sources: tuple[int, ...] = ()   # teacher layer of each student layer (teacher_layers)
  classifier: nn.Module | None = None  # distill_glue: GLUE's plain classifier, for predictions


def teacher_of(config, head: str, num_labels: int = 0) -> Teacher:
  """`config.distill.teacher` as a `Teacher` (its model config read, its params not yet)."""
  return Teacher(Settings.from_config(config).teacher, head, config.model.dtype, num_labels,
                 config.model.kernels)


def checked_settings(config, student: ModelConfig,
                     teacher: Teacher) -> tuple[Settings, tuple[int, ...]]:
  """Student against teacher (vocabulary, layer_map, heads, shapes for teacher_layers): the
  settings with the layer_map resolved and the teacher layer each student layer starts from."""
  settings, t = Settings.from_config(config), teacher.config
  where = f"distill.teacher={settings.teacher}"
  if student.vocab_size != t.vocab_size:
    fail(f"{where} has vocab_size {t.vocab_size} but the student's model.vocab_size is "
         f"{student.vocab_size}; student and teacher must share one vocabulary: set "
         f"--config.model.vocab_size={t.vocab_size} and use the teacher's tokenizer")
  layer_map = parse_layer_map(settings.layer_map_text, student.num_hidden_layers,
                              t.num_hidden_layers)
  settings = dataclasses.replace(settings, layer_map=layer_map)
  if settings.attention_weight and student.num_attention_heads != t.num_attention_heads:
    fail(f"distill.attention_weight compares attention scores head by head, but the student has "
         f"{student.num_attention_heads} heads and the teacher {t.num_attention_heads}; match "
         "model.num_attention_heads or set --config.distill.attention_weight=0")
  sources: tuple[int, ...] = ()
  if settings.student_init == "teacher_layers":
    for name in SHAPE_FIELDS:
      mine, theirs = getattr(student, name), getattr(t, name)
      if mine != theirs:
        fail(f"student_init=teacher_layers copies the teacher's weights, but model.{name}="
             f"{mine} differs from the teacher's {theirs}; match it or set "
             "--config.distill.student_init=scratch")
    sources = init_layer_sources(settings.init_layers_text, student.num_groups, t.num_groups)
  return settings, sources


def proj_layers(settings: Settings, student: ModelConfig, teacher: ModelConfig) -> tuple[int, ...]:
  """hidden_states indices the student projects to the teacher's width (W_h)."""
  layers = set()
  if settings.hidden_weight:
    layers |= {i + 1 for i, _ in settings.layer_map}
  if settings.cosine_weight and student.hidden_size != teacher.hidden_size:
    layers.add(student.num_hidden_layers)
  return tuple(sorted(layers))


def copy_teacher(boxed, teacher_params, init_sources: tuple[int, ...]):
  """The student's params with embeddings, head and the chosen layers taken from the teacher."""
  teacher = flat_paths(teacher_params)
  out = {}
  for key, leaf in flat_paths(boxed).items():
    parts = key.split("/")
    if parts[0] == "distill_proj":
      out[key] = leaf
      continue
    if len(parts) > 1 and parts[0] == "encoder" and parts[1].startswith("layer_"):
      parts[1] = f"layer_{init_sources[int(parts[1][len('layer_'):])]}"
    source = teacher.get("/".join(parts))
    value = leaf.value if isinstance(leaf, nn.LogicallyPartitioned) else leaf
    if source is None or tuple(source.shape) != tuple(value.shape):
      fail(f"student_init=teacher_layers: the teacher has no {'/'.join(parts)} of shape "
           f"{tuple(value.shape)}; set --config.distill.student_init=scratch")
    new = source.astype(value.dtype)
    out[key] = leaf.replace_boxed(new) if isinstance(leaf, nn.LogicallyPartitioned) else new
  return flax.traverse_util.unflatten_dict(out, sep="/")


def with_teacher_tokenizer(config, teacher: Teacher, allowed: bool):
  """`config`, or a copy tokenizing with the teacher's tokenizer unless the config names one (or
  data that has its own): the caller's config is never changed."""
  if not allowed or config.data.tokenizer or teacher.tokenizer_dir is None:
    return config
  task_base.announce(f"distill: tokenizing with the teacher's tokenizer {teacher.tokenizer_dir}")
  config = config.copy_and_resolve_references()
  config.data.tokenizer = str(teacher.tokenizer_dir)
  return config


# ---------------------------------------------------------------------------------------------
# The objectives.


def weight_count(model: ModelConfig) -> int:
  """The encoder's weight matrices (embeddings, attention, feed-forward), biases and norms left
  out: enough to say which of two models is the larger."""
  h = model.hidden_size
  layer = 4 * h * h + 2 * h * model.intermediate_size
  return model.vocab_size * h + model.num_hidden_layers * layer


def size_warning(student: ModelConfig, teacher: ModelConfig, where: str) -> str:
  """'' when the student is smaller than its teacher, else one line saying it is not."""
  if weight_count(student) < weight_count(teacher):
    return ""
  shape = lambda m: f"{m.num_hidden_layers} layers, hidden {m.hidden_size}"
  return (f"warning: the student ({shape(student)}) is not smaller than its teacher {where} "
          f"({shape(teacher)}); distillation compresses a larger teacher: configs/distill.py's "
          "docstring trains a 4-layer teacher for its 2-layer runlocal student")


class DistillationBase(Objective):
  """What both objectives share: the student model with its teacher, its init and its forward."""
  head = "mlm"

  def num_labels(self, config) -> int:
    del config
    return 0

  def distillation(self, config, student: ModelConfig) -> Distillation:
    """The student module and the loaded teacher, placed on the config's mesh."""
    teacher = teacher_of(config, self.head, self.num_labels(config))
    settings, sources = checked_settings(config, student, teacher)
    batch = self.init_batch(config, 1, config.max_seq_length, config.max_predictions_per_seq)
    teacher.load(sharding.make_mesh(config.mesh_shape), sharding.rules_from_config(config),
                 self.model_inputs(batch))
    proj = proj_layers(settings, student, teacher.config)
    warning = size_warning(student, teacher.config, f"distill.teacher={settings.teacher}")
    if warning:
      task_base.announce(warning)
    if settings.student_init == "teacher_layers":
      task_base.announce(
          f"distill: student layers 0..{student.num_groups - 1} start from teacher layers "
          f"{list(sources)}, embeddings and {self.head} head copied"
          + (", distill_proj fresh" if proj else ""))
    model = DistillModel(student, head=self.head, num_labels=self.num_labels(config),
                         proj_layers=proj, proj_size=teacher.config.hidden_size)
    return Distillation(student=model, teacher=teacher, settings=settings, init_sources=sources)

  def init_params(self, model: Distillation, rng, batch):
    boxed = model.student.init(rng, **self.model_inputs(batch))["params"]
    if model.settings.student_init == "teacher_layers":
      boxed = copy_teacher(boxed, model.teacher.params, model.init_sources)
    return boxed

  def about(self, config) -> str | None:
    if not config.distill.get("soft_weight"):
      return None
    return ("distill: the loss holds soft_weight x T^2 x the teacher's entropy, which no student "
            "lowers, so it hardly moves; what tells distillation works is soft_kl (0 when the "
            "student matches the teacher) falling and agreement (the same top prediction) rising")

  def reading(self, config, summary) -> str:
    kl, kl_fell = moved(summary, "soft_kl", down=True)
    agreement, rose = moved(summary, "agreement", down=False)
    known = [ok for ok in (kl_fell, rose) if ok is not None]
    if not known:
      verdict = "one train row: nothing to compare yet"
    elif all(known):
      verdict = "distillation is working: the student moves toward the teacher"
    elif not any(known):
      verdict = ("distillation is not working: the student moves away from the teacher (check "
                 "the teacher, the learning rate, distill.temperature or distill.student_init)")
    else:
      verdict = "mixed: one moves toward the teacher, the other away; train longer to tell"
    return f"distill: {kl}, {agreement}: {verdict}"

  def forward(self, model: Distillation, params, batch, rng, deterministic):
    """(student outputs, teacher outputs) on a batch; the teacher is traced into the caller."""
    s = model.settings
    inputs = self.model_inputs(batch)
    student = model.student.apply({"params": params}, **inputs, deterministic=deterministic,
                                  output_hidden_states=s.uses_hidden,
                                  output_attentions=s.uses_attention, rngs={"dropout": rng})
    return student, model.teacher(inputs, s.uses_hidden, s.uses_attention)


class Distill(DistillationBase):
  """DistilBERT / TinyBERT general distillation: MLM on full segments, no NSP."""
  name = "distill"
  data_kind = "full"
  masking_strategy = "token"
  head = "mlm"

  @classmethod
  def main_metric(cls, settings) -> str:
    """soft_kl, T^2 * KL(teacher || student) at the masked positions: the quantity distillation
    drives to 0. The loss holds soft_weight x T^2 x the teacher's entropy on top (about 160 of
    configs/distill.py:runlocal's 173), so it hardly moves while the student learns. Without a
    soft term: the eval loss."""
    distill_settings = settings.get("distill") or {}
    return "soft_kl" if distill_settings.get("soft_weight") else "loss"

  def check(self, config) -> None:
    # Everything checkable without data is checked before any corpus is prepared.
    checked_settings(config, ModelConfig.from_dict(config.model.to_dict()),
                     teacher_of(config, self.head))

  def build_inputs(self, config, workdir, eval_batch_size=None):
    teacher = teacher_of(config, self.head)
    config = with_teacher_tokenizer(config, teacher,
                                    allowed=not config.data_dir and not config.data.synthetic)
    data = super().build_inputs(config, workdir, eval_batch_size)
    check_tokenizers(data.tokenizer, teacher)
    return data

  def make_model(self, config, model_config):
    return self.distillation(config, model_config)

  def denominators(self, batch):
    return distill_denominators(batch["attention_mask"], batch["masked_weights"])

  def loss(self, model, params, batch, rng, denominators, deterministic):
    student, teacher = self.forward(model, params, batch, rng, deterministic)
    return distillation_terms(student, teacher, batch["masked_ids"], batch["masked_weights"],
                              batch["attention_mask"], denominators, model.settings,
                              hard_prefix="mlm")


class DistillGlue(DistillationBase):
  """Task distillation on a GLUE task (`config.task`): GlueTask's data and evaluation, a
  fine-tuned teacher's predictions as soft targets."""
  name = "distill_glue"
  data_kind = "task"
  evaluator = "glue"
  head = "classifier"
  task = glue_task.GlueTask()

  @classmethod
  def main_metric(cls, settings) -> str:
    return glue_task.GlueTask.main_metric(settings)

  def num_labels(self, config) -> int:
    return glue_task.task_of(config).num_labels

  def check(self, config) -> None:
    self.task.check(config)
    if not config.init_from:  # else the student's architecture is init_from's: checked later
      checked_settings(config, ModelConfig.from_dict(config.model.to_dict()),
                       teacher_of(config, self.head, self.num_labels(config)))

  def build_inputs(self, config, workdir, eval_batch_size=None):
    teacher = teacher_of(config, self.head, self.num_labels(config))
    config = with_teacher_tokenizer(config, teacher, allowed=not config.init_from)
    data = self.task.build_inputs(config, workdir, eval_batch_size)
    check_tokenizers(data.tokenizer, teacher)
    return data

  def schedule(self, config, data):
    return self.task.schedule(config, data)

  def model_config(self, config):
    cfg = self.task.model_config(config)
    checked_settings(config, cfg, teacher_of(config, self.head, self.num_labels(config)))
    return cfg

  def make_model(self, config, model_config):
    model = self.distillation(config, model_config)
    # GLUE's plain classifier predicts for evaluation; it ignores the student's distill_proj.
    return dataclasses.replace(model, classifier=self.task.make_model(config, model_config))

  def init_batch(self, config, batch_size, seq_len, num_predictions):
    return self.task.init_batch(config, batch_size, seq_len, num_predictions)

  def model_inputs(self, batch):
    return self.task.model_inputs(batch)

  def denominators(self, batch):
    return distill_denominators(batch["attention_mask"], batch["weight"])

  def loss(self, model, params, batch, rng, denominators, deterministic):
    student, teacher = self.forward(model, params, batch, rng, deterministic)
    return distillation_terms(student, teacher, batch["label"], batch["weight"],
                              batch["attention_mask"], denominators, model.settings,
                              hard_prefix="task", regression=model.student.num_labels == 1)

  def predict(self, model, params, batch, rng, deterministic):
    return self.task.predict(model.classifier, params, batch, rng, deterministic)
