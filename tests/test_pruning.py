"""Pruning (bertjax.prune, bertjax.models.pruning): heads and layers removed, magnitude pruning.

A pruned model equals the unpruned one with those heads masked; it round-trips through orbax
and through Hugging Face export (transformers prunes by `pruned_heads` on load); head
importance scores equal finite differences of the loss; magnitude-pruned weights stay exactly
zero through fine-tuning with weight decay.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import jax
import flax.linen as nn
import jax.numpy as jnp
import optax
import numpy as np
import pytest
import torch
import transformers as T

import bertjax
from bertjax import convert
from bertjax.config import config_checks
from bertjax.convert import sources
from bertjax.models.config import ModelConfig
from bertjax.prune.session import Session
from bertjax.runtime import checkpoints, optim
from bertjax.trainer import train
from conftest import DATA_DIR
from helpers import TINY, load_config, run_module
from bertjax.core.errors import UserError
from bertjax.data import tokenizers
from bertjax.models import pruning
from bertjax.models.classifiers import SequenceClassifier
from bertjax.models.config import ModelConfig
from bertjax.models.encoder import Encoder, init_params
from bertjax.prune import __main__ as prune_cli, folders, importance, magnitude, select, table

CFG = ModelConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                  intermediate_size=40, max_position_embeddings=32, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
REMOVE = {0: [1, 3], 2: [0]}


def random_params(model, cfg, seed=0):
  """Every parameter drawn at random (init leaves biases 0 and scales 1, which hides mistakes)."""
  if isinstance(model, Encoder):
    params = init_params(model, cfg, jax.random.key(seed))
  else:
    ids = jnp.zeros((1, 8), jnp.int32)
    params = model.init(jax.random.key(seed), ids, ids, ids)["params"]
    params = nn.meta.unbox(params)
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  return jax.tree_util.tree_unflatten(
      tree, [0.3 * jax.random.normal(k, x.shape) + (x if x.ndim == 1 else 0)
             for k, x in zip(keys, leaves)])


def inputs(seed=2, batch=3, seq=10):
  rs = np.random.RandomState(seed)
  ids = rs.randint(1, CFG.vocab_size, (batch, seq))
  mask = np.ones((batch, seq), np.int32)
  mask[1, 7:] = 0
  types = np.zeros_like(ids)
  types[:, 5:] = 1
  return jnp.asarray(ids * mask), jnp.asarray(mask), jnp.asarray(types * mask)


def masks_without(cfg, remove):
  return [jnp.asarray([0.0 if h in remove.get(i, ()) else 1.0 for h in cfg.kept_heads(i)])
          for i in range(cfg.num_hidden_layers)]


@pytest.mark.slow
def test_pruned_heads_equal_masked_heads():
  params = random_params(Encoder(CFG), CFG)
  ids, mask, types = inputs()
  masked = Encoder(CFG).apply({"params": pruning.with_head_masks(params, CFG, masks_without(CFG, REMOVE))},
                              ids, mask, types)
  small, cfg = pruning.prune_heads(params, CFG, REMOVE)
  assert cfg.pruned_heads == ((1, 3), (), (0,))
  assert [cfg.layer_heads(i) for i in range(3)] == [2, 4, 3]
  assert small["layer_0"]["attention"]["query"]["kernel"].shape == (32, 2, 8)
  assert small["layer_0"]["attention"]["output"]["kernel"].shape == (2, 8, 32)
  assert small["layer_2"]["attention"]["value"]["bias"].shape == (3, 8)
  out = Encoder(cfg).apply({"params": small}, ids, mask, types)
  full = Encoder(CFG).apply({"params": params}, ids, mask, types)
  np.testing.assert_allclose(out.last_hidden_state, masked.last_hidden_state, atol=1e-5)
  np.testing.assert_allclose(out.pooler_output, masked.pooler_output, atol=1e-5)
  assert np.max(np.abs(out.last_hidden_state - full.last_hidden_state)) > 1e-2  # pruning did act
  # Pruning twice (original numbers) equals pruning once with the union.
  twice, cfg2 = pruning.prune_heads(*pruning.prune_heads(params, CFG, {0: [1]}), {0: [3], 2: [0]})
  assert cfg2 == cfg
  np.testing.assert_allclose(Encoder(cfg2).apply({"params": twice}, ids, mask, types).last_hidden_state,
                             out.last_hidden_state, atol=1e-6)


def test_removed_layer_equals_skipped_layer():
  params = random_params(Encoder(CFG), CFG)
  small, cfg = pruning.remove_layers(params, CFG, [1])
  assert cfg.num_hidden_layers == 2 and set(k for k in small if k.startswith("layer_")) == {"layer_0", "layer_1"}
  ids, mask, types = inputs()
  out = Encoder(cfg).apply({"params": small}, ids, mask, types)
  # The same computation by hand: layers 0 and 2 of the original.
  two = CFG.replace(num_hidden_layers=2)
  by_hand = {**params, "layer_1": params["layer_2"]}
  del by_hand["layer_2"]
  np.testing.assert_allclose(out.last_hidden_state,
                             Encoder(two).apply({"params": by_hand}, ids, mask, types).last_hidden_state,
                             atol=1e-6)


def test_pruning_refuses_emptying_a_layer_and_bad_configs():
  params = random_params(Encoder(CFG), CFG)
  with pytest.raises(UserError, match="without heads; remove the layer"):
    pruning.prune_heads(params, CFG, {1: [0, 1, 2, 3]})
  with pytest.raises(UserError, match="no head"):
    pruning.prune_heads(*pruning.prune_heads(params, CFG, {0: [1]}), {0: [1]})
  with pytest.raises(UserError, match="scan_layers"):
    CFG.replace(scan_layers=True, pruned_heads=((1,), (), ()))
  uniform = CFG.replace(scan_layers=True, pruned_heads=((1,), (2,), (0,)))
  assert uniform.layer_heads(2) == 3
  with pytest.raises(UserError, match="one .*list per layer"):
    CFG.replace(pruned_heads=((1,),))
  with pytest.raises(UserError, match="ALBERT"):
    CFG.replace(architecture="albert", num_hidden_groups=1, pruned_heads=((1,), (), ()))


def test_head_selection_is_global_and_keeps_a_head_per_layer():
  scores = np.array([[0.1, 0.2, 0.9, 0.8], [0.05, 0.04, 0.03, 0.02], [0.7, 0.6, 0.5, 0.4]])
  chosen = select.heads_to_remove(scores, CFG, 5)
  assert chosen == {1: [3, 2, 1], 0: [0, 1]}  # layer 1 keeps its best head (0)
  assert select.layers_to_remove(scores, CFG, 1) == [1]


def _projection(seed=5, shape=(3, 10, 32)):
  return jnp.asarray(np.random.RandomState(seed).randn(*shape), jnp.float32)


def _encoder_loss(cfg, proj):
  def loss(params, batch):
    ids, mask, types = batch
    out = Encoder(cfg).apply({"params": params}, ids, mask, types)
    return jnp.mean(jnp.tanh(out.last_hidden_state) * proj) + jnp.mean(out.pooler_output ** 2)
  return loss


@pytest.mark.slow
def test_importance_matches_finite_differences():
  params, cfg = pruning.prune_heads(random_params(Encoder(CFG), CFG), CFG, {1: [2]})
  batch, proj = inputs(), _projection()
  loss = _encoder_loss(cfg, proj)
  grads = importance.mask_gradients(loss, params, cfg, batch)
  eps = 1e-2
  for layer in range(cfg.num_hidden_layers):
    for pos in range(cfg.layer_heads(layer)):
      def at(value):
        masks = [jnp.ones((cfg.layer_heads(i),)) for i in range(cfg.num_hidden_layers)]
        masks[layer] = masks[layer].at[pos].set(value)
        return float(loss(pruning.with_head_masks(params, cfg, masks), batch))
      fd = (at(1 + eps) - at(1 - eps)) / (2 * eps)
      assert abs(float(grads[layer][pos]) - fd) < 2e-3 * max(1.0, abs(fd)), (layer, pos, fd)
  # Scores by original head numbers, NaN where pruned, normalized per layer to unit l2 norm.
  batches = [inputs(seed=s) for s in (2, 3)]
  raw = importance.raw_importance(loss, params, cfg, batches)
  assert np.isnan(raw[1, 2]) and not np.isnan(raw[1, 3])
  by_hand = np.mean([np.abs(np.asarray(importance.mask_gradients(loss, params, cfg, b)[1]))
                     for b in batches], axis=0)
  np.testing.assert_allclose(raw[1, [0, 1, 3]], by_hand, rtol=1e-5)
  norm = importance.head_importance(loss, params, cfg, batches)
  np.testing.assert_allclose(np.nansum(norm ** 2, axis=-1), 1.0, rtol=1e-6)


def _export(tmp_path, cfg, params, name="pruned"):
  folder = folders.save_pruned(tmp_path / name, cfg, {"encoder": params}, None)
  convert.convert_to_hf(folder, tmp_path / f"{name}_hf", log=lambda _: None)
  return folder, tmp_path / f"{name}_hf"


@pytest.mark.slow
def test_importance_matches_torch_autograd_of_hf_head_mask(tmp_path):
  """The same gradients from transformers' own head_mask, by PyTorch's autograd."""
  params = random_params(Encoder(CFG), CFG)
  _, hf_dir = _export(tmp_path, CFG, params)
  model = T.BertModel.from_pretrained(hf_dir, attn_implementation="eager").eval()
  batch, proj = inputs(), _projection()
  ours = importance.mask_gradients(_encoder_loss(CFG, proj), params, CFG, batch)
  ids, mask, types = (torch.tensor(np.asarray(x)) for x in batch)
  head_mask = torch.ones(CFG.num_hidden_layers, CFG.num_attention_heads, requires_grad=True)
  out = model(input_ids=ids, attention_mask=mask, token_type_ids=types, head_mask=head_mask)
  loss = (torch.mean(torch.tanh(out.last_hidden_state) * torch.tensor(np.asarray(proj)))
          + torch.mean(out.pooler_output ** 2))
  loss.backward()
  np.testing.assert_allclose(np.stack([np.asarray(g) for g in ours]), head_mask.grad.numpy(),
                             atol=1e-6, rtol=1e-4)


def test_pruned_model_exports_to_hf_and_back(tmp_path):
  params = random_params(Encoder(CFG), CFG)
  small, cfg = pruning.prune_heads(params, CFG, REMOVE)
  folder, hf_dir = _export(tmp_path, cfg, small)
  hf_config = json.loads((hf_dir / "config.json").read_text())
  assert hf_config["pruned_heads"] == {"0": [1, 3], "2": [0]}
  model = T.AutoModel.from_pretrained(hf_dir).eval()
  assert model.encoder.layer[0].attention.self.query.weight.shape == (16, 32)
  assert model.encoder.layer[2].attention.output.dense.weight.shape == (32, 24)
  ids, mask, types = inputs()
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(np.asarray(ids)), attention_mask=torch.tensor(np.asarray(mask)),
                   token_type_ids=torch.tensor(np.asarray(types)))
  ours = Encoder(cfg).apply({"params": small}, ids, mask, types)
  np.testing.assert_allclose(ours.last_hidden_state, theirs.last_hidden_state.numpy(), atol=1e-4)
  np.testing.assert_allclose(ours.pooler_output, theirs.pooler_output.numpy(), atol=1e-4)
  # And back: transformers' folder converts to the same pruned config and weights.
  _, back, back_cfg = bertjax.from_hf(hf_dir)
  assert back_cfg.pruned_heads == cfg.pruned_heads
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), back, small)


def test_pruned_classifier_round_trips_through_orbax(tmp_path):
  model = SequenceClassifier(CFG, 3)
  params = random_params(model, CFG)
  small, cfg = pruning.prune_heads(params, CFG, REMOVE)
  small, cfg = pruning.remove_layers(small, cfg, [1])
  folder = folders.save_pruned(tmp_path / "p", cfg, small, None)
  cfg2, restored = folders.load_pruned(folder)
  assert cfg2 == cfg and cfg2.pruned_heads == ((1, 3), (0,))
  ids, mask, types = inputs()
  want = SequenceClassifier(cfg, 3).apply({"params": small}, ids, mask, types)
  got = SequenceClassifier(cfg2, 3).apply({"params": restored}, ids, mask, types)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  encoder, enc_params, enc_cfg = bertjax.load(folder)  # the encoder alone, task head left aside
  assert enc_cfg.pruned_heads == cfg.pruned_heads
  np.testing.assert_array_equal(
      np.asarray(encoder.apply({"params": enc_params}, ids, mask, types).pooler_output),
      np.asarray(Encoder(cfg).apply({"params": small["encoder"]}, ids, mask, types).pooler_output))


def _pruned_sst2_classifier(tmp_path, task=True):
  """A pruned 2-label SST-2 classifier written by save_pruned (with its task head recorded)."""
  params = random_params(SequenceClassifier(CFG, 2), CFG)
  small, cfg = pruning.prune_heads(params, CFG, REMOVE)
  head = dataclasses.asdict(sources.task_head({"objective": "glue", "task": "sst2"}, small))
  info = {"scores": [[0.5, float("nan")], [float("inf"), 1.0]]}
  folder = folders.save_pruned(tmp_path / "p", cfg, small, None, info, head if task else None)
  return folder, cfg, small


@pytest.mark.slow
def test_pruned_folder_loads_and_exports_with_its_head(tmp_path):
  folder, cfg, small = _pruned_sst2_classifier(tmp_path)
  meta = json.loads((folder / "model.json").read_text(),
                    parse_constant=lambda c: pytest.fail(f"model.json holds {c}"))
  assert meta["task"]["kind"] == "sequence" and meta["task"]["num_labels"] == 2
  assert meta["pruning"]["scores"] == [[0.5, None], [None, 1.0]]
  ids, mask, types = inputs()
  want = SequenceClassifier(cfg, 2).apply({"params": small}, ids, mask, types)
  loaded = bertjax.load(folder)
  assert loaded.task.labels == ("negative", "positive")
  np.testing.assert_allclose(loaded.logits(ids, mask, types), want, atol=1e-6)
  lines = []
  convert.convert_to_hf(folder, tmp_path / "hf", log=lines.append)
  assert any("BertForSequenceClassification" in l and "classifier" in l for l in lines), lines
  model, info = T.BertForSequenceClassification.from_pretrained(tmp_path / "hf",
                                                                output_loading_info=True)
  assert info["missing_keys"] == [] and info["unexpected_keys"] == [], info
  assert model.config.id2label == {0: "negative", 1: "positive"}
  with torch.no_grad():
    theirs = model.eval()(input_ids=torch.tensor(np.asarray(ids)),
                          attention_mask=torch.tensor(np.asarray(mask)),
                          token_type_ids=torch.tensor(np.asarray(types))).logits.numpy()
  np.testing.assert_allclose(theirs, want, atol=1e-4)


def test_a_head_model_json_does_not_name_is_named_when_left_out(tmp_path):
  """A pruned folder written before heads were recorded: to-hf says it leaves the classifier
  out, and .logits says there is no task head in one line."""
  folder, _, _ = _pruned_sst2_classifier(tmp_path, task=False)
  lines = []
  convert.convert_to_hf(folder, tmp_path / "hf", log=lines.append)
  assert any(l.startswith("left out classifier: model.json does not name") for l in lines), lines
  with pytest.raises(UserError, match="has no task head"):
    bertjax.load(folder).logits(*inputs())
  with pytest.raises(UserError, match="is a model folder .* not a run: fine-tune it"):
    prune_cli.main(["--workdir", str(folder), "--output", str(tmp_path / "out"),
                    "--target-heads", "0.5"])
  assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("scope", ["global", "layer"])
def test_magnitude_pruning_hits_the_target_exactly(scope):
  params = random_params(SequenceClassifier(CFG, 2), CFG)
  pruned = magnitude.magnitude_prune(params, 0.6, scope)
  assert magnitude.sparsity_of(pruned) == pytest.approx(0.6, abs=1e-3)
  flat = jax.tree_util.tree_leaves_with_path(pruned)
  for path, x in flat:
    name = jax.tree_util.keystr(path)
    zeros = float(np.mean(np.asarray(x) == 0))
    if "layer_" in name and name.endswith("['kernel']"):
      if scope == "layer":
        assert zeros == pytest.approx(0.6, abs=1 / x.size), name
    else:  # embeddings, pooler, classifier, LayerNorm, biases: untouched
      assert zeros == 0.0, name
  # Global: the surviving weights are the largest ones overall.
  if scope == "global":
    kernels = [np.abs(np.asarray(x)).ravel() for p, x in flat
               if "layer_" in jax.tree_util.keystr(p) and jax.tree_util.keystr(p).endswith("['kernel']")]
    orig = [np.abs(np.asarray(x)).ravel() for p, x in jax.tree_util.tree_leaves_with_path(params)
            if "layer_" in jax.tree_util.keystr(p) and jax.tree_util.keystr(p).endswith("['kernel']")]
    kept, all_w = np.concatenate(kernels), np.concatenate(orig)
    assert kept[kept > 0].min() >= np.sort(all_w)[int(round(0.6 * all_w.size)) - 1]


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_keep_pruned_holds_zeros_bitwise_through_updates(name):
  """Weight decay, Adam's moments and clipping run; masked weights stay exactly 0.0."""
  config = load_config("configs/glue.py:task=sst2,runlocal", **{"optimizer.name": name,
                       "optimizer.weight_decay": 0.1, "optimizer.keep_pruned": True,
                       "total_steps": 20, "optimizer.warmup_steps": 0, "learning_rate": 0.05})
  params = magnitude.magnitude_prune(random_params(SequenceClassifier(CFG, 2), CFG), 0.5)
  zero = jax.tree.map(lambda x: np.asarray(x) == 0, params)
  opt = optim.make_optimizer(config, params=params, num_layers=CFG.num_hidden_layers)
  state = opt.init(params)
  rng = np.random.RandomState(0)
  for _ in range(8):
    grads = jax.tree.map(lambda x: jnp.asarray(rng.randn(*np.shape(x)), jnp.float32), params)
    updates, state = opt.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  for z, x in zip(jax.tree.leaves(zero), jax.tree.leaves(params)):
    x = np.asarray(x)
    assert np.all(x[z] == 0.0) and np.all(np.signbit(x[z]) == False)  # noqa: E712 (bitwise +0.0)
    assert np.all(x[~z] != 0.0)  # live weights moved and none froze at zero
  assert magnitude.sparsity_of(params) == pytest.approx(0.5, abs=1e-3)
  assert float(optim.held_sparsity(state)) == pytest.approx(magnitude.sparsity_of(params))
  # Without the mask the same updates revive the pruned weights.
  config.optimizer.keep_pruned = False
  opt = optim.make_optimizer(config, params=params, num_layers=CFG.num_hidden_layers)
  updates, _ = opt.update(grads, opt.init(params), params)
  assert magnitude.sparsity_of(optax.apply_updates(params, updates)) < 0.01


