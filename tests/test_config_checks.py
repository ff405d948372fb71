"""Settings are checked before anything is prepared, trained or written
(bertjax/config/config_checks.py): every numeric range, the mesh against the devices, batch and
model, max_seq_length against the position table of the model trained, the data's tokenizer against
init_from's. Each refusal is one line (exit status 2) and leaves an earlier run's workdir as it
was."""

import asyncio
import gc
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import time
import types

import jax
import ml_collections
import numpy as np
import pytest

from bertjax.config import config_checks, config_lib
from bertjax.core.errors import UserError
from bertjax.data import tokenizers
from bertjax.models.config import ModelConfig
from bertjax.runtime import checkpoints
from bertjax.trainer import train
from orbax.checkpoint._src import asyncio_utils
from tests.helpers import run_module
from tests.test_train import REPO, run_launch, tiny_config

CONFIGS = ["quickstart.py", "quickstart.py:runlocal", "bert.py", "bert.py:runlocal", "albert.py",
           "roberta.py", "electra.py", "spanbert.py", "distill.py", "glue.py", "glue.py:runlocal",
           "squad.py", "ner.py", "modernbert.py", "modernbert.py:runlocal"]
# Numeric settings whose every value is meaningful, or that other code checks where they are read.
UNRANGED = {"null_score_diff_threshold",  # SQuAD v2: any margin, negative included
            "distill.temperature", "distill.soft_weight", "distill.hard_weight",  # distill_settings
            "distill.cosine_weight", "distill.hidden_weight", "distill.attention_weight",
            # ModernBERT's, ranged by ModelConfig with the architecture (bertjax/models/config.py)
            "model.norm_eps", "model.global_rope_theta", "model.local_rope_theta",
            "model.global_attn_every_n_layers", "model.local_attention", "model.attention_dropout",
            "model.embedding_dropout", "model.mlp_dropout", "model.initializer_range",
            "model.initializer_cutoff_factor", "model.classifier_dropout"}


def fake_mesh(data=1, fsdp=1, tensor=1):
  """What the checks read of a mesh (its axis sizes), for layouts this host has no devices for."""
  return types.SimpleNamespace(shape={"data": data, "fsdp": fsdp, "tensor": tensor})


def one_error_line(r, needle):
  assert r.returncode == 2, r.stderr[-3000:]
  assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr[-3000:]
  errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and needle in errors[0], r.stderr[-3000:]
  return errors[0]


def snapshot(folder: pathlib.Path) -> dict[str, bytes]:
  return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
          if p.is_file()}


# --------------------------------------------------------------------------- ranges, in process


def _numeric_keys(config, prefix=""):
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      yield from _numeric_keys(value, f"{prefix}{key}.")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
      yield prefix + key


@pytest.mark.parametrize("spec", CONFIGS)
def test_every_config_passes_and_every_numeric_setting_has_a_range(spec):
  config = config_lib.load_config_file(str(REPO / "configs" / spec))
  config_checks.check_settings(config)
  ruled = {key for key, *_ in config_checks.RULES}
  assert set(_numeric_keys(config)) - ruled - UNRANGED == set()


def test_every_rule_names_a_setting_of_some_config_and_its_example_is_in_range():
  keys = set()
  for spec in CONFIGS:
    keys |= set(_numeric_keys(config_lib.load_config_file(str(REPO / "configs" / spec))))
  for key, allowed, _, example in config_checks.RULES:
    assert key in keys, key
    assert allowed.holds(example), (key, example)


