"""Training parity with transformers for ModernBERT's MLM, as tests/test_finetune_parity.py does
for the other families.

One randomly initialized tiny transformers `ModernBertForMaskedLM` (two layers: layer 0 global,
layer 1 local with a window of 8 tokens, 4 each side, on rows of up to 64 tokens, so the local
layer takes bertjax's band-by-band path) is converted to our parameters by bertjax.convert's
ModernBERT names; both are trained for STEPS (24) steps on the same real MLM batches from the
WikiText-2 sample (sentencepiece, dynamic masking, padded rows): ours with the trainer's jitted
step and `bertjax.runtime.optim` (optax AdamW, no decay on biases and LayerNorm, global-norm
clipping, warmup then linear decay), theirs with torch.optim.AdamW on the same parameter groups,
clip_grad_norm_ and get_linear_schedule_with_warmup (bertjax.tools.hf_reference). Dropout is off and
everything is float32. The loss is transformers' own (the model's `loss`: cross-entropy averaged
over the labels other than -100, here the masked positions): eager attention with
`sparse_prediction=False` (the head at every row, transformers' default), and PyTorch's SDPA with
`True` (the head at the masked rows only, as bertjax's head computes it). The tolerance is the
other families' (test_finetune_parity.RTOL, 5e-5 relative at every step), at the learning rate
and weight decay at which clipping and the decay mask act strongly (STRONG).
"""

from __future__ import annotations

import numpy as np
import pytest
import transformers as T

from bertjax.tools import hf_reference
from helpers import bertjax_losses
from test_finetune_parity import (  # noqa: F401 (corpus, report: fixtures)
    RTOL, STEPS, STRONG, compare, corpus, mlm_labels, pretraining_batches, report, starting_params)

MODERNBERT = {"objective": "mlm", "model.architecture": "modernbert",
              "model.global_attn_every_n_layers": 2, "model.local_attention": 8, **STRONG}


def mlm_loss(model, batch):
  """ModernBertForMaskedLM's own loss (it takes no token types)."""
  t = hf_reference.tensors({k: batch[k] for k in ("input_ids", "attention_mask")})
  return model(**t, labels=mlm_labels(batch)).loss, {}


@pytest.fixture(scope="module")
def setup(corpus, tmp_path_factory):  # pylint: disable=redefined-outer-name
  config, objective, batches = pretraining_batches(
      "configs/bert.py:runlocal", corpus, tmp_path_factory.mktemp("mb"), **MODERNBERT)
  cfg = objective.model_config(config)
  assert cfg.architecture == "modernbert" and cfg.num_hidden_layers == 2
  assert [cfg.is_global_layer(i) for i in range(2)] == [True, False]
  seq = max(b["input_ids"].shape[1] for b in batches)
  assert 3 * (cfg.local_attention // 2) < seq  # the local layer takes the band-by-band path
  assert any((b["attention_mask"] == 0).any() for b in batches)  # padded rows among them
  return config, objective, cfg, batches


@pytest.mark.slow
@pytest.mark.parametrize("implementation, sparse", [("eager", False), ("sdpa", True)],
                         ids=["eager_dense_head", "sdpa_sparse_head"])
def test_modernbert_mlm_matches_transformers(setup, implementation, sparse):
  config, objective, cfg, batches = setup
  hf = hf_reference.build_model(cfg, cls=T.ModernBertForMaskedLM, sparse_prediction=sparse,
                                reference_compile=False, attn_implementation=implementation)
  assert hf.config._attn_implementation == implementation  # pylint: disable=protected-access
  assert (hf.config.local_attention, hf.config.global_attn_every_n_layers) == (8, 2)
  params = starting_params(objective, config, cfg, hf, heads=("mlm",))
  ours, theirs = compare(f"modernbert_mlm_{implementation}_{'sparse' if sparse else 'dense'}",
                         objective, config, cfg, params, hf, batches, mlm_loss)
  assert len(ours) == STEPS and np.all(np.isfinite(theirs))


@pytest.mark.slow
def test_the_tolerance_sees_a_wrong_setting(setup):
  """A reference whose local layers see a window 2 tokens wider, or that decays LayerNorm scales
  and biases too, leaves the tolerance within the 24 steps: the comparison sees the window and
  the decay mask."""
  config, objective, cfg, batches = setup
  hf = hf_reference.build_model(cfg, cls=T.ModernBertForMaskedLM, reference_compile=False,
                                attn_implementation="sdpa")
  params = starting_params(objective, config, cfg, hf, heads=("mlm",))
  ours = np.array(bertjax_losses(objective, config, cfg, params, batches))
  start = {k: v.clone() for k, v in hf.state_dict().items()}
  wider = hf_reference.build_model(cfg.replace(local_attention=12), cls=T.ModernBertForMaskedLM,
                                   reference_compile=False, attn_implementation="sdpa")
  wider.load_state_dict(start)
  others = {"window 12, not 8": (wider, None), "decay everywhere": (hf, lambda model: set())}
  for what, (model, no_decay) in others.items():
    with pytest.MonkeyPatch.context() as mp:
      if no_decay:
        mp.setattr(hf_reference, "no_decay_names", no_decay)
      theirs = np.array([r["loss"] for r in hf_reference.train(model, batches, config, mlm_loss)])
    assert np.max(np.abs(ours - theirs) / theirs) > 10 * RTOL, what
