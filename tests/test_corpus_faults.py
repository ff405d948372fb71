"""Faults met while a tokenizer is trained or a corpus prepared (issue 41, defects 12 and 21):
each ends in one line naming its real cause (exit 75 for a SIGTERM, 2 for the corpus), never
sentencepiece's own words about something else."""

import logging
import os
import pathlib
import random
import re
import signal

import pytest

from bertjax.core import errors
from bertjax.core.errors import Preempted, UserError
from bertjax.data import sources, tokenizers
from bertjax.runtime.preemption import Preemption
from tests.helpers import run_module

REPO = pathlib.Path(__file__).resolve().parent.parent
SAMPLE = REPO / "bertjax/data/samples/wikitext2_test.raw"


def _lines(n=400):
  return [l for l in SAMPLE.read_text().splitlines() if l.strip()][:n]


def test_sigterm_while_sentencepiece_reads_the_corpus_is_preempted(capsys):
  """Defect 12: SIGTERM lands while sentencepiece pulls sentences from the corpus (the start of
  its training). The run stops as preempted, exit 75 with the preemption line, not as a user
  error (exit 2, "sentencepiece training failed: INTERNAL: ..."), as on dd89774 (seen failing
  there)."""

  def sentences():
    for i, line in enumerate(_lines()):
      if i == 100:
        os.kill(os.getpid(), signal.SIGTERM)
      yield line

  def run():
    with Preemption() as preemption, preemption.abandoning("training the tokenizer"):
      tokenizers.train_sentencepiece(sentences(), None, vocab_size=300)

  with pytest.raises(SystemExit) as e:
    errors.run_cli(run)
  assert e.value.code == errors.EXIT_PREEMPTED
  err = capsys.readouterr().err
  assert err.splitlines() == ["preempted: SIGTERM while training the tokenizer; run the same "
                              "command again to go on"], err


def test_an_error_while_reading_the_corpus_is_raised_as_it_was():
  """The corpus reader's own one-line error (an unreadable file, say) reaches the user as it was
  raised, not wrapped as a sentencepiece failure."""

  def sentences():
    yield from _lines(50)
    errors.fail("corpus.txt:51: byte 10 (0xff) is not valid UTF-8")

  with pytest.raises(UserError, match=r"^corpus.txt:51: byte 10 \(0xff\) is not valid UTF-8$"):
    tokenizers.train_sentencepiece(sentences(), None, vocab_size=300)
  with pytest.raises(KeyboardInterrupt):  # Ctrl-C while it reads: exit 130, as elsewhere
    tokenizers.train_sentencepiece(_raising(KeyboardInterrupt()), None, vocab_size=300)


def _raising(error):
  yield from _lines(10)
  raise error


def _source(path, fmt="doc_per_line"):
  return sources.iter_sentences(sources.TextFileSource(str(path), format=fmt))


@pytest.mark.parametrize("fmt", ["bert", "doc_per_line", "wikitext"])
def test_a_corpus_of_one_giant_line_names_the_line_length(tmp_path, fmt):
  """Defect 21: the sample text on one line with no sentence ends: sentencepiece leaves out every
  sentence over 4192 bytes, then fails with `[!sentences_.empty()]` (dd89774 passed that on,
  seen failing there). One line names the cause and the fix."""
  text = " ".join(_lines(2000)).translate(str.maketrans("", "", ".!?"))
  path = tmp_path / "one_line.txt"
  path.write_text(text + "\n")
  with pytest.raises(UserError) as e:
    tokenizers.train_sentencepiece(_source(path, fmt), None, vocab_size=300)
  message = str(e.value)
  assert "\n" not in message and "sentences_" not in message
  assert re.match(r"every sentence of the corpus is longer than 4192 bytes \(the longest: "
                  r"9[\d,]{6} bytes\), which sentencepiece does not train on", message), message
  assert "split the text into lines" in message


