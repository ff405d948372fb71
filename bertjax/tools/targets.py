"""The chips `python -m bertjax.tools.compile --target T` compiles for, as compile-only devices on
this machine: no TPU or GPU is needed, only its compiler (libtpu; the CUDA plugin).

  cpu-N                   N host CPU devices
  v2-N v3-N v4-N v5p-N    a TPU slice of N TensorCores (the names Cloud TPU uses: v4-32 is 16
                          chips; the LAMB paper's 1,024 v3 chips are v3-2048)
  v5e-N v6e-N             a TPU slice of N chips (v5litepod-N, v6e-N)
  h100 h200 b200          one GPU; NAME-8 one host of 8; NAME-8x4 four hosts of 8

A TPU slice becomes a libtpu topology (`jax.experimental.topologies.get_topology_desc("v5e:4x4",
"tpu")`) whose devices are those the real slice shows: one per TensorCore on v2 and v3, one per
chip on v4 and v5p (megacore: two TensorCores each) and on v5e and v6e (one TensorCore each). A
GPU is XLA:GPU's compile-only device described by a GpuTargetConfigProto written from the chip's
published specifications (bertjax/tools/gpu_specs/NAME.txtpb).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os
import pathlib
import re
import tempfile
from typing import Callable, Sequence
import jax
from absl import flags
from jax.experimental import topologies

from bertjax.config import config_lib
from bertjax.core import command_line
from bertjax.core.errors import fail

GPU_SPECS = pathlib.Path(__file__).resolve().parent / "gpu_specs"


@dataclasses.dataclass(frozen=True)
class Generation:
  """A TPU generation: how its slice names count, its topology's rank, HBM per device."""
  name: str               # libtpu's: "v5e" in "v5e:4x4"
  counts_cores: bool      # the slice name counts TensorCores (two per chip), else chips
  devices_per_chip: int   # devices the real slice shows per chip
  rank: int               # 2-D or 3-D torus
  hbm_gib: int            # per device, published
  max_chips: int          # a full pod
  options: tuple = ()     # get_topology_desc's keyword arguments


TPUS = {g.name: g for g in (
    Generation("v2", True, 2, 2, 8, 256),
    Generation("v3", True, 2, 2, 16, 1024),
    # A v4 VM shows one device per chip (megacore); libtpu's default v4 topology one per core.
    Generation("v4", True, 1, 3, 32, 4096, (("chip_config_name", "megacore"),)),
    Generation("v5p", True, 1, 3, 95, 8960),
    Generation("v5e", False, 1, 2, 16, 256),
    Generation("v6e", False, 1, 2, 32, 256),
)}
ALIASES = {"v5litepod": "v5e"}
GPU_EXTRA = ("jax-cuda13-plugin and jax-cuda13-pjrt at jax's version (pip install "
             f"jax-cuda13-plugin=={jax.__version__} jax-cuda13-pjrt=={jax.__version__})")
TPU_EXTRA = f'libtpu (pip install "jax[tpu]=={jax.__version__}")'


def installed(module: str) -> bool:
  """Whether `module` (dotted: its parents too) can be imported, without importing it."""
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # a parent package is missing
    return False


def gpu_names() -> list[str]:
  return sorted(p.stem for p in GPU_SPECS.glob("*.txtpb"))


def known() -> str:
  return ("cpu-N; TPU slices " + ", ".join(f"{g}-N" for g in TPUS) + " (e.g. v5e-16, v4-32, "
          "v3-2048); GPUs " + ", ".join(gpu_names()) + " (NAME, NAME-8, NAME-8x4)")


@dataclasses.dataclass(frozen=True)
class Target:
  """Compile-only devices and what a device of the real target holds."""
  name: str
  platform: str          # "cpu", "tpu" or "cuda"
  chip: str              # e.g. "TPU v5 lite", "NVIDIA H100 80GB HBM3"
  topology: str          # libtpu's topology, the GPU layout, or the CPU count
  devices: tuple
  memory_bytes: int | None   # per device, None on the CPU (the host's)


