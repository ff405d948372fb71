"""The coordinator's port: found in use before a run binds it, in one line.

JAX's coordination service, hosted by process 0, binds its port when the processes join; a port
already taken made process 0 print a gRPC log line and a traceback ("Failed to start RPC server")
while the others waited out the join timeout against whatever held it. `check_coordinator_port`
refuses it first (bertjax/runtime/distributed.py on process 0, bertjax/tools/multihost.py for
`--port`).
"""

from __future__ import annotations

import contextlib
import errno
import socket

from bertjax.core.errors import fail


def _host_port(address: str) -> tuple[str, int] | None:
  """("host", port) of "host:port" or "[v6]:port"; None where it is not one."""
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit():
    return None
  return host.strip("[]"), int(port)


def check_coordinator_port(address: str, bind_address: str | None = None) -> None:
  """Refuses, in one line, a coordinator `address` whose port this host cannot listen on
  (`bind_address`, where the service binds: JAX's default is every interface, [::]:port). Bound
  as gRPC binds it (SO_REUSEADDR: a port left in TIME_WAIT by a run that ended is free). Where
  the check itself cannot run (no IPv6 here, a name not resolved) it says nothing: JAX's own error
  stands."""
  given = _host_port(address)
  target = _host_port(bind_address) if bind_address else given and ("::", given[1])
  if target is None:
    return
  host, port = target
  family = socket.AF_INET6 if ":" in host else socket.AF_INET
  try:
    with contextlib.closing(socket.socket(family, socket.SOCK_STREAM)) as s:
      s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      s.bind((host, port))
  except OSError as e:
    if e.errno in (errno.EADDRINUSE, errno.EACCES):
      why = ("is in use (a run still going, or another program, listens there)"
             if e.errno == errno.EADDRINUSE else "is not open to this user (below 1024)")
      fail(f"the coordinator's port {port} ({address}) {why}; end that program, or start every "
           "process with another free port (JAX_COORDINATOR_ADDRESS=host:port; bertjax.tools."
           "multihost --port, or leave it out for a free one)")
