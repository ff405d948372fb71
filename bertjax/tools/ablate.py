"""One command that measures a set of variants in a device window and writes one table.

  python -m bertjax.tools.benchmark --ablate h100-bert-base --output ablate.md [--timeout 900]
  python -m bertjax.tools.benchmark --ablate my_spec.py          # or my_spec.json

Order: transformers' PyTorch reference first (eager and torch.compile, each in its own process),
then every variant in its own process with a timeout. This process never touches a device (it
starts processes and reads their output), so neither the reference nor a variant shares the
accelerator with a JAX process that has preallocated its memory. A variant that fails, runs out
of memory or outlives its timeout gets a row saying so (with its last error line) and the rest go
on. After each row the table is rewritten (a temporary file renamed over --output), with every
figure and each process's start and end time in the JSON file beside it (--output .md -> .json).

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
  overrides    ["key=value", ...] as --override (a bad key or value is that row's error)
  env          {"JAX_DEFAULT_PRNG_IMPL": "rbg", ...};   xla_flags   ["--xla_gpu_...=...", ...]
  timeout      seconds for the variant's process;  trainer_steps   the trainer row's steps
  command      ["{python}", "script.py", ...] for kind "command" ({python}, {repo} filled in)
Base only: references ["hf-torch", "hf-torch-compile"] (at the base's shapes; [] for none),
reference_steps, reference_command (a command run instead of the PyTorch reference, given the
reference's name as its last argument), title. Variants: name (required, unique).
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

from bertjax.config import config_lib
from bertjax.core import paths
from bertjax.core.errors import UserError, fail
from bertjax.runtime import metric_writers

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
SETS_DIR = REPO / "experiments" / "ablations"
NAMED_SETS = ("h100-bert-base", "bert-large-512", "cpu-smoke")
KINDS = ("step", "trainer", "command")
REFERENCES = ("hf-torch", "hf-torch-compile")
DEFAULT_TIMEOUT_S = 900.0
# key: the types its value may take. Base and variants alike, unless listed below.
SETTINGS = {
    "kind": (str,), "preset": (str,), "config": (str,), "trainer_config": (str,),
    "batch_size": (int,), "seq_len": (int,), "dtype": (str,), "steps": (int,),
    "objective": (str,), "remat": (bool, str), "scan_layers": (bool,), "overrides": (list,),
    "env": (dict,), "xla_flags": (list,), "timeout": (int, float), "trainer_steps": (int,),
    "command": (list,),
}
BASE_ONLY = {"references": (list,), "reference_steps": (int,), "reference_command": (list,),
             "title": (str,)}
VARIANT_ONLY = {"name": (str,)}
DEFAULTS = {"kind": "step", "preset": "bert-base", "steps": 20, "overrides": [], "env": {},
            "xla_flags": [], "trainer_steps": 120, "references": list(REFERENCES)}
# The keys that decide the FLOPs of a step: a trainer row takes its MFU from a step row whose
# keys match.
FLOP_KEYS = ("preset", "config", "objective", "batch_size", "seq_len", "dtype", "remat",
             "scan_layers", "overrides")


# ------------------------------------------------------------------------------ the spec


def _check_entry(entry, allowed: dict, where: str) -> None:
  if not isinstance(entry, dict):
    fail(f"ablation spec: {where} must be a dict of settings, not {type(entry).__name__}")
  for key, value in entry.items():
    if key not in allowed:
      fail(f"ablation spec: unknown key {key!r} in {where}; use {', '.join(sorted(allowed))}")
    if value is None:
      continue
    types = allowed[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
      fail(f"ablation spec: {where}: {key}={value!r} must be "
           f"{' or '.join(t.__name__ for t in types)}")
    if key in ("overrides", "xla_flags", "command", "references", "reference_command") and \
        not all(isinstance(x, str) for x in value):
      fail(f"ablation spec: {where}: {key} must be a list of strings")
    if key == "env" and not all(isinstance(x, str) for item in value.items() for x in item):
      fail(f"ablation spec: {where}: env must map names to string values")
  bad = [o for o in entry.get("overrides") or [] if "=" not in o]
  if bad:
    fail(f"ablation spec: {where}: override {bad[0]!r} has no value; write key=value")
  if entry.get("kind") not in (None, *KINDS):
    fail(f"ablation spec: {where}: kind={entry['kind']!r}; use one of {', '.join(KINDS)}")
  if entry.get("remat") not in (None, False, "full", "dots"):
    fail(f"ablation spec: {where}: remat={entry['remat']!r}; use false, 'full' or 'dots'")
  unknown = [r for r in entry.get("references") or [] if r not in REFERENCES]
  if unknown:
    fail(f"ablation spec: {where}: reference {unknown[0]!r}; use {', '.join(REFERENCES)}")


def check_spec(spec, source: str) -> dict:
  """`spec` ({"base": ..., "variants": [...]}) checked: a malformed one fails in one line."""
  if not isinstance(spec, dict) or set(spec) - {"base", "variants"}:
    fail(f"ablation spec {source}: give a base dict and a variants list, nothing else")
  base, variants = spec.get("base") or {}, spec.get("variants")
  _check_entry(base, {**SETTINGS, **BASE_ONLY}, f"{source} base")
  if not isinstance(variants, list) or not variants:
    fail(f"ablation spec {source}: variants must be a non-empty list of dicts")
  names = set()
  for i, variant in enumerate(variants):
    _check_entry(variant, {**SETTINGS, **VARIANT_ONLY}, f"{source} variant {i}")
    name = variant.get("name")
    if not name:
      fail(f"ablation spec {source}: variant {i} has no name; give each a unique name")
    if name in names:
      fail(f"ablation spec {source}: two variants are named {name!r}; names must be unique")
    names.add(name)
    if settings(base, variant)["kind"] == "command" and not settings(base, variant).get("command"):
      fail(f"ablation spec {source}: variant {name!r} of kind command needs a command list")
  return {"base": base, "variants": variants}


def load_spec(name: str) -> dict:
  """A named set, a Python spec file (BASE, VARIANTS) or a JSON one, checked."""
  path = pathlib.Path(name)
  if not path.is_file():
    if name not in NAMED_SETS:
      fail(f"--ablate {name}: no such file or named set; use a spec file (.py or .json) or one "
           f"of {', '.join(NAMED_SETS)}")
    path = SETS_DIR / f"{name}.py"
  if path.suffix == ".json":
    try:
      spec = json.loads(path.read_text())
    except json.JSONDecodeError as e:
      fail(f"ablation spec {path}: not valid JSON ({e})")
  elif path.suffix == ".py":
    try:
      module = config_lib.load_module(path, kind="ablation spec")
    except UserError:
      raise  # a syntax error: already one line naming the file and line
    except Exception as e:  # pylint: disable=broad-except  # any error in the user's file
      fail(f"ablation spec {path}: {type(e).__name__}: {e}")
    if not hasattr(module, "VARIANTS"):
      fail(f"ablation spec {path}: define VARIANTS (a list of dicts) and optionally BASE")
    spec = {"base": getattr(module, "BASE", {}), "variants": module.VARIANTS}
  else:
    fail(f"ablation spec {path}: use a .py file (BASE, VARIANTS) or a .json one")
  return check_spec(spec, str(path))


def settings(base: dict, variant: dict) -> dict:
  """The variant's settings: the defaults, the base, then the variant."""
  merged = {**DEFAULTS, **base, **variant}
  merged["overrides"] = list(base.get("overrides") or []) + list(variant.get("overrides") or [])
  merged["xla_flags"] = list(base.get("xla_flags") or []) + list(variant.get("xla_flags") or [])
  merged["env"] = {**(base.get("env") or {}), **(variant.get("env") or {})}
  return merged


