"""FP8 matrix products for the encoder's projections (`model.fp8`), with delayed scaling.

With `model.fp8` the query, key, value, attention-output, intermediate and output projections of
every layer (not the embeddings, not the heads) multiply through flax's
`Fp8DirectDotGeneralOp` (`bertjax.models.layers.Dense` with `fp8_amax_history`): inputs and kernels quantized to float8_e4m3fn, the output gradient to
float8_e5m2, each scaled by the largest magnitude seen over the last `model.fp8_amax_history`
steps (the recipe of NVIDIA's MLPerf BERT runs). Their parameters (`kernel`, `bias`) are those of
the ordinary dense layer: same names, shapes and logical axes, so checkpoints and every reader of
parameters are unaffected.

The scale state (per projection: three amax histories and three scales) is flax's
`_overwrite_with_gradient` collection, `SCALES`: its gradient *is* its next value. The trainer
keeps it in its train state (`bertjax.trainer.train.Fp8TrainState.fp8`), hands it to the model
through `WithScales` and takes the gradient as the new state, never through the optimizer.

A model applied without that collection (evaluation, prediction, `bertjax.load`, export, a
distillation teacher) multiplies in its compute dtype instead: the parameters are read as every
reader reads them, and nothing there changes the scale state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax.linen import fp8_ops

Array = jax.Array

SCALES = fp8_ops.OVERWRITE_WITH_GRADIENT  # the collection of amax histories and scales
OP = "fp8"  # the scale state's sub-tree under each projection (`layers.Dense`)


class WithScales:
  """`model` whose `apply` also reads the scale state `scales` (the `SCALES` collection); every
  other attribute is the model's. An objective's loss calls `model.apply({"params": ...}, ...)`;
  handed this instead, its FP8 projections read `scales`, and the gradient with respect to
  `scales` is their next value."""

  def __init__(self, model, scales):
    self._model, self._scales = model, scales

  def apply(self, variables, *args, **kwargs):
    return self._model.apply({**variables, SCALES: self._scales}, *args, **kwargs)

  def __getattr__(self, name):
    return getattr(self._model, name)


class KeepingScales:
  """`model` whose `init` keeps the `SCALES` collection it creates (`scales`, set when an
  objective's `init_params` calls it inside the same trace); every other attribute is the
  model's."""

  def __init__(self, model):
    self._model, self.scales = model, None

  def init(self, *args, **kwargs):
    variables = self._model.init(*args, **kwargs)
    self.scales = variables.get(SCALES, {})
    return variables

  def __getattr__(self, name):
    return getattr(self._model, name)


def combine(a, b):
  """Two micro-batches' next scale states as one: their elementwise maximum. Both start from the
  same state, so the histories differ only in the newest amax, and the maximum is the amax of the
  whole batch; the scales are equal."""
  return jax.tree.map(jnp.maximum, a, b)
