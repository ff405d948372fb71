"""bert-base at sequence 128, batch 256, 20 predictions (BERT's phase 1) on one GPU: the rows that
decide the GPU set's defaults, in one 10-minute device window.

  python -m bertjax.tools.benchmark --ablate h100-bert-base --output h100-bert-base.md

The figures this set starts from (one H200, jax 0.11.2, commit dd89774, tokens/s): the GPU set
with the explicit attention-dropout path 492.3k; with the Pallas attention-dropout kernel 549.2k
(now the GPU set's default); attention dropout 0 559.8k; all dropout 0 618.0k; model.kernels=cpu
507.1k; transformers + torch.compile 502.2k. The rows this set drops for time (the 297e3fb
choices, the dropout forms, remat, scan, batch 128) are in h100-bert-base-more.

Fits 10 minutes, estimated from that window: compiling one variant took 45-140 s, and the 7 step
variants plus the trainer compile ahead in two waves of 6 (<= 280 s); the two references take
about 40 s (eager) and 90 s (torch.compile); each timed row then starts from the cache, times 20
steps and profiles 3, about 30 s, 8 rows 240 s: about 610 s in the worst case, so `budget` caps
the run at 600 s (the last rows are marked "not run" if the window is slower than that).
"""

NO_ATTENTION_DROPOUT = ["model.attention_probs_dropout_prob=0.0"]
NO_DROPOUT = ["model.hidden_dropout_prob=0.0", "model.attention_probs_dropout_prob=0.0"]

BASE = {
    "title": "bert-base, seq 128, batch 256, 20 predictions, bf16, MLM+NSP, AdamW",
    "preset": "bert-base", "batch_size": 256, "seq_len": 128, "dtype": "bfloat16", "steps": 20,
    "objective": "mlm_nsp", "overrides": ["max_predictions_per_seq=20"],
    "references": ["hf-torch", "hf-torch-compile"], "timeout": 400, "budget": 600,
}

VARIANTS = [
    {"name": "default"},
    {"name": "attention dropout explicit",
     "overrides": ["model.attention_dropout_kernel='explicit'"]},
    {"name": "attention dropout 0", "overrides": NO_ATTENTION_DROPOUT},
    {"name": "dropout 0", "overrides": NO_DROPOUT},
    {"name": "trainer", "kind": "trainer", "trainer_steps": 120},
    {"name": "kernels cpu", "overrides": ["model.kernels='cpu'"]},
    # XLA:GPU scheduling (unmeasured).
    {"name": "command buffers off", "xla_flags": ["--xla_gpu_enable_command_buffer="]},
    {"name": "latency-hiding scheduler",
     "xla_flags": ["--xla_gpu_enable_latency_hiding_scheduler=true"]},
]
