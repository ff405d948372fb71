"""Draws experiments/pruning.png from the summary.json of several `python -m bertjax.prune` runs.

  python experiments/pruning_plot.py OUT.png LABEL=RUN_DIR [LABEL=RUN_DIR ...]

Each run is one line of dev metric against the fraction of heads kept, right after pruning; a
run with re-fine-tuning adds a dashed line for the metric after it.
"""

import json
import pathlib
import sys

from matplotlib.figure import Figure


def main(out: str, *runs: str) -> None:
  fig = Figure(figsize=(7, 4.5), dpi=100)
  ax = fig.subplots()
  metric = "score"
  for item in runs:
    label, _, folder = item.partition("=")
    summary = json.loads((pathlib.Path(folder) / "summary.json").read_text())
    metric, rows = summary["metric"], summary["rows"]
    x = [r["heads_kept"] for r in rows]
    line, = ax.plot(x, [r["dev_pruned"] for r in rows], marker="o", label=f"{label}: pruned")
    tuned = [(xi, r["dev_finetuned"]) for xi, r in zip(x, rows) if r["dev_finetuned"] is not None]
    if any(r["dev_finetuned"] is not None for r in rows[1:]):
      ax.plot(*zip(*tuned), marker="s", linestyle="--", color=line.get_color(),
              label=f"{label}: + re-fine-tuned")
  ax.set_xlabel("fraction of attention heads kept")
  ax.set_ylabel(f"SST-2 dev {metric} (accuracy)")
  ax.invert_xaxis()
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, loc="lower left")
  fig.tight_layout()
  fig.savefig(out)


if __name__ == "__main__":
  main(*sys.argv[1:])
