"""Hyperparameter sweeps from files: each point in its own process, resumable, local or remote.

  python launch.py --sweep experiments/quickstart_sweep.py --workdir runs/qs_sweep [--dry_run]
  python launch.py --sweep experiments/glue_bert_grid.py:task=rte --workdir runs/rte_grid \
      --config.init_from=runs/bert-base-uncased
  python -m bertjax.report runs/qs_sweep

A sweep file defines `get_sweep(arg=None) -> dict` (`arg` is what follows `:` in the --sweep
spec, as for configs) with these keys:

  config   the base config spec, as given to --config (relative paths: from the repository root).
  fixed    {key: value} set on every point; not part of the point names.
  product  {key: [values]}: every combination (the last key varies fastest).
  points   [{key: value}, ...]: explicit points.

With only `product`, the points are its combinations; with only `points`, the list; with both,
each explicit point crossed with the product (e.g. objectives x seeds). Keys are config keys with
dots (`optimizer.b2`), values Python values. `--config.key=value` given with --sweep are added to
`fixed` (a swept key there is refused: the point names would lie). Every point is checked against
the config before anything runs: an unknown key or a bad value fails naming it.

Each point runs in DIR/<name>, its name made of its swept keys and values, sorted by key
(`learning_rate=0.001,seed=1`; characters outside `[A-Za-z0-9._+-]` become `_`; a tuple's
elements join with `x`), as `python launch.py --config C --workdir DIR/<name> --config.k=v ...`,
one after another, its output appended to DIR/<name>/log.txt. A point is done when its
summary.json says "finished" at the config's total_steps: a re-run skips it. Any other point is
launched again, and the trainer resumes it from its latest checkpoint. A point that crashes is
recorded as failed with the last line of its log, and the sweep goes on. DIR/sweep.json holds
every point's overrides, status, command, last log line, runs and wall time; SIGTERM is passed
to the running point (which saves a checkpoint) and stops the sweep.

Remote runs (see experiments/README.md): `--tpu NAME --zone Z [--project P]` first packs this
repository, copies it to every worker of the Cloud TPU VM and installs it, then runs each point
on all workers at once through `gcloud compute tpus tpu-vm ssh --worker=all` with
`--config.distributed=True`. `--hosts h1,h2` does the same over plain ssh (rsync, then one process
per host), each process given JAX_COORDINATOR_ADDRESS (first host, port COORDINATOR_PORT),
JAX_NUM_PROCESSES and JAX_PROCESS_ID. The workdir is then a path on the hosts: use one shared by
all of them (NFS, or a GCS bucket mounted with gcsfuse) at the same path as on this machine, so
that skipping finished points and the report see the results. `--dry_run` prints every command.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import datetime
import hashlib
import importlib.util
import inspect
import itertools
import json
import os
import pathlib
import posixpath
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Sequence

from bertjax.errors import UserError, fail

REPO = pathlib.Path(__file__).resolve().parent.parent
REMOTE_DIR = "bertjax"          # where the code lives on remote hosts, relative to the home folder
SOURCE_TARBALL = "/tmp/bertjax_src.tar.gz"
COORDINATOR_PORT = 8476         # jax.distributed coordinator port on the first of --hosts
# What never travels to remote hosts: VCS data, caches, and run outputs (they can be huge).
PACK_EXCLUDES = (".git", "__pycache__", "*.pyc", ".pytest_cache", "*.egg-info", "runs", ".venv",
                 "venv")
SWEEP_KEYS = ("config", "fixed", "product", "points")
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


@dataclasses.dataclass
class Sweep:
  path: str
  arg: str | None
  config: str                 # the config spec as the commands give it
  points: list[Point]


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
  module_spec = importlib.util.spec_from_file_location(f"bertjax_sweep_{file.stem}", file)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
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
  """Loads a sweep file and checks every point against its config; nothing runs.

  `overrides` (`key=value`, as on the command line) join every point's args; `also_check` is
  applied in the check only (settings the remote commands add themselves).
  """
  from bertjax import config_lib  # pylint: disable=g-import-not-at-top  (imports jax: slow)

  raw, path, arg = load_sweep_spec(spec)
  where = f"sweep {path}"
  fixed = _check_mapping(f"{where}: 'fixed'", raw.get("fixed", {}))
  swept = expand_points(raw, where)
  swept_keys = {k for p in swept for k in p}
  cli = [o.removeprefix("--").removeprefix("config.") for o in overrides]
  for item in cli:
    key = item.partition("=")[0]
    if key in swept_keys:
      fail(f"--config.{key} is swept by {path}; remove it from the command line or the sweep")

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

  points, names = [], {}
  for overrides_ in swept:
    name = point_name(overrides_)
    args = fixed_args + [f"{k}={format_value(v)}" for k, v in overrides_.items()]
    config = copy.deepcopy(base)
    _with_where(f"{where}: point {name}", config_lib.apply_overrides, config,
                args + list(also_check))
    if name in names:
      fail(f"{where}: points {names[name]} and {overrides_} share the name {name}; "
           f"make their values differ in letters or digits")
    names[name] = overrides_
    if config.get("seeds"):
      fail(f"{where}: point {name} sets seeds={tuple(config.seeds)}; sweep over 'seed' instead "
           f"so each seed is its own point")
    resolved = {k: _plain(config[k]) for k in RESOLVED_KEYS if k in config}
    points.append(Point(name=name, overrides=overrides_, args=[f"--config.{a}" for a in args],
                        total_steps=int(config.get("total_steps", 0) or 0), resolved=resolved))
  return Sweep(path=path, arg=arg, config=config_spec, points=points)


def _with_where(where: str, fn, *args):
  try:
    return fn(*args)
  except UserError as e:
    raise UserError(f"{where}: {e}") from None


def _plain(value: Any) -> Any:
  return list(value) if isinstance(value, tuple) else value


# ---------------------------------------------------------------------------------------------
# State of a point on disk.


def _read_json(path: pathlib.Path) -> Any:
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def is_finished(point_dir: pathlib.Path, total_steps: int) -> bool:
  """summary.json says finished at the config's total_steps (or, when the config leaves it to
  the trainer, at the total_steps the trainer resolved into config.json)."""
  summary = _read_json(pathlib.Path(point_dir) / "summary.json")
  if not isinstance(summary, dict) or summary.get("status") != "finished":
    return False
  if total_steps <= 0:
    total_steps = int((_read_json(pathlib.Path(point_dir) / "config.json") or {})
                      .get("total_steps", 0) or 0)
  return total_steps > 0 and summary.get("step") == total_steps


def last_line(text: str) -> str:
  """The last non-blank line (a traceback's ends with the exception; a UserError's is it)."""
  lines = [l.strip() for l in text.replace("\r", "\n").splitlines() if l.strip()]
  return lines[-1][:500] if lines else "(no output)"


# ---------------------------------------------------------------------------------------------
# Commands.


def local_command(sweep: Sweep, point: Point, workdir: pathlib.Path) -> list[str]:
  return [sys.executable, "launch.py", "--config", sweep.config, "--workdir",
          str(workdir / point.name), *point.args]


def _remote_launch(sweep: Sweep, point: Point, workdir: str, env: str = "") -> str:
  """The shell command a remote host runs for one point (in REMOTE_DIR, python3)."""
  argv = ["python3", "launch.py", "--config", sweep.config, "--workdir",
          posixpath.join(workdir, point.name), *point.args, "--config.distributed=True"]
  return f"cd {REMOTE_DIR} && {env}{shlex.join(argv)}"


def _gcloud(verb: str, tpu: str, zone: str, project: str | None) -> list[str]:
  project_args = ["--project", project] if project else []
  return ["gcloud", "compute", "tpus", "tpu-vm", verb, tpu, "--zone", zone, *project_args]


def pack_command() -> list[str]:
  excludes = [f"--exclude={p}" for p in PACK_EXCLUDES]
  return ["tar", "-czf", SOURCE_TARBALL, *excludes, "-C", str(REPO), "."]


def tpu_install_commands(tpu: str, zone: str, project: str | None) -> list[list[str]]:
  """Pack the repository here, copy it to every worker, unpack and pip install there."""
  tarball = posixpath.basename(SOURCE_TARBALL)
  install = (f"mkdir -p {REMOTE_DIR} && tar -xzf {tarball} -C {REMOTE_DIR} && cd {REMOTE_DIR} && "
             f'pip install -q -r requirements.txt "jax[tpu]"')
  project_args = ["--project", project] if project else []
  return [pack_command(),
          ["gcloud", "compute", "tpus", "tpu-vm", "scp", SOURCE_TARBALL, f"{tpu}:{tarball}",
           "--zone", zone, *project_args, "--worker=all"],
          [*_gcloud("ssh", tpu, zone, project), "--worker=all", "--command", install]]


def tpu_point_command(sweep: Sweep, point: Point, workdir: str, tpu: str, zone: str,
                      project: str | None) -> list[str]:
  return [*_gcloud("ssh", tpu, zone, project), "--worker=all", "--command",
          _remote_launch(sweep, point, workdir)]


def _host_address(host: str) -> str:
  return host.rpartition("@")[2]


def hosts_install_commands(hosts: Sequence[str]) -> list[list[str]]:
  excludes = [f"--exclude={p}" for p in PACK_EXCLUDES]
  commands = []
  for host in hosts:
    commands.append(["rsync", "-az", *excludes, f"{REPO}/", f"{host}:{REMOTE_DIR}/"])
    commands.append(["ssh", host, f'cd {REMOTE_DIR} && pip install -q -r requirements.txt '
                                  f'"jax[cuda12]"'])
  return commands


def hosts_point_commands(sweep: Sweep, point: Point, workdir: str,
                         hosts: Sequence[str]) -> list[list[str]]:
  """One ssh command per host, run together: process i of len(hosts), coordinator on hosts[0]."""
  coordinator = f"{_host_address(hosts[0])}:{COORDINATOR_PORT}"
  commands = []
  for i, host in enumerate(hosts):
    env = (f"JAX_COORDINATOR_ADDRESS={coordinator} JAX_NUM_PROCESSES={len(hosts)} "
           f"JAX_PROCESS_ID={i} ")
    commands.append(["ssh", host, _remote_launch(sweep, point, workdir, env)])
  return commands


def jax_distributed_kwargs(environ: dict[str, str] | None = None) -> dict[str, Any]:
  """jax.distributed.initialize() arguments from the variables `--hosts` sets (empty on Cloud
  TPU, where JAX discovers every setting itself). JAX reads JAX_COORDINATOR_ADDRESS on its own,
  but not the process count and id."""
  environ = os.environ if environ is None else environ
  kwargs: dict[str, Any] = {}
  if environ.get("JAX_COORDINATOR_ADDRESS"):
    kwargs["coordinator_address"] = environ["JAX_COORDINATOR_ADDRESS"]
  for var, key in (("JAX_NUM_PROCESSES", "num_processes"), ("JAX_PROCESS_ID", "process_id")):
    if environ.get(var):
      try:
        kwargs[key] = int(environ[var])
      except ValueError:
        fail(f"{var}={environ[var]!r} must be an integer")
  return kwargs


# ---------------------------------------------------------------------------------------------
# Running.


class _Stop:
  """SIGTERM while a point runs: pass it on (the trainer checkpoints and exits), then stop."""

  def __init__(self):
    self.requested = False
    self.procs: list[subprocess.Popen] = []
    self._previous = None

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True
    for proc in self.procs:
      if proc.poll() is None:
        proc.terminate()

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def _run_logged(commands: list[list[str]], logs: list[pathlib.Path], stop: _Stop,
                cwd: pathlib.Path | None) -> tuple[int, str]:
  """Runs commands together, each appending its output to its log. Returns the exit code and
  this run's last output line of the first command that failed (else of the first command)."""
  procs, files, offsets = [], [], []
  try:
    for argv, log in zip(commands, logs):
      log.parent.mkdir(parents=True, exist_ok=True)
      f = log.open("a")
      stamp = datetime.datetime.now().isoformat(timespec="seconds")
      f.write(f"# bertjax.sweep {stamp}: {shlex.join(argv)}\n")
      f.flush()
      files.append(f)
      offsets.append(f.tell())
      try:
        procs.append(subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=cwd,
                                      stdin=subprocess.DEVNULL))
      except FileNotFoundError:
        for p in procs:  # the hosts already started cannot run without this one
          p.terminate()
          p.wait()
        fail(f"{argv[0]} not found; install it, or use --dry_run to print the commands")
      stop.procs = procs
    codes = [p.wait() for p in procs]
  except KeyboardInterrupt:
    for p in procs:
      p.wait()
    raise
  finally:
    for f in files:
      f.close()
  failing = next((i for i, c in enumerate(codes) if c != 0), 0)
  with logs[failing].open(errors="replace") as f:
    f.seek(offsets[failing])
    line = last_line(f.read())
  return codes[failing], line


