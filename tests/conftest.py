"""Shared test settings.

The suite runs on the CPU (JAX_PLATFORMS=cpu) unless a device is asked for: `-m accelerator`
(the tier in tests/test_accelerator_tier.py) or BERTJAX_TEST_PLATFORM=gpu|tpu|auto leaves JAX
to the device ("auto": JAX's own choice; cpu: the default).

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
# bertjax's opt-in oneDNN flags stay off here (XLA:CPU cannot cache their compiled steps;
# bertjax/xla_defaults.py); tests/test_training_parity.py runs once with them on.
os.environ.setdefault("BERTJAX_XLA_DEFAULTS", "0")


def device_requested(markexpr: str, environ=os.environ) -> str | None:
  """The platform the tests run on when not the CPU: BERTJAX_TEST_PLATFORM, or "auto" when the
  marker expression selects the accelerator tier."""
  asked = environ.get("BERTJAX_TEST_PLATFORM", "")
  if asked:
    return None if asked == "cpu" else asked
  selects = "accelerator" in markexpr and "not accelerator" not in markexpr
  return "auto" if selects else None


def pytest_configure(config):
  # Before any test module imports JAX, which reads JAX_PLATFORMS when it is imported.
  platform = device_requested(config.getoption("markexpr") or "")
  if platform is None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  elif platform != "auto":
    os.environ["JAX_PLATFORMS"] = platform


DATA_DIR = pathlib.Path(os.environ.get("BERTJAX_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture
def data_dir() -> pathlib.Path:
  if not DATA_DIR.is_dir():
    pytest.skip(f"shared data not found at {DATA_DIR}; set BERTJAX_DATA to its folder")
  return DATA_DIR


@pytest.fixture
def fake_gcs(tmp_path, monkeypatch):
  """gs:// served from tmp_path/bucketroot (tests/fake_gcs.py); yields that folder, whose
  `uploaded` counts the bytes written per object."""
  from tests import fake_gcs as fake  # pylint: disable=import-outside-toplevel
  with fake.serve(tmp_path / "bucketroot", tmp_path / "cache", monkeypatch) as root:
    yield root
