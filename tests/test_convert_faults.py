"""Faults of `convert to-hf` / `from-hf` a new user and a red-team found (issue 41), one test each.

Each was seen failing on dd89774: the ModernBERT export kept transformers' default special-token
ids (50281/50282, outside a small vocabulary); model.safetensors was written 0600 where every
other file is 0644; a head-pruned ModernBERT gave an AssertionError traceback; a truncated
tokenizer.json was copied by from-hf (exit 0) and by to-hf into a folder AutoTokenizer cannot
load; a missing tokenizer.json went without a word; `--model-dir bert-base-uncased` did not say
that only local folders are taken or how to get one.
"""

from __future__ import annotations

import json
import os
import pathlib
import stat

import pytest
import transformers as T

from bertjax import convert
from bertjax.models import pruning
from bertjax.prune import folders
from bertjax.trainer import train
from configs.common import SAMPLE

from helpers import glue_data, load_config, run_module
from test_modernbert import TINY as MODERNBERT
from test_modernbert_hf import bpe_folder


@pytest.fixture(scope="module")
def modernbert_hf(tmp_path_factory) -> pathlib.Path:
  """A transformers ModernBertForMaskedLM folder with its own small tokenizer.json, its config's
  special-token ids the tokenizer's (as a user's model has them)."""
  path = tmp_path_factory.mktemp("mb") / "hf"
  texts = SAMPLE.read_text(encoding="utf-8").splitlines()[:2000]
  tok = T.AutoTokenizer.from_pretrained(bpe_folder(path, texts, vocab_size=300))
  ids = {f"{n}_token_id": getattr(tok, f"{n}_token_id") for n in ("pad", "cls", "sep")}
  config = T.ModernBertConfig(**{**MODERNBERT, "vocab_size": len(tok), **ids,
                                 "bos_token_id": tok.cls_token_id,
                                 "eos_token_id": tok.sep_token_id})
  T.ModernBertForMaskedLM(config).save_pretrained(path)
  return path


@pytest.fixture(scope="module")
def converted(modernbert_hf, tmp_path_factory) -> pathlib.Path:
  out = tmp_path_factory.mktemp("conv") / "converted"
  convert.convert_from_hf(modernbert_hf, out, log=lambda _: None)
  return out


def convert_cli(*args) -> tuple[int, list[str], list[str]]:
  proc = run_module("-m", "bertjax.convert", *map(str, args))
  return proc.returncode, proc.stdout.splitlines(), proc.stderr.strip().splitlines()


def one_line_refusal(code: int, stderr: list[str], needle: str) -> None:
  assert code == 2 and len(stderr) == 1 and stderr[0].startswith("error: "), stderr
  assert needle in stderr[0], stderr


@pytest.mark.slow
def test_modernbert_export_names_its_own_special_tokens(converted, tmp_path):
  """Defect 2: cls/sep/bos/eos ids of the exported config.json are the tokenizer's."""
  convert.convert_to_hf(converted, tmp_path / "hf", log=lambda _: None)
  written = json.loads((tmp_path / "hf" / "config.json").read_text())
  tok = T.AutoTokenizer.from_pretrained(tmp_path / "hf")
  assert written["vocab_size"] == len(tok)
  assert (written["cls_token_id"], written["sep_token_id"]) == (tok.cls_token_id, tok.sep_token_id)
  assert (written["bos_token_id"], written["eos_token_id"]) == (tok.cls_token_id, tok.sep_token_id)
  assert written["pad_token_id"] == tok.pad_token_id


@pytest.mark.slow
def test_exported_weights_have_the_mode_of_the_other_files(converted, tmp_path):
  """Defect 3: model.safetensors was 0600 (safetensors' own writer), config.json 0644."""
  convert.convert_to_hf(converted, tmp_path / "hf", log=lambda _: None)
  mode = lambda name: stat.S_IMODE(os.stat(tmp_path / "hf" / name).st_mode)
  umask = os.umask(0)
  os.umask(umask)
  assert mode("model.safetensors") == mode("config.json") == 0o666 & ~umask


def _pruned_modernbert(tmp_path: pathlib.Path, converted: pathlib.Path) -> pathlib.Path:
  loaded = convert.load_workdir(converted)
  small, cfg = pruning.prune_heads(loaded.params["encoder"], loaded.config, {0: [1], 2: [0, 3]})
  return folders.save_pruned(tmp_path / "pruned", cfg, {"encoder": small}, converted / "tokenizer")


