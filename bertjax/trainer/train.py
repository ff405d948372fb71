"""The one trainer: pretraining objectives and fine-tuning tasks run through `train_and_evaluate`.

The train step is a pure function `train_step(state, batch) -> (state, metrics)`, jitted once
with explicit shardings and a donated state. Gradient accumulation runs inside it as a scan over
micro-batches; losses are divided by whole-batch denominators so k micro-batches give exactly the
gradient of one big batch. Dropout keys derive from `fold_in(rng, step)`, so a resumed run
repeats an uninterrupted one bit for bit.
"""

from __future__ import annotations

import contextlib
import json
import logging
import pathlib
import sys
import time
from typing import Callable

import flax.linen as nn
import jax
import ml_collections

from bertjax.core import paths, run_files
from bertjax.core.errors import DISK_FULL_ERRNOS, fail
from bertjax.data.tokenizers import CONFIG_FILE as TOKENIZER_MARK  # written last by its save
from bertjax.evaluators.context import EvalContext
from bertjax.evaluators.schedule import Evaluations
from bertjax.models.config import ModelConfig
from bertjax.objective import Schedule
from bertjax.runtime import (checkpoints, distributed, divergence, prefetch, sharding,
                             step_memory, workdir as workdir_lib)
from bertjax.runtime import metric_writers
from bertjax.runtime.metric_writers import MetricWriter
from bertjax.runtime.preemption import Preemption
from bertjax.runtime.progress import EVERY_S, Progress, real_clock_compile_seconds
from bertjax.runtime.run_record import RunRecord
from bertjax.tasks import base as task_base
from bertjax.trainer import run_plan, steps


def model_config_from(config: ml_collections.ConfigDict) -> ModelConfig:
  return ModelConfig.from_dict(config.model.to_dict())


# The setup's pieces, built in bertjax/trainer/steps.py, under the names the trainer's readers use.
TrainState, Fp8TrainState, Setup = steps.TrainState, steps.Fp8TrainState, steps.Setup
make_train_step, split_micro_batches = steps.make_train_step, steps.split_micro_batches
abstract_params_of, param_shardings_for = steps.abstract_params_of, steps.param_shardings_for
create_train_state = steps.create_train_state


def setup(config, objective, model_cfg: ModelConfig, mesh, schedule: Schedule | None = None,
          grad_accum_steps: int | None = None, *, rules) -> tuple[Setup, TrainState]:
  """The run's setup (`steps.build`: model, optimizer, shardings, the jitted steps) and its
  freshly initialized, sharded train state. A run's plan (bertjax/trainer/run_plan.py) gives
  `schedule` (the learning rate runs to its total_steps, else to config.total_steps),
  `grad_accum_steps` (already checked; else checked here) and `rules`, its logical rules."""
  accum = grad_accum_steps or run_plan.accumulation_steps(config, mesh)
  s = steps.build(config, objective, model_cfg, mesh, schedule, accum, rules)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    state = s.init(jax.random.key(config.seed))
  return s, state


def _best_eval(config, objective, workdir: paths.Path, best: checkpoints.BestKeeper) -> dict:
  """summary.json's best evaluation of the whole run: best/'s (best_metric), else the best by
  the objective's main metric over metrics.jsonl (its parameters not kept)."""
  kept = run_files.read_json(best.dir / "best.json") if best.metric else None
  if kept and isinstance(kept.get("metrics"), dict):
    return {"best_eval": kept["metrics"], "best_eval_step": kept.get("step"),
            "best_metric": kept.get("metric"), "best": str(best.dir)}
  metric = objective.main_metric(config)
  rows = [r for r in metric_writers.read_metrics(workdir)
          if r.get("split") == "eval" and isinstance(r.get(metric), (int, float))]
  if not rows:
    return {}
  row = (min if run_files.lower_is_better(metric) else max)(rows, key=lambda r: r[metric])
  return {"best_eval": {k: v for k, v in row.items() if k not in ("step", "split")},
          "best_eval_step": row["step"], "best_metric": metric, "best": None}


