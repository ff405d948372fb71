"""A recipe's train step compiled for the chips it claims, on this machine, without them.

  python -m bertjax.tools.compile --config configs/bert.py:size=base --target v5e-16
  python -m bertjax.tools.compile --config configs/modernbert.py --target h100-8 --mesh 8,1,1

builds the run exactly as the trainer does (bertjax/trainer/steps.py: every check a run makes,
the same abstract state, shardings and jitted step, the target's kernel set: splash through
Mosaic on TPU, the Pallas Triton kernels on GPU) over a mesh of the target's compile-only devices
(bertjax/tools/targets.py: TPU slices such as v5e-16, v4-32, v3-2048; h100, h200, b200 as one
GPU, NAME-8 or NAME-8x4; cpu-N), compiles it with the target's own compiler (XLA:TPU and Mosaic
from libtpu; XLA:GPU and Triton from the CUDA plugin) and prints, per device: the memory the
step needs against the chip's ("fits" or "does not fit by X GiB"), its FLOPs, its kernels by kind
and the compile time.

What this proves: XLA and its kernel compilers accept the program for that topology and mesh,
and how much memory it needs there. What it does not: speed, and numerics on the chip.
`--mesh data,fsdp,tensor` sets the mesh (default: the config's mesh_shape); `--config.key=value`
sets any setting, as for launch.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
from typing import Sequence

import jax
from absl import flags
from ml_collections import config_flags

from bertjax.core.errors import fail, run_cli
from bertjax.models import kernels
from bertjax.runtime import step_memory
from bertjax.tools import hlo_stats, targets
from bertjax.trainer import steps

PROG = "python -m bertjax.tools.compile"


@dataclasses.dataclass
class Report:
  """A compiled step and what it says, per device."""
  target: targets.Target
  mesh_shape: tuple[int, ...]
  compiled: object
  seconds: float                            # lowering and compiling
  footprint: step_memory.Footprint | None
  memory_bytes: int | None                  # one device of the target holds
  flops: int                                # matrix products, from the optimized HLO
  xla_flops: float | None                   # XLA's cost_analysis, where it gives one
  kernels: dict[str, int]

  @property
  def fits(self) -> bool | None:
    if self.footprint is None or self.memory_bytes is None:
      return None
    return self.footprint.peak <= self.memory_bytes


def mesh_devices(target: targets.Target, mesh: Sequence[int] | None) -> None:
  """Refuses, in one line, a --mesh whose sizes do not multiply to the target's devices."""
  n = len(target.devices)
  if mesh is not None and math.prod(mesh) != n:
    fail(f"--mesh={','.join(map(str, mesh))} uses {math.prod(mesh)} devices but {target.name} "
         f"has {n}; fix: data,fsdp,tensor sizes whose product is {n}, e.g. --mesh={n},1,1")


def compile_step(config, target: targets.Target, mesh: Sequence[int] | None = None) -> Report:
  """`config`'s train step compiled for `target` (module docstring); `mesh` (data, fsdp,
  tensor) replaces the config's mesh_shape. Refused in one line where the run's checks refuse it,
  the mesh does not fit the devices, or the compiler refuses the program (memory)."""
  mesh_devices(target, mesh)
  if mesh is not None:
    with config.unlocked():
      config.mesh_shape = tuple(mesh)
  # A pretraining recipe's data is not read: its batch is the synthetic one of the same shapes.
  if "data" in config:
    with config.unlocked():
      config.data.synthetic = True
  platform = None if target.platform == "cpu" else target.platform
  start = time.perf_counter()
  with (kernels.lowering_for(platform) if platform else contextlib.nullcontext(),
        targets.quiet_stderr()):
    _, s, batch = steps.abstract_run(config, target.devices)
    try:
      compiled = s.lower_train_step(batch).compile()
    except jax.errors.JaxRuntimeError as e:
      refuse(target, e)
  seconds = time.perf_counter() - start
  text = compiled.as_text()
  cost = compiled.cost_analysis()
  limit = target.memory_bytes
  if limit is None:
    found = step_memory.device_limit(target.devices[0])
    limit = found[0] if found else None
  return Report(target=target, mesh_shape=tuple(s.mesh.shape.values()), compiled=compiled,
                seconds=seconds, footprint=step_memory.footprint(compiled), memory_bytes=limit,
                flops=hlo_stats.flops(text),
                xla_flops=cost.get("flops") if isinstance(cost, dict) else None,
                kernels=hlo_stats.kernels(text))


