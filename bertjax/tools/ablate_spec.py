"""An ablation spec: its keys and their types, its checks (one line each), and the command each
row runs (the benchmark's flags, launch.py's for a trainer row). The keys are described in
bertjax/tools/ablate.py's docstring, which `--help` prints."""

from __future__ import annotations

import json
import pathlib
import sys

from bertjax.config import config_lib
from bertjax.core.errors import UserError, fail, read_text
from bertjax.data import ragged

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
SETS_DIR = REPO / "experiments" / "ablations"
NAMED_SETS = ("h100-bert-base", "h100-bert-base-more", "bert-large-512", "modernbert-base-1024",
              "cpu-smoke")
KINDS = ("step", "trainer", "command")
REFERENCES = ("hf-torch", "hf-torch-compile")
DEFAULT_TIMEOUT_S = 900.0
# key: the types its value may take. Base and variants alike, unless listed below.
SETTINGS = {
    "kind": (str,), "preset": (str,), "config": (str,), "trainer_config": (str,),
    "batch_size": (int,), "seq_len": (int,), "dtype": (str,), "steps": (int,),
    "objective": (str,), "remat": (bool, str), "scan_layers": (bool,), "overrides": (list,),
    "env": (dict,), "xla_flags": (list,), "timeout": (int, float), "trainer_steps": (int,),
    "command": (list,), "lengths": (str,), "pack": (bool,),
}
BASE_ONLY = {"references": (list,), "reference_steps": (int,), "reference_command": (list,),
             "title": (str,), "budget": (int, float)}
VARIANT_ONLY = {"name": (str,)}
DEFAULTS = {"kind": "step", "preset": "bert-base", "steps": 20, "overrides": [], "env": {},
            "xla_flags": [], "trainer_steps": 120, "references": list(REFERENCES)}
# The keys that decide the FLOPs of a step: a trainer row takes its MFU from a step row whose
# keys match.
FLOP_KEYS = ("preset", "config", "objective", "batch_size", "seq_len", "dtype", "remat",
             "scan_layers", "overrides", "lengths", "pack")


# ------------------------------------------------------------------------------ the spec


def _check_entry(entry, allowed: dict, where: str) -> None:
  if not isinstance(entry, dict):
    fail(f"ablation spec: {where} must be a dict of settings, not {type(entry).__name__}")
  for key, value in entry.items():
    if key not in allowed:
      fail(f"ablation spec: unknown key {key!r} in {where}; use {', '.join(sorted(allowed))}")
    types = allowed[key]
    if value is None:
      fail(f"ablation spec: {where}: {key} is null; give "
           f"{' or '.join(t.__name__ for t in types)} or leave the key out for its default")
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


def _check_rows(s: dict, where: str) -> None:
  """`lengths` and `pack`: a known distribution, on a step row (the benchmark's batches)."""
  if s.get("lengths") is None and s.get("pack") is None:
    return
  if s["kind"] != "step":
    fail(f"ablation spec: {where}: lengths and pack set the benchmark's rows, not a {s['kind']} "
         "row's; move them to step variants")
  try:
    distribution = ragged.parse(s.get("lengths") or "full")
  except UserError as e:
    fail(f"ablation spec: {where}: {e}")
  if s.get("pack") is not None and distribution is None:
    fail(f"ablation spec: {where}: pack={s['pack']} needs ragged rows; give lengths too "
         "(e.g. 'wikitext2')")


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
    _check_rows(settings(base, variant), f"{source} variant {name!r}")
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
      spec = json.loads(read_text(path, "ablation spec"))
    except json.JSONDecodeError as e:
      fail(f"ablation spec {path}: not valid JSON ({e})")
  elif path.suffix == ".py":
    try:
      module = config_lib.load_module(path, kind="ablation spec")
    except UserError:
      raise  # a syntax error: already one line naming the file and line
    except Exception as e:  # pylint: disable=broad-except  # any error in the user's file
      fail(f"ablation spec {path}: {type(e).__name__}: {e}")
    except SystemExit as e:  # sys.exit() in the spec would end the ablation as "finished"
      fail(f"ablation spec {path} called sys.exit({e.code!r}) while loading; a spec defines "
           "BASE and VARIANTS and runs nothing")
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
  if s.get("lengths") is not None:
    args += ["--lengths", s["lengths"]]
  if s.get("pack") is not None:
    args.append("--pack" if s["pack"] else "--no-pack")
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
