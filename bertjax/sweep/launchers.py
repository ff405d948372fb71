"""The commands that run a sweep point: here, on every worker of a Cloud TPU VM, or over ssh on
several hosts; and the slice of this machine's devices each of several points at once gets."""

from __future__ import annotations

import glob
import os
import pathlib
import posixpath
import re
import shlex
import sys
from typing import Sequence

from bertjax.core.errors import fail
from bertjax.sweep.spec import (COORDINATOR_PORT, PACK_EXCLUDES, REMOTE_DIR, REPO, SOURCE_TARBALL,
                                Point, Sweep)


def local_command(sweep: Sweep, point: Point, workdir: pathlib.Path, processes: int = 0,
                  devices_per_process: int = 0) -> list[str]:
  """The point's launch.py command here; with `processes`, run on that many local processes
  joined by JAX's distributed runtime (bertjax.tools.multihost: CPU devices, gloo collectives,
  `devices_per_process` each when given), as a pod's hosts would run it."""
  run = [sweep.command, "--config", sweep.config, "--workdir", str(workdir / point.name),
         *point.args]
  if not processes:
    return [sys.executable, *run]
  devices = ["--devices-per-process", str(devices_per_process)] if devices_per_process else []
  return [sys.executable, "-m", "bertjax.tools.multihost", "--processes", str(processes),
          *devices, "--", *run, "--config.distributed=True"]


def _remote_launch(sweep: Sweep, point: Point, workdir: str, env: str = "") -> str:
  """The shell command a remote host runs for one point (in REMOTE_DIR, python3)."""
  argv = ["python3", "launch.py", "--config", sweep.config, "--workdir",
          posixpath.join(workdir, point.name), *point.args, "--config.distributed=True"]
  return f"cd {REMOTE_DIR} && {env}{shlex.join(argv)}"


def _gcloud(verb: str, tpu: str, zone: str, project: str | None) -> list[str]:
  project_args = ["--project", project] if project else []
  return ["gcloud", "compute", "tpus", "tpu-vm", verb, tpu, "--zone", zone, *project_args]


def pack_command() -> list[str]:
  excludes = [f"--exclude={p}" for p in PACK_EXCLUDES]
  return ["tar", "-czf", SOURCE_TARBALL, *excludes, "-C", str(REPO), "."]


def tpu_install_commands(tpu: str, zone: str, project: str | None) -> list[list[str]]:
  """Pack the repository here, copy it to every worker, unpack and pip install there."""
  tarball = posixpath.basename(SOURCE_TARBALL)
  install = (f"mkdir -p {REMOTE_DIR} && tar -xzf {tarball} -C {REMOTE_DIR} && cd {REMOTE_DIR} && "
             f'pip install -q -r requirements.txt "jax[tpu]"')
  project_args = ["--project", project] if project else []
  return [pack_command(),
          ["gcloud", "compute", "tpus", "tpu-vm", "scp", SOURCE_TARBALL, f"{tpu}:{tarball}",
           "--zone", zone, *project_args, "--worker=all"],
          [*_gcloud("ssh", tpu, zone, project), "--worker=all", "--command", install]]


def tpu_point_command(sweep: Sweep, point: Point, workdir: str, tpu: str, zone: str,
                      project: str | None) -> list[str]:
  return [*_gcloud("ssh", tpu, zone, project), "--worker=all", "--command",
          _remote_launch(sweep, point, workdir)]


def host_address(host: str) -> str:
  return host.rpartition("@")[2]


def hosts_install_commands(hosts: Sequence[str]) -> list[list[str]]:
  excludes = [f"--exclude={p}" for p in PACK_EXCLUDES]
  commands = []
  for host in hosts:
    commands.append(["rsync", "-az", *excludes, f"{REPO}/", f"{host}:{REMOTE_DIR}/"])
    commands.append(["ssh", host, f'cd {REMOTE_DIR} && pip install -q -r requirements.txt '
                                  f'"jax[cuda12]"'])
  return commands


def hosts_point_commands(sweep: Sweep, point: Point, workdir: str,
                         hosts: Sequence[str]) -> list[list[str]]:
  """One ssh command per host, run together: process i of len(hosts), coordinator on hosts[0]."""
  coordinator = f"{host_address(hosts[0])}:{COORDINATOR_PORT}"
  commands = []
  for i, host in enumerate(hosts):
    env = (f"JAX_COORDINATOR_ADDRESS={coordinator} JAX_NUM_PROCESSES={len(hosts)} "
           f"JAX_PROCESS_ID={i} ")
    commands.append(["ssh", host, _remote_launch(sweep, point, workdir, env)])
  return commands


