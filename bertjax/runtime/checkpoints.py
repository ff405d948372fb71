"""Checkpointing with orbax: exact resume, falling back past a damaged latest checkpoint.

A checkpoint holds the whole train state (params, optimizer state, step, RNG) and the input
pipeline's iterator state, so a resumed run sees the same batches, masks and dropout as an
uninterrupted one. orbax writes each step into a temporary folder and renames it when complete,
so a crash mid-save never looks like a checkpoint, and old steps are only deleted after a newer
one is finalized.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import logging
import pathlib
import time
from typing import Any, Callable, NoReturn

import flax
import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from bertjax.core import digests, paths, run_files
from bertjax.core.errors import (DiskFull, UserError, disk_error_of, disk_reason, fail,
                                 free_space, read_text, size_in_gib)
from bertjax.runtime import orbax_workarounds
from bertjax.runtime.orbax_workarounds import draining_event_loops


RECORD = "config"  # the checkpoint item holding the run's resolved settings
_WAIT_S = 0.1      # how often a wait for an asynchronous save reads its background error


class Checkpointer:
  """Saves and restores {state, data} items under `workdir/checkpoints` (local or remote).

  Each finished save gets a digest of its files (bertjax/core/digests.py), written once orbax has
  finalized it: right away for a synchronous save; for an asynchronous one at the first `poll`
  (every step) after orbax is done, at the next save, or at `close`. A restore checks it first.
  """

  def __init__(self, directory: str | pathlib.Path, *, keep: int = 3, async_save: bool = True,
               record: dict | None = None):
    """`record`: the run's resolved settings (what WORKDIR/config.json records), saved with each
    checkpoint as its `config` item, so that a resume whose config.json is gone still compares
    its settings with those trained (`saved_record`)."""
    self.directory = paths.absolute(directory)
    self.async_save = async_save
    self.record = record
    # cleanup_tmp_directories: a save cut short (a full disk, a kill) left a partial folder
    # (STEP.orbax-checkpoint-tmp*), which the next run removes before it saves.
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=async_save,
                                           cleanup_tmp_directories=True)
    self.manager = ocp.CheckpointManager(
        self.directory, options=options,
        item_handlers={"state": ocp.StandardCheckpointHandler(),
                       "data": ocp.JsonCheckpointHandler(),
                       RECORD: ocp.JsonCheckpointHandler()})
    self._saved: int | None = None     # the step this process saved last
    self._pending: int | None = None   # saved, its digest not yet written
    self._needed = 0                   # bytes of the state being saved
    self._failed = False               # a save failed in orbax's background thread
    # While a save is in flight (an asynchronous one: until its digest is written), orbax's loops
    # drain on close and its tracebacks go to WORKDIR/checkpoint-errors.log
    # (bertjax/runtime/orbax_workarounds.py).
    self._loops = orbax_workarounds.SaveInFlight()
    self._error_log = self.directory.parent / orbax_workarounds.ERROR_LOG

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def latest_step(self) -> int | None:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def save(self, step: int, state: Any, data_state: dict | None, *, force: bool = False) -> bool:
    """Saves `step`; False when it was not saved. A step this process saved already is not saved
    again (a SIGTERM during a checkpoint step's evaluation asks for the step just saved). A full
    disk fails with one line; the older checkpoints stay."""
    if step == self._saved:
      return False
    self._seal()
    self._needed = sum(int(np.prod(np.shape(x))) * np.dtype(x.dtype).itemsize
                       for x in jax.tree.leaves(state) if hasattr(x, "dtype"))
    self._loops.start()
    orbax_workarounds.forget_failed()
    items = {"state": ocp.args.StandardSave(state), "data": ocp.args.JsonSave(data_state or {})}
    if self.record is not None:
      items[RECORD] = ocp.args.JsonSave(self.record)
    with self._no_space(step):
      saved = self.manager.save(step, args=ocp.args.Composite(**items), force=force)
    if saved:
      self._saved = self._pending = step
    if not saved or not self.async_save:
      self._seal()
    return saved

  def wait(self) -> None:
    self._seal()
    self.manager.wait_until_finished()

  def poll(self) -> None:
    """Writes the digest of an asynchronous save that has finished meanwhile, or raises its error
    where it failed on this process (two reads when neither); the training loop calls it after
    every step."""
    if self._pending is not None and (orbax_workarounds.failed_in_background() is not None
                                      or not self.manager.is_saving_in_progress()):
      self._seal()

  def _seal(self) -> None:
    """Waits for the save in flight, then writes its digest. Not in a thread of its own: orbax
    deletes old steps (keep_checkpoints) while finalizing the next save, under a digest being
    written."""
    if self._pending is None:
      self._loops.end()
      return
    step, self._pending = self._pending, None
    try:
      with self._no_space(step):
        self._wait_for_save()
        if jax.process_index() == 0:
          digests.write(self.directory / str(step))
    finally:
      self._loops.end()

  def _wait_for_save(self) -> None:
    """`manager.wait_until_finished`, except that an error of this process's asynchronous save is
    raised as soon as orbax's background thread meets it: with several processes orbax would
    wait in its barriers for the others instead (orbax_workarounds.py, 3), and the error raised
    here ends every process (bertjax/runtime/distributed.py, `run_main`)."""
    while self.manager.is_saving_in_progress():
      error = orbax_workarounds.failed_in_background()
      if error is not None:
        self._failed = True
        raise error
      time.sleep(_WAIT_S)
    self.manager.wait_until_finished()

  @contextlib.contextmanager
  def _no_space(self, step: int):
    """A full disk (or a quota, or a file-size limit) while saving `step`: its partial folder
    removed, the traceback in WORKDIR/checkpoint-errors.log, one line; older checkpoints kept."""
    try:
      yield
    except Exception as e:  # TensorStore, orbax and the OS report it as different types
      full = disk_error_of(e)
      if full is None:
        raise
      self._pending = None
      self._loops.abandon()
      self._remove_partial(step)
      # orbax's other writing threads may still be writing that step's files (recreating its
      # folder) until the process ends: removed once more at the end, after Python has joined
      # them (threads are joined before exit hooks run).
      atexit.register(self._remove_partial, step)
      where = self.directory / str(step)
      older = [s for s in self.all_steps() if s != step]
      logged = orbax_workarounds.log_failed_save(
          self._error_log, f"saving the checkpoint of step {step} at {where}", e)
      report = f" (its traceback: {self._error_log})" if logged else ""
      kept = f"older checkpoints {older or 'none'} are kept"
      if full.errno == errno.EFBIG:
        problem = (f"the checkpoint of step {step} at {where} has a file larger than the "
                   f"file-size limit (ulimit -f): it needs about {size_in_gib(self._needed)}; "
                   f"{kept}: raise the limit (ulimit -f unlimited) and run the same command to "
                   f"resume{report}")
      else:
        problem = (f"{disk_reason(full)} for the checkpoint of step {step} at {where}: it needs "
                   f"about {size_in_gib(self._needed)}, {free_space(self.directory)} free there; "
                   f"{kept}: free some space and run the same command to resume{report}")
      raise DiskFull(problem) from e

  def _remove_partial(self, step: int) -> None:
    """Removes what a failed save of `step` left (its STEP.orbax-checkpoint-tmp* folders). A
    writer still adding files makes it fail: what is left goes at the end, or at the next run's
    start (cleanup_tmp_directories)."""
    for partial in self.directory.glob(f"{step}.orbax-checkpoint-tmp*"):
      with contextlib.suppress(OSError):
        paths.rmtree(partial)

  def restore_latest(self, abstract_state: Any, set_data_state: Callable[[dict], None] | None = None
                     ) -> tuple[int, Any, dict] | None:
    """Restores the newest readable checkpoint; a damaged one is moved aside with one line.

    Returns (step, state, data_state) or None when there is no checkpoint. A checkpoint whose
    tree does not match `abstract_state` (a different model) is a user error, not damage.
    Damage: files that differ from the checkpoint's digest, unreadable files, an empty input
    pipeline state. `set_data_state` receives the pipeline state (its errors name the checkpoint).
    """
    steps = self.all_steps()
    damaged = []
    for step in reversed(steps):
      try:
        self._check_same_model(step, abstract_state)
        verify(self.directory, step, steps)
        with draining_event_loops():
          restored = self.manager.restore(
              step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                            data=ocp.args.JsonRestore()))
        data_state = restored["data"]
        if not data_state or not isinstance(data_state, dict):
          raise digests.Damaged(f"its input pipeline state (data/) is {data_state!r}")
        if set_data_state is not None:
          try:
            set_data_state(dict(data_state))
          except UserError as e:
            fail(f"the checkpoint at {self.directory / str(step)}: {e}")
        self._set_aside(damaged, step)
        return step, restored["state"], dict(data_state)
      except UserError:
        raise
      except Exception as e:  # damaged files surface as many error types (tensorstore, json, OS)
        damaged.append((step, _short(e)))
    if steps:
      fail(f"no readable checkpoint in {self.directory} ("
           + "; ".join(f"step {s}: {why}" for s, why in damaged)
           + "); move the folder away to start fresh")
    return None

  def _check_same_model(self, step: int, abstract_state: Any) -> None:
    """Compares the state's names and shapes (parameters first, then the optimizer's) with the
    checkpoint's metadata before reading arrays, so a workdir of another model or optimizer is
    refused with one line (and nothing is touched); what fails after this check is damage."""
    saved = _shapes(self.manager.item_metadata(step)["state"])
    wanted = _shapes(abstract_state)
    if saved == wanted:
      return
    where = self.directory / str(step)
    names = sorted(set(saved) | set(wanted), key=lambda n: (not n.startswith("params/"), n))
    for name in names:
      if saved.get(name) != wanted.get(name):
        what = "model" if name.startswith("params/") else "model or optimizer"
        fail(f"the checkpoint at {where} holds a different {what} than this config ({name}: "
             f"{saved.get(name, 'absent')} there, {wanted.get(name, 'absent')} here); use a new "
             f"--workdir or the config it was trained with")

  def _set_aside(self, damaged: list[tuple[int, str]], used: int) -> None:
    """Renames damaged checkpoints out of the way (kept for inspection, never deleted), one line
    each."""
    for step, why in damaged:
      src = self.directory / str(step)
      dst = self.directory / f"damaged-{step}-{int(time.time())}"
      src.rename(dst)
      logging.warning("checkpoint at step %d is unreadable (%s); moved it to %s and used step %d",
                      step, why, dst, used)
    if damaged:
      self.manager.reload()

  def close(self) -> None:
    """Waits for the save in flight and closes orbax's manager; not where a save failed in orbax's
    background thread (before, or while waiting here): its threads may wait in barriers for the
    other processes, and this process is ending with the error."""
    if self._failed:
      return
    try:
      self._seal()
      self.manager.wait_until_finished()
    finally:
      if not self._failed:
        self.manager.close()


def verify(directory: paths.Path, step: int, steps: list[int]) -> None:
  """`digests.verify` of checkpoint `step` among the run's `steps`: a missing digest.json is
  damage wherever another checkpoint of the run has one (only a run whose checkpoints all lack
  one, saved by a bertjax before digests, is read unchecked)."""
  directory = paths.as_path(directory)
  others = [s for s in steps if s != step and (directory / str(s) / digests.DIGEST).exists()]
  required = (f"the run's other checkpoint{'s' if len(others) > 1 else ''} "
              f"{', '.join(map(str, others))} {'have' if len(others) > 1 else 'has'} one"
              if others else "")
  digests.verify(directory / str(step), required=required)


def saved_record(directory: str | pathlib.Path) -> tuple[int, dict] | None:
  """(step, settings) saved with the newest checkpoint in `directory` that holds them and whose
  files match its digest; None where none does (checkpoints of a bertjax before they were)."""
  directory = paths.as_path(directory)
  if not directory.is_dir():
    return None
  manager = ocp.CheckpointManager(paths.absolute(directory), item_names=(RECORD,))
  try:
    steps = sorted(manager.all_steps())
    for step in reversed(steps):
      if not (directory / str(step) / RECORD).is_dir():
        continue
      try:
        verify(directory, step, steps)
        with draining_event_loops():
          record = manager.restore(step, args=ocp.args.Composite(
              **{RECORD: ocp.args.JsonRestore()}))[RECORD]
      except Exception as e:  # pylint: disable=broad-except  # damaged: an older one may do
        logging.warning("the settings saved with the checkpoint at step %d are unreadable (%s)",
                        step, _short(e))
        continue
      if isinstance(record, dict) and record:
        return step, record
  finally:
    manager.close()
  return None


def _shapes(tree: Any) -> dict[str, tuple]:
  """{name: shape} of a state or of its checkpoint's metadata; a name joins the keys (a field of
  an optimizer state's named tuple is a dict key in the metadata: both read as the field)."""
  key = lambda k: str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
  return {"/".join(map(key, path)): tuple(np.shape(leaf))
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _short(e: Exception) -> str:
  text = " ".join(str(e).split())
  return text[:200] + ("..." if len(text) > 200 else "")


def restore_params(path: str | pathlib.Path) -> dict:
  """Parameters (a plain nested dict of numpy arrays) from a converted folder or a training workdir."""
  path = paths.as_path(path)
  if (folder := best_params(path)) is not None:
    return restore_params_folder(folder)
  if (path / "params").is_dir():
    return restore_params_folder(path / "params")
  if (path / "checkpoints").is_dir():
    return restore_checkpoint_params(path)[1]
  fail(f"init_from={path} holds neither params/ (a converted checkpoint) nor checkpoints/ "
       f"(a training workdir); run `python -m bertjax.convert from-hf` or point at a workdir")


def restore_params_folder(folder: paths.Path) -> dict:
  """The arrays of one params/ folder (a best/ folder's, a `from-hf` or pruned folder's), checked
  against its digest first. Such a folder has nothing to fall back to: damage is refused in one
  line naming the file; a folder written before digests loads unchecked (one warning)."""
  folder = paths.as_path(folder)
  try:
    digests.verify(folder)
  except digests.Damaged as e:
    meta = folder.parent / "model.json"
    best = next((d for d in (folder.parent, folder.parent.parent) if (d / "best.json").is_file()),
                None)
    if best is not None:
      fix = f"point at the run {best.parent} (its newest checkpoint) or fine-tune again"
    elif meta.is_file() and b'"pruning"' in meta.read_bytes():
      fix = "prune again (python -m bertjax.prune)"
    else:
      fix = "write it again (python -m bertjax.convert from-hf)"
    fail(f"{folder} is damaged: {e}; there is no other copy to fall back to: {fix}")
  with draining_event_loops():
    return ocp.StandardCheckpointer().restore(paths.absolute(folder))


def restore_checkpoint_params(workdir: str | pathlib.Path, step: int | None = None
                              ) -> tuple[int, dict]:
  """(step, params) of a training workdir's checkpoint: `step`'s, or the newest readable one
  (orbax lists only complete checkpoints; a damaged one, unreadable or differing from its
  digest, is skipped with a warning and left where it is: a reader does not change a workdir)."""
  ckpt_dir = paths.as_path(workdir) / "checkpoints"
  manager = ocp.CheckpointManager(paths.absolute(ckpt_dir), item_names=("state", "data"))
  try:
    steps = sorted(manager.all_steps())
    if step is not None:
      if step not in steps:
        fail(f"--step {step}: {ckpt_dir} has no complete checkpoint at that step; its steps: "
             f"{', '.join(map(str, steps)) or 'none'}")
      steps = [step]
    every = sorted(manager.all_steps())
    for s in reversed(steps):
      try:
        verify(ckpt_dir, s, every)
        with draining_event_loops():
          restored = _restore_here(manager.directory, s)
        return s, jax.tree.map(lambda x: x, dict(restored["state"]["params"]))
      except Exception as e:  # same fallback as training resume
        if step is not None:  # the step asked for: no other is tried in its place
          _damaged_step(ckpt_dir, step, e, sorted(manager.all_steps()))
        logging.warning("checkpoint at step %d is unreadable (%s); trying an earlier one", s,
                        _short(e))
    fail(f"no readable checkpoint in {ckpt_dir}; point at a run that saved one")
  finally:
    manager.close()


def _restore_here(directory: paths.Path, step: int):
  """A checkpoint's state on this process's first device: a reader's arrays, wherever the
  checkpoint was written from (several processes' devices, a mesh this host lacks)."""
  # Every item the run writes named, so orbax has no item of unknown kind to warn about.
  reader = ocp.CheckpointManager(directory, item_names=("state", "data", RECORD),
                                 item_handlers={"state": ocp.StandardCheckpointHandler(),
                                                "data": ocp.JsonCheckpointHandler(),
                                                RECORD: ocp.JsonCheckpointHandler()})
  try:
    here = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=here),
                          reader.item_metadata(step)["state"])
    return reader.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
  finally:
    reader.close()


