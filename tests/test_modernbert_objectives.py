"""Every pretraining objective and fine-tuning task on a ModernBERT encoder
(`model.architecture="modernbert"`, bertjax/models/modernbert.py): RTD (its generator and
discriminator), span masking with SBO, distillation from and into BERT, GLUE, SQuAD, NER, frozen
encoders, `bertjax.tools.embed` and head pruning; NSP/SOP refused in one line;
configs/modernbert.py's recipe and its runlocal. Tiny shapes (hidden 32, 3 layers, rows <= 64
tokens, a few steps).
"""

from __future__ import annotations

import json
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.convert.hf_configs import model_config_to_hf_config
from bertjax.core.errors import UserError
from bertjax.models import pruning
from bertjax.models.config import ModelConfig
from bertjax.models.electra import ElectraPretrainingModel, generator_config
from bertjax.models.modernbert import ModernBertEncoder
from bertjax.models.presets import preset
from bertjax.prune import __main__ as prune_cli
from bertjax.runtime import checkpoints, metric_writers
from bertjax.tools import embed
from bertjax.trainer import train
from conftest import DATA_DIR
from helpers import load_config

# A ModernBERT of hidden 32: layer 0 global, layers 1 and 2 within an 8-token window.
MB = {"model.architecture": "modernbert", "model.hidden_size": 32,
      "model.intermediate_size": 48, "model.num_attention_heads": 2,
      "model.num_hidden_layers": 3, "model.local_attention": 8, "model.use_pooler": False,
      "model.type_vocab_size": 1, "tensorboard": False, "async_checkpointing": False,
      "checkpoint_every": 100000}
BERT = {"model.hidden_size": 32, "model.intermediate_size": 48, "model.num_attention_heads": 2,
        "model.num_hidden_layers": 2, "tensorboard": False, "async_checkpointing": False,
        "checkpoint_every": 100000}
SYNTHETIC = {"data.synthetic": True, "model.vocab_size": 200, "max_seq_length": 24,
             "max_predictions_per_seq": 4, "total_steps": 2, "eval_every": 2, "log_every": 1}
TINY_CFG = preset("modernbert-tiny").replace(vocab_size=60, hidden_size=32, intermediate_size=40,
                                             num_attention_heads=4, local_attention=4)


def needs_data():
  if not DATA_DIR.is_dir():
    pytest.skip(f"shared data not found at {DATA_DIR}; set BERTJAX_DATA to its folder")


def finite_run(summary, steps):
  assert summary["step"] == steps and summary["status"] == "finished"
  assert all(np.isfinite(v) for v in summary["last_eval"].values() if isinstance(v, float))


def is_modernbert(encoder_params) -> bool:
  return ("Wqkv" in encoder_params["layer_0"].get("attn", {})
          and "tok_embeddings" in encoder_params["embeddings"])


# ------------------------------------------------------------------------------------ RTD


def test_generator_config_narrows_a_modernbert():
  disc = preset("modernbert-base")
  gen = generator_config(disc, 1 / 3)
  assert (gen.architecture, gen.hidden_size, gen.num_attention_heads, gen.head_dim) == (
      "modernbert", 256, 4, 64)
  assert gen.intermediate_size == 384 and gen.embed_size == 768  # reads the 768-wide table
  model = ElectraPretrainingModel(TINY_CFG, generator_config(TINY_CFG, 0.5))
  z = jnp.zeros((1, 8), jnp.int32)
  shapes = jax.eval_shape(lambda r: model.init({"params": r, "sample": r}, z, z + 1, z, z[:, :2],
                                               z[:, :2], jnp.ones((1, 2)))["params"],
                          jax.random.key(0))
  gen_params = shapes["generator"]["encoder"]
  assert "embeddings" not in gen_params  # the discriminator's table, shared
  assert gen_params["embedding_projection"]["kernel"].value.shape == (32, 16)
  assert gen_params["layer_1"]["attn"]["Wqkv"]["kernel"].value.shape == (16, 3, 2, 8)
  assert shapes["generator"]["mlm"]["dense"]["kernel"].value.shape == (16, 32)
  assert shapes["encoder"]["embeddings"]["tok_embeddings"]["embedding"].value.shape == (60, 32)


@pytest.mark.slow
def test_rtd_trains_a_modernbert_generator_and_discriminator(tmp_path):
  config = load_config("configs/quickstart.py:runlocal",
                       **{**MB, **SYNTHETIC, "objective": "rtd"})
  summary = train.train_and_evaluate(config, tmp_path / "run")
  finite_run(summary, 2)
  assert 0 < summary["last_eval"]["rtd_accuracy"] < 1
  params = checkpoints.restore_params(tmp_path / "run")
  assert is_modernbert(params["encoder"]) and "rtd" in params
  assert params["generator"]["encoder"]["layer_2"]["attn"]["Wqkv"]["kernel"].shape == (
      16, 3, 1, 16)


