"""Evaluators beside the trainer (bertjax/evaluators/): `config.evals` runs several on their own
cadences, each writing its rows; each family scores as the objective-based evaluation did before
evaluation moved out of the objectives; a bad entry is refused in one line before anything runs."""

import json
import os
import subprocess
import sys

import pytest

from bertjax import evaluators
from bertjax.config import config_checks, config_lib
from bertjax.core.errors import UserError
from bertjax.registry import objective_class
from bertjax.runtime import sharding
from bertjax.runtime.metric_writers import MetricWriter, read_metrics
from bertjax.trainer import eval_context, train
from evaluator_runs import FAMILIES, GOLDEN, prepared
from helpers import REPO, TINY, load_config


def test_the_checks_know_every_evaluator():
  assert config_checks.EVALUATORS == tuple(evaluators.REGISTERED)
  for name in evaluators.REGISTERED:
    assert evaluators.evaluator_class(name).name == name


@pytest.mark.parametrize("family", FAMILIES)
def test_each_evaluator_scores_as_the_objective_did(family, tmp_path, data_dir):
  """The same parameters of a tiny GLUE (RTE), SQuAD v2.0 and CoNLL NER run, scored by the task's
  evaluator, give the numbers `Objective.evaluate` gave at 2981da0 (tests/evaluator_runs.py),
  its final test-set scores included."""
  config, objective, inputs, model_cfg, params = prepared(family, tmp_path, data_dir)
  context = eval_context.standalone(config, objective, model_cfg, inputs, tmp_path / "run",
                                    sharding.make_mesh(config.mesh_shape), total_steps=1)
  evaluator = evaluators.evaluator_class(objective.evaluator)(config, context)
  got = dict(evaluator.run(params, 1))
  before = json.loads(GOLDEN.read_text())[family]
  assert sorted(got) == sorted(before)
  for key, value in before.items():
    # Counts and scores over whole examples are equal; float64 means of float32 logits agree to
    # their last bits on another processor.
    assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
  assert (tmp_path / "run" / "predictions" / "step_1" / "metrics.json").is_file()


def _pretraining_config(**settings):
  return load_config("configs/quickstart.py:runlocal", **{
      **TINY, "data.vocab_size": 400, "model.vocab_size": 400, "max_seq_length": 32,
      "max_predictions_per_seq": 5, "batch_size": 8, "log_every": 2, **settings})


def _eval_rows(workdir, key):
  return [r for r in read_metrics(workdir) if r.get("split") == "eval" and key in r]


@pytest.mark.slow
def test_a_pretraining_run_with_two_evaluators_on_their_cadences(tmp_path, data_dir):
  """Quickstart pretraining for 6 steps with its own MLM evaluation every 2 steps and a GLUE
  (RTE) probe every 3: the MLM rows are at steps 2, 4 and 6, the probe's at 3 and 6, each under
  its own names; the MLM rows equal those of the same run without `evals` (eval_every=2)."""
  probe = dict(name="glue_probe", every=3, task="rte", data_dir=str(data_dir / "glue"),
               train_examples=48, dev_examples=40, steps=50)
  config = _pretraining_config(total_steps=6, eval_every=2)
  with config.unlocked():
    config.evals = [dict(name="metric_sums", every=2), probe]
  train.train_and_evaluate(config, tmp_path / "two")
  mlm = _eval_rows(tmp_path / "two", "mlm_loss")
  probed = _eval_rows(tmp_path / "two", "probe_rte/accuracy")
  assert [r["step"] for r in mlm] == [2, 4, 6]
  assert [r["step"] for r in probed] == [3, 6]
  assert all("mlm_loss" not in r for r in probed if r["step"] == 3)
  for row in probed:
    assert row["probe_rte/examples"] == 40
    assert 0.0 <= row["probe_rte/accuracy"] <= 1.0 and row["probe_rte/loss"] > 0
    assert 0.0 <= row["probe_rte/train_accuracy"] <= 1.0
  # The probe reads the encoder of its step: the two rows are of different parameters.
  assert probed[0]["probe_rte/loss"] != probed[1]["probe_rte/loss"]

  # The same run without `evals`, on the corpus (and tokenizer) the first one prepared.
  own_config = _pretraining_config(total_steps=6, eval_every=2,
                                   data_dir=str(tmp_path / "two" / "prepared"))
  train.train_and_evaluate(own_config, tmp_path / "own")
  own = _eval_rows(tmp_path / "own", "mlm_loss")
  assert [{k: v for k, v in r.items() if not k.startswith("probe_")} for r in mlm] == own


