"""Tests for bertjax.data.pipeline: batches, determinism, sharding and exact resume."""

import dataclasses
import json
import re

import numpy as np
import pytest

from bertjax.data import pipeline
from bertjax.core.errors import UserError
from bertjax.data.masking import Masking, SpecialIds
from helpers import count_instances

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
VOCAB = 2000
SPECIAL = SpecialIds(PAD, UNK, CLS, SEP, MASK, VOCAB)
WORD_START = np.arange(VOCAB) < 1500  # Ids >= 1500 continue a word.


def corpus(num_docs: int = 40, seed: int = 0) -> list[list[np.ndarray]]:
  """Documents whose every token encodes the document: 5 + doc + 50 * k, so any token of a
  batch tells which document it came from (doc < 50)."""
  rng = np.random.default_rng(seed)
  documents = []
  for doc in range(num_docs):
    sentences = [(5 + doc + 50 * rng.integers(0, 29, rng.integers(3, 25))).astype(np.int32)
                 for _ in range(rng.integers(1, 8))]
    documents.append(sentences)
  return documents


def source_docs(batch: dict[str, np.ndarray], first_segment_only: bool = False) -> set[int]:
  """Documents the (unmasked) text of a batch came from."""
  ids = batch["input_ids"].copy()
  rows, slots = np.nonzero(batch["masked_weights"])
  ids[rows, batch["masked_positions"][rows, slots]] = batch["masked_ids"][rows, slots]
  keep = ~np.isin(ids, SPECIAL.ids)
  if first_segment_only:
    keep &= batch["token_type_ids"] == 0
  text = ids[keep]
  return set(((text - 5) % 50).tolist())


def make(documents, **kwargs):
  """The pipeline's iterator with this file's defaults; a keyword sets a field of
  `pipeline.Instances` or `masking.Masking`, or an argument of make_pretraining_iterator."""
  args = dict(kind="nsp", max_seq_length=48, batch_size=4, seed=0, special=SPECIAL,
              word_start_mask=WORD_START, max_predictions=8)
  args.update(kwargs)
  settings = lambda cls: cls(**{f.name: args.pop(f.name) for f in dataclasses.fields(cls)
                                if f.name in args})
  rows, masking = settings(pipeline.Instances), settings(Masking)
  return pipeline.make_pretraining_iterator(documents, rows, masking, **args)


def take(iterator, n):
  return [next(iterator) for _ in range(n)]


def assert_same_batches(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for key in x:
      np.testing.assert_array_equal(x[key], y[key], err_msg=key)


@pytest.mark.parametrize("kind, strategy", [("nsp", "token"), ("sop", "whole_word"),
                                            ("full", "ngram"), ("single", "span")])
def test_batch_shapes_and_consistency(kind, strategy):
  batches = take(make(corpus(), kind=kind, strategy=strategy, batch_size=3), 5)
  expected = {"input_ids", "token_type_ids", "attention_mask", "masked_positions", "masked_ids",
              "masked_weights", "next_sentence_label"}
  if strategy == "span":
    expected |= {"span_left", "span_right", "span_offset"}
  for batch in batches:
    assert set(batch) == expected
    for key in ("input_ids", "token_type_ids", "attention_mask"):
      assert batch[key].shape == (3, 48) and batch[key].dtype == np.int32
    for key in ("masked_positions", "masked_ids"):
      assert batch[key].shape == (3, 8) and batch[key].dtype == np.int32
    assert batch["masked_weights"].dtype == np.float32
    assert batch["next_sentence_label"].shape == (3,)
    assert batch["next_sentence_label"].dtype == np.int32
    np.testing.assert_array_equal(batch["attention_mask"], batch["input_ids"] != PAD)
    assert np.all(batch["input_ids"][:, 0] == CLS)
    # Predictions point at real tokens only.
    rows, slots = np.nonzero(batch["masked_weights"])
    assert np.all(batch["attention_mask"][rows, batch["masked_positions"][rows, slots]] == 1)
    if kind in ("full", "single"):
      assert not batch["next_sentence_label"].any() and not batch["token_type_ids"].any()


def test_pair_kinds_have_both_labels():
  labels = np.concatenate([b["next_sentence_label"] for b in take(make(corpus(), kind="sop"),
                                                                  40)])
  assert 0.3 < labels.mean() < 0.7


def test_same_seed_same_batches_and_other_seed_differs():
  documents = corpus()
  a = take(make(documents, seed=11, strategy="span"), 30)
  b = take(make(documents, seed=11, strategy="span"), 30)
  c = take(make(documents, seed=12, strategy="span"), 30)
  assert_same_batches(a, b)
  assert not all(np.array_equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, c))


