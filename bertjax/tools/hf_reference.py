"""Transformers' PyTorch models trained on our batches: the reference learning curves.

Used by tests/test_training_parity.py and tests/test_finetune_parity.py (same start, same
batches: the per-step losses must agree with bertjax's train step) and by
experiments/quickstart_hf_reference.py (what the reference implementation learns in the
quickstart's 200 steps). Needs torch and transformers (requirements-dev.txt); nothing else in
bertjax imports this module.

The torch loop is the usual one: torch.optim.AdamW with weight decay off biases and LayerNorm
parameters, `clip_grad_norm_`, transformers' `get_linear_schedule_with_warmup`. It matches
`bertjax.runtime.optim`'s AdamW exactly in exact arithmetic (bias-corrected moments, eps added to
the square root, decoupled decay, clipping before the update, warmup then linear decay to 0 over
total - warmup steps), except that `clip_grad_norm_` divides by norm + 1e-6 where bertjax (like
BERT's tf.clip_by_global_norm) divides by the norm. The other side, bertjax's own state,
optimizer and jitted step started from given parameters, is tests/helpers.py's `bertjax_losses`.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F
import transformers

from bertjax import convert

# (model, numpy batch) -> (loss, {metric name: float}) for one step of the torch loop.
LossFn = Callable[[torch.nn.Module, dict], tuple[torch.Tensor, dict]]


def build_model(model_cfg, seed: int = 0, cls: type | None = None, **config_kwargs):
  """A randomly initialized transformers `cls` (default BertForPreTraining) of `model_cfg`'s
  architecture and shape, in training mode; `config_kwargs` (num_labels, ...) go to its config."""
  torch.manual_seed(seed)
  fields = convert.model_config_to_hf_config(model_cfg)
  if fields["model_type"] == "albert":
    # AlbertSOPHead drops out its input (classifier_dropout_prob, 0.1 by default); ALBERT's own
    # code, transformers' BertForPreTraining and our pair head do not.
    config_kwargs.setdefault("classifier_dropout_prob", 0.0)
  hf_config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields,
                                                **config_kwargs)
  model = (cls or transformers.BertForPreTraining)(hf_config)
  model.train()
  return model


def no_decay_names(model: torch.nn.Module) -> set[str]:
  """Parameters BERT's recipe does not decay: biases and every LayerNorm module's parameters
  (found by type, as transformers' Trainer does: RoBERTa's lm_head.layer_norm has no
  "LayerNorm" in its name)."""
  names = set()
  for module_name, module in model.named_modules():
    for name, _ in module.named_parameters(recurse=False):
      full = f"{module_name}.{name}" if module_name else name
      if isinstance(module, torch.nn.LayerNorm) or name == "bias":
        names.add(full)
  return names


def warmup_steps(config) -> int:
  """Warmup steps as `bertjax.runtime.optim.make_schedule` counts them (round(fraction * total))."""
  o, total = config.optimizer, max(int(config.total_steps), 1)
  steps = int(o.warmup_steps if o.warmup_steps >= 0 else round(o.warmup_fraction * total))
  return min(steps, total)


def make_optimizer(model: torch.nn.Module, config):
  """(torch AdamW, transformers' linear warmup/decay scheduler) for `config`'s settings."""
  o = config.optimizer
  if (o.name != "adamw" or o.decay != "linear" or o.end_learning_rate_factor != 0
      or o.get("layerwise_lr_decay", 1.0) != 1.0):
    raise ValueError("the torch reference is AdamW with linear decay to 0 and no layer-wise "
                     f"rates; config has {o.name}, {o.decay}, end factor "
                     f"{o.end_learning_rate_factor}, layerwise {o.get('layerwise_lr_decay')}")
  skip = no_decay_names(model)
  named = list(model.named_parameters())  # tied weights appear once
  opt = torch.optim.AdamW(
      [{"params": [p for n, p in named if n not in skip], "weight_decay": o.weight_decay},
       {"params": [p for n, p in named if n in skip], "weight_decay": 0.0}],
      lr=config.learning_rate, betas=(o.b1, o.b2), eps=o.eps)
  sched = transformers.get_linear_schedule_with_warmup(opt, warmup_steps(config),
                                                       max(int(config.total_steps), 1))
  return opt, sched


def tensors(batch: dict, dtype=torch.long) -> dict[str, torch.Tensor]:
  return {k: torch.tensor(np.asarray(v), dtype=dtype) for k, v in batch.items()}


def pretraining_loss(model, batch: dict) -> tuple[torch.Tensor, dict]:
  """BertForPreTraining: MLM cross-entropy averaged over the masked positions, plus NSP."""
  t = tensors({k: v for k, v in batch.items() if k != "masked_weights"})
  out = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"],
              token_type_ids=t["token_type_ids"])
  vocab = model.config.vocab_size
  logits = torch.gather(out.prediction_logits, 1,
                        t["masked_positions"][..., None].expand(-1, -1, vocab))
  w = torch.from_numpy(np.asarray(batch["masked_weights"], np.float32)).flatten()
  ce = F.cross_entropy(logits.flatten(0, 1), t["masked_ids"].flatten(), reduction="none")
  mlm = (ce * w).sum() / w.sum()
  correct = (logits.argmax(-1).flatten() == t["masked_ids"].flatten()).float()
  nsp = F.cross_entropy(out.seq_relationship_logits, t["next_sentence_label"].flatten())
  return mlm + nsp, {"mlm_loss": mlm.item(), "nsp_loss": nsp.item(),
                     "mlm_accuracy": float((correct * w).sum() / w.sum())}


def train(model, batches: Iterable[dict], config, loss_fn: LossFn = pretraining_loss
          ) -> list[dict]:
  """Trains `model` one step per batch with `config`'s optimizer settings; per-step metrics."""
  opt, sched = make_optimizer(model, config)
  rows = []
  for step, batch in enumerate(batches, start=1):
    loss, metrics = loss_fn(model, batch)
    opt.zero_grad()
    loss.backward()
    if config.optimizer.grad_clip_norm > 0:
      torch.nn.utils.clip_grad_norm_(model.parameters(), config.optimizer.grad_clip_norm)
    opt.step()
    sched.step()
    rows.append({"step": step, "loss": loss.item(), **metrics})
  return rows
