"""Corpus preparation: raw text -> tokenized ArrayRecord shards (format in `records.py`).

Tokenizing once, ahead of training, keeps the input pipeline cheap and makes every run see the
same ids. `prepare_corpus` reads documents from a source (`sources.py`), tokenizes each sentence
once in worker processes, drops sentences and documents that tokenize to nothing (counts are
logged and kept in meta.json), and writes document i to shard i % num_shards, so the output does
not depend on the number of workers. Everything is written into a hidden staging folder next to
the output; meta.json is written last and the folder is renamed into place only on success, so a
crashed or interrupted run never leaves an output that looks complete.

`PreparedCorpus(dir)` reads it back by random access: `corpus[i]` is document i (in source order)
as a list of int32 sentence arrays.

Command line:
  python -m bertjax.data.prepare --input 'wiki/*.txt' --format bert --tokenizer tok/ \
      --output prepared/ [--num_shards 8] [--num_workers N]
  python -m bertjax.data.prepare --tfds wikipedia/20230601.en --split train --data_dir ~/tfds \
      --train_tokenizer 32000 --output prepared/
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import logging
import multiprocessing
import os
import pathlib
import shutil
from typing import Iterable, Iterator, Sequence

import numpy as np
import tqdm
from array_record.python import array_record_data_source
from array_record.python import array_record_module

from bertjax.core import errors, paths
from bertjax.data import records, sources, tokenizers

_log = logging.getLogger("bertjax.data.prepare")  # not __name__: that is __main__ under -m

FORMAT_VERSION = 1
# Documents per task sent to a worker: large enough to amortize inter-process traffic, small
# enough to keep all workers busy and memory bounded.
_CHUNK_DOCUMENTS = 64
# Random access wants one record per chunk (no decompressing neighbours to read one document).
_WRITER_OPTIONS = "group_size:1"


@dataclasses.dataclass
class _Counts:
  documents: int = 0
  sentences: int = 0
  tokens: int = 0
  empty_sentences: int = 0
  empty_documents: int = 0

  def add(self, other: _Counts) -> None:
    for f in dataclasses.fields(self):
      setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def _tokenize_documents(tokenizer: tokenizers.Tokenizer,
                        documents: Sequence[Sequence[str]]) -> tuple[list[bytes], _Counts]:
  """Tokenizes a chunk of documents into document records, dropping empty sentences/documents."""
  counts = _Counts()
  out = []
  for doc in documents:
    ids = tokenizer.encode_batch(list(doc))
    sentences = [s for s in ids if s]
    counts.empty_sentences += len(ids) - len(sentences)
    if not sentences:
      counts.empty_documents += 1
      continue
    counts.documents += 1
    counts.sentences += len(sentences)
    counts.tokens += sum(len(s) for s in sentences)
    out.append(records.encode_document(sentences))
  return out, counts


_worker_tokenizer: tokenizers.Tokenizer | None = None


def _init_worker(tokenizer_dir: str) -> None:
  global _worker_tokenizer
  # Each worker is one of num_workers processes; the Rust tokenizers' own thread pool on top of
  # that would only oversubscribe the cores.
  os.environ["TOKENIZERS_PARALLELISM"] = "false"
  _worker_tokenizer = tokenizers.load_tokenizer(tokenizer_dir)


def _worker_tokenize(documents: Sequence[Sequence[str]]) -> tuple[list[bytes], _Counts]:
  assert _worker_tokenizer is not None, "worker not initialized"
  return _tokenize_documents(_worker_tokenizer, documents)


def _chunks(documents: Iterable[Sequence[str]], size: int,
            limit: int | None) -> Iterator[list[Sequence[str]]]:
  chunk: list[Sequence[str]] = []
  for i, doc in enumerate(documents):
    if limit is not None and i >= limit:
      break
    chunk.append(doc)
    if len(chunk) == size:
      yield chunk
      chunk = []
  if chunk:
    yield chunk


# Files of a training workdir, a model folder or a sweep (never of a prepared corpus).
_NOT_A_CORPUS = ("checkpoints", "config.json", "metrics.jsonl", "model.json", "params",
                 "sweep.json")


def _check_output(out_dir: pathlib.Path, overwrite: bool) -> None:
  if out_dir.exists():
    if not out_dir.is_dir():
      errors.fail(f"output {out_dir} is a file; choose another --output")
    if any(out_dir.iterdir()) and not overwrite:
      errors.fail(f"output {out_dir} already exists and is not empty; choose another --output or "
                  "pass --overwrite")
    # What --overwrite would delete with the folder: a training run, a model or a sweep.
    held = sorted(n for n in _NOT_A_CORPUS if (out_dir / n).exists())
    if overwrite and held:
      errors.fail(f"output {out_dir} holds {', '.join(held)}: a run, a model or a sweep, which "
                  "--overwrite would delete; choose another --output, a new folder")


def prepare_corpus(source: Iterable[Sequence[str]],
                   tokenizer: tokenizers.Tokenizer | str | os.PathLike,
                   out_dir: str | os.PathLike,
                   num_shards: int = 8,
                   num_workers: int | None = None,
                   *,
                   max_documents: int | None = None,
                   overwrite: bool = False,
                   progress: bool | None = None,
                   provenance: dict | None = None) -> dict:
  """Tokenizes `source` into a prepared corpus in `out_dir` and returns its meta.json contents.

  Args:
    source: documents as lists of sentence strings, e.g. a `sources.TextFileSource`.
    tokenizer: a Tokenizer, or a folder `tokenizers.load_tokenizer` reads.
    out_dir: the output folder; must not exist or be empty unless `overwrite`.
    num_shards: number of ArrayRecord files; document i goes to shard i % num_shards.
    num_workers: tokenizing processes (default: all cores); the output does not depend on it.
      More than one uses spawned processes, so a calling script needs the usual
      `if __name__ == "__main__":` guard.
    max_documents: stop after this many source documents (for samples and smoke runs).
    overwrite: replace an existing output (only once the new one is complete).
    progress: show a tqdm bar; None shows it only on a terminal.
    provenance: what the corpus is made from, recorded in meta.json (default: the source's own
      `provenance()`, e.g. its files' paths, sizes and sample hashes); see `changed_inputs`.
  """
  if num_shards < 1:
    errors.fail(f"--num_shards must be at least 1, got {num_shards}")
  num_workers = num_workers or os.cpu_count() or 1
  if num_workers < 1:
    errors.fail(f"--num_workers must be at least 1, got {num_workers}")
  if max_documents is not None and max_documents < 1:
    errors.fail(f"--max_documents must be at least 1, got {max_documents}")
  if not isinstance(tokenizer, tokenizers.Tokenizer):
    tokenizer = tokenizers.load_tokenizer(tokenizer)
  out_dir = pathlib.Path(out_dir)
  _check_output(out_dir, overwrite)
  out_dir.parent.mkdir(parents=True, exist_ok=True)
  # Hidden and clearly unfinished: nothing reads it as a corpus, and it is removed on failure.
  staging = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
  if staging.exists():
    shutil.rmtree(staging)
  staging.mkdir()
  try:
    meta = _prepare_into(staging, source, tokenizer, num_shards, num_workers, max_documents,
                         progress, provenance)
    _check_output(out_dir, overwrite)
    old = None
    if out_dir.exists() and any(out_dir.iterdir()):
      old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
      os.rename(out_dir, old)
    os.replace(staging, out_dir)  # atomic; an empty out_dir folder is replaced as well
    if old is not None:
      shutil.rmtree(old)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  return meta


def _tokenized(source: Iterable[Sequence[str]], tokenizer: tokenizers.Tokenizer,
               tokenizer_dir: pathlib.Path, num_workers: int, max_documents: int | None
               ) -> Iterator[tuple[tuple[list[bytes], _Counts], int]]:
  """(encoded documents and their counts, number of input documents) per chunk, in source
  order, tokenized here or by `num_workers` processes."""
  chunks = _chunks(source, _CHUNK_DOCUMENTS, max_documents)
  if num_workers == 1:
    for chunk in chunks:
      yield _tokenize_documents(tokenizer, chunk), len(chunk)
    return
  ctx = multiprocessing.get_context("spawn")  # fork is unsafe once JAX or Rust threads run
  with ctx.Pool(num_workers, initializer=_init_worker, initargs=(str(tokenizer_dir),)) as pool:
    # A bounded window of tasks in flight, collected in order: results come out in source
    # order whatever the workers' speed, and memory stays bounded on huge corpora.
    pending: collections.deque = collections.deque()
    for chunk in chunks:
      pending.append((pool.apply_async(_worker_tokenize, (chunk,)), len(chunk)))
      if len(pending) >= 2 * num_workers:
        task, n = pending.popleft()
        yield task.get(), n
    while pending:
      task, n = pending.popleft()
      yield task.get(), n


def _source_size(source, max_documents: int | None) -> int | None:
  """The number of documents to expect (for the progress bar), when the source knows it."""
  try:
    total = len(source)  # type: ignore[arg-type]
  except TypeError:
    return None
  return min(total, max_documents) if max_documents is not None else total


def _write_shards(staging: pathlib.Path, names: list[str], results, bar) -> tuple[_Counts, list[int]]:
  """Writes the encoded documents round-robin into the shards `names`: document i is record
  i // num_shards of shard i % num_shards. Returns the counts and documents per shard."""
  writers = [array_record_module.ArrayRecordWriter(str(staging / n), _WRITER_OPTIONS)
             for n in names]
  shard_documents = [0] * len(names)
  counts = _Counts()
  try:
    for (docs, chunk_counts), num_input in results:
      for record in docs:
        shard = counts.documents % len(names)
        writers[shard].write(record)
        shard_documents[shard] += 1
        counts.documents += 1
      chunk_counts.documents = 0  # already counted one by one above
      counts.add(chunk_counts)
      bar.update(num_input)
  finally:
    bar.close()
    for w in writers:
      w.close()
  return counts, shard_documents


def _prepare_into(staging: pathlib.Path, source: Iterable[Sequence[str]],
                  tokenizer: tokenizers.Tokenizer, num_shards: int, num_workers: int,
                  max_documents: int | None, progress: bool | None,
                  provenance: dict | None = None) -> dict:
  tokenizer_dir = staging / records.TOKENIZER_DIR
  tokenizer.save(tokenizer_dir)
  names = [records.shard_name(i, num_shards) for i in range(num_shards)]
  bar = tqdm.tqdm(total=_source_size(source, max_documents), unit="doc", desc="tokenizing",
                  disable=None if progress is None else not progress)
  results = _tokenized(source, tokenizer, tokenizer_dir, num_workers, max_documents)
  try:
    counts, shard_documents = _write_shards(staging, names, results, bar)
  finally:
    results.close()  # on an error: the worker pool stops now, not when collected

  if counts.documents == 0:
    errors.fail("every document tokenized to nothing; check the input text and the tokenizer")
  if counts.empty_sentences or counts.empty_documents:
    _log.warning("dropped %d sentence(s) and %d document(s) that tokenized to nothing",
                 counts.empty_sentences, counts.empty_documents)
  meta = {
      "format_version": FORMAT_VERSION,
      "num_documents": counts.documents,
      "num_sentences": counts.sentences,
      "num_tokens": counts.tokens,
      "skipped": {
          "empty_sentences": counts.empty_sentences,
          "empty_documents": counts.empty_documents,
          "undecodable_lines": int(getattr(source, "skipped_lines", 0)),
      },
      "num_shards": num_shards,
      "shards": names,
      "shard_documents": shard_documents,
      # Document i is record i // num_shards of shard i % num_shards.
      "document_order": "round_robin",
      "tokenizer": {"kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size,
                    "lowercase": tokenizer.lowercase,
                    "fingerprint": tokenizer.fingerprint()},
      "source": getattr(source, "description", type(source).__name__),
      # What it was made from (files, sizes, sample hashes; tfds name): see `changed_inputs`.
      "provenance": provenance or (source.provenance() if hasattr(source, "provenance") else None),
      "max_documents": max_documents,
  }
  # Last file written: its presence is what marks the corpus complete.
  paths.replace_text(staging / records.META_FILE, json.dumps(meta, indent=2) + "\n")
  _log.info("prepared %d documents, %d sentences, %d tokens in %d shard(s)",
            counts.documents, counts.sentences, counts.tokens, num_shards)
  return meta


def changed_inputs(recorded: dict | None, current: dict) -> str:
  """What differs between the provenance a corpus was prepared from and `current` ("" when
  nothing does), in words for a one-line message."""
  if recorded is None:
    return ""  # prepared before provenance was recorded: nothing to compare
  old_files = {f["path"]: f for f in recorded.get("files", [])}
  new_files = {f["path"]: f for f in current.get("files", [])}
  parts = []
  for what, names in (("added", sorted(set(new_files) - set(old_files))),
                      ("removed", sorted(set(old_files) - set(new_files))),
                      ("changed", sorted(p for p in new_files
                                         if p in old_files and new_files[p] != old_files[p]))):
    if names:
      parts.append(f"{what} {names[0]}" + (f" and {len(names) - 1} more" if len(names) > 1 else ""))
  for key in sorted((set(recorded) | set(current)) - {"files"}):
    if recorded.get(key) != current.get(key):
      parts.append(f"{key} {recorded.get(key)!r} -> {current.get(key)!r}")
  return "; ".join(parts)


_META_KEYS = ("num_documents", "num_sentences", "num_tokens", "num_shards", "shards",
              "shard_documents", "tokenizer")


class PreparedCorpus:
  """Random access to a prepared corpus: `corpus[i]` is document i as int32 sentence arrays."""

  def __init__(self, directory: str | os.PathLike):
    self.directory = pathlib.Path(directory)
    rerun = "re-run python -m bertjax.data.prepare"
    meta_path = self.directory / records.META_FILE
    if not meta_path.is_file():
      errors.fail(f"{self.directory} has no {records.META_FILE}: it is not a prepared corpus or "
                  f"its preparation did not finish; {rerun}")
    try:
      meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
      errors.fail(f"{meta_path} is corrupt; {rerun}")
    if not isinstance(meta, dict) or any(k not in meta for k in _META_KEYS):
      errors.fail(f"{meta_path} is incomplete; {rerun}")
    if meta.get("format_version") != FORMAT_VERSION:
      errors.fail(f"{meta_path} has format version {meta.get('format_version')}, this code reads "
                  f"{FORMAT_VERSION}; {rerun}")
    self.meta: dict = meta
    self.shard_paths = [self.directory / n for n in meta["shards"]]
    missing = [str(p) for p in self.shard_paths if not p.is_file()]
    if missing:
      errors.fail(f"{self.directory} lacks shard {missing[0]}; {rerun}")
    try:
      self._shards = [array_record_data_source.ArrayRecordDataSource([str(p)])
                      for p in self.shard_paths]
      lengths = [len(s) for s in self._shards]
    except Exception as e:  # the C++ reader raises plain errors on damaged files
      errors.fail(f"cannot read the shards of {self.directory} ({e}); {rerun}")
    if lengths != list(meta["shard_documents"]) or sum(lengths) != meta["num_documents"]:
      errors.fail(f"the shards of {self.directory} do not match its {records.META_FILE}; {rerun}")
    self._num_shards = len(self._shards)
    self._len = sum(lengths)

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, index: int) -> list[np.ndarray]:
    index = int(index)
    if index < 0:
      index += self._len
    if not 0 <= index < self._len:
      raise IndexError(f"document {index} out of range for {self._len} documents")
    record = self._shards[index % self._num_shards][index // self._num_shards]
    return records.decode_document(record)

  @functools.cached_property
  def tokenizer(self) -> tokenizers.Tokenizer:
    return tokenizers.load_tokenizer(self.directory / records.TOKENIZER_DIR)

  def __getstate__(self) -> dict:
    # Input-pipeline workers receive the corpus pickled; they reload the tokenizer if they use it.
    state = dict(self.__dict__)
    state.pop("tokenizer", None)
    return state

  def __repr__(self) -> str:
    return (f"PreparedCorpus({str(self.directory)!r}, documents={self._len}, "
            f"tokens={self.meta['num_tokens']})")


def _parser() -> errors.ArgumentParser:
  p = errors.ArgumentParser(prog="python -m bertjax.data.prepare",
                                description="Tokenize a corpus into ArrayRecord shards.")
  src = p.add_argument_group("input (give --input or --tfds)")
  src.add_argument("--input", action="append", help="file or glob; repeat for more")
  src.add_argument("--format", default="bert", choices=sources.FORMATS,
                   help="layout of the --input files (see bertjax.data.sources)")
  src.add_argument("--tfds", help="a prepared TFDS dataset, e.g. wikipedia/20230601.en")
  src.add_argument("--split", default="train", help="TFDS split")
  src.add_argument("--data_dir", help="TFDS data folder")
  src.add_argument("--tfds_field", default="text", help="TFDS feature holding the text")
  tok = p.add_argument_group("tokenizer (give --tokenizer or --train_tokenizer)")
  tok.add_argument("--tokenizer", help="folder with a tokenizer (see bertjax.data.tokenizers)")
  tok.add_argument("--train_tokenizer", type=int, metavar="VOCAB_SIZE",
                   help="train a sentencepiece tokenizer of this size on the input first")
  tok.add_argument("--model_type", default="unigram", choices=("unigram", "bpe"),
                   help="sentencepiece model for --train_tokenizer")
  tok.add_argument("--lowercase", action="store_true", help="case-fold (--train_tokenizer)")
  out = p.add_argument_group("output")
  out.add_argument("--output", required=True, help="folder to create")
  out.add_argument("--num_shards", type=int, default=8)
  out.add_argument("--num_workers", type=int, default=None, help="default: all cores")
  out.add_argument("--max_documents", type=int, default=None)
  out.add_argument("--overwrite", action="store_true", help="replace an existing --output")
  return p


def main(argv: Sequence[str] | None = None) -> None:
  args = _parser().parse_args(argv)
  logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
  logging.getLogger("bertjax").setLevel(logging.INFO)  # ours, not every library's
  if (args.input is None) == (args.tfds is None):
    errors.fail("give exactly one of --input GLOB and --tfds NAME")
  if (args.tokenizer is None) == (args.train_tokenizer is None):
    errors.fail("give exactly one of --tokenizer DIR and --train_tokenizer VOCAB_SIZE")
  if args.input is not None:
    source: sources.Source = sources.TextFileSource(args.input, format=args.format)
  else:
    source = sources.TfdsSource(args.tfds, split=args.split, data_dir=args.data_dir,
                                field=args.tfds_field)
  paths.check_output_folder(args.output, "--output")
  _check_output(pathlib.Path(args.output), args.overwrite)  # fail before training a tokenizer
  if args.tokenizer is not None:
    tokenizer = tokenizers.load_tokenizer(args.tokenizer)
  else:
    documents = source if args.max_documents is None else _take(source, args.max_documents)
    _log.info("training a %d-token sentencepiece tokenizer on %s", args.train_tokenizer,
                 source.description)
    tokenizer = tokenizers.train_sentencepiece(
        sources.iter_sentences(documents), None, vocab_size=args.train_tokenizer,
        model_type=args.model_type, lowercase=args.lowercase, flag="--train_tokenizer")
  meta = prepare_corpus(source, tokenizer, args.output, num_shards=args.num_shards,
                        num_workers=args.num_workers, max_documents=args.max_documents,
                        overwrite=args.overwrite)
  print(f"wrote {meta['num_documents']} documents ({meta['num_tokens']} tokens) to {args.output}")


def _take(documents: Iterable[Sequence[str]], n: int) -> Iterator[Sequence[str]]:
  for i, doc in enumerate(documents):
    if i >= n:
      return
    yield doc


if __name__ == "__main__":
  errors.run_cli(main)
