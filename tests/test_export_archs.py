"""Export of the other architectures' training workdirs (RoBERTa, ALBERT, ELECTRA, SpanBERT) and
of WordPiece and BPE tokenizers, each checked against transformers."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import tokenizers as hf_tokenizers
import transformers as T

import bertjax
from bertjax import convert
from bertjax.data import tokenizers
from bertjax.trainer import train

from export_helpers import (QUIET, TOL, glue_run, hf_load, hf_logits, max_diff, own_prediction,
                            pretraining_outputs, sample_ids, to_hf)
from helpers import TINY, load_config


# ----------------------------------------------------------------------------- other architectures

ARCHS = {  # config, the class its export is, a model with its heads' outputs to compare
    "roberta": ("configs/roberta.py:runlocal", "RobertaForMaskedLM"),
    "albert": ("configs/albert.py:runlocal", "AlbertForPreTraining"),
    "electra": ("configs/electra.py:size=small,runlocal", "ElectraForPreTraining"),
}


@pytest.fixture(scope="module")
def arch_runs(tmp_path_factory):
  """A 2-step pretraining workdir of each architecture (its runlocal config, tiny sizes)."""
  runs = {}

  def get(arch: str) -> pathlib.Path:
    if arch not in runs:
      extra = {} if arch == "roberta" else {"model.embedding_size": 16}
      config = load_config(ARCHS[arch][0], **{**TINY, **extra, "total_steps": 2,
                                              "eval_every": 0, "checkpoint_every": 2,
                                              "batch_size": 8})
      runs[arch] = tmp_path_factory.mktemp(arch) / "run"
      train.train_and_evaluate(config, runs[arch])
    return runs[arch]
  return get


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCHS))
def test_architecture_round_trip(arch_runs, tmp_path, arch):
  """Training workdir -> to-hf -> transformers (same outputs) -> from-hf -> bertjax (same)."""
  workdir = arch_runs(arch)
  lines = []
  convert.convert_to_hf(workdir, tmp_path / "hf", log=lines.append)
  folder = tmp_path / "hf" / ("discriminator" if arch == "electra" else "")
  written = json.loads((folder / "config.json").read_text())
  assert written["architectures"] == [ARCHS[arch][1]] and written["model_type"] == arch
  hf = hf_load(getattr(T, ARCHS[arch][1]), folder)
  m = bertjax.load(workdir)
  _, _, ids, mask, types = sample_ids(workdir)
  types = types * (m.config.type_vocab_size > 1)
  ours = pretraining_outputs(m, ids, mask, types)
  field = "prediction_logits" if arch == "albert" else "logits"
  real = mask.astype(bool)
  assert max_diff(np.asarray(ours["logits"])[real], hf_logits(hf, ids, mask, types, field)[real]) < TOL
  if arch == "albert":
    assert max_diff(ours["sop"], hf_logits(hf, ids, mask, types, "sop_logits")) < TOL
  if arch == "roberta":  # MLM only: the pooler was never trained, and RobertaForMaskedLM has none
    assert m.untrained == ("pooler",)
  # ... and back into bertjax: the same outputs again.
  convert.convert_from_hf(folder, tmp_path / "back", **QUIET)
  again = pretraining_outputs(bertjax.load(tmp_path / "back"), ids, mask, types)
  assert max_diff(np.asarray(again["logits"])[real], np.asarray(ours["logits"])[real]) < TOL
  if arch == "electra":  # the generator, with a copy of the shared embeddings
    gen = hf_load(T.ElectraForMaskedLM, tmp_path / "hf" / "generator")
    g = m.source.converted.generator
    positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    out = convert.build_model(g.config, ("mlm",)).apply({"params": g.params}, ids, mask, types,
                                                         positions, deterministic=True)
    assert max_diff(np.asarray(out["mlm_logits"])[real], hf_logits(gen, ids, mask, types)[real]) < TOL
    assert any(l.startswith("wrote ElectraForMaskedLM") for l in lines), lines


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCHS))
def test_sequence_classifier_of_each_architecture(arch_runs, tmp_path_factory, data_dir, arch):
  """GLUE fine-tuned from each architecture: RoBERTa's classifier maps onto
  RobertaClassificationHead (our pooler is its dense layer), ALBERT's onto its classifier; no
  transformers class matches ELECTRA's (its head has a GELU layer ours lacks): one line."""
  config, workdir = glue_run(tmp_path_factory, data_dir, "rte", init_from=str(arch_runs(arch)),
                             total_steps=2, eval_every=2)
  out = workdir.parent / "hf"
  code, stdout, stderr = to_hf("--workdir", workdir, "--output", out)
  if arch == "electra":
    assert code == 2 and len(stderr) == 1, stderr
    assert "no transformers class matches this electra sequence classifier" in stderr[0]
    assert "dense + GELU + linear" in stderr[0] and "bertjax.load" in stderr[0]
    assert not out.exists()
    return
  assert code == 0, stderr
  m = bertjax.load(workdir)
  eval_set, ours = own_prediction(config, workdir, m.head_params)
  a = {k: v[:32] for k, v in eval_set.arrays.items()}
  hf = hf_load(T.AutoModelForSequenceClassification, out)
  assert type(hf).__name__ == {"roberta": "RobertaForSequenceClassification",
                               "albert": "AlbertForSequenceClassification"}[arch]
  types = a["token_type_ids"] * (m.config.type_vocab_size > 1)
  theirs = hf_logits(hf, a["input_ids"], a["attention_mask"], types)
  assert max_diff(theirs, ours["logits"][:32]) < TOL


