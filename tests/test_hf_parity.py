"""Numerical parity with Hugging Face transformers for every converted architecture.

Each test builds a tiny randomly initialized transformers model (every weight, bias and LayerNorm
scale drawn at random, so a mis-mapped tensor cannot hide behind HF's zero/one init), saves it,
converts it with `bertjax.convert`, and compares hidden states, pooled output and head logits on
padded inputs with token types. The round-trip tests export back with `to-hf` and check that
transformers loads the exact same weights and outputs.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest
import torch
import transformers as T
from safetensors.numpy import load_file, save_file

import bertjax
from bertjax import convert
from bertjax.core.errors import UserError
from bertjax.models.electra import ElectraDiscriminator
from bertjax.models.pretraining import PretrainingModel

TOL = 1e-4
SMALL = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=37, max_position_embeddings=40)
BATCH, SEQ = 3, 12
MASKED = np.array([[1, 4], [2, 8], [0, 3]])  # MLM positions, some of them at padding (row 1).


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
  """Random values everywhere: HF's init leaves biases 0 and LayerNorm scales 1."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("weight") and p.ndim == 1:  # LayerNorm scale: keep it near 1.
        p.copy_(0.5 + torch.rand(p.shape, generator=gen))
      else:
        p.copy_(0.2 * torch.randn(p.shape, generator=gen))
  return model.eval()


def make_inputs(pad_id: int, type_vocab: int = 2, seed: int = 1):
  """Token ids (padding = pad_id), attention mask with trailing zeros, two-segment token types."""
  rs = np.random.RandomState(seed)
  mask = np.ones((BATCH, SEQ), np.int64)
  mask[1, 9:] = 0
  mask[2, 5:] = 0
  ids = rs.randint(3, SMALL["vocab_size"], (BATCH, SEQ))
  ids = np.where(mask == 1, ids, pad_id)
  types = np.zeros_like(ids)
  if type_vocab > 1:
    types[:, SEQ // 2:] = 1
    types = types * mask
  return ids, mask, types


def save(model: torch.nn.Module, path: pathlib.Path, **kw) -> pathlib.Path:
  model.save_pretrained(path, **kw)
  return path


def hf_run(model, ids, mask, types):
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                 token_type_ids=torch.tensor(types), output_hidden_states=True)


def close(ours, theirs, what: str):
  ours, theirs = np.asarray(ours), theirs.detach().numpy() if torch.is_tensor(theirs) else theirs
  assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
  diff = float(np.max(np.abs(ours - theirs)))
  assert diff < TOL, f"{what}: max abs diff {diff}"


def gathered(values: torch.Tensor) -> np.ndarray:
  """Rows at the masked positions: all our pretraining models compute (their last layer
  included, model.gather_last_layer)."""
  return np.take_along_axis(values.numpy(), MASKED[..., None], axis=1)


# ----------------------------------------------------------------------------- parity


@pytest.mark.slow
def test_bert_pretraining_parity(tmp_path):
  hf = randomize(T.BertForPreTraining(T.BertConfig(**SMALL)))
  c = convert.load_hf(save(hf, tmp_path / "hf"))
  assert c.heads == ("mlm", "pair") and c.missing == () and c.ignored == ()
  ids, mask, types = make_inputs(0)
  ref, base = hf_run(hf, ids, mask, types), hf_run(hf.bert, ids, mask, types)
  out = PretrainingModel(c.config).apply({"params": c.params}, ids, mask, types, MASKED,
                                         deterministic=True)
  close(out["output"].last_hidden_state, gathered(base.last_hidden_state), "hidden")
  close(out["output"].pooler_output, base.pooler_output, "pooled")
  close(out["mlm_logits"], gathered(ref.prediction_logits), "mlm")
  close(out["pair_logits"], ref.seq_relationship_logits, "nsp")


# (1, 32): embedding_size == hidden_size, where ALBERT still has embedding_hidden_mapping_in.
@pytest.mark.parametrize("groups, emb", [(1, 16), (2, 16), (1, 32)])
def test_albert_pretraining_parity(tmp_path, groups, emb):
  cfg = T.AlbertConfig(**{**SMALL, "num_hidden_layers": 4}, embedding_size=emb,
                       num_hidden_groups=groups, hidden_act="gelu_new")
  hf = randomize(T.AlbertForPreTraining(cfg))
  c = convert.load_hf(save(hf, tmp_path / "hf"))
  assert c.config.num_groups == groups and c.config.embed_size == emb
  assert "embedding_projection" in c.params["encoder"]
  assert sorted(k for k in c.params["encoder"] if k.startswith("layer_")) == [
      f"layer_{g}" for g in range(groups)]
  ids, mask, types = make_inputs(0)
  ref, base = hf_run(hf, ids, mask, types), hf_run(hf.albert, ids, mask, types)
  out = PretrainingModel(c.config).apply({"params": c.params}, ids, mask, types, MASKED,
                                         deterministic=True)
  close(out["output"].last_hidden_state, gathered(base.last_hidden_state), "hidden")
  close(out["output"].pooler_output, base.pooler_output, "pooled")
  close(out["mlm_logits"], gathered(ref.prediction_logits), "mlm")
  close(out["pair_logits"], ref.sop_logits, "sop")


