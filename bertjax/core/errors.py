"""User-facing errors: one clear line, a non-zero exit, no traceback.

Anything a user can cause (a bad config key, a missing file, malformed data, a wrong mesh, a
corrupt checkpoint) raises `UserError` with a message that names the problem and the fix.
Command-line entry points wrap their `main` in `run_cli`, which prints that one line to stderr
and exits with the error's status; genuine bugs still surface as tracebacks (status 1).

Exit statuses of every command (README, "Exit statuses"):
  0   finished
  1   a bug: a Python traceback (please report it)
  2   a user error: the one line says what to change (nothing of an earlier run was changed);
      also a full disk: the one line names the file and the space that was needed
  3   the run diverged (a non-finite loss or gradient): the last finite checkpoint is kept
  75  preempted (SIGTERM): the steps trained are saved (a checkpoint, where a step was trained
      since the last one), run the same command again to go on
  69  another process of a multi-process run was lost (bertjax/runtime/distributed.py); the same
      command on every host resumes from the last complete checkpoint
  130 interrupted (Ctrl-C), handled as SIGTERM is: the step under way finishes and is saved, run
      the same command again to go on; a second Ctrl-C stops at once
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import shutil
import sys
from typing import Callable, NoReturn

from etils import epath


EXIT_USER_ERROR = 2
EXIT_DIVERGED = 3
EXIT_PREEMPTED = 75  # sysexits' EX_TEMPFAIL: a temporary failure, the caller is invited to retry
EXIT_INTERRUPTED = 130


class UserError(Exception):
  """An error caused by the user's input; its message is the whole report."""
  exit_code = EXIT_USER_ERROR
  label = "error"  # the word before the message on its one line


class Diverged(UserError):
  """The loss or the gradients became non-finite; the message names the step and likely cause."""
  exit_code = EXIT_DIVERGED


class Preempted(BaseException):
  """SIGTERM stopped the run where nothing needed saving; the message says where and how to go
  on (bertjax/runtime/preemption.py). Not an `Exception`, as KeyboardInterrupt is not: the handlers
  that turn a failed read into a fallback (a damaged checkpoint, a missing optional file) let it
  through."""
  exit_code = EXIT_PREEMPTED
  label = "preempted"


class Interrupted(Preempted):
  """Ctrl-C (SIGINT) stopped the run, handled as a SIGTERM is; exit 130."""
  exit_code = EXIT_INTERRUPTED
  label = "interrupted"


def fail(message: str) -> NoReturn:
  raise UserError(message)


class DiskFull(UserError):
  """A write met a full disk, a quota or a file-size limit; what was written before is kept."""


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def disk_full(path: str | os.PathLike | None, error: OSError, size: int | None = None
              ) -> NoReturn:
  """One line for a write that found no space: the path, the bytes being written when known,
  and the fix. Raised from `error`, so a traceback (a bug's) would still show where."""
  reason = {errno.EDQUOT: "the disk quota is exceeded",
            errno.EFBIG: "the file is larger than the file-size limit (ulimit -f)"}.get(
                error.errno, "no space is left on the device")
  need = f" ({_size(size)} being written)" if size else ""
  raise DiskFull(f"cannot write {os.fspath(path) if path else 'a file'}: {reason}{need}; "
                 "files written before are kept: free space there (or point the output at "
                 "another disk) and run the same command again") from error


def disk_reason(error: OSError) -> str:
  """What a full disk, quota or file-size limit (`disk_error_of`) is, as a checkpoint's line
  says it."""
  return {errno.EDQUOT: "the disk quota is exceeded",
          errno.EFBIG: "a file is larger than the file-size limit (ulimit -f)"}.get(
              error.errno, "no space left on the device")


def free_space(directory: str | os.PathLike) -> str:
  """The space free on `directory`'s disk, in words ("unknown space" for a remote store)."""
  if "://" in os.fspath(directory):
    return "unknown space"
  try:
    return size_in_gib(shutil.disk_usage(os.fspath(directory)).free)
  except OSError:
    return "unknown space"


