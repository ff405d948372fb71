"""A fake gs:// for the tests: fsspec's DirFileSystem over a local folder.

No bucket is reachable from the tests, so gs:// is served by fsspec's DirFileSystem over a local
folder, registered as fsspec's `gs`/`gcs` protocol (the one epath asks for gs:// when TensorFlow is
absent), refusing to append as an object store does. Everything bertjax and orbax write through
epath goes to it, and orbax takes its GCS code paths (commit_success.txt instead of a rename, its
GCS deleter). Two things are redirected, as they bypass fsspec and need Google's servers:
tensorstore's array bytes (orbax's `gs://` -> its `gcs` kvstore driver; here the `file` driver on
the same folder) and orbax's hierarchical-namespace query (google-cloud-storage; here "no"). gcsfs
and tensorstore's GCS client themselves are not exercised.

`Bucket.uploaded` counts the bytes written through fsspec (what a real bucket would be sent),
per object path, so a test can bound a run's upload volume.
"""

from __future__ import annotations

import collections
import contextlib
import pathlib
import sys

from etils.epath import backend as epath_backend
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from orbax.checkpoint._src.path import gcs_utils
from orbax.checkpoint._src.serialization import tensorstore_utils

from bertjax.config import config_checks
from bertjax.core import paths


class Bucket(pathlib.PosixPath):
  """The local folder behind gs:// (a pathlib.Path), with `uploaded`: bytes written per path."""
  uploaded: collections.Counter


@contextlib.contextmanager
def serve(root: pathlib.Path, cache: pathlib.Path, monkeypatch):
  """gs:// served from `root` while the block runs; yields `root` as a `Bucket`."""
  root.mkdir(parents=True, exist_ok=True)
  uploaded = collections.Counter()

  class CountingFile:
    """Wraps a file opened for writing and counts what goes through it."""

    def __init__(self, f, path):
      self._f, self._path = f, path

    def write(self, data):
      uploaded[self._path] += len(data)
      return self._f.write(data)

    def __getattr__(self, name):
      return getattr(self._f, name)

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      return self._f.__exit__(*exc)

  class FakeGCS(DirFileSystem):
    protocol = ("gs", "gcs")
    cachable = False  # a new root per test

    def __init__(self, finalize_on_close=False, **kwargs):  # gcsfs's argument, which epath passes
      del finalize_on_close
      super().__init__(path=str(root), fs=LocalFileSystem(), **kwargs)

    def open(self, path, mode="rb", *args, **kwargs):
      if "a" in mode:
        raise NotImplementedError("an object cannot be appended to")
      f = super().open(path, mode, *args, **kwargs)
      return CountingFile(f, str(path)) if "w" in mode else f

  for name in FakeGCS.protocol:  # fsspec's registry of implementations, restored after the test
    monkeypatch.setitem(sys.modules["fsspec.registry"]._registry, name, FakeGCS)  # pylint: disable=protected-access
  epath_backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access
  normalize = tensorstore_utils._normalize_path  # pylint: disable=protected-access
  monkeypatch.setattr(tensorstore_utils, "_normalize_path", lambda p: normalize(
      f"{root}/{p[len('gs://'):]}" if p.startswith("gs://") else p))
  monkeypatch.setattr(gcs_utils, "is_hierarchical_namespace_enabled", lambda p: False)
  # That query is orbax's only use of google-cloud-storage, which the run otherwise requires.
  monkeypatch.setattr(config_checks, "GCS_CLIENT", "json")
  monkeypatch.setenv(paths.CACHE_ENV, str(cache))
  bucket = Bucket(root)
  bucket.uploaded = uploaded
  try:
    yield bucket
  finally:
    epath_backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access