def test_roberta_parity(tmp_path):
  cfg = T.RobertaConfig(**SMALL, type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5)
  mlm = randomize(T.RobertaForMaskedLM(cfg))
  c = convert.load_hf(save(mlm, tmp_path / "mlm"))
  # RobertaForMaskedLM has no pooler: it is initialized fresh and reported.
  assert c.heads == ("mlm",) and c.missing == ("pooler",)
  ids, mask, types = make_inputs(1, type_vocab=1)
  ref = hf_run(mlm, ids, mask, types)
  out = PretrainingModel(c.config, pair_head=False).apply(
      {"params": c.params}, ids, mask, types, MASKED, deterministic=True)
  close(out["output"].last_hidden_state, gathered(ref.hidden_states[-1]), "hidden")
  close(out["mlm_logits"], gathered(ref.logits), "mlm")
  # A RobertaModel carries the pooler: compare pooled output through the public entry point.
  base = randomize(T.RobertaModel(cfg), seed=3)
  model, params, config = bertjax.from_hf(save(base, tmp_path / "base"))
  assert config.architecture == "roberta" and config.position_offset == 2
  ref = hf_run(base, ids, mask, types)
  out = model.apply({"params": params}, ids, attention_mask=mask, token_type_ids=types,
                    deterministic=True)
  close(out.last_hidden_state, ref.last_hidden_state, "hidden")
  close(out.pooler_output, ref.pooler_output, "pooled")


def test_electra_discriminator_parity(tmp_path):
  hf = randomize(T.ElectraForPreTraining(T.ElectraConfig(**SMALL, embedding_size=16)))
  c = convert.load_hf(save(hf, tmp_path / "hf"))
  assert c.part == "discriminator" and c.heads == ("rtd",) and c.config.embed_size == 16
  ids, mask, types = make_inputs(0)
  ref = hf_run(hf, ids, mask, types)
  out = ElectraDiscriminator(c.config).apply({"params": c.params}, ids, mask, types,
                                             deterministic=True)
  assert out["output"].pooler_output is None
  close(out["output"].last_hidden_state, ref.hidden_states[-1], "hidden")
  close(out["rtd_logits"], ref.logits, "rtd")


# relu as well: the generator head must stay exact GELU whatever the encoder's activation.
@pytest.mark.parametrize("act", ["gelu", "relu"])
def test_electra_generator_parity(tmp_path, act):
  # Like the released generators: narrower hidden size than the (shared) embedding size.
  hf = randomize(T.ElectraForMaskedLM(T.ElectraConfig(**SMALL, embedding_size=48, hidden_act=act)))
  c = convert.load_hf(save(hf, tmp_path / "hf"))
  assert c.part == "generator" and c.heads == ("mlm",)
  ids, mask, types = make_inputs(0)
  ref = hf_run(hf, ids, mask, types)
  out = PretrainingModel(c.config, pair_head=False).apply({"params": c.params}, ids, mask, types, MASKED,
                                         deterministic=True)
  close(out["output"].last_hidden_state, gathered(ref.hidden_states[-1]), "hidden")
  close(out["mlm_logits"], gathered(ref.logits), "mlm")


def test_bare_bert_model_gets_fresh_heads(tmp_path):
  # Saved as pytorch_model.bin: the torch-pickle path of the reader.
  hf = randomize(T.BertModel(T.BertConfig(**SMALL)))
  path = save(hf, tmp_path / "hf", safe_serialization=False)
  assert (path / "pytorch_model.bin").is_file()
  c = convert.load_hf(path)
  assert c.missing == ("mlm", "pair") and c.heads == ("mlm", "pair")
  assert c.params["mlm"]["bias"].shape == (SMALL["vocab_size"],)
  assert c.params["pair"]["classifier"]["kernel"].shape == (SMALL["hidden_size"], 2)
  # Fresh heads use the model's init (normal(0.02) kernels), not zeros.
  assert 0.005 < float(np.std(c.params["mlm"]["transform"]["kernel"])) < 0.05
  ids, mask, types = make_inputs(0)
  ref = hf_run(hf, ids, mask, types)
  model, params, _ = bertjax.from_hf(path)
  assert set(params) == set(c.params["encoder"])
  out = model.apply({"params": params}, ids, attention_mask=mask, token_type_ids=types,
                    deterministic=True)
  close(out.last_hidden_state, ref.last_hidden_state, "hidden")
  close(out.pooler_output, ref.pooler_output, "pooled")


