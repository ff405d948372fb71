"""bert-base at sequence 128, batch 256 (as h100-bert-base): the rows that set has no time for,
in a second 10-minute window.

  python -m bertjax.tools.benchmark --ablate h100-bert-base-more --output h100-bert-base-more.md

The fused residual kernel (bertjax/models/fused_residual.py), remat, scanned layers, command
buffers with cuBLAS, batch 128, the 297e3fb GPU set (its choices put back with
`model.kernel_overrides`) and FP8 projections with delayed scaling (`model.fp8`,
bertjax/models/fp8.py). Unmeasured until this set runs on a device. The dropout forms were
measured at dd89774 (within 2% of each other) and are left out.

Fits 10 minutes, estimated from the dd89774 window: 7 step variants compile ahead in two waves
(6, then 1; 45-140 s per variant, <= 280 s), the torch.compile reference about 90 s, each timed row
about 30 s (210 s): about 580 s; `budget` caps the run at 600 s (the last row is marked "not run"
if the window is slower than that).
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
    {"name": "remat dots", "remat": "dots"},
    {"name": "scan layers", "scan_layers": True},
    {"name": "command buffers fusion+cublas",
     "xla_flags": ["--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL"]},
    {"name": "batch 128", "batch_size": 128},
    {"name": "297e3fb GPU set",
     "overrides": [f"model.kernel_overrides.{k}={v!r}" for k, v in OLD_GPU_SET.items()]},
    # FP8 query/key/value/output/feed-forward products (Hopper's FP8 tensor cores; unmeasured).
    {"name": "fp8 projections", "overrides": ["model.fp8=True"]},
]
