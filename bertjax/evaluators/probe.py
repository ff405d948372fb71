"""A GLUE probe of the encoder being trained: how linearly separable a GLUE task is on its
features, every N steps of a pretraining (or any) run.

The probe fine-tunes nothing in the run: it reads the encoder's parameters as they are
(`params["encoder"]`, the name every model of the package gives its encoder), embeds the first
`train_examples` training and `dev_examples` dev rows of the task's official tsv files (the mean
of the last layer's states over each row's tokens, encoded with the run's tokenizer as GLUE
fine-tuning encodes them), fits a softmax regression on the training features (standardized,
L2-regularized, `steps` full-batch gradient steps from zero: deterministic) and scores the dev
rows with `bertjax.metrics.glue`. Its rows are named `probe_<task>/accuracy`, ... unless the
entry gives another prefix.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax.core.errors import fail
from bertjax.evaluators.base import Evaluator
from bertjax.evaluators.context import to_host
from bertjax.metrics import glue
from bertjax.models.architectures import encoder_for
from bertjax.tasks import base
from bertjax.tasks.glue import TASKS, dev_splits, encode_rows, local_file


class GlueProbe(Evaluator):
  name = "glue_probe"
  options = ("task", "data_dir", "train_examples", "dev_examples", "steps", "learning_rate",
             "l2")

  def __init__(self, config, context, task: str = "rte", data_dir: str = "",
               train_examples: int = 256, dev_examples: int = 256, steps: int = 200,
               learning_rate: float = 0.5, l2: float = 1e-3, **options):
    super().__init__(config, context, **options)
    if task not in TASKS or glue.get_task(task).is_regression:
      fail(f"glue_probe task {task!r} is not a GLUE classification task; set the entry's task "
           f"to one of {', '.join(t for t in TASKS if t != 'stsb')}")
    if min(train_examples, dev_examples, steps) < 1 or learning_rate <= 0 or l2 < 0:
      fail(f"glue_probe needs train_examples, dev_examples and steps >= 1, learning_rate > 0 "
           f"and l2 >= 0 (given {train_examples}, {dev_examples}, {steps}, {learning_rate}, "
           f"{l2}); fix the evals entry")
    tokenizer = context.data.tokenizer if context.data is not None else None
    if tokenizer is None:
      fail("glue_probe encodes GLUE text with the run's tokenizer, and this run has none "
           "(synthetic data); drop the glue_probe entry or train on text")
    data_dir = data_dir or base.shared_data_dir("glue")
    self.task = glue.get_task(task)
    self.steps, self.learning_rate, self.l2 = int(steps), float(learning_rate), float(l2)
    self.train = self._rows(tokenizer, data_dir, task, "train", int(train_examples))
    self.dev = self._rows(tokenizer, data_dir, dev_splits(task)[0].task, "dev", int(dev_examples))
    encoder = encoder_for(context.model_config)

    def embed(params, batch):
      out = encoder.apply({"params": params}, batch["input_ids"], batch["attention_mask"],
                          batch["token_type_ids"], deterministic=True)
      mask = batch["attention_mask"][..., None].astype(jnp.float32)
      summed = jnp.sum(out.last_hidden_state.astype(jnp.float32) * mask, axis=1)
      return {"features": summed / jnp.maximum(jnp.sum(mask, axis=1), 1.0)}

    self.embed = jax.jit(embed)

  @classmethod
  def default_prefix(cls, options):
    return f"probe_{options.get('task', 'rte')}/"

  def _rows(self, tokenizer, data_dir: str, task: str, split: str, limit: int):
    path, tried = local_file(data_dir, task, split) if data_dir else (None, [])
    if path is None:
      fail(f"glue_probe: the GLUE {task} {split} file was not found (tried "
           f"{' and '.join(tried) or 'no folder'}); set the entry's data_dir to glue_data/ "
           f"({base.data_folder_hint()})")
    rows = glue.read_glue_tsv(path, task, split)[:limit]
    arrays, _ = encode_rows(tokenizer, rows, self.config.max_seq_length, regression=False)
    return arrays

  def _features(self, params, arrays) -> np.ndarray:
    c = self.context
    inputs = {k: arrays[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    chunks = []
    for batch, valid in base.padded_batches(inputs, c.eval_batch_size, jax.process_index(),
                                            jax.process_count()):
      del batch["weight"]
      with jax.set_mesh(c.mesh), nn.logical_axis_rules(c.rules):
        out = self.embed(params, c.shard(batch))
      chunks.append(to_host(out["features"])[valid])
    return np.concatenate(chunks).astype(np.float64)

  def run(self, params, step):
    if "encoder" not in params:
      fail(f"glue_probe reads the parameters under 'encoder', which the {self.config.objective} "
           "model does not have; drop the glue_probe entry for this objective")
    x_train = self._features(params["encoder"], self.train)
    x_dev = self._features(params["encoder"], self.dev)
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    w, b = fit_softmax_regression((x_train - mean) / std, self.train["label"],
                                  self.task.num_labels, self.steps, self.learning_rate, self.l2)
    logits_train = ((x_train - mean) / std) @ w + b
    logits = ((x_dev - mean) / std) @ w + b
    labels = self.dev["label"].astype(np.int64)
    metrics = glue.glue_metrics(self.task.name, logits.argmax(-1), labels)
    z = logits - logits.max(-1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(-1, keepdims=True))
    metrics["loss"] = float(-np.mean(log_probs[np.arange(len(labels)), labels]))
    metrics["train_accuracy"] = float(np.mean(logits_train.argmax(-1) == self.train["label"]))
    metrics["examples"] = len(labels)
    yield from metrics.items()


def fit_softmax_regression(x: np.ndarray, y: np.ndarray, num_labels: int, steps: int,
                           learning_rate: float, l2: float) -> tuple[np.ndarray, np.ndarray]:
  """Weights and bias of a softmax regression of labels `y` on features `x`: `steps` full-batch
  gradient steps from zero on the mean cross-entropy plus `l2` times the squared weights."""
  x32, y32 = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.int32)

  def objective(wb):
    w, b = wb
    ce = optax.softmax_cross_entropy_with_integer_labels(x32 @ w + b, y32)
    return jnp.mean(ce) + l2 * jnp.sum(jnp.square(w))

  @jax.jit
  def fit(wb):
    step = lambda _, p: jax.tree.map(lambda a, g: a - learning_rate * g, p, jax.grad(objective)(p))
    return jax.lax.fori_loop(0, steps, step, wb)

  w, b = fit((jnp.zeros((x.shape[1], num_labels), jnp.float32),
              jnp.zeros((num_labels,), jnp.float32)))
  return np.asarray(w, np.float64), np.asarray(b, np.float64)