# ----------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
  """A tiny SST-2 run (4 heads x 2 layers) on 64 sentences, its dev set cut to 48 rows."""
  if not DATA_DIR.is_dir():
    pytest.skip(f"shared data not found at {DATA_DIR}; set BERTJAX_DATA to its folder")
  data_dir = DATA_DIR
  tmp = tmp_path_factory.mktemp("prune")
  glue_root = tmp / "glue" / "SST-2"
  glue_root.mkdir(parents=True)
  (glue_root / "train.tsv").symlink_to(data_dir / "glue" / "SST-2" / "train.tsv")
  dev = (data_dir / "glue" / "SST-2" / "dev.tsv").read_text().splitlines()
  (glue_root / "dev.tsv").write_text("\n".join(dev[:49]) + "\n")
  train_lines = (data_dir / "glue" / "SST-2" / "train.tsv").read_text().splitlines()[1:2001]
  tok = tmp / "tok"
  tokenizers.train_sentencepiece([l.split("\t")[0] for l in train_lines], tok, vocab_size=400,
                                 num_threads=1)
  config = load_config("configs/glue.py:task=sst2,runlocal", **{
      **TINY, "model.num_attention_heads": 4, "model.vocab_size": 400, "data.tokenizer": str(tok),
      "data_dir": str(tmp / "glue"), "max_train_examples": 64, "num_epochs": 1.0,
      "batch_size": 16, "max_seq_length": 32})
  train.train_and_evaluate(config, tmp / "run")
  return tmp / "run"