def _print_plan(sweep: Sweep, workdir: pathlib.Path, install: list[list[str]],
                point_commands: dict[str, list[list[str]]]) -> None:
  print(f"sweep {sweep.path}: {len(sweep.points)} points of {sweep.config} in {workdir}")
  if install:
    print("# install the code on every host:")
    for argv in install:
      print(shlex.join(argv))
  for i, point in enumerate(sweep.points, 1):
    done = " (finished)" if is_finished(workdir / point.name, point.total_steps) else ""
    print(f"# [{i}/{len(sweep.points)}] {point.name}{done}")
    for argv in point_commands[point.name]:
      print(shlex.join(argv))


def run_sweep(path: str, workdir: str | os.PathLike, dry_run: bool = False, tpu: str | None = None,
              zone: str | None = None, project: str | None = None,
              hosts: str | Sequence[str] | None = None,
              overrides: Sequence[str] = ()) -> dict[str, Any]:
  """Runs (or with dry_run prints) every point of the sweep file `path` into `workdir`.

  Returns the sweep record written to WORKDIR/sweep.json (with dry_run: the planned points and
  commands, nothing written), with counts `finished`, `failed` and `skipped` (done before).
  """
  if tpu and hosts:
    fail("give --tpu or --hosts, not both")
  if tpu and not zone:
    fail(f"--tpu {tpu} needs --zone, e.g. --zone us-central2-b (where the TPU VM was created)")
  if (zone or project) and not tpu:
    fail("--zone and --project go with --tpu NAME")
  if isinstance(hosts, str):
    hosts = [h for h in hosts.split(",") if h.strip()]
    if not hosts:
      fail("--hosts needs a comma-separated list of ssh hosts, e.g. --hosts gpu1,gpu2")
  remote = bool(tpu or hosts)
  # Remote commands add --config.distributed=True themselves: the config must have the key.
  sweep = load_sweep(path, overrides, also_check=["distributed=True"] if remote else [])
  local_dir = pathlib.Path(workdir).absolute()
  remote_dir = str(workdir)

  if tpu:
    install = tpu_install_commands(tpu, zone, project)
    commands = {p.name: [tpu_point_command(sweep, p, remote_dir, tpu, zone, project)]
                for p in sweep.points}
  elif hosts:
    install = hosts_install_commands(hosts)
    commands = {p.name: hosts_point_commands(sweep, p, remote_dir, hosts) for p in sweep.points}
  else:
    install = []
    commands = {p.name: [local_command(sweep, p, local_dir)] for p in sweep.points}

  record: dict[str, Any] = {
      "sweep": sweep.path, "arg": sweep.arg, "config": sweep.config, "workdir": str(local_dir),
      "mode": f"tpu {tpu}" if tpu else ("hosts " + ",".join(hosts) if hosts else "local"),
      "points": [{"name": p.name, "overrides": {k: _plain(v) for k, v in p.overrides.items()},
                  "workdir": str(local_dir / p.name), "total_steps": p.total_steps,
                  "resolved": p.resolved,
                  "command": " ; ".join(shlex.join(c) for c in commands[p.name])}
                 for p in sweep.points],
  }
  if dry_run:
    _print_plan(sweep, local_dir, install, commands)
    return {**record, "finished": 0, "failed": 0, "skipped": 0}

  previous = {p["name"]: p for p in (_read_json(local_dir / "sweep.json") or {}).get("points", [])}
  for entry in record["points"]:
    old = previous.get(entry["name"], {})
    entry.update(status="pending", runs=int(old.get("runs", 0)),
                 wall_s=float(old.get("wall_s", 0.0)), returncode=old.get("returncode"),
                 last_line=old.get("last_line"))
  local_dir.mkdir(parents=True, exist_ok=True)
  save = lambda: _write_json(local_dir / "sweep.json", record)

  todo = []
  for point, entry in zip(sweep.points, record["points"]):
    if is_finished(local_dir / point.name, point.total_steps):
      entry.update(status="finished", skipped=True)
    else:
      todo.append((point, entry))
  skipped = len(sweep.points) - len(todo)
  print(f"sweep {sweep.path}: {len(sweep.points)} points in {local_dir}; {skipped} already "
        f"finished, {len(todo)} to run", flush=True)
  save()
  if install and todo:
    print("installing the code on every host", flush=True)
    for argv in install:
      code, line = _run_logged([argv], [local_dir / "install_log.txt"], _Stop(), cwd=REPO)
      if code:
        fail(f"installing on the hosts failed ({shlex.join(argv[:6])} ...: {line}); see "
             f"{local_dir / 'install_log.txt'}")

  with _Stop() as stop:
    for i, (point, entry) in enumerate(todo, 1):
      point_dir = local_dir / point.name
      logs = [point_dir / "log.txt"] + [point_dir / f"log.{_host_address(h)}.txt"
                                        for h in (hosts or [])[1:]]
      entry.update(status="running", skipped=False, runs=entry["runs"] + 1)
      save()
      start = time.time()
      try:
        code, line = _run_logged(commands[point.name], logs, stop, cwd=None if remote else REPO)
      except KeyboardInterrupt:
        entry.update(status="interrupted", wall_s=entry["wall_s"] + time.time() - start)
        save()
        raise
      entry["wall_s"] = round(entry["wall_s"] + time.time() - start, 3)
      entry["returncode"] = code
      summary = _read_json(point_dir / "summary.json") or {}
      if code == 0 and is_finished(point_dir, point.total_steps):
        entry.update(status="finished", last_line=None)
      elif stop.requested or str(summary.get("status", "")).startswith("preempted"):
        entry.update(status="preempted", last_line=line)
      else:
        entry.update(status="failed", last_line=line)
      save()
      print(f"[{i}/{len(todo)}] {point.name}: {entry['status']} in {entry['wall_s']:.1f}s"
            + (f": {line}" if entry["status"] == "failed" else ""), flush=True)
      if stop.requested:
        print("SIGTERM: the running point saved a checkpoint; run the sweep again to go on")
        break

  statuses = [e["status"] for e in record["points"]]
  record.update(finished=statuses.count("finished"), failed=statuses.count("failed"),
                skipped=skipped)
  save()
  print(f"sweep done: {record['finished']} finished ({skipped} before), {record['failed']} "
        f"failed; report: python -m bertjax.report {local_dir}", flush=True)
  return record


def _write_json(path: pathlib.Path, value: Any) -> None:
  """Write beside, then rename: a killed sweep never leaves half a sweep.json."""
  tmp = path.with_suffix(".json.tmp")
  tmp.write_text(json.dumps(value, indent=2, default=str))
  tmp.replace(path)

