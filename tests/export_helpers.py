"""What the export tests share: running to-hf, loading its output in transformers, and bertjax's
own outputs (tiny GLUE runs, the runs' prediction pass, pretraining heads at every position)."""

from __future__ import annotations

import pathlib

import numpy as np
import torch

from bertjax.data import tokenizers
from bertjax.registry import get_objective
from bertjax.runtime import sharding
from bertjax.trainer import eval_context, train

from helpers import TINY, load_config, run_module

TOL = 1e-4
SMALL = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=37, max_position_embeddings=40)
QUIET = dict(log=lambda *_: None)


def to_hf(*args) -> tuple[int, list[str], list[str]]:
  proc = run_module("-m", "bertjax.convert", "to-hf", *map(str, args))
  return proc.returncode, proc.stdout.splitlines(), proc.stderr.strip().splitlines()


def hf_logits(model, ids, mask, types, field="logits"):
  with torch.no_grad():
    out = model(input_ids=torch.tensor(np.asarray(ids, np.int64)),
                attention_mask=torch.tensor(np.asarray(mask, np.int64)),
                token_type_ids=torch.tensor(np.asarray(types, np.int64)))
  return getattr(out, field).numpy()


def hf_load(cls, path):
  """transformers' `cls` from `path`, checking that every weight came from the export (none
  initialized fresh, none ignored)."""
  model, info = cls.from_pretrained(path, output_loading_info=True)
  assert info["missing_keys"] == [] and info["unexpected_keys"] == [], info
  return model.eval()


def max_diff(a, b) -> float:
  return float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))


def sample_ids(workdir: pathlib.Path):
  tok = tokenizers.load_tokenizer(workdir / "tokenizer")
  texts = [("The game began in 1998 .", "It was released in Japan ."), ("A second, longer line of "
           "text about the history of the river valley .", "Short one .")]
  rows = [[tok.cls_id, *tok.encode(a), tok.sep_id, *tok.encode(b), tok.sep_id] for a, b in texts]
  seq = max(map(len, rows))
  ids = np.full((len(rows), seq), tok.pad_id, np.int32)
  mask, types = np.zeros_like(ids), np.zeros_like(ids)
  for i, (r, (a, _)) in enumerate(zip(rows, texts)):
    ids[i, :len(r)], mask[i, :len(r)] = r, 1
    types[i, len(tok.encode(a)) + 2:len(r)] = 1
  return tok, texts, ids, mask, types


def own_prediction(config, workdir: pathlib.Path, params):
  """The run's own prediction pass (EvalContext.predict_rows) over its first dev set."""
  objective = get_objective(config)
  data = objective.build_inputs(config, workdir)
  context = eval_context.standalone(config, objective, objective.model_config(config), data,
                                    workdir, sharding.make_mesh(config.mesh_shape))
  eval_set = data.eval_sets[0]
  return eval_set, context.predict_rows(params, eval_set, 0)


def glue_run(tmp_path_factory, data_dir, task: str, **settings):
  folder = {"rte": "RTE", "stsb": "STS-B"}[task]
  root = tmp_path_factory.mktemp(task) / "glue"
  (root / folder).mkdir(parents=True)
  for name in ("train.tsv", "dev.tsv"):
    (root / folder / name).symlink_to(data_dir / "glue" / folder / name)
  config = load_config(f"configs/glue.py:task={task},runlocal",
                       **{**TINY, "data_dir": str(root), "max_train_examples": 64,
                          "total_steps": 4, "batch_size": 16, "eval_batch_size": 32,
                          "max_seq_length": 64, "eval_every": 4, **settings})
  workdir = root.parent / "run"
  train.train_and_evaluate(config, workdir)
  return config, workdir


def pretraining_outputs(m, ids, mask, types):
  """bertjax's head outputs at every position: MLM logits (+ pair), or ELECTRA's RTD logits."""
  if "rtd" in m.heads:
    return {"logits": m.head_model.apply({"params": m.head_params}, ids, mask, types,
                                         deterministic=True)["rtd_logits"]}
  positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  out = m.head_model.apply({"params": m.head_params}, ids, mask, types, positions,
                           deterministic=True)
  return {"logits": out["mlm_logits"], **({"sop": out["pair_logits"]} if "pair_logits" in out
                                          else {})}