@pytest.mark.slow
def test_prune_heads_in_steps_with_fine_tuning(finetuned, tmp_path):
  out = tmp_path / "out"
  # Learning rate 0: the re-fine-tuning must then reproduce the pruned model's dev metric, which
  # shows that init_from restored the pruned encoder and the classifier both.
  rows = prune_cli.main(["--workdir", str(finetuned), "--output", str(out), "--target-heads", "0.5",
                         "--steps", "2", "--finetune-steps", "2", "--override", "learning_rate=0.0"])
  assert [r["heads"] for r in rows] == [8, 6, 4] and [r["layers"] for r in rows] == [2, 2, 2]
  assert rows[2]["encoder_params"] < rows[0]["encoder_params"]
  # Step 1 removed the two heads with the lowest normalized scores over both layers.
  scores = np.asarray(rows[1]["removed"]["scores"])
  assert rows[1]["removed"]["ranking"] == "importance"
  assert np.all(scores > 0) and len(np.unique(scores)) == scores.size
  lowest = sorted((scores[i, h], i, h) for i in range(2) for h in range(4))[:2]
  removed = {(int(i), h) for i, hs in rows[1]["removed"]["heads"].items() for h in hs}
  assert removed == {(i, h) for _, i, h in lowest}
  for r in rows[1:]:
    assert r["dev_finetuned"] == pytest.approx(r["dev_pruned"], abs=1e-9)
  cfg, params = folders.load_pruned(out / "step_2" / "pruned")
  assert sum(len(h) for h in cfg.pruned_heads) == 4 and min(cfg.layer_heads(i) for i in range(2)) >= 1
  tuned = checkpoints.restore_params(out / "step_2" / "finetuned")
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a.shape, b.shape), tuned, params)
  recorded = json.loads((out / "step_2" / "finetuned" / "config.json").read_text())
  assert [len(h) for h in recorded["model"]["pruned_heads"]] == [len(h) for h in cfg.pruned_heads]
  for name in ("pruning.md", "pruning.csv", "pruning.png", "summary.json"):
    assert (out / name).stat().st_size > 0
  assert "| 2 | 4 | 0.5000 |" in (out / "pruning.md").read_text()
  strict = dict(parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
  json.loads((out / "summary.json").read_text(), **strict)
  meta = json.loads((out / "step_2" / "pruned" / "model.json").read_text(), **strict)
  assert meta["task"]["task"] == "glue/sst2" and meta["task"]["name"] == "classifier"
  assert bertjax.load(out / "step_2" / "pruned").task.num_labels == 2
  # The pruned folder exports to Hugging Face with its pruned_heads and its classifier.
  convert.convert_to_hf(out / "step_2" / "pruned", tmp_path / "hf", log=lambda _: None)
  hf = T.BertForSequenceClassification.from_pretrained(tmp_path / "hf")
  assert sum(len(v) for v in hf.config.pruned_heads.values()) == 4


@pytest.mark.slow
def test_prune_starts_from_best_and_says_which_it_took(finetuned, tmp_path):
  """A run that keeps best/ is pruned from it, not from its newest checkpoint; without best/,
  the newest checkpoint, and the line says so (issue 52). Costs two parameter reads."""
  params, line = prune_cli.starting_params(str(finetuned))
  best = checkpoints.best_params(finetuned / "best")
  record = json.loads((finetuned / "best" / "best.json").read_text())
  assert line == (f"pruning {best}: the best evaluation (score {record['value']} at step "
                  f"{record['step']}), not the newest checkpoint")
  jax.tree.map(np.testing.assert_array_equal, params, checkpoints.restore_params_folder(best))
  run = tmp_path / "run"
  shutil.copytree(finetuned, run, ignore=shutil.ignore_patterns("best"))
  params, line = prune_cli.starting_params(str(run))
  step, newest = checkpoints.restore_checkpoint_params(run)
  assert line == (f"pruning the newest checkpoint of {run} (step {step}): the run keeps no "
                  "best/ (it had no best_metric or no evaluation)")
  jax.tree.map(np.testing.assert_array_equal, params, newest)


@pytest.mark.slow
def test_prune_evaluations_name_their_step_and_the_plot_has_a_title(finetuned, tmp_path, caplog):
  """Each pruning step's evaluation says its step (on dd89774 every one said "step 0"), and
  pruning.png has a title (on dd89774 none)."""
  out = tmp_path / "out"
  with caplog.at_level("INFO"):
    rows = prune_cli.main(["--workdir", str(finetuned), "--output", str(out),
                           "--target-heads", "0.5", "--steps", "2"])
  said = [r.getMessage() for r in caplog.records if " dev accuracy " in r.getMessage()]
  assert [m.split(":")[0] for m in said] == ["step 0", "step 1", "step 2"], said
  assert (out / "step_2" / "predictions" / "step_2").is_dir()
  title = table.plot(rows, "accuracy", tmp_path / "again.png", unstructured=False)
  assert title == "pruning: dev accuracy against the fraction of heads kept (2 steps from the " \
      "model as given)"


@pytest.mark.slow
def test_prune_weights_keeps_the_mask_through_fine_tuning(finetuned, tmp_path):
  out = tmp_path / "out"
  rows = prune_cli.main(["--workdir", str(finetuned), "--output", str(out), "--target-sparsity",
                         "0.5", "--sparsity-scope", "layer", "--finetune-steps", "4"])
  assert rows[1]["sparsity"] == pytest.approx(0.5, abs=1e-3)
  _, pruned = folders.load_pruned(out / "step_1" / "pruned")
  tuned = checkpoints.restore_params(out / "step_1" / "finetuned")
  recorded = json.loads((out / "step_1" / "finetuned" / "config.json").read_text())
  assert recorded["optimizer"]["weight_decay"] > 0 and recorded["optimizer"]["keep_pruned"]
  moved = 0
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(pruned), jax.tree.leaves(tuned)):
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_array_equal(b[a == 0], 0.0, err_msg=jax.tree_util.keystr(path))
    moved += int(np.sum(a != b))
  assert moved > 0
  assert magnitude.sparsity_of(tuned) == pytest.approx(0.5, abs=1e-3)
  # The run reports the sparsity it holds: in metrics.jsonl and summary.json.
  summary = json.loads((out / "step_1" / "finetuned" / "summary.json").read_text())
  assert summary["last_train"]["sparsity"] == pytest.approx(0.5, abs=1e-3)
  assert rows[1]["sparsity"] == pytest.approx(magnitude.sparsity_of(tuned))