def _damaged_step(ckpt_dir: paths.Path, step: int, error: Exception, steps: list[int]
                  ) -> NoReturn:
  """Refuses `--step step` whose checkpoint is damaged, naming the other steps whose files match
  their digests (or that have none: saved before digests were written)."""
  readable = []
  for s in (s for s in steps if s != step):
    try:
      verify(ckpt_dir, s, steps)
    except digests.Damaged:
      continue
    readable.append(s)
  others = (f"readable steps: {', '.join(map(str, readable))}: pass one with --step, or drop "
            f"--step for the newest readable one" if readable else
            "no other step is readable; point at a run that saved one")
  fail(f"--step {step}: the checkpoint at {ckpt_dir / str(step)} is damaged ({_short(error)}); "
       f"{others}")


def load_model_config(path: str | pathlib.Path) -> dict:
  """The `ModelConfig` fields of a converted folder (model.json) or a training workdir
  (config.json), local or remote."""
  path = paths.as_path(path)
  for name in ("model.json", "config.json"):
    file = path / name
    if file.is_file():
      try:
        model = json.loads(read_text(file, name))["model"]
      except (ValueError, KeyError, TypeError) as e:
        fail(f"{file} is not a bertjax {name} ({type(e).__name__}: {_short(e)}); it may be "
             f"truncated: copy it again from where the run was made, or use another init_from")
      if not isinstance(model, dict):
        fail(f"{file} has no model settings (\"model\" is not an object); copy the file again")
      return dict(model)
  fail(f"{path} has no model.json or config.json; point init_from at a converted checkpoint "
       f"(python -m bertjax.convert from-hf) or a training workdir")


