"""Shared test settings.

The suite runs on the CPU (JAX_PLATFORMS=cpu) unless a device is asked for: `-m accelerator`
(the tier in tests/test_accelerator_tier.py) or BERTJAX_TEST_PLATFORM=gpu|tpu|auto leaves JAX
to the device ("auto": JAX's own choice; cpu: the default).

Real data lives outside the project (see ../shared/data/README.md). Tests find it through
BERTJAX_DATA, defaulting to ../shared/data next to the repository, and skip with a reason when
it is absent.
"""

import gc
import logging
import os
import pathlib
import resource
import sys

import pytest

from bertjax.runtime import xla_defaults

REPO = pathlib.Path(__file__).resolve().parent.parent

# One compilation cache for the suite and the runs it starts in subprocesses: many tests compile
# the same tiny models, and a warm cache makes a repeated suite much faster.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    os.environ.get("TMPDIR", "/tmp"), "bertjax-test-jax-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# bertjax's opt-in oneDNN flags stay off here (XLA:CPU cannot cache their compiled steps;
# bertjax/runtime/xla_defaults.py); tests/test_training_parity.py runs once with them on.
os.environ.setdefault("BERTJAX_XLA_DEFAULTS", "0")
xla_defaults.apply()  # the test process is an entry point: as launch.py does


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


@pytest.fixture(autouse=True)
def _root_logger_as_found():
  """A test that sets up logging (an in-process launch.main: absl's handler, level INFO) leaves
  the root logger as it found it, so what a later test prints (bertjax.tasks.base.announce prints
  only where nothing shows the log) does not depend on which tests ran before it."""
  root = logging.getLogger()
  handlers, level = list(root.handlers), root.level
  yield
  for handler in list(root.handlers):
    if handler not in handlers and not type(handler).__module__.startswith("_pytest"):
      root.removeHandler(handler)
  root.setLevel(level)


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


# ----------------------------------------------------------------------------- the suite's end
# An xdist worker that has reported its end gets 5 s (execnet's grace) to exit before execnet
# sends it SIGINT. pytest's last act in a worker is 5 full garbage collections (its unraisable-
# exception check), each running JAX's GC callback: with many tests' objects alive that took
# longer on a loaded machine, and the KeyboardInterrupt landed in the callback, reported as a
# PytestUnraisableExceptionWarning after a green run. So a worker collects before it reports its
# end, and freezes what survives: the collections after it then have nothing to walk.

_PEAKS: dict[str, int] = {}  # worker id -> peak resident memory, KiB (the controller's record)


def peak_rss_kib() -> int:
  """This process's peak resident memory so far, KiB (ru_maxrss: KiB on Linux, bytes on macOS)."""
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak // 1024 if sys.platform == "darwin" else peak


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
  """Runs in each worker after the session's fixtures are torn down and before xdist's report of
  its end (xdist sends it after every pytest_sessionfinish)."""
  jax = sys.modules.get("jax")
  if jax is not None:
    jax.clear_caches()
  for _ in range(3):
    gc.collect()
  gc.freeze()
  output = getattr(session.config, "workeroutput", None)
  if output is not None:  # an xdist worker: the controller prints it
    output["peak_rss_kib"] = peak_rss_kib()
  else:  # the process that ran the tests, or under -n the controller (the workers are in)
    _PEAKS["controller" if _PEAKS else "main"] = peak_rss_kib()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):  # xdist, in the controller: a worker ended
  del error
  peak = getattr(node, "workeroutput", {}).get("peak_rss_kib")
  if peak is not None:
    _PEAKS[node.gateway.id] = peak


def pytest_terminal_summary(terminalreporter):
  """One line: each test process's peak resident memory (README, "Run the tests")."""
  if _PEAKS:
    terminalreporter.write_line("peak memory per test process (ru_maxrss): " + ", ".join(
        f"{name} {kib / 2 ** 20:.2f} GiB" for name, kib in sorted(_PEAKS.items())))
