"""A run's start walked (tests/run_walk.py): from `train_and_evaluate` to its first step the
validator is entered once, and each settings derivation (the logical rules, the eval batch size)
happens once; nothing below the trainer calls back up into it."""

import pytest

from tests import run_walk

CHECKS = "bertjax.config.config_checks"
RUN_PLAN = "bertjax.trainer.run_plan"


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
  return run_walk.walk_a_run(tmp_path_factory.mktemp("walk") / "run")


def test_the_validator_is_entered_once_from_the_plan(walk):
  assert walk.entries(CHECKS, "check") == 1
  entered = [(caller, function) for caller, callee, function in walk.visits if callee == CHECKS]
  # Its one entry before the inputs, and the two checks of what only comes later (the inputs,
  # the parameters' layout), each once and each from the plan.
  assert sorted(entered) == [(RUN_PLAN, "check"), (RUN_PLAN, "check_data"),
                             (RUN_PLAN, "check_param_shardings")], entered


def test_each_derivation_happens_once(walk):
  assert walk.entries("bertjax.runtime.sharding", "rules_from_config") == 1
  assert walk.entries("bertjax.config.settings", "eval_batch_size") == 1
  assert sum(walk.derived_lines.values()) == 1, walk.derived_lines


def test_nothing_calls_back_up_into_the_trainer(walk):
  """The plan has no callback: no module below bertjax.trainer calls a trainer function, and
  within the trainer no call climbs (run_plan into train)."""
  assert walk.entries("bertjax.trainer.train", "train_and_evaluate") == 1
  ups = [c for c in walk.climbs if c[1].startswith("bertjax.trainer")]
  assert ups == [], ups
  assert walk.figures()["modules"] > 10  # the walk saw the run's start, not an empty trace


def test_a_fine_tuning_run_derives_its_eval_batch_size_once(tmp_path, data_dir):
  """A GLUE task's start: the eval batch size derived by the plan and handed to the task's
  inputs (it was derived three times: the checks, the plan, the task), the validator entered
  from the plan only (the task re-checked the positions itself)."""
  from tests.helpers import glue_data
  root = glue_data(tmp_path / "data", data_dir)
  walk = run_walk.walk_a_run(tmp_path / "run",
                             run_walk.tiny_glue(str(root), **{"data.vocab_size": 500}))
  assert sum(walk.derived_lines.values()) == 1, walk.derived_lines
  assert walk.entries("bertjax.runtime.sharding", "rules_from_config") == 1
  assert {caller for caller, callee, _ in walk.visits if callee == CHECKS} == {RUN_PLAN}
  assert walk.entries(CHECKS, "check") == 1 and walk.entries(CHECKS, "check_positions") == 1


def test_the_walker_counts_climbs_by_the_import_contract():
  import bertjax
  import pathlib
  rank = run_walk.layer_ranks(pathlib.Path(bertjax.__file__).resolve().parent.parent)
  assert run_walk.climbs_up(rank, "bertjax.trainer.run_plan", "bertjax.trainer.train")
  assert run_walk.climbs_up(rank, "bertjax.config.config_checks", "bertjax.objective")
  assert not run_walk.climbs_up(rank, "bertjax.trainer.train", "bertjax.config.config_checks")
  assert not run_walk.climbs_up(rank, "bertjax.models.encoder", "bertjax.data.masking")  # one line
