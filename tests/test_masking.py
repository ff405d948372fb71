"""Tests for bertjax.data.masking: statistics of every masking scheme on real text.

The real-text statistics use WikiText-2 valid (about 200k whitespace tokens) with a vocabulary
built here (every token starts a word), so rates are measured over well over 100k tokens.
"""

import functools
import re

import numpy as np
import pytest

from bertjax.core.errors import UserError
from bertjax.data import masking
from bertjax.data.masking import SpecialIds

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4


@functools.lru_cache(maxsize=1)
def load_wikitext_tokens(path) -> tuple[np.ndarray, int]:
  """All WikiText tokens as ids (5.. in order of appearance, <unk> -> UNK) and the vocab size."""
  vocab: dict[str, int] = {}
  ids = []
  for line in open(path, encoding="utf-8"):
    line = line.strip()
    if not line or re.fullmatch(r"(= )+.*( =)+", line):
      continue
    ids += [UNK if t == "<unk>" else vocab.setdefault(t, 5 + len(vocab)) for t in line.split()]
  return np.array(ids, np.int32), 5 + len(vocab)


@pytest.fixture
def wikitext(data_dir):
  return load_wikitext_tokens(data_dir / "wikitext2" / "wiki.valid.tokens")


def make_sequences(tokens: np.ndarray, max_len: int, total: int, rng: np.random.Generator,
                   pairs: bool = False, full: bool = False) -> list[np.ndarray]:
  """Cuts `total` text tokens into [CLS] a [SEP] (b [SEP]) + padding sequences of varied length
  (or, with `full`, of max_len tokens each)."""
  out = []
  pos = 0
  while pos < total:
    n = max_len - 2 - pairs if full else int(rng.integers(max_len // 4, max_len - 2))
    text = tokens[pos:pos + n]
    pos += n
    if pairs:
      cut = int(rng.integers(1, len(text)))
      seq = np.concatenate([[CLS], text[:cut], [SEP], text[cut:], [SEP]])
    else:
      seq = np.concatenate([[CLS], text, [SEP]])
    out.append(np.pad(seq, (0, max_len - len(seq)), constant_values=PAD).astype(np.int32))
  return out


def restore(example: dict[str, np.ndarray]) -> np.ndarray:
  """The unmasked input, from the masked input and the prediction targets."""
  ids = example["input_ids"].copy()
  used = example["masked_weights"] > 0
  ids[example["masked_positions"][used]] = example["masked_ids"][used]
  return ids


def run_masking(sequences, special, seed=0, **kwargs):
  rng = np.random.default_rng(seed)
  return [masking.mask_tokens(s, special, rng, **kwargs) for s in sequences]


def check_common(sequences, examples, special, max_predictions):
  """Invariants of every scheme; returns (num_selected, num_real_tokens)."""
  selected = real = 0
  for seq, ex in zip(sequences, examples):
    used = ex["masked_weights"] > 0
    positions = ex["masked_positions"][used]
    assert ex["masked_positions"].shape == (max_predictions,)
    assert ex["masked_ids"].dtype == np.int32 and ex["masked_weights"].dtype == np.float32
    # Used slots first, padded slots zero.
    assert np.all(used[:used.sum()]) and np.all(ex["masked_positions"][~used] == 0)
    assert np.all(ex["masked_ids"][~used] == 0)
    assert np.all(np.diff(positions) > 0)
    # Never a special token or padding; targets are the original tokens.
    assert not np.isin(seq[positions], special.ids).any()
    np.testing.assert_array_equal(ex["masked_ids"][used], seq[positions])
    # Nothing outside the selection changes.
    outside = np.ones(len(seq), bool)
    outside[positions] = False
    np.testing.assert_array_equal(ex["input_ids"][outside], seq[outside])
    np.testing.assert_array_equal(restore(ex), seq)
    # Random replacements are never special tokens.
    changed = positions[ex["input_ids"][positions] != seq[positions]]
    replaced = ex["input_ids"][changed]
    assert not np.isin(replaced[replaced != special.mask], special.ids).any()
    selected += len(positions)
    real += int(np.count_nonzero(seq != PAD))
  return selected, real


def replacement_fractions(sequences, examples, special):
  """Fractions of selected tokens turned into [MASK], a random token, or left unchanged."""
  counts = np.zeros(3)
  for seq, ex in zip(sequences, examples):
    positions = ex["masked_positions"][ex["masked_weights"] > 0]
    now, before = ex["input_ids"][positions], seq[positions]
    is_mask = now == special.mask
    counts += [is_mask.sum(), (~is_mask & (now != before)).sum(), (now == before).sum()]
  return counts / counts.sum()


def test_token_masking_statistics(wikitext):
  tokens, vocab_size = wikitext
  special = SpecialIds(PAD, UNK, CLS, SEP, MASK, vocab_size)
  sequences = make_sequences(tokens, 128, 120_000, np.random.default_rng(1))
  examples = run_masking(sequences, special, max_predictions=128)
  selected, real = check_common(sequences, examples, special, 128)
  assert real > 100_000
  assert abs(selected / real - 0.15) < 0.005
  mask, random, same = replacement_fractions(sequences, examples, special)
  assert abs(mask - 0.8) < 0.01 and abs(random - 0.1) < 0.01 and abs(same - 0.1) < 0.01


def test_budget_follows_bert(wikitext):
  tokens, vocab_size = wikitext
  special = SpecialIds(PAD, UNK, CLS, SEP, MASK, vocab_size)
  sequences = make_sequences(tokens, 128, 20_000, np.random.default_rng(2))
  examples = run_masking(sequences, special, max_predictions=12)
  for seq, ex in zip(sequences, examples):
    real = np.count_nonzero(seq != PAD)
    expected = min(12, max(1, int(round(real * 0.15))))
    assert ex["masked_weights"].sum() == expected


def test_configurable_mask_rate(wikitext):
  tokens, vocab_size = wikitext
  special = SpecialIds(PAD, UNK, CLS, SEP, MASK, vocab_size)
  sequences = make_sequences(tokens, 128, 110_000, np.random.default_rng(3))
  examples = run_masking(sequences, special, mask_rate=0.3, max_predictions=128)
  selected, real = check_common(sequences, examples, special, 128)
  assert abs(selected / real - 0.30) < 0.005


def test_electra_mask_has_no_random_replacements(wikitext):
  tokens, vocab_size = wikitext
  special = SpecialIds(PAD, UNK, CLS, SEP, MASK, vocab_size)
  sequences = make_sequences(tokens, 128, 30_000, np.random.default_rng(4))
  rng = np.random.default_rng(0)
  # ELECTRA's generator input: token masking with (0.85 [MASK], 0 random, 0.15 kept).
  examples = [masking.mask_tokens(s, special, rng, mask_rate=0.15, max_predictions=40,
                                  strategy="token", replace_probs=(0.85, 0.0, 0.15))
              for s in sequences]
  check_common(sequences, examples, special, 40)
  mask, random, same = replacement_fractions(sequences, examples, special)
  assert random == 0 and abs(mask - 0.85) < 0.02 and abs(same - 0.15) < 0.02


def word_ids(seq: np.ndarray, word_start: np.ndarray, special: SpecialIds) -> np.ndarray:
  """Word index of every token (-1 for specials), computed independently with a plain loop."""
  out = np.full(len(seq), -1)
  word = -1
  previous_special = True
  for i, t in enumerate(seq):
    if t in special.ids:
      previous_special = True
      continue
    if word_start[t] or previous_special:
      word += 1
    out[i] = word
    previous_special = False
  return out


def synthetic_words(num_sequences: int, rng: np.random.Generator):
  """Sequences of words of 1-4 pieces: ids < 500 start a word, ids >= 500 continue one."""
  vocab_size = 1000
  word_start = np.arange(vocab_size) < 500
  special = SpecialIds(PAD, UNK, CLS, SEP, MASK, vocab_size)
  sequences = []
  for _ in range(num_sequences):
    pieces = [CLS]
    while len(pieces) < 100:
      pieces.append(int(rng.integers(5, 500)))
      pieces += list(rng.integers(500, 1000, rng.integers(0, 4)))
    # Starts with continuation pieces right after [SEP]: they form their own word.
    seq = pieces[:100] + [SEP] + list(rng.integers(500, 1000, 3)) + [SEP]
    sequences.append(np.pad(np.array(seq, np.int32), (0, 128 - len(seq))))
  return sequences, special, word_start


@pytest.mark.parametrize("strategy", ["whole_word", "ngram", "span"])
def test_word_level_strategies_mask_whole_words(strategy):
  sequences, special, word_start = synthetic_words(300, np.random.default_rng(5))
  examples = run_masking(sequences, special, strategy=strategy, word_start_mask=word_start,
                         max_predictions=40)
  selected, real = check_common(sequences, examples, special, 40)
  assert selected > 0.13 * real  # Whole words may undershoot the budget a little, not much.
  for seq, ex in zip(sequences, examples):
    words = word_ids(seq, word_start, special)
    is_masked = np.zeros(len(seq), bool)
    is_masked[ex["masked_positions"][ex["masked_weights"] > 0]] = True
    for w in np.unique(words[is_masked]):
      assert is_masked[words == w].all(), f"word {w} partly masked"


def test_token_strategy_splits_words():
  # The whole-word check above is able to fail: plain token masking splits words.
  sequences, special, word_start = synthetic_words(100, np.random.default_rng(6))
  examples = run_masking(sequences, special, max_predictions=40)
  split = 0
  for seq, ex in zip(sequences, examples):
    words = word_ids(seq, word_start, special)
    is_masked = np.zeros(len(seq), bool)
    is_masked[ex["masked_positions"][ex["masked_weights"] > 0]] = True
    split += sum(not is_masked[words == w].all() for w in np.unique(words[is_masked]))
  assert split > 100


def test_ngram_lengths_follow_one_over_n(wikitext):
  tokens, vocab_size = wikitext
  special = SpecialIds(PAD, UNK, CLS, SEP, MASK, vocab_size)
  word_start = np.ones(vocab_size, bool)
  sequences = make_sequences(tokens, 512, 150_000, np.random.default_rng(7), pairs=True)
  rng = np.random.default_rng(0)
  lengths, selected, real = [], 0, 0
  for seq in sequences:
    units = masking.select_spans(seq, special, rng, strategy="ngram", word_start_mask=word_start,
                                 max_ngram=3, max_predictions=512)
    for u in units:
      assert u.end - u.start == u.num_words  # Every token is a word here.
      assert not np.isin(seq[u.start:u.end], special.ids).any()  # Within one segment.
    lengths += [u.num_words for u in units]
    selected += sum(u.end - u.start for u in units)
    real += np.count_nonzero(seq != PAD)
  assert abs(selected / real - 0.15) < 0.005
  observed = np.bincount(lengths, minlength=4)[1:] / len(lengths)
  expected = np.array([1, 1 / 2, 1 / 3]) / (1 + 1 / 2 + 1 / 3)
  np.testing.assert_allclose(observed, expected, atol=0.015)
  np.testing.assert_allclose(masking.ngram_length_distribution(3), expected)


def test_span_length_distribution_is_spanberts():
  probs = masking.span_length_distribution(0.2, 10)
  k = np.arange(1, 11)
  # Closed form of the geometric truncated to 1..10: E[L | L <= 10].
  q = 0.8
  analytic = (1 - 11 * q**10 + 10 * q**11) / (1 - q) / (1 - q**10)
  assert abs(analytic - 3.797) < 1e-3
  assert abs((probs * k).sum() - analytic) < 1e-9
  np.testing.assert_allclose(probs[1:] / probs[:-1], q)
  # Clamping at 10 instead of truncating would give a different mean: 4.46 words.
  assert abs((1 - q**10) / (1 - q) - 4.463) < 1e-3


def test_span_masking_statistics(wikitext):
  tokens, vocab_size = wikitext
  special = SpecialIds(PAD, UNK, CLS, SEP, MASK, vocab_size)
  word_start = np.ones(vocab_size, bool)
  # SpanBERT's setting: full single segments of 512 tokens. (Shorter sequences give a slightly
  # lower mean: the last span of each sequence is cut to fit the budget, as in SpanBERT.)
  sequences = make_sequences(tokens, 512, 200_000, np.random.default_rng(8), full=True)
  examples = run_masking(sequences, special, strategy="span", word_start_mask=word_start,
                         max_predictions=512)
  selected, real = check_common(sequences, examples, special, 512)
  assert abs(selected / real - 0.15) < 0.005
  span_lengths = []
  span_kinds = np.zeros(3)
  for seq, ex in zip(sequences, examples):
    used = ex["masked_weights"] > 0
    positions = ex["masked_positions"][used]
    left, right = ex["span_left"][used], ex["span_right"][used]
    offset = ex["span_offset"][used]
    assert np.all(ex["span_left"][~used] == 0) and np.all(ex["span_right"][~used] == 0)
    np.testing.assert_array_equal(offset, positions - left - 1)
    is_masked = np.zeros(len(seq), bool)
    is_masked[positions] = True
    for l, r in sorted(set(zip(left.tolist(), right.tolist()))):
      inside = np.arange(l + 1, r)
      # The span is all masked, holds no [SEP]/padding, and its boundaries stay visible.
      assert is_masked[inside].all()
      assert not np.isin(seq[inside], special.ids).any()
      assert not is_masked[l] and not is_masked[r]
      span_lengths.append(len(inside))
      # One replacement decision per span.
      now, before = ex["input_ids"][inside], seq[inside]
      if (now == special.mask).all():
        span_kinds[0] += 1
      elif (now == before).all():
        span_kinds[2] += 1
      else:
        assert not (now == special.mask).any() and np.mean(now != before) > 0.5
        span_kinds[1] += 1
    assert len(positions) == sum(r - l - 1 for l, r in set(zip(left.tolist(), right.tolist())))
  # Every token is a word here, so span lengths in tokens are lengths in words.
  assert abs(np.mean(span_lengths) - 3.8) < 0.2
  assert np.max(span_lengths) <= 10
  np.testing.assert_allclose(span_kinds / span_kinds.sum(), [0.8, 0.1, 0.1], atol=0.02)


def test_spans_never_cross_separators_or_padding():
  # Short segments between [SEP]s force the limit to matter.
  rng = np.random.default_rng(9)
  special = SpecialIds(PAD, UNK, CLS, SEP, MASK, 100)
  word_start = np.ones(100, bool)
  for _ in range(300):
    parts = [[CLS]]
    for _ in range(6):
      parts.append(list(rng.integers(5, 100, rng.integers(1, 6))) + [SEP])
    seq = np.array(sum(parts, []), np.int32)
    seq = np.pad(seq, (0, 48 - len(seq)))
    ex = masking.mask_tokens(seq, special, rng, strategy="span", word_start_mask=word_start,
                             mask_rate=0.3, max_predictions=48)
    used = ex["masked_weights"] > 0
    segment = np.cumsum(np.isin(seq, special.ids))
    for p, l, r in zip(ex["masked_positions"][used], ex["span_left"][used],
                       ex["span_right"][used]):
      assert l < p < r and segment[l + 1] == segment[r - 1] == segment[p]


def test_masking_is_deterministic_given_the_generator():
  sequences, special, word_start = synthetic_words(5, np.random.default_rng(10))
  for strategy in masking.STRATEGIES:
    a = masking.mask_tokens(sequences[0], special, np.random.default_rng(3), strategy=strategy,
                            word_start_mask=word_start)
    b = masking.mask_tokens(sequences[0], special, np.random.default_rng(3), strategy=strategy,
                            word_start_mask=word_start)
    c = masking.mask_tokens(sequences[0], special, np.random.default_rng(4), strategy=strategy,
                            word_start_mask=word_start)
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["masked_positions"], c["masked_positions"])


def test_random_tokens_cover_the_non_special_vocabulary():
  special = SpecialIds(pad=0, unk=100, cls=101, sep=102, mask=199, vocab_size=200)
  draws = masking.random_tokens(special, np.random.default_rng(0), 50_000)
  counts = np.bincount(draws, minlength=200)
  assert len(counts) == 200
  assert np.all(counts[list(special.ids)] == 0)
  non_special = np.delete(counts, list(special.ids))
  assert np.all(non_special > 0)
  assert non_special.std() / non_special.mean() < 0.1  # Uniform: about 256 each.


def test_no_candidates_gives_empty_predictions():
  special = SpecialIds(PAD, UNK, CLS, SEP, MASK, 50)
  seq = np.array([CLS, UNK, SEP, PAD, PAD], np.int32)
  ex = masking.mask_tokens(seq, special, np.random.default_rng(0), max_predictions=4)
  assert ex["masked_weights"].sum() == 0
  np.testing.assert_array_equal(ex["input_ids"], seq)


@pytest.mark.parametrize("kwargs, message", [
    (dict(strategy="words"), "unknown masking strategy"),
    (dict(strategy="whole_word"), "needs word_start_mask"),
    (dict(strategy="span", word_start_mask=np.ones(7, bool)), "word_start_mask has shape"),
    (dict(replace_probs=(0.8, 0.1)), "replace_probs"),
    (dict(replace_probs=(0.8, 0.3, -0.1)), "replace_probs"),
    (dict(mask_rate=1.5), "mask_rate"),
    (dict(max_predictions=0), "max_predictions"),
    (dict(strategy="span", word_start_mask=np.ones(50, bool), span_p=0.0), "span_p"),
])
def test_bad_config_is_a_user_error(kwargs, message):
  special = SpecialIds(PAD, UNK, CLS, SEP, MASK, 50)
  seq = np.array([CLS, 10, 11, 12, SEP], np.int32)
  with pytest.raises(UserError, match=message):
    masking.mask_tokens(seq, special, np.random.default_rng(0), **kwargs)


@pytest.mark.parametrize("fields, word_start_mask, message", [
    (dict(strategy="words"), None, "unknown masking strategy"),
    (dict(strategy="whole_word"), None, "needs word_start_mask"),
    (dict(strategy="span"), np.ones(7, bool), "word_start_mask has shape"),
    (dict(replace_probs=(0.8, 0.3, -0.1)), None, "replace_probs"),
    (dict(mask_rate=1.5), None, "mask_rate"),
    (dict(max_predictions=0), None, "max_predictions"),
    (dict(strategy="ngram", max_ngram=0), np.ones(50, bool), "max_ngram"),
    (dict(strategy="span", span_max=0), np.ones(50, bool), "span_max"),
    (dict(rate_schedule=((2, 0.1), (1, 0.2))), None, "rate_schedule"),
])
def test_masking_settings_check_refuses_before_any_example(fields, word_start_mask, message):
  special = SpecialIds(PAD, UNK, CLS, SEP, MASK, 50)
  settings = masking.Masking(**fields)
  with pytest.raises(UserError, match=message):
    settings.check(special, word_start_mask)


def test_masking_settings_mask_as_mask_tokens_at_the_rate_of_the_step():
  special = SpecialIds(PAD, UNK, CLS, SEP, MASK, 50)
  words = np.arange(50) % 3 == 0
  seq = np.array([CLS, *range(5, 45), SEP, PAD, PAD], np.int32)
  settings = masking.Masking(strategy="span", mask_rate=0.4, max_predictions=16, span_p=0.3,
                             span_max=4, replace_probs=(0.6, 0.2, 0.2), rate_schedule=((3, 0.1),))
  settings.check(special, words)
  kwargs = dict(strategy="span", word_start_mask=words, max_predictions=16, span_p=0.3,
                span_max=4, replace_probs=(0.6, 0.2, 0.2))
  for step, rate in ((None, 0.4), (2, 0.4), (3, 0.1)):
    got = settings.mask(seq, special, np.random.default_rng(7), word_start_mask=words, step=step)
    want = masking.mask_tokens(seq, special, np.random.default_rng(7), mask_rate=rate, **kwargs)
    assert got.keys() == want.keys()
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], err_msg=f"{step}: {key}")
  assert settings.mask(seq, special, np.random.default_rng(7), word_start_mask=words,
                       step=3)["masked_weights"].sum() == 4  # round(42 * 0.1)
  with pytest.raises(AttributeError):
    settings.mask_rate = 0.2  # frozen: a value passed around, never changed on the way


def test_bad_special_ids_are_a_user_error():
  with pytest.raises(UserError, match="outside the vocabulary"):
    SpecialIds(PAD, UNK, CLS, SEP, 60, 50)
  with pytest.raises(UserError, match="distinct"):
    SpecialIds(PAD, UNK, CLS, CLS, MASK, 50)
