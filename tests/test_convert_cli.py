"""The `python -m bertjax.convert` command line, run as a user would (subprocesses).

Success: from-hf writes model.json, params/ and tokenizer/, and to-hf writes a folder that
transformers loads with the same weights and tokenizer. Bad input (missing config.json, unknown
model_type, a tensor with the wrong shape, a non-empty target): exit status 2, one line on
stderr, no traceback, and the target folder neither created nor changed.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers as T
from safetensors.numpy import load_file, save_file

from bertjax import convert

REPO = pathlib.Path(__file__).resolve().parent.parent
SMALL = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=37, max_position_embeddings=40)
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(55)]


def run_convert(*args: str) -> subprocess.CompletedProcess:
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  return subprocess.run([sys.executable, "-m", "bertjax.convert", *map(str, args)], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> pathlib.Path:
  """A tiny random BertForPreTraining with a WordPiece vocabulary, saved once per module."""
  path = tmp_path_factory.mktemp("hf") / "bert"
  torch.manual_seed(0)
  T.BertForPreTraining(T.BertConfig(**SMALL)).save_pretrained(path)
  (path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
  (path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
  return path


@pytest.mark.slow
def test_from_hf_and_back(hf_dir, tmp_path):
  work, back = tmp_path / "work", tmp_path / "back"
  r = run_convert("from-hf", "--model-dir", hf_dir, "--workdir", work)
  assert r.returncode == 0, r.stderr
  assert "Traceback" not in r.stderr
  assert "heads: mlm, pair" in r.stdout and "missing heads" not in r.stdout
  assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]  # No staging folder left.
  meta = json.loads((work / "model.json").read_text())
  assert meta["hf_model_type"] == "bert" and meta["heads"] == ["mlm", "pair"]
  assert meta["model"] == convert.hf_config_to_model_config(
      json.loads((hf_dir / "config.json").read_text())).to_dict()
  assert sorted(p.name for p in (work / "tokenizer").iterdir()) == [
      "tokenizer_config.json", "vocab.txt"]
  restored = convert.load_workdir(work)
  hf_tensors = load_file(hf_dir / "model.safetensors")
  np.testing.assert_array_equal(restored.params["mlm"]["bias"], hf_tensors["cls.predictions.bias"])
  np.testing.assert_array_equal(
      restored.params["encoder"]["layer_1"]["attention"]["query"]["kernel"],
      hf_tensors["bert.encoder.layer.1.attention.self.query.weight"].T.reshape(32, 4, 8))

  r = run_convert("to-hf", "--workdir", work, "--output", back)
  assert r.returncode == 0, r.stderr
  assert {"config.json", "model.safetensors", "vocab.txt"} <= {p.name for p in back.iterdir()}
  original = T.BertForPreTraining.from_pretrained(hf_dir).state_dict()
  loaded = T.AutoModelForPreTraining.from_pretrained(back).state_dict()
  assert set(original) == set(loaded)
  for k, v in original.items():
    assert torch.equal(v, loaded[k]), k
  tokenizer = T.AutoTokenizer.from_pretrained(back)
  assert tokenizer("w3 w7")["input_ids"] == [2, 8, 12, 3]


def test_bare_model_lists_missing_heads(tmp_path):
  src = tmp_path / "bare"
  T.BertModel(T.BertConfig(**SMALL)).save_pretrained(src)
  r = run_convert("from-hf", "--model-dir", src, "--workdir", tmp_path / "work")
  assert r.returncode == 0, r.stderr
  assert "missing heads, initialized fresh: mlm, pair" in r.stdout
  meta = json.loads((tmp_path / "work" / "model.json").read_text())
  assert meta["heads"] == ["mlm", "pair"] and meta["missing"] == ["mlm", "pair"]
  params = convert.load_workdir(tmp_path / "work").params
  assert params["pair"]["classifier"]["kernel"].shape == (32, 2)


def _drop_config(d: pathlib.Path) -> None:
  (d / "config.json").unlink()


def _unknown_type(d: pathlib.Path) -> None:
  cfg = json.loads((d / "config.json").read_text())
  (d / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))


def _wrong_shape(d: pathlib.Path) -> None:
  tensors = load_file(d / "model.safetensors")
  name = "bert.encoder.layer.0.intermediate.dense.weight"
  tensors[name] = np.ascontiguousarray(tensors[name][:, :16])
  save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("corrupt, message", [
    (_drop_config, "config.json not found"),
    (_unknown_type, "unknown architecture 'gpt2'; supported: bert, roberta, albert, electra"),
    (_wrong_shape, "tensor bert.encoder.layer.0.intermediate.dense.weight has shape (37, 16), "
                   "expected (37, 32)"),
])
def test_from_hf_bad_input(hf_dir, tmp_path, corrupt, message):
  src = tmp_path / "src"
  shutil.copytree(hf_dir, src)
  corrupt(src)
  r = run_convert("from-hf", "--model-dir", src, "--workdir", tmp_path / "out" / "work")
  assert r.returncode == 2, r.stderr
  assert "Traceback" not in r.stderr
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
  assert not (tmp_path / "out").exists()  # Neither OUT nor a staging folder was created.


@pytest.mark.parametrize("command", ["from-hf", "to-hf"])
def test_refuses_non_empty_target(hf_dir, tmp_path, command):
  target = tmp_path / "target"
  target.mkdir()
  (target / "keep.txt").write_text("precious")
  if command == "from-hf":
    r = run_convert("from-hf", "--model-dir", hf_dir, "--workdir", target)
  else:
    r = run_convert("to-hf", "--workdir", hf_dir, "--output", target)
  assert r.returncode == 2 and "Traceback" not in r.stderr
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and f"{target} is not empty" in lines[0], r.stderr
  assert [p.name for p in target.iterdir()] == ["keep.txt"]
  assert (target / "keep.txt").read_text() == "precious"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]


def test_to_hf_needs_a_model_folder(hf_dir, tmp_path):
  r = run_convert("to-hf", "--workdir", hf_dir, "--output", tmp_path / "back")
  assert r.returncode == 2 and "Traceback" not in r.stderr
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and "is not a bertjax model folder" in lines[0], r.stderr
  assert not (tmp_path / "back").exists()


def test_from_hf_by_hub_name_reads_huggingface_hubs_cache_offline(hf_dir, tmp_path):
  """`from-hf --model ORG/NAME` fetches through huggingface_hub's snapshot_download: with
  HF_HUB_OFFLINE=1 it reads the cache the test lays out (models--ORG--NAME/refs/main and its
  snapshot, the layout huggingface_hub writes) and converts what `--model-dir` on the same files
  converts; a name the cache lacks is one line, exit 2, nothing written. Two convert processes."""
  cache = tmp_path / "hub"
  repo = cache / "models--tiny-org--tiny-bert"
  commit = "0123456789abcdef0123456789abcdef01234567"
  shutil.copytree(hf_dir, repo / "snapshots" / commit)
  (repo / "refs").mkdir()
  (repo / "refs" / "main").write_text(commit)
  env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
  run = lambda *args: subprocess.run([sys.executable, "-m", "bertjax.convert", *map(str, args)],
                                     cwd=REPO, env=env, capture_output=True, text=True,
                                     timeout=300)
  r = run("from-hf", "--model", "tiny-org/tiny-bert", "--workdir", tmp_path / "work")
  assert r.returncode == 0, r.stderr[-3000:]
  restored = convert.load_workdir(tmp_path / "work")
  hf_tensors = load_file(hf_dir / "model.safetensors")
  np.testing.assert_array_equal(restored.params["mlm"]["bias"], hf_tensors["cls.predictions.bias"])
  assert (tmp_path / "work" / "tokenizer" / "vocab.txt").is_file()
  r = run("from-hf", "--model", "tiny-org/absent", "--workdir", tmp_path / "other")
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
  assert r.stderr.strip().splitlines() == [
      "error: --model tiny-org/absent: not in the Hugging Face cache, and the Hub is not "
      "reachable or HF_HUB_OFFLINE is set; fix: download it once online (or `hf download "
      "tiny-org/absent`), or pass a local folder with --model-dir"]
  assert not (tmp_path / "other").exists()
