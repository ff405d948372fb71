"""`python -m bertjax.tools.embed`: features of a text file, a GLUE split or a CoNLL file from a
training workdir or a converted folder equal the model's own forward pass; mean pooling ignores
padding; user mistakes are one line and leave any earlier output as it was."""

import json
import pathlib

import jax.numpy as jnp
import numpy as np

import pytest

from bertjax.convert import convert_from_hf
from bertjax.core.errors import UserError
from bertjax.data import tokenizers
from bertjax.models.config import ModelConfig
from bertjax.models.encoder import Encoder
from bertjax.runtime import checkpoints
from bertjax.tools import embed
from bertjax.trainer import train

from conftest import DATA_DIR
from helpers import TINY, load_config, run_module

LINES = ["a gripping , funny film .", "", "the plot is thin and the jokes are old , but it moves "
         "along well enough for a sunday afternoon .", "bad ."]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A two-step SST-2 fine-tuning run of a tiny model (checkpoints, config.json, tokenizer/)."""
  if not DATA_DIR.is_dir():
    pytest.skip(f"shared data not found at {DATA_DIR}")
  path = tmp_path_factory.mktemp("embed") / "run"
  config = load_config("configs/glue.py:task=sst2,runlocal", **{
      **TINY, "data_dir": str(DATA_DIR / "glue"), "max_train_examples": 32, "total_steps": 2,
      "eval_every": 0, "model.num_hidden_layers": 3})
  train.train_and_evaluate(config, path)
  return path


def reference(workdir, texts, seq=None):
  """The encoder's own output on each text alone (no padding), from the checkpoint."""
  cfg = ModelConfig.from_dict(checkpoints.load_model_config(workdir))
  params = checkpoints.restore_params(workdir)["encoder"]
  tok = tokenizers.load_tokenizer(workdir / "tokenizer")
  outs = []
  for ids in tok.encode_batch(texts):
    ids = jnp.asarray([[tok.cls_id, *ids, tok.sep_id]], jnp.int32)
    outs.append(Encoder(cfg).apply({"params": params}, ids, jnp.ones_like(ids),
                                   jnp.zeros_like(ids), output_hidden_states=True))
  return outs


def run(tmp_path, workdir, *args, name="out.npz"):
  out = tmp_path / name
  embed.main(["--workdir", str(workdir), "--output", str(out), *args])
  return out


def text_file(tmp_path, lines=LINES):
  path = tmp_path / "in.txt"
  path.write_text("\n".join(lines) + "\n")
  return path


def test_cls_and_tokens_equal_the_forward_pass(tmp_path, workdir):
  out = run(tmp_path, workdir, "--input", str(text_file(tmp_path)), "--tokens",
            "--batch_size", "3", "--max_seq_length", "64")
  got = np.load(out)
  refs = reference(workdir, LINES)
  assert got["pooled"].shape == (4, 32) and got["tokens"].shape == (4, 64, 32)
  for i, ref in enumerate(refs):
    h = np.asarray(ref.last_hidden_state[0])
    n = len(h)
    np.testing.assert_allclose(got["pooled"][i], h[0], atol=1e-5)
    np.testing.assert_allclose(got["tokens"][i, :n], h, atol=1e-5)
    assert got["attention_mask"][i].sum() == n and not got["tokens"][i, n:].any()


def test_mean_pooling_ignores_padding_and_layers_concatenate(tmp_path, workdir):
  """Each row is padded to its batch's longest (and to 32); the means equal those of each text
  run alone, over its own tokens."""
  out = run(tmp_path, workdir, "--input", str(text_file(tmp_path)), "--pooling", "mean",
            "--layers=0,-2,-1")
  pooled = np.load(out)["pooled"]
  assert pooled.shape == (4, 3 * 32)
  for i, ref in enumerate(reference(workdir, LINES)):
    states = [np.asarray(ref.hidden_states[j][0]).mean(0) for j in (0, 2, 3)]
    np.testing.assert_allclose(pooled[i], np.concatenate(states), atol=1e-5)


