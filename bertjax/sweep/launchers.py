"""The commands that run a sweep point: here, on every worker of a Cloud TPU VM, or over ssh on
several hosts."""

from __future__ import annotations

import pathlib
import posixpath
import shlex
import sys
from typing import Sequence

from bertjax.sweep.spec import (COORDINATOR_PORT, PACK_EXCLUDES, REMOTE_DIR, REPO, SOURCE_TARBALL,
                                Point, Sweep)


def local_command(sweep: Sweep, point: Point, workdir: pathlib.Path, processes: int = 0,
                  devices_per_process: int = 0) -> list[str]:
  """The point's launch.py command here; with `processes`, run on that many local processes
  joined by JAX's distributed runtime (bertjax.tools.multihost: CPU devices, gloo collectives,
  `devices_per_process` each when given), as a pod's hosts would run it."""
  run = ["launch.py", "--config", sweep.config, "--workdir", str(workdir / point.name),
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
