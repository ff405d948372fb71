"""bert-large at sequence 512, batch 32, 80 predictions (BERT's phase 2): dropout, remat and FP8
projections, in one 10-minute device window.

  python -m bertjax.tools.benchmark --ablate bert-large-512 --output bert-large-512.md

The starting figures (H100, bf16, commit 297e3fb): default 107.5k tokens/s (then with the explicit
attention-dropout path; the GPU set now takes the Pallas kernel), all dropout 0 169.9k,
transformers + torch.compile 157.9k at 22.7 GiB.

Fits 10 minutes, estimated: compiling bert-large took about 90 s on the H100 (bert-base 45-140 s
on the H200), so the 6 variants compile ahead in one wave of 6 (<= 180 s); the torch.compile
reference about 120 s; each timed row about 40 s (start from the cache, 20 steps of about 0.1 s,
a 3-step profile), 240 s: about 540 s; `budget` caps it at 600 s. The eager reference is left
out for time (`references`), and so is batch 64 with remat dots (its place is the FP8 row's: a
seventh variant would need a second compile wave).
"""

NO_DROPOUT = ["model.hidden_dropout_prob=0.0", "model.attention_probs_dropout_prob=0.0"]

BASE = {
    "title": "bert-large, seq 512, batch 32, 80 predictions, bf16",
    "preset": "bert-large", "batch_size": 32, "seq_len": 512, "dtype": "bfloat16", "steps": 20,
    "overrides": ["max_predictions_per_seq=80"],
    "references": ["hf-torch-compile"], "timeout": 500, "budget": 600,
}

VARIANTS = [
    {"name": "default (dropout 0.1)"},
    {"name": "attention dropout explicit",
     "overrides": ["model.attention_dropout_kernel='explicit'"]},
    {"name": "attention dropout 0", "overrides": ["model.attention_probs_dropout_prob=0.0"]},
    {"name": "dropout 0", "overrides": NO_DROPOUT},
    {"name": "remat dots", "remat": "dots"},
    # FP8 query/key/value/output/feed-forward products, delayed scaling (model.fp8; unmeasured):
    # the MLPerf BERT-large recipe's matmuls.
    {"name": "fp8 projections", "overrides": ["model.fp8=True"]},
]
