"""Checkpointing with orbax: exact resume, falling back past a damaged latest checkpoint.

A checkpoint holds the whole train state (params, optimizer state, step, RNG) and the input
pipeline's iterator state, so a resumed run sees the same batches, masks and dropout as an
uninterrupted one. orbax writes each step into a temporary folder and renames it when complete,
so a crash mid-save never looks like a checkpoint, and old steps are only deleted after a newer
one is finalized.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import pathlib
import time
from typing import Any

import flax
import jax
import numpy as np
import orbax.checkpoint as ocp

from bertjax import paths, run_files
from bertjax.errors import UserError, fail, read_text


class Checkpointer:
  """Saves and restores {state, data} items under `workdir/checkpoints` (local or remote)."""

  def __init__(self, directory: str | pathlib.Path, *, keep: int = 3, async_save: bool = True):
    self.directory = paths.absolute(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=async_save)
    self.manager = ocp.CheckpointManager(
        self.directory, options=options,
        item_handlers={"state": ocp.StandardCheckpointHandler(),
                       "data": ocp.JsonCheckpointHandler()})

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def latest_step(self) -> int | None:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def save(self, step: int, state: Any, data_state: dict | None, *, force: bool = False) -> bool:
    return self.manager.save(
        step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                      data=ocp.args.JsonSave(data_state or {})),
        force=force)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def restore_latest(self, abstract_state: Any) -> tuple[int, Any, dict] | None:
    """Restores the newest readable checkpoint; a damaged one is skipped with a warning.

    Returns (step, state, data_state) or None when there is no checkpoint. A checkpoint whose
    tree does not match `abstract_state` (a different model) is a user error, not damage.
    """
    steps = self.all_steps()
    damaged = []
    for step in reversed(steps):
      try:
        self._check_same_model(step, abstract_state)
        with draining_event_loops():
          restored = self.manager.restore(
              step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                            data=ocp.args.JsonRestore()))
        self._set_aside(damaged)
        return step, restored["state"], dict(restored["data"] or {})
      except UserError:
        raise
      except (ValueError, KeyError) as e:
        if _is_structure_mismatch(e):
          fail(f"the checkpoint at {self.directory / str(step)} holds a different model or "
               f"optimizer than this config ({_short(e)}); use a new --workdir or the config it was "
               f"trained with")
        logging.warning("checkpoint at step %d is unreadable (%s); trying an earlier one", step,
                        _short(e))
        damaged.append(step)
      except Exception as e:  # damaged files surface as many error types (tensorstore, json, OS)
        logging.warning("checkpoint at step %d is unreadable (%s); trying an earlier one", step,
                        _short(e))
        damaged.append(step)
    if steps:
      fail(f"no readable checkpoint in {self.directory} (tried steps {steps}); move the folder away "
           f"to start fresh")
    return None

  def _check_same_model(self, step: int, abstract_state: Any) -> None:
    """Compares parameter names and shapes with the checkpoint's metadata before reading arrays,
    so a workdir of another model is refused with one line (and nothing is touched)."""
    meta = self.manager.item_metadata(step)["state"]
    saved = {_path(p): tuple(m.shape) for p, m in jax.tree_util.tree_flatten_with_path(meta["params"])[0]}
    wanted = {_path(p): tuple(a.shape)
              for p, a in jax.tree_util.tree_flatten_with_path(abstract_state.params)[0]}
    if saved == wanted:
      return
    where = self.directory / str(step)
    for name in sorted(set(saved) | set(wanted)):
      if saved.get(name) != wanted.get(name):
        fail(f"the checkpoint at {where} holds a different model than this config ({name}: "
             f"{saved.get(name, 'absent')} there, {wanted.get(name, 'absent')} here); use a new "
             f"--workdir or the config it was trained with")

  def _set_aside(self, steps: list[int]) -> None:
    """Renames damaged checkpoints out of the way (kept for inspection, never deleted)."""
    for step in steps:
      src = self.directory / str(step)
      dst = self.directory / f"damaged-{step}-{int(time.time())}"
      src.rename(dst)
      logging.warning("moved the unreadable checkpoint of step %d to %s", step, dst)
    if steps:
      self.manager.reload()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


class _DrainingLoop(asyncio.SelectorEventLoop):
  """An event loop that, when closed, first cancels and awaits the tasks still running on it (as
  `asyncio.run` does). Tasks are tracked by a task factory rather than `asyncio.all_tasks`
  (orbax avoids the latter across threads)."""

  def __init__(self):
    super().__init__()
    self._tasks = []

    def factory(loop, coro, **kwargs):
      task = asyncio.Task(coro, loop=loop, **kwargs)
      self._tasks.append(task)
      return task

    self.set_task_factory(factory)

  def close(self) -> None:
    pending = [t for t in self._tasks if not t.done()]
    if pending and not self.is_running() and not self.is_closed():
      for task in pending:
        task.cancel()
      self.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    super().close()


class _DrainingPolicy(asyncio.DefaultEventLoopPolicy):
  def new_event_loop(self) -> asyncio.AbstractEventLoop:
    return _DrainingLoop()


@contextlib.contextmanager
def draining_event_loops():
  """Within it, event loops created by `asyncio.new_event_loop` finish their tasks on close.

  Restoring a damaged checkpoint, the first unreadable array ends orbax's `asyncio.gather` while
  the reads of the others are in flight; orbax's `run_sync` then closes its loop under them, and
  each late read prints a traceback ("Event loop is closed", "Exception ignored in: <coroutine
  ...>"): hundreds of lines after the one-line error. orbax 0.12 offers no setting for its loop,
  so the restores that may meet a damaged checkpoint run inside this block, which swaps asyncio's
  event loop policy (its public way to choose the loops `new_event_loop` makes) and puts the
  previous one back after.
  """
  previous = asyncio.get_event_loop_policy()
  asyncio.set_event_loop_policy(_DrainingPolicy())
  try:
    yield
  finally:
    asyncio.set_event_loop_policy(previous)


def _path(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def _short(e: Exception) -> str:
  text = " ".join(str(e).split())
  return text[:200] + ("..." if len(text) > 200 else "")


def _is_structure_mismatch(e: Exception) -> bool:
  text = str(e).lower()
  return any(s in text for s in ("tree structure", "does not match", "mismatch", "shape", "dict key"))


def restore_params(path: str | pathlib.Path) -> dict:
  """Parameters (a plain nested dict of numpy arrays) from a converted folder or a training workdir."""
  path = paths.as_path(path)
  if (path / "params").is_dir():
    with draining_event_loops():
      return ocp.StandardCheckpointer().restore(paths.absolute(path / "params"))
  if (path / "checkpoints").is_dir():
    return restore_checkpoint_params(path)[1]
  fail(f"init_from={path} holds neither params/ (a converted checkpoint) nor checkpoints/ "
       f"(a training workdir); run `python -m bertjax.convert from-hf` or point at a workdir")


def restore_checkpoint_params(workdir: str | pathlib.Path, step: int | None = None
                              ) -> tuple[int, dict]:
  """(step, params) of a training workdir's checkpoint: `step`'s, or the newest readable one
  (orbax lists only complete checkpoints; a damaged one is skipped with a warning)."""
  ckpt_dir = paths.as_path(workdir) / "checkpoints"
  manager = ocp.CheckpointManager(paths.absolute(ckpt_dir), item_names=("state", "data"))
  try:
    steps = sorted(manager.all_steps())
    if step is not None:
      if step not in steps:
        fail(f"--step {step}: {ckpt_dir} has no complete checkpoint at that step; its steps: "
             f"{', '.join(map(str, steps)) or 'none'}")
      steps = [step]
    for s in reversed(steps):
      try:
        with draining_event_loops():
          restored = manager.restore(s, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
        return s, jax.tree.map(lambda x: x, dict(restored["state"]["params"]))
      except Exception as e:  # same fallback as training resume
        logging.warning("checkpoint at step %d is unreadable (%s); trying an earlier one", s,
                        _short(e))
    fail(f"no readable checkpoint in {ckpt_dir}; point at a run that saved one")
  finally:
    manager.close()


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


class BestKeeper:
  """Keeps the parameters of the best evaluation so far in WORKDIR/best (when a metric is named)."""

  def __init__(self, workdir: paths.Path, metric: str, mode: str):
    self.dir = paths.as_path(workdir) / "best"
    self.metric, self.mode = metric, mode
    if mode not in ("max", "min"):
      fail(f"best_mode={mode!r} must be max or min")
    # A damaged best.json (a warning names it) holds no value: the next evaluation replaces it.
    self.value = run_files.read_number(self.dir / "best.json", "value")

  def update(self, step: int, metrics: dict, params) -> None:
    if not self.metric or jax.process_index() != 0:
      return
    if self.metric not in metrics:
      fail(f"best_metric={self.metric!r} is not an eval metric; choose one of "
           f"{', '.join(sorted(metrics))}")
    value = metrics[self.metric]
    better = self.value is None or (value > self.value if self.mode == "max" else value < self.value)
    if not better:
      return
    # Write beside, then swap: the previous best survives until the new one is complete.
    tmp = self.dir.with_name("best.tmp")
    paths.rmtree(tmp)
    tmp.mkdir(parents=True)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(paths.absolute(tmp / "params"), jax.device_get(params))
    checkpointer.wait_until_finished()
    (tmp / "best.json").write_text(json.dumps({"step": step, "metric": self.metric, "value": value,
                                               "metrics": metrics}))
    old = self.dir.with_name("best.old")
    if self.dir.exists():
      self.dir.rename(old)
    tmp.rename(self.dir)
    paths.rmtree(old)
    self.value = value