def _resolved(config, model_cfg: ModelConfig | None, schedule: Schedule | None = None) -> dict:
  """What config.json records: the config with the schedule run (`schedule`: the run's plan; a
  fine-tuning task derives it) and the model actually trained (fine-tuning takes init_from's
  architecture, so this workdir can itself be an init_from or a teacher); without `model_cfg`,
  no model."""
  fields = config.to_dict()
  if schedule is not None:
    fields.update(total_steps=schedule.total_steps, eval_every=schedule.eval_every)
  resolved = workdir_lib.as_recorded(fields)
  resolved.pop("model")
  return {**resolved, "model": model_cfg.to_dict()} if model_cfg else resolved


def _write_tokenizer(workdir: paths.Path, data) -> None:
  """WORKDIR/tokenizer, written beside and moved into place whole (its config file last on a
  bucket), so a write that fails leaves none rather than a part the next run would keep."""
  target = workdir / "tokenizer"
  if data.tokenizer is None or jax.process_index() != 0 or (target / TOKENIZER_MARK).exists():
    return
  with paths.writing_whole(target, last=(TOKENIZER_MARK,)) as folder:
    data.tokenizer.save(folder)


# What every step that reads nothing from the devices (`reads_devices`) runs under: a factory of
# context managers, none in a run. tests/test_loop_transfers.py passes one that raises on any
# device-to-host read (`jax.transfer_guard_device_to_host("disallow")` where the backend enforces
# it), so a read slipped into those steps, which would make the devices wait, fails a test.
QuietStep = Callable[[], contextlib.AbstractContextManager]


def reads_devices(config, schedule: Schedule, step: int, first: bool) -> bool:
  """Whether the loop reads device values at `step` (1-based): a process's `first` step, whose
  end starts the throughput clock, and logging, evaluation and checkpoint steps. Between them
  it only queues work, so the devices never wait for the host."""
  return bool(first or step % config.log_every == 0 or step == schedule.total_steps
              or (schedule.eval_every and step % schedule.eval_every == 0)
              or step % config.checkpoint_every == 0)


def check_step_memory(s: Setup, state: TrainState, device_batch) -> str:
  """Compiles the train step for the first batch and refuses, in one line, a step that cannot
  fit on the device (bertjax/runtime/step_memory.py); else prints its estimate once. The jitted step
  then runs this same executable (jit reuses it: no second compile). Fine-tuning batches cut to
  their longest row are estimated at the first batch's length."""
  with jax.set_mesh(s.mesh), nn.logical_axis_rules(s.rules):
    compiled = s.train_step.lower(state, device_batch).compile()
  line = step_memory.check_fits(compiled, jax.local_devices()[0])
  logging.info(line)
  # Once: the log's line where a handler writes it to the terminal (launch.py's), else printed
  # (a handler that only captures, as pytest's, shows nothing).
  console = [h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler)
             and getattr(h, "stream", None) in (sys.stderr, sys.stdout)]
  shown = logging.getLogger(__name__).isEnabledFor(logging.INFO) and console
  if jax.process_index() == 0 and not shown:
    print(line, file=sys.stderr, flush=True)
  return line


