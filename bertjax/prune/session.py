"""A fine-tuned run opened for pruning: its config, task, dev batches, parameters and mesh, with
the dev evaluation, the loss that head importance differentiates and the brief re-fine-tuning
(through the one trainer, `train.train_and_evaluate`)."""

from __future__ import annotations

import copy
import dataclasses
import json
import pathlib
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertjax.config import config_lib, settings
from bertjax.convert import sources
from bertjax.core import paths
from bertjax.core.errors import fail, read_text
from bertjax.evaluators import evaluator_class
from bertjax.models.config import ModelConfig
from bertjax.registry import get_objective
from bertjax.runtime import checkpoints, sharding
from bertjax.tasks.base import TaskObjective, padded_batches
from bertjax.trainer import eval_context, train


def _tuples(value: Any) -> Any:
  """config.json's lists back to the tuples the configs hold (mesh_shape, seeds, rules, ...)."""
  if isinstance(value, dict):
    return {k: _tuples(v) for k, v in value.items()}
  if isinstance(value, list):
    return tuple(_tuples(v) for v in value)
  return value


def read_run_config(workdir: paths.Path) -> ml_collections.ConfigDict:
  """The resolved config a training workdir (local or remote) recorded (config.json), as a
  ConfigDict."""
  file = workdir / "config.json"
  if not file.is_file():
    fail(f"{workdir} has no config.json; point --workdir at a finished fine-tuning run")
  try:
    record = json.loads(read_text(file, "config.json"))
  except ValueError as e:
    fail(f"{file} is not JSON ({e}); copy it again from where the run was made")
  if not isinstance(record, dict) or "objective" not in record or "model" not in record:
    fail(f"{file} is not a bertjax run's config.json; point --workdir at a fine-tuning run")
  return ml_collections.ConfigDict(_tuples(record))


@dataclasses.dataclass
class Session:
  """Everything pruning needs from the run in `workdir` (evaluated and fine-tuned under `out`)."""
  config: ml_collections.ConfigDict
  objective: Any
  mesh: Any
  rules: Any
  data: Any
  out: pathlib.Path
  metric: str
  batches: list | None = None  # what head importance is scored on (importance_batches)

  @classmethod
  def open(cls, workdir: str | pathlib.Path, out: pathlib.Path, metric: str | None):
    workdir = paths.absolute(workdir)
    config = read_run_config(workdir)
    if not config.get("task", ""):
      fail(f"{workdir} is a {config.objective} run; pruning scores heads on a fine-tuning task's "
           "dev set (GLUE, SQuAD, CoNLL): fine-tune first, then prune that run")
    # The run's own architecture and tokenizer: init_from is what the task reads them from.
    config.init_from = str(workdir)
    objective = get_objective(config)
    if not isinstance(objective, TaskObjective):  # distill_glue: a student with its teacher
      fail(f"{workdir} is a {config.objective} run; pruning scores and exports the heads of "
           "glue, squad and ner runs only: prune one of those")
    mesh = sharding.make_mesh(config.mesh_shape)
    data = objective.build_inputs(config, out)
    metric = metric or config.get("best_metric", "") or "score"
    return cls(config, objective, mesh, sharding.rules_from_config(config), data, out, metric)

  def model_config(self) -> ModelConfig:
    return self.objective.model_config(self.config)

  def evaluate(self, cfg: ModelConfig, params, where: pathlib.Path, step: int = 0
               ) -> dict[str, float]:
    """The task's dev metrics of `params` at pruning step `step`, which its lines name
    (predictions written under `where`; no test-set predictions)."""
    context = eval_context.standalone(self.config, self.objective, cfg, self.data, where,
                                      self.mesh, total_steps=step + 1)
    evaluator = evaluator_class(self.objective.evaluator)(self.config, context)
    metrics = dict(evaluator.run(params, step))
    if self.metric not in metrics:
      fail(f"--metric {self.metric} is not a dev metric of this task; choose one of "
           f"{', '.join(sorted(metrics))}")
    return metrics

  def task_head(self, params) -> dict[str, Any]:
    """The run's fine-tuning head as a pruned folder's model.json records it ("task")."""
    return dataclasses.asdict(sources.task_head(self.config.to_dict(), params))

  def importance_batches(self) -> list[dict[str, np.ndarray]]:
    """Labelled dev batches for the importance scores: the dev rows with the gold labels their
    evaluation keeps on the host (GLUE). A task whose dev rows have no such labels (SQuAD,
    CoNLL) is scored on as many training batches instead, which is said."""
    spec = self.objective.feature_spec(self.config, self.config.max_seq_length)
    size = settings.eval_batch_size(self.config)
    sets = self.data.eval_sets
    if "label" in spec and all("labels" in e.meta for e in sets):
      out = []
      for e in sets:
        arrays = {**e.arrays, "label": np.asarray(e.meta["labels"], spec["label"][1])}
        out += [batch for batch, _ in padded_batches(arrays, size)]
      return out
    rows = sum(e.num_rows for e in sets)
    count = max(1, -(-rows // self.config.batch_size))
    print(f"{self.objective.name}: the dev rows carry no labels for the loss; scoring heads on "
          f"{count} training batches instead", flush=True)
    return [next(self.data.train) for _ in range(count)]

  def loss_fn(self, cfg: ModelConfig):
    """(params, host batch) -> the task's deterministic dev loss (what importance differentiates)."""
    model = self.objective.make_model(self.config, cfg)

    def loss(params, batch):
      batch = jax.tree.map(jnp.asarray, batch)
      with nn.logical_axis_rules(self.rules):
        value, _ = self.objective.loss(model, params, batch, jax.random.key(0),
                                       self.objective.denominators(batch), deterministic=True)
      return value
    return loss

  def finetune(self, init_from: pathlib.Path, workdir: pathlib.Path, steps: int,
               keep_pruned: bool, overrides: list[str]) -> tuple[dict, Any]:
    """Fine-tunes the pruned folder `init_from` for `steps` steps into `workdir` (encoder and task
    head restored; pruned weights kept at zero when `keep_pruned`); (summary, final params)."""
    config = copy.deepcopy(self.config)
    config.init_from = str(init_from)
    config.total_steps = steps
    config.eval_every = steps
    config.checkpoint_every = steps
    config.keep_checkpoints = 1
    config.best_metric = ""
    config.tensorboard = False
    config.optimizer.keep_pruned = keep_pruned
    if "seeds" in config:
      config.seeds = ()
    config_lib.apply_overrides(config, overrides)
    summary = train.train_and_evaluate(config, workdir)
    return summary, checkpoints.restore_params(workdir)
