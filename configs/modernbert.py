"""ModernBERT (Warner et al., 2024, "Smarter, Better, Faster, Longer"): its pretraining recipe.

  python launch.py --config configs/modernbert.py --workdir runs/modernbert_base \
      --config.data_dir=PREPARED
  python launch.py --config configs/modernbert.py:runlocal --workdir runs/modernbert_local

The model is modernbert-base (22 layers, hidden 768; every third layer global, the others a
128-token window; `--config.model.<field>=...` overrides it); runlocal trains modernbert-tiny
(3 layers, hidden 128, a 16-token window) on the WikiText-2 sample shipped in the repo: its 200
steps took 65 s of CPU time on a 2-core machine (measured; train loss 7.8 at step 20, eval
loss 6.5 at step 200).

The training recipe of the paper's base model (its 1024-token pretraining phase):
  masking      30% of the tokens (mlm), dynamic;
  data         sequence packing: whole documents ([CLS] text [SEP], split to fit), several to a
               row, each attending only to itself (data.kind=single, data.pack);
  optimizer    StableAdamW (AdamW with per-tensor update clipping), lr 8e-4, betas 0.9/0.98,
               eps 1e-6, weight decay 1e-5 fully decoupled from the learning rate (optimi's
               decouple_lr, ModernBERT's decoupled_stableadamw), none on biases and norms, no
               gradient clipping;
  schedule     warmup-stable-decay: 3B tokens of warmup, the peak, then a 1-sqrt decay (here
               over the last 50B tokens, the length of the paper's final decay phase);
  batch        4608 rows of 1024 tokens (48 micro-batches of 96), warmed up from 768 rows
               (8 micro-batches) over the first 50B tokens.
bertjax schedules count steps: the token counts above become steps at the batch sizes the batch
warmup gives (`_steps_for`). Not here: the context-extension phases (8192 tokens, global RoPE
theta 160k) and the paper's separate decay phase, which would each be a config resuming this
one's workdir.
"""

from bertjax.data import batch_warmup
from configs.common import LOCAL_VOCAB, base_config, model_config, parse_variant, runlocal

SEQ, BATCH, MICRO, START = 1024, 4608, 96, 768  # tokens per row; rows: global, micro, first


def _steps_for(tokens: int, accum: int, start: int, micro_tokens: int, warmup_tokens: int) -> int:
  """Steps until `tokens` are trained, the batch warmup's smaller steps counted."""
  counts = batch_warmup.micro_batches_per_step(accum, start, micro_tokens, warmup_tokens)
  seen = 0
  for step, k in enumerate(counts):
    if seen >= tokens:
      return step
    seen += k * micro_tokens
  return len(counts) + -(-max(tokens - seen, 0) // (accum * micro_tokens))


def get_config(arg=None):
  v = parse_variant(arg, "configs/modernbert.py", runlocal=False)
  c = base_config()
  c.objective = "mlm"
  c.model = model_config("modernbert-base")
  c.max_seq_length, c.max_predictions_per_seq = SEQ, 320  # 30% of 1024 is 307
  c.masking.rate = 0.3
  # Packed documents: each [CLS] document [SEP] (split to fit), several per row, attending only
  # within themselves (segment ids).
  c.data.kind, c.data.pack, c.data.short_seq_prob = "single", True, 0.0
  c.batch_size, c.grad_accum_steps = BATCH, BATCH // MICRO
  c.batch_warmup_start, c.batch_warmup_tokens = START // MICRO, 50 * 10**9
  c.learning_rate = 8e-4
  c.optimizer.name = "stableadamw"
  c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = 0.9, 0.98, 1e-6
  c.optimizer.weight_decay, c.optimizer.fully_decoupled_weight_decay = 1e-5, True
  c.optimizer.grad_clip_norm = 0.0  # the update clipping replaces it
  c.optimizer.decay, c.optimizer.wsd_decay_shape = "wsd", "1-sqrt"
  c.optimizer.end_learning_rate_factor = 0.0
  steps = lambda tokens: _steps_for(tokens, c.grad_accum_steps, c.batch_warmup_start,
                                    MICRO * SEQ, c.batch_warmup_tokens)
  c.total_steps = steps(1_719 * 10**9)
  c.optimizer.warmup_steps = steps(3 * 10**9)
  c.optimizer.wsd_decay_fraction = (c.total_steps - steps(1_669 * 10**9)) / c.total_steps
  c.log_every = 1000
  c.checkpoint_every = 10_000
  if v.runlocal:
    runlocal(c)
    # ModernBERT's tiny shape (3 layers: one global, two local) on the sample's vocabulary; a
    # 16-token window, so the 64-token rows reach past it and the local layers matter.
    c.model = model_config("modernbert-tiny", vocab_size=LOCAL_VOCAB, pad_token_id=0,
                           max_position_embeddings=128, local_attention=16)
    c.max_predictions_per_seq = 20  # 30% of 64
    c.grad_accum_steps, c.batch_warmup_start, c.batch_warmup_tokens = 4, 1, 20 * 16 * 64
    c.learning_rate = 2e-3
    c.optimizer.wsd_decay_fraction = 0.2
  return c
