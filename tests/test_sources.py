"""Tests for bertjax.data.sources: each file format, globs, TFDS (mocked), bad bytes, empties."""

from __future__ import annotations

import gzip
import json
import logging
import pathlib

import pytest

from bertjax.core import errors
from bertjax.data import sources


def _write(path: pathlib.Path, text: str | bytes) -> pathlib.Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  if isinstance(text, str):
    text = text.encode("utf-8")
  path.write_bytes(text)
  return path


@pytest.mark.parametrize("text, expected", [
    ("Dr. Smith went to Washington. He met J. R. R. Tolkien in the U.S. Army! Was it 1999? "
     "\"Yes,\" he said. The end.",
     ["Dr. Smith went to Washington.", "He met J. R. R. Tolkien in the U.S. Army!",
      "Was it 1999?", "\"Yes,\" he said.", "The end."]),
    # WikiText's tokenized style: stand-alone periods, @.@ decimals.
    ("It was 3 @.@ 5 m long . It sank in 1904 . e.g. not here . no split",
     ["It was 3 @.@ 5 m long .", "It sank in 1904 . e.g. not here . no split"]),
    ("Élise dit « non ». (Parenthèse.) Ça va... Fin",
     ["Élise dit « non ».", "(Parenthèse.)", "Ça va...", "Fin"]),
    ("  ", []),
    ("no final period", ["no final period"]),
])
def test_split_sentences(text, expected):
  assert sources.split_sentences(text) == expected


def test_bert_format(tmp_path):
  # CRLF line ends, a byte-order mark, runs of blank lines and whitespace-only lines.
  path = _write(tmp_path / "c.txt",
                "\ufeffFirst sentence.\r\n  Second one.  \r\n\r\n\r\n \t \nDoc two.\n\n\n"
                "Doc three a.\nDoc three b.")
  docs = list(sources.TextFileSource(str(path), format="bert"))
  assert docs == [["First sentence.", "Second one."], ["Doc two."],
                  ["Doc three a.", "Doc three b."]]


def test_doc_per_line_format(tmp_path):
  path = _write(tmp_path / "d.txt", "One doc. Two sentences.\n\nAnother doc here! Yes.\n")
  docs = list(sources.TextFileSource(path, format="doc_per_line"))
  assert docs == [["One doc.", "Two sentences."], ["Another doc here!", "Yes."]]


def test_wikitext_format_synthetic(tmp_path):
  path = _write(tmp_path / "w.tokens", " \n = Alpha = \n \n Alpha is a letter . It is first . \n"
                " \n = = History = = \n \n It is old . \n = Beta = \n Beta follows . \n")
  docs = list(sources.TextFileSource(path, format="wikitext"))
  assert docs == [["Alpha is a letter .", "It is first .", "It is old ."], ["Beta follows ."]]


@pytest.mark.parametrize("name", ["wiki.valid.tokens", "wiki.test.raw"])
def test_wikitext_real(data_dir, name):
  path = data_dir / "wikitext2" / name
  lines = path.read_text(encoding="utf-8").splitlines()
  # Headings look like " = Title = " or " = = Section = = "; some table rows (" = National
  # record ") start like one but are text.
  headings = [l for l in lines if l.startswith(" = ") and l.endswith(" = ")]
  titles = [l for l in headings if not l.startswith(" = = ")]
  paragraphs = [l.strip() for l in lines if l.strip() and l not in set(headings)]
  source = sources.TextFileSource(str(path), format="wikitext")
  docs = list(source)
  assert len(docs) == len(titles) > 10
  sentences = [s for d in docs for s in d]
  assert not {s for s in sentences} & {h.strip() for h in headings}
  # Splitting loses no words and cuts most paragraphs into several sentences.
  assert " ".join(sentences).split() == " ".join(paragraphs).split()
  assert len(sentences) > 2 * len(paragraphs)
  assert source.skipped_lines == 0


def test_globs_order_dedup_recursive_and_gzip(tmp_path):
  _write(tmp_path / "b.txt", "B.\n")
  _write(tmp_path / "a.txt", "A.\n")
  _write(tmp_path / "sub" / "c.txt", "C.\n")
  with gzip.open(tmp_path / "sub" / "d.txt.gz", "wb") as f:
    f.write(b"D one.\nD two.\n\nE.\n")
  source = sources.TextFileSource([str(tmp_path / "*.txt"), str(tmp_path / "a.txt"),
                                   str(tmp_path / "**" / "*.gz"), str(tmp_path / "sub/c.txt")])
  assert [p.name for p in source.files] == ["a.txt", "b.txt", "d.txt.gz", "c.txt"]
  assert list(source) == [["A."], ["B."], ["D one.", "D two."], ["E."], ["C."]]
  assert len(sources.expand_globs(str(tmp_path / "**" / "*.txt"))) == 3


