"""Checks that come before the work they guard: every setting before the tokenizer is trained,
the corpus prepared or the model initialized; a sweep's every point before the first runs (and
in --dry_run); the train step's memory against the device's before the first step."""

import logging
import pathlib

import jax
import jax.numpy as jnp
import pytest

from bertjax import inputs, sweep
from bertjax.config import config_lib
from bertjax.core.errors import UserError
from bertjax.data import prepare
from bertjax.runtime import step_memory
from bertjax.trainer import train
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
  """The runlocal quickstart on raw text: its first run trains a tokenizer, prepares a corpus."""
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
  assert not (tmp_path / "run").exists()


def test_packing_rows_with_a_pair_label_is_refused_before_the_workdir(tmp_path, no_work):
  with pytest.raises(UserError, match="data.pack=True is for single-segment data"):
    train.train_and_evaluate(corpus_config(**{"data.pack": True}), tmp_path / "run")
  assert not (tmp_path / "run").exists()


def test_a_squad_question_longer_than_the_row_is_refused_before_reading_data(tmp_path, no_work):
  config = config_lib.load_config_file(str(REPO / "configs/squad.py"))
  config_lib.apply_overrides(config, ["max_seq_length=64", "max_query_length=60",
                                      "data_dir=/nonexistent"])
  with pytest.raises(UserError, match="max_seq_length=64 leaves fewer than 8 passage tokens"):
    train.train_and_evaluate(config, tmp_path / "run")
  assert not (tmp_path / "run").exists()  # refused before the workdir is even created


def test_a_pretraining_run_with_no_data_source_is_refused_before_the_workdir(tmp_path):
  """configs/bert.py names no corpus: refused in one line before the workdir is made or locked
  (it used to be refused by the input builder, inside a made and locked workdir)."""
  from tests.test_config_checks import one_error_line
  from tests.test_train import run_launch
  workdir = tmp_path / "x"
  r = run_launch("--config", "configs/bert.py", "--workdir", str(workdir))
  one_error_line(r, "no training data: set --config.data_dir to a prepared corpus or "
                    "--config.data.corpus to raw text files")
  assert not workdir.exists()


# --------------------------------------------------------------------------- sweeps


def write_sweep(path: pathlib.Path, body: dict) -> str:
  path.write_text(f"def get_sweep():\n  return {body!r}\n")
  return str(path)


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_sweep_points_range_error_is_refused_before_any_point_runs(tmp_path, dry_run):
  path = write_sweep(tmp_path / "s.py", {"config": "configs/quickstart.py:runlocal",
                                         "product": {"optimizer.b2": [0.999, 1.5]}})
  with pytest.raises(UserError, match=r"point optimizer\.b2=1\.5: optimizer\.b2=1\.5 must be") as e:
    sweep.run_sweep(path, tmp_path / "w", dry_run=dry_run)
  assert "\n" not in str(e.value)
  assert not (tmp_path / "w").exists()  # no point ran, no sweep.json


def test_a_sweep_points_bad_choice_is_refused_in_dry_run(tmp_path):
  path = write_sweep(tmp_path / "s.py", {"config": "configs/quickstart.py:runlocal",
                                         "points": [{"seed": 0}, {"nonfinite_policy": "skp"}]})
  with pytest.raises(UserError, match=r"point nonfinite_policy=skp: nonfinite_policy='skp'"):
    sweep.run_sweep(path, tmp_path / "w", dry_run=True)


@pytest.mark.parametrize("product, needle", [
    ({"max_seq_length": [64, 256]}, "point max_seq_length=256: max_seq_length=256 exceeds the "
     "model's 128 positions"),
    ({"model.remat_policy": ["full", "som"]}, "point model.remat_policy=som: unknown "
     "model.remat_policy='som'"),
])
def test_a_sweep_point_the_model_refuses_is_refused_in_dry_run(tmp_path, product, needle):
  path = write_sweep(tmp_path / "s.py", {"config": "configs/quickstart.py:runlocal",
                                         "product": product})
  with pytest.raises(UserError, match=needle):
    sweep.run_sweep(path, tmp_path / "w", dry_run=True)


@pytest.mark.parametrize("swept", [{"product": {"seed": [0, 1]}}, {"points": [{"seed": 2}]}])
def test_a_key_both_fixed_and_swept_is_refused(tmp_path, swept):
  path = write_sweep(tmp_path / "s.py", {"config": "configs/quickstart.py:runlocal",
                                         "fixed": {"seed": 5}, **swept})
  with pytest.raises(UserError, match="key 'seed' is both in 'fixed' and swept") as e:
    sweep.run_sweep(path, tmp_path / "w", dry_run=True)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("spec", sorted(str(p.relative_to(REPO))
                                        for p in (REPO / "experiments").glob("*.py")
                                        if "def get_sweep" in p.read_text()))
def test_every_sweep_file_of_experiments_passes_the_point_checks(spec):
  loaded = sweep.load_sweep(spec)
  assert loaded.points or loaded.search  # a search draws its points as it goes


# --------------------------------------------------------------------------- the step's memory


def test_the_step_estimate_counts_arguments_outputs_and_temporaries():
  x = jnp.ones((64, 64), jnp.float32)
  compiled = jax.jit(lambda a: (a @ a, a.sum())).lower(x).compile()
  need = step_memory.step_bytes(compiled)
  assert need is not None and need >= 2 * x.nbytes  # the argument and the product
  limit, what = step_memory.device_limit(jax.local_devices()[0])
  assert limit > need and "memory" in what


def test_a_step_that_cannot_fit_is_refused_in_one_line_before_it_runs(tmp_path, monkeypatch):
  monkeypatch.setattr(step_memory, "device_limit", lambda device: (2**16, "a 64 KiB test limit"))
  ran = []
  monkeypatch.setattr(train.RunRecord, "add", lambda *a: ran.append(a))
  with pytest.raises(UserError, match=r"the train step needs about [0-9.]+ MiB per device .*but "
                     r"a 64 KiB test limit is 0\.1 MiB; fix: a smaller --config\.batch_size") as e:
    train.train_and_evaluate(tiny_config(total_steps=2), tmp_path / "run")
  assert "\n" not in str(e.value) and not ran  # no step ran
  assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.slow
def test_a_run_that_fits_prints_its_estimate_once_and_compiles_its_step_once(tmp_path, capsys,
                                                                             caplog):
  with jax.log_compiles(True), caplog.at_level(logging.WARNING):
    summary = train.train_and_evaluate(tiny_config(nonfinite_policy="skip", total_steps=2),
                                       tmp_path / "run")
  assert summary["step"] == 2 and summary["status"] == "finished"
  lines = [l for l in capsys.readouterr().err.splitlines() if "the train step needs" in l]
  assert len(lines) == 1 and "per device of" in lines[0], lines
  compiles = [r for r in caplog.records if "Compiling jit(train_step)" in r.getMessage()]
  assert len(compiles) == 1, [r.getMessage()[:120] for r in compiles]
