"""bert-large at sequence 512, batch 32, 80 predictions (BERT's phase 2): dropout and remat.

  python -m bertjax.tools.benchmark --ablate bert-large-512 --output bert-large-512.md

The starting figures (H100, bf16; the issue's table): default 107.5k tokens/s, all dropout 0
169.9k, transformers + torch.compile 157.9k at 22.7 GiB. Compiling bert-large takes about 90 s
on the H100, hence the longer timeout.
"""

NO_DROPOUT = ["model.hidden_dropout_prob=0.0", "model.attention_probs_dropout_prob=0.0"]

BASE = {
    "title": "bert-large, seq 512, batch 32, 80 predictions, bf16",
    "preset": "bert-large", "batch_size": 32, "seq_len": 512, "dtype": "bfloat16", "steps": 20,
    "overrides": ["max_predictions_per_seq=80"],
    "references": ["hf-torch", "hf-torch-compile"], "timeout": 900,
}

VARIANTS = [
    {"name": "default (dropout 0.1)"},
    {"name": "attention dropout 0", "overrides": ["model.attention_probs_dropout_prob=0.0"]},
    {"name": "dropout 0", "overrides": NO_DROPOUT},
    {"name": "remat full", "remat": "full"},
    {"name": "remat dots", "remat": "dots"},
    {"name": "dropout 0, remat dots", "remat": "dots", "overrides": NO_DROPOUT},
    {"name": "batch 64, remat dots", "batch_size": 64, "remat": "dots"},
    {"name": "attention dropout pallas", "overrides": ["model.attention_dropout_kernel='pallas'"]},
    {"name": "attention dropout pallas, remat dots", "remat": "dots",
     "overrides": ["model.attention_dropout_kernel='pallas'"]},
]
