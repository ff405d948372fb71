"""Faults met while a tokenizer is trained or a corpus prepared (issue 41, defects 12 and 21):
each ends in one line naming its real cause (exit 75 for a SIGTERM, 2 for the corpus), never
sentencepiece's own words about something else."""

import os
import pathlib
import signal

import pytest

from bertjax.core import errors
from bertjax.core.errors import Preempted, UserError
from bertjax.data import tokenizers
from bertjax.runtime.preemption import Preemption

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
