"""Result tables and plots of a sweep or a run: `python -m bertjax.tools.report DIR [--metric NAME]`.

DIR is a sweep workdir (launch.py --sweep; local or gs://...): its sweep.json lists the points;
without one, every sub-folder holding a run is a point, its overrides read back from its name
(or, for names that are not `key=value,...`, the config.json settings that differ between them,
so runs of several tasks are plotted apart). DIR may also be one run's workdir: its curves.
Writes into DIR:

  report.md        one row per point (overrides, status, steps, wall time, tokens/s, and each dev
                   metric's final and best value; a failed point shows its log's last line);
                   median, min-max and std over seeds of points that differ only by `seed`; the
                   best point per task and metric; for GLUE points, the GLUE average.
  train_loss.png   the training loss per setting of the swept keys other than `seed`: the median
                   over its seeds at each logged step, a min-max band, each seed a thin line
                   (train_loss.json: the plotted arrays and the labels drawn).
  dev_curve.png    the main dev metric at each evaluation, grouped as train_loss.png is.
  dev_vs_lr.png    the main dev metric at the last evaluation against the learning rate (ticks
                   1e-4, 3e-4, ...), per setting of the other swept keys: the median over seeds
                   (line), a min-max band, each seed a dot (dev_vs_lr.json: the data and labels);
                   not for a single run.
  search.png       a search's sweep (sweep.json's `search`, bertjax/sweep/search.py): each
                   point's value (its best dev metric of the search) against its trial, pruned
                   points marked, the best so far; against each searched key; every point's dev
                   curve, the pruned ones red, ending where they were stopped (search.json).

Dev metrics are the rows of metrics.jsonl with split "eval": "final" is the last evaluation,
"best" the best over the run (lowest for losses and perplexities, highest otherwise). tokens/s
is the median over the logged training windows (the first includes compilation). The main
metric is `--metric`, else the main metric of the points' objective (`Objective.main_metric`):
a fine-tuning task's over its whole dev set (GLUE score, SQuAD F1, NER F1, POS accuracy), a
pretraining objective's eval loss. A pretraining evaluation covers data.eval_batches batches of
the held-out documents (quickstart's runlocal: 1 batch of 8 rows), not the whole held-out set:
the report says how many, and its accuracies over so few masked tokens are noisy, which is why
the loss is the default.

The GLUE average follows the papers: per task, the setting (the swept keys other than seed)
with the best median dev score over seeds is chosen and its median metrics are reported; the
average (`bertjax.metrics.glue.glue_average`) leaves WNLI out and counts MNLI once, as the
mean of matched and mismatched.
"""

from __future__ import annotations

import ast
import dataclasses
import logging
import math
import os
import pathlib
import statistics
import sys
from typing import Any, Sequence

from absl import flags

from bertjax import registry, sweep as sweep_lib
from bertjax.core import command_line, paths, run_files
from bertjax.core.errors import fail, run_cli
from bertjax.metrics import glue
from bertjax.runtime import metric_writers
from bertjax.tools.report_plots import (plot_dev_curve, plot_dev_vs_lr, plot_search,
                                        plot_train_loss, setting_text)

SEED_KEYS = ("seed",)
# Counters an evaluation logs next to its metrics: not metrics to compare.
NOT_METRICS = {"step", "split", "examples"}


@dataclasses.dataclass
class PointResult:
  name: str
  overrides: dict[str, Any]
  status: str
  last_line: str | None
  steps: int | None
  wall_s: float | None
  tokens_per_s: float | None
  config: dict[str, Any]            # the resolved values (config.json, else sweep.json)
  train_steps: list[int]
  train_loss: list[float]
  final: dict[str, float]           # the last evaluation's metrics
  best: dict[str, float]            # each metric's best value over evaluations
  evals: list[tuple[int, dict[str, float]]] = dataclasses.field(default_factory=list)

  @property
  def task(self) -> str | None:
    """The GLUE task of a fine-tuning point, else None."""
    if self.config.get("objective") == "glue" and self.config.get("task"):
      return str(self.config["task"])
    return None

  @property
  def setting(self) -> tuple[tuple[str, str], ...]:
    """The swept values other than the seed: points equal here are seeds of one setting."""
    return tuple((k, repr(v)) for k, v in sorted(self.overrides.items()) if k not in SEED_KEYS)


def _is_metric(key: str, value: Any) -> bool:
  return (key not in NOT_METRICS and not key.endswith("_examples")
          and isinstance(value, (int, float)) and not isinstance(value, bool))


