"""A prepared corpus records what it was made from and is rebuilt, or refused, when that changes."""

import json
import logging
import pathlib

import pytest

from bertjax import inputs
from bertjax.data import prepare, sources, tokenizers
from bertjax.core.errors import UserError

from test_train import run_launch, tiny_config

SAMPLE = pathlib.Path(__file__).resolve().parent.parent / "bertjax/data/samples/wikitext2_test.raw"


def _corpus(path: pathlib.Path, lines: int) -> pathlib.Path:
  """The first `lines` lines of the shipped WikiText-2 sample (whole articles, wikitext format)."""
  text = SAMPLE.read_text(encoding="utf-8").splitlines(keepends=True)[:lines]
  path.write_text("".join(text), encoding="utf-8")
  return path


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> pathlib.Path:
  out = tmp_path_factory.mktemp("tok") / "spm"
  docs = sources.read_documents([str(SAMPLE)], "wikitext")
  tokenizers.train_sentencepiece(sources.iter_sentences(docs), out, vocab_size=300, num_threads=1)
  return out


def _config(corpus: pathlib.Path, tokenizer_dir: pathlib.Path):
  return tiny_config(**{"data.synthetic": False, "data.corpus": str(corpus),
                        "data.format": "wikitext", "data.tokenizer": str(tokenizer_dir)})


def _meta(workdir: pathlib.Path) -> dict:
  return json.loads((workdir / "prepared" / "meta.json").read_text())


def test_the_prepared_corpus_records_files_format_and_tokenizer(tmp_path, tokenizer_dir):
  corpus = _corpus(tmp_path / "a.txt", 400)
  inputs.prepared_corpus_dir(_config(corpus, tokenizer_dir), tmp_path / "w")
  provenance = _meta(tmp_path / "w")["provenance"]
  [entry] = provenance["files"]
  assert entry["path"] == str(corpus.resolve()) and entry["size"] == corpus.stat().st_size
  assert provenance["format"] == "wikitext"
  assert provenance["tokenizer"] == {"path": str(tokenizer_dir.resolve()),
                                     "fingerprint": tokenizers.load_tokenizer(tokenizer_dir).fingerprint()}


def test_unchanged_inputs_reuse_it_changed_ones_rebuild_it(tmp_path, tokenizer_dir, caplog):
  corpus = _corpus(tmp_path / "a.txt", 400)
  workdir = tmp_path / "w"
  inputs.prepared_corpus_dir(_config(corpus, tokenizer_dir), workdir)
  first = _meta(workdir)
  stamp = (workdir / "prepared" / "meta.json").stat().st_mtime_ns
  inputs.prepared_corpus_dir(_config(corpus, tokenizer_dir), workdir)
  assert (workdir / "prepared" / "meta.json").stat().st_mtime_ns == stamp  # reused as it was

  _corpus(corpus, 800)  # more text in the same file, no checkpoint yet: prepared again
  with caplog.at_level(logging.WARNING):
    inputs.prepared_corpus_dir(_config(corpus, tokenizer_dir), workdir)
  assert "its inputs changed (changed " + str(corpus.resolve()) in caplog.text
  assert _meta(workdir)["num_documents"] > first["num_documents"]


def test_changed_inputs_under_checkpoints_are_refused(tmp_path, tokenizer_dir):
  corpus = _corpus(tmp_path / "a.txt", 400)
  workdir = tmp_path / "w"
  inputs.prepared_corpus_dir(_config(corpus, tokenizer_dir), workdir)
  before = (workdir / "prepared" / "meta.json").read_bytes()
  (workdir / "checkpoints" / "10").mkdir(parents=True)
  _corpus(corpus, 800)
  with pytest.raises(UserError) as e:
    inputs.prepared_corpus_dir(_config(corpus, tokenizer_dir), workdir)
  assert "changed " + str(corpus.resolve()) in str(e.value) and "\n" not in str(e.value)
  assert "use a new --workdir" in str(e.value)
  assert (workdir / "prepared" / "meta.json").read_bytes() == before


def test_changed_inputs_in_words():
  old = {"source": "files", "format": "wikitext", "tokenizer": {"trained_vocab_size": 300},
         "files": [{"path": "/a", "size": 1}, {"path": "/b", "size": 2}]}
  assert prepare.changed_inputs(old, old) == ""
  assert prepare.changed_inputs(None, old) == ""  # prepared before provenance was recorded
  new = {**old, "format": "bert", "tokenizer": {"trained_vocab_size": 400},
         "files": [{"path": "/a", "size": 5}, {"path": "/c", "size": 2}, {"path": "/d", "size": 2}]}
  words = prepare.changed_inputs(old, new)
  assert "added /c and 1 more" in words and "removed /b" in words and "changed /a" in words
  assert "format 'wikitext' -> 'bert'" in words and "tokenizer" in words


def test_sample_hash_sees_a_change_in_the_middle_of_a_small_file(tmp_path):
  path = tmp_path / "x.txt"
  path.write_text("a" * 1000)
  before = sources.read_documents([str(path)], "doc_per_line").provenance()
  path.write_text("a" * 500 + "b" + "a" * 499)
  after = sources.read_documents([str(path)], "doc_per_line").provenance()
  assert before["files"][0]["size"] == after["files"][0]["size"]
  assert prepare.changed_inputs(before, after).startswith("changed ")


@pytest.mark.slow
def test_a_rerun_on_a_changed_corpus_is_one_line_and_changes_nothing(tmp_path, tokenizer_dir):
  """The red team's case: data.corpus files changed under a workdir that trained on them."""
  corpus = _corpus(tmp_path / "a.txt", 400)
  workdir = tmp_path / "w"
  args = ["--config", "configs/quickstart.py:runlocal", "--workdir", str(workdir),
          f"--config.data.corpus={corpus}", f"--config.data.tokenizer={tokenizer_dir}",
          "--config.model.vocab_size=300", "--config.total_steps=2", "--config.eval_every=0",
          "--config.checkpoint_every=2", "--config.tensorboard=False"]
  first = run_launch(*args)
  assert first.returncode == 0, first.stderr[-2000:]
  files = {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file()}
  _corpus(corpus, 800)
  again = run_launch(*args)
  assert again.returncode == 2 and "Traceback" not in again.stderr
  errors = [l for l in again.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "is not what" in errors[0] and str(corpus.resolve()) in errors[0]
  assert {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file()} == files
