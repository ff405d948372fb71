"""Tests for bertjax.data.instances: NSP/SOP/FULL-SENTENCES/single-segment instances.

Real-text checks use WikiText-2 valid cut into documents at ` = Title = ` headings and into
sentences after each "." token, with whitespace tokens mapped to ids by a vocabulary built here.
"""

import functools
import re

import numpy as np
import pytest

from bertjax.data import instances as inst
from bertjax.data.instances import Segment
from bertjax.core.errors import UserError
from bertjax.data.masking import SpecialIds
from helpers import count_instances, epoch_instances

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4


@functools.lru_cache(maxsize=1)
def load_wikitext_documents(path) -> tuple[list[list[np.ndarray]], int]:
  documents: list[list[np.ndarray]] = []
  vocab: dict[str, int] = {}
  for line in open(path, encoding="utf-8"):
    line = line.strip()
    if re.fullmatch(r"= [^=].* =", line):
      documents.append([])
      continue
    if not line or line.startswith("= "):
      continue
    sentence: list[int] = []
    for token in line.split():
      sentence.append(UNK if token == "<unk>" else vocab.setdefault(token, 5 + len(vocab)))
      if token == ".":
        documents[-1].append(np.array(sentence, np.int32))
        sentence = []
    if sentence:
      documents[-1].append(np.array(sentence, np.int32))
  return documents, 5 + len(vocab)


@pytest.fixture
def wikitext(data_dir):
  return load_wikitext_documents(data_dir / "wikitext2" / "wiki.valid.tokens")


def special_for(vocab_size: int) -> SpecialIds:
  return SpecialIds(PAD, UNK, CLS, SEP, MASK, vocab_size)


def synthetic_corpus(num_docs: int, rng: np.random.Generator, max_sentences: int = 12,
                     max_len: int = 40) -> list[list[np.ndarray]]:
  return [[rng.integers(5, 1000, rng.integers(1, max_len)).astype(np.int32)
           for _ in range(rng.integers(0, max_sentences))] for _ in range(num_docs)]


# Keyed by id(documents): only used with the WikiText list, which lru_cache keeps alive.
_pieces_cache: dict[tuple[int, int, int], list[np.ndarray]] = {}


def segment_tokens(documents, segment: Segment, max_len: int) -> np.ndarray:
  """The tokens a Segment names, recomputed from the documents."""
  key = (id(documents), segment.doc, max_len)
  if key not in _pieces_cache:
    _pieces_cache[key] = inst.split_long_sentences(documents[segment.doc], max_len)
  pieces = _pieces_cache[key]
  text = np.concatenate(pieces[segment.start:segment.end])
  return text[segment.trim_front:len(text) - segment.trim_back]


def split_pair(instance) -> tuple[np.ndarray, np.ndarray]:
  ids = instance["input_ids"]
  seps = np.flatnonzero(ids == SEP)
  assert ids[0] == CLS and len(seps) == 2 and seps[1] == len(ids) - 1
  types = instance["token_type_ids"]
  np.testing.assert_array_equal(types, (np.arange(len(ids)) > seps[0]).astype(np.int32))
  return ids[1:seps[0]], ids[seps[0] + 1:-1]


def test_nsp_statistics_and_pair_provenance(wikitext):
  documents, vocab_size = wikitext
  special = special_for(vocab_size)
  max_seq_length = 64
  labels = []
  for epoch in range(3):
    for instance in epoch_instances(documents, "nsp", max_seq_length, seed=0,
                                                epoch=epoch, special=special):
      assert instance["length"] == len(instance["input_ids"]) <= max_seq_length
      tokens_a, tokens_b = split_pair(instance)
      assert len(tokens_a) and len(tokens_b)
      segment_a, segment_b = instance["segments"]
      np.testing.assert_array_equal(tokens_a, segment_tokens(documents, segment_a,
                                                             max_seq_length - 3))
      np.testing.assert_array_equal(tokens_b, segment_tokens(documents, segment_b,
                                                             max_seq_length - 3))
      assert segment_a.doc == instance["doc_index"]
      if instance["next_sentence_label"] == 0:
        # The actual continuation: B starts at the sentence right after A's last one.
        assert segment_b.doc == segment_a.doc and segment_b.start == segment_a.end
      else:
        assert segment_b.doc != segment_a.doc
      labels.append(instance["next_sentence_label"])
  assert len(labels) > 5000
  assert abs(np.mean(labels) - 0.5) < 0.02


def test_sop_statistics_and_swaps(wikitext):
  documents, vocab_size = wikitext
  special = special_for(vocab_size)
  labels = []
  for epoch in range(3):
    for instance in epoch_instances(documents, "sop", 64, seed=1, epoch=epoch,
                                                special=special):
      tokens_a, tokens_b = split_pair(instance)
      first, second = instance["segments"]
      np.testing.assert_array_equal(tokens_a, segment_tokens(documents, first, 61))
      np.testing.assert_array_equal(tokens_b, segment_tokens(documents, second, 61))
      assert first.doc == second.doc == instance["doc_index"]
      if instance["next_sentence_label"] == 1:
        assert first.start == second.end  # Swapped: the later text comes first.
      else:
        assert first.end == second.start
      labels.append(instance["next_sentence_label"])
  assert len(labels) > 5000
  assert abs(np.mean(labels) - 0.5) < 0.02