def _overrides_from_name(name: str) -> dict[str, Any]:
  """`learning_rate=0.001,seed=1` -> {learning_rate: 0.001, seed: 1} (for runs without
  sweep.json)."""
  out = {}
  for part in name.split(","):
    key, sep, text = part.partition("=")
    if not sep:
      return {}
    try:
      out[key] = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      out[key] = text
  return out


def _log_last_line(point_dir: paths.Path) -> str | None:
  log = point_dir / "log.txt"
  if not log.exists():
    return None
  text = log.read_bytes().decode("utf-8", errors="replace")
  # Only the latest launch counts: the sweep writes a header line before each.
  start = text.rfind("# bertjax.sweep ")
  if start >= 0:
    text = text[text.find("\n", start) + 1:]
  return sweep_lib.last_line(text)


def load_point(sweep_dir: paths.Path, entry: dict[str, Any],
               point_dir: paths.Path | None = None) -> PointResult:
  """One point's results from its folder (sweep_dir/name unless given) and its sweep.json
  entry."""
  name = entry["name"]
  point_dir = point_dir or sweep_dir / name
  rows = metric_writers.read_metrics(point_dir)
  train = [r for r in rows if r.get("split") == "train" and r.get("loss") is not None]
  evals = [r for r in rows if r.get("split") == "eval"]
  final = {k: v for k, v in (evals[-1] if evals else {}).items() if _is_metric(k, v)}
  best: dict[str, float] = {}
  for row in evals:
    for k, v in row.items():
      if _is_metric(k, v):
        better = min if run_files.lower_is_better(k) else max
        best[k] = v if k not in best else better(best[k], v)
  summary = run_files.read_json(point_dir / "summary.json") or {}
  config = {**(entry.get("resolved") or {}),
            **(run_files.read_json(point_dir / "config.json") or {})}
  total = int(entry.get("total_steps") or 0)
  status = entry.get("status") or ("finished" if summary else "pending")
  if sweep_lib.is_finished(point_dir, total):
    status = "finished"
  elif status in ("finished", "running"):
    # sweep.json is stale (a killed sweep, a changed total_steps): the folder says otherwise.
    status = "incomplete" if summary or rows else "pending"
  last_line = None
  if status != "finished":
    last_line = entry.get("last_line") or _log_last_line(point_dir)
  speeds = [r["tokens_per_s"] for r in train if isinstance(r.get("tokens_per_s"), (int, float))]
  steps = summary.get("step") if isinstance(summary.get("step"), int) else (
      train[-1]["step"] if train else None)
  return PointResult(
      name=name, overrides=dict(entry.get("overrides") or {}), status=status,
      last_line=last_line, steps=steps, wall_s=entry.get("wall_s"),
      tokens_per_s=statistics.median(speeds) if speeds else None, config=config,
      train_steps=[int(r["step"]) for r in train], train_loss=[float(r["loss"]) for r in train],
      final=final, best=best,
      evals=[(int(r["step"]), {k: v for k, v in r.items() if _is_metric(k, v)}) for r in evals])


RUN_FILES = ("config.json", "log.txt", metric_writers.METRICS, metric_writers.METRICS_DIR)


def is_run(folder: paths.Path) -> bool:
  """Whether `folder` holds one run (a training workdir) rather than a sweep's points."""
  return any((folder / f).exists() for f in RUN_FILES)


def load_points(sweep_dir: str | pathlib.Path) -> list[PointResult]:
  """The points of a sweep folder; a run's own workdir is a sweep of one point. Folders of runs
  without sweep.json whose names are not `key=value,...`: each point's swept keys are the
  settings of its config.json that differ between them (the task of runs of several tasks), so
  runs of different settings are never taken for seeds of one."""
  sweep_dir = paths.as_path(sweep_dir)  # local or remote (gs://...)
  if sweep_dir.exists() and not sweep_dir.is_dir():
    fail(f"{sweep_dir} is a file, not a folder; pass the --workdir of a sweep or of a run, "
         "not a file in it")
  if not sweep_dir.is_dir():
    fail(f"sweep folder {sweep_dir} not found; pass the --workdir of a sweep or of a run")
  record = run_files.read_json(sweep_dir / "sweep.json")
  entries = _entries(sweep_dir, record.get("points")) if record else []
  if not entries and is_run(sweep_dir):
    return [load_point(sweep_dir, {"name": sweep_dir.name, "overrides": {}}, sweep_dir)]
  if not entries:
    entries = [{"name": d.name, "overrides": _overrides_from_name(d.name)}
               for d in sorted(sweep_dir.iterdir()) if d.is_dir() and is_run(d)]
    if not entries:
      fail(f"{sweep_dir} holds no sweep.json, no run folders and no run; run a sweep into it "
           f"first (python launch.py --sweep experiments/<name>.py --workdir {sweep_dir}) or "
           "pass a run's --workdir")
    if not all(e["overrides"] for e in entries):
      configs = [_flat(run_files.read_json(sweep_dir / e["name"] / "config.json") or {})
                 for e in entries]
      differing = sorted(k for k in set().union(*configs)
                         if len({repr(c.get(k)) for c in configs}) > 1)
      for e, c in zip(entries, configs):
        e["overrides"] = {**{k: c.get(k) for k in differing}, **e["overrides"]}
  return [load_point(sweep_dir, e) for e in entries]


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  """{"model": {"hidden_size": 32}} -> {"model.hidden_size": 32}."""
  out = {}
  for k, v in config.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[prefix + k] = v
  return out


