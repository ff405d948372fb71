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
import logging
from typing import Any

import flax
import flax.linen as nn

from bertjax import sharding
from bertjax.errors import fail
from bertjax.models.config import ModelConfig
from bertjax.models.distill import DistillModel
from bertjax.objective import Objective
from bertjax.objectives.distill_losses import distill_denominators, distillation_terms
from bertjax.objectives.distill_settings import (SHAPE_FIELDS, Settings, init_layer_sources,
                                                 parse_layer_map)
from bertjax.objectives.teacher import Teacher, check_tokenizers, flat_paths
from bertjax.tasks import base as task_base
from bertjax.tasks import glue as glue_task

_log = logging.getLogger(__name__)

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
      for name in SHAPE_FIELDS:
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
    teacher = flat_paths(self.teacher.params)
    out = {}
    for key, leaf in flat_paths(boxed).items():
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

  @classmethod
  def main_metric(cls, settings) -> str:
    """soft_kl, T^2 * KL(teacher || student) at the masked positions: the quantity distillation
    drives to 0. The loss holds soft_weight x T^2 x the teacher's entropy on top (about 160 of
    configs/distill.py:runlocal's 173), so it hardly moves while the student learns. Without a
    soft term: the eval loss."""
    distill_settings = settings.get("distill") or {}
    return "soft_kl" if distill_settings.get("soft_weight") else "loss"

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

  @classmethod
  def main_metric(cls, settings) -> str:
    return glue_task.GlueTask.main_metric(settings)

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

  def schedule(self, config, data):
    return self.task.schedule(config, data)

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
