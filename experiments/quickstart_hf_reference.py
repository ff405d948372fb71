"""The quickstart's learning curve next to transformers' BertForPreTraining on the same batches.

  python launch.py --config configs/quickstart.py --workdir runs/qs200 \
      --config.total_steps=200 --config.log_every=1
  python experiments/quickstart_hf_reference.py --workdir runs/qs200

The second command rebuilds the quickstart's batches from WORKDIR's tokenizer and prepared corpus
(same seed, so the same batches the first run trained on), trains a PyTorch BertForPreTraining of
the same shape and optimizer settings on them (bertjax.tools.hf_reference), writes
WORKDIR/hf_reference.jsonl and prints both runs' first loss, mean of the last 10 and the drop.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bertjax.config import config_lib  # pylint: disable=g-import-not-at-top
from bertjax.core.errors import doc_summary, fail, run_cli  # pylint: disable=g-import-not-at-top
from bertjax.registry import get_objective  # pylint: disable=g-import-not-at-top
from bertjax.runtime import metric_writers  # pylint: disable=g-import-not-at-top
from bertjax.tools import hf_reference  # pylint: disable=g-import-not-at-top


def drop(rows: list[dict]) -> str:
  first, last = rows[0]["loss"], sum(r["loss"] for r in rows[-10:]) / len(rows[-10:])
  acc = sum(r["mlm_accuracy"] for r in rows[-10:]) / len(rows[-10:])
  return (f"first {first:.3f}  last-10 mean {last:.3f}  drop {1 - last / first:.1%}  "
          f"last-10 MLM accuracy {acc:.3f}")


def main(argv=None):
  p = argparse.ArgumentParser(description=doc_summary(__doc__))
  p.add_argument("--workdir", required=True, help="a quickstart run's workdir")
  args = p.parse_args(argv)
  workdir = pathlib.Path(args.workdir)
  resolved = workdir / "config.json"
  if not resolved.is_file():
    fail(f"{resolved} not found; run the quickstart into {workdir} first (see this file's help)")
  config = config_lib.load_config_file(str(REPO / "configs/quickstart.py"))
  saved = json.loads(resolved.read_text())
  overrides = [f"{k}={saved[k]!r}" for k in ("total_steps", "batch_size", "learning_rate",
                                              "max_seq_length", "max_predictions_per_seq", "seed")]
  config_lib.apply_overrides(config, overrides)
  objective = get_objective(config)
  data = objective.build_inputs(config, workdir)
  model = hf_reference.build_model(objective.model_config(config), seed=config.seed)
  rows = hf_reference.train(model, (next(data.train) for _ in range(config.total_steps)), config)
  with open(workdir / "hf_reference.jsonl", "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  print(f"transformers (PyTorch), {len(rows)} steps: {drop(rows)}")
  ours = metric_writers.read_metrics(workdir)
  ours = [r for r in ours if r["split"] == "train"]
  if ours and ours[0]["step"] == 1 and len(ours) == len(rows):
    print(f"bertjax,              {len(ours)} steps: {drop(ours)}")
  else:
    print("bertjax's metrics.jsonl is not one row per step: run it with --config.log_every=1")


if __name__ == "__main__":
  run_cli(main)
