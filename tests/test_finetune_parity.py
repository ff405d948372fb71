"""Training parity with transformers for fine-tuning and for the other pretraining heads.

tests/test_training_parity.py does it for BERT's MLM+NSP; here, the same way, for
BertForSequenceClassification (MRPC), regression (STS-B, num_labels=1, MSE),
BertForQuestionAnswering (SQuAD v1.1), BertForTokenClassification (CoNLL-2003 NER),
RobertaForMaskedLM (MLM), AlbertForPreTraining (MLM+SOP) and ElectraForPreTraining (the
discriminator's loss alone on given replaced inputs). Each case: one randomly initialized tiny
transformers model is converted to our parameters (the encoder and pretraining heads by
`bertjax.convert`'s names, the fine-tuning head by hand: classifier / qa_outputs); both are
trained for STEPS steps on the same real batches from bertjax's own pipelines; ours with the
trainer's jitted step and `bertjax.runtime.optim` (optax AdamW, no decay on biases and LayerNorm,
global norm clipping, warmup then linear decay), theirs with torch.optim.AdamW on the same parameter
groups, clip_grad_norm_ and get_linear_schedule_with_warmup (bertjax.tools.hf_reference). Dropout is
off and everything is float32. The loss is transformers' own (the model's `loss` output), except
for QA (below). Tagging: bertjax's loss is the cross-entropy averaged over the batch's labelled
positions (each word's first sub-token), transformers' the same given label -100 at [CLS],
[SEP], sub-word continuations and padding.

Tolerance: every step's loss agrees within rtol RTOL (5e-5). Both sides compute the same float32
math in different orders (XLA vs PyTorch kernels), about 1e-7 relative per operation; Adam
divides each gradient by its running RMS, so those rounding differences do not shrink with the
gradients and grow slowly over the steps. Measured maxima over 24 steps (printed with -s): 1e-7
to 5e-6, 1e-5 for STS-B, trained at a learning rate (1e-2) and weight decay (0.1) at which
clipping and the decay mask act strongly. A real mismatch is far outside: on STS-B, weight decay
also on LayerNorm and biases moves the losses by 1.2e-3 within 8 steps, no clipping by 5.6e-3,
a warmup one step longer by 6e-2 (`test_the_tolerance_sees_a_wrong_setting` checks all three).

Defined differences, kept and written down rather than mirrored:
- QA: bertjax masks padding out of the start/end softmax (tasks/squad.py), so a loss does not
  depend on how far a batch is padded (batches are cut to their longest row, pad_to_multiple_of).
  transformers' BertForQuestionAnswering (and BERT's run_squad) take the softmax over every
  position, padding included. The torch side here applies the same mask to transformers' logits;
  `test_squad_padding_is_the_only_loss_difference` shows transformers' own loss equals it on rows
  without padding and differs on padded rows.
- bertjax's AdamW is optax.adamw (bias-corrected moments, like torch.optim.AdamW); BERT's original
  AdamWeightDecay has no bias correction, and its linear decay runs from step 0 over all steps
  with the warmup overriding it, where bertjax (like transformers) decays over total - warmup
  steps after the warmup. torch's clip_grad_norm_ divides by norm + 1e-6, bertjax (like BERT's
  tf.clip_by_global_norm) by the norm: a 1e-6 relative difference, inside the tolerance.
- ALBERT: transformers' AlbertSOPHead drops out its input (classifier_dropout_prob, 0.1 by
  default); ALBERT's own code and bertjax's pair head do not, so the reference sets it to 0.
- Warmup from a fraction: bertjax takes round(fraction * total) steps, transformers' Trainer
  ceil(warmup_ratio * total), BERT int(). The reference here is given bertjax's count.
"""

from __future__ import annotations

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers as T

from bertjax import convert
from bertjax.data import prepare, sources, tokenizers
from bertjax.models.config import ModelConfig
from bertjax.models.electra import ElectraDiscriminator
from bertjax.models.pretraining import PretrainingModel
from bertjax.objective import Objective
from bertjax.objectives.rtd import rtd_terms
from bertjax.registry import get_objective
from bertjax.tasks import glue as glue_task, ner as ner_task
from bertjax.tools import hf_reference
from configs.common import SAMPLE
from conftest import DATA_DIR
from helpers import bertjax_losses, load_config

