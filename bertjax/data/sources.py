"""Raw-text corpus sources: each yields documents as lists of sentence strings.

BERT's pretraining needs document and sentence boundaries (next-sentence prediction, sentence-
order prediction, and packing that never crosses a document). Every source here produces them:

  TextFileSource(patterns, format=...)  local files, globs allowed, `.gz` read transparently:
    "bert"          one sentence per line, a blank line between documents (BERT's format)
    "doc_per_line"  one document per line, split into sentences by `split_sentences`
    "wikitext"      WikiText raw/tokens files: a ` = Title = ` line starts a new document, deeper
                    ` = = Section = = ` headings and blank lines are dropped, and each paragraph
                    line is split into sentences by `split_sentences`
  TfdsSource(name, split, data_dir)     a prepared TFDS dataset (wikipedia, c4, ...) read by random
                                        access without TensorFlow; its 'text' field is cut into
                                        paragraphs at newlines and then into sentences

Lines that are not valid UTF-8 are skipped (not decoded with replacement characters, which would
put garbage tokens into the corpus); the count is logged per file and kept in `skipped_lines`.
A file that is not UTF-8 text is refused in one line naming it: a NUL byte (binary, or UTF-16);
no line of UTF-8; ten or more lines not UTF-8 that are more than a tenth of its lines, or more
than its lines of UTF-8 beyond ASCII (another encoding, such as Latin-1).
A glob matching no file, or a source with no text at all, raises `UserError` naming the path.
"""

from __future__ import annotations

import abc
import glob
import gzip
import hashlib
import logging
import os
import pathlib
import re
import zlib
from typing import BinaryIO, Iterable, Iterator, Sequence

from bertjax.core import errors

_log = logging.getLogger("bertjax.data.sources")  # not __name__: that is __main__ under -m

FORMATS = ("bert", "doc_per_line", "wikitext")

Document = list[str]

# Lower-cased words that end with a period without ending the sentence. Kept short on purpose:
# a missed split only makes a longer sentence, a wrong split breaks one in two.
_ABBREVIATIONS = frozenset("""
    mr mrs ms dr prof sr jr st mt ft gen col lt sgt capt rev hon gov sen rep pres
    vs etc al approx ca cf viz no nos vol vols fig figs pp ed eds inc ltd co corp dept univ est
    jan feb mar apr jun jul aug sep sept oct nov dec
""".split())
# Sentence-final punctuation, optional closing quotes/brackets, then whitespace.
_END = re.compile(r"[.!?]+[\"'”’»)\]]*\s+")
_OPENERS = "\"'“‘«(["


def split_sentences(text: str) -> list[str]:
  """Splits running text into sentences with a few rules (no model, no language data).

  A sentence ends at '.', '!' or '?' (optionally followed by closing quotes or brackets), followed
  by whitespace and then an upper-case letter, a digit or an opening quote/bracket. A period does
  NOT end a sentence after a known abbreviation ("Dr.", "e.g."), a single letter (an initial, as in
  "J. R. R. Tolkien") or a word with inner periods ("U.S."). Tokenized text such as WikiText's
  "... in 2000 . This ..." splits as expected because the period stands alone.
  """
  sentences = []
  start = 0
  for m in _END.finditer(text):
    nxt = text[m.end():m.end() + 1]
    if not nxt or not (nxt.isupper() or nxt.isdigit() or nxt in _OPENERS):
      continue
    punct = m.group(0).rstrip()
    if punct.startswith(".") and len(punct.rstrip("\"'”’»)]")) == 1:
      j = m.start()
      while j > start and not text[j - 1].isspace():
        j -= 1
      word = text[j:m.start()].lstrip(_OPENERS)
      if word and (len(word) == 1 and word.isalpha() or "." in word
                   or word.lower() in _ABBREVIATIONS):
        continue
    sentence = text[start:m.end()].strip()
    if sentence:
      sentences.append(sentence)
    start = m.end()
  tail = text[start:].strip()
  if tail:
    sentences.append(tail)
  return sentences


