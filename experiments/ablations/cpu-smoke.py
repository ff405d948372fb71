"""A few seconds per row on a CPU: the ablation command end to end at bert-tiny shapes.

  python -m bertjax.tools.benchmark --ablate cpu-smoke --output /tmp/cpu-smoke.md
"""

BASE = {
    "title": "cpu-smoke: bert-tiny, batch 2, seq 16",
    "preset": "bert-tiny", "batch_size": 2, "seq_len": 16, "steps": 2,
    "overrides": ["max_predictions_per_seq=4"],
    "references": ["hf-torch"], "timeout": 300,
}

VARIANTS = [
    {"name": "default"},
    {"name": "dropout 0", "overrides": ["model.hidden_dropout_prob=0.0",
                                        "model.attention_probs_dropout_prob=0.0"]},
    {"name": "trainer", "kind": "trainer", "trainer_steps": 12},
]