def tokenizer_dir(path: str | pathlib.Path) -> pathlib.Path:
  """The tokenizer saved with a converted checkpoint or a training workdir, as a local folder (a
  remote one's local copy: the tokenizer libraries read local files only)."""
  folder = paths.as_path(path) / "tokenizer"
  if not folder.is_dir():
    fail(f"{path} has no tokenizer/ folder; converted checkpoints and training workdirs carry one")
  return paths.reading(folder)


def load_init_from(state, path: str, shardings) -> tuple[Any, str]:
  """Copies every matching sub-tree of a checkpoint's params into `state`; reports the rest."""
  source = restore_params(path)
  target = flax.traverse_util.flatten_dict(jax.device_get(state.params), sep="/")
  flat_src = flax.traverse_util.flatten_dict(source, sep="/")
  restored, fresh = [], []
  new = {}
  for key, value in target.items():
    src = flat_src.get(key)
    if src is not None and tuple(np.shape(src)) == tuple(value.shape):
      new[key] = np.asarray(src, value.dtype)
      restored.append(key)
    else:
      if src is not None:
        logging.warning("init_from: %s has shape %s in the checkpoint, %s here; initialized fresh",
                        key, np.shape(src), value.shape)
      new[key] = value
      fresh.append(key)
  if not restored:
    fail(f"init_from={path} shares no parameter with this model; check the architecture and sizes")
  params = flax.traverse_util.unflatten_dict(new, sep="/")
  params = jax.device_put(params, shardings.params)
  top = lambda keys: sorted({k.split("/")[0] for k in keys})
  report = (f"init_from {path}: restored {len(restored)} tensors ({', '.join(top(restored))}); "
            f"initialized fresh {len(fresh)} ({', '.join(top(fresh)) or 'none'})")
  return state.replace(params=params), report


