"""Dynamic masking for masked-language-model pretraining, in pure numpy.

`mask_tokens` picks which tokens of one example the model must predict and corrupts them, for
each masking scheme of the BERT family:

  token       BERT: single tokens chosen uniformly.
  whole_word  BERT whole-word masking: a word (a word-start token and its continuation pieces) is
              masked as a unit.
  ngram       ALBERT: n-grams of 1..max_ngram whole words, n drawn with probability ~ 1/n.
  span        SpanBERT: spans of whole words, length ~ Geometric(span_p) truncated to
              1..span_max (mean 3.8 words for p=0.2, max 10), one 80/10/10 decision per span,
              plus the span-boundary fields the SBO head needs.

`Masking` holds those settings (and a masking-rate schedule) as one value, the way the input
pipeline and the objectives pass them.

Everything is deterministic given the `np.random.Generator` passed in, so the input pipeline can
redraw masks each epoch from a seed derived from (seed, epoch, example).

Rules shared by all schemes (as BERT's create_pretraining_data):
  * budget = min(max_predictions, max(1, round(num_real_tokens * mask_rate))), where real tokens
    are all non-padding tokens ([CLS] and [SEP] included);
  * special tokens ([PAD], [UNK], [CLS], [SEP], [MASK]) are never selected;
  * a selected token becomes [MASK], a random non-special token, or stays unchanged with
    probabilities `replace_probs` (0.8, 0.1, 0.1 by default).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import numpy as np

from bertjax.core.errors import UserError

STRATEGIES = ("token", "whole_word", "ngram", "span")


@dataclasses.dataclass(frozen=True)
class SpecialIds:
  """The token ids masking must know about, as plain ints (no tokenizer dependency)."""

  pad: int
  unk: int
  cls: int
  sep: int
  mask: int
  vocab_size: int

  def __post_init__(self):
    for name in ("pad", "unk", "cls", "sep", "mask"):
      value = getattr(self, name)
      if not 0 <= value < self.vocab_size:
        raise UserError(f"special id {name}={value} is outside the vocabulary [0, "
                        f"{self.vocab_size}); check the tokenizer's special tokens")
    if len(set(self.ids)) != 5:
      raise UserError(f"special ids must be distinct, got {self}; check the tokenizer's special "
                      "tokens")
    if self.vocab_size <= 5:
      raise UserError(f"vocab_size={self.vocab_size} leaves no ordinary tokens; use a real "
                      "vocabulary")

  @property
  def ids(self) -> tuple[int, int, int, int, int]:
    return (self.pad, self.unk, self.cls, self.sep, self.mask)

  @classmethod
  def from_tokenizer(cls, tokenizer: Any) -> "SpecialIds":
    """Reads pad_id/unk_id/cls_id/sep_id/mask_id/vocab_size from any tokenizer-like object."""
    return cls(pad=int(tokenizer.pad_id), unk=int(tokenizer.unk_id), cls=int(tokenizer.cls_id),
               sep=int(tokenizer.sep_id), mask=int(tokenizer.mask_id),
               vocab_size=int(tokenizer.vocab_size))


@dataclasses.dataclass(frozen=True)
class Masking:
  """How the pipeline masks its examples: `mask_tokens`'s settings (see there) and the rate
  schedule ((from_step, rate), ...): rows of training step >= from_step are masked at that rate
  (`rate_at`), mask_rate before the first. The tokenizer's word_start_mask is not a setting: it
  is passed with the special ids."""

  strategy: str = "token"
  mask_rate: float = 0.15
  max_predictions: int = 20
  max_ngram: int = 3
  span_p: float = 0.2
  span_max: int = 10
  replace_probs: tuple[float, float, float] = (0.8, 0.1, 0.1)
  rate_schedule: tuple[tuple[int, float], ...] = ()

  def check(self, special: SpecialIds, word_start_mask: np.ndarray | None = None) -> None:
    """Raises `UserError` for bad settings, so a pipeline fails before its first batch."""
    _check_config(special, self.mask_rate, self.max_predictions, self.strategy, word_start_mask)
    _check_replace_probs(self.replace_probs)
    if self.strategy == "ngram":
      ngram_length_distribution(self.max_ngram)
    if self.strategy == "span":
      span_length_distribution(self.span_p, self.span_max)
    check_rate_schedule(self.rate_schedule)

  def mask(self, input_ids: np.ndarray, special: SpecialIds, rng: np.random.Generator, *,
           word_start_mask: np.ndarray | None = None,
           step: int | None = None) -> dict[str, np.ndarray]:
    """`mask_tokens` with these settings, at the rate of training step `step` (None: mask_rate,
    as for evaluation). The settings were checked once (`check`, before the first example):
    an example is masked without checking them again."""
    rate = self.mask_rate if step is None else rate_at(step, self.mask_rate, self.rate_schedule)
    return _mask_tokens(input_ids, special, rng, mask_rate=rate,
                        max_predictions=self.max_predictions, strategy=self.strategy,
                        word_start_mask=word_start_mask, max_ngram=self.max_ngram,
                        span_p=self.span_p, span_max=self.span_max,
                        replace_probs=self.replace_probs)


class Span(NamedTuple):
  """A selected unit: tokens [start, end) covering `num_words` whole words."""

  start: int
  end: int
  num_words: int


def span_length_distribution(p: float = 0.2, max_len: int = 10) -> np.ndarray:
  """SpanBERT's span lengths: `<float64>[max_len]`, P(len = i+1) ∝ p (1-p)^i, renormalized.

  SpanBERT "clips" the geometric by truncating it to 1..max_len and renormalizing (its code
  normalizes the list of probabilities); that is what gives its quoted mean of 3.8 words for
  p=0.2, max 10. Clamping instead (min(len, 10)) would give a mean of 4.46.
  """
  if not 0.0 < p <= 1.0 or max_len < 1:
    raise UserError(f"span_p={p} must be in (0, 1] and span_max={max_len} >= 1; fix the masking "
                    "config")
  probs = p * (1.0 - p) ** np.arange(max_len)
  return probs / probs.sum()


def ngram_length_distribution(max_ngram: int = 3) -> np.ndarray:
  """ALBERT's n-gram lengths: `<float64>[max_ngram]`, P(n) ∝ 1/n for n = 1..max_ngram."""
  if max_ngram < 1:
    raise UserError(f"max_ngram={max_ngram} must be >= 1; fix the masking config")
  probs = 1.0 / np.arange(1, max_ngram + 1)
  return probs / probs.sum()


