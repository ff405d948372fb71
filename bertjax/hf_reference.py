"""Transformers' PyTorch BertForPreTraining trained on our batches: the reference learning curve.

Used by tests/test_training_parity.py (same start, same batches: the per-step losses must agree
with bertjax's train step) and by experiments/quickstart_hf_reference.py (what the reference
implementation learns in the quickstart's 200 steps). Needs torch and transformers
(requirements-dev.txt); nothing else in bertjax imports this module.

The loop mirrors `bertjax.optim` + `bertjax.train`: AdamW with weight decay off biases and
LayerNorm, global-norm clipping, the learning rate from `bertjax.optim.make_schedule`, MLM cross-entropy averaged over the masked positions plus NSP cross-entropy over the rows.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch
import torch.nn.functional as F
import transformers

from bertjax import convert, optim


def build_model(model_cfg, seed: int = 0):
  """A randomly initialized BertForPreTraining of `model_cfg`'s shape, in training mode."""
  torch.manual_seed(seed)
  hf_config = transformers.BertConfig(**convert.model_config_to_hf_config(model_cfg))
  model = transformers.BertForPreTraining(hf_config)
  model.train()
  return model


def train(model, batches: Iterable[dict], config) -> list[dict]:
  """Trains `model` one step per batch with `config`'s optimizer settings; per-step metrics."""
  o = config.optimizer
  schedule = optim.make_schedule(config)  # the trainer's own, as a multiple of the peak below
  no_decay = lambda n: n.endswith("bias") or "LayerNorm" in n
  named = list(model.named_parameters())
  opt = torch.optim.AdamW(
      [{"params": [p for n, p in named if not no_decay(n)], "weight_decay": o.weight_decay},
       {"params": [p for n, p in named if no_decay(n)], "weight_decay": 0.0}],
      lr=config.learning_rate, betas=(o.b1, o.b2), eps=o.eps)
  sched = torch.optim.lr_scheduler.LambdaLR(
      opt, lambda s: float(schedule(s)) / config.learning_rate)
  vocab = model.config.vocab_size
  rows = []
  for step, b in enumerate(batches, start=1):
    t = {k: torch.from_numpy(np.asarray(v)).long() for k, v in b.items() if k != "masked_weights"}
    out = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"],
                token_type_ids=t["token_type_ids"])
    logits = torch.gather(out.prediction_logits, 1,
                          t["masked_positions"][..., None].expand(-1, -1, vocab))
    w = torch.from_numpy(np.asarray(b["masked_weights"], np.float32)).flatten()
    ce = F.cross_entropy(logits.flatten(0, 1), t["masked_ids"].flatten(), reduction="none")
    mlm = (ce * w).sum() / w.sum()
    correct = (logits.argmax(-1).flatten() == t["masked_ids"].flatten()).float()
    nsp = F.cross_entropy(out.seq_relationship_logits, t["next_sentence_label"].flatten())
    loss = mlm + nsp
    opt.zero_grad()
    loss.backward()
    if o.grad_clip_norm > 0:
      torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip_norm)
    opt.step()
    sched.step()
    rows.append({"step": step, "loss": loss.item(), "mlm_loss": mlm.item(),
                 "nsp_loss": nsp.item(), "mlm_accuracy": float((correct * w).sum() / w.sum())})
  return rows