def test_short_sequences_appear_at_short_seq_prob(wikitext):
  documents, vocab_size = wikitext
  special = special_for(vocab_size)
  lengths = [i["length"] for i in epoch_instances(
      documents, "nsp", 128, seed=0, epoch=0, special=special, short_seq_prob=0.0)]
  short = [i["length"] for i in epoch_instances(
      documents, "nsp", 128, seed=0, epoch=0, special=special, short_seq_prob=0.5)]
  assert np.mean(short) < np.mean(lengths) - 10
  assert np.median(lengths) == 128  # Without short targets, most pairs are full.


def test_full_sentences_pack_across_documents(wikitext):
  documents, vocab_size = wikitext
  special = special_for(vocab_size)
  max_seq_length = 128
  order = inst.shard_documents(len(documents), seed=2, epoch=0)
  instances = list(epoch_instances(documents, "full", max_seq_length, seed=2,
                                               epoch=0, special=special))
  crossing = 0
  expected_stream = [(int(d), i) for d in order
                     for i in range(len(inst.split_long_sentences(documents[d], 126)))]
  seen_stream = []
  for instance in instances:
    ids = instance["input_ids"]
    assert ids[0] == CLS and ids[-1] == SEP and len(ids) <= max_seq_length
    assert not np.any(instance["token_type_ids"])
    assert instance["next_sentence_label"] == 0
    parts = []
    for segment in instance["segments"]:
      parts.append(segment_tokens(documents, segment, 126))
      seen_stream += [(segment.doc, i) for i in range(segment.start, segment.end)]
    # Documents are joined with an extra [SEP].
    joined = np.concatenate(sum([[p, [SEP]] for p in parts], [])[:-1])
    np.testing.assert_array_equal(ids[1:-1], joined)
    crossing += len(instance["segments"]) > 1
  # Every sentence of the epoch appears once, in the shuffled document order.
  assert seen_stream == expected_stream
  assert crossing >= 0.7 * (len(documents) - 1)
  # Packing is greedy: an instance plus the next sentence would not have fitted.
  for this, following in zip(instances, instances[1:]):
    next_segment = following["segments"][0]
    next_len = len(inst.split_long_sentences(documents[next_segment.doc],
                                                    126)[next_segment.start])
    extra = this["segments"][-1].doc != next_segment.doc
    assert this["length"] - 2 + extra + next_len > max_seq_length - 2


def test_single_segments_cover_each_document_once(wikitext):
  documents, vocab_size = wikitext
  special = special_for(vocab_size)
  per_doc: dict[int, list[Segment]] = {}
  for instance in epoch_instances(documents, "single", 128, seed=3, epoch=0,
                                              special=special):
    ids = instance["input_ids"]
    assert ids[0] == CLS and ids[-1] == SEP and len(ids) <= 128
    assert SEP not in ids[1:-1]
    (segment,) = instance["segments"]
    np.testing.assert_array_equal(ids[1:-1], segment_tokens(documents, segment, 126))
    per_doc.setdefault(segment.doc, []).append(segment)
  for doc, segments in per_doc.items():
    segments.sort()
    num_pieces = len(inst.split_long_sentences(documents[doc], 126))
    assert segments[0].start == 0 and segments[-1].end == num_pieces
    assert all(a.end == b.start for a, b in zip(segments, segments[1:]))
  assert len(per_doc) == sum(1 for d in documents if d)


def test_long_sentences_are_split_not_fatal():
  rng = np.random.default_rng(4)
  documents = [[rng.integers(5, 1000, 1000).astype(np.int32)],  # One 1000-token line.
               [rng.integers(5, 1000, 7).astype(np.int32), rng.integers(5, 1000, 300)],
               [rng.integers(5, 1000, 20).astype(np.int32) for _ in range(5)]]
  special = special_for(1000)
  for kind in inst.KINDS:
    stats = inst.InstanceStats()
    instances = list(epoch_instances(documents, kind, 32, seed=0, epoch=0,
                                                 special=special, stats=stats))
    assert instances and all(i["length"] <= 32 for i in instances)
    # The long line became pieces, so even the one-line document is usable.
    assert stats.usable_documents == 3
  pieces = inst.split_long_sentences(documents[0], 30)
  assert [len(p) for p in pieces] == [30] * 33 + [10]
  np.testing.assert_array_equal(np.concatenate(pieces), documents[0][0])


def test_unusable_documents_are_counted():
  rng = np.random.default_rng(5)
  good = [[rng.integers(5, 1000, 10).astype(np.int32) for _ in range(4)] for _ in range(6)]
  one_sentence = [[rng.integers(5, 1000, 10).astype(np.int32)] for _ in range(3)]
  empty = [[], [np.zeros(0, np.int32)]]  # No sentence; only an empty line.
  documents = good + one_sentence + empty
  special = special_for(1000)
  for kind, usable in [("nsp", 6), ("sop", 6), ("full", 9), ("single", 9)]:
    stats = count_instances(documents, kind, 64, special=special)
    assert stats.documents == 11
    assert stats.usable_documents == usable
    assert stats.instances > 0