# The types of the sweep.json entry fields the report reads (bertjax/sweep/runner.py writes them).
_ENTRY_TYPES = {"name": str, "overrides": dict, "resolved": dict, "total_steps": int,
                "status": str, "last_line": str, "wall_s": (int, float)}


def _entries(sweep_dir: paths.Path, points: Any) -> list[dict[str, Any]]:
  """sweep.json's points; one that is damaged (not an object, or a field of another type) is
  left out with a warning naming it."""
  out = []
  for i, entry in enumerate(points if isinstance(points, list) else []):
    problem = _entry_problem(entry)
    if problem:
      logging.warning("%s: skipped point %d: %s", sweep_dir / "sweep.json", i, problem)
    else:
      out.append(entry)
  return out


def _entry_problem(entry: Any) -> str | None:
  if not isinstance(entry, dict):
    return f"a JSON {type(entry).__name__}, not an object"
  for key, kind in _ENTRY_TYPES.items():
    value = entry.get(key)
    if value is None and key != "name":
      continue
    if not isinstance(value, kind) or isinstance(value, bool):
      return f"its {key} {value!r:.40} is damaged"
  return None


# ---------------------------------------------------------------------------------------------
# Aggregates.


def _objective_class(point: PointResult):
  name = point.config.get("objective")
  return registry.objective_class(name) if name in registry.REGISTERED else None


def main_metric(points: Sequence[PointResult], requested: str | None = None) -> str | None:
  """`requested`, else the main metric of the points' objective (a task's: GLUE score, SQuAD
  F1, NER F1, POS accuracy; pretraining: the eval loss), else a guess from the logged names."""
  names = [k for p in points for k in p.final]
  if requested:
    if requested not in names:
      fail(f"--metric {requested!r} is not a dev metric of these points; use one of "
           f"{', '.join(sorted(set(names))) or '(none: no evaluation yet)'}")
    return requested
  for p in points:
    cls = _objective_class(p)
    if cls is not None and cls.main_metric(p.config) in names:
      return cls.main_metric(p.config)
  for candidate in ("score", "f1", "loss"):
    if candidate in names:
      return candidate
  return next((k for k in names if not run_files.lower_is_better(k)), names[0] if names else None)


def metric_scope(points: Sequence[PointResult], metric: str | None) -> str:
  """What the dev metric is computed over: a task's whole dev set, or a pretraining run's eval
  batches (data.eval_batches x batch_size rows of the held-out documents, not all of them)."""
  for p in points:
    if metric not in p.final:
      continue
    cls = _objective_class(p)
    if cls is not None and cls.data_kind == "task":
      return "over the whole dev set"
    data = p.config.get("data") or {}
    batches, rows = data.get("eval_batches"), p.config.get("batch_size")
    if isinstance(batches, int) and isinstance(rows, int) and cls is not None:
      return (f"over {batches} batch{'es' if batches != 1 else ''} of {rows} held-out rows: "
              f"data.eval_batches={batches}")
  return ""


def spread(values: Sequence[float]) -> dict[str, float]:
  return {"n": len(values), "median": statistics.median(values), "min": min(values),
          "max": max(values), "std": statistics.pstdev(values) if len(values) > 1 else 0.0}


def seed_groups(points: Sequence[PointResult]) -> list[dict[str, Any]]:
  """Finished points that differ only by seed: per metric, the spread of the final values."""
  groups: dict[tuple, list[PointResult]] = {}
  for p in points:
    if p.status == "finished" and any(k in p.overrides for k in SEED_KEYS):
      groups.setdefault(p.setting, []).append(p)
  out = []
  for setting, members in groups.items():
    if len(members) < 2:
      continue
    metrics = sorted({k for m in members for k in m.final})
    out.append({
        "setting": setting, "points": [m.name for m in members],
        "seeds": [m.overrides.get("seed") for m in members],
        "metrics": {k: spread([m.final[k] for m in members if k in m.final]) for k in metrics},
    })
  return out