# ------------------------------------------------------------------------------ commands


def benchmark_args(s: dict) -> list[str]:
  """`python -m bertjax.tools.benchmark` flags for settings `s`."""
  args = ["--config", s["config"]] if s.get("config") else ["--preset", s["preset"]]
  for key in ("batch_size", "seq_len", "dtype", "steps", "objective"):
    if s.get(key) is not None:
      args += [f"--{key}", str(s[key])]
  if s.get("remat"):
    args += ["--remat", s["remat"]]
  if s.get("scan_layers") is not None:
    args += ["--override", f"model.scan_layers={s['scan_layers']}"]
  for item in s["overrides"]:
    args += ["--override", item]
  return args


def trainer_args(s: dict, workdir: str) -> list[str]:
  """launch.py's command for a trainer row: the same shapes on synthetic batches."""
  config = s.get("trainer_config") or s.get("config")
  if not config:
    if not s["preset"].startswith("bert-"):
      fail(f"trainer variant {s['name']!r}: give trainer_config (launch.py's --config) for "
           f"preset {s['preset']}")
    config = f"configs/bert.py:size={s['preset'].removeprefix('bert-')}"
  steps = s["trainer_steps"]
  items = ["data.synthetic=True", "optimizer.warmup_steps=0", f"total_steps={steps}",
           f"log_every={max(1, steps // 6)}", "checkpoint_every=100000000", "tensorboard=False",
           "eval_every=0", "async_checkpointing=False"]
  for key, name in (("batch_size", "batch_size"), ("seq_len", "max_seq_length")):
    if s.get(key) is not None:
      items.append(f"{name}={s[key]}")
  if s.get("dtype"):
    items.append(f"model.dtype='{s['dtype']}'")
  if s.get("objective"):
    items.append(f"objective='{s['objective']}'")
  if s.get("remat"):
    items += ["model.remat=True", f"model.remat_policy='{s['remat']}'"]
  if s.get("scan_layers") is not None:
    items.append(f"model.scan_layers={s['scan_layers']}")
  items += s["overrides"]
  return [sys.executable, "launch.py", "--config", config, "--workdir", workdir,
          *(f"--config.{x}" for x in items)]


