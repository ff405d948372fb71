"""One workdir, one run: the lock a running process holds, and the settings a resumed run may change.

- WORKDIR/lock (JSON: pid, hostname, started; with several processes, how many) is created
  atomically by the run that trains in the workdir (its process 0) and removed when it ends, also
  when it ends at once (bertjax/runtime/distributed.py's os._exit: `release_held`). A second run
  is refused while the holder lives; a lock whose process is gone (killed, on this host) is taken
  over with a warning. On another host nothing can
  be checked: the run is refused, and the message says to delete the file if that run is gone.
  The workdir may be remote (gs://...; bertjax/core/paths.py): the same rules hold, since the pid is
  checked only on the host the lock names. An object store offers no exclusive create through
  fsspec, so there the lock is written, then read back (ours: taken); two runs starting within
  that round trip could both proceed: start one run per workdir.
- WORKDIR/code.json, written with config.json, holds the digest of each source file of the package
  (`distributed.source_digests`); a resume on other code says which files differ in one line and
  goes on, noting them in changes.jsonl (`code`).
- WORKDIR/config.json is the record of the run, written once the run has trained its first step
  (a run failing before it leaves the old record as it was); one beside no checkpoint records
  nothing a run resumes and binds nothing. A resumed run compares its resolved config with
  it key by key: cadence and placement settings (`CADENCE`, `PLACEMENT`) and a longer
  `total_steps` may change; any other change is refused with the list of changed keys, unless
  `allow_changed_settings=True`. Every change a resumed run makes is appended to
  WORKDIR/changes.jsonl ({step, time, changed: {key: [old, new]}, forced: [keys]}). Each
  checkpoint also holds the resolved settings (its `config` item): a config.json deleted beside
  checkpoints is stood in for by the newest one's; where none holds them (an older bertjax), the
  resume says in one line that nothing was compared, and changes.jsonl records it (`unchecked`).

Nothing here writes before every check has passed: a refused run leaves the workdir as it was.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import pathlib
import socket
import time
from typing import Any, Iterator

from flax import traverse_util
import jax

from bertjax.core import paths
from bertjax.core.errors import fail, read_text
from bertjax.runtime import checkpoints, distributed

LOCK = "lock"
CHANGES = "changes.jsonl"
CODE = "code.json"  # the digest of each source file of the package the run last trained with
OVERRIDE = "allow_changed_settings"  # an instruction to one invocation: never compared or recorded
# How often a run logs, evaluates and checkpoints: never what it trains.
CADENCE = ("log_every", "eval_every", "checkpoint_every", "keep_checkpoints", "async_checkpointing",
           "tensorboard", "progress_every_s", "evals")
# How a run is placed and computed (devices, micro-batches, padding, recomputation, kernels):
# the same training up to floating-point rounding. A resumed run may need new ones (other devices).
PLACEMENT = ("distributed", "mesh_shape", "logical_rules", "grad_accum_steps", "prefetch_batches",
             "eval_batch_size", "pad_to_multiple_of", "model.remat", "model.remat_policy",
             "model.kernels", "model.kernel_overrides", "model.gather_last_layer")
# Decided with the data (fine-tuning tasks derive them): compared once the schedule is known.
SCHEDULE = ("total_steps", "eval_every")
_ABSENT = "(absent)"
# Settings added after runs were recorded without them, at the value that trains as before: a
# run recorded before they existed resumes with them at that value. (model.dropout_impl="auto" draws
# the masks as before on CPUs and TPUs; a GPU run resumes with the GPU set's rbg draws, the same
# rate from another generator, as a run moved between platforms does.)
INERT_DEFAULTS = {"freeze.encoder": False, "freeze.train_top_layers": 0,
                  "freeze.train_embeddings": False, "head.features": "standard",
                  "head.layers": [-4, -3, -2, -1], "head.pooling": "cls",
                  "optimizer.keep_pruned": False, "optimizer.fused_update": False,
                  "data.generated": "",
                  "optimizer.fully_decoupled_weight_decay": False,
                  "batch_warmup_tokens": 0, "batch_warmup_start": 1,
                  "masking.rate_schedule": [], "data.kind": "",
                  "optimizer.wsd_decay_fraction": 0.1, "optimizer.wsd_decay_shape": "1-sqrt",
                  "data.generated_families": 1, "data.generated_tokens": 8,
                  "model.attention_dropout_kernel": "auto",
                  "model.dropout_impl": "auto", "model.kernel_overrides": "", "evals": []}
_SHOWN = 6  # changed keys shown with their values in a refusal
# What makes a run another run (what it trains, on which task, which parameters it has): listed
# first in a refusal, and a change to one is not offered `allow_changed_settings` (a new workdir
# with init_from is the fix). The data's sources come next (a moved folder may be the same data).
OTHER_RUN = ("objective", "task", "model.architecture", "model.vocab_size", "model.hidden_size",
             "model.num_hidden_layers", "model.num_attention_heads", "model.intermediate_size",
             "model.max_position_embeddings", "model.type_vocab_size", "model.embedding_size",
             "model.num_hidden_groups", "model.pruned_heads", "model.use_pooler",
             "model.scan_layers")
DECISIVE = OTHER_RUN + ("data.corpus", "data.tokenizer", "data_dir")

# The locks this process holds: their absolute paths and texts (a pid of ours in a lock may be a
# past run's).
_held: dict[str, str] = {}


# ---------------------------------------------------------------------------------------------
# The lock.


@contextlib.contextmanager
def locked(workdir: paths.Path) -> Iterator[None]:
  """Holds WORKDIR/lock for the duration (process 0 of a multi-host run only)."""
  if jax.process_index() != 0:
    yield
    return
  path = paths.as_path(workdir) / LOCK
  mine = _acquire(path)
  try:
    yield
  finally:
    _release(path, mine)


def _acquire(path: paths.Path) -> str:
  holder = {"pid": os.getpid(), "hostname": socket.gethostname(),
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
  if jax.process_count() > 1:  # one lock for the whole run, held by its process 0
    holder["processes"] = jax.process_count()
  mine = json.dumps(holder)
  if paths.is_remote(path):
    return _acquire_remote(path, mine)
  for _ in range(10):
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      text = _read_lock(path)
      if text is not None and _refuse_unless_stale(path, text):
        _take_over(path, text)
      continue
    with os.fdopen(fd, "w") as f:
      f.write(mine)
    _held[str(paths.absolute(path))] = mine
    return mine
  fail(f"could not take {path}: other runs keep taking it; start one run per --workdir")


def _acquire_remote(path: paths.Path, mine: str) -> str:
  """`_acquire` on an object store: write, then read back (no exclusive create there)."""
  for _ in range(10):
    text = _read_lock(path) if path.exists() else None
    if text is not None:
      _refuse_unless_stale(path, text)
      if _read_lock(path) == text:  # unchanged since read: still the dead run's
        path.unlink(missing_ok=True)
        _warn_taken_over(path, text)
      continue
    path.write_text(mine)
    if _read_lock(path) == mine:
      _held[str(paths.absolute(path))] = mine
      return mine
  fail(f"could not take {path}: other runs keep taking it; start one run per --workdir")


def _release(path: paths.Path, mine: str) -> None:
  _held.pop(str(paths.absolute(path)), None)
  with contextlib.suppress(FileNotFoundError):
    if path.read_text() == mine:  # never another run's lock
      path.unlink()


def release_held() -> None:
  """Releases every lock this process holds (each only while its text is still ours): run
  before this process ends through os._exit (`distributed.at_once_exit`), which skips `locked`'s
  release; the next run then finds no lock, on this host or another."""
  for held, mine in list(_held.items()):
    with contextlib.suppress(Exception):  # ending all the same: a lock left is taken over later
      _release(paths.as_path(held), mine)


distributed.at_once_exit(release_held)


def _read_lock(path: paths.Path) -> str | None:
  """The lock's text (None: it is gone). A lock just created may not be written yet: wait."""
  for _ in range(20):
    try:
      text = path.read_text()
    except FileNotFoundError:
      return None
    with contextlib.suppress(ValueError):
      holder = json.loads(text)
      if isinstance(holder, dict) and isinstance(holder.get("pid"), int):
        return text
    time.sleep(0.05)
  fail(f"{path} is not a lock this program wrote; delete it if no run uses {path.parent}")