@pytest.mark.parametrize("key, value, needle", [
    ("log_every", 0, "log_every=0 must be >= 1"),
    ("checkpoint_every", 0, "checkpoint_every=0 must be >= 1"),
    ("keep_checkpoints", 0, "keep_checkpoints=0 must be >= 1"),
    ("keep_checkpoints", -1, "keep_checkpoints=-1 must be >= 1"),
    ("learning_rate", -1e-4, "learning_rate=-0.0001 must be >= 0"),
    ("total_steps", -1, "total_steps=-1 must be >= 0"),
    ("batch_size", 0, "batch_size=0 must be >= 1"),
    ("grad_accum_steps", 0, "grad_accum_steps=0 must be >= 1"),
    ("eval_every", -5, "eval_every=-5 must be >= 0"),
    ("seed", -1, "seed=-1 must be in [0, 4294967296)"),
    ("prefetch_batches", -1, "prefetch_batches=-1 must be >= 0"),
    ("max_predictions_per_seq", 0, "max_predictions_per_seq=0 must be >= 1"),
    ("max_seq_length", 2, "max_seq_length=2 must be >= 3"),
    ("model.hidden_dropout_prob", 1.0, "model.hidden_dropout_prob=1.0 must be in [0, 1)"),
    ("model.attention_probs_dropout_prob", -0.1, "must be in [0, 1)"),
    ("model.num_attention_heads", 0, "model.num_attention_heads=0 must be >= 1"),
    ("model.layer_norm_eps", 0.0, "model.layer_norm_eps=0.0 must be > 0"),
    ("model.embedding_size", 0, "model.embedding_size=0 must be >= 1 or None"),
    ("masking.rate", 0.0, "masking.rate=0.0 must be in (0, 1)"),
    ("masking.rate", 1.0, "masking.rate=1.0 must be in (0, 1)"),
    ("masking.span_p", 0.0, "masking.span_p=0.0 must be in (0, 1]"),
    ("data.short_seq_prob", 1.5, "data.short_seq_prob=1.5 must be in [0, 1]"),
    ("optimizer.warmup_steps", -2, "optimizer.warmup_steps=-2 must be >= -1"),
    ("optimizer.warmup_fraction", 1.5, "optimizer.warmup_fraction=1.5 must be in [0, 1]"),
    ("optimizer.weight_decay", -0.01, "optimizer.weight_decay=-0.01 must be >= 0"),
    ("optimizer.b2", 1.0, "optimizer.b2=1.0 must be in [0, 1)"),
    ("optimizer.eps", 0.0, "optimizer.eps=0.0 must be > 0"),
    ("optimizer.grad_clip_norm", -1.0, "optimizer.grad_clip_norm=-1.0 must be >= 0"),
    ("optimizer.layerwise_lr_decay", 0.0, "optimizer.layerwise_lr_decay=0.0 must be in (0, 1]"),
    ("electra.generator_hidden_fraction", 1.5, "must be in (0, 1]"),
    ("optimizer.name", "adamx", "optimizer.name='adamx' must be one of adamw, lamb, adam, sgd"),
    ("best_mode", "maximum", "best_mode='maximum' must be one of max, min"),
])
def test_a_setting_out_of_range_is_refused_with_its_fix(key, value, needle):
  config = tiny_config()
  config_lib.apply_overrides(config, [f"{key}={value!r}"])
  with pytest.raises(UserError) as e:
    config_checks.check_settings(config)
  message = str(e.value)
  assert needle in message and f"fix: --config.{key}=" in message and "\n" not in message
  # The fix's example is itself accepted.
  example = message.rsplit(f"fix: --config.{key}=", 1)[1]
  config_lib.apply_overrides(config, [f"{key}={example}"])
  config_checks.check_settings(config)


def test_settings_that_depend_on_each_other():
  config = tiny_config(**{"model.pad_token_id": 200})
  with pytest.raises(UserError, match="model.pad_token_id=200 must be below model.vocab_size=200"):
    config_checks.check_settings(config)
  glue = config_lib.load_config_file(str(REPO / "configs/glue.py:runlocal"))
  config_lib.apply_overrides(glue, ["num_epochs=0.0"])  # total_steps=0 derives from num_epochs
  with pytest.raises(UserError, match="total_steps=0 derives the steps from num_epochs"):
    config_checks.check_settings(glue)
  config_lib.apply_overrides(glue, ["total_steps=10"])
  config_checks.check_settings(glue)


def test_a_loss_kept_as_best_needs_best_mode_min(tmp_path):
  """ea9bcfe took best_metric=loss with best_mode's default, max, and kept the highest loss in
  best/ (quickstart runlocal: step 10's 8.817 over step 20's 8.327)."""
  for metric in ("loss", "mlm_loss", "soft_kl"):
    with pytest.raises(UserError) as e:
      train.train_and_evaluate(tiny_config(best_metric=metric), tmp_path / metric)
    assert str(e.value) == (f"best_metric={metric!r} is best at its lowest, but best_mode='max' "
                            "keeps its highest; fix: --config.best_mode=min")
    assert not (tmp_path / metric).exists()
  config_checks.check_settings(tiny_config(best_metric="loss", best_mode="min"))
  config_checks.check_settings(tiny_config(best_metric="mlm_accuracy"))


