"""Sequence packing: several short instances share one row, kept apart by segment ids.

Single-segment data (SpanBERT) ends every document with a short instance, and a share of all
instances are shortened on purpose (short_seq_prob); padded to max_seq_length, that padding is
compute spent on nothing. Packing puts several instances into one row of max_seq_length: the row
carries `segment_ids` (1, 2, ... per instance, 0 on padding), and the encoder lets each token
attend only within its own instance and restarts position ids per instance, so a packed instance
is computed exactly as it would be alone (tests/test_packing.py checks this).

Rows are filled first-fit over a group of `num_bins` open rows: each instance goes into the first
row with room left; when an instance fits in none, the group's rows are emitted in order and that
instance opens the next group. Instances are packed before masking, so the masking budget is per
row and spans never cross an instance's [SEP]/[CLS] (special tokens end spans).

Resuming is exact: the iterator's state is the instance stream's state where the current group
started plus how many of the group's rows were emitted; restoring reads the group again (the
stream is deterministic) and skips those rows.

(grain's own packers pack fixed features of arrays; ours packs whole instances so that masking can
run on the packed row with a seed from the instance's key.)
"""

from __future__ import annotations

import copy
from typing import Any

import grain
import numpy as np

from bertjax.data.instances import Instance
from bertjax.core.errors import UserError

# Kinds whose instances can share a row: they carry no per-instance label read from [CLS].
PACKABLE_KINDS = ("single",)


def check_packing(kind: str, num_bins: int) -> None:
  if kind not in PACKABLE_KINDS:
    why = ("FULL-SENTENCES rows are already filled with contiguous text" if kind == "full" else
           "its sentence-pair label is read from each row's [CLS], one label per row")
    raise UserError(f"data.pack=True is for single-segment data (objective span_sbo), not "
                    f"kind {kind!r}: {why}; set --config.data.pack=False")
  if num_bins < 1:
    raise UserError(f"data.pack_bins={num_bins} must be >= 1 (rows filled at once; e.g. 64)")


def pack_instances(instances: list[Instance]) -> Instance:
  """One row from instances whose lengths sum to at most the row length (not padded).

  The result has the instances' input_ids / token_type_ids concatenated, segment_ids
  `<int32>[length]` numbering them from 1, their `segments` in order, and the first instance's
  example_key, epoch and doc_index (the row's masking seed comes from its first instance, which
  belongs to no other row).
  """
  first = instances[0]
  return {
      "input_ids": np.concatenate([i["input_ids"] for i in instances]).astype(np.int32),
      "token_type_ids": np.concatenate([i["token_type_ids"] for i in instances]).astype(np.int32),
      "segment_ids": np.concatenate([np.full(i["length"], k + 1, np.int32)
                                     for k, i in enumerate(instances)]),
      "length": sum(i["length"] for i in instances),
      "next_sentence_label": 0,
      "segments": [s for i in instances for s in i["segments"]],
      "num_instances": len(instances),
      "doc_index": first["doc_index"],
      "example_key": first["example_key"],
      "epoch": first["epoch"],
  }


class PackedDataset(grain.IterDataset):
  """Rows of packed instances from an `IterDataset` of unpadded instances."""

  def __init__(self, parent: grain.IterDataset, *, max_seq_length: int, num_bins: int):
    super().__init__(parent)
    self.max_seq_length = max_seq_length
    self.num_bins = num_bins

  def __iter__(self) -> "_PackIterator":
    return _PackIterator(self._parent.__iter__(), self.max_seq_length, self.num_bins)


class _PackIterator(grain.DatasetIterator):
  """First-fit over groups of num_bins rows; see the module docstring for the state."""

  def __init__(self, parent: grain.DatasetIterator, max_seq_length: int, num_bins: int):
    super().__init__(parent)
    self._max_len = max_seq_length
    self._num_bins = num_bins
    self._group_state = copy.deepcopy(parent.get_state())  # where the current group starts
    self._next_group_state = self._group_state
    self._rows: list[list[Instance]] | None = []
    self._emitted = 0
    self._pending: Instance | None = None  # the instance that opens the next group
    self._exhausted = False

  def _fill(self) -> None:
    rows: list[list[Instance]] = []
    room: list[int] = []
    while True:
      if self._pending is not None:
        instance, self._pending = self._pending, None
      else:
        before = copy.deepcopy(self._parent.get_state())
        try:
          instance = next(self._parent)
        except StopIteration:
          self._exhausted = True
          break
      length = instance["length"]
      if length > self._max_len:
        raise UserError(f"an instance of {length} tokens does not fit max_seq_length="
                        f"{self._max_len}; build instances with the same max_seq_length")
      for i, free in enumerate(room):
        if length <= free:
          rows[i].append(instance)
          room[i] -= length
          break
      else:
        if len(rows) < self._num_bins:
          rows.append([instance])
          room.append(self._max_len - length)
        else:
          self._pending = instance
          self._next_group_state = before
          break
    self._rows = rows

  def __next__(self) -> Instance:
    if self._rows is None:  # restored: read the group again and skip what was emitted
      skip = self._emitted
      self._fill()
      self._emitted = min(skip, len(self._rows))
    while self._emitted >= len(self._rows):
      if self._exhausted:
        raise StopIteration
      self._group_state = self._next_group_state
      self._fill()
      self._emitted = 0
    row = self._rows[self._emitted]
    self._emitted += 1
    return pack_instances(row)

  def get_state(self) -> dict[str, Any]:
    return {"group": copy.deepcopy(self._group_state), "emitted": self._emitted}

  def set_state(self, state: dict[str, Any]) -> None:
    try:
      group, emitted = state["group"], int(state["emitted"])
    except (KeyError, TypeError, ValueError) as e:
      raise UserError(f"input pipeline state {state!r} is not from a packed pipeline ({e}); "
                      "resume with the data.pack setting the checkpoint was written with") from None
    self._parent.set_state(group)
    self._group_state = self._next_group_state = copy.deepcopy(group)
    self._pending = None
    self._exhausted = False
    self._rows = None
    self._emitted = emitted
