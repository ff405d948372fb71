"""Span decoding against a brute-force O(n^2) search over (window, start, end)."""

import numpy as np
import pytest

from bertjax.metrics import span_decoding as sd


def _random_example(rng, windows=3, seq=20):
  """Logits plus a BERT-like mask: [CLS] question [SEP] passage [SEP] padding, per window."""
  start = rng.normal(0, 2, (windows, seq)).astype(np.float32)
  end = rng.normal(0, 2, (windows, seq)).astype(np.float32)
  mask = np.zeros((windows, seq), bool)
  for w in range(windows):
    q = int(rng.integers(2, 6))
    length = int(rng.integers(1, seq - q - 2))
    mask[w, q + 1:q + 1 + length] = True
  return start, end, mask


def _brute_force(start, end, mask, max_len, start_mask=None):
  """All allowed spans, best first: [(score, w, i, j)]."""
  starts_ok = mask if start_mask is None else mask & start_mask
  spans = []
  for w in range(start.shape[0]):
    for i in range(start.shape[1]):
      for j in range(i, start.shape[1]):
        if starts_ok[w, i] and mask[w, j] and j - i + 1 <= max_len:
          spans.append((np.float32(start[w, i] + end[w, j]), w, i, j))
  # Stable on ties: row-major order, as argmax/top_k pick the lowest flat index.
  return sorted(spans, key=lambda s: -s[0])


@pytest.mark.parametrize("seed,max_len", [(0, 1), (1, 3), (2, 30), (3, 5)])
def test_best_and_nbest_match_brute_force(seed, max_len):
  rng = np.random.default_rng(seed)
  start, end, mask = _random_example(rng)
  ref = _brute_force(start, end, mask, max_len)
  out = sd.decode(start, end, mask, max_len, n_best=10)
  score, w, i, j = ref[0]
  assert (int(out.best.window), int(out.best.start), int(out.best.end)) == (w, i, j)
  assert float(out.best.score) == pytest.approx(float(score), abs=1e-6)
  assert bool(out.best.valid)
  assert 0 <= int(out.best.end) - int(out.best.start) < max_len
  assert mask[w, i] and mask[w, j]
  got = list(zip(np.asarray(out.nbest.window), np.asarray(out.nbest.start),
                 np.asarray(out.nbest.end)))
  assert got == [(r[1], r[2], r[3]) for r in ref[:10]]
  np.testing.assert_allclose(np.asarray(out.nbest.score), [r[0] for r in ref[:10]], atol=1e-6)
  # best_span (argmax) agrees with the head of the n-best list (top_k).
  b = sd.best_span(start, end, mask, max_len)
  assert (int(b.window), int(b.start), int(b.end)) == (w, i, j)
  # v2.0: null score at [CLS] (position 0), minimized over windows; odds against best span.
  null = min(start[k, 0] + end[k, 0] for k in range(start.shape[0]))
  assert float(out.null_score) == pytest.approx(float(null), abs=1e-6)
  assert float(out.null_odds) == pytest.approx(float(null - score), abs=1e-5)


def test_nbest_pads_with_invalid_entries_when_few_spans_exist():
  rng = np.random.default_rng(4)
  start, end, _ = _random_example(rng, windows=2, seq=12)
  start, end = start[:, :8], end[:, :8]
  mask = np.zeros((2, 8), bool)
  mask[1, 3:5] = True  # three allowed spans: (3,3), (3,4), (4,4)
  out = sd.decode(start, end, mask, max_answer_length=5, n_best=5)
  ref = _brute_force(start, end, mask, 5)
  assert len(ref) == 3
  assert np.asarray(out.nbest.valid).tolist() == [True, True, True, False, False]
  assert np.all(np.isneginf(np.asarray(out.nbest.score)[3:]))
  assert [(int(a), int(b)) for a, b in zip(out.nbest.start[:3], out.nbest.end[:3])] == [
      (r[2], r[3]) for r in ref]
  none = sd.decode(start, end, np.zeros((2, 8), bool), 5, n_best=2)
  assert not bool(none.best.valid) and np.isposinf(float(none.null_odds))


def test_start_mask_restricts_starts_only():
  rng = np.random.default_rng(5)
  start, end, mask = _random_example(rng, windows=3, seq=16)
  start_mask = rng.random(mask.shape) < 0.5
  ref = _brute_force(start, end, mask, 4, start_mask)
  out = sd.decode(start, end, mask, 4, n_best=4, start_mask=start_mask)
  assert [(int(a), int(b), int(c)) for a, b, c in zip(out.nbest.window, out.nbest.start,
                                                      out.nbest.end)] == [r[1:] for r in ref[:4]]


def test_batch_matches_per_example_and_ignores_padding_windows():
  rng = np.random.default_rng(6)
  windows, seq, max_len, n_best = 3, 16, 6, 5
  num_windows = [1, 3, 2, 2]
  starts, ends, masks, wmask = [], [], [], []
  for n in num_windows:
    s, e, m = _random_example(rng, windows, seq)
    valid = np.arange(windows) < n
    # Padding windows get huge logits (and a passage mask) that must not leak into results.
    s[~valid] = 100.0
    e[~valid] = -100.0
    m[~valid] = True
    starts.append(s)
    ends.append(e)
    masks.append(m)
    wmask.append(valid)
  out = sd.decode_batch(np.stack(starts), np.stack(ends), np.stack(masks), np.stack(wmask),
                        max_answer_length=max_len, n_best=n_best)
  assert out.nbest.start.shape == (len(num_windows), n_best)
  for b, n in enumerate(num_windows):
    s, e, m = starts[b][:n], ends[b][:n], masks[b][:n]
    ref = _brute_force(s, e, m, max_len)
    assert (int(out.best.window[b]), int(out.best.start[b]), int(out.best.end[b])) == ref[0][1:]
    assert [(int(w), int(i), int(j)) for w, i, j in zip(
        out.nbest.window[b], out.nbest.start[b], out.nbest.end[b])] == [r[1:] for r in
                                                                        ref[:n_best]]
    null = min(s[k, 0] + e[k, 0] for k in range(n))
    assert float(out.null_score[b]) == pytest.approx(float(null), abs=1e-6)
    assert float(out.null_odds[b]) == pytest.approx(float(null - ref[0][0]), abs=1e-5)


def test_span_to_text_returns_exact_context_substring():
  context = "  The Normans (Norman: Nourmands) gave   their name to Normandy.  "
  # Whitespace tokens with their character offsets, after 3 non-passage tokens and before one.
  tokens, offs, pos = [], [], 0
  for tok in context.split():
    pos = context.index(tok, pos)
    tokens.append(tok)
    offs.append((pos, pos + len(tok)))
    pos += len(tok)
  offsets = np.array([(-1, -1)] * 3 + offs + [(-1, -1)], np.int32)
  for i in range(len(tokens)):
    for j in range(i, len(tokens)):
      a, b, text = sd.span_to_text(context, offsets, i + 3, j + 3)
      assert text == context[a:b]
      assert text.split() == tokens[i:j + 1]
      # Spaces inside the span are kept exactly as in the context.
      assert text.startswith(tokens[i]) and text.endswith(tokens[j])
  assert sd.span_to_text(context, offsets, 7, 8)[2] == "gave   their"
  with pytest.raises(ValueError, match="non-passage"):
    sd.span_to_text(context, offsets, 0, 4)
  with pytest.raises(ValueError, match="outside"):
    sd.span_to_text(context, offsets, 5, 4)
