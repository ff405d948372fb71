"""The plots of a sweep report (bertjax/tools/report.py): training loss over steps, the main dev
metric against the learning rate, and a search's points (`plot_search`).

Every plot aggregates the seeds of a setting (points equal in every swept key but `seed`): a line
through the median over seeds, a band from the lowest to the highest seed, each seed a dot or a
thin line; legends and titles say so. Each plot's data, and the labels actually drawn, go to a
.json file next to the .png.
"""

from __future__ import annotations

import io
import json
from typing import Any, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from bertjax.core import paths

LR_KEY = "learning_rate"
AGGREGATE = "median over seeds; band: min–max over seeds"


def setting_text(setting: tuple[tuple[str, str], ...]) -> str:
  # Values are reprs (so 1 and '1' group apart); strings read better without their quotes.
  return ", ".join(f"{k}={v.strip(chr(39))}" for k, v in setting) or "(base)"


def lr_label(lr: float) -> str:
  """1e-4, 3e-4, 2.5e-5: a learning rate as people write it."""
  mantissa, exponent = f"{lr:e}".split("e")
  return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _figure() -> tuple[Figure, Any]:
  """A figure drawn straight to files (no pyplot, no display backend, nothing global)."""
  fig = Figure(figsize=(9, 5.5), dpi=100)
  return fig, fig.subplots()


def _seeds(n: int) -> str:
  return f"{n} seed" + ("s" if n != 1 else "")


def _save(fig, ax, path: paths.Path, data: dict[str, Any]) -> dict[str, Any]:
  """Writes the png and, with the plotted data, the labels as drawn to path.json (local or
  remote: matplotlib writes the png into memory, the path layer writes the bytes)."""
  legend = ax.get_legend()
  data.update(title=ax.get_title(), xlabel=ax.get_xlabel(), ylabel=ax.get_ylabel(),
              legend=[t.get_text() for t in legend.get_texts()] if legend else [],
              xticklabels=[t.get_text() for t in ax.get_xticklabels()])
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format="png", bbox_inches="tight")  # the image grows to hold a long title
  path = paths.as_path(path)
  paths.replace_bytes(path, png.getvalue())
  paths.replace_text(path.with_suffix(".json"), json.dumps(data, indent=1))
  return data


def _spread(values: Sequence[float]) -> dict[str, float]:
  v = np.asarray(values, np.float64)
  return {"n": len(v), "median": float(np.median(v)), "min": float(np.min(v)),
          "max": float(np.max(v))}


def plot_train_loss(points: Sequence[Any], path: paths.Path) -> dict[str, Any]:
  """Per setting, the median training loss over its seeds at each logged step (the steps every
  seed logged) with a min–max band; each seed a thin line. path.json: every point's curve and
  each setting's aggregate."""
  return _plot_curves(points, lambda p: (p.train_steps, p.train_loss), "loss", path,
                      "training loss (mean of the logged window)", "training loss",
                      "no training metrics yet")


def plot_dev_curve(points: Sequence[Any], metric: str | None, path: paths.Path,
                   scope: str = "", lower_is_better: bool = False) -> dict[str, Any]:
  """The dev `metric` at each evaluation step, per setting as `plot_train_loss` draws the loss."""
  def curve(p):
    rows = [(step, row[metric]) for step, row in p.evals if metric in row]
    return [s for s, _ in rows], [v for _, v in rows]
  better = "lower" if lower_is_better else "higher"
  return _plot_curves(points, curve, metric or "metric", path,
                      f"dev {metric} ({better} is better)" if metric else "dev metric",
                      f"dev {metric}{f', {scope}' if scope else ''}" if metric else "dev metric",
                      "no evaluation yet")


