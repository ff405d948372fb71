"""BERT's GLUE fine-tuning grid (Devlin et al. 2019, section A.3), 5 seeds per setting.

  python launch.py --sweep experiments/glue_bert_grid.py:task=rte --workdir runs/glue_grid/rte \
      --config.init_from=runs/bert-base-uncased --config.data_dir=~/glue_data
  python -m bertjax.tools.report runs/glue_grid/rte

Learning rate {5e-5, 4e-5, 3e-5, 2e-5} x batch size {16, 32} x epochs {2, 3, 4} x seeds 1-5:
120 runs per task. The paper picks the best setting per task on dev; `bertjax.tools.report` does the
same on the median over seeds, then takes the GLUE average as papers do (WNLI out, MNLI m/mm
averaged). `init_from` (the pretrained encoder) must be given on the command line.

Argument: `task=NAME` (one of cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte), or several joined
with `+` (`task=rte+mrpc`); without it, the eight tasks of the GLUE average (960 runs: the big
ones, MNLI and QQP, take hours each on a TPU; start with the small tasks).
"""

from bertjax.core.errors import fail

TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte")
LEARNING_RATES = [5e-5, 4e-5, 3e-5, 2e-5]
BATCH_SIZES = [16, 32]
EPOCHS = [2.0, 3.0, 4.0]
SEEDS = [1, 2, 3, 4, 5]


def get_sweep(arg=None):
  tasks = list(TASKS)
  if arg:
    key, _, value = arg.partition("=")
    tasks = value.split("+")
    if key != "task" or not all(t in TASKS for t in tasks):
      fail(f"glue_bert_grid takes task=NAME[+NAME...] with names from {', '.join(TASKS)}; "
           f"got {arg!r}")
  return {
      "config": "configs/glue.py",
      "fixed": {"tensorboard": False},
      "product": {"task": tasks, "learning_rate": LEARNING_RATES, "batch_size": BATCH_SIZES,
                  "num_epochs": EPOCHS, "seed": SEEDS},
  }
