"""The train step's memory, known before the first step runs: XLA's compiled memory analysis of
the step against what a device holds. A batch that cannot fit is refused in one line naming the
estimate, the limit and the fix, instead of running out of memory (or, on a CPU, swapping) after
minutes of compilation; a step that fits says how much it needs, once.

The estimate is per device (under SPMD each device runs its shard of the step): the arguments
(state and batch), the outputs not written in place of a donated argument, XLA's temporaries and
the compiled code. The limit is the device allocator's `bytes_limit` (GPU, TPU); on a CPU, the
host's available memory plus what this process already holds, shared by its CPU devices.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from bertjax.core.errors import fail
from bertjax.runtime import host_memory

FIX = ("a smaller --config.batch_size, a larger --config.grad_accum_steps (the same batch in "
       "smaller micro-batches) or --config.model.remat=True (recompute activations)")


@dataclasses.dataclass(frozen=True)
class Footprint:
  """One device's bytes of a compiled step, as XLA's memory analysis gives them."""
  arguments: int    # the state and the batch
  outputs: int
  aliased: int      # outputs written in place of a donated argument (the state)
  temporaries: int  # XLA's temporary buffers (activations, gradients, workspace)
  code: int         # the compiled code

  @property
  def peak(self) -> int:
    """Arguments + outputs - aliased + temporaries + code: everything live at once, as if every
    temporary were live at the step's worst moment (XLA's temporaries are already its buffer
    assignment's peak, so this is an upper estimate)."""
    return self.arguments + self.outputs - self.aliased + self.temporaries + self.code


def footprint(compiled: Any) -> Footprint | None:
  """The compiled step's `Footprint`; None where XLA gives no analysis."""
  try:
    stats = compiled.memory_analysis()
  except (NotImplementedError, jax.errors.JaxRuntimeError):
    return None
  if stats is None:
    return None
  return Footprint(arguments=int(stats.argument_size_in_bytes),
                   outputs=int(stats.output_size_in_bytes), aliased=int(stats.alias_size_in_bytes),
                   temporaries=int(stats.temp_size_in_bytes),
                   code=int(stats.generated_code_size_in_bytes))


def step_bytes(compiled: Any) -> int | None:
  """Peak bytes one device holds while the compiled step runs; None where XLA gives no analysis."""
  found = footprint(compiled)
  return None if found is None else found.peak


def verdict(need: int, limit: int) -> str:
  """"fits (X spare)" or "does not fit by X": `need` bytes against a device's `limit`."""
  if need <= limit:
    return f"fits ({size(limit - need)} spare)"
  return f"does not fit by {size(need - limit)}"


def device_limit(device) -> tuple[int, str] | None:
  """(bytes, what they are) one device's step may use; None where neither is known."""
  try:
    stats = device.memory_stats()
  except (NotImplementedError, jax.errors.JaxRuntimeError):
    stats = None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"]), f"the {device.device_kind} memory limit"
  if device.platform == "cpu":
    available = host_memory.host_available_bytes()
    shared = len(jax.local_devices(backend="cpu"))
    if available:
      what = "the host's available memory" + (f" / {shared} CPU devices" if shared > 1 else "")
      return available // shared, what
  return None


def size(n: int) -> str:
  """Bytes as GiB, or MiB below one GiB."""
  return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_fits(compiled: Any, device, what: str = "the train step") -> str:
  """Refuses (`errors.fail`, one line) a compiled step that needs more than `device` holds;
  returns the line that says the estimate otherwise."""
  need, limit = step_bytes(compiled), device_limit(device)
  if need is None:
    return f"{what}: no memory estimate on {device.platform} (XLA gives no memory analysis)"
  if limit is None:
    return f"{what} needs about {size(need)} per device (XLA's estimate; the limit is unknown)"
  total, where = limit
  if need > total:
    fail(f"{what} needs about {size(need)} per device (XLA's compiled estimate) but {where} is "
         f"{size(total)}; fix: {FIX}")
  return (f"{what} needs about {size(need)} per device of {size(total)} ({where}; XLA's compiled "
          "estimate)")