def num_to_predict(input_ids: np.ndarray, special: SpecialIds, mask_rate: float,
                   max_predictions: int) -> int:
  """BERT's budget: min(max_predictions, max(1, round(num_non_padding_tokens * mask_rate)))."""
  num_real = int(np.count_nonzero(input_ids != special.pad))
  return min(max_predictions, max(1, int(round(num_real * mask_rate))))


class _Words(NamedTuple):
  """The maskable words of one sequence; all arrays are `[num_words]`."""

  start: np.ndarray  # <int64> first token of each word
  end: np.ndarray  # <int64> one past its last token
  segment: np.ndarray  # <int64> segment id; words of different segments are never joined


def _find_words(input_ids: np.ndarray, special: SpecialIds,
                word_start_mask: np.ndarray | None) -> _Words:
  """Splits the non-special tokens into words (every token is a word without a mask)."""
  candidate = ~np.isin(input_ids, special.ids)
  if word_start_mask is None:
    starts = candidate
  else:
    previous_candidate = np.concatenate([[False], candidate[:-1]])
    # A continuation piece right after a special token (e.g. truncated at the front) has no word
    # to join, so it starts its own.
    starts = candidate & (word_start_mask[input_ids] | ~previous_candidate)
  start = np.flatnonzero(starts)
  # A word runs until the next word start or the next special/padding token.
  breaks = np.flatnonzero(starts | ~candidate)
  after = np.searchsorted(breaks, start, side="right")
  end = np.where(after < len(breaks), breaks[np.minimum(after, len(breaks) - 1)],
                 len(input_ids))
  # Segments are the runs of non-special tokens: count the specials before each word.
  segment = np.cumsum(~candidate)[start] if len(start) else np.zeros(0, np.int64)
  return _Words(start, end, segment)


def _free_run_lengths(free: np.ndarray, segment: np.ndarray) -> np.ndarray:
  """`<int64>[num_words]`: how many consecutive free words of the same segment start at each."""
  n = len(free)
  index = np.arange(n)
  # The first non-free word at or after w.
  next_blocked = np.minimum.accumulate(np.where(free, n, index)[::-1])[::-1]
  # The first word after w that begins a new segment.
  new_segment = np.concatenate([[False], segment[1:] != segment[:-1]])
  next_new = np.minimum.accumulate(np.where(new_segment, index, n)[::-1])[::-1]
  next_new_after = np.concatenate([next_new[1:], [n]])
  return np.maximum(np.minimum(next_blocked, next_new_after) - index, 0)