STEPS = 24
RTOL = 5e-5
VOCAB = 1000
TINY = {"model.hidden_size": 32, "model.intermediate_size": 64, "model.num_attention_heads": 2,
        "model.num_hidden_layers": 2, "model.vocab_size": VOCAB,
        "model.hidden_dropout_prob": 0.0, "model.attention_probs_dropout_prob": 0.0,
        "total_steps": STEPS, "eval_every": 0, "tensorboard": False}
# STS-B's settings: a learning rate and weight decay at which clipping and the decay mask act
# strongly enough within STEPS steps that a mistake in either shows (see the tolerance above).
STRONG = {"learning_rate": 1e-2, "optimizer.weight_decay": 0.1}
MEASURED: dict[str, tuple[float, float]] = {}  # case -> max absolute, relative loss difference


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """A sentencepiece vocabulary trained on the WikiText-2 sample and the sample prepared with it:
  every case's tokenizer, and the pretraining cases' corpus."""
  root = tmp_path_factory.mktemp("corpus")
  docs = sources.read_documents([str(SAMPLE)], "wikitext")
  tok = tokenizers.train_sentencepiece(sources.iter_sentences(docs), root / "tok",
                                       vocab_size=VOCAB, num_threads=1)
  assert tok.vocab_size == VOCAB
  prepare.prepare_corpus(docs, tok, root / "prepared", num_shards=1, num_workers=0)
  return root


@pytest.fixture(scope="module", autouse=True)
def report():
  yield
  for case, (absolute, relative) in sorted(MEASURED.items()):
    print(f"\n{case}: max step loss difference {absolute:.2e} (relative {relative:.2e})")


def merged(base, converted):
  """`base` (our init) with every tensor `converted` has replaced: parts transformers' class
  lacks (the pooler of RobertaForMaskedLM or BertForQuestionAnswering) keep our init, unused."""
  flat = flax.traverse_util.flatten_dict(jax.device_get(base))
  new = flax.traverse_util.flatten_dict(converted)
  assert set(new) <= set(flat), sorted(set(new) - set(flat))
  flat.update(new)
  return flax.traverse_util.unflatten_dict(flat)


def starting_params(objective, config, cfg, hf, heads=(), head_names=None):
  """transformers' weights as our tree: encoder (+ pretraining heads) by bertjax.convert; the
  fine-tuning head {ours: theirs} (a Linear) by hand."""
  state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
  converted, _, ignored = convert.hf_to_params(state, cfg, heads)
  head_names = head_names or {}
  # Every tensor of theirs is one of ours: the converter's, or the head mapped here.
  assert set(ignored) == {f"{t}.{w}" for t in head_names.values() for w in ("weight", "bias")}
  for ours, theirs in head_names.items():
    converted[ours] = {"classifier": {"kernel": state[f"{theirs}.weight"].T,
                                      "bias": state[f"{theirs}.bias"]}}
  model = objective.make_model(config, cfg)
  init_batch = objective.init_batch(config, 1, config.max_seq_length, config.max_predictions_per_seq)
  init = nn.meta.unbox(objective.init_params(model, jax.random.key(1), init_batch))
  return merged(init, converted)


def compare(case, objective, config, cfg, params, hf, batches, loss_fn):
  ours = np.array(bertjax_losses(objective, config, cfg, params, batches))
  theirs = np.array([r["loss"] for r in hf_reference.train(hf, batches, config, loss_fn)])
  MEASURED[case] = (float(np.max(np.abs(ours - theirs))),
                    float(np.max(np.abs(ours - theirs) / np.abs(theirs))))
  np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=0, err_msg=case)
  # Not a flat curve that trivially agrees: the model learned over these steps.
  assert ours[-4:].mean() < ours[:2].mean() - 0.05, (case, ours)
  return ours, theirs


def task_batches(spec, corpus, tmp_path, **settings):
  config = load_config(spec, **{**TINY, "data.tokenizer": str(corpus / "tok"), **settings})
  objective = get_objective(config)
  data = objective.build_inputs(config, tmp_path)
  return config, objective, [next(data.train) for _ in range(STEPS)]


# ----------------------------------------------------------------------------- fine-tuning


def builtin_loss(labels_of):
  """A loss_fn: transformers' own loss (the model's `loss` output), given the keyword arguments
  `labels_of(batch)` makes of our batch (labels, sentence_order_label...)."""
  def loss_fn(model, batch):
    t = hf_reference.tensors({k: batch[k] for k in ("input_ids", "attention_mask",
                                                    "token_type_ids")})
    return model(**t, **labels_of(batch)).loss, {}
  return loss_fn


