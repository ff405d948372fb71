"""Loading experiment configs: `configs/<exp>.py[:arg]` plus `--config.key=value` overrides.

A config file defines `get_config(arg: str | None) -> ml_collections.ConfigDict`. The result is
locked, so a misspelled override key fails with the list of close valid keys instead of
silently adding a field; values are parsed to the type the field already has.
"""

from __future__ import annotations

import ast
import copy
import difflib
import importlib.util
import json
import pathlib
from typing import Any, Iterable

import ml_collections

from bertjax.core.errors import fail
from bertjax.models.config import ModelConfig


def load_module(file: pathlib.Path, kind: str = "config"):
  """The Python file `file` (a `kind` file: a config, a sweep, or a helper such as
  configs/common.py) as a module. A syntax error in it (or in a file it imports) is one line
  naming the file and line; a file that is not Python (.json, .txt) is one line too."""
  if file.suffix != ".py":
    fail(f"{kind} file {file} is not a Python file (.py): a {kind} file is Python code; fix: "
         f"pass a .py {kind} file")
  module_spec = importlib.util.spec_from_file_location(
      f"bertjax_{kind.replace(' ', '_')}_{file.stem}", file)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
  except SyntaxError as e:  # IndentationError and TabError too
    where = f"{e.filename or file}:{e.lineno}" if e.lineno else str(e.filename or file)
    fail(f"{where}: {e.msg} (a syntax error in the {kind} file); fix that line")
  return module


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """`path/to/config.py[:arg]` -> the locked ConfigDict its `get_config(arg)` returns."""
  path, _, arg = spec.partition(":")
  file = pathlib.Path(path)
  if not file.is_file():
    fail(f"config file {path} not found; pass an existing file such as configs/quickstart.py")
  module = load_module(file)
  if not hasattr(module, "get_config"):
    fail(f"config file {path} defines no get_config(arg); add one returning a ConfigDict")
  config = module.get_config(arg or None)
  config.lock()
  return config


def _all_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  keys = []
  for k, v in config.items():
    keys.append(prefix + k)
    if isinstance(v, ml_collections.ConfigDict):
      keys += _all_keys(v, prefix + k + ".")
  return keys


def _optional_model_keys(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """{"model.NAME": default} of the model fields a config leaves out while they are off
  (`ModelConfig.OPTIONAL_FIELDS`, absent from its records too): they can still be set."""
  model = config.get("model") if isinstance(config, ml_collections.ConfigDict) else None
  if not isinstance(model, ml_collections.ConfigDict):
    return {}
  return {f"model.{name}": default for name, default in ModelConfig.OPTIONAL_FIELDS.items()
          if name not in model}


def _parse_value(key: str, text: str, current: Any) -> Any:
  if isinstance(current, ml_collections.ConfigDict):
    fail(f"--config.{key} is a group of settings ({', '.join(current)}), not one; set each on "
         f"its own, e.g. --config.{key}.{next(iter(current), 'NAME')}=VALUE")
  if isinstance(current, str) or (current is None and not _looks_literal(text)):
    # A quoted string (as written from Python or a sweep file) means its contents.
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
      return text[1:-1]
    return text
  try:
    value = literal(text)
  except (ValueError, SyntaxError):
    if current is None:
      return text
    if isinstance(current, (list, tuple)):
      fail(f"--config.{key}={text!r} is not a Python list literal; fix: quote one for the shell, "
           f"e.g. --config.{key}='{list(current) or '[...]'}'" + (
               " with entries dict(name=\"metric_sums\", every=1000)" if key == "evals" else ""))
    fail(f"--config.{key}={text!r} is not a valid {type(current).__name__}; "
         f"give a value like {current!r}")
  if current is None:
    return value
  if isinstance(current, bool) and not isinstance(value, bool):
    fail(f"--config.{key}={text!r} must be True or False")
  if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if isinstance(current, tuple) and isinstance(value, list):
    value = tuple(value)
  if isinstance(current, (list, tuple)) and isinstance(value, (list, tuple)):
    return type(current)(value)
  if type(value) is not type(current):
    fail(f"--config.{key}={text!r} has type {type(value).__name__}, but the setting is a "
         f"{type(current).__name__} (default {current!r})")
  return value


class _DictCalls(ast.NodeTransformer):
  """`dict(name="glue_probe", every=1000)`, as a config file writes it, read as the dict literal
  `{"name": "glue_probe", "every": 1000}`."""

  def visit_Call(self, node: ast.Call) -> ast.AST:
    self.generic_visit(node)
    if isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args and all(
        k.arg for k in node.keywords):
      return ast.Dict(keys=[ast.Constant(k.arg) for k in node.keywords],
                      values=[k.value for k in node.keywords])
    return node


def literal(text: str) -> Any:
  """A Python literal, where `dict(key=value, ...)` may stand for a dict (config files' way of
  writing `config.evals`' entries); anything else raises as `ast.literal_eval` does."""
  tree = _DictCalls().visit(ast.parse(text.strip(), mode="eval"))
  return ast.literal_eval(tree)


def _looks_literal(text: str) -> bool:
  try:
    literal(text)
    return True
  except (ValueError, SyntaxError):
    return False


# Where a config keeps the keys its overrides set: an attribute of the object, outside its
# fields, so config.json, the workdir comparison and `to_dict` never see it.
_SET_KEYS = "_bertjax_overridden"


def overridden(config: ml_collections.ConfigDict) -> frozenset[str]:
  """The keys `apply_overrides` set on `config` (the command line's `--config.key=value`): the
  run-start checks tell a setting the user gave from one the config file holds."""
  return frozenset(getattr(config, _SET_KEYS, None) or ())


def copy_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A deep copy of `config` that keeps the record of its overridden keys."""
  new = copy.deepcopy(config)
  object.__setattr__(new, _SET_KEYS, overridden(config))
  return new


def apply_overrides(config: ml_collections.ConfigDict, overrides: Iterable[str]) -> None:
  """Applies `key.sub=value` strings (with or without a leading `--config.`) in place; the keys
  set are recorded (`overridden`)."""
  optional = _optional_model_keys(config)
  valid = _all_keys(config) + list(optional)
  for item in overrides:
    item = item.removeprefix("--").removeprefix("config.")
    key, sep, text = item.partition("=")
    if not sep:
      fail(f"override {item!r} has no value; write --config.{key}=VALUE")
    if key not in valid:
      close = difflib.get_close_matches(key, valid, n=3)
      hint = f"; did you mean {', '.join(close)}?" if close else "; see the config file for valid keys"
      fail(f"unknown config key {key!r}{hint}")
    parent, _, leaf = key.rpartition(".")
    node = config
    for part in filter(None, parent.split(".")):
      node = node[part]
    value = _parse_value(key, text, node[leaf] if leaf in node else optional[key])
    try:
      with node.ignore_type(), node.unlocked():
        node[leaf] = value
    except (TypeError, KeyError, ValueError) as e:
      fail(f"cannot set config key {key!r} to {text!r}: {e}")
    object.__setattr__(config, _SET_KEYS, overridden(config) | {key})


def to_json(config: ml_collections.ConfigDict) -> str:
  return json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str)