def _refuse_unless_stale(path: paths.Path, text: str) -> bool:
  """True when the lock's process is gone (this host); else a one-line refusal."""
  holder = json.loads(text)
  pid, host, since = holder.get("pid"), holder.get("hostname"), holder.get("started")
  in_use = f"{path.parent} is in use by pid {pid} on {host} since {since} ({path})"
  if host != socket.gethostname():
    fail(f"{in_use}; it cannot be checked from {socket.gethostname()}: wait for it, use another "
         f"--workdir, or delete {path} if that run is gone")
  if _alive(int(pid), since, str(paths.absolute(path))):
    fail(f"{in_use}; wait for it or use another --workdir")
  return True


def _alive(pid: int, since: str, path: str) -> bool:
  if pid == os.getpid():  # a run of this process, or a past process that had our pid (containers)
    return path in _held
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process: alive
    pass
  return not _gone_or_reused(pid, since)


def _gone_or_reused(pid: int, since: str) -> bool:
  """Linux: the process is a zombie (dead, not yet reaped), or started after the lock was taken
  (its pid was reused). False where /proc cannot tell."""
  try:
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    boot = next(float(l.split()[1]) for l in pathlib.Path("/proc/stat").read_text().splitlines()
                if l.startswith("btime "))
    started = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    locked_at = datetime.datetime.fromisoformat(since).timestamp()
  except (OSError, ValueError, IndexError, StopIteration, TypeError):
    return False
  # The lock is taken after its process starts; 3 s covers btime's whole seconds and rounding.
  return fields[0] == "Z" or started > locked_at + 3


