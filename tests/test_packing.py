"""Sequence packing (data.pack): several single-segment instances per row, kept apart by segment
ids; every instance lands in exactly one row, resume is exact, and the encoder computes a packed
instance exactly as it computes it alone."""

import json

import jax
import numpy as np

import pytest

from bertjax.core.errors import UserError
from bertjax.data import packing, pipeline
from bertjax.data.masking import Masking, SpecialIds
from bertjax.models.config import ModelConfig
from bertjax.models.encoder import Encoder
from bertjax.registry import get_objective
from bertjax.trainer import train
from tests.test_objectives import quickstart
from tests.helpers import epoch_instances
from tests.test_pipeline import SPECIAL, assert_same_batches, corpus, make, take

SEQ = 48


def instance_stream(documents, seed=0):
  """The unpacked instances of one epoch, as the pipeline sees them."""
  return [dict(i, epoch=0) for i in epoch_instances(
      documents, "single", SEQ, seed, 0, special=SPECIAL, short_seq_prob=0.3)]


def packed_rows(documents, num_bins, seed=0):
  instances = pipeline._InstanceDataset(  # pylint: disable=protected-access
      documents, pipeline.Instances(kind="single", max_seq_length=SEQ, short_seq_prob=0.3),
      seed=seed, special=SPECIAL, shard_index=0, shard_count=1, num_epochs=1)
  return list(packing.PackedDataset(instances, max_seq_length=SEQ, num_bins=num_bins))


@pytest.mark.parametrize("num_bins", [1, 4, 16])
def test_every_instance_lands_in_exactly_one_row_intact(num_bins):
  documents = corpus(num_docs=40)
  instances = {i["example_key"]: i for i in instance_stream(documents)}
  rows = packed_rows(documents, num_bins)
  seen = []
  for row in rows:
    assert row["length"] <= SEQ
    assert len(row["input_ids"]) == len(row["token_type_ids"]) == len(row["segment_ids"]) == \
        row["length"]
    # Segment ids number the instances 1..k in order, each a contiguous run.
    ids = row["segment_ids"]
    assert ids[0] == 1 and np.all(np.diff(ids) >= 0) and np.all(np.diff(ids) <= 1)
    assert ids[-1] == row["num_instances"]
    keys = [row["example_key"]]
    for k in range(1, row["num_instances"] + 1):
      text = row["input_ids"][ids == k]
      # Each packed piece is one whole instance: [CLS] text [SEP] of the stream's instance.
      match = [key for key, i in instances.items()
               if np.array_equal(i["input_ids"], text) and key not in seen]
      assert match, f"row piece {k} is not an instance of the stream"
      seen.append(match[0])
      keys.append(match[0])
    assert keys[0] == keys[1]  # The row's key (its masking seed) is its first instance's.
  assert sorted(seen) == sorted(instances)
  # Packing fills rows: fewer rows than instances, except with one bin (no choice of row).
  fill = sum(r["length"] for r in rows) / (len(rows) * SEQ)
  unpacked = sum(i["length"] for i in instances.values()) / (len(instances) * SEQ)
  if num_bins > 1:
    assert len(rows) < len(instances) and fill > unpacked


@pytest.mark.slow
def test_more_bins_fill_rows_at_least_as_well_on_real_text(data_dir):
  from tests.test_pipeline import load_wikitext_documents  # pylint: disable=g-import-not-at-top
  documents, vocab_size = load_wikitext_documents(data_dir / "wikitext2" / "wiki.valid.tokens")
  special = SpecialIds(0, 1, 2, 3, 4, vocab_size)

  def rows(pack, bins=1):
    it = pipeline.make_pretraining_iterator(
        documents, pipeline.Instances(kind="single", max_seq_length=128, short_seq_prob=0.1,
                                      pack=pack, pack_bins=bins),
        Masking(strategy="span", max_predictions=20), batch_size=16, seed=0, special=special,
        word_start_mask=np.ones(vocab_size, bool), num_epochs=1, drop_remainder=False)
    batches = list(it)
    real = sum(b["attention_mask"].sum() for b in batches)
    instances = sum(b["segment_ids"].max(1).sum() if pack else len(b["input_ids"])
                    for b in batches)
    return sum(len(b["input_ids"]) for b in batches), real, instances

  plain_rows, plain_real, plain_instances = rows(False)
  packed = [rows(True, bins) for bins in (4, 64)]
  for n_rows, real, instances in packed:
    assert (real, instances) == (plain_real, plain_instances)  # same text, none lost
    assert n_rows < plain_rows
  assert packed[1][0] <= packed[0][0]


