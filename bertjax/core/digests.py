"""Checkpoint digests: a record of every file a finished checkpoint holds, checked before reading.

Bytes changed in a checkpoint after its save (a flipped bit on a disk, a half-copied folder, an
edited file) are read back by TensorStore without complaint as long as they still parse: a damaged
float is just another float, and training goes on from it. `write` records each file's size and
checksum in `digest.json` inside the step's folder once orbax has finalized the save; `verify`
checks them before any array is restored, and a mismatch is damage like an unreadable file.
A single params/ folder (a fine-tuning run's best/, a `convert from-hf` or pruned folder) gets
one too, inside it; with no earlier copy to fall back to, its readers refuse damage in one line
(`checkpoints.restore_params_folder`).

What is hashed, and why: the checkpoint's files, not the restored arrays. The check then runs
before the restore, on exactly the bytes every reader reads (resume, `init_from`, export, load,
prune and embed restore different parts of the tree in different ways), needs no copy of the
arrays from the devices, and names the file that changed. The files are read back from the page
cache right after the save, so the cost is the checksum's speed. The checksum is CRC-32 (zlib):
it catches every change of up to 32 bits in a file and any other with probability 1 - 2^-32,
which is what a check against decay (not against an adversary) needs, at about twice sha256's
speed here (PERFORMANCE.md has the measured cost). On a remote store whose listing carries each
object's CRC-32C (Cloud Storage through gcsfs), that value is recorded and compared instead of
reading the data back; other stores are read.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import zlib

import fsspec

from bertjax.core import paths

DIGEST = "digest.json"
_CHUNK = 16 << 20
_VERSION = 1
_unchecked_warned: set[str] = set()


class Damaged(Exception):
  """A checkpoint's files differ from its digest; the message says which file and how."""


def _files(folder: paths.Path, prefix: str = "") -> list[tuple[str, paths.Path]]:
  out = []
  for path in sorted(folder.iterdir(), key=lambda p: p.name):
    if path.is_dir():
      out.extend(_files(path, f"{prefix}{path.name}/"))
    elif prefix or path.name != DIGEST:
      out.append((prefix + path.name, path))
  return out


def _store_crc32c(path: paths.Path) -> str | None:
  """The object's CRC-32C as the store lists it (gcsfs: `crc32c`), None where it has none."""
  try:
    fs, inner = fsspec.core.url_to_fs(os.fspath(path))
    value = fs.info(inner).get("crc32c")
  except Exception:  # pylint: disable=broad-except  # no such listing: read the bytes instead
    return None
  return str(value) if value else None


def _crc32(path: paths.Path) -> str:
  crc = 0
  with path.open("rb") as f:
    while chunk := f.read(_CHUNK):
      crc = zlib.crc32(chunk, crc)
  return f"{crc:08x}"


def _size(path: paths.Path) -> int:
  stat = path.stat()
  return int(stat.length if hasattr(stat, "length") else stat.st_size)


def _entry(path: paths.Path) -> dict:
  entry = {"size": _size(path)}
  store = _store_crc32c(path) if paths.is_remote(path) else None
  if store is not None:
    entry["crc32c"] = store
  else:
    entry["crc32"] = _crc32(path)
  return entry


def _map(fn, items):
  # zlib.crc32 releases the GIL on large buffers: files are checked side by side.
  with concurrent.futures.ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:
    return list(pool.map(fn, items))


def compute(step_dir: paths.Path) -> dict:
  """{relative file name: {"size", "crc32" or "crc32c"}} of every file under `step_dir`."""
  files = _files(step_dir)
  return dict(zip([name for name, _ in files], _map(_entry, [path for _, path in files])))


def write(step_dir: paths.Path) -> None:
  """Records `step_dir`'s files in its digest.json (a temporary file renamed into place, so a
  crash leaves either no digest or a whole one)."""
  text = json.dumps({"version": _VERSION, "files": compute(step_dir)}, indent=1, sort_keys=True)
  target = step_dir / DIGEST
  if paths.is_remote(target):
    target.write_text(text)  # an object appears whole or not at all
    return
  tmp = step_dir / f".{DIGEST}.{os.getpid()}.tmp"
  try:
    tmp.write_text(text)
    os.replace(tmp, target)
  finally:
    if tmp.exists():
      tmp.unlink()


def verify(step_dir: paths.Path, required: str = "") -> bool:
  """Checks `step_dir` against its digest: True when it matches, False when it has none (a
  checkpoint saved before digests were written, or one whose process was killed before writing
  it: it is read unchecked, said once per folder). Raises `Damaged` naming the first file that
  is missing or changed, or a digest that is itself unreadable. `required`: why a digest must be
  there (the run's other checkpoints have one); its absence is then damage too."""
  try:
    text = (step_dir / DIGEST).read_text()
  except FileNotFoundError:
    if required:
      raise Damaged(f"its {DIGEST} is missing ({required}), so its files cannot be checked; "
                    "it was deleted, or the save was cut short before it was written") from None
    parent = os.fspath(step_dir.parent)
    if parent not in _unchecked_warned:
      _unchecked_warned.add(parent)
      logging.warning("checkpoint %s has no %s (saved by an older bertjax, or stopped before its "
                      "digest was written): its arrays are read unchecked", step_dir, DIGEST)
    return False
  try:
    recorded = json.loads(text)["files"]
    if not isinstance(recorded, dict):
      raise TypeError("files is not an object")
  except (ValueError, KeyError, TypeError) as e:
    raise Damaged(f"its {DIGEST} is unreadable ({type(e).__name__}: {e})") from None
  present = {name: path for name, path in _files(step_dir)}
  for name in sorted(recorded):
    if name not in present:
      raise Damaged(f"{name} is missing")
    size = _size(present[name])
    if size != recorded[name].get("size"):
      raise Damaged(f"{name} has {size} bytes, {recorded[name].get('size')} when saved")
  names = sorted(recorded)
  entries = _map(lambda n: _recheck(present[n], recorded[n]), names)
  for name, (now, then) in zip(names, entries):
    if now != then:
      raise Damaged(f"{name} has changed since it was saved (checksum {now}, {then} when saved)")
  return True


def _recheck(path: paths.Path, recorded: dict) -> tuple[str, str]:
  """(checksum now, checksum recorded) of one file, of the kind the digest recorded."""
  if "crc32c" in recorded:
    now = _store_crc32c(path)
    if now is not None:
      return now, str(recorded["crc32c"])
    return "unavailable", str(recorded["crc32c"])
  return _crc32(path), str(recorded.get("crc32"))
