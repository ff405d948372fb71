"""Non-finite losses and gradients: found without a host sync per step, never checkpointed.

The train step flags each step whose loss or gradient norm is not finite (`step_is_finite`) and,
under `nonfinite_policy="skip"`, keeps the previous parameters and optimizer state for it
(`keep_if_finite`); the step counter still advances, so the data and dropout streams stay those
of an uninterrupted run. The host (`Watch`) folds the flags into one device scalar, the first
non-finite step, and reads it only where the loop already waits for the device: at logging steps
and before every checkpoint. Before a checkpoint the parameters themselves are checked too (an
update from finite gradients can still overflow), so a checkpoint on disk is always finite and
rotation can only ever drop an older finite one.

Policies:
  stop  (default) the run ends with exit status 3 and one line naming the first non-finite step
        and its likely cause; the last (finite) checkpoint stays, a rerun resumes from it.
  skip  non-finite steps leave the state unchanged and are counted (`nonfinite` in the logged
        metrics: the fraction of the window's steps skipped); a window where every step was
        skipped, or non-finite parameters, still stop the run.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from bertjax.core.errors import Diverged, fail

POLICIES = ("stop", "skip")
_NONE = jnp.iinfo(jnp.int32).max  # "no non-finite step seen"


def check_policy(policy: str) -> str:
  if policy not in POLICIES:
    fail(f"nonfinite_policy={policy!r} is not one of {', '.join(POLICIES)}; use 'stop' (end the "
         "run at the first non-finite loss) or 'skip' (leave those steps' updates out)")
  return policy


def step_is_finite(loss: jax.Array, grad_norm: jax.Array) -> jax.Array:
  return jnp.isfinite(loss) & jnp.isfinite(grad_norm)


def keep_if_finite(finite: jax.Array, new: Any, old: Any) -> Any:
  """`new` where the step was finite, else `old` (leaf by leaf, inside the jitted step)."""
  return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)


def without_nonfinite_step(finite: jax.Array, metrics: dict) -> dict:
  """A skipped step's metric sums count for nothing (numerators and denominators zeroed)."""
  return {k: jax.tree.map(lambda x: jnp.where(finite, x, jnp.zeros_like(x)), v)
          for k, v in metrics.items()}


@jax.jit
def _fold(first: jax.Array, window: jax.Array, nonfinite: jax.Array, step: jax.Array):
  """(first non-finite step, the window's non-finite count) after one more step: one dispatch."""
  return jnp.where((first == _NONE) & (nonfinite > 0), step, first), window + nonfinite


@jax.jit
def _all_finite(tree) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


class Watch:
  """The host's view of non-finite steps: `add` after each step (no sync), `check` where the
  loop reads metrics anyway, `check_checkpoint` before each save."""

  def __init__(self, policy: str, start_step: int, learning_rate: float, dtype: str):
    self.policy = policy  # checked with the settings (config_checks: one of POLICIES)
    self.start_step = start_step
    self.learning_rate = learning_rate
    self.dtype = dtype
    self.first = jnp.asarray(_NONE, jnp.int32)
    self.window_steps = 0
    self.window_nonfinite = jnp.zeros((), jnp.float32)

  def add(self, metrics: dict, step: jax.Array) -> None:
    """`step`: the device step counter after the update (the 1-based number of this step)."""
    self.window_steps += 1
    self.first, self.window_nonfinite = _fold(self.first, self.window_nonfinite,
                                              metrics["nonfinite"][0], step)

  def check(self) -> None:
    """Raises `Diverged` when a non-finite step must stop the run; resets the window."""
    first, nonfinite = jax.device_get((self.first, self.window_nonfinite))  # one read
    steps, first, nonfinite = self.window_steps, int(first), float(nonfinite)
    self.window_steps, self.window_nonfinite = 0, jnp.zeros((), jnp.float32)
    if self.policy == "stop":
      if first != _NONE:
        raise Diverged(self._message(first, "the loss or the gradients are not finite"))
    elif steps and nonfinite >= steps:
      raise Diverged(self._message(None, f"all {steps} steps of the last logging window had a "
                                         "non-finite loss or gradient (policy skip)"))

  def check_checkpoint(self, step: int, params) -> None:
    """Called before saving `params` at `step`: a non-finite state is never checkpointed."""
    self.check()
    if not bool(jax.device_get(_all_finite(params))):
      raise Diverged(self._message(step, "the parameters are not finite"))

  def _message(self, step: int | None, what: str) -> str:
    at = f" at step {step}" if step is not None else ""
    if step is not None and step <= self.start_step + 1:
      cause = ("from its first step on: check the inputs against the model (max_seq_length "
               "against model.max_position_embeddings, the vocabulary), the dtype "
               f"({self.dtype}) and --config.learning_rate ({self.learning_rate:g})")
    else:
      cause = (f"the learning rate ({self.learning_rate:g} at its peak) is likely too high"
               + (f" for {self.dtype}" if self.dtype != "float32" else "")
               + "; lower --config.learning_rate or raise --config.optimizer.warmup_steps (a "
               "resumed run changes them with --config.allow_changed_settings=True), or set "
               "--config.nonfinite_policy=skip")
    return (f"the run diverged{at}: {what}, and no non-finite state was checkpointed (running "
            f"again resumes from the last checkpoint); likely cause: {cause}")
