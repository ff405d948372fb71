"""SpanBERT (Joshi et al., 2019): masked LM over contiguous whole-word spans plus the span
boundary objective, on single segments without next sentence prediction; the published recipe.

  python launch.py --config configs/spanbert.py:size=base --workdir runs/spanbert_base \
      --config.data_dir=PREPARED
  python launch.py --config configs/spanbert.py:size=large --workdir runs/spanbert_large \
      --config.data_dir=PREPARED
  python launch.py --config configs/spanbert.py:runlocal --workdir runs/spanbert_local

PREPARED is a corpus from `python -m bertjax.data.prepare` (SpanBERT: Wikipedia + BookCorpus with
BERT's cased WordPiece vocabulary of 28996). Variants:
  size=base|large   AdamW lr 1e-4 with 10k warmup steps, linear decay, batch 256, sequence 512,
                    2.4M steps; spans ~ Geometric(0.2) clipped at 10 words, 15% of the tokens
  runlocal          a tiny SpanBERT on the WikiText-2 sample: minutes on a CPU
"""

from configs.common import base_config, choose, model_config, parse_variant, runlocal, LOCAL_MODEL

SIZES = {"base": "spanbert-base", "large": "spanbert-large"}


def get_config(arg=None):
  v = parse_variant(arg, "configs/spanbert.py", size="base", runlocal=False)
  c = base_config()
  c.objective = "span_sbo"
  c.model = model_config(choose(v.size, SIZES, "SpanBERT size"))
  c.max_seq_length, c.max_predictions_per_seq = 512, 80
  c.masking.strategy = "span"
  c.masking.rate = 0.15
  c.masking.span_p, c.masking.span_max = 0.2, 10
  c.batch_size, c.total_steps = 256, 2_400_000
  c.learning_rate, c.optimizer.warmup_steps = 1e-4, 10_000
  c.optimizer.name = "adamw"
  c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = 0.9, 0.999, 1e-8
  c.optimizer.weight_decay = 0.01
  c.optimizer.decay = "linear"
  c.log_every = 1000
  c.checkpoint_every = 10_000
  if v.runlocal:
    runlocal(c)
    c.model = model_config(SIZES[v.size], **LOCAL_MODEL)
    c.learning_rate = 2e-3
  return c
