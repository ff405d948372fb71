"""ModernBERT-base at sequence 1024, batch 32, 154 predictions (15% of 1024), bf16, MLM, in one
10-minute device window.

  python -m bertjax.tools.benchmark --ablate modernbert-base-1024 --output modernbert-base-1024.md

The starting figures (one H200, jax 0.11.2, commit dd89774): transformers ModernBertForMaskedLM +
torch.compile (SDPA, no FlashAttention, no unpadding) 297,324 tokens/s at 21,233 MiB; bertjax
348,052 (MFU 0.278) at 23,693 MiB. Rows are 50-100% full synthetic batches, except the
ragged rows at the end: WikiText-2 paragraph lengths (bertjax/data/ragged.py; mean 169 tokens,
so a padded 1024-token row is about a sixth full), padded one per row, then packed first-fit
with segment ids as the recipe packs (configs/modernbert.py, data.pack); their real tokens/s
column is the figure to compare (device figures: unmeasured). The "remat dots" row was moved out
for them (run it as a spec of its own: {"name": "remat dots", "remat": "dots"}).

"pallas local window": the 14 local layers' window (64 keys each side) in the Pallas flash kernel
(bertjax/models/flash_attention.py, `window`), each block of 64 queries visiting the 3 key blocks
around it, instead of band by band through XLA; on full rows it saves only the window's work, on
packed ragged rows (the last row) it also skips the block pairs whose segments cannot meet.
Unmeasured. Moved out for these rows: "dropout 0" (ModernBERT's dropouts are 0 already, so it
timed the default twice) and "kernels cpu" (bert-base's set has that row).

Fits 10 minutes, estimated: 6 variants (5 steps and the trainer) compile in one wave of 6
(<= 140 s, as bert-base on the H200: ModernBERT-base has 22 thinner layers), the torch.compile
reference about 120 s, each timed row about 35 s (175 s), the trainer row about 60 s: about
500 s; `budget` caps it at 600 s. A seventh variant would start a second compile wave (up to
140 s more, past the budget's margin).
"""

BASE = {
    "title": "ModernBERT-base, seq 1024, batch 32, 154 predictions, bf16, MLM",
    "preset": "modernbert-base", "batch_size": 32, "seq_len": 1024, "dtype": "bfloat16",
    "steps": 20, "objective": "mlm", "overrides": ["max_predictions_per_seq=154"],
    "references": ["hf-torch-compile"], "timeout": 500, "budget": 600,
}

VARIANTS = [
    {"name": "default"},
    {"name": "pallas local window",
     "overrides": ["model.kernel_overrides.pallas_local_window=True"]},
    {"name": "trainer", "kind": "trainer", "trainer_steps": 60,
     "trainer_config": "configs/modernbert.py",
     "overrides": ["max_predictions_per_seq=154", "grad_accum_steps=1",
                   "batch_warmup_tokens=0", "batch_warmup_start=1", "masking.rate=0.15"]},
    # Ragged rows: WikiText-2 paragraph lengths, padded, then packed (segment ids).
    {"name": "ragged padded", "lengths": "wikitext2", "pack": False},
    {"name": "ragged packed", "lengths": "wikitext2", "pack": True},
    {"name": "ragged packed, pallas local window", "lengths": "wikitext2", "pack": True,
     "overrides": ["model.kernel_overrides.pallas_local_window=True"]},
]
