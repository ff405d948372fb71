"""The grain input pipeline for pretraining: documents -> instances -> masked, padded batches.

  documents --(_InstanceDataset: epochs of `instances.walk_epoch`)--> instances
            [--(packing.PackedDataset, when pack=True: several instances per row)--> rows]
            [--(_NumberedDataset, with a masking-rate schedule: each row's index)--> rows]
            --map(_Featurize: pad to max_seq_length, dynamic masking)--> examples
            --batch(batch_size)--> batches of numpy arrays

The number of instances per document varies, which grain's MapDataset cannot express, so the
instance stream is a custom `grain.IterDataset` over our own epoch generator. Its iterator state
is (epoch, position in the epoch's shuffled document order, instances of that document already
produced); `map` and `batch` pass that state through, so `get_state()` / `set_state()` on the
returned iterator resume exactly, and the state is a small JSON-able dict fit for a checkpoint.

Masking is dynamic: every example is masked with a generator seeded from (seed, epoch,
example_key), where example_key names the instance within the epoch independently of sharding,
so masks change every epoch yet a given seed and step always give the same batch.
Shards (one per process) split every global batch: shard k of n takes its k-th block of rows of the
batches one process would read with n times the batch size, so n processes read together what
one reads, each row once, and a checkpoint's input state (taken between batches) is the same in
every process and resumes under any process count with the same global batch.
A masking-rate schedule masks each row at the rate of the training step it lands in, read from
the row's index in the stream (kept in the iterator state, so a resumed run masks as before).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

import grain
import numpy as np

from bertjax.data import packing
from bertjax.data import instances
from bertjax.core.errors import UserError
from bertjax.data.masking import Masking, SpecialIds

# Keeps the masking seeds apart from the instance seeds [seed, epoch, doc_index].
_MASK_TAG = 0x4D41534B


@dataclasses.dataclass(frozen=True)
class Instances:
  """Which rows the pipeline builds from the documents.

  Attributes:
    kind: 'nsp', 'sop', 'full' or 'single' (see `bertjax.data.instances`).
    max_seq_length: L, the padded sequence length.
    short_seq_prob: probability of a shorter target length (None: 0.1 for nsp/sop, else 0).
    pack: put several instances into each row (kind 'single'; see `bertjax.data.packing`).
    pack_bins: rows filled at once when packing (first-fit over that many rows).
  """

  kind: str
  max_seq_length: int
  short_seq_prob: float | None = None
  pack: bool = False
  pack_bins: int = 64

  def check(self) -> None:
    """Raises `UserError` for a kind, length or packing the pipeline cannot build."""
    instances.check_kind(self.kind, self.max_seq_length)
    if self.pack:
      packing.check_packing(self.kind, self.pack_bins)


class _InstanceDataset(grain.IterDataset):
  """Unpadded instances of `num_epochs` epochs (forever if None) of one shard."""

  def __init__(self, documents: instances.Documents, settings: Instances, *, seed: int,
               special: SpecialIds, shard_index: int, shard_count: int,
               num_epochs: int | None):
    super().__init__()
    self.documents = documents
    self.settings = settings
    self.seed = seed
    self.special = special
    self.shard_index = shard_index
    self.shard_count = shard_count
    self.num_epochs = num_epochs

  def __iter__(self) -> "_InstanceIterator":
    return _InstanceIterator(self)


class _InstanceIterator(grain.DatasetIterator):
  """Walks epoch after epoch; its state is the cursor of the next instance."""

  def __init__(self, dataset: _InstanceDataset):
    super().__init__()
    self._ds = dataset
    self._epoch = 0
    self._cursor: instances.Cursor = (0, 0)
    self._walk = None

  def __next__(self) -> instances.Instance:
    ds = self._ds
    while ds.num_epochs is None or self._epoch < ds.num_epochs:
      if self._walk is None:
        self._walk = instances.walk_epoch(
            ds.documents, ds.settings.kind, ds.settings.max_seq_length, ds.seed, self._epoch,
            ds.shard_index, ds.shard_count, special=ds.special,
            short_seq_prob=ds.settings.short_seq_prob, start=self._cursor)
      try:
        instance, self._cursor = next(self._walk)
      except StopIteration:
        self._epoch += 1
        self._cursor = (0, 0)
        self._walk = None
        continue
      instance["epoch"] = self._epoch
      return instance
    raise StopIteration

  def get_state(self) -> dict[str, Any]:
    return {"epoch": self._epoch, "position": int(self._cursor[0]),
            "index": int(self._cursor[1])}

  def set_state(self, state: dict[str, Any]) -> None:
    try:
      self._epoch = int(state["epoch"])
      self._cursor = (int(state["position"]), int(state["index"]))
    except (KeyError, TypeError, ValueError) as e:
      raise UserError(f"input pipeline state {state!r} is not from this pipeline ({e}); restore "
                      "a checkpoint written by make_pretraining_iterator") from None
    self._walk = None


class _NumberedDataset(grain.IterDataset):
  """The parent's rows, each with its index in the stream as "row"."""

  def __iter__(self) -> "_NumberedIterator":
    return _NumberedIterator(self._parent.__iter__())