def fill(command: list[str]) -> list[str]:
  return [c.replace("{python}", sys.executable).replace("{repo}", str(REPO)) for c in command]


def environment(s: dict) -> dict:
  env = dict(os.environ, **s["env"])
  if s["xla_flags"]:
    env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""), *s["xla_flags"]]).strip()
  return env


def run_process(argv: list[str], env: dict, timeout: float) -> dict:
  """Runs `argv` in the repository in its own process group; on timeout kills that group."""
  started = time.time()
  proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True)
  try:
    out, err = proc.communicate(timeout=timeout)
    rc = proc.returncode
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    out, err = proc.communicate()
    rc = None
  return {"rc": rc, "stdout": out, "stderr": err, "started": started, "ended": time.time(),
          "command": argv}


def failure(p: dict, timeout: float) -> dict:
  """The row of a process that did not give its figures: what went wrong, in its last line."""
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


def run_reference(base: dict, name: str, timeout: float) -> dict:
  s = settings(base, {})
  if base.get("reference_command"):
    argv = fill(base["reference_command"]) + [name]
  else:
    args = benchmark_args({**s, "steps": base.get("reference_steps") or s["steps"]})
    argv = [sys.executable, "-m", "bertjax.tools.benchmark", *args, "--compare", name,
            "--reference_only"]
  p = run_process(argv, dict(os.environ, **s["env"]), timeout)
  result = last_json(p)
  row = {"name": name, "kind": "reference", "started": p["started"], "ended": p["ended"],
         "command": argv}
  if result is None:
    return {**row, **failure(p, timeout)}
  return {**row, "status": "ok", **result, "compile_time_s": result.get("first_step_s")}