def test_ranges_read_as_written_and_refuse_nan():
  assert str(config_checks.Range(1)) == ">= 1"
  assert str(config_checks.Range(1, also=(None,))) == ">= 1 or None"
  assert str(config_checks.OPEN_UNIT) == "in (0, 1)" and str(config_checks.PROBABILITY) == "in [0, 1)"
  assert config_checks.POSITIVE.holds(1e-9) and not config_checks.POSITIVE.holds(float("nan"))
  assert not config_checks.AT_LEAST_1.holds(True) and not config_checks.AT_LEAST_1.holds("3")
  assert config_checks.Range(1, also=(None,)).holds(None) and not config_checks.AT_LEAST_1.holds(None)


def test_model_config_refuses_zero_heads_with_one_line():
  with pytest.raises(UserError, match="num_attention_heads=0"):
    ModelConfig(num_attention_heads=0)


# --------------------------------------------------------------------------- the run's shape


def _objective(data_kind="nsp"):
  return types.SimpleNamespace(data_kind=data_kind)


def test_batch_against_data_parallel_size_and_accumulation():
  config = tiny_config(batch_size=12, grad_accum_steps=2)
  with pytest.raises(UserError, match=r"batch_size=12 must be divisible by data-parallel size 4 x "
                                      r"grad_accum_steps 2; fix: --config.batch_size=8"):
    config_checks.accumulation_steps(config, fake_mesh(data=2, fsdp=2))
  assert config_checks.accumulation_steps(config, fake_mesh(data=2, fsdp=3)) == 2


@pytest.mark.parametrize("mesh, overrides, needle", [
    ((1, 1, 8), {}, "model.num_attention_heads=2 is not divisible by 8, the size of mesh axis "
                    "tensor that its logical axis 'heads' is sharded over (mesh_shape=(1, 1, 8)); "
                    "fix: --config.mesh_shape='(-1, 1, 2)'"),
    ((1, 1, 2), {"model.intermediate_size": 63}, "model.intermediate_size=63 is not divisible by 2"),
    ((1, 4, 1), {"model.hidden_size": 34}, "model.hidden_size=34 is not divisible by 4, the size "
                                           "of mesh axis fsdp"),
    ((1, 1, 2), {"model.vocab_size": 201}, "or --config.model.vocab_size=202 (padded)"),
])
def test_mesh_against_heads_and_hidden_sizes(mesh, overrides, needle):
  config = tiny_config(**overrides)
  cfg = train.model_config_from(config)
  with pytest.raises(UserError) as e:
    config_checks.check_run(config, _objective(), cfg, fake_mesh(*mesh))
  assert needle in str(e.value)


def test_a_mesh_that_fits_passes_and_custom_rules_are_followed():
  config = tiny_config(**{"model.num_attention_heads": 4, "model.vocab_size": 256})
  cfg = train.model_config_from(config)
  assert config_checks.check_run(config, _objective(), cfg, fake_mesh(2, 1, 4)) == 1
  # With heads, mlp and vocab unsharded, 2 heads need not divide a tensor axis of 4.
  config = tiny_config(logical_rules=[("heads", None), ("mlp", None), ("vocab", None)])
  config_checks.check_run(config, _objective(), train.model_config_from(config), fake_mesh(1, 1, 4))


def test_max_seq_length_against_the_position_table_of_the_model_trained():
  config = tiny_config(max_seq_length=256)  # tiny_config's model has 128 positions
  with pytest.raises(UserError, match=r"max_seq_length=256 exceeds the model's 128 positions"):
    config_checks.check_run(config, _objective(), train.model_config_from(config), fake_mesh())
  roberta = train.model_config_from(tiny_config()).replace(architecture="roberta", pad_token_id=1,
                                                           max_position_embeddings=130)
  config = tiny_config(max_seq_length=129)  # RoBERTa's positions start after pad_token_id
  with pytest.raises(UserError, match="exceeds the model's 128 positions"):
    config_checks.check_positions(config, roberta)
  config_lib.apply_overrides(config, ["max_seq_length=128"])
  config_checks.check_positions(config, roberta)


