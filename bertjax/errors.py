"""User-facing errors: one clear line, a non-zero exit, no traceback.

Anything a user can cause (a bad config key, a missing file, malformed data, a wrong mesh, a
corrupt checkpoint) raises `UserError` with a message that names the problem and the fix.
Command-line entry points wrap their `main` in `run_cli`, which prints that one line to stderr
and exits with status 2; genuine bugs still surface as tracebacks.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, NoReturn


class UserError(Exception):
  """An error caused by the user's input; its message is the whole report."""


def fail(message: str) -> NoReturn:
  raise UserError(message)


def run_cli(main: Callable[[], object]) -> None:
  """Runs `main`, turning a `UserError` into one line on stderr and exit status 2."""
  try:
    main()
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except KeyboardInterrupt:
    print("error: interrupted", file=sys.stderr)
    sys.exit(130)


class ArgumentParser(argparse.ArgumentParser):
  """An ArgumentParser whose usage errors are one-line `UserError`s (exit status 2 via run_cli)."""

  def error(self, message: str):
    fail(f"{message}; see {self.prog} --help")
