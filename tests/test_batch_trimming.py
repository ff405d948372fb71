"""Fine-tuning batches cut to their longest row (`pad_to_multiple_of`): the right length, the same
rows, and the same model outputs as at full padding, so only the compute spent on padding goes."""

import jax
import numpy as np
import pytest

from bertjax.core.errors import UserError
from bertjax.models.config import ModelConfig
from bertjax.models import classifiers
from bertjax.tasks import base

SEQ = 32


def rows(lengths, seed=0):
  """Feature rows as the tasks build them: ids, mask, types and per-position labels padded to
  SEQ, a per-row label."""
  rng = np.random.default_rng(seed)
  n = len(lengths)
  mask = (np.arange(SEQ)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
  ids = np.where(mask == 1, rng.integers(5, 60, (n, SEQ)), 0).astype(np.int32)
  types = np.where(np.arange(SEQ)[None, :] >= np.asarray(lengths)[:, None] // 2, 1, 0) * mask
  tags = np.where(mask == 1, rng.integers(0, 3, (n, SEQ)), -1).astype(np.int32)
  return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types.astype(np.int32),
          "labels": tags, "label": rng.integers(0, 2, n).astype(np.int32)}


def test_batch_length_is_the_longest_row_rounded_up():
  assert base.batch_length(rows([3, 9, 5])["attention_mask"], 8) == 16
  assert base.batch_length(rows([3, 8, 5])["attention_mask"], 8) == 8
  assert base.batch_length(rows([3, 31])["attention_mask"], 8) == SEQ  # never past the rows
  assert base.batch_length(rows([3, 9])["attention_mask"], 1) == 9
  assert base.batch_length(np.zeros((2, SEQ), np.int32), 8) == 8  # all padding: one bucket


def test_iterator_cuts_each_batch_and_keeps_the_rows():
  arrays = rows([4, 6, 11, 3, 20, 7, 5, 2, 9, 30])
  full = base.FeatureIterator(arrays, batch_size=4, seed=1)
  cut = base.FeatureIterator(arrays, batch_size=4, seed=1, pad_to_multiple_of=8)
  lengths = set()
  for _ in range(6):
    a, b = next(full), next(cut)
    length = base.batch_length(a["attention_mask"], 8)
    lengths.add(length)
    assert b["input_ids"].shape == (4, length) and b["labels"].shape == (4, length)
    for k in a:
      if a[k].ndim == 2:
        np.testing.assert_array_equal(b[k], a[k][:, :length])
        assert not a["attention_mask"][:, length:].any()  # only padding was cut
      else:
        np.testing.assert_array_equal(b[k], a[k])
  assert len(lengths) > 1  # the data above gives batches of different lengths
  # Processes cut to the length of the whole global batch, so their shapes agree.
  halves = [base.FeatureIterator(arrays, 4, 1, process_index=p, process_count=2,
                                 pad_to_multiple_of=8) for p in range(2)]
  whole = base.FeatureIterator(arrays, 4, 1, pad_to_multiple_of=8)
  for _ in range(3):
    parts, b = [next(h) for h in halves], next(whole)
    np.testing.assert_array_equal(np.concatenate([p["input_ids"] for p in parts]), b["input_ids"])
  with pytest.raises(UserError, match="pad_to_multiple_of=-8 must be >= 0"):
    base.FeatureIterator(arrays, 4, 1, pad_to_multiple_of=-8)


@pytest.mark.parametrize("model_cls", [classifiers.SequenceClassifier, classifiers.TokenClassifier])
def test_model_outputs_do_not_depend_on_the_cut(model_cls):
  cfg = ModelConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=SEQ)
  model = model_cls(cfg, 3)
  batch = rows([5, 12, 9])
  length = base.batch_length(batch["attention_mask"], 8)
  assert length == 16
  cut = base.trim_batch(batch, length, SEQ)
  inputs = lambda b: (b["input_ids"], b["attention_mask"], b["token_type_ids"])
  params = model.init(jax.random.key(0), *inputs(batch))
  full_out, cut_out = model.apply(params, *inputs(batch)), model.apply(params, *inputs(cut))
  if model_cls is classifiers.TokenClassifier:  # per position: compare the kept (real) positions
    full_out = full_out[:, :length]
  np.testing.assert_allclose(np.asarray(cut_out), np.asarray(full_out), rtol=1e-5, atol=1e-5)
