"""jax.distributed settings from the environment, for multi-host runs (launch.py)."""

from __future__ import annotations

import os
from typing import Any

from bertjax.core.errors import fail


def jax_distributed_kwargs(environ: dict[str, str] | None = None) -> dict[str, Any]:
  """jax.distributed.initialize() arguments from the variables `--hosts` sets (empty on Cloud
  TPU, where JAX discovers every setting itself). JAX reads JAX_COORDINATOR_ADDRESS on its own,
  but not the process count and id."""
  environ = os.environ if environ is None else environ
  kwargs: dict[str, Any] = {}
  if environ.get("JAX_COORDINATOR_ADDRESS"):
    kwargs["coordinator_address"] = environ["JAX_COORDINATOR_ADDRESS"]
  for var, key in (("JAX_NUM_PROCESSES", "num_processes"), ("JAX_PROCESS_ID", "process_id")):
    if environ.get(var):
      try:
        kwargs[key] = int(environ[var])
      except ValueError:
        fail(f"{var}={environ[var]!r} must be an integer")
  return kwargs
