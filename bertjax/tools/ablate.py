"""One command that measures a set of variants in a device window and writes one table.

  python -m bertjax.tools.benchmark --ablate h100-bert-base --output ablate.md [--timeout 900]
  python -m bertjax.tools.benchmark --ablate my_spec.py          # or my_spec.json

A device is lent in short windows, and compiling one bert-base variant takes 45-140 s, so the run
has three phases:
1. ahead of time: every variant's step is compiled (`--steps 0`; a trainer row trains one step),
   `--parallel` processes at a time, into JAX's persistent compilation cache
   (JAX_COMPILATION_CACHE_DIR, default ~/.cache/bertjax/jax) and XLA:GPU's per-fusion autotune
   cache beside it;
2. transformers' PyTorch reference (eager and torch.compile, each in its own process);
3. every variant alone, in its own process with a timeout, loading its step from the cache (the
   row records the cache hits and misses of its train step's compilation), then a short profile:
   the row's kernels per step and top operations by device time (a trainer row takes them from
   the benchmark's step at its settings).
This process never touches a device (it starts processes and reads their output), so neither the
reference nor a variant shares the accelerator with a JAX process that has preallocated its
memory (the compile processes run with XLA_PYTHON_CLIENT_PREALLOCATE=false). A variant that
fails, runs out of memory or outlives its timeout gets a row saying so (with its last error line)
and the rest go on. `--budget SECONDS` bounds the whole run: a process still running when it is
spent is stopped, the rows not reached are marked "not run", and the table is written. SIGTERM
(or Ctrl-C) stops the running processes, writes the table of the rows measured and exits 75.
After each row the table is rewritten (a temporary file renamed over --output), with every figure
and each process's start and end time in the JSON file beside it (--output .md -> .json), and each
step row's operation table under --output's stem + ".profiles/". An existing table is not
overwritten unless `--overwrite` is given.
The table's tokens/s counts every slot of batch x seq (as the references do); real tokens/s
counts the attention mask's ones, the tokens a step trains on (rows with `lengths` hold a share
of their slots: padded few, packed most).

A spec is a Python file defining BASE (a dict) and VARIANTS (a list of dicts), or a JSON file
{"base": {...}, "variants": [...]}; a name from `NAMED_SETS` picks a file of
experiments/ablations/. Keys (base and variants; a variant's value wins, its `overrides` and
`xla_flags` are added after the base's, its `env` merged over the base's):

  kind         "step": the benchmark's train step (default); "trainer": launch.py's real loop
               on data.synthetic, tokens/s the median of metrics.jsonl's train rows after the
               first; "command": any command whose last line is the benchmark's JSON
  preset | config   a model preset (bert-base) or a config file; trainer_config: launch.py's
               --config for trainer rows (default configs/bert.py:size=X for a bert-X preset)
  batch_size, seq_len, dtype, steps, objective   as the benchmark's flags
  remat        false | "full" | "dots";   scan_layers   true | false
  lengths      the rows' lengths, as --lengths: "full" (default), "wikitext2",
               "wikitext2-articles", "ragged:MEAN,MIN" (bertjax/data/ragged.py); step rows only
  pack         true: --pack (ragged rows packed with segment ids); false: --no-pack (padded,
               whatever the config's data.pack); step rows with lengths only
  overrides    ["key=value", ...] as --override (a bad key or value is that row's error)
  env          {"JAX_DEFAULT_PRNG_IMPL": "rbg", ...};   xla_flags   ["--xla_gpu_...=...", ...]
  timeout      seconds for the variant's process;  trainer_steps   the trainer row's steps
  command      ["{python}", "script.py", ...] for kind "command" ({python}, {repo} filled in)
Base only: references ["hf-torch", "hf-torch-compile"] (at the base's shapes; [] for none),
reference_steps, reference_command (a command run instead of the PyTorch reference, given the
reference's name as its last argument), title, budget (seconds, as --budget; the flag wins).
Variants: name (required, unique).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from bertjax.core import paths
from bertjax.core.errors import Preempted, fail
from bertjax.runtime import metric_writers

from bertjax.tools.ablate_spec import (  # the spec, its checks and its rows' commands
    DEFAULT_TIMEOUT_S, FLOP_KEYS, NAMED_SETS, REPO, benchmark_args, check_spec, load_spec,
    settings, trainer_args)


def fill(command: list[str]) -> list[str]:
  return [c.replace("{python}", sys.executable).replace("{repo}", str(REPO)) for c in command]


def environment(s: dict, cache: "Cache | None" = None) -> dict:
  env = dict(os.environ, **s["env"])
  if cache:
    env.update(cache.env())
  flags = s["xla_flags"] + (cache.xla_flags() if cache else [])
  if flags:
    env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""), *flags]).strip()
  return env


class Cache:
  """Where the compile-ahead phase leaves the compiled steps for the timed phase: JAX's persistent
  compilation cache (every entry kept, however quick its compilation) and, beside it, XLA:GPU's
  per-fusion autotuning results (read by GPU backends only; XLA:CPU takes and ignores the flag)."""

  def __init__(self, directory: str | None = None):
    self.dir = pathlib.Path(directory or os.environ.get("JAX_COMPILATION_CACHE_DIR")
                            or os.path.expanduser("~/.cache/bertjax/jax"))

  def env(self) -> dict:
    return {"JAX_COMPILATION_CACHE_DIR": str(self.dir),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}

  def xla_flags(self) -> list[str]:
    return [f"--xla_gpu_per_fusion_autotune_cache_dir={self.dir / 'autotune'}"]


class Processes:
  """The ablation's child processes, each in its own process group with its output in files: run
  one at a time or several at once, each stopped at its timeout or the run's deadline, and all
  stopped at once when the ablation itself is stopped (SIGTERM, Ctrl-C)."""

  def __init__(self, deadline: float | None = None):
    self.deadline = deadline
    self.active: dict[int, subprocess.Popen] = {}

  def remaining(self) -> float | None:
    return None if self.deadline is None else self.deadline - time.time()

  def run(self, jobs: list[tuple], parallel: int = 1) -> list[dict]:
    """Runs (argv, env, timeout[, until]) jobs, at most `parallel` at a time, in order; a result
    each: rc (None when stopped), stdout, stderr, started, ended, command, stopped ("timeout",
    "budget", "done" or None). `until`: a function; once it returns True the job has done what
    it was for, and its process is stopped with rc 0 ("done")."""
    results: list[dict | None] = [None] * len(jobs)
    pending = list(range(len(jobs)))
    running: dict[int, tuple] = {}
    try:
      while pending or running:
        while pending and len(running) < max(1, parallel):
          left = self.remaining()
          if left is not None and left <= 0:
            for i in pending:
              results[i] = {"rc": None, "stdout": "", "stderr": "", "started": None,
                            "ended": None, "command": jobs[i][0], "stopped": "budget"}
            pending = []
            break
          i = pending.pop(0)
          argv, env, timeout = jobs[i][:3]
          out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
          proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=err, text=True,
                                  start_new_session=True)
          self.active[proc.pid] = proc
          running[i] = (proc, out, err, time.time(), timeout)
        for i, (proc, out, err, started, timeout) in list(running.items()):
          stopped = None
          until = jobs[i][3] if len(jobs[i]) > 3 else None
          if proc.poll() is None:
            now = time.time()
            if until is not None and until():
              stopped = "done"
            elif now - started > timeout:
              stopped = "timeout"
            elif self.deadline is not None and now > self.deadline:
              stopped = "budget"
            else:
              continue
            self._kill(proc)
          del running[i]
          self.active.pop(proc.pid, None)
          out.seek(0)
          err.seek(0)
          rc = 0 if stopped == "done" else None if stopped else proc.returncode
          results[i] = {"rc": rc, "stdout": out.read(),
                        "stderr": err.read(), "started": started, "ended": time.time(),
                        "command": jobs[i][0], "stopped": stopped}
          out.close()
          err.close()
        if running:
          time.sleep(0.1)
    finally:
      for proc, out, err, *_ in running.values():
        out.close()
        err.close()
    return results

  def _kill(self, proc: subprocess.Popen) -> None:
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    proc.wait()

  def stop_all(self) -> None:
    for proc in list(self.active.values()):
      self._kill(proc)
    self.active.clear()


def failure(p: dict, timeout: float) -> dict:
  """The row of a process that did not give its figures: what went wrong, in its last line."""
  if p.get("stopped") == "budget":
    if p["started"] is None:
      return {"status": "not run", "error": "the --budget was spent before it started"}
    return {"status": "stopped", "error": "the --budget was spent while it ran"}
  if p["rc"] is None:
    return {"status": "timed out", "error": f"timed out after {timeout:g} s"}
  lines = [x.strip() for x in (p["stderr"] or p["stdout"]).splitlines() if x.strip()]
  last = lines[-1] if lines else f"exit status {p['rc']}"
  oom = re.search(r"RESOURCE_EXHAUSTED|out of memory|OutOfMemoryError", p["stderr"] + p["stdout"],
                  re.IGNORECASE)
  return {"status": "out of memory" if oom else "failed", "error": last}


def last_json(p: dict) -> dict | None:
  if p["rc"] != 0:
    return None
  lines = p["stdout"].strip().splitlines()
  try:
    result = json.loads(lines[-1]) if lines else None
  except json.JSONDecodeError:
    return None
  return result if isinstance(result, dict) and "tokens_per_s" in result else None


def train_step_entries(cache: "Cache | None") -> set[str]:
  """The persistent cache's entries of train steps (JAX names each by its module)."""
  if cache is None or not cache.dir.is_dir():
    return set()
  return {p.name for p in cache.dir.glob("jit_train_step-*")}


