"""Knowledge distillation: the loss by hand, a distilled student beating one trained alone (MLM on
WikiText-2, SST-2 task distillation), the teacher frozen inside the jitted step, bad input."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import flax
import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np

import pytest

from bertjax import inputs
from bertjax.config import config_lib
from bertjax.objectives import distill_losses, distill_settings
from bertjax.registry import get_objective
from bertjax.runtime import checkpoints, optim, sharding
from bertjax.runtime.run_record import summarize
from bertjax.trainer import train

REPO = pathlib.Path(__file__).resolve().parent.parent
SAMPLE = REPO / "bertjax/data/samples/wikitext2_test.raw"
VOCAB = 512
# A 6-layer teacher and its 4-layer students: hidden 64, 64-token sequences, no dropout.
MODEL = {"model.vocab_size": VOCAB, "model.hidden_size": 64, "model.intermediate_size": 256,
         "model.num_attention_heads": 2, "model.max_position_embeddings": 64,
         "model.hidden_dropout_prob": 0.0, "model.attention_probs_dropout_prob": 0.0}
RUN = {"max_seq_length": 64, "max_predictions_per_seq": 10, "batch_size": 16,
       "learning_rate": 1e-3, "optimizer.warmup_steps": 20, "log_every": 50,
       "data.eval_documents": 20, "data.eval_batches": 8, "tensorboard": False,
       "async_checkpointing": False}
TEACHER_STEPS, STUDENT_STEPS = 300, 120


def make_config(spec: str, **settings):
  config = config_lib.load_config_file(str(REPO / spec))
  config_lib.apply_overrides(config, [f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                                      for k, v in settings.items()])
  return config


def student_config(corpus, teacher, steps, **overrides):
  """configs/distill.py:runlocal (DistilBERT's recipe) shrunk to the test's 4-layer student."""
  return make_config("configs/distill.py:runlocal", data_dir=str(corpus),
                     **{**RUN, **MODEL, "model.num_hidden_layers": 4,
                        "distill.teacher": str(teacher), "total_steps": steps,
                        "eval_every": steps, "checkpoint_every": steps, **overrides})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """The WikiText-2 sample, tokenized once (sentencepiece, 512 pieces) for every run here."""
  from bertjax.data import prepare, sources, tokenizers
  out = tmp_path_factory.mktemp("corpus")
  docs = sources.read_documents([str(SAMPLE)], "wikitext")
  tok = tokenizers.train_sentencepiece(sources.iter_sentences(docs), None, vocab_size=VOCAB)
  prepare.prepare_corpus(docs, tok, out / "prepared", num_shards=1, num_workers=1)
  return out / "prepared"


@pytest.fixture(scope="module")
def teacher(corpus, tmp_path_factory):
  """A 6-layer MLM teacher pretrained on the corpus (a training workdir)."""
  workdir = tmp_path_factory.mktemp("teacher")
  config = make_config("configs/quickstart.py", objective="mlm", data_dir=str(corpus),
                       **{**RUN, **MODEL, "model.num_hidden_layers": 6,
                          "total_steps": TEACHER_STEPS, "eval_every": TEACHER_STEPS,
                          "checkpoint_every": TEACHER_STEPS})
  train.train_and_evaluate(config, workdir)
  return workdir


# ---------------------------------------------------------------------------------------------
# The loss, by hand.


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_loss_terms_match_a_hand_computed_example():
  """Every term, its T^2 scaling, its weight and its denominator, against numpy by hand.

  One sequence of 3 tokens (the last is padding) with 3 masked positions (the last unused), a
  vocabulary of 3, hidden width 2, one attention head; layer_map pairs student layer 0 with
  teacher layer 1.
  """
  T = 2.0
  settings = distill_settings.Settings(
      teacher="", student_init="scratch", temperature=T, soft_weight=5.0, hard_weight=2.0,
      cosine_weight=1.0, hidden_weight=0.5, attention_weight=0.25, layer_map_text="0:1",
      init_layers_text="", layer_map=((0, 1),))
  s_logits = np.array([[[1.0, 2.0, 0.5], [0.3, -1.0, 2.0], [9.0, 0.0, 0.0]]], np.float32)
  t_logits = np.array([[[2.0, 1.0, 0.0], [0.5, 1.5, 1.0], [0.0, 9.0, 0.0]]], np.float32)
  labels = np.array([[1, 2, 0]], np.int32)
  weights = np.array([[1.0, 1.0, 0.0]], np.float32)
  mask = np.array([[1, 1, 0]], np.int32)
  s_last = np.array([[[1.0, 0.0], [1.0, 1.0], [5.0, 5.0]]], np.float32)
  t_last = np.array([[[0.0, 2.0], [3.0, 1.0], [-5.0, 0.0]]], np.float32)
  projected = np.array([[[0.5, 1.5], [2.0, 2.0], [9.0, 9.0]]], np.float32)
  s_att = np.array([[[[1.0, 2.0, 7.0], [0.0, -1.0, 7.0], [7.0, 7.0, 7.0]]]], np.float32)
  t_att = np.array([[[[0.5, 2.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]]], np.float32)
  zeros = np.zeros_like(s_last)
  student = {"logits": s_logits, "hidden_states": (zeros, s_last), "attentions": (s_att,),
             "projected": {1: projected}}
  teacher = {"logits": t_logits, "hidden_states": (zeros, zeros, t_last),
             "attentions": (np.zeros_like(t_att), t_att), "projected": {}}
  denominators = distill_losses.distill_denominators(jnp.asarray(mask), jnp.asarray(weights))
  assert {k: float(v) for k, v in denominators.items()} == {"soft": 2.0, "tokens": 2.0,
                                                            "pairs": 4.0}
  loss, metrics = distill_losses.distillation_terms(student, teacher, labels, weights, mask,
                                             denominators, settings)

  # By hand: positions 0 and 1 count, tokens 0 and 1 are real.
  soft = [-(_softmax(t_logits[0, i] / T) * np.log(_softmax(s_logits[0, i] / T))).sum() * T * T
          for i in range(2)]
  kl = [(_softmax(t_logits[0, i] / T) * (np.log(_softmax(t_logits[0, i] / T))
                                         - np.log(_softmax(s_logits[0, i] / T)))).sum() * T * T
        for i in range(2)]
  hard = [-np.log(_softmax(s_logits[0, i])[labels[0, i]]) for i in range(2)]
  cos = [1 - s_last[0, i] @ t_last[0, i] / np.linalg.norm(s_last[0, i])
         / np.linalg.norm(t_last[0, i]) for i in range(2)]
  hidden = ((projected[0, :2] - t_last[0, :2]) ** 2).sum() / (2 * 2)   # 2 tokens x width 2
  attention = ((s_att[0, 0, :2, :2] - t_att[0, 0, :2, :2]) ** 2).sum() / 4   # 4 pairs x 1 head
  expected = (5.0 * sum(soft) / 2 + 2.0 * sum(hard) / 2 + 1.0 * sum(cos) / 2 + 0.5 * hidden
              + 0.25 * attention)
  summary = summarize(metrics)
  assert float(loss) == pytest.approx(expected, rel=1e-5)
  assert summary["soft_ce"] == pytest.approx(sum(soft) / 2, rel=1e-5)
  assert summary["soft_kl"] == pytest.approx(sum(kl) / 2, rel=1e-5)
  assert summary["mlm_loss"] == pytest.approx(sum(hard) / 2, rel=1e-5)
  assert summary["cosine_loss"] == pytest.approx(sum(cos) / 2, rel=1e-5)
  assert summary["hidden_mse"] == pytest.approx(hidden, rel=1e-5)
  assert summary["attention_mse"] == pytest.approx(attention, rel=1e-5)
  # Argmax: student (1, 2), teacher (0, 1), labels (1, 2).
  assert summary["agreement"] == 0.0 and summary["mlm_accuracy"] == 1.0
  assert summary["teacher_mlm_accuracy"] == 0.0

  # The temperature: the soft term is T^2 * CE at temperature T, so T=1 gives plain CE.
  plain = dataclasses.replace(settings, temperature=1.0, hard_weight=0.0,
                                      cosine_weight=0.0, hidden_weight=0.0, attention_weight=0.0)
  loss1, _ = distill_losses.distillation_terms(student, teacher, labels, weights, mask, denominators,
                                        plain)
  ce1 = [-(_softmax(t_logits[0, i]) * np.log(_softmax(s_logits[0, i]))).sum() for i in range(2)]
  assert float(loss1) == pytest.approx(5.0 * sum(ce1) / 2, rel=1e-5)
  assert sum(ce1) != pytest.approx(sum(soft), rel=1e-2)  # T really changed the targets


@pytest.mark.parametrize("remat", [False, True])
def test_encoder_returns_attention_scores(remat):
  """`output_attentions` hands out each layer's pre-softmax scores q.k / sqrt(d) and leaves the
  encoder's output as the fused path computes it."""
  from bertjax.models.config import ModelConfig
  from bertjax.models.encoder import Encoder
  cfg = ModelConfig(vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                    intermediate_size=32, remat=remat, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)
  encoder = Encoder(cfg)
  ids = jax.random.randint(jax.random.key(0), (2, 7), 1, 50)
  mask = jnp.array([[1] * 7, [1] * 4 + [0] * 3])
  params = encoder.init(jax.random.key(1), ids, mask)
  plain = encoder.apply(params, ids, mask)
  out = encoder.apply(params, ids, mask, output_attentions=True, output_hidden_states=True)
  assert plain.attentions is None and len(out.attentions) == 3
  np.testing.assert_allclose(out.last_hidden_state, plain.last_hidden_state, atol=1e-5)
  p = flax.linen.meta.unbox(params)["params"]["layer_0"]["attention"]
  x = np.asarray(out.hidden_states[0])
  q = np.einsum("bsd,dhk->bshk", x, p["query"]["kernel"]) + p["query"]["bias"]
  k = np.einsum("bsd,dhk->bshk", x, p["key"]["kernel"]) + p["key"]["bias"]
  expected = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(8)
  assert out.attentions[0].shape == (2, 2, 7, 7)
  np.testing.assert_allclose(out.attentions[0], expected, rtol=1e-4, atol=1e-5)


def test_layer_maps_and_init_layers():
  assert distill_settings.parse_layer_map("uniform", 3, 6) == ((0, 1), (1, 3), (2, 5))
  assert distill_settings.parse_layer_map("0:1, 1:3", 2, 6) == ((0, 1), (1, 3))
  assert distill_settings.parse_layer_map("", 2, 6) == ()
  assert distill_settings.init_layer_sources("", 6, 12) == (0, 2, 4, 6, 8, 10)  # DistilBERT
  assert distill_settings.init_layer_sources("", 4, 6) == (0, 1, 3, 4)
  assert distill_settings.init_layer_sources("5,4", 2, 6) == (5, 4)


# ---------------------------------------------------------------------------------------------
# Pretraining distillation on WikiText-2.


def _eval_batches(config):
  objective = get_objective(config)
  return list(inputs.build(config, pathlib.Path("/nonexistent"), objective).eval_batches())


@pytest.mark.slow
def test_distilled_student_beats_student_trained_alone(corpus, teacher, tmp_path):
  """A 4-layer student distilled for N steps from the 6-layer teacher (DistilBERT's recipe:
  teacher layers 0, 1, 3, 4, T=2, 5 soft + 2 MLM + 1 cosine) reaches a lower held-out MLM loss
  than the same student trained N steps on MLM alone, on the very same eval batches."""
  alone_config = make_config(
      "configs/quickstart.py", objective="mlm", data_dir=str(corpus),
      **{**RUN, **MODEL, "model.num_hidden_layers": 4, "total_steps": STUDENT_STEPS,
         "eval_every": STUDENT_STEPS, "checkpoint_every": STUDENT_STEPS})
  distill_config = student_config(corpus, teacher, STUDENT_STEPS)
  # Same held-out batches (same documents, masks and order) for both runs.
  for a, b in zip(_eval_batches(alone_config), _eval_batches(distill_config), strict=True):
    for key in ("input_ids", "masked_positions", "masked_ids", "masked_weights"):
      np.testing.assert_array_equal(a[key], b[key])

  alone = train.train_and_evaluate(alone_config, tmp_path / "alone")["last_eval"]
  distilled = train.train_and_evaluate(distill_config, tmp_path / "distilled")["last_eval"]
  print(f"held-out MLM loss after {STUDENT_STEPS} steps: alone {alone['mlm_loss']:.4f}, "
        f"distilled {distilled['mlm_loss']:.4f} (teacher accuracy "
        f"{distilled['teacher_mlm_accuracy']:.4f})")
  assert distilled["mlm_loss"] < alone["mlm_loss"] - 0.05
  assert distilled["mlm_accuracy"] > alone["mlm_accuracy"]
  for key in ("soft_ce", "soft_kl", "cosine_loss", "agreement", "mlm_accuracy",
              "teacher_mlm_accuracy"):
    assert np.isfinite(distilled[key]), key
  # The distilled student is a plain encoder + MLM head: it loads wherever a pretrained one does.
  params = checkpoints.restore_params(tmp_path / "distilled")
  assert sorted(params) == ["encoder", "mlm"]
  assert sorted(k for k in params["encoder"] if k.startswith("layer_")) == [
      "layer_0", "layer_1", "layer_2", "layer_3"]


def _all_constants(closed) -> list:
  """Every array a traced function closed over (constvars, and hoisted literals)."""
  found = list(closed.consts)

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      found.extend(v.val for v in eqn.invars if isinstance(v, jex.Literal))
      for sub in jex.jaxprs_in_params(eqn.params):
        walk(sub)
  walk(closed.jaxpr)
  return found


@pytest.mark.slow
def test_teacher_is_frozen_and_runs_inside_the_jitted_step(corpus, teacher):
  """TinyBERT's losses on: the train state holds only the student (and W_h), the teacher's
  arrays are closed over by the traced step, training leaves them unchanged, and gradient
  accumulation stays exact with the teacher in the step."""
  config = student_config(corpus, teacher, 3, **{
      "distill.hidden_weight": 1.0, "distill.attention_weight": 1.0,
      "distill.layer_map": "uniform", "optimizer.warmup_steps": 0})
  objective = get_objective(config)
  data = objective.build_inputs(config, pathlib.Path("/nonexistent"))
  model = objective.make_model(config, objective.model_config(config))
  init_batch = objective.init_batch(config, 1, config.max_seq_length, config.max_predictions_per_seq)
  abstract = flax.linen.meta.unbox(jax.eval_shape(
      lambda r: objective.init_params(model, r, init_batch), jax.random.key(0)))
  optimizer = optim.make_optimizer(config, params=abstract, num_layers=4)
  mesh = sharding.make_mesh(config.mesh_shape)
  state, _, _ = train.create_train_state(objective, model, optimizer, config, mesh, init_batch,
                                         rules=sharding.rules_from_config(config))

  teacher_params = model.teacher.params
  saved = checkpoints.restore_params(teacher)
  n_teacher = sum(x.size for x in jax.tree.leaves(teacher_params))
  n_student = sum(x.size for x in jax.tree.leaves(state.params))
  n_state = sum(x.size for x in jax.tree.leaves(state))
  assert sorted(state.params) == ["distill_proj", "encoder", "mlm"]
  assert n_state < 3 * n_student + 100  # params + Adam's two moments: no teacher in the state
  assert n_teacher > 0.4 * n_student

  # teacher_layers init: student layers 0..3 are teacher layers 0, 1, 3, 4; W_h starts at I.
  for student_layer, teacher_layer in enumerate((0, 1, 3, 4)):
    for a, b in zip(jax.tree.leaves(state.params["encoder"][f"layer_{student_layer}"]),
                    jax.tree.leaves(saved["encoder"][f"layer_{teacher_layer}"])):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_array_equal(state.params["distill_proj"]["kernel"], np.eye(64))

  batch = next(data.train)
  # Unequal masked counts per row: means per micro-batch would differ from the whole batch.
  batch["masked_weights"][::3, 5:] = 0.0
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  step = train.make_train_step(objective, model, optimizer, 1)
  closed = jax.make_jaxpr(step)(state, batch)
  ids = {id(c) for c in _all_constants(closed)}
  assert all(id(leaf) in ids for leaf in jax.tree.leaves(teacher_params))

  results = []
  for accum in (1, 2):
    new_state, metrics = jax.jit(train.make_train_step(objective, model, optimizer, accum))(
        state, batch)
    results.append((new_state, summarize(metrics)))
  (s1, m1), (s2, m2) = results
  assert m1["loss"] == pytest.approx(m2["loss"], rel=1e-5)
  for key in ("soft_ce", "mlm_loss", "cosine_loss", "hidden_mse", "attention_mse", "agreement"):
    assert np.isfinite(m1[key]) and m1[key] == pytest.approx(m2[key], rel=1e-4, abs=1e-6), key
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  # The student (W_h included) moved; the teacher did not.
  assert float(jnp.max(jnp.abs(s1.params["distill_proj"]["kernel"] - jnp.eye(64)))) > 1e-5
  for a, b in zip(jax.tree.leaves(teacher_params), jax.tree.leaves(
      {k: saved[k] for k in ("encoder", "mlm")})):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---------------------------------------------------------------------------------------------
# Task distillation on SST-2.


@pytest.mark.slow
def test_task_distillation_beats_fine_tuning_alone(data_dir, tmp_path):
  """A teacher twice as wide, fine-tuned on 2500 SST-2 sentences, teaches a 2-layer student
  fine-tuned on 400 (TinyBERT's task distillation: soft targets, W_h hidden-state and attention
  losses over the uniform layer map); the same student fine-tuned alone on the same 400
  sentences for the same steps scores clearly lower on the 872 dev sentences."""
  glue = str(data_dir / "glue")
  common = {"data_dir": glue, "eval_every": 100000, "checkpoint_every": 100000,
            "log_every": 1000, "tensorboard": False, "async_checkpointing": False}
  teacher_dir = tmp_path / "teacher"
  teacher_eval = train.train_and_evaluate(make_config(
      "configs/glue.py:task=sst2,runlocal",
      **{**common, "max_train_examples": 2500, "num_epochs": 3.0, "batch_size": 32,
         "model.hidden_size": 128, "model.intermediate_size": 256}), teacher_dir)["last_eval"]
  student = {**common, "max_train_examples": 400, "num_epochs": 8.0}
  alone = train.train_and_evaluate(make_config(
      "configs/glue.py:task=sst2,runlocal",
      **{**student, "data.tokenizer": str(teacher_dir / "tokenizer")}), tmp_path / "alone")
  distilled = train.train_and_evaluate(make_config(
      "configs/distill.py:task=sst2,runlocal",
      **{**student, "distill.teacher": str(teacher_dir), "distill.hidden_weight": 1.0,
         "distill.attention_weight": 1.0, "distill.layer_map": "uniform"}),
      tmp_path / "distilled")
  teacher_acc = teacher_eval["accuracy"]
  print(f"SST-2 dev accuracy: teacher {teacher_acc:.4f}, student alone "
        f"{alone['last_eval']['accuracy']:.4f}, distilled {distilled['last_eval']['accuracy']:.4f}")
  assert alone["step"] == distilled["step"] == 200
  assert distilled["last_eval"]["examples"] == 872
  assert distilled["last_eval"]["accuracy"] > alone["last_eval"]["accuracy"] + 0.03
  assert distilled["last_eval"]["loss"] < alone["last_eval"]["loss"]
  assert teacher_acc > distilled["last_eval"]["accuracy"] - 0.05  # the teacher was worth copying
  params = checkpoints.restore_params(tmp_path / "distilled")
  assert params["encoder"]["embeddings"]["word_embeddings"]["embedding"].shape[1] == 64
  assert params["distill_proj"]["kernel"].shape == (64, 128)   # W_h: student -> teacher width


# ---------------------------------------------------------------------------------------------
# Bad input.


@pytest.mark.parametrize("case", ["missing", "vocab", "layer_map"])
def test_bad_input_is_one_line(case, teacher, tmp_path):
  args = {
      "missing": ["--config.distill.teacher=" + str(tmp_path / "no_such_teacher")],
      "vocab": [f"--config.distill.teacher={teacher}"],  # runlocal's student has 4000 tokens
      "layer_map": [f"--config.distill.teacher={teacher}", f"--config.model.vocab_size={VOCAB}",
                    "--config.distill.student_init=scratch", "--config.distill.hidden_weight=1.0",
                    "--config.distill.layer_map=0:1,1:9"],
  }[case]
  needle = {"missing": "does not exist", "vocab": "vocab_size 512",
            "layer_map": "names teacher layer 9, but the teacher has 6 layers"}[case]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "launch.py", "--config", "configs/distill.py:runlocal",
                      "--workdir", str(tmp_path / "w"), *args], cwd=REPO, env=env,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 2, r.stderr[-2000:]
  assert "Traceback" not in r.stderr
  errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and needle in errors[0], r.stderr[-2000:]


