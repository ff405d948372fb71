"""Training parity with Hugging Face: the same start, the same batches, the same loss curve.

Forward parity (tests/test_hf_parity.py) says nothing about gradients, the optimizer, clipping or
the schedule. Here one randomly initialized transformers `BertForPreTraining` is converted to our
parameters; both are trained for 30 steps on identical real batches from the quickstart pipeline
(WikiText-2 sample, sentencepiece, dynamic masking, NSP): ours with the real jitted train step
and optimizer, theirs with torch AdamW (weight decay off biases and LayerNorm), global-norm
clipping and the same warmup-then-linear-decay schedule. Every step's loss must agree.

It is also the reference for the quickstart's learning curve: what our model learns in the first
steps on this corpus is what transformers' implementation learns.
"""

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest
import torch
import transformers as T

from bertjax import convert, optim, sharding, train
from bertjax.objectives import get_objective
from tests.helpers import load_config

STEPS, WARMUP = 30, 5


def torch_schedule(step: int, total: int, warmup: int) -> float:
  """optax: linear 0 -> peak over `warmup` steps, then linear peak -> 0 at `total`."""
  return step / warmup if step < warmup else max(0.0, (total - step) / (total - warmup))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  config = load_config("configs/quickstart.py", total_steps=STEPS, batch_size=8,
                       max_seq_length=64, max_predictions_per_seq=10, learning_rate=2e-3,
                       **{"optimizer.warmup_steps": WARMUP, "optimizer.weight_decay": 0.01,
                          "eval_every": 0})
  objective = get_objective(config)
  data = objective.build_inputs(config, tmp_path_factory.mktemp("qs"))
  batches = [next(data.train) for _ in range(STEPS)]
  return config, objective, batches


def test_pretraining_losses_match_transformers(setup):
  config, objective, batches = setup
  cfg = objective.model_config(config)
  torch.manual_seed(0)
  hf = T.BertForPreTraining(T.BertConfig(**convert.model_config_to_hf_config(cfg)))
  hf.train()
  state_dict = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
  converted, missing, _ = convert.hf_to_params(state_dict, cfg, ("mlm", "pair"))
  assert not missing

  # Ours: the trainer's own state, optimizer and jitted step, starting from HF's weights.
  model = objective.make_model(cfg)
  init_batch = objective.init_batch(1, config.max_seq_length, config.max_predictions_per_seq)
  abstract = nn.meta.unbox(jax.eval_shape(
      lambda r: objective.init_params(model, r, init_batch), jax.random.key(0)))
  assert jax.tree.structure(abstract) == jax.tree.structure(converted)
  optimizer = optim.make_optimizer(config, params=abstract, num_layers=cfg.num_hidden_layers)
  mesh = sharding.make_mesh((1, 1, 1))
  state, _, _ = train.create_train_state(objective, model, optimizer, config, mesh, init_batch)
  params = jax.tree.map(lambda a, x: np.asarray(x, a.dtype), abstract, converted)
  state = state.replace(params=params, opt_state=optimizer.init(params))
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.rules_from_config(config)):
    step_fn = jax.jit(train.make_train_step(objective, model, optimizer, accum=1))
    ours = []
    for b in batches:
      state, metrics = step_fn(state, b)
      ours.append(float(metrics["loss"][0]))

  # Theirs: the usual PyTorch loop with the same hyperparameters.
  o = config.optimizer
  no_decay = [p for n, p in hf.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
  decay = [p for n, p in hf.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
  opt = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=config.learning_rate, betas=(o.b1, o.b2), eps=o.eps)
  sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: torch_schedule(s, STEPS, WARMUP))
  theirs = []
  for b in batches:
    t = {k: torch.from_numpy(np.asarray(v)).long() for k, v in b.items() if k != "masked_weights"}
    out = hf(input_ids=t["input_ids"], attention_mask=t["attention_mask"],
             token_type_ids=t["token_type_ids"])
    logits = torch.gather(out.prediction_logits, 1,
                          t["masked_positions"][..., None].expand(-1, -1, cfg.vocab_size))
    w = torch.from_numpy(np.asarray(b["masked_weights"], np.float32))
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), t["masked_ids"].flatten(),
                                           reduction="none")
    mlm = (ce * w.flatten()).sum() / w.sum()
    nsp = torch.nn.functional.cross_entropy(out.seq_relationship_logits,
                                            t["next_sentence_label"].flatten())
    loss = mlm + nsp
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(hf.parameters(), o.grad_clip_norm)
    opt.step()
    sched.step()
    theirs.append(loss.item())

  ours, theirs = np.array(ours), np.array(theirs)
  np.testing.assert_allclose(ours, theirs, rtol=2e-5, atol=0)
  # Not a flat curve that trivially agrees: both learned over these steps.
  assert ours[-5:].mean() < ours[0] - 0.5, ours
