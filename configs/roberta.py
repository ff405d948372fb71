"""RoBERTa (Liu et al., 2019): masked LM only, dynamic masking, full-length segments that cross
document boundaries, large batches; the published pretraining recipe.

  python launch.py --config configs/roberta.py:size=base --workdir runs/roberta_base \
      --config.data_dir=PREPARED
  python launch.py --config configs/roberta.py:size=large --workdir runs/roberta_large \
      --config.data_dir=PREPARED
  python launch.py --config configs/roberta.py:runlocal --workdir runs/roberta_local

PREPARED is a corpus from `python -m bertjax.data.prepare` tokenized with RoBERTa's byte-level BPE
(50265 tokens, <pad> = 1, which the model's position numbering relies on). Variants:
  size=base|large   Adam (b2 0.98, eps 1e-6), batch 8K, sequence 512, 500k steps; peak lr 6e-4
                    (base) / 4e-4 (large) after 24k / 30k warmup steps, linear decay
  runlocal          a tiny RoBERTa on the WikiText-2 sample shipped in the repo: minutes on a CPU
"""

from configs.common import base_config, choose, model_config, parse_variant, runlocal, LOCAL_MODEL

# size -> (preset, peak learning rate, warmup steps), from the paper's Table 9.
SIZES = {"base": ("roberta-base", 6e-4, 24_000), "large": ("roberta-large", 4e-4, 30_000)}


def get_config(arg=None):
  v = parse_variant(arg, "configs/roberta.py", size="base", runlocal=False)
  preset, lr, warmup = choose(v.size, SIZES, "RoBERTa size")
  c = base_config()
  c.objective = "mlm"
  c.model = model_config(preset)
  c.max_seq_length, c.max_predictions_per_seq = 512, 80
  c.masking.rate = 0.15
  c.batch_size, c.total_steps = 8192, 500_000
  c.learning_rate, c.optimizer.warmup_steps = lr, warmup
  c.optimizer.name = "adamw"
  c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = 0.9, 0.98, 1e-6
  c.optimizer.weight_decay = 0.01
  c.optimizer.grad_clip_norm = 0.0  # the paper trains without clipping
  c.optimizer.decay = "linear"
  c.log_every = 1000
  c.checkpoint_every = 10_000
  if v.runlocal:
    runlocal(c)
    # The sentencepiece tokenizer trained locally pads with id 0, so positions count from 1.
    c.model = model_config(preset, **LOCAL_MODEL, pad_token_id=0)
    c.learning_rate = 2e-3
  return c