def test_glob_matching_nothing_and_folder_are_user_errors(tmp_path):
  _write(tmp_path / "a.txt", "A.\n")
  missing = str(tmp_path / "nope" / "*.txt")
  with pytest.raises(errors.UserError, match="matches no file") as e:
    sources.TextFileSource([str(tmp_path / "a.txt"), missing])
  assert missing in str(e.value)
  with pytest.raises(errors.UserError, match="is a folder"):
    sources.TextFileSource(str(tmp_path))
  with pytest.raises(errors.UserError, match="unknown input format"):
    sources.TextFileSource(str(tmp_path / "a.txt"), format="csv")


def test_non_utf8_lines_are_skipped_and_counted(tmp_path, caplog):
  path = _write(tmp_path / "bad.txt",
                b"Good one.\nBad \xff\xfe line.\nGood two.\n\nLatin-1 caf\xe9.\nGood three.\n")
  source = sources.TextFileSource(str(path), format="bert")
  with caplog.at_level(logging.WARNING):
    docs = list(source)
  assert docs == [["Good one.", "Good two."], ["Good three."]]
  assert source.skipped_lines == 2
  assert any("skipped 2 line(s)" in r.getMessage() and str(path) in r.getMessage()
             for r in caplog.records)
  # Counts restart on each pass, so reading twice does not double them.
  list(source)
  assert source.skipped_lines == 2


def test_empty_corpus_is_user_error(tmp_path):
  path = _write(tmp_path / "empty.txt", "\n  \n\n")
  source = sources.TextFileSource(str(path))
  with pytest.raises(errors.UserError, match="no text found") as e:
    list(source)
  assert str(path) in str(e.value)
  path = _write(tmp_path / "onlyheadings.txt", " = Title = \n = = Section = = \n")
  with pytest.raises(errors.UserError, match="no text found"):
    list(sources.TextFileSource(str(path), format="wikitext"))


def test_tfds_mock_random(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  for name in ("wikipedia/20230601.en", "c4/en"):
    with tfds.testing.mock_data(num_examples=7):
      source = sources.TfdsSource(name, split="train", data_dir=str(tmp_path))
      assert len(source) == 7
      docs = list(source)
      reference = tfds.data_source(name, split="train", data_dir=str(tmp_path), download=False)
      texts = [reference[i]["text"] for i in range(len(reference))]
    assert len(docs) == sum(1 for t in texts if t.strip())
    assert " ".join(s for d in docs for s in d).split() == " ".join(texts).split()
    assert all(isinstance(s, str) and s for d in docs for s in d)


def test_tfds_mock_real_text(tmp_path, data_dir):
  """Wikipedia-like records (paragraphs at newlines, bytes, one bad record) from SQuAD text."""
  tfds = pytest.importorskip("tensorflow_datasets")
  squad = json.loads((data_dir / "squad" / "v1.1_dev_subset.json").read_text(encoding="utf-8"))
  articles = ["\n\n".join(p["context"] for p in a["paragraphs"][:3]) for a in squad["data"]]
  records = [{"title": "t", "text": a.encode("utf-8")} for a in articles]
  records.insert(2, {"title": "bad", "text": b"broken \xff bytes"})

  def as_data_source(self, split, **kwargs):
    del self, kwargs
    assert split == "train"
    return records

  with tfds.testing.mock_data(as_data_source_fn=as_data_source):
    source = sources.TfdsSource("wikipedia/20230601.en", split="train", data_dir=str(tmp_path))
    docs = list(source)
  assert len(docs) == len(articles) and source.skipped_lines == 1
  for doc, article in zip(docs, articles):
    paragraphs = [p for p in article.split("\n") if p.strip()]
    assert len(doc) > len(paragraphs)  # several sentences per paragraph
    assert " ".join(doc).split() == article.split()


def test_tfds_errors(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  with pytest.raises(errors.UserError, match="unknown tfds dataset") as e:
    list(sources.TfdsSource("no_such_dataset_xyz", data_dir=str(tmp_path)))
  assert "\n" not in str(e.value)
  # Not built locally: an error saying how to build it, never a download.
  with pytest.raises(errors.UserError, match="tfds build wikipedia") as e:
    list(sources.TfdsSource("wikipedia/20230601.en", data_dir=str(tmp_path)))
  assert "\n" not in str(e.value)


def test_iter_sentences(tmp_path):
  path = _write(tmp_path / "c.txt", "a.\nb.\n\nc.\n")
  assert list(sources.iter_sentences(sources.TextFileSource(str(path)))) == ["a.", "b.", "c."]
  assert list(sources.read_documents([str(path)], "bert")) == [["a.", "b."], ["c."]]