def _plot_curves(points: Sequence[Any], curve, key: str, path: paths.Path, ylabel: str,
                 what: str, empty: str) -> dict[str, Any]:
  """Per setting (points equal but for the seed), the median of `curve(point)` (steps, values)
  over its seeds at each step every seed has, a min–max band and each seed a thin line; a
  setting of one point is that point's curve (labelled with the setting, or the run's name)."""
  fig, ax = _figure()
  curves, series, groups = [], [], {}
  for p in points:
    steps, values = curve(p)
    if steps:
      curves.append({"point": p.name, "steps": steps, key: values})
      groups.setdefault(p.setting, []).append((p, steps, values))
  for setting, members in groups.items():
    steps = sorted(set.intersection(*(set(m[1]) for m in members)))
    by_step = [dict(zip(m[1], m[2])) for m in members]
    stats = [_spread([values[s] for values in by_step]) for s in steps]
    if len(members) == 1 and not setting:
      label = members[0][0].name
    else:
      label = f"{setting_text(setting)}: median of {_seeds(len(members))}"
    line, = ax.plot(steps, [s["median"] for s in stats], label=label, linewidth=2)
    if len(members) > 1:
      ax.fill_between(steps, [s["min"] for s in stats], [s["max"] for s in stats],
                      color=line.get_color(), alpha=0.2, linewidth=0)
      for _, m_steps, m_values in members:
        ax.plot(m_steps, m_values, color=line.get_color(), linewidth=0.6, alpha=0.5)
    series.append({"label": label, "points": [m[0].name for m in members], "steps": steps,
                   **{k: [s[k] for s in stats] for k in ("median", "min", "max", "n")}})
  ax.set_xlabel("step")
  ax.set_ylabel(ylabel)
  if len(points) == 1:
    ax.set_title(f"{what}: {points[0].name}")
  else:
    ax.set_title(f"{what}: {AGGREGATE}; thin lines: single seeds")
  if series:
    ax.legend(fontsize=8, loc="best", framealpha=0.8)
  else:
    ax.text(0.5, 0.5, empty, ha="center", transform=ax.transAxes)
  return _save(fig, ax, path, {"curves": curves, "series": series})


def plot_dev_vs_lr(points: Sequence[Any], metric: str | None, path: paths.Path,
                   scope: str = "", lower_is_better: bool = False) -> dict[str, Any]:
  """The last evaluation's `metric` against the learning rate, per setting of the other swept
  keys: the median over seeds (line), min–max band, each seed a dot. `scope` says what the
  metric is computed over (the whole dev set, N eval batches)."""
  fig, ax = _figure()
  by_setting: dict[tuple, dict[float, list[tuple[float, str]]]] = {}
  for p in points:
    lr = p.config.get(LR_KEY)
    if metric and metric in p.final and isinstance(lr, (int, float)):
      setting = tuple(kv for kv in p.setting if kv[0] != LR_KEY)
      by_setting.setdefault(setting, {}).setdefault(float(lr), []).append((p.final[metric], p.name))
  data: dict[str, Any] = {"metric": metric, "scope": scope, "series": []}
  all_lrs: set[float] = set()
  for setting, by_lr in by_setting.items():
    lrs = sorted(by_lr)
    all_lrs.update(lrs)
    stats = [_spread([v for v, _ in by_lr[lr]]) for lr in lrs]
    seeds = sorted({s["n"] for s in stats})
    n_text = _seeds(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]} seeds"
    label = f"{setting_text(setting) if setting else 'all points'}: median of {n_text}"
    line, = ax.plot(lrs, [s["median"] for s in stats], marker="o", label=label, linewidth=2)
    if max(seeds) > 1:
      ax.fill_between(lrs, [s["min"] for s in stats], [s["max"] for s in stats],
                      color=line.get_color(), alpha=0.2, linewidth=0)
    ax.scatter([lr for lr in lrs for _ in by_lr[lr]], [v for lr in lrs for v, _ in by_lr[lr]],
               s=14, alpha=0.6, color=line.get_color())
    data["series"].append({"label": label, "learning_rate": lrs,
                           **{k: [s[k] for s in stats] for k in ("median", "min", "max", "n")},
                           "points": [{"learning_rate": lr, "value": v, "point": n}
                                      for lr in lrs for v, n in by_lr[lr]]})
  ax.set_xscale("log")
  if all_lrs:
    ax.set_xticks(sorted(all_lrs), [lr_label(lr) for lr in sorted(all_lrs)])
    ax.xaxis.set_minor_locator(NullLocator())
  ax.set_xlabel("learning rate")
  better = "lower" if lower_is_better else "higher"
  ax.set_ylabel(f"dev {metric} ({better} is better)" if metric else "dev metric")
  if metric:
    ax.set_title(f"dev {metric} at the last evaluation{f', {scope}' if scope else ''}\n"
                 f"{AGGREGATE}; dots: single seeds", fontsize=10)
  else:
    ax.set_title("no dev metrics yet")
  if data["series"]:
    ax.legend(fontsize=8, loc="best", framealpha=0.8)
  else:
    ax.text(0.5, 0.5, "no dev metric with a learning rate yet", ha="center",
            transform=ax.transAxes)
  return _save(fig, ax, path, data)