def test_max_predictions_must_leave_room_for_masking_only_in_pretraining():
  config = tiny_config(max_seq_length=16, max_predictions_per_seq=16)
  cfg = train.model_config_from(config)
  with pytest.raises(UserError, match="max_predictions_per_seq=16 must be below max_seq_length=16"):
    config_checks.check_run(config, _objective(), cfg, fake_mesh())
  config_checks.check_run(config, _objective("task"), cfg, fake_mesh())  # tasks never mask


def test_a_parameter_that_does_not_divide_its_mesh_axis_is_named():
  params = {"generator": {"query": {"kernel": jax.ShapeDtypeStruct((32, 1, 16), np.float32)}}}
  named = types.SimpleNamespace(mesh=types.SimpleNamespace(shape={"data": 1, "fsdp": 1, "tensor": 2}),
                                spec=("fsdp", "tensor", None))
  with pytest.raises(UserError, match="parameter generator/query/kernel has a dimension of 1, not "
                                      "divisible by 2, the size of mesh axis tensor"):
    config_checks.check_param_shardings(params, {"generator": {"query": {"kernel": named}}})


# --------------------------------------------------------------------------- files and tokenizers


def test_workdir_that_is_a_file_or_under_one(tmp_path):
  file = tmp_path / "notes.txt"
  file.write_text("keep me")
  with pytest.raises(UserError, match=re.escape(f"workdir {file} is a file, not a folder")):
    config_checks.check_workdir(file)
  with pytest.raises(UserError, match=re.escape(f"workdir {file / 'run'} cannot be created: "
                                                f"{file} is a file")):
    config_checks.check_workdir(file / "run")
  config_checks.check_workdir(tmp_path / "new" / "run")
  assert file.read_text() == "keep me" and not (tmp_path / "new").exists()


def test_init_from_path_is_checked_before_its_tokenizer(tmp_path):
  config = tiny_config(init_from=str(tmp_path / "nope"))
  with pytest.raises(UserError, match=r"init_from=.*nope does not exist"):
    config_checks.check_settings(config)
  (tmp_path / "empty").mkdir()
  config = tiny_config(init_from=str(tmp_path / "empty"))
  with pytest.raises(UserError, match="holds neither params/"):
    config_checks.check_settings(config)


def test_truncated_config_json_of_init_from_is_one_line(tmp_path):
  text = json.dumps({"model": ModelConfig().to_dict(), "total_steps": 4}, indent=2)
  (tmp_path / "config.json").write_text(text[:100])
  with pytest.raises(UserError, match=r"config.json is not a bertjax config.json \(JSONDecodeError"):
    checkpoints.load_model_config(tmp_path)
  (tmp_path / "config.json").write_text(json.dumps({"total_steps": 4}))
  with pytest.raises(UserError, match="is not a bertjax config.json .KeyError"):
    checkpoints.load_model_config(tmp_path)


def wordpiece(folder: pathlib.Path, words) -> tokenizers.Tokenizer:
  folder.mkdir(parents=True)
  specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  (folder / "vocab.txt").write_text("\n".join(specials + list(words)) + "\n")
  tok = tokenizers.load_tokenizer(folder)
  tok.save(folder)
  return tok


@pytest.fixture
def init_from_with_tokenizer(tmp_path):
  """A stand-in init_from: a workdir with (empty) checkpoints/ and a WordPiece tokenizer/."""
  folder = tmp_path / "pretrained"
  (folder / "checkpoints").mkdir(parents=True)
  wordpiece(folder / "tokenizer", ["the", "cat", "sat", "##s"])
  return folder


