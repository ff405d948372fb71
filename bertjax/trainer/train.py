"""The one trainer: pretraining objectives and fine-tuning tasks run through `train_and_evaluate`.

The train step is a pure function `train_step(state, batch) -> (state, metrics)`, jitted once
with explicit shardings and a donated state. Gradient accumulation runs inside it as a scan over
micro-batches; losses are divided by whole-batch denominators so k micro-batches give exactly the
gradient of one big batch. Dropout keys derive from `fold_in(rng, step)`, so a resumed run
repeats an uninterrupted one bit for bit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import pathlib
import sys
import time
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

from bertjax.core import paths, run_files
from bertjax.core.errors import DISK_FULL_ERRNOS, fail
from bertjax.data.tokenizers import CONFIG_FILE as TOKENIZER_MARK  # written last by its save
from bertjax.evaluators.context import EvalContext
from bertjax.evaluators.schedule import Evaluations
from bertjax.models import fp8, kernels
from bertjax.models.config import ModelConfig
from bertjax.objective import Schedule
from bertjax.runtime import (checkpoints, distributed, divergence, freezing, optim, prefetch,
                             sharding, step_memory, workdir as workdir_lib)
from bertjax.runtime import metric_writers
from bertjax.runtime.metric_writers import MetricWriter
from bertjax.runtime.preemption import Preemption
from bertjax.runtime.progress import EVERY_S, Progress, real_clock_compile_seconds
from bertjax.runtime.run_record import RunRecord
from bertjax.tasks import base as task_base
from bertjax.trainer import run_plan
from bertjax.trainer.eval_context import make_eval_step, make_predict_step


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array  # <uint32>[2]: raw key data, so it checkpoints as a plain array


@flax.struct.dataclass
class Fp8TrainState(TrainState):
  """A `model.fp8` run's train state: `TrainState` and `fp8`, the FP8 projections' scale state
  (amax histories and scales, bertjax.models.fp8), replicated, checkpointed with the rest; a
  step's gradient with respect to it is its next value. A run without FP8 keeps `TrainState`, so
  its state, step and checkpoint tree are those before FP8 existed."""
  fp8: Any = None


def model_config_from(config: ml_collections.ConfigDict) -> ModelConfig:
  return ModelConfig.from_dict(config.model.to_dict())


def split_micro_batches(batch, accum: int):
  """[accum * micro, ...] -> [accum, micro, ...], taking rows accum apart so a data-sharded batch
  splits along each device's own rows."""
  def split(x):
    return x.reshape(x.shape[0] // accum, accum, *x.shape[1:]).swapaxes(0, 1)
  return jax.tree.map(split, batch)


def make_train_step(objective, model, optimizer, accum: int, skip_nonfinite: bool = False,
                    partition: freezing.Partition | None = None,
                    micro_rows: int | None = None) -> Callable:
  """The jitted-to-be step. Every step reports `nonfinite` (1 when its loss or gradient norm is
  not finite); with `skip_nonfinite` such a step leaves parameters and optimizer state as they
  were (bertjax.runtime.divergence). `partition` (a frozen encoder, bertjax.runtime.freezing):
  gradients, optimizer state and updates cover its trainable parameters only. With `micro_rows` (a
  batch warmup, bertjax/data/batch_warmup.py) a batch of k * micro_rows rows runs as k
  micro-batches, k read from its shape (one compilation per k); else as `accum`."""
  partition = partition or freezing.Partition(frozenset(), frozen_any=False)

  def train_step(state: TrainState, batch):
    rows = jax.tree.leaves(batch)[0].shape[0]
    accum_now = rows // micro_rows if micro_rows else accum
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    denominators = objective.denominators(batch)
    trainable, frozen = partition.split(state.params)
    loss_fn = lambda p, mb, r: objective.loss(model, partition.merge(p, frozen), mb, r,
                                              denominators, deterministic=False)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    # model.fp8: ((loss, metrics), grads, the scale state's gradient, which is its next value).
    grad_fn = _with_scales(grad_fn, objective, model, partition, frozen, denominators,
                           getattr(state, "fp8", None))
    if accum_now == 1:
      (loss, metrics), grads, scales = grad_fn(trainable, batch, rng)
    else:
      micro = split_micro_batches(batch, accum_now)

      def body(carry, xs):
        i, mb = xs
        (l, m), g, sc = grad_fn(trainable, mb, jax.random.fold_in(rng, i))
        acc_l, acc_m, acc_g, acc_sc = carry
        # The scale states combine by their maximum (fp8.combine), not a sum.
        return (acc_l + l, jax.tree.map(jnp.add, acc_m, m), jax.tree.map(jnp.add, acc_g, g),
                fp8.combine(acc_sc, sc)), None

      (l0, m0), g0, sc0 = jax.eval_shape(grad_fn, trainable, jax.tree.map(lambda x: x[0], micro),
                                         rng)
      zeros = lambda t: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), t)
      # Zeros start the scale states' maximum too: amaxes and scales are never negative.
      (loss, metrics, grads, scales), _ = jax.lax.scan(
          body, (zeros(l0), zeros(m0), zeros(g0), zeros(sc0)), (jnp.arange(accum_now), micro))
    updates, opt_state = optimizer.update(grads, state.opt_state, trainable)
    params = partition.merge(optax.apply_updates(trainable, updates), frozen)
    grad_norm = optax.tree.norm(grads)
    finite = divergence.step_is_finite(loss, grad_norm)
    metrics = {**metrics, "loss": (loss, jnp.ones_like(loss))}
    if skip_nonfinite:
      params, opt_state, scales = divergence.keep_if_finite(
          finite, (params, opt_state, scales),
          (state.params, state.opt_state, getattr(state, "fp8", None)))
      metrics = divergence.without_nonfinite_step(finite, metrics)
    metrics["learning_rate"] = (optim.current_learning_rate(state.opt_state), jnp.ones(()))
    metrics["grad_norm"] = (grad_norm, jnp.ones(()))
    metrics["nonfinite"] = (1.0 - finite.astype(jnp.float32), jnp.ones(()))
    sparsity = optim.held_sparsity(opt_state)  # optimizer.keep_pruned: the zeros held
    if sparsity is not None:
      metrics["sparsity"] = (sparsity, jnp.ones(()))
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                              **({} if scales is None else {"fp8": scales}))
    return new_state, metrics

  return train_step


