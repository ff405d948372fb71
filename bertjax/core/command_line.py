"""The command lines of bertjax's tools on absl flags, each mistake one line (exit 2).

A tool defines its flags on a `flags.FlagValues` of its own (not absl's global one, so a test can
parse several command lines in one process) and calls `parse`:

  def define(fv):
    flags.DEFINE_string("output", None, "folder to write", flag_values=fv)
  fv, positional = command_line.parse(argv, define, prog="python -m bertjax.x", doc=__doc__,
                                      required=["output"])

`--help` prints the usage, the module's first paragraph and the flags, then exits 0; a flag that
is unknown, missing or malformed, or a stray argument, is a `UserError` whose one line ends with
"see PROG --help". `--flagfile` reads flags from a file, as for launch.py. A tool that takes a
config file uses `define_config_file`: ml_collections' config flag (`file.py[:variant]`,
`--config.key=value`), its loading errors one line.
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence

import ml_collections
from absl import flags
from ml_collections import config_flags

from bertjax.core.errors import doc_summary, fail

HELP_FLAGS = ("--help", "-h", "--helpfull")


def parse(argv: Sequence[str], define: Callable[[flags.FlagValues], None], *, prog: str,
          doc: str | None, positional: Sequence[str] = (), required: Sequence[str] = (),
          usage: str | None = None) -> tuple[flags.FlagValues, list[str]]:
  """(the parsed flags, the positional arguments: exactly `positional`'s names, in order).
  The flags named in `required` must be given."""
  argv = list(argv)
  fv = flags.FlagValues()
  define(fv)
  usage = usage or " ".join([prog, *positional, *(f"--{n}=..." for n in required),
                            "[--flag=value ...]"])
  if set(HELP_FLAGS) & set(argv):
    print(help_text(fv, usage, doc))
    raise SystemExit(0)
  try:
    argv = fv.read_flags_from_files([prog, *argv], force_gnu=False)
    rest = fv(argv)[1:]
  except flags.IllegalFlagValueError as e:
    fail(f"{_enum_words(fv, e) or _one_line(e)}; see {prog} --help")
  except flags.Error as e:
    fail(f"{_one_line(e)}; see {prog} --help")
  if len(rest) > len(positional):
    fail(f"unrecognized arguments: {' '.join(rest[len(positional):])}; see {prog} --help")
  if len(rest) < len(positional):
    fail(f"give {' '.join(positional[len(rest):])}; see {prog} --help")
  missing = [f"--{name}" for name in required if fv[name].value is None]
  if missing:
    fail(f"the following arguments are required: {', '.join(missing)}; see {prog} --help")
  return fv, rest


def help_text(fv: flags.FlagValues, usage: str, doc: str | None) -> str:
  """usage, the description (the docstring's first paragraph, whole) and the flags."""
  lines = ["options:"]
  for flag in _in_order(fv):
    default = "" if flag.default in (None, "", []) else f" (default: {flag.default_as_str})"
    lines.append(f"  --{flag.name}: {flag.help}{default}")
  return f"usage: {usage}\n\n{doc_summary(doc)}\n\n" + "\n".join(lines)


def _in_order(fv: flags.FlagValues) -> list[flags.Flag]:
  """The flags as they were defined (absl keeps them by name)."""
  seen, ordered = set(), []
  for module_flags in fv.flags_by_module_dict().values():
    for flag in module_flags:
      if flag.name not in seen:
        seen.add(flag.name)
        ordered.append(flag)
  return ordered


def _one_line(e: Exception) -> str:
  return " ".join(str(e).split()).rstrip(".")


def _enum_words(fv: flags.FlagValues, e: Exception) -> str | None:
  """An enum flag's bad value as "invalid choice", naming the choices."""
  for flag in _in_order(fv):
    values = getattr(flag.parser, "enum_values", None)
    if values and f"--{flag.name}=" in str(e):
      given = str(e).split(f"--{flag.name}=", 1)[1].split(":", 1)[0]
      return f"--{flag.name}: invalid choice {given!r}; choose one of {', '.join(values)}"
  return None


class OneLineConfigErrors(flags.ArgumentParser):
  """config_flags' loader of `--config` (`file.py[:variant]` -> `get_config(variant)`, locked);
  a file that is missing, does not parse or defines no get_config fails with `explain`'s one line
  (config_lib.load_config_file raises it) instead of a traceback (or a config that fails only
  when first read); a get_config that raises is a traceback, as any bug."""

  def __init__(self, loader: flags.ArgumentParser, explain: Callable[[str], object]):
    self.loader, self.explain = loader, explain

  def parse(self, argument):
    if not str(argument).partition(":")[0].endswith(".py"):
      self.explain(argument)  # a .json or .txt would run as Python: its one line instead
    try:
      config = self.loader.parse(argument)
    except (SyntaxError, AttributeError, TypeError, ValueError):
      config = None
    if not isinstance(config, ml_collections.ConfigDict):  # also the missing file's stand-in
      try:
        self.explain(argument)  # raises the one line naming the problem
      except (TypeError, ValueError) as e:  # a bug in get_config: its traceback, not a flag error
        raise RuntimeError(f"get_config of {argument} failed") from e
    return config

  def flag_type(self):
    return self.loader.flag_type()


def define_config_file(fv: flags.FlagValues, argv: Sequence[str], help_text_: str,
                       explain: Callable[[str], object], name: str = "config") -> None:
  """ml_collections' `--config file.py[:variant]` flag on `fv` (with `--config.key=value`
  overrides of its own, read from `argv`), its loading errors `explain`'s one line."""
  sys.modules.pop(f"{name}_config", None)  # config_flags' module name for the file: a fresh one
  config_flags.DEFINE_config_file(name, None, help_text_, flag_values=fv, sys_argv=list(argv))
  fv[name].parser = OneLineConfigErrors(fv[name].parser, explain)
