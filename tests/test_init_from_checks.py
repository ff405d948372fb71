"""init_from's model against the run's, checked before anything is prepared (issue 41).

Seen failing on dd89774: a fine-tuning run with `--config.model.hidden_size=256` and an
init_from of hidden size 128 trained the checkpoint's 128 without a word (the override dropped);
a BERT pretraining run from a converted ModernBERT logged "restored 1 tensors; initialized fresh
43" and trained from scratch.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from bertjax.config import config_checks
from bertjax.core.errors import UserError
from bertjax.models.config import ModelConfig
from bertjax.registry import get_objective
from bertjax.trainer import train

from helpers import load_config


def model_folder(path: pathlib.Path, **fields) -> pathlib.Path:
  """A stand-in for a converted folder (model.json + params/) holding a model of `fields`."""
  (path / "params").mkdir(parents=True)
  (path / "model.json").write_text(json.dumps(
      {"model": ModelConfig(**fields).to_dict(), "heads": [], "missing": []}))
  return path


def refused(config, workdir: pathlib.Path) -> str:
  with pytest.raises(UserError) as e:
    train.train_and_evaluate(config, workdir)
  assert not workdir.exists()  # refused before the workdir was made
  return str(e.value)


def test_a_model_override_that_fine_tuning_would_drop_is_refused(tmp_path):
  """Defect 4: fine-tuning trains init_from's model; a model setting given that disagrees is
  refused in one line naming both values, not dropped."""
  init = model_folder(tmp_path / "init", vocab_size=100, hidden_size=128, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=256, max_position_embeddings=64)
  spec = "configs/glue.py:task=rte,runlocal"
  config = load_config(spec, init_from=str(init), **{"model.hidden_size": 256,
                                                     "model.hidden_dropout_prob": 0.2})
  message = refused(config, tmp_path / "run")
  assert message.startswith("model.hidden_size=256 (init_from's: 128): fine-tuning trains the "
                            f"model of init_from={init}"), message
  assert "would be dropped; fix: drop --config.model.hidden_size" in message
  assert "hidden_dropout_prob" not in message  # a run setting: it applies to init_from's model
  # Settings that agree with init_from, and the config file's own model block, pass.
  for settings in ({"model.hidden_size": 128, "model.num_hidden_layers": 2}, {}):
    config = load_config(spec, init_from=str(init), **settings)
    config_checks.check_init_from_model(config, get_objective(config))


def test_pretraining_from_a_model_of_another_architecture_is_refused(tmp_path):
  """Defect 17: a BERT pretraining run from a converted ModernBERT, refused in one line."""
  init = model_folder(tmp_path / "init", architecture="modernbert", vocab_size=100,
                      hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                      intermediate_size=40, max_position_embeddings=64, use_pooler=False,
                      type_vocab_size=1, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0)
  config = load_config("configs/quickstart.py:runlocal", init_from=str(init))
  message = refused(config, tmp_path / "run")
  assert message.startswith(f"init_from={init} holds a modernbert model but this run pretrains "
                            "model.architecture='bert'"), message
  assert "fix: pretrain a modernbert model (--config.model.architecture=modernbert" in message
  assert "model.json" in message
