"""Extractive QA decoding: best answer span(s) from start/end logits, vectorized in JAX.

A long context is split into overlapping windows; each window yields start and end logits
`<float32>[windows, seq]`. A span (w, i, j) scores start[w, i] + end[w, j] and is allowed when
i and j are passage tokens of window w (`passage_mask`), j >= i and j - i < max_answer_length.
Instead of BERT's loop over the top-20 starts x top-20 ends, the full masked score tensor
`<float32>[windows, seq, seq]` is formed and reduced with argmax / `jax.lax.top_k`, which finds
the true best spans (the top-20 heuristic can miss them) and compiles to a few fused ops.

SQuAD v2.0: the null ("no answer") score is start[w, 0] + end[w, 0] at [CLS], minimized over
windows as BERT's run_squad does, and null_odds = null_score - best_non_null_score; predict
"no answer" when null_odds exceeds a threshold tuned on dev (squad.py's best_f1_thresh).

Then `span_to_text` maps a token span back to the exact substring of the context through
per-token character offsets.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.core.errors import fail

NEG_INF = -jnp.inf


class Spans(NamedTuple):
  """Decoded spans; fields have shape [] (best span) or [k] (n-best), plus leading batch dims.

  `valid` is False where no allowed span exists (then score is -inf and the indices are 0).
  """
  window: jax.Array  # int32
  start: jax.Array  # int32, token index inside the window
  end: jax.Array  # int32, inclusive
  score: jax.Array  # float32, start_logit + end_logit
  valid: jax.Array  # bool


class Decoded(NamedTuple):
  """One example's decoding (or a batch of them, with leading [examples] dims)."""
  best: Spans  # fields []
  nbest: Spans  # fields [n_best]
  null_score: jax.Array  # float32 []: min over windows of start[w, 0] + end[w, 0]
  null_odds: jax.Array  # float32 []: null_score - best.score (+inf without a valid span)


def span_scores(start_logits: jax.Array, end_logits: jax.Array, passage_mask: jax.Array,
                max_answer_length: int, start_mask: jax.Array | None = None) -> jax.Array:
  """Scores of all spans, -inf where not allowed.

  Args:
    start_logits, end_logits: `<float32>[windows, seq]`.
    passage_mask: `<bool>[windows, seq]`, tokens that may be part of an answer.
    max_answer_length: longest allowed span, in tokens.
    start_mask: optional `<bool>[windows, seq]` further restricting where a span may start
      (e.g. BERT's "token has its maximal context in this window"); ANDed with passage_mask.

  Returns:
    `<float32>[windows, seq, seq]`, entry [w, i, j] = start[w, i] + end[w, j] or -inf.
  """
  seq = start_logits.shape[-1]
  starts_ok = passage_mask if start_mask is None else passage_mask & start_mask
  i = jnp.arange(seq)[:, None]
  j = jnp.arange(seq)[None, :]
  length_ok = (j >= i) & (j - i < max_answer_length)  # <bool>[seq, seq]
  allowed = length_ok & starts_ok[..., :, None] & passage_mask[..., None, :]
  scores = start_logits[..., :, None] + end_logits[..., None, :]
  return jnp.where(allowed, scores, NEG_INF).astype(jnp.float32)