def test_packed_batches_keep_masks_and_spans_inside_their_instances():
  documents = corpus(num_docs=30)
  batches = take(make(documents, kind="single", strategy="span", pack=True, pack_bins=8), 10)
  assert any(b["segment_ids"].max() > 1 for b in batches)
  for b in batches:
    seg = b["segment_ids"]
    np.testing.assert_array_equal(seg > 0, b["attention_mask"] == 1)
    rows, slots = np.nonzero(b["masked_weights"])
    positions = b["masked_positions"][rows, slots]
    segment = seg[rows, positions]
    assert np.all(segment > 0)
    # A span and its two boundary tokens belong to one instance.
    np.testing.assert_array_equal(seg[rows, b["span_left"][rows, slots]], segment)
    np.testing.assert_array_equal(seg[rows, b["span_right"][rows, slots]], segment)


def test_packed_iterator_resumes_exactly_mid_group():
  documents = corpus(num_docs=25)
  args = dict(kind="single", strategy="span", pack=True, pack_bins=6)
  iterator = make(documents, **args)
  for skip in (3, 5):  # batches of 4 rows: states fall inside groups of 6 rows
    take(iterator, skip)
    state = json.loads(json.dumps(iterator.get_state()))
    expected = take(iterator, 30)  # crosses epochs
    restored = make(documents, **args)
    restored.set_state(state)
    assert_same_batches(take(restored, 30), expected)
  with pytest.raises(UserError, match="packed pipeline"):
    make(documents, **args).set_state({"epoch": 0, "position": 0, "index": 0})


