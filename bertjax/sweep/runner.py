"""Running a sweep: each point in its own process (up to --max_concurrent at once, each on its
own slice of the devices), resumable, its status in DIR/sweep.json; a search's points drawn and
pruned by its optuna study (bertjax/sweep/search.py).

DIR may be remote (gs://...): sweep.json is rewritten whole, and each launch's output is kept in a
local temporary file, added to the point's log.txt there when the launch ends."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from typing import Any, Callable, Sequence

from bertjax.core import paths, run_files
from bertjax.core.errors import fail
from bertjax.runtime import workdir as workdir_lib
from bertjax.sweep import search as search_lib
from bertjax.sweep.launchers import (device_slices, host_address, hosts_install_commands,
                                     hosts_point_commands, local_command, local_devices, pin_cores,
                                     tpu_install_commands, tpu_point_command)
from bertjax.sweep.spec import Point, REPO, Sweep, load_sweep, plain_value


# ---------------------------------------------------------------------------------------------
# State of a point on disk.


def _read_json(path: paths.Path) -> dict | None:
  """The JSON object in `path`; None when absent, or damaged (with a warning naming it)."""
  return run_files.read_json(path)


def is_finished(point_dir: str | os.PathLike, total_steps: int) -> bool:
  """summary.json says finished at the config's total_steps (or, when the config leaves it to
  the trainer, at the total_steps the trainer resolved into config.json)."""
  point_dir = paths.as_path(point_dir)
  summary = _read_json(point_dir / "summary.json")
  if not isinstance(summary, dict) or summary.get("status") != "finished":
    return False
  if total_steps <= 0:
    resolved = (_read_json(point_dir / "config.json") or {}).get("total_steps")
    total_steps = resolved if isinstance(resolved, int) else 0
  return total_steps > 0 and summary.get("step") == total_steps


def check_finished(point: Point, point_dir: paths.Path) -> None:
  """Refuses a finished point whose config.json records other values of what the sweep sets
  (a resumed run could not change them either, bertjax/runtime/workdir.py): skipped, it would be
  recorded in sweep.json with settings it was not trained with."""
  recorded = workdir_lib.flatten(_read_json(point_dir / "config.json") or {})
  for key, value in point.settings.items():
    if key in workdir_lib.SCHEDULE or (key.startswith("model.") and recorded.get("init_from")):
      continue  # the trainer derives these (epochs; init_from's model): recorded as derived
    new = workdir_lib.as_recorded({"v": value})["v"]
    if key in recorded and recorded[key] != new and workdir_lib.allowed(
        key, recorded[key], new) is not None:
      fail(f"point {point.name} in {point_dir.parent} finished with {key}={recorded[key]!r}, "
           f"and this sweep gives {key}={new!r}; a finished point is not run again: use a new "
           "--workdir for other settings, or give the ones it finished with")


def last_line(text: str) -> str:
  """The last non-blank line (a traceback's ends with the exception; a UserError's is it). Of a
  point run on several local processes (lines prefixed `[pN] `), the first one-line error of a
  process when there is one: what comes after it says only that the others were stopped."""
  lines = [l.strip() for l in text.replace("\r", "\n").splitlines() if l.strip()]
  errors = [l for l in lines if re.match(r"\[p\d+\] error: ", l)]
  if errors:
    return errors[0][:500]
  return lines[-1][:500] if lines else "(no output)"


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
    self.stop_all()

  def stop_all(self):
    self.requested = True
    for proc in list(self.procs):
      if proc.poll() is None:
        proc.terminate()

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def _open_log(log: paths.Path) -> tuple[Any, paths.Path | None]:
  """(a local file the command's output is appended to, the remote log it is added to after)."""
  if not paths.is_remote(log):
    log.parent.mkdir(parents=True, exist_ok=True)
    return open(log, "a+", encoding="utf-8", errors="replace"), None
  # An object cannot be appended to as the command writes: a local file, added to it at the end.
  return tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace",
                                prefix="bertjax-sweep-log-"), log