@pytest.mark.slow
def test_prune_layers(finetuned, tmp_path):
  rows = prune_cli.main(["--workdir", str(finetuned), "--output", str(tmp_path / "o"),
                         "--target-layers", "0.5"])
  assert [r["layers"] for r in rows] == [2, 1] and rows[1]["heads"] == 4


@pytest.mark.slow
def test_prune_random_ranking_control(finetuned, tmp_path):
  rows = [prune_cli.main(["--workdir", str(finetuned), "--output", str(tmp_path / f"o{i}"),
                          "--target-heads", "0.5", "--ranking", "random", "--seed", str(seed)])
          for i, seed in enumerate((0, 0, 1))]
  assert [r[1]["heads"] for r in rows] == [4, 4, 4]
  assert rows[0][1]["removed"]["ranking"] == "random"
  assert rows[0][1]["removed"] == rows[1][1]["removed"]  # the seed decides


@pytest.mark.slow
def test_prune_refuses_bad_requests(finetuned, tmp_path):
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "keep.txt").write_text("mine")
  with pytest.raises(UserError, match="not empty"):
    prune_cli.main(["--workdir", str(finetuned), "--output", str(tmp_path / "full"),
                    "--target-heads", "0.5"])
  assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
  with pytest.raises(UserError, match="not both"):
    prune_cli.main(["--workdir", str(finetuned), "--output", str(tmp_path / "o"),
                    "--target-heads", "0.5", "--target-sparsity", "0.5"])
  proc = run_module("-m", "bertjax.prune", "--workdir", str(tmp_path / "nothing"), "--output",
                    str(tmp_path / "o2"), "--target-heads", "0.5")
  assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
  assert "error:" in proc.stderr and not (tmp_path / "o2").exists()


