"""Sweeps that search and prune, through optuna: what a sweep file's `search` asks for, checked
before anything runs, and the study that draws its points and stops the poor ones.

  search = {
      "sampler": "random",            # or "tpe" (optuna's TPESampler); leave it out to run the
                                      # grid of 'product'/'points' (and prune it)
      "trials": 12, "seed": 0,        # how many points to draw, and the sampler's seed
      "space": {"learning_rate": ("log_uniform", 1e-5, 1e-3), "warmup_steps": ("int", 0, 100),
                "optimizer.b2": ("uniform", 0.95, 0.999), "seed": ("choice", [1, 2, 3])},
      "metric": "score", "mode": "max",   # default: the objective's main metric, its direction
      "pruner": "median",             # or "successive_halving", or {"kind": ..., **its options}
  }

optuna's samplers draw each point when a slot frees (TPE learns from the points done), and its
pruners decide on each point's dev metric: the sweep reads the eval rows a point writes to its
metrics.jsonl, at the run's own evaluation cadence, and reports them (`Trial.report`); the
trainer knows nothing of sweeps. A pruned point is stopped as a preemption stops it (SIGTERM: it
saves a checkpoint and exits), recorded "pruned" and never run again. A point's value is the best
of its evaluations. The trials live in WORKDIR/optuna.journal (optuna's JournalStorage on a
JournalFileBackend: a file several machines on one shared filesystem can use at once); a rerun
goes on with the trials there, and a journal of another sweep is refused. optuna is imported only
when a sweep file has `search` (`pip install ".[sweep]"`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from typing import Any

from bertjax.core import paths, run_files
from bertjax.core.errors import fail
from bertjax.registry import objective_class
from bertjax.runtime import metric_writers

SEARCH_KEYS = ("sampler", "trials", "seed", "space", "metric", "mode", "pruner")
SAMPLERS = ("random", "tpe")
DISTRIBUTIONS = ("uniform", "log_uniform", "int", "choice")
PRUNERS = {"median": "MedianPruner", "successive_halving": "SuccessiveHalvingPruner"}
JOURNAL = "optuna.journal"
STUDY = "bertjax-sweep"


@dataclasses.dataclass(frozen=True)
class Search:
  sampler: str | None         # None: the sweep's grid points, in order
  trials: int                 # points to draw (a grid: its number of points)
  seed: int | None
  space: dict[str, tuple]     # key -> (kind, low, high) or ("choice", [values])
  metric: str
  mode: str                   # "min" or "max"
  pruner: dict[str, Any] | None  # {"kind": ..., **options}

  def describe(self) -> str:
    drawn = (f"{self.sampler} sampler, {self.trials} points over " + ", ".join(
        f"{k} ~ {v[0]}{tuple(v[1:]) if v[0] != 'choice' else v[1]}" for k, v in self.space.items())
        if self.sampler else "the grid's points")
    pruner = self.pruner["kind"] if self.pruner else "none"
    return f"search: {drawn}; metric {self.metric} ({self.mode}); pruner {pruner}"


def import_optuna(where: str):
  try:
    import optuna  # pylint: disable=import-outside-toplevel
  except ImportError:
    fail(f"{where} asks for a search, which needs optuna: pip install \".[sweep]\" (the sweep "
         "extra)")
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  return optuna


def _number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _distribution(where: str, key: str, spec: Any) -> tuple:
  """A checked `(kind, low, high)` or `("choice", [values])`."""
  kind = spec[0] if isinstance(spec, (list, tuple)) and spec else None
  if kind not in DISTRIBUTIONS:
    fail(f"{where}: space[{key!r}] must be (kind, ...) with kind one of "
         f"{', '.join(DISTRIBUTIONS)}, e.g. ('log_uniform', 1e-5, 1e-3); got {spec!r}")
  if kind == "choice":
    values = spec[1] if len(spec) == 2 else None
    if (not isinstance(values, (list, tuple)) or not values or not all(
        v is None or isinstance(v, (bool, int, float, str)) for v in values)):
      fail(f"{where}: space[{key!r}] = {spec!r} must be ('choice', [values]), a non-empty list "
           "of numbers, strings or booleans")
    return ("choice", list(values))
  if len(spec) != 3 or not all(_number(v) for v in spec[1:]):
    fail(f"{where}: space[{key!r}] = {spec!r} must be ({kind!r}, low, high) with numbers")
  low, high = spec[1:]
  if kind == "int" and not all(isinstance(v, int) for v in (low, high)):
    fail(f"{where}: space[{key!r}] = {spec!r}: an 'int' range needs whole-number bounds")
  if low >= high:
    fail(f"{where}: space[{key!r}] = {spec!r} has low {low!r} >= high {high!r}; give low < high")
  if kind == "log_uniform" and low <= 0:
    fail(f"{where}: space[{key!r}] = {spec!r}: a log-uniform range needs low > 0")
  return (kind, low, high)


def parse(raw: Any, sweep, where: str) -> Search:
  """The sweep file's `search`, checked against the sweep's points (a pruner needs their
  evaluations; the metric must be one they log), with optuna present. Writes nothing."""
  if not isinstance(raw, dict):
    fail(f"{where}: 'search' must be a dict with keys {', '.join(SEARCH_KEYS)}")
  unknown = sorted(set(raw) - set(SEARCH_KEYS))
  if unknown:
    fail(f"{where}: unknown search key {unknown[0]!r}; use {', '.join(SEARCH_KEYS)}")
  optuna = import_optuna(where)
  sampler = raw.get("sampler")
  if sampler is not None and sampler not in SAMPLERS:
    fail(f"{where}: search sampler {sampler!r} is not one of {', '.join(SAMPLERS)} (leave it "
         "out to run the grid)")
  space = raw.get("space", {})
  if not isinstance(space, dict) or (sampler and not space):
    fail(f"{where}: a search with a sampler needs 'space', a dict of config key -> "
         "distribution, e.g. {'learning_rate': ('log_uniform', 1e-5, 1e-3)}")
  if space and not sampler:
    fail(f"{where}: the search's 'space' needs a 'sampler' ({', '.join(SAMPLERS)}) to draw from")
  space = {k: _distribution(where, k, v) for k, v in space.items()}
  trials = raw.get("trials", len(sweep.points))
  if sampler and (isinstance(trials, bool) or not isinstance(trials, int) or trials < 1):
    fail(f"{where}: a search with a sampler needs 'trials', how many points to draw (>= 1); "
         f"got {trials!r}")
  seed = raw.get("seed")
  if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
    fail(f"{where}: the search's 'seed' must be a whole number; got {seed!r}")

  # Every value a point can take passes the trainer's checks (the extremes stand for a range).
  for key, dist in space.items():
    for value in (dist[1] if dist[0] == "choice" else dist[1:]):
      sweep.make_point({key: value})
  config = (sweep.points[0] if sweep.points else sweep.make_point({})).config
  cls = objective_class(config.objective)
  main = cls.main_metric(config)
  metric = raw.get("metric", main)
  known = {"loss", main, *metric_writers.SHOWN}
  if not isinstance(metric, str) or not (metric in known or metric.endswith(("_loss",
                                                                              "_accuracy"))):
    fail(f"{where}: metric {metric!r} is not one a {config.objective} run logs at evaluation; "
         f"its main metric is {main!r}")
  mode = raw.get("mode", "min" if run_files.lower_is_better(metric) else "max")
  if mode not in ("min", "max"):
    fail(f"{where}: the search's 'mode' must be 'min' or 'max'; got {mode!r}")

  pruner = raw.get("pruner")
  if pruner is not None:
    pruner = dict(pruner) if isinstance(pruner, dict) else {"kind": pruner}
    if pruner.get("kind") not in PRUNERS:
      fail(f"{where}: pruner {pruner.get('kind')!r} is not one of {', '.join(PRUNERS)}")
    options = {k: v for k, v in pruner.items() if k != "kind"}
    try:
      getattr(optuna.pruners, PRUNERS[pruner["kind"]])(**options)
    except (TypeError, ValueError) as e:
      fail(f"{where}: pruner {pruner['kind']!r} refuses {options}: {' '.join(str(e).split())}")
    points = sweep.points or [sweep.make_point({})]
    for point in points:
      c = point.config
      if not (c.get("evals") or int(c.get("eval_every", 0) or 0) > 0
              or objective_class(c.objective).data_kind == "task"):
        fail(f"{where}: pruner {pruner['kind']!r} reads each point's dev metric, and point "
             f"{point.name} never evaluates (eval_every=0); set eval_every to how often it "
             "should")
  return Search(sampler=sampler, trials=trials if sampler else len(sweep.points), seed=seed,
                space=space, metric=metric, mode=mode, pruner=pruner)


def fingerprint(sweep, search: Search) -> dict[str, Any]:
  """What makes a study this sweep's: its config, settings, space and what it optimizes (not
  `trials`: a rerun may ask for more)."""
  args = sorted({a for p in sweep.points for a in p.args} if sweep.points
                else sweep.make_point({}).args)
  return json.loads(json.dumps({
      "config": sweep.config, "command": sweep.command, "args": args,
      "points": [p.name for p in sweep.points], "sampler": search.sampler, "seed": search.seed,
      "space": search.space, "metric": search.metric, "mode": search.mode,
      "pruner": search.pruner}, default=str))


def check_storage(workdir: paths.Path, spec: dict[str, Any]) -> None:
  """Refuses a journal that holds another sweep's study (before anything is written)."""
  journal = workdir / JOURNAL
  if not journal.is_file():
    return
  optuna = import_optuna(f"sweep in {workdir}")
  storage = optuna.storages.JournalStorage(
      optuna.storages.journal.JournalFileBackend(str(journal)))
  for study in storage.get_all_studies():
    if study.study_name == STUDY and study.user_attrs.get("sweep") != spec:
      old = study.user_attrs.get("sweep", {})
      differ = sorted(k for k in set(spec) | set(old) if spec.get(k) != old.get(k))
      fail(f"{journal} holds the trials of another sweep (its {', '.join(differ) or 'spec'} "
           "differ); use a new --workdir for this one, or give the spec it was run with")