def plot_search(points: Sequence[Any], metric: str, mode: str, space: dict[str, Any],
                path: paths.Path) -> dict[str, Any]:
  """A search (sweep.json's `search`), in panels side by side: each point's value (its best dev
  `metric`) against its trial (its place in sweep.json), pruned points as red crosses at their
  best before they were stopped, the best so far of the finished ones as a step line; the values
  against each searched key (a log axis for a log-uniform one); and every point's dev curve,
  pruned ones red, ending where they were stopped. path.json: the numbers drawn and each panel's
  labels."""
  keys = list(space)
  fig = Figure(figsize=(4.2 * (2 + len(keys)), 4.2), dpi=100)
  axes = list(np.atleast_1d(fig.subplots(1, 2 + len(keys))))
  pick = min if mode == "min" else max
  scored = [(i, p) for i, p in enumerate(points) if metric in p.best]
  pruned = lambda p: p.status == "pruned"
  data: dict[str, Any] = {"metric": metric, "mode": mode, "trials": [
      {"trial": i, "name": p.name, "status": p.status, "value": p.best[metric],
       "settings": p.overrides} for i, p in scored], "curves": [], "panels": []}

  ax = axes[0]
  for flag, style in ((False, dict(marker="o", color="tab:blue", label="finished")),
                      (True, dict(marker="x", color="tab:red", label="pruned (best before)"))):
    shown = [(i, p.best[metric]) for i, p in scored if pruned(p) == flag]
    if shown:
      ax.scatter(*zip(*shown), **style)
  done = [(i, p.best[metric]) for i, p in scored if p.status == "finished"]
  if done:
    best = [pick(v for _, v in done[:k + 1]) for k in range(len(done))]
    ax.step([i for i, _ in done] + [scored[-1][0]], best + best[-1:], where="post", color="k",
            label="best so far")
  ax.set(title=f"{metric} per trial", xlabel="trial", ylabel=f"best dev {metric}")
  ax.legend(fontsize=8)
  for ax, key in zip(axes[1:], keys):
    for flag, style in ((False, dict(marker="o", color="tab:blue")),
                        (True, dict(marker="x", color="tab:red"))):
      shown = [(p.overrides[key], p.best[metric]) for _, p in scored
               if pruned(p) == flag and isinstance(p.overrides.get(key), (int, float))]
      if shown:
        ax.scatter(*zip(*shown), **style)
    if space[key][0] == "log_uniform":
      ax.set_xscale("log")
    ax.set(title=f"{metric} against {key}", xlabel=key, ylabel=f"best dev {metric}")
  ax = axes[-1]
  for p in points:
    rows = [(step, row[metric]) for step, row in p.evals if metric in row]
    if rows:
      ax.plot(*zip(*rows), color="tab:red" if pruned(p) else "tab:blue", alpha=0.7, lw=1,
              marker="x" if pruned(p) else None, markevery=[len(rows) - 1])
      data["curves"].append({"name": p.name, "status": p.status, "steps": [s for s, _ in rows],
                             "values": [v for _, v in rows]})
  ax.set(title=f"dev {metric} curves (red: pruned)", xlabel="step", ylabel=f"dev {metric}")
  data["panels"] = [{"title": a.get_title(), "xlabel": a.get_xlabel(), "ylabel": a.get_ylabel()}
                    for a in axes]
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format="png")
  path = paths.as_path(path)
  paths.replace_bytes(path, png.getvalue())
  paths.replace_text(path.with_suffix(".json"), json.dumps(data, indent=1, default=str))
  return data