def _train_loop(plan: run_plan.RunPlan, s: Setup, state: TrainState, ckpt, writer: MetricWriter,
                run_eval: Callable, record: RunRecord, clock: Callable[[], float],
                preemption: Preemption, started: Callable[[int], None] = lambda step: None,
                eval_due: Callable[[int], bool] = lambda step: False,
                quiet_step: QuietStep = contextlib.nullcontext) -> tuple[TrainState, int, str]:
  """Steps until total_steps or SIGTERM: logging, evaluation (at the steps `eval_due` names) and
  checkpoints on their cadence, a progress line every `progress_every_s` seconds; `started(step)`
  once the first step is trained; a step that reads nothing from the devices (`reads_devices`)
  runs under `quiet_step()`. A SIGTERM (`preemption.requested`) lets the step, its evaluation and
  its saves finish, then saves it. Returns the state, the step reached and why the loop ended."""
  config, data, total_steps = plan.config, plan.data, plan.schedule.total_steps
  step = int(jax.device_get(state.step))
  stop_reason = "finished"
  batches = prefetch.DevicePrefetch(data.train, lambda b: sharding.shard_batch(b, s.mesh),
                                    config.get("prefetch_batches", 2))
  lines = Progress("train", total_steps, every_s=config.get("progress_every_s", EVERY_S),
                   clock=clock, enabled=jax.process_index() == 0,
                   excluded=real_clock_compile_seconds(clock))
  while step < total_steps:
    step += 1
    quiet = not (reads_devices(config, plan.schedule, step, record.compiling) or eval_due(step))
    with quiet_step() if quiet else contextlib.nullcontext():
      batch, device_batch = next(batches)
      if record.compiling:  # this process's first step: known to fit before it runs
        check_step_memory(s, state, device_batch)
      with jax.set_mesh(s.mesh), nn.logical_axis_rules(s.rules):
        state, metrics = s.train_step(state, device_batch)
      first = record.compiling
      record.add(batch, metrics, state.step)  # the first step: waits until it is trained
      if first:
        started(step)
      if step % config.log_every == 0 or step == total_steps:
        record.log(writer, step, metrics)
        record.watch.check()
      lines.update(step, record.shown)
      if eval_due(step):
        t_eval = time.time()
        record.last_eval = run_eval(step, state) or record.last_eval
        record.t_log += time.time() - t_eval  # evaluation time is not training time
      if step % config.checkpoint_every == 0 or step == total_steps:
        record.watch.check_checkpoint(step, state.params)
        ckpt.save(step, state, _data_state(batches, record), force=True)
      ckpt.poll()  # the digest of an asynchronous save that finished meanwhile
    if preemption.stop_at(step):  # outside the guard: a preemption checkpoint may come at any step
      record.watch.check_checkpoint(step, state.params)
      ckpt.save(step, state, _data_state(batches, record), force=True)
      stop_reason = stopped_status(preemption)
      break
  return state, step, stop_reason


# The key of the checkpoint's JSON item (the input pipeline's state) that carries the train
# metrics of the steps since the last logged row (RunRecord.window).
WINDOW = "train_window"


def _data_state(batches, record: RunRecord) -> dict:
  window = record.window()
  return {**batches.get_state(), WINDOW: window} if window else batches.get_state()


def _pipeline_state(set_state: Callable[[dict], None], windows: list) -> Callable[[dict], None]:
  """The restore's setter of the input pipeline's state: the logging window taken out first
  (into `windows`)."""
  def set_pipeline(state: dict) -> None:
    windows.append(state.pop(WINDOW, None))
    set_state(state)
  return set_pipeline


# Where a SIGTERM before the first step stops a run: nothing of this process to save.
STARTING = "starting, before this process trained a step (nothing half-written is kept)"
PREEMPTED = "preempted (SIGTERM): checkpoint saved"
INTERRUPTED = "interrupted (Ctrl-C): checkpoint saved"


def stopped_status(preemption: Preemption) -> str:
  """summary.json's status of a run a SIGTERM or a Ctrl-C stopped after its checkpoint."""
  return INTERRUPTED if preemption.name == "Ctrl-C" else PREEMPTED


