"""The bert-base sharding layout on a (2, 2, 2) mesh is pinned by a golden file."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests/golden/sharding_bert_base_2x2x2.json"


@pytest.mark.slow
def test_sharding_matches_golden(tmp_path):
  out = tmp_path / "specs.json"
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8")
  r = subprocess.run([sys.executable, str(REPO / "tests/sharding_golden.py"), str(out)], env=env,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  got, want = json.loads(out.read_text()), json.loads(GOLDEN.read_text())
  assert got == want
  # The layout is what the rules say: heads and MLP units split over `tensor`, weights' embed
  # dimension over `fsdp`, LayerNorm replicated along everything but fsdp.
  q = want["encoder/layer_0/attention/query/kernel"]
  assert q == ["fsdp", "tensor", None]
  assert want["encoder/layer_0/intermediate/kernel"] == ["fsdp", "tensor"]
  assert want["encoder/embeddings/word_embeddings/embedding"] == ["tensor", "fsdp"]
  assert len(want) == 12 * 16 + 14  # 16 per layer; embeddings, pooler, MLM and NSP heads