# Seconds between the lines a running point's progress is reported with.
PROGRESS_EVERY_S = 30.0
# Seconds between two reads of a pruned search's running point's eval rows.
WATCH_EVERY_S = 0.5
# The folder (in the environment of a local sweep's points) where points share their prepared
# corpus and tokenizer, keyed by what determines them (bertjax/inputs.py).
PREPARED_CACHE = "BERTJAX_PREPARED_CACHE"


def _progress_line(text: str) -> str | None:
  """The latest progress line of a point's output (a train or eval line), if any."""
  lines = [re.sub(r"^\[p0\] ", "", l.strip()) for l in text.replace("\r", "\n").splitlines()]
  lines = [l for l in lines if l.startswith(("train step", "eval "))]  # [p0]'s of several
  return lines[-1][:300] if lines else None


def _run_logged(commands: list[list[str]], logs: list[paths.Path], stop: _Stop,
                cwd: pathlib.Path | None, say: Callable[[str], None] | None = None,
                env: dict[str, str] | None = None,
                watch: Callable[[], bool] | None = None) -> tuple[int, str, bool]:
  """Runs commands together, each appending its output to its log. Returns the exit code,
  this run's last output line of the first command that failed (else of the first command), and
  whether `watch` stopped them. While they run, `say` gets the first command's latest progress
  line every PROGRESS_EVERY_S seconds (when it printed a new one), and `watch` is called every
  WATCH_EVERY_S: when it returns True the commands get SIGTERM (they save and exit)."""
  procs, files, offsets, stopped = [], [], [], False
  try:
    for argv, log in zip(commands, logs):
      f, remote = _open_log(log)
      stamp = datetime.datetime.now().isoformat(timespec="seconds")
      f.write(f"# bertjax.sweep {stamp}: {shlex.join(argv)}\n")
      f.flush()
      files.append((f, remote))
      offsets.append(f.tell())
      try:
        procs.append(subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=cwd,
                                      stdin=subprocess.DEVNULL, preexec_fn=pin_cores(env),
                                      env={**os.environ, **env} if env else None))
      except FileNotFoundError:
        for p in procs:  # the hosts already started cannot run without this one
          p.terminate()
          p.wait()
        fail(f"{argv[0]} not found; install it, or use --dry_run to print the commands")
      stop.procs.append(procs[-1])
    codes, shown, said = [], None, time.time()
    tick = WATCH_EVERY_S if watch else PROGRESS_EVERY_S if say else None
    for p in procs:
      while True:
        try:
          codes.append(p.wait(timeout=tick))
          break
        except subprocess.TimeoutExpired:
          if watch and not stopped:
            try:
              stopped = watch()
            except BaseException:  # the one-line error of a search: nothing left running
              for q in procs:
                q.terminate()
                q.wait()
              raise
            for q in procs if stopped else ():
              q.terminate()
          if say and time.time() - said >= PROGRESS_EVERY_S:
            said = time.time()
            f = files[0][0]
            f.seek(offsets[0])
            line = _progress_line(f.read())
            if line and line != shown:
              say(line)
              shown = line
    failing = next((i for i, c in enumerate(codes) if c != 0), 0)
    f = files[failing][0]
    f.seek(offsets[failing])
    line = last_line(f.read())
  except KeyboardInterrupt:
    for p in procs:
      p.wait()
    raise
  finally:
    for p in procs:
      if p in stop.procs:
        stop.procs.remove(p)
    for f, remote in files:
      if remote is not None:
        f.seek(0)
        remote.parent.mkdir(parents=True, exist_ok=True)
        paths.append_text(remote, f.read())
      f.close()
  return codes[failing], line, stopped


