"""XLA:CPU settings bertjax can turn on before JAX starts its backends: opt-in, with
BERTJAX_XLA_DEFAULTS=1.

Matrix multiplies through oneDNN (the library PyTorch uses on CPUs) instead of XLA:CPU's default
kernels: +9-13% tokens/s on the bert-mini train step and +4-9% on bert-base on a 2-core Xeon with
AVX-512 (PERFORMANCE.md), at some memory (bert-base peak +0.45 GiB). They were the default until
they corrupted the heap on a 2-core AMD EPYC (AVX2): a bert-mini train step at sequence 512
aborted with a segmentation fault or "free(): invalid pointer" in 2 of 3 runs, never without the
flags. XLA marks them experimental; a crash that depends on the CPU and the shapes is not a
default, so they are off unless asked for.

The flags are added only for the jaxlib versions they were checked with, never when the user has
set them (either way) in XLA_FLAGS. GPU and TPU backends ignore xla_cpu_* flags. XLA reads
XLA_FLAGS when the first backend starts, so the entry points call `apply()` before any JAX
computation (launch.py, and the `__main__` of the benchmark, evaluate, embed, convert and prune);
importing bertjax changes no environment variable.

The cost besides: XLA:CPU cannot serialize oneDNN calls, so with these flags the persistent
compilation cache stores nothing on CPUs (each run compiles again, a few seconds for small
models).
"""

from __future__ import annotations

import importlib.metadata
import os

CPU_FLAGS = ("--xla_cpu_use_onednn=true",
             "--xla_cpu_experimental_onednn_fusion_type=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT")
CHECKED_JAXLIB = ("0.10.2",)


def version_of_jaxlib() -> str | None:
  try:
    return importlib.metadata.version("jaxlib")
  except importlib.metadata.PackageNotFoundError:
    return None


def apply(environ=os.environ) -> list[str]:
  """Adds CPU_FLAGS to XLA_FLAGS when asked (BERTJAX_XLA_DEFAULTS=1) and the jaxlib is one they
  were checked with; returns the flags added."""
  if environ.get("BERTJAX_XLA_DEFAULTS", "0") != "1":
    return []
  if version_of_jaxlib() not in CHECKED_JAXLIB:
    return []
  current = environ.get("XLA_FLAGS", "")
  added = [f for f in CPU_FLAGS if f.split("=")[0] not in current]
  if added:
    environ["XLA_FLAGS"] = " ".join([current, *added]).strip()
  return added


def onednn_active(environ=os.environ) -> bool:
  return CPU_FLAGS[0] in environ.get("XLA_FLAGS", "")