# ------------------------------------------------------------------------------ span, NSP


@pytest.mark.slow
def test_span_sbo_trains_on_a_modernbert(tmp_path):
  """The SBO head's relative positions (the offset in the span) are a table of its own, so it
  needs no position embeddings of the encoder's: ModernBERT takes it as it is."""
  needs_data()
  config = load_config("configs/quickstart.py:runlocal", **{
      **MB, "objective": "span_sbo", "total_steps": 2, "eval_every": 2, "log_every": 1,
      "max_seq_length": 32, "max_predictions_per_seq": 5})
  summary = train.train_and_evaluate(config, tmp_path / "run")
  finite_run(summary, 2)
  assert summary["last_eval"]["sbo_loss"] > 0
  params = checkpoints.restore_params(tmp_path / "run")
  assert is_modernbert(params["encoder"])
  assert params["sbo"]["position_embeddings"]["embedding"].shape == (32, 32)


@pytest.mark.parametrize("objective", ["mlm_nsp", "mlm_sop"])
def test_pair_objectives_are_refused_in_one_line(tmp_path, objective):
  config = load_config("configs/quickstart.py:runlocal",
                       **{**MB, **SYNTHETIC, "objective": objective})
  with pytest.raises(UserError) as e:
    train.train_and_evaluate(config, tmp_path / "run")
  assert "NSP/SOP" in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------------------ distillation


def _pretrain(tmp_path, name, arch):
  config = load_config("configs/quickstart.py:runlocal",
                       **{**arch, **SYNTHETIC, "objective": "mlm"})
  train.train_and_evaluate(config, tmp_path / name)
  return tmp_path / name


@pytest.mark.slow
@pytest.mark.parametrize("teacher_arch,student_arch", [(BERT, MB), (MB, BERT)],
                         ids=["bert_into_modernbert", "modernbert_into_bert"])
def test_distillation_across_architectures(tmp_path, teacher_arch, student_arch):
  """Soft targets, hidden states through W_h, attention scores and the cosine term, from a BERT
  teacher into a ModernBERT student and back; copying layers across them is refused."""
  teacher = _pretrain(tmp_path, "teacher", teacher_arch)
  settings = {**student_arch, **SYNTHETIC, "distill.teacher": str(teacher),
              "distill.student_init": "scratch", "distill.hidden_weight": 1.0,
              "distill.attention_weight": 1.0, "distill.layer_map": "uniform"}
  config = load_config("configs/distill.py:runlocal", **settings)
  summary = train.train_and_evaluate(config, tmp_path / "student")
  finite_run(summary, 2)
  for key in ("soft_kl", "hidden_mse", "attention_mse", "cosine_loss", "teacher_mlm_accuracy"):
    assert key in summary["last_eval"], key
  assert summary["last_eval"]["hidden_mse"] > 0 and summary["last_eval"]["attention_mse"] > 0
  student = checkpoints.restore_params(tmp_path / "student")["encoder"]
  assert ("attn" in student["layer_0"]) == (student_arch is MB)
  config = load_config("configs/distill.py:runlocal", **{
      **settings, "distill.student_init": "teacher_layers"})
  with pytest.raises(UserError) as e:
    train.train_and_evaluate(config, tmp_path / "copied")
  assert "student_init=scratch" in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------------ fine-tuning tasks


@pytest.fixture(scope="module")
def glue_run(tmp_path_factory):
  """SST-2 on a ModernBERT with 4 heads, 3 steps, checkpoints at each (for the frozen check)."""
  needs_data()
  path = tmp_path_factory.mktemp("mb_glue") / "run"
  config = load_config("configs/glue.py:task=sst2,runlocal", **{
      **MB, "model.num_attention_heads": 4, "data_dir": str(DATA_DIR / "glue"),
      "max_train_examples": 48, "batch_size": 16, "total_steps": 3, "eval_every": 0,
      "max_seq_length": 64})
  return path, train.train_and_evaluate(config, path)


@pytest.mark.slow
def test_glue_fine_tunes_a_modernbert(glue_run):
  path, summary = glue_run
  finite_run(summary, 3)
  assert 0 < summary["last_eval"]["accuracy"] < 1
  assert is_modernbert(checkpoints.restore_params(path)["encoder"])


@pytest.mark.slow
def test_task_distillation_from_a_modernbert_teacher(glue_run, tmp_path):
  """distill_glue: the SST-2 ModernBERT above as the teacher of a BERT student."""
  teacher, _ = glue_run
  config = load_config("configs/distill.py:task=sst2,runlocal", **{
      **BERT, "data_dir": str(DATA_DIR / "glue"), "max_train_examples": 32, "total_steps": 2,
      "eval_every": 0, "max_seq_length": 32, "distill.teacher": str(teacher),
      "distill.student_init": "scratch"})
  summary = train.train_and_evaluate(config, tmp_path / "student")
  finite_run(summary, 2)
  student = checkpoints.restore_params(tmp_path / "student")
  assert "attention" in student["encoder"]["layer_0"] and "classifier" in student