def trainer_figures(workdir: pathlib.Path, slots: int | None = None) -> dict | None:
  """tokens/s and step time from metrics.jsonl: the median of the train rows after the first
  (the first window follows compilation and warms the input pipeline).

  The trainer logs real tokens (the attention mask's ones; synthetic rows are 50-100% full),
  the benchmark every slot of batch x seq. With `slots` (batch x seq), tokens/s counts slots, as
  the benchmark does, so the two rows compare; the real-token rate is kept as well."""
  rows = metric_writers.read_metrics(workdir)
  rows = [r for r in rows if r.get("split") == "train" and "tokens_per_s" in r]
  rows = rows[1:] or rows
  if not rows:
    return None
  steps_per_s = statistics.median(r["steps_per_s"] for r in rows)
  real = statistics.median(r["tokens_per_s"] for r in rows)
  return {"tokens_per_s": steps_per_s * slots if slots else real, "real_tokens_per_s": real,
          "step_time_s": 1 / steps_per_s, "rows": len(rows)}


# ------------------------------------------------------------------------------ the runs


def run_reference(base: dict, name: str, timeout: float, processes: Processes) -> dict:
  s = settings(base, {})
  if base.get("reference_command"):
    argv = fill(base["reference_command"]) + [name]
  else:
    args = benchmark_args({**s, "steps": base.get("reference_steps") or s["steps"]})
    argv = [sys.executable, "-m", "bertjax.tools.benchmark", *args, "--compare", name,
            "--reference_only"]
  p = processes.run([(argv, dict(os.environ, **s["env"]), timeout)])[0]
  result = last_json(p)
  row = {"name": name, "kind": "reference", "started": p["started"], "ended": p["ended"],
         "command": argv}
  if result is None:
    return {**row, **failure(p, timeout)}
  return {**row, "status": "ok", **result, "compile_time_s": result.get("first_step_s")}


