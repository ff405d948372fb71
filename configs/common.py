"""Settings every experiment config shares; each config starts from `base_config()`."""

import pathlib

import ml_collections

from bertjax.config import settings
from bertjax.core.errors import fail
from bertjax.models import kernels
from bertjax.models.config import ModelConfig
from bertjax.models.presets import PRESETS

# The WikiText-2 sample shipped in the repo: the `runlocal` variants pretrain on it.
SAMPLE = pathlib.Path(__file__).resolve().parent.parent / "bertjax/data/samples/wikitext2_test.raw"
LOCAL_VOCAB = 4000  # the sentencepiece vocabulary trained on SAMPLE by runlocal variants


def model_config(preset: str, **overrides) -> ml_collections.ConfigDict:
  """All `ModelConfig` fields of a preset, so any of them can be overridden from the command line."""
  fields = ModelConfig.from_dict({**choose(preset, PRESETS, "model preset"), **overrides}).to_dict()
  # The kernel overrides as a field each (--config.model.kernel_overrides.flat_dense=False).
  fields["kernel_overrides"] = kernels.Overrides(fields["kernel_overrides"] or None)
  return ml_collections.ConfigDict(fields)


def base_config() -> ml_collections.ConfigDict:
  """Every experiment's settings at their defaults: one row each in bertjax/config/settings.py
  (`settings.TRAINER`: default, allowed values and help), the model's from `ModelConfig`."""
  c = settings.defaults(settings.TRAINER)
  c.model = model_config("bert-base")
  return c


def parse_variant(arg: str | None, config_file: str, choices: dict | None = None,
                  **defaults) -> ml_collections.ConfigDict:
  """`size=base,runlocal` -> {size: 'base', runlocal: True, ...defaults}: a config's variant.

  Every key must be one of `defaults`: `key=value` sets a string option, a bare `key` turns a
  flag (a bool default) on. `choices` optionally lists the values a string option may take.
  `config_file` names the file in the error for anything else.
  """
  options = dict(defaults)
  for item in filter(None, (arg or "").split(",")):
    key, sep, value = (part.strip() for part in item.partition("="))
    if key not in defaults or bool(sep) == isinstance(defaults[key], bool):
      valid = ", ".join(f"{k}" if isinstance(v, bool) else f"{k}=..." for k, v in defaults.items())
      fail(f"unknown variant {item!r} for {config_file}; use a comma-separated list of {valid}")
    if sep and choices and key in choices and value not in choices[key]:
      fail(f"{config_file}: {key}={value!r} is not one of {', '.join(choices[key])}")
    options[key] = value if sep else True
  return ml_collections.ConfigDict(options)


def finetune_config() -> ml_collections.ConfigDict:
  """`base_config()` plus the settings GLUE, SQuAD and CoNLL fine-tuning share (`settings.FINETUNE`)
  and the defaults of BERT's fine-tuning recipe where they differ from pretraining's."""
  c = settings.defaults(settings.FINETUNE, into=base_config())
  # c.model (bert-base) is used for random init only; with init_from the architecture comes from
  # the checkpoint and only dropout, dtype and remat are taken from it.
  c.batch_size = 32
  c.optimizer.warmup_fraction = 0.1  # BERT's 10% linear warmup
  c.keep_checkpoints = 1           # fine-tuning runs are short; the last checkpoint is what counts
  return c


def choose(value: str, choices: dict, what: str):
  """`choices[value]`, or a one-line error listing the valid values."""
  if value not in choices:
    fail(f"unknown {what} {value!r}; use one of {', '.join(choices)}")
  return choices[value]


def runlocal(c: ml_collections.ConfigDict) -> None:
  """Shrinks a recipe's run to minutes on a CPU: the WikiText-2 sample (tokenizer trained on it at
  first run), 64-token sequences, 200 steps of 16. Each config then swaps in a tiny model of its
  own family (model_config(..., **LOCAL_MODEL)) and a learning rate that suits it."""
  c.data_dir = ""
  c.data.corpus = str(SAMPLE)
  c.data.format = "wikitext"
  c.data.tokenizer = ""
  c.data.vocab_size = LOCAL_VOCAB
  c.data.eval_documents = 6
  c.data.eval_batches = 4
  c.total_steps = 200
  c.batch_size = 16
  c.grad_accum_steps = 1
  c.max_seq_length = 64
  c.max_predictions_per_seq = 10
  c.log_every = 20
  c.eval_every = 100
  c.checkpoint_every = 100
  c.optimizer.warmup_steps = 20


# Tiny-model overrides for runlocal (a bert-tiny shape; positions cover the 64-token sequences).
LOCAL_MODEL = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=2,
                   intermediate_size=512, vocab_size=LOCAL_VOCAB, max_position_embeddings=128,
                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
