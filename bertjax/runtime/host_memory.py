"""A process's peak resident memory and the host's available memory, readable without importing
any framework."""

from __future__ import annotations

import resource


def host_peak_rss_bytes() -> int:
  """This process's peak resident memory. VmHWM, unlike ru_maxrss, is not inherited from the
  parent across fork+exec, so a reference run in a subprocess reports only its own peak."""
  try:
    with open("/proc/self/status", encoding="ascii", errors="replace") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def host_available_bytes() -> int | None:
  """Memory the host can still give processes without swapping (MemAvailable), plus what this
  process already holds (VmRSS): the most this process can use. None where /proc is unreadable."""
  fields = {}
  for path, keys in (("/proc/meminfo", ("MemAvailable:",)), ("/proc/self/status", ("VmRSS:",))):
    try:
      with open(path, encoding="ascii", errors="replace") as f:
        for line in f:
          if line.startswith(keys):
            fields[line.split()[0]] = int(line.split()[1]) * 1024
    except OSError:
      return None
  if "MemAvailable:" not in fields:
    return None
  return fields["MemAvailable:"] + fields.get("VmRSS:", 0)