def compile_job(base: dict, variant: dict, timeout: float, cache: Cache,
                workdirs: list[pathlib.Path]) -> tuple[list[str], dict, float] | None:
  """The compile-ahead process of a variant: the benchmark with `--steps 0`, or for a trainer
  row launch.py training one step; None for a command row."""
  s = settings(base, variant)
  env = {**environment(s, cache), "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
  timeout = float(variant.get("timeout") or timeout)
  if s["kind"] == "command":
    return None
  if s["kind"] == "trainer":
    # The row's own command (its step depends on total_steps through the schedule), stopped
    # once its first train row is logged: its step is compiled and cached by then.
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="bertjax-ablate-"))
    workdirs.append(workdir)
    logged = lambda: any(r.get("split") == "train" for r in metric_writers.read_metrics(workdir))
    return trainer_args(s, str(workdir)), env, timeout, logged
  return ([sys.executable, "-m", "bertjax.tools.benchmark", *benchmark_args(s), "--steps", "0"],
          env, timeout)


def compile_ahead(base: dict, variants: list[dict], timeout: float, cache: Cache,
                  processes: Processes, parallel: int) -> dict:
  """Phase 1: every variant's step compiled into the cache, `parallel` processes at a time. A
  failure here is recorded, not fatal: the timed phase will meet it again and report it."""
  workdirs: list[pathlib.Path] = []
  jobs = {v["name"]: compile_job(base, v, timeout, cache, workdirs) for v in variants}
  jobs = {name: job for name, job in jobs.items() if job}
  started = time.time()
  try:
    results = processes.run(list(jobs.values()), parallel)
  finally:
    for w in workdirs:
      shutil.rmtree(w, ignore_errors=True)
  rows = {}
  for name, p in zip(jobs, results):
    outcome = {"status": "ok"} if p["rc"] == 0 else failure(p, jobs[name][2])
    rows[name] = {**outcome, "started": p["started"], "ended": p["ended"]}
  return {"parallel": parallel, "seconds": time.time() - started, "cache": str(cache.dir),
          "variants": rows}