CHECKING = "checking the settings (nothing was written)"


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, *,
                       clock: Callable[[], float] = time.monotonic,
                       quiet_step: QuietStep = contextlib.nullcontext) -> dict:
  """Trains `config` in `workdir` (resuming from its latest checkpoint) and returns a summary.
  One run at a time holds the workdir (bertjax/runtime/workdir.py). `clock` times the progress lines
  (bertjax/runtime/progress.py); `quiet_step` is what the loop's steps that read nothing from the
  devices run under (`QuietStep`). A SIGTERM at any point ends the run as preempted
  (bertjax/runtime/preemption.py): a summary saying so, its checkpoint saved, or `errors.Preempted`
  where a step was not trained since the last checkpoint; either way the same call goes on. The run
  is planned once (bertjax/trainer/run_plan.py): `config` is that of every step, never copied or
  changed.

  It reads top to bottom: check, lock the workdir, inputs, setup, then (`_train_and_evaluate`)
  restore and the loop."""
  with Preemption() as preemption, contextlib.ExitStack() as held:
    # ----------------------------------------------------------------------------------------------
    # Check: every setting, before anything is created, prepared, trained or written.
    with preemption.abandoning(CHECKING):
      paths.check_output_folder(workdir)  # "" (an unset variable): the current folder
      workdir = paths.as_path(workdir)
      plan = run_plan.plan(config, workdir)

    # ----------------------------------------------------------------------------------------------
    # Lock the workdir: made and held. Then a SIGTERM drops everything up to the first step:
    # reads, and writes staged then moved into place whole (the prepared corpus, a trained
    # tokenizer); a resumed run's settings are checked against its config.json before anything
    # is prepared or written (the schedule once it is derived).
    try:
      workdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a read-only mount, or a folder even root cannot write in (/proc)
      if e.errno in DISK_FULL_ERRNOS:
        raise
      fail(f"workdir {workdir} cannot be created ({e.strerror or type(e).__name__}); fix: pass "
           "a --workdir you can write to")
    held.enter_context(workdir_lib.locked(workdir))
    with preemption.abandoning(STARTING):
      settings = workdir_lib.Settings(workdir, config.get("allow_changed_settings", False),
                                      trained=workdir_lib.has_checkpoints(workdir))
      settings.check(_resolved(config, plan.model_cfg), pending=workdir_lib.SCHEDULE)

      # --------------------------------------------------------------------------------------------
      # Inputs: process 0 builds what is built once (a tokenizer, the prepared corpus, a task's
      # features); the others wait for it, then read them. Then the schedule (a task's from its
      # training rows) and the inputs against the model.
      with distributed.built_by_process_0("the inputs (tokenizer, prepared corpus or task "
                                          "features)"):
        data = plan.objective.build_inputs(config, workdir, eval_batch_size=plan.eval_batch_size)
      plan = run_plan.with_inputs(plan, data)
      settings.check(_resolved(config, plan.model_cfg, plan.schedule))

      # --------------------------------------------------------------------------------------------
      # Setup: the model, optimizer and shardings; the sharded train state; the jitted steps.
      s, state = setup(config, plan.objective, plan.model_cfg, plan.mesh, plan.schedule,
                       plan.grad_accum_steps, rules=plan.rules)
    return _train_and_evaluate(plan, settings, s, state, clock, preemption, quiet_step)


