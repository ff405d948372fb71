"""Device time per operation, read from a JAX profiler trace (`jax.profiler.trace(...,
create_perfetto_trace=True)`), so anyone with a device sees where a train step goes without
TensorBoard.

The trace's Perfetto JSON holds one complete event ("ph": "X") per kernel or XLA operation. On a
GPU or TPU those are events of the `/device:...` processes: the "XLA Ops" line where the trace has
one (TPU), else the streams' kernels, never the lines that summarize them ("XLA Modules",
"Steps", ...), which would count each operation twice. On a CPU, where XLA runs on host threads,
the events of XLA's own threads (the Python thread and the runtime's bookkeeping spans left out).
Events are summed by name; counts and times are divided by the number of steps traced.
"""

from __future__ import annotations

import collections
import gzip
import json
import pathlib

# Spans of the CPU runtime that enclose operations rather than being one.
_CPU_WRAPPERS = ("ThunkExecutor", "SlinkyThreadPool", "ThreadpoolListener", "end: ")
# Device lines that summarize the operations rather than being them.
_SUMMARY_LINES = ("XLA Modules", "Steps", "Framework", "Source", "TensorFlow", "Launch", "Host")


def find_trace(trace_dir: str | pathlib.Path) -> pathlib.Path | None:
  """The newest perfetto_trace.json.gz under `trace_dir`, or None."""
  found = sorted(pathlib.Path(trace_dir).rglob("perfetto_trace.json.gz"),
                 key=lambda p: p.stat().st_mtime)
  return found[-1] if found else None


def _events(path: pathlib.Path) -> tuple[list[dict], dict, dict]:
  with gzip.open(path, "rt") as f:
    data = json.load(f)
  events = data["traceEvents"] if isinstance(data, dict) else data
  processes = {e["pid"]: e.get("args", {}).get("name", "") for e in events
               if e.get("ph") == "M" and e.get("name") == "process_name"}
  threads = {(e["pid"], e["tid"]): e.get("args", {}).get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
  return events, processes, threads


def op_table(trace_dir: str | pathlib.Path, steps: int, top: int = 25) -> dict:
  """{"where": device or host threads, "step_device_ms", "kernels_per_step" (operations launched
  per step: kernels on a device, XLA's operations on a CPU), "ops": [{"name", "per_step",
  "ms_per_step", "share"}...]} for the `top` operations by time; the rest summed as "(other)"."""
  path = find_trace(trace_dir)
  if path is None:
    raise FileNotFoundError(f"no perfetto_trace.json.gz under {trace_dir}")
  events, processes, threads = _events(path)
  device_pids = {pid for pid, name in processes.items() if name.startswith("/device:")}
  device_lines = {key: name for key, name in threads.items() if key[0] in device_pids}
  op_lines = {key for key, name in device_lines.items() if name == "XLA Ops"} or {
      key for key, name in device_lines.items() if not name.startswith(_SUMMARY_LINES)}

  def is_op(e) -> bool:
    if e.get("ph") != "X" or "dur" not in e:
      return False
    if device_pids:
      return (e["pid"], e["tid"]) in op_lines if device_lines else e["pid"] in device_pids
    thread = threads.get((e["pid"], e["tid"]), "")
    return "XLA" in thread and not e["name"].startswith(_CPU_WRAPPERS)

  time_us, count = collections.Counter(), collections.Counter()
  for e in filter(is_op, events):
    time_us[e["name"]] += float(e["dur"])
    count[e["name"]] += 1
  total = sum(time_us.values())
  ops = [{"name": name, "per_step": count[name] / steps, "ms_per_step": t / 1e3 / steps,
          "share": t / total if total else 0.0} for name, t in time_us.most_common(top)]
  rest = total - sum(time_us[o["name"]] for o in ops)
  if rest > 0:
    ops.append({"name": "(other)", "per_step": sum(count.values()) / steps - sum(
        o["per_step"] for o in ops), "ms_per_step": rest / 1e3 / steps, "share": rest / total})
  return {"trace": str(path), "where": "device" if device_pids else "host (XLA threads)",
          "steps": steps, "step_device_ms": total / 1e3 / steps,
          "kernels_per_step": sum(count.values()) / steps, "ops": ops}


def format_table(table: dict) -> str:
  """The table as Markdown."""
  lines = [f"Device time per operation over {table['steps']} steps ({table['where']}): "
           f"{table['step_device_ms']:.2f} ms per step.", "",
           "| operation | per step | ms per step | share |", "|---|---:|---:|---:|"]
  for o in table["ops"]:
    lines.append(f"| `{o['name'][:80]}` | {o['per_step']:g} | {o['ms_per_step']:.3f} | "
                 f"{100 * o['share']:.1f}% |")
  return "\n".join(lines) + "\n"