# ---------------------------------------------------------------------------------------------
# Points at once here: each its own slice of the devices.

# A TPU slice of k chips of one host: the bounds of its chips (non-communicating processes on one
# Cloud TPU VM, one port each).
TPU_CHIP_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}
TPU_FIRST_PORT = 8477  # each slice's mesh controller: 8477, 8478, ... (8476 is a pod's)


def local_devices(environ: dict[str, str]) -> tuple[str, list[str]]:
  """(platform, device ids) the points here may share: the GPUs CUDA_VISIBLE_DEVICES names (else
  /dev/nvidiaN), the TPU chips (/dev/accelN, /dev/vfio/N), else the CPU cores this process may
  use. JAX_PLATFORMS=cpu means the CPU. The sweep's own process opens no device to know this."""
  platforms = environ.get("JAX_PLATFORMS", "")
  if not platforms.startswith("cpu"):
    if environ.get("CUDA_VISIBLE_DEVICES", "").strip():
      return "gpu", [d for d in environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    numbered = lambda pattern: sorted((m.group(1) for f in glob.glob(pattern)
                                       if (m := re.search(r"(\d+)$", f))), key=int)
    if numbered("/dev/nvidia[0-9]*"):
      return "gpu", numbered("/dev/nvidia[0-9]*")
    chips = numbered("/dev/accel[0-9]*") or numbered("/dev/vfio/[0-9]*")
    if chips:
      return "tpu", [str(i) for i in range(len(chips))]
  return "cpu", [str(c) for c in sorted(os.sched_getaffinity(0))]


def device_slices(n: int, platform: str, devices: list[str],
                  environ: dict[str, str]) -> list[dict[str, str]]:
  """The environment of each of `n` points at once: disjoint, equal slices of `devices`.

  gpu: CUDA_VISIBLE_DEVICES. tpu: TPU_VISIBLE_CHIPS (and TPU_VISIBLE_DEVICES, its older name)
  with the chips' bounds and a mesh controller port of its own. cpu: BERTJAX_CPU_CORES (the
  cores the point is pinned to, `pin_cores`) and XLA_FLAGS faking one CPU device per core."""
  per = len(devices) // n
  if per == 0:
    fail(f"--max_concurrent {n} needs a {platform} device for each point; this machine shows "
         f"{len(devices)} ({','.join(devices)}); run at most {len(devices)} at once")
  if platform == "tpu" and per not in TPU_CHIP_BOUNDS:
    fail(f"--max_concurrent {n} gives each point {per} of {len(devices)} TPU chips; a slice of "
         f"one host holds {', '.join(map(str, TPU_CHIP_BOUNDS))} chips: choose n to match")
  slices = [devices[i * per:(i + 1) * per] for i in range(n)]
  if platform == "gpu":
    return [{"CUDA_VISIBLE_DEVICES": ",".join(s)} for s in slices]
  if platform == "tpu":
    return [{"TPU_VISIBLE_CHIPS": ",".join(s), "TPU_VISIBLE_DEVICES": ",".join(s),
             "TPU_CHIPS_PER_PROCESS_BOUNDS": TPU_CHIP_BOUNDS[per], "TPU_PROCESS_BOUNDS": "1,1,1",
             "TPU_MESH_CONTROLLER_ADDRESS": f"localhost:{TPU_FIRST_PORT + i}",
             "TPU_MESH_CONTROLLER_PORT": str(TPU_FIRST_PORT + i)}
            for i, s in enumerate(slices)]
  flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "",
                 environ.get("XLA_FLAGS", "")).split()
  return [{"BERTJAX_CPU_CORES": ",".join(s), "XLA_FLAGS": " ".join(
      [*flags, f"--xla_force_host_platform_device_count={per}"])} for s in slices]


def pin_cores(env: dict[str, str] | None):
  """A Popen `preexec_fn` pinning the child to its slice's CPU cores (None: no slice)."""
  cores = (env or {}).get("BERTJAX_CPU_CORES")
  if not cores:
    return None
  return lambda: os.sched_setaffinity(0, [int(c) for c in cores.split(",")])
