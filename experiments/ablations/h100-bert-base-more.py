"""bert-base at sequence 128, batch 256 (as h100-bert-base): the rows that set has no time for.

  python -m bertjax.tools.benchmark --ablate h100-bert-base-more --output h100-bert-base-more.md

The 297e3fb GPU set's choices put back one by one (`model.kernel_overrides`), the dropout forms,
the TPU set, remat, scanned layers, command buffers with cuBLAS, and batch 128. Unmeasured until
this set runs on a device. 12 step variants compile ahead in two waves of 6 (<= 280 s, the
dd89774 window's 45-140 s per variant) and time in about 30 s each (360 s) after the references
(about 130 s): about 770 s in the worst case, more than one 10-minute window, so `budget` caps it
at 600 s and the rows are in the order they matter (the last ones may be "not run").
"""

NO_DROPOUT = ["model.hidden_dropout_prob=0.0", "model.attention_probs_dropout_prob=0.0"]
OLD_GPU_SET = "flat_dense=False,layer_norm_vjp=False,dropout=packed32,attention_dropout=explicit"
DROPOUT_IMPLS = ("packed32", "bits16+rbg", "recompute16+rbg")

BASE = {
    "title": "bert-base, seq 128, batch 256, 20 predictions, bf16, MLM+NSP, AdamW (more rows)",
    "preset": "bert-base", "batch_size": 256, "seq_len": 128, "dtype": "bfloat16", "steps": 20,
    "objective": "mlm_nsp", "overrides": ["max_predictions_per_seq=20"],
    "references": ["hf-torch-compile"], "timeout": 400, "budget": 600,
}

VARIANTS = [
    {"name": "remat dots", "remat": "dots"},
    {"name": "scan layers", "scan_layers": True},
    {"name": "command buffers fusion+cublas",
     "xla_flags": ["--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL"]},
    {"name": "batch 128", "batch_size": 128},
    {"name": "kernels tpu", "overrides": ["model.kernels='tpu'"]},
    *({"name": f"dropout impl {impl}", "overrides": [f"model.dropout_impl='{impl}'"]}
      for impl in DROPOUT_IMPLS),
    {"name": "297e3fb GPU set", "overrides": [f"model.kernel_overrides='{OLD_GPU_SET}'"]},
    {"name": "remat full", "remat": "full"},
    {"name": "batch 128, dropout 0", "batch_size": 128, "overrides": NO_DROPOUT},
    {"name": "kernels stock", "overrides": ["model.kernels='stock'"]},
]