def test_torch_bin_without_torch_is_a_user_error(tmp_path, monkeypatch):
  path = save(randomize(T.BertModel(T.BertConfig(**SMALL))), tmp_path / "hf",
              safe_serialization=False)
  monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError.
  with pytest.raises(UserError, match="needs torch, which is not installed"):
    convert.load_hf(path)


def test_bfloat16_safetensors_are_read(tmp_path):
  hf = randomize(T.BertModel(T.BertConfig(**SMALL))).to(torch.bfloat16)
  path = save(hf, tmp_path / "hf")
  c = convert.load_hf(path, heads=False)
  want = hf.embeddings.word_embeddings.weight.detach().float().numpy()
  np.testing.assert_array_equal(c.params["encoder"]["embeddings"]["word_embeddings"]["embedding"],
                                want)


# ----------------------------------------------------------------------------- round trips

ROUND_TRIPS = {
    "bert": (T.BertForPreTraining, T.BertConfig(**SMALL), 0),
    "roberta": (T.RobertaForMaskedLM,
                T.RobertaConfig(**SMALL, type_vocab_size=1, pad_token_id=1), 1),
    "albert": (T.AlbertForPreTraining,
               T.AlbertConfig(**{**SMALL, "num_hidden_layers": 4}, embedding_size=16,
                              num_hidden_groups=2), 0),
    "electra-discriminator": (T.ElectraForPreTraining,
                              T.ElectraConfig(**SMALL, embedding_size=16), 0),
    "electra-generator": (T.ElectraForMaskedLM, T.ElectraConfig(**SMALL, embedding_size=48), 0),
}


@pytest.mark.parametrize("name", list(ROUND_TRIPS))
def test_to_hf_round_trip(tmp_path, name):
  cls, cfg, pad = ROUND_TRIPS[name]
  hf = randomize(cls(cfg))
  convert.convert_from_hf(save(hf, tmp_path / "hf"), tmp_path / "work", log=lambda *_: None)
  convert.convert_to_hf(tmp_path / "work", tmp_path / "back", log=lambda *_: None)
  written = json.loads((tmp_path / "back" / "config.json").read_text())
  assert written["architectures"] == [cls.__name__]
  back = cls.from_pretrained(tmp_path / "back").eval()
  want, got = hf.state_dict(), back.state_dict()
  assert set(want) == set(got)
  for k in want:
    assert torch.equal(want[k], got[k]), k
  ids, mask, types = make_inputs(pad, cfg.type_vocab_size)
  a, b = hf_run(hf, ids, mask, types), hf_run(back, ids, mask, types)
  close(b.hidden_states[-1], a.hidden_states[-1], "hidden")
  close(b.logits if hasattr(b, "logits") else b.prediction_logits,
        a.logits if hasattr(a, "logits") else a.prediction_logits, "logits")
  # The generic Auto class loads the encoder too.
  base = T.AutoModel.from_pretrained(tmp_path / "back").eval()
  close(hf_run(base, ids, mask, types).last_hidden_state, a.hidden_states[-1], "auto hidden")


def test_load_matches_from_hf(tmp_path):
  hf = randomize(T.AlbertModel(T.AlbertConfig(**SMALL, embedding_size=16)))
  src = save(hf, tmp_path / "hf")
  convert.convert_from_hf(src, tmp_path / "work", log=lambda *_: None)
  ids, mask, types = make_inputs(0)
  outs = []
  for model, params, config in (bertjax.from_hf(src), bertjax.load(tmp_path / "work")):
    assert config.architecture == "albert" and config.embed_size == 16
    outs.append(model.apply({"params": params}, ids, attention_mask=mask, token_type_ids=types,
                            deterministic=True).last_hidden_state)
  np.testing.assert_array_equal(np.asarray(outs[0]), np.asarray(outs[1]))
  close(outs[1], hf_run(hf, ids, mask, types).last_hidden_state, "hidden")