def _print_plan(sweep: Sweep, workdir: paths.Path, install: list[list[str]],
                command_of: Callable[[Point], list[list[str]]], search) -> None:
  if search is not None and search.sampler:
    print(f"sweep {sweep.path}: {search.trials} points drawn from a space, of {sweep.config} in "
          f"{workdir}")
  else:
    print(f"sweep {sweep.path}: {len(sweep.points)} points of {sweep.config} in {workdir}")
  if search is not None:
    print(search.describe())
  if install:
    print("# install the code on every host:")
    for argv in install:
      print(shlex.join(argv))
  for i, point in enumerate(sweep.points, 1):
    done = " (finished)" if is_finished(workdir / point.name, point.total_steps) else ""
    print(f"# [{i}/{len(sweep.points)}] {point.name}{done}")
    for argv in command_of(point):
      print(shlex.join(argv))
  if search is not None and search.sampler:
    low = sweep.make_point({k: v[1][0] if v[0] == "choice" else v[1]
                            for k, v in search.space.items()})
    print("# each point is drawn as the sweep runs; at the space's low ends it would run:")
    for argv in command_of(low):
      print(shlex.join(argv))


def _remote_hosts(tpu, zone, project, hosts) -> list[str]:
  """The ssh hosts of a --hosts sweep (empty otherwise), after checking the remote flags."""
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
  return list(hosts or [])


def _local_processes(remote: bool, processes: int | None, devices_per_process: int | None
                     ) -> tuple[int, int]:
  """(processes, devices per process) of a local sweep whose points run on several local
  processes (0, 0: one process each), after checking the flags."""
  if processes is not None and remote:
    fail("--local_processes runs each point on this machine; give it or --tpu/--hosts, not both")
  if devices_per_process is not None and processes is None:
    fail("--devices_per_process goes with --local_processes N (each point on N local processes)")
  if processes is not None and processes < 2:
    fail(f"--local_processes={processes} must be at least 2 (leave it out to run each point in "
         "one process)")
  if devices_per_process is not None and devices_per_process < 1:
    fail(f"--devices_per_process={devices_per_process} must be at least 1")
  return processes or 0, devices_per_process or 0


def _commands(sweep: Sweep, local_dir: paths.Path, remote_dir: str, tpu, zone, project,
              hosts: list[str], processes: int = 0, devices_per_process: int = 0
              ) -> tuple[list[list[str]], Callable[[Point], list[list[str]]]]:
  """(install commands, a point's commands) for where the sweep runs."""
  if tpu:
    return (tpu_install_commands(tpu, zone, project),
            lambda p: [tpu_point_command(sweep, p, remote_dir, tpu, zone, project)])
  if hosts:
    return hosts_install_commands(hosts), lambda p: hosts_point_commands(sweep, p, remote_dir,
                                                                         hosts)
  return [], lambda p: [local_command(sweep, p, local_dir, processes, devices_per_process)]


def _entry(point: Point, local_dir: paths.Path,
           command_of: Callable[[Point], list[list[str]]]) -> dict[str, Any]:
  """A point's record in sweep.json, every key there from the start (points at once update
  their entries while another thread writes the file)."""
  return {"name": point.name,
          "overrides": {k: plain_value(v) for k, v in point.overrides.items()},
          "workdir": str(local_dir / point.name), "total_steps": point.total_steps,
          "resolved": point.resolved,
          "command": " ; ".join(shlex.join(c) for c in command_of(point)),
          "status": "pending", "skipped": False, "runs": 0, "wall_s": 0.0, "returncode": None,
          "last_line": None, "started_at": None, "ended_at": None, "value": None}


def _plan(sweep: Sweep, local_dir: paths.Path, mode: str,
          command_of: Callable[[Point], list[list[str]]]) -> dict[str, Any]:
  return {
      "sweep": sweep.path, "arg": sweep.arg, "config": sweep.config, "workdir": str(local_dir),
      "mode": mode, "points": [_entry(p, local_dir, command_of) for p in sweep.points],
  }