def best_params(folder: str | pathlib.Path) -> paths.Path | None:
  """The params/ folder of a best/ folder (`BestKeeper`'s: best/STEP/params, the complete step
  orbax kept, best.json's where two are: one replaced, not yet deleted; a bertjax before
  CheckpointManager kept it wrote best/params), None where `folder` is not a best/ folder."""
  folder = paths.as_path(folder)
  if not (folder / "best.json").is_file():
    return None
  manager = ocp.CheckpointManager(paths.absolute(folder), item_names=("params",))
  try:
    steps = manager.all_steps()
  finally:
    manager.close()
  if steps:
    named = run_files.read_number(folder / "best.json", "step")
    return folder / str(named if named in steps else max(steps)) / "params"
  return folder / "params" if (folder / "params").is_dir() else None


class BestKeeper:
  """Keeps the parameters of the best evaluation so far in WORKDIR/best (when a metric is named).

  orbax's CheckpointManager keeps them: `best_fn`/`best_mode` rank the saved steps by the metric,
  `max_to_keep=1` keeps the best one (best/STEP/params, whole arrays with their digest), and the
  one it replaces is deleted only once the new one is complete. best/best.json names the step,
  the metric and the whole evaluation for the readers (summary.json, convert, load)."""

  def __init__(self, workdir: paths.Path, metric: str, mode: str):
    self.dir = paths.as_path(workdir) / "best"
    self.metric, self.mode = metric, mode  # best_mode: max or min, checked with the settings
    self._manager: ocp.CheckpointManager | None = None
    # A damaged best.json (a warning names it) holds no value: the next evaluation replaces it.
    self.value = run_files.read_number(self.dir / "best.json", "value")
    if metric and self.dir.is_dir():
      kept = self.manager().best_step()
      if kept is not None:  # orbax's record of the step it kept, saved with that step
        self.value = (self.manager().metrics(kept) or {}).get(metric, self.value)

  def manager(self) -> ocp.CheckpointManager:
    if self._manager is None:
      metric = self.metric
      options = ocp.CheckpointManagerOptions(
          max_to_keep=1, best_fn=lambda metrics: metrics[metric], best_mode=self.mode,
          keep_checkpoints_without_metrics=False, create=True, enable_async_checkpointing=False)
      self._manager = ocp.CheckpointManager(
          paths.absolute(self.dir), options=options,
          item_handlers={"params": ocp.StandardCheckpointHandler()})
    return self._manager

  def update(self, step: int, metrics: dict, params) -> None:
    """Every process of a run calls it (the metrics are the run's): the parameters are gathered
    to the hosts and saved once; process 0 writes the digest and best.json."""
    if not self.metric:
      return
    if self.metric not in metrics:
      fail(f"best_metric={self.metric!r} is not an eval metric; choose one of "
           f"{', '.join(sorted(metrics))}")
    value = metrics[self.metric]
    # orbax's best_fn decides which saved step stays; this skips writing parameters it would
    # delete at once (an evaluation no better than the kept one).
    if self.value is not None and not (value > self.value if self.mode == "max"
                                       else value < self.value):
      return
    several, primary = jax.process_count() > 1, jax.process_index() == 0
    # Whole arrays on every host (fsdp or tensor shards gathered), saved as plain arrays.
    host = (multihost_utils.process_allgather(params, tiled=True) if several
            else jax.device_get(params))
    where = self.dir / str(step)
    try:
      with draining_event_loops():
        self.manager().save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(host)),
                            metrics=dict(metrics), force=True)
        self.manager().wait_until_finished()
      if primary:
        digests.write(where / "params")  # checked by every reader (restore_params_folder)
        paths.replace_text(self.dir / "best.json", json.dumps(
            {"step": step, "metric": self.metric, "value": value, "metrics": metrics}))
        paths.rmtree(self.dir / "params")  # a bertjax before orbax kept it wrote best/params
    except Exception as e:  # pylint: disable=broad-except
      full = disk_error_of(e)
      if full is None:
        raise
      if primary:
        for partial in self.dir.glob(f"{step}.orbax-checkpoint-tmp*"):
          paths.rmtree(partial)
      log = self.dir.parent / orbax_workarounds.ERROR_LOG
      logged = primary and orbax_workarounds.log_failed_save(
          log, f"saving the best parameters of step {step} at {where}", e)
      fail(f"{disk_reason(full)} for the best parameters (step {step}) at {where}; the "
           f"previous best/ and the checkpoints are kept: free some space and run the same "
           f"command to resume" + (f" (its traceback: {log})" if logged else ""))
    if several:
      multihost_utils.sync_global_devices("bertjax:best:end")
    self.value = value
