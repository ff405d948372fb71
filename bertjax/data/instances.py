"""Pretraining example construction from documents of tokenized sentences, in pure numpy.

A corpus here is any random-access sequence of documents (a `PreparedCorpus`, a plain list in
tests); a document is a list of sentences, each an `<int32>[len]` array of token ids. Builders
return unpadded instances; `bertjax.data.pipeline` pads, masks and batches them.

Kinds of instances:
  nsp     BERT: [CLS] A [SEP] B [SEP]; B is the actual continuation (label 0) or, half of the
          time, text from a random other document (label 1).
  sop     ALBERT sentence-order prediction: A and B are consecutive text of one document, swapped
          half of the time (label 1 = swapped).
  full    RoBERTa FULL-SENTENCES: contiguous sentences packed up to max_seq_length, crossing
          document boundaries with an extra [SEP] between documents; one segment, no label.
  single  SpanBERT: one contiguous segment of one document up to max_seq_length; no label.

Sentences longer than what fits are split into consecutive pieces first (`split_long_sentences`),
and empty ones dropped, so long lines never crash; segment boundaries in instances index those
pieces. Pair kinds need at least 2 pieces in a document; other documents are skipped and counted.

An instance is a dict: input_ids / token_type_ids `<int32>[length]` (unpadded), length,
next_sentence_label (0 for full/single), segments (the `Segment`s its text came from, for tests
and debugging) and, from the epoch walk, doc_index and example_key.

`walk_epoch` walks one shard's documents for one epoch in a shuffled order, building each
document's instances with `np.random.default_rng([seed, epoch, doc_index])`, so the instances of
a document depend only on (seed, epoch, document), never on how work is split across processes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from bertjax.core.errors import UserError
from bertjax.data.masking import SpecialIds

KINDS = ("nsp", "sop", "full", "single")
# numpy gives [a, b, c] and [a, b, c, 0] the same stream, so derived seeds end in a distinct
# non-zero tag; this one keeps the shuffle apart from the per-document seeds [seed, epoch, doc].
_ORDER_TAG = 0x4F52444552

Documents = Sequence[Sequence[np.ndarray]]
Instance = dict[str, Any]
# Position in an epoch walk: (position in the shuffled document order, instance or piece index).
Cursor = tuple[int, int]


class Segment(NamedTuple):
  """Where a segment's tokens come from: pieces [start, end) of document `doc`, of which
  `trim_front` tokens were cut from the front and `trim_back` from the back by truncation."""

  doc: int
  start: int
  end: int
  trim_front: int = 0
  trim_back: int = 0


@dataclasses.dataclass
class InstanceStats:
  """Counts from walking (part of) an epoch."""

  documents: int = 0
  usable_documents: int = 0
  instances: int = 0


def split_long_sentences(sentences: Sequence[np.ndarray], max_len: int) -> list[np.ndarray]:
  """Drops empty sentences and cuts longer than `max_len` ones into consecutive pieces."""
  pieces = []
  for sentence in sentences:
    sentence = np.asarray(sentence, np.int32)
    if 0 < len(sentence) <= max_len:  # The common case, kept cheap: NSP splits whole documents.
      pieces.append(sentence)
      continue
    for start in range(0, len(sentence), max_len):
      pieces.append(sentence[start:start + max_len])
  return pieces


def truncate_seq_pair(len_a: int, len_b: int, max_num_tokens: int,
                      rng: np.random.Generator) -> tuple[tuple[int, int], tuple[int, int]]:
  """BERT's truncate_seq_pair, in closed form: ((a_front, a_back), (b_front, b_back)) cuts.

  BERT removes one token at a time from the longer segment (B on ties), from the front or the
  back with probability 1/2 each. The number removed from each segment is therefore fixed, and
  the front/back split of each is Binomial(removed, 1/2); drawing that directly avoids a Python
  loop over possibly hundreds of tokens.
  """
  excess = len_a + len_b - max_num_tokens
  cut_a = cut_b = 0
  if excess > 0:
    if len_a > len_b:
      cut_a = min(excess, len_a - len_b)
    else:
      cut_b = min(excess, len_b - len_a)
    rest = excess - cut_a - cut_b
    cut_b += (rest + 1) // 2
    cut_a += rest // 2
  front_a = int(rng.binomial(cut_a, 0.5)) if cut_a else 0
  front_b = int(rng.binomial(cut_b, 0.5)) if cut_b else 0
  return (front_a, cut_a - front_a), (front_b, cut_b - front_b)


def _target_length(max_num_tokens: int, short_seq_prob: float, rng: np.random.Generator) -> int:
  # BERT sometimes uses shorter sequences to lessen the pretrain/fine-tune length mismatch.
  if short_seq_prob > 0 and rng.random() < short_seq_prob:
    return int(rng.integers(2, max_num_tokens + 1))
  return max_num_tokens


def _pair_instances(documents: Documents, doc_index: int, max_seq_length: int,
                    rng: np.random.Generator, short_seq_prob: float, special: SpecialIds,
                    order_prediction: bool) -> list[Instance]:
  """BERT's create_instances_from_document (NSP), or ALBERT's sentence-order variant.

  Pieces are accumulated into a chunk until the target length; the chunk is split at a random
  piece boundary into A and B. Unlike BERT, a chunk is only closed with at least 2 pieces and a
  lone last piece joins the chunk before it, so every pair has a real continuation (BERT falls
  back to a random B for one-piece chunks, which skews the labels).
  """
  max_num_tokens = max_seq_length - 3
  pieces = split_long_sentences(documents[doc_index], max_num_tokens)
  if len(pieces) < 2:
    return []
  if not order_prediction and len(documents) < 2:
    raise UserError("NSP needs at least 2 documents to draw random next segments; the corpus "
                    "has 1; use sop/full/single or add documents")
  target = _target_length(max_num_tokens, short_seq_prob, rng)
  last = len(pieces) - 1
  instances = []
  chunk: list[int] = []
  chunk_len = 0
  i = 0
  while i <= last:
    chunk.append(i)
    chunk_len += len(pieces[i])
    close = i == last or (chunk_len >= target and len(chunk) >= 2 and i + 1 != last)
    if close:
      if len(chunk) < 2:
        # Only after an NSP put-back: one piece is left and has no partner in this document.
        break
      a_end = int(rng.integers(1, len(chunk)))  # A gets pieces chunk[:a_end], at least one.
      first = chunk[0]
      split = first + a_end
      tokens_a = np.concatenate(pieces[first:split])
      segment_a = Segment(doc_index, first, split)
      label = 0
      tokens_b = segment_b = None
      if not order_prediction and rng.random() < 0.5:
        random_b = _random_next(documents, doc_index, max_num_tokens,
                                target - len(tokens_a), rng)
        if random_b is not None:
          tokens_b, segment_b = random_b
          label = 1
          # The pieces of the chunk not used as A are put back for the next chunk.
          i = split - 1
      if tokens_b is None:
        tokens_b = np.concatenate(pieces[split:chunk[-1] + 1])
        segment_b = Segment(doc_index, split, chunk[-1] + 1)
      if order_prediction and rng.random() < 0.5:
        tokens_a, tokens_b, segment_a, segment_b = tokens_b, tokens_a, segment_b, segment_a
        label = 1
      instances.append(_pair_instance(tokens_a, tokens_b, segment_a, segment_b, label,
                                      max_num_tokens, rng, special))
      chunk, chunk_len = [], 0
      target = _target_length(max_num_tokens, short_seq_prob, rng)
    i += 1
  return instances


def _random_next(documents: Documents, doc_index: int, max_num_tokens: int, target_b: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, Segment] | None:
  """B for a negative NSP pair: text from a random start in a random other document."""
  # Like BERT, retry a few times when the drawn document has no text; give up rather than scan
  # the corpus (the caller then uses the actual continuation).
  for _ in range(10):
    other = int(rng.integers(len(documents) - 1))
    other += other >= doc_index  # Uniform over the documents other than doc_index.
    pieces = split_long_sentences(documents[other], max_num_tokens)
    if not pieces:
      continue
    start = int(rng.integers(len(pieces)))
    end = start
    length = 0
    while end < len(pieces) and (end == start or length < target_b):
      length += len(pieces[end])
      end += 1
    return np.concatenate(pieces[start:end]), Segment(other, start, end)
  return None


def _pair_instance(tokens_a: np.ndarray, tokens_b: np.ndarray, segment_a: Segment,
                   segment_b: Segment, label: int, max_num_tokens: int,
                   rng: np.random.Generator, special: SpecialIds) -> Instance:
  (fa, ba), (fb, bb) = truncate_seq_pair(len(tokens_a), len(tokens_b), max_num_tokens, rng)
  tokens_a = tokens_a[fa:len(tokens_a) - ba]
  tokens_b = tokens_b[fb:len(tokens_b) - bb]
  input_ids = np.concatenate([[special.cls], tokens_a, [special.sep], tokens_b,
                              [special.sep]]).astype(np.int32)
  token_type_ids = np.zeros(len(input_ids), np.int32)
  token_type_ids[len(tokens_a) + 2:] = 1
  return {
      "input_ids": input_ids,
      "token_type_ids": token_type_ids,
      "length": len(input_ids),
      "next_sentence_label": label,
      "segments": [segment_a._replace(trim_front=fa, trim_back=ba),
                   segment_b._replace(trim_front=fb, trim_back=bb)],
  }


def nsp_instances(documents: Documents, doc_index: int, max_seq_length: int,
                  rng: np.random.Generator, short_seq_prob: float = 0.1, *,
                  special: SpecialIds) -> list[Instance]:
  """BERT next-sentence-prediction pairs from document `doc_index`.

  Returns a list of dicts: input_ids / token_type_ids `<int32>[length]` ([CLS] A [SEP] has type
  0, B [SEP] type 1), length, next_sentence_label (0 = B is the actual next text, 1 = B is from
  another document) and segments, the two `Segment`s (A, B) the text came from. A document with
  fewer than 2 pieces gives no instances.
  """
  return _pair_instances(documents, doc_index, max_seq_length, rng, short_seq_prob, special,
                         order_prediction=False)


def sop_instances(documents: Documents, doc_index: int, max_seq_length: int,
                  rng: np.random.Generator, short_seq_prob: float = 0.1, *,
                  special: SpecialIds) -> list[Instance]:
  """ALBERT sentence-order-prediction pairs: as `nsp_instances`, both segments consecutive text of
  the document, in order (label 0) or swapped (label 1); segments are listed as placed."""
  return _pair_instances(documents, doc_index, max_seq_length, rng, short_seq_prob, special,
                         order_prediction=True)


def _single_instance(tokens: np.ndarray, segments: list[Segment],
                     special: SpecialIds) -> Instance:
  input_ids = np.concatenate([[special.cls], tokens, [special.sep]]).astype(np.int32)
  return {
      "input_ids": input_ids,
      "token_type_ids": np.zeros(len(input_ids), np.int32),
      "length": len(input_ids),
      "next_sentence_label": 0,
      "segments": segments,
  }


def single_segment_instances(documents: Documents, doc_index: int, max_seq_length: int,
                             rng: np.random.Generator, short_seq_prob: float = 0.0, *,
                             special: SpecialIds) -> list[Instance]:
  """SpanBERT single segments: [CLS] text [SEP] with consecutive whole pieces of one document,
  as many as fit in max_seq_length (or a shorter target with probability short_seq_prob)."""
  max_num_tokens = max_seq_length - 2
  pieces = split_long_sentences(documents[doc_index], max_num_tokens)
  instances = []
  start = 0
  target = _target_length(max_num_tokens, short_seq_prob, rng)
  length = 0
  for i, piece in enumerate(pieces):
    if i > start and (length + len(piece) > max_num_tokens or length >= target):
      instances.append(_single_instance(np.concatenate(pieces[start:i]),
                                        [Segment(doc_index, start, i)], special))
      start, length = i, 0
      target = _target_length(max_num_tokens, short_seq_prob, rng)
    length += len(piece)
  if pieces:
    instances.append(_single_instance(np.concatenate(pieces[start:]),
                                      [Segment(doc_index, start, len(pieces))], special))
  return instances


def full_sentences_instances(documents: Documents, doc_order: Sequence[int], max_seq_length: int,
                             start: Cursor = (0, 0), *, special: SpecialIds,
                             stats: InstanceStats | None = None) -> Iterator[Instance]:
  """RoBERTa FULL-SENTENCES: packs whole pieces of the documents, in `doc_order`, into
  [CLS] text [SEP] sequences of at most max_seq_length, continuing into the next document with
  an extra [SEP] between documents.

  Starts at `start` = (position in doc_order, piece index). Each instance has `segments` (one
  `Segment` per document it uses), `start` (its own cursor) and `next` (the cursor of the next
  instance), so a walk can be resumed exactly.
  """
  capacity = max_seq_length - 2
  position, piece_index = start
  parts: list[np.ndarray] = []
  segments: list[Segment] = []
  length = 0
  instance_start = start
  while position < len(doc_order):
    doc = int(doc_order[position])
    pieces = split_long_sentences(documents[doc], capacity)
    if stats is not None and piece_index == 0:
      stats.documents += 1
      stats.usable_documents += bool(pieces)
    i = piece_index
    while i < len(pieces):
      # A new document after text in this instance costs one extra [SEP].
      extra = 1 if segments and segments[-1].doc != doc else 0
      if parts and length + extra + len(pieces[i]) > capacity:
        yield _full_instance(parts, segments, instance_start, (position, i), special)
        parts, segments, length = [], [], 0
        continue
      if not parts:
        instance_start = (position, i)
      if extra:
        parts.append(np.array([special.sep], np.int32))
      parts.append(pieces[i])
      length += extra + len(pieces[i])
      if segments and segments[-1].doc == doc:
        segments[-1] = segments[-1]._replace(end=i + 1)
      else:
        segments.append(Segment(doc, i, i + 1))
      i += 1
    position, piece_index = position + 1, 0
  if parts:
    yield _full_instance(parts, segments, instance_start, (len(doc_order), 0), special)


def _full_instance(parts: list[np.ndarray], segments: list[Segment], start: Cursor,
                   next_cursor: Cursor, special: SpecialIds) -> Instance:
  instance = _single_instance(np.concatenate(parts), list(segments), special)
  instance["start"] = start
  instance["next"] = next_cursor
  return instance


_BUILDERS: dict[str, Callable[..., list[Instance]]] = {
    "nsp": nsp_instances,
    "sop": sop_instances,
    "single": single_segment_instances,
}
_DEFAULT_SHORT_SEQ_PROB = {"nsp": 0.1, "sop": 0.1, "single": 0.0, "full": 0.0}
_REQUIREMENT = {
    "nsp": "NSP needs documents with at least 2 sentences",
    "sop": "SOP needs documents with at least 2 sentences",
    "single": "single-segment instances need documents with at least 1 non-empty sentence",
    "full": "FULL-SENTENCES needs documents with at least 1 non-empty sentence",
}


def check_kind(kind: str, max_seq_length: int) -> None:
  if kind not in KINDS:
    raise UserError(f"unknown instance kind {kind!r}; use one of {', '.join(KINDS)}")
  minimum = 5 if kind in ("nsp", "sop") else 3
  if max_seq_length < minimum:
    raise UserError(f"max_seq_length={max_seq_length} is too short for {kind} (needs >= "
                    f"{minimum}: special tokens plus text); use e.g. 128 or 512")


def shard_documents(num_documents: int, seed: int, epoch: int, shard_index: int = 0,
                    shard_count: int = 1) -> np.ndarray:
  """`<int64>[n]`: this shard's documents (every shard_count-th, from shard_index) in the
  epoch's shuffled order. Shards are disjoint and together cover the corpus."""
  if shard_count < 1 or not 0 <= shard_index < shard_count:
    raise UserError(f"shard_index={shard_index} must be in [0, shard_count={shard_count}); "
                    "pass the process index and process count")
  if seed < 0 or epoch < 0:
    raise UserError(f"seed={seed} and epoch={epoch} must be >= 0; use a non-negative seed")
  if num_documents == 0:
    raise UserError("the corpus has no documents; check the prepared corpus path")
  docs = np.arange(shard_index, num_documents, shard_count)
  if not len(docs):
    raise UserError(f"shard {shard_index} of {shard_count} has no documents: the corpus has "
                    f"only {num_documents}; use fewer shards or a bigger corpus")
  rng = np.random.default_rng([seed, epoch, shard_index, shard_count, _ORDER_TAG])
  return rng.permutation(docs)