def _with_scales(grad_fn, objective, model, partition, frozen, denominators, scales):
  """`grad_fn` (params, batch, rng) -> ((loss, metrics), grads) as (params, batch, rng) ->
  ((loss, metrics), grads, next scale state): without FP8 (`scales` None) the same, the state
  None; with it the model handed to the loss reads `scales` (fp8.WithScales) and the gradient
  with respect to them is their next value (flax's `_overwrite_with_gradient`): it never enters
  the optimizer, the gradient norm, clipping or weight decay."""
  if scales is None:
    return lambda p, mb, r: (*grad_fn(p, mb, r), None)
  loss_fn = lambda p, sc, mb, r: objective.loss(fp8.WithScales(model, sc),
                                                partition.merge(p, frozen), mb, r, denominators,
                                                deterministic=False)
  both = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)

  def fp8_grad_fn(p, mb, r):
    out, (grads, next_scales) = both(p, scales, mb, r)
    return out, grads, next_scales
  return fp8_grad_fn


def abstract_params_of(objective, model, init_batch):
  """The boxed parameter tree (shapes, dtypes, logical axes), traced without allocating."""
  return jax.eval_shape(lambda r: objective.init_params(model, r, init_batch), jax.random.key(0))


def param_shardings_for(objective, model, config, mesh, init_batch, abstract_boxed=None,
                        rules=None):
  """(abstract boxed params, NamedSharding per param) without allocating anything (`rules`: the
  run's logical rules, by default the config's)."""
  if abstract_boxed is None:
    abstract_boxed = abstract_params_of(objective, model, init_batch)
  rules = sharding.rules_from_config(config) if rules is None else rules
  shardings = run_plan.param_shardings(abstract_boxed, mesh, rules)
  return abstract_boxed, shardings


def create_train_state(objective, model, optimizer, config, mesh, init_batch, abstract_boxed=None,
                       partition: freezing.Partition | None = None, rules=None):
  """Parameters and optimizer state created already sharded: shapes, specs, one jitted init.

  The model's init is traced once for the shapes (or not at all, given `abstract_boxed`) and
  once more by the jitted init that allocates them. With `partition`, the optimizer state
  covers its trainable parameters only. `rules`: the run's logical rules, by default the
  config's.
  """
  partition = partition or freezing.Partition(frozenset(), frozen_any=False)
  rules = sharding.rules_from_config(config) if rules is None else rules
  rng = jax.random.key(config.seed)
  abstract_boxed, param_shardings = param_shardings_for(objective, model, config, mesh, init_batch,
                                                        abstract_boxed, rules)
  abstract_params = nn.meta.unbox(abstract_boxed)
  abstract_opt = jax.eval_shape(optimizer.init, partition.trainable(abstract_params))
  repl = sharding.replicated(mesh)
  opt_shardings = optim.state_shardings(config, optimizer, abstract_opt,
                                        partition.trainable(param_shardings), repl)
  # model.fp8: the scale state, created by the same init (fp8.KeepingScales) and replicated.
  with_scales = bool(config.model.get("fp8", False))
  abstract_scales = (jax.eval_shape(lambda r: _init_params_and_scales(
      objective, model, r, init_batch)[1], jax.random.key(0)) if with_scales else None)
  state_cls, scale_field = ((Fp8TrainState, lambda scales: {"fp8": scales}) if with_scales
                            else (TrainState, lambda scales: {}))
  state_shardings = state_cls(step=repl, params=param_shardings, opt_state=opt_shardings, rng=repl,
                              **scale_field(jax.tree.map(lambda _: repl, abstract_scales)))
  abstract_state = state_cls(
      step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params, opt_state=abstract_opt,
      rng=jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))),
      **scale_field(abstract_scales))

  def init(rng):
    if with_scales:
      params, scales = _init_params_and_scales(objective, model, jax.random.fold_in(rng, 1),
                                               init_batch)
    else:
      params = objective.init_params(model, jax.random.fold_in(rng, 1), init_batch)
      scales = None
    params = nn.meta.unbox(params)
    return state_cls(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=optimizer.init(partition.trainable(params)),
                     rng=jax.random.key_data(jax.random.fold_in(rng, 2)), **scale_field(scales))

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    state = jax.jit(init, out_shardings=state_shardings)(rng)
  return state, state_shardings, abstract_state


