"""The trainer's straight path: a run is planned once (bertjax/trainer/run_plan.py), the settings
checks are reached from one place, and the config passed in is the one every step reads (no
copy)."""

import ast
import pytest

from bertjax.config import config_checks
from bertjax.core.errors import UserError
from bertjax.trainer import run_plan, train
from tests.test_config_checks import fake_mesh
from tests.test_train import REPO, tiny_config

TRAIN_PY = REPO / "bertjax" / "trainer" / "train.py"


def _names(tree) -> list[ast.AST]:
  """Every use of the name `config_checks` in `tree`: a name, an import, an attribute's base."""
  uses = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Name) and node.id == "config_checks":
      uses.append(node)
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
      if any(n == "config_checks" or n.endswith(".config_checks") for n in names):
        uses.append(node)
  return uses


def _plan_calls(tree) -> list[ast.Call]:
  return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
          and isinstance(n.func, ast.Attribute) and n.func.attr == "plan"
          and isinstance(n.func.value, ast.Name) and n.func.value.id == "run_plan"]


def test_train_reaches_the_checks_from_one_place():
  """train.py names no settings check itself: its one way into them is one `run_plan.plan`
  call; no copy of the config (`with_schedule`, `copy`) is left."""
  tree = ast.parse(TRAIN_PY.read_text())
  assert _names(tree) == [], [ast.unparse(n) for n in _names(tree)]
  assert len(_plan_calls(tree)) == 1
  source = TRAIN_PY.read_text()
  assert "with_schedule" not in source and "deepcopy" not in source


def test_a_run_is_planned_once_and_trains_the_config_it_was_given(tmp_path, monkeypatch):
  """One plan per run; every step's cadence is read from the caller's own config object (a
  copy mid-run would fail `is`), which the run leaves as it was."""
  plans, finished, configs = [], [], []
  real_plan, real_with_inputs, real_reads = run_plan.plan, run_plan.with_inputs, train.reads_devices

  def counting_plan(*args, **kwargs):
    plans.append(real_plan(*args, **kwargs))
    return plans[-1]

  def counting_with_inputs(*args, **kwargs):
    finished.append(real_with_inputs(*args, **kwargs))
    return finished[-1]

  def watching_step(config, *args, **kwargs):
    configs.append(config)
    return real_reads(config, *args, **kwargs)

  monkeypatch.setattr(run_plan, "plan", counting_plan)
  monkeypatch.setattr(run_plan, "with_inputs", counting_with_inputs)
  monkeypatch.setattr(train, "reads_devices", watching_step)
  config = tiny_config(total_steps=3, eval_every=2, log_every=1, checkpoint_every=3,
                       batch_size=8, grad_accum_steps=2)
  before = config.to_dict()
  summary = train.train_and_evaluate(config, tmp_path / "run")
  assert summary["step"] == 3 and summary["status"] == "finished"
  assert len(plans) == 1 and plans[0].config is config
  assert len(finished) == 1 and finished[0].config is config
  assert (finished[0].schedule.total_steps, finished[0].schedule.eval_every) == (3, 2)
  assert (finished[0].grad_accum_steps, finished[0].eval_batch_size) == (2, 4)  # the micro-batch
  assert len(configs) == 3 and all(c is config for c in configs)
  assert config.to_dict() == before


def test_plan_refuses_before_anything_is_made(tmp_path):
  """A bad setting is refused by the plan, which prepares and writes nothing."""
  with pytest.raises(UserError, match="batch_size=12 must be divisible"):
    run_plan.plan(tiny_config(batch_size=12, grad_accum_steps=5), tmp_path / "run")
  assert not (tmp_path / "run").exists()


def test_the_plan_is_a_function_of_the_config_and_the_devices(tmp_path):
  """No callback and no state: the same config and devices give the same plan; the workdir is
  not made, the config not changed; the inputs and the schedule come from `with_inputs`."""
  import inspect
  import jax
  config = tiny_config(batch_size=8, grad_accum_steps=2)
  before = config.to_dict()
  a = run_plan.plan(config, tmp_path / "run", jax.devices()[:1])
  b = run_plan.plan(config, tmp_path / "run", jax.devices()[:1])
  fields = lambda p: (p.rules, p.model_cfg, p.grad_accum_steps, p.eval_batch_size,
                      dict(p.mesh.shape), p.data, p.schedule)
  assert fields(a) == fields(b) == (fields(a)[0], fields(a)[1], 2, 4, {"data": 1, "fsdp": 1,
                                                                        "tensor": 1}, None, None)
  assert config.to_dict() == before and not (tmp_path / "run").exists()
  assert list(inspect.signature(run_plan.plan).parameters) == ["config", "workdir", "devices"]
  data = a.objective.build_inputs(config, tmp_path / "run", eval_batch_size=a.eval_batch_size)
  done = run_plan.with_inputs(a, data)
  assert done.data is data and (done.schedule.total_steps, done.schedule.eval_every) == (
      config.total_steps, config.eval_every)
  assert a.data is None  # frozen: with_inputs returns a new plan
  assert not hasattr(train, "QUIET_STEP")  # the quiet-step guard is an argument


def test_eval_batch_size_is_computed_by_the_plan_and_refused_by_the_checks():
  config = tiny_config(batch_size=16, grad_accum_steps=2)
  assert run_plan.eval_batch_size(config, fake_mesh(data=2)) == 8  # the micro-batch
  with config.unlocked():
    config.eval_batch_size = 12
  assert run_plan.eval_batch_size(config, fake_mesh(data=4)) == 12
  with pytest.raises(UserError, match="eval_batch_size=12 must be a positive multiple of the "
                                      "data-parallel size 8"):
    run_plan.eval_batch_size(config, fake_mesh(data=8))
  assert not hasattr(config_checks, "eval_batch_size")  # a computation, not a check
