"""Tests for bertjax.data.prepare: round trip through ArrayRecord shards, counts, determinism
across worker counts, no complete-looking output after a failure, reader errors, and the CLI."""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import shutil
import subprocess
import sys

import numpy as np

import pytest

from bertjax.core import errors
from bertjax.data import prepare, records, sources, tokenizers

REPO = pathlib.Path(__file__).resolve().parent.parent
ZWSP = "\u200b"  # survives str.strip() but tokenizes to nothing

_CACHE: dict = {}


@pytest.fixture
def wiki_lines(data_dir) -> list[str]:
  if "lines" not in _CACHE:
    text = (data_dir / "wikitext2" / "wiki.valid.tokens").read_text(encoding="utf-8")
    _CACHE["lines"] = text.splitlines()[:1200]
  return _CACHE["lines"]


@pytest.fixture
def tok_dir(wiki_lines, tmp_path_factory) -> pathlib.Path:
  if "tok" not in _CACHE:
    d = tmp_path_factory.mktemp("tok")
    train = [l for l in wiki_lines if l.strip() and not l.startswith(" = ")]
    tokenizers.train_sentencepiece(train, d, vocab_size=800, num_threads=1)
    _CACHE["tok"] = d
  return _CACHE["tok"]


@pytest.fixture
def corpus_files(wiki_lines, tmp_path) -> list[pathlib.Path]:
  """A WikiText excerpt and a BERT-format file with a bad line and things that tokenize empty."""
  wiki = tmp_path / "in" / "wiki.tokens"
  wiki.parent.mkdir()
  wiki.write_text("\n".join(wiki_lines[:400]) + "\n", encoding="utf-8")
  bert = tmp_path / "in" / "extra.tokens"
  bert.write_bytes(
      f" = Extra = \n The first sentence . And the second ! \n {ZWSP} \n"
      f" = Empty = \n {ZWSP} \n = Last = \n".encode("utf-8")
      + b" Bad \xff bytes here . \n Final words . \n")
  return [wiki, bert]


def _expected(source, tok) -> tuple[list[list[list[int]]], int, int]:
  """Independently tokenized documents, plus counts of empty sentences/documents dropped."""
  docs, empty_sentences, empty_documents = [], 0, 0
  for doc in source:
    ids = [tok.encode(s) for s in doc]
    kept = [s for s in ids if s]
    empty_sentences += len(ids) - len(kept)
    if kept:
      docs.append(kept)
    else:
      empty_documents += 1
  return docs, empty_sentences, empty_documents


def test_round_trip_and_meta(corpus_files, tok_dir, tmp_path):
  tok = tokenizers.load_tokenizer(tok_dir)
  source = sources.TextFileSource([str(p) for p in corpus_files], format="wikitext")
  expected, empty_sentences, empty_documents = _expected(source, tok)
  assert empty_sentences == 2 and empty_documents == 1  # the fixture's zero-width spaces

  out = tmp_path / "out"
  meta = prepare.prepare_corpus(source, tok_dir, out, num_shards=3, num_workers=1)
  corpus = prepare.PreparedCorpus(out)
  assert corpus.meta == meta == json.loads((out / records.META_FILE).read_text())
  assert len(corpus) == len(expected) == meta["num_documents"] > 3
  for i, want in enumerate(expected):
    got = corpus[i]
    assert all(s.dtype == np.int32 for s in got)
    assert [s.tolist() for s in got] == want
  assert [s.tolist() for s in corpus[-1]] == expected[-1]
  with pytest.raises(IndexError):
    corpus[len(expected)]
  assert meta["num_sentences"] == sum(len(d) for d in expected)
  assert meta["num_tokens"] == sum(len(s) for d in expected for s in d)
  assert meta["skipped"] == {"empty_sentences": empty_sentences,
                             "empty_documents": empty_documents, "undecodable_lines": 1}
  assert meta["tokenizer"] == {"kind": "sentencepiece", "vocab_size": 800, "lowercase": False,
                               "fingerprint": tok.fingerprint()}
  assert corpus.tokenizer.fingerprint() == tok.fingerprint()  # the same vocabulary, id for id
  assert meta["provenance"] == source.provenance()
  assert [f["path"] for f in meta["provenance"]["files"]] == [
      str(p.resolve()) for p in corpus_files]
  assert sorted(p.name for p in out.glob("*.array_record")) == meta["shards"] == [
      records.shard_name(i, 3) for i in range(3)]
  assert sum(meta["shard_documents"]) == len(expected)
  # The copied tokenizer reproduces the ids.
  assert corpus.tokenizer.encode("The first sentence .") == tok.encode("The first sentence .")
  # Nothing but the output itself is left next to it.
  assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]
  # Usable as a grain source and picklable for input-pipeline workers.
  grain = pytest.importorskip("grain")
  ds = grain.MapDataset.source(corpus)
  assert [s.tolist() for s in ds[2]] == expected[2]
  clone = pickle.loads(pickle.dumps(corpus))
  assert [s.tolist() for s in clone[1]] == expected[1]


