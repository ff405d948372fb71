"""Sweep files: what a sweep is (its points, their names), read and checked before anything runs."""

from __future__ import annotations

import ast
import copy
import dataclasses
import hashlib
import inspect
import itertools
import pathlib
import re
import sys
from typing import Any, Callable, Sequence

from bertjax.config import config_checks, config_lib
from bertjax.core.errors import UserError, fail


REPO = pathlib.Path(__file__).resolve().parents[2]
REMOTE_DIR = "bertjax"          # where the code lives on remote hosts, relative to the home folder
SOURCE_TARBALL = "/tmp/bertjax_src.tar.gz"
COORDINATOR_PORT = 8476         # jax.distributed coordinator port on the first of --hosts
# What never travels to remote hosts: VCS data, caches, and run outputs (they can be huge).
PACK_EXCLUDES = (".git", "__pycache__", "*.pyc", ".pytest_cache", "*.egg-info", "runs", ".venv",
                 "venv")
SWEEP_KEYS = ("config", "fixed", "product", "points", "search", "command")
# Resolved config values worth keeping per point (the report groups and plots by them).
RESOLVED_KEYS = ("objective", "task", "learning_rate", "batch_size", "seed", "total_steps",
                 "num_epochs")
MAX_NAME_LEN = 200              # file names may be 255 bytes; leave room for suffixes


@dataclasses.dataclass
class Point:
  name: str
  overrides: dict[str, Any]   # the swept keys and values (what the name shows)
  args: list[str]             # every --config.k=v of this point: fixed, command line, swept
  total_steps: int            # from the config; 0 when the trainer derives it (GLUE epochs)
  resolved: dict[str, Any]
  # What the sweep sets (fixed, command line, swept), as the config holds it: a finished point
  # trained with other values is not skipped as if it were this one (runner.check_finished).
  settings: dict[str, Any] = dataclasses.field(default_factory=dict)
  config: Any = dataclasses.field(default=None, repr=False)  # its resolved ConfigDict


@dataclasses.dataclass
class Sweep:
  path: str
  arg: str | None
  config: str                 # the config spec as the commands give it
  points: list[Point]         # a sampled search's are drawn as it runs (`make_point`)
  # What a search asks for (bertjax/sweep/search.py: sampler, space, metric, pruner), or None.
  search: dict[str, Any] | None = None
  command: str = "launch.py"  # the script each point runs, with launch.py's flags
  make_point: Callable[[dict[str, Any]], Point] | None = None  # overrides -> a checked point


# ---------------------------------------------------------------------------------------------
# Sweep files and points.


def format_value(value: Any) -> str:
  """A value as `--config.key=` text that config_lib parses back to the same value."""
  if isinstance(value, str):
    # A string that reads as a literal (`1e-3`, `True`) is quoted so it stays a string.
    try:
      ast.literal_eval(value)
      return repr(value)
    except (SyntaxError, ValueError):
      return value
  if isinstance(value, (list, tuple)):
    value = tuple(value)
    if all(isinstance(v, (int, float)) for v in value):
      # No spaces: `(2,2,1)` is one word for a shell and needs less quoting in remote commands.
      return repr(value).replace(" ", "")
  return repr(value)


def _name_value(value: Any) -> str:
  if isinstance(value, (list, tuple)):
    return "x".join(_name_value(v) for v in value)
  text = repr(value) if isinstance(value, float) else str(value)
  return re.sub(r"[^A-Za-z0-9._+-]", "_", text)


def point_name(overrides: dict[str, Any]) -> str:
  """`{'seed': 1, 'learning_rate': 1e-3}` -> `learning_rate=0.001,seed=1` (stable, file-safe)."""
  if not overrides:
    return "base"
  name = ",".join(f"{re.sub(r'[^A-Za-z0-9._+-]', '_', k)}={_name_value(overrides[k])}"
                  for k in sorted(overrides))
  if len(name) > MAX_NAME_LEN:
    digest = hashlib.sha1(name.encode()).hexdigest()[:10]
    name = name[:MAX_NAME_LEN - 11] + "-" + digest
  return name


def _check_mapping(where: str, value: Any) -> dict[str, Any]:
  if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
    fail(f"{where} must be a dict of config key -> value, got {type(value).__name__}")
  return dict(value)


def load_sweep_spec(spec: str) -> tuple[dict[str, Any], str, str | None]:
  """`experiments/x.py[:arg]` -> (the dict its get_sweep(arg) returns, path, arg)."""
  path, _, arg = spec.partition(":")
  arg = arg or None
  file = pathlib.Path(path)
  if not file.is_file() and not file.is_absolute() and (REPO / path).is_file():
    file = REPO / path
  if not file.is_file():
    fail(f"sweep file {path} not found; pass one such as experiments/quickstart_sweep.py")
  if str(REPO) not in sys.path:  # sweep and config files import configs.common
    sys.path.insert(0, str(REPO))
  module = config_lib.load_module(file, "sweep")
  get_sweep = getattr(module, "get_sweep", None)
  if get_sweep is None:
    fail(f"sweep file {path} defines no get_sweep(); add one returning a dict with 'config'")
  if inspect.signature(get_sweep).parameters:
    raw = get_sweep(arg)
  elif arg is not None:
    fail(f"sweep file {path} takes no argument; drop ':{arg}' from --sweep")
  else:
    raw = get_sweep()
  if not isinstance(raw, dict):
    fail(f"{path}: get_sweep() must return a dict with keys {', '.join(SWEEP_KEYS)}")
  unknown = sorted(set(raw) - set(SWEEP_KEYS))
  if unknown:
    fail(f"{path}: unknown sweep key {unknown[0]!r}; use {', '.join(SWEEP_KEYS)}")
  if not isinstance(raw.get("config"), str) or not raw["config"]:
    fail(f"{path}: get_sweep() needs 'config', a config spec such as 'configs/quickstart.py'")
  return raw, path, arg