def torus(chips: int, rank: int) -> tuple[int, ...]:
  """The usual shape of a slice of `chips` (a power of two): 2-D 2x2, 2x4, 4x4, ... 16x16;
  3-D 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, ... (each doubling grows the shortest side, the last
  such)."""
  if rank == 2:
    side = 2 ** (int(math.log2(chips)) // 2)
    return (side, chips // side)
  if chips < 4:
    return (chips, 1, 1)
  dims = [2, 2, 1]
  while math.prod(dims) < chips:
    shortest = min(dims)
    i = max(j for j, d in enumerate(dims) if d == shortest)
    dims[i] *= 2
  return tuple(dims)


def tpu_slice(name: str) -> tuple[Generation, str, int]:
  """(generation, libtpu topology, devices the real slice shows) of a slice name, e.g. v4-32 ->
  v4, "v4:2x2x4", 16; refused in one line where it names no slice."""
  m = re.fullmatch(r"(v\d+[a-z]*)-(\d+)", name)
  gen = TPUS.get(ALIASES.get(m.group(1), m.group(1))) if m else None
  if gen is None:
    fail(f"unknown target {name!r}; known: {known()}")
  n = int(m.group(2))
  chips = n // 2 if gen.counts_cores else n
  counted = "TensorCores (two per chip)" if gen.counts_cores else "chips"
  if chips < 1 or chips & (chips - 1) or chips > gen.max_chips or (gen.counts_cores and n % 2):
    fail(f"{name}: a {gen.name} slice counts {counted}, a power of two up to "
         f"{gen.max_chips * (2 if gen.counts_cores else 1)} (a full pod); e.g. "
         f"{gen.name}-{8 if gen.counts_cores else 16}")
  topology = f"{gen.name}:{'x'.join(map(str, torus(chips, gen.rank)))}"
  return gen, topology, chips * gen.devices_per_chip


def topology_options(gen: Generation, topology: str) -> dict:
  """get_topology_desc's keyword arguments: the generation's, and for a slice smaller than
  libtpu's default host (2x2x1), its own chips as the host (v5e-1: one chip)."""
  dims = tuple(int(d) for d in topology.split(":")[1].split("x"))
  small = math.prod(dims) < 4
  return {**dict(gen.options), **({"chips_per_host_bounds": (dims + (1, 1))[:3]} if small else {})}


# What libtpu prints on a machine without a TPU (it looks for the VM's metadata): not the user's
# concern when compiling for a topology, so kept off the terminal.
LIBTPU_NOISE = re.compile(r"TPU_ACCELERATOR_TYPE|TPU_WORKER_HOSTNAMES|InitGoogle|"
                          r"Source Location Trace|libtpu_init_utils|host bounds|^\s*$")


@contextlib.contextmanager
def quiet_stderr(noise: re.Pattern = LIBTPU_NOISE):
  """Runs the block with file descriptor 2 captured (libtpu writes to it from C++), then writes
  back every captured line that is not `noise`."""
  with tempfile.TemporaryFile(mode="w+b") as captured:
    saved = os.dup(2)
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      for line in captured.read().decode(errors="replace").splitlines(keepends=True):
        if not noise.search(line):
          os.write(2, line.encode())


def _tpu(name: str) -> Target:
  gen, topology, expected = tpu_slice(name)
  if not installed("libtpu"):
    fail(f"target {name} needs the TPU compiler, which is not installed; fix: install {TPU_EXTRA}")
  # libtpu's lock file keeps a second process off a TPU; compile-only devices hold none, so the
  # processes of a test run (pytest-xdist) or two compiles may load it together.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  with quiet_stderr():
    desc = topologies.get_topology_desc(topology, "tpu", **topology_options(gen, topology))
  devices = tuple(desc.devices)
  assert len(devices) == expected, (topology, len(devices), expected)  # TPUS's counts
  return Target(name, "tpu", devices[0].device_kind, topology, devices, gen.hbm_gib * 2**30)


def _gpu(name: str) -> Target:
  m = re.fullmatch(r"([a-z]\d+)(?:-(\d+)(?:x(\d+))?)?", name)
  if not m or m.group(1) not in gpu_names():
    fail(f"unknown target {name!r}; known: {known()}")
  per_host, hosts = int(m.group(2) or 1), int(m.group(3) or 1)
  if not installed("jax_plugins.xla_cuda13"):
    fail(f"target {name} needs XLA's GPU compiler, which is not installed; fix: install "
         f"{GPU_EXTRA}")
  spec = (GPU_SPECS / f"{m.group(1)}.txtpb").read_text()
  layout = f"1x{hosts}x{per_host}"
  desc = topologies.get_topology_desc(topology_name=name, platform="cuda", topology=layout,
                                      target_config=spec)
  memory = int(re.search(r"device_memory_size:\s*(\d+)", spec).group(1))
  devices = tuple(desc.devices)
  return Target(name, "cuda", devices[0].device_kind, f"{hosts} host(s) x {per_host}", devices,
                memory)


def _cpu(name: str) -> Target:
  n = int(name[len("cpu-"):]) if re.fullmatch(r"cpu-[1-9]\d*", name) else 0
  if not n:
    fail(f"unknown target {name!r}; known: {known()}")
  devices = jax.devices("cpu")
  if len(devices) < n:
    fail(f"target {name} needs {n} CPU devices but JAX started with {len(devices)}; fix: run the "
         f"tool in a fresh process (python -m bertjax.tools.compile), which starts them")
  return Target(name, "cpu", devices[0].device_kind, str(n), tuple(devices[:n]), None)


def resolve(name: str) -> Target:
  """The target named `name` (module docstring), refused in one line where it is unknown or its
  compiler is not installed."""
  if name.startswith("cpu"):
    return _cpu(name)
  if re.match(r"v\d", name):
    return _tpu(name)
  return _gpu(name)


def cpu_count(name: str) -> int | None:
  """N of a `cpu-N` target (the devices to start before JAX's backend is), else None."""
  m = re.fullmatch(r"cpu-([1-9]\d*)", name)
  return int(m.group(1)) if m else None


def describe(target: Target) -> str:
  if target.platform == "cpu":
    return f"{target.name}: {len(target.devices)} host CPU devices"
  return (f"{target.name}: {len(target.devices)} x {target.chip} ({target.topology}, "
          f"{target.memory_bytes / 2**30:.1f} GiB each; compile-only devices)")


def step_command(argv: Sequence[str], *, prog: str, doc: str | None, mesh_default: str | None,
                 mesh_help: str, more: Callable[[flags.FlagValues], None] = lambda fv: None,
                 required: Sequence[str] = ("config",)):
  """The command line of a tool that builds a recipe's step for a mesh (this module's compile
  tool, tpu_lowering): `--config FILE[:variant]` with `--config.key=value` overrides (typed as
  launch.py types them), `--mesh data,fsdp,tensor`, and `more`'s flags. Returns (the flags, the
  config with its overrides, the mesh's sizes or None); each mistake one line."""
  argv = list(argv)
  overrides = [a for a in argv if a.startswith("--config.")]
  argv = [a for a in argv if not a.startswith("--config.")]

  def define(fv: flags.FlagValues) -> None:
    command_line.define_config_file(fv, [prog, *argv], "configs/<exp>.py[:variant]; then "
                                    "--config.key=value sets one of its settings",
                                    config_lib.load_config_file)
    flags.DEFINE_string("mesh", mesh_default, mesh_help, flag_values=fv)
    more(fv)

  fv, _ = command_line.parse(argv, define, prog=prog, doc=doc, required=list(required))
  mesh = None
  if fv.mesh is not None:
    try:
      mesh = tuple(int(x) for x in fv.mesh.split(","))
    except ValueError:
      mesh = ()
    if len(mesh) != 3 or min(mesh) < 1:
      fail(f"--mesh={fv.mesh!r} takes three sizes data,fsdp,tensor, e.g. 4,2,2")
  config = fv.config
  config_lib.apply_overrides(config, overrides)
  return fv, config, mesh
