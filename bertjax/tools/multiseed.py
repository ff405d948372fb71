"""Several seeds of one experiment in one command: `--config.seeds='(1,2,3)'`.

Fine-tuning results on small data sets (RTE, MRPC, STS-B, CoLA) swing by points from seed to
seed, so papers report the median (or mean and spread) over several runs. `run_seeds` trains one
run per seed into WORKDIR/seed_<n> through `train.train_and_evaluate` (each resumes on its own,
so re-running the command finishes an interrupted sweep) and writes WORKDIR/seeds_summary.json
(WORKDIR local or remote: gs://...):

  {"seeds": [1, 2, 3],
   "runs": {"1": {<final dev metrics of seed 1>}, ...},
   "summary": {metric: {"median", "mean", "min", "max", "std", "n"}}}

std is the sample standard deviation (ddof=1; 0 for a single seed). A metric a run did not report
(or reported as NaN) is left out of that metric's statistics, and `n` says how many runs count.
"""

from __future__ import annotations

import json
import logging
import math
import pathlib
from typing import Any, Mapping, Sequence

import ml_collections
import numpy as np

from bertjax.config import config_lib
from bertjax.core import paths
from bertjax.core.errors import Interrupted, Preempted, fail
from bertjax.trainer import train

_log = logging.getLogger(__name__)


def seed_list(config: ml_collections.ConfigDict) -> list[int]:
  """`config.seeds` as distinct ints, in order; [] when empty or absent."""
  seeds = config.get("seeds") or ()
  if isinstance(seeds, (int, np.integer)):
    seeds = (seeds,)
  out = []
  for s in seeds:
    if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
      fail(f"seeds={tuple(seeds)!r} must hold integers, e.g. --config.seeds='(1,2,3)'")
    if int(s) in out:
      fail(f"seed {s} appears twice in seeds={tuple(seeds)!r}; give each seed once")
    out.append(int(s))
  return out


def summarize(runs: Mapping[Any, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
  """Per metric, median/mean/min/max/std (ddof=1) over the runs that report a finite number."""
  names: list[str] = []
  for metrics in runs.values():
    names += [k for k in metrics if k not in names]
  out = {}
  for name in names:
    values = [float(m[name]) for m in runs.values()
              if isinstance(m.get(name), (int, float)) and not isinstance(m.get(name), bool)
              and math.isfinite(float(m[name]))]
    if not values:
      continue
    v = np.asarray(values, np.float64)
    out[name] = {"median": float(np.median(v)), "mean": float(np.mean(v)),
                 "min": float(np.min(v)), "max": float(np.max(v)),
                 "std": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0, "n": len(v)}
  return out


def run_seeds(config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
              seeds: Sequence[int] | None = None) -> dict[str, Any]:
  """Trains `config` once per seed into WORKDIR/seed_<n>; writes and returns the summary."""

  workdir = paths.as_path(workdir)
  seeds = list(seeds) if seeds is not None else seed_list(config)
  if not seeds:
    fail("no seeds to run; set --config.seeds='(1,2,3)' (or call train.train_and_evaluate)")
  workdir.mkdir(parents=True, exist_ok=True)
  runs: dict[str, dict[str, Any]] = {}
  for seed in seeds:
    # A fresh copy per seed: every run starts from the same experiment config.
    run_config = config_lib.copy_config(config)  # keeps which keys were overridden
    run_config.seed = seed
    if "seeds" in run_config:
      run_config.seeds = ()
    _log.info("seed %d -> %s", seed, workdir / f"seed_{seed}")
    summary = train.train_and_evaluate(run_config, workdir / f"seed_{seed}")
    status = str(summary.get("status", ""))
    if status.startswith(("preempted", "interrupted")):  # the later seeds wait for a rerun
      stopped = Interrupted if status.startswith("interrupted") else Preempted
      raise stopped(f"{'Ctrl-C' if stopped is Interrupted else 'SIGTERM'} at step {summary['step']} of seed {seed}; checkpoint "
                      f"{summary.get('checkpoint') or 'none'} saved; run the same command again "
                      "to go on")
    runs[str(seed)] = dict(summary.get("last_eval") or {})
    if not runs[str(seed)]:
      _log.warning("seed %d finished without dev metrics (is eval_every 0?)", seed)
  result = {"seeds": seeds, "runs": runs, "summary": summarize(runs)}
  paths.replace_text(workdir / "seeds_summary.json", json.dumps(result, indent=2) + "\n")
  for name, s in result["summary"].items():
    _log.info("%s over %d seeds: median %.4f (min %.4f, max %.4f, std %.4f)", name, s["n"],
              s["median"], s["min"], s["max"], s["std"])
  return result
