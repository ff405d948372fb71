"""CoNLL-2003 NER: reader, entity-level scores with conlleval semantics, predictions files.

Entities are read from tag sequences the way conlleval (and seqeval's default mode) does, which
accepts IOB1 (I- starts an entity unless it continues one of the same type; B- only splits two
adjacent entities of one type), IOB2 (every entity starts with B-) and IOBES alike: an entity
starts at B-/S-, or at I-/E- after O or after a tag of another type; it ends before O, B-, S-,
a change of type, or right after E-/S-. A predicted entity counts as correct only if its type,
first and last token all match a gold entity. Precision, recall and F1 are micro-averaged over
entities, overall and per type; a ratio with a zero denominator is 0.

The predictions file: one `token tag` line per token, a blank line after each sentence, the
sentences in the gold file's order without -DOCSTART- markers.
"""

from __future__ import annotations

import dataclasses
import io
import os
from typing import Iterable, Sequence

from bertjax.core import paths
from bertjax.core.errors import fail, read_text

DOCSTART = "-DOCSTART-"
_PREFIXES = ("B", "I", "E", "S")


@dataclasses.dataclass
class Sentence:
  """One sentence of a CoNLL file; `tags` are the NER tags (the last column)."""
  tokens: list[str]
  tags: list[str]
  pos: list[str] | None = None
  chunk: list[str] | None = None
  line: int = 0  # 1-based line of its first token, for error messages


def _check_tag(tag: str, path: str, line: int) -> None:
  if tag == "O":
    return
  if len(tag) < 3 or tag[0] not in _PREFIXES or tag[1] != "-":
    fail(f"{path}:{line}: tag {tag!r} is not O or B-/I-/E-/S-TYPE; fix the tag column")


def _read_columns(path: str | os.PathLike, num_columns: int,
                  what: str) -> list[tuple[int, list[list[str]]]]:
  """Splits a CoNLL-style file into sentences of `num_columns`-field rows."""
  path = os.fspath(path)
  if not paths.as_path(path).is_file():  # local or remote (gs://...)
    fail(f"{what} file not found: {path}")
  sentences: list[tuple[int, list[list[str]]]] = []
  current: list[list[str]] = []
  start = 0
  # newline=None: lines end at \n, \r\n or \r, as a file opened in text mode splits them.
  for line_no, raw in enumerate(io.StringIO(read_text(path, f"{what} file"), newline=None),
                                start=1):
    fields = raw.split()
    if not fields:
      if current:
        sentences.append((start, current))
        current = []
      continue
    if fields[0] == DOCSTART:
      # A document marker sits alone between blank lines; it closes any open sentence.
      if current:
        sentences.append((start, current))
        current = []
      continue
    if len(fields) != num_columns:
      fail(f"{path}:{line_no}: {len(fields)} columns, a {what} line has {num_columns}; "
           "fix the line")
    _check_tag(fields[-1], path, line_no)
    if not current:
      start = line_no
    current.append(fields)
  if current:
    sentences.append((start, current))
  return sentences


def read_conll(path: str | os.PathLike) -> list[Sentence]:
  """Reads CoNLL-2003 `token POS chunk NER` data, skipping -DOCSTART- lines.

  Raises `UserError` naming file and line for a line without 4 columns or an invalid tag.
  """
  out = []
  for start, rows in _read_columns(path, 4, "CoNLL-2003 (token POS chunk NER)"):
    cols = list(zip(*rows))
    out.append(Sentence(tokens=list(cols[0]), pos=list(cols[1]), chunk=list(cols[2]),
                        tags=list(cols[3]), line=start))
  return out


def write_ner_predictions(path: str | os.PathLike, tokens: Sequence[Sequence[str]],
                          tags: Sequence[Sequence[str]]) -> None:
  """Writes `token tag` lines, a blank line after each sentence."""
  if len(tokens) != len(tags):
    fail(f"{len(tokens)} sentences of tokens but {len(tags)} of tags; give one tag list each")
  lines = []
  for n, (toks, ts) in enumerate(zip(tokens, tags), start=1):
    if len(toks) != len(ts):
      fail(f"sentence {n}: {len(toks)} tokens but {len(ts)} tags; give one tag per token")
    lines.extend(f"{tok} {tag}\n" for tok, tag in zip(toks, ts))
    lines.append("\n")
  paths.replace_text(paths.as_path(path), "".join(lines))  # whole or not at all; local or gs://


def read_ner_predictions(path: str | os.PathLike) -> list[Sentence]:
  """Reads a predictions file written by `write_ner_predictions`."""
  return [Sentence(tokens=[r[0] for r in rows], tags=[r[1] for r in rows], line=start)
          for start, rows in _read_columns(path, 2, "predictions (token tag)")]


