"""Quickstart: a tiny BERT pretrained with MLM+NSP on the WikiText-2 sample shipped in the repo.

  python launch.py --config configs/quickstart.py --workdir runs/quickstart
  python launch.py --config configs/quickstart.py --workdir runs/qs_rtd --config.objective=rtd

At first run a sentencepiece tokenizer is trained on the sample and the corpus is tokenized into
WORKDIR/prepared; later runs (and resumes) reuse both. Finishes in a few minutes on 2 CPU cores.
Variant `runlocal` shrinks it further for tests.
"""

import pathlib

from bertjax.core.errors import fail
from configs.common import base_config, model_config

SAMPLE = pathlib.Path(__file__).resolve().parent.parent / "bertjax/data/samples/wikitext2_test.raw"


def get_config(arg=None):
  c = base_config()
  vocab = 4000
  c.objective = "mlm_nsp"
  c.model = model_config("bert-tiny", vocab_size=vocab, max_position_embeddings=128,
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  c.total_steps = 300
  c.batch_size = 32
  c.learning_rate = 1e-3
  c.max_seq_length = 128
  c.max_predictions_per_seq = 20
  c.log_every = 25
  c.eval_every = 100
  c.checkpoint_every = 100
  c.optimizer.warmup_steps = 30
  c.data.corpus = str(SAMPLE)
  c.data.format = "wikitext"
  c.data.vocab_size = vocab
  c.data.eval_documents = 6
  c.data.eval_batches = 4
  if arg == "runlocal":
    c.total_steps = 20
    c.batch_size = 8
    c.max_seq_length = 64
    c.max_predictions_per_seq = 10
    c.log_every = 5
    c.eval_every = 10
    c.checkpoint_every = 10
    c.data.eval_batches = 1
  elif arg:
    fail(f"unknown quickstart variant {arg!r}; use configs/quickstart.py:runlocal or no variant")
  return c
