"""Context checks: every pretraining objective, trained briefly on a generated language whose words
follow from their neighbours (bertjax/data/synthetic.py, configs/context_check.py), beats what
context-free statistics allow; a twin with one fault injected does not.

On WikiText the loss of a tiny model first falls to the unigram plateau whether or not its
objective is right. Here the bounds come from the eval batches themselves: the best context-free
masked-token accuracy (`synthetic.context_free_accuracy`), the majority label for NSP, and for
ELECTRA the accuracy of always answering "original" (`rtd_baseline_accuracy`); SOP passes chance
on short rows (configs/context_check.py:objective=mlm_sop). Each fault is one that removes the
information the criterion needs (a shifted or consistently permuted input would be learned
around), injected by monkeypatching a model or data function for one run. MLM and RTD are
checked on a ModernBERT encoder too (configs/context_check.py:arch=modernbert), with the same
faults.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import inputs
from bertjax.config import config_checks
from bertjax.core.errors import UserError
from bertjax.data import synthetic
from bertjax.models import attention
from bertjax.objectives import distill, span_sbo
from bertjax.registry import get_objective
from bertjax.trainer import train
from tests.helpers import load_config



STEPS = 300
MARGIN = 0.05        # above the context-free bound: several standard errors on 8 x 32 x 5 labels
PAIR_MARGIN = 0.1    # above the majority label: > 3 standard errors on 256 rows
STEPS_RTD = 600      # ELECTRA's discriminator leaves the prior at ~400-500 steps
RTD_MARGIN = 0.01    # above always "original": ~2.5 standard errors on ~8k tokens


def context_config(objective: str, arch: str = "bert", **settings):
  steps = STEPS_RTD if objective == "rtd" else STEPS
  return load_config(f"configs/context_check.py:objective={objective},arch={arch}",
                     total_steps=steps,
                     eval_every=steps, log_every=steps, checkpoint_every=steps,
                     async_checkpointing=False, **settings)


def run(objective: str, workdir, arch: str = "bert", **settings) -> tuple[dict, dict]:
  """Trains `objective` for STEPS steps; (its final eval metrics, the bounds of its eval batches).
  `arch`: configs/context_check.py's encoder (bert, or modernbert)."""
  config = context_config(objective, arch, **settings)
  metrics = train.train_and_evaluate(config, workdir)["last_eval"]
  batches = list(inputs.build(config, workdir, get_objective(config)).eval_batches())
  bounds = {"context_free": synthetic.context_free_accuracy(batches),
            "majority": synthetic.majority_fraction(
                np.concatenate([b["next_sentence_label"] for b in batches]))}
  return metrics, bounds


def beats_context_free(metrics, bounds, key="mlm_accuracy") -> bool:
  return metrics[key] > bounds["context_free"] + MARGIN


def beats_chance(metrics, bounds, key) -> bool:
  return metrics[key] > bounds["majority"] + PAIR_MARGIN


def detects_replacements(metrics) -> bool:
  return metrics["rtd_accuracy"] > metrics["rtd_baseline_accuracy"] + RTD_MARGIN


# ------------------------------------------------------------------------------------- faults


def self_only_attention(monkeypatch):
  """Each token attends to itself alone: no context reaches any head."""
  original = attention.make_attention_mask

  def mask(attention_mask, segment_ids=None):
    keys = original(attention_mask, segment_ids)
    n = attention_mask.shape[-1]
    return keys & jnp.eye(n, dtype=bool)[None, None]
  monkeypatch.setattr(attention, "make_attention_mask", mask)


class _RolledLabels:
  """The training stream with each row's masked labels and pair label (NSP/SOP; 0 for one-segment
  objectives) taken from the row half a batch away."""

  def __init__(self, stream):
    self.stream = stream

  def __iter__(self):
    return self

  def __next__(self):
    batch = dict(next(self.stream))
    half = len(batch["masked_ids"]) // 2
    for key in ("masked_ids", "next_sentence_label"):
      batch[key] = np.roll(batch[key], half, axis=0)
    return batch

  def get_state(self):
    return self.stream.get_state()

  def set_state(self, state):
    self.stream.set_state(state)


def labels_from_other_rows(monkeypatch):
  """Training labels at the wrong rows (evaluation keeps the true ones)."""
  build = inputs.build

  def wrong(config, workdir, objective):
    data = build(config, workdir, objective)
    data.train = _RolledLabels(data.train)
    return data
  monkeypatch.setattr(inputs, "build", wrong)


