"""The quickstart pretraining at 2 learning rates x 2 seeds: 4 points, about 2 minutes on 2 CPUs.

  python launch.py --sweep experiments/quickstart_sweep.py --workdir runs/qs_sweep
  python -m bertjax.tools.report runs/qs_sweep

Each point runs the `runlocal` variant (a tiny BERT, 20 steps of 8 sequences, on the WikiText-2
sample shipped in the repo; the first run of a point trains its tokenizer). The learning rates
are the variant's own 1e-3 (configs/quickstart.py) and three times it.
"""


def get_sweep():
  return {
      "config": "configs/quickstart.py:runlocal",
      # TensorBoard files are not needed to compare points: metrics.jsonl has everything.
      "fixed": {"tensorboard": False},
      "product": {"learning_rate": [1e-3, 3e-3], "seed": [0, 1]},
  }