def rows_of(batch):
  """Each row of a batch as one hashable record of all its fields (an example's identity: its
  tokens, mask and labels)."""
  n = len(batch["input_ids"])
  return [tuple(np.asarray(batch[k][i]).tobytes() for k in sorted(batch)) for i in range(n)]


def check_shares(whole, shares):
  """Raises AssertionError unless the processes' batches, put together in process order, are the
  one-process batches row for row, over the whole epoch: no row read twice, none left out."""
  assert all(len(s) <= len(whole) for s in shares), "a process read more batches than one"
  for step, batch in enumerate(whole):  # in a last, partial batch a process may have no rows
    together = [r for s in shares if step < len(s) for r in rows_of(s[step])]
    assert together == rows_of(batch), f"batch {step}: the processes' rows are not its rows"
  every = [r for s in shares for b in s for r in rows_of(b)]
  assert len(every) == len(set(every)), "a row was read twice"


# With packing, a rate schedule: the other stages between the walk and the share.
SHARED_KINDS = [dict(kind="nsp"), dict(kind="full"), dict(kind="single", pack=True, pack_bins=4),
                dict(kind="single", rate_schedule=((0.0, 0.1), (1.0, 0.3)))]


@pytest.mark.parametrize("kwargs", SHARED_KINDS, ids=["nsp", "full", "packed", "rate_schedule"])
def test_processes_read_together_what_one_reads(kwargs):
  """Over one epoch (its last, partial batch included) two processes with 3 rows each read, put
  together, exactly the batches of one process with 6 rows; each row once. (On the original
  code processes took disjoint documents and read other batches: this failed.)"""
  documents = corpus()
  whole = list(make(documents, batch_size=6, num_epochs=1, drop_remainder=False, **kwargs))
  shares = [list(make(documents, batch_size=3, shard_index=p, shard_count=2, num_epochs=1,
                      drop_remainder=False, **kwargs)) for p in range(2)]
  assert len(whole) > 5 and len(whole[-1]["input_ids"]) < 6  # a last, partial batch
  check_shares(whole, shares)


def test_check_shares_catches_a_process_reading_the_others_rows():
  """The twin: process 1 built as process 0 reads process 0's rows; the check refuses it."""
  documents = corpus()
  whole = list(make(documents, batch_size=6, num_epochs=1, drop_remainder=False))
  wrong = [list(make(documents, batch_size=3, shard_index=0, shard_count=2, num_epochs=1,
                     drop_remainder=False)) for _ in range(2)]
  with pytest.raises(AssertionError, match="not its rows"):
    check_shares(whole, wrong)


def test_share_state_resumes_under_another_process_count():
  """A state taken by a process after a batch is the one-process state at that global batch:
  one process resuming from it reads on as an uninterrupted one-process run."""
  documents = corpus()
  it = make(documents, batch_size=3, shard_index=1, shard_count=2)
  take(it, 4)
  state = json.loads(json.dumps(it.get_state()))
  whole = make(documents, batch_size=6)
  take(whole, 4)
  assert whole.get_state() == state
  resumed = make(documents, batch_size=6)
  resumed.set_state(state)
  assert_same_batches(take(resumed, 3), take(whole, 3))


@pytest.mark.parametrize("kind, strategy", [("nsp", "token"), ("full", "span"),
                                            ("sop", "ngram")])
def test_restored_iterator_continues_exactly(kind, strategy):
  documents = corpus(num_docs=25)
  iterator = make(documents, kind=kind, strategy=strategy)
  take(iterator, 7)
  # The state goes through JSON, as in a checkpoint.
  state = json.loads(json.dumps(iterator.get_state()))
  expected = take(iterator, 40)  # Crosses into the next epochs.
  assert iterator.get_state()["epoch"] > state["epoch"]
  restored = make(documents, kind=kind, strategy=strategy)
  restored.set_state(state)
  assert_same_batches(take(restored, 40), expected)
  # Restoring an older state rewinds an iterator that has moved on.
  iterator.set_state(state)
  assert_same_batches(take(iterator, 5), expected[:5])