@pytest.mark.slow
def test_pruned_modernbert_export_is_refused_in_one_line(converted, tmp_path, data_dir):
  """Defect 15: the pruned folder and a run fine-tuned from it: one line, nothing written (was
  an AssertionError traceback from the tensor layout)."""
  pruned = _pruned_modernbert(tmp_path, converted)
  code, stdout, stderr = convert_cli("to-hf", "--workdir", pruned, "--output", tmp_path / "hf")
  one_line_refusal(code, stderr, "ModernBERT model with pruned heads")
  assert not stdout and not (tmp_path / "hf").exists()
  config = load_config("configs/glue.py:task=rte,runlocal", **{
      "data_dir": str(glue_data(tmp_path, data_dir)), "init_from": str(pruned), "total_steps": 1,
      "max_train_examples": 16, "batch_size": 8, "eval_every": 1, "max_seq_length": 32,
      "tensorboard": False, "async_checkpointing": False, "best_metric": ""})
  train.train_and_evaluate(config, tmp_path / "run")
  code, stdout, stderr = convert_cli("to-hf", "--workdir", tmp_path / "run", "--output",
                                     tmp_path / "hf")
  one_line_refusal(code, stderr, "ModernBERT model with pruned heads")
  assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_damaged_or_missing_tokenizer_json(modernbert_hf, converted, tmp_path):
  """Defect 16: from-hf of a truncated tokenizer.json is refused (exit 2, nothing written); one
  whose tokenizer.json is missing converts the weights and warns; to-hf never writes a tokenizer
  AutoTokenizer cannot load (a converted folder's damaged tokenizer.json is refused)."""
  hf = tmp_path / "hf"
  hf.mkdir()
  for f in modernbert_hf.iterdir():
    (hf / f.name).write_bytes(f.read_bytes())
  text = (hf / "tokenizer.json").read_text()
  (hf / "tokenizer.json").write_text(text[:len(text) // 2])
  code, stdout, stderr = convert_cli("from-hf", "--model-dir", hf, "--workdir", tmp_path / "a")
  one_line_refusal(code, stderr, f"cannot read {hf / 'tokenizer.json'}")
  assert "download or save the model folder again" in stderr[0]
  assert not (tmp_path / "a").exists()

  (hf / "tokenizer.json").unlink()
  code, stdout, stderr = convert_cli("from-hf", "--model-dir", hf, "--workdir", tmp_path / "b")
  assert code == 0, stderr
  warning = [l for l in stdout if l.startswith("warning: ")]
  assert len(warning) == 1 and "but no tokenizer.json" in warning[0], stdout
  assert "PreTrainedTokenizerFast" in warning[0] and "--config.data.tokenizer" in warning[0]
  assert not (tmp_path / "b" / "tokenizer").exists()

  damaged = tmp_path / "damaged"
  damaged.mkdir()
  for f in converted.rglob("*"):
    if f.is_file():
      (damaged / f.relative_to(converted)).parent.mkdir(parents=True, exist_ok=True)
      (damaged / f.relative_to(converted)).write_bytes(f.read_bytes())
  tok_json = damaged / "tokenizer" / "tokenizer.json"
  tok_json.write_text(tok_json.read_text()[:1000])
  code, stdout, stderr = convert_cli("to-hf", "--workdir", damaged, "--output", tmp_path / "out")
  one_line_refusal(code, stderr, f"cannot read {tok_json}")
  assert not (tmp_path / "out").exists()
  # Its tokenizer_config.json left alone, without the vocabulary it names: refused too.
  tok_json.unlink()
  code, stdout, stderr = convert_cli("to-hf", "--workdir", damaged, "--output", tmp_path / "out")
  one_line_refusal(code, stderr, "but no tokenizer.json")
  assert not (tmp_path / "out").exists()


def test_from_hf_of_a_hub_name_says_how_to_get_a_folder(tmp_path):
  """Defect 5: `--model-dir bert-base-uncased` (a hub name) names the local-folder rule and the
  way to get one."""
  code, stdout, stderr = convert_cli("from-hf", "--model-dir", "bert-base-uncased", "--workdir",
                                     tmp_path / "out")
  one_line_refusal(code, stderr, "bert-base-uncased")
  assert "only a local folder" in stderr[0] and "save_pretrained" in stderr[0], stderr
  assert "hf download bert-base-uncased" in stderr[0] and "huggingface-cli" not in stderr[0], stderr
  assert not (tmp_path / "out").exists()


def test_from_hf_of_a_missing_path_does_not_call_it_a_hub_name(tmp_path):
  """ea9bcfe answered a mistyped local path (absolute, or a file) with `not a Hugging Face hub
  name: download one first (huggingface-cli download /abs/path ...)`, a command that cannot
  work; a path is now named as a missing folder (or a file)."""
  (tmp_path / "model.safetensors").write_bytes(b"not a folder")
  for given, what in ((tmp_path / "bert-base", "not found"),
                      (tmp_path / "model.safetensors", "is a file")):
    code, stdout, stderr = convert_cli("from-hf", "--model-dir", given, "--workdir",
                                       tmp_path / "out")
    one_line_refusal(code, stderr, str(given))
    assert stderr[0] == (f"error: model directory {given} {what}; --model-dir takes a local "
                         "Hugging Face model folder (config.json + model.safetensors)"), stderr
    assert not (tmp_path / "out").exists()