def expand_points(raw: dict[str, Any], where: str) -> list[dict[str, Any]]:
  """The swept overrides of every point: explicit points crossed with the product."""
  product = _check_mapping(f"{where}: 'product'", raw.get("product", {}))
  for key, values in product.items():
    if not isinstance(values, (list, tuple)) or not values:
      fail(f"{where}: product[{key!r}] must be a non-empty list of values")
  explicit = raw.get("points", [{}])
  if not isinstance(explicit, (list, tuple)) or not explicit:
    fail(f"{where}: 'points' must be a non-empty list of dicts")
  combos = [dict(zip(product, values)) for values in itertools.product(*product.values())]
  points = []
  for i, point in enumerate(explicit):
    point = _check_mapping(f"{where}: points[{i}]", point)
    shared = sorted(set(point) & set(product))
    if shared:
      fail(f"{where}: key {shared[0]!r} is both in points[{i}] and in the product; keep one")
    points += [{**point, **combo} for combo in combos]
  return points


def load_sweep(spec: str, overrides: Sequence[str] = (), also_check: Sequence[str] = ()) -> Sweep:
  """Loads a sweep file and checks every point's config as the trainer would before it prepares
  anything (`config_checks.check_config`); nothing runs.

  `overrides` (`key=value`, as on the command line) join every point's args; `also_check` is
  applied in the check only (settings the remote commands add themselves).
  """

  raw, path, arg = load_sweep_spec(spec)
  where = f"sweep {path}"
  fixed = _check_mapping(f"{where}: 'fixed'", raw.get("fixed", {}))
  search = raw.get("search")
  space = search.get("space", {}) if isinstance(search, dict) else {}
  sampled = isinstance(search, dict) and search.get("sampler") is not None
  if sampled and ("product" in raw or "points" in raw):
    fail(f"{where}: a search with a sampler draws its points; drop 'product' and 'points', or "
         "drop 'sampler' to run (and prune) the grid")
  swept = [] if sampled else expand_points(raw, where)
  swept_keys = {k for p in swept for k in p} | set(space if isinstance(space, dict) else ())
  twice = sorted(set(fixed) & swept_keys)
  if twice:  # passed twice, the last would silently win
    fail(f"{where}: key {twice[0]!r} is both in 'fixed' and swept ('product', 'points' or the "
         "search's 'space'); keep one")
  cli = [o.removeprefix("--").removeprefix("config.") for o in overrides]
  for item in cli:
    key = item.partition("=")[0]
    if key in swept_keys:
      fail(f"--config.{key} is swept by {path}; remove it from the command line or the sweep")
  command = raw.get("command", "launch.py")
  if not isinstance(command, str) or not (REPO / command).is_file():
    fail(f"{where}: 'command' {command!r} is not a script under {REPO}; leave it out to run "
         "launch.py")

  config_spec = raw["config"]
  config_path = config_spec.partition(":")[0]
  if not pathlib.Path(config_path).is_absolute() and not (REPO / config_path).is_file():
    fail(f"{where}: config file {config_path} not found under {REPO}; give a path relative to "
         f"the repository root, such as configs/quickstart.py")
  base = _with_where(where, config_lib.load_config_file,
                     str(REPO / config_spec) if not pathlib.Path(config_path).is_absolute()
                     else config_spec)
  fixed_args = [f"{k}={format_value(v)}" for k, v in fixed.items()] + cli
  _with_where(where, config_lib.apply_overrides, copy.deepcopy(base), fixed_args)

  def make_point(overrides_: dict[str, Any]) -> Point:
    """A point of these overrides, its config checked as the trainer would."""
    name = point_name(overrides_)
    args = fixed_args + [f"{k}={format_value(v)}" for k, v in overrides_.items()]
    config = copy.deepcopy(base)
    _with_where(f"{where}: point {name}", config_lib.apply_overrides, config,
                args + list(also_check))
    # The trainer's settings checks, on every point before any runs (and in --dry_run).
    _with_where(f"{where}: point {name}", config_checks.check_config, config)
    if config.get("seeds"):
      fail(f"{where}: point {name} sets seeds={tuple(config.seeds)}; sweep over 'seed' instead "
           f"so each seed is its own point")
    resolved = {k: plain_value(config[k]) for k in RESOLVED_KEYS if k in config}
    keys = dict.fromkeys(a.partition("=")[0] for a in args)
    settings = {k: plain_value(config[k]) for k in keys}
    return Point(name=name, overrides=overrides_, args=[f"--config.{a}" for a in args],
                 total_steps=int(config.get("total_steps", 0) or 0), resolved=resolved,
                 settings=settings, config=config)

  points, names = [], {}
  for overrides_ in swept:
    point = make_point(overrides_)
    if point.name in names:
      fail(f"{where}: points {names[point.name]} and {overrides_} share the name {point.name}; "
           f"make their values differ in letters or digits")
    names[point.name] = overrides_
    points.append(point)
  return Sweep(path=path, arg=arg, config=config_spec, points=points,
               search=search, command=command,
               make_point=make_point)


def _with_where(where: str, fn, *args):
  try:
    return fn(*args)
  except UserError as e:
    raise UserError(f"{where}: {e}") from None


def plain_value(value: Any) -> Any:
  return list(value) if isinstance(value, tuple) else value
