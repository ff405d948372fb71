"""Every trainer setting, declared once: key, default, allowed values and help in one row.

configs/common.py builds its ConfigDicts from these rows (`defaults`), bertjax/config/config_rules.py
derives the ranges and choices `bertjax.config.config_checks` checks, and `help_text` answers for a
key. A setting's type is its default's: the ConfigDict refuses a value of another type. Adding a
setting is one row in `TRAINER` (or `FINETUNE`); a model setting (`model.*`) is one field of
`ModelConfig`, declared with its default, check and help (`models.config.setting`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from bertjax.data import masking, sources
from bertjax.models import dropout, features, kernels
from bertjax.models.config import ModelConfig
from bertjax.core.ranges import (AT_LEAST_1, NON_NEGATIVE, OPEN_UNIT, POSITIVE, PROBABILITY, SHARE,
                                 UNIT, Range)
from bertjax.runtime import divergence, optim, sharding


_SAME = object()


@dataclasses.dataclass(frozen=True)
class Setting:
  """One setting: `check` is a Range, a tuple of the allowed values (the first is the fix
  suggested for a bad one), or None (any value of the default's type); `example` is the value a
  range's error suggests (the default unless given)."""
  key: str
  default: Any
  check: Range | tuple | None
  help: str
  example: Any = _SAME

  @property
  def fix(self) -> Any:
    return self.default if self.example is _SAME else self.example


S = Setting
# Every experiment's settings (configs/common.py's base_config). Sections: the run, data, masking,
# electra, optimizer.
TRAINER: tuple[Setting, ...] = (
    S("objective", "mlm_nsp", None, "mlm_nsp | mlm | mlm_sop | span_sbo | rtd | distill"),
    S("total_steps", 1000, NON_NEGATIVE,
      "optimizer steps; 0 in fine-tuning configs: from num_epochs"),
    S("batch_size", 256, AT_LEAST_1,
      "rows per optimizer step (all hosts, all micro-batches)", 32),
    S("grad_accum_steps", 1, AT_LEAST_1,
      "micro-batches per step, accumulated inside the jitted step"),
    # Batch-size warmup (ModernBERT): a step runs batch_warmup_start micro-batches at first,
    # growing to grad_accum_steps as the tokens trained (rows x max_seq_length) reach the tokens.
    S("batch_warmup_tokens", 0, NON_NEGATIVE, "tokens over which the batch grows; 0: no warmup"),
    S("batch_warmup_start", 1, AT_LEAST_1, "micro-batches per step as the batch warmup starts"),
    S("prefetch_batches", 2, NON_NEGATIVE, "batches sent to the devices ahead; 0: none"),
    # 0 is allowed: the weights stay as restored (tests/test_task_glue.py checks a restore so).
    S("learning_rate", 1e-4, NON_NEGATIVE, "the peak learning rate"),
    S("seed", 0, Range(0, 2**32, hi_open=True), "the seed of data order, init and dropout"),
    S("distributed", False, None,
      "call jax.distributed.initialize() (TPU pods, multi-host GPU)"),
    S("mesh_shape", (-1, 1, 1), None, "(data, fsdp, tensor); -1 takes the remaining devices"),
    S("logical_rules", sharding.DEFAULT_RULES, None,
      "(logical axis, mesh axis or axes or None) pairs; () in older configs: these defaults"),
    S("log_every", 50, AT_LEAST_1, "steps between train metric lines"),
    S("progress_every_s", 10.0, NON_NEGATIVE,
      "seconds of work between progress lines (with ETA); 0: every step"),
    S("eval_every", 0, NON_NEGATIVE,
      "steps between evaluations; 0: at the end only (fine-tuning: once per epoch)"),
    S("evals", (), None,
      "evaluations beside the trainer, each a dict: name (metric_sums | glue | squad | ner | "
      "glue_probe), every (steps), an optional prefix and the evaluator's options; empty: the "
      "objective's own every eval_every steps. On the command line a Python/JSON list: "
      "--config.evals='[{\"name\": \"glue_probe\", \"every\": 1000, \"task\": \"rte\"}]'"),
    S("best_metric", "", None, "eval metric whose best value keeps its params in WORKDIR/best"),
    S("best_mode", "max", ("max", "min"), "whether best_metric's best is its max or its min"),
    S("checkpoint_every", 1000, AT_LEAST_1,
      "steps between checkpoints; one is also saved at the end"),
    S("keep_checkpoints", 3, AT_LEAST_1,
      "checkpoints kept on disk; fewer than 1 would delete every one, the latest included"),
    S("nonfinite_policy", "stop", divergence.POLICIES,
      "a NaN/inf loss or gradient: stop (exit 3) | skip that update"),
    S("async_checkpointing", True, None, "write checkpoints in a background thread"),
    S("tensorboard", True, None, "also write TensorBoard event files"),
    S("init_from", "", None,
      "a converted checkpoint folder (convert from-hf) or a training workdir to start from"),
    S("allow_changed_settings", False, None,
      "resume a workdir although settings that alter the run changed (all but a longer "
      "total_steps and cadence/placement keys: bertjax/runtime/workdir.py); the change goes to "
      "WORKDIR/changes.jsonl. Not itself recorded in config.json"),
    S("data_dir", "", None, "a prepared corpus (python -m bertjax.data.prepare) to train on"),
    S("max_seq_length", 128, Range(3), "tokens per row, [CLS] and [SEP]s included"),
    S("max_predictions_per_seq", 20, AT_LEAST_1,
      "masked positions per row; the MLM head runs on these only"),

    S("data.synthetic", False, None,
      "random token batches instead of a corpus (benchmarks, layout tests)"),
    S("data.generated", "", ("", "context"),
      "context: a generated corpus whose words follow from context (bertjax/data/synthetic.py)"),
    S("data.generated_families", 1, Range(1),
      "language families of the generated corpus (NSP's random B: another one half the time)"),
    S("data.generated_tokens", 8, Range(3),
      "tokens per language of the generated corpus (the length of each cycle)"),
    S("data.corpus", "", None,
      "raw text glob(s), comma separated, prepared into workdir at first run"),
    S("data.format", "bert", sources.FORMATS,
      "bert (sentence per line, blank line between documents) | doc_per_line | wikitext"),
    S("data.tokenizer", "", None, "tokenizer folder; empty: train sentencepiece on the corpus"),
    S("data.vocab_size", 30522, AT_LEAST_1, "the sentencepiece vocabulary trained"),
    S("data.eval_documents", 50, NON_NEGATIVE, "documents held out for evaluation"),
    S("data.eval_batches", 4, NON_NEGATIVE, "batches per evaluation"),
    S("data.short_seq_prob", 0.1, UNIT, "BERT: probability of a shorter target length"),
    S("data.kind", "", None, "instances: empty, the objective's; full | single (mlm, rtd)"),
    S("data.pack", False, None,
      "several instances per row, kept apart by segment ids (single)"),
    S("data.pack_bins", 64, AT_LEAST_1, "rows filled at once, first-fit, when packing"),

    S("masking.strategy", "", ("", *masking.STRATEGIES),
      "token | whole_word | ngram | span; empty: the objective's default"),
    S("masking.rate", 0.15, OPEN_UNIT, "fraction of tokens selected for prediction"),
    S("masking.rate_schedule", (), None,
      "((from_step, rate), ...): training rows of steps >= from_step are masked at that rate "
      "(mmBERT: 30% to 5% across phases); masking.rate before the first, and for evaluation"),
    S("masking.max_ngram", 3, AT_LEAST_1, "ALBERT n-gram masking: the longest masked n-gram"),
    S("masking.span_p", 0.2, SHARE, "SpanBERT's geometric span-length parameter"),
    S("masking.span_max", 10, AT_LEAST_1, "SpanBERT's longest span, in words"),

    # objective=rtd only. The paper's best widths are 1/4 to 1/2 (1/4 small and large, 1/3 base:
    # configs/electra.py); 1/2 keeps tiny models at >= 2 heads, for tensor parallelism.
    S("electra.generator_hidden_fraction", 0.5, SHARE, "generator width / discriminator's"),
    S("electra.generator_layer_fraction", 1.0, SHARE,
      "generator depth / discriminator's (paper: 1)"),
    S("electra.disc_weight", 50.0, NON_NEGATIVE,
      "lambda: loss = generator MLM + lambda * discriminator BCE"),

    S("optimizer.name", "adamw", optim.OPTIMIZERS,
      "adamw | lamb | adam | sgd | stableadamw (AdamW with per-tensor update clipping)"),
    S("optimizer.b1", 0.9, PROBABILITY, "the first-moment decay"),
    S("optimizer.b2", 0.999, PROBABILITY, "the second-moment decay"),
    S("optimizer.eps", 1e-6, POSITIVE, "the denominator's epsilon (0 divides by zero)"),
    S("optimizer.weight_decay", 0.01, NON_NEGATIVE,
      "decoupled weight decay; not applied to LayerNorm parameters and biases"),
    S("optimizer.fully_decoupled_weight_decay", False, None,
      "decay by (lr_t / learning_rate) * weight_decay instead of lr_t * weight_decay: the "
      "schedule's shape without the peak's size (optimi's decouple_lr; ModernBERT uses 1e-5)"),
    S("optimizer.grad_clip_norm", 1.0, NON_NEGATIVE, "global-norm clipping; 0 disables"),
    S("optimizer.warmup_steps", -1, Range(-1), "warmup steps; -1: warmup_fraction"),
    S("optimizer.warmup_fraction", 0.01, UNIT, "warmup as a fraction of total_steps"),
    S("optimizer.decay", "linear", optim.DECAYS,
      "linear | polynomial | constant | wsd (warmup, plateau, decay)"),
    S("optimizer.decay_power", 1.0, POSITIVE, "the polynomial decay's power"),
    S("optimizer.wsd_decay_fraction", 0.1, UNIT, "wsd: the last fraction of the steps that decays"),
    S("optimizer.wsd_decay_shape", "1-sqrt", optim.WSD_SHAPES,
      "wsd: 1-sqrt (lr falls as 1 - sqrt(done)) | linear"),
    S("optimizer.end_learning_rate_factor", 0.0, UNIT, "the final learning rate / the peak"),
    S("optimizer.layerwise_lr_decay", 1.0, SHARE,
      "per-layer learning-rate factor (ELECTRA: 0.8 base, 0.9 large); 1 disables"),
    S("optimizer.fused_update", False, None,
      "the update over one flat buffer per group of parameters (dtype, weight decay, layer-wise "
      "factor) instead of one chain per tensor: fewer kernels; adamw, adam and sgd, on a mesh "
      "that does not shard parameters; its optimizer state is laid out by group"),
    S("optimizer.keep_pruned", False, None,
      "encoder kernels' weights that are zero at the start (a magnitude-pruned init_from: "
      "python -m bertjax.prune) stay zero: their updates are masked"),
)

# What fine-tuning adds (configs/common.py's finetune_config).
FINETUNE: tuple[Setting, ...] = (
    S("pad_to_multiple_of", 32, NON_NEGATIVE,
      "training batches cut to their longest row, rounded up to this; 0: max_seq_length"),
    S("eval_batch_size", 0, NON_NEGATIVE, "rows per prediction batch; 0: the training micro-batch"),
    S("seeds", (), None, "one run per seed into WORKDIR/seed_<n> (empty: just `seed`)"),
    S("tfds_data_dir", "", None, "where tfds finds built datasets (empty: tfds's default)"),
    # A frozen encoder (README, "Frozen encoder and features"): no gradient, optimizer state or
    # update for frozen parameters; checkpoints still hold them all.
    S("freeze.encoder", False, None,
      "train only the task head (and what the two keys below add)"),
    S("freeze.train_top_layers", 0, NON_NEGATIVE,
      "with freeze.encoder: also train the top k layers (+ final LN, pooler)"),
    S("freeze.train_embeddings", False, None, "with freeze.encoder: also train the embeddings"),
    S("head.features", "standard", features.FEATURES,
      "what the task head reads: standard (GLUE: the pooled [CLS]; tagging, QA: the last layer) "
      "| last | concat (head.layers side by side) | scalar_mix (ELMo's learned weighted sum)"),
    S("head.layers", (-4, -3, -2, -1), None,
      "hidden states for concat/scalar_mix: 0 embeddings, 1..L layers, <0 from the top"),
    S("head.pooling", "cls", features.POOLINGS,
      "sequence tasks with features != standard: cls ([CLS] row) | mean (real tokens)"),
)

# Settings the task configs (configs/glue.py, squad.py, ner.py) set themselves: checked when a
# config has them; their default here is only the fix an error suggests.
TASK: tuple[Setting, ...] = (
    S("num_epochs", 3.0, NON_NEGATIVE, "passes over the training set when total_steps=0"),
    S("max_train_examples", 0, NON_NEGATIVE, "training examples used; 0: all"),
    S("doc_stride", 128, AT_LEAST_1, "tokens between passage windows"),
    S("max_query_length", 64, AT_LEAST_1, "question tokens kept"),
    S("max_answer_length", 30, AT_LEAST_1, "answer tokens predicted at most"),
    S("n_best_size", 20, AT_LEAST_1, "answer candidates per question"),
)

def eval_batch_size(config) -> int:
  """Rows per evaluation batch, derived here only: `eval_batch_size`, else the training
  micro-batch (batch_size / grad_accum_steps)."""
  micro_batch = config.batch_size // max(int(config.get("grad_accum_steps", 1)), 1)
  return int(config.get("eval_batch_size", 0) or micro_batch)


def model_settings() -> tuple[Setting, ...]:
  """The model's settings, declared on ModelConfig's fields (`models.config.setting`): each
  field that names a check, with its default, check and help."""
  out = []
  for field in dataclasses.fields(ModelConfig):
    if "check" in field.metadata:
      m = field.metadata
      out.append(S(f"model.{field.name}", field.default, m["check"], m["help"],
                   m.get("example", _SAME)))
  return tuple(out)


def declared() -> tuple[Setting, ...]:
  """Every declared setting: the trainer's, fine-tuning's, the task configs' and the model's."""
  return TRAINER + FINETUNE + TASK + model_settings()


def defaults(table: tuple[Setting, ...], into=None):
  """A ConfigDict (or `into`) holding every setting of `table` at its default."""
  config = ml_collections.ConfigDict() if into is None else into
  for setting in table:
    *sections, name = setting.key.split(".")
    node = config
    for section in sections:
      if section not in node:
        node[section] = ml_collections.ConfigDict()
      node = node[section]
    node[name] = setting.default
  return config


def help_text(key: str) -> str:
  """`key`'s help, with its default and allowed values, in one line (for --help and errors)."""
  for setting in declared():
    if setting.key == key:
      allowed = ("" if setting.check is None else
                 f"; one of {', '.join(map(repr, setting.check))}"
                 if isinstance(setting.check, tuple) else f"; {setting.check}")
      return f"{key} (default {setting.default!r}{allowed}): {setting.help}"
  raise KeyError(key)


def describe() -> str:
  """Every declared setting's `help_text`, one per line (a config's --help listing)."""
  return "\n".join(help_text(setting.key) for setting in declared())