def _take_over(path: paths.Path, text: str) -> None:
  """Moves a stale lock aside (one atomic rename, so of two runs taking over, one wins)."""
  aside = path.with_name(f"{LOCK}.stale.{os.getpid()}")
  try:
    os.rename(path, aside)
  except FileNotFoundError:
    return  # another run moved it first
  if aside.read_text() != text:  # a live lock, taken since we read the stale one: put it back
    with contextlib.suppress(FileExistsError):
      os.link(aside, path)
    aside.unlink()
    return
  aside.unlink()
  _warn_taken_over(path, text)


def _warn_taken_over(path: paths.Path, text: str) -> None:
  holder = json.loads(text)
  logging.warning("took over the stale lock %s: pid %s on %s (since %s) is gone", path,
                  holder.get("pid"), holder.get("hostname"), holder.get("started"))


# ---------------------------------------------------------------------------------------------
# Settings of a resumed run.


def flatten(tree: dict) -> dict[str, Any]:
  """{"a": {"b": 1}} -> {"a.b": 1}."""
  return traverse_util.flatten_dict(tree, sep=".")


def as_recorded(resolved: dict) -> dict:
  """`resolved` as config.json holds it (JSON types; without the override)."""
  record = json.loads(json.dumps(resolved, sort_keys=True, default=str))
  record.pop(OVERRIDE, None)
  return record


def allowed(key: str, old: Any, new: Any) -> str | None:
  """None when a resumed run may change `key` from `old` to `new`, else why not."""
  if old == _ABSENT and key in INERT_DEFAULTS and new == INERT_DEFAULTS[key]:
    return None
  if key == "eval_every" and bool(old) != bool(new):
    return "evaluation cannot be switched on or off: it decides the held-out documents"
  if key in CADENCE or key in PLACEMENT or key.rpartition(".")[0] in PLACEMENT:
    return None  # (a field of a placement setting: model.kernel_overrides.FIELD)
  if key == "num_epochs":
    return "it sets total_steps and the learning-rate schedule; to train longer, raise total_steps"
  if key == "total_steps":
    if isinstance(old, int) and isinstance(new, int) and new > old:
      return None
    return "total_steps may only grow"
  return ""


