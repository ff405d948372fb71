"""The one setup (bertjax/trainer/steps.py): the trainer, the benchmark and the compile tool build
the same train state and step for every recipe.

For each config file's runlocal variant (configs/distill.py's in tests/test_distill.py, where its
teacher is trained once), and for BERT with FP8 and with the GPU kernel set (its Pallas kernels
in interpret mode on the CPU), the compile tool's `cpu-1` step (`steps.abstract_run`: the run's
plan, then the abstract state) and the trainer's (`train.setup` from the same plan: its concrete,
initialized state) compile to the same optimized HLO on the CPU, instruction for instruction (the
source-line metadata aside).

Cost (2 CPU cores): about 2 minutes, two CPU compiles of each runlocal step.
"""

import jax
import flax.linen as nn
import pytest

from bertjax.objective import Schedule
from bertjax.runtime import step_memory
from bertjax.tools import benchmark
from bertjax.tools import compile as compile_tool
from bertjax.tools import hlo_stats, targets
from bertjax.trainer import run_plan, steps, train
from tests.helpers import REPO, load_config

# Every config file with a runlocal variant, but distill's (its teacher: tests/test_distill.py).
RECIPES = sorted(f"configs/{p.name}:runlocal" for p in (REPO / "configs").glob("*.py")
                 if "runlocal" in p.read_text() and p.name not in ("common.py", "distill.py", "context_check.py"))
CASES = [(spec, {}) for spec in RECIPES] + [
    ("configs/bert.py:runlocal", {"model.fp8": True}),
    ("configs/bert.py:runlocal", {"model.kernels": "gpu"}),
]


def trainers_step(config):
  """The trainer's step as `train_and_evaluate` builds it (its plan, then `train.setup`: the state
  initialized, not abstract), compiled for the synthetic batch's specs. The schedule is the one
  the compile tool takes (a run's from its rows only changes the learning rate's constants)."""
  plan = run_plan.plan(config, None, jax.devices()[:1])
  schedule = Schedule(total_steps=max(int(config.total_steps), 1),
                      eval_every=int(config.get("eval_every", 0)))
  s, state = train.setup(config, plan.objective, plan.model_cfg, plan.mesh, schedule,
                         plan.grad_accum_steps, rules=plan.rules)
  batch = steps.batch_specs(config, plan.objective, plan.mesh)
  with jax.set_mesh(plan.mesh), nn.logical_axis_rules(plan.rules):
    return s.train_step.lower(state, batch).compile()


def same_step(spec: str, overrides: dict) -> None:
  """Asserts the compile tool's cpu-1 step and the trainer's are one program (module docstring)."""
  synthetic = {"data.synthetic": True} if "data" in load_config(spec) else {}
  report = compile_tool.compile_step(load_config(spec, **overrides), targets.resolve("cpu-1"))
  trainer = trainers_step(load_config(spec, **overrides, **synthetic))
  ours, theirs = (hlo_stats.program(c.as_text()) for c in (report.compiled, trainer))
  assert ours.count("\n") > 500, ours[:200]
  assert ours == theirs, f"{spec} {overrides}: the compile tool's step differs from the trainer's"
  assert report.footprint == step_memory.footprint(trainer)


def test_every_recipe_with_a_runlocal_variant_is_covered():
  names = {spec.split(":")[0].split("/")[1] for spec in RECIPES}
  assert {"bert.py", "modernbert.py", "electra.py", "glue.py", "squad.py", "ner.py",
          "quickstart.py", "albert.py", "roberta.py", "spanbert.py"} <= names


@pytest.mark.slow
@pytest.mark.parametrize("spec, overrides", CASES,
                         ids=[f"{s.split('/')[1]}{'+' + ','.join(o) if o else ''}"
                              for s, o in CASES])
def test_the_compile_tool_compiles_the_trainers_step(spec, overrides):
  same_step(spec, overrides)


@pytest.mark.slow
def test_the_benchmark_times_the_trainers_step():
  """The benchmark's step (`benchmark.step_hlo`, the one it times) is the trainer's: same HLO."""
  config = load_config("configs/quickstart.py:runlocal", **{"data.synthetic": True})
  text, _ = benchmark.step_hlo(config)
  assert hlo_stats.program(text) == hlo_stats.program(trainers_step(config).as_text())
