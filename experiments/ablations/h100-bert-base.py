"""bert-base at sequence 128, batch 256, 20 predictions (BERT's phase 1) on one GPU: every choice
the train step's speed was found to depend on, each in its own process, in one device window.

  python -m bertjax.tools.benchmark --ablate h100-bert-base --output h100-bert-base.md

The issue's starting table (H100, bf16, MLM+NSP, AdamW; tokens/s, at commit 297e3fb): default
414.6k; JAX_DEFAULT_PRNG_IMPL=rbg 429.6k; GPU set + flat_dense 427.5k; GPU set + layer_norm_vjp
440.8k; model.kernels=cpu 454.1k; attention dropout 0 and gather_last_layer off 459.7k; all
dropout 0 and gather_last_layer off 537.9k; the trainer (launch.py, data.synthetic, 120 steps)
381.6k; transformers + torch.compile 469k. The GPU set has since taken flat_dense, layer_norm_vjp
and rbg dropout draws from those figures; the "297e3fb GPU set" rows put the old choices back
with `model.kernel_overrides`, so the table can be reproduced and each change read off it.

The XLA flag rows, the dropout forms other than packed32+rbg, the Pallas attention-dropout kernel
and the remat rows are unmeasured choices until this set runs on a device.
"""

NO_ATTENTION_DROPOUT = ["model.attention_probs_dropout_prob=0.0"]
NO_DROPOUT = ["model.hidden_dropout_prob=0.0", "model.attention_probs_dropout_prob=0.0"]
NO_GATHER = ["model.gather_last_layer=False"]
# model.dropout_impl's forms (bertjax/models/dropout.py), each with XLA's RngBitGenerator draws;
# packed32+rbg is the GPU set's own and threefry packed32 the 297e3fb one.
DROPOUT_IMPLS = ("packed32", "mask32+rbg", "bits16+rbg", "recompute16+rbg", "packed32+unsafe_rbg")
OLD_GPU_SET = "flat_dense=False,layer_norm_vjp=False,dropout=packed32"

BASE = {
    "title": "bert-base, seq 128, batch 256, 20 predictions, bf16, MLM+NSP, AdamW",
    "preset": "bert-base", "batch_size": 256, "seq_len": 128, "dtype": "bfloat16", "steps": 20,
    "objective": "mlm_nsp", "overrides": ["max_predictions_per_seq=20"],
    "references": ["hf-torch", "hf-torch-compile"], "timeout": 600,
}

VARIANTS = [
    # The table (at 297e3fb), then today's GPU set.
    {"name": "297e3fb GPU set", "overrides": [f"model.kernel_overrides='{OLD_GPU_SET}'"]},
    {"name": "297e3fb GPU set, prng rbg", "env": {"JAX_DEFAULT_PRNG_IMPL": "rbg"},
     "overrides": [f"model.kernel_overrides='{OLD_GPU_SET}'"]},
    {"name": "297e3fb GPU set + flat_dense",
     "overrides": ["model.kernel_overrides='layer_norm_vjp=False,dropout=packed32'"]},
    {"name": "297e3fb GPU set + layer_norm_vjp",
     "overrides": ["model.kernel_overrides='flat_dense=False,dropout=packed32'"]},
    {"name": "default"},
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