class Study:
  """The sweep's optuna study: draws points (`next_point`), watches a running point's eval rows
  (`watch`) and records how it ended (`done`). Thread-safe: points run at once call it."""

  def __init__(self, sweep, search: Search, workdir: paths.Path, spec: dict[str, Any]):
    optuna = self.optuna = import_optuna(f"sweep {sweep.path}")
    self.sweep, self.search, self.lock = sweep, search, threading.Lock()
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(workdir / JOURNAL)))
    pruner = (getattr(optuna.pruners, PRUNERS[search.pruner["kind"]])(
        **{k: v for k, v in search.pruner.items() if k != "kind"}) if search.pruner
        else optuna.pruners.NopPruner())
    self.study = optuna.create_study(
        storage=storage, study_name=STUDY, load_if_exists=True, pruner=pruner,
        direction="minimize" if search.mode == "min" else "maximize")
    self.study.set_user_attr("sweep", spec)
    self.trials: dict[str, Any] = {}  # point name -> its running optuna Trial
    self.reported: dict[str, set[int]] = {}
    states = optuna.trial.TrialState
    # A rerun: the points an interrupted sweep left running go on in their own trials.
    self.resumed = [t for t in self.study.get_trials(deepcopy=False, states=(states.RUNNING,))]
    # Each point done in an earlier run of the sweep: "complete", "pruned" or "fail".
    self.done = {t.user_attrs.get("point"): t.state.name.lower() for t in self.study.get_trials(
        deepcopy=False, states=(states.COMPLETE, states.PRUNED, states.FAIL))}

  def _sampler(self, number: int):
    """A sampler seeded from the search's seed and the trial's number: a point's draw does not
    depend on how many sweep processes drew before it."""
    seed = None if self.search.seed is None else self.search.seed * 100_003 + number
    if self.search.sampler == "tpe":
      return self.optuna.samplers.TPESampler(seed=seed)
    return self.optuna.samplers.RandomSampler(seed=seed)

  def _distributions(self) -> dict[str, Any]:
    d = self.optuna.distributions
    out = {}
    for key, (kind, *bounds) in self.search.space.items():
      out[key] = (d.CategoricalDistribution(bounds[0]) if kind == "choice" else
                  d.IntDistribution(*bounds) if kind == "int" else
                  d.FloatDistribution(*bounds, log=kind == "log_uniform"))
    return out

  def _start(self, trial, point) -> Any:
    trial.set_user_attr("point", point.name)
    trial.set_user_attr("overrides", json.loads(json.dumps(point.overrides, default=str)))
    self.trials[point.name] = trial
    self.reported[point.name] = set(getattr(trial, "intermediate_values", {}) or {})
    return point

  def next_point(self, grid_todo: list):
    """The next point to run (None: the search is done): an interrupted trial's, else a new
    draw (the sampler's), else the grid's next point not finished or pruned."""
    with self.lock:
      while self.resumed:
        frozen = self.resumed.pop(0)
        point = self.sweep.make_point(dict(frozen.params)) if self.search.sampler else next(
            (p for p in grid_todo if p.name == frozen.user_attrs.get("point")), None)
        if point is None:
          continue
        if point in grid_todo:
          grid_todo.remove(point)
        trial = self.optuna.trial.Trial(self.study, frozen._trial_id)  # pylint: disable=protected-access
        self.reported[point.name] = set(frozen.intermediate_values)
        self.trials[point.name] = trial
        return point
      if self.search.sampler:
        if len(self.study.get_trials(deepcopy=False)) >= self.search.trials:
          return None
        self.study.sampler = self._sampler(len(self.study.get_trials(deepcopy=False)))
        trial = self.study.ask(self._distributions())
        return self._start(trial, self.sweep.make_point(dict(trial.params)))
      while grid_todo:
        point = grid_todo.pop(0)
        if self.done.get(point.name) in ("complete", "pruned"):
          continue
        return self._start(self.study.ask(), point)
      return None

  def watch(self, point, point_dir: paths.Path, prune: bool = True) -> bool:
    """Reports the eval rows the point wrote since the last call, one at a time; True when the
    pruner says to stop it. Each row is judged at its own step (optuna's pruners compare the
    trials' values at the step last reported: rows read together are not judged at the last
    only). `prune=False`: report them only (the point has ended)."""
    trial = self.trials[point.name]
    metric, reported = self.search.metric, self.reported[point.name]
    for row in metric_writers.read_metrics(point_dir):
      if row["split"] != "eval" or row["step"] in reported:
        continue
      if metric not in row:
        shown = ", ".join(k for k in row if k not in ("step", "split"))
        fail(f"point {point.name} logs no {metric!r} at evaluation (its eval rows have "
             f"{shown}); give the search a metric it logs")
      reported.add(row["step"])
      if isinstance(row[metric], (int, float)):
        with self.lock:
          trial.report(float(row[metric]), row["step"])
          if prune and self.search.pruner is not None and trial.should_prune():
            return True
    return False

  def value(self, point_dir: paths.Path) -> float | None:
    values = [r[self.search.metric] for r in metric_writers.read_metrics(point_dir)
              if r["split"] == "eval" and isinstance(r.get(self.search.metric), (int, float))]
    if not values:
      return None
    return (min if self.search.mode == "min" else max)(values)

  def done_with(self, point, point_dir: paths.Path, status: str) -> float | None:
    """Tells the study how the point ended (finished, pruned, failed); its value when finished.
    A preempted point's trial stays running: a rerun goes on with it."""
    states = self.optuna.trial.TrialState
    # The rows written after the last watch (a point that ends between two): the pruner compares
    # the next points with every evaluation of this one.
    self.watch(point, point_dir, prune=False)
    trial = self.trials.pop(point.name)
    value = self.value(point_dir)
    with self.lock:
      if status == "finished" and value is not None:
        self.study.tell(trial, value)
      elif status == "pruned":
        self.study.tell(trial, state=states.PRUNED)
      elif status != "preempted":
        self.study.tell(trial, state=states.FAIL)
    return value

  def best(self) -> dict[str, Any] | None:
    """The best finished point: its name, trial, value and settings."""
    states = self.optuna.trial.TrialState
    complete = self.study.get_trials(deepcopy=False, states=(states.COMPLETE,))
    if not complete:
      return None
    t = self.study.best_trial
    return {"name": t.user_attrs.get("point"), "trial": t.number, self.search.metric: t.value,
            "settings": t.user_attrs.get("overrides", dict(t.params))}
