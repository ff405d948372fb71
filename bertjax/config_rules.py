"""Every setting's allowed values, declared once: the range of each numeric setting (RULES) and
the choices of each named one (CHOICES). `bertjax.config_checks` checks a config against them
before a run (or a sweep's points) prepares, trains or writes anything."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from bertjax import divergence, optim
from bertjax.data import masking, sources
from bertjax.models import dropout, features, kernels


@dataclasses.dataclass(frozen=True)
class Range:
  """lo <= value <= hi (a bound is strict when marked open); `also`: sentinel values allowed."""
  lo: float | None = None
  hi: float | None = None
  lo_open: bool = False
  hi_open: bool = False
  also: tuple = ()

  def holds(self, value) -> bool:
    if any(value is a or (value == a and type(value) is type(a)) for a in self.also):
      return True
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
      return False
    if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
      return False
    return self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)

  def __str__(self) -> str:
    if self.hi is None:
      text = f"{'>' if self.lo_open else '>='} {self.lo}"
    else:
      text = (f"in {'(' if self.lo_open else '['}{self.lo}, {self.hi}"
              f"{')' if self.hi_open else ']'}")
    return " or ".join([text, *map(repr, self.also)])


AT_LEAST_1, NON_NEGATIVE, POSITIVE = Range(1), Range(0), Range(0, lo_open=True)
UNIT, OPEN_UNIT = Range(0, 1), Range(0, 1, lo_open=True, hi_open=True)
PROBABILITY = Range(0, 1, hi_open=True)   # dropout: 1 would drop everything
SHARE = Range(0, 1, lo_open=True)         # a fraction that must keep something

# Every numeric setting of configs/common.py (and the fine-tuning configs' own), with its range,
# what it means and an example value for the fix. A key a config lacks is not checked.
RULES: tuple[tuple[str, Range, str, Any], ...] = (
    ("total_steps", NON_NEGATIVE, "optimizer steps; 0 in fine-tuning configs: from num_epochs", 1000),
    ("batch_size", AT_LEAST_1, "rows per optimizer step", 32),
    ("grad_accum_steps", AT_LEAST_1, "micro-batches per step", 1),
    ("batch_warmup_tokens", NON_NEGATIVE, "tokens over which the batch grows; 0: no warmup", 0),
    ("batch_warmup_start", AT_LEAST_1, "micro-batches per step as the batch warmup starts", 1),
    ("prefetch_batches", NON_NEGATIVE, "batches sent to the devices ahead; 0: none", 2),
    # 0 is allowed: the weights stay as restored (tests/test_task_glue.py checks a restore so).
    ("learning_rate", NON_NEGATIVE, "the peak learning rate", 1e-4),
    ("seed", Range(0, 2**32, hi_open=True), "the seed of data order, init and dropout", 0),
    ("log_every", AT_LEAST_1, "steps between train metric lines", 50),
    ("progress_every_s", NON_NEGATIVE, "seconds of work between progress lines; 0: every step", 10.0),
    ("eval_every", NON_NEGATIVE, "steps between evaluations; 0: at the end only", 0),
    ("checkpoint_every", AT_LEAST_1, "steps between checkpoints; one is also saved at the end", 1000),
    ("keep_checkpoints", AT_LEAST_1,
     "checkpoints kept on disk; fewer than 1 would delete every one, the latest included", 3),
    ("max_seq_length", Range(3), "tokens per row, [CLS] and [SEP]s included", 128),
    ("max_predictions_per_seq", AT_LEAST_1, "masked positions per row", 20),
    ("num_epochs", NON_NEGATIVE, "passes over the training set when total_steps=0", 3.0),
    ("max_train_examples", NON_NEGATIVE, "training examples used; 0: all", 0),
    ("eval_batch_size", NON_NEGATIVE, "rows per prediction batch; 0: the training micro-batch", 0),
    ("pad_to_multiple_of", NON_NEGATIVE, "batch length rounding; 0: pad to max_seq_length", 32),
    ("doc_stride", AT_LEAST_1, "tokens between passage windows", 128),
    ("max_query_length", AT_LEAST_1, "question tokens kept", 64),
    ("max_answer_length", AT_LEAST_1, "answer tokens predicted at most", 30),
    ("n_best_size", AT_LEAST_1, "answer candidates per question", 20),
    ("data.vocab_size", AT_LEAST_1, "the sentencepiece vocabulary trained", 30522),
    ("data.eval_documents", NON_NEGATIVE, "documents held out for evaluation", 50),
    ("data.eval_batches", NON_NEGATIVE, "batches per evaluation", 4),
    ("data.short_seq_prob", UNIT, "probability of a shorter target length", 0.1),
    ("data.pack_bins", AT_LEAST_1, "rows filled at once when packing", 64),
    ("masking.rate", OPEN_UNIT, "fraction of tokens selected for prediction", 0.15),
    ("masking.max_ngram", AT_LEAST_1, "longest masked n-gram", 3),
    ("masking.span_p", SHARE, "the geometric span-length parameter", 0.2),
    ("masking.span_max", AT_LEAST_1, "longest span, in words", 10),
    ("electra.generator_hidden_fraction", SHARE, "generator width / discriminator's", 0.5),
    ("electra.generator_layer_fraction", SHARE, "generator depth / discriminator's", 1.0),
    ("electra.disc_weight", NON_NEGATIVE, "weight of the discriminator loss", 50.0),
    ("optimizer.b1", PROBABILITY, "the first-moment decay", 0.9),
    ("optimizer.b2", PROBABILITY, "the second-moment decay", 0.999),
    ("optimizer.eps", POSITIVE, "the denominator's epsilon (0 divides by zero)", 1e-6),
    ("optimizer.weight_decay", NON_NEGATIVE, "decoupled weight decay", 0.01),
    ("optimizer.grad_clip_norm", NON_NEGATIVE, "global-norm clipping; 0 disables", 1.0),
    ("optimizer.warmup_steps", Range(-1), "warmup steps; -1: warmup_fraction", -1),
    ("optimizer.warmup_fraction", UNIT, "warmup as a fraction of total_steps", 0.01),
    ("optimizer.wsd_decay_fraction", UNIT, "the share of the steps a wsd decay takes", 0.1),
    ("optimizer.decay_power", POSITIVE, "the polynomial decay's power", 1.0),
    ("optimizer.end_learning_rate_factor", UNIT, "the final learning rate / the peak", 0.0),
    ("optimizer.layerwise_lr_decay", SHARE, "per-layer learning-rate factor; 1 disables", 1.0),
    ("freeze.train_top_layers", NON_NEGATIVE, "top encoder layers trained under freeze.encoder", 0),
    ("model.vocab_size", AT_LEAST_1, "the model's vocabulary", 30522),
    ("model.hidden_size", AT_LEAST_1, "the hidden width", 768),
    ("model.num_hidden_layers", AT_LEAST_1, "encoder layers", 12),
    ("model.num_attention_heads", AT_LEAST_1, "attention heads", 12),
    ("model.intermediate_size", AT_LEAST_1, "the feed-forward width", 3072),
    ("model.hidden_dropout_prob", PROBABILITY, "dropout probability", 0.1),
    ("model.attention_probs_dropout_prob", PROBABILITY, "dropout probability", 0.1),
    ("model.max_position_embeddings", AT_LEAST_1, "rows of the position table", 512),
    ("model.type_vocab_size", AT_LEAST_1, "token types", 2),
    ("model.layer_norm_eps", POSITIVE, "LayerNorm's epsilon", 1e-12),
    ("data.generated_families", Range(1), "language families of the generated corpus", 1),
    ("data.generated_tokens", Range(3), "tokens per language of the generated corpus", 8),
    ("model.pad_token_id", NON_NEGATIVE, "the padding id", 0),
    ("model.embedding_size", Range(1, also=(None,)), "the embedding width; None: hidden_size", 128),
    ("model.num_hidden_groups", Range(1, also=(None,)), "ALBERT's layer groups; None: one per layer",
     1),
)

# Settings that name one of a few choices (refused here rather than after data preparation).
CHOICES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("best_mode", ("max", "min")),
    ("nonfinite_policy", divergence.POLICIES),
    ("masking.strategy", ("", *masking.STRATEGIES)),   # "": the objective's default
    ("data.format", sources.FORMATS),
    ("optimizer.name", optim.OPTIMIZERS),
    ("optimizer.decay", optim.DECAYS),
    ("optimizer.wsd_decay_shape", optim.WSD_SHAPES),
    ("data.generated", ("", "context")),   # bertjax/data/synthetic.py
    ("head.features", features.FEATURES),
    ("head.pooling", features.POOLINGS),
    ("model.attention_dropout_kernel", kernels.ATTENTION_DROPOUT_SETTINGS),
    ("model.dropout_impl", dropout.DROPOUT_SETTINGS),
)