def boundaries_of_other_rows(monkeypatch):
  """The SBO head reads span boundaries of the row half a batch away."""
  model_inputs = span_sbo.SpanSbo.model_inputs

  def wrong(self, batch):
    out = model_inputs(self, batch)
    half = batch["input_ids"].shape[0] // 2
    return {**out, **{k: jnp.roll(out[k], half, axis=0) for k in ("span_left", "span_right")}}
  monkeypatch.setattr(span_sbo.SpanSbo, "model_inputs", wrong)


def teacher_of_other_rows(monkeypatch):
  """The student's soft targets are the teacher's predictions for the row half a batch away."""
  terms = distill.distillation_terms

  def wrong(student, teacher, *args, **kwargs):
    half = teacher["logits"].shape[0] // 2
    return terms(student, {**teacher, "logits": jnp.roll(teacher["logits"], half, axis=0)},
                 *args, **kwargs)
  monkeypatch.setattr(distill, "distillation_terms", wrong)


# ------------------------------------------------------------------------------ the checks


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory):
  """The healthy MLM run, also the teacher of the distillation checks."""
  workdir = tmp_path_factory.mktemp("context") / "mlm"
  return workdir, *run("mlm", workdir)


@pytest.mark.slow
def test_mlm_beats_context_free_bound(mlm_run):
  _, metrics, bounds = mlm_run
  assert beats_context_free(metrics, bounds), (metrics, bounds)


@pytest.mark.slow
def test_mlm_with_fp8_projections_beats_context_free_bound(tmp_path):
  """model.fp8 (bertjax/models/fp8.py): the layers' projections in float8 with delayed scaling
  keep the learning signal (float32 compute, as the run above)."""
  metrics, bounds = run("mlm", tmp_path / "run", **{"model.fp8": True})
  assert beats_context_free(metrics, bounds), (metrics, bounds)


@pytest.mark.slow
def test_mlm_with_labels_of_other_rows_does_not(tmp_path, monkeypatch):
  labels_from_other_rows(monkeypatch)
  metrics, bounds = run("mlm", tmp_path / "run")
  assert not beats_context_free(metrics, bounds), (metrics, bounds)


@pytest.mark.slow
def test_mlm_nsp_beats_context_free_bound_and_chance(tmp_path):
  metrics, bounds = run("mlm_nsp", tmp_path / "run")
  assert beats_context_free(metrics, bounds), (metrics, bounds)
  assert beats_chance(metrics, bounds, "nsp_accuracy"), (metrics, bounds)


@pytest.mark.slow
def test_mlm_nsp_with_self_only_attention_does_not(tmp_path, monkeypatch):
  self_only_attention(monkeypatch)
  metrics, bounds = run("mlm_nsp", tmp_path / "run")
  assert not beats_context_free(metrics, bounds), (metrics, bounds)
  assert not beats_chance(metrics, bounds, "nsp_accuracy"), (metrics, bounds)


@pytest.mark.slow
def test_mlm_sop_beats_context_free_bound_and_chance(tmp_path):
  metrics, bounds = run("mlm_sop", tmp_path / "run")
  assert beats_context_free(metrics, bounds), (metrics, bounds)
  assert beats_chance(metrics, bounds, "sop_accuracy"), (metrics, bounds)


@pytest.mark.slow
def test_mlm_sop_with_labels_of_other_rows_does_not(tmp_path, monkeypatch):
  labels_from_other_rows(monkeypatch)
  metrics, bounds = run("mlm_sop", tmp_path / "run")
  assert not beats_context_free(metrics, bounds), (metrics, bounds)
  assert not beats_chance(metrics, bounds, "sop_accuracy"), (metrics, bounds)


@pytest.mark.slow
def test_span_sbo_beats_context_free_bound(tmp_path):
  metrics, bounds = run("span_sbo", tmp_path / "run")
  assert beats_context_free(metrics, bounds), (metrics, bounds)
  assert beats_context_free(metrics, bounds, "sbo_accuracy"), (metrics, bounds)


@pytest.mark.slow
def test_span_sbo_reading_other_rows_fails_sbo(tmp_path, monkeypatch):
  boundaries_of_other_rows(monkeypatch)
  metrics, bounds = run("span_sbo", tmp_path / "run")
  assert beats_context_free(metrics, bounds), (metrics, bounds)
  assert not beats_context_free(metrics, bounds, "sbo_accuracy"), (metrics, bounds)


@pytest.mark.slow
def test_rtd_discriminator_beats_always_original(tmp_path):
  metrics, bounds = run("rtd", tmp_path / "run")
  assert beats_context_free(metrics, bounds), (metrics, bounds)  # the generator has learned
  assert detects_replacements(metrics), metrics


