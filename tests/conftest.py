"""Shared test settings.

Real data lives outside the project (see ../shared/data/README.md). Tests find it through
BERTJAX_DATA, defaulting to ../shared/data next to the repository, and skip with a reason when
it is absent.
"""

import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent

# One compilation cache for the suite and the runs it starts in subprocesses: many tests compile
# the same tiny models, and a warm cache makes a repeated suite much faster.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    os.environ.get("TMPDIR", "/tmp"), "bertjax-test-jax-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# bertjax's opt-in oneDNN flags stay off here (XLA:CPU cannot cache their compiled steps;
# bertjax/xla_defaults.py); tests/test_training_parity.py runs once with them on.
os.environ.setdefault("BERTJAX_XLA_DEFAULTS", "0")
DATA_DIR = pathlib.Path(os.environ.get("BERTJAX_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture
def data_dir() -> pathlib.Path:
  if not DATA_DIR.is_dir():
    pytest.skip(f"shared data not found at {DATA_DIR}; set BERTJAX_DATA to its folder")
  return DATA_DIR