def _select_units(words: _Words, budget: int, rng: np.random.Generator,
                  length_probs: np.ndarray, keep_gap: bool) -> list[Span]:
  """Places runs of whole words until `budget` tokens are selected (n-gram and span masking).

  Each round draws a length n (in words) from `length_probs`, then a start uniformly among the
  words where n free words of one segment fit, so lengths follow the configured distribution
  instead of being cut at segment ends. If no place fits n, shorter lengths are tried. The last
  unit is shortened to fit the budget. With `keep_gap`, a unit is never adjacent to another one
  (SpanBERT): its boundary tokens then stay visible for the span boundary objective.
  """
  num_words = len(words.start)
  lengths = words.end - words.start
  free = np.ones(num_words, bool)
  cdf = np.cumsum(length_probs)
  units: list[Span] = []
  selected = 0
  while selected < budget:
    remaining = budget - selected
    runs = _free_run_lengths(free, words.segment)
    fits_budget = lengths <= remaining
    n = min(int(np.searchsorted(cdf, rng.random(), side="right")), len(cdf) - 1) + 1
    starts = np.zeros(0, np.int64)
    while n >= 1:
      starts = np.flatnonzero((runs >= n) & fits_budget)
      if len(starts):
        break
      n -= 1
    if not len(starts):
      break  # No free word fits the rest of the budget.
    first = int(starts[rng.integers(len(starts))])
    # Shorten the unit word by word until it fits the budget (its first word always does).
    cumulative = words.end[first:first + n] - words.start[first]
    n = int(np.searchsorted(cumulative, remaining, side="right"))
    last = first + n - 1
    units.append(Span(int(words.start[first]), int(words.end[last]), n))
    selected += int(words.end[last] - words.start[first])
    free[first:last + 1] = False
    if keep_gap:
      if first > 0 and words.segment[first - 1] == words.segment[first]:
        free[first - 1] = False
      if last + 1 < num_words and words.segment[last + 1] == words.segment[last]:
        free[last + 1] = False
  return units


def _select_whole_words(words: _Words, budget: int, rng: np.random.Generator) -> list[Span]:
  """BERT whole-word masking: words in random order, skipping any that would overflow."""
  units = []
  selected = 0
  for w in rng.permutation(len(words.start)):
    length = int(words.end[w] - words.start[w])
    if selected + length > budget:
      continue
    units.append(Span(int(words.start[w]), int(words.end[w]), 1))
    selected += length
    if selected == budget:
      break
  return units


def select_spans(input_ids: np.ndarray, special: SpecialIds, rng: np.random.Generator, *,
                 mask_rate: float = 0.15, max_predictions: int = 20, strategy: str = "token",
                 word_start_mask: np.ndarray | None = None, max_ngram: int = 3,
                 span_p: float = 0.2, span_max: int = 10) -> list[Span]:
  """Chooses what to mask in `input_ids <int32>[seq]`: disjoint spans sorted by position.

  A span is one masking unit: one token ('token'), one word ('whole_word'), an n-gram of words
  ('ngram') or a SpanBERT span ('span'). `mask_tokens` calls this; it is public so the unit
  length distributions can be checked directly.
  """
  _check_config(special, mask_rate, max_predictions, strategy, word_start_mask)
  return _select_spans(input_ids, special, rng, mask_rate=mask_rate,
                       max_predictions=max_predictions, strategy=strategy,
                       word_start_mask=word_start_mask, max_ngram=max_ngram, span_p=span_p,
                       span_max=span_max)


def _select_spans(input_ids: np.ndarray, special: SpecialIds, rng: np.random.Generator, *,
                  mask_rate: float, max_predictions: int, strategy: str,
                  word_start_mask: np.ndarray | None, max_ngram: int, span_p: float,
                  span_max: int) -> list[Span]:
  """`select_spans` on settings already checked."""
  input_ids = np.asarray(input_ids)
  if word_start_mask is not None:
    word_start_mask = np.asarray(word_start_mask, bool)
  budget = num_to_predict(input_ids, special, mask_rate, max_predictions)
  if strategy == "token":
    candidates = np.flatnonzero(~np.isin(input_ids, special.ids))
    chosen = rng.permutation(candidates)[:budget]
    units = [Span(int(p), int(p) + 1, 1) for p in chosen]
  else:
    words = _find_words(input_ids, special, word_start_mask)
    if strategy == "whole_word":
      units = _select_whole_words(words, budget, rng)
    elif strategy == "ngram":
      units = _select_units(words, budget, rng, ngram_length_distribution(max_ngram),
                            keep_gap=False)
    else:
      units = _select_units(words, budget, rng, span_length_distribution(span_p, span_max),
                            keep_gap=True)
  return sorted(units)


