"""GLUE fine-tuning with BERT's published recipe (lr 2e-5, batch 32, 3 epochs, 10% warmup).

  python launch.py --config configs/glue.py:task=rte --workdir runs/rte \
      --config.init_from=runs/bert-base-uncased --config.data_dir=~/glue_data
  python launch.py --config configs/glue.py:task=mnli --workdir runs/mnli \
      --config.init_from=runs/bert-base-uncased            # tfds glue/mnli, built locally
  python launch.py --config configs/glue.py:task=sst2,runlocal --workdir /tmp/sst2

`init_from` is a folder from `python -m bertjax.convert from-hf` or a pretraining workdir: the
encoder is restored from it, the classifier starts fresh, and its tokenizer is used. Several
seeds in one command (the usual way to report small GLUE tasks): `--config.seeds='(1,2,3,4,5)'`
runs each into WORKDIR/seed_<n> and writes WORKDIR/seeds_summary.json.

A frozen encoder (only the classifier trains; README, "Frozen encoder"): add
`--config.freeze.encoder=True`, optionally `--config.freeze.train_top_layers=2`, and a
feature-based head with `--config.head.features=concat --config.head.pooling=mean` (the last
four layers' hidden states, averaged over the real tokens) or `scalar_mix`.

Variant `runlocal`: a tiny random-init model, a sentencepiece tokenizer trained on the task's
own text, 512 training examples for 8 epochs from the local GLUE copy (BERTJAX_DATA or
../shared/data): a smoke test of well under a minute on a laptop CPU (SST-2: dev accuracy ~0.6).
"""

from bertjax.tasks.base import shared_data_dir
from bertjax.tasks.glue import TASKS
from configs.common import finetune_config, model_config, parse_variant


def get_config(arg=None):
  v = parse_variant(arg, "configs/glue.py", {"task": TASKS}, task="rte", runlocal=False)
  c = finetune_config()
  c.objective = "glue"
  c.task = v.task  # cola | sst2 | mrpc | stsb | qqp | mnli | qnli | rte | wnli
  c.data_dir = ""                  # GLUE tsv: glue_data/ or glue_data/<TASK>/; empty: tfds
  c.max_seq_length = 128           # [CLS] A [SEP] B [SEP]; the longer sentence is truncated first
  c.learning_rate = 2e-5           # BERT picks 2e-5..5e-5 on dev; 2e-5 is its safest choice
  c.num_epochs = 3.0               # converted to total_steps from the train set size at run time
  c.total_steps = 0                # 0: num_epochs * train examples / batch_size
  c.max_train_examples = 0         # use only the first N training examples (0: all)
  c.best_metric = "score"          # GLUE score (mean of the task's metrics); best in WORKDIR/best
  if v.runlocal:
    vocab = 2000
    c.model = model_config("bert-tiny", vocab_size=vocab, hidden_size=64, intermediate_size=128,
                           max_position_embeddings=128, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0)
    c.data.vocab_size = vocab      # sentencepiece trained on the task's training text
    c.data_dir = shared_data_dir("glue")
    c.max_seq_length = 64
    c.batch_size = 16
    c.learning_rate = 1e-3
    c.num_epochs = 8.0
    c.max_train_examples = 512
    c.log_every = 20
    c.tensorboard = False
  return c
