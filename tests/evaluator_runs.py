"""Tiny GLUE, SQuAD and CoNLL runs whose evaluation tests/test_evaluators.py compares with what
the objective-based evaluation gave on the same parameters before evaluators moved out of the
objectives (tests/golden/evaluators_before.json, recorded at 2981da0 with `record`)."""

from __future__ import annotations

import json
import pathlib
import sys

import flax.linen as nn
import jax

from bertjax.data import tokenizers
from bertjax.metrics import glue as glue_eval
from bertjax.metrics import ner as ner_eval
from bertjax.registry import get_objective
from helpers import TINY, conll_part, load_config

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden" / "evaluators_before.json"
FAMILIES = ("glue", "squad", "ner")


def _tokenizer(folder: pathlib.Path, texts, vocab: int) -> str:
  tokenizers.train_sentencepiece(texts, folder, vocab_size=vocab, num_threads=1)
  return str(folder)


def config_of(family: str, tmp: pathlib.Path, data: pathlib.Path):
  """A fine-tuning config on tiny data with its own sentencepiece tokenizer (step 1 of 1, so the
  final evaluation's test predictions are made where the task has a test set)."""
  common = {**TINY, "total_steps": 1, "eval_every": 1, "eval_batch_size": 16, "batch_size": 16}
  if family == "glue":
    rows = glue_eval.read_glue_tsv(data / "glue/RTE/train.tsv", "rte", "train")[:200]
    tok = _tokenizer(tmp / "tok", [r["sentence1"] for r in rows], 500)
    return load_config("configs/glue.py:task=rte,runlocal", data_dir=str(data / "glue"),
                       max_train_examples=16, max_seq_length=64,
                       **{**common, "data.tokenizer": tok, "model.vocab_size": 500})
  if family == "squad":
    examples = json.loads((data / "squad/v2.0_dev_subset.json").read_text(encoding="utf-8"))
    articles = examples["data"][:2]
    texts = [p["context"] for a in articles for p in a["paragraphs"]]
    tok = _tokenizer(tmp / "tok", texts, 800)
    (tmp / "sq.json").write_text(json.dumps({**examples, "data": articles}), encoding="utf-8")
    return load_config("configs/squad.py:version=2.0,runlocal", data_dir=str(tmp),
                       train_file="sq.json", dev_file="sq.json", max_seq_length=96,
                       doc_stride=48, max_query_length=24, max_train_examples=16,
                       **{**common, "data.tokenizer": tok, "model.vocab_size": 800})
  conll = data / "conll2003"
  conll_part(conll / "valid.txt", tmp / "train.txt", 0, 40)
  conll_part(conll / "valid.txt", tmp / "dev.txt", 40, 60)
  conll_part(conll / "valid.txt", tmp / "test.txt", 100, 30)
  sentences = ner_eval.read_conll(conll / "valid.txt")[:200]
  tok = _tokenizer(tmp / "tok", (" ".join(s.tokens) for s in sentences), 500)
  return load_config("configs/ner.py:runlocal", data_dir=str(tmp), train_file="train.txt",
                     dev_file="dev.txt", test_file="test.txt", max_seq_length=48,
                     **{**common, "data.tokenizer": tok, "model.vocab_size": 500})


def prepared(family: str, tmp: pathlib.Path, data: pathlib.Path):
  """(config, objective, inputs, model config, initialized parameters) of `family`'s run."""
  config = config_of(family, tmp, data)
  objective = get_objective(config)
  inputs = objective.build_inputs(config, tmp / "run")
  model_cfg = objective.model_config(config)
  model = objective.make_model(config, model_cfg)
  batch = objective.init_batch(config, 1, config.max_seq_length, config.max_predictions_per_seq)
  params = nn.meta.unbox(objective.init_params(model, jax.random.key(7), batch))
  return config, objective, inputs, model_cfg, params


def record(tmp: pathlib.Path, data: pathlib.Path) -> dict:
  """What the objective-based evaluation (2981da0: `Objective.evaluate` with an `EvalContext`)
  gives for each family's run: the numbers recorded in GOLDEN."""
  from bertjax.runtime import sharding  # pylint: disable=import-outside-toplevel
  from bertjax.trainer import eval_context  # pylint: disable=import-outside-toplevel
  out = {}
  for family in FAMILIES:
    folder = tmp / family
    folder.mkdir(parents=True)
    config, objective, inputs, model_cfg, params = prepared(family, folder, data)
    context = eval_context.standalone(config, objective, model_cfg, inputs, folder / "run",
                                      sharding.make_mesh(config.mesh_shape), step=1,
                                      total_steps=1)
    out[family] = objective.evaluate(config, params, context)
  return out


if __name__ == "__main__":  # python tests/evaluator_runs.py TMP DATA (at 2981da0)
  GOLDEN.write_text(json.dumps(record(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])),
                               indent=1, sort_keys=True) + "\n")
