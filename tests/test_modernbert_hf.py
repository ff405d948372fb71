"""ModernBERT's fine-tuning classes and its tokenizer across bertjax and Hugging Face.

Each task class (ModernBertForSequenceClassification with "cls" and "mean" pooling,
ModernBertForTokenClassification, ModernBertForQuestionAnswering) against bertjax's
SequenceClassifier / TokenClassifier at random init, float32, on the CPU: three layers (layer 0
global, 1 and 2 local, a window of 8), rows of 33 tokens, one unpadded and two padded. Then the
folders: from-hf of each class gives a converted folder whose `bertjax.load` runs the head; to-hf
writes the class back; a tokenizer.json (byte-level BPE with [CLS]/[SEP]/[MASK]/[PAD], as
ModernBERT's) read by bertjax and written back gives AutoTokenizer's ids; and a ModernBERT run
trained here goes to transformers and back with the same outputs.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import torch
import transformers as T

import bertjax
from bertjax import convert
from bertjax.convert.hf_configs import modernbert_model_config
from bertjax.convert.names import encoder_entries, hf_to_params, task_head_entries
from bertjax.models.classifiers import SequenceClassifier, TokenClassifier

# The tiny model, its rows and its random weights, shared with the encoder's parity tests.
from test_modernbert import BIASES, TINY, TOL, inputs, randomize

# (transformers class, our task kind, our head name, labels, extra ModernBertConfig settings)
CLASSES = {
    "sequence_cls": (T.ModernBertForSequenceClassification, "sequence", "classifier", 3,
                     dict(classifier_pooling="cls")),
    "sequence_mean": (T.ModernBertForSequenceClassification, "sequence", "classifier", 3,
                      dict(classifier_pooling="mean", **BIASES)),
    "token": (T.ModernBertForTokenClassification, "token", "classifier", 5, BIASES),
    "qa": (T.ModernBertForQuestionAnswering, "qa", "qa_outputs", 2, {}),
}


def hf_model(name: str) -> torch.nn.Module:
  cls, _, _, labels, extra = CLASSES[name]
  config = T.ModernBertConfig(**TINY, **extra, num_labels=labels, attn_implementation="eager")
  return randomize(cls(config))


def bertjax_model(name: str, cfg):
  _, kind, head, labels, _ = CLASSES[name]
  if kind == "sequence":
    return SequenceClassifier(cfg, labels)
  return TokenClassifier(cfg, labels, head_name=head)


def hf_logits(hf: torch.nn.Module, ids, mask) -> np.ndarray:
  with torch.no_grad():
    out = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
  if hasattr(out, "start_logits"):
    return torch.stack([out.start_logits, out.end_logits], -1).numpy()
  return out.logits.numpy()


def close(ours, theirs, mask, what: str):
  """Max abs difference at the real tokens (sequence logits: every row)."""
  ours, theirs = np.asarray(ours), np.asarray(theirs)
  assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
  keep = mask.astype(bool) if ours.ndim == 3 else np.ones(ours.shape[0], bool)
  diff = float(np.max(np.abs(ours - theirs)[keep]))
  assert diff < TOL, f"{what}: max abs diff {diff}"


@pytest.mark.parametrize("name", list(CLASSES))
def test_task_class_matches_transformers(name):
  """The weights cross by bertjax.convert.names' task-head mapping; logits agree."""
  hf = hf_model(name)
  cfg = modernbert_model_config(hf.config.to_dict())
  _, kind, _, labels, _ = CLASSES[name]
  state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
  entries = encoder_entries(cfg) + task_head_entries(cfg, kind, labels)
  params, missing, ignored = hf_to_params(state, cfg, (), entries)
  assert missing == [] and ignored == []
  ids, mask = inputs()
  ours = bertjax_model(name, cfg).apply({"params": params}, ids, mask, np.zeros_like(ids))
  close(ours, hf_logits(hf, ids, mask), mask, name)