def as_torch(x, dtype=torch.long) -> torch.Tensor:
  return torch.tensor(np.asarray(x), dtype=dtype)


def glue_case(task, corpus, data_dir, tmp_path):
  """(config, objective, model config, batches, transformers model, our starting params)."""
  config, objective, batches = task_batches(
      f"configs/glue.py:task={task},runlocal", corpus, tmp_path, data_dir=str(data_dir / "glue"),
      batch_size=16, **(STRONG if task == "stsb" else {}))
  cfg = objective.model_config(config)
  hf = hf_reference.build_model(cfg, cls=T.BertForSequenceClassification,
                                num_labels=glue_task.task_of(config).num_labels)
  params = starting_params(objective, config, cfg, hf, head_names={"classifier": "classifier"})
  return config, objective, cfg, batches, hf, params


def glue_loss(task):
  dtype = torch.float32 if task == "stsb" else torch.long
  return builtin_loss(lambda b: {"labels": as_torch(b["label"], dtype)})


@pytest.mark.slow
@pytest.mark.parametrize("task", ["mrpc", "stsb"])
def test_sequence_classification_matches_transformers(corpus, data_dir, tmp_path, task):
  """Cross-entropy over the rows (MRPC), mean squared error of one output (STS-B)."""
  config, objective, cfg, batches, hf, params = glue_case(task, corpus, data_dir, tmp_path)
  assert hf.config.problem_type is None  # transformers picks it from num_labels and the dtype
  compare(task, objective, config, cfg, params, hf, batches, glue_loss(task))
  assert hf.config.problem_type == ("regression" if task == "stsb" else
                                     "single_label_classification")


@pytest.mark.slow
def test_the_tolerance_sees_a_wrong_setting(corpus, data_dir, tmp_path):
  """The reference trained with a setting slightly off (weight decay on LayerNorm and biases
  too, no clipping, a one step longer warmup) leaves the tolerance within a few steps."""
  config, objective, cfg, batches, hf, params = glue_case("stsb", corpus, data_dir, tmp_path)
  ours = np.array(bertjax_losses(objective, config, cfg, params, batches))
  start = {k: v.clone() for k, v in hf.state_dict().items()}
  wrong = {"decay everywhere": ("no_decay_names", lambda model: set()),
           "no clipping": ("optimizer.grad_clip_norm", 0.0),
           "warmup + 1": ("optimizer.warmup_steps", hf_reference.warmup_steps(config) + 1)}
  for what, (key, value) in wrong.items():
    hf.load_state_dict(start)
    changed = config.copy_and_resolve_references()
    with pytest.MonkeyPatch.context() as mp:
      if key == "no_decay_names":
        mp.setattr(hf_reference, key, value)
      else:
        changed.optimizer[key.split(".")[1]] = value
      theirs = np.array([r["loss"] for r in hf_reference.train(hf, batches, changed,
                                                               glue_loss("stsb"))])
    assert np.max(np.abs(ours[:8] - theirs[:8]) / theirs[:8]) > 10 * RTOL, what


def tag_labels(batch) -> dict:
  """BertForTokenClassification's labels: -100 wherever bertjax's task gives weight 0 ([CLS],
  [SEP], sub-word continuations, padding), so its mean runs over labelled first sub-tokens."""
  return {"labels": as_torch(np.where(batch["label_weights"] > 0, batch["labels"], -100))}


@pytest.mark.slow
def test_token_classification_matches_transformers(corpus, data_dir, tmp_path):
  config, objective, batches = task_batches(
      "configs/ner.py:runlocal", corpus, tmp_path, data_dir=str(data_dir / "conll2003"),
      batch_size=16)
  labelled = sum(b["label_weights"].sum() for b in batches)
  inner = sum(b["attention_mask"].sum() - 2 * len(b["attention_mask"]) for b in batches)
  assert 0 < labelled < inner  # some tokens between [CLS] and [SEP] are word continuations
  cfg = objective.model_config(config)
  hf = hf_reference.build_model(cfg, cls=T.BertForTokenClassification,
                                num_labels=len(ner_task.LABELS[ner_task.task_of(config)]))
  params = starting_params(objective, config, cfg, hf, head_names={"classifier": "classifier"})
  compare("ner", objective, config, cfg, params, hf, batches, builtin_loss(tag_labels))