def test_masks_are_redrawn_each_epoch():
  documents = corpus(num_docs=10)
  batches = list(make(documents, kind="single", batch_size=1, num_epochs=2,
                      drop_remainder=False))
  half = len(batches) // 2
  by_text = {}
  for epoch, part in enumerate([batches[:half], batches[half:]]):
    for b in part:
      ids = b["input_ids"][0].copy()
      used = b["masked_weights"][0] > 0
      ids[b["masked_positions"][0][used]] = b["masked_ids"][0][used]
      by_text.setdefault(ids.tobytes(), []).append(tuple(b["masked_positions"][0][used]))
  # Single segments without short targets are the same each epoch; their masks are not.
  assert len(by_text) == half and all(len(v) == 2 for v in by_text.values())
  assert sum(v[0] != v[1] for v in by_text.values()) > 0.8 * half


def test_finite_epochs_end():
  documents = corpus(num_docs=12)
  one = list(make(documents, kind="single", batch_size=2, num_epochs=1, drop_remainder=False))
  two = list(make(documents, kind="single", batch_size=2, num_epochs=2, drop_remainder=False))
  examples = sum(len(b["input_ids"]) for b in one)
  assert examples == count_instances(documents, "single", 48,
                                                 special=SPECIAL).instances
  assert sum(len(b["input_ids"]) for b in two) == 2 * examples
  dropped = list(make(documents, kind="single", batch_size=5, num_epochs=1))
  assert all(len(b["input_ids"]) == 5 for b in dropped)
  assert len(dropped) == examples // 5


@pytest.mark.parametrize("kwargs, message", [
    (dict(kind="mlm"), "unknown instance kind"),
    (dict(batch_size=0), "batch_size"),
    (dict(shard_index=2, shard_count=2), "shard_index"),
    (dict(seed=-1), "seed"),
    (dict(strategy="span", word_start_mask=None), "needs word_start_mask"),
    (dict(replace_probs=(1.0, 0.5, 0.0)), "replace_probs"),
    (dict(num_epochs=0), "num_epochs"),
])
def test_bad_arguments_are_user_errors(kwargs, message):
  with pytest.raises(UserError, match=message):
    make(corpus(num_docs=4), **kwargs)


def test_unusable_corpus_fails_at_first_batch():
  documents = [[np.arange(5, 15, dtype=np.int32)] for _ in range(6)]
  iterator = make(documents, kind="sop")
  with pytest.raises(UserError, match="0 of 6 documents qualify"):
    next(iterator)
  with pytest.raises(UserError, match="state"):
    iterator.set_state({"epoch": 0})


def load_wikitext_documents(path) -> tuple[list[list[np.ndarray]], int]:
  """WikiText articles (split at ` = Title = `), sentences ending at ".", whitespace tokens."""
  documents: list[list[np.ndarray]] = []
  vocab: dict[str, int] = {}
  for line in open(path, encoding="utf-8"):
    line = line.strip()
    if re.fullmatch(r"= [^=].* =", line):
      documents.append([])
    elif line and not line.startswith("= "):
      ids = [vocab.setdefault(t, 5 + len(vocab)) for t in line.split()]
      ends = [i + 1 for i, t in enumerate(line.split()) if t == "."]
      for start, end in zip([0] + ends, ends + [len(ids)]):
        if end > start:
          documents[-1].append(np.array(ids[start:end], np.int32))
  return documents, 5 + len(vocab)


def test_real_text_batches(data_dir):
  documents, vocab_size = load_wikitext_documents(data_dir / "wikitext2" / "wiki.valid.tokens")
  special = SpecialIds(PAD, UNK, CLS, SEP, MASK, vocab_size)
  iterator = pipeline.make_pretraining_iterator(
      documents, pipeline.Instances(kind="nsp", max_seq_length=128),
      Masking(strategy="whole_word", max_predictions=20), batch_size=32, seed=0,
      special=special, word_start_mask=np.ones(vocab_size, bool))
  batches = take(iterator, 40)
  masked = sum(b["masked_weights"].sum() for b in batches)
  tokens = sum(b["attention_mask"].sum() for b in batches)
  assert tokens > 100_000
  assert abs(masked / tokens - 0.15) < 0.005
  labels = np.concatenate([b["next_sentence_label"] for b in batches])
  assert abs(labels.mean() - 0.5) < 0.05