@pytest.mark.slow
def test_frozen_modernbert_trains_only_the_head_and_top_layer(tmp_path):
  needs_data()
  path = tmp_path / "run"
  config = load_config("configs/glue.py:task=sst2,runlocal", **{
      **MB, "data_dir": str(DATA_DIR / "glue"), "max_train_examples": 32, "batch_size": 16,
      "total_steps": 2, "eval_every": 0, "max_seq_length": 32, "checkpoint_every": 1,
      "keep_checkpoints": 2, "freeze.encoder": True, "freeze.train_top_layers": 1})
  finite_run(train.train_and_evaluate(config, path), 2)
  flat = lambda step: {"/".join(str(getattr(k, "key", k)) for k in key): np.asarray(v)
                       for key, v in jax.tree_util.tree_leaves_with_path(
                           checkpoints.restore_checkpoint_params(path, step)[1])}
  one, two = flat(1), flat(2)
  assert not any(k.startswith(("encoder/layer_0", "encoder/layer_1", "encoder/embeddings"))
                 and not np.array_equal(one[k], two[k]) for k in one)
  assert any(k.startswith("classifier") and not np.array_equal(one[k], two[k]) for k in one)
  assert any(k.startswith("encoder/layer_2") and not np.array_equal(one[k], two[k]) for k in one)


@pytest.mark.slow
def test_squad_fine_tunes_a_modernbert(tmp_path):
  needs_data()
  config = load_config("configs/squad.py:runlocal", **{
      **MB, "total_steps": 2, "max_train_examples": 32, "batch_size": 8, "eval_batch_size": 64,
      "max_seq_length": 64, "doc_stride": 32, "max_query_length": 16, "eval_every": 0})
  summary = train.train_and_evaluate(config, tmp_path / "run")
  assert summary["step"] == 2 and summary["last_eval"]["f1"] >= 0
  assert is_modernbert(checkpoints.restore_params(tmp_path / "run")["encoder"])


@pytest.mark.slow
def test_ner_fine_tunes_a_modernbert(tmp_path):
  needs_data()
  config = load_config("configs/ner.py:runlocal", **{
      **MB, "total_steps": 2, "max_train_examples": 32, "batch_size": 8, "max_seq_length": 64,
      "eval_every": 0})
  summary = train.train_and_evaluate(config, tmp_path / "run")
  assert summary["step"] == 2 and summary["last_eval"]["f1"] >= 0
  assert is_modernbert(checkpoints.restore_params(tmp_path / "run")["encoder"])


@pytest.mark.slow
def test_embed_reads_a_modernbert_run(glue_run, tmp_path):
  path, _ = glue_run
  text = tmp_path / "in.txt"
  text.write_text("a fine film\nnot good at all , and far too long\n")
  out = tmp_path / "out.npz"
  embed.main(["--workdir", str(path), "--input", str(text), "--output", str(out), "--pooling",
              "mean", "--tokens"])
  got = np.load(out)
  assert got["pooled"].shape == (2, 32) and got["tokens"].shape[:2] == got["input_ids"].shape
  # The mean of a row's token features over its real tokens, computed from the checkpoint.
  cfg = ModelConfig.from_dict(checkpoints.load_model_config(path))
  ids, mask = got["input_ids"][1:2], got["attention_mask"][1:2]
  n = int(mask.sum())
  states = ModernBertEncoder(cfg).apply(
      {"params": checkpoints.restore_params(path)["encoder"]}, jnp.asarray(ids[:, :n]),
      jnp.ones((1, n), jnp.int32)).last_hidden_state
  np.testing.assert_allclose(got["pooled"][1], np.mean(states[0], axis=0), atol=2e-5)
  with pytest.raises(UserError, match="no pooler"):
    embed.main(["--workdir", str(path), "--input", str(text), "--output",
                str(tmp_path / "pooled.npz"), "--pooling", "pooler"])


# ---------------------------------------------------------------------------------- pruning


def random_params(cfg, seed=0):
  """Every parameter drawn at random (init leaves biases 0 and scales 1, which hides mistakes)."""
  ids = jnp.zeros((1, 8), jnp.int32)
  params = nn.meta.unbox(ModernBertEncoder(cfg).init(jax.random.key(seed), ids)["params"])
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  return jax.tree_util.tree_unflatten(
      tree, [0.3 * jax.random.normal(k, x.shape) + (x if x.ndim == 1 else 0)
             for k, x in zip(keys, leaves)])