def expand_globs(patterns: str | Sequence[str]) -> list[pathlib.Path]:
  """Files matching `patterns` (paths or globs, `**` recursive), sorted, each once.

  Raises UserError naming the first pattern that matches no file.
  """
  if isinstance(patterns, (str, os.PathLike)):
    patterns = [patterns]
  if not patterns:
    errors.fail("no input given; pass --input FILE_OR_GLOB")
  files: list[pathlib.Path] = []
  seen = set()
  for pattern in patterns:
    pattern = os.path.expanduser(os.fspath(pattern))
    matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    if not matches:
      if os.path.isdir(pattern):
        errors.fail(f"input {pattern} is a folder; pass a glob such as {pattern}/*.txt")
      errors.fail(f"input {pattern} matches no file; check the path or glob")
    for m in matches:
      key = os.path.realpath(m)
      if key not in seen:
        seen.add(key)
        files.append(pathlib.Path(m))
  return files


class Source(abc.ABC):
  """An iterable of documents (lists of non-empty sentence strings), re-iterable.

  `skipped_lines` counts the lines (or TFDS records) dropped as undecodable during the latest
  iteration. Iterating a source that yields no document raises UserError.
  """

  skipped_lines: int = 0

  @property
  @abc.abstractmethod
  def description(self) -> str:
    """Where the text comes from, for messages and meta.json."""

  @abc.abstractmethod
  def _documents(self) -> Iterator[Document]:
    """Yields documents; may yield empty ones (filtered out by `__iter__`)."""

  def provenance(self) -> dict:
    """What the documents are made from, recorded with a prepared corpus so that a changed
    input is noticed (compared as a whole)."""
    return {"source": self.description}

  def __iter__(self) -> Iterator[Document]:
    self.skipped_lines = 0
    count = 0
    for doc in self._documents():
      doc = [s for s in doc if s]
      if doc:
        count += 1
        yield doc
    if count == 0:
      errors.fail(f"no text found in {self.description}; check the path and --format")


_SAMPLE_BYTES = 1 << 20


def _sample_sha256(path: pathlib.Path) -> str:
  digest = hashlib.sha256()
  try:
    with open(path, "rb") as f:
      digest.update(f.read(_SAMPLE_BYTES))
      size = os.fstat(f.fileno()).st_size
      if size > _SAMPLE_BYTES:
        f.seek(max(_SAMPLE_BYTES, size - _SAMPLE_BYTES))
        digest.update(f.read(_SAMPLE_BYTES))
  except OSError as e:
    errors.fail(f"cannot read {path} ({e}); check the file")
  return digest.hexdigest()


def _open_binary(path: pathlib.Path) -> BinaryIO:
  if path.suffix == ".gz":
    return gzip.open(path, "rb")
  return open(path, "rb")


# A file is refused as not UTF-8 when more than this share of its lines are not (checked after
# its first _ENCODING_SAMPLE lines and at its end); a few damaged lines are skipped.
_UNDECODABLE_SHARE = 0.1
_UNDECODABLE_LINES = 10  # fewer are skipped whatever their share (a small file's damaged lines)
_ENCODING_SAMPLE = 1000


def _refuse_binary(path: pathlib.Path, line: int, raw: bytes) -> None:
  errors.fail(f"{path} is not UTF-8 text: line {line} holds a NUL byte (at byte "
              f"{raw.index(0)} of the line), so it is a binary file or text in UTF-16/32; give "
              f"text files (convert UTF-16 with iconv -f utf-16 -t utf-8), or leave it out")


