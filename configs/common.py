"""Settings every experiment config shares; each config starts from `base_config()`."""

import pathlib

import ml_collections

from bertjax.errors import fail
from bertjax.models.presets import PRESETS
from bertjax.models.config import ModelConfig

# The WikiText-2 sample shipped in the repo: the `runlocal` variants pretrain on it.
SAMPLE = pathlib.Path(__file__).resolve().parent.parent / "bertjax/data/samples/wikitext2_test.raw"
LOCAL_VOCAB = 4000  # the sentencepiece vocabulary trained on SAMPLE by runlocal variants


def model_config(preset: str, **overrides) -> ml_collections.ConfigDict:
  """All `ModelConfig` fields of a preset, so any of them can be overridden from the command line."""
  fields = ModelConfig.from_dict({**choose(preset, PRESETS, "model preset"), **overrides}).to_dict()
  return ml_collections.ConfigDict(fields)


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.objective = "mlm_nsp"          # mlm_nsp | mlm | mlm_sop | span_sbo | rtd | distill
  c.model = model_config("bert-base")
  c.total_steps = 1000             # optimizer steps
  c.batch_size = 256               # global batch of one optimizer step (all hosts, all micro-batches)
  c.grad_accum_steps = 1           # micro-batches per step, accumulated inside the jitted step
  # Batch-size warmup (ModernBERT): a step runs batch_warmup_start micro-batches at first, growing
  # to grad_accum_steps as the tokens trained (rows x max_seq_length) reach batch_warmup_tokens.
  c.batch_warmup_tokens = 0        # 0: every step runs the full batch
  c.batch_warmup_start = 1         # micro-batches per step when the warmup starts
  c.prefetch_batches = 2           # batches sent to the devices ahead of the step (0: none)
  c.learning_rate = 1e-4           # peak learning rate
  c.seed = 0
  c.distributed = False            # call jax.distributed.initialize() (TPU pods, multi-host GPU)
  c.mesh_shape = (-1, 1, 1)        # (data, fsdp, tensor); -1 takes the remaining devices
  c.logical_rules = ()             # () = bertjax.sharding.DEFAULT_RULES
  c.log_every = 50                 # steps between train metric lines
  c.progress_every_s = 10.0        # seconds of work between progress lines (with ETA; 0: every step)
  c.eval_every = 0                 # steps between evaluations (0 = only at the end... never for 0 steps)
  c.best_metric = ""               # eval metric whose best value keeps its params in WORKDIR/best
  c.best_mode = "max"              # max | min
  c.checkpoint_every = 1000        # steps between checkpoints (and always at the end)
  c.keep_checkpoints = 3           # checkpoints kept on disk
  c.nonfinite_policy = "stop"      # a NaN/inf loss or gradient: stop (exit 3) | skip that update
  c.async_checkpointing = True     # write checkpoints in a background thread
  c.tensorboard = True             # also write TensorBoard event files
  c.init_from = ""                 # a converted checkpoint folder or a training workdir to start from
  # Resume a workdir although settings that alter the run changed (anything but a longer
  # total_steps and cadence/placement keys: bertjax/workdir.py); the change is recorded in
  # WORKDIR/changes.jsonl. Not itself recorded in config.json.
  c.allow_changed_settings = False
  c.data_dir = ""                  # a prepared corpus (python -m bertjax.data.prepare) to train on
  c.max_seq_length = 128
  c.max_predictions_per_seq = 20   # masked positions gathered per row; the MLM head runs on these only

  c.data = ml_collections.ConfigDict()
  c.data.synthetic = False         # random token batches instead of a corpus (benchmarks, layout tests)
  c.data.generated = ""            # "context": a generated corpus whose words follow from context (bertjax/data/synthetic.py)
  c.data.generated_families = 1    # its language families (NSP's random B is of another family half the time)
  c.data.generated_tokens = 8      # its tokens per language (the length of each cycle)
  c.data.corpus = ""               # raw text glob(s), comma separated, prepared into workdir at first run
  c.data.format = "bert"           # bert (sentence per line, blank line between documents) | doc_per_line | wikitext
  c.data.tokenizer = ""            # tokenizer folder; empty: train sentencepiece on the corpus
  c.data.vocab_size = 30522        # sentencepiece vocabulary size when training one
  c.data.eval_documents = 50       # documents held out for evaluation
  c.data.eval_batches = 4          # batches per evaluation
  c.data.short_seq_prob = 0.1      # BERT: probability of a shorter target length
  c.data.kind = ""                 # instances: empty, the objective's; full | single (mlm, rtd)
  c.data.pack = False              # several instances per row, kept apart by segment ids (single)
  c.data.pack_bins = 64            # rows filled at once, first-fit, when packing

  c.masking = ml_collections.ConfigDict()
  c.masking.strategy = ""          # token | whole_word | ngram | span; empty: the objective's default
  c.masking.rate = 0.15            # fraction of tokens selected for prediction
  # ((from_step, rate), ...): training rows of steps >= from_step are masked at that rate
  # (mmBERT: 30% to 5% across phases); masking.rate before the first, and for evaluation.
  c.masking.rate_schedule = ()
  c.masking.max_ngram = 3          # ALBERT n-gram masking
  c.masking.span_p = 0.2           # SpanBERT geometric span length parameter
  c.masking.span_max = 10          # SpanBERT span length clip (in words)

  c.electra = ml_collections.ConfigDict()  # objective=rtd only
  # Generator width / the discriminator's; the paper's best are 1/4 to 1/2 (1/4 small and large,
  # 1/3 base: configs/electra.py). 1/2 keeps tiny models at >= 2 heads, for tensor parallelism.
  c.electra.generator_hidden_fraction = 0.5
  c.electra.generator_layer_fraction = 1.0   # generator depth / discriminator's (paper: 1)
  c.electra.disc_weight = 50.0     # lambda: loss = generator MLM + lambda * discriminator BCE

  c.optimizer = ml_collections.ConfigDict()
  # adamw | lamb | adam | sgd | stableadamw (AdamW with per-tensor update clipping)
  c.optimizer.name = "adamw"
  c.optimizer.b1 = 0.9
  c.optimizer.b2 = 0.999
  c.optimizer.eps = 1e-6
  c.optimizer.weight_decay = 0.01  # not applied to LayerNorm parameters and biases
  # Each step decays by (lr_t / learning_rate) * weight_decay instead of lr_t * weight_decay:
  # the schedule's shape without the peak's size (optimi's decouple_lr; ModernBERT uses 1e-5 so).
  c.optimizer.fully_decoupled_weight_decay = False
  c.optimizer.grad_clip_norm = 1.0 # global-norm clipping; 0 disables
  c.optimizer.warmup_steps = -1    # -1: use warmup_fraction
  c.optimizer.warmup_fraction = 0.01
  c.optimizer.decay = "linear"     # linear | polynomial | constant | wsd (warmup, plateau, decay)
  c.optimizer.decay_power = 1.0    # for polynomial decay
  c.optimizer.wsd_decay_fraction = 0.1  # wsd: the last fraction of total_steps that decays
  c.optimizer.wsd_decay_shape = "1-sqrt"  # wsd: 1-sqrt (lr falls as 1 - sqrt(done)) | linear
  c.optimizer.end_learning_rate_factor = 0.0
  c.optimizer.layerwise_lr_decay = 1.0
  # Weights of the encoder layers' kernels that are zero when the run starts (a magnitude-pruned
  # init_from: python -m bertjax.prune) stay exactly zero: their updates are masked.
  c.optimizer.keep_pruned = False
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
  """`base_config()` plus the settings GLUE, SQuAD and CoNLL fine-tuning share (BERT's recipe)."""
  c = base_config()
  # Used for random init only; with init_from the architecture comes from the checkpoint and
  # only dropout, dtype and remat are taken from here.
  c.model = model_config("bert-base")
  c.init_from = ""                 # converted checkpoint (convert from-hf) or pretraining workdir
  c.batch_size = 32
  c.pad_to_multiple_of = 32        # training batches cut to their longest row, rounded up to this (0: max_seq_length)
  c.best_mode = "max"
  c.checkpoint_every = 1000
  c.eval_batch_size = 0            # rows per prediction batch (0: the training micro-batch)
  c.eval_every = 0                 # steps between dev evals (0: once per epoch); also at the end
  c.log_every = 50
  c.optimizer.layerwise_lr_decay = 1.0  # ELECTRA's recipe: 0.8 (base) / 0.9 (large); 1.0 disables
  c.optimizer.name = "adamw"
  c.optimizer.warmup_fraction = 0.1  # BERT's 10% linear warmup
  c.optimizer.warmup_steps = -1    # -1: warmup_fraction of total_steps
  c.optimizer.weight_decay = 0.01
  c.seed = 0                       # data order, dropout and head init
  c.seeds = ()                     # one run per seed into WORKDIR/seed_<n> (empty: just `seed`)
  c.tfds_data_dir = ""             # where tfds finds built datasets (empty: tfds's default)
  c.keep_checkpoints = 1           # fine-tuning runs are short; the last checkpoint is what counts
  c.optimizer.decay = "linear"     # linear decay to 0 after warmup
  # A frozen encoder (README, "Frozen encoder and features"): no gradient, optimizer state or
  # update for frozen parameters; checkpoints still hold them all.
  c.freeze = ml_collections.ConfigDict()
  c.freeze.encoder = False         # train only the task head (and what the two keys below add)
  c.freeze.train_top_layers = 0    # with encoder=True: also train the top k layers (+ final LN, pooler)
  c.freeze.train_embeddings = False  # with encoder=True: also train the embeddings
  c.head = ml_collections.ConfigDict()
  # What the task head reads: standard (GLUE: the pooled [CLS]; tagging, QA: the last layer) |
  # last (the last layer) | concat (head.layers' hidden states side by side) | scalar_mix
  # (ELMo's learned softmax-weighted sum of head.layers' hidden states, times a learned scale).
  c.head.features = "standard"
  c.head.layers = (-4, -3, -2, -1) # hidden states for concat/scalar_mix: 0 embeddings, 1..L layers, <0 from the top
  c.head.pooling = "cls"           # sequence tasks with features != standard: cls ([CLS] row) | mean (real tokens)
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
