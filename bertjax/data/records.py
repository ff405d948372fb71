"""The on-disk format of a prepared (tokenized) pretraining corpus.

A prepared corpus is a folder:
  meta.json                         counts, shard names, tokenizer summary
  tokenizer/                        the tokenizer files used (loadable by `tokenizers.load_tokenizer`)
  docs-00000-of-00004.array_record  one record per document

A document record is a flat little-endian int32 array:
  [num_sentences, len_0, ..., len_{n-1}, ids of sentence 0..., ids of sentence 1..., ...]
so a reader gets the sentence boundaries BERT's pair construction needs without any parsing.
"""

from __future__ import annotations

import numpy as np

META_FILE = "meta.json"
TOKENIZER_DIR = "tokenizer"


def shard_name(index: int, count: int) -> str:
  return f"docs-{index:05d}-of-{count:05d}.array_record"


def encode_document(sentences: list[np.ndarray] | list[list[int]]) -> bytes:
  """Serializes a document given as a list of sentences of token ids."""
  lengths = [len(s) for s in sentences]
  parts = [np.asarray([len(sentences)] + lengths, dtype="<i4")]
  parts += [np.asarray(s, dtype="<i4") for s in sentences]
  return np.concatenate(parts).tobytes()


def decode_document(record: bytes) -> list[np.ndarray]:
  """Inverse of `encode_document`: a list of `<int32>[len_i]` sentence arrays."""
  flat = np.frombuffer(record, dtype="<i4")
  n = int(flat[0])
  lengths = flat[1:1 + n]
  ends = np.cumsum(lengths) + 1 + n
  starts = ends - lengths
  return [flat[s:e].astype(np.int32) for s, e in zip(starts, ends)]