def test_a_tokenizer_other_than_init_froms_is_refused(tmp_path, init_from_with_tokenizer):
  config = tiny_config(init_from=str(init_from_with_tokenizer))
  same = tokenizers.load_tokenizer(init_from_with_tokenizer / "tokenizer")
  reordered = wordpiece(tmp_path / "reordered", ["the", "sat", "cat", "##s"])  # same size
  cased = tokenizers.WordPieceTokenizer(init_from_with_tokenizer / "tokenizer/vocab.txt",
                                        lowercase=False)
  config_checks.check_tokenizer(config, same, "the data", "fix it")
  for other in (reordered, cased):
    with pytest.raises(UserError, match=r"the data is tokenized differently \(the data: wordpiece, "
                                        r"9 tokens, other pieces or casing\) from what init_from="):
      config_checks.check_tokenizer(config, other, "the data", "fix it")
  task = types.SimpleNamespace(tokenizer=reordered, vocab_size=9)
  config_lib.apply_overrides(config, [f"data.tokenizer='{tmp_path / 'reordered'}'"])
  with pytest.raises(UserError, match="fix: leave --config.data.tokenizer empty"):
    config_checks.check_data(config, _objective("task"), ModelConfig(vocab_size=9), task)


def test_vocab_advice_follows_where_the_model_comes_from(init_from_with_tokenizer):
  config = tiny_config(init_from=str(init_from_with_tokenizer))
  cfg = ModelConfig(vocab_size=9)
  with pytest.raises(UserError) as e:  # fine-tuning: the vocabulary is init_from's
    config_checks.check_vocab(config, cfg, 12, from_checkpoint=True)
  assert "init_from's own tokenizer" in str(e.value) and "model.vocab_size=" not in str(e.value)
  with pytest.raises(UserError, match="fix: --config.model.vocab_size=12"):
    config_checks.check_vocab(config, cfg, 12, from_checkpoint=False)


def test_refused_runs_create_no_workdir(tmp_path, init_from_with_tokenizer):
  """In process, through the trainer: each refusal comes before the workdir is made."""
  cases = [
      (tiny_config(max_seq_length=256), "exceeds the model's 128 positions"),
      (tiny_config(keep_checkpoints=0), "keep_checkpoints=0 must be >= 1"),
      (tiny_config(**{"optimizer.decay": "cosine"}), "optimizer.decay='cosine' must be one of"),
      # Pretraining on raw text from init_from would train a tokenizer of its own.
      (tiny_config(**{"data.synthetic": False, "init_from": str(init_from_with_tokenizer)}),
       "a new one would be trained on data.corpus; fix: --config.data.tokenizer="),
  ]
  for i, (config, needle) in enumerate(cases):
    with pytest.raises(UserError, match=re.escape(needle)):
      train.train_and_evaluate(config, tmp_path / f"w{i}")
    assert not (tmp_path / f"w{i}").exists()


def test_fine_tuning_checks_max_seq_length_against_init_froms_positions(tmp_path):
  init_from = tmp_path / "pretrained"
  (init_from / "checkpoints").mkdir(parents=True)
  model = ModelConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=128).to_dict()
  (init_from / "config.json").write_text(json.dumps({"model": model}))
  config = config_lib.load_config_file(str(REPO / "configs/glue.py:task=sst2"))
  # config.model (bert-base) would allow 512 positions; the model trained is init_from's, with
  # 128. (A --config.model.max_position_embeddings given with init_from is refused itself.)
  config_lib.apply_overrides(config, [f"init_from='{init_from}'", "max_seq_length=256"])
  with pytest.raises(UserError, match=re.escape(f"exceeds the 128 positions of the model of "
                                                f"init_from={init_from}; fix: "
                                                "--config.max_seq_length=128")):
    train.train_and_evaluate(config, tmp_path / "w")
  assert not (tmp_path / "w").exists()


# --------------------------------------------------------------------------- orbax's loops


def test_a_failed_restore_finishes_its_reads_before_the_loop_closes(monkeypatch):
  """orbax's run_sync closed its loop under reads still in flight when one failed: each then
  printed a traceback ("Event loop is closed", "Exception ignored in: <coroutine ...>").
  bertjax's restores run inside checkpoints.draining_event_loops, which finishes them."""
  unraisable, finished = [], []
  monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

  async def read(i, gate):
    try:
      await gate
    except BaseException as e:  # as orbax's _read_array_index_and_device_put
      finished.append(i)
      raise RuntimeError(f"read {i} failed") from e

  async def restore():
    loop = asyncio.get_running_loop()
    gates = [loop.create_future() for _ in range(8)]

    async def damaged():
      raise ValueError("damaged array")
    await asyncio.gather(damaged(), *(read(i, g) for i, g in enumerate(gates)))

  with pytest.raises(ValueError, match="damaged array"), checkpoints.draining_event_loops():
    asyncio_utils.run_sync(restore())
  gc.collect()
  assert sorted(finished) == list(range(8)) and not unraisable