def profile_dir(out: pathlib.Path | None, name: str) -> pathlib.Path:
  """Where a variant's operation table goes: beside the table, else a temporary folder."""
  if out is None:
    return pathlib.Path(tempfile.mkdtemp(prefix="bertjax-profile-"))
  safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "variant"
  return out.parent / f"{out.stem}.profiles" / safe


def profile_columns(result: dict) -> dict:
  """kernels per step and the top operations from a benchmark result's profile."""
  prof = result.get("profile") or {}
  top = [{"name": o["name"], "ms_per_step": o["ms_per_step"], "share": o["share"]}
         for o in prof.get("top", []) if o["name"] != "(other)"][:5]
  return {"kernels_per_step": prof.get("kernels_per_step"), "top_ops": top,
          "profile_table": prof.get("table")}


def run_variant(base: dict, variant: dict, timeout: float, processes: Processes,
                cache: Cache | None = None, out: pathlib.Path | None = None) -> dict:
  s = settings(base, variant)
  timeout = float(variant.get("timeout") or timeout)
  row = {"name": s["name"], "kind": s["kind"], "settings": {k: s.get(k) for k in FLOP_KEYS}}
  env = environment(s, cache)
  workdir = None
  if s["kind"] == "trainer":
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="bertjax-ablate-"))
    argv = trainer_args(s, str(workdir))
  elif s["kind"] == "command":
    argv = fill(s["command"])
  else:
    argv = [sys.executable, "-m", "bertjax.tools.benchmark", *benchmark_args(s),
            "--profile", str(profile_dir(out, s["name"]))]
  entries = train_step_entries(cache)
  try:
    p = processes.run([(argv, env, timeout)])[0]
    slots = (s["batch_size"] * s["seq_len"]) if s.get("batch_size") and s.get("seq_len") else None
    result = trainer_figures(workdir, slots) if workdir and p["rc"] == 0 else last_json(p)
  finally:
    if workdir:
      shutil.rmtree(workdir, ignore_errors=True)
  row.update(started=p["started"], ended=p["ended"], command=argv, env=s["env"],
             xla_flags=s["xla_flags"])
  if result is None:
    return {**row, **failure(p, timeout)}
  row.update(status="ok", **result)
  if s["kind"] == "trainer" and cache is not None:
    # launch.py reports no cache events: a train step compiled in the row writes a new entry,
    # one loaded from the cache writes none.
    new = train_step_entries(cache) - entries
    row["step_cache"] = {"hits": 0 if new else 1, "misses": len(new)}
  elif s["kind"] == "step":
    row.update(profile_columns(result))
  return row


def trainer_profile(base: dict, variant: dict, row: dict, timeout: float, processes: Processes,
                    cache: Cache, out: pathlib.Path | None) -> None:
  """A trainer row's kernels per step and top operations: those of the benchmark's step at the
  row's settings (the trainer has no profiler of its own), from a short run after the row."""
  s = settings(base, {**variant, "kind": "step", "steps": 2})
  argv = [sys.executable, "-m", "bertjax.tools.benchmark", *benchmark_args(s),
          "--profile", str(profile_dir(out, s["name"]))]
  p = processes.run([(argv, environment(s, cache), timeout)])[0]
  result = last_json(p)
  if result is not None:
    row.update(profile_columns(result), profile_from="the benchmark's step at these settings")


