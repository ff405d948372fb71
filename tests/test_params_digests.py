"""Digests of single params/ folders (a fine-tuning run's best/, a `from-hf` folder, a pruned
folder): written when the folder is saved and checked by every reader. Flipped array bytes are
refused in one line naming the folder and the file (there is nothing to fall back to); a folder
written before digests loads with one warning. Also: `--step N` on a damaged checkpoint names it
and the readable steps, and prune and embed fall back past (or refuse) a damaged newest
checkpoint."""

import dataclasses
import logging
import pathlib
import shutil

import flax.linen as nn
import jax
import numpy as np
import pytest

import bertjax
from bertjax.convert import convert_from_hf, sources
from bertjax.convert.__main__ import main as convert_main
from bertjax.core import digests, paths
from bertjax.core.errors import UserError
from bertjax.models.classifiers import SequenceClassifier
from bertjax.models.config import ModelConfig
from bertjax.prune import __main__ as prune_cli, folders
from bertjax.runtime import checkpoints
from bertjax.tools import embed
from bertjax.trainer import train

from conftest import DATA_DIR
from helpers import TINY, load_config, run_module

CFG = ModelConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=40, max_position_embeddings=32)


def flip_array_bytes(folder: pathlib.Path) -> pathlib.Path:
  """Flips 8 bytes in the middle of the largest array file under `folder`, its size unchanged."""
  files = [f for f in folder.rglob("*") if f.is_file() and f.parent.name == "d"]
  target = max(files, key=lambda f: f.stat().st_size)
  data = bytearray(target.read_bytes())
  for i in range(len(data) // 2, len(data) // 2 + 8):
    data[i] ^= 0x7F
  target.write_bytes(bytes(data))
  return target


def assert_refused(call, folder: pathlib.Path, changed: pathlib.Path, fix: str):
  """`call()` fails with one line naming `folder`, the changed file and the fix."""
  with pytest.raises(UserError) as e:
    call()
  text = str(e.value)
  assert "\n" not in text, text
  name = changed.relative_to(folder).as_posix()
  assert f"{folder} is damaged: {name} has changed since it was saved" in text, text
  assert fix in text, text


def assert_every_reader_refuses(model_folder: pathlib.Path, tmp_path: pathlib.Path, fix: str):
  """Flips bytes in MODEL_FOLDER's params/ (a best/ folder's is best/STEP/params): `bertjax.load`,
  to-hf and init_from each refuse."""
  params = pathlib.Path(checkpoints.best_params(model_folder) or model_folder / "params")
  assert digests.verify(paths.as_path(params))
  changed = flip_array_bytes(params)
  assert_refused(lambda: bertjax.load(model_folder), params, changed, fix)
  assert_refused(lambda: convert_main(["to-hf", "--workdir", str(model_folder), "--output",
                                       str(tmp_path / "hf")]), params, changed, fix)
  assert not (tmp_path / "hf").exists()
  # init_from reads the folder before it touches the state: the refusal comes first.
  assert_refused(lambda: checkpoints.load_init_from(None, str(model_folder), None), params,
                 changed, fix)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A tiny SST-2 fine-tuning run: checkpoints at steps 2 and 4, best/ kept by its score."""
  if not DATA_DIR.is_dir():
    pytest.skip(f"shared data not found at {DATA_DIR}; set BERTJAX_DATA to its folder")
  path = tmp_path_factory.mktemp("digests") / "run"
  config = load_config("configs/glue.py:task=sst2,runlocal", **{
      **TINY, "data_dir": str(DATA_DIR / "glue"), "max_train_examples": 32, "total_steps": 4,
      "checkpoint_every": 2, "keep_checkpoints": 2, "eval_every": 2, "data.eval_batches": 1})
  train.train_and_evaluate(config, path)
  assert checkpoints.best_params(path / "best").is_dir() and (path / "checkpoints" / "2").is_dir()
  return path


def copy_of(run_dir: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
  copy = tmp_path / "run"
  shutil.copytree(run_dir, copy)
  return copy


@pytest.mark.slow
def test_damaged_best_params_are_refused(run, tmp_path):
  workdir = copy_of(run, tmp_path)
  assert_every_reader_refuses(workdir / "best", tmp_path,
                              f"point at the run {workdir} (its newest checkpoint)")
  assert bertjax.load(workdir).source.step == 4  # the checkpoints are another copy


@pytest.mark.slow
def test_damaged_best_params_exit_non_zero_in_one_line(run, tmp_path):
  workdir = copy_of(run, tmp_path)
  params = pathlib.Path(checkpoints.best_params(workdir / "best"))
  flip_array_bytes(params)
  proc = run_module("-m", "bertjax.convert", "to-hf", "--workdir", str(workdir / "best"),
                    "--output", str(tmp_path / "hf"))
  assert proc.returncode != 0
  assert proc.stderr.strip().count("\n") == 0, proc.stderr
  assert proc.stderr.startswith(f"error: {params} is damaged: ")


@pytest.fixture
def converted(tmp_path):
  """A folder written by `convert from-hf` from a tiny transformers BertModel."""
  transformers = pytest.importorskip("transformers")
  hf = tmp_path / "hf_in"
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat"]
  transformers.BertModel(transformers.BertConfig(
      vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
      intermediate_size=40, max_position_embeddings=32)).save_pretrained(hf)
  (hf / "vocab.txt").write_text("\n".join(vocab) + "\n")
  out = tmp_path / "converted"
  convert_from_hf(hf, out, log=lambda _: None)
  return out


def test_damaged_from_hf_params_are_refused(converted, tmp_path):
  assert_every_reader_refuses(converted, tmp_path, "write it again (python -m bertjax.convert")


def test_a_folder_without_a_digest_loads_with_one_warning(converted, caplog):
  """A folder written before digests were written: read unchecked, said once."""
  (converted / "params" / digests.DIGEST).unlink()
  caplog.set_level(logging.WARNING)
  first = bertjax.load(converted)
  bertjax.load(converted)
  lines = [r.getMessage() for r in caplog.records if digests.DIGEST in r.getMessage()]
  assert len(lines) == 1 and "read unchecked" in lines[0], lines
  assert first.config.hidden_size == 32


def test_damaged_pruned_params_are_refused(tmp_path):
  model = SequenceClassifier(CFG, 2)
  ids = np.zeros((1, 8), np.int32)
  params = jax.tree.map(np.asarray, nn.meta.unbox(model.init(jax.random.key(0), ids, ids,
                                                             ids)["params"]))
  head = sources.task_head({"objective": "glue", "task": "sst2"}, params)
  folder = folders.save_pruned(tmp_path / "pruned", CFG, params, None, {"heads": 4},
                               dataclasses.asdict(head))
  assert bertjax.load(folder).task.num_labels == 2
  assert_every_reader_refuses(folder, tmp_path, "prune again (python -m bertjax.prune)")


@pytest.mark.slow
def test_an_explicit_damaged_step_names_the_file_and_the_readable_steps(run, tmp_path, caplog):
  """Defect: `to-hf --step 4` on a damaged step 4 said "trying an earlier one", then "no
  readable checkpoint", although step 2 is readable."""
  workdir = copy_of(run, tmp_path)
  changed = flip_array_bytes(workdir / "checkpoints" / "4")
  name = changed.relative_to(workdir / "checkpoints" / "4").as_posix()
  caplog.set_level(logging.WARNING)
  for call in (lambda: convert_main(["to-hf", "--workdir", str(workdir), "--step", "4",
                                     "--output", str(tmp_path / "hf")]),
               lambda: bertjax.load(workdir, step=4)):
    with pytest.raises(UserError) as e:
      call()
    text = str(e.value)
    assert "\n" not in text
    assert text.startswith(f"--step 4: the checkpoint at {workdir / 'checkpoints' / '4'} is "
                           f"damaged ({name} has changed since it was saved"), text
    assert "readable steps: 2: pass one with --step" in text, text
  assert not any("trying an earlier one" in r.getMessage() for r in caplog.records)
  assert bertjax.load(workdir, step=2).source.step == 2


@pytest.mark.slow
def test_prune_falls_back_past_a_damaged_newest_checkpoint(run, tmp_path, caplog):
  workdir = copy_of(run, tmp_path)
  shutil.rmtree(workdir / "best", ignore_errors=True)  # prune would start from best/ otherwise
  flip_array_bytes(workdir / "checkpoints" / "4")
  caplog.set_level(logging.WARNING)
  prune_cli.main(["--workdir", str(workdir), "--output", str(tmp_path / "out"),
                  "--target-heads", "0.5"])
  lines = [r.getMessage() for r in caplog.records if "step 4 is unreadable" in r.getMessage()]
  assert lines and "has changed since it was saved" in lines[0], lines
  _, pruned = folders.load_pruned(tmp_path / "out" / "step_1" / "pruned")
  step2 = checkpoints.restore_checkpoint_params(run, 2)[1]
  step4 = checkpoints.restore_checkpoint_params(run, 4)[1]
  word = lambda p: np.asarray(p["encoder"]["embeddings"]["word_embeddings"]["embedding"])
  np.testing.assert_array_equal(word(pruned), word(step2))
  assert not np.array_equal(word(pruned), word(step4))
  # With step 2 damaged too, nothing is readable: one line, and no output folder.
  flip_array_bytes(workdir / "checkpoints" / "2")
  with pytest.raises(UserError, match="no readable checkpoint in .*; point at a run"):
    prune_cli.main(["--workdir", str(workdir), "--output", str(tmp_path / "out2"),
                    "--target-heads", "0.5"])
  assert not (tmp_path / "out2").exists()


@pytest.mark.slow
def test_embed_falls_back_past_a_damaged_newest_checkpoint(run, tmp_path, caplog):
  workdir = copy_of(run, tmp_path)
  text = tmp_path / "in.txt"
  text.write_text("a gripping , funny film .\nbad .\n")
  twin = tmp_path / "twin"  # the same run with step 4 gone: what embed must read
  shutil.copytree(run, twin)
  shutil.rmtree(twin / "checkpoints" / "4")
  embed.main(["--workdir", str(twin), "--input", str(text), "--output", str(tmp_path / "a.npz")])
  flip_array_bytes(workdir / "checkpoints" / "4")
  caplog.set_level(logging.WARNING)
  embed.main(["--workdir", str(workdir), "--input", str(text), "--output",
              str(tmp_path / "b.npz")])
  assert any("step 4 is unreadable" in r.getMessage() for r in caplog.records)
  np.testing.assert_array_equal(np.load(tmp_path / "a.npz")["pooled"],
                                np.load(tmp_path / "b.npz")["pooled"])
  flip_array_bytes(workdir / "checkpoints" / "2")
  with pytest.raises(UserError, match="no readable checkpoint in "):
    embed.main(["--workdir", str(workdir), "--input", str(text), "--output",
                str(tmp_path / "c.npz")])
  assert not (tmp_path / "c.npz").exists()
