"""The frozen teacher of distillation: its config and parameters read from a workdir or a converted
folder, placed on the mesh with the student's sharding rules, run inside the student's step."""

from __future__ import annotations

import json
import pathlib
from typing import Any, Mapping

import flax
import flax.linen as nn
import jax
import numpy as np

from bertjax.core.errors import fail
from bertjax.data import tokenizers
from bertjax.models.config import ModelConfig
from bertjax.models.distill import DistillModel
from bertjax.runtime import checkpoints, sharding
from bertjax.tasks import base as task_base

# Objectives whose workdirs record the experiment, the encoder being their init_from's.
_TASK_OBJECTIVES = ("glue", "squad", "ner", "distill_glue")


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


def flat_paths(tree) -> dict[str, Any]:
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
    if fields.get("architecture") == "modernbert":  # its own dropout settings
      fields.update(attention_dropout=0.0, embedding_dropout=0.0, mlp_dropout=0.0)
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
    shapes = {k: tuple(v.shape) for k, v in flat_paths(nn.meta.unbox(abstract)).items()}
    got = {k: tuple(np.shape(v)) for k, v in flat_paths(restored).items()}
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
  theirs = tokenizers.load_tokenizer(teacher.tokenizer_dir)
  n = tokenizer.vocab_size
  if theirs.vocab_size != n or any(theirs.id_to_token(i) != tokenizer.id_to_token(i)
                                   for i in range(n)):
    fail(f"the data is tokenized with a different vocabulary than the teacher's "
         f"({teacher.tokenizer_dir}); prepare the corpus with --config.data.tokenizer="
         f"{teacher.tokenizer_dir} (or leave data_dir and data.tokenizer empty to use it)")