def masked_qa_loss(model, batch):
  """transformers' start/end cross-entropies averaged, with padding masked out of the softmax
  as bertjax's SQuAD task does (the module docstring)."""
  t = hf_reference.tensors(batch)
  out = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"],
              token_type_ids=t["token_type_ids"])
  pad = t["attention_mask"] == 0
  start = out.start_logits.masked_fill(pad, -1e9)
  end = out.end_logits.masked_fill(pad, -1e9)
  return (F.cross_entropy(start, t["start_position"])
          + F.cross_entropy(end, t["end_position"])) / 2, {}


@pytest.fixture(scope="module")
def squad(corpus, tmp_path_factory):
  return task_batches("configs/squad.py:runlocal", corpus, tmp_path_factory.mktemp("squad"),
                      data_dir=str(DATA_DIR / "squad"), batch_size=16)


@pytest.mark.slow
def test_question_answering_matches_transformers(data_dir, squad):
  config, objective, batches = squad
  assert any(b["start_position"].any() for b in batches)  # answers, not only [CLS]
  cfg = objective.model_config(config)
  hf = hf_reference.build_model(cfg, cls=T.BertForQuestionAnswering)
  params = starting_params(objective, config, cfg, hf, head_names={"qa_outputs": "qa_outputs"})
  compare("squad", objective, config, cfg, params, hf, batches, masked_qa_loss)


def test_squad_padding_is_the_only_loss_difference(data_dir, squad):
  """transformers' own QA loss equals the masked one on rows without padding, not on padded
  rows: masking padding is the one way bertjax's QA loss differs from transformers'."""
  config, objective, batches = squad
  hf = hf_reference.build_model(objective.model_config(config), cls=T.BertForQuestionAnswering)
  batch = next(b for b in batches if (b["attention_mask"] == 0).any(1).any()
               and (b["attention_mask"] == 1).all(1).any())
  full = (batch["attention_mask"] == 1).all(1)
  with torch.no_grad():
    for rows, same in ((full, True), (~full, False)):
      b = {k: v[rows] for k, v in batch.items()}
      t = hf_reference.tensors(b)
      theirs = hf(input_ids=t["input_ids"], attention_mask=t["attention_mask"],
                  token_type_ids=t["token_type_ids"], start_positions=t["start_position"],
                  end_positions=t["end_position"]).loss.item()
      masked = masked_qa_loss(hf, b)[0].item()
      assert (abs(theirs - masked) < 1e-6 * masked) == same, (rows.sum(), theirs, masked)


# ----------------------------------------------------------------------------- pretraining heads


def mlm_labels(batch) -> torch.Tensor:
  """transformers' MLM labels: the original token at each masked position, -100 elsewhere."""
  labels = np.full(batch["input_ids"].shape, -100, np.int64)
  rows, cols = np.nonzero(np.asarray(batch["masked_weights"]) > 0)
  positions = np.asarray(batch["masked_positions"])[rows, cols]
  assert len(set(zip(rows, positions))) == len(rows)  # each position predicted once
  labels[rows, positions] = np.asarray(batch["masked_ids"])[rows, cols]
  return as_torch(labels)


def pretraining_batches(spec, corpus, tmp_path, **settings):
  return task_batches(spec, corpus, tmp_path, data_dir=str(corpus / "prepared"), batch_size=8,
                      max_seq_length=64, max_predictions_per_seq=10, **settings)


@pytest.mark.slow
def test_roberta_mlm_matches_transformers(corpus, tmp_path):
  config, objective, batches = pretraining_batches("configs/roberta.py:runlocal", corpus, tmp_path)
  cfg = objective.model_config(config)
  assert (cfg.architecture, cfg.pad_token_id, cfg.position_offset) == ("roberta", 0, 1)
  hf = hf_reference.build_model(cfg, cls=T.RobertaForMaskedLM)
  params = starting_params(objective, config, cfg, hf, heads=("mlm",))
  compare("roberta_mlm", objective, config, cfg, params, hf, batches,
          builtin_loss(lambda b: {"labels": mlm_labels(b)}))


@pytest.mark.slow
def test_albert_mlm_sop_matches_transformers(corpus, tmp_path):
  """ALBERT's recipe trains with LAMB, which torch lacks: both sides use AdamW here."""
  config, objective, batches = pretraining_batches(
      "configs/albert.py:runlocal", corpus, tmp_path, learning_rate=2e-3,
      **{"optimizer.name": "adamw", "model.embedding_size": 16})
  cfg = objective.model_config(config)
  assert cfg.num_groups == 1 and cfg.num_hidden_layers == 2  # one layer's weights, used twice
  hf = hf_reference.build_model(cfg, cls=T.AlbertForPreTraining)
  params = starting_params(objective, config, cfg, hf, heads=("mlm", "pair"))
  assert {int(x) for b in batches for x in b["next_sentence_label"]} == {0, 1}
  compare("albert_mlm_sop", objective, config, cfg, params, hf, batches,
          builtin_loss(lambda b: {"labels": mlm_labels(b),
                                  "sentence_order_label": as_torch(b["next_sentence_label"])}))