def mask_tokens(input_ids: np.ndarray, special: SpecialIds, rng: np.random.Generator, *,
                mask_rate: float = 0.15, max_predictions: int = 20, strategy: str = "token",
                word_start_mask: np.ndarray | None = None, max_ngram: int = 3,
                span_p: float = 0.2, span_max: int = 10,
                replace_probs: Sequence[float] = (0.8, 0.1, 0.1)) -> dict[str, np.ndarray]:
  """Masks one example.

  Args:
    input_ids: `<int32>[seq]`, padded with `special.pad`.
    special: the special token ids and vocabulary size.
    rng: the only source of randomness.
    mask_rate: fraction of the non-padding tokens to predict.
    max_predictions: P, the fixed number of prediction slots.
    strategy: one of 'token', 'whole_word', 'ngram', 'span'.
    word_start_mask: `<bool>[vocab]`, True for tokens that begin a word; needed by the
      word-level strategies.
    max_ngram: longest n-gram for 'ngram'.
    span_p, span_max: the truncated geometric of span lengths (in words) for 'span'.
    replace_probs: probabilities of ([MASK], random token, unchanged) for a selected token;
      'span' draws one decision per span, the others one per token.

  Returns:
    input_ids `<int32>[seq]` (corrupted), masked_positions `<int32>[P]` (ascending, 0 in unused
    slots), masked_ids `<int32>[P]` (original tokens), masked_weights `<float32>[P]` (1 for used
    slots). For 'span' also span_left / span_right `<int32>[P]`, the positions of the tokens just
    outside each masked token's span, and span_offset `<int32>[P]`, its 0-based position inside
    the span.
  """
  _check_replace_probs(replace_probs)
  _check_config(special, mask_rate, max_predictions, strategy, word_start_mask)
  return _mask_tokens(input_ids, special, rng, mask_rate=mask_rate,
                      max_predictions=max_predictions, strategy=strategy,
                      word_start_mask=word_start_mask, max_ngram=max_ngram, span_p=span_p,
                      span_max=span_max, replace_probs=replace_probs)


def _mask_tokens(input_ids: np.ndarray, special: SpecialIds, rng: np.random.Generator, *,
                 mask_rate: float, max_predictions: int, strategy: str,
                 word_start_mask: np.ndarray | None, max_ngram: int, span_p: float,
                 span_max: int, replace_probs: Sequence[float]) -> dict[str, np.ndarray]:
  """`mask_tokens` on settings already checked: `Masking.mask` draws every example through it
  (its settings checked once by `Masking.check`, before the pipeline's first example)."""
  input_ids = np.asarray(input_ids, np.int32)
  probs = np.asarray(replace_probs, np.float64)
  units = _select_spans(input_ids, special, rng, mask_rate=mask_rate,
                        max_predictions=max_predictions, strategy=strategy,
                        word_start_mask=word_start_mask, max_ngram=max_ngram, span_p=span_p,
                        span_max=span_max)
  unit_lengths = np.array([u.end - u.start for u in units], np.int64)
  unit_starts = np.array([u.start for u in units], np.int64)
  unit_of = np.repeat(np.arange(len(units)), unit_lengths)
  offsets = np.arange(len(unit_of)) - np.repeat(np.cumsum(unit_lengths) - unit_lengths,
                                                unit_lengths)
  positions = unit_starts[unit_of] + offsets if len(units) else np.zeros(0, np.int64)
  count = len(positions)

  # SpanBERT corrupts a span as a unit; the other schemes decide per token.
  if strategy == "span":
    decision = rng.random(len(units))[unit_of]
  else:
    decision = rng.random(count)
  to_mask = decision < probs[0]
  to_random = (decision >= probs[0]) & (decision < probs[0] + probs[1])
  masked = input_ids.copy()
  masked[positions[to_mask]] = special.mask
  masked[positions[to_random]] = random_tokens(special, rng, int(to_random.sum()))

  out = {
      "input_ids": masked,
      "masked_positions": _pad(positions, max_predictions, np.int32),
      "masked_ids": _pad(input_ids[positions], max_predictions, np.int32),
      "masked_weights": _pad(np.ones(count), max_predictions, np.float32),
  }
  if strategy == "span":
    last = len(input_ids) - 1
    # Clipped so they stay valid indices even for inputs without [CLS]/[SEP] around the span.
    left = np.clip(unit_starts[unit_of] - 1, 0, last) if count else positions
    right = np.clip((unit_starts + unit_lengths)[unit_of], 0, last) if count else positions
    out["span_left"] = _pad(left, max_predictions, np.int32)
    out["span_right"] = _pad(right, max_predictions, np.int32)
    out["span_offset"] = _pad(offsets, max_predictions, np.int32)
  return out


