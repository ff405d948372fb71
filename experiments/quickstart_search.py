"""A random (or Bayesian) search over the quickstart's learning rate, warmup steps and seed, the points
that fall behind at their evaluations stopped early: the laptop path of a search with pruning.

  pip install ".[sweep]"     # optuna
  python launch.py --sweep experiments/quickstart_search.py --workdir runs/qs_search
  python launch.py --sweep experiments/quickstart_search.py:tpe --workdir runs/qs_search_tpe \
      --max_concurrent 2
  python -m bertjax.tools.report runs/qs_search

12 points of the `runlocal` variant (a tiny BERT on the WikiText-2 sample), each 40 steps with an
evaluation every 5; from the sixth point on, the median pruner stops a point whose eval loss is
worse than the median of the finished points' at the same step (optuna's MedianPruner). `:tpe`
draws with optuna's TPE sampler instead of at random. Measured once on a 2-core CPU machine shared
with other work, `--max_concurrent 2`, random: 6 min 23 s, 6 points finished and 6 pruned (at
steps 6 to 40), best loss 6.877 at learning_rate 0.0035, no warmup, seed 1.
"""

from bertjax.core.errors import fail


def get_sweep(arg=None):
  if arg not in (None, "tpe", "random"):
    fail(f"quickstart_search takes :tpe or :random, not :{arg}")
  return {
      "config": "configs/quickstart.py:runlocal",
      "fixed": {"tensorboard": False, "total_steps": 40, "eval_every": 5,
                "checkpoint_every": 20},
      "search": {
          "sampler": arg or "random", "trials": 12, "seed": 0,
          "space": {"learning_rate": ("log_uniform", 1e-4, 1e-2),
                    "optimizer.warmup_steps": ("int", 0, 10),
                    "seed": ("choice", [0, 1, 2])},
          "metric": "loss",
          "pruner": {"kind": "median", "n_startup_trials": 5},
      },
  }
