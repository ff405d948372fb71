"""The device mesh and the mapping of logical axis names onto it.

`config.mesh_shape` gives sizes for the mesh axes (data, fsdp, tensor); one entry may be -1 to
take the remaining devices. Weights and activations carry logical names; `config.logical_rules`
(a list of (logical name, mesh axis or axes or None)) maps them, so changing a layout is a config
edit, never a model edit.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from bertjax.core.errors import fail

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Data parallel over data+fsdp; FSDP shards weights' embed dimension; tensor parallelism splits
# attention heads, the MLP's hidden units and the vocabulary. The default of the config's
# `logical_rules` (bertjax/config/settings.py), so a run's config.json holds the rules it used.
DEFAULT_RULES = (
    ("act_batch", ("data", "fsdp")),
    ("act_len", None),
    ("act_embed", None),
    ("act_mlp", "tensor"),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("embed_in", None),
    ("embed_out", None),
    ("layers", None),   # the stacked layer axis of model.scan_layers
)


def resolve_mesh_shape(mesh_shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
  shape = list(mesh_shape)
  if len(shape) != len(MESH_AXES):
    fail(f"mesh_shape={tuple(mesh_shape)} needs {len(MESH_AXES)} sizes for axes {MESH_AXES}, "
         f"e.g. --config.mesh_shape='(-1, 1, 1)'")
  free = [i for i, s in enumerate(shape) if s == -1]
  if len(free) > 1 or any(s == 0 or s < -1 for s in shape):
    fail(f"mesh_shape={tuple(mesh_shape)} may hold one -1 and otherwise positive sizes")
  known = math.prod(s for s in shape if s != -1)
  if free:
    if num_devices % known:
      fail(f"mesh_shape={tuple(mesh_shape)} cannot fill {num_devices} devices; "
           f"make the fixed sizes divide {num_devices}")
    shape[free[0]] = num_devices // known
  if math.prod(shape) != num_devices:
    fail(f"mesh_shape={tuple(mesh_shape)} uses {math.prod(shape)} devices but {num_devices} are "
         f"present; set --config.mesh_shape so its sizes multiply to {num_devices} (or use -1)")
  return tuple(shape)


def make_mesh(mesh_shape: Sequence[int], devices: Sequence[Any] | None = None) -> Mesh:
  devices = list(jax.devices() if devices is None else devices)
  shape = resolve_mesh_shape(mesh_shape, len(devices))
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES,
              axis_types=(AxisType.Auto,) * len(MESH_AXES))


def rules_from_config(config) -> tuple[tuple[str, Any], ...]:
  """The config's logical_rules as tuples; () (the default's spelling in older configs and
  workdirs) means DEFAULT_RULES."""
  rules = config.get("logical_rules") or DEFAULT_RULES
  return tuple((name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in rules)


def logical_shardings(abstract_boxed: Any, mesh: Mesh, rules) -> Any:
  """NamedShardings for a tree whose leaves are (possibly) `nn.LogicallyPartitioned` boxes."""
  specs = nn.get_partition_spec(abstract_boxed)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def data_parallel_size(mesh: Mesh) -> int:
  return math.prod(mesh.shape[a] for a in BATCH_AXES)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Assembles the global batch from this process's rows (each host passes its own shard)."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in batch.items()}