def refuse(target: targets.Target, error: Exception):
  """The compiler's refusal as one line: out of memory (XLA:TPU refuses a program larger than
  HBM) with its figures and the fix, else its first line."""
  lines = [l.strip() for l in str(error).splitlines() if l.strip()]
  memory = [l for l in lines if "exceeds" in l or "Ran out of memory" in l]
  if "RESOURCE_EXHAUSTED" in str(error) and memory:
    fail(f"the train step does not fit {target.name}'s memory: {memory[-1].rstrip('.')}; fix: "
         f"{step_memory.FIX}")
  fail(f"{target.name}'s compiler refused the train step: {lines[0] if lines else error}")


def gib(n: int) -> str:
  return f"{n / 2**30:8.2f} GiB" if n >= 2**30 else f"{n / 2**20:8.1f} MiB"


def lines(report: Report) -> list[str]:
  """What the tool prints (module docstring)."""
  out = [f"{targets.describe(report.target)}; mesh data,fsdp,tensor = {report.mesh_shape}"]
  f = report.footprint
  if f is None:
    out.append("memory: XLA gives no memory analysis on this target")
  else:
    out += ["memory per device (XLA's compiled memory analysis):",
            f"  arguments    {gib(f.arguments)}  (train state and batch)",
            f"  outputs      {gib(f.outputs)}  ({gib(f.aliased).strip()} of them written in "
            "place of the donated state)",
            f"  temporaries  {gib(f.temporaries)}",
            f"  code         {gib(f.code)}",
            f"  peak         {gib(f.peak)}  estimated: arguments + outputs - aliased + "
            "temporaries + code"]
    if report.memory_bytes is not None:
      out.append(f"  device       {gib(report.memory_bytes)}  "
                 f"{step_memory.verdict(f.peak, report.memory_bytes)}")
  xla = (f"; XLA's cost_analysis: {report.xla_flops:.3g} (a loop's body once)"
         if report.xla_flops else "; XLA's cost_analysis: none on this target")
  out.append(f"FLOPs per device per step: {report.flops:.3g} (matrix products in the optimized "
             f"HLO, loops times their trip count){xla}")
  out.append("kernels (as they stand in the module, a loop's body once):")
  out += [f"  {count:6d}  {kind}" for kind, count in report.kernels.items()]
  out.append(f"compile time: {report.seconds:.1f} s (lowering and compiling, on this machine)")
  return out


def main(argv: Sequence[str] | None = None):
  def target_flag(fv: flags.FlagValues) -> None:
    flags.DEFINE_string("target", None, f"what to compile for: {targets.known()}",
                        flag_values=fv)

  fv, config, mesh = targets.step_command(
      sys.argv[1:] if argv is None else argv, prog=PROG, doc=__doc__, mesh_default=None,
      mesh_help="data,fsdp,tensor sizes of the mesh over the target's devices (default: the "
      "config's mesh_shape)", more=target_flag, required=["config", "target"])
  # Only the compiler of the target is wanted, never a device of this machine: JAX starts on the
  # CPU (with cpu-N's devices) unless JAX_PLATFORMS says otherwise.
  if not os.environ.get("JAX_PLATFORMS"):
    jax.config.update("jax_platforms", "cpu")
  n = targets.cpu_count(fv.target)
  if n:
    with contextlib.suppress(RuntimeError):  # JAX already started: targets.resolve says so
      jax.config.update("jax_num_cpu_devices", max(n, jax.config.jax_num_cpu_devices))
  target = targets.resolve(fv.target)
  report = compile_step(config, target, mesh)
  name = config_flags.get_config_filename(fv["config"])
  print(f"{name}: the train step compiles for {target.name}")
  print("\n".join(lines(report)), flush=True)
  if report.fits is False:  # XLA:GPU and XLA:CPU compile a program larger than the device
    fail(f"the train step needs about {step_memory.size(report.footprint.peak)} per device "
         f"(XLA's compiled estimate) but a {target.name} device holds "
         f"{step_memory.size(report.memory_bytes)}: it "
         f"{step_memory.verdict(report.footprint.peak, report.memory_bytes)}; fix: "
         f"{step_memory.FIX}")


if __name__ == "__main__":
  run_cli(main)