def _init_params_and_scales(objective, model, rng, init_batch):
  """(boxed params, FP8 scale state) from one `objective.init_params`: the model it is handed
  keeps the scale state its init creates (fp8.KeepingScales)."""
  keeping = fp8.KeepingScales(model)
  params = objective.init_params(keeping, rng, init_batch)
  return params, nn.meta.unbox(keeping.scales)


def _abstract_with_shardings(abstract, shardings):
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract,
                      shardings)


@dataclasses.dataclass
class Setup:
  """How a run trains, built the same way by the trainer and the benchmark."""
  mesh: Any
  rules: Any
  state_shardings: TrainState
  abstract_state: TrainState
  train_step: Callable     # jitted (state, sharded batch) -> (state, metrics); donates the state
  eval_step: Callable      # jitted (params, sharded batch) -> metric sums
  predict_step: Callable   # jitted (params, sharded batch) -> per-row outputs (fine-tuning tasks)
  num_params: int
  partition: freezing.Partition | None = None  # a frozen encoder's trainable/frozen split


def setup(config, objective, model_cfg: ModelConfig, mesh, schedule: Schedule | None = None,
          grad_accum_steps: int | None = None, rules=None) -> tuple[Setup, TrainState]:
  """The jitted steps of `objective` under `config` (model, optimizer, shardings) and its freshly
  initialized, sharded train state. A run's plan (bertjax/trainer/run_plan.py) gives `schedule` (the
  learning rate runs to its total_steps, else to config.total_steps), `grad_accum_steps`
  (already checked; else checked here) and `rules` (else the config's)."""
  accum = grad_accum_steps or run_plan.accumulation_steps(config, mesh)
  rules = sharding.rules_from_config(config) if rules is None else rules
  model = objective.make_model(config, model_cfg)
  init_batch = objective.init_batch(config, 1, config.max_seq_length, config.max_predictions_per_seq)
  # The optimizer sees the parameter tree (shapes only) for per-layer learning-rate scales.
  abstract_boxed = abstract_params_of(objective, model, init_batch)
  partition = freezing.Partition.of(nn.meta.unbox(abstract_boxed),
                                    freezing.FreezeSpec.from_config(config),
                                    model_cfg.num_hidden_layers)
  optimizer = optim.make_optimizer(config, params=partition.trainable(nn.meta.unbox(abstract_boxed)),
                                   num_layers=model_cfg.num_hidden_layers,
                                   scalar_clipping=kernels.for_model(model_cfg).scalar_clipping,
                                   total_steps=schedule.total_steps if schedule else None)
  state, state_shardings, abstract_state = create_train_state(
      objective, model, optimizer, config, mesh, init_batch, abstract_boxed, partition, rules)
  batch_shard = sharding.batch_sharding(mesh)
  metric_shard = sharding.replicated(mesh)
  skip = config.get("nonfinite_policy", "stop") == "skip"  # checked: config_checks
  micro_rows = config.batch_size // accum if config.get("batch_warmup_tokens", 0) else None
  train_step = jax.jit(make_train_step(objective, model, optimizer, accum, skip, partition,
                                       micro_rows),
                       in_shardings=(state_shardings, batch_shard),
                       out_shardings=(state_shardings, metric_shard), donate_argnums=(0,))
  # With model.fp8 evaluation and prediction read the parameters alone, so they compute in the
  # model's dtype without FP8, as every reader of the workdir will (bertjax/models/fp8.py).
  eval_step = jax.jit(make_eval_step(objective, model),
                      in_shardings=(state_shardings.params, batch_shard), out_shardings=metric_shard)
  # Compiled only when an evaluation calls it (a task decoding its dev set).
  predict_step = jax.jit(make_predict_step(objective, model),
                         in_shardings=(state_shardings.params, batch_shard))
  run = Setup(mesh=mesh, rules=rules, state_shardings=state_shardings,
              abstract_state=abstract_state, train_step=train_step, eval_step=eval_step,
              predict_step=predict_step,
              num_params=sum(x.size for x in jax.tree.leaves(state.params)), partition=partition)
  return run, state


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
                       plan.grad_accum_steps, plan.rules)
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
          _abstract_with_shardings(s.abstract_state, s.state_shardings),
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