@pytest.mark.slow
def test_pruned_modernbert_heads_equal_masked_heads():
  cfg = TINY_CFG.replace(attention_bias=True)  # a Wqkv bias to slice too
  params = random_params(cfg)
  remove = {0: [1, 3], 2: [0]}
  rs = np.random.RandomState(2)
  ids = jnp.asarray(rs.randint(1, 60, (2, 12)))
  mask = jnp.asarray(np.arange(12)[None] < np.array([[12], [9]])).astype(jnp.int32)
  masks = [jnp.asarray([0.0 if h in remove.get(i, ()) else 1.0 for h in range(4)])
           for i in range(3)]
  masked = ModernBertEncoder(cfg).apply(
      {"params": pruning.with_head_masks(params, cfg, masks)}, ids, mask)
  small, new = pruning.prune_heads(params, cfg, remove)
  assert new.pruned_heads == ((1, 3), (), (0,))
  assert small["layer_0"]["attn"]["Wqkv"]["kernel"].shape == (32, 3, 2, 8)
  assert small["layer_0"]["attn"]["Wqkv"]["bias"].shape == (3, 2, 8)
  assert small["layer_2"]["attn"]["Wo"]["kernel"].shape == (3, 8, 32)
  out = ModernBertEncoder(new).apply({"params": small}, ids, mask).last_hidden_state
  full = ModernBertEncoder(cfg).apply({"params": params}, ids, mask).last_hidden_state
  real = np.asarray(mask, bool)
  np.testing.assert_allclose(np.asarray(out)[real], np.asarray(masked.last_hidden_state)[real],
                             atol=1e-5)
  assert np.max(np.abs(out - full)) > 1e-2  # pruning did act
  with pytest.raises(UserError, match="prune its heads only"):
    pruning.remove_layers(params, cfg, [1])


@pytest.mark.slow
def test_prune_command_removes_modernbert_heads(glue_run, tmp_path):
  path, _ = glue_run
  out = tmp_path / "out"
  rows = prune_cli.main(["--workdir", str(path), "--output", str(out), "--target-heads", "0.5",
                         "--steps", "1", "--finetune-steps", "1"])
  assert [r["heads"] for r in rows] == [12, 6] and rows[1]["layers"] == 3
  assert rows[1]["encoder_params"] < rows[0]["encoder_params"]
  meta = json.loads((out / "step_1" / "pruned" / "model.json").read_text())
  assert sum(len(h) for h in meta["model"]["pruned_heads"]) == 6
  params = checkpoints.restore_params(out / "step_1" / "finetuned")["encoder"]
  kept = [params[f"layer_{i}"]["attn"]["Wqkv"]["kernel"].shape[2] for i in range(3)]
  assert sum(kept) == 6 and min(kept) >= 1
  with pytest.raises(UserError) as e:
    prune_cli.main(["--workdir", str(path), "--output", str(tmp_path / "layers"),
                    "--target-layers", "0.5"])
  assert "prune its heads only" in str(e.value) and "\n" not in str(e.value)
  # transformers' ModernBertConfig has no pruned_heads: the export refuses it.
  with pytest.raises(UserError, match="no Hugging Face equivalent"):
    model_config_to_hf_config(ModelConfig.from_dict(meta["model"]))


# ---------------------------------------------------------------------------- the recipe


def test_recipe_config_uses_the_modernbert_presets():
  published = load_config("configs/modernbert.py")
  assert (published.model.architecture, published.model.num_hidden_layers,
          published.model.hidden_size, published.masking.rate) == ("modernbert", 22, 768, 0.3)
  local = load_config("configs/modernbert.py:runlocal")
  assert (local.model.architecture, local.model.num_hidden_layers,
          local.model.local_attention) == ("modernbert", 3, 16)
  assert local.model.local_attention < local.max_seq_length  # the window matters


@pytest.mark.slow
def test_recipe_runlocal_trains(tmp_path):
  """configs/modernbert.py:runlocal on the shipped sample, cut to 8 steps: packed rows, the
  batch warmup, StableAdamW and WSD all run on the tiny ModernBERT."""
  config = load_config("configs/modernbert.py:runlocal", total_steps=8, eval_every=8,
                       log_every=4, checkpoint_every=8, tensorboard=False,
                       async_checkpointing=False)
  summary = train.train_and_evaluate(config, tmp_path / "run")
  finite_run(summary, 8)
  rows = metric_writers.read_metrics(tmp_path / "run")
  assert [r["step"] for r in rows if r["split"] == "train"] == [4, 8]
  recorded = json.loads((tmp_path / "run" / "config.json").read_text())
  assert recorded["model"]["architecture"] == "modernbert"
  assert is_modernbert(checkpoints.restore_params(tmp_path / "run")["encoder"])
  assert pathlib.Path(tmp_path / "run" / "tokenizer").is_dir()