def _unravel(flat_index: jax.Array, seq: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  window = flat_index // (seq * seq)
  rest = flat_index % (seq * seq)
  return (window.astype(jnp.int32), (rest // seq).astype(jnp.int32),
          (rest % seq).astype(jnp.int32))


def _spans(flat_index: jax.Array, score: jax.Array, seq: int) -> Spans:
  w, i, j = _unravel(flat_index, seq)
  valid = score > NEG_INF
  zero = jnp.zeros_like(w)
  return Spans(window=jnp.where(valid, w, zero), start=jnp.where(valid, i, zero),
               end=jnp.where(valid, j, zero), score=score, valid=valid)


def best_span(start_logits: jax.Array, end_logits: jax.Array, passage_mask: jax.Array,
              max_answer_length: int, start_mask: jax.Array | None = None) -> Spans:
  """The highest-scoring allowed span of one example over all its windows (fields [])."""
  scores = span_scores(start_logits, end_logits, passage_mask, max_answer_length, start_mask)
  flat = scores.reshape(-1)
  k = jnp.argmax(flat)
  return _spans(k, flat[k], start_logits.shape[-1])


def nbest_spans(start_logits: jax.Array, end_logits: jax.Array, passage_mask: jax.Array,
                max_answer_length: int, n_best: int,
                start_mask: jax.Array | None = None) -> Spans:
  """The `n_best` highest-scoring allowed spans over all windows, best first (fields [n_best]).

  Entries past the number of allowed spans have valid=False and score -inf.
  """
  scores = span_scores(start_logits, end_logits, passage_mask, max_answer_length, start_mask)
  flat = scores.reshape(-1)
  if n_best > flat.shape[0]:
    fail(f"n_best={n_best} exceeds the {flat.shape[0]} (window, start, end) triples; lower it")
  values, index = jax.lax.top_k(flat, n_best)
  return _spans(index, values, start_logits.shape[-1])


def null_score(start_logits: jax.Array, end_logits: jax.Array,
               window_mask: jax.Array | None = None) -> jax.Array:
  """SQuAD v2.0 "no answer" score: min over windows of start[w, 0] + end[w, 0] ([CLS]).

  `window_mask <bool>[windows]` drops padding windows from the min.
  """
  cls = start_logits[..., 0] + end_logits[..., 0]
  if window_mask is not None:
    cls = jnp.where(window_mask, cls, jnp.inf)
  return jnp.min(cls, axis=-1)


def decode(start_logits: jax.Array, end_logits: jax.Array, passage_mask: jax.Array,
           max_answer_length: int, n_best: int = 20, window_mask: jax.Array | None = None,
           start_mask: jax.Array | None = None) -> Decoded:
  """Decodes one example: best span, n-best list, null score and null odds.

  Args:
    start_logits, end_logits: `<float32>[windows, seq]`.
    passage_mask: `<bool>[windows, seq]`.
    max_answer_length: longest allowed span in tokens.
    n_best: length of the n-best list.
    window_mask: `<bool>[windows]`, False for padding windows (ignored everywhere).
    start_mask: optional `<bool>[windows, seq]`, see `span_scores`.
  """
  start_logits = jnp.asarray(start_logits, jnp.float32)
  end_logits = jnp.asarray(end_logits, jnp.float32)
  passage_mask = jnp.asarray(passage_mask, bool)
  if window_mask is not None:
    passage_mask = passage_mask & jnp.asarray(window_mask, bool)[..., :, None]
  nbest = nbest_spans(start_logits, end_logits, passage_mask, max_answer_length, n_best,
                      start_mask)
  # top_k returns its values in descending order, so its first entry is the best span.
  best = jax.tree.map(lambda x: x[0], nbest)
  null = null_score(start_logits, end_logits, window_mask)
  return Decoded(best=best, nbest=nbest, null_score=null, null_odds=null - best.score)


@functools.partial(jax.jit, static_argnames=("max_answer_length", "n_best"))
def decode_batch(start_logits: jax.Array, end_logits: jax.Array, passage_mask: jax.Array,
                 window_mask: jax.Array, max_answer_length: int, n_best: int = 20,
                 start_mask: jax.Array | None = None) -> Decoded:
  """`decode` over examples padded to one number of windows (jitted).

  Args:
    start_logits, end_logits: `<float32>[examples, windows, seq]`.
    passage_mask: `<bool>[examples, windows, seq]`.
    window_mask: `<bool>[examples, windows]`, False for padding windows.
    max_answer_length, n_best: static.
    start_mask: optional `<bool>[examples, windows, seq]`.

  Returns:
    `Decoded` whose fields have a leading [examples] dimension.
  """
  def one(s, e, p, w, m):
    return decode(s, e, p, max_answer_length, n_best, window_mask=w, start_mask=m)
  if start_mask is None:
    return jax.vmap(lambda s, e, p, w: one(s, e, p, w, None))(
        start_logits, end_logits, passage_mask, window_mask)
  return jax.vmap(one)(start_logits, end_logits, passage_mask, window_mask, start_mask)


def span_to_text(context: str, offsets: np.ndarray, start: int, end: int) -> tuple[int, int, str]:
  """Maps a token span of one window to a character span and the exact context substring.

  Args:
    context: the original context string.
    offsets: `<int32>[seq, 2]`, per token of the window its [char_start, char_end) in `context`,
      -1 for tokens outside the passage ([CLS], question, [SEP], padding).
    start, end: the span's first and last token (inclusive).

  Returns:
    (char_start, char_end, context[char_start:char_end]).
  """
  offsets = np.asarray(offsets)
  if not 0 <= start <= end < len(offsets):
    raise ValueError(f"token span [{start}, {end}] outside the window's {len(offsets)} tokens")
  char_start = int(offsets[start, 0])
  char_end = int(offsets[end, 1])
  if char_start < 0 or char_end < 0:
    raise ValueError(f"token span [{start}, {end}] touches a non-passage token (offset -1)")
  if not char_start <= char_end <= len(context):
    raise ValueError(f"character span [{char_start}, {char_end}) does not fit the context")
  return char_start, char_end, context[char_start:char_end]