def test_pair_head_has_no_dropout():
  """NSP/SOP logits are the pooled output times the head's weights also when dropout is on, as
  in BERT's and ALBERT's pretraining code and BertForPreTraining (the encoder drops out)."""
  cfg = ModelConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, hidden_dropout_prob=0.5)
  model = PretrainingModel(cfg)
  ids = jnp.arange(24).reshape(2, 12) % 50
  params = nn.meta.unbox(model.init(jax.random.key(0), ids, masked_positions=ids[:, :2]))
  out = model.apply(params, ids, masked_positions=ids[:, :2], deterministic=False,
                    rngs={"dropout": jax.random.key(1)})
  head = params["params"]["pair"]["classifier"]
  want = out["output"].pooler_output @ head["kernel"] + head["bias"]
  np.testing.assert_allclose(out["pair_logits"], want, rtol=1e-6, atol=1e-6)
  again = model.apply(params, ids, masked_positions=ids[:, :2], deterministic=True)
  assert not np.allclose(again["output"].pooler_output, out["output"].pooler_output)


class Discriminator(Objective):
  """ELECTRA's discriminator alone on given replaced inputs (batch["rtd_labels"]), with the loss
  term `bertjax.objectives.rtd` uses (rtd_terms: mean binary cross-entropy over real tokens)."""
  name = "rtd_discriminator"

  def make_model(self, config, model_config):
    del config
    return ElectraDiscriminator(model_config)

  def model_inputs(self, batch):
    return {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}

  def denominators(self, batch):
    return {"tokens": jnp.maximum(jnp.sum(batch["attention_mask"].astype(jnp.float32)), 1.0)}

  def loss(self, model, params, batch, rng, denominators, deterministic):
    out = model.apply({"params": params}, **self.model_inputs(batch), deterministic=deterministic)
    return rtd_terms(out["rtd_logits"], batch["rtd_labels"], batch["attention_mask"],
                     denominators["tokens"])


def replaced(config, objective, batches):
  """Our ELECTRA pretraining model's corrupted inputs and labels for each masked batch: tokens
  sampled from its (untrained) generator at the masked positions."""
  model = objective.make_model(config, objective.model_config(config))
  params = nn.meta.unbox(objective.init_params(model, jax.random.key(0), batches[0]))
  apply = jax.jit(lambda b, r: model.apply({"params": params}, **objective.model_inputs(b),
                                           rngs={"sample": r}))
  out = []
  for i, b in enumerate(batches):
    r = apply(b, jax.random.key(100 + i))
    out.append({"input_ids": np.asarray(r["corrupted_ids"]),
                "attention_mask": b["attention_mask"], "token_type_ids": b["token_type_ids"],
                "rtd_labels": np.asarray(r["rtd_labels"])})
  return out


@pytest.mark.slow
def test_electra_discriminator_matches_transformers(corpus, tmp_path):
  # The paper's masking rate and the settings this test was written with (runlocal now selects
  # half the tokens at a constant 5e-4 so that its 200 steps separate; the torch reference decays
  # linearly).
  config, rtd, masked = pretraining_batches("configs/electra.py:runlocal", corpus, tmp_path,
                                            **{"model.embedding_size": 16, "masking.rate": 0.15,
                                               "optimizer.decay": "linear",
                                               "learning_rate": 2e-3})
  batches = replaced(config, rtd, masked)
  labels = np.concatenate([b["rtd_labels"].ravel() for b in batches])
  assert 0.05 < labels.mean() < 0.3, labels.mean()  # about the 15% masked, most replaced
  objective = Discriminator()
  cfg = objective.model_config(config)
  assert cfg.embed_size == 16 and not cfg.use_pooler
  hf = hf_reference.build_model(cfg, cls=T.ElectraForPreTraining)
  params = starting_params(objective, config, cfg, hf, heads=("rtd",))
  compare("electra_discriminator", objective, config, cfg, params, hf, batches,
          builtin_loss(lambda b: {"labels": as_torch(b["rtd_labels"])}))
