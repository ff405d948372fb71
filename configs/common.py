"""Settings every experiment config shares; each config starts from `base_config()`."""

import ml_collections

from bertjax.models.presets import PRESETS
from bertjax.models.config import ModelConfig


def model_config(preset: str, **overrides) -> ml_collections.ConfigDict:
  """All `ModelConfig` fields of a preset, so any of them can be overridden from the command line."""
  fields = ModelConfig.from_dict({**PRESETS[preset], **overrides}).to_dict()
  return ml_collections.ConfigDict(fields)


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.objective = "mlm_nsp"          # mlm_nsp | mlm | mlm_sop | span_sbo | rtd | distill
  c.model = model_config("bert-base")
  c.total_steps = 1000             # optimizer steps
  c.batch_size = 256               # global batch of one optimizer step (all hosts, all micro-batches)
  c.grad_accum_steps = 1           # micro-batches per step, accumulated inside the jitted step
  c.learning_rate = 1e-4           # peak learning rate
  c.seed = 0
  c.mesh_shape = (-1, 1, 1)        # (data, fsdp, tensor); -1 takes the remaining devices
  c.logical_rules = ()             # () = bertjax.sharding.DEFAULT_RULES
  c.log_every = 50                 # steps between train metric lines
  c.eval_every = 0                 # steps between evaluations (0 = only at the end... never for 0 steps)
  c.best_metric = ""               # eval metric whose best value keeps its params in WORKDIR/best
  c.best_mode = "max"              # max | min
  c.checkpoint_every = 1000        # steps between checkpoints (and always at the end)
  c.keep_checkpoints = 3           # checkpoints kept on disk
  c.async_checkpointing = True     # write checkpoints in a background thread
  c.tensorboard = True             # also write TensorBoard event files
  c.init_from = ""                 # a converted checkpoint folder or a training workdir to start from
  c.data_dir = ""                  # a prepared corpus (python -m bertjax.data.prepare) to train on
  c.max_seq_length = 128
  c.max_predictions_per_seq = 20   # masked positions gathered per row; the MLM head runs on these only

  c.data = ml_collections.ConfigDict()
  c.data.synthetic = False         # random token batches instead of a corpus (benchmarks, layout tests)
  c.data.corpus = ""               # raw text glob(s), comma separated, prepared into workdir at first run
  c.data.format = "bert"           # bert (sentence per line, blank line between documents) | doc_per_line | wikitext
  c.data.tokenizer = ""            # tokenizer folder; empty: train sentencepiece on the corpus
  c.data.vocab_size = 30522        # sentencepiece vocabulary size when training one
  c.data.eval_documents = 50       # documents held out for evaluation
  c.data.eval_batches = 4          # batches per evaluation
  c.data.short_seq_prob = 0.1      # BERT: probability of a shorter target length

  c.masking = ml_collections.ConfigDict()
  c.masking.strategy = ""          # token | whole_word | ngram | span; empty: the objective's default
  c.masking.rate = 0.15            # fraction of tokens selected for prediction
  c.masking.max_ngram = 3          # ALBERT n-gram masking
  c.masking.span_p = 0.2           # SpanBERT geometric span length parameter
  c.masking.span_max = 10          # SpanBERT span length clip (in words)

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = "adamw"       # adamw | lamb | adam | sgd
  c.optimizer.b1 = 0.9
  c.optimizer.b2 = 0.999
  c.optimizer.eps = 1e-6
  c.optimizer.weight_decay = 0.01  # not applied to LayerNorm parameters and biases
  c.optimizer.grad_clip_norm = 1.0 # global-norm clipping; 0 disables
  c.optimizer.warmup_steps = -1    # -1: use warmup_fraction
  c.optimizer.warmup_fraction = 0.01
  c.optimizer.decay = "linear"     # linear | polynomial | constant
  c.optimizer.decay_power = 1.0    # for polynomial decay
  c.optimizer.end_learning_rate_factor = 0.0
  c.optimizer.layerwise_lr_decay = 1.0
  return c
