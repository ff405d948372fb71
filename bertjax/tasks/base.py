"""Shared machinery of the fine-tuning tasks: tokenizer, model, batches, predictions, schedule.

A task is an `Objective` whose `build_inputs` reads a labelled data set, tokenizes it into
fixed-length feature rows and returns a `FeatureIterator` for training and its dev sets, which
its evaluator (bertjax/evaluators/) predicts, writes prediction files of and scores.

- Tokenizer: `config.data.tokenizer` if set, else the one saved with `config.init_from` (a
  converted checkpoint or a training workdir); with neither, a sentencepiece model is trained on
  the task's own training text into WORKDIR/tokenizer (random-init runs and smoke tests).
- Model config: `config.init_from`'s (model.json or config.json), keeping the experiment's
  dropout, dtype and remat settings; without init_from, `config.model`.
- Schedule: `total_steps == 0` derives the steps from `num_epochs` and the number of training
  rows; `eval_every == 0` evaluates once per epoch (and at the end).
- Evaluation pads the final partial batch with copies of row 0 whose `weight` is 0, and drops
  those rows again after gathering, so every dev feature gets exactly one prediction.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import pathlib
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import inputs
from bertjax.config import settings as settings_table
from bertjax.core import paths
from bertjax.core.errors import fail
from bertjax.data import tokenizers
from bertjax.models.config import RUN_FIELDS, ModelConfig
from bertjax.objective import Objective, Schedule
from bertjax.runtime import checkpoints

_log = logging.getLogger(__name__)

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# Settings of `config.model` that still apply when the architecture comes from init_from
# (bertjax/models/config.py says which and why; the run-start checks refuse any other given).
RUN_SETTINGS = RUN_FIELDS
REPO = pathlib.Path(__file__).resolve().parent.parent.parent


def announce(message: str) -> None:
  """Says what a run decided about its data: in the log, or on stdout where nothing shows the
  log (a library call without logging set up), so the line is seen exactly once."""
  _log.info(message)
  shown = _log.isEnabledFor(logging.INFO) and logging.getLogger().handlers
  if jax.process_index() == 0 and not shown:
    print(message, flush=True)


# ---------------------------------------------------------------------------------------------
# Batching.


def stack(rows: Sequence[Mapping[str, Any]], keys: Sequence[str] | None = None,
          dtypes: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
  """A list of per-feature dicts -> one array per key with a leading [rows] axis."""
  if not rows:
    return {}
  keys = list(keys or rows[0].keys())
  dtypes = dtypes or {}
  return {k: np.asarray([r[k] for r in rows], dtype=dtypes.get(k)) for k in keys}


def num_rows(arrays: Mapping[str, np.ndarray]) -> int:
  return len(next(iter(arrays.values()))) if arrays else 0


def pad_row(ids: Sequence[int], length: int, value: int) -> list[int]:
  return list(ids) + [value] * (length - len(ids))


def batch_length(attention_mask: np.ndarray, multiple: int) -> int:
  """The sequence length a batch needs: its longest row (last attended position + 1), rounded
  up to `multiple` so that only a few shapes are ever compiled, and at most the rows' length."""
  seq = attention_mask.shape[1]
  attended = attention_mask.any(axis=0)
  longest = int(seq - np.argmax(attended[::-1])) if attended.any() else 1
  return min(seq, -(-longest // multiple) * multiple)


def trim_batch(batch: Mapping[str, np.ndarray], length: int, seq: int) -> dict[str, np.ndarray]:
  """Every per-position array ([rows, seq, ...]) cut to its first `length` positions; the cut
  positions are padding (attention mask 0), so the model computes the same on the kept ones."""
  return {k: v[:, :length] if v.ndim >= 2 and v.shape[1] == seq else v for k, v in batch.items()}


class FeatureIterator:
  """Training batches of feature rows, reshuffled every epoch; resumes exactly.

  The stream is the concatenation of one permutation of the rows per epoch (permutation e drawn
  from (seed, e)); a batch takes the next `batch_size` positions, so batches run across epoch
  boundaries as BERT's repeated tf.data pipeline does. Each process yields its own slice of every
  global batch. The state is the stream position.
  """

  def __init__(self, arrays: Mapping[str, np.ndarray], batch_size: int, seed: int,
               process_index: int = 0, process_count: int = 1, pad_to_multiple_of: int = 0):
    """`pad_to_multiple_of` > 0: cut each batch's sequence axis to its longest row, rounded up
    to that multiple (`trim_batch`); 0: keep the rows' full length."""
    if pad_to_multiple_of < 0:
      fail(f"pad_to_multiple_of={pad_to_multiple_of} must be >= 0 (0: pad every batch to "
           "max_seq_length)")
    self.pad_to_multiple_of = pad_to_multiple_of
    self.arrays = dict(arrays)
    self.n = num_rows(self.arrays)
    if self.n == 0:
      fail("no training examples left after reading and filtering the data; check the files "
           "and --config.max_train_examples")
    if batch_size % process_count:
      fail(f"batch_size={batch_size} must be divisible by the process count {process_count}")
    self.batch_size, self.seed = batch_size, seed
    self.per_process = batch_size // process_count
    self.process_index = process_index
    self.position = 0
    self._epoch, self._order = -1, None

  def _permutation(self, epoch: int) -> np.ndarray:
    if epoch != self._epoch:
      self._epoch = epoch
      self._order = np.random.default_rng([self.seed, epoch]).permutation(self.n)
    return self._order

  def indices(self, position: int) -> np.ndarray:
    """Row indices of the global batch starting at stream `position`."""
    pos = np.arange(position, position + self.batch_size)
    epochs, within = pos // self.n, pos % self.n
    out = np.empty(self.batch_size, np.int64)
    for e in np.unique(epochs):
      sel = epochs == e
      out[sel] = self._permutation(int(e))[within[sel]]
    return out

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    idx = self.indices(self.position)
    self.position += self.batch_size
    lo = self.process_index * self.per_process
    batch = {k: v[idx[lo:lo + self.per_process]] for k, v in self.arrays.items()}
    if not self.pad_to_multiple_of:
      return batch
    # The length comes from the whole global batch, so every process cuts to the same shape.
    mask = self.arrays["attention_mask"]
    return trim_batch(batch, batch_length(mask[idx], self.pad_to_multiple_of), mask.shape[1])

  def get_state(self) -> dict:
    return {"position": int(self.position), "num_rows": int(self.n), "seed": int(self.seed)}

  def set_state(self, state: Mapping[str, Any]) -> None:
    rows = int(state.get("num_rows", self.n))
    if rows != self.n:
      fail(f"the checkpoint was trained on {rows} training rows, the data now gives {self.n}; "
           "use the same data and settings to resume, or a new --workdir")
    self.position = int(state.get("position", 0))


@dataclasses.dataclass
class EvalSet:
  """One evaluation split: model-input rows plus what the host needs to decode them.

  arrays: what goes to the device, one row per feature (MODEL_INPUTS and labels).
  meta: host-side information (example ids, offsets, gold labels), task-specific.
  """
  name: str
  arrays: dict[str, np.ndarray]
  meta: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def num_rows(self) -> int:
    return num_rows(self.arrays)


def padded_batches(arrays: Mapping[str, np.ndarray], batch_size: int, process_index: int = 0,
                   process_count: int = 1) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
  """Fixed-size batches over all rows; the last one padded with row 0 at weight 0.

  Yields (this process's slice of the batch, with a float32 `weight` of 1 for real rows and 0 for
  padding; the global <bool>[batch_size] validity of the whole batch).
  """
  n = num_rows(arrays)
  per = batch_size // process_count
  for start in range(0, n, batch_size):
    idx = np.arange(start, start + batch_size)
    valid = idx < n
    idx = np.where(valid, idx, 0)
    mine = slice(process_index * per, (process_index + 1) * per)
    batch = {k: v[idx[mine]] for k, v in arrays.items()}
    batch["weight"] = valid[mine].astype(np.float32)
    yield batch, valid


# ---------------------------------------------------------------------------------------------
# Data sources.


def open_tfds(name: str, split: str, data_dir: str | None):
  """`tfds.data_source(name, split)` of a dataset built locally; never downloads."""
  # Imported only for tfds inputs: with its builders, 0.3 s that local files do not need.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  # Importing these registers glue, conll2003 (text) and squad (question_answering).
  import tensorflow_datasets.question_answering  # pylint: disable=g-import-not-at-top,unused-import
  import tensorflow_datasets.text  # pylint: disable=g-import-not-at-top,unused-import
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)  # tfds logs multi-line notes while probing folders
  build = (f"build it with `tfds build {name} --file_format array_record`, or set "
           f"--config.data_dir to local files in the official format ({data_folder_hint()})")
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir or None, download=False)
  except tfds.core.registered.DatasetNotFoundError:
    fail(f"tfds has no dataset {name!r}; check --config.task")
  except NotImplementedError:
    fail(f"tfds {name} is not built in ArrayRecord format (nothing is downloaded); {build}")
  except (AssertionError, FileNotFoundError, ValueError, KeyError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    fail(f"cannot open tfds {name} split {split} ({first[:200]}); {build}")
  finally:
    absl_logger.setLevel(level)


def text(value: Any) -> str:
  """A tfds text feature (bytes, numpy scalar or str) as str."""
  if isinstance(value, np.ndarray):
    value = value.item()
  if isinstance(value, bytes):
    return value.decode("utf-8")
  return str(value)


def resolve_file(config, name: str, default: str) -> pathlib.Path:
  """`name` (or `default`) inside `config.data_dir`; absolute paths are taken as they are."""
  path = pathlib.Path(os.path.expanduser(name or default))
  if not path.is_absolute():
    path = pathlib.Path(os.path.expanduser(config.data_dir)) / path
  return path


def shared_data_root() -> pathlib.Path:
  """The project's shared data folder: BERTJAX_DATA, else ../shared/data beside the repo."""
  return pathlib.Path(os.environ.get("BERTJAX_DATA", REPO.parent / "shared" / "data"))


def shared_data_dir(*parts: str) -> str:
  """The shared data folder (`shared_data_root`) joined with `parts`, or "" when it is absent:
  configs' runlocal variants default to it so they run out of the box."""
  path = shared_data_root().joinpath(*parts)
  return str(path) if path.exists() else ""


def data_folder_hint() -> str:
  """What every missing-data message adds: where the runlocal variants look for their data."""
  root = shared_data_root()
  state = "" if root.is_dir() else ", which does not exist"
  return (f"the runlocal variants read the shared data folder, BERTJAX_DATA (now {root}{state}): "
          "set BERTJAX_DATA to that folder")


# ---------------------------------------------------------------------------------------------
# The task objective.


@dataclasses.dataclass(frozen=True)
class Prepared:
  """What a task's `prepare` read: its training rows, its dev (and test) sets and the tokenizer
  they were encoded with; `details` holds task-specific counts for the log."""
  train: dict[str, np.ndarray]
  eval_sets: list[EvalSet]
  tokenizer: tokenizers.Tokenizer
  test_sets: list[EvalSet] = dataclasses.field(default_factory=list)
  details: dict[str, Any] = dataclasses.field(default_factory=dict)


class TaskObjective(Objective):
  """Common parts of GLUE, SQuAD and NER; subclasses define data, model and forward pass.

  Subclasses implement `prepare(config, workdir) -> Prepared` (the tokenizer from
  `load_tokenizer`), `make_model(config, model_config)`, `feature_spec(config, seq_len)` and
  `predict` (per-row losses and predictions: what `loss` sums and the trainer's predict step
  returns), and name the evaluator that scores their dev sets (`evaluator`, bertjax/evaluators/;
  the default sums `predict`'s metrics over the dev rows).
  """
  data_kind = "task"
  feature_heads = True  # config.head and config.freeze apply (models/features.py, freezing.py)

  # -- what subclasses define ------------------------------------------------------------------

  def prepare(self, config, workdir: paths.Path) -> Prepared:
    raise NotImplementedError

  def make_model(self, config, model_config: ModelConfig) -> nn.Module:
    raise NotImplementedError

  def feature_spec(self, config, seq_len: int) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Per-row shape and dtype of every training array except MODEL_INPUTS and weight."""
    raise NotImplementedError

  def predict(self, model: nn.Module, params, batch, rng, deterministic: bool) -> dict[str, Any]:
    """Forward pass: {"loss": <float32>[batch] per-row loss (0 at weight 0), ...predictions,
    "metrics": {name: (numerator, denominator)}}."""
    raise NotImplementedError

  # -- the Objective contract ------------------------------------------------------------------

  def model_config(self, config) -> ModelConfig:
    if config.init_from:
      fields = checkpoints.load_model_config(config.init_from)
      for key in RUN_SETTINGS:  # the FP8 fields: absent from a config while off
        fields[key] = (config.model[key] if key in config.model
                       else ModelConfig.OPTIONAL_FIELDS[key])
      cfg = ModelConfig.from_dict(fields)
    else:
      cfg = ModelConfig.from_dict(config.model.to_dict())
    return cfg  # max_seq_length against its positions: config_checks.check_run

  def init_batch(self, config, batch_size: int, seq_len: int,
                 num_predictions: int) -> dict[str, Any]:
    del num_predictions
    batch = {k: jnp.zeros((batch_size, seq_len), jnp.int32) for k in MODEL_INPUTS}
    batch["weight"] = jnp.zeros((batch_size,), jnp.float32)
    for k, (shape, dtype) in self.feature_spec(config, seq_len).items():
      batch[k] = jnp.zeros((batch_size, *shape), dtype)
    return batch

  def model_inputs(self, batch) -> dict[str, Any]:
    return {k: batch[k] for k in MODEL_INPUTS}

  def denominators(self, batch) -> dict[str, jax.Array]:
    """What per-row losses are summed and divided by: real rows of the whole batch."""
    return {"loss": jnp.maximum(jnp.sum(batch["weight"].astype(jnp.float32)), 1.0)}

  def loss(self, model, params, batch, rng, denominators, deterministic):
    out = self.predict(model, params, batch, rng, deterministic)
    return jnp.sum(out["loss"]) / denominators["loss"], out["metrics"]

  def build_inputs(self, config, workdir, eval_batch_size: int | None = None) -> inputs.Inputs:
    prepared = self.prepare(config, paths.as_path(workdir))
    for s in prepared.eval_sets:
      if s.num_rows == 0:
        fail(f"the {s.name} set of {self.name} has no examples; check the data files")
    train_arrays = dict(prepared.train)
    n = num_rows(train_arrays)
    train_arrays["weight"] = np.ones((n,), np.float32)
    train = FeatureIterator(train_arrays, config.batch_size, config.seed, jax.process_index(),
                            jax.process_count(), int(config.get("pad_to_multiple_of", 0)))
    # The run's plan hands its eval batch size; a caller outside a run, the config's.
    size = settings_table.eval_batch_size(config) if eval_batch_size is None else eval_batch_size

    def eval_batches() -> Iterator[dict[str, np.ndarray]]:
      # The generic view of the eval rows (the metric sums evaluator reads these); the task
      # evaluators decode the EvalSets directly.
      for s in prepared.eval_sets:
        for batch, _ in padded_batches(s.arrays, size, jax.process_index(), jax.process_count()):
          yield batch

    return inputs.Inputs(train=train, eval_batches=eval_batches,
                         vocab_size=prepared.tokenizer.vocab_size, tokenizer=prepared.tokenizer,
                         num_train_rows=n,
                         num_eval_batches=sum(-(-s.num_rows // size) for s in prepared.eval_sets),
                         eval_sets=tuple(prepared.eval_sets),
                         test_sets=tuple(prepared.test_sets), details=dict(prepared.details))

  def schedule(self, config, data: inputs.Inputs) -> Schedule:
    return derive_schedule(config, data.num_train_rows, self.name)

  # -- helpers for subclasses ------------------------------------------------------------------

  def load_tokenizer(self, config, workdir: paths.Path,
                     train_texts: Callable[[], Iterable[str]]) -> tokenizers.Tokenizer:
    """data.tokenizer, else init_from's tokenizer/, else one trained on the task's text."""
    if config.data.tokenizer:
      return tokenizers.load_tokenizer(os.path.expanduser(config.data.tokenizer))
    if config.init_from:
      return tokenizers.load_tokenizer(checkpoints.tokenizer_dir(config.init_from))
    if (workdir / "tokenizer").is_dir():  # a resumed run keeps the vocabulary it trained
      return tokenizers.load_tokenizer(paths.reading(workdir / "tokenizer"))
    texts = iter(train_texts())
    first = next((t for t in texts if t.strip()), None)
    if first is None:
      fail(f"{self.name}: the training data has no text to train a tokenizer on; fill the "
           "training file, or set --config.data.tokenizer (or --config.init_from)")
    announce(f"{self.name}: no init_from or data.tokenizer; training a sentencepiece tokenizer "
             f"(vocab {config.data.vocab_size}) on the training text")
    return tokenizers.train_sentencepiece(itertools.chain([first], texts), None,
                                          vocab_size=config.data.vocab_size, seed=config.seed,
                                          flag="--config.data.vocab_size")


def head_options(config) -> dict[str, Any]:
  """`config.head` as the classifiers' fields: what the head reads and how it pools."""
  head = config.get("head") if config is not None else None
  if head is None:
    return {}
  return {"features": head.features, "layers": tuple(head.layers), "pooling": head.pooling}


def derive_schedule(config, num_train: int, what: str) -> Schedule:
  """total_steps (0: from num_epochs) and eval_every (0: once per epoch) for `num_train` rows;
  `config` is left as it is (the trainer records the derived values in the run's config.json)."""
  steps_per_epoch = max(1, math.ceil(num_train / config.batch_size))
  total_steps = int(config.total_steps)
  if total_steps == 0:
    epochs = float(config.get("num_epochs", 0.0))
    if epochs <= 0:
      fail("total_steps=0 derives the steps from num_epochs, which is not positive; set "
           "--config.num_epochs or --config.total_steps")
    total_steps = max(1, math.ceil(epochs * num_train / config.batch_size))
  eval_every = int(config.eval_every) or min(steps_per_epoch, total_steps)
  announce(f"{what}: {num_train} training rows, batch {config.batch_size}: {steps_per_epoch} "
           f"steps per epoch, total_steps {total_steps}, eval every {eval_every}")
  return Schedule(total_steps, eval_every)


def write_json(path: paths.Path, obj: Any) -> None:
  if jax.process_index() == 0:
    paths.replace_text(path, json.dumps(obj, indent=2, ensure_ascii=False,
                                        default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
  if isinstance(o, np.generic):
    return o.item()
  raise TypeError(type(o).__name__)


def finite_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
  """Numbers only (the trainer logs and compares them); NaN stays NaN, the writer nulls it."""
  return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float, np.number))
          and not isinstance(v, bool)}
