"""A trained model through Hugging Face and back, for each kind of tokenizer bertjax reads.

quickstart runlocal (a tiny BERT, a few steps) with a sentencepiece, WordPiece, byte-level BPE or
tokenizer.json tokenizer -> `convert to-hf` (transformers' AutoTokenizer loads it and gives
bertjax's ids) -> `convert from-hf` -> the imported tokenizer is the original, id for id
(fingerprint), `tools.embed` gives the original run's features, and a GLUE fine-tuning run takes
the imported folder as init_from (learning rate 0: its encoder is the imported one, bit for bit).

Before the one tokenizer-file registry (tokenizers.KIND_FILES), to-hf wrote spiece.model, from-hf
copied it and the loader knew only spm.model: embed and init_from of the imported folder failed
with "no tokenizer files" (seen failing on dd89774, the sentencepiece case).
"""

from __future__ import annotations

import functools
import json
import pathlib

import jax
import numpy as np
import pytest
import transformers as T

from bertjax import convert
from bertjax.data import tokenizers
from bertjax.runtime import checkpoints
from bertjax.tools import embed
from bertjax.trainer import train
from configs.common import SAMPLE

from helpers import TINY, glue_data, load_config

KINDS = ("sentencepiece", "wordpiece", "bpe", "json")
TEXTS = [("The game began in 1998 .", "It was released in Japan ."),
         ("A second line about the history of the river valley .", "Short one .")]


def _sample_lines(n: int = 3000) -> list[str]:
  return [l for l in SAMPLE.read_text(encoding="utf-8").splitlines()[:n] if l.strip()]