class _NumberedIterator(grain.DatasetIterator):
  """Its state: the parent's and how many rows came out."""

  def __init__(self, parent: grain.DatasetIterator):
    super().__init__(parent)
    self._rows = 0

  def __next__(self) -> instances.Instance:
    row = {**next(self._parent), "row": self._rows}
    self._rows += 1
    return row

  def get_state(self) -> dict[str, Any]:
    return {"numbered": copy.deepcopy(self._parent.get_state()), "rows": self._rows}

  def set_state(self, state: dict[str, Any]) -> None:
    if "numbered" not in state:
      raise UserError("the checkpoint's input state is from a run without a masking-rate "
                      "schedule; resume with the masking.rate_schedule it was written with")
    self._parent.set_state(state["numbered"])
    self._rows = int(state["rows"])


class _ShareDataset(grain.IterDataset):
  """This process's rows of the parent's stream: of every `group` rows (one global batch) the
  rows [lo, hi). Rows are featurized after this, so a process pads and masks only its own."""

  def __init__(self, parent: grain.IterDataset, *, group: int, lo: int, hi: int):
    super().__init__(parent)
    self.group, self.lo, self.hi = group, lo, hi

  def __iter__(self) -> "_ShareIterator":
    return _ShareIterator(self._parent.__iter__(), self.group, self.lo, self.hi)


class _ShareIterator(grain.DatasetIterator):
  """After its last row of a group it reads past the others' rows to the group's end, so its
  state, taken between batches, is the parent's at a global batch boundary: the same in every
  process, and what a run of another process count resumes from."""

  def __init__(self, parent: grain.DatasetIterator, group: int, lo: int, hi: int):
    super().__init__(parent)
    self._group, self._lo, self._hi = group, lo, hi
    self._at = 0  # the position within the current group

  def __next__(self):
    while self._at < self._lo:
      next(self._parent)
      self._at += 1
    row = next(self._parent)
    self._at += 1
    if self._at == self._hi:
      try:
        while self._at < self._group:
          next(self._parent)
          self._at += 1
      except StopIteration:  # the stream's last, partial group
        pass
      self._at = 0
    return row

  def get_state(self) -> dict[str, Any]:
    return self._parent.get_state()

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state)
    self._at = 0


class _Featurize:
  """Pads an instance to max_seq_length and masks it; the result is all numpy arrays. With
  `step_of_row`, a numbered row is masked at the rate of the step it is trained in."""

  def __init__(self, *, max_seq_length: int, seed: int, special: SpecialIds, masking: Masking,
               word_start_mask: np.ndarray | None,
               step_of_row: Callable[[int], int] | None = None):
    self.max_seq_length = max_seq_length
    self.seed = seed
    self.special = special
    self.masking = masking
    self.word_start_mask = word_start_mask
    self.step_of_row = step_of_row

  def __call__(self, instance: instances.Instance) -> dict[str, np.ndarray]:
    length = instance["length"]
    input_ids = np.full(self.max_seq_length, self.special.pad, np.int32)
    input_ids[:length] = instance["input_ids"]
    token_type_ids = np.zeros(self.max_seq_length, np.int32)
    token_type_ids[:length] = instance["token_type_ids"]
    attention_mask = np.zeros(self.max_seq_length, np.int32)
    attention_mask[:length] = 1
    key = instance["example_key"]
    rng = np.random.default_rng([self.seed, instance["epoch"], key[0], key[1], _MASK_TAG])
    step = None if self.step_of_row is None else self.step_of_row(instance["row"])
    example = self.masking.mask(input_ids, self.special, rng,
                                word_start_mask=self.word_start_mask, step=step)
    example["token_type_ids"] = token_type_ids
    example["attention_mask"] = attention_mask
    example["next_sentence_label"] = np.int32(instance["next_sentence_label"])
    if "segment_ids" in instance:  # a packed row
      segment_ids = np.zeros(self.max_seq_length, np.int32)
      segment_ids[:length] = instance["segment_ids"]
      example["segment_ids"] = segment_ids
    return example