def test_mesh_check_counts_a_pruned_layers_heads():
  """A tensor-parallel axis must divide every layer's head count, pruned ones included."""
  config = load_config("configs/glue.py:task=sst2,runlocal", **{"mesh_shape": (1, 1, 2)})
  pruned = CFG.replace(pruned_heads=((1,), (), ()))
  class Mesh2:  # the check reads only the mesh's shape
    shape = {"data": 1, "fsdp": 1, "tensor": 2}
  config_checks.check_mesh(config, CFG, Mesh2())
  with pytest.raises(UserError, match=r"pruned_heads\[0\] \(leaving 3 heads\)=3 is not divisible by 2"):
    config_checks.check_mesh(config, pruned, Mesh2())


def test_a_distillation_run_is_refused_in_one_line(tmp_path):
  """distill_glue records a GLUE task too, but its model is a student with its teacher: pruning
  refuses it in one line instead of failing on the first task method it lacks."""
  config = load_config("configs/glue.py:task=rte,runlocal").to_dict()
  config.update(objective="distill_glue", model=ModelConfig().to_dict())
  (tmp_path / "config.json").write_text(json.dumps(config))
  with pytest.raises(UserError, match=r"^\S+ is a distill_glue run; pruning scores and exports "
                                      r"the heads of glue, squad and ner runs only"):
    Session.open(tmp_path, tmp_path / "out", None)