def size_in_gib(nbytes: int) -> str:
  """A checkpoint-sized figure: GiB with two decimals, else MiB with one."""
  return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def _size(n: int) -> str:
  for unit in ("bytes", "KiB", "MiB", "GiB"):
    if n < 1024 or unit == "GiB":
      return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
    n /= 1024
  return f"{n} bytes"


def disk_error_of(error: BaseException) -> OSError | None:
  """The disk-full OSError that caused `error` (itself or along its causes), if any; also one
  that a library only reported in words (tensorstore's and ArrayRecord's errors carry the C
  library's message, not an OSError)."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
      return error
    for code in DISK_FULL_ERRNOS:
      if not isinstance(error, OSError) and os.strerror(code) in str(error):
        return OSError(code, os.strerror(code), _named_path(str(error)))
    if not isinstance(error, OSError) and "ENOSPC" in str(error):  # a remote store's client
      return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), _named_path(str(error)))
    error = error.__cause__ or error.__context__
  return None


# A path or URL that starts a word (not a tensor's name such as "params.w/0.0" in TensorStore's
# `Error writing "params.w/0.0" in OCDBT database at local file "/runs/a/..."`).
_PATH = re.compile(r"(?:^|(?<=[\s\"'(]))((?:[a-z0-9]+://|/)[^\s'\"\[\],;]+)")


def _named_path(text: str) -> str | None:
  """The file a library's error names: the one it failed writing, else the first path."""
  for pattern in (r'Failed writing: "([^"]+)"', r'local file "([^"]+)"'):
    if found := re.search(pattern, text):
      return found.group(1)
  found = _PATH.search(text)
  return found.group(1).rstrip(":.") if found else None


def read_text(path: str | os.PathLike, what: str = "file") -> str:
  """The whole of `path` decoded as UTF-8 (a leading byte-order mark dropped; line ends kept as
  they are); local or remote (gs://...). A missing or unreadable file, or bytes that are not
  UTF-8, fail with one line that names the file, the line and the byte offset of the first bad
  byte."""
  path = os.fspath(path)
  try:
    with epath.Path(path).open("rb") as f:
      data = f.read()
  except OSError as e:
    fail(f"cannot read {what} {path} ({e.strerror or type(e).__name__}); check the path")
  try:
    return data.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    start = e.start + len(data) - len(e.object)  # e.object lacks a byte-order mark
    head = data[:start]
    line = head.count(b"\n") + head.count(b"\r") - head.count(b"\r\n") + 1
    fail(f"{path}:{line}: byte {start} (0x{data[start]:02x}) is not valid UTF-8 "
         f"({e.reason}); save the {what} as UTF-8 (e.g. iconv -f latin1 -t utf-8)")


def run_cli(main: Callable[[], object]) -> None:
  """Runs `main`, turning a `UserError` into one line on stderr and its exit status (2 unless
  the error says otherwise: 3 diverged, 75 preempted)."""
  try:
    try:
      main()
    except Exception as e:  # a full disk in a library's own writer (orbax, ArrayRecord, ...)
      full = None if isinstance(e, UserError) else disk_error_of(e)
      if full is None:
        raise
      disk_full(full.filename, full)
  except (UserError, Preempted) as e:
    print(f"{e.label}: {e}", file=sys.stderr)
    sys.exit(e.exit_code)
  except KeyboardInterrupt:
    print("error: interrupted", file=sys.stderr)
    sys.exit(EXIT_INTERRUPTED)


def doc_summary(doc: str | None) -> str:
  """The first paragraph of a module docstring on one line: a command's --help description
  (its first line alone may stop mid-sentence)."""
  return " ".join((doc or "").strip().split("\n\n", maxsplit=1)[0].split())


class ArgumentParser(argparse.ArgumentParser):
  """An ArgumentParser whose usage errors are one-line `UserError`s (exit status 2 via run_cli)."""

  def error(self, message: str):
    fail(f"{message}; see {self.prog} --help")