# ----------------------------------------------------------------------------- tokenizers

TEXTS = [("Hello world, the river's valley.", "Über café naïve Ünïcode [MASK] text"),
         ("tokenizers split words into pieces", "a second segment of text")]


def _wordpiece(folder: pathlib.Path) -> tokenizers.Tokenizer:
  words = sorted({w for a, b in TEXTS for w in (a + " " + b).lower().replace(",", " , ")
                  .replace(".", " . ").replace("'", " ' ").split()})
  chars = sorted({c for w in words for c in w})
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *[f"##{c}" for c in chars],
           *[w for w in words if len(w) > 1][::2]]
  folder.mkdir()
  (folder / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n", encoding="utf-8")
  return tokenizers.WordPieceTokenizer(folder / "vocab.txt", lowercase=True)


def _bpe(folder: pathlib.Path) -> tokenizers.Tokenizer:
  bpe = hf_tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator([t for pair in TEXTS for t in pair] * 5, vocab_size=300,
                          special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
  folder.mkdir()
  bpe.save_model(str(folder))
  return tokenizers.ByteLevelBPETokenizer(folder / "vocab.json", folder / "merges.txt")


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_tokenizer_files_load_in_transformers(tmp_path, kind):
  """A workdir's WordPiece or BPE tokenizer, written for transformers, gives bertjax's ids with
  the special tokens bertjax's pipelines place ([CLS] A [SEP] B [SEP]; <s> A </s></s> B </s>)."""
  ours = {"wordpiece": _wordpiece, "bpe": _bpe}[kind](tmp_path / "src")
  ours.save(tmp_path / "tok")
  files = convert.hf_tokenizer.write_hf_tokenizer(tmp_path / "tok", tmp_path / "hf", 128)
  assert "tokenizer.json" in files and "tokenizer_config.json" in files
  for fast in (True, False):
    tok = T.AutoTokenizer.from_pretrained(tmp_path / "hf", use_fast=fast)
    for a, b in TEXTS:
      ea, eb = ours.encode(a), ours.encode(b)
      if kind == "wordpiece":
        want = [ours.cls_id, *ea, ours.sep_id, *eb, ours.sep_id]
      else:
        want = [ours.cls_id, *ea, ours.sep_id, ours.sep_id, *eb, ours.sep_id]
      assert tok(a, b)["input_ids"] == want, (fast, a, b)
      if kind == "wordpiece":
        assert tok(a, b)["token_type_ids"] == [0] * (len(ea) + 2) + [1] * (len(eb) + 1)


@pytest.mark.slow
def test_spanbert_export_names_the_head_it_leaves_out(tmp_path):
  config = load_config("configs/spanbert.py:runlocal", **{**TINY, "total_steps": 2,
                                                          "eval_every": 0, "checkpoint_every": 2,
                                                          "batch_size": 8})
  train.train_and_evaluate(config, tmp_path / "run")
  lines = []
  convert.convert_to_hf(tmp_path / "run", tmp_path / "hf", log=lines.append)
  assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == [
      "BertForMaskedLM"]
  assert "left out sbo: no transformers class holds SpanBERT's span boundary head" in lines
  m = bertjax.load(tmp_path / "run")
  _, _, ids, mask, types = sample_ids(tmp_path / "run")
  hf = hf_load(T.BertForMaskedLM, tmp_path / "hf")
  real = mask.astype(bool)
  ours = pretraining_outputs(m, ids, mask, types)["logits"]
  assert max_diff(np.asarray(ours)[real], hf_logits(hf, ids, mask, types)[real]) < TOL