@pytest.mark.parametrize("argv, message", [
    (["--override", "learning_rate=1e-4"],
     "--override learning_rate=1e-4 changes the re-fine-tuning, which --finetune-steps 0 (the "
     "default) leaves out; fix: add --finetune-steps N, or drop --override"),
    (["--finetune-steps", "2", "--override", "lerning_rate=1e-4"],
     "unknown config key 'lerning_rate'; did you mean learning_rate?"),
    (["--finetune-steps", "2", "--override", "learning_rate=fast"],
     "--override learning_rate='fast' is not a valid float; give a value like 0.001"),
    (["--finetune-steps", "2", "--override", "learning_rate"],
     "override 'learning_rate' has no value; write --override learning_rate=VALUE"),
])
def test_a_bad_override_is_one_line_before_anything_runs(tmp_path, argv, message):
  """ea9bcfe ignored --override without --finetune-steps (a mistyped key too), and with it
  found a bad key or value only after the first evaluation, OUT/step_0 and OUT/step_1 written,
  in a line naming launch.py's --config.KEY=VALUE. The run's record alone reaches the check."""
  run = tmp_path / "run"
  (run / "checkpoints").mkdir(parents=True)
  config = load_config("configs/glue.py:task=rte,runlocal")
  (run / "config.json").write_text(json.dumps(config.to_dict()))
  with pytest.raises(UserError) as e:
    prune_cli.main(["--workdir", str(run), "--output", str(tmp_path / "out"),
                    "--target-heads", "0.5", *argv])
  assert str(e.value) == message
  assert not (tmp_path / "out").exists()
