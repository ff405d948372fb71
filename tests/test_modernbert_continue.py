"""Continued pretraining of a published ModernBERT, end to end through the command lines.

A transformers ModernBertForMaskedLM folder (random weights, a byte-level BPE tokenizer.json
trained here as tests/test_modernbert_hf.py builds it) goes through `python -m bertjax.convert
from-hf`, then `launch.py --config configs/modernbert.py:runlocal` with `--config.init_from` (the
converted tokenizer, the converted model's shape) trains three steps on the shipped sample, then
`convert to-hf` of the run loads in transformers. Step 1 trains at learning rate 0 (warmup), so
its loss is the converted model's own: it must be transformers' MLM loss on that kind of batch,
not a fresh model's (about ln(vocab)), and its exported checkpoint must be the original weights.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers as T

from configs.common import SAMPLE
from tests.test_modernbert_hf import bpe_folder, randomize

REPO = pathlib.Path(__file__).resolve().parent.parent
# runlocal's modernbert-tiny but for these: the shape of the published model, as the command line
# must say (pretraining builds config.model and restores what init_from has of it).
SHAPE = dict(hidden_size=32, num_attention_heads=4, intermediate_size=40)
TINY = dict(num_hidden_layers=3, max_position_embeddings=128, global_attn_every_n_layers=3,
            local_attention=16, reference_compile=False, **SHAPE)
SEQ = 64  # runlocal's rows


def run(*args: str, cwd: pathlib.Path) -> str:
  out = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return out.stdout + out.stderr


def published_model(path: pathlib.Path) -> T.ModernBertForMaskedLM:
  """The stand-in for a downloaded ModernBERT: tokenizer files and save_pretrained's."""
  texts = SAMPLE.read_text().splitlines()[:2000]
  tok = T.AutoTokenizer.from_pretrained(bpe_folder(path, texts, vocab_size=300))
  config = T.ModernBertConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                              cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id,
                              attn_implementation="eager", **TINY)
  model = randomize(T.ModernBertForMaskedLM(config), seed=4)
  with torch.no_grad():  # sharper predictions (the decoder is tied): its MLM loss is about 13
    model.model.embeddings.tok_embeddings.weight.mul_(4.0)
  model.save_pretrained(path)
  return model


def hf_mlm_loss(model, tok, rows: int = 16, rate: float = 0.3, seed: int = 0) -> float:
  """transformers' MLM loss on runlocal-like rows of the sample: [CLS] text [SEP], 64 tokens,
  30% of the text tokens masked (80% [MASK], 10% random, 10% kept, as bertjax masks)."""
  ids = tok(SAMPLE.read_text()[:200_000], add_special_tokens=False)["input_ids"]
  body = SEQ - 2
  rs = np.random.RandomState(seed)
  x = np.array([[tok.cls_token_id, *ids[i * body:(i + 1) * body], tok.sep_token_id]
                for i in range(rows)])
  pick = np.zeros_like(x, bool)
  pick[:, 1:-1] = rs.rand(rows, body) < rate
  labels = np.where(pick, x, -100)
  roll = rs.rand(*x.shape)
  x = np.where(pick & (roll < 0.8), tok.mask_token_id, x)
  x = np.where(pick & (roll >= 0.8) & (roll < 0.9), rs.randint(5, len(tok), x.shape), x)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(x), labels=torch.tensor(labels))
  return float(out.loss)


def train_losses(workdir: pathlib.Path) -> dict[int, float]:
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["loss"] for r in rows if "loss" in r and r.get("split", "train") == "train"}


@pytest.mark.slow
def test_continue_pretraining_a_converted_modernbert(tmp_path):
  hf = published_model(tmp_path / "hf")
  run("-m", "bertjax.convert", "from-hf", "--model-dir", "hf", "--workdir", "conv", cwd=tmp_path)
  model = json.loads((tmp_path / "conv" / "model.json").read_text())["model"]
  overrides = {**SHAPE, "vocab_size": model["vocab_size"], "pad_token_id": model["pad_token_id"]}
  log = run(str(REPO / "launch.py"), "--config", str(REPO / "configs/modernbert.py:runlocal"),
            "--workdir", "run", "--config.init_from=conv", "--config.data.tokenizer=conv/tokenizer",
            *[f"--config.model.{k}={v}" for k, v in overrides.items()],
            "--config.total_steps=3", "--config.log_every=1", "--config.eval_every=3",
            "--config.checkpoint_every=1", cwd=tmp_path)
  assert "initialized fresh 0 (none)" in log and "WARNING init_from" not in log, log[-3000:]
  # The run trains the converted model as it is: every field that shapes or computes it.
  trained = json.loads((tmp_path / "run" / "config.json").read_text())["model"]
  run_settings = ("hidden_dropout_prob", "attention_probs_dropout_prob", "attention_dropout",
                  "embedding_dropout", "mlp_dropout", "dtype", "remat")
  differ = {k: (trained[k], v) for k, v in model.items()
            if k not in run_settings and trained.get(k) != v}
  assert differ == {}, differ
  # Step 1 (learning rate 0) is the converted model's loss; a fresh init's is about ln(300).
  losses = train_losses(tmp_path / "run")
  theirs = hf_mlm_loss(hf, T.AutoTokenizer.from_pretrained(tmp_path / "hf"))
  assert abs(theirs - math.log(model["vocab_size"])) > 2.0, theirs  # the check can tell
  assert abs(losses[1] - theirs) < 0.1 * theirs, (losses, theirs)
  assert set(losses) == {1, 2, 3} and all(math.isfinite(v) for v in losses.values())
  # to-hf of the run loads in transformers: step 1 holds the original weights, step 3 trained.
  for step in (1, 3):
    run("-m", "bertjax.convert", "to-hf", "--workdir", "run", "--output", f"back{step}",
        "--step", str(step), cwd=tmp_path)
  want = hf.state_dict()
  first = T.ModernBertForMaskedLM.from_pretrained(tmp_path / "back1").state_dict()
  last = T.ModernBertForMaskedLM.from_pretrained(tmp_path / "back3").state_dict()
  assert set(first) == set(want) == set(last)
  assert all(torch.allclose(first[k], want[k], atol=1e-4) for k in want)
  assert any(not torch.allclose(last[k], want[k], atol=1e-4) for k in want)
  assert T.AutoTokenizer.from_pretrained(tmp_path / "back3").mask_token == "[MASK]"