@pytest.mark.slow
def test_rtd_with_self_only_attention_does_not(tmp_path, monkeypatch):
  self_only_attention(monkeypatch)
  metrics, _ = run("rtd", tmp_path / "run")
  assert not detects_replacements(metrics), metrics


@pytest.mark.slow
def test_distill_student_beats_context_free_bound(mlm_run, tmp_path):
  teacher, _, _ = mlm_run
  metrics, bounds = run("distill", tmp_path / "run", **{"distill.teacher": str(teacher)})
  assert beats_context_free(metrics, bounds), (metrics, bounds)


@pytest.mark.slow
def test_distill_from_teacher_of_other_rows_does_not(mlm_run, tmp_path, monkeypatch):
  teacher, _, _ = mlm_run
  teacher_of_other_rows(monkeypatch)
  metrics, bounds = run("distill", tmp_path / "run", **{"distill.teacher": str(teacher)})
  assert not beats_context_free(metrics, bounds), (metrics, bounds)


# ------------------------------------------------------------------- on a ModernBERT encoder


@pytest.mark.slow
def test_modernbert_mlm_beats_context_free_bound(tmp_path):
  metrics, bounds = run("mlm", tmp_path / "run", arch="modernbert")
  assert beats_context_free(metrics, bounds), (metrics, bounds)


@pytest.mark.slow
def test_modernbert_mlm_with_labels_of_other_rows_does_not(tmp_path, monkeypatch):
  labels_from_other_rows(monkeypatch)
  metrics, bounds = run("mlm", tmp_path / "run", arch="modernbert")
  assert not beats_context_free(metrics, bounds), (metrics, bounds)


@pytest.mark.slow
def test_modernbert_rtd_discriminator_beats_always_original(tmp_path):
  metrics, bounds = run("rtd", tmp_path / "run", arch="modernbert")
  assert beats_context_free(metrics, bounds), (metrics, bounds)
  assert detects_replacements(metrics), metrics


@pytest.mark.slow
def test_modernbert_rtd_with_self_only_attention_does_not(tmp_path, monkeypatch):
  """The fault reaches the global layers' mask and the local layers' window mask built from it
  (configs/context_check.py's window keeps them off the banded path, which reads segment ids)."""
  self_only_attention(monkeypatch)
  metrics, _ = run("rtd", tmp_path / "run", arch="modernbert")
  assert not detects_replacements(metrics), metrics


# ------------------------------------------------------------------------ the generated corpus


@pytest.mark.parametrize("families,tokens", [(1, 8), (2, 4)])
def test_cycle_documents_follow_their_rule(families, tokens):
  language = synthetic.CycleLanguage(families=families, tokens_per_language=tokens)
  cycles = language.cycles
  successor = {int(a): int(b) for row in cycles for a, b in zip(row, np.roll(row, -1))}
  lang_of = {int(t): i for i, row in enumerate(cycles) for t in row}
  documents = synthetic.CycleDocuments(language, 50, seed=3)
  for doc in documents:
    walk = np.concatenate(doc)
    assert walk.min() >= synthetic.NUM_SPECIAL and walk.max() < language.vocab_size
    ends = set(np.cumsum([len(s) for s in doc])[:-1].tolist())
    for t in range(1, len(walk)):
      a, b = int(walk[t - 1]), int(walk[t])
      if t in ends:  # a new sentence: the family's next language, the next place in the cycle
        la, lb = lang_of[a], lang_of[b]
        assert lb // language.languages == la // language.languages
        assert lb % language.languages == (la + 1) % language.languages
        assert list(cycles[lb]).index(b) == (list(cycles[la]).index(a) + 1) % tokens
      else:
        assert b == successor[a]
  assert [list(map(list, d)) for d in documents] == [list(map(list, d)) for d in documents]


def test_context_free_accuracy_is_the_best_guess_per_seen_token():
  # Seen [MASK] (4) three times with labels 7, 7, 8 and token 9 once with label 9: best 3 of 4.
  batch = {"input_ids": np.array([[2, 4, 4, 9, 4]]), "masked_positions": np.array([[1, 2, 3, 4]]),
           "masked_ids": np.array([[7, 7, 9, 8]]), "masked_weights": np.ones((1, 4))}
  assert synthetic.context_free_accuracy([batch]) == pytest.approx(0.75)
  assert synthetic.majority_fraction(np.array([0, 1, 1])) == pytest.approx(2 / 3)


def test_unknown_generated_corpus_is_refused_in_one_line(tmp_path):
  config = context_config("mlm", **{"data.generated": "nonsense"})
  with pytest.raises(UserError) as e:
    config_checks.check_settings(config, tmp_path / "run")
  assert "data.generated" in str(e.value) and "\n" not in str(e.value)
  assert not (tmp_path / "run").exists()
