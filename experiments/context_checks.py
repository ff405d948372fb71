"""Curves of the context checks (configs/context_check.py): per objective, the eval metrics every
`--every` steps, the bounds of its eval batches, and the first step past them, as markdown.

  python experiments/context_checks.py --workdir runs/context_checks [--objectives mlm,span_sbo]
      [--steps 400] [--every 50] [--set key=value ...]

Distillation needs the mlm run first (its teacher): list mlm before distill.
"""

import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bertjax import inputs  # noqa: E402
from bertjax.config import config_lib  # noqa: E402
from bertjax.core.errors import doc_summary  # noqa: E402
from bertjax.data import synthetic  # noqa: E402
from bertjax.registry import get_objective  # noqa: E402
from bertjax.runtime import metric_writers  # noqa: E402
from bertjax.trainer import train  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
# metric -> the bound it must pass ("context_free" | "majority" | "rtd_baseline_accuracy").
CHECKS = {"mlm_accuracy": "context_free", "sbo_accuracy": "context_free",
          "nsp_accuracy": "majority", "sop_accuracy": "majority",
          "rtd_accuracy": "rtd_baseline_accuracy"}
MARGINS = {"context_free": 0.05, "majority": 0.1, "rtd_baseline_accuracy": 0.02}


def run(objective, workdir, steps, every, overrides):
  config = config_lib.load_config_file(str(REPO / f"configs/context_check.py:objective={objective}"))
  config_lib.apply_overrides(config, [f"total_steps={steps}", f"eval_every={every}",
                                      f"log_every={every}", *overrides])
  train.train_and_evaluate(config, workdir)
  batches = list(inputs.build(config, workdir, get_objective(config)).eval_batches())
  bounds = {"context_free": synthetic.context_free_accuracy(batches),
            "majority": synthetic.majority_fraction(
                np.concatenate([b["next_sentence_label"] for b in batches]))}
  rows = metric_writers.read_metrics(workdir)
  return [r for r in rows if r["split"] == "eval"], bounds


def table(objective, evals, bounds) -> list[str]:
  keys = [k for k in CHECKS if k in evals[-1]] + [k for k in ("rtd_precision", "rtd_recall",
                                                               "rtd_loss") if k in evals[-1]]
  lines = [f"### {objective}", "", "bounds: " + ", ".join(f"{k} {v:.3f}" for k, v in bounds.items()),
           "", "| step | loss | " + " | ".join(keys) + " |", "|---" * (len(keys) + 2) + "|"]
  for r in evals:
    cells = [f"{r[k]:.3f}" if isinstance(r.get(k), float) else str(r.get(k)) for k in keys]
    lines.append(f"| {r['step']} | {r['loss']:.3f} | " + " | ".join(cells) + " |")
  for k in keys[:len([k for k in CHECKS if k in evals[-1]])]:
    bound_name = CHECKS[k]
    passed = [r["step"] for r in evals
              if r[k] > (r[bound_name] if bound_name in r else bounds[bound_name]) + MARGINS[bound_name]]
    lines.append(f"\n{k}: first past {bound_name} + {MARGINS[bound_name]} at step "
                 f"{passed[0] if passed else 'never'}; final {evals[-1][k]:.3f}")
  return lines + [""]


def main():
  parser = argparse.ArgumentParser(description=doc_summary(__doc__))
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--objectives", default="mlm_nsp,mlm,mlm_sop,span_sbo,rtd,distill")
  parser.add_argument("--steps", type=int, default=400)
  parser.add_argument("--every", type=int, default=50)
  parser.add_argument("--set", nargs="*", default=[], help="config overrides key=value")
  args = parser.parse_args()
  root = pathlib.Path(args.workdir)
  out = []
  for objective in args.objectives.split(","):
    extra = list(args.set)
    if objective == "distill":
      extra.append(f"distill.teacher={str(root / 'mlm')!r}")
    evals, bounds = run(objective, root / objective, args.steps, args.every, extra)
    out += table(objective, evals, bounds)
    print("\n".join(table(objective, evals, bounds)), flush=True)
  (root / "context_checks.md").write_text("\n".join(out))


if __name__ == "__main__":
  main()