def random_tokens(special: SpecialIds, rng: np.random.Generator, size: int) -> np.ndarray:
  """`<int32>[size]` token ids drawn uniformly from the vocabulary minus the special ids."""
  specials = np.sort(np.array(special.ids, np.int64))
  draws = rng.integers(0, special.vocab_size - len(specials), size)
  # Map 0..V-6 onto the non-special ids: skip every special id at or below the draw.
  shifted = specials - np.arange(len(specials))
  return (draws + np.searchsorted(shifted, draws, side="right")).astype(np.int32)


def _pad(values: np.ndarray, size: int, dtype: Any) -> np.ndarray:
  out = np.zeros(size, dtype)
  out[:len(values)] = values
  return out


def _check_replace_probs(replace_probs: Sequence[float]) -> np.ndarray:
  probs = np.asarray(replace_probs, np.float64)
  if probs.shape != (3,) or np.any(probs < 0) or abs(probs.sum() - 1.0) > 1e-6:
    raise UserError(f"replace_probs={tuple(replace_probs)} must be 3 non-negative numbers "
                    "([MASK], random, unchanged) summing to 1, e.g. (0.8, 0.1, 0.1)")
  return probs


def check_rate_schedule(schedule: Sequence[Sequence[float]]) -> None:
  """A masking-rate schedule is ((step, rate), ...): whole steps >= 0 rising, rates in (0, 1).
  Anything else (a bare pair, a rate written as text) is refused in one line."""
  example = "e.g. ((1000, 0.15), (2000, 0.05))"
  number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
  pairs = isinstance(schedule, (tuple, list)) and all(
      isinstance(p, (tuple, list)) and len(p) == 2 and all(map(number, p)) for p in schedule)
  if not pairs:
    flat = isinstance(schedule, (tuple, list)) and len(schedule) == 2 and all(map(number, schedule))
    hint = f" (one pair needs its own parentheses: ({tuple(schedule)},))" if flat else ""
    raise UserError(f"masking.rate_schedule={schedule!r} must be a tuple of (step, rate) pairs "
                    f"of numbers, {example}{hint}")
  steps = [s for s, _ in schedule]
  if any(int(s) != s or s < 0 for s in steps) or steps != sorted(set(steps)):
    raise UserError(f"masking.rate_schedule={tuple(map(tuple, schedule))} must be (step, rate) "
                    f"pairs with rising steps >= 0, {example}")
  for step, rate in schedule:
    if not 0.0 < rate < 1.0:
      raise UserError(f"masking.rate_schedule: rate {rate} at step {step} must be in (0, 1)")


def rate_at(step: int, rate: float, schedule: Sequence[Sequence[float]]) -> float:
  """The masking rate at a (0-based) step: `rate`, or that of the last (from_step, rate) pair of
  `schedule` with from_step <= step (mmBERT lowers it from 30% to 5% across its phases)."""
  for from_step, scheduled in schedule:
    if step < from_step:
      break
    rate = scheduled
  return float(rate)


def _check_config(special: SpecialIds, mask_rate: float, max_predictions: int, strategy: str,
                  word_start_mask: np.ndarray | None) -> None:
  if strategy not in STRATEGIES:
    raise UserError(f"unknown masking strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
  if not 0.0 < mask_rate < 1.0:
    raise UserError(f"mask_rate={mask_rate} must be in (0, 1), e.g. 0.15")
  if max_predictions < 1:
    raise UserError(f"max_predictions={max_predictions} must be >= 1, e.g. 20")
  if strategy != "token":
    if word_start_mask is None:
      raise UserError(f"{strategy} masking needs word_start_mask; pass "
                      "tokenizer.word_start_mask()")
    if np.shape(word_start_mask) != (special.vocab_size,):
      raise UserError(f"word_start_mask has shape {np.shape(word_start_mask)} but vocab_size is "
                      f"{special.vocab_size}; pass the mask of the same tokenizer")
