"""ALBERT (Lan et al., 2019): factorized embeddings, cross-layer parameter sharing, masked LM with
n-gram masking + sentence order prediction; the published pretraining recipe.

  python launch.py --config configs/albert.py:size=base --workdir runs/albert_base \
      --config.data_dir=PREPARED
  python launch.py --config configs/albert.py:size=xxlarge --workdir runs/albert_xxlarge \
      --config.data_dir=PREPARED
  python launch.py --config configs/albert.py:runlocal --workdir runs/albert_local

PREPARED is a corpus from `python -m bertjax.data.prepare` (ALBERT: Wikipedia + BookCorpus, a
sentencepiece vocabulary of 30000). Variants:
  size=base|large|xlarge|xxlarge   LAMB lr 0.00176 with 3125 warmup steps, batch 4096, sequence
                                   512, 125k steps, n-grams of up to 3 words
  runlocal                         a tiny ALBERT on the WikiText-2 sample: minutes on a CPU
"""

from configs.common import base_config, choose, model_config, parse_variant, runlocal, LOCAL_MODEL

SIZES = {s: f"albert-{s}" for s in ("base", "large", "xlarge", "xxlarge")}


def get_config(arg=None):
  v = parse_variant(arg, "configs/albert.py", size="base", runlocal=False)
  c = base_config()
  c.objective = "mlm_sop"
  c.model = model_config(choose(v.size, SIZES, "ALBERT size"))
  c.max_seq_length, c.max_predictions_per_seq = 512, 20
  c.masking.rate = 0.15
  c.masking.max_ngram = 3
  c.batch_size, c.total_steps = 4096, 125_000
  c.learning_rate, c.optimizer.warmup_steps = 0.00176, 3125
  c.optimizer.name = "lamb"
  c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = 0.9, 0.999, 1e-6
  c.optimizer.weight_decay = 0.01
  c.optimizer.decay = "linear"
  c.log_every = 1000
  c.checkpoint_every = 10_000
  if v.runlocal:
    runlocal(c)
    c.model = model_config(SIZES[v.size], **{**LOCAL_MODEL, "embedding_size": 64})
    # LAMB's step is relative to each weight's norm, so a short run needs a larger rate.
    c.learning_rate = 2e-2
  return c