@pytest.mark.parametrize("kind, message", [
    ("sop", "SOP needs documents with at least 2 sentences; 0 of 5 documents qualify"),
    ("nsp", "NSP needs documents with at least 2 sentences; 0 of 5 documents qualify"),
])
def test_unusable_corpus_is_a_user_error(kind, message):
  documents = [[np.arange(5, 15, dtype=np.int32)] for _ in range(5)]
  with pytest.raises(UserError, match=message):
    count_instances(documents, kind, 64, special=special_for(100))


def test_other_corpus_errors():
  special = special_for(100)
  with pytest.raises(UserError, match="at least 1 non-empty sentence; 0 of 2"):
    count_instances([[], []], "full", 64, special=special)
  with pytest.raises(UserError, match="no documents"):
    count_instances([], "single", 64, special=special)
  with pytest.raises(UserError, match="NSP needs at least 2 documents"):
    count_instances([[np.arange(5, 9), np.arange(5, 9)]], "nsp", 64,
                                special=special)
  with pytest.raises(UserError, match="shard 3 of 4 has no documents"):
    count_instances([[np.arange(5, 9)]] * 3, "single", 64, shard_index=3,
                                shard_count=4, special=special)
  with pytest.raises(UserError, match="unknown instance kind"):
    count_instances([[np.arange(5, 9)]], "mlm", 64, special=special)
  with pytest.raises(UserError, match="too short"):
    count_instances([[np.arange(5, 9)]], "nsp", 4, special=special)


def instances_by_key(documents, kind, seed, epoch, shard_index=0, shard_count=1):
  return {i["example_key"]: i for i in epoch_instances(
      documents, kind, 48, seed=seed, epoch=epoch, shard_index=shard_index,
      shard_count=shard_count, special=special_for(1000))}


@pytest.mark.parametrize("kind", ["nsp", "sop", "single"])
def test_instances_are_deterministic_and_independent_of_sharding(kind):
  documents = synthetic_corpus(120, np.random.default_rng(6))
  whole = instances_by_key(documents, kind, seed=7, epoch=0)
  again = instances_by_key(documents, kind, seed=7, epoch=0)
  shards = [instances_by_key(documents, kind, seed=7, epoch=0, shard_index=s, shard_count=3)
            for s in range(3)]
  assert whole.keys() == again.keys()
  # Shards own disjoint documents and together give exactly the unsharded instances.
  shard_docs = [{i["doc_index"] for i in s.values()} for s in shards]
  assert not (shard_docs[0] & shard_docs[1]) and not (shard_docs[1] & shard_docs[2])
  merged = {k: v for s in shards for k, v in s.items()}
  assert merged.keys() == whole.keys()
  for key, instance in whole.items():
    np.testing.assert_array_equal(instance["input_ids"], again[key]["input_ids"])
    np.testing.assert_array_equal(instance["input_ids"], merged[key]["input_ids"])
  # Another epoch draws different pairs (single segments without short targets do not change).
  other = instances_by_key(documents, kind, seed=7, epoch=1)
  differ = sum(k not in other or not np.array_equal(v["input_ids"], other[k]["input_ids"])
               for k, v in whole.items())
  assert (differ > len(whole) // 4) == (kind != "single")


@pytest.mark.parametrize("kind", inst.KINDS)
def test_walk_resumes_exactly_from_any_cursor(kind):
  documents = synthetic_corpus(60, np.random.default_rng(8))
  special = special_for(1000)
  walked = list(inst.walk_epoch(documents, kind, 48, 9, 2, special=special))
  for j in [0, 1, len(walked) // 3, len(walked) - 2]:
    rest = list(inst.walk_epoch(documents, kind, 48, 9, 2, special=special,
                                       start=walked[j][1]))
    assert len(rest) == len(walked) - j - 1
    for (a, cursor_a), (b, cursor_b) in zip(rest, walked[j + 1:]):
      np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
      assert a["example_key"] == b["example_key"] and cursor_a == cursor_b


def test_truncate_seq_pair_matches_berts_loop():
  rng = np.random.default_rng(10)
  for _ in range(300):
    len_a, len_b = rng.integers(1, 200, 2)
    max_tokens = int(rng.integers(2, 200))
    # BERT: remove from the longer (B on ties) until the pair fits.
    a, b = int(len_a), int(len_b)
    while a + b > max_tokens:
      if a > b:
        a -= 1
      else:
        b -= 1
    (fa, ba), (fb, bb) = inst.truncate_seq_pair(int(len_a), int(len_b), max_tokens, rng)
    assert min(fa, ba, fb, bb) >= 0
    assert (len_a - fa - ba, len_b - fb - bb) == (a, b)
  # Front and back cuts are equally likely.
  fronts = [inst.truncate_seq_pair(300, 10, 110, rng)[0][0] for _ in range(2000)]
  assert abs(np.mean(fronts) / 200 - 0.5) < 0.02
