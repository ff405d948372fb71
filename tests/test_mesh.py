"""The same training on one device and on data / FSDP / tensor-parallel meshes of 8 fake devices."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
OBJECTIVES = ("mlm_nsp", "rtd")
MESHES = ("8,1,1", "2,4,1", "2,2,2")


def _runs(tmp_path, devices, specs):
  out = tmp_path / f"losses_{devices}.json"
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  r = subprocess.run([sys.executable, str(REPO / "tests/mesh_runs.py"), str(out), *specs],
                     env=env, capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(out.read_text())


@pytest.mark.slow
def test_meshes_match_single_device(tmp_path):
  single = _runs(tmp_path, 1, [f"{o}:1,1,1" for o in OBJECTIVES])
  sharded = _runs(tmp_path, 8, [f"{o}:{m}" for o in OBJECTIVES for m in MESHES])
  for o in OBJECTIVES:
    reference = single[f"{o}:1,1,1"]
    assert len(reference) == 5 and reference[0] != reference[-1]
    for m in MESHES:
      assert sharded[f"{o}:{m}"] == pytest.approx(reference, rel=1e-5), (o, m)
