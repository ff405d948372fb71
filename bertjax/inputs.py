"""From a config to the trainer's inputs: tokenizer, prepared corpus, train and eval iterators.

For pretraining, `config.data_dir` names a corpus prepared by `python -m bertjax.data.prepare`.
Without it, `config.data.corpus` (raw text) is prepared into WORKDIR/prepared at first run,
training a sentencepiece tokenizer on it when `config.data.tokenizer` is empty; later runs and
resumes reuse what is there. The last `config.data.eval_documents` documents are held out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import shutil
from typing import Any, Callable, Iterable, Iterator, Sequence

import jax
import numpy as np

from bertjax.config import config_checks
from bertjax.core import paths
from bertjax.core.errors import fail
from bertjax.data import (batch_warmup, packing, pipeline, prepare, records, sources, synthetic,
                          tokenizers)
from bertjax.data.masking import SpecialIds


@dataclasses.dataclass
class Inputs:
  train: Any                                   # iterator of numpy batches with get_state/set_state
  eval_batches: Callable[[], Iterable[dict]]   # a fresh, identical pass over the eval batches
  vocab_size: int
  tokenizer: Any = None
  num_train_rows: int | None = None            # a finite training set's size (fine-tuning)
  num_eval_batches: int | None = None          # how many batches eval_batches yields, if known
  # A fine-tuning task's own evaluation sets (bertjax.tasks.base.EvalSet) and task-specific
  # counts: what its evaluator (bertjax/evaluators/) decodes and scores from `EvalContext.data`.
  eval_sets: tuple = ()
  test_sets: tuple = ()
  details: dict = dataclasses.field(default_factory=dict)


class DocumentSlice(Sequence):
  """A random-access view of documents [start, stop) of a corpus."""

  def __init__(self, corpus, start: int, stop: int):
    self.corpus, self.start, self.stop = corpus, start, stop

  def __len__(self):
    return self.stop - self.start

  def __getitem__(self, i):
    if not 0 <= i < len(self):
      raise IndexError(i)
    return self.corpus[self.start + i]


def prepared_corpus_dir(config, workdir: paths.Path) -> pathlib.Path:
  """The prepared corpus to train on, preparing `config.data.corpus` first if needed: again when
  its files, format or tokenizer changed since, unless checkpoints were trained on the old one.
  A remote one (gs://...) is read from a local copy (`paths.reading`)."""
  if config.data_dir:
    path = paths.as_path(config.data_dir)
    if not path.is_dir():
      fail(f"data_dir={path} does not exist; prepare a corpus with `python -m bertjax.data.prepare` "
           f"or set --config.data.corpus to raw text")
    return paths.reading(path)
  if not config.data.corpus:
    fail("no training data: set --config.data_dir to a prepared corpus or --config.data.corpus to "
         "raw text files")
  out = workdir / "prepared"
  globs = [g for g in config.data.corpus.split(",") if g]
  docs = sources.read_documents(globs, config.data.format)
  given = tokenizers.load_tokenizer(config.data.tokenizer) if config.data.tokenizer else None
  provenance = {**docs.provenance(), "tokenizer": _tokenizer_setting(config, given)}
  overwrite = False
  if (out / "meta.json").exists():
    changed = prepare.changed_inputs(prepare.PreparedCorpus(paths.reading(out)).meta.get("provenance"),
                                     provenance)
    if not changed:
      return paths.reading(out)
    if _has_checkpoints(workdir):
      fail(f"data.corpus is not what {out} was prepared from ({changed}) and this workdir's "
           "checkpoints were trained on the old corpus; use a new --workdir, or restore the old "
           "inputs to resume")
    logging.warning("preparing %s again: its inputs changed (%s)", out, changed)
    overwrite = True
  if jax.process_index() != 0:
    fail(f"{out} is not prepared; prepare the corpus once before a multi-host run")
  shared = _shared_preparation(provenance, workdir)
  if shared is not None and (shared / records.META_FILE).exists():
    logging.info("using the corpus and tokenizer prepared for another point of this sweep: %s",
                 shared)
    with paths.writing(out, last=(records.META_FILE,), replace=overwrite) as local_out:
      shutil.copytree(shared, local_out, dirs_exist_ok=True)
    return paths.reading(out)
  if given is not None:
    tokenizer = given
  else:
    logging.info("training a sentencepiece tokenizer (vocab %d) on %s", config.data.vocab_size, globs)
    tokenizer = tokenizers.train_sentencepiece(sources.iter_sentences(docs), None,
                                               vocab_size=config.data.vocab_size,
                                               flag="--config.data.vocab_size")
  logging.info("tokenizing %s into %s", globs, out)
  with paths.writing(out, last=(records.META_FILE,), replace=overwrite) as local_out:
    prepare.prepare_corpus(docs, tokenizer, local_out, num_shards=1, overwrite=overwrite,
                           provenance=provenance)
  if shared is not None:
    _share(out, shared)
  return paths.reading(out)


# Set by a local sweep for its points (bertjax/sweep/runner.py): a folder where a corpus prepared
# by one point is kept, under a key of what determines it, for the others to copy.
SHARED_ENV = "BERTJAX_PREPARED_CACHE"


def _shared_preparation(provenance: dict, workdir: paths.Path) -> pathlib.Path | None:
  """Where the corpus and tokenizer of `provenance` (the files, their format and the tokenizer
  setting: all that determines them) are shared between a sweep's points; None outside one."""
  root = os.environ.get(SHARED_ENV)
  if not root or paths.is_remote(workdir):
    return None
  key = hashlib.sha256(json.dumps(provenance, sort_keys=True).encode()).hexdigest()[:16]
  return pathlib.Path(root) / key


def _share(prepared: paths.Path, shared: pathlib.Path) -> None:
  """Copies a prepared corpus into the sweep's shared folder, whole or not at all."""
  if shared.exists():
    return
  staging = shared.with_name(f"{shared.name}.tmp-{os.getpid()}")
  try:
    shutil.copytree(prepared, staging)
    staging.rename(shared)
  except OSError as e:  # another point shared it first, or no space: each point prepares its own
    logging.info("not sharing %s with the sweep's other points (%s)", prepared, e)
    shutil.rmtree(staging, ignore_errors=True)


def _tokenizer_setting(config, given: tokenizers.Tokenizer | None) -> dict:
  """Which tokenizer a workdir's corpus is tokenized with: a given folder (by its vocabulary), or one
  trained on the corpus at data.vocab_size."""
  if given is not None:
    return {"path": os.path.realpath(os.path.expanduser(config.data.tokenizer)),
            "fingerprint": given.fingerprint()}
  return {"trained_vocab_size": int(config.data.vocab_size)}


def _has_checkpoints(workdir: paths.Path) -> bool:
  directory = workdir / "checkpoints"
  return directory.is_dir() and any(p.name.isdigit() for p in directory.iterdir())


class SyntheticBatches:
  """Random token batches, deterministic in (seed, batch index): for benchmarks and layout tests.

  Row i of batch k is the same whatever the process layout, so sharded and single-device runs
  see the same global batch; each process yields its own rows. Every masked token also counts as
  a one-token span (span_left / span_right / span_offset, as the pipeline's 'span' masking gives),
  so span objectives run on them too.
  """

  def __init__(self, config, vocab_size: int, seed: int, per_process: int):
    self.config, self.vocab_size, self.seed = config, vocab_size, seed
    self.per_process = per_process
    self.index = 0

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    c = self.config
    rows = self.per_process * jax.process_count()
    rng = np.random.default_rng([self.seed, self.index])
    self.index += 1
    seq, p = c.max_seq_length, c.max_predictions_per_seq
    lengths = rng.integers(max(seq // 2, p + 1), seq + 1, size=rows)  # room for p masked tokens
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
    ids = rng.integers(5, self.vocab_size, size=(rows, seq)).astype(np.int32) * mask
    ids[:, 0] = 2
    types = ((np.arange(seq)[None, :] >= (lengths // 2)[:, None]) * mask).astype(np.int32)
    positions = np.stack([np.sort(rng.choice(np.arange(1, l), size=p, replace=False)) for l in lengths])
    original = np.take_along_axis(ids, positions, axis=1)
    masked = ids.copy()
    np.put_along_axis(masked, positions, 4, axis=1)
    batch = {"input_ids": masked, "attention_mask": mask, "token_type_ids": types,
             "masked_positions": positions.astype(np.int32), "masked_ids": original,
             "masked_weights": np.ones((rows, p), np.float32),
             "next_sentence_label": rng.integers(0, 2, size=rows).astype(np.int32),
             "span_left": (positions - 1).astype(np.int32),
             "span_right": np.minimum(positions + 1, seq - 1).astype(np.int32),
             "span_offset": np.zeros((rows, p), np.int32)}
    lo = jax.process_index() * self.per_process
    return {k: v[lo:lo + self.per_process] for k, v in batch.items()}

  def get_state(self) -> dict:
    return {"index": self.index}

  def set_state(self, state: dict) -> None:
    self.index = int(state.get("index", 0))


def build(config, workdir: paths.Path, objective) -> Inputs:
  """The pretraining inputs of `config`; with `batch_warmup_tokens`, the train iterator yields
  micro-batches joined into batches that grow (bertjax/data/batch_warmup.py)."""
  per_process = config.batch_size // jax.process_count()
  warmup_tokens = int(config.get("batch_warmup_tokens", 0))
  if not warmup_tokens:
    return _build(config, workdir, objective, per_process, per_process)
  accum = int(config.grad_accum_steps)
  counts = batch_warmup.micro_batches_per_step(
      accum, int(config.batch_warmup_start), config.batch_size // accum * config.max_seq_length,
      warmup_tokens)
  rows = per_process // accum
  global_rows = rows * jax.process_count()  # the pipeline numbers the rows of the global stream
  built = _build(config, workdir, objective, per_process, rows,
                 lambda row: batch_warmup.step_of_micro_batch(row // global_rows, counts, accum))
  return dataclasses.replace(built, train=batch_warmup.GrowingBatches(built.train, counts, accum))


def data_kind(config, objective) -> str:
  """The instances the pipeline builds: `data.kind`, or the objective's, refused where they do
  not suit the objective (config_checks.check_data_kind; a run's plan checked it already)."""
  return config_checks.check_data_kind(config, objective)


def _build(config, workdir: paths.Path, objective, per_process: int, train_rows: int,
           step_of_row: Callable[[int], int] | None = None) -> Inputs:
  """`build`'s inputs, the train iterator yielding `train_rows` rows per process (row r of the
  global stream trained in step `step_of_row(r)`; None: r // (train_rows * process count))."""
  if config.data.synthetic:
    vocab = config.model.vocab_size
    train = SyntheticBatches(config, vocab, config.seed, train_rows)

    def synthetic_eval():
      it = SyntheticBatches(config, vocab, config.seed + 1, per_process)
      return (next(it) for _ in range(config.data.eval_batches))
    return Inputs(train=train, eval_batches=synthetic_eval, vocab_size=vocab,
                  num_eval_batches=config.data.eval_batches)


  kind = data_kind(config, objective)  # refused before a tokenizer is trained or a corpus prepared
  if config.data.pack:
    packing.check_packing(kind, config.data.pack_bins)
  if config.data.generated:
    return _generated(config, objective, kind, per_process, train_rows, step_of_row)
  corpus = prepare.PreparedCorpus(prepared_corpus_dir(config, workdir))
  tokenizer = corpus.tokenizer
  n = len(corpus)
  n_eval = min(config.data.eval_documents, n // 5) if config.eval_every else 0
  return _pretraining_inputs(
      config, objective, kind, per_process, train_rows, DocumentSlice(corpus, 0, n - n_eval),
      DocumentSlice(corpus, n - n_eval, n), SpecialIds.from_tokenizer(tokenizer),
      tokenizer.word_start_mask(), tokenizer.vocab_size, tokenizer, step_of_row)


def _generated(config, objective, kind: str, per_process: int, train_rows: int,
               step_of_row: Callable[[int], int] | None) -> Inputs:
  """The generated corpus `config.data.generated` names (bertjax/data/synthetic.py): training
  documents from seed `config.seed`, held-out ones from another seed, of the same language."""
  if config.data.generated != "context":
    fail(f"data.generated={config.data.generated!r} is not a generated corpus; use 'context' "
         "(bertjax/data/synthetic.py) or leave it empty")
  language = synthetic.CycleLanguage(families=config.data.generated_families,
                                     tokens_per_language=config.data.generated_tokens)
  train = synthetic.CycleDocuments(language, synthetic.TRAIN_DOCUMENTS, seed=config.seed)
  held_out = synthetic.CycleDocuments(language, config.data.eval_documents if config.eval_every
                                      else 0, seed=config.seed + synthetic.TRAIN_DOCUMENTS)
  return _pretraining_inputs(config, objective, kind, per_process, train_rows, train, held_out,
                             language.special_ids(), language.word_start_mask(),
                             language.vocab_size, None, step_of_row)


def _pretraining_inputs(config, objective, kind: str, per_process: int, train_rows: int, train_docs,
                        eval_docs, special, word_start_mask, vocab_size: int, tokenizer,
                        step_of_row: Callable[[int], int] | None = None) -> Inputs:
  rows = pipeline.Instances(kind=kind,
                            max_seq_length=config.max_seq_length,
                            short_seq_prob=config.data.short_seq_prob, pack=config.data.pack,
                            pack_bins=config.data.pack_bins)
  masking = objective.masking(config)
  common = dict(special=special, word_start_mask=word_start_mask,
                shard_index=jax.process_index(), shard_count=jax.process_count())
  train = pipeline.make_pretraining_iterator(train_docs, rows, masking, batch_size=train_rows,
                                             seed=config.seed, step_of_row=step_of_row, **common)

  def eval_batches() -> Iterator[dict]:
    if not len(eval_docs):
      return
    # Evaluation masks at masking.rate throughout: no rate schedule.
    it = pipeline.make_pretraining_iterator(
        eval_docs, rows, dataclasses.replace(masking, rate_schedule=()), batch_size=per_process,
        seed=config.seed + 1, **common)
    for _ in range(config.data.eval_batches):
      yield next(it)

  return Inputs(train=train, eval_batches=eval_batches, vocab_size=vocab_size,
                tokenizer=tokenizer,
                num_eval_batches=config.data.eval_batches if len(eval_docs) else 0)