def _check_encoding(path: pathlib.Path, skipped: int, lines: int, first_bad,
                    utf8: int | None = None, text_lines: int = 0) -> None:
  """Refuses `path` when at least _UNDECODABLE_LINES of its `lines` are not UTF-8 and more than
  _UNDECODABLE_SHARE of them or, once it is read whole (`utf8` given: its lines of valid
  non-ASCII UTF-8), more than are UTF-8 beyond ASCII: a file in a one-byte encoding such as
  Latin-1, where every line with an accent fails (a UTF-8 file with a few damaged lines has many
  more good ones); or when none of its `text_lines` (not blank) is UTF-8. Names the first bad
  byte and, when the line reads as one, the likely encoding."""
  if not skipped:
    return
  every = utf8 is not None and skipped == text_lines
  if not every and (skipped < _UNDECODABLE_LINES or (
      skipped <= _UNDECODABLE_SHARE * lines and (utf8 is None or utf8 >= skipped))):
    return
  line, raw, error = first_bad
  byte = raw[error.start]
  try:
    as_latin = raw.decode("cp1252").strip()
    # Text in a one-byte encoding: no control characters, and mostly ASCII (random bytes are not).
    readable = (not any(c < " " and c != "\t" for c in as_latin)
                and sum(not c.isascii() for c in as_latin) < 0.3 * len(as_latin))
    latin = f"; it reads as Latin-1/Windows-1252: {as_latin[:40]!r}" if readable else ""
  except UnicodeDecodeError:
    latin = ""
  of = f"{skipped:,} of its {'' if utf8 is not None else 'first '}{lines:,} lines are"
  errors.fail(f"{path} is not UTF-8 text: {of} not valid UTF-8 (the first: line {line}, byte "
              f"0x{byte:02x}{latin}); save it as UTF-8 (e.g. iconv -f latin1 -t utf-8 "
              f"{path.name} > {path.stem}.utf8{path.suffix}) or leave it out")


class TextFileSource(Source):
  """Documents from local text files in one of FORMATS (see the module docstring)."""

  def __init__(self, patterns: str | Sequence[str],
               format: str = "bert"):  # pylint: disable=redefined-builtin
    if format not in FORMATS:
      errors.fail(f"unknown input format {format!r}; use one of {', '.join(FORMATS)}")
    self.patterns = [patterns] if isinstance(patterns, (str, os.PathLike)) else list(patterns)
    self.format = format
    # Expanded now so that a bad glob fails before any work is done.
    self.files = expand_globs(self.patterns)

  @property
  def description(self) -> str:
    return f"{', '.join(map(str, self.patterns))} ({self.format} format)"

  def provenance(self) -> dict:
    """The format and, per file, its resolved path, size and a SHA-256 of its first and last
    MiB: cheap on a corpus of many GB, and any copy of the same files matches (no mtimes)."""
    return {"source": "files", "format": self.format,
            "files": [{"path": os.path.realpath(f), "size": f.stat().st_size,
                       "sample_sha256": _sample_sha256(f)} for f in self.files]}

  def _lines(self, path: pathlib.Path) -> Iterator[str]:
    """The file's lines, stripped; lines that are not UTF-8 are skipped and counted. A file that
    is not UTF-8 text at all is refused (`_check_encoding`)."""
    # utf8: lines of valid non-ASCII UTF-8; text: lines not blank
    skipped, first_bad, count, utf8, text = 0, None, 0, 0, 0
    try:
      with _open_binary(path) as f:
        for i, raw in enumerate(f):
          count = i + 1
          if b"\0" in raw:
            _refuse_binary(path, count, raw)
          text += bool(raw.strip())
          try:
            line = raw.decode("utf-8")
          except UnicodeDecodeError as e:
            skipped += 1
            first_bad = first_bad or (count, raw, e)
            line = None
          if count == _ENCODING_SAMPLE:
            _check_encoding(path, skipped, count, first_bad)
          if line is None:
            continue
          utf8 += not raw.isascii()
          if i == 0:
            line = line.lstrip("\ufeff")  # a byte-order mark is not text
          yield line.strip()
      _check_encoding(path, skipped, count, first_bad, utf8, text)
    except (OSError, EOFError, zlib.error) as e:  # unreadable file, truncated or corrupt .gz
      errors.fail(f"cannot read {path} ({e}); check the file")
    finally:
      if skipped:
        self.skipped_lines += skipped
        _log.warning("skipped %d line(s) of %s that are not valid UTF-8", skipped, path)

  def _documents(self) -> Iterator[Document]:
    for path in self.files:
      if self.format == "bert":
        yield from _bert_documents(self._lines(path))
      elif self.format == "doc_per_line":
        for line in self._lines(path):
          yield split_sentences(line)
      else:
        yield from _wikitext_documents(self._lines(path))


def _bert_documents(lines: Iterable[str]) -> Iterator[Document]:
  doc: Document = []
  for line in lines:
    if line:
      doc.append(line)
    elif doc:
      yield doc
      doc = []
  if doc:
    yield doc