def best_points(points: Sequence[PointResult]) -> list[dict[str, Any]]:
  """Per task (the GLUE task; '-' for pretraining) and dev metric: the point with the best
  final value."""
  out = []
  by_task: dict[str, list[PointResult]] = {}
  for p in points:
    if p.final:
      by_task.setdefault(p.task or "-", []).append(p)
  for task, members in by_task.items():
    for metric in sorted({k for m in members for k in m.final}):
      have = [m for m in members if metric in m.final]
      better = min if run_files.lower_is_better(metric) else max
      pick = better(have, key=lambda m: m.final[metric])
      out.append({"task": task, "metric": metric, "value": pick.final[metric], "point": pick.name})
  return out


def _glue_metrics(task: str, final: dict[str, float]) -> dict[str, dict[str, float]] | None:
  """A point's final eval row -> {glue task name: glue_metrics dict} (MNLI: both dev sets)."""
  if task == "mnli":
    parts = {"mnli_matched": "matched_", "mnli_mismatched": "mismatched_"}
  else:
    parts = {task: ""}
  out = {}
  for name, prefix in parts.items():
    metrics = glue.get_task(name).metrics
    if not all(prefix + m in final for m in metrics):
      return None
    out[name] = {m: final[prefix + m] for m in metrics}
  return out


def glue_summary(points: Sequence[PointResult]) -> dict[str, Any] | None:
  """Per GLUE task the best setting by median dev score over seeds, and the GLUE average."""
  settings: dict[str, dict[tuple, list[dict]]] = {}
  for p in points:
    if p.task and p.status == "finished":
      parsed = _glue_metrics(p.task, p.final)
      if parsed is not None:
        settings.setdefault(p.task, {}).setdefault(p.setting, []).append(parsed)
  if not settings:
    return None
  chosen, results = {}, {}
  for task, by_setting in settings.items():
    best = None
    for setting, runs in by_setting.items():
      medians = {name: {m: statistics.median(r[name][m] for r in runs) for m in runs[0][name]}
                 for name in runs[0]}
      score = statistics.mean(glue.glue_task_score(n, m) for n, m in medians.items())
      if best is None or score > best["score"]:
        best = {"setting": setting, "seeds": len(runs), "metrics": medians, "score": score}
    chosen[task] = best
    results.update(best["metrics"])
  counted = [t for t in chosen if t != "wnli"]
  average = glue.glue_average(results) if counted else None
  return {"tasks": chosen, "average": average, "counted": counted}


# ---------------------------------------------------------------------------------------------
# Output.


def _fmt(value: Any) -> str:
  if value is None:
    return ""
  if isinstance(value, float):
    return "nan" if math.isnan(value) else f"{value:.4g}"
  return str(value)


def _cell(text: Any) -> str:
  return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
  return lines


def render_markdown(sweep_dir: paths.Path, points: Sequence[PointResult], metric: str | None,
                    groups: list[dict], best: list[dict], glue_result: dict | None,
                    scope: str = "") -> str:
  keys = sorted({k for p in points for k in p.overrides})
  metrics = sorted({k for p in points for k in p.final})
  if metric in metrics:  # the main metric first
    metrics.remove(metric)
    metrics.insert(0, metric)
  lines = [f"# {'Run' if is_run(sweep_dir) else 'Sweep'} report: {sweep_dir}", ""]
  counts = {s: sum(p.status == s for p in points) for s in sorted({p.status for p in points})}
  lines.append(f"{len(points)} points: " + ", ".join(f"{n} {s}" for s, n in counts.items())
               + (f". Main dev metric: `{metric}`" + (f", {scope}" if scope else "") + "."
                  if metric else "."))
  lines += ["", "## Points", "", "Dev metrics: final (best).", ""]
  header = ["point", *keys, "status", "steps", "wall s", "tokens/s",
            *[f"dev {m}" for m in metrics]]
  rows = []
  for p in points:
    status = p.status if p.status == "finished" or not p.last_line else \
        f"{p.status}: {p.last_line}"
    row = [p.name, *[_fmt(p.overrides.get(k)) for k in keys], status, _fmt(p.steps),
           _fmt(p.wall_s), _fmt(p.tokens_per_s)]
    row += [f"{_fmt(p.final[m])} ({_fmt(p.best[m])})" if m in p.final else "" for m in metrics]
    rows.append(row)
  lines += _table(header, rows)
  if groups:
    lines += ["", "## Over seeds", "", "Final dev metrics: median [min, max] ± std.", ""]
    header = ["setting", "seeds", *metrics]
    rows = []
    for g in groups:
      row = [setting_text(g["setting"]), ",".join(str(s) for s in g["seeds"])]
      for m in metrics:
        s = g["metrics"].get(m)
        row.append(f"{_fmt(s['median'])} [{_fmt(s['min'])}, {_fmt(s['max'])}] ± {_fmt(s['std'])}"
                   if s else "")
      rows.append(row)
    lines += _table(header, rows)
  if glue_result:
    lines += ["", "## GLUE", "", "Per task, the setting with the best median dev score over "
              "seeds; its median metrics.", ""]
    rows = []
    for task, c in glue_result["tasks"].items():
      shown = "; ".join(f"{n} " + ", ".join(f"{k} {_fmt(v)}" for k, v in m.items())
                        for n, m in c["metrics"].items())
      rows.append([task, setting_text(c["setting"]), c["seeds"], shown, _fmt(c["score"])])
    lines += _table(["task", "setting", "seeds", "median dev metrics", "score"], rows)
    if glue_result["average"] is not None:
      lines += ["", f"**GLUE average: {_fmt(glue_result['average'])}** over "
                f"{', '.join(glue_result['counted'])} (WNLI excluded; MNLI = mean of matched and "
                f"mismatched)."]
  if best:
    lines += ["", "## Best point per task and dev metric", ""]
    lines += _table(["task", "metric", "best final", "point"],
                    [[b["task"], b["metric"], _fmt(b["value"]), b["point"]] for b in best])
  return "\n".join(lines) + "\n"