class Settings:
  """The comparison of a run's resolved config with the record of the workdir it resumes."""

  def __init__(self, workdir: paths.Path, allow_changes: bool, trained: bool = True):
    """`trained`: whether the workdir holds a checkpoint (`has_checkpoints`); without one its
    config.json is not compared."""
    self.workdir, self.allow_changes = paths.as_path(workdir), bool(allow_changes)
    path = self.workdir / "config.json"
    self.recorded = None
    self.source = f"the settings in {path}"  # where the recorded settings come from
    self.unchecked = ""  # why a resumed run's settings could not be compared (changes.jsonl)
    if path.exists() and not trained:
      # The record of a run that saved no step: nothing it trained is resumed, so it binds nothing.
      logging.warning("%s records a run that saved no checkpoint: a new run starts here, with "
                      "its own settings", path)
    elif path.exists():
      try:
        record = json.loads(read_text(path, "run record"))
      except ValueError as e:
        fail(f"{path} is not valid JSON ({e}); restore it, or use another --workdir")
      if not isinstance(record, dict):
        kind = {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
            type(record), "number")
        fail(f"{path} is not a run record (a JSON {kind}, not an object); "
             f"restore it, move it away (the settings saved with the checkpoints are then "
             f"compared), or use another --workdir")
      self.recorded = flatten(as_recorded(record))
    elif trained:
      self._recover(path)
    self.changed: dict[str, tuple[Any, Any]] = {}
    self.forced: list[str] = []
    self.code_changed = self._code_changed() if trained else []

  def _code_changed(self) -> list[str]:
    """The package's source files that differ from those the run last recorded (WORKDIR/code.json),
    said in one line: a resume on other code goes on, but its curve may bend there."""
    path = self.workdir / CODE
    if not path.exists():
      return []
    try:
      recorded = json.loads(read_text(path, "run record"))["files"]
    except (ValueError, KeyError, TypeError):
      logging.warning("%s is not a record of the code (restore it or delete it); the code is not "
                      "compared", path)
      return []
    changed = distributed.config_difference(distributed.source_digests(), recorded)
    if changed and jax.process_index() == 0:
      logging.warning("the code changed since this run's last record: %s differ%s; going on with "
                      "the code here (noted in %s)", distributed.listed(changed), "s" if len(changed) == 1 else "",
                      self.workdir / CHANGES)
    return changed

  def _recover(self, path: paths.Path) -> None:
    """config.json is gone beside checkpoints: the settings saved with the newest checkpoint
    stand in for it (written back once a step is trained); without them (checkpoints of an
    older bertjax) nothing can be compared, which is said and recorded in changes.jsonl."""
    saved = checkpoints.saved_record(self.workdir / "checkpoints")
    if saved is not None:
      step, record = saved
      logging.warning("%s is missing: this run's settings are compared with those saved with "
                      "the checkpoint at step %d (and written back to it)", path, step)
      self.recorded = flatten(as_recorded(record))
      self.source = (f"the settings saved with the checkpoint at step {step} (its config.json "
                     "is gone)")
      return
    self.unchecked = (f"{path.name} was missing and the checkpoints hold no copy of the "
                      "settings: this run's could not be compared with those trained")
    logging.warning("%s is missing and the checkpoints hold no copy of the settings they were "
                    "trained with: this run's settings are taken as they are, unchecked (noted "
                    "in %s); restore config.json to have them compared", path,
                    self.workdir / CHANGES)

  def check(self, resolved: dict, pending: tuple[str, ...] = ()) -> None:
    """Refuses (one line, nothing written) when `resolved` changes what may not change. Keys in
    `pending`, or under a `pending` prefix ending in ".", are left to a later call."""
    if self.recorded is None:
      return
    new = flatten(as_recorded(resolved))
    skip = lambda k: k in pending or any(p.endswith(".") and k.startswith(p) for p in pending)
    changed = {k: (self.recorded.get(k, _ABSENT), new.get(k, _ABSENT))
               for k in sorted(set(self.recorded) | set(new)) if not skip(k)}
    changed = {k: v for k, v in changed.items() if v[0] != v[1]}
    refused = {k: allowed(k, *v) for k, v in changed.items()}
    refused = {k: why for k, why in refused.items() if why is not None}
    if refused and not self.allow_changes:
      fail(self._refusal(changed, refused))
    self.changed, self.forced = changed, sorted(refused)

  def _refusal(self, changed: dict, refused: dict) -> str:
    rank = lambda k: (DECISIVE.index(k) if k in DECISIVE else len(DECISIVE), k)
    keys = sorted(refused, key=rank)
    shown = [f"{k} {_short(changed[k][0])} -> {_short(changed[k][1])}"
             + (f" ({refused[k]})" if refused[k] else "") for k in keys[:_SHOWN]]
    if len(keys) > _SHOWN:
      rest = keys[_SHOWN:]
      shown.append(f"and {len(rest)} more: {', '.join(rest[:10])}{', ...' if len(rest) > 10 else ''}")
    other_run = [k for k in keys if k in OTHER_RUN]
    new_run = (f"to train from its weights, use a new --workdir with --config.init_from="
               f"{self.workdir}")
    if other_run:
      return (f"{self.workdir} holds a run trained with other settings: {'; '.join(shown)}; "
              f"resume with {self.source}, or, as "
              f"{', '.join(other_run[:3])} make{'s' if len(other_run) == 1 else ''} this another "
              f"run, {new_run}")
    return (f"{self.workdir} holds a run trained with other settings: {'; '.join(shown)}; resume "
            f"with {self.source}; {new_run}; or add "
            f"--config.{OVERRIDE}=True to change them in this run anyway (recorded in "
            f"{self.workdir / CHANGES})")

  def record(self, step: int, resolved: dict | None = None) -> None:
    """Writes the run's record once it has trained a step (a run failing before its first step
    leaves the old record in place): `resolved` as WORKDIR/config.json, whole or not at all; its
    changes appended to WORKDIR/changes.jsonl, with what they mean (once per resume, so a
    remote changes.jsonl rewritten whole each time costs little)."""
    if resolved is not None:
      paths.replace_text(self.workdir / "config.json",
                         json.dumps(resolved, indent=2, sort_keys=True, default=str))
      paths.replace_text(self.workdir / CODE, json.dumps({"files": distributed.source_digests()},
                                                         indent=1, sort_keys=True))
    if not (self.changed or self.unchecked or self.code_changed) or jax.process_index() != 0:
      return
    if self.changed:
      logging.warning("resuming at step %d with changed settings: %s%s", step,
                      ", ".join(f"{k} {_short(a)} -> {_short(b)}"
                                for k, (a, b) in self.changed.items()),
                      f" (allowed by {OVERRIDE}: {', '.join(self.forced)})" if self.forced else "")
    if "total_steps" in self.changed:
      old, new = self.changed["total_steps"]
      logging.warning("total_steps %s -> %s: the learning-rate schedule now runs to step %s (the "
                      "steps trained so far followed the one to step %s)", old, new, new, old)
    entry = {"step": int(step), "time": datetime.datetime.now().astimezone().isoformat(
                 timespec="seconds"),
             "changed": {k: [a, b] for k, (a, b) in self.changed.items()}, "forced": self.forced}
    if self.unchecked:
      entry["unchecked"] = self.unchecked
    if self.code_changed:
      entry["code"] = self.code_changed
    paths.append_text(self.workdir / CHANGES, json.dumps(entry) + "\n")


def has_checkpoints(workdir: paths.Path) -> bool:
  """Whether WORKDIR/checkpoints holds a saved step (orbax names each by its number)."""
  directory = paths.as_path(workdir) / "checkpoints"
  return directory.is_dir() and any(p.name.isdigit() for p in directory.iterdir())


def _short(value: Any, limit: int = 40) -> str:
  text = json.dumps(value) if value != _ABSENT else _ABSENT
  return text if len(text) <= limit else text[:limit - 3] + "..."
