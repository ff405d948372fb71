"""Every command reads and writes gs:// paths where it takes local ones (bertjax/paths.py).

Each test runs a command on a local folder and on the same folder copied onto the fake bucket of
tests/fake_gcs.py (`gs://bucket/...` is the folder `fake_gcs / "bucket/..."`; it refuses
appends as an object store does), in this process, and compares the outputs. A missing gs://
input is one line (a UserError).
"""

from __future__ import annotations

import json
import pathlib
import shutil

import jax
import numpy as np
import pytest

import bertjax
from bertjax.convert import __main__ as convert_cli
from bertjax.data import tokenizers
from bertjax.errors import UserError
from bertjax import train
from conftest import DATA_DIR
from helpers import TINY, load_config


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
  """A tiny SST-2 run (4 heads x 2 layers, 4 steps on 64 sentences; dev cut to 48 rows), its
  GLUE folder beside it (glue/SST-2/dev.tsv)."""
  if not DATA_DIR.is_dir():
    pytest.skip(f"shared data not found at {DATA_DIR}; set BERTJAX_DATA to its folder")
  tmp = tmp_path_factory.mktemp("remote")
  glue_root = tmp / "glue" / "SST-2"
  glue_root.mkdir(parents=True)
  train_lines = (DATA_DIR / "glue/SST-2/train.tsv").read_text().splitlines()
  (glue_root / "train.tsv").write_text("\n".join(train_lines[:200]) + "\n")
  dev = (DATA_DIR / "glue/SST-2/dev.tsv").read_text().splitlines()
  (glue_root / "dev.tsv").write_text("\n".join(dev[:49]) + "\n")
  tok = tmp / "tok"
  tokenizers.train_sentencepiece([l.split("\t")[0] for l in train_lines[1:2001]], tok,
                                 vocab_size=400, num_threads=1)
  config = load_config("configs/glue.py:task=sst2,runlocal", **{
      **TINY, "model.num_attention_heads": 4, "model.vocab_size": 400, "data.tokenizer": str(tok),
      "data_dir": str(tmp / "glue"), "max_train_examples": 64, "num_epochs": 1.0,
      "batch_size": 16, "max_seq_length": 32})
  train.train_and_evaluate(config, tmp / "run")
  return tmp / "run"


def on_bucket(fake_gcs, local: pathlib.Path, name: str) -> str:
  """Copies the folder `local` to gs://bucket/<name>; returns that URL."""
  shutil.copytree(local, fake_gcs / "bucket" / name)
  return f"gs://bucket/{name}"


def files_of(folder: pathlib.Path) -> dict[str, bytes]:
  return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
          if p.is_file()}


# ----------------------------------------------------------------------------- convert, load


@pytest.mark.slow
def test_to_hf_from_and_to_gs_equals_local(finetuned, fake_gcs, tmp_path, capsys):
  remote = on_bucket(fake_gcs, finetuned, "runs/sst2")
  convert_cli.main(["to-hf", "--workdir", str(finetuned), "--output", str(tmp_path / "hf")])
  convert_cli.main(["to-hf", "--workdir", remote, "--output", "gs://bucket/hf"])
  out = capsys.readouterr().out
  assert f"exported the fine-tuning folder at step 4 {remote}" in out
  assert "wrote BertForSequenceClassification to gs://bucket/hf" in out
  local_files = files_of(tmp_path / "hf")
  assert {"config.json", "model.safetensors", "spiece.model"} <= set(local_files)
  assert files_of(fake_gcs / "bucket/hf") == local_files
  # to a local folder from the bucket: the same files again
  convert_cli.main(["to-hf", "--workdir", remote, "--output", str(tmp_path / "hf2")])
  assert files_of(tmp_path / "hf2") == local_files
  with pytest.raises(UserError, match="--output gs://bucket/hf is not empty"):
    convert_cli.main(["to-hf", "--workdir", remote, "--output", "gs://bucket/hf"])


@pytest.mark.slow
def test_load_from_gs_equals_local(finetuned, fake_gcs):
  remote = on_bucket(fake_gcs, finetuned, "runs/sst2")
  local, far = bertjax.load(finetuned), bertjax.load(remote)
  assert far.source.step == local.source.step == 4 and str(far.source.path) == remote
  assert far.task == local.task and far.task.kind == "sequence"
  for a, b in zip(jax.tree.leaves(local.head_params), jax.tree.leaves(far.head_params)):
    np.testing.assert_array_equal(a, b)
  ids = np.random.RandomState(0).randint(5, 400, (2, 12))
  mask, types = np.ones_like(ids), np.zeros_like(ids)
  np.testing.assert_array_equal(local.logits(ids, mask, types), far.logits(ids, mask, types))
  # the tokenizer is read from a local copy of the bucket's
  assert (far.source.tokenizer / "spm.model").read_bytes() == (
      finetuned / "tokenizer/spm.model").read_bytes()
  best = bertjax.load(remote + "/best")
  assert best.source.kind == "best"


def test_missing_gs_paths_are_one_line(fake_gcs):
  (fake_gcs / "bucket").mkdir()
  with pytest.raises(UserError, match="gs://bucket/nothing does not exist"):
    bertjax.load("gs://bucket/nothing")
  with pytest.raises(UserError, match="gs://bucket/nothing does not exist"):
    convert_cli.main(["to-hf", "--workdir", "gs://bucket/nothing", "--output", "gs://bucket/o"])
  with pytest.raises(UserError, match="gs://bucket/nothing does not exist"):
    convert_cli.main(["from-hf", "--model-dir", "gs://bucket/nothing", "--workdir", "gs://b/o"])
