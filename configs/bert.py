"""BERT (Devlin et al., 2018): masked LM + next sentence prediction, with its published recipes.

  python launch.py --config configs/bert.py:size=base --workdir runs/bert_base \
      --config.data_dir=PREPARED
  python launch.py --config configs/bert.py:size=base,seq512 --workdir runs/bert_base_512 \
      --config.data_dir=PREPARED --config.init_from=runs/bert_base
  python launch.py --config configs/bert.py:size=large,lamb --workdir runs/bert_large_lamb \
      --config.data_dir=PREPARED
  python launch.py --config configs/bert.py:runlocal --workdir runs/bert_local

PREPARED is a corpus from `python -m bertjax.data.prepare` (BERT: Wikipedia + BookCorpus, one
sentence per line, WordPiece vocabulary of 30522). Variants, comma-separated:
  size=tiny|mini|small|medium|base|large   the released shapes (default base)
  (none)    Adam(W) recipe, phase 1: sequence 128, batch 256, lr 1e-4 with 10k warmup steps,
            900k steps (90% of the paper's 1M)
  seq512    phase 2: sequence 512 for the last 100k steps; start it from phase 1 (init_from)
  lamb      "Large Batch Optimization for Deep Learning" (You et al., 2019): LAMB with batch
            65536 at sequence 128 for 7037 steps, then (with seq512) 32768 at 512 for 1562
  runlocal  a tiny BERT on the WikiText-2 sample shipped in the repo: minutes on a CPU
"""

from configs.common import base_config, choose, model_config, parse_variant, runlocal, LOCAL_MODEL

SIZES = {s: f"bert-{s}" for s in ("tiny", "mini", "small", "medium", "base", "large")}


def get_config(arg=None):
  v = parse_variant(arg, "configs/bert.py", size="base", seq512=False, lamb=False, runlocal=False)
  c = base_config()
  c.objective = "mlm_nsp"
  c.model = model_config(choose(v.size, SIZES, "BERT size"))
  c.masking.rate = 0.15
  c.optimizer.name = "adamw"
  c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = 0.9, 0.999, 1e-6
  c.optimizer.weight_decay = 0.01
  c.optimizer.decay = "linear"
  if not v.seq512:
    c.max_seq_length, c.max_predictions_per_seq = 128, 20
    c.batch_size, c.total_steps = 256, 900_000
    c.learning_rate, c.optimizer.warmup_steps = 1e-4, 10_000
  else:
    c.max_seq_length, c.max_predictions_per_seq = 512, 80
    c.batch_size, c.total_steps = 256, 100_000
    # Where the paper's single 1M-step linear decay stands at step 900k; it decays on to 0.
    c.learning_rate, c.optimizer.warmup_steps = 1e-5, 0
  if v.lamb:
    c.optimizer.name = "lamb"
    # The paper scales LAMB's learning rate with the square root of the batch (5e-3 at 32K);
    # warmup fractions as NVIDIA's reproduction of the 64K/32K run (28.4% and 12.8%).
    if not v.seq512:
      c.batch_size, c.total_steps = 65536, 7037
      c.learning_rate, c.optimizer.warmup_steps = 5e-3 * 2 ** 0.5, 2000
    else:
      c.batch_size, c.total_steps = 32768, 1562
      c.learning_rate, c.optimizer.warmup_steps = 5e-3, 200
  c.log_every = 1000
  c.checkpoint_every = 10_000
  if v.runlocal:
    runlocal(c)
    c.model = model_config("bert-tiny", **LOCAL_MODEL)
    c.learning_rate = 2e-2 if v.lamb else 2e-3
  return c