def _train_and_evaluate(plan: run_plan.RunPlan, settings: workdir_lib.Settings, s: Setup,
                        state: TrainState, clock: Callable[[], float], preemption: Preemption,
                        quiet_step: QuietStep = contextlib.nullcontext) -> dict:
  """A planned and set-up run's restore and loop (`train_and_evaluate`'s second half)."""
  config, workdir, objective, data = plan.config, plan.workdir, plan.objective, plan.data
  total_steps, eval_every = plan.schedule.total_steps, plan.schedule.eval_every
  logging.info("model: %s parameters", f"{s.num_params:,}")
  about = objective.about(config)  # what its headline loss sums, where that misleads
  if about:
    task_base.announce(about)
  if s.partition.frozen_any:
    logging.info(s.partition.describe(state.params))

  best = checkpoints.BestKeeper(workdir, config.get("best_metric", ""), config.get("best_mode", "max"))
  ckpt = checkpoints.Checkpointer(
      workdir / "checkpoints", keep=config.keep_checkpoints, async_save=config.async_checkpointing,
      record=json.loads(json.dumps(_resolved(config, plan.model_cfg, plan.schedule), default=str)))
  try:
    # ----------------------------------------------------------------------------------------------
    # Restore: the latest checkpoint, else init_from's weights.
    with preemption.abandoning(STARTING):
      windows = []
      restored = ckpt.restore_latest(
          s.abstract_state,
          _pipeline_state(data.train.set_state, windows))
      step0 = 0
      if restored is not None:
        step0, state, _ = restored
        logging.info("resumed from the checkpoint at step %d in %s", step0, ckpt.directory)
      elif config.init_from:
        state, report = checkpoints.load_init_from(state, config.init_from, s.state_shardings)
        task_base.announce(report)  # once: in the log where one is set up, else on stdout
      # Every check has passed: the tokenizer is written now; the record of the run (config.json,
      # changes.jsonl) once its first step is trained, so a run failing before it blocks no fix.
      _write_tokenizer(workdir, data)
    writer = MetricWriter(workdir, total_steps, tensorboard=config.tensorboard)

    # The run's evaluators (bertjax/evaluators/), built once with the trainer's jitted functions.
    evaluations = Evaluations.of(config, objective, EvalContext(
        mesh=plan.mesh, rules=s.rules, workdir=workdir, total_steps=total_steps,
        eval_step=s.eval_step, batches=data.eval_batches, num_batches=data.num_eval_batches,
        predict_step=s.predict_step, eval_batch_size=plan.eval_batch_size, data=data,
        model_config=plan.model_cfg, progress_every_s=config.get("progress_every_s", EVERY_S),
        clock=clock), eval_every)

    def run_eval(step, state, last=False):
      # After the last step a SIGTERM drops the evaluation (its checkpoint is saved: a rerun
      # evaluates it); in the loop the evaluation finishes and its step is saved.
      with (preemption.abandoning(f"evaluating step {step} after the last step (its checkpoint "
                                  "is saved)") if last else contextlib.nullcontext()):
        metrics = evaluations.run(state.params, step, at_end=last)
      if metrics:  # written whole whatever comes: a SIGTERM now only sets `requested`
        writer.write(step, "eval", metrics)
        best.update(step, metrics, state.params)
        record.last_eval_step = step
      return metrics

    record = RunRecord.resumed(writer.resume_at(step0), divergence.Watch(
        config.get("nonfinite_policy", "stop"), int(jax.device_get(state.step)),
        config.learning_rate, plan.model_cfg.dtype))
    record.resume_window(windows[-1] if restored is not None and windows else None)
    # ----------------------------------------------------------------------------------------------
    # Loop.
    with distributed.watching_the_others():  # several processes: one lost ends the others
      state, step, stop_reason = _train_loop(
          plan, s, state, ckpt, writer, run_eval, record, clock, preemption,
          started=lambda step: settings.record(step0, _resolved(config, plan.model_cfg,
                                                                plan.schedule)),
          eval_due=evaluations.due, quiet_step=quiet_step)
      if (stop_reason == "finished" and step == total_steps
          and evaluations.at_end(step, record.last_eval_step)):
        record.last_eval = run_eval(step, state, last=True) or record.last_eval
  finally:
    # Also on errors: orbax's background threads must finish before the process exits.
    ckpt.close()
  writer.close()
  if preemption.requested:  # since the loop (the last writes, the last save's end): all is saved
    stop_reason = stopped_status(preemption)
  summary = {"workdir": str(workdir), "step": step, "status": stop_reason,
             "checkpoint": str(ckpt.directory / str(ckpt.latest_step())) if ckpt.latest_step() else None,
             "first_train": record.first, "last_train": record.last,
             "last_eval": record.last_eval, "first_train_step": record.first_step,
             "last_train_step": record.last_step, "last_eval_step": record.last_eval_step,
             "num_params": int(s.num_params), **_best_eval(config, objective, workdir, best)}
  summary["reading"] = objective.reading(config, summary)
  if jax.process_index() == 0:  # one run, one summary
    paths.replace_text(workdir / "summary.json", json.dumps(summary, indent=2, default=str))
  return summary
