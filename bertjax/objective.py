"""The contract every pretraining objective (and fine-tuning task) honours for the one trainer.

An objective is stateless: a set of functions of the config, the batch and the parameters, on a
class for its constants (`name`, `data_kind`, `masking_strategy`) and so that objectives share
code by inheritance. It holds no config, model, tokenizer or data: each method is handed what it
needs, and an instance refuses attribute assignment, so `objective_class(name)()` is the whole
object.

- Data: which examples the input pipeline builds: `data_kind`, and `masking(config)`, a
  `bertjax.data.masking.Masking` whose strategy defaults to `masking_strategy`; a task prepares
  its own in `build_inputs`, whose `Inputs` carry what evaluation reads later.
- Model: `make_model(config, model_config)` returns what `init_params` and `loss` are handed back
  (a flax module, or a frozen holder of several, such as a student and its teacher).
- Loss: `loss` divides sums by denominators that depend only on the *whole* batch
  (`denominators`), so gradient accumulation over micro-batches reproduces the full-batch
  gradient exactly. Metrics are (numerator, denominator) pairs, summed before dividing.
- Evaluation is not the objective's: evaluators (bertjax/evaluators/) run beside the trainer with
  its jitted metric step (the loss above) and per-row `predict`; `evaluator` names the one a
  run uses when its config lists none (`config.evals`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bertjax import inputs
from bertjax.data.masking import Masking
from bertjax.models.config import ModelConfig
from bertjax.models.pretraining import PretrainingModel

Batch = Mapping[str, jax.Array]
Metrics = dict[str, tuple[jax.Array, jax.Array]]


@dataclasses.dataclass(frozen=True)
class Schedule:
  """How long a run trains and how often it evaluates (0: never)."""
  total_steps: int
  eval_every: int


class Objective:
  name: str = ""
  data_kind: str = "nsp"          # which instances the pipeline builds: nsp | sop | full | single
  masking_strategy: str = "token"  # default masking strategy (config may override)
  pair_head: bool = False
  # Final-layer rows the heads read per masked prediction (the encoder's `output_positions`),
  # None: every row. Lets the benchmark count what `model.gather_last_layer` computes.
  output_rows_per_prediction: int | None = None
  # The evaluator (bertjax/evaluators/) of a run whose config lists none: the loss and metric
  # sums over the eval batches.
  evaluator: str = "metric_sums"

  def __setattr__(self, name, value):
    raise AttributeError(f"objectives are stateless: {type(self).__name__}.{name} cannot be set; "
                         "pass what a method needs as an argument")

  def check(self, config) -> None:
    """What can be refused from the config alone, before any data is read (default: nothing)."""
    del config

  def model_config(self, config):
    """The encoder's `ModelConfig`: from `config.model` (fine-tuning tasks take init_from's)."""
    return ModelConfig.from_dict(config.model.to_dict())

  def build_inputs(self, config, workdir, eval_batch_size: int | None = None):
    """The train iterator and eval batches (see `bertjax.inputs.Inputs`); `eval_batch_size`:
    the run's rows per evaluation batch (its plan's), where the objective's eval batches are
    cut from rows it reads (fine-tuning tasks)."""
    del eval_batch_size  # pretraining evaluates batches of the training batch's shape
    return inputs.build(config, workdir, self)

  def schedule(self, config, data: inputs.Inputs) -> Schedule:
    """The run's length and evaluation cadence, decided once the inputs are built and before
    anything is initialized: the config's own for a pretraining corpus (a stream); fine-tuning
    tasks derive them from their number of training rows."""
    del data
    return Schedule(int(config.total_steps), int(config.eval_every))

  @classmethod
  def main_metric(cls, settings: Mapping[str, Any]) -> str:
    """The eval metric that says how good a run is (`settings`: its config or config.json):
    a pretraining objective's eval loss over its eval batches (lower is better)."""
    del settings
    return "loss"

  def about(self, config) -> str | None:
    """One line printed as the run starts where its headline loss can mislead (what it sums,
    what should move instead); None: the loss says it."""
    del config
    return None

  def reading(self, config, summary: Mapping[str, Any]) -> str | None:
    """One line for the end table: whether the metrics that tell this objective works moved the
    right way between the run's first and last train rows (`summary`); None: the loss says it."""
    del config, summary
    return None

  def predict(self, model, params, batch: Batch, rng: jax.Array | None = None,
              deterministic: bool = True) -> dict[str, Any]:
    """Per-row outputs of a forward pass, for an evaluator that decodes them (the trainer jits
    the deterministic one as its `predict_step`); pretraining objectives have none."""
    raise NotImplementedError(f"objective {self.name!r} has no per-row predictions")

  def masking(self, config) -> Masking:
    """How the input pipeline masks this objective's examples (see bertjax.data.masking)."""
    m = config.masking
    return Masking(strategy=m.strategy or self.masking_strategy, mask_rate=m.rate,
                   max_predictions=config.max_predictions_per_seq, max_ngram=m.max_ngram,
                   span_p=m.span_p, span_max=m.span_max,
                   rate_schedule=tuple(map(tuple, m.get("rate_schedule", ()))))

  def make_model(self, config, model_config) -> nn.Module:
    """The masked-LM model with the pair head when `pair_head` (override for other models)."""
    del config
    return PretrainingModel(model_config, pair_head=self.pair_head)

  def init_batch(self, config, batch_size: int, seq_len: int,
                 num_predictions: int) -> dict[str, jax.Array]:
    """A dummy batch of the right shapes, for parameter initialization."""
    del config
    z = lambda *s: jnp.zeros(s, jnp.int32)
    return {"input_ids": z(batch_size, seq_len), "attention_mask": z(batch_size, seq_len),
            "token_type_ids": z(batch_size, seq_len),
            "masked_positions": z(batch_size, num_predictions),
            "masked_ids": z(batch_size, num_predictions),
            "masked_weights": jnp.zeros((batch_size, num_predictions), jnp.float32),
            "next_sentence_label": z(batch_size)}

  def init_params(self, model: nn.Module, rng: jax.Array, batch: Batch):
    return model.init(rng, **self.model_inputs(batch))["params"]

  def model_inputs(self, batch: Batch) -> dict[str, Any]:
    keys = ("input_ids", "attention_mask", "token_type_ids", "masked_positions")
    inputs = {k: batch[k] for k in keys}
    if "segment_ids" in batch:  # packed rows (data.pack)
      inputs["segment_ids"] = batch["segment_ids"]
    return inputs

  def denominators(self, batch: Batch) -> dict[str, jax.Array]:
    """The masked-LM denominator: the batch's masked predictions (at least 1)."""
    return {"mlm": jnp.maximum(jnp.sum(batch["masked_weights"].astype(jnp.float32)), 1.0)}

  def apply(self, model: nn.Module, params, batch: Batch, rng: jax.Array,
            deterministic: bool) -> dict[str, Any]:
    """The model's outputs on `batch` (dropout drawn from `rng` unless `deterministic`)."""
    return model.apply({"params": params}, **self.model_inputs(batch), deterministic=deterministic,
                       rngs={"dropout": rng})

  def loss(self, model: nn.Module, params, batch: Batch, rng: jax.Array,
           denominators: Mapping[str, jax.Array], deterministic: bool) -> tuple[jax.Array, Metrics]:
    raise NotImplementedError