@pytest.mark.slow
def test_electra_both_parts(tmp_path):
  disc = randomize(T.ElectraForPreTraining(T.ElectraConfig(**SMALL, embedding_size=16)))
  gen = randomize(T.ElectraForMaskedLM(T.ElectraConfig(**{**SMALL, "hidden_size": 16},
                                                       embedding_size=16)), seed=5)
  save(disc, tmp_path / "hf" / "discriminator")
  save(gen, tmp_path / "hf" / "generator")
  convert.convert_from_hf(tmp_path / "hf", tmp_path / "work", part="both", log=lambda *_: None)
  c = convert.load_workdir(tmp_path / "work")
  assert c.part == "both" and c.heads == ("rtd",) and c.generator.heads == ("mlm",)
  assert c.generator.config.hidden_size == 16
  ids, mask, types = make_inputs(0)
  out = PretrainingModel(c.generator.config, pair_head=False).apply(
      {"params": c.generator.params}, ids, mask, types, MASKED, deterministic=True)
  close(out["mlm_logits"], gathered(hf_run(gen, ids, mask, types).logits), "generator mlm")
  convert.convert_to_hf(tmp_path / "work", tmp_path / "back", log=lambda *_: None)
  for part, cls, ref in (("discriminator", T.ElectraForPreTraining, disc),
                         ("generator", T.ElectraForMaskedLM, gen)):
    back = cls.from_pretrained(tmp_path / "back" / part).eval()
    close(hf_run(back, ids, mask, types).logits, hf_run(ref, ids, mask, types).logits, part)


# ----------------------------------------------------------------------------- configs and errors


@pytest.mark.parametrize("cfg", [
    T.BertConfig(**SMALL, hidden_act="gelu_new"),
    T.RobertaConfig(**SMALL, type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5),
    T.AlbertConfig(**{**SMALL, "num_hidden_layers": 4}, embedding_size=16, num_hidden_groups=2),
    T.ElectraConfig(**SMALL, embedding_size=16),
])
def test_config_round_trip(cfg):
  ours = convert.hf_config_to_model_config(cfg.to_dict())
  back = convert.model_config_to_hf_config(ours)
  for key, value in back.items():
    if key not in ("initializer_range",):
      assert getattr(cfg, key) == value, key
  assert convert.hf_config_to_model_config(back) == ours


def test_config_errors():
  with pytest.raises(UserError,
                     match="unknown architecture 'gpt2'; supported: bert, roberta, albert, electra"):
    convert.hf_config_to_model_config({"model_type": "gpt2"})
  with pytest.raises(UserError, match="inner_group_num=2"):
    convert.hf_config_to_model_config(T.AlbertConfig(inner_group_num=2).to_dict())
  with pytest.raises(UserError, match="position_embedding_type='relative_key'"):
    convert.hf_config_to_model_config(
        T.BertConfig(position_embedding_type="relative_key").to_dict())
  # Missing keys take transformers' class defaults (ALBERT's differ from BERT's).
  albert = convert.hf_config_to_model_config({"model_type": "albert"})
  assert (albert.hidden_size, albert.embed_size, albert.hidden_act) == (4096, 128, "gelu_new")


def test_shape_mismatch_names_tensor(tmp_path):
  path = save(randomize(T.BertModel(T.BertConfig(**SMALL))), tmp_path / "hf")
  tensors = load_file(path / "model.safetensors")
  name = "encoder.layer.1.attention.self.key.weight"
  tensors[name] = tensors[name][:, :16].copy()
  save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
  with pytest.raises(UserError, match=rf"tensor {name} has shape \(32, 16\), expected \(32, 32\)"):
    convert.load_hf(path)


def test_missing_encoder_tensor_is_an_error(tmp_path):
  path = save(randomize(T.BertModel(T.BertConfig(**SMALL))), tmp_path / "hf")
  tensors = load_file(path / "model.safetensors")
  del tensors["encoder.layer.0.output.LayerNorm.bias"]
  save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
  with pytest.raises(UserError, match="no tensor bert.encoder.layer.0.output.LayerNorm.bias"):
    convert.load_hf(path)


def test_wrong_electra_part_is_an_error(tmp_path):
  path = save(randomize(T.ElectraForPreTraining(T.ElectraConfig(**SMALL))), tmp_path / "hf")
  with pytest.raises(UserError, match="use --part discriminator"):
    convert.load_hf(path, part="generator")
  # A part for a non-ELECTRA checkpoint is refused rather than ignored.
  bert = save(randomize(T.BertModel(T.BertConfig(**SMALL))), tmp_path / "bert")
  with pytest.raises(UserError, match="ELECTRA checkpoints only"):
    convert.load_hf(bert, part="generator")


@pytest.mark.slow
def test_imports_stay_light():
  """`import bertjax` pulls in no framework; the converter never imports torch/transformers."""
  import subprocess  # pylint: disable=g-import-not-at-top
  code = ("import sys, bertjax\n"
          "heavy = [m for m in ('jax', 'flax', 'torch', 'transformers') if m in sys.modules]\n"
          "import bertjax.convert\n"
          "heavy += [m for m in ('torch', 'transformers') if m in sys.modules]\n"
          "print(heavy); sys.exit(1 if heavy else 0)")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=pathlib.Path(__file__).resolve().parent.parent)
  assert result.returncode == 0, result.stdout + result.stderr