def test_some_long_lines_are_left_out_with_a_warning(tmp_path, caplog):
  path = tmp_path / "mixed.txt"
  long_line = "word " * 2000
  path.write_text("\n".join(_lines(400) + [long_line]) + "\n")
  with caplog.at_level(logging.WARNING):
    tokenizers.train_sentencepiece(_source(path, "bert"), None, vocab_size=300)
  assert any("1 of the 401 sentences of the corpus is longer than 4192 bytes (the longest: 9,999 "
             "bytes)" in r.getMessage() and "the tokenizer was trained on the others" in
             r.getMessage()
             for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_a_latin1_corpus_names_its_encoding_not_the_vocabulary(tmp_path):
  """Defect 21: French text saved as Latin-1. dd89774 skipped every line with an accent and then
  blamed --vocab_size (seen failing there); now one line names the file, the first bad byte,
  what it reads as, and the conversion."""
  french = ["Le café est très apprécié à Paris .", "Où est la bibliothèque ?",
            "Les élèves étudient la théorie générale .", "Il était une fois un garçon ."]
  path = tmp_path / "latin.txt"
  path.write_bytes(("\n".join(french * 50) + "\n").encode("latin-1"))
  with pytest.raises(UserError) as e:
    tokenizers.train_sentencepiece(_source(path, "bert"), None, vocab_size=300)
  message = str(e.value)
  assert message.startswith(f"{path} is not UTF-8 text: 200 of its 200 lines are not valid UTF-8 "
                            "(the first: line 1, byte 0xe9; it reads as Latin-1/Windows-1252: "
                            "'Le café est très apprécié à Paris .')"), message
  assert "iconv -f latin1 -t utf-8" in message and "vocab" not in message


def test_a_few_damaged_lines_of_a_utf8_corpus_are_still_skipped(tmp_path):
  """What the refusal leaves as it was: a UTF-8 corpus with a damaged line or two."""
  lines = [l.encode() for l in _lines(300)] + ["Un café très noir .".encode()] * 20
  lines[10] = b"broken \xff\xfe line ."
  lines[200] = b"caf\xe9 latin ."
  path = tmp_path / "mostly.txt"
  path.write_bytes(b"\n".join(lines) + b"\n")
  source = sources.TextFileSource(str(path), format="bert")
  assert sum(len(d) for d in source) == 318 and source.skipped_lines == 2


def _binary(seed, size=200_000, nul=True):
  data = random.Random(seed).randbytes(size)
  return data if nul else data.replace(b"\0", b"\1")


def test_a_binary_file_without_nul_bytes_is_refused(tmp_path):
  path = tmp_path / "noise.bin"
  path.write_bytes(_binary(1, nul=False))
  with pytest.raises(UserError, match=rf"^{path} is not UTF-8 text: \d+ of its \d+ lines are not "
                                      r"valid UTF-8 \(the first: line \d+, byte 0x[0-9a-f]{2}\); "):
    list(sources.TextFileSource(str(path), format="bert"))


@pytest.mark.slow
def test_prepare_refuses_a_binary_file(tmp_path):
  """Defect 21: `python -m bertjax.data.prepare` on a binary file exited 0 on dd89774, having
  written a corpus of a few tokens (seen failing there). Exit 2, one line, no output folder."""
  tok = tmp_path / "tok"
  tokenizers.train_sentencepiece(_lines(), tok, vocab_size=300)
  path = tmp_path / "archive.bin"
  path.write_bytes(_binary(0))
  out = tmp_path / "prepared"
  r = run_module("-m", "bertjax.data.prepare", "--input", str(path), "--tokenizer", str(tok),
                 "--output", str(out))
  assert r.returncode == 2, r.stderr[-2000:]
  assert "Traceback" not in r.stderr
  errors_ = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert len(errors_) == 1 and errors_[0].startswith(
      f"error: {path} is not UTF-8 text: line "), r.stderr[-2000:]
  assert "holds a NUL byte" in errors_[0]
  assert not out.exists() and [p.name for p in tmp_path.iterdir()] == sorted(["tok", path.name])