def moved(summary: Mapping[str, Any], key: str, down: bool) -> tuple[str, bool | None]:
  """`key` between the first and last train rows of `summary` in words ("soft_kl 3.2 -> 1.1")
  and whether it moved the way it should (down: falling); None when there is nothing to compare
  (fewer than two rows, or the metric missing)."""
  first, last = summary.get("first_train") or {}, summary.get("last_train") or {}
  if key not in first or key not in last or summary.get("first_train_step") == summary.get(
      "last_train_step"):
    return f"{key} {last[key]:.4g}" if key in last else f"no {key}", None
  a, b = float(first[key]), float(last[key])
  return f"{key} {a:.4g} -> {b:.4g}", (b < a if down else b > a)


def learns(summary: Mapping[str, Any], key: str, head: str) -> str:
  """Whether `head`'s loss `key` fell between the run's first and last train rows, in words."""
  words, fell = moved(summary, key, down=True)
  if fell is None:
    return f"{head}'s {words} (one train row: nothing to compare yet)"
  return f"{head}'s {words} ({'falling: it learns' if fell else 'not falling: it is not learning'})"


def above_chance(summary: Mapping[str, Any], key: str, chance: float, margin: float = 0.05) -> str:
  """The last train row's accuracy `key` against guessing (`chance`), in words."""
  last = summary.get("last_train") or {}
  if key not in last:
    return f"no {key}"
  value = float(last[key])
  verdict = ("above chance: it learns" if value > chance + margin else
             f"within {margin:g} of chance: not learnt yet (a small model on a small corpus stays "
             "there)")
  return f"{key} {value:.4g} against chance {chance:g}, {verdict}"


def top1_correct(logits, labels) -> jax.Array:
  """<float32> 1 where the label's logit is the largest (ties count as correct).

  Cheaper than `argmax(logits) == labels` over a 30k vocabulary: the row maximum is the one the
  softmax already computes, and the label's logit is a gather, not a second pass with indices.
  """
  target = jnp.take_along_axis(logits, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return (target >= jnp.max(logits, axis=-1)).astype(jnp.float32)


def masked_lm_terms(logits, masked_ids, masked_weights, denominator, prefix="mlm") -> tuple[jax.Array, Metrics]:
  """Cross-entropy and accuracy of <float32>[batch, p, vocab] logits at the masked positions."""
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, masked_ids)
  w = masked_weights.astype(jnp.float32)
  correct = top1_correct(logits, masked_ids)
  loss_sum = jnp.sum(ce * w)
  return loss_sum / denominator, {f"{prefix}_loss": (loss_sum, jnp.sum(w)),
                                  f"{prefix}_accuracy": (jnp.sum(correct * w), jnp.sum(w))}


def classification_terms(logits, labels, denominator, prefix) -> tuple[jax.Array, Metrics]:
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  n = jnp.asarray(labels.shape[0], jnp.float32)
  correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  return jnp.sum(ce) / denominator, {f"{prefix}_loss": (jnp.sum(ce), n),
                                     f"{prefix}_accuracy": (jnp.sum(correct), n)}
