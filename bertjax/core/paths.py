"""Workdir paths, local or remote (gs://, s3://, ...): one type, `etils.epath.Path`.

A local path goes through the os (the same bytes plain `open` writes); a remote one through
epath's backend (fsspec: gcsfs for gs://; tf.io.gfile where TensorFlow is installed), which orbax
uses too. What object stores lack is done here, once:
- appending: an object cannot grow, so `append_text` reads it, adds, and writes it whole (fine
  for a file appended once per resume, changes.jsonl; metric rows, appended at every logging
  event, are one object each instead: bertjax/runtime/metric_writers.py);
- libraries that read or write only local files (ArrayRecord, sentencepiece, tokenizers,
  tensorboardX) get a local folder: `writing` uploads it when done, `reading` downloads a
  remote folder into a local cache (kept while its files' sizes are unchanged).
Every file written into a workdir or an output folder goes through `replace_bytes` (whole or not
at all; a full disk is one line naming the file), and every such folder argument through
`check_output_folder` before anything is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import shutil
import tempfile
from typing import Iterator

from etils import epath

from bertjax.core.errors import DISK_FULL_ERRNOS, disk_full, fail

Path = epath.Path
_UMASK = os.umask(0o022)  # read once, at import (reading it means setting it)
os.umask(_UMASK)
CACHE_ENV = "BERTJAX_REMOTE_CACHE"  # where `reading` keeps local copies (default: the temp dir)


def as_path(path: str | os.PathLike) -> epath.Path:
  try:
    return epath.Path(path)
  except KeyError:  # a URL scheme epath has no class for
    fail(f"{path}: etils.epath reads no {os.fspath(path).split('://')[0]}:// paths; fix: use a "
         "local path or gs://, s3://, az://")


def is_remote(path: str | os.PathLike) -> bool:
  """True for a URL (gs://bucket/run), False for a local path."""
  return "://" in os.fspath(path)


def absolute(path: str | os.PathLike) -> epath.Path:
  path = as_path(path)
  return path if is_remote(path) else path.absolute()


def append_text(path: epath.Path, text: str) -> None:
  """Adds `text` at the end of the file (created if absent). Remote, the whole file is uploaded
  again: for files appended rarely (once per resume), not at every step. A line torn by a full
  disk is dropped by its readers (bertjax/runtime/metric_writers.py); the disk error is one line."""
  with disk_errors(path, len(text.encode())):
    if not is_remote(path):
      with open(path, "a", encoding="utf-8") as f:
        f.write(text)
      return
    old = path.read_text() if path.exists() else ""
    path.write_text(old + text)


def replace_text(path: epath.Path, text: str) -> None:
  """`replace_bytes` of `text` in UTF-8."""
  replace_bytes(path, text.encode("utf-8"))


def replace_bytes(path: str | os.PathLike, data: bytes) -> None:
  """Writes the whole file so a reader sees the old or the new one, never a part: locally a
  temporary file in the same folder, flushed to the disk, then renamed over it; an object
  store's single write already is. Every file bertjax writes into a workdir or an output folder
  goes through here, so a full disk never leaves one truncated (and says so in one line)."""
  path = as_path(path)
  with disk_errors(path, len(data)):
    if is_remote(path):
      path.write_bytes(data)
      return
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
      os.fchmod(fd, 0o666 & ~_UMASK)  # as open() would create it (mkstemp makes it private)
      with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
      os.replace(tmp, path)
    except BaseException:
      with contextlib.suppress(OSError):
        os.unlink(tmp)
      raise


def copy_file(src: str | os.PathLike, dst: str | os.PathLike) -> None:
  """Copies `src` to `dst` with `replace_bytes` (whole or not at all)."""
  replace_bytes(dst, as_path(src).read_bytes())


@contextlib.contextmanager
def disk_errors(path: str | os.PathLike, size: int | None = None) -> Iterator[None]:
  """Turns a full disk (or quota, or file-size limit) met while writing `path` into one line
  naming it and the bytes that were being written."""
  try:
    yield
  except OSError as e:
    if e.errno not in DISK_FULL_ERRNOS:
      raise
    disk_full(path, e, size)



# The repository's folders of code and settings: no run writes into them.
SOURCE_FOLDERS = ("bertjax", "configs", "experiments", "tests")


def check_output_folder(folder: str | os.PathLike | None, flag: str = "--workdir") -> None:
  """Refuses, before anything is written, a folder that cannot be meant: none or empty (an unset
  shell variable), the filesystem root, the home folder, this repository's own folder or one of
  its source folders (the package, configs, experiments, tests), or a file."""
  text = "" if folder is None else os.fspath(folder)
  if not text.strip():
    fail(f"{flag} is empty (an unset shell variable?); fix: pass the folder to write, e.g. "
         f"{flag} runs/my_run")
  if is_remote(text):
    if not text.split("://", 1)[1].strip("/"):
      fail(f"{flag} {text} names no bucket or folder; fix: pass one, e.g. {flag} "
           f"{text.split('://')[0]}://BUCKET/runs/my_run")
    return
  path = pathlib.Path(text).expanduser().absolute().resolve()
  home = pathlib.Path.home().resolve()
  repo = pathlib.Path(__file__).resolve().parent.parent.parent
  named = {pathlib.Path(path.anchor): "the filesystem root", home: "your home folder",
           repo: "this repository's folder"}
  if path in named:
    fail(f"{flag} {text} is {named[path]}: a run would scatter its files there; fix: pass a "
         f"new folder, e.g. {flag} {os.path.join(text, 'runs', 'my_run')}")
  for source in SOURCE_FOLDERS:
    if path == repo / source or (repo / source) in path.parents:
      fail(f"{flag} {text} is inside this repository's {source}/ folder (source code); fix: pass "
           f"a folder outside it, e.g. {flag} runs/my_run")
  if path.exists() and not path.is_dir():
    fail(f"{flag} {text} is a file, not a folder; fix: pass a folder to {flag}")


def rmtree(path: epath.Path) -> None:
  """Removes a folder and what it holds; nothing when it is absent."""
  if path.exists():
    path.rmtree()


def upload(local: pathlib.Path, remote: epath.Path, last: tuple[str, ...] = ()) -> None:
  """Copies the folder `local` into `remote` (files named in `last` after all the others, so
  their presence marks the copy complete)."""
  files = sorted(p for p in pathlib.Path(local).rglob("*") if p.is_file())
  files = ([p for p in files if p.name not in last] + [p for p in files if p.name in last])
  for src in files:
    dst = remote / src.relative_to(local).as_posix()
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(src.read_bytes())


@contextlib.contextmanager
def writing(folder: epath.Path, last: tuple[str, ...] = (), replace: bool = False
            ) -> Iterator[pathlib.Path]:
  """A local folder to write `folder`'s files in: `folder` itself when local, else a temporary
  one uploaded to it on success (with `replace`, what `folder` held is removed first)."""
  if not is_remote(folder):
    yield pathlib.Path(folder)
    return
  with tempfile.TemporaryDirectory(prefix="bertjax-upload-") as tmp:
    yield pathlib.Path(tmp)
    if replace:
      rmtree(folder)
    upload(pathlib.Path(tmp), folder, last)


@contextlib.contextmanager
def writing_whole(folder: epath.Path, last: tuple[str, ...] = ()) -> Iterator[pathlib.Path]:
  """`writing`, all or nothing: locally a hidden folder beside `folder`, moved over it on
  success and removed on failure; remotely `folder` is replaced, the files in `last` uploaded
  last (their presence marks it complete)."""
  if is_remote(folder):
    with writing(folder, last, replace=True) as local:
      yield local
    return
  target = pathlib.Path(folder)
  staging = target.with_name(f".{target.name}.partial-{os.getpid()}")
  shutil.rmtree(staging, ignore_errors=True)
  staging.mkdir(parents=True)
  try:
    yield staging
    with disk_errors(target):
      shutil.rmtree(target, ignore_errors=True)  # a part an older run left
      os.replace(staging, target)
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def reading(folder: epath.Path) -> pathlib.Path:
  """`folder` as a local path: itself when local, else a local copy of it, copied again when a
  file's size or modification time differs from the copy's record (or the copy is partial)."""
  if not is_remote(folder):
    return pathlib.Path(folder)
  root = pathlib.Path(os.environ.get(CACHE_ENV) or tempfile.gettempdir()) / "bertjax-remote"
  local = root / hashlib.sha256(os.fspath(folder).encode()).hexdigest()[:20]
  listing = _listing(folder)
  record = local / _LISTING
  if record.is_file() and json.loads(record.read_text()) == listing:
    return local
  partial = local.with_name(local.name + f".partial-{os.getpid()}")
  shutil.rmtree(partial, ignore_errors=True)
  for name in listing:
    dst = partial / name
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes((folder / name).read_bytes())
  partial.mkdir(parents=True, exist_ok=True)
  (partial / _LISTING).write_text(json.dumps(listing))
  shutil.rmtree(local, ignore_errors=True)
  try:
    os.replace(partial, local)
  except OSError:  # another process of this host placed its copy first
    shutil.rmtree(partial, ignore_errors=True)
    if not (record.is_file() and json.loads(record.read_text()) == listing):
      raise
  return local


_LISTING = ".bertjax-listing.json"  # in a local copy: the remote files' [size, mtime] it was made from


def _listing(folder: epath.Path, prefix: str = "") -> dict[str, list[int]]:
  """Relative file name -> [size, modification time] of every file under `folder`."""
  out = {}
  for path in sorted(folder.iterdir()):
    if path.is_dir():
      out.update(_listing(path, f"{prefix}{path.name}/"))
    else:
      stat = path.stat()
      out[prefix + path.name] = [stat.length, stat.mtime]
  return out