def _check_stream(num_documents: int, *, batch_size: int, seed: int, shard_index: int,
                  shard_count: int, num_epochs: int | None) -> None:
  """Refuses a bad batch size, epoch count, shard or seed before the first batch."""
  if batch_size < 1:
    raise UserError(f"batch_size={batch_size} must be >= 1 (it is the per-process batch size)")
  if num_epochs is not None and num_epochs < 1:
    raise UserError(f"num_epochs={num_epochs} must be >= 1, or None to repeat forever")
  instances.shard_documents(num_documents, seed, 0, shard_index, shard_count)


def make_pretraining_dataset(
    documents: instances.Documents, rows: Instances, masking: Masking, *, batch_size: int,
    seed: int, special: SpecialIds, word_start_mask: np.ndarray | None = None,
    shard_index: int = 0, shard_count: int = 1, num_epochs: int | None = None,
    drop_remainder: bool = True,
    step_of_row: Callable[[int], int] | None = None) -> grain.IterDataset:
  """The pretraining `grain.IterDataset` of batches.

  Args:
    documents: random-access sequence of documents (lists of `<int32>[len]` sentences).
    rows: which rows are built (kind, max_seq_length L, packing; see `Instances`).
    masking: how they are masked (`bertjax.data.masking.Masking`; max_predictions is P); with a
      rate_schedule, each row is masked at the rate of the step it is trained in.
    batch_size: B, per process.
    seed: non-negative; with the step it determines every batch.
    special: special token ids and vocabulary size.
    word_start_mask: `<bool>[vocab]`, needed for word-level masking strategies.
    shard_index, shard_count: this process's share: rows [shard_index * B, (shard_index + 1) * B)
      of every global batch of shard_count * B rows, the batches one process with that batch
      size reads (the processes together read each row once).
    num_epochs: stop after this many epochs; None repeats forever.
    drop_remainder: drop a last partial batch (only reachable with num_epochs).
    step_of_row: the (0-based) step a row of the global stream is trained in; None: row //
      (batch_size * shard_count).

  Returns:
    A dataset of dicts: input_ids, token_type_ids, attention_mask `<int32>[B, L]`;
    masked_positions, masked_ids `<int32>[B, P]`; masked_weights `<float32>[B, P]`;
    next_sentence_label `<int32>[B]` (0 for full/single); and for strategy='span' span_left,
    span_right, span_offset `<int32>[B, P]`; when packing, segment_ids `<int32>[B, L]` (1, 2, ...
    per instance in the row, 0 on padding).
  """
  rows.check()
  _check_stream(len(documents), batch_size=batch_size, seed=seed, shard_index=shard_index,
                shard_count=shard_count, num_epochs=num_epochs)
  masking.check(special, word_start_mask)
  if word_start_mask is not None:
    word_start_mask = np.asarray(word_start_mask, bool)
  # Every process walks the one stream of a single process with the global batch (cheap: no
  # padding or masking) and keeps its rows of each global batch.
  dataset = _InstanceDataset(documents, rows, seed=seed, special=special, shard_index=0,
                             shard_count=1, num_epochs=num_epochs)
  if rows.pack:
    dataset = packing.PackedDataset(dataset, max_seq_length=rows.max_seq_length,
                                    num_bins=rows.pack_bins)
  global_batch = batch_size * shard_count
  if masking.rate_schedule:
    dataset = _NumberedDataset(dataset)  # numbered in the global stream
    step_of_row = step_of_row or (lambda row: row // global_batch)
  else:
    step_of_row = None
  if shard_count > 1:
    dataset = _ShareDataset(dataset, group=global_batch, lo=shard_index * batch_size,
                            hi=(shard_index + 1) * batch_size)
  featurize = _Featurize(max_seq_length=rows.max_seq_length, seed=seed, special=special,
                         masking=masking, word_start_mask=word_start_mask,
                         step_of_row=step_of_row)
  return dataset.map(featurize).batch(batch_size, drop_remainder=drop_remainder)


def make_pretraining_iterator(*args, **kwargs) -> grain.DatasetIterator:
  """`iter(make_pretraining_dataset(...))`, with the same arguments: an iterator of pretraining
  batches with exact checkpoint/resume through its get_state/set_state."""
  return iter(make_pretraining_dataset(*args, **kwargs))