@pytest.mark.parametrize("kind", ["nsp", "sop", "full"])
def test_packing_a_labelled_or_already_full_kind_is_a_user_error(kind):
  with pytest.raises(UserError, match="data.pack"):
    make(corpus(num_docs=10), kind=kind, pack=True)
  with pytest.raises(UserError, match="pack_bins"):
    make(corpus(num_docs=10), kind="single", pack=True, pack_bins=0)


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["bert", "roberta"])  # RoBERTa numbers from pad + 1
def test_a_packed_row_computes_each_instance_as_it_does_alone(architecture):
  cfg = ModelConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=40, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0, architecture=architecture,
                    pad_token_id=1 if architecture == "roberta" else 0)
  pad = cfg.pad_token_id
  rng = np.random.default_rng(0)
  a, b = rng.integers(5, 60, 9).astype(np.int32), rng.integers(5, 60, 13).astype(np.int32)
  seq = 26
  alone = np.full((2, seq), pad, np.int32)
  alone[0, :9], alone[1, :13] = a, b
  alone_mask = (alone != pad).astype(np.int32)
  packed = np.full((1, seq), pad, np.int32)
  packed[0, :22] = np.concatenate([a, b])
  segment_ids = np.zeros((1, seq), np.int32)
  segment_ids[0, :9], segment_ids[0, 9:22] = 1, 2
  enc = Encoder(cfg)
  params = enc.init(jax.random.key(0), alone)["params"]
  want = np.asarray(enc.apply({"params": params}, alone, alone_mask).last_hidden_state)
  got = np.asarray(enc.apply({"params": params}, packed, segment_ids=segment_ids)
                   .last_hidden_state)
  np.testing.assert_allclose(got[0, :9], want[0, :9], rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(got[0, 9:22], want[1, :13], rtol=2e-5, atol=2e-5)
  # Without segment ids the two instances see each other: the outputs differ.
  mixed = np.asarray(enc.apply({"params": params}, packed, (packed != pad).astype(np.int32))
                     .last_hidden_state)
  assert np.max(np.abs(mixed[0, :9] - want[0, :9])) > 1e-3


@pytest.mark.slow
def test_data_pack_reaches_span_sbo_and_its_gradients_stay_finite(tmp_path):
  """configs: data.pack=True gives span_sbo packed rows from the real sample; the loss and every
  gradient are finite (padding queries see no key of their own segment) and depend on the ids."""
  config = quickstart(objective="span_sbo", batch_size=16, max_seq_length=128,
                      **{"data.pack": True, "model.num_hidden_layers": 1})
  work = tmp_path / "work"
  objective = get_objective(config)
  batch = next(objective.build_inputs(config, work).train)
  assert batch["segment_ids"].max() > 1
  assert "segment_ids" in objective.model_inputs(batch)
  model = objective.make_model(config, train.model_config_from(config))
  params = objective.init_params(model, jax.random.key(0), batch)
  denominators = objective.denominators(batch)

  def loss(p, b):
    return objective.loss(model, p, b, jax.random.key(1), denominators, False)[0]

  value, grads = jax.value_and_grad(loss)(params, batch)
  assert np.isfinite(value)
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
  plain = {k: v for k, v in batch.items() if k != "segment_ids"}
  assert abs(float(loss(params, plain)) - float(value)) > 1e-6
  nsp = quickstart(**{"data.pack": True})
  with pytest.raises(UserError, match="data.pack"):
    get_objective(nsp).build_inputs(nsp, tmp_path / "nsp")
  assert not (tmp_path / "nsp").exists()  # refused before preparing anything


def test_a_packed_modernbert_row_gives_its_instances_their_loss_alone():
  """ModernBERT's MLM loss (configs/modernbert.py's objective, a tiny model whose local window
  is shorter than the row): two instances packed into one row with segment ids give the loss
  they give in two padded rows, the same predictions at the same tokens."""
  from tests.helpers import load_config  # pylint: disable=import-outside-toplevel
  config = load_config("configs/modernbert.py:runlocal", max_seq_length=32,
                       max_predictions_per_seq=6, **{"model.vocab_size": 60,
                                                     "model.hidden_size": 32,
                                                     "model.intermediate_size": 40,
                                                     "model.num_attention_heads": 4,
                                                     "model.local_attention": 8,
                                                     # weights large enough that attention
                                                     # matters to the loss at init
                                                     "model.initializer_range": 0.5})
  objective = get_objective(config)
  model = objective.make_model(config, train.model_config_from(config))
  rng = np.random.default_rng(0)
  a, b = rng.integers(5, 60, 13).astype(np.int32), rng.integers(5, 60, 11).astype(np.int32)
  at_a, at_b = np.array([2, 5, 9]), np.array([1, 4, 7])
  z = lambda *shape: np.zeros(shape, np.int32)
  alone = {"input_ids": z(2, 32), "attention_mask": z(2, 32), "token_type_ids": z(2, 32),
           "masked_positions": z(2, 6), "masked_ids": z(2, 6),
           "masked_weights": np.zeros((2, 6), np.float32), "next_sentence_label": z(2)}
  packed = {k: v[:1].copy() for k, v in alone.items()}
  packed["segment_ids"] = z(1, 32)
  for row, (tokens, at) in enumerate(((a, at_a), (b, at_b))):
    masked = tokens.copy()
    masked[at] = 4
    alone["input_ids"][row, :len(tokens)], alone["attention_mask"][row, :len(tokens)] = masked, 1
    alone["masked_positions"][row, :3], alone["masked_ids"][row, :3] = at, tokens[at]
    alone["masked_weights"][row, :3] = 1
  packed["input_ids"][0, :24] = np.concatenate([alone["input_ids"][0, :13],
                                                alone["input_ids"][1, :11]])
  packed["attention_mask"][0, :24] = 1
  packed["segment_ids"][0, :13], packed["segment_ids"][0, 13:24] = 1, 2
  packed["masked_positions"][0] = np.concatenate([at_a, 13 + at_b])
  packed["masked_ids"][0] = np.concatenate([a[at_a], b[at_b]])
  packed["masked_weights"][0] = 1
  params = objective.init_params(model, jax.random.key(0), alone)

  def loss(batch):
    return float(objective.loss(model, params, batch, jax.random.key(1),
                                objective.denominators(batch), True)[0])

  assert loss(packed) == pytest.approx(loss(alone), rel=1e-5)
  # Without its segment ids the row's two instances see each other: another loss.
  assert abs(loss({k: v for k, v in packed.items() if k != "segment_ids"}) - loss(alone)) > 1e-2
