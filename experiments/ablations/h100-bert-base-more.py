"""bert-base at sequence 128, batch 256 (as h100-bert-base): the rows that set has no time for,
in a second 10-minute window.

  python -m bertjax.tools.benchmark --ablate h100-bert-base-more --output h100-bert-base-more.md

The fused residual kernel (bertjax/models/fused_residual.py: the projection's bias, dropout,
residual add and LayerNorm in one kernel), the optimizer over one buffer per parameter group
(`optimizer.fused_update`: on a 2-core x86 CPU, 2026-11-28, bert-mini batch 16 compiles to 942
operations per step instead of 1093), FP8 projections with delayed scaling (`model.fp8`,
bertjax/models/fp8.py), remat, command buffers with cuBLAS and the 297e3fb GPU set (its choices
put back with `model.kernel_overrides`). Unmeasured until this set runs on a device. The dropout
forms were measured at dd89774 (within 2% of each other) and are left out; scanned layers and
batch 128 were moved out for the fused update and FP8 rows (run them as a spec of their own:
{"name": "scan layers", "scan_layers": True}, {"name": "batch 128", "batch_size": 128}). The XLA
scheduling rows (command buffers off, the latency-hiding scheduler) are in h100-bert-base.

Fits 10 minutes, estimated from the dd89774 window: 6 step variants compile ahead in one wave
of 6 (45-140 s per variant, <= 140 s), the torch.compile reference about 90 s, each timed row
about 30 s (180 s): about 410 s, 580 s if a second wave were needed; `budget` caps the run at 600 s (a slower
window marks its last rows "not run").
"""

OLD_GPU_SET = {"flat_dense": False, "layer_norm_vjp": False, "dropout": "packed32",
               "attention_dropout": "explicit"}

BASE = {
    "title": "bert-base, seq 128, batch 256, 20 predictions, bf16, MLM+NSP, AdamW (more rows)",
    "preset": "bert-base", "batch_size": 256, "seq_len": 128, "dtype": "bfloat16", "steps": 20,
    "objective": "mlm_nsp", "overrides": ["max_predictions_per_seq=20"],
    "references": ["hf-torch-compile"], "timeout": 400, "budget": 600,
}

VARIANTS = [
    {"name": "fused residual kernel",
     "overrides": ["model.kernel_overrides.fused_residual=True"]},
    {"name": "fused optimizer update", "overrides": ["optimizer.fused_update=True"]},
    {"name": "remat dots", "remat": "dots"},
    {"name": "command buffers fusion+cublas",
     "xla_flags": ["--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL"]},
    {"name": "297e3fb GPU set",
     "overrides": [f"model.kernel_overrides.{k}={v!r}" for k, v in OLD_GPU_SET.items()]},
    # FP8 query/key/value/output/feed-forward products (Hopper's FP8 tensor cores; unmeasured).
    {"name": "fp8 projections", "overrides": ["model.fp8=True"]},
]