def test_workers_give_identical_output(wiki_lines, tok_dir, tmp_path):
  # One document per paragraph gives several chunks of work per worker.
  path = tmp_path / "docs.txt"
  path.write_text("\n".join(l for l in wiki_lines if l.strip() and not l.startswith(" = ")),
                  encoding="utf-8")
  source = sources.TextFileSource(str(path), format="doc_per_line")
  one = prepare.prepare_corpus(source, tok_dir, tmp_path / "one", num_shards=4, num_workers=1)
  two = prepare.prepare_corpus(source, tok_dir, tmp_path / "two", num_shards=4, num_workers=2)
  assert one == two and one["num_documents"] > 3 * prepare._CHUNK_DOCUMENTS
  for name in one["shards"]:
    assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
  a, b = prepare.PreparedCorpus(tmp_path / "one"), prepare.PreparedCorpus(tmp_path / "two")
  for i in (0, len(a) // 2, len(a) - 1):
    assert [s.tolist() for s in a[i]] == [s.tolist() for s in b[i]]


class _Boom(Exception):
  pass


@pytest.mark.parametrize("num_workers", [1, 2])
def test_failed_prepare_leaves_no_complete_output(wiki_lines, tok_dir, tmp_path, num_workers):
  good = [[l.strip()] for l in wiki_lines if l.strip()]

  def failing():
    yield from good[:150]
    raise _Boom("disk on fire")

  out = tmp_path / "out"
  with pytest.raises(_Boom):
    prepare.prepare_corpus(failing(), tok_dir, out, num_shards=2, num_workers=num_workers)
  assert list(tmp_path.iterdir()) == []  # neither the output nor the staging folder
  with pytest.raises(errors.UserError, match="re-run"):
    prepare.PreparedCorpus(out)


def test_incomplete_or_damaged_output_is_user_error(corpus_files, tok_dir, tmp_path):
  source = sources.TextFileSource([str(p) for p in corpus_files], format="wikitext")
  out = tmp_path / "out"
  prepare.prepare_corpus(source, tok_dir, out, num_shards=2, num_workers=1)
  meta_text = (out / records.META_FILE).read_text()

  def broken(mutate) -> pathlib.Path:
    d = tmp_path / f"broken{len(list(tmp_path.iterdir()))}"
    shutil.copytree(out, d)
    mutate(d)
    return d

  cases = [
      (lambda d: (d / records.META_FILE).unlink(), "did not finish"),
      (lambda d: (d / records.META_FILE).write_text(meta_text[:40]), "corrupt"),
      (lambda d: (d / records.META_FILE).write_text("{}"), "incomplete"),
      (lambda d: (d / records.shard_name(1, 2)).unlink(), "lacks shard"),
      (lambda d: (d / records.META_FILE).write_text(
          meta_text.replace('"num_documents": ', '"num_documents": 1')), "do not match"),
  ]
  for mutate, message in cases:
    with pytest.raises(errors.UserError, match=message) as e:
      prepare.PreparedCorpus(broken(mutate))
    assert "re-run" in str(e.value) and "\n" not in str(e.value)


def test_existing_output_and_overwrite(corpus_files, tok_dir, tmp_path):
  source = sources.TextFileSource([str(p) for p in corpus_files], format="wikitext")
  out = tmp_path / "out"
  out.mkdir()
  (out / "keep.txt").write_text("precious")
  with pytest.raises(errors.UserError, match="--overwrite"):
    prepare.prepare_corpus(source, tok_dir, out, num_shards=1, num_workers=1)
  assert (out / "keep.txt").exists()
  meta = prepare.prepare_corpus(source, tok_dir, out, num_shards=1, num_workers=1,
                                overwrite=True, max_documents=2)
  assert not (out / "keep.txt").exists() and meta["num_documents"] == 2
  assert len(prepare.PreparedCorpus(out)) == 2
  with pytest.raises(errors.UserError, match="num_shards"):
    prepare.prepare_corpus(source, tok_dir, tmp_path / "x", num_shards=0)


def test_prepare_from_mock_tfds(data_dir, tok_dir, tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  squad = json.loads((data_dir / "squad" / "v1.1_dev_subset.json").read_text(encoding="utf-8"))
  articles = ["\n".join(p["context"] for p in a["paragraphs"][:4]) for a in squad["data"]]

  def as_data_source(self, split, **kwargs):
    del self, split, kwargs
    return [{"text": a, "title": ""} for a in articles]

  out = tmp_path / "out"
  with tfds.testing.mock_data(as_data_source_fn=as_data_source):
    source = sources.TfdsSource("wikipedia/20230601.en", split="train", data_dir=str(tmp_path))
    meta = prepare.prepare_corpus(source, tok_dir, out, num_shards=2, num_workers=1)
  # Read after the mock is gone: it also patches array_record's data source.
  corpus = prepare.PreparedCorpus(out)
  tok = corpus.tokenizer
  assert len(corpus) == len(articles) == meta["num_documents"]
  assert "tfds wikipedia" in meta["source"]
  for doc, article in zip(corpus, articles):
    assert len(doc) > article.count("\n") + 1
    assert tok.decode(np.concatenate(doc)).split() == tok.decode(tok.encode(article)).split()


def _cli(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "bertjax.data.prepare", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=120,
                        env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.slow
def test_cli(corpus_files, tok_dir, tmp_path):
  glob = str(corpus_files[0].parent / "*.tokens")
  r = _cli("--input", glob, "--format", "wikitext", "--tokenizer", str(tok_dir), "--output",
           str(tmp_path / "a"), "--num_shards", "2", "--num_workers", "1")
  assert r.returncode == 0, r.stderr
  a = prepare.PreparedCorpus(tmp_path / "a")
  assert a.meta["skipped"]["undecodable_lines"] == 1 and len(a) > 3

  r = _cli("--input", str(corpus_files[0]), "--format", "wikitext", "--train_tokenizer", "400",
           "--output", str(tmp_path / "b"), "--num_shards", "1", "--num_workers", "1")
  assert r.returncode == 0, r.stderr
  b = prepare.PreparedCorpus(tmp_path / "b")
  assert b.meta["tokenizer"]["vocab_size"] == 400 and b.tokenizer.kind == "sentencepiece"
  assert b.tokenizer.mask_id == 4

  base = ["--tokenizer", str(tok_dir), "--output", str(tmp_path / "c")]
  for args, message in [
      (["--input", str(tmp_path / "nothing" / "*.txt"), *base], "matches no file"),
      (base, "exactly one of --input"),
      (["--input", glob, "--output", str(tmp_path / "c")], "exactly one of --tokenizer"),
      (["--input", glob, "--tokenizer", str(tmp_path / "no_tok"), "--output",
        str(tmp_path / "c")], "does not exist"),
      (["--input", glob, "--format", "wikitext", "--tokenizer", str(tok_dir), "--output",
        str(tmp_path / "a")], "already exists"),
      (["--input", glob, *base, "--num_shards", "zero"], "invalid int value"),
      (["--tfds", "no_such_dataset_xyz", "--data_dir", str(tmp_path), *base],
       "unknown tfds dataset"),
  ]:
    r = _cli(*args)
    assert r.returncode == 2, (args, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert "Traceback" not in r.stderr
  assert not (tmp_path / "c").exists()


def test_overwrite_refuses_a_run_workdir(corpus_files, tok_dir, tmp_path):
  """ea9bcfe's `prepare --output RUN --overwrite` (what its refusal of a non-empty --output
  suggests) replaced a training workdir whole: checkpoints, config.json and metrics gone."""
  source = sources.TextFileSource([str(p) for p in corpus_files], format="wikitext")
  run = tmp_path / "run"
  (run / "checkpoints" / "20").mkdir(parents=True)
  (run / "config.json").write_text('{"objective": "mlm"}\n')
  before = sorted(p.relative_to(run) for p in run.rglob("*"))
  with pytest.raises(errors.UserError) as e:
    prepare.prepare_corpus(source, tok_dir, run, num_shards=1, num_workers=1, overwrite=True)
  assert str(e.value) == (f"output {run} holds checkpoints, config.json: a run, a model or a "
                          "sweep, which --overwrite would delete; choose another --output, a "
                          "new folder")
  assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
  assert not list(tmp_path.glob(".run.*"))  # no staging folder left
