"""How a run trains, built one way: its model, optimizer, abstract train state (shapes, dtypes and
shardings, nothing allocated), batch specs and jitted train, eval and predict steps, from the config
and a mesh. The trainer (`train.setup`, which then initializes the state), the benchmark and the
compile tool (bertjax/tools/compile.py: the same step compiled for a TPU pod or a GPU on a CPU, as
MaxText's train_compile.py reuses its trainer's `get_abstract_state`) build it here and nowhere
else, so what they compile is the same program.

`abstract_run(config, devices)` is the whole of it for a run that is only compiled: the run's plan
(every check the trainer makes, bertjax/trainer/run_plan.py) on those devices, then `build`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax import inputs
from bertjax.models import fp8, kernels
from bertjax.models.config import ModelConfig
from bertjax.objective import Schedule
from bertjax.runtime import divergence, freezing, optim, sharding
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


def param_shardings_for(objective, model, mesh, init_batch, abstract_boxed=None, *, rules):
  """(abstract boxed params, NamedSharding per param) without allocating anything (`rules`: the
  run's logical rules, from its plan)."""
  if abstract_boxed is None:
    abstract_boxed = abstract_params_of(objective, model, init_batch)
  shardings = run_plan.param_shardings(abstract_boxed, mesh, rules)
  return abstract_boxed, shardings



def abstract_train_state(objective, model, optimizer, config, mesh, init_batch, abstract_boxed,
                         partition: freezing.Partition, rules):
  """(state shardings, abstract state: ShapeDtypeStructs carrying those shardings, the jitted
  init `rng -> state` that creates it already sharded). Nothing is allocated; the model's init is
  traced for the shapes (given `abstract_boxed`, not at all) and again by the init when it runs.
  The optimizer state covers `partition`'s trainable parameters only."""
  abstract_boxed, param_shardings = param_shardings_for(objective, model, mesh, init_batch,
                                                        abstract_boxed, rules=rules)
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

  return (state_shardings, with_shardings(abstract_state, state_shardings),
          jax.jit(init, out_shardings=state_shardings))


def create_train_state(objective, model, optimizer, config, mesh, init_batch, abstract_boxed=None,
                       partition: freezing.Partition | None = None, *, rules):
  """Parameters and optimizer state created already sharded (`abstract_train_state`'s init run
  once under the mesh): (state, state shardings, abstract state). `rules`: the run's logical
  rules, from its plan."""
  partition = partition or freezing.Partition(frozenset(), frozen_any=False)
  state_shardings, abstract_state, init = abstract_train_state(
      objective, model, optimizer, config, mesh, init_batch, abstract_boxed, partition, rules)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    state = init(jax.random.key(config.seed))
  return state, state_shardings, abstract_state


def _init_params_and_scales(objective, model, rng, init_batch):
  """(boxed params, FP8 scale state) from one `objective.init_params`: the model it is handed
  keeps the scale state its init creates (fp8.KeepingScales)."""
  keeping = fp8.KeepingScales(model)
  params = objective.init_params(keeping, rng, init_batch)
  return params, nn.meta.unbox(keeping.scales)


def with_shardings(abstract, shardings):
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract,
                      shardings)


@dataclasses.dataclass
class Setup:
  """How a run trains, built the same way by the trainer, the benchmark and the compile tool."""
  mesh: Any
  rules: Any
  state_shardings: TrainState
  abstract_state: TrainState  # ShapeDtypeStructs with their shardings: nothing allocated
  train_step: Callable     # jitted (state, sharded batch) -> (state, metrics); donates the state
  eval_step: Callable      # jitted (params, sharded batch) -> metric sums
  predict_step: Callable   # jitted (params, sharded batch) -> per-row outputs (fine-tuning tasks)
  init: Callable           # jitted rng -> the sharded train state (run under the mesh)
  num_params: int
  partition: freezing.Partition | None = None  # a frozen encoder's trainable/frozen split

  def lower_train_step(self, batch):
    """The train step lowered for the abstract state and `batch` (specs or arrays), under the
    run's mesh and rules: `.compile()` it for the mesh's devices."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      return self.train_step.lower(self.abstract_state, batch)

  def lower_eval_step(self, batch):
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      return self.eval_step.lower(self.abstract_state.params, batch)


def build(config, objective, model_cfg: ModelConfig, mesh, schedule: Schedule | None,
          grad_accum_steps: int, rules) -> Setup:
  """The model, optimizer, abstract state and jitted steps of `objective` under `config` on
  `mesh`, from a run's plan (bertjax/trainer/run_plan.py): `schedule` (the learning rate runs to
  its total_steps; None: config.total_steps), `grad_accum_steps` and `rules`, as checked there."""
  accum = grad_accum_steps
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
  state_shardings, abstract_state, init = abstract_train_state(
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
  return Setup(mesh=mesh, rules=rules, state_shardings=state_shardings,
               abstract_state=abstract_state, train_step=train_step, eval_step=eval_step,
               predict_step=predict_step, init=init,
               num_params=sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract_state.params)),
               partition=partition)


def batch_specs(config, objective, mesh, rows: int | None = None) -> dict[str, jax.ShapeDtypeStruct]:
  """The global train batch (`rows`: config.batch_size) as specs sharded over the mesh's batch
  axes: a fine-tuning task's features (its init batch holds them all), or the synthetic
  pretraining batch (every field a pretraining objective reads), with packed rows' segment ids
  where the recipe packs."""
  rows = config.batch_size if rows is None else rows
  if isinstance(objective, task_base.TaskObjective):
    shapes = jax.eval_shape(lambda: objective.init_batch(
        config, rows, config.max_seq_length, config.max_predictions_per_seq))
  else:
    shapes = next(inputs.SyntheticBatches(config, config.model.vocab_size, 0, rows))
    if config.data.get("pack"):
      shapes["segment_ids"] = jax.ShapeDtypeStruct(shapes["input_ids"].shape, np.int32)
  shard = sharding.batch_sharding(mesh)
  return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shard) for k, v in shapes.items()}


def abstract_run(config, devices: Sequence[Any]) -> tuple[run_plan.RunPlan, Setup,
                                                          dict[str, jax.ShapeDtypeStruct]]:
  """A run of `config` on `devices` (real or compile-only: jax.experimental.topologies) that is
  only compiled: its plan (every check a run makes before its inputs, one line each), its setup
  and its train batch's specs. The schedule is the config's (a task's, from rows it has not read,
  is taken as one step: the learning rate's shape does not change the program)."""
  plan = run_plan.plan(config, None, devices)
  schedule = Schedule(total_steps=max(int(config.total_steps), 1),
                      eval_every=int(config.get("eval_every", 0)))
  s = build(config, plan.objective, plan.model_cfg, plan.mesh, schedule, plan.grad_accum_steps,
            plan.rules)
  return plan, s, batch_specs(config, plan.objective, plan.mesh)