def align_predictions(gold: Sequence[Sentence], predicted: Sequence[Sentence],
                      predictions_path: str | os.PathLike | None = None) -> list[list[str]]:
  """Checks `predicted` sentence by sentence against `gold`; returns the predicted tags.

  Raises `UserError` naming the first sentence (1-based, in gold order) whose length or tokens
  differ, or the sentence counts if they differ (a sentence the gold data lacks included); the
  message starts with `predictions_path` when given.
  """
  at = f"{os.fspath(predictions_path)}: " if predictions_path is not None else ""
  for n, (g, p) in enumerate(zip(gold, predicted), start=1):
    if len(g.tokens) != len(p.tokens):
      fail(f"{at}sentence {n} (gold line {g.line}, predictions line {p.line}) has "
           f"{len(g.tokens)} gold tokens but {len(p.tokens)} predicted; write one line per gold "
           "token")
    for k, (a, b) in enumerate(zip(g.tokens, p.tokens)):
      if a != b:
        fail(f"{at}sentence {n} token {k + 1} (predictions line {p.line + k}) is {b!r}, gold "
             f"has {a!r}; keep the gold file's tokens and order")
  if len(gold) != len(predicted):
    fail(f"{at}{len(predicted)} predicted sentences for {len(gold)} gold sentences; write one "
         "block per gold sentence, in order, without -DOCSTART- lines")
  return [list(p.tags) for p in predicted]


def _split_tag(tag: str) -> tuple[str, str]:
  if tag == "O":
    return "O", ""
  return tag[0], tag[2:]


def get_entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
  """Entities `(type, first, last)` (inclusive token indices) of one sentence's tags."""
  entities = []
  prev_prefix, prev_type = "O", ""
  begin = 0
  for i, tag in enumerate(list(tags) + ["O"]):
    prefix, type_ = _split_tag(tag)
    # Does an entity end before token i?
    ends = prev_prefix in ("E", "S") or (
        prev_prefix in ("B", "I") and prefix in ("B", "S", "O")) or (
            prev_prefix != "O" and prev_type != type_)
    if ends:
      entities.append((prev_type, begin, i - 1))
    # Does one start at token i?
    starts = prefix in ("B", "S") or (
        prefix in ("I", "E") and prev_prefix in ("O", "E", "S")) or (
            prefix != "O" and prev_type != type_)
    if starts:
      begin = i
    prev_prefix, prev_type = prefix, type_
  return entities


def _prf(correct: int, predicted: int, gold: int) -> dict[str, float]:
  precision = correct / predicted if predicted else 0.0
  recall = correct / gold if gold else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return {"precision": precision, "recall": recall, "f1": f1}


def ner_metrics(gold_tags: Iterable[Sequence[str]],
                predicted_tags: Iterable[Sequence[str]]) -> dict[str, object]:
  """Entity-level precision/recall/F1, overall (micro) and per entity type.

  Args:
    gold_tags: per sentence, its gold tags (IOB1, IOB2 or IOBES).
    predicted_tags: per sentence, the predicted tags, same lengths.

  Returns:
    {precision, recall, f1, num_gold, num_predicted, num_correct,
     per_type: {TYPE: {precision, recall, f1, support}}} with support = gold entity count.
    Types are those seen in gold or predictions, sorted.
  """
  gold_tags = list(gold_tags)
  predicted_tags = list(predicted_tags)
  if len(gold_tags) != len(predicted_tags):
    fail(f"{len(predicted_tags)} predicted sentences for {len(gold_tags)} gold sentences")
  gold_set: set[tuple[int, str, int, int]] = set()
  pred_set: set[tuple[int, str, int, int]] = set()
  for n, (g, p) in enumerate(zip(gold_tags, predicted_tags)):
    if len(g) != len(p):
      fail(f"sentence {n + 1}: {len(g)} gold tags but {len(p)} predicted; give one per token")
    gold_set.update((n,) + e for e in get_entities(g))
    pred_set.update((n,) + e for e in get_entities(p))
  correct = gold_set & pred_set
  out: dict[str, object] = _prf(len(correct), len(pred_set), len(gold_set))
  out.update(num_gold=len(gold_set), num_predicted=len(pred_set), num_correct=len(correct))
  per_type = {}
  for t in sorted({e[1] for e in gold_set | pred_set}):
    ng = sum(1 for e in gold_set if e[1] == t)
    npred = sum(1 for e in pred_set if e[1] == t)
    nc = sum(1 for e in correct if e[1] == t)
    per_type[t] = {**_prf(nc, npred, ng), "support": ng}
  out["per_type"] = per_type
  return out


def iob2_to_iob1(tags: Sequence[str]) -> list[str]:
  """IOB2 -> IOB1: B- only where an entity directly follows one of the same type."""
  out = []
  prev_type = None
  for tag in tags:
    prefix, type_ = _split_tag(tag)
    if prefix == "O":
      out.append("O")
      prev_type = None
      continue
    if prefix == "B" and prev_type == type_:
      out.append(tag)
    else:
      out.append(f"I-{type_}")
    prev_type = type_
  return out


def to_iob2(tags: Sequence[str]) -> list[str]:
  """Any conlleval-readable tagging (IOB1/IOB2/IOBES) -> IOB2 with the same entities."""
  out = ["O"] * len(tags)
  for type_, first, last in get_entities(tags):
    out[first] = f"B-{type_}"
    for k in range(first + 1, last + 1):
      out[k] = f"I-{type_}"
  return out