def test_the_probe_is_deterministic(tmp_path, data_dir, capsys):
  """Two probes of the same parameters give the same numbers (no randomness in the fit). Each
  says what it does as it starts (it printed nothing for 16 s of a quickstart run)."""
  config, objective, inputs, model_cfg, params = prepared("glue", tmp_path, data_dir)
  context = eval_context.standalone(config, objective, model_cfg, inputs, tmp_path / "run",
                                    sharding.make_mesh(config.mesh_shape))
  kind = evaluators.evaluator_class("glue_probe")
  options = dict(task="rte", data_dir=str(data_dir / "glue"), train_examples=32,
                 dev_examples=24, steps=30)
  capsys.readouterr()
  first = dict(kind(config, context, **options).run(params, 1))
  assert capsys.readouterr().err.splitlines()[0] == (
      "eval glue_probe rte at step 1: embedding 32 train and 24 dev rows, then fitting the probe "
      "(30 steps)")
  again = dict(kind(config, context, **options).run(params, 1))
  assert first == again and first["examples"] == 24
  assert kind.default_prefix(options) == "probe_rte/"
  with pytest.raises(UserError, match=r"^evals entry 'glue_probe' has no option 'epochs'; it "):
    kind(config, context, epochs=3)


@pytest.mark.parametrize("entry, needle", [
    (dict(name="glue_prob", every=3), "evals[0].name='glue_prob' is not an evaluator; fix: one "
                                      "of metric_sums, glue, squad, ner, glue_probe"),
    (dict(name="glue_probe", every=0), "evals[0].every=0 must be a positive number of steps"),
    (dict(name="metric_sums", every=-2), "evals[0].every=-2 must be a positive number of steps"),
    (dict(name="metric_sums"), "evals[0].every=None must be a positive number of steps"),
])
def test_a_bad_evals_entry_is_refused_by_the_checks(entry, needle):
  config = config_lib.load_config_file(str(REPO / "configs/quickstart.py") + ":runlocal")
  with config.unlocked():
    config.evals = [entry]
  with pytest.raises(UserError) as e:
    config_checks.check_config(config)
  assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_run_whose_only_evaluation_is_a_probe_shows_it_on_its_eval_line(tmp_path, capsys):
  """The row of a probe alone has only prefixed names; its line was `eval step 5/20:`."""
  metrics = {"probe_rte/accuracy": 0.5, "probe_rte/loss": 0.69, "probe_rte/examples": 40,
             "probe_rte/train_accuracy": 0.75}
  MetricWriter(tmp_path, 20, enabled=True, tensorboard=False).print_row(5, "eval", metrics)
  assert capsys.readouterr().err == (
      "eval step 5/20: probe_rte/loss 0.6900 probe_rte/accuracy 0.5000\n")


def _glue_dir(data_dir):
  return str(data_dir / "glue")