def _carry_over(record: dict[str, Any], local_dir: paths.Path, drawn: bool = False) -> None:
  """Each point's run count, time and last result from an earlier sweep.json in `local_dir`;
  with `drawn` (a search's points, drawn as it ran), the earlier points themselves."""
  points = (_read_json(local_dir / "sweep.json") or {}).get("points")
  previous = {p["name"]: p for p in (points if isinstance(points, list) else [])
              if isinstance(p, dict) and isinstance(p.get("name"), str)}
  if drawn:
    record["points"] = [{**p, "skipped": True} for p in previous.values()]
    return
  number = lambda v, kind: kind(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0
  for entry in record["points"]:
    old = previous.get(entry["name"], {})
    line = old.get("last_line")
    entry.update(status="pending", runs=number(old.get("runs"), int),
                 wall_s=number(old.get("wall_s"), float), returncode=old.get("returncode"),
                 last_line=line if isinstance(line, str) else None)


def _install(install: list[list[str]], local_dir: paths.Path) -> None:
  print("installing the code on every host", flush=True)
  for argv in install:
    code, line, _ = _run_logged([argv], [local_dir / "install_log.txt"], _Stop(), cwd=REPO)
    if code:
      fail(f"installing on the hosts failed ({shlex.join(argv[:6])} ...: {line}); see "
           f"{local_dir / 'install_log.txt'}")


def _run_point(point: Point, entry: dict[str, Any], commands: list[list[str]],
               logs: list[paths.Path], stop: _Stop, cwd, save: Callable[[], None],
               label: str = "", env: dict[str, str] | None = None,
               watch: Callable[[], bool] | None = None) -> str | None:
  """Runs one point to its end, recording status, times and return code in `entry`; returns
  the last line it printed. Its progress is printed as it runs, after `label`. When `watch`
  returns True the point is stopped as a preemption would (it saves and exits): "pruned"."""
  start = time.time()
  entry.update(status="running", skipped=False, runs=entry["runs"] + 1,
               started_at=round(start, 3), ended_at=None)
  save()
  say = lambda line: print(f"{label}{point.name}: {line}", flush=True)
  try:
    code, line, pruned = _run_logged(commands, logs, stop, cwd=cwd, say=say, env=env, watch=watch)
  except KeyboardInterrupt:
    entry.update(status="interrupted", wall_s=entry["wall_s"] + time.time() - start)
    save()
    raise
  point_dir = logs[0].parent
  entry["wall_s"] = round(entry["wall_s"] + time.time() - start, 3)
  entry.update(returncode=code, ended_at=round(time.time(), 3))
  summary = _read_json(point_dir / "summary.json") or {}
  if code == 0 and is_finished(point_dir, point.total_steps):
    entry.update(status="finished", last_line=None)
  elif pruned:
    entry.update(status="pruned", last_line=line)
  elif stop.requested or str(summary.get("status", "")).startswith("preempted"):
    entry.update(status="preempted", last_line=line)
  else:
    entry.update(status="failed", last_line=line)
  save()
  return line


def _run_all(next_point: Callable[[], tuple | None], run_one: Callable[..., None],
             slots: list[dict[str, str] | None], stop: _Stop) -> None:
  """Runs the points next_point() gives (None: no more) on one thread per slot, each point with
  its slot's environment; one slot: here, one after another. The first error of a thread stops
  every point (SIGTERM: they save) and is raised here."""
  def worker(slot):
    while not stop.requested:
      item = next_point()
      if item is None:
        return
      run_one(*item, slot)

  if len(slots) == 1:
    worker(slots[0])
    return
  errors = []

  def guarded(slot):
    try:
      worker(slot)
    except BaseException as e:  # pylint: disable=broad-except
      errors.append(e)
      stop.stop_all()

  threads = [threading.Thread(target=guarded, args=(slot,), daemon=True) for slot in slots]
  for thread in threads:
    thread.start()
  try:
    for thread in threads:
      thread.join()
  except KeyboardInterrupt:  # the points got the Ctrl-C too: they save and exit
    for thread in threads:
      thread.join()
    raise
  if errors:
    raise errors[0]


def run_sweep(path: str, workdir: str | os.PathLike, dry_run: bool = False, tpu: str | None = None,
              zone: str | None = None, project: str | None = None,
              hosts: str | Sequence[str] | None = None,
              overrides: Sequence[str] = (), local_processes: int | None = None,
              devices_per_process: int | None = None, max_concurrent: int = 1) -> dict[str, Any]:
  """Runs (or with dry_run prints) every point of the sweep file `path` into `workdir`.

  `local_processes` N runs each point here on N processes joined by JAX's distributed runtime
  (bertjax.tools.multihost), `devices_per_process` CPU devices each. `max_concurrent` N runs up
  to N points here at once, each on its own slice of this machine's devices
  (launchers.device_slices).
  Returns the sweep record written to WORKDIR/sweep.json (with dry_run: the planned points and
  commands, nothing written), with counts `finished`, `failed`, `pruned` and `skipped` (done
  before), and for a search its `best` point.
  """
  if max_concurrent is None or max_concurrent < 1:
    fail(f"--max_concurrent {max_concurrent} must be at least 1: how many points run at once")
  hosts = _remote_hosts(tpu, zone, project, hosts)
  remote = bool(tpu or hosts)
  processes, devices = _local_processes(remote, local_processes, devices_per_process)
  if max_concurrent > 1 and (remote or processes):
    fail(f"--max_concurrent {max_concurrent} runs points at once here, each on its own devices; "
         "give it or --tpu/--hosts/--local_processes, not both")
  # Remote and multi-process commands add --config.distributed=True themselves: the config must
  # have the key.
  sweep = load_sweep(path, overrides,
                     also_check=["distributed=True"] if remote or processes else [])
  where = f"sweep {sweep.path}"
  if sweep.command != "launch.py" and (remote or processes):
    fail(f"{where}: 'command' {sweep.command} runs points here, one process each; drop it or "
         "--tpu/--hosts/--local_processes")
  # optuna only where a search asks for it (bertjax/sweep/search.py).
  search = search_lib.parse(sweep.search, sweep, where) if sweep.search is not None else None
  if processes:
    for point in sweep.points:
      batch = dict(point.resolved).get("batch_size")
      if isinstance(batch, int) and batch % processes:
        fail(f"sweep {sweep.path}: point {point.name} has batch_size={batch}, which does not "
             f"split over --local_processes={processes}; make it a multiple of {processes}")
  slots = [None]
  if max_concurrent > 1:
    slots = device_slices(max_concurrent, *local_devices(dict(os.environ)), dict(os.environ))
  local_dir = paths.absolute(workdir)  # a local folder or a remote one (gs://...)
  install, command_of = _commands(sweep, local_dir, str(workdir), tpu, zone, project, hosts,
                                  processes, devices)
  mode = (f"tpu {tpu}" if tpu else "hosts " + ",".join(hosts) if hosts else
          f"local, {processes} processes each" if processes else "local")
  if max_concurrent > 1:
    mode += f", {max_concurrent} at once"
  record = _plan(sweep, local_dir, mode, command_of)
  if search is not None:
    record["search"] = dataclasses.asdict(search)
  if dry_run:
    _print_plan(sweep, local_dir, install, command_of, search)
    return {**record, "finished": 0, "failed": 0, "pruned": 0, "skipped": 0}

  spec = search_lib.fingerprint(sweep, search) if search is not None else None
  if search is not None:
    search_lib.check_storage(local_dir, spec)  # before anything is written
  for point in sweep.points:  # before sweep.json is written
    if is_finished(local_dir / point.name, point.total_steps):
      check_finished(point, local_dir / point.name)
  _carry_over(record, local_dir, drawn=bool(search and search.sampler))
  local_dir.mkdir(parents=True, exist_ok=True)
  lock = threading.RLock()

  def save():
    with lock:
      _write_json(local_dir / "sweep.json", record)

  study = search_lib.Study(sweep, search, local_dir, spec) if search is not None else None
  todo = []
  for point, entry in zip(sweep.points, record["points"]):
    if is_finished(local_dir / point.name, point.total_steps):
      entry.update(status="finished", skipped=True)
    elif study is not None and study.done.get(point.name) == "pruned":
      entry.update(status="pruned", skipped=True)
    else:
      todo.append(point)
  drawn = study is not None and search.sampler is not None  # points drawn as it runs
  skipped = len(study.done) if drawn else len(sweep.points) - len(todo)
  total = max(search.trials - skipped, 0) if drawn else len(todo)
  print(f"sweep {sweep.path}: {total + skipped} points in {local_dir}; {skipped} already "
        f"{'done' if study is not None else 'finished'}, {total} to run", flush=True)
  save()
  if install and (todo or total):
    _install(install, local_dir)

  entries = {e["name"]: e for e in record["points"]}
  started = []

  def next_point():
    with lock:
      point = study.next_point(todo) if study is not None else (todo.pop(0) if todo else None)
      if point is None:
        return None
      started.append(point.name)
      if point.name not in entries:
        entries[point.name] = _entry(point, local_dir, command_of)
        record["points"].append(entries[point.name])
      return point, entries[point.name], f"[{len(started)}/{max(total, len(started))}] "

  def run_one(point, entry, label, slot, stop):
    point_dir = local_dir / point.name
    line = None
    if study is not None and is_finished(point_dir, point.total_steps):
      entry.update(status="finished", skipped=True)  # a drawn point its sweep left untold
    else:
      logs = [point_dir / "log.txt"] + [point_dir / f"log.{host_address(h)}.txt"
                                        for h in hosts[1:]]
      # Local points share their prepared corpus and tokenizer (bertjax/inputs.py).
      env = None if remote or paths.is_remote(local_dir) else {
          PREPARED_CACHE: str(local_dir / ".prepared"), **(slot or {})}
      watch = (lambda: study.watch(point, point_dir)) if study is not None else None
      line = _run_point(point, entry, command_of(point), logs, stop, None if remote else REPO,
                        save, label=label, env=env, watch=watch)
    if study is not None:
      entry["value"] = study.done_with(point, point_dir, entry["status"])
      save()
    value = f" ({search.metric} {entry['value']:.6g})" if entry.get("value") is not None else ""
    print(f"{label}{point.name}: {entry['status']} in {entry['wall_s']:.1f}s{value}"
          + (f": {line}" if entry["status"] == "failed" else ""), flush=True)

  with _Stop() as stop:
    _run_all(next_point, lambda *item: run_one(*item, stop), slots, stop)
    if stop.requested:
      print("SIGTERM: the running points saved a checkpoint; run the sweep again to go on")

  statuses = [e["status"] for e in record["points"]]
  record.update(finished=statuses.count("finished"), failed=statuses.count("failed"),
                pruned=statuses.count("pruned"), skipped=skipped)
  if study is not None:
    record["best"] = study.best()
  save()
  pruned = f", {record['pruned']} pruned" if study is not None else ""
  print(f"sweep done: {record['finished']} finished ({skipped} before), {record['failed']} "
        f"failed{pruned}; report: python -m bertjax.tools.report {local_dir}", flush=True)
  if record.get("best"):
    best = record["best"]
    print(f"best point: {best['name']} ({search.metric} {best[search.metric]:.6g}), settings "
          f"{json.dumps(best['settings'])}", flush=True)
  return record


def _write_json(path: paths.Path, value: Any) -> None:
  """Written whole (beside, then renamed): a killed sweep never leaves half a sweep.json."""
  paths.replace_text(path, json.dumps(value, indent=2, default=str))