def run_variant(base: dict, variant: dict, timeout: float) -> dict:
  s = settings(base, variant)
  timeout = float(variant.get("timeout") or timeout)
  row = {"name": s["name"], "kind": s["kind"], "settings": {k: s.get(k) for k in FLOP_KEYS}}
  workdir = None
  if s["kind"] == "trainer":
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="bertjax-ablate-"))
    argv = trainer_args(s, str(workdir))
  elif s["kind"] == "command":
    argv = fill(s["command"])
  else:
    argv = [sys.executable, "-m", "bertjax.tools.benchmark", *benchmark_args(s)]
  try:
    p = run_process(argv, environment(s), timeout)
    slots = (s["batch_size"] * s["seq_len"]) if s.get("batch_size") and s.get("seq_len") else None
    result = trainer_figures(workdir, slots) if workdir and p["rc"] == 0 else last_json(p)
  finally:
    if workdir:
      shutil.rmtree(workdir, ignore_errors=True)
  row.update(started=p["started"], ended=p["ended"], command=argv, env=s["env"],
             xla_flags=s["xla_flags"])
  if result is None:
    return {**row, **failure(p, timeout)}
  return {**row, "status": "ok", **result}


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


def format_table(title: str, base: dict, references: list[dict], rows: list[dict]) -> str:
  s = settings(base, {})
  ok_refs = [r for r in references if r["status"] == "ok"]
  device = next((r.get("device") for r in rows if r.get("device")), "not yet measured")
  shapes = ", ".join(f"{k} {s[k]}" for k in ("preset", "config", "batch_size", "seq_len", "dtype")
                     if s.get(k))
  head = ["variant", "kind", "tokens/s", "MFU", "step ms", "peak MiB", "compile s"]
  head += [f"vs {r['name']}" for r in references] + ["note"]
  lines = [f"# {title}", "", f"Base: {shapes}; device: {device}; references at the base shapes.",
           "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for row in references + rows:
    ok = row["status"] == "ok"
    cells = [row["name"], row["kind"]]
    if ok:
      peak = row.get("peak_memory_bytes")
      cells += [_fmt(row["tokens_per_s"], ",.0f"), _fmt(row.get("mfu"), ".3f"),
                _fmt(row["step_time_s"] * 1e3 if row.get("step_time_s") else None, ".1f"),
                _fmt(peak / 2**20 if peak else None, ",.0f"),
                _fmt(row.get("compile_time_s"), ".1f")]
      cells += [f"{row['tokens_per_s'] / r['tokens_per_s']:.2f}x" if r in ok_refs else "-"
                for r in references]
      note = f"MFU from {row['mfu_from']}'s FLOPs" if row.get("mfu_from") else ""
    else:
      cells += ["-"] * (5 + len(references))
      note = f"{row['status']}: {row['error']}"
    cells.append(note.replace("|", "/")[:200])
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def run_ablation(spec_name: str, output: str | None = None, timeout: float | None = None) -> dict:
  """Runs the spec (references first, then each variant) and writes the table; returns every
  row."""
  spec = load_spec(spec_name)
  base, variants = spec["base"], spec["variants"]
  title = base.get("title") or f"Ablation {spec_name}"
  timeout = float(timeout or base.get("timeout") or DEFAULT_TIMEOUT_S)
  out = pathlib.Path(output) if output else None
  record = {"spec": spec_name, "base": base, "references": [], "rows": []}

  def save():
    table = format_table(title, base, record["references"], record["rows"])
    if out:
      out.parent.mkdir(parents=True, exist_ok=True)
      paths.replace_text(out, table)
      paths.replace_text(out.with_suffix(".json"), json.dumps(record, indent=1, default=str))
    return table

  for name in settings(base, {})["references"]:
    print(f"reference {name} ...", flush=True)
    record["references"].append(run_reference(base, name, timeout))
    save()
  for variant in variants:
    print(f"variant {variant['name']} ...", flush=True)
    row = run_variant(base, variant, timeout)
    record["rows"].append(row)
    for other in record["rows"]:  # a step row may come after its trainer row
      if other["kind"] == "trainer" and other["status"] == "ok" and "mfu" not in other:
        trainer_mfu(other, record["rows"])
    print(f"  {row['status']}" + (f": {row['tokens_per_s']:,.0f} tokens/s" if row["status"] == "ok"
                                  else f": {row['error']}"), flush=True)
    save()
  print(save(), end="")
  return record