# Each refused by the plan, before the workdir is made (a GLUE evaluation of a pretraining run
# was refused at its first evaluation, after the tokenizer and the corpus were written; SQuAD's
# and NER's raised an IndexError there; learning_rate="fast" a TypeError).
@pytest.mark.parametrize("entry, needle", [
    (dict(name="glue", every=5), "evals[0] names 'glue', which scores the dev sets of a glue "
                                 "fine-tuning run, and this run trains 'mlm_nsp', which has no "
                                 "glue dev sets; drop the entry"),
    (dict(name="squad", every=5), "evals[0] names 'squad', which scores the dev sets"),
    (dict(name="ner", every=5), "evals[0] names 'ner', which scores the dev sets"),
    (dict(name="glue_probe", every=5, learning_rate="fast"),
     "glue_probe learning_rate='fast' must be a number > 0; fix the evals entry, e.g. "
     "learning_rate=0.5"),
    (dict(name="glue_probe", every=5, steps=0), "glue_probe steps=0 must be a whole number >= 1"),
    (dict(name="glue_probe", every=5, l2=-1.0), "glue_probe l2=-1.0 must be a number >= 0"),
    (dict(name="glue_probe", every=5, dev_examples=2.5),
     "glue_probe dev_examples=2.5 must be a whole number >= 1"),
    (dict(name="glue_probe", every=5, task="stsb"), "glue_probe task='stsb' is not a GLUE "
                                                    "classification task"),
    (dict(name="glue_probe", every=5, data_dir="{nowhere}"), "glue_probe: the GLUE rte train "
                                                             "file was not found"),
    (dict(name="glue_probe", every=5, epochs=3), "evals entry 'glue_probe' has no option 'epochs'"),
], ids=["glue", "squad", "ner", "probe_rate_text", "probe_steps", "probe_l2", "probe_count_float",
        "probe_regression_task", "probe_no_files", "probe_unknown_option"])
def test_an_evaluator_the_run_cannot_run_is_refused_before_the_workdir_is_made(
    tmp_path, data_dir, entry, needle):
  config = _pretraining_config(total_steps=6, eval_every=2)
  entry = {k: v.format(nowhere=tmp_path / "nowhere") if isinstance(v, str) else v
           for k, v in entry.items()}
  if entry["name"] == "glue_probe":
    entry.setdefault("data_dir", _glue_dir(data_dir))
  with config.unlocked():
    config.evals = [entry]
  with pytest.raises(UserError) as e:
    train.train_and_evaluate(config, tmp_path / "run")
  assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("recipe, entries", [
    ("configs/glue.py:task=rte,runlocal", [dict(name="glue", every=2),
                                           dict(name="metric_sums", every=4)]),
    ("configs/quickstart.py:runlocal", [dict(name="metric_sums", every=2),
                                        dict(name="glue_probe", every=4, steps=10,
                                             learning_rate=1)]),
], ids=["glue_on_glue", "probe_on_pretraining"])
def test_the_evaluators_a_run_can_run_pass_their_checks(data_dir, recipe, entries):
  config = config_lib.load_config_file(str(REPO / recipe))
  with config.unlocked():
    config.evals = [{**e, "data_dir": str(data_dir / "glue")} if e["name"] == "glue_probe" else e
                    for e in entries]
  evaluators.check_entries(config, objective_class(config.objective)())  # raises nothing


BAD_EVALS = """
import sys
sys.path.insert(0, {repo!r})
from configs.quickstart import get_config as quickstart

def get_config(arg=None):
  c = quickstart("runlocal")
  c.evals = [dict(name="metric_sums", every=2), dict(name={name!r}, every=5)]
  return c
"""


@pytest.mark.parametrize("name, said", [
    ("mlm_probe", "evals[1].name='mlm_probe' is not an evaluator"),
    ("glue", "evals[1] names 'glue', which scores the dev sets of a glue fine-tuning run"),
], ids=["unknown", "glue_on_pretraining"])
def test_a_bad_evals_entry_stops_launch_in_one_line(tmp_path, name, said):
  (tmp_path / "bad.py").write_text(BAD_EVALS.format(repo=str(REPO), name=name))
  workdir = tmp_path / "run"
  r = subprocess.run([sys.executable, "launch.py", "--config", str(tmp_path / "bad.py"),
                      "--workdir", str(workdir)], cwd=REPO, capture_output=True, text=True,
                     env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
  assert r.returncode == 2
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and said in lines[0], r.stderr
  assert not workdir.exists()


def test_architecture_shows_the_metric_sums_evaluator_as_it_is():
  shown = (REPO / "ARCHITECTURE.md").read_text()
  block = "\n".join(line[2:] for line in shown[shown.index("  class MetricSums("):].splitlines())
  source = (REPO / "bertjax/evaluators/metric_sums.py").read_text()
  source = source[source.index("class MetricSums("):].rstrip()
  assert block.startswith(source + "\n")
