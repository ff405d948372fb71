"""ELECTRA (Clark et al., 2020): replaced token detection; a small masked-LM generator, sharing the
discriminator's embeddings, corrupts the input; the published pretraining recipes.

  python launch.py --config configs/electra.py:size=small --workdir runs/electra_small \
      --config.data_dir=PREPARED
  python launch.py --config configs/electra.py:size=base --workdir runs/electra_base \
      --config.data_dir=PREPARED
  python launch.py --config configs/electra.py:size=small,runlocal --workdir runs/electra_local

PREPARED is a corpus from `python -m bertjax.data.prepare` (ELECTRA: Wikipedia + BookCorpus,
BERT's uncased WordPiece vocabulary of 30522). Variants (the paper's Table 6):
  size=small   generator 1/4 wide, lr 5e-4, batch 128, sequence 128, 1M steps
  size=base    generator 1/3 wide, lr 2e-4, batch 256, sequence 512, 766k steps
  size=large   generator 1/4 wide, lr 2e-4, batch 2048, sequence 512, 400k steps, 25% masked
  runlocal     a tiny ELECTRA on the WikiText-2 sample, 200 steps: about a minute on 2 CPU cores
All: Adam (eps 1e-6, weight decay 0.01) with 10k warmup steps and linear decay, loss = generator
MLM + 50 x discriminator, 85% [MASK] / 15% unchanged at the selected positions.

runlocal selects half the tokens (32 of 64) at a constant lr 5e-4, and its discriminator passes
always answering "original" within the 200 steps (eval at step 200: accuracy about 0.70 against
0.50, recall about 0.8; tests/test_local_recipes.py). Its generator is still weak there (MLM
accuracy about 0.05), so what the discriminator detects is mostly implausible tokens; as the
generator improves the margin narrows (0.57 against 0.51 at step 600). At the sizes' 15% (lr 2e-3,
linear decay: this variant's earlier setting) the discriminator sat at the prior for all 200
steps (accuracy equal to always "original", recall 0), and at 25% with lr 5e-4 it was within 0.002
of it at step 600: a token is predicted replaced only once it is more likely replaced than not,
which at a low rate takes context that a tiny model learns slowly from WikiText.
configs/context_check.py:objective=rtd uses the same lower, constant lr.
"""

from configs.common import base_config, choose, model_config, parse_variant, runlocal, LOCAL_MODEL

# size -> preset, generator fraction, lr, batch, sequence, predictions, steps, mask rate.
SIZES = {
    "small": ("electra-small", 1 / 4, 5e-4, 128, 128, 20, 1_000_000, 0.15),
    "base": ("electra-base", 1 / 3, 2e-4, 256, 512, 80, 766_000, 0.15),
    "large": ("electra-large", 1 / 4, 2e-4, 2048, 512, 128, 400_000, 0.25),
}


def get_config(arg=None):
  v = parse_variant(arg, "configs/electra.py", size="small", runlocal=False)
  preset, fraction, lr, batch, seq, predictions, steps, rate = choose(v.size, SIZES,
                                                                      "ELECTRA size")
  c = base_config()
  c.objective = "rtd"
  c.model = model_config(preset)
  c.electra.generator_hidden_fraction = fraction
  c.electra.generator_layer_fraction = 1.0
  c.electra.disc_weight = 50.0
  c.masking.rate = rate
  c.max_seq_length, c.max_predictions_per_seq = seq, predictions
  c.batch_size, c.total_steps = batch, steps
  c.learning_rate, c.optimizer.warmup_steps = lr, 10_000
  c.optimizer.name = "adamw"
  c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = 0.9, 0.999, 1e-6
  c.optimizer.weight_decay = 0.01
  c.optimizer.decay = "linear"
  c.log_every = 1000
  c.checkpoint_every = 10_000
  if v.runlocal:
    runlocal(c)
    # ELECTRA-small's factorized embeddings, at bert-tiny width; the generator keeps the size's
    # fraction but at least 2 heads' worth, so it still splits across a tensor-parallel mesh.
    c.model = model_config(preset, **{**LOCAL_MODEL, "embedding_size": 64})
    c.electra.generator_hidden_fraction = max(fraction, 0.5)
    # Half the tokens selected at a constant lr 5e-4: the discriminator separates from always
    # "original" within the 200 steps (the module docstring; 15% at lr 2e-3 stays at the prior).
    c.masking.rate = 0.5
    c.max_predictions_per_seq = 32
    c.learning_rate = 5e-4
    c.optimizer.decay = "constant"
  return c