def trainer_mfu(row: dict, rows: list[dict]) -> None:
  """A trainer row's MFU from the FLOPs per token of a step row with the same shapes."""
  for other in rows:
    if (other["kind"] == "step" and other["status"] == "ok" and other.get("peak_flops")
        and other["settings"] == row["settings"]):
      row["mfu"] = row["tokens_per_s"] * other["model_flops_per_token"] / other["peak_flops"]
      row["mfu_from"] = other["name"]
      return


# ------------------------------------------------------------------------------ the table


def _fmt(value, spec: str) -> str:
  return "-" if value is None else format(value, spec)


def cache_cell(row: dict) -> str:
  """How the row's train step was compiled: loaded from the cache, or compiled in the row."""
  c = row.get("step_cache")
  if not c or not (c["hits"] or c["misses"]):
    return "-"
  return "compiled" if c["misses"] else "cache"


def top_ops_cell(row: dict) -> str:
  return "; ".join(f"{o['name'][:40]} {o['share']:.0%}" for o in (row.get("top_ops") or [])[:3])


def format_table(title: str, base: dict, references: list[dict], rows: list[dict],
                 ahead: dict | None = None) -> str:
  s = settings(base, {})
  ok_refs = [r for r in references if r["status"] == "ok"]
  device = next((r.get("device") for r in rows if r.get("device")), "not yet measured")
  shapes = ", ".join(f"{k} {s[k]}" for k in ("preset", "config", "batch_size", "seq_len", "dtype")
                     if s.get(k))
  head = ["variant", "kind", "tokens/s", "MFU", "real tokens/s", "step ms", "peak MiB",
          "compile s", "step from", "kernels/step"]
  head += [f"vs {r['name']}" for r in references] + ["top ops (share of device time)", "note"]
  lines = [f"# {title}", "", f"Base: {shapes}; device: {device}; references at the base shapes."]
  if ahead:
    failed = [n for n, v in ahead["variants"].items() if v["status"] != "ok"]
    lines += ["", f"Compiled ahead: {len(ahead['variants'])} variants, {ahead['parallel']} at a "
              f"time, in {ahead['seconds']:.0f} s"
              + (f" ({len(failed)} failed there: {', '.join(failed)})" if failed else "")
              + f"; cache {ahead['cache']}."]
  lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for row in references + rows:
    ok = row["status"] == "ok"
    cells = [row["name"], row["kind"]]
    if ok:
      peak = row.get("peak_memory_bytes")
      cells += [_fmt(row["tokens_per_s"], ",.0f"), _fmt(row.get("mfu"), ".3f"),
                _fmt(row.get("real_tokens_per_s"), ",.0f"),
                _fmt(row["step_time_s"] * 1e3 if row.get("step_time_s") else None, ".1f"),
                _fmt(peak / 2**20 if peak else None, ",.0f"),
                _fmt(row.get("compile_time_s"), ".1f"), cache_cell(row),
                _fmt(row.get("kernels_per_step"), ",.0f")]
      cells += [f"{row['tokens_per_s'] / r['tokens_per_s']:.2f}x" if r in ok_refs else "-"
                for r in references]
      cells.append(top_ops_cell(row) or "-")
      note = f"MFU from {row['mfu_from']}'s FLOPs" if row.get("mfu_from") else ""
      if row.get("profile_from"):
        note = "; ".join(filter(None, [note, f"profile of {row['profile_from']}"]))
    else:
      cells += ["-"] * (9 + len(references))
      note = f"{row['status']}: {row['error']}"
    cells.append(note.replace("|", "/")[:200])
    lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
  return "\n".join(lines) + "\n"