@pytest.mark.parametrize("name", ["sequence_mean", "token", "qa"])
def test_from_hf_load_and_to_hf_keep_the_task_head(tmp_path, name):
  """from-hf of a fine-tuned class: `bertjax.load` runs its head with transformers' logits;
  to-hf writes the same class with the same tensors, labels and pooling."""
  hf = hf_model(name)
  _, kind, head, labels, _ = CLASSES[name]
  if kind == "sequence":
    hf.config.id2label = {i: f"L{i}" for i in range(labels)}
    hf.config.label2id = {f"L{i}": i for i in range(labels)}
  hf.save_pretrained(tmp_path / "hf")
  convert.convert_from_hf(tmp_path / "hf", tmp_path / "work", log=lambda *_: None)
  m = bertjax.load(tmp_path / "work")
  assert (m.task.kind, m.task.name, m.task.num_labels) == (kind, head, labels)
  ids, mask = inputs(seed=3)
  close(m.logits(ids, mask, np.zeros_like(ids)), hf_logits(hf, ids, mask), mask, name)
  lines = []
  convert.convert_to_hf(tmp_path / "work", tmp_path / "back", log=lines.append)
  config = json.loads((tmp_path / "back" / "config.json").read_text())
  assert config["architectures"] == [type(hf).__name__], lines
  back = type(hf).from_pretrained(tmp_path / "back")
  want, got = hf.state_dict(), back.state_dict()
  assert set(want) == set(got)
  assert all(torch.equal(want[k], got[k]) for k in want)
  assert back.config.classifier_pooling == hf.config.classifier_pooling
  if kind == "sequence":
    assert back.config.id2label == hf.config.id2label


TEXTS = ["The river valley was settled in 1998 .", "  Two  spaces, and a [MASK] token here.",
         "naïve café — ünïcödé text", "Short one ."]
SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]


def bpe_folder(path: pathlib.Path, texts: list[str], vocab_size: int = 300) -> pathlib.Path:
  """A transformers folder holding a ModernBERT-style tokenizer: a byte-level BPE tokenizer.json
  with [UNK] [CLS] [SEP] [PAD] [MASK] ([MASK] taking the space before it), its post-processor
  and a tokenizer_config.json naming the specials, as answerdotai's checkpoints ship it."""
  from tokenizers import (AddedToken, Tokenizer, decoders, models, pre_tokenizers,
                          processors, trainers)
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(texts, trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  tok.add_special_tokens([AddedToken("[MASK]", lstrip=True, normalized=False)])
  cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
  tok.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
      special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
  path.mkdir(parents=True, exist_ok=True)
  tok.save(str(path / "tokenizer.json"))
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 64,
            "model_input_names": ["input_ids", "attention_mask"],
            **{f"{t[1:-1].lower()}_token": t for t in SPECIALS}}
  (path / "tokenizer_config.json").write_text(json.dumps(config))
  return path


def bertjax_ids(tok, a: str, b: str | None = None) -> list[int]:
  """[CLS] A [SEP] (B [SEP]), as bertjax's pipelines place the specials."""
  ids = [tok.cls_id, *tok.encode(a), tok.sep_id]
  return ids + ([*tok.encode(b), tok.sep_id] if b is not None else [])


def test_tokenizer_json_is_read_and_written_with_autotokenizer_ids(tmp_path):
  """bertjax reads a ModernBERT-style tokenizer.json with AutoTokenizer's ids; saved by bertjax
  and written for transformers, AutoTokenizer loads it and gives the same ids again."""
  from bertjax.convert.hf_tokenizer import write_hf_tokenizer
  from bertjax.data import tokenizers
  hf_dir = bpe_folder(tmp_path / "hf", TEXTS * 20)
  theirs = T.AutoTokenizer.from_pretrained(hf_dir)
  tok = tokenizers.load_tokenizer(hf_dir)
  assert tok.kind == "json" and tok.mask_id == theirs.mask_token_id
  assert (tok.cls_id, tok.sep_id, tok.pad_id) == (theirs.cls_token_id, theirs.sep_token_id,
                                                  theirs.pad_token_id)
  pairs = [(t, None) for t in TEXTS] + [(TEXTS[0], TEXTS[1]), (TEXTS[2], TEXTS[3])]
  for a, b in pairs:
    assert bertjax_ids(tok, a, b) == theirs(a, b)["input_ids"], (a, b)
  tok.save(tmp_path / "ours")
  again = tokenizers.load_tokenizer(tmp_path / "ours")
  assert again.kind == "json" and again.fingerprint() == tok.fingerprint()
  write_hf_tokenizer(tmp_path / "ours", tmp_path / "back", 64, "modernbert")
  back = T.AutoTokenizer.from_pretrained(tmp_path / "back")
  for a, b in pairs:
    out = back(a, b)
    assert out["input_ids"] == bertjax_ids(again, a, b), (a, b)
    assert set(out) == {"input_ids", "attention_mask"}
  assert back.decode(back("Short one .")["input_ids"], skip_special_tokens=True) == "Short one ."


