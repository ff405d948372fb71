"""The behaviour guard of the refactors: the quickstart's first 20 training losses on the CPU are
bitwise those recorded from commit 297e3fb (tests/golden/quickstart_losses.json).

The run is the README's command, `python launch.py --config configs/quickstart.py --workdir W`,
with `--config.log_every=1` so that metrics.jsonl holds every step's loss (log_every only sets
how often the summed metrics are written; the schedule, batches and steps are those of the
quickstart's own 300-step recipe). Once metrics.jsonl holds 20 train rows the run is sent SIGTERM
(it saves a checkpoint and exits with status 75). The golden file was written by `record` below
from a checkout of 297e3fb: `python tests/test_quickstart_losses.py /path/to/checkout`.

XLA:CPU's code depends on the processor's vector extensions, and so do the last bits of a loss:
297e3fb's own quickstart gives another last bit at step 5 on a Xeon with AVX-512 and AMX than on
the machine the golden was first recorded on. So the file holds 297e3fb's losses per kind of
processor (`cpu_kind`, its vector extensions), each recorded from a checkout of 297e3fb on such a
processor; the test compares bitwise with its own kind's, or with the first recording where its
kind has none.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests/golden/quickstart_losses.json"
STEPS = 20
# The vector extensions XLA:CPU's code generation depends on.
EXTENSIONS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile")


def cpu_kind() -> str:
  """This processor's kind for the golden file: its architecture and vector extensions."""
  import platform  # pylint: disable=import-outside-toplevel
  flags = set()
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("flags"):
        flags = set(line.split(":", 1)[1].split())
        break
  except OSError:
    pass
  return "+".join([platform.machine(), *(e for e in EXTENSIONS if e in flags)])


def train_rows(workdir: pathlib.Path) -> list[dict]:
  path = workdir / "metrics.jsonl"
  if not path.is_file():
    return []
  rows = []
  for line in path.read_text().splitlines():
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:  # a line being written
      break
  return [r for r in rows if r.get("split") == "train"]


def first_losses(repo: pathlib.Path, workdir: pathlib.Path, steps: int = STEPS,
                 timeout_s: float = 900) -> list[float]:
  """Runs the quickstart from `repo` into `workdir` until `steps` train rows are written and
  returns their losses (Python floats, as metrics.jsonl holds them)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  cmd = [sys.executable, "launch.py", "--config", "configs/quickstart.py", "--workdir",
         str(workdir), "--config.log_every=1"]
  with open(workdir.parent / f"{workdir.name}.log", "w") as log:
    proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    try:
      while len(train_rows(workdir)) < steps:
        if proc.poll() is not None or time.monotonic() > deadline:
          raise AssertionError(f"quickstart stopped or timed out before step {steps}: "
                               + (workdir.parent / f"{workdir.name}.log").read_text()[-3000:])
        time.sleep(0.5)
      proc.send_signal(signal.SIGTERM)
      proc.wait(timeout=300)
    finally:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  rows = train_rows(workdir)[:steps]
  assert [r["step"] for r in rows] == list(range(1, steps + 1))
  return [r["loss"] for r in rows]


def record(checkout: str) -> None:
  """Writes GOLDEN from the quickstart of `checkout` (a worktree of commit 297e3fb)."""
  commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True,
                          text=True, check=True).stdout.strip()
  with tempfile.TemporaryDirectory() as tmp:
    losses = first_losses(pathlib.Path(checkout), pathlib.Path(tmp) / "run")
  golden = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else None
  entry = {"commit": commit, "losses_hex": [float(x).hex() for x in losses], "losses": losses}
  if golden is None:
    golden = {"command": "python launch.py --config configs/quickstart.py --workdir W "
                         "--config.log_every=1 (JAX_PLATFORMS=cpu; SIGTERM once 20 train rows "
                         "exist)",
              "note": "train loss of steps 1..20 as metrics.jsonl holds them; hex is float.hex",
              **entry}
  else:
    golden.setdefault("by_cpu", {})[cpu_kind()] = entry
  GOLDEN.write_text(json.dumps(golden, indent=2) + "\n")


def golden_for(golden: dict, kind: str) -> dict:
  """The recording for this kind of processor, else the first one."""
  return golden.get("by_cpu", {}).get(kind, golden)


def test_golden_choice():
  golden = {"losses_hex": ["a"], "by_cpu": {"x86_64+avx2+avx512f": {"losses_hex": ["b"]}}}
  assert golden_for(golden, "x86_64+avx2+avx512f")["losses_hex"] == ["b"]
  assert golden_for(golden, "x86_64+avx2")["losses_hex"] == ["a"]
  assert cpu_kind().split("+")[0]


@pytest.mark.slow
def test_quickstart_first_20_losses_are_bitwise_those_of_297e3fb(tmp_path):
  golden = golden_for(json.loads(GOLDEN.read_text()), cpu_kind())
  losses = first_losses(REPO, tmp_path / "run")
  assert [x.hex() for x in losses] == golden["losses_hex"], (cpu_kind(), losses, golden["losses"])


if __name__ == "__main__":
  record(sys.argv[1])