def test_glue_and_conll_splits(tmp_path, workdir):
  out = run(tmp_path, workdir, "--glue", "rte", "--split", "dev", "--data_dir",
            str(DATA_DIR / "glue"), "--batch_size", "64")
  assert np.load(out)["pooled"].shape == (277, 32)
  conll = tmp_path / "small.txt"
  text = (DATA_DIR / "conll2003/valid.txt").read_text().split("\n\n")
  conll.write_text("\n\n".join(text[:6]) + "\n")
  sentences = [b for b in text[:6] if b.strip() and not b.startswith("-DOCSTART-")]
  out = run(tmp_path, workdir, "--conll", str(conll), "--tokens", name="ner.npz")
  assert np.load(out)["pooled"].shape[0] == len(sentences)


def test_converted_folder_through_the_command_line(tmp_path):
  """A converted Hugging Face model, run as a user runs it: pooler output into an .npy."""
  transformers = pytest.importorskip("transformers")
  hf = tmp_path / "hf"
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a"]
  transformers.BertModel(transformers.BertConfig(
      vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=64, max_position_embeddings=64)).save_pretrained(hf)
  (hf / "vocab.txt").write_text("\n".join(vocab) + "\n")
  (hf / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
  converted = tmp_path / "converted"
  convert_from_hf(hf, converted, log=lambda _: None)
  lines = ["the cat sat on the mat", "a cat"]
  out = tmp_path / "pooled.npy"
  proc = run_module("-m", "bertjax.tools.embed", "--workdir", str(converted), "--input",
                    str(text_file(tmp_path, lines)), "--output", str(out), "--pooling", "pooler")
  assert proc.returncode == 0, proc.stderr
  assert "embedded 2/2 examples" in proc.stderr
  pooled = np.load(out)
  model, params, cfg = _load(converted)
  tok = tokenizers.load_tokenizer(converted / "tokenizer")
  for i, ids in enumerate(tok.encode_batch(lines)):
    ids = jnp.asarray([[tok.cls_id, *ids, tok.sep_id]], jnp.int32)
    ref = model.apply({"params": params}, ids, jnp.ones_like(ids), jnp.zeros_like(ids))
    np.testing.assert_allclose(pooled[i], np.asarray(ref.pooler_output[0]), atol=1e-5)


def _load(folder):
  model, params, cfg, _ = embed.load_encoder(folder)
  return model, params, cfg


@pytest.mark.parametrize("args, needle", [
    (["--layers=5"], "--layers=5 holds 5, outside the 4 hidden states"),
    (["--layers=a"], "--layers='a' must be comma-separated integers"),
    (["--tokens", "--output", "x.npy"], "--tokens writes several arrays; use an .npz"),
    (["--pooling", "pooler", "--layers=-2,-1"], "use --layers=-1"),
    (["--output", "out.txt"], "must end in .npz or .npy"),
    (["--glue", "rte", "--input", "x"], "not allowed with argument"),
])
def test_bad_arguments_are_one_line(tmp_path, workdir, args, needle):
  base = ["--workdir", str(workdir), "--output", str(tmp_path / "o.npz")]
  if "--glue" not in args:
    base += ["--input", str(text_file(tmp_path))]
  with pytest.raises(UserError) as e:
    embed.main(base + args)
  assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_failed_run_keeps_the_earlier_output(tmp_path, workdir, monkeypatch):
  out = tmp_path / "out.npz"
  out.write_bytes(b"earlier")
  args = ["--workdir", str(workdir), "--input", str(text_file(tmp_path)), "--output", str(out)]
  with pytest.raises(UserError, match="exists; pass --overwrite"):
    embed.main(args)

  def broken(*a, **k):
    raise UserError("the disk is full")
  monkeypatch.setattr(np, "savez", broken)
  with pytest.raises(UserError, match="disk is full"):
    embed.main(args + ["--overwrite"])
  assert out.read_bytes() == b"earlier"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.npz"]
  with pytest.raises(UserError, match="does not exist; pass a training workdir"):
    embed.main(["--workdir", str(tmp_path / "none"), "--input", "x", "--output",
                str(tmp_path / "new.npz")])
  assert not pathlib.Path(tmp_path / "new.npz").exists()