_WIKITEXT_HEADING = re.compile(r"^(=(?: =)*) \S.*? \1$")


def _wikitext_documents(lines: Iterable[str]) -> Iterator[Document]:
  doc: Document = []
  for line in lines:
    if not line:
      continue
    heading = _WIKITEXT_HEADING.match(line)
    if heading:
      # Only a top-level " = Title = " starts an article; section headings are not sentences.
      if heading.group(1) == "=" and doc:
        yield doc
        doc = []
      continue
    doc.extend(split_sentences(line))
  if doc:
    yield doc


class TfdsSource(Source):
  """Documents from a prepared TFDS text dataset (e.g. 'wikipedia/20230601.en', 'c4/en').

  Uses `tfds.data_source`, which reads ArrayRecord files by random access and needs no
  TensorFlow. Nothing is downloaded: the dataset must already be built under `data_dir` with
  `--file_format array_record`.
  """

  def __init__(self, name: str, split: str = "train", data_dir: str | None = None,
               field: str = "text"):
    self.name, self.split, self.data_dir, self.field = name, split, data_dir, field
    self._source = None

  @property
  def description(self) -> str:
    where = f" in {self.data_dir}" if self.data_dir else ""
    return f"tfds {self.name} split {self.split}{where}"

  def provenance(self) -> dict:
    return {"source": "tfds", "name": self.name, "split": self.split,
            "data_dir": os.path.realpath(self.data_dir) if self.data_dir else None,
            "field": self.field}

  def _data_source(self):
    if self._source is None:
      # Imported only for tfds corpora: with its builders, 0.3 s that local files do not need.
      import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
      # Importing the text builders registers wikipedia, c4, ... so names resolve to them.
      import tensorflow_datasets.text  # pylint: disable=g-import-not-at-top,unused-import
      # tfds logs multi-line notes while probing folders; the errors below say what matters.
      absl_logger = logging.getLogger("absl")
      level = absl_logger.level
      absl_logger.setLevel(logging.ERROR)
      try:
        self._source = tfds.data_source(self.name, split=self.split, data_dir=self.data_dir,
                                        download=False)
      except tfds.core.registered.DatasetNotFoundError:
        errors.fail(f"unknown tfds dataset {self.name!r}; check --tfds "
                    "(e.g. wikipedia/20230601.en)")
      except NotImplementedError:  # what tfds raises when no ArrayRecord files are there
        errors.fail(f"{self.description} is not built in ArrayRecord format (nothing is "
                    f"downloaded); build it with `tfds build {self.name} --file_format "
                    "array_record --data_dir DIR`")
      except (AssertionError, FileNotFoundError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        errors.fail(f"cannot open {self.description} ({first}); build it first with `tfds build "
                    f"{self.name} --file_format array_record --data_dir DIR`")
      finally:
        absl_logger.setLevel(level)
      if isinstance(self._source, dict):
        errors.fail(f"--split {self.split!r} names several splits; give one, e.g. train")
    return self._source

  def __len__(self) -> int:
    return len(self._data_source())

  def _documents(self) -> Iterator[Document]:
    data = self._data_source()
    for i in range(len(data)):
      example = data[i]
      if self.field not in example:
        errors.fail(f"{self.description} has no {self.field!r} field; it has "
                    f"{sorted(example)}")
      text = example[self.field]
      if isinstance(text, bytes):
        try:
          text = text.decode("utf-8")
        except UnicodeDecodeError:
          self.skipped_lines += 1
          continue
      yield [s for paragraph in str(text).split("\n") for s in split_sentences(paragraph)]
    if self.skipped_lines:
      _log.warning("skipped %d record(s) of %s that are not valid UTF-8",
                      self.skipped_lines, self.description)


def read_documents(patterns: str | Sequence[str],
                   format: str = "bert") -> TextFileSource:  # pylint: disable=redefined-builtin
  """The documents of local files `patterns` in `format` (a re-iterable `TextFileSource`)."""
  return TextFileSource(patterns, format=format)


def iter_sentences(source: Iterable[Document]) -> Iterator[str]:
  """All sentences of all documents, in order (e.g. to train a tokenizer)."""
  for doc in source:
    yield from doc