def tokenizer_folder(kind: str, path: pathlib.Path) -> pathlib.Path | None:
  """A bertjax tokenizer folder of `kind` trained on the shipped sample (sentencepiece: None,
  quickstart trains its own)."""
  from tokenizers import implementations  # pylint: disable=g-import-not-at-top
  lines, raw = _sample_lines(), path.parent / f"{kind}_raw"
  raw.mkdir(parents=True)
  if kind == "sentencepiece":
    return None
  if kind == "wordpiece":
    trainer = implementations.BertWordPieceTokenizer(lowercase=True)
    trainer.train_from_iterator(lines, vocab_size=1500, show_progress=False,
                                special_tokens=list(tokenizers.BERT_SPECIALS.values()))
    trainer.save_model(str(raw))
    tok = tokenizers.WordPieceTokenizer(raw / "vocab.txt", lowercase=True)
  elif kind == "bpe":
    trainer = implementations.ByteLevelBPETokenizer()
    trainer.train_from_iterator(lines, vocab_size=1500, show_progress=False,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    trainer.save_model(str(raw))
    tok = tokenizers.ByteLevelBPETokenizer(raw / "vocab.json", raw / "merges.txt")
  else:
    from tests.test_modernbert_hf import bpe_folder  # pylint: disable=g-import-not-at-top
    tok = tokenizers.JsonTokenizer(bpe_folder(raw, lines, vocab_size=1500) / "tokenizer.json")
  tok.save(path)
  return path


@functools.lru_cache(maxsize=None)
def _run(kind: str, root: pathlib.Path) -> pathlib.Path:
  folder = tokenizer_folder(kind, root / "tokenizer")
  extra = {"data.tokenizer": str(folder)} if folder else {}
  config = load_config("configs/quickstart.py:runlocal", **{
      **TINY, **extra, "total_steps": 2, "checkpoint_every": 2, "eval_every": 0})
  workdir = root / "run"
  train.train_and_evaluate(config, workdir)
  return workdir


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """kind -> a quickstart runlocal workdir trained with that kind of tokenizer (made once)."""
  return lambda kind: _run(kind, tmp_path_factory.mktemp(kind))


def _ids(tok, a: str, b: str) -> list[int]:
  return [tok.cls_id, *tok.encode(a), tok.sep_id, *tok.encode(b), tok.sep_id]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_through_hugging_face(trained, tmp_path, data_dir, kind):
  workdir = trained(kind)
  original = tokenizers.load_tokenizer(workdir / "tokenizer")
  assert original.kind == kind
  hf, imported = tmp_path / "hf", tmp_path / "imported"
  lines = []
  convert.convert_to_hf(workdir, hf, log=lines.append)
  written = next(l for l in lines if l.startswith("tokenizer files: "))
  assert all(name in tokenizers.TOKENIZER_FILES
             for name in written.removeprefix("tokenizer files: ").split(", ")), written
  # transformers reads the exported tokenizer and gives the ids bertjax's pipelines build.
  hf_tok = T.AutoTokenizer.from_pretrained(hf)
  for a, b in TEXTS:
    assert hf_tok(a)["input_ids"] == [original.cls_id, *original.encode(a), original.sep_id]
    if kind != "bpe":  # RoBERTa's pairs are <s> A </s></s> B </s>
      assert hf_tok(a, b)["input_ids"] == _ids(original, a, b)
  # Back: the imported tokenizer is the original, id for id, casing and settings included.
  convert.convert_from_hf(hf, imported, log=lambda _: None)
  back = tokenizers.load_tokenizer(imported / "tokenizer")
  assert back.kind == kind and back.fingerprint() == original.fingerprint()
  for a, b in TEXTS:
    assert _ids(back, a, b) == _ids(original, a, b)
  # embed: the imported folder gives the original run's features.
  text = tmp_path / "lines.txt"
  text.write_text("\n".join(a for a, _ in TEXTS) + "\n")
  for folder, name in ((workdir, "original.npy"), (imported, "imported.npy")):
    embed.main(["--workdir", str(folder), "--input", str(text), "--output", str(tmp_path / name),
                "--pooling", "mean"])
  np.testing.assert_allclose(np.load(tmp_path / "imported.npy"), np.load(tmp_path / "original.npy"),
                             atol=1e-5)
  # init_from: fine-tuning starts from the imported encoder (learning rate 0 keeps it as it is).
  config = load_config("configs/glue.py:task=rte,runlocal", **{
      "data_dir": str(glue_data(tmp_path, data_dir)), "init_from": str(imported), "total_steps": 2,
      "learning_rate": 0.0, "max_train_examples": 32, "batch_size": 8, "eval_every": 2,
      "max_seq_length": 32, "tensorboard": False, "async_checkpointing": False,
      "best_metric": ""})
  train.train_and_evaluate(config, tmp_path / "finetuned")
  tuned = checkpoints.restore_params(tmp_path / "finetuned")["encoder"]
  start = checkpoints.restore_params(imported)["encoder"]
  jax.tree.map(np.testing.assert_array_equal, tuned, start)
  assert json.loads((tmp_path / "finetuned" / "config.json").read_text())["model"][
      "hidden_size"] == TINY["model.hidden_size"]


def test_one_registry_of_tokenizer_files(tmp_path):
  """Loading, from-hf's copy and to-hf's export read the same table: a sentencepiece model under
  any name transformers gives it loads as the one bertjax saved (was: spm.model only)."""
  from bertjax.convert import hf_tokenizer  # pylint: disable=g-import-not-at-top
  assert convert.TOKENIZER_FILES == tokenizers.TOKENIZER_FILES
  saved = tokenizers.train_sentencepiece(_sample_lines(800), tmp_path / "ours", vocab_size=300,
                                         lowercase=True, num_threads=1)
  for names in tokenizers.KIND_FILES["sentencepiece"]:
    folder = tmp_path / names[0]
    folder.mkdir()
    (folder / names[0]).write_bytes((tmp_path / "ours" / tokenizers.SPM_FILE).read_bytes())
    loaded = tokenizers.load_tokenizer(folder)
    assert loaded.fingerprint() == saved.fingerprint() and loaded.lowercase, names
    assert hf_tokenizer.copy_files(folder, tmp_path / f"copy_{names[0]}") == [names[0]]