@pytest.mark.parametrize("draining", [False, True])
def test_a_wake_up_after_a_failed_saves_loop_closed_is_dropped(draining):
  """A write still in flight when its sibling fails (a full disk) finishes after orbax's
  run_sync has closed the loop, and wakes it from its own thread as TensorStore does:
  asyncio's loop raises "Event loop is closed", which TensorStore printed as a traceback after
  the one-line error (9e59c5e's CI, test_full_disk.py); the draining loop drops it."""
  raised, threads = [], []

  def wake_later(loop, future):
    time.sleep(0.5)  # by now run_sync has closed the loop
    try:
      loop.call_soon_threadsafe(future.set_result, None)
    except RuntimeError as e:
      raised.append(e)

  async def save():
    loop = asyncio.get_running_loop()
    written = loop.create_future()
    threads.append(threading.Thread(target=wake_later, args=(loop, written)))
    threads[0].start()

    async def full():
      raise OSError(28, "No space left on device")
    await asyncio.gather(full(), written)

  with pytest.raises(OSError, match="No space"):
    if draining:
      with checkpoints.draining_event_loops():
        asyncio_utils.run_sync(save())
    else:
      asyncio_utils.run_sync(save())
  threads[0].join()
  assert [str(e) for e in raised] == ([] if draining else ["Event loop is closed"])


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
  """A tiny pretraining run, finished, with checkpoints at steps 2 and 4."""
  workdir = tmp_path_factory.mktemp("finished") / "run"
  r = run_launch("--config", "configs/quickstart.py:runlocal", "--workdir", str(workdir),
                 *TINY_ARGS)
  assert r.returncode == 0, r.stderr[-3000:]
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["2", "4"]
  return workdir


TINY_ARGS = ["--config.data.synthetic=True", "--config.model.vocab_size=200",
             "--config.model.hidden_size=32", "--config.model.intermediate_size=64",
             "--config.max_seq_length=16", "--config.max_predictions_per_seq=4",
             "--config.tensorboard=False", "--config.total_steps=4", "--config.checkpoint_every=2",
             "--config.eval_every=0", "--config.log_every=1"]


@pytest.mark.slow
@pytest.mark.parametrize("args, needle", [
    # Resumed, this deleted every checkpoint (exit 0).
    (["--config.keep_checkpoints=0", "--config.total_steps=6"], "keep_checkpoints=0 must be >= 1"),
    (["--config.max_seq_length=256"], "max_seq_length=256 exceeds the model's 128 positions"),
    (["--config.log_every=0"], "log_every=0 must be >= 1"),
    (["--config.checkpoint_every=0", "--config.total_steps=6"], "checkpoint_every=0 must be >= 1"),
    (["--config.learning_rate=-0.001", "--config.total_steps=6"], "learning_rate=-0.001 must be >= 0"),
])
def test_a_refused_resume_leaves_the_workdir_as_it_was(tmp_path, finished_run, args, needle):
  workdir = tmp_path / "run"
  shutil.copytree(finished_run, workdir)
  before = snapshot(workdir)
  r = run_launch("--config", "configs/quickstart.py:runlocal", "--workdir", str(workdir),
                 *TINY_ARGS, *args)
  one_error_line(r, needle)
  assert snapshot(workdir) == before


@pytest.mark.slow
def test_a_workdir_that_is_a_file_is_one_line(tmp_path):
  file = tmp_path / "run"
  file.write_text("an earlier run's notes\n")
  r = run_launch("--config", "configs/quickstart.py:runlocal", "--workdir", str(file), *TINY_ARGS)
  one_error_line(r, f"workdir {file} is a file, not a folder")
  assert file.read_text() == "an earlier run's notes\n"


