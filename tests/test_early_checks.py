"""Checks that come before the work they guard: every setting before the tokenizer is trained,
the corpus prepared or the model initialized; a sweep's every point before the first runs (and
in --dry_run); the train step's memory against the device's before the first step."""

import pathlib

import pytest

from bertjax import config_lib, inputs, train
from bertjax.data import prepare
from bertjax.errors import UserError
from tests.test_train import REPO, tiny_config


@pytest.fixture
def no_work(monkeypatch):
  """Tokenizer training, corpus preparation and model init raise: a refusal must come first."""
  def forbidden(what):
    def raise_(*args, **kwargs):
      raise AssertionError(f"{what} ran before the settings were refused")
    return raise_
  monkeypatch.setattr(inputs.tokenizers, "train_sentencepiece", forbidden("tokenizer training"))
  monkeypatch.setattr(prepare, "prepare_corpus", forbidden("corpus preparation"))
  monkeypatch.setattr(train, "setup", forbidden("model init"))


def corpus_config(**overrides):
  """The runlocal quickstart on raw text: its first run trains a tokenizer and prepares the corpus."""
  return tiny_config(**{"data.synthetic": False, "model.vocab_size": 4000, **overrides})


@pytest.mark.parametrize("overrides, needle", [
    ({"nonfinite_policy": "skp"}, "nonfinite_policy='skp' must be one of stop, skip"),
    ({"masking.strategy": "spam"}, "masking.strategy='spam' must be one of '', token"),
    ({"data.format": "csv"}, "data.format='csv' must be one of bert"),
])
def test_a_bad_choice_is_refused_before_the_tokenizer_and_corpus(tmp_path, no_work, overrides,
                                                                 needle):
  with pytest.raises(UserError, match=needle):
    train.train_and_evaluate(corpus_config(**overrides), tmp_path / "run")
  assert not (tmp_path / "run").exists()


def test_span_sbo_without_span_masking_is_refused_before_the_corpus(tmp_path, no_work):
  config = corpus_config(objective="span_sbo", **{"masking.strategy": "token"})
  with pytest.raises(UserError, match="objective span_sbo needs span masking"):
    train.train_and_evaluate(config, tmp_path / "run")


def test_a_squad_question_longer_than_the_row_is_refused_before_reading_data(tmp_path, no_work):
  config = config_lib.load_config_file(str(REPO / "configs/squad.py"))
  config_lib.apply_overrides(config, ["max_seq_length=64", "max_query_length=60",
                                      "data_dir=/nonexistent"])
  with pytest.raises(UserError, match="max_seq_length=64 leaves fewer than 8 passage tokens"):
    train.train_and_evaluate(config, tmp_path / "run")
  assert not (tmp_path / "run").exists()  # refused before the workdir is even created


def test_a_good_choice_still_trains(tmp_path):
  summary = train.train_and_evaluate(tiny_config(nonfinite_policy="skip", total_steps=2),
                                     pathlib.Path(tmp_path) / "run")
  assert summary["step"] == 2 and summary["status"] == "finished"