def rte_texts(data: pathlib.Path, n: int = 200) -> list[str]:
  rows = (data / "glue" / "RTE" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:n]
  return [t for r in rows for t in r.split("\t")[1:3]]


@pytest.mark.slow
def test_trained_run_goes_to_transformers_and_back_with_equal_outputs(tmp_path):
  """A ModernBertForMaskedLM folder with a tokenizer.json -> from-hf -> a GLUE (RTE) fine-tune
  of a few steps with it as init_from (its tokenizer, mean pooling) -> to-hf: transformers'
  ModernBertForSequenceClassification gives bertjax's logits on AutoTokenizer's ids, which are
  bertjax's; -> from-hf again: `bertjax.load` gives them too."""
  import os  # pylint: disable=g-import-not-at-top
  from bertjax.data import tokenizers  # pylint: disable=g-import-not-at-top
  from bertjax.trainer import train  # pylint: disable=g-import-not-at-top
  from helpers import TINY as RUN, load_config  # pylint: disable=g-import-not-at-top
  data = pathlib.Path(os.environ.get("BERTJAX_DATA", "/work/shared/data"))
  if not (data / "glue" / "RTE").is_dir():
    pytest.skip("needs BERTJAX_DATA's glue/RTE")
  hf_dir = bpe_folder(tmp_path / "mlm", rte_texts(data), vocab_size=400)
  vocab = len(json.loads((hf_dir / "tokenizer.json").read_text())["model"]["vocab"])
  pad = T.AutoTokenizer.from_pretrained(hf_dir).pad_token_id
  mlm = T.ModernBertForMaskedLM(T.ModernBertConfig(**{**TINY, "vocab_size": vocab,
                                                      "pad_token_id": pad}))
  mlm.save_pretrained(hf_dir)
  convert.convert_from_hf(hf_dir, tmp_path / "init", log=lambda *_: None)
  root = tmp_path / "glue"
  (root / "RTE").mkdir(parents=True)
  for name in ("train.tsv", "dev.tsv"):
    (root / "RTE" / name).symlink_to(data / "glue" / "RTE" / name)
  config = load_config("configs/glue.py:task=rte,runlocal", **{
      # The model is init_from's: model settings other than its own are refused (issue 41).
      **{k: v for k, v in RUN.items() if not k.startswith("model.")},
      "data_dir": str(root), "init_from": str(tmp_path / "init"),
      "model.classifier_pooling": "mean", "max_train_examples": 32, "total_steps": 3,
      "batch_size": 8, "eval_batch_size": 32, "max_seq_length": 48, "eval_every": 3,
      "learning_rate": 1e-2, "best_metric": ""})
  train.train_and_evaluate(config, tmp_path / "run")
  ours = bertjax.load(tmp_path / "run")
  assert ours.config.architecture == "modernbert" and ours.config.classifier_pooling == "mean"
  assert ours.source.tokenizer is not None and tokenizers.load_tokenizer(
      ours.source.tokenizer).kind == "json"
  convert.convert_to_hf(tmp_path / "run", tmp_path / "hf", log=lambda *_: None)
  hf = T.ModernBertForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
  assert hf.config.classifier_pooling == "mean"
  theirs_tok = T.AutoTokenizer.from_pretrained(tmp_path / "hf")
  tok = tokenizers.load_tokenizer(ours.source.tokenizer)
  pairs = list(zip(rte_texts(data, 6)[0::2], rte_texts(data, 6)[1::2]))
  batch = theirs_tok([a for a, _ in pairs], [b for _, b in pairs], padding=True,
                     return_tensors="np")
  for i, (a, b) in enumerate(pairs):
    row = bertjax_ids(tok, a, b)
    assert batch["input_ids"][i, :len(row)].tolist() == row
  ids, mask = batch["input_ids"], batch["attention_mask"]
  assert ids.shape[1] > TINY["local_attention"] and mask.min() == 0  # the window, and padding
  logits = ours.logits(ids, mask, np.zeros_like(ids))
  close(logits, hf_logits(hf, ids, mask), mask, "exported")
  # Trained: the head differs from a fresh one's init (its norm scale left 1).
  assert not np.allclose(ours.head_params["classifier"]["norm"]["scale"], 1.0)
  convert.convert_from_hf(tmp_path / "hf", tmp_path / "back", log=lambda *_: None)
  back = bertjax.load(tmp_path / "back")
  assert back.task.labels == ours.task.labels
  close(back.logits(ids, mask, np.zeros_like(ids)), logits, mask, "back")
