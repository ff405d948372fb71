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
  # The entry's options and their defaults.
  DEFAULTS = dict(task="rte", data_dir="", train_examples=256, dev_examples=256, steps=200,
                  learning_rate=0.5, l2=1e-3)
  options = tuple(DEFAULTS)

  def __init__(self, config, context, **options):
    super().__init__(config, context, **options)
    o = {**self.DEFAULTS, **options}
    task, data_dir = o["task"], o["data_dir"]
    tokenizer = context.data.tokenizer if context.data is not None else None
    if tokenizer is None:
      fail("glue_probe encodes GLUE text with the run's tokenizer, and this run has none "
           "(synthetic data); drop the glue_probe entry or train on text")
    data_dir = data_dir or base.shared_data_dir("glue")
    self.task = glue.get_task(task)
    self.steps, self.learning_rate = int(o["steps"]), float(o["learning_rate"])
    self.l2 = float(o["l2"])
    self.train = self._rows(tokenizer, data_dir, task, "train", int(o["train_examples"]))
    self.dev = self._rows(tokenizer, data_dir, dev_splits(task)[0].task, "dev",
                          int(o["dev_examples"]))
    encoder = encoder_for(context.model_config)

    def embed(params, batch):
      out = encoder.apply({"params": params}, batch["input_ids"], batch["attention_mask"],
                          batch["token_type_ids"], deterministic=True)
      mask = batch["attention_mask"][..., None].astype(jnp.float32)
      summed = jnp.sum(out.last_hidden_state.astype(jnp.float32) * mask, axis=1)
      return {"features": summed / jnp.maximum(jnp.sum(mask, axis=1), 1.0)}

    self.embed = jax.jit(embed)

  @classmethod
  def check_options(cls, options):
    super().check_options(options)
    o = {**cls.DEFAULTS, **options}
    task = o["task"]
    if not isinstance(task, str) or task not in TASKS or glue.get_task(task).is_regression:
      fail(f"glue_probe task={task!r} is not a GLUE classification task; set the entry's task "
           f"to one of {', '.join(t for t in TASKS if t != 'stsb')}")
    if not isinstance(o["data_dir"], str):
      fail(f"glue_probe data_dir={o['data_dir']!r} must be a folder's path (a string); fix the "
           "evals entry, e.g. data_dir=\"glue_data\"")
    counts = {k: o[k] for k in ("train_examples", "dev_examples", "steps")}
    rates = {"learning_rate": (o["learning_rate"], 0), "l2": (o["l2"], None)}
    for key, value in counts.items():
      if not _is_number(value, whole=True) or value < 1:
        fail(f"glue_probe {key}={value!r} must be a whole number >= 1; fix the evals entry, "
             f"e.g. {key}={cls.DEFAULTS[key]}")
    for key, (value, above) in rates.items():
      if not _is_number(value) or (value <= 0 if above == 0 else value < 0):
        fail(f"glue_probe {key}={value!r} must be a number {'> 0' if above == 0 else '>= 0'}; "
             f"fix the evals entry, e.g. {key}={cls.DEFAULTS[key]}")

  @classmethod
  def check(cls, config, objective, options, where):
    """Besides its options: a run with text (its tokenizer encodes GLUE's) and the task's
    training and dev files, found before the workdir is made."""
    super().check(config, objective, options, where)
    if config.get("data", {}).get("synthetic", False):
      fail(f"{where} (glue_probe) encodes GLUE text with the run's tokenizer, and a run on "
           "data.synthetic has none; drop the entry or train on text")
    task = options.get("task", cls.DEFAULTS["task"])
    data_dir = options.get("data_dir", "") or base.shared_data_dir("glue")
    for name, split in ((task, "train"), (dev_splits(task)[0].task, "dev")):
      cls._file(data_dir, name, split)

  @staticmethod
  def _file(data_dir: str, task: str, split: str):
    path, tried = local_file(data_dir, task, split) if data_dir else (None, [])
    if path is None:
      fail(f"glue_probe: the GLUE {task} {split} file was not found (tried "
           f"{' and '.join(map(str, tried)) or 'no folder'}); set the entry's data_dir to "
           f"glue_data/ ({base.data_folder_hint()})")
    return path

  @classmethod
  def default_prefix(cls, options):
    return f"probe_{options.get('task', 'rte')}/"

  def _rows(self, tokenizer, data_dir: str, task: str, split: str, limit: int):
    rows = glue.read_glue_tsv(self._file(data_dir, task, split), task, split)[:limit]
    arrays, _ = encode_rows(tokenizer, rows, self.config.max_seq_length, regression=False)
    return arrays

  def _batches(self, arrays) -> int:
    return -(-len(arrays["label"]) // self.context.eval_batch_size)

  def _features(self, params, arrays, lines, done: int = 0) -> np.ndarray:
    c = self.context
    inputs = {k: arrays[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    chunks = []
    for batch, valid in base.padded_batches(inputs, c.eval_batch_size, jax.process_index(),
                                            jax.process_count()):
      del batch["weight"]
      with jax.set_mesh(c.mesh), nn.logical_axis_rules(c.rules):
        out = self.embed(params, c.shard(batch))
      chunks.append(to_host(out["features"])[valid])
      lines.update(done + len(chunks))
    return np.concatenate(chunks).astype(np.float64)

  def run(self, params, step):
    if "encoder" not in params:
      fail(f"glue_probe reads the parameters under 'encoder', which the {self.config.objective} "
           "model does not have; drop the glue_probe entry for this objective")
    # Its progress lines: what it does first (it may take longer than a line's interval before
    # its first batch: compilation), then its batches as any evaluation pass's.
    lines = self.context.progress(f"eval glue_probe {self.task.name} at step {step}:",
                                  self._batches(self.train) + self._batches(self.dev))
    lines.say(f"embedding {len(self.train['label'])} train and {len(self.dev['label'])} dev rows, "
              f"then fitting the probe ({self.steps} steps)")
    x_train = self._features(params["encoder"], self.train, lines)
    x_dev = self._features(params["encoder"], self.dev, lines, self._batches(self.train))
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


def _is_number(value, whole: bool = False) -> bool:
  """An int (or, unless `whole`, a float), not a bool: what a ConfigDict or a command line gives."""
  kinds = (int,) if whole else (int, float)
  return isinstance(value, kinds) and not isinstance(value, bool)