def walk_epoch(documents: Documents, kind: str, max_seq_length: int, seed: int, epoch: int,
               shard_index: int = 0, shard_count: int = 1, *,
               special: SpecialIds, short_seq_prob: float | None = None,
               start: Cursor = (0, 0),
               stats: InstanceStats | None = None) -> Iterator[tuple[Instance, Cursor]]:
  """Yields (instance, cursor after it) for one epoch of one shard, from cursor `start`.

  Each instance gets `doc_index` (its first document) and `example_key`, a pair of ints naming
  it uniquely within the epoch and independently of sharding (the pipeline seeds its masking
  from it). Resuming from a yielded cursor continues with exactly the instances that followed.
  Raises `UserError` when a whole epoch yields nothing, saying why.
  """
  check_kind(kind, max_seq_length)
  if short_seq_prob is None:
    short_seq_prob = _DEFAULT_SHORT_SEQ_PROB[kind]
  order = shard_documents(len(documents), seed, epoch, shard_index, shard_count)
  stats = stats if stats is not None else InstanceStats()
  emitted = 0
  if kind == "full":
    for instance in full_sentences_instances(documents, order, max_seq_length, start,
                                             special=special, stats=stats):
      first = instance["segments"][0]
      instance["doc_index"] = first.doc
      instance["example_key"] = (first.doc, first.start)
      emitted += 1
      stats.instances += 1
      yield instance, instance["next"]
  else:
    builder = _BUILDERS[kind]
    position, skip = start
    for position in range(position, len(order)):
      doc = int(order[position])
      rng = np.random.default_rng([seed, epoch, doc])
      instances = builder(documents, doc, max_seq_length, rng, short_seq_prob, special=special)
      if skip == 0:
        stats.documents += 1
        stats.usable_documents += bool(instances)
      for k in range(skip, len(instances)):
        instance = instances[k]
        instance["doc_index"] = doc
        instance["example_key"] = (doc, k)
        emitted += 1
        stats.instances += 1
        yield instance, (position, k + 1)
      skip = 0
  if emitted == 0 and tuple(start) == (0, 0):
    where = f" in shard {shard_index} of {shard_count}" if shard_count > 1 else ""
    raise UserError(f"{_REQUIREMENT[kind]}; {stats.usable_documents} of {stats.documents} "
                    f"documents{where} qualify; use a corpus with such documents or another "
                    "kind")