@pytest.mark.slow
def test_a_mesh_that_does_not_divide_the_heads_is_one_line(tmp_path):
  """8 fake CPU devices, tensor-parallel over all 8: 2 heads cannot be split 8 ways."""
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8")
  base = [sys.executable, "launch.py", "--config", "configs/quickstart.py:runlocal", *TINY_ARGS,
          "--config.batch_size=8"]
  run = lambda *a: subprocess.run([*base, *a], cwd=REPO, env=env, capture_output=True, text=True,
                                  timeout=600)
  r = run("--workdir", str(tmp_path / "a"), "--config.mesh_shape=(1, 1, 8)")
  one_error_line(r, "model.num_attention_heads=2 is not divisible by 8")
  # ELECTRA's generator (half width: 1 head) on 2-way tensor parallelism: named by parameter.
  r = run("--workdir", str(tmp_path / "b"), "--config.mesh_shape=(4, 1, 2)",
          "--config.objective=rtd")
  one_error_line(r, "not divisible by 2, the size of mesh axis tensor")
  assert "parameter generator" in r.stderr
  assert not (tmp_path / "a").exists()


@pytest.mark.slow
def test_init_from_with_every_checkpoint_damaged_is_one_line(tmp_path, finished_run):
  """orbax's in-flight reads used to print hundreds of lines after the error (when the
  damaged arrays were read in parallel): now the one line is all."""
  damaged = tmp_path / "damaged"
  shutil.copytree(finished_run, damaged)
  for f in damaged.glob("checkpoints/*/state/ocdbt.process_0/d/*"):
    f.write_bytes(f.read_bytes()[:50])
  for d in damaged.glob("checkpoints/*/data"):
    shutil.rmtree(d)
  r = run_launch("--config", "configs/quickstart.py:runlocal", "--workdir", str(tmp_path / "w"),
                 *TINY_ARGS, f"--config.init_from={damaged}")
  one_error_line(r, f"no readable checkpoint in {damaged / 'checkpoints'}")
  assert len(r.stderr.splitlines()) < 10, r.stderr[-3000:]
  assert not (tmp_path / "w" / "config.json").exists()


@pytest.mark.slow
def test_init_from_problems_are_one_line(tmp_path, finished_run, data_dir):
  """A tokenizer other than the checkpoint's used to train silently (its 9 ids fit the model's
  200); a truncated config.json was a JSONDecodeError traceback."""
  pretrained = tmp_path / "pretrained"
  shutil.copytree(finished_run, pretrained)
  wordpiece(pretrained / "tokenizer", ["the", "cat", "sat", "##s"])
  wordpiece(tmp_path / "other", ["the", "sat", "cat", "##s"])
  glue = ["--config", "configs/glue.py:task=sst2,runlocal", f"--config.data_dir={data_dir / 'glue'}",
          "--config.max_train_examples=32", f"--config.init_from={pretrained}"]
  r = run_launch(*glue, "--workdir", str(tmp_path / "w1"), f"--config.data.tokenizer={tmp_path / 'other'}")
  one_error_line(r, f"the data is tokenized differently (data.tokenizer={tmp_path / 'other'}: "
                    "wordpiece, 9 tokens, other pieces or casing)")
  assert list((tmp_path / "w1").iterdir()) == []  # refused before anything was written
  r = run_launch("--config", "configs/quickstart.py:runlocal", "--workdir", str(tmp_path / "w2"),
                 f"--config.init_from={pretrained}", f"--config.data.tokenizer={tmp_path / 'other'}")
  one_error_line(r, "the data is tokenized differently")
  config = pretrained / "config.json"
  config.write_text(config.read_text()[:100])
  r = run_launch(*glue, "--workdir", str(tmp_path / "w3"))
  one_error_line(r, f"{config} is not a bertjax config.json (JSONDecodeError")
  assert not (tmp_path / "w2").exists() and not (tmp_path / "w3").exists()


@pytest.mark.slow
def test_benchmark_preset_typo_is_one_line():
  r = run_module("-m", "bertjax.tools.benchmark", "--preset", "bert-tinyy", "--steps", "0")
  one_error_line(r, "unknown model preset 'bert-tinyy'; use one of bert-tiny,")
  r = run_module("-m", "bertjax.tools.benchmark", "--steps", "many")
  one_error_line(r, "argument --steps: invalid int value: 'many'")