@pytest.mark.slow
def test_the_teachers_tokenizer_leaves_the_config_as_given_and_the_run_resumes(teacher, tmp_path):
  """Without data_dir the corpus is prepared with the teacher's tokenizer: on a copy of the
  config, so the run records the config it was given, and its rerun resumes without a changed
  setting (the run's config was once rewritten in place, so its config.json named the teacher's
  tokenizer and no longer matched the command that made it)."""
  def config(steps):
    config = student_config("", teacher, steps, checkpoint_every=2, eval_every=0)
    assert not config.data_dir and config.data.corpus  # runlocal's raw sample, prepared here
    return config

  first = config(2)
  before = first.to_json()
  workdir = tmp_path / "run"
  train.train_and_evaluate(first, workdir)
  assert first.to_json() == before
  assert json.loads((workdir / "config.json").read_text())["data"]["tokenizer"] == ""
  files = lambda folder: {p.name: p.read_bytes() for p in (folder / "tokenizer").iterdir()}
  assert files(workdir) == files(teacher)  # the teacher's vocabulary, id for id
  summary = train.train_and_evaluate(config(4), workdir)
  assert summary["step"] == 4 and summary["status"] == "finished"


@pytest.mark.slow
def test_the_compile_tool_compiles_the_trainers_distillation_step(corpus, teacher):
  """The one setup for configs/distill.py:runlocal (tests/test_one_setup.py has the other
  recipes): the compile tool's cpu-1 step, teacher inside, is the trainer's."""
  from tests.test_one_setup import same_step
  same_step("configs/distill.py:runlocal", {"data_dir": str(corpus), **RUN, **MODEL,
                                             "model.num_hidden_layers": 4,
                                             "distill.teacher": str(teacher)})