def check_output(output: str | None, overwrite: bool = False) -> pathlib.Path | None:
  """--output checked before anything runs: a writable file path whose table does not exist yet
  (unless `overwrite`)."""
  if output is None:
    return None
  if not output.strip():
    fail("--output is empty (an unset shell variable?); give the table's path, e.g. "
         "--output ablate.md")
  out = pathlib.Path(output)
  if out.is_dir():
    fail(f"--output {output} is a folder; give a file path inside it, e.g. {out / 'ablate.md'}")
  if out.suffix == ".json":
    fail(f"--output {output}: the figures go beside the table as .json; give the table's path, "
         f"e.g. {out.with_suffix('.md')}")
  existing = [p for p in (out, out.with_suffix(".json")) if p.exists()]
  if existing and not overwrite:
    fail(f"--output {output}: {existing[0]} exists (an earlier table); give another path or add "
         "--overwrite to replace it")
  folder = out.parent
  probe = folder
  while not probe.exists() and probe != probe.parent:
    probe = probe.parent
  if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
    fail(f"--output {output}: cannot write into {probe}; choose a folder you can write to")
  return out


def run_ablation(spec_name: str, output: str | None = None, timeout: float | None = None,
                 budget: float | None = None, parallel: int | None = None,
                 overwrite: bool = False) -> dict:
  """Runs the spec (compile ahead, references, then each variant alone) and writes the table;
  returns every row."""
  if timeout is not None and timeout <= 0:
    fail(f"--timeout {timeout:g} must be a positive number of seconds")
  if budget is not None and budget <= 0:
    fail(f"--budget {budget:g} must be a positive number of seconds")
  if parallel is not None and parallel < 1:
    fail(f"--parallel {parallel} must be at least 1")
  out = check_output(output, overwrite)
  spec = load_spec(spec_name)
  base, variants = spec["base"], spec["variants"]
  title = base.get("title") or f"Ablation {spec_name}"
  timeout = float(timeout or base.get("timeout") or DEFAULT_TIMEOUT_S)
  budget = budget or base.get("budget")
  parallel = parallel or min(6, os.cpu_count() or 1)
  started = time.time()
  processes = Processes(started + budget if budget else None)
  cache = Cache()
  record = {"spec": spec_name, "base": base, "budget_s": budget, "started": started,
            "compile_ahead": None, "references": [], "rows": []}

  def save():
    table = format_table(title, base, record["references"], record["rows"],
                         record["compile_ahead"])
    if out:
      out.parent.mkdir(parents=True, exist_ok=True)
      paths.replace_text(out, table)
      paths.replace_text(out.with_suffix(".json"), json.dumps(record, indent=1, default=str))
    return table

  def stopped(signum, frame):
    del frame
    raise Preempted(f"{signal.Signals(signum).name} during the ablation")

  previous = {sig: signal.signal(sig, stopped) for sig in (signal.SIGTERM, signal.SIGINT)}
  try:
    print(f"compiling {len(variants)} variants ahead, {parallel} at a time ...", flush=True)
    record["compile_ahead"] = compile_ahead(base, variants, timeout, cache, processes, parallel)
    save()
    for name in settings(base, {})["references"]:
      print(f"reference {name} ...", flush=True)
      record["references"].append(run_reference(base, name, timeout, processes))
      save()
    for variant in variants:
      print(f"variant {variant['name']} ...", flush=True)
      row = run_variant(base, variant, timeout, processes, cache, out)
      if row["kind"] == "trainer" and row["status"] == "ok":
        trainer_profile(base, variant, row, timeout, processes, cache, out)
      record["rows"].append(row)
      for other in record["rows"]:  # a step row may come after its trainer row
        if other["kind"] == "trainer" and other["status"] == "ok" and "mfu" not in other:
          trainer_mfu(other, record["rows"])
      print(f"  {row['status']}" + (f": {row['tokens_per_s']:,.0f} tokens/s"
                                    if row["status"] == "ok" else f": {row['error']}"), flush=True)
      save()
  except Preempted as e:
    processes.stop_all()
    done = {r["name"] for r in record["rows"]}
    record["rows"] += [{"name": v["name"], "kind": settings(base, v)["kind"], "status": "not run",
                        "error": str(e)} for v in variants if v["name"] not in done]
    save()
    where = f"the table of the rows measured is in {out}" if out else "no --output was given"
    raise Preempted(f"{e}: the running processes were stopped; {where}; run the same command "
                    "with --overwrite (or another --output) to measure again") from None
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
  print(save(), end="")
  if budget and processes.remaining() is not None and processes.remaining() <= 0:
    print(f"the --budget of {budget:g} s was spent: rows not reached are marked 'not run'",
          flush=True)
  return record
