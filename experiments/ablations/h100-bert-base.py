"""bert-base at sequence 128, batch 256, 20 predictions (BERT's phase 1) on one GPU: every choice
the train step's speed was found to depend on, each in its own process, in one device window.

  python -m bertjax.benchmark --ablate h100-bert-base --output h100-bert-base.md

The issue's starting table (H100, bf16, MLM+NSP, AdamW; tokens/s): default 414.6k;
JAX_DEFAULT_PRNG_IMPL=rbg 429.6k; model.kernels=cpu 454.1k; attention dropout 0 and
gather_last_layer off 459.7k; all dropout 0 and gather_last_layer off 537.9k; the trainer
(launch.py, data.synthetic, 120 steps) 381.6k; transformers + torch.compile 469k. Its "GPU set +
flat_dense" (427.5k) and "GPU set + layer_norm_vjp" (440.8k) rows have no setting of their own
(the kernel set's fields are not config keys), so they are not repeated here.

Rows whose settings are being added elsewhere (model.dropout_impl, model.attention_dropout_kernel)
are passed through as overrides: until the setting exists, the row reports the unknown key. The
XLA flag rows are unmeasured choices.
"""

NO_ATTENTION_DROPOUT = ["model.attention_probs_dropout_prob=0.0"]
NO_DROPOUT = ["model.hidden_dropout_prob=0.0", "model.attention_probs_dropout_prob=0.0"]
NO_GATHER = ["model.gather_last_layer=False"]
# The values model.dropout_impl is to take; adjust to the setting's declared choices.
DROPOUT_IMPLS = ("threefry", "rbg")

BASE = {
    "title": "bert-base, seq 128, batch 256, 20 predictions, bf16, MLM+NSP, AdamW",
    "preset": "bert-base", "batch_size": 256, "seq_len": 128, "dtype": "bfloat16", "steps": 20,
    "objective": "mlm_nsp", "overrides": ["max_predictions_per_seq=20"],
    "references": ["hf-torch", "hf-torch-compile"], "timeout": 600,
}

VARIANTS = [
    # The table.
    {"name": "default"},
    {"name": "prng rbg", "env": {"JAX_DEFAULT_PRNG_IMPL": "rbg"}},
    {"name": "kernels cpu", "overrides": ["model.kernels='cpu'"]},
    {"name": "attention dropout 0, no gather",
     "overrides": NO_ATTENTION_DROPOUT + NO_GATHER},
    {"name": "dropout 0, no gather", "overrides": NO_DROPOUT + NO_GATHER},
    {"name": "trainer", "kind": "trainer", "trainer_steps": 120, "timeout": 900},
    # Kernel sets.
    {"name": "kernels gpu", "overrides": ["model.kernels='gpu'"]},
    {"name": "kernels tpu", "overrides": ["model.kernels='tpu'"]},
    # Dropout: on/off, where, and how its bits are drawn.
    {"name": "attention dropout 0", "overrides": NO_ATTENTION_DROPOUT},
    {"name": "dropout 0", "overrides": NO_DROPOUT},
    *({"name": f"dropout impl {impl}", "overrides": [f"model.dropout_impl='{impl}'"]}
      for impl in DROPOUT_IMPLS),
    {"name": "dropout impl rbg, prng rbg", "overrides": ["model.dropout_impl='rbg'"],
     "env": {"JAX_DEFAULT_PRNG_IMPL": "rbg"}},
    {"name": "attention dropout pallas",
     "overrides": ["model.attention_dropout_kernel='pallas'"]},
    # Memory for speed.
    {"name": "remat full", "remat": "full"},
    {"name": "remat dots", "remat": "dots"},
    {"name": "scan layers", "scan_layers": True},
    # XLA:GPU scheduling (unmeasured).
    {"name": "command buffers off", "xla_flags": ["--xla_gpu_enable_command_buffer="]},
    {"name": "command buffers fusion+cublas",
     "xla_flags": ["--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL"]},
    {"name": "latency-hiding scheduler",
     "xla_flags": ["--xla_gpu_enable_latency_hiding_scheduler=true"]},
    # Batch.
    {"name": "batch 128", "batch_size": 128},
    {"name": "batch 128, dropout 0", "batch_size": 128, "overrides": NO_DROPOUT},
    {"name": "trainer, dropout 0", "kind": "trainer", "trainer_steps": 120, "timeout": 900,
     "overrides": NO_DROPOUT},
]