def _check_writable(sweep_dir: paths.Path) -> None:
  """The report is written into the sweep's folder: one that cannot be written to (read-only,
  another user's) is refused before anything is read."""
  if paths.is_remote(sweep_dir) or not sweep_dir.is_dir():
    return  # a remote store says so at the first write; a missing folder is load_points' line
  if not os.access(sweep_dir, os.W_OK | os.X_OK):
    fail(f"{sweep_dir} is not writable, and the report is written into it (report.md, "
         f"train_loss.png, dev_vs_lr.png); fix: make it writable, or copy the folder (cp -r "
         f"{sweep_dir} SOMEWHERE) and report on the copy")


def write_report(sweep_dir: str | pathlib.Path, metric: str | None = None) -> dict[str, Any]:
  """Writes report.md, train_loss.png and dev_vs_lr.png (with .json data) into `sweep_dir`
  (local or remote)."""
  sweep_dir = paths.as_path(sweep_dir)
  _check_writable(sweep_dir)
  points = load_points(sweep_dir)
  metric = main_metric(points, metric)
  scope = metric_scope(points, metric)
  groups, best, glue_result = seed_groups(points), best_points(points), glue_summary(points)
  text = render_markdown(sweep_dir, points, metric, groups, best, glue_result, scope)
  paths.replace_text(sweep_dir / "report.md", text)
  plot_train_loss(points, sweep_dir / "train_loss.png")
  lower = run_files.lower_is_better(metric or "")
  plot_dev_curve(points, metric, sweep_dir / "dev_curve.png", scope, lower)
  if not is_run(sweep_dir):  # one run: one learning rate, no curve against it
    plot_dev_vs_lr(points, metric, sweep_dir / "dev_vs_lr.png", scope, lower)
  search = (run_files.read_json(sweep_dir / "sweep.json") or {}).get("search")
  if isinstance(search, dict) and isinstance(search.get("metric"), str):  # a search's sweep
    plot_search(points, search["metric"], search.get("mode", "min"), search.get("space") or {},
                sweep_dir / "search.png")
  return {"points": points, "metric": metric, "scope": scope, "seed_groups": groups,
          "best": best, "glue": glue_result, "markdown": text}


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_string("metric", None, "the dev metric to plot against the steps and the learning "
                      "rate", flag_values=fv)


def main(argv: Sequence[str] | None = None) -> None:
  """`python -m bertjax.tools.report SWEEP_DIR`: SWEEP_DIR is the --workdir of a sweep, a folder
  of runs or one run."""
  fv, [sweep_dir] = command_line.parse(sys.argv[1:] if argv is None else argv, define_flags,
                                       prog="python -m bertjax.tools.report", doc=__doc__,
                                       positional=["SWEEP_DIR"])
  report = write_report(sweep_dir, fv.metric)
  print(report["markdown"])
  where = paths.as_path(sweep_dir)
  print(f"wrote {where / 'report.md'}, train_loss.png, dev_curve.png"
        + ("" if is_run(where) else ", dev_vs_lr.png")
        + (", search.png" if (where / "search.png").is_file() else ""))


if __name__ == "__main__":
  run_cli(main)
