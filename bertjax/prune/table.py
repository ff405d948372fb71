"""The record of a pruning run: pruning.csv, pruning.md, pruning.png and summary.json in OUT."""

from __future__ import annotations

import csv
import io
import json
import pathlib
from typing import Any, Sequence

from matplotlib.figure import Figure

from bertjax.core import paths
from bertjax.prune.folders import json_safe

COLUMNS = ("step", "heads", "heads_kept", "layers", "sparsity", "encoder_params", "dev_pruned",
           "dev_finetuned")


def _fmt(value: Any) -> str:
  if value is None:
    return "-"
  return f"{value:.4f}" if isinstance(value, float) else str(value)


def write_csv(rows: Sequence[dict], path: pathlib.Path) -> None:
  text = io.StringIO(newline="")
  writer = csv.DictWriter(text, fieldnames=COLUMNS, extrasaction="ignore")
  writer.writeheader()
  writer.writerows(rows)
  paths.replace_text(path, text.getvalue())


def markdown(rows: Sequence[dict], metric: str, command: str) -> str:
  lines = [f"# Pruning: dev {metric} against what is kept", "", f"    {command}", "",
           "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
  lines += ["| " + " | ".join(_fmt(r[c]) for c in COLUMNS) + " |" for r in rows]
  lines += ["", "dev_pruned: right after pruning; dev_finetuned: after the brief fine-tuning "
            "that follows (step 0: the model as given). Removed per step:", ""]
  lines += [f"- step {r['step']}: " + json.dumps({k: v for k, v in r["removed"].items()
                                                   if k != "scores"})
            for r in rows if r["removed"]]
  return "\n".join(lines) + "\n"


def plot(rows: Sequence[dict], metric: str, path: pathlib.Path, unstructured: bool) -> str:
  """Dev metric against the fraction of heads kept (or the sparsity): after pruning and after
  the brief fine-tuning; returns its title. Figure API only (no pyplot, nothing global)."""
  fig = Figure(figsize=(6, 4), dpi=100)
  ax = fig.subplots()
  x = [r["sparsity"] if unstructured else r["heads_kept"] for r in rows]
  ax.plot(x, [r["dev_pruned"] for r in rows], marker="o", label="pruned")
  tuned = [(xi, r["dev_finetuned"]) for xi, r in zip(x, rows) if r["dev_finetuned"] is not None]
  if len(tuned) > 1:
    ax.plot(*zip(*tuned), marker="s", label="pruned + fine-tuned")
  ax.set_xlabel("sparsity of the encoder layers' kernels" if unstructured else "fraction of heads kept")
  ax.set_ylabel(f"dev {metric}")
  if not unstructured:
    ax.invert_xaxis()
  ax.grid(alpha=0.3)
  kept = "the encoder's sparsity" if unstructured else "the fraction of heads kept"
  title = f"pruning: dev {metric} against {kept} ({len(rows) - 1} steps from the model as given)"
  ax.set_title(title, fontsize=10)
  ax.legend(loc="best")
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format="png", bbox_inches="tight")  # the image grows to hold a long title
  paths.replace_bytes(path, png.getvalue())
  return title


def write_all(out: pathlib.Path, rows: Sequence[dict], metric: str, command: str,
              unstructured: bool) -> str:
  write_csv(rows, out / "pruning.csv")
  text = markdown(rows, metric, command)
  paths.replace_text(out / "pruning.md", text)
  plot(rows, metric, out / "pruning.png", unstructured)
  record = {"metric": metric, "command": command, "rows": json_safe(list(rows))}
  paths.replace_text(out / "summary.json", json.dumps(record, indent=2, allow_nan=False))
  return text
